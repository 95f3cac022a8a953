//! The learning-rate schedule: linear warmup, then cosine decay to a floor.
//!
//! It is a pure function of the step index so that every engine computes the
//! same value: the CPU engine calls [`LrSchedule::lr`] on the host, a GPU
//! engine evaluates the same formula on the device from its device-resident
//! step counter (so a captured graph never bakes an lr in by value). The
//! formula is written out in [`LrSchedule::lr`] for that purpose.

use serde::{Deserialize, Serialize};

/// Linear warmup over `warmup` steps to `peak`, then a half cosine from
/// `peak` down to `min_lr` at step `total`, constant after.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Learning rate at the end of warmup.
    pub peak: f64,
    /// Floor the cosine reaches at `total` (and keeps after).
    pub min_lr: f64,
    /// Warmup steps (0: start at `peak`).
    pub warmup: u64,
    /// Step count the cosine spans (the run's `--steps`).
    pub total: u64,
}

impl LrSchedule {
    /// The learning rate of step `step` (0-based: the first step is 0).
    ///
    /// ```text
    /// step <  warmup:  peak * (step + 1) / warmup
    /// step >= warmup:  p = min(1, (step - warmup) / max(1, total - warmup))
    ///                  min_lr + (peak - min_lr) * (1 + cos(pi * p)) / 2
    /// ```
    ///
    /// The `+ 1` makes the first step train (lr > 0) and the last warmup step
    /// reach `peak` exactly.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            // u64 -> f64 is exact below 2^53; step counts never get near it.
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.peak - self.min_lr) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::LrSchedule;

    const S: LrSchedule = LrSchedule {
        peak: 1e-3,
        min_lr: 1e-5,
        warmup: 10,
        total: 110,
    };

    #[test]
    fn warmup_is_linear_and_reaches_peak() {
        assert!((S.lr(0) - 1e-4).abs() < 1e-15);
        assert!((S.lr(4) - 5e-4).abs() < 1e-15);
        assert_eq!(S.lr(9), 1e-3);
        for s in 0..9 {
            assert!(S.lr(s) < S.lr(s + 1));
        }
    }

    #[test]
    fn cosine_decays_monotonically_to_the_floor() {
        assert_eq!(S.lr(10), 1e-3);
        // Halfway through the cosine the lr is the midpoint.
        assert!((S.lr(60) - (1e-3 + 1e-5) / 2.0).abs() < 1e-12);
        for s in 10..120 {
            assert!(S.lr(s + 1) <= S.lr(s), "step {s}");
        }
        assert!((S.lr(110) - 1e-5).abs() < 1e-15);
        assert!((S.lr(10_000) - 1e-5).abs() < 1e-15);
    }

    #[test]
    fn degenerate_schedules_stay_finite() {
        let none = LrSchedule {
            warmup: 0,
            total: 0,
            ..S
        };
        assert_eq!(none.lr(0), 1e-3);
        assert!((none.lr(1) - 1e-5).abs() < 1e-15);
        let all_warmup = LrSchedule {
            warmup: 5,
            total: 5,
            ..S
        };
        assert_eq!(all_warmup.lr(4), 1e-3);
        assert!(all_warmup.lr(5).is_finite());
    }
}
