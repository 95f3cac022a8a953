//! The training step: the one struct the step specs describe, for both
//! precisions, and the ops that join the model and the optimizer.
//!
//! [`Mamba3Step<P>`] is written once, generic over the compute type `P`
//! ([`ModelCompute`]: `f32` or `bf16`), and instantiated by the two specs,
//! which stay data files side by side: `specs/mamba3_f32.ron` binds
//! `P = f32`, `specs/mamba3_bf16.ron` binds `P = bf16`. For each the derive
//! generates `Mamba3F32Capture`/`Replay`/`Graph` (resp. `Mamba3Bf16..`) and
//! implements [`TrainingStep`](crate::graph::TrainingStep), which is all the
//! training engine and the bench use.
//!
//! Layering: this module sits above the model ([`crate::mamba3`]) and the
//! optimizer ([`crate::optim`]) and joins them; neither imports it.
//! [`control`] holds what the step does between the backward pass and the
//! update (loss weights, frozen slices, norm, clip, skip, schedule).
//!
//! Context scratch: `half_staging` (bf16 copies of f32 gradients feeding a
//! GEMM; the bf16 step only) is presized for the step's shape by
//! [`Mamba3Step::new`]; `gemm_workspace` and `reduce_partials` are presized
//! by the context. The capture freezes them, and its guards snapshot their
//! addresses.

pub mod control;

pub use control::{FrozenSlice, StepControl, loss_weights_for, report};

use thiserror::Error;

use crate::TrainingGraph;
use crate::device::{DeviceBuffer, Gpu, GpuError};
use crate::graph::{CaptureViolation, OpError};
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{self, ParamKind, param_specs};
use crate::mamba3::gpu::{Acts, Grads, Mamba3GpuError, ModelCompute, StepWeights, presize_staging};
use crate::optim::gpu::{AdamWState, StepScalars, Update, fused_update};
use crate::optim::{AdamWConfig, DecayPolicy, OptimError, Param};

/// What building or running a training step can fail with: the model's
/// errors or the optimizer's (which know nothing of each other).
#[derive(Debug, Error)]
pub enum StepError {
    /// A model op or buffer failed.
    #[error(transparent)]
    Model(#[from] Mamba3GpuError),
    /// The optimizer failed.
    #[error(transparent)]
    Optim(#[from] OptimError),
}

impl From<GpuError> for StepError {
    fn from(e: GpuError) -> Self {
        Self::Model(Mamba3GpuError::Gpu(e))
    }
}

impl OpError for StepError {
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        match self {
            Self::Model(e) => e.capture_violation(),
            Self::Optim(e) => e.capture_violation(),
        }
    }
}

/// A Mamba-3 model's parameters as one optimizer param group, in
/// `param_specs` (checkpoint) order: what the optimizer updates.
pub fn params(cfg: &Mamba3Config) -> Vec<Param> {
    param_specs(cfg)
        .into_iter()
        .map(|s| Param {
            numel: s.numel(),
            matrix: s.kind == ParamKind::Matrix,
            name: s.name,
        })
        .collect()
}

/// The optimizer's view of one update: each f32 master with its gradient
/// and its bf16 compute copy, if any, in param order.
pub(crate) fn updates<'a, W: StepWeights>(
    weights: &'a mut W,
    grads: &'a Grads,
) -> Result<Vec<Update<'a>>, StepError> {
    let (master, copies) = weights.masters_and_copies()?;
    let mut copies = copies.into_iter();
    let out = master
        .tensors_mut()
        .into_iter()
        .zip(grads.params.tensors())
        .map(|(param, grad)| Update {
            param,
            grad,
            copy: copies.next().flatten(),
        })
        .collect();
    Ok(out)
}

/// One training step's buffers, at compute type `P`; the graph lives beside
/// the memory it points into.
#[derive(Debug, TrainingGraph)]
#[graph(spec = "../../../specs/mamba3_f32.ron", with(P = f32))]
#[graph(spec = "../../../specs/mamba3_bf16.ron", with(P = half::bf16))]
pub struct Mamba3Step<P: ModelCompute> {
    /// Trainable parameters: f32 masters, and in bf16 their GEMM copies.
    pub weights: P::Weights,
    /// AdamW moments (f32).
    pub adam: AdamWState,
    /// lr, step count and bias corrections on the device.
    pub sched: StepScalars,
    /// f32 gradients and backward working memory.
    pub grads: Grads,
    /// Forward activations (GEMM operands in `P`, the rest f32).
    pub acts: Acts<DeviceBuffer<P>>,
    /// Schedule, clipping, skip counters and the step's report.
    pub control: StepControl,
    /// `[batch, seq_len + 1]` token ids (written by the host before a step).
    pub tokens: DeviceBuffer<i32>,
    /// `[batch * seq_len]` loss weight per prediction (written by the host).
    pub loss_weights: DeviceBuffer<f32>,
    /// Weighted loss of the last step.
    pub loss: DeviceBuffer<f32>,
}

/// The f32 step (`specs/mamba3_f32.ron`).
pub type F32Step = Mamba3Step<f32>;
/// The bf16 mixed-precision step (`specs/mamba3_bf16.ron`).
pub type Bf16Step = Mamba3Step<half::bf16>;

impl<P: ModelCompute> Mamba3Step<P> {
    /// Uploads `weights` (f32 masters, plus bf16 copies in bf16), allocates
    /// everything a `batch x seq_len` step needs and presizes `half_staging`
    /// for it: zero moments, step count 0, equal loss weights `1 / (batch *
    /// seq_len)` (the plain mean), constant lr `adamw.lr`, no clipping.
    pub fn new<T: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        weights: &cpu::Weights<T>,
        adamw: &AdamWConfig,
        policy: &DecayPolicy,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, StepError> {
        let acts = Acts::<DeviceBuffer<P>>::new(gpu, cfg, batch, seq_len)?;
        presize_staging::<P>(gpu, &acts.shape)?;
        let rows = acts.shape.rows;
        let uniform = loss_weights_for(rows, |_| true).ok_or(Mamba3GpuError::Shape {
            what: "predictions per step",
            expected: 1,
            found: rows,
        })?;
        Ok(Self {
            weights: P::Weights::upload(gpu, cfg, weights)?,
            adam: AdamWState::new(gpu, &params(cfg), policy)?,
            sched: StepScalars::new(gpu, adamw)?,
            grads: Grads::new::<P>(gpu, cfg, batch, seq_len)?,
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
        let vocab = self.weights.master().cfg.vocab_size;
        upload_tokens(gpu, vocab, ids, &mut self.tokens)
    }

    /// Copies `[batch * seq_len]` per-prediction loss weights into the
    /// step's input (0 or one common value; see [`control`]).
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

/// Checks `ids` against `vocab` and copies them into `tokens`.
pub fn upload_tokens(
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

/// One AdamW update of every parameter with the device-side scalars (no
/// clipping, no skip): the backbone bench's update. On the f32 masters, and
/// in the same pass the bf16 copies of the updated GEMM weights, if any.
pub fn adamw_step<W: StepWeights>(
    gpu: &Gpu,
    grads: &Grads,
    sched: &StepScalars,
    weights: &mut W,
    adam: &mut AdamWState,
) -> Result<(), StepError> {
    let list = updates(weights, grads)?;
    fused_update(gpu, list, &sched.derived, None, adam)?;
    Ok(())
}
