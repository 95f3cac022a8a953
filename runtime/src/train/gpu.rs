//! The GPU engines: a graph-captured step behind [`TrainEngine`], one body
//! ([`GpuEngine<P>`]) for both precisions, driving
//! [`Mamba3Step<P>`] through [`TrainingStep`] as the derive implements it:
//! [`GpuF32Engine`] runs `specs/mamba3_f32.ron`, [`GpuBf16Engine`] runs
//! `specs/mamba3_bf16.ron` (its state is the f32 masters and moments, and
//! importing re-syncs the bf16 copies).
//!
//! The step is captured once, for the run's training shape, when the engine
//! is built, and again over narrower windows in the same buffers where the
//! run trims its batches ([`TrainEngine::capture_widths`]); every
//! [`TrainEngine::step`] is one guarded replay of the graph of the staged
//! batch's width and returns without waiting. Batches go through two pinned
//! host buffers used in turn: [`TrainEngine::load_batch`] fills one on the
//! host (while the previous step runs on the device) and enqueues its upload
//! into the step's input buffers behind the running replay, so stream order
//! keeps the replay's reads before the overwrite and no device copy of the
//! inputs is needed. The step leaves its scalars in a small device report that is
//! copied into pinned memory behind the replay; [`TrainEngine::metrics`]
//! waits for that copy, and is the only call of a training step that waits.
//!
//! Evaluation runs the forward op eagerly on activations sized for the eval
//! batch (row chunks no larger than a training batch, buffers kept per
//! shape), then an arg-max kernel; it never touches the captured buffers
//! except to read the weights.

use std::collections::HashMap;

use half::bf16;

use super::data::Batch;
use super::engine::{
    EngineError, EngineInfo, EngineState, EvalOutput, Moments, OptimSettings, StepMetrics,
    TrainEngine,
};
use super::schedule::LrSchedule;
use crate::device::{DeviceBuffer, Gpu, PinnedBuffer};
use crate::graph::{ShapeKey, TrainingStep};
use crate::kernels::train as kt;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{Weights, check_weights};
use crate::mamba3::gpu::{Acts, ModelCompute, StepWeights, forward};
use crate::step::{FrozenSlice, Mamba3Step, StepControl, loss_weights_for, report};

/// Most eval activation shapes kept at once.
const EVAL_SHAPES: usize = 8;

/// The f32 engine (`specs/mamba3_f32.ron`).
pub type GpuF32Engine = GpuEngine<f32>;
/// The bf16 mixed-precision engine (`specs/mamba3_bf16.ron`; f32 masters
/// and moments).
pub type GpuBf16Engine = GpuEngine<bf16>;

/// Buffers of one eval shape.
struct EvalBufs<A> {
    acts: A,
    tokens: DeviceBuffer<i32>,
    loss: DeviceBuffer<f32>,
    argmax: DeviceBuffer<u32>,
}

/// One host-side staging slot for a batch.
struct Staging {
    tokens: PinnedBuffer<i32>,
    weights: PinnedBuffer<f32>,
    /// Sequence starts of a packed batch (1.0 or 0.0 a position).
    resets: PinnedBuffer<f32>,
}

/// A graph-captured step as a [`TrainEngine`]; see the [module
/// docs](self).
pub struct GpuEngine<P: ModelCompute>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    // Field order is drop order: the graph before the buffers it points
    // into, every buffer before the context.
    graph: <Mamba3Step<P> as TrainingStep>::Graph,
    /// The step captured over narrower windows, by batch width, ascending.
    narrow: Vec<(usize, <Mamba3Step<P> as TrainingStep>::Graph)>,
    step: Mamba3Step<P>,
    eval: HashMap<(usize, usize), EvalBufs<Acts<DeviceBuffer<P>>>>,
    staging: [Staging; 2],
    next_slot: usize,
    report: PinnedBuffer<f64>,
    cfg: Mamba3Config,
    rows: usize,
    width: usize,
    /// The width of the staged batch: which graph the next step replays.
    staged_width: usize,
    staged: bool,
    stepped: bool,
    last: Option<StepMetrics>,
    schedule: Option<LrSchedule>,
    gpu: Gpu,
}

