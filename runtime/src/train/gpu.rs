//! The GPU engines: a graph-captured step behind [`TrainEngine`], one body
//! ([`GpuEngine`]) for both precisions through [`GraphStep`]:
//! [`GpuF32Engine`] runs `specs/mamba3_f32.ron` ([`F32Step`]),
//! [`GpuBf16Engine`] runs `specs/mamba3_bf16.ron` ([`Bf16Step`]; its state is
//! the f32 masters and moments, and importing re-syncs the bf16 copies).
//!
//! The step is captured once, for the run's training shape, when the engine
//! is built; every [`TrainEngine::step`] is one guarded graph replay and
//! returns without waiting. Batches go through two pinned host buffers used
//! in turn: [`TrainEngine::load_batch`] fills one on the host (while the
//! previous step runs on the device) and enqueues its upload into the
//! step's input buffers behind the running replay, so stream order keeps
//! the replay's reads before the overwrite and no device copy of the inputs
//! is needed. The step leaves its scalars in a small device report that is
//! copied into pinned memory behind the replay; [`TrainEngine::metrics`]
//! waits for that copy, and is the only call of a training step that waits.
//!
//! Evaluation runs the forward op eagerly on activations sized for the eval
//! batch (row chunks no larger than a training batch, buffers kept per
//! shape), then an arg-max kernel; it never touches the captured buffers
//! except to read the weights.

use std::collections::HashMap;

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
use crate::mamba3::gpu::{
    Acts, Bf16Step, F32Step, Mamba3GpuError, MixedActs, forward, forward_mixed,
    sync_master_to_compute,
};
use crate::optim::gpu::{AdamWState, StepScalars};
use crate::optim::step_control::{FrozenSlice, StepControl, loss_weights_for, report};
use crate::optim::{AdamWConfig, DecayPolicy};

/// Most eval activation shapes kept at once.
const EVAL_SHAPES: usize = 8;

