//! How a task's training sizes are drawn over a run. Each row's size is
//! uniform in a range that moves with the batch count: a curriculum grows
//! the largest size linearly from a start (`--curriculum-start`, else the
//! task's smallest) to the training size, optionally only on batches whose
//! smoothed loss is below a gate (`--curriculum-gate`); once the largest
//! size is the training size, a floor (`--train-min-len`) may raise the
//! smallest. Long instances of a state-tracking task carry almost no
//! gradient signal until short ones are solved, which is what all three
//! shape.

use std::ops::RangeInclusive;

/// The size schedule of one run (`DataSpec::Task`'s curriculum fields,
/// with the task's smallest size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Curriculum {
    /// The task's smallest size.
    pub smallest: usize,
    /// The training size, the largest once the curriculum has ended.
    pub train_len: usize,
    /// Batches the largest size grows over (0: no curriculum).
    pub steps: u64,
    /// Smoothed loss below which the curriculum advances (0: always).
    pub gate: f64,
    /// The largest size of the first batch (0: the task's smallest).
    pub start: usize,
    /// The smallest size once the curriculum has ended (0: the task's).
    pub floor: usize,
}

impl Curriculum {
    /// Whether a loss gate paces the curriculum.
    pub fn is_gated(&self) -> bool {
        self.gate > 0.0
    }

    /// Whether the next batch advances the curriculum's clock, given the
    /// smoothed training loss so far.
    pub fn advances(&self, smoothed_loss: Option<f64>) -> bool {
        !self.is_gated() || smoothed_loss.is_some_and(|l| l < self.gate)
    }

    /// The largest size of the first batch, within the task's sizes and
    /// the training size.
    fn first_largest(&self) -> usize {
        self.start.max(self.smallest).min(self.train_len)
    }

    /// The largest size drawn once the clock reads `clock`.
    pub fn largest(&self, clock: u64) -> usize {
        curriculum_max(self.first_largest(), self.train_len, self.steps, clock)
    }

    /// Whether the largest size has reached the training size (at once
    /// without a curriculum): what the floor and skewed rows wait for.
    pub fn ended(&self, clock: u64) -> bool {
        self.largest(clock) >= self.train_len
    }

    /// The sizes drawn once the clock reads `clock`. The floor waits for
    /// the curriculum's end: short rows are what a run first learns from
    /// (tests/gpu/STATE-TRACKING.md, "Arithmetic at full length"; round 17).
    pub fn drawn(&self, clock: u64) -> RangeInclusive<usize> {
        let hi = self.largest(clock);
        let lo = if self.ended(clock) {
            self.floor.max(self.smallest).min(hi)
        } else {
            self.smallest
        };
        lo..=hi
    }

    /// The sizes for a run's start line: `1..=80 (from 40 once the
    /// curriculum has ended) (largest size growing from 1 over 4000
    /// batches)`.
    pub fn describe(&self) -> String {
        let curriculum = self.steps > 0;
        let lo = if curriculum {
            self.smallest
        } else {
            self.floor.max(self.smallest)
        };
        let mut out = format!("{lo}..={}", self.train_len);
        if curriculum && self.floor > self.smallest {
            out.push_str(&format!(
                " (from {} once the curriculum has ended)",
                self.floor
            ));
        }
        if curriculum {
            out.push_str(&format!(
                " (largest size growing from {} over {} batches",
                self.first_largest(),
                self.steps
            ));
            if self.is_gated() {
                out.push_str(&format!(" whose smoothed loss is below {}", self.gate));
            }
            out.push(')');
        }
        out
    }
}

/// The largest size drawn for training batch `batch` (1-based): it grows
/// linearly from `min` to `max` over the first `curriculum` batches.
fn curriculum_max(min: usize, max: usize, curriculum: u64, batch: u64) -> usize {
    if curriculum == 0 || batch >= curriculum || max <= min {
        return max;
    }
    let Ok(span) = u128::try_from(max - min) else {
        return max;
    };
    let (batch, curriculum) = (u128::from(batch), u128::from(curriculum));
    let grown = usize::try_from(span * batch / curriculum).unwrap_or(max - min);
    (min + grown).min(max)
}

