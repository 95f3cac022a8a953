//! `stepgraph train`: trains a Mamba-3 model on a synthetic task or a token
//! file. With no arguments it runs the default job: parity on a tiny model,
//! on the GPU engine when one is available, else on the CPU (with a notice).
//!
//! Flags become [`TrainOptions`]; the loop lives in `stepgraph::train`. With
//! `--resume`, the flags typed explicitly (clap's value source says which)
//! are compared with the saved run; the others are not read. SIGINT, SIGTERM
//! and SIGHUP finish the current step, checkpoint and exit 0; a second
//! signal exits at once (code 130). Exit codes: 0 finished, stopped cleanly
//! or already finished, 1 a failure (one `error:` line), 2 a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::ArgMatches;
use clap::parser::ValueSource;
use stepgraph::Precision;
use stepgraph::mamba3::AActivation;
use stepgraph::train::data::{DataFormat, DataSpec, Task};
use stepgraph::train::edit::WeightEdit;
use stepgraph::train::report::{ProgressMode, clock, human};
use stepgraph::train::run::LossWindow;
use stepgraph::train::{
    DEFAULT_ADAM_EPS, DEFAULT_BETA2, DEFAULT_CHUNK_SIZE, Decay, Device, DtInit, ModelSize, Resume,
    Rotation, RunConfig, RunStatus, RunSummary, Setting, SignalAction, Stop, TrainOptions, train,
};

use crate::parse::{at_least_one, at_least_one_u64, non_negative, open_fraction, positive};