impl<P: ModelCompute> GpuEngine<P>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    /// Uploads `weights`, allocates a step for `rows x width` token batches
    /// (`width = T + 1`) and captures it.
    pub fn new(
        gpu: Gpu,
        cfg: Mamba3Config,
        weights: &Weights<f32>,
        settings: &OptimSettings,
        rows: usize,
        width: usize,
    ) -> Result<Self, EngineError> {
        Self::build(gpu, cfg, weights, settings, (rows, width), false)
    }

    /// [`Self::new`] for packed batches
    /// ([`crate::train::data::Batch::packed`]): the step's
    /// scan reads each batch's sequence starts, and every batch must bring
    /// them. Refused where the model's heads do not run the warp scan.
    pub fn packed(
        gpu: Gpu,
        cfg: Mamba3Config,
        weights: &Weights<f32>,
        settings: &OptimSettings,
        rows: usize,
        width: usize,
    ) -> Result<Self, EngineError> {
        Self::build(gpu, cfg, weights, settings, (rows, width), true)
    }

    fn build(
        gpu: Gpu,
        cfg: Mamba3Config,
        weights: &Weights<f32>,
        settings: &OptimSettings,
        (rows, width): (usize, usize),
        packed: bool,
    ) -> Result<Self, EngineError> {
        check_weights(&cfg, weights)?;
        if rows == 0 || width < 2 {
            return Err(EngineError::BatchShape {
                ids: rows.saturating_mul(width),
                rows,
                width,
            });
        }
        let len = width - 1;
        let mut step = Mamba3Step::<P>::new(
            &gpu,
            &cfg,
            weights,
            &settings.adam,
            &settings.decay,
            rows,
            len,
        )?;
        let frozen = settings
            .frozen
            .iter()
            .map(|f| FrozenSlice {
                tensor: f.tensor,
                start: f.start,
                end: f.end,
            })
            .collect();
        step.control = StepControl::new(&gpu, &cfg, settings.adam.lr, frozen)?;
        step.control.set_clip(&gpu, settings.clip)?;
        // Before any capture: the captured scans read the flags or never do.
        step.acts.set_packed(packed)?;
        let graph = step.capture(
            &gpu,
            ShapeKey {
                batch: rows,
                seq_len: len,
            },
        )?;
        let slot = || -> Result<Staging, EngineError> {
            Ok(Staging {
                tokens: gpu.alloc_pinned::<i32>(rows * width)?,
                weights: gpu.alloc_pinned::<f32>(rows * len)?,
                resets: gpu.alloc_pinned::<f32>(if packed { rows * len } else { 1 })?,
            })
        };
        let staging = [slot()?, slot()?];
        let report = gpu.alloc_pinned::<f64>(report::LEN)?;
        Ok(Self {
            graph,
            narrow: Vec::new(),
            step,
            eval: HashMap::new(),
            staging,
            next_slot: 0,
            report,
            cfg,
            rows,
            width,
            staged_width: width,
            staged: false,
            stepped: false,
            last: None,
            schedule: None,
            gpu,
        })
    }

    /// The context (tests read buffers through it).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The captured step's buffers.
    pub fn step_buffers(&self) -> &Mamba3Step<P> {
        &self.step
    }

    /// Runs the staged step eagerly instead of replaying the graph (tests
    /// compare the two); the same ops, in spec order.
    pub fn step_eager(&mut self) -> Result<(), EngineError> {
        self.take_staged()?;
        self.set_len(self.staged_width - 1)?;
        let ran = self.step.run_eager(&self.gpu);
        self.set_len(self.width - 1)?;
        ran?;
        self.after_step()
    }

    /// Points the step's ops at windows of `len` tokens (see
    /// [`crate::mamba3::gpu::Acts::set_len`]).
    fn set_len(&mut self, len: usize) -> Result<(), EngineError> {
        self.step.acts.set_len(len)?;
        self.step.grads.work.set_len(len)?;
        Ok(())
    }

    /// The graph that runs batches of `width`.
    fn graph_for(&self, width: usize) -> Option<&<Mamba3Step<P> as TrainingStep>::Graph> {
        if width == self.width {
            return Some(&self.graph);
        }
        self.narrow
            .iter()
            .find(|(w, _)| *w == width)
            .map(|(_, g)| g)
    }

    /// Checks a batch is staged and writes a new schedule, if any, to the
    /// device (between replays).
    fn take_staged(&mut self) -> Result<(), EngineError> {
        if !self.staged {
            return Err(EngineError::Order("step() without load_batch()"));
        }
        self.staged = false;
        if let Some(s) = self.schedule.take() {
            self.step
                .control
                .set_schedule(&self.gpu, s.peak, s.min_lr, s.warmup, s.total)?;
        }
        Ok(())
    }

    fn after_step(&mut self) -> Result<(), EngineError> {
        self.gpu
            .copy_to_pinned(&self.step.control.report, &mut self.report)?;
        self.stepped = true;
        self.last = None;
        Ok(())
    }

    /// Ids as the kernels' `i32`, each checked against the vocabulary.
    fn check_ids(&self, batch: &Batch, out: &mut [i32]) -> Result<(), EngineError> {
        let vocab = self.cfg.vocab_size;
        for (i, (o, &t)) in out.iter_mut().zip(&batch.tokens).enumerate() {
            *o = i32::try_from(t)
                .ok()
                .filter(|&v| usize::try_from(v).is_ok_and(|v| v < vocab))
                .ok_or_else(|| EngineError::TokenOutOfVocab {
                    index: i,
                    id: t,
                    vocab,
                })?;
        }
        Ok(())
    }

    /// Writes `weights` into the f32 masters (into the existing
    /// allocations: the captured pointers stay valid) and re-derives the
    /// compute copies.
    fn upload_masters(&mut self, weights: &Weights<f32>) -> Result<(), EngineError> {
        let gpu = &self.gpu;
        for (dst, src) in self
            .step
            .weights
            .master_mut()
            .tensors_mut()
            .into_iter()
            .zip(weights.tensors())
        {
            gpu.copy_from_host(src, dst)?;
        }
        self.step.weights.masters_changed(gpu)?;
        Ok(())
    }

    fn eval_chunk(&mut self, batch: &Batch) -> Result<EvalOutput, EngineError> {
        let (rows, len) = (batch.rows, batch.seq_len());
        if !self.eval.contains_key(&(rows, len)) {
            if self.eval.len() >= EVAL_SHAPES {
                self.eval.clear();
            }
            let bufs = EvalBufs {
                acts: Acts::<DeviceBuffer<P>>::new(&self.gpu, &self.cfg, rows, len)?,
                tokens: self.gpu.alloc_zeros::<i32>(rows * batch.width)?,
                loss: self.gpu.alloc_zeros::<f32>(1)?,
                argmax: self.gpu.alloc_zeros::<u32>(rows * len)?,
            };
            self.eval.insert((rows, len), bufs);
        }
        let mut ids = vec![0i32; batch.tokens.len()];
        self.check_ids(batch, &mut ids)?;
        let (gpu, step, cfg) = (&self.gpu, &self.step, &self.cfg);
        let bufs = self
            .eval
            .get_mut(&(rows, len))
            .ok_or(EngineError::Order("eval buffers missing"))?;
        gpu.copy_from_host(&ids, &mut bufs.tokens)?;
        forward(
            gpu,
            &step.weights,
            &bufs.tokens,
            &mut bufs.acts,
            &mut bufs.loss,
        )?;
        let (logits, row_loss) = (&bufs.acts.logits, &bufs.acts.row_loss);
        kt::argmax(
            gpu,
            logits,
            cfg.padded_vocab_size(),
            cfg.vocab_size,
            rows * len,
            &mut bufs.argmax,
        )?;
        Ok(EvalOutput {
            token_loss: gpu.to_host(row_loss)?,
            argmax: gpu.to_host(&bufs.argmax)?,
        })
    }
}

