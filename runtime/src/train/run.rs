//! The training job: start a run (or resume one), then the step loop with
//! evaluation, metrics and checkpoints, and the final summary.
//!
//! Starting checks everything a flag can get wrong before anything is
//! allocated ([`config::validate`], [`config::model_config`], the memory
//! estimate of [`memory`]), then claims the run directory ([`RunDir`]). A
//! resume loads the newest intact checkpoint, continues the run *it* saved
//! (flags typed again are compared with it, [`config::merge_resume`]),
//! refuses a data file whose fingerprint changed, and rewinds the run
//! directory to the checkpoint's step.
//!
//! Per step the loop runs `engine.step()`, draws the next batch and stages it
//! (`load_batch`) *before* reading the step's metrics, so a GPU engine
//! uploads the next batch while the current step runs. The data position
//! saved in a checkpoint is the one before that next batch was drawn, so a
//! resumed run draws it again and continues bit-identically.
//!
//! A stop request ([`Stop`], set by a signal handler) is honoured after the
//! current step, or between evaluation chunks: the run skips the rest of the
//! evaluation, checkpoints and returns [`RunStatus::Stopped`].

use std::borrow::Cow;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::TrainError;
use super::checkpoint::{self, CHECKPOINTS_DIR, Found, TrainState};
use super::config::{self, Change, Device, Rotation, RunConfig, Setting};
use super::cpu::CpuEngine;
use super::data::{Batch, DataSpec, Dataset, EvalSet, Task};
use super::dynamics::{self, Dynamics};
use super::edit::WeightEdit;
use super::ema::Ema;
use super::engine::{OptimSettings, TrainEngine, rotation_rows};
use super::gpu::{GpuBf16Engine, GpuF32Engine};
use super::memory::{self, Holder};
use super::plot;
use super::report::{EvalResult, MetricsLog, Progress, ProgressMode};
use super::rundir::RunDir;
use super::schedule::LrSchedule;
use super::stop::Stop;
use crate::Precision;
use crate::device::Gpu;
use crate::mamba3::checkpoint as model_ckpt;
use crate::mamba3::cpu::Weights;
use crate::mamba3::{AActivation, Mamba3Config, RopeFraction};
use crate::optim::AdamWConfig;

/// What `stepgraph train` was asked to do.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The run. With `resume`, only the settings listed in
    /// [`Resume::given`] are read from it (and compared with the saved run).
    pub run: RunConfig,
    /// Run directory of a new run (`None`: `runs/<UTC timestamp>`).
    pub run_dir: Option<PathBuf>,
    /// Continue a saved run instead of starting one.
    pub resume: Option<Resume>,
    /// Stop (checkpoint, return) after this step, as a signal would.
    pub stop_after: Option<u64>,
    /// Progress display.
    pub progress: ProgressMode,
    /// At every evaluation of a task run, also measure the model's
    /// dynamics on a few rows of the longest eval set
    /// ([`super::dynamics`]) and log them (`"kind": "dynamics"`).
    pub log_dynamics: bool,
    /// The GPU (ordinal) a GPU run trains on (`--gpu`). Not a setting of
    /// the run: a resume may continue it on another.
    pub gpu: usize,
}

/// `--resume`: where, and which settings the user typed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// A checkpoint, or a run directory (its newest intact checkpoint).
    pub from: PathBuf,
    /// Settings given explicitly, compared with the saved run.
    pub given: Vec<Setting>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// It trained to its last step.
    Finished,
    /// It stopped early (a signal or `--stop-after`), with a checkpoint.
    Stopped,
    /// A resume found the run already at its last step; nothing ran.
    AlreadyFinished,
}

/// The mean training loss over a range of steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossWindow {
    /// First step of the range.
    pub first: u64,
    /// Last step of the range.
    pub last: u64,
    /// Mean loss over it.
    pub mean: f64,
}

/// Steps averaged at each end of a run for the summary's loss.
pub const SUMMARY_STEPS: usize = 50;

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Step reached.
    pub step: u64,
    /// Steps of the run.
    pub steps: u64,
    /// How it ended.
    pub status: RunStatus,
    /// Mean loss of this process's first [`SUMMARY_STEPS`] steps (the first
    /// half of a run of fewer than twice as many).
    pub first_loss: Option<LossWindow>,
    /// Mean loss of this process's last [`SUMMARY_STEPS`] steps (the second
    /// half of a shorter run).
    pub last_loss: Option<LossWindow>,
    /// Steps skipped for non-finite gradients (whole run).
    pub skipped: u64,
    /// Last evaluation.
    pub eval: Vec<EvalResult>,
    /// The weight average's scores at the last evaluation (`--ema`; empty
    /// without one).
    pub eval_ema: Vec<EvalResult>,
    /// Newest checkpoint (written, or found finished).
    pub checkpoint: Option<PathBuf>,
    /// The plot.
    pub plot: Option<PathBuf>,
    /// Wall time of this process's loop, evaluations and checkpoints included.
    pub elapsed: Duration,
    /// Time spent in training steps only.
    pub train_time: Duration,
    /// Training tokens per second of training time (no eval, no checkpoints).
    pub tokens_per_s: f64,
    /// The engine that ran.
    pub engine: String,
    /// The last dynamics probe (with [`TrainOptions::log_dynamics`]).
    pub dynamics: Option<Dynamics>,
}