/// Arguments of `stepgraph train`.
#[derive(clap::Args)]
pub struct Args {
    /// Synthetic task.
    #[arg(long, value_enum, default_value_t = TaskArg::Parity, conflicts_with = "data")]
    task: TaskArg,
    /// Largest problem size trained on (sizes are drawn from the task's minimum up to it).
    #[arg(long, default_value_t = 16, conflicts_with = "data")]
    train_len: usize,
    /// Problem sizes evaluated (comma-separated); larger than --train-len
    /// tests length generalization. Default: L, 2L, 4L for L = --train-len
    /// (those within the task's range).
    #[arg(long, value_delimiter = ',', conflicts_with = "data")]
    eval_lens: Vec<usize>,
    /// Also evaluate one set whose rows draw their size uniformly from
    /// LO..=HI (e.g. 20-128): the sources' validation protocol, one
    /// accuracy over rows of many lengths, beside the sets of one size.
    #[arg(long, value_name = "LO-HI", value_parser = crate::parse::size_range, conflicts_with = "data")]
    eval_mix: Option<[usize; 2]>,
    /// Also evaluate one set of zero-free products of K operands (every
    /// operator `*`, no 0; modarith and modarith-prec): a probe of the
    /// product's rotation step over the steps, outside the task's rows.
    #[arg(long, value_name = "K", conflicts_with = "data")]
    eval_products: Option<usize>,
    /// Grow the largest training size linearly from the task's minimum (or
    /// --curriculum-start) to --train-len over this many steps (0: all
    /// sizes from the start).
    #[arg(long, default_value_t = 0, conflicts_with = "data")]
    curriculum: u64,
    /// Advance the curriculum only on steps whose smoothed training loss
    /// (an average over about 50 steps) is below this value, so the
    /// largest size waits until the model fits the sizes it has (0: the
    /// curriculum advances every step).
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true, conflicts_with = "data")]
    curriculum_gate: f64,
    /// The largest training size of the curriculum's first step, from
    /// which it grows to --train-len; the smallest stays the task's (0:
    /// the task's smallest, so the curriculum starts with one size).
    #[arg(long, default_value_t = 0, conflicts_with = "data")]
    curriculum_start: usize,
    /// Once the curriculum has reached --train-len, draw each training
    /// row's size from this value up to --train-len instead of from the
    /// task's smallest size: full-length rows hold more of a task's
    /// long-range structure (0: the task's smallest).
    #[arg(long, default_value_t = 0, conflicts_with = "data")]
    train_min_len: usize,
    /// Once the curriculum has reached --train-len, draw this fraction of
    /// the training rows with skewed symbol frequencies: per row, the
    /// shares of each value (bit, operand) and operator are drawn from a
    /// flat Dirichlet instead of being equal, so a row can hold almost only
    /// one value and an angle that is a little off shows at the training
    /// size. Evaluation rows stay uniform (0: every row uniform, as the
    /// tasks are published).
    #[arg(long, default_value_t = 0.0, value_parser = crate::parse::fraction, conflicts_with = "data")]
    skewed_rows: f64,
    /// Leave each value and each operator out of a skewed row with this
    /// probability (one of each stays), so some rows lack a symbol
    /// entirely: without 0, a row's modular products never collapse to 0
    /// and every factor turns the state. Needs --skewed-rows (0: none left
    /// out).
    #[arg(long, default_value_t = 0.0, value_parser = crate::parse::fraction, conflicts_with = "data")]
    skew_drop: f64,
    /// Train on this file instead of a task.
    #[arg(long)]
    data: Option<PathBuf>,
    /// How --data encodes tokens.
    #[arg(long, value_enum, default_value_t = FormatArg::Bytes, requires = "data")]
    data_format: FormatArg,
    /// Vocabulary size of a u16/u32 token file (every id must be below it).
    #[arg(long, value_parser = at_least_one, requires = "data")]
    vocab_size: Option<usize>,
    /// Fraction of --data held out (at its end) for evaluation.
    #[arg(long, default_value_t = 0.1, value_parser = open_fraction, requires = "data")]
    eval_fraction: f64,
    /// Window length T of --data batches.
    #[arg(long, default_value_t = 64, value_parser = at_least_one, requires = "data")]
    seq_len: usize,
    /// Residual width.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    d_model: usize,
    /// Number of Mamba-3 blocks.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    n_layer: usize,
    /// State size N (even).
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    d_state: usize,
    /// Head dimension P (must divide --expand x --d-model).
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    headdim: usize,
    /// d_inner = expand * d_model.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    expand: usize,
    /// Rotate every state dim (rope_fraction 1.0) instead of half.
    #[arg(long)]
    full_rope: bool,
    /// Rotation angles: data (Mamba-3's input-dependent angles), fixed
    /// (standard RoPE: fixed frequencies, the same for every input) or none
    /// (no state rotates); fixed and none keep the angle projections at zero.
    #[arg(long, value_enum, default_value_t = RotationArg::Data)]
    rotation: RotationArg,
    /// The same as --rotation none.
    #[arg(long, conflicts_with = "rotation")]
    no_rotation: bool,
    /// Normalize y per head group (a grouped RMSNorm) before the z gate: the
    /// official is_outproj_norm.
    #[arg(long)]
    outproj_norm: bool,
    /// Chunk length of the scan: the same math at any chunk, a different
    /// schedule (the GPU's bf16 scan takes 16, 32, 48 or 64; BENCHMARKS.md
    /// has the timings).
    #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE, value_parser = at_least_one)]
    chunk_size: usize,
    /// Range of every head's initial dt, drawn log-uniform: MIN,MAX (the
    /// official dt_min, dt_max).
    #[arg(long, value_name = "MIN,MAX", default_value_t = DtInit::default())]
    dt_init: DtInit,
    /// Decay map f of A = -max(f(dd_A), A_floor): the official heavy-tail, or the paper's softplus.
    #[arg(long, value_enum, default_value_t = AActArg::HeavyTail)]
    a_activation: AActArg,
    /// Where the step runs: auto is the GPU when one can be opened, else the CPU (with a notice).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// Compute precision (bf16 needs a GPU).
    #[arg(long, default_value_t = Precision::F32, value_parser = crate::parse::precision(TRAIN_PRECISIONS))]
    precision: Precision,
    /// Rows per batch.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    batch: usize,
    /// Training steps (with --resume: a larger value extends the run).
    #[arg(long, default_value_t = 4000, value_parser = at_least_one_u64)]
    steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3, value_parser = positive, allow_negative_numbers = true)]
    lr: f64,
    /// Learning rate at the end of the cosine (at most --lr).
    #[arg(long, default_value_t = 1e-4, value_parser = non_negative, allow_negative_numbers = true)]
    min_lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.1, value_parser = non_negative, allow_negative_numbers = true)]
    weight_decay: f64,
    /// AdamW's second-moment decay, in (0, 1). Lower values let the step
    /// size follow a sudden gradient within a few steps instead of
    /// hundreds.
    #[arg(long, default_value_t = DEFAULT_BETA2, value_parser = open_fraction, allow_negative_numbers = true)]
    beta2: f64,
    /// AdamW's denominator epsilon, > 0. Where a weight's gradients are
    /// far below it, its step shrinks with them instead of staying near the
    /// learning rate (a solved task's weights stop wandering).
    #[arg(long, default_value_t = DEFAULT_ADAM_EPS, value_parser = positive, allow_negative_numbers = true)]
    adam_eps: f64,
    /// Which tensors decay: matrices (embedding, projections), outputs (the
    /// embedding / LM head and out_proj: every matrix but in_proj), all, or none.
    #[arg(long, value_enum, default_value_t = DecayArg::Matrices)]
    decay: DecayArg,
    /// Global gradient-norm clip (0: off).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative, allow_negative_numbers = true)]
    clip: f64,
    /// Seed of the initial weights, and of the data unless --data-seed
    /// gives another.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seed of the data alone (training rows and eval sets), so that one
    /// run's initial weights can train on another run's rows.
    #[arg(long)]
    data_seed: Option<u64>,
    /// Start from the weights of this model directory (config.json and
    /// model.safetensors in the official layout: a checkpoint, its ema/, or
    /// `stepgraph init`'s output) instead of drawing them from --seed; its
    /// config must be the one the model flags describe.
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    init_from: Option<PathBuf>,
    /// Evaluate every N steps (0: only at the end).
    #[arg(long, default_value_t = 500)]
    eval_every: u64,
    /// Plain progress line every N steps (when stderr is not a terminal).
    #[arg(long, default_value_t = 250, value_parser = at_least_one_u64)]
    log_every: u64,
    /// Checkpoint every N steps (0: only at the end and when stopped).
    #[arg(long, default_value_t = 1000)]
    checkpoint_every: u64,
    /// Checkpoints kept (the newest ones of this run).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    keep: usize,
    /// Also save the checkpoints of these steps (comma-separated) and keep
    /// them besides the newest --keep, e.g. the end of the curriculum, to
    /// read the run there once it has finished.
    #[arg(long, value_delimiter = ',')]
    keep_at: Vec<u64>,
    /// Keep an exponential moving average of the weights with this
    /// per-step decay, in [0, 1) (0: none; 0.999 averages about the last
    /// thousand steps). Every evaluation also scores the average, and
    /// checkpoints save it in ema/ as a model `stepgraph eval` loads.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true)]
    ema: f64,
    /// Edit the weights once the run has trained STEP steps: PART (a
    /// substring of tensor names, e.g. `layers.1.`, optionally with rows
    /// `NAME:LO-HI` of each matching 2-D tensor) times FACTOR, in the
    /// weights and the --ema average, its Adam moments zeroed; repeat the
    /// flag or separate edits with commas. E.g.
    /// 'layers.1.mixer.in_proj.weight:656-672*0@4000' resets the second
    /// block's A rows (d_model 128, d_state 64, 16 heads) after step 4000.
    #[arg(long, value_name = "PART*FACTOR@STEP", value_delimiter = ',')]
    edit: Vec<WeightEdit>,
    /// Trim each training batch to its longest row (in steps of 16
    /// tokens): a task's rows are one instance each, padded to the training
    /// size, so a batch of short rows trains on fewer tokens. The same
    /// mathematics (the model is causal); on the GPU, one captured graph
    /// per width.
    #[arg(long)]
    trim: bool,
    /// Lay K instances of a task to a training row (1: one a row): the
    /// batch's instances in batch / K rows, the model's state reset at
    /// each one's first token, each row cut to the fullest (in steps of 16
    /// tokens). The same instances and loss in far fewer positions; needs
    /// the recurrent scan on the CPU and the warp scan on the GPU
    /// (headdim 8-32, d_state 32-64).
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = at_least_one)]
    pack: usize,
    /// Run directory, created for this run (default: runs/<UTC timestamp>);
    /// an existing one must be empty.
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Continue the run saved in this run directory (its newest intact
    /// checkpoint) or checkpoint, with its own settings; flags given too must
    /// agree with it, except --steps (to extend), --device, --data (a moved
    /// file) and the reporting and checkpoint cadence.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop after this step as a signal would (checkpoint, exit 0).
    #[arg(long)]
    stop_after: Option<u64>,
    /// Progress display: auto (bar on a terminal), plain lines, or quiet.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,
    /// At every evaluation of a task, also log the model's decay and
    /// rotation on a few rows of the longest eval set (metrics.jsonl,
    /// "kind": "dynamics").
    #[arg(long, conflicts_with = "data")]
    log_dynamics: bool,
    /// The GPU to train on (its ordinal, 0 = the first the driver lists);
    /// a resumed run may continue on another.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TaskArg {
    Parity,
    Modarith,
    ModarithPrec,
    ModarithBrackets,
    ModarithBracketsNomult,
    Copy,
    Mqar,
}

