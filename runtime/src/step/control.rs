//! What a training step does between the model's backward pass and the
//! parameter update, on the device and inside the captured graph: the
//! per-prediction loss weights, the frozen-slice mask, the global gradient
//! norm with torch-style clipping, the non-finite skip, and the learning
//! rate from the warmup + cosine schedule evaluated at a device step counter.
//!
//! Every value a run may change (schedule, clip threshold, counters on
//! resume) lives in [`StepControl`]'s device buffers and is rewritten by the
//! host between replays; the graph bakes in none of them. The frozen slices
//! are fixed when the step is built (an ablation is a property of the run).
//!
//! # Loss weights
//!
//! The model's forward pass computes the per-prediction cross-entropy and
//! its backward pass the gradient of their plain mean. [`apply_loss_weights`]
//! turns that into the weighted loss `sum_i w_i * loss_i` the trainer wants
//! (its masked mean puts `1 / scored` on scored predictions and 0 elsewhere),
//! the way the CPU engine does it: rows of weight 0 get logits whose softmax
//! is exactly their target, so their gradient is exactly zero, and the
//! gradient is rescaled by `rows * w` when it is clipped and applied. That is
//! exact when every nonzero weight is the same `w`, which is what a masked
//! mean gives; [`loss_weights_for`] builds such weights and the engine
//! uploads nothing else.

use crate::DevicePtrs;
use crate::device::{DeviceBuffer, Gpu, GpuError};
use crate::kernels::optim as ko;
use crate::kernels::train as kt;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{ParamSpec, param_specs};
use crate::mamba3::gpu::{Acts, Grads, Mamba3GpuError, StepWeights};
use crate::optim::gpu::{AdamWState, StepScalars, fused_update};

use super::StepError;

/// Report slots (`kernels/train.cu`): what one step leaves for the host.
pub mod report {
    /// The weighted loss.
    pub const LOSS: usize = 0;
    /// Global gradient norm before clipping.
    pub const GRAD_NORM: usize = 1;
    /// Learning rate the step used.
    pub const LR: usize = 2;
    /// 1 when the update was skipped.
    pub const SKIPPED: usize = 3;
    /// Skipped steps so far.
    pub const SKIPPED_TOTAL: usize = 4;
    /// Steps run so far (skipped ones included).
    pub const STEPS: usize = 5;
    /// AdamW updates so far.
    pub const ADAM_STEPS: usize = 6;
    /// Clip coefficient applied (1: none).
    pub const CLIP_COEF: usize = 7;
    /// Slots.
    pub const LEN: usize = 8;
}

/// Elements `start..end` of parameter tensor `tensor` (in `param_specs`
/// order) never train: their gradient is zeroed before the norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrozenSlice {
    /// Tensor index in `param_specs` order.
    pub tensor: usize,
    /// First frozen element.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

/// The device scalars of the step around the optimizer (layouts in
/// `kernels/train.cu`).
#[derive(Debug, DevicePtrs)]
pub struct StepControl {
    /// `[peak_lr, min_lr, max_norm]` (`max_norm <= 0`: no clipping).
    pub params: DeviceBuffer<f64>,
    /// `[steps, skipped, warmup, total]`.
    pub counters: DeviceBuffer<u64>,
    /// `[clip coefficient, skip flag, gradient scale]`, written each step.
    pub gate: DeviceBuffer<f32>,
    /// Sum-of-squares partials of the gradient norm, one per
    /// `kernels::optim::NORM_CHUNK` elements of each tensor.
    pub partials: DeviceBuffer<f64>,
    /// The last step's report ([`report`] slots).
    pub report: DeviceBuffer<f64>,
    /// Frozen parameter slices.
    #[ptrs(skip)]
    pub frozen: Vec<FrozenSlice>,
}