/// What `--device` / `--precision` resolved to.
#[derive(Debug)]
pub enum Resolved {
    /// The CPU engine, with the one-line notice to print when `auto` fell
    /// back to it.
    Cpu(Option<String>),
    /// A GPU engine on this context.
    Cuda(Box<Gpu>),
}

/// Resolves `--device` / `--precision` to the engine that will run: `auto`
/// is GPU `gpu` when a context opens on it, else the CPU with a one-line
/// notice; `cuda` without a usable GPU is an error naming why.
pub fn resolve_device(
    device: Device,
    precision: Precision,
    gpu: usize,
) -> Result<Resolved, TrainError> {
    let resolved = match device {
        Device::Cpu => Resolved::Cpu(None),
        Device::Cuda => match Gpu::new(gpu) {
            Ok(gpu) => Resolved::Cuda(Box::new(gpu)),
            Err(source) => return Err(TrainError::NoGpu { source }),
        },
        Device::Auto => match Gpu::new(gpu) {
            Ok(gpu) => Resolved::Cuda(Box::new(gpu)),
            Err(e) => Resolved::Cpu(Some(format!(
                "notice: no usable GPU ({}); training on the CPU (f32 reference)",
                one_line(&e.to_string())
            ))),
        },
    };
    match (&resolved, precision) {
        (_, Precision::F64) => Err(TrainError::F64NotTrained),
        (Resolved::Cpu(_), Precision::Bf16) => Err(TrainError::Bf16NeedsGpu),
        _ => Ok(resolved),
    }
}

/// The first line of an error message, for one-line notices and errors.
pub(crate) fn one_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// A new run's first weights: drawn from its seed, or read from its
/// `--init-from` model directory (whose path the run's record keeps
/// absolute), refused unless that directory's config is the run's model, so
/// a run never starts from weights of another shape or map.
fn initial_weights(run: &mut RunConfig, cfg: &Mamba3Config) -> Result<Weights<f32>, TrainError> {
    let Some(dir) = &mut run.init_from else {
        return Ok(Weights::init(cfg, run.seed)?);
    };
    *dir = std::fs::canonicalize(&*dir).map_err(|e| TrainError::InvalidOption {
        flag: "--init-from",
        reason: format!("{}: {e}", dir.display()),
    })?;
    let (found, weights) = model_ckpt::load::<f32>(dir)?;
    match checkpoint::config_difference(&found, cfg) {
        Some((field, found, expected)) => Err(TrainError::InitMismatch {
            dir: dir.clone(),
            field,
            found,
            expected,
        }),
        None => Ok(weights),
    }
}

/// The run with its `--data` path made absolute, so a resume from another
/// directory finds the file.
fn absolute_data(run: &RunConfig) -> Result<RunConfig, TrainError> {
    let mut run = run.clone();
    if let DataSpec::File { path, .. } = &mut run.data {
        *path = std::fs::canonicalize(&*path).map_err(|source| TrainError::DataRead {
            path: path.clone(),
            source,
        })?;
    }
    Ok(run)
}

/// Row widths of training batches and of each evaluated set.
fn widths(data: &DataSpec) -> (usize, Vec<usize>) {
    match data {
        DataSpec::Task {
            task,
            train_len,
            eval_lens,
            ..
        } => (
            task.width(*train_len),
            eval_lens.iter().map(|&n| task.width(n)).collect(),
        ),
        DataSpec::File { seq_len, .. } => {
            let w = seq_len.saturating_add(1);
            (w, vec![w])
        }
    }
}

/// A run about to train: everything checked, the directory held.
struct Start {
    run: RunConfig,
    cfg: Mamba3Config,
    resolved: Resolved,
    estimate: (memory::Estimate, Option<u128>, String),
    resumed: Option<(Found, Vec<Change>)>,
    /// A new run's first weights; a resumed run's come from its checkpoint.
    initial: Option<Weights<f32>>,
}

