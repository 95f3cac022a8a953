//! The Mamba-3 SISO language model on the GPU, in f32 and in bf16 mixed
//! precision: device-resident weights, gradients and activations, and the
//! model's ops of the training steps (`specs/mamba3_f32.ron`,
//! `specs/mamba3_bf16.ron`; the step structs live in [`crate::step`]).
//!
//! One forward and one backward body ([`forward_probed`],
//! [`backward_probed`]; the step ops [`forward`] and [`backward`] call them
//! with the do-nothing [`NoProbe`]), generic over the compute type of the
//! GEMM operands ([`ModelCompute`]): f32, or bf16 (f32 masters, bf16 GEMM
//! copies, f32 scan/norms/reductions; see [`MixedWeights`]).
//!
//! The math is the CPU oracle's ([`crate::mamba3::cpu`]), with the scan in
//! its chunked form (reference §2.3): one thread block per (batch row, head)
//! walks the chunks, carrying the state; the backward pass walks them in
//! reverse from the chunk-entry states the forward pass kept. The projections
//! and the LM head are cuBLAS f32 GEMMs (IEEE, no TF32). Every reduction that
//! feeds a gradient runs in a fixed order (per-row contributions, then a
//! two-pass column sum), so two runs, and eager vs replayed, are
//! bit-identical.
//!
//! Ops ([`zero_grads`], [`forward`], [`backward`]) take the context first and
//! the step buffers in spec order; they allocate nothing, copy nothing to or
//! from the host and never synchronize, so they run unchanged under a graph
//! capture (`step::Mamba3Step` derives the capture/replay code from the
//! specs) and eagerly.
//!
//! A training window always starts from a zero state (no carry across
//! windows), as the step spec describes; the CPU oracle's `forward(.., None, ..)`.

mod acts;
mod backward;
mod forward;
mod mixed;
mod probe;
mod shape;
mod weights;

pub use acts::{Acts, BackwardWork, LayerActs, MixedActs, tensor_core_scan};
pub use backward::{backward, backward_probed, blocks_backward};
pub use forward::{blocks_forward, forward, forward_probed, zero_grads};
pub use mixed::{MixedLayer, MixedWeights, presize_staging, staging_bytes, sync_master_to_compute};
pub use probe::{Family, NoProbe, Probe};
pub use shape::kernel_shape;
pub use weights::{GemmPair, Grads, LayerWeights, ModelCompute, StepWeights, Weights};

use thiserror::Error;

use crate::device::GpuError;
use crate::graph::{CaptureViolation, OpError};
use crate::mamba3::ConfigError;

/// What a GPU Mamba-3 op or constructor can fail with.
#[derive(Debug, Error)]
pub enum Mamba3GpuError {
    /// A device call or kernel launch failed (or was refused in a capture).
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Two buffers of one step disagree about a size.
    #[error("{what}: expected {expected}, found {found}")]
    Shape {
        /// What disagrees.
        what: &'static str,
        /// The size the step was built for.
        expected: usize,
        /// The size found.
        found: usize,
    },
    /// Weights from the CPU model that do not fit the configuration.
    #[error("weights do not fit the configuration: {0}")]
    Weights(#[from] crate::mamba3::cpu::ModelError),
    /// Packed rows (sequence starts inside a row) at a head shape whose
    /// scan takes none.
    #[error(
        "packed rows need the warp scan, which takes heads of headdim x d_state 8 or 16 x 32 or 64, or 32 x 32; this model's are {headdim} x {d_state}"
    )]
    Packed {
        /// Head dimension P.
        headdim: usize,
        /// State size N.
        d_state: usize,
    },
}

impl OpError for Mamba3GpuError {
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        match self {
            Self::Gpu(e) => e.capture_violation(),
            _ => None,
        }
    }
}

/// Fails unless `found >= expected`, naming `what`: an input buffer sized
/// for the widest window a step runs holds every narrower one
/// ([`Acts::set_len`]).
pub(crate) fn at_least(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), Mamba3GpuError> {
    shape_check(found >= expected, what, expected, found)
}

/// Fails unless `found == expected`, naming `what`.
pub(crate) fn same(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), Mamba3GpuError> {
    shape_check(found == expected, what, expected, found)
}

fn shape_check(
    ok: bool,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), Mamba3GpuError> {
    if ok {
        Ok(())
    } else {
        Err(Mamba3GpuError::Shape {
            what,
            expected,
            found,
        })
    }
}