/// What the engine needs of a graph-captured step (`F32Step`, `Bf16Step`):
/// one engine body serves both precisions.
pub trait GraphStep: TrainingStep<Context = Gpu> + Sized {
    /// Activations of an eval forward pass.
    type EvalActs;
    /// `f32` or `bf16`.
    const PRECISION: &'static str;
    /// Uploads `weights` and allocates a `batch x seq_len` step.
    fn build(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        weights: &Weights<f32>,
        adamw: &AdamWConfig,
        policy: &DecayPolicy,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError>;
    /// f32 master weights.
    fn master(&self) -> &crate::mamba3::gpu::Weights;
    /// f32 master weights, mutably.
    fn master_mut(&mut self) -> &mut crate::mamba3::gpu::Weights;
    /// AdamW moments, mutably.
    fn adam_mut(&mut self) -> &mut AdamWState;
    /// AdamW's device scalars, mutably.
    fn sched_mut(&mut self) -> &mut StepScalars;
    /// The step's control scalars, mutably.
    fn control_mut(&mut self) -> &mut StepControl;
    /// The two inputs: token ids and loss weights.
    fn inputs_mut(&mut self) -> (&mut DeviceBuffer<i32>, &mut DeviceBuffer<f32>);
    /// Refreshes anything derived from the masters after they were
    /// overwritten from the host (bf16 compute copies).
    fn masters_changed(&mut self, gpu: &Gpu) -> Result<(), Mamba3GpuError>;
    /// Eval activations for `rows x len`.
    fn eval_acts(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        rows: usize,
        len: usize,
    ) -> Result<Self::EvalActs, Mamba3GpuError>;
    /// The forward op on eval buffers.
    fn eval_forward(
        &self,
        gpu: &Gpu,
        tokens: &DeviceBuffer<i32>,
        acts: &mut Self::EvalActs,
        loss: &mut DeviceBuffer<f32>,
    ) -> Result<(), Mamba3GpuError>;
    /// `(logits, per-prediction loss)` of an eval pass.
    fn eval_out(acts: &Self::EvalActs) -> (&DeviceBuffer<f32>, &DeviceBuffer<f32>);
}

/// Implements [`GraphStep`] for a derived step; the two steps differ only in
/// their types and the forward op.
macro_rules! graph_step {
    ($step:ty, $acts:ty, $prec:literal, $fwd:path, $master:path, $sync:path) => {
        impl GraphStep for $step {
            type EvalActs = $acts;
            const PRECISION: &'static str = $prec;

            fn build(
                gpu: &Gpu,
                cfg: &Mamba3Config,
                weights: &Weights<f32>,
                adamw: &AdamWConfig,
                policy: &DecayPolicy,
                batch: usize,
                seq_len: usize,
            ) -> Result<Self, Mamba3GpuError> {
                <$step>::new(gpu, cfg, weights, adamw, policy, batch, seq_len)
            }

            fn master(&self) -> &crate::mamba3::gpu::Weights {
                crate::mamba3::gpu::StepWeights::master(&self.weights)
            }

            fn master_mut(&mut self) -> &mut crate::mamba3::gpu::Weights {
                $master(&mut self.weights)
            }

            fn adam_mut(&mut self) -> &mut AdamWState {
                &mut self.adam
            }

            fn sched_mut(&mut self) -> &mut StepScalars {
                &mut self.sched
            }

            fn control_mut(&mut self) -> &mut StepControl {
                &mut self.control
            }

            fn inputs_mut(&mut self) -> (&mut DeviceBuffer<i32>, &mut DeviceBuffer<f32>) {
                (&mut self.tokens, &mut self.loss_weights)
            }

            fn masters_changed(&mut self, gpu: &Gpu) -> Result<(), Mamba3GpuError> {
                $sync(gpu, &mut self.weights)
            }

            fn eval_acts(
                gpu: &Gpu,
                cfg: &Mamba3Config,
                rows: usize,
                len: usize,
            ) -> Result<$acts, Mamba3GpuError> {
                <$acts>::new(gpu, cfg, rows, len)
            }

            fn eval_forward(
                &self,
                gpu: &Gpu,
                tokens: &DeviceBuffer<i32>,
                acts: &mut $acts,
                loss: &mut DeviceBuffer<f32>,
            ) -> Result<(), Mamba3GpuError> {
                $fwd(gpu, &self.weights, tokens, acts, loss)
            }

            fn eval_out(acts: &$acts) -> (&DeviceBuffer<f32>, &DeviceBuffer<f32>) {
                (&acts.logits, &acts.row_loss)
            }
        }
    };
}

graph_step!(F32Step, Acts, "f32", forward, own_master, nothing_derived);
graph_step!(
    Bf16Step,
    MixedActs,
    "bf16",
    forward_mixed,
    mixed_master,
    sync_master_to_compute
);

/// The f32 step's weights are their own masters.
fn own_master(w: &mut crate::mamba3::gpu::Weights) -> &mut crate::mamba3::gpu::Weights {
    w
}

/// The f32 masters of a mixed step.
fn mixed_master(w: &mut crate::mamba3::gpu::MixedWeights) -> &mut crate::mamba3::gpu::Weights {
    &mut w.master
}

/// The f32 step keeps no copies of its weights.
fn nothing_derived(_: &Gpu, _: &mut crate::mamba3::gpu::Weights) -> Result<(), Mamba3GpuError> {
    Ok(())
}

/// The f32 engine.
pub type GpuF32Engine = GpuEngine<F32Step>;
/// The bf16 mixed-precision engine (f32 masters and moments).
pub type GpuBf16Engine = GpuEngine<Bf16Step>;

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
}

/// A graph-captured step as a [`TrainEngine`]; see the [module
/// docs](self).
pub struct GpuEngine<S: GraphStep> {
    // Field order is drop order: the graph before the buffers it points
    // into, every buffer before the context.
    graph: S::Graph,
    step: S,
    eval: HashMap<(usize, usize), EvalBufs<S::EvalActs>>,
    staging: [Staging; 2],
    next_slot: usize,
    report: PinnedBuffer<f64>,
    cfg: Mamba3Config,
    rows: usize,
    width: usize,
    staged: bool,
    stepped: bool,
    last: Option<StepMetrics>,
    schedule: Option<LrSchedule>,
    gpu: Gpu,
}