/// Runs (or resumes) a training job. `stop` is polled after every step and
/// between evaluation chunks: when set, the run checkpoints and returns
/// [`RunStatus::Stopped`].
pub fn train(opts: &TrainOptions, stop: &Stop) -> Result<RunSummary, TrainError> {
    let (run, resumed, held) = match &opts.resume {
        None => {
            config::validate(&opts.run)?;
            (absolute_data(&opts.run)?, None, None)
        }
        Some(r) => {
            let owner = checkpoint::run_dir_for(&r.from);
            if let (Some(dir), Some(_)) = (&owner, &opts.run_dir) {
                return Err(TrainError::InvalidOption {
                    flag: "--run-dir",
                    reason: format!(
                        "a resumed run continues in its own directory {}; leave --run-dir out",
                        dir.display()
                    ),
                });
            }
            let held = owner.as_deref().map(RunDir::open).transpose()?;
            let found = checkpoint::find(&r.from)?;
            let typed = if r.given.contains(&Setting::Data) {
                absolute_data(&opts.run)?
            } else {
                opts.run.clone()
            };
            let (run, changes) = config::merge_resume(&found.train.run, &typed, &r.given)?;
            config::validate(&run)?;
            if found.train.step > run.steps {
                return Err(TrainError::InvalidOption {
                    flag: "--steps",
                    reason: format!(
                        "{} is behind the run, which is at step {}",
                        run.steps, found.train.step
                    ),
                });
            }
            if found.train.step == run.steps {
                return Ok(already_finished(&found, &run, held.as_ref()));
            }
            (run, Some((found, changes)), held)
        }
    };
    let cfg = config::model_config(run.model, config::vocab_of(&run.data))?;
    check_edits(&run, &cfg)?;
    let resolved = resolve_device(run.device, run.precision, opts.gpu)?;
    let (train_width, eval_widths) = widths(&run.data);
    let holder = match (&resolved, run.precision) {
        (Resolved::Cpu(_), _) => Holder::Cpu,
        (Resolved::Cuda(_), p) => Holder::Gpu {
            operand_bytes: p.operand_bytes(),
        },
    };
    let (rows, width) = Batch::packed_shape(run.batch, train_width, run.pack);
    let est = memory::estimate(&cfg, holder, rows, width, &eval_widths);
    let (available, place) = match &resolved {
        Resolved::Cpu(_) => (memory::host_available(), "the host".to_owned()),
        Resolved::Cuda(gpu) => (
            gpu.mem_info()
                .ok()
                .map(|(free, _)| u128::try_from(free).unwrap_or(u128::MAX)),
            gpu.info().name.clone(),
        ),
    };
    memory::check(&est, available, &place)?;
    // After the memory check, which refuses a model too big to draw.
    let mut run = run;
    let initial = match &resumed {
        None => Some(initial_weights(&mut run, &cfg)?),
        Some(_) => None,
    };
    let dir = match held {
        Some(d) => d,
        None => match &opts.run_dir {
            Some(p) => RunDir::claim(p)?,
            None => RunDir::claim_default()?,
        },
    };
    let start = Start {
        run,
        cfg,
        resolved,
        estimate: (est, available, place),
        resumed,
        initial,
    };
    match run_in(&dir, start, opts, stop) {
        Ok(summary) => Ok(summary),
        Err(e) => {
            dir.discard_if_unused();
            Err(e)
        }
    }
}

fn already_finished(found: &Found, run: &RunConfig, dir: Option<&RunDir>) -> RunSummary {
    RunSummary {
        run_dir: dir.map_or_else(|| found.dir.clone(), |d| d.path().to_path_buf()),
        step: found.train.step,
        steps: run.steps,
        status: RunStatus::AlreadyFinished,
        first_loss: None,
        last_loss: None,
        skipped: found.train.skipped,
        eval: Vec::new(),
        eval_ema: Vec::new(),
        checkpoint: Some(found.dir.clone()),
        plot: None,
        elapsed: Duration::ZERO,
        train_time: Duration::ZERO,
        tokens_per_s: 0.0,
        engine: found.train.engine.clone(),
        dynamics: None,
    }
}

/// The next training batch: packed `--pack` instances to a row, else
/// trimmed to its longest row with `--trim`.
fn draw(data: &mut Dataset, run: &RunConfig) -> Result<Batch, TrainError> {
    let batch = data.next_batch(run.batch)?;
    Ok(if run.packs() {
        let pad = data.task().map_or(0, Task::pad);
        batch.packed(run.pack, config::TRIM_STEP, pad)
    } else if run.trim {
        batch.trimmed(config::TRIM_STEP)
    } else {
        batch
    })
}

