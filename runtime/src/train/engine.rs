//! The seam between the training loop and whatever runs a step.
//!
//! [`TrainEngine`] is one training step as the loop sees it: a batch goes in,
//! the parameters and optimizer state are updated, and a few scalars come
//! out. The loop never touches weights, gradients or moments directly, so the
//! CPU reference ([`super::CpuEngine`]) and the GPU graph-captured steps (f32
//! and bf16) are interchangeable behind it.
//!
//! # What a GPU engine must do
//!
//! A GPU engine wraps a captured step (`Mamba3F32Graph` / `Mamba3Bf16Graph`)
//! and its buffers. To keep the contract the CPU engine keeps:
//!
//! * **One shape.** The loop hands every training batch with the same
//!   `(rows, width)` (see `Dataset::train_width`), so one capture serves the
//!   whole run. Eval batches may have other shapes: run them eagerly (or
//!   capture one forward-only graph per shape).
//! * **Loss mask.** Synthetic tasks score only answer positions
//!   ([`Batch::mask`]); the step needs a per-prediction weight buffer (an
//!   `Input`, `1/scored` at scored positions, 0 elsewhere) so the loss and
//!   its gradient are the masked mean. `mask: None` means all weights equal.
//! * **Overlap.** [`TrainEngine::load_batch`] is called while the previous
//!   step may still run: copy the batch into pinned host memory (two
//!   buffers used in turn, so filling one never waits for the running
//!   upload) and enqueue its upload into the step's input buffers behind the
//!   running replay; stream order keeps the replay's reads before the
//!   overwrite, and drawing and staging the batch on the host overlaps the
//!   device step. [`TrainEngine::step`] only enqueues the replay and
//!   returns; [`TrainEngine::metrics`] is the one place that waits.
//! * **Schedule on the device.** [`TrainEngine::set_schedule`] stores the
//!   [`LrSchedule`]; each replay computes `lr = schedule(step)` on the device
//!   from a device-resident step counter (the formula in [`LrSchedule::lr`]),
//!   advances the counter, and AdamW reads lr and its bias corrections from
//!   device memory. Nothing the user can change is baked into the graph.
//! * **Clipping and skipping inside the graph.** The global gradient norm is
//!   reduced on the device in a fixed order; the update scales gradients by
//!   `min(1, max_norm / (norm + 1e-6))` (torch `clip_grad_norm_`); when the
//!   norm is not finite, the update (weights, moments, AdamW's step count) is
//!   skipped by a device-side flag and a device skip counter is incremented.
//!   The schedule step advances either way, as here.
//! * **Metrics.** After a step: the masked mean loss, the pre-clip global
//!   norm, the lr used and the skip flag, read back with one small copy.
//! * **State.** [`TrainEngine::export_state`] returns f32 master weights in
//!   the official layout and f32 moments in parameter order (for bf16, the
//!   f32 masters, not the bf16 compute copies);
//!   [`TrainEngine::import_state`] uploads them (and re-syncs bf16 copies)
//!   without reallocating, so the captured pointers stay valid. A resumed
//!   run must then continue bit-identically.
//! * **Determinism.** Two runs from one seed are bit-identical: fixed-order
//!   reductions, no float atomics.

use thiserror::Error;

use super::data::Batch;
use super::schedule::LrSchedule;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{ModelError, Weights};