impl<S: GraphStep> GpuEngine<S> {
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
        check_weights(&cfg, weights)?;
        if rows == 0 || width < 2 {
            return Err(EngineError::BatchShape {
                ids: rows.saturating_mul(width),
                rows,
                width,
            });
        }
        let len = width - 1;
        let mut step = S::build(
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
        *step.control_mut() = StepControl::new(&gpu, &cfg, settings.adam.lr, frozen)?;
        step.control_mut().set_clip(&gpu, settings.clip)?;
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
            })
        };
        let staging = [slot()?, slot()?];
        let report = gpu.alloc_pinned::<f64>(report::LEN)?;
        Ok(Self {
            graph,
            step,
            eval: HashMap::new(),
            staging,
            next_slot: 0,
            report,
            cfg,
            rows,
            width,
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
    pub fn step_buffers(&self) -> &S {
        &self.step
    }

    /// Runs the staged step eagerly instead of replaying the graph (tests
    /// compare the two); the same ops, in spec order.
    pub fn step_eager(&mut self) -> Result<(), EngineError> {
        self.take_staged()?;
        self.step.run_eager(&self.gpu)?;
        self.after_step()
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
                .control_mut()
                .set_schedule(&self.gpu, s.peak, s.min_lr, s.warmup, s.total)?;
        }
        Ok(())
    }

    fn after_step(&mut self) -> Result<(), EngineError> {
        self.gpu
            .copy_to_pinned(&self.step.control_mut().report, &mut self.report)?;
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

    fn eval_chunk(&mut self, batch: &Batch) -> Result<EvalOutput, EngineError> {
        let (rows, len) = (batch.rows, batch.seq_len());
        if !self.eval.contains_key(&(rows, len)) {
            if self.eval.len() >= EVAL_SHAPES {
                self.eval.clear();
            }
            let bufs = EvalBufs {
                acts: S::eval_acts(&self.gpu, &self.cfg, rows, len)?,
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
        step.eval_forward(gpu, &bufs.tokens, &mut bufs.acts, &mut bufs.loss)?;
        let (logits, row_loss) = S::eval_out(&bufs.acts);
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

fn metrics_of(r: &[f64]) -> StepMetrics {
    let at = |i: usize| r.get(i).copied().unwrap_or(f64::NAN);
    // Counters travel as f64 in the report; they are exact below 2^53.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
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

impl<S: GraphStep> TrainEngine for GpuEngine<S> {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "cuda graph".into(),
            precision: S::PRECISION,
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

    fn load_batch(&mut self, batch: &Batch) -> Result<(), EngineError> {
        if (batch.rows, batch.width) != (self.rows, self.width)
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
        let preds = self.rows * (self.width - 1);
        let weights =
            loss_weights_for(preds, |i| batch.scored(i)).ok_or(EngineError::NothingScored)?;
        let k = self.next_slot;
        let mut ids = vec![0i32; batch.tokens.len()];
        self.check_ids(batch, &mut ids)?;
        let slot = &mut self.staging[k];
        // Waits only for this slot's previous upload, two batches ago.
        slot.tokens.as_mut_slice()?.copy_from_slice(&ids);
        slot.weights.as_mut_slice()?.copy_from_slice(&weights);
        let (tokens, loss_weights) = self.step.inputs_mut();
        self.gpu.copy_from_pinned(&slot.tokens, tokens)?;
        self.gpu.copy_from_pinned(&slot.weights, loss_weights)?;
        self.next_slot = 1 - k;
        self.staged = true;
        Ok(())
    }

    fn step(&mut self) -> Result<(), EngineError> {
        self.take_staged()?;
        self.step.replay(&self.gpu, &self.graph)?;
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
        let weights = self.step.master().download(gpu)?;
        let m = self.step.adam_mut().m.download(gpu)?;
        let v = self.step.adam_mut().v.download(gpu)?;
        let moments: Vec<Moments> = m
            .tensors()
            .into_iter()
            .zip(v.tensors())
            .map(|(a, b)| (a.to_vec(), b.to_vec()))
            .collect();
        let (steps, skipped) = self.step.control_mut().counters(gpu)?;
        Ok(EngineState {
            weights,
            moments,
            adam_steps: self.step.sched_mut().steps(gpu)?,
            steps,
            skipped,
        })
    }

    fn import_state(&mut self, state: EngineState) -> Result<(), EngineError> {
        state.check(&self.cfg)?;
        let adam_steps = i32::try_from(state.adam_steps)
            .map_err(|_| EngineError::AdamStepsOverflow(state.adam_steps))?;
        let gpu = &self.gpu;
        // Into the existing allocations: the captured pointers stay valid.
        for (dst, src) in self
            .step
            .master_mut()
            .tensors_mut()
            .into_iter()
            .zip(state.weights.tensors())
        {
            gpu.copy_from_host(src, dst)?;
        }
        self.step.masters_changed(gpu)?;
        let adam = self.step.adam_mut();
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
        gpu.copy_from_host(&[adam_steps], &mut self.step.sched_mut().step)?;
        self.step
            .control_mut()
            .set_counters(gpu, state.steps, state.skipped)?;
        self.last = None;
        self.stepped = false;
        Ok(())
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