/// Refuses an edit whose part names no parameter of `cfg`, or whose step
/// the run never reaches (a usage error, before any device opens).
fn check_edits(run: &RunConfig, cfg: &Mamba3Config) -> Result<(), TrainError> {
    let specs = crate::mamba3::cpu::param_specs(cfg);
    for e in &run.edits {
        let reason = match e.part.spans(&specs) {
            Err(err) => err.to_string(),
            Ok(_) if e.step >= run.steps => format!(
                "the run ends at step {} (--steps), so an edit after step {} never applies",
                run.steps, e.step
            ),
            Ok(_) => continue,
        };
        return Err(TrainError::InvalidOption {
            flag: "--edit",
            reason: format!("{e}: {reason}"),
        });
    }
    Ok(())
}

/// Applies `edit` between two steps: the engine's state read back, edited
/// and put back (weights, moments and counters; the captured step is not
/// rebuilt), and the weight average edited alike.
fn apply_edit(
    engine: &mut dyn TrainEngine,
    ema: Option<&mut Ema>,
    cfg: &Mamba3Config,
    edit: &WeightEdit,
) -> Result<(), TrainError> {
    let specs = crate::mamba3::cpu::param_specs(cfg);
    let mut state = engine.export_state()?;
    let avg = ema.and_then(Ema::weights_mut);
    edit.apply(&specs, &mut state, avg)
        .map_err(|err| TrainError::InvalidOption {
            flag: "--edit",
            reason: format!("{edit}: {err}"),
        })?;
    engine.import_state(state)?;
    Ok(())
}

/// Builds the engine over the run's first weights (frozen slices zeroed),
/// which a resume then replaces; the GPU context moves from `start` into it.
fn build_engine(
    start: &mut Start,
    settings: OptimSettings,
    rows: usize,
    width: usize,
) -> Result<(Box<dyn TrainEngine>, Option<String>), TrainError> {
    let (run, cfg) = (&start.run, &start.cfg);
    let mut weights = match start.initial.take() {
        Some(w) => w,
        None => Weights::<f32>::init(cfg, run.seed)?,
    };
    let mut tensors = weights.tensors_mut();
    for f in &settings.frozen {
        if let Some(w) = tensors
            .get_mut(f.tensor)
            .and_then(|t| t.get_mut(f.start..f.end))
        {
            w.fill(0.0);
        }
    }
    Ok(
        match std::mem::replace(&mut start.resolved, Resolved::Cpu(None)) {
            Resolved::Cpu(notice) => (
                Box::new(CpuEngine::new(cfg.clone(), weights, settings)?),
                notice,
            ),
            Resolved::Cuda(gpu) => {
                let (gpu, c, s) = (*gpu, cfg.clone(), &settings);
                let engine: Box<dyn TrainEngine> = match (run.precision, run.packs()) {
                    (Precision::F32, false) => {
                        Box::new(GpuF32Engine::new(gpu, c, &weights, s, rows, width)?)
                    }
                    (Precision::F32, true) => {
                        Box::new(GpuF32Engine::packed(gpu, c, &weights, s, rows, width)?)
                    }
                    (Precision::Bf16, false) => {
                        Box::new(GpuBf16Engine::new(gpu, c, &weights, s, rows, width)?)
                    }
                    (Precision::Bf16, true) => {
                        Box::new(GpuBf16Engine::packed(gpu, c, &weights, s, rows, width)?)
                    }
                    (Precision::F64, _) => return Err(TrainError::F64NotTrained),
                };
                (engine, None)
            }
        },
    )
}

/// The start lines: engine, model, data; batch and schedule; memory.
fn start_lines(
    progress: &Progress,
    start: &Start,
    engine: &dyn TrainEngine,
    data: &Dataset,
    at: u64,
    dir: &Path,
) {
    let (run, cfg) = (&start.run, &start.cfg);
    let info = engine.info();
    let params = memory::param_count(cfg);
    progress.line(&format!(
        "stepgraph train: {} {} on {}; model d_model {} n_layer {} d_state {} headdim {}{}{}{}{} ({params} params); {}",
        info.name,
        info.precision,
        info.device,
        cfg.d_model,
        cfg.n_layer,
        cfg.d_state,
        cfg.headdim,
        if cfg.rope_fraction == RopeFraction::Full { " full-rope" } else { "" },
        if cfg.a_activation == AActivation::Softplus { " softplus-A" } else { "" },
        match run.model.rotation {
            Rotation::Data => "",
            Rotation::Fixed => " fixed-RoPE",
            Rotation::None => " no-rotation",
        },
        if cfg.is_outproj_norm { " outproj-norm" } else { "" },
        data.describe()
    ));
    if let (0, Some(dir)) = (at, &run.init_from) {
        progress.line(&format!("initial weights from {}", dir.display()));
    }
    progress.line(&format!(
        "batch {} x {} tokens{}, {} steps{}, lr {:.1e} (warmup {}, cosine to {:.1e}); run dir {}",
        run.batch,
        data.train_width() - 1,
        if run.packs() {
            Cow::Owned(format!(
                " ({} a row in {} rows, each cut to the fullest)",
                run.pack,
                run.batch.div_ceil(run.pack)
            ))
        } else if run.trim {
            Cow::Borrowed(" (each trimmed to its longest row)")
        } else {
            Cow::Borrowed("")
        },
        run.steps,
        if at > 0 {
            format!(" (resuming at {at})")
        } else {
            String::new()
        },
        run.lr,
        run.warmup,
        run.min_lr,
        dir.display()
    ));
    let (est, available, place) = &start.estimate;
    progress.line(&format!(
        "memory: about {} (model and optimizer {}, training step {}, evaluation {}){}",
        memory::gib(est.total()),
        memory::gib(est.params),
        memory::gib(est.step),
        memory::gib(est.eval),
        available.map_or_else(String::new, |a| format!(
            " of {} available on {place}",
            memory::gib(a)
        ))
    ));
}

