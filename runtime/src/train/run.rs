//! The training loop: options, engine selection, resume, the step loop with
//! evaluation, metrics and checkpoints, and the final summary.
//!
//! Per step the loop runs `engine.step()`, draws the next batch and stages it
//! (`load_batch`) *before* reading the step's metrics, so a GPU engine
//! uploads the next batch while the current step runs. The data position
//! saved in a checkpoint is the one before that next batch was drawn, so a
//! resumed run draws it again and continues bit-identically.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::TrainError;
use super::checkpoint::{self, CHECKPOINTS_DIR, TrainState};
use super::cpu::CpuEngine;
use super::data::{DataSpec, Dataset, EvalSet};
use super::engine::{Frozen, OptimSettings, TrainEngine};
use super::gpu::{GpuBf16Engine, GpuF32Engine};
use super::report::{self, EvalResult, MetricsLog, Progress, ProgressMode};
use super::schedule::LrSchedule;
use crate::device::Gpu;
use crate::mamba3::cpu::Weights;
use crate::mamba3::{AActivation, Mamba3Config, RopeFraction};
use crate::optim::{AdamWConfig, DecayPolicy};

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The GPU engine when `Gpu::new(0)` succeeds, else the CPU (with a notice).
    Auto,
    /// The CPU engine.
    Cpu,
    /// The GPU engine (an error without a usable GPU).
    Cuda,
}

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 everywhere.
    F32,
    /// bf16 compute, f32 master weights (GPU only).
    Bf16,
}

impl Precision {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }
}

/// Model size flags; the vocabulary comes from the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    /// Residual width.
    pub d_model: usize,
    /// Blocks.
    pub n_layer: usize,
    /// State size N.
    pub d_state: usize,
    /// Head dimension P.
    pub headdim: usize,
    /// `d_inner / d_model`.
    pub expand: usize,
    /// Rotate all state dims (`rope_fraction` 1.0) instead of half.
    pub full_rope: bool,
    /// `false`: the rotation ablation (`--no-rotation`): the angle rows of
    /// every `in_proj` start at zero and never train, so no state rotates
    /// (the paper's "w/o RoPE" row of Table 5b).
    pub rotation: bool,
    /// The decay map of `A` (`--a-activation`).
    pub a_activation: AActivation,
}

/// Everything `stepgraph train` was asked to do.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The data.
    pub data: DataSpec,
    /// Model size.
    pub model: ModelSize,
    /// Device requested.
    pub device: Device,
    /// Precision requested.
    pub precision: Precision,
    /// Rows per batch.
    pub batch: usize,
    /// Total steps (the schedule spans them).
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate of the cosine.
    pub min_lr: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Which tensors decay.
    pub decay: DecayPolicy,
    /// Global-norm clip (`None`: off).
    pub clip: Option<f64>,
    /// Seed of weights and data.
    pub seed: u64,
    /// Evaluate every this many steps (and at the end); 0: only at the end.
    pub eval_every: u64,
    /// Plain progress line every this many steps.
    pub log_every: u64,
    /// Checkpoint every this many steps (and at the end); 0: only at the end.
    pub checkpoint_every: u64,
    /// Checkpoints kept.
    pub keep: usize,
    /// Run directory (`None`: `runs/<UTC timestamp>`).
    pub run_dir: Option<PathBuf>,
    /// Checkpoint or run directory to continue from.
    pub resume: Option<PathBuf>,
    /// Stop (checkpoint, exit 0) after this step, as an interruption would.
    pub stop_after: Option<u64>,
    /// Progress display.
    pub progress: ProgressMode,
}

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Step reached.
    pub step: u64,
    /// Steps requested.
    pub steps: u64,
    /// Stopped early (Ctrl-C or `stop_after`).
    pub interrupted: bool,
    /// Mean training loss of the first and last steps of this process
    /// (up to 10 steps each).
    pub first_loss: f64,
    /// See `first_loss`.
    pub last_loss: f64,
    /// Steps skipped for non-finite gradients (whole run).
    pub skipped: u64,
    /// Last evaluation.
    pub eval: Vec<EvalResult>,
    /// Last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// The plot.
    pub plot: Option<PathBuf>,
    /// Wall time of this process's steps.
    pub elapsed: Duration,
    /// Predictions per second over this process's steps.
    pub tokens_per_s: f64,
    /// The engine that ran.
    pub engine: String,
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
/// is the GPU when `Gpu::new(0)` succeeds, else the CPU with a one-line
/// notice; `cuda` without a usable GPU is an error naming why.
pub fn resolve_device(device: Device, precision: Precision) -> Result<Resolved, TrainError> {
    let resolved = match device {
        Device::Cpu => Resolved::Cpu(None),
        Device::Cuda => match Gpu::new(0) {
            Ok(gpu) => Resolved::Cuda(Box::new(gpu)),
            Err(source) => return Err(TrainError::NoGpu { source }),
        },
        Device::Auto => match Gpu::new(0) {
            Ok(gpu) => Resolved::Cuda(Box::new(gpu)),
            Err(e) => Resolved::Cpu(Some(format!(
                "notice: no usable GPU ({}); training on the CPU (f32 reference)",
                one_line(&e.to_string())
            ))),
        },
    };
    match (&resolved, precision) {
        (Resolved::Cpu(_), Precision::Bf16) => Err(TrainError::Bf16NeedsGpu),
        _ => Ok(resolved),
    }
}