#[cfg(test)]
mod tests {
    use super::super::{DataSpec, Dataset, Task};
    use super::curriculum_max;
    use rand::SeedableRng;

    /// `modarith-prec` up to 21 operands over a 20-batch curriculum.
    fn data(
        curriculum_gate: f64,
        curriculum_start: usize,
        train_min_len: usize,
        seed: u64,
        batch: usize,
    ) -> Dataset {
        let spec = DataSpec::Task {
            task: Task::ModarithPrec,
            train_len: 21,
            eval_lens: vec![21],
            curriculum: 20,
            curriculum_gate,
            curriculum_start,
            train_min_len,
            skewed_rows: 0.0,
            skew_drop: 0.0,
            eval_mix: None,
            eval_products: None,
        };
        Dataset::new(&spec, seed, batch).unwrap()
    }

    fn gated(gate: f64) -> Dataset {
        data(gate, 0, 0, 3, 4)
    }

    #[test]
    fn a_gated_curriculum_waits_for_the_loss() {
        let mut d = gated(0.5);
        let min = Task::ModarithPrec.min_len();
        for _ in 0..5 {
            d.next_batch(4).unwrap();
            d.observe_loss(1.6);
        }
        assert_eq!(d.largest_size(), Some(min), "held while the loss is high");
        // The average follows the loss down over tens of steps, not at once.
        d.observe_loss(0.0);
        d.next_batch(4).unwrap();
        assert_eq!(
            d.largest_size(),
            Some(min),
            "one good batch does not open it"
        );
        for _ in 0..100 {
            d.observe_loss(0.1);
        }
        for _ in 0..10 {
            d.next_batch(4).unwrap();
        }
        assert_eq!(d.largest_size(), Some(curriculum_max(min, 21, 20, 10)));
        // Shut again: the size stays where it is, it does not shrink.
        for _ in 0..200 {
            d.observe_loss(1.6);
        }
        let at = d.largest_size();
        d.next_batch(4).unwrap();
        assert_eq!(d.largest_size(), at);
        // Skipped steps' non-finite losses are left out.
        let before = d.position().smoothed_loss;
        d.observe_loss(f64::NAN);
        assert_eq!(d.position().smoothed_loss, before);
        // The position carries the gate's state.
        let pos = d.position();
        let mut e = gated(0.5);
        e.restore(pos);
        assert_eq!(e.position(), pos);
        assert_eq!(
            e.next_batch(4).unwrap().tokens,
            d.next_batch(4).unwrap().tokens
        );
    }

    #[test]
    fn without_a_gate_the_clock_is_the_batch_count() {
        let mut d = gated(0.0);
        for _ in 0..7 {
            d.next_batch(4).unwrap();
            d.observe_loss(9.0);
        }
        let pos = d.position();
        assert_eq!((pos.clock, pos.batches, pos.smoothed_loss), (7, 7, None));
    }

