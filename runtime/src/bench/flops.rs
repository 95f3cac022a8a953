//! Model FLOPs of one training step, counted from the configuration
//! (BENCHMARKS.md, "FLOP formula", says the same in prose).
//!
//! Only matrix products count, as in the usual MFU convention; norms, gates,
//! rotations, the loss and the optimizer are memory-bound and left out.
//!
//! * **GEMMs**, exact: per block `in_proj` (`2 rows d_model d_in_proj`) and
//!   `out_proj` (`2 rows d_inner d_model`), and the LM head
//!   (`2 rows d_model V`, V the padded vocabulary); the backward pass costs
//!   twice the forward (input and weight gradients), so each counts three
//!   times.
//! * **Scan**, the chunked form (reference §2.3) as dense chunk matrices, the
//!   way a tensor-core kernel computes them: per (batch row, head) and chunk
//!   of `c` steps, `Q S^T` and the state update `V^T K~` (`2 c P N` each),
//!   the score matrix `Q K~^T` (`2 c^2 N`) and `scores V` (`2 c^2 P`). The
//!   backward pass differentiates each product into two of the same size, so
//!   the scan counts three times too; a backward kernel that recomputes the
//!   scores does more work than this, and that extra is not model FLOPs.

use crate::mamba3::Mamba3Config;

/// FLOPs of one step over `batch x seq_len` tokens, by family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StepFlops {
    /// Tokens per step.
    pub tokens: u64,
    /// `in_proj` and `out_proj` of every block, forward and backward.
    pub gemm_backbone: u64,
    /// The LM head, forward and backward.
    pub gemm_head: u64,
    /// The chunked scan of every block, forward and backward.
    pub scan: u64,
}

impl StepFlops {
    /// The full LM step: backbone, head and scan.
    pub fn full(&self) -> u64 {
        self.gemm_backbone + self.gemm_head + self.scan
    }

    /// The backbone step (no embedding, LM head or loss).
    pub fn backbone(&self) -> u64 {
        self.gemm_backbone + self.scan
    }

    /// Full-step FLOPs per token.
    pub fn full_per_token(&self) -> f64 {
        ratio(self.full(), self.tokens)
    }

    /// Backbone FLOPs per token.
    pub fn backbone_per_token(&self) -> f64 {
        ratio(self.backbone(), self.tokens)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "statistics only: a rounding f64 conversion is what is wanted here"
    )]
    let (a, b) = (a as f64, b as f64);
    if b == 0.0 { 0.0 } else { a / b }
}

fn w(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Forward FLOPs of the chunked scan for one (batch row, head) over a
/// `seq_len` window: the four products of every chunk, the last one short
/// when `chunk` does not divide `seq_len`.
pub fn scan_forward_per_head(cfg: &Mamba3Config, seq_len: usize) -> u64 {
    let (p, n) = (w(cfg.headdim), w(cfg.d_state));
    let chunk = cfg.chunk_size.max(1);
    let mut total = 0u64;
    let mut start = 0;
    while start < seq_len {
        let c = w(chunk.min(seq_len - start));
        total += 4 * c * p * n + 2 * c * c * (n + p);
        start += chunk;
    }
    total
}

/// The model FLOPs of one training step (see the module docs).
pub fn step_flops(cfg: &Mamba3Config, batch: usize, seq_len: usize) -> StepFlops {
    let rows = w(batch) * w(seq_len);
    let (dm, di) = (w(cfg.d_model), w(cfg.d_inner()));
    let per_layer_fwd = 2 * rows * dm * w(cfg.d_in_proj()) + 2 * rows * di * dm;
    let head_fwd = 2 * rows * dm * w(cfg.padded_vocab_size());
    let scan_fwd = w(batch) * w(cfg.nheads()) * scan_forward_per_head(cfg, seq_len);
    StepFlops {
        tokens: rows,
        gemm_backbone: 3 * w(cfg.n_layer) * per_layer_fwd,
        gemm_head: 3 * head_fwd,
        scan: 3 * w(cfg.n_layer) * scan_fwd,
    }
}

/// Trainable parameters of the model (every tensor of the checkpoint).
pub fn param_count(cfg: &Mamba3Config) -> u64 {
    crate::mamba3::cpu::param_specs(cfg)
        .iter()
        .map(|s| w(s.numel()))
        .sum()
}