/// The first line of a message, for one-line notices and errors.
/// The first line of an error message, for one-line reports.
pub(crate) fn one_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> TrainError {
    TrainError::InvalidOption {
        flag,
        reason: reason.into(),
    }
}

fn validate(o: &TrainOptions) -> Result<(), TrainError> {
    if o.batch == 0 {
        return Err(invalid("--batch", "must be at least 1"));
    }
    if o.steps == 0 {
        return Err(invalid("--steps", "must be at least 1"));
    }
    for (flag, v) in [
        ("--lr", o.lr),
        ("--min-lr", o.min_lr),
        ("--weight-decay", o.weight_decay),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(invalid(flag, format!("must be finite and >= 0, got {v}")));
        }
    }
    if let Some(c) = o.clip
        && !(c.is_finite() && c > 0.0)
    {
        return Err(invalid(
            "--clip",
            format!("must be finite and > 0, got {c}"),
        ));
    }
    match &o.data {
        DataSpec::Task {
            task,
            train_len,
            eval_lens,
            ..
        } => {
            for (flag, n) in std::iter::once(("--train-len", *train_len))
                .chain(eval_lens.iter().map(|&n| ("--eval-lens", n)))
            {
                if n < task.min_len() || n > task.max_len() {
                    return Err(invalid(
                        flag,
                        format!(
                            "{n} is outside {}..={} for task {}",
                            task.min_len(),
                            task.max_len(),
                            task.name()
                        ),
                    ));
                }
            }
        }
        DataSpec::File {
            eval_fraction,
            seq_len,
            ..
        } => {
            if !(0.0..1.0).contains(eval_fraction) || *eval_fraction <= 0.0 {
                return Err(invalid("--eval-fraction", "must lie in (0, 1)"));
            }
            if *seq_len == 0 {
                return Err(invalid("--seq-len", "must be at least 1"));
            }
        }
    }
    Ok(())
}

fn model_config(size: ModelSize, vocab: usize) -> Result<Mamba3Config, TrainError> {
    let cfg = Mamba3Config {
        d_model: size.d_model,
        n_layer: size.n_layer,
        vocab_size: vocab,
        d_state: size.d_state,
        headdim: size.headdim,
        expand: size.expand,
        rope_fraction: if size.full_rope {
            RopeFraction::Full
        } else {
            RopeFraction::Half
        },
        a_activation: size.a_activation,
        ..Mamba3Config::default()
    };
    cfg.validate()?;
    Ok(cfg)
}

/// The `in_proj` rows producing the rotation angles, per layer: frozen (and
/// zeroed) for the `--no-rotation` ablation.
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

/// `runs/20261202-101500` (UTC), made unique with a suffix if taken.
pub fn default_run_dir() -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let stamp = format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    let base = Path::new("runs").join(&stamp);
    let mut dir = base.clone();
    let mut k = 2;
    while dir.exists() {
        dir = Path::new("runs").join(format!("{stamp}-{k}"));
        k += 1;
    }
    dir
}

fn mismatch(dir: &Path, field: &str, found: String, expected: String) -> TrainError {
    TrainError::ConfigMismatch {
        dir: dir.to_path_buf(),
        field: field.into(),
        found,
        expected,
    }
}

/// Refuses a checkpoint whose model, data or run identity differs from this
/// run's (a resume must continue the same computation to be bit-identical).
fn check_resume(
    dir: &Path,
    ckpt_cfg: &Mamba3Config,
    tstate: &TrainState,
    cfg: &Mamba3Config,
    opts: &TrainOptions,
) -> Result<(), TrainError> {
    if let Some((field, found, expected)) = checkpoint::config_difference(ckpt_cfg, cfg) {
        return Err(mismatch(dir, &field, found, expected));
    }
    let checks = [
        ("data", tstate.data.summary(), opts.data.summary()),
        ("batch", tstate.batch.to_string(), opts.batch.to_string()),
        ("seed", tstate.seed.to_string(), opts.seed.to_string()),
        (
            "precision",
            tstate.precision.clone(),
            opts.precision.name().into(),
        ),
        (
            "rotation",
            tstate.rotation.to_string(),
            opts.model.rotation.to_string(),
        ),
    ];
    for (field, found, expected) in checks {
        if found != expected {
            return Err(mismatch(dir, field, found, expected));
        }
    }
    // Equal summaries can still hide a difference (e.g. a float rounding).
    if tstate.data != opts.data {
        return Err(mismatch(
            dir,
            "data",
            format!("{:?}", tstate.data),
            format!("{:?}", opts.data),
        ));
    }
    Ok(())
}