    /// Each row's problem size, read from where its answer is scored.
    fn row_sizes(d: &mut Dataset, rows: usize) -> Vec<usize> {
        let task = Task::ModarithPrec;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0);
        let at: std::collections::HashMap<usize, usize> = (task.min_len()..=21)
            .map(|n| (task.sample(n, false, &mut rng).answers[0], n))
            .collect();
        let batch = d.next_batch(rows).unwrap();
        let mask = batch.mask.as_ref().unwrap();
        mask.chunks(batch.seq_len())
            .map(|row| at[&row.iter().position(|&m| m).unwrap()])
            .collect()
    }

    /// Draws `batches` batches of 64 rows and checks every row's size
    /// against `expected(batch)` (batches count from 1), whose end is the
    /// curriculum's largest size; returns the sizes of each batch.
    fn sizes_within(
        d: &mut Dataset,
        batches: u64,
        expected: impl Fn(u64) -> std::ops::RangeInclusive<usize>,
    ) -> Vec<Vec<usize>> {
        (1..=batches)
            .map(|b| {
                let range = expected(b);
                let sizes = row_sizes(d, 64);
                assert_eq!(d.largest_size(), Some(*range.end()), "batch {b}");
                for &n in &sizes {
                    assert!(range.contains(&n), "batch {b}: size {n} outside {range:?}");
                }
                sizes
            })
            .collect()
    }

    fn floored(train_min_len: usize) -> Dataset {
        data(0.0, 0, train_min_len, 5, 64)
    }

    fn started(curriculum_start: usize) -> Dataset {
        data(0.0, curriculum_start, 0, 7, 64)
    }

    #[test]
    fn a_curriculum_start_is_the_first_largest_size() {
        let min = Task::ModarithPrec.min_len();
        let mut d = started(10);
        assert!(
            d.describe().contains(&format!(
                "train sizes {min}..=21 (largest size growing from 10 over 20 batches)"
            )),
            "{}",
            d.describe()
        );
        let drawn = sizes_within(&mut d, 40, |b| min..=curriculum_max(10, 21, 20, b));
        assert_eq!(d.largest_size(), Some(21), "it ends at the training size");
        assert_eq!(
            drawn[0]
                .iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            (min..=10).collect(),
            "the first batch draws every size from the task's smallest to the start"
        );
        // A start at the task's smallest (or 0) is the plain curriculum, bit
        // for bit; a start above the training size is the training size.
        let (mut a, mut b, mut c) = (started(0), started(min), started(10));
        let (x, y, z) = (
            a.next_batch(16).unwrap(),
            b.next_batch(16).unwrap(),
            c.next_batch(16).unwrap(),
        );
        assert_eq!(x.tokens, y.tokens);
        assert_ne!(x.tokens, z.tokens);
        let mut over = started(99);
        over.next_batch(4).unwrap();
        assert_eq!(over.largest_size(), Some(21));
    }

    #[test]
    fn a_training_floor_draws_rows_between_it_and_the_curriculum_size() {
        let min = Task::ModarithPrec.min_len();
        let mut d = floored(15);
        assert!(
            d.describe().contains(&format!(
                "train sizes {min}..=21 (from 15 once the curriculum has ended)"
            )),
            "{}",
            d.describe()
        );
        let drawn = sizes_within(&mut d, 60, |b| {
            let hi = curriculum_max(min, 21, 20, b);
            (if hi == 21 { 15 } else { min })..=hi
        });
        assert_eq!(
            drawn[20..]
                .iter()
                .flatten()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            (15..=21).collect(),
            "every size of the range is drawn"
        );
        // Until the curriculum's end the floor changes nothing.
        let (mut a, mut b) = (floored(0), floored(15));
        for _ in 0..19 {
            assert_eq!(
                a.next_batch(8).unwrap().tokens,
                b.next_batch(8).unwrap().tokens
            );
        }
        let (x, y) = (a.next_batch(64).unwrap(), b.next_batch(64).unwrap());
        assert_ne!(x.tokens, y.tokens, "from the curriculum's end on it does");
        // The task's own minimum as the floor is the stream without one.
        let (mut a, mut b) = (floored(0), floored(min));
        for _ in 0..30 {
            assert_eq!(
                a.next_batch(8).unwrap().tokens,
                b.next_batch(8).unwrap().tokens
            );
        }
    }

    #[test]
    fn the_largest_size_grows_linearly_then_stays() {
        assert_eq!(curriculum_max(1, 160, 0, 1), 160, "off");
        assert_eq!(curriculum_max(1, 160, 100, 1), 2);
        assert_eq!(curriculum_max(1, 160, 100, 50), 80);
        assert_eq!(curriculum_max(1, 160, 100, 99), 158);
        assert_eq!(curriculum_max(1, 160, 100, 100), 160);
        assert_eq!(curriculum_max(1, 160, 100, 10_000), 160);
        assert_eq!(curriculum_max(5, 5, 100, 1), 5);
        let sizes: Vec<usize> = (1..=100).map(|b| curriculum_max(1, 160, 100, b)).collect();
        assert!(sizes.windows(2).all(|w| w[0] <= w[1]));
    }
}
