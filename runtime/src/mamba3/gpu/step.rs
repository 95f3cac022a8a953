//! The f32 training step, derived from `specs/mamba3_f32.ron`: the derive
//! generates `Mamba3F32Capture`, `Mamba3F32Replay` and `Mamba3F32Graph`
//! (capture, guarded replay) and `F32Step::run_eager`, all calling the same
//! op functions in spec order.

use crate::TrainingGraph;
use crate::device::{DeviceBuffer, Gpu};
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu;
use crate::optim::AdamWConfig;
use crate::optim::DecayPolicy;
use crate::optim::gpu::{AdamWState, StepScalars};
use crate::optim::step_control::StepControl;

use super::{Acts, Grads, Mamba3GpuError, Weights};

/// One f32 training step's buffers; the graph lives beside the memory it
/// points into.
#[derive(Debug, TrainingGraph)]
#[graph(spec = "../../../../specs/mamba3_f32.ron")]
pub struct F32Step {
    /// Trainable parameters.
    pub weights: Weights,
    /// AdamW moments.
    pub adam: AdamWState,
    /// lr, step count and bias corrections on the device.
    pub sched: StepScalars,
    /// Gradients and backward working memory.
    pub grads: Grads,
    /// Forward activations.
    pub acts: Acts,
    /// Schedule, clipping, skip counters and the step's report.
    pub control: StepControl,
    /// `[batch, seq_len + 1]` token ids (written by the host before a step).
    pub tokens: DeviceBuffer<i32>,
    /// `[batch * seq_len]` loss weight per prediction (written by the host).
    pub loss_weights: DeviceBuffer<f32>,
    /// Weighted loss of the last step.
    pub loss: DeviceBuffer<f32>,
}

impl F32Step {
    /// Uploads `weights` and allocates everything a `batch x seq_len` step
    /// needs (zero moments, step count 0, equal loss weights `1 / (batch *
    /// seq_len)`: the plain mean; constant lr `adamw.lr`, no clipping).
    pub fn new<T: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        weights: &cpu::Weights<T>,
        adamw: &AdamWConfig,
        policy: &DecayPolicy,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError> {
        let acts = Acts::new(gpu, cfg, batch, seq_len)?;
        let rows = acts.shape.rows;
        let uniform = crate::optim::step_control::loss_weights_for(rows, |_| true).ok_or(
            Mamba3GpuError::Shape {
                what: "predictions per step",
                expected: 1,
                found: rows,
            },
        )?;
        Ok(Self {
            weights: Weights::upload(gpu, cfg, weights)?,
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

    /// Copies a `[batch, seq_len + 1]` token window into the step's input.
    /// Ids are checked against the vocabulary here, since a kernel cannot
    /// report a bad one.
    pub fn set_tokens(&mut self, gpu: &Gpu, ids: &[i32]) -> Result<(), Mamba3GpuError> {
        super::step_bf16::upload_tokens(gpu, self.weights.cfg.vocab_size, ids, &mut self.tokens)
    }

    /// Copies `[batch * seq_len]` per-prediction loss weights into the
    /// step's input (0 or one common value; see `optim::step_control`).
    pub fn set_loss_weights(&mut self, gpu: &Gpu, w: &[f32]) -> Result<(), Mamba3GpuError> {
        gpu.copy_from_host(w, &mut self.loss_weights)?;
        Ok(())
    }

    /// The loss of the last step (synchronizes).
    pub fn loss(&self, gpu: &Gpu) -> Result<f32, Mamba3GpuError> {
        let v = gpu.to_host(&self.loss)?;
        Ok(v.first().copied().unwrap_or(f32::NAN))
    }
}
