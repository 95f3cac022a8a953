//! An exponential moving average of the weights (`--ema DECAY`).
//!
//! Late in a state-tracking run the accuracy beyond the training length
//! swings by tens of points between evaluations a thousand steps apart
//! while the accuracy at the training length barely moves (README, "State
//! tracking"): the trained weights wander around a solution whose long-row
//! behaviour is sensitive to small angle errors. The average of the recent
//! weights sits nearer the middle of that wandering.
//!
//! The average lives on the host and never feeds the training step, so a
//! run with it trains bit-identically to one without. It folds in the
//! weights every [`EVERY`] steps (at steps that are multiples of it, so a
//! resumed run folds in at the same steps), with the decay of that many
//! steps, `decay^EVERY`: reading the weights back every step would cost a
//! device round trip per step, and over ten steps the weights move by a few
//! hundredths of the average's horizon. The first fold starts the average
//! at the weights of that step.
//!
//! A young run's decay is lower: at step `t` a fold uses
//! `min(decay, (1 + t) / (10 + t))` per step, so the average spans about the
//! last tenth of the run until that reaches the decay's horizon (step ~9000
//! for 0.999). With the fixed decay alone, a 3000-step run's average held
//! 5% (0.999^3000) of its first fold's weights, and 5% of an untrained
//! rotation angle put a parity model's average at chance while its trained
//! weights scored 100 (tests/gpu/STATE-TRACKING.md, the CPU parity runs).

use crate::mamba3::cpu::Weights;

/// Steps between folds of the weights into the average.
pub const EVERY: u64 = 10;

/// The average and its decay.
#[derive(Debug, Clone, PartialEq)]
pub struct Ema {
    /// The weight of the old average in one fold: `decay^EVERY`.
    keep: f32,
    weights: Option<Weights<f32>>,
}

impl Ema {
    /// An empty average with per-step decay `decay` (in (0, 1), checked by
    /// the run's validation).
    pub fn new(decay: f64) -> Self {
        let steps = i32::try_from(EVERY).unwrap_or(i32::MAX);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a decay in (0, 1) to the tenth power is in (0, 1): f32 holds it"
        )]
        let keep = decay.powi(steps) as f32;
        Self {
            keep,
            weights: None,
        }
    }

    /// An average restored from a checkpoint.
    pub fn restored(decay: f64, weights: Option<Weights<f32>>) -> Self {
        Self {
            weights,
            ..Self::new(decay)
        }
    }

    /// Whether the weights after step `step` are folded in.
    pub fn due(step: u64) -> bool {
        step > 0 && step.is_multiple_of(EVERY)
    }

    /// Whether a run at step `step` has folded at least once (and so must
    /// have saved an average).
    pub fn due_by(step: u64) -> bool {
        step >= EVERY
    }

    /// The weight of the old average in the fold at `step`: the decay's,
    /// or the young run's ramp `((1 + step) / (10 + step))^EVERY` when
    /// that is lower.
    fn keep_at(&self, step: u64) -> f32 {
        let t = f64::from(u32::try_from(step).unwrap_or(u32::MAX));
        let steps = i32::try_from(EVERY).unwrap_or(i32::MAX);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a ratio in (0, 1) to the tenth power is in (0, 1): f32 holds it"
        )]
        let ramp = ((1.0 + t) / (10.0 + t)).powi(steps) as f32;
        self.keep.min(ramp)
    }

    /// Folds `w`, the weights after step `step`, into the average:
    /// `avg += (1 - keep) (w - avg)`, or starts it at `w`.
    pub fn fold(&mut self, w: &Weights<f32>, step: u64) {
        let take = 1.0 - self.keep_at(step);
        match &mut self.weights {
            None => self.weights = Some(w.clone()),
            Some(avg) => {
                for (a, x) in avg.tensors_mut().into_iter().zip(w.tensors()) {
                    for (a, &x) in a.iter_mut().zip(x) {
                        *a += take * (x - *a);
                    }
                }
            }
        }
    }

    /// The average, once a fold has started it.
    pub fn weights(&self) -> Option<&Weights<f32>> {
        self.weights.as_ref()
    }

    /// The average to change in place (a weight edit changes it as it
    /// changes the trained weights, `super::edit`).
    pub fn weights_mut(&mut self) -> Option<&mut Weights<f32>> {
        self.weights.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mamba3::Mamba3Config;

    fn tiny() -> Mamba3Config {
        Mamba3Config {
            d_model: 16,
            n_layer: 1,
            d_state: 8,
            headdim: 8,
            vocab_size: 8,
            ..Mamba3Config::default()
        }
    }

    fn filled(cfg: &Mamba3Config, v: f32) -> Weights<f32> {
        let mut w = Weights::<f32>::zeros(cfg);
        for t in w.tensors_mut() {
            t.fill(v);
        }
        w
    }

    #[test]
    fn folds_every_tenth_step_with_the_decay_of_ten_steps() {
        let cfg = tiny();
        assert!(!Ema::due(0) && !Ema::due(9) && Ema::due(10) && Ema::due(20));
        let mut ema = Ema::new(0.99);
        assert!(ema.weights().is_none());
        // Late enough that the ramp (1 + t) / (10 + t) is above 0.99.
        ema.fold(&filled(&cfg, 1.0), 2000);
        ema.fold(&filled(&cfg, 3.0), 2010);
        let keep = 0.99f64.powi(10);
        let want = keep + (1.0 - keep) * 3.0;
        let avg = ema.weights().expect("started");
        for t in avg.tensors() {
            for &a in t {
                assert!((f64::from(a) - want).abs() < 1e-6, "{a} vs {want}");
            }
        }
        let back = Ema::restored(0.99, Some(avg.clone()));
        assert_eq!(back, ema);
    }

    #[test]
    fn a_short_run_keeps_almost_none_of_its_first_weights() {
        let cfg = tiny();
        // The first fold's weights are 1, every later one 0: what is left
        // of the 1 after 3000 steps is their share of the average.
        let mut ema = Ema::new(0.999);
        ema.fold(&filled(&cfg, 1.0), EVERY);
        let zero = filled(&cfg, 0.0);
        for step in (2 * EVERY..=3000).step_by(10) {
            ema.fold(&zero, step);
        }
        let share = ema.weights().expect("started").tensors()[0][0];
        assert!(
            share < 1e-3,
            "{share}: the fixed decay alone would leave 0.999^2990 = 5%"
        );
        // Once past the ramp, the decay alone: a fold at step 1e6 keeps
        // 0.999^10 of the old average.
        let mut late = Ema::new(0.999);
        late.fold(&filled(&cfg, 1.0), 1_000_000);
        late.fold(&zero, 1_000_010);
        let left = late.weights().expect("started").tensors()[0][0];
        assert!((f64::from(left) - 0.999f64.powi(10)).abs() < 1e-6, "{left}");
    }
}
