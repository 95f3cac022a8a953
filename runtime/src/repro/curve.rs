//! A run's learning curve in three numbers: when it first did clearly
//! better than chance at its training size, how often it fell back to
//! chance afterwards, and when it first all but fitted that size. On the
//! H200 the first two were the ways the arithmetic runs missed the paper's
//! number (tests/gpu/STATE-TRACKING.md, rounds 5-8): seeds that started
//! thousands of steps later than others, and runs that lost a learned task
//! for a thousand steps or more before learning it again. The third split
//! the seven runs of the arithmetic recipe in rounds 21 and 23: the four
//! whose weight average reached it while the curriculum was still growing
//! ended at 97.1-100 scaled at 128 operands, the three that had not at
//! 59.5-77.5.

use crate::train::data::Task;

/// Scaled accuracy (%) at which a run has started: 256 answers give a
/// standard error of about 3 scaled points on arithmetic and 6 on parity,
/// so 25 is several of them above chance.
pub const STARTED: f64 = 25.0;

/// Scaled accuracy (%) below which a started run has relapsed to about
/// chance.
pub const RELAPSED: f64 = 10.0;

/// Scaled accuracy (%) at which a run has all but fitted its training
/// size: 94% raw on the arithmetic, above the 84-91% at which the runs of
/// rounds 21-23 that never found the exact steps plateaued.
pub const FITTED: f64 = 92.5;

/// The first step whose scaled accuracy reached [`FITTED`]; `points` as for
/// [`started_and_relapses`].
pub fn fitted(points: &[(f64, f64)], task: Task) -> Option<f64> {
    points
        .iter()
        .find(|&&(_, acc)| 100.0 * task.scaled_accuracy(acc / 100.0) >= FITTED)
        .map(|&(step, _)| step)
}

/// The first step whose scaled accuracy reached [`STARTED`], and the
/// relapses after it: each fall below [`RELAPSED`] counts once, and the
/// next one only after the run has reached [`STARTED`] again. `points` are
/// `(step, raw accuracy %)` in step order, as the run's evaluations logged
/// them (`plot::eval_accuracy`); the step comes back as logged.
pub fn started_and_relapses(points: &[(f64, f64)], task: Task) -> (Option<f64>, usize) {
    let mut started = None;
    let mut relapses = 0;
    let mut armed = false;
    for &(step, acc) in points {
        let scaled = 100.0 * task.scaled_accuracy(acc / 100.0);
        if scaled >= STARTED {
            if started.is_none() {
                started = Some(step);
            }
            armed = true;
        } else if armed && scaled < RELAPSED {
            relapses += 1;
            armed = false;
        }
    }
    (started, relapses)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw accuracy (%) at 80 operands of the H200's round-8 run, seed 2,
    /// every 1000 steps from 1000.
    const SEED2: [f64; 20] = [
        23.0, 20.3, 19.9, 31.6, 32.8, 24.2, 54.3, 13.3, 40.6, 24.2, 61.3, 87.9, 87.1, 91.0, 94.1,
        94.9, 94.1, 91.8, 94.9, 96.1,
    ];

    fn every_1000(acc: &[f64]) -> Vec<(f64, f64)> {
        acc.iter()
            .zip(1u32..)
            .map(|(&a, k)| (1000.0 * f64::from(k), a))
            .collect()
    }

    #[test]
    fn the_round_8_run_started_at_7000_and_relapsed_twice() {
        // 54.3% raw is 42.9 scaled (started); 13.3% is -8.4 (relapse),
        // 40.6% re-arms, 24.2% (5.3 scaled) is the second relapse.
        let (started, relapses) = started_and_relapses(&every_1000(&SEED2), Task::ModarithPrec);
        assert_eq!(started, Some(7000.0));
        assert_eq!(relapses, 2);
    }

    #[test]
    fn the_round_8_run_fitted_at_15000() {
        // 94.1% raw (92.6 scaled) at step 15,000 is the first at or above
        // 92.5; 91.0% (88.75 scaled) at 14,000 is not.
        assert_eq!(
            fitted(&every_1000(&SEED2), Task::ModarithPrec),
            Some(15000.0)
        );
        assert_eq!(fitted(&every_1000(&SEED2[..14]), Task::ModarithPrec), None);
    }

    #[test]
    fn fitting_depends_on_the_task() {
        // 95% raw: 90 scaled for parity (not fitted), 93.75 for arithmetic.
        let p = [(500.0, 95.0)];
        assert_eq!(fitted(&p, Task::Parity), None);
        assert_eq!(fitted(&p, Task::ModarithPrec), Some(500.0));
        assert_eq!(fitted(&[], Task::Parity), None);
    }

    #[test]
    fn a_run_at_chance_never_starts_and_never_relapses() {
        let chance = every_1000(&[19.1, 21.5, 22.3, 18.0, 24.6]);
        assert_eq!(started_and_relapses(&chance, Task::ModarithPrec), (None, 0));
        assert_eq!(started_and_relapses(&[], Task::Parity), (None, 0));
    }

    #[test]
    fn chance_depends_on_the_task() {
        // 60% raw: 20 scaled for parity (not started), 50 for arithmetic.
        let p = [(500.0, 60.0)];
        assert_eq!(started_and_relapses(&p, Task::Parity).0, None);
        assert_eq!(started_and_relapses(&p, Task::ModarithPrec).0, Some(500.0));
    }

    #[test]
    fn a_collapse_that_stays_down_counts_once() {
        let p = every_1000(&[100.0, 100.0, 50.0, 49.0, 51.0, 100.0, 40.0]);
        // Parity: 100, 100, 0 (relapse), -2, 2, 100 (re-armed), -20 (relapse).
        assert_eq!(started_and_relapses(&p, Task::Parity), (Some(1000.0), 2));
    }
}
