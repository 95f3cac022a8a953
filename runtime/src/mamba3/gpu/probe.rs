//! The timing hook of the forward and backward bodies.
//!
//! [`forward_probed`](super::forward_probed) and
//! [`backward_probed`](super::backward_probed) call [`Probe::enter`] before
//! each op (or small group of ops) with the op's [`Family`] and name, so a
//! bench can time the step's own launch sequence instead of a copy of it.
//! The step ops pass [`NoProbe`], whose `enter` does nothing and is inlined
//! away: the launches, their order, and so the captured graph and the
//! numerics, are those of a body without the hook.

use crate::device::{Gpu, GpuError};

/// The families of the eager-time breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// cuBLAS GEMMs (projections, LM head).
    Gemm,
    /// The chunked scan and the angle cumsums, forward and backward.
    Scan,
    /// Norms, gates, rotations, per-head scalars, residual copies, the
    /// embedding, and the column sums that finish parameter gradients.
    NormElementwise,
    /// Cross-entropy forward and backward, the mean.
    Loss,
    /// Zeroing gradients, the schedule and AdamW.
    Optimizer,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 5] = [
        Family::Gemm,
        Family::Scan,
        Family::NormElementwise,
        Family::Loss,
        Family::Optimizer,
    ];

    /// The table's column label.
    pub fn label(self) -> &'static str {
        match self {
            Family::Gemm => "GEMM",
            Family::Scan => "scan",
            Family::NormElementwise => "norm/elem",
            Family::Loss => "loss",
            Family::Optimizer => "optimizer",
        }
    }
}

/// Told where each op of a pass begins. The work queued between one `enter`
/// and the next (or the end of the pass) belongs to the first one's op.
pub trait Probe {
    /// The op `op` of family `family` is about to be launched on `gpu`.
    fn enter(&mut self, gpu: &Gpu, family: Family, op: &'static str) -> Result<(), GpuError>;
}

/// The probe of the training steps: does nothing, so captures hold exactly
/// the step's kernels.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbe;

impl Probe for NoProbe {
    #[inline(always)]
    fn enter(&mut self, _: &Gpu, _: Family, _: &'static str) -> Result<(), GpuError> {
        Ok(())
    }
}
