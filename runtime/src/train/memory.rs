//! The memory a run will need, estimated from its flags before anything is
//! allocated, and checked against the host (CPU engine) or the device (GPU
//! engines). A model or batch that cannot fit is a usage error naming the
//! flags that size the biggest part, not an allocator abort minutes later.
//!
//! The estimate counts what the engines keep: parameters with their
//! gradients and AdamW moments (the CPU engine also one gradient per row
//! chunk and the copies a checkpoint makes), the forward tape of every layer
//! for each training token plus one layer's backward working set, and the
//! forward tape of the largest evaluation chunk (the loop evaluates in row
//! chunks of at most a training batch's predictions, see
//! [`eval_chunk_rows`]). It is an estimate: within a factor of about two of
//! the measured peak for the shapes the tests and the README use, and all in
//! `u128`, so absurd flags cannot overflow it.

use std::num::Saturating;

use super::TrainError;
use super::cpu::CHUNKS;
use crate::mamba3::Mamba3Config;

/// What a run needs, in bytes, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Parameters, gradients, moments and their copies.
    pub params: u128,
    /// One training step's activations.
    pub step: u128,
    /// The largest evaluation chunk's activations.
    pub eval: u128,
}

impl Estimate {
    /// The total.
    pub fn total(&self) -> u128 {
        self.params
            .saturating_add(self.step)
            .saturating_add(self.eval)
    }

    /// The flags that size the largest part, for the refusal message.
    pub fn biggest(&self) -> &'static str {
        if self.params >= self.step && self.params >= self.eval {
            "--d-model/--n-layer/--expand/--d-state (the model)"
        } else if self.step >= self.eval {
            "--batch/--train-len/--seq-len (the training batch)"
        } else {
            "--eval-lens (the longest evaluated size)"
        }
    }
}

/// Which engine will hold the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The CPU engine (host memory).
    Cpu,
    /// A GPU engine with GEMM operands of this many bytes (4 f32, 2 bf16).
    Gpu {
        /// Bytes per GEMM operand element.
        operand_bytes: u8,
    },
}

/// A size in saturating arithmetic: absurd flags give `u128::MAX`, never a
/// wrapped small number.
type Sz = Saturating<u128>;

fn u(x: usize) -> Sz {
    Saturating(u128::try_from(x).unwrap_or(u128::MAX))
}

/// Parameters of `cfg` (a validated config), counted per layer so a huge
/// `n_layer` costs nothing.
pub fn param_count(cfg: &Mamba3Config) -> u128 {
    let count = |n_layer: usize| -> Sz {
        let c = Mamba3Config {
            n_layer,
            ..cfg.clone()
        };
        crate::mamba3::cpu::param_specs(&c)
            .iter()
            .fold(Saturating(0), |a, s| a + u(s.numel()))
    };
    let (globals, one) = (count(0), count(1));
    (globals + u(cfg.n_layer) * (one - globals)).0
}

/// f32 values the forward pass keeps per token: every layer's tape, and the
/// final norm and logits.
fn tape_per_token(cfg: &Mamba3Config) -> (Sz, Sz) {
    let (d, di, e) = (u(cfg.d_model), u(cfg.d_inner()), u(cfg.d_in_proj()));
    let (h, n, p, s) = (
        u(cfg.nheads()),
        u(cfg.d_state),
        u(cfg.headdim),
        u(cfg.num_rope_angles()),
    );
    let g = u(cfg.ngroups);
    let cs = u(cfg.chunk_size.max(1));
    let one = Saturating(1);
    // Block input, norm, mixer input, in_proj output, group norms, angles,
    // dt/adt/lambda, cumulative angles, rotated q and k, gated outputs, and
    // the chunked scan's per-head intermediates and chunk states.
    let per_layer = Saturating(2) * d
        + one
        + e
        + Saturating(2) * g
        + s
        + Saturating(4) * h
        + h * s
        + Saturating(2) * h * n
        + Saturating(3) * di
        + h * (p + Saturating(4) + n + Saturating((p * n).0.div_ceil(cs.0)));
    let globals = Saturating(2) * d + one + Saturating(2) * u(cfg.padded_vocab_size());
    (per_layer, globals)
}

/// Rows of one evaluation chunk of `width`-token rows when training
/// batches hold `train_predictions` predictions: evaluation never holds
/// more activations than a training step (or one row).
pub fn eval_chunk_rows(train_predictions: usize, width: usize) -> usize {
    let len = width.saturating_sub(1).max(1);
    (train_predictions.max(len) / len).max(1)
}