/// Scores one eval set.
fn evaluate(engine: &mut dyn TrainEngine, set: &EvalSet) -> Result<EvalResult, TrainError> {
    let (mut loss, mut correct, mut count) = (0.0, 0usize, 0usize);
    for batch in &set.batches {
        let out = engine.eval(batch)?;
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
    }
    let n = count.max(1) as f64;
    Ok(EvalResult {
        label: set.label.clone(),
        length: set.length,
        loss: loss / n,
        accuracy: correct as f64 / n,
        count,
    })
}

fn eval_line(step: u64, results: &[EvalResult]) -> String {
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
    format!("eval @ {step}  {}", parts.join(" | "))
}

/// Runs (or resumes) a training job. `stop` is polled after every step: when
/// set, the run checkpoints and returns with `interrupted`.
pub fn train(opts: &TrainOptions, stop: &AtomicBool) -> Result<RunSummary, TrainError> {
    validate(opts)?;
    let resolved = resolve_device(opts.device, opts.precision)?;
    let resumed = match &opts.resume {
        Some(path) => {
            let dir = checkpoint::resolve(path)?;
            let (cfg, state, tstate) = checkpoint::load(&dir)?;
            Some((dir, cfg, state, tstate))
        }
        None => None,
    };
    let mut data = Dataset::new(&opts.data, opts.seed, opts.batch)?;
    let cfg = model_config(opts.model, data.vocab_size())?;
    let settings = OptimSettings {
        adam: AdamWConfig {
            lr: opts.lr,
            weight_decay: opts.weight_decay,
            ..AdamWConfig::default()
        },
        decay: opts.decay.clone(),
        clip: opts.clip,
        frozen: if opts.model.rotation {
            Vec::new()
        } else {
            rotation_rows(&cfg)
        },
    };
    let mut weights = Weights::<f32>::init(&cfg, opts.seed)?;
    let mut tensors = weights.tensors_mut();
    for f in &settings.frozen {
        if let Some(w) = tensors
            .get_mut(f.tensor)
            .and_then(|t| t.get_mut(f.start..f.end))
        {
            w.fill(0.0);
        }
    }
    let (mut engine, notice): (Box<dyn TrainEngine>, Option<String>) = match resolved {
        Resolved::Cpu(notice) => (
            Box::new(CpuEngine::new(cfg.clone(), weights, settings)?),
            notice,
        ),
        Resolved::Cuda(gpu) => {
            let (gpu, c, width) = (*gpu, cfg.clone(), data.train_width());
            let engine: Box<dyn TrainEngine> = match opts.precision {
                Precision::F32 => Box::new(GpuF32Engine::new(
                    gpu, c, &weights, &settings, opts.batch, width,
                )?),
                Precision::Bf16 => Box::new(GpuBf16Engine::new(
                    gpu, c, &weights, &settings, opts.batch, width,
                )?),
            };
            (engine, None)
        }
    };
    let run_dir = match &resumed {
        Some((dir, ckpt_cfg, state, tstate)) => {
            check_resume(dir, ckpt_cfg, tstate, &cfg, opts)?;
            engine.import_state(state.clone())?;
            data.restore(tstate.data_position(dir)?);
            checkpoint::run_dir_of(dir).unwrap_or_else(|| dir.with_extension("resumed"))
        }
        None => opts.run_dir.clone().unwrap_or_else(default_run_dir),
    };
    std::fs::create_dir_all(&run_dir).map_err(TrainError::io(&run_dir))?;
    let ckpt_root = run_dir.join(CHECKPOINTS_DIR);
    let start = resumed.as_ref().map_or(0, |r| r.3.step);
    let schedule = LrSchedule {
        peak: opts.lr,
        min_lr: opts.min_lr,
        warmup: opts.warmup,
        total: opts.steps,
    };
    engine.set_schedule(schedule);
    let info = engine.info();
    let progress = Progress::new(opts.progress, start, opts.steps, opts.log_every);
    if let Some(n) = &notice {
        progress.line(n);
    }
    let params: usize = crate::mamba3::cpu::param_specs(&cfg)
        .iter()
        .map(|s| s.numel())
        .sum();
    progress.line(&format!(
        "stepgraph train: {} {} on {}; model d_model {} n_layer {} d_state {} headdim {}{}{} ({params} params); {}",
        info.name,
        info.precision,
        info.device,
        cfg.d_model,
        cfg.n_layer,
        cfg.d_state,
        cfg.headdim,
        if cfg.rope_fraction == RopeFraction::Full { " full-rope" } else { "" },
        if cfg.a_activation == AActivation::Softplus { " softplus-A" } else { "" },
        data.describe()
    ));
    progress.line(&format!(
        "batch {} x {} tokens, {} steps{}, lr {:.1e} (warmup {}, cosine to {:.1e}); run dir {}",
        opts.batch,
        data.train_width() - 1,
        opts.steps,
        if start > 0 {
            format!(" (resuming at {start})")
        } else {
            String::new()
        },
        opts.lr,
        opts.warmup,
        opts.min_lr,
        run_dir.display()
    ));
    let mut log = MetricsLog::open(&run_dir)?;
    let save = |engine: &mut dyn TrainEngine,
                step: u64,
                pos: super::data::DataPosition|
     -> Result<PathBuf, TrainError> {
        let state = engine.export_state()?;
        let tstate = TrainState {
            format: 1,
            step,
            adam_steps: state.adam_steps,
            skipped: state.skipped,
            seed: opts.seed,
            batch: opts.batch,
            precision: opts.precision.name().into(),
            data: opts.data.clone(),
            rotation: opts.model.rotation,
            data_batches: pos.batches,
            data_word_pos: pos.word_pos.to_string(),
        };
        checkpoint::save(&ckpt_root, &cfg, &state, &tstate, opts.keep)
    };

    let t0 = Instant::now();
    let tokens_per_step = (opts.batch * (data.train_width() - 1)) as f64;
    let (mut first, mut recent): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    let mut last_eval = Vec::new();
    let mut last_ckpt = None;
    let mut step = start;
    let mut interrupted = false;
    let mut skipped = resumed.as_ref().map_or(0, |r| r.3.skipped);
    if step < opts.steps {
        let first_batch = data.next_batch(opts.batch)?;
        engine.load_batch(&first_batch)?;
    }
    while step < opts.steps {
        engine.step()?;
        // The next batch is drawn and staged while a GPU step runs; the
        // checkpoint position is the one before drawing it.
        let pos = data.position();
        if step + 1 < opts.steps {
            let next = data.next_batch(opts.batch)?;
            engine.load_batch(&next)?;
        }
        let m = engine.metrics()?;
        step = m.step;
        skipped = m.skipped_total;
        if m.skipped {
            progress.line(&format!(
                "step {step}: non-finite gradient (norm {}), update skipped ({} so far)",
                m.grad_norm, m.skipped_total
            ));
        }
        if first.len() < 10 {
            first.push(m.loss);
        }
        recent.push(m.loss);
        if recent.len() > 10 {
            recent.remove(0);
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let done = (step - start) as f64;
        let rate = tokens_per_step * done / elapsed.max(1e-9);
        let eta = Duration::from_secs_f64(elapsed / done * (opts.steps - step) as f64);
        log.train(&m, rate, elapsed)?;
        progress.step(&m, rate, eta);
        let stopping = stop.load(Ordering::SeqCst) || opts.stop_after.is_some_and(|s| step >= s);
        let at_end = step == opts.steps || stopping;
        if at_end || (opts.eval_every > 0 && step.is_multiple_of(opts.eval_every)) {
            last_eval = data
                .eval_sets()
                .iter()
                .map(|set| evaluate(engine.as_mut(), set))
                .collect::<Result<_, _>>()?;
            for r in &last_eval {
                log.eval(step, r)?;
            }
            progress.line(&eval_line(step, &last_eval));
        }
        if at_end || (opts.checkpoint_every > 0 && step.is_multiple_of(opts.checkpoint_every)) {
            log.flush()?;
            last_ckpt = Some(save(engine.as_mut(), step, pos)?);
        }
        if stopping && step < opts.steps {
            interrupted = true;
            break;
        }
    }
    log.flush()?;
    progress.finish();
    let plot = Some(report::write_plot(&run_dir)?);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let elapsed = t0.elapsed();
    Ok(RunSummary {
        run_dir,
        step,
        steps: opts.steps,
        interrupted,
        first_loss: mean(&first),
        last_loss: mean(&recent),
        skipped,
        eval: last_eval,
        checkpoint: last_ckpt,
        plot,
        elapsed,
        tokens_per_s: tokens_per_step * (step - start) as f64 / elapsed.as_secs_f64().max(1e-9),
        engine: format!("{} {}", info.name, info.precision),
    })
}
