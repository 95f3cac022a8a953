//! Launch wrappers for `kernels/train.cu`: loss weights, the frozen mask, the
//! fold of the global gradient norm and the device-side schedule that the
//! training step adds around the model (see [`crate::step::control`]
//! for the ops built from them; the norm's partials and the guarded AdamW
//! update are the multi-tensor kernels of [`super::optim`]).

use cudarc::driver::PushKernelArg as _;

use super::Kernel;
use super::launch;
use super::mamba3::{Mamba3Shape, need, row_blocks, thread_blocks};
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, to_u32};

/// `loss[0] = sum(w[i] * row_loss[i])` over the `rows` rows with `w[i] != 0`,
/// in double and a fixed order, and `gate[2] = rows * max(w)` (the factor
/// from the plain mean's gradient to the weighted loss's).
pub fn weighted_loss(
    gpu: &Gpu,
    row_loss: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    rows: usize,
    loss: &mut DeviceBuffer<f32>,
    gate: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    need(gpu, "weighted_loss: row_loss", row_loss, rows)?;
    need(gpu, "weighted_loss: weights", w, rows)?;
    need(gpu, "weighted_loss: loss", loss, 1)?;
    need(gpu, "weighted_loss: gate", gate, 3)?;
    let n = to_u32("weighted_loss: rows", rows)?;
    let f = gpu.function(Kernel::TrWeightedLossF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(row_loss.slice()?)
        .arg(w.slice()?)
        .arg(loss.slice_mut()?)
        .arg(gate.slice_mut()?)
        .arg(&n);
    // SAFETY: one block reads row_loss[0..rows) and w[0..rows) and writes
    // loss[0] and gate[2]; all lengths checked above.
    unsafe { b.launch(launch::grid(1)) }.during("launch tr_weighted_loss_f32")?;
    Ok(())
}

/// Rows of weight 0 get one-hot-target logits and lse 0, so the model's
/// cross-entropy backward gives them exact zeros.
pub fn mask_rows(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    logits: &mut DeviceBuffer<f32>,
    lse: &mut DeviceBuffer<f32>,
    tokens: &DeviceBuffer<i32>,
    w: &DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let n = sh.per_row(sh.vocab)?;
    need(gpu, "mask_rows: logits", logits, n)?;
    need(gpu, "mask_rows: lse", lse, sh.rows)?;
    need(gpu, "mask_rows: tokens", tokens, sh.batch * (sh.len + 1))?;
    need(gpu, "mask_rows: weights", w, sh.rows)?;
    let (v, len, rows) = (
        to_u32("vocab", sh.vocab)?,
        to_u32("len", sh.len)?,
        to_u32("rows", sh.rows)?,
    );
    let f = gpu.function(Kernel::TrMaskRowsF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(logits.slice_mut()?)
        .arg(lse.slice_mut()?)
        .arg(tokens.slice()?)
        .arg(w.slice()?);
    b.arg(&v).arg(&len).arg(&rows);
    // SAFETY: elementwise over rows x vocab of logits (checked); lse and w
    // hold rows values, tokens B x (T + 1) (checked).
    unsafe { b.launch(thread_blocks(n)?) }.during("launch tr_mask_rows_f32")?;
    Ok(())
}

/// `x[start .. end) = 0`.
pub fn zero_range(
    gpu: &Gpu,
    x: &mut DeviceBuffer<f32>,
    start: usize,
    end: usize,
) -> Result<(), GpuError> {
    need(gpu, "zero_range: x", x, end)?;
    if end <= start {
        return Ok(());
    }
    let (s, n) = (
        to_u32("zero_range: start", start)?,
        to_u32("zero_range: n", end - start)?,
    );
    let f = gpu.function(Kernel::TrZeroRangeF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice_mut()?).arg(&s).arg(&n);
    // SAFETY: writes x[start .. start + n) = x[start .. end), and x holds at
    // least `end` values (checked).
    unsafe { b.launch(thread_blocks(end - start)?) }.during("launch tr_zero_range_f32")?;
    Ok(())
}

/// The device scalars [`schedule`] reads and writes (layouts in
/// `kernels/train.cu`).
#[derive(Debug)]
pub struct ScheduleArgs<'a> {
    /// Norm partials, `count` used.
    pub partials: &'a DeviceBuffer<f64>,
    /// Partials to fold.
    pub count: usize,
    /// `[peak, min_lr, max_norm]`.
    pub params: &'a DeviceBuffer<f64>,
    /// `[steps, skipped, warmup, total]`.
    pub counters: &'a mut DeviceBuffer<u64>,
    /// AdamW `[lr, beta1, beta2, eps, weight_decay]` (lr unused).
    pub hyper: &'a DeviceBuffer<f64>,
    /// AdamW updates taken.
    pub adam_step: &'a mut DeviceBuffer<i32>,
    /// AdamW per-step scalars (8).
    pub derived: &'a mut DeviceBuffer<f32>,
    /// `[clip coefficient, skip flag, gradient scale]`.
    pub gate: &'a mut DeviceBuffer<f32>,
    /// The step's loss.
    pub loss: &'a DeviceBuffer<f32>,
    /// The step's report (8 f64).
    pub report: &'a mut DeviceBuffer<f64>,
}

/// Folds the norm, decides clip and skip, evaluates the schedule and
/// advances the counters (one block).
pub fn schedule(gpu: &Gpu, a: ScheduleArgs<'_>) -> Result<(), GpuError> {
    need(gpu, "schedule: partials", a.partials, a.count)?;
    need(gpu, "schedule: params", a.params, 3)?;
    need(gpu, "schedule: counters", a.counters, 4)?;
    need(gpu, "schedule: hyper", a.hyper, 5)?;
    need(gpu, "schedule: adam step", a.adam_step, 1)?;
    need(gpu, "schedule: derived", a.derived, 8)?;
    need(gpu, "schedule: gate", a.gate, 3)?;
    need(gpu, "schedule: loss", a.loss, 1)?;
    need(gpu, "schedule: report", a.report, 8)?;
    let count = to_u32("schedule: partials", a.count)?;
    let f = gpu.function(Kernel::TrSchedule)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(a.partials.slice()?)
        .arg(&count)
        .arg(a.params.slice()?)
        .arg(a.counters.slice_mut()?)
        .arg(a.hyper.slice()?)
        .arg(a.adam_step.slice_mut()?)
        .arg(a.derived.slice_mut()?)
        .arg(a.gate.slice_mut()?)
        .arg(a.loss.slice()?)
        .arg(a.report.slice_mut()?);
    // SAFETY: one block reads partials[0..count), params[0..3), hyper[0..5),
    // loss[0], gate[2]; updates counters[0..4), adam_step[0]; writes
    // derived[0..8), gate[0..2), report[0..8). Every length is checked above.
    unsafe { b.launch(launch::grid(1)) }.during("launch tr_schedule")?;
    Ok(())
}

/// `out[row]` = first index of the largest of `logits[row, 0 .. real)`, for
/// `rows` rows of `stride` logits.
pub fn argmax(
    gpu: &Gpu,
    logits: &DeviceBuffer<f32>,
    stride: usize,
    real: usize,
    rows: usize,
    out: &mut DeviceBuffer<u32>,
) -> Result<(), GpuError> {
    need(
        gpu,
        "argmax: logits",
        logits,
        crate::device::checked_elems("argmax: rows x stride", rows, stride)?,
    )?;
    need(gpu, "argmax: out", out, rows)?;
    if real > stride {
        return Err(GpuError::BufferTooSmall {
            what: "argmax: row stride",
            need: real,
            have: stride,
        });
    }
    let (s, r, n) = (
        to_u32("argmax: stride", stride)?,
        to_u32("argmax: real", real)?,
        to_u32("argmax: rows", rows)?,
    );
    let f = gpu.function(Kernel::TrArgmaxF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(logits.slice()?)
        .arg(out.slice_mut()?)
        .arg(&s)
        .arg(&r)
        .arg(&n);
    // SAFETY: one block per row reads logits[row * stride + 0 .. real) with
    // real <= stride and rows * stride values held (checked), and writes
    // out[row] for row < rows (checked).
    unsafe { b.launch(row_blocks(rows)?) }.during("launch tr_argmax_f32")?;
    Ok(())
}