/// Why an engine could not run.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The model rejected the batch or weights.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// `step` was called before any `load_batch`, or `metrics` before `step`.
    #[error("engine used out of order: {0}")]
    Order(&'static str),
    /// A batch that does not form `[rows, width]` with `width >= 2`.
    #[error("batch rejected: {ids} ids do not form [{rows}, {width}] with at least 2 columns")]
    BatchShape {
        /// Token ids given.
        ids: usize,
        /// Rows claimed.
        rows: usize,
        /// Width claimed.
        width: usize,
    },
    /// A batch of another shape than the captured step's.
    #[error(
        "batch rejected: {ids} ids as [{rows}, {width}]; the captured step takes [{want_rows}, {want_width}]"
    )]
    BatchMismatch {
        /// Token ids given.
        ids: usize,
        /// Rows given.
        rows: usize,
        /// Width given.
        width: usize,
        /// Rows captured.
        want_rows: usize,
        /// Width captured.
        want_width: usize,
    },
    /// A token id the embedding has no row for.
    #[error("batch rejected: token {index} has id {id}, beyond the vocabulary ({vocab})")]
    TokenOutOfVocab {
        /// Position in the flattened batch.
        index: usize,
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A batch of several instances a row, which this engine cannot run.
    #[error(
        "batch rejected: {0} does not run packed batches (--pack); it would mix their instances"
    )]
    Packed(&'static str),
    /// A batch of one instance a row given to an engine built for packed
    /// ones.
    #[error(
        "batch rejected: this engine was built for packed batches (--pack) and takes packed batches only"
    )]
    Unpacked,
    /// A batch in which no prediction is scored (the loss would be 0/0).
    #[error("batch rejected: no scored prediction in the batch")]
    NothingScored,
    /// Imported moments for another number of parameters.
    #[error("state does not fit the model: {got} moment tensors for {want} parameters")]
    MomentCount {
        /// Moment pairs given.
        got: usize,
        /// Parameters of the model.
        want: usize,
    },
    /// Imported moments of one tensor with the wrong length.
    #[error(
        "state does not fit the model: moments of `{tensor}` have {m} / {v} values, expected {want}"
    )]
    MomentLength {
        /// The parameter.
        tensor: String,
        /// First-moment values given.
        m: usize,
        /// Second-moment values given.
        v: usize,
        /// Values of the parameter.
        want: usize,
    },
    /// An AdamW step count the device counter (i32) cannot hold.
    #[error("state does not fit the model: {0} AdamW steps overflow i32")]
    AdamStepsOverflow(u64),
    /// A GPU call, kernel launch or buffer operation failed.
    #[error("GPU: {0}")]
    Gpu(#[from] crate::mamba3::gpu::Mamba3GpuError),
    /// The optimizer failed on the device.
    #[error("optimizer: {0}")]
    Optim(#[from] crate::optim::OptimError),
    /// The captured graph refused a replay or failed to capture.
    #[error("graph: {0}")]
    Graph(#[from] crate::graph::GraphError),
}

impl From<crate::step::StepError> for EngineError {
    fn from(e: crate::step::StepError) -> Self {
        match e {
            crate::step::StepError::Model(e) => Self::Gpu(e),
            crate::step::StepError::Optim(e) => Self::Optim(e),
        }
    }
}

impl From<crate::device::GpuError> for EngineError {
    fn from(e: crate::device::GpuError) -> Self {
        Self::Gpu(e.into())
    }
}

/// What ran a step, for the start line and the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Short name (`cpu`, `cuda graph`).
    pub name: String,
    /// `f32` or `bf16`.
    pub precision: &'static str,
    /// The device (`CPU, 2 threads`, the GPU's name).
    pub device: String,
}

/// Optimizer settings fixed for a run.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimSettings {
    /// AdamW hyper-parameters (`lr` is replaced by the schedule each step).
    pub adam: crate::optim::AdamWConfig,
    /// Which tensors decay.
    pub decay: crate::optim::DecayPolicy,
    /// Global-norm clipping threshold; `None`: no clipping.
    pub clip: Option<f64>,
    /// Parameter slices that never train (ablations such as
    /// `--rotation none|fixed`): their gradients are zeroed before clipping, so
    /// AdamW leaves them exactly as initialised. A GPU engine applies the
    /// same mask inside the graph.
    pub frozen: Vec<Frozen>,
}

/// Elements `start..end` of parameter tensor `tensor` (in `param_specs`
/// order, flat row-major) do not train.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frozen {
    /// Tensor index in `param_specs` order.
    pub tensor: usize,
    /// First frozen element.
    pub start: usize,
    /// One past the last frozen element.
    pub end: usize,
}

/// The scalars of the last step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMetrics {
    /// Steps run so far, skipped ones included (the schedule's step + 1).
    pub step: u64,
    /// Masked mean cross-entropy of the batch.
    pub loss: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Learning rate the step used.
    pub lr: f64,
    /// Whether the update was skipped because a gradient was not finite.
    pub skipped: bool,
    /// Skipped steps so far.
    pub skipped_total: u64,
}

/// Per-prediction results of an eval forward pass, `[rows, T]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalOutput {
    /// `-log p(target)` of each prediction.
    pub token_loss: Vec<f32>,
    /// Arg-max token of each prediction.
    pub argmax: Vec<u32>,
}

/// Adam moments for one tensor: `(exp_avg, exp_avg_sq)`.
pub type Moments = (Vec<f32>, Vec<f32>);