impl StepControl {
    /// Constant learning rate `lr`, no clipping, counters at zero.
    pub fn new(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        lr: f64,
        frozen: Vec<FrozenSlice>,
    ) -> Result<Self, Mamba3GpuError> {
        let specs = param_specs(cfg);
        let count = ko::norm_partials(specs.iter().map(ParamSpec::numel));
        for f in &frozen {
            let numel = specs.get(f.tensor).map_or(0, |s| s.numel());
            if f.start > f.end || f.end > numel {
                return Err(Mamba3GpuError::Shape {
                    what: "frozen slice end (tensor length)",
                    expected: numel,
                    found: f.end,
                });
            }
        }
        Ok(Self {
            params: gpu.to_device(&[lr, lr, 0.0])?,
            counters: gpu.alloc_zeros::<u64>(4)?,
            gate: gpu.to_device(&[1.0f32, 0.0, 1.0])?,
            partials: gpu.alloc_zeros::<f64>(count.max(1))?,
            report: gpu.alloc_zeros::<f64>(report::LEN)?,
            frozen,
        })
    }

    /// Sets the schedule (see `train::LrSchedule::lr`) between replays.
    pub fn set_schedule(
        &mut self,
        gpu: &Gpu,
        peak: f64,
        min_lr: f64,
        warmup: u64,
        total: u64,
    ) -> Result<(), GpuError> {
        let mut p = gpu.to_host(&self.params)?;
        let mut c = gpu.to_host(&self.counters)?;
        p[0] = peak;
        p[1] = min_lr;
        c[2] = warmup;
        c[3] = total;
        gpu.copy_from_host(&p, &mut self.params)?;
        gpu.copy_from_host(&c, &mut self.counters)
    }

    /// Sets the global-norm clip threshold (`None`: no clipping).
    pub fn set_clip(&mut self, gpu: &Gpu, max_norm: Option<f64>) -> Result<(), GpuError> {
        let mut p = gpu.to_host(&self.params)?;
        p[2] = max_norm.unwrap_or(0.0);
        gpu.copy_from_host(&p, &mut self.params)
    }

    /// `(steps, skipped)` so far (synchronizes).
    pub fn counters(&self, gpu: &Gpu) -> Result<(u64, u64), GpuError> {
        let c = gpu.to_host(&self.counters)?;
        Ok((c[0], c[1]))
    }

    /// Restores `(steps, skipped)` (resume), keeping the schedule.
    pub fn set_counters(&mut self, gpu: &Gpu, steps: u64, skipped: u64) -> Result<(), GpuError> {
        let mut c = gpu.to_host(&self.counters)?;
        c[0] = steps;
        c[1] = skipped;
        gpu.copy_from_host(&c, &mut self.counters)
    }
}

/// Per-prediction weights of the masked mean: `1 / scored` where `scored(i)`,
/// 0 elsewhere; `None` when nothing is scored.
pub fn loss_weights_for(rows: usize, scored: impl Fn(usize) -> bool) -> Option<Vec<f32>> {
    let n = (0..rows).filter(|&i| scored(i)).count();
    let n = f64::from(u32::try_from(n).ok().filter(|&n| n > 0)?);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "one rounding of 1/n to the f32 the kernels weigh with"
    )]
    let w = (1.0 / n) as f32;
    Some((0..rows).map(|i| if scored(i) { w } else { 0.0 }).collect())
}

/// Replaces the plain mean loss by the weighted one and masks the logits of
/// unweighted predictions (see the [module docs](self)).
pub fn apply_loss_weights<B>(
    gpu: &Gpu,
    tokens: &DeviceBuffer<i32>,
    loss_weights: &DeviceBuffer<f32>,
    acts: &mut Acts<B>,
    loss: &mut DeviceBuffer<f32>,
    control: &mut StepControl,
) -> Result<(), Mamba3GpuError> {
    let sh = acts.shape;
    crate::mamba3::gpu::at_least(
        "loss weights (at least batch * seq_len)",
        sh.rows,
        loss_weights.len(),
    )?;
    kt::weighted_loss(
        gpu,
        &acts.row_loss,
        loss_weights,
        sh.rows,
        loss,
        &mut control.gate,
    )?;
    kt::mask_rows(
        gpu,
        &sh,
        &mut acts.logits,
        &mut acts.lse,
        tokens,
        loss_weights,
    )?;
    Ok(())
}