/// Scores one eval set in row chunks of at most `budget` predictions;
/// `None` when a stop was requested before it finished.
fn evaluate(
    engine: &mut dyn TrainEngine,
    set: &EvalSet,
    budget: usize,
    stop: &Stop,
) -> Result<Option<EvalResult>, TrainError> {
    let (mut loss, mut correct, mut count) = (0.0, 0usize, 0usize);
    for whole in &set.batches {
        let rows = memory::eval_chunk_rows(budget, whole.width);
        let mut start = 0;
        while start < whole.rows {
            if stop.is_requested() {
                return Ok(None);
            }
            let end = (start + rows).min(whole.rows);
            let batch: Cow<'_, Batch> = if start == 0 && end == whole.rows {
                Cow::Borrowed(whole)
            } else {
                Cow::Owned(whole.slice_rows(start, end))
            };
            let out = engine.eval(&batch)?;
            let t = batch.seq_len();
            for (i, (&l, &a)) in out.token_loss.iter().zip(&out.argmax).enumerate() {
                if !batch.scored(i) {
                    continue;
                }
                let (r, p) = (i / t, i % t);
                let target = batch.tokens[r * batch.width + p + 1];
                loss += f64::from(l);
                correct += usize::from(a == target);
                count += 1;
            }
            start = end;
        }
    }
    let n = count.max(1) as f64;
    Ok(Some(EvalResult {
        label: set.label.clone(),
        length: set.length,
        loss: loss / n,
        accuracy: correct as f64 / n,
        count,
    }))
}

fn eval_parts(results: &[EvalResult]) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|r| {
            format!(
                "{}: loss {:.4} acc {:.1}%",
                r.label,
                r.loss,
                100.0 * r.accuracy
            )
        })
        .collect();
    parts.join(" | ")
}

fn eval_line(step: u64, results: &[EvalResult]) -> String {
    format!("eval @ {step}  {}", eval_parts(results))
}