/// Everything a checkpoint holds of an engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineState {
    /// f32 (master) weights.
    pub weights: Weights<f32>,
    /// Moments per tensor, in `param_specs` order.
    pub moments: Vec<Moments>,
    /// Updates AdamW applied (its `t`; skipped steps excluded).
    pub adam_steps: u64,
    /// Steps run, skipped ones included (the schedule position).
    pub steps: u64,
    /// Steps skipped for non-finite gradients.
    pub skipped: u64,
}

impl EngineState {
    /// Fails unless the weights and every moment pair fit `cfg`: what both
    /// engines check before importing a checkpoint.
    pub fn check(&self, cfg: &Mamba3Config) -> Result<(), EngineError> {
        crate::mamba3::cpu::check_weights(cfg, &self.weights)?;
        let specs = crate::mamba3::cpu::param_specs(cfg);
        if self.moments.len() != specs.len() {
            return Err(EngineError::MomentCount {
                got: self.moments.len(),
                want: specs.len(),
            });
        }
        for (spec, (m, v)) in specs.iter().zip(&self.moments) {
            if m.len() != spec.numel() || v.len() != spec.numel() {
                return Err(EngineError::MomentLength {
                    tensor: spec.name.clone(),
                    m: m.len(),
                    v: v.len(),
                    want: spec.numel(),
                });
            }
        }
        Ok(())
    }
}

/// One training step, implemented by the CPU reference and the GPU graphs.
///
/// The loop calls, per step: `load_batch(next)` (may overlap the running
/// step), `step()`, then `metrics()`; and between steps `eval`,
/// `export_state` (checkpoints) and, once at start, `import_state` (resume).
pub trait TrainEngine {
    /// What runs the step.
    fn info(&self) -> EngineInfo;
    /// The model being trained.
    fn model_config(&self) -> &Mamba3Config;
    /// The lr schedule the following steps evaluate (on the device for GPUs).
    fn set_schedule(&mut self, schedule: LrSchedule);
    /// Makes batches of these widths (each at most the training width)
    /// trainable besides the training width, for a run that trims each
    /// batch to its longest row (`--trim`): the GPU engines capture their
    /// step once more per width, in the same buffers; the CPU engine runs
    /// any width and has nothing to prepare.
    fn capture_widths(&mut self, widths: &[usize]) -> Result<(), EngineError> {
        let _ = widths;
        Ok(())
    }
    /// Stages the batch the next [`Self::step`] trains on.
    fn load_batch(&mut self, batch: &Batch) -> Result<(), EngineError>;
    /// Runs (GPU: enqueues) one step on the staged batch: forward, masked
    /// loss, backward, clipping, non-finite skip, AdamW.
    fn step(&mut self) -> Result<(), EngineError>;
    /// The scalars of the last step (GPU: waits for it).
    fn metrics(&mut self) -> Result<StepMetrics, EngineError>;
    /// Forward only, no update: per-prediction loss and arg-max.
    fn eval(&mut self, batch: &Batch) -> Result<EvalOutput, EngineError>;
    /// Weights, moments and counters for a checkpoint.
    fn export_state(&mut self) -> Result<EngineState, EngineError>;
    /// Replaces weights, moments and counters (resume).
    fn import_state(&mut self, state: EngineState) -> Result<(), EngineError>;
    /// The f32 (master) weights alone: what a weight average reads.
    fn weights(&mut self) -> Result<Weights<f32>, EngineError> {
        Ok(self.export_state()?.weights)
    }
    /// Replaces the f32 (master) weights alone, re-deriving any compute
    /// copy from them; moments and counters stay. Putting back weights read
    /// with [`Self::weights`] restores the engine exactly (a bf16 copy is
    /// the master rounded to nearest even, as every AdamW update leaves
    /// it), so a training run that evaluates other weights in between goes
    /// on bit-identically.
    fn set_weights(&mut self, weights: &Weights<f32>) -> Result<(), EngineError>;
}

/// The `in_proj` rows producing the rotation angles, per layer: frozen (and
/// zeroed) for the rotation ablations (`--rotation none|fixed`).
pub fn rotation_rows(cfg: &Mamba3Config) -> Vec<Frozen> {
    let layout = cfg.in_proj_layout();
    crate::mamba3::cpu::param_specs(cfg)
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name.ends_with(".mixer.in_proj.weight"))
        .map(|(tensor, _)| Frozen {
            tensor,
            start: layout.angles * cfg.d_model,
            end: layout.width * cfg.d_model,
        })
        .collect()
}