/// Zeroes the frozen slices' gradients and writes the partials of the
/// global squared norm (one multi-tensor launch, see
/// [`crate::kernels::optim::sumsq_partials`]).
pub fn grad_norm(
    gpu: &Gpu,
    grads: &mut Grads,
    control: &mut StepControl,
) -> Result<(), Mamba3GpuError> {
    let mut tensors = grads.params.tensors_mut();
    for f in &control.frozen {
        let found = tensors.len();
        let t = tensors.get_mut(f.tensor).ok_or(Mamba3GpuError::Shape {
            what: "frozen tensor index (tensors)",
            expected: f.tensor + 1,
            found,
        })?;
        kt::zero_range(gpu, t, f.start, f.end)?;
    }
    ko::sumsq_partials(gpu, &grads.params.tensors(), &mut control.partials)?;
    Ok(())
}

/// Folds the norm, decides clip and skip, evaluates the schedule at the
/// step counter and advances it, and writes AdamW's scalars and the report.
pub fn schedule(
    gpu: &Gpu,
    control: &mut StepControl,
    sched: &mut StepScalars,
    loss: &DeviceBuffer<f32>,
) -> Result<(), Mamba3GpuError> {
    let StepControl {
        params,
        counters,
        gate,
        partials,
        report,
        ..
    } = control;
    kt::schedule(
        gpu,
        kt::ScheduleArgs {
            partials,
            count: partials.len(),
            params,
            counters,
            hyper: &sched.hyper,
            adam_step: &mut sched.step,
            derived: &mut sched.derived,
            gate,
            loss,
            report,
        },
    )?;
    Ok(())
}

/// AdamW on every tensor with the rescaled, clipped gradient; nothing when
/// the step is skipped. One multi-tensor pass over the f32 masters
/// ([`fused_update`]) that, in the bf16 step, also writes each updated GEMM
/// weight's bf16 compute copy (so the step needs no
/// `sync_master_to_compute` after it; a skipped step leaves masters and
/// copies as they were).
pub fn adamw_guarded<W: StepWeights>(
    gpu: &Gpu,
    grads: &Grads,
    sched: &StepScalars,
    control: &StepControl,
    weights: &mut W,
    adam: &mut AdamWState,
) -> Result<(), StepError> {
    let list = super::updates(weights, grads)?;
    fused_update(gpu, list, &sched.derived, Some(&control.gate), adam)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_mean_weights_put_one_over_scored_on_scored_rows() {
        let w = loss_weights_for(6, |i| i % 3 == 2).unwrap();
        assert_eq!(w, vec![0.0, 0.0, 0.5, 0.0, 0.0, 0.5]);
        let all = loss_weights_for(4, |_| true).unwrap();
        assert!(all.iter().all(|&v| v == 0.25));
        assert!(loss_weights_for(3, |_| false).is_none());
    }

    #[test]
    fn report_slots_match_the_kernel() {
        let src = include_str!("../../../kernels/train.cu");
        for (slot, value) in [
            (report::LOSS, "(double)loss[0]"),
            (report::GRAD_NORM, "norm"),
            (report::LR, "lr"),
            (report::SKIPPED, "skip ? 1.0 : 0.0"),
            (report::SKIPPED_TOTAL, "(double)counters[1]"),
            (report::STEPS, "(double)(step + 1)"),
            (report::ADAM_STEPS, "(double)t"),
            (report::CLIP_COEF, "coef"),
        ] {
            assert!(slot < report::LEN);
            let line = format!("report[{slot}] = {value};");
            assert!(src.contains(&line), "`{line}` not in kernels/train.cu");
        }
    }
}