/// Scores every eval set with `weights` in place of the trained ones, then
/// puts the trained weights back (exactly: [`TrainEngine::set_weights`]),
/// also when a stop cuts the scoring short (`None`). `trained` is the
/// engine's weights when the caller has just read them (else read here).
fn evaluate_weights(
    engine: &mut dyn TrainEngine,
    weights: &Weights<f32>,
    trained: Option<Weights<f32>>,
    sets: &[EvalSet],
    budget: usize,
    stop: &Stop,
) -> Result<Option<Vec<EvalResult>>, TrainError> {
    let trained = match trained {
        Some(w) => w,
        None => engine.weights()?,
    };
    engine.set_weights(weights)?;
    let mut scores = Vec::with_capacity(sets.len());
    let mut outcome = Ok(());
    for set in sets {
        match evaluate(engine, set, budget, stop) {
            Ok(Some(r)) => scores.push(r),
            Ok(None) => break,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    engine.set_weights(&trained)?;
    outcome?;
    Ok((scores.len() == sets.len()).then_some(scores))
}

/// Probes the model's dynamics on the last eval set of one size of a task
/// run (the longest, as the recipes list them) and logs them (see
/// [`super::dynamics`]); `None` for a file run.
fn log_dynamics(
    engine: &mut dyn TrainEngine,
    cfg: &Mamba3Config,
    data: &Dataset,
    step: u64,
    log: &mut MetricsLog,
) -> Result<Option<Dynamics>, TrainError> {
    let longest = data.eval_sets().iter().rev().find(|s| s.length.is_some());
    let (Some(task), Some(set)) = (data.task(), longest) else {
        return Ok(None);
    };
    let Some(batch) = set.batches.first() else {
        return Ok(None);
    };
    let state = engine.export_state()?;
    let d = dynamics::probe(cfg, &state.weights, task, batch)
        .map_err(|e| TrainError::Engine(e.into()))?;
    log.event(&json!({
        "kind": "dynamics", "step": step, "set": set.label, "row_len": d.row_len,
        "layers": d.layers,
    }))?;
    Ok(Some(d))
}

fn window(losses: &[(u64, f64)]) -> Option<LossWindow> {
    let (first, last) = (losses.first()?.0, losses.last()?.0);
    let mean = losses.iter().map(|p| p.1).sum::<f64>() / losses.len() as f64;
    Some(LossWindow { first, last, mean })
}

/// The summary's two loss windows: the first and last [`SUMMARY_STEPS`]
/// steps, or the two halves of a shorter run, so they never overlap.
fn windows(
    head: &[(u64, f64)],
    tail: &VecDeque<(u64, f64)>,
) -> (Option<LossWindow>, Option<LossWindow>) {
    if head.len() < 2 * SUMMARY_STEPS {
        let half = head.len().div_ceil(2);
        let last = if head.len() > 1 { &head[half..] } else { head };
        return (window(&head[..half]), window(last));
    }
    let tail: Vec<(u64, f64)> = tail.iter().copied().collect();
    (window(&head[..SUMMARY_STEPS]), window(&tail))
}

/// Opens the data, builds or restores the engine, then runs the loop.
fn run_in(
    dir: &RunDir,
    start: Start,
    opts: &TrainOptions,
    stop: &Stop,
) -> Result<RunSummary, TrainError> {
    let run_dir = dir.path().to_path_buf();
    let mut data = match Dataset::new(&start.run.data, start.run.seed_of_data(), start.run.batch) {
        Err(TrainError::DataRead { path, source }) if start.resumed.is_some() => {
            return Err(TrainError::DataChanged {
                path,
                reason: format!(
                    "cannot read it: {source}; if it moved, give its new path with --data"
                ),
            });
        }
        other => other?,
    };
    if let Some((found, _)) = &start.resumed
        && found.train.data_fingerprint.as_ref() != data.fingerprint()
        && let (Some(then), Some(now), DataSpec::File { path, .. }) = (
            &found.train.data_fingerprint,
            data.fingerprint(),
            &start.run.data,
        )
    {
        return Err(TrainError::DataChanged {
            path: path.clone(),
            reason: format!(
                "{} bytes with xxh3 {} then, {} bytes with xxh3 {} now",
                then.bytes, then.xxh3, now.bytes, now.xxh3
            ),
        });
    }
    let settings = OptimSettings {
        adam: AdamWConfig {
            lr: start.run.lr,
            weight_decay: start.run.weight_decay,
            beta2: start.run.beta2,
            eps: start.run.adam_eps,
            ..AdamWConfig::default()
        },
        decay: start.run.decay.policy(&crate::step::params(&start.cfg)),
        clip: start.run.clip,
        frozen: if start.run.model.rotation.freezes_angle_rows() {
            rotation_rows(&start.cfg)
        } else {
            Vec::new()
        },
    };
    let (rows, width) = Batch::packed_shape(start.run.batch, data.train_width(), start.run.pack);
    let mut start = start;
    let (mut engine, notice) = build_engine(&mut start, settings, rows, width)?;
    if start.run.trim || start.run.packs() {
        engine.capture_widths(&Batch::trimmed_widths(width, config::TRIM_STEP))?;
    }
    let info = engine.info();
    let engine_name = format!("{} {}", info.name, info.precision);
    let run = &start.run;
    let mut notes: Vec<String> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let mut resume_event = None;
    let mut resumed_loss = None;
    let at = match &start.resumed {
        Some((found, changes)) => {
            if let Some((field, found_v, expected)) =
                checkpoint::config_difference(&found.cfg, &start.cfg)
            {
                return Err(TrainError::ConfigMismatch {
                    dir: found.dir.clone(),
                    field,
                    found: found_v,
                    expected,
                });
            }
            engine.import_state(found.state.clone())?;
            data.restore(found.train.data_position(&found.dir)?);
            resumed_loss = found.train.last_loss(&found.dir)?;
            for (skipped, why) in &found.skipped {
                warnings.push(format!(
                    "warning: checkpoint {} is unusable ({why}); resuming from {}, the newest intact one",
                    skipped.display(),
                    found.dir.display()
                ));
            }
            if found.train.engine != engine_name {
                warnings.push(format!(
                    "warning: this run trained on {} so far and continues on {engine_name}: the steps \
                     from here will not be bit-identical to an uninterrupted run",
                    found.train.engine
                ));
            }
            notes.extend(dir.rewind(found.train.step, &found.skipped)?);
            notes.extend(changes.iter().map(|c| format!("resume: {c}")));
            stop.checkpointed(&found.dir);
            resume_event = Some(json!({
                "kind": "resume", "step": found.train.step, "from": found.dir.display().to_string(),
                "changes": changes.iter().map(|c| json!({"from": c.from, "to": c.to})).collect::<Vec<_>>(),
            }));
            found.train.step
        }
        None => 0,
    };
    engine.set_schedule(LrSchedule {
        peak: run.lr,
        min_lr: run.min_lr,
        warmup: run.warmup,
        total: run.steps,
    });
    for w in &warnings {
        eprintln!("{w}");
    }
    let progress = Progress::new(opts.progress, at, run.steps, run.log_every);
    if let Some(n) = &notice {
        progress.line(n);
    }
    start_lines(&progress, &start, engine.as_ref(), &data, at, &run_dir);
    for n in &notes {
        progress.line(n);
    }
    let mut log = MetricsLog::open(&run_dir)?;
    if let Some(event) = &resume_event {
        log.event(event)?;
    }
    let (skipped_before, fingerprint) = (
        start.resumed.as_ref().map_or(0, |r| r.0.train.skipped),
        data.fingerprint().cloned(),
    );
    let ckpt_root = run_dir.join(CHECKPOINTS_DIR);
    let gated = data.is_gated();
    let mut ema = run.ema.map(|decay| {
        Ema::restored(
            decay,
            start
                .resumed
                .as_ref()
                .and_then(|(found, _)| found.ema.clone()),
        )
    });
    let save = |engine: &mut dyn TrainEngine,
                avg: Option<&Weights<f32>>,
                step: u64,
                pos: super::data::DataPosition,
                last_loss: f64|
     -> Result<PathBuf, TrainError> {
        let state = engine.export_state()?;
        let tstate = TrainState {
            format: checkpoint::FORMAT,
            step,
            adam_steps: state.adam_steps,
            skipped: state.skipped,
            run: run.clone(),
            engine: engine_name.clone(),
            data_fingerprint: fingerprint.clone(),
            data_batches: pos.batches,
            data_word_pos: pos.word_pos.to_string(),
            files: Default::default(),
            data_clock: gated.then_some(pos.clock),
            data_smoothed_loss: pos.smoothed_loss.filter(|_| gated).map(|l| l.to_string()),
            data_last_loss: gated.then(|| last_loss.to_string()),
        };
        let dir = checkpoint::save(
            &ckpt_root,
            &start.cfg,
            &state,
            avg,
            &tstate,
            run.keep,
            &run.keep_at,
        )?;
        stop.checkpointed(&dir);
        Ok(dir)
    };

    let t0 = Instant::now();
    let mut train_time = Duration::ZERO;
    // The engine's training positions (packed rows are wider and fewer).
    let budget = rows * (width - 1);
    // Positions the steps ran over: a trimmed batch's own, not the
    // training width's (`--trim`).
    let tokens_of = |b: &Batch| (b.rows * b.seq_len()) as f64;
    let (mut staged_tokens, mut trained_tokens) = (0.0, 0.0);
    let (mut first, mut recent) = (Vec::new(), VecDeque::new());
    let mut last_eval = Vec::new();
    let mut last_eval_ema = Vec::new();
    let mut last_dynamics = None;
    let mut last_ckpt = None;
    let mut step = at;
    // A run resumed at or past its stop step stops again before training
    // further, as it would have stopped there uninterrupted.
    let mut status = if step < run.steps && opts.stop_after.is_some_and(|s| step >= s) {
        RunStatus::Stopped
    } else {
        RunStatus::Finished
    };
    let mut skipped = skipped_before;
    // A fresh run also probes its initial weights: what the init drew (each
    // layer's mean dt, say) before any step moved it.
    if at == 0 && opts.log_dynamics && run.steps > 0 {
        log_dynamics(engine.as_mut(), &start.cfg, &data, 0, &mut log)?;
    }
    if step < run.steps {
        let t = Instant::now();
        let first_batch = draw(&mut data, run)?;
        engine.load_batch(&first_batch)?;
        staged_tokens = tokens_of(&first_batch);
        // The uninterrupted run showed the gate the saved step's loss only
        // after drawing this batch; so does the resumed one.
        if let Some(l) = resumed_loss {
            data.observe_loss(l);
        }
        train_time += t.elapsed();
    }
    while step < run.steps && status != RunStatus::Stopped {
        for edit in run.edits.iter().filter(|e| e.step == step) {
            apply_edit(engine.as_mut(), ema.as_mut(), &start.cfg, edit)?;
            log.event(&json!({"kind": "edit", "step": step, "edit": edit.to_string()}))?;
            progress.line(&format!(
                "step {step}: {} times {} in the weights{}, its Adam moments zeroed",
                edit.part,
                edit.factor,
                if ema.as_ref().and_then(Ema::weights).is_some() {
                    " and the average"
                } else {
                    ""
                }
            ));
        }
        let t = Instant::now();
        engine.step()?;
        let running = staged_tokens;
        // The next batch is drawn and staged while a GPU step runs; the
        // checkpoint position is the one before drawing it.
        let pos = data.position();
        if step + 1 < run.steps {
            let next = draw(&mut data, run)?;
            engine.load_batch(&next)?;
            staged_tokens = tokens_of(&next);
        }
        let m = engine.metrics()?;
        data.observe_loss(m.loss);
        train_time += t.elapsed();
        trained_tokens += running;
        step = m.step;
        skipped = m.skipped_total;
        if m.skipped {
            progress.line(&format!(
                "step {step}: non-finite gradient (norm {}), update skipped ({} so far)",
                m.grad_norm, m.skipped_total
            ));
        }
        // The weights read for the fold, kept for an evaluation at this
        // step, which puts them back after scoring the average.
        let mut folded = None;
        if let Some(e) = &mut ema
            && Ema::due(step)
        {
            let w = engine.weights()?;
            e.fold(&w, step);
            folded = Some(w);
        }
        if first.len() < 2 * SUMMARY_STEPS {
            first.push((step, m.loss));
        }
        recent.push_back((step, m.loss));
        if recent.len() > SUMMARY_STEPS {
            recent.pop_front();
        }
        let done = (step - at) as f64;
        let rate = trained_tokens / train_time.as_secs_f64().max(1e-9);
        let elapsed = t0.elapsed().as_secs_f64();
        let eta = Duration::from_secs_f64(elapsed / done * (run.steps - step) as f64);
        log.train(&m, rate, elapsed)?;
        progress.step(&m, rate, eta);
        let at_end = step == run.steps;
        if !stop.is_requested()
            && (at_end || (run.eval_every > 0 && step.is_multiple_of(run.eval_every)))
        {
            let mut results = Vec::new();
            for set in data.eval_sets() {
                match evaluate(engine.as_mut(), set, budget, stop)? {
                    Some(r) => results.push(r),
                    None => break,
                }
            }
            // An evaluation cut short by a stop is not reported: it would
            // score a subset of the set.
            if results.len() == data.eval_sets().len() {
                for r in &results {
                    log.eval(step, r)?;
                }
                let mut line = eval_line(step, &results);
                if gated {
                    let largest = data.largest_size();
                    let smoothed = data.position().smoothed_loss;
                    log.event(&json!({
                        "kind": "curriculum",
                        "step": step,
                        "largest_size": largest,
                        "smoothed_loss": smoothed,
                    }))?;
                    if let Some(n) = largest {
                        line.push_str(&format!(" | training sizes <= {n}"));
                    }
                }
                if let Some(avg) = ema.as_ref().and_then(Ema::weights)
                    && let Some(scores) = evaluate_weights(
                        engine.as_mut(),
                        avg,
                        folded.take(),
                        data.eval_sets(),
                        budget,
                        stop,
                    )?
                {
                    for r in &scores {
                        log.eval_ema(step, r)?;
                    }
                    line.push_str(&format!(" | ema {}", eval_parts(&scores)));
                    last_eval_ema = scores;
                }
                progress.line(&line);
                last_eval = results;
                if opts.log_dynamics {
                    last_dynamics =
                        log_dynamics(engine.as_mut(), &start.cfg, &data, step, &mut log)?;
                }
            }
        }
        let stopping = stop.is_requested() || opts.stop_after.is_some_and(|s| step >= s);
        if at_end
            || stopping
            || (run.checkpoint_every > 0 && step.is_multiple_of(run.checkpoint_every))
            || run.keep_at.contains(&step)
        {
            log.flush()?;
            let avg = ema.as_ref().and_then(Ema::weights);
            last_ckpt = Some(save(engine.as_mut(), avg, step, pos, m.loss)?);
        }
        if stopping && !at_end {
            status = RunStatus::Stopped;
            break;
        }
    }
    log.flush()?;
    progress.finish();
    let plot = Some(plot::write_plot(&run_dir)?);
    let (first_loss, last_loss) = windows(&first, &recent);
    Ok(RunSummary {
        run_dir,
        step,
        steps: run.steps,
        status,
        first_loss,
        last_loss,
        skipped,
        eval: last_eval,
        eval_ema: last_eval_ema,
        checkpoint: last_ckpt,
        plot,
        elapsed: t0.elapsed(),
        train_time,
        tokens_per_s: trained_tokens / train_time.as_secs_f64().max(1e-9),
        engine: engine_name,
        dynamics: last_dynamics,
    })
}