/// Copies `src` into the front of `dst` (a staging buffer sized for the
/// widest batch).
fn prefix<T: Copy>(dst: &mut [T], src: &[T]) -> Result<(), EngineError> {
    let head = dst
        .get_mut(..src.len())
        .ok_or(EngineError::Order("batch wider than its staging buffer"))?;
    head.copy_from_slice(src);
    Ok(())
}

fn metrics_of(r: &[f64]) -> StepMetrics {
    let at = |i: usize| r.get(i).copied().unwrap_or(f64::NAN);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "counters travel as f64 in the report; they are exact below 2^53"
    )]
    let count = |i: usize| at(i) as u64;
    StepMetrics {
        step: count(report::STEPS),
        loss: at(report::LOSS),
        grad_norm: at(report::GRAD_NORM),
        lr: at(report::LR),
        skipped: at(report::SKIPPED) != 0.0,
        skipped_total: count(report::SKIPPED_TOTAL),
    }
}

impl<P: ModelCompute> TrainEngine for GpuEngine<P>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "cuda graph".into(),
            precision: P::PRECISION.name(),
            device: self.gpu.info().name.clone(),
        }
    }

    fn model_config(&self) -> &Mamba3Config {
        &self.cfg
    }

    fn set_schedule(&mut self, schedule: LrSchedule) {
        // Written to the device before the next step (it cannot fail here).
        self.schedule = Some(schedule);
    }

    fn capture_widths(&mut self, widths: &[usize]) -> Result<(), EngineError> {
        for &w in widths {
            if w == self.width || self.graph_for(w).is_some() {
                continue;
            }
            if w < 2 || w > self.width {
                return Err(EngineError::BatchShape {
                    ids: self.rows.saturating_mul(w),
                    rows: self.rows,
                    width: w,
                });
            }
            let len = w - 1;
            self.set_len(len)?;
            let shape = ShapeKey {
                batch: self.rows,
                seq_len: len,
            };
            let captured = self.step.capture(&self.gpu, shape);
            self.set_len(self.width - 1)?;
            self.narrow.push((w, captured?));
        }
        self.narrow.sort_by_key(|(w, _)| *w);
        Ok(())
    }

    fn load_batch(&mut self, batch: &Batch) -> Result<(), EngineError> {
        let packed = self.step.acts.packed;
        let starts: Option<Vec<f32>> = match (&batch.resets, packed) {
            (Some(r), true) => Some(r.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect()),
            (None, false) => None,
            (Some(_), false) => return Err(EngineError::Packed("a GPU engine built without it")),
            // Else the scan would read the previous batch's starts.
            (None, true) => return Err(EngineError::Unpacked),
        };
        if batch.rows != self.rows
            || self.graph_for(batch.width).is_none()
            || batch.tokens.len() != batch.rows * batch.width
        {
            return Err(EngineError::BatchMismatch {
                ids: batch.tokens.len(),
                rows: batch.rows,
                width: batch.width,
                want_rows: self.rows,
                want_width: self.width,
            });
        }
        let preds = self.rows * batch.seq_len();
        let weights =
            loss_weights_for(preds, |i| batch.scored(i)).ok_or(EngineError::NothingScored)?;
        let k = self.next_slot;
        let mut ids = vec![0i32; batch.tokens.len()];
        self.check_ids(batch, &mut ids)?;
        let slot = &mut self.staging[k];
        // Waits only for this slot's previous upload, two batches ago. A
        // narrower batch fills the front of each buffer, which is all its
        // graph reads; the whole buffer is uploaded, the tail unread.
        prefix(slot.tokens.as_mut_slice()?, &ids)?;
        prefix(slot.weights.as_mut_slice()?, &weights)?;
        self.gpu
            .copy_from_pinned(&slot.tokens, &mut self.step.tokens)?;
        self.gpu
            .copy_from_pinned(&slot.weights, &mut self.step.loss_weights)?;
        if let Some(starts) = starts {
            prefix(slot.resets.as_mut_slice()?, &starts)?;
            self.gpu
                .copy_from_pinned(&slot.resets, &mut self.step.acts.resets)?;
        }
        self.next_slot = 1 - k;
        self.staged_width = batch.width;
        self.staged = true;
        Ok(())
    }

    fn step(&mut self) -> Result<(), EngineError> {
        self.take_staged()?;
        let graph = self
            .graph_for(self.staged_width)
            .ok_or(EngineError::Order("no graph for the staged batch's width"))?;
        self.step.replay(&self.gpu, graph)?;
        self.after_step()
    }

    fn metrics(&mut self) -> Result<StepMetrics, EngineError> {
        if let Some(m) = self.last {
            return Ok(m);
        }
        if !self.stepped {
            return Err(EngineError::Order("metrics() before step()"));
        }
        let m = metrics_of(self.report.as_slice()?);
        self.last = Some(m);
        Ok(m)
    }

    fn eval(&mut self, batch: &Batch) -> Result<EvalOutput, EngineError> {
        let len = batch.seq_len();
        if len == 0 || batch.rows == 0 {
            return Ok(EvalOutput {
                token_loss: Vec::new(),
                argmax: Vec::new(),
            });
        }
        // Chunks of at most a training batch's predictions bound the memory.
        let budget = (self.rows * (self.width - 1)).max(len);
        let chunk = (budget / len).max(1);
        let mut out = EvalOutput {
            token_loss: Vec::with_capacity(batch.rows * len),
            argmax: Vec::with_capacity(batch.rows * len),
        };
        let mut start = 0;
        while start < batch.rows {
            let end = (start + chunk).min(batch.rows);
            let part = self.eval_chunk(&batch.slice_rows(start, end))?;
            out.token_loss.extend(part.token_loss);
            out.argmax.extend(part.argmax);
            start = end;
        }
        Ok(out)
    }

    fn export_state(&mut self) -> Result<EngineState, EngineError> {
        let gpu = &self.gpu;
        let weights = self.step.weights.master().download(gpu)?;
        let m = self.step.adam.m.download(gpu)?;
        let v = self.step.adam.v.download(gpu)?;
        let moments: Vec<Moments> = m.into_iter().zip(v).collect();
        let (steps, skipped) = self.step.control.counters(gpu)?;
        Ok(EngineState {
            weights,
            moments,
            adam_steps: self.step.sched.steps(gpu)?,
            steps,
            skipped,
        })
    }

    fn import_state(&mut self, state: EngineState) -> Result<(), EngineError> {
        state.check(&self.cfg)?;
        let adam_steps = i32::try_from(state.adam_steps)
            .map_err(|_| EngineError::AdamStepsOverflow(state.adam_steps))?;
        self.upload_masters(&state.weights)?;
        let gpu = &self.gpu;
        let adam = &mut self.step.adam;
        for ((dm, dv), (m, v)) in adam
            .m
            .tensors_mut()
            .into_iter()
            .zip(adam.v.tensors_mut())
            .zip(&state.moments)
        {
            gpu.copy_from_host(m, dm)?;
            gpu.copy_from_host(v, dv)?;
        }
        gpu.copy_from_host(&[adam_steps], &mut self.step.sched.step)?;
        self.step
            .control
            .set_counters(gpu, state.steps, state.skipped)?;
        self.last = None;
        self.stepped = false;
        Ok(())
    }

    fn weights(&mut self) -> Result<Weights<f32>, EngineError> {
        Ok(self.step.weights.master().download(&self.gpu)?)
    }

    fn set_weights(&mut self, weights: &Weights<f32>) -> Result<(), EngineError> {
        check_weights(&self.cfg, weights)?;
        self.upload_masters(weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_read_the_report_slots() {
        let mut r = [0.0; report::LEN];
        r[report::LOSS] = 0.5;
        r[report::GRAD_NORM] = 2.0;
        r[report::LR] = 1e-3;
        r[report::SKIPPED] = 1.0;
        r[report::SKIPPED_TOTAL] = 3.0;
        r[report::STEPS] = 17.0;
        let m = metrics_of(&r);
        assert_eq!(
            m,
            StepMetrics {
                step: 17,
                loss: 0.5,
                grad_norm: 2.0,
                lr: 1e-3,
                skipped: true,
                skipped_total: 3,
            }
        );
        assert!(metrics_of(&[]).loss.is_nan());
    }
}