/// The estimate for training `rows x train_width` batches and evaluating
/// rows of `eval_widths` tokens (in chunks of [`eval_chunk_rows`]), for a
/// validated `cfg`.
pub fn estimate(
    cfg: &Mamba3Config,
    holder: Holder,
    rows: usize,
    train_width: usize,
    eval_widths: &[usize],
) -> Estimate {
    let params = Saturating(param_count(cfg));
    let (per_layer, globals) = tape_per_token(cfg);
    let layers = u(cfg.n_layer);
    let four = Saturating(4);
    let tokens = u(rows) * u(train_width.saturating_sub(1));
    let forward = |tokens: Sz| four * tokens * (layers * per_layer + globals);
    let (param_floats, extra) = match holder {
        // Weights, m, v; one gradient per row chunk and their sum; and the
        // weights and moments a checkpoint copies out.
        Holder::Cpu => (u(CHUNKS) + Saturating(7), Saturating(0)),
        // Master weights, gradients, m, v; bf16 compute copies.
        Holder::Gpu { operand_bytes } => {
            let copies = if operand_bytes < 4 {
                Saturating(u128::from(operand_bytes)) * params
            } else {
                Saturating(0)
            };
            (four, copies)
        }
    };
    // Backward: one layer's gradients of the tape at a time, plus the
    // logits' gradient.
    let backward = four * tokens * (per_layer + Saturating(2) * u(cfg.padded_vocab_size()));
    let train_predictions = rows.saturating_mul(train_width.saturating_sub(1));
    let eval = eval_widths
        .iter()
        .map(|&w| {
            let chunk = u(eval_chunk_rows(train_predictions, w));
            forward(chunk * u(w.saturating_sub(1))).0
        })
        .max()
        .unwrap_or(0);
    Estimate {
        params: (four * param_floats * params + extra).0,
        step: (forward(tokens) + backward).0,
        eval,
    }
}

/// Bytes of host memory a new allocation can take: the available memory,
/// lowered to the cgroup's free memory when a container limits it. `None`
/// when the platform does not say.
pub fn host_available() -> Option<u128> {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()),
    )
    .ok()?;
    let available = sys.available_memory();
    if available == 0 {
        return None;
    }
    let limited = sys
        .cgroup_limits()
        .map_or(available, |c| c.free_memory.min(available));
    Some(u128::from(limited))
}

/// `12.3 GiB`-style size.
pub fn gib(bytes: u128) -> String {
    let mib = bytes >> 20;
    if mib >= 1 << 30 {
        format!("{} PiB", mib >> 30)
    } else if mib >= 1024 {
        let tenths = mib * 10 / 1024;
        format!("{}.{} GiB", tenths / 10, tenths % 10)
    } else if mib == 0 {
        "under 1 MiB".into()
    } else {
        format!("{mib} MiB")
    }
}

/// Refuses a run whose estimate exceeds `available` bytes of `place`.
pub fn check(e: &Estimate, available: Option<u128>, place: &str) -> Result<(), TrainError> {
    let Some(have) = available else {
        return Ok(());
    };
    if e.total() <= have {
        return Ok(());
    }
    Err(TrainError::TooBig {
        flags: e.biggest(),
        need: gib(e.total()),
        parts: format!(
            "model and optimizer {}, training step {}, evaluation {}",
            gib(e.params),
            gib(e.step),
            gib(e.eval)
        ),
        have: gib(have),
        place: place.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_count_matches_the_specs() {
        for n_layer in [1, 3] {
            let cfg = Mamba3Config {
                n_layer,
                ..Mamba3Config::tiny()
            };
            let direct: usize = crate::mamba3::cpu::param_specs(&cfg)
                .iter()
                .map(|s| s.numel())
                .sum();
            assert_eq!(param_count(&cfg), u(direct).0);
        }
    }

    #[test]
    fn eval_chunks_hold_at_most_a_training_batch() {
        assert_eq!(eval_chunk_rows(64 * 17, 18), 64);
        assert_eq!(eval_chunk_rows(64 * 17, 100_002), 1);
        assert_eq!(eval_chunk_rows(64 * 17, 35), 32);
        assert_eq!(eval_chunk_rows(0, 0), 1);
    }

    #[test]
    fn absurd_sizes_do_not_overflow_and_are_refused() {
        let cfg = Mamba3Config {
            d_model: 1_000_000,
            n_layer: 1 << 40,
            ..Mamba3Config::tiny()
        };
        cfg.validate().unwrap();
        let e = estimate(&cfg, Holder::Cpu, usize::MAX, usize::MAX, &[usize::MAX]);
        assert_eq!(e.total(), u128::MAX, "saturates");
        assert!(check(&e, Some(1 << 34), "the host").is_err());
        // A model too big for the machine is blamed on the model flags.
        let e = estimate(&cfg, Holder::Cpu, 64, 17, &[18]);
        let err = check(&e, Some(1 << 34), "the host").unwrap_err();
        assert!(err.to_string().contains("lower --d-model"), "{err}");
    }

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(gib(512 << 20), "512 MiB");
        assert_eq!(gib(3 << 30), "3.0 GiB");
        assert_eq!(gib((3 << 30) + (512 << 20)), "3.5 GiB");
    }
}
