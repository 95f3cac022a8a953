//! The bf16 mixed-precision training step, derived from
//! `specs/mamba3_bf16.ron`: the derive generates `Mamba3Bf16Capture`,
//! `Mamba3Bf16Replay` and `Mamba3Bf16Graph` and `Bf16Step::run_eager`,
//! side by side with the f32 step's types.
//!
//! Context scratch: `half_staging` (bf16 copies of f32 gradients feeding a
//! GEMM) is presized for the step's shape by [`Bf16Step::new`];
//! `gemm_workspace` and `reduce_partials` are presized by the context. The
//! capture freezes all three, and its guards snapshot their addresses.

use crate::TrainingGraph;
use crate::device::{DeviceBuffer, Gpu};
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu;
use crate::optim::AdamWConfig;
use crate::optim::DecayPolicy;
use crate::optim::gpu::{AdamWState, StepScalars};
use crate::optim::step_control::{StepControl, loss_weights_for};

use super::acts::MixedActs;
use super::mixed::{MixedWeights, presize_staging};
use super::{Grads, Mamba3GpuError};

/// One mixed-precision training step's buffers; the graph lives beside the
/// memory it points into.
#[derive(Debug, TrainingGraph)]
#[graph(spec = "../../../../specs/mamba3_bf16.ron")]
pub struct Bf16Step {
    /// f32 master weights and bf16 GEMM copies.
    pub weights: MixedWeights,
    /// AdamW moments (f32).
    pub adam: AdamWState,
    /// lr, step count and bias corrections on the device.
    pub sched: StepScalars,
    /// f32 gradients of the masters and backward working memory.
    pub grads: Grads,
    /// Forward activations (bf16 GEMM operands, f32 otherwise).
    pub acts: MixedActs,
    /// Schedule, clipping, skip counters and the step's report.
    pub control: StepControl,
    /// `[batch, seq_len + 1]` token ids (written by the host before a step).
    pub tokens: DeviceBuffer<i32>,
    /// `[batch * seq_len]` loss weight per prediction (written by the host).
    pub loss_weights: DeviceBuffer<f32>,
    /// Weighted loss of the last step.
    pub loss: DeviceBuffer<f32>,
}

impl Bf16Step {
    /// Uploads `weights` (f32 masters plus bf16 copies), allocates everything
    /// a `batch x seq_len` step needs and presizes `half_staging` for it.
    pub fn new<T: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        weights: &cpu::Weights<T>,
        adamw: &AdamWConfig,
        policy: &DecayPolicy,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError> {
        let acts = MixedActs::new(gpu, cfg, batch, seq_len)?;
        presize_staging::<half::bf16>(gpu, &acts.shape)?;
        let rows = acts.shape.rows;
        // Equal weights (the plain mean), constant lr, no clipping.
        let uniform = loss_weights_for(rows, |_| true).ok_or(Mamba3GpuError::Shape {
            what: "predictions per step",
            expected: 1,
            found: rows,
        })?;
        Ok(Self {
            weights: MixedWeights::upload(gpu, cfg, weights)?,
            adam: AdamWState::new(gpu, cfg, policy)?,
            sched: StepScalars::new(gpu, adamw)?,
            grads: Grads::new(gpu, cfg, batch, seq_len)?,
            acts,
            control: StepControl::new(gpu, cfg, adamw.lr, Vec::new())?,
            tokens: gpu.alloc_zeros::<i32>(batch * (seq_len + 1))?,
            loss_weights: gpu.to_device(&uniform)?,
            loss: gpu.alloc_zeros::<f32>(1)?,
        })
    }

    /// Copies a `[batch, seq_len + 1]` token window into the step's input,
    /// checking every id against the vocabulary (a kernel cannot report one).
    pub fn set_tokens(&mut self, gpu: &Gpu, ids: &[i32]) -> Result<(), Mamba3GpuError> {
        upload_tokens(gpu, self.weights.cfg().vocab_size, ids, &mut self.tokens)
    }

    /// The loss of the last step (synchronizes).
    pub fn loss(&self, gpu: &Gpu) -> Result<f32, Mamba3GpuError> {
        let v = gpu.to_host(&self.loss)?;
        Ok(v.first().copied().unwrap_or(f32::NAN))
    }
}

/// Checks `ids` against `vocab` and copies them into `tokens`.
pub(crate) fn upload_tokens(
    gpu: &Gpu,
    vocab: usize,
    ids: &[i32],
    tokens: &mut DeviceBuffer<i32>,
) -> Result<(), Mamba3GpuError> {
    if let Some(&bad) = ids
        .iter()
        .find(|&&t| !usize::try_from(t).is_ok_and(|t| t < vocab))
    {
        return Err(Mamba3GpuError::Shape {
            what: "token id (must be in [0, vocab_size))",
            expected: vocab,
            found: usize::try_from(bad).unwrap_or(usize::MAX),
        });
    }
    gpu.copy_from_host(ids, tokens)?;
    Ok(())
}