/// `--rotation` (and `repro`'s `--rotations`, `init`'s `--rotation`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RotationArg {
    Data,
    Fixed,
    None,
}

impl From<RotationArg> for Rotation {
    fn from(r: RotationArg) -> Self {
        match r {
            RotationArg::Data => Rotation::Data,
            RotationArg::Fixed => Rotation::Fixed,
            RotationArg::None => Rotation::None,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Bytes,
    U16,
    U32,
}

/// `--device`, shared with `repro`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DeviceArg {
    Auto,
    Cpu,
    Cuda,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Auto => Device::Auto,
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
        }
    }
}

/// `--a-activation`, shared with `init`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum AActArg {
    HeavyTail,
    Softplus,
}

impl From<AActArg> for AActivation {
    fn from(a: AActArg) -> Self {
        match a {
            AActArg::HeavyTail => AActivation::HeavyTail,
            AActArg::Softplus => AActivation::Softplus,
        }
    }
}

/// What `train --precision` accepts (the engines' precisions).
const TRAIN_PRECISIONS: &[(Precision, &str)] = &[(Precision::F32, ""), (Precision::Bf16, "")];

/// `--decay`, shared with `repro`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DecayArg {
    Matrices,
    Outputs,
    All,
    None,
}

impl From<DecayArg> for Decay {
    fn from(d: DecayArg) -> Self {
        match d {
            DecayArg::Matrices => Decay::Matrices,
            DecayArg::Outputs => Decay::Outputs,
            DecayArg::All => Decay::All,
            DecayArg::None => Decay::None,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProgressArg {
    Auto,
    Plain,
    Quiet,
}

fn task(t: TaskArg) -> Task {
    match t {
        TaskArg::Parity => Task::Parity,
        TaskArg::Modarith => Task::Modarith,
        TaskArg::ModarithPrec => Task::ModarithPrec,
        TaskArg::ModarithBrackets => Task::ModarithBrackets,
        TaskArg::ModarithBracketsNomult => Task::ModarithBracketsNomult,
        TaskArg::Copy => Task::Copy,
        TaskArg::Mqar => Task::Mqar,
    }
}

/// `L, 2L, 4L`, keeping those the task can generate (at least `L`).
fn default_eval_lens(task: Task, train_len: usize) -> Vec<usize> {
    let mut lens = vec![train_len];
    for k in [2, 4] {
        let n = train_len.saturating_mul(k);
        if n <= task.max_len() {
            lens.push(n);
        }
    }
    lens
}

fn run_config(a: &Args) -> RunConfig {
    let data = match &a.data {
        Some(path) => DataSpec::File {
            path: path.clone(),
            format: match a.data_format {
                FormatArg::Bytes => DataFormat::Bytes,
                FormatArg::U16 => DataFormat::U16,
                FormatArg::U32 => DataFormat::U32,
            },
            vocab_size: a.vocab_size,
            eval_fraction: a.eval_fraction,
            seq_len: a.seq_len,
        },
        None => DataSpec::Task {
            task: task(a.task),
            train_len: a.train_len,
            eval_lens: if a.eval_lens.is_empty() {
                default_eval_lens(task(a.task), a.train_len)
            } else {
                a.eval_lens.clone()
            },
            curriculum: a.curriculum,
            curriculum_gate: a.curriculum_gate,
            curriculum_start: a.curriculum_start,
            train_min_len: a.train_min_len,
            skewed_rows: a.skewed_rows,
            skew_drop: a.skew_drop,
            eval_mix: a.eval_mix,
            eval_products: a.eval_products,
        },
    };
    RunConfig {
        data,
        model: ModelSize {
            d_model: a.d_model,
            n_layer: a.n_layer,
            d_state: a.d_state,
            headdim: a.headdim,
            expand: a.expand,
            full_rope: a.full_rope,
            rotation: if a.no_rotation {
                Rotation::None
            } else {
                a.rotation.into()
            },
            a_activation: a.a_activation.into(),
            outproj_norm: a.outproj_norm,
            chunk_size: a.chunk_size,
            dt_init: a.dt_init,
        },
        device: a.device.into(),
        precision: a.precision,
        batch: a.batch,
        steps: a.steps,
        lr: a.lr,
        min_lr: a.min_lr,
        warmup: a.warmup,
        weight_decay: a.weight_decay,
        beta2: a.beta2,
        adam_eps: a.adam_eps,
        decay: a.decay.into(),
        clip: (a.clip > 0.0).then_some(a.clip),
        seed: a.seed,
        data_seed: a.data_seed,
        init_from: a.init_from.clone(),
        eval_every: a.eval_every,
        log_every: a.log_every,
        checkpoint_every: a.checkpoint_every,
        keep: a.keep,
        keep_at: a.keep_at.clone(),
        ema: (a.ema > 0.0).then_some(a.ema),
        edits: a.edit.clone(),
        trim: a.trim,
        pack: a.pack,
    }
}

/// The settings typed on the command line (not defaulted); `--no-rotation`
/// counts as `--rotation`.
fn given(m: &ArgMatches) -> Vec<Setting> {
    let typed = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    Setting::ALL
        .into_iter()
        .filter(|s| {
            let id = s.flag().trim_start_matches('-').replace('-', "_");
            typed(&id) || (*s == Setting::Rotation && typed("no_rotation"))
        })
        .collect()
}

fn options(a: &Args, m: &ArgMatches) -> TrainOptions {
    TrainOptions {
        run: run_config(a),
        run_dir: a.run_dir.clone(),
        resume: a.resume.clone().map(|from| Resume {
            from,
            given: given(m),
        }),
        stop_after: a.stop_after,
        progress: match a.progress {
            ProgressArg::Auto => ProgressMode::Auto,
            ProgressArg::Plain => ProgressMode::Plain,
            ProgressArg::Quiet => ProgressMode::Quiet,
        },
        log_dynamics: a.log_dynamics,
        gpu: a.gpu,
    }
}

/// The first signal stops the run after its step; a second one (not a
/// duplicate delivery of the first) exits at once, saying what was saved.
fn install_handler(stop: &Arc<Stop>) {
    let stop = Arc::clone(stop);
    let handler = ctrlc::set_handler(move || match stop.on_signal(Instant::now()) {
        SignalAction::Stop => eprintln!(
            "\nstopping: finishing the current step, then saving a checkpoint \
             (signal again to exit at once, without saving)"
        ),
        SignalAction::Duplicate => {}
        SignalAction::ExitNow => {
            let last = stop.last_checkpoint().map_or_else(
                || "this run has no checkpoint yet".to_owned(),
                |p| format!("the last checkpoint is {}", p.display()),
            );
            eprintln!(
                "\nsecond signal: exiting now; nothing was saved since the last checkpoint ({last})"
            );
            std::process::exit(130);
        }
    });
    if let Err(e) = handler {
        eprintln!("warning: a signal will stop the run without a checkpoint ({e})");
    }
}

/// Runs the job; prints the summary (exit 0) or one error line (exit 1), or
/// clap's usage error (exit 2).
pub fn run(args: &Args, matches: &ArgMatches) -> ExitCode {
    let stop = Arc::new(Stop::new());
    install_handler(&stop);
    match train(&options(args, matches), &stop) {
        Ok(summary) => {
            if args.progress != ProgressArg::Quiet || summary.status != RunStatus::Finished {
                print_summary(&summary);
            }
            ExitCode::SUCCESS
        }
        Err(e) if e.is_usage() => crate::usage_error("train", e),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn loss_part(w: Option<LossWindow>) -> String {
    match w {
        Some(w) if w.first == w.last => format!("{:.4} (step {})", w.mean, w.first),
        Some(w) => format!("{:.4} (mean of steps {}-{})", w.mean, w.first, w.last),
        None => "n/a".into(),
    }
}

fn print_summary(s: &RunSummary) {
    if s.status == RunStatus::AlreadyFinished {
        println!(
            "run {} is already finished: step {}/{}, nothing to train (extend it with \
             `stepgraph train --resume {} --steps N`, N > {})",
            s.run_dir.display(),
            s.step,
            s.steps,
            s.run_dir.display(),
            s.steps
        );
        if let Some(c) = &s.checkpoint {
            println!("checkpoint: {}", c.display());
        }
        return;
    }
    let status = if s.status == RunStatus::Stopped {
        "stopped"
    } else {
        "done"
    };
    println!(
        "{status}: step {}/{} in {} on {} ({} tok/s training, evaluation and checkpoints \
         excluded); train loss {} -> {}{}",
        s.step,
        s.steps,
        clock(s.elapsed),
        s.engine,
        human(s.tokens_per_s),
        loss_part(s.first_loss),
        loss_part(s.last_loss),
        if s.skipped > 0 {
            format!("; {} non-finite steps skipped", s.skipped)
        } else {
            String::new()
        }
    );
    if !s.eval.is_empty() {
        let parts: Vec<String> = s
            .eval
            .iter()
            .map(|r| format!("{} {:.1}%", r.label, 100.0 * r.accuracy))
            .collect();
        println!("accuracy: {}", parts.join(", "));
    }
    if let Some(c) = &s.checkpoint {
        println!("checkpoint: {}", c.display());
    }
    if let Some(p) = &s.plot {
        println!("plot: {}", p.display());
    }
    if s.status == RunStatus::Stopped {
        println!("resume: stepgraph train --resume {}", s.run_dir.display());
    }
}
