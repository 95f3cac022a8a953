//! `stepgraph repro state-tracking`: the Mamba-3 paper's state-tracking table
//! in one command (the library's `stepgraph::repro`). Flags become
//! [`ReproOptions`]; SIGINT, SIGTERM and SIGHUP stop every run after its
//! current step and still write the table of the runs that finished; a
//! second signal exits at once (code 130). Exit codes: 0 done (or stopped
//! cleanly), 1 a failure, 2 a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stepgraph::Precision;
use stepgraph::repro::recipe::{Overrides, ROTATIONS, TASKS};
use stepgraph::repro::{
    ReproError, ReproOptions, ReproReport, merge::merge, resume::resume, state_tracking, validate,
};
use stepgraph::train::data::Task;
use stepgraph::train::{Device, DtInit, SignalAction, Stop};

use crate::train::{DecayArg, DeviceArg, RotationArg};

use crate::parse::{at_least_one, at_least_one_u64, non_negative, positive};

/// Arguments of `stepgraph repro`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// The state-tracking table (Table 5b): parity and modular arithmetic
    /// without and with brackets, for Mamba-3, Mamba-3 with standard RoPE
    /// and Mamba-3 without rotation, trained on instances of about 160
    /// tokens and scored at about 256, over several seeds.
    StateTracking(StArgs),
}

/// Arguments of `stepgraph repro state-tracking`.
#[derive(clap::Args)]
struct StArgs {
    /// Seeds per cell (seeds --first-seed .. --first-seed + N).
    #[arg(long, default_value_t = 5, value_parser = at_least_one_u64)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Compute precision of every run.
    #[arg(long, default_value_t = Precision::F32, value_parser = crate::parse::precision(PRECISIONS))]
    precision: Precision,
    /// Where the runs train (the table is a GPU job; cpu is for smoke tests with --quick).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cuda)]
    device: DeviceArg,
    /// Output directory (default: runs/repro-state-tracking-<UTC timestamp>); an existing one
    /// must be empty.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Runs trained at once (default: 16 on the GPU, 1 on the CPU).
    #[arg(long, value_parser = at_least_one)]
    jobs: Option<usize>,
    /// GPUs the runs share, by ordinal (comma-separated; default: every GPU
    /// the driver lists); the --jobs runs go round them.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<usize>,
    /// Smoke test: a few steps of tiny models on short instances.
    #[arg(long)]
    quick: bool,
    /// Columns to run (comma-separated; default: the paper's three, parity,
    /// modarith-prec and modarith-brackets; modarith-brackets-nomult is the
    /// bracketed column without `*`).
    #[arg(long, value_enum, value_delimiter = ',')]
    tasks: Vec<TaskArg>,
    /// Rows to run (comma-separated; default: all three).
    #[arg(long, value_enum, value_delimiter = ',')]
    rotations: Vec<RotationArg>,
    /// Stop every run after this many seconds (as a signal would) and report
    /// the runs that finished.
    #[arg(long, value_parser = at_least_one_u64)]
    time_limit: Option<u64>,
    /// Training steps of every run instead of its column's recipe (the curriculum keeps its
    /// share unless --curriculum is given).
    #[arg(long, value_parser = at_least_one_u64)]
    steps: Option<u64>,
    /// Steps over which the training size grows, instead of the recipe's.
    #[arg(long)]
    curriculum: Option<u64>,
    /// Rows per batch instead of the recipe's.
    #[arg(long, value_parser = at_least_one)]
    batch: Option<usize>,
    /// Peak learning rate instead of the recipe's.
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Final learning rate of the cosine instead of the recipe's 1e-5, at
    /// most the peak (`stepgraph train --min-lr`).
    #[arg(long, value_parser = non_negative, allow_negative_numbers = true)]
    min_lr: Option<f64>,
    /// Linear warmup steps instead of the recipe's (`stepgraph train
    /// --warmup`).
    #[arg(long)]
    warmup: Option<u64>,
    /// Residual width instead of the recipe's (heads: 2 d_model / headdim).
    #[arg(long, value_parser = at_least_one)]
    d_model: Option<usize>,
    /// Head dimension instead of the recipe's (must divide 2 d_model).
    #[arg(long, value_parser = at_least_one)]
    headdim: Option<usize>,
    /// The curriculum advances only while the smoothed training loss is
    /// below this value (`stepgraph train --curriculum-gate`; 0: every step).
    #[arg(long, value_parser = non_negative, allow_negative_numbers = true)]
    curriculum_gate: Option<f64>,
    /// Range of every head's initial dt instead of the official 0.001,0.1
    /// (`stepgraph train --dt-init`).
    #[arg(long, value_name = "MIN,MAX")]
    dt_init: Option<DtInit>,
    /// Report the scores of a moving average of each run's weights with
    /// this per-step decay, in (0, 1) (`stepgraph train --ema`); the
    /// trained weights' scores stay in the per-run table.
    #[arg(long, value_parser = crate::parse::open_fraction, allow_negative_numbers = true)]
    ema: Option<f64>,
    /// Smallest training size of every run once its curriculum has reached
    /// the training size, instead of the task's smallest (`stepgraph train
    /// --train-min-len`).
    #[arg(long)]
    train_min_len: Option<usize>,
    /// The largest training size at the curriculum's start, from which it
    /// grows to the training size, instead of the task's smallest
    /// (`stepgraph train --curriculum-start`).
    #[arg(long)]
    curriculum_start: Option<usize>,
    /// AdamW's denominator epsilon of every run instead of 1e-8, > 0
    /// (`stepgraph train --adam-eps`).
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    adam_eps: Option<f64>,
    /// The fraction of every run's training rows drawn with skewed symbol
    /// frequencies, in 0..=1 (`stepgraph train --skewed-rows`).
    #[arg(long, value_parser = crate::parse::fraction, allow_negative_numbers = true)]
    skewed_rows: Option<f64>,
    /// The probability that each value and operator is left out of a
    /// skewed row, in 0..1 (`stepgraph train --skew-drop`).
    #[arg(long, value_parser = crate::parse::fraction, allow_negative_numbers = true)]
    skew_drop: Option<f64>,
    /// Which tensors AdamW decays, instead of the recipe's outputs
    /// (`stepgraph train --decay`).
    #[arg(long, value_enum)]
    decay: Option<DecayArg>,
    /// Pad every run's training batches to the training size instead of
    /// trimming each to its longest row (`stepgraph train --trim`, which
    /// the recipes use): the same runs up to rounding, slower, as the
    /// tables before the recipes trimmed ran.
    #[arg(long)]
    pad: bool,
    /// Lay K instances to a training row in every run (`stepgraph train
    /// --pack`): the same runs up to rounding in fewer positions; the GPU
    /// engines need heads the warp scan takes.
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    pack: Option<usize>,
    /// Stop every run at this step (as a signal would: a checkpoint, and
    /// --resume continues it) and report the runs so far. A screen: which
    /// runs fit their training size while the curriculum grows shows by its
    /// end (README, "The recipes").
    #[arg(long, value_parser = at_least_one_u64)]
    stop_after: Option<u64>,
    /// Instead of training, merge the output directories of several parts
    /// (comma-separated) into one table in --out.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with_all = [
            "seeds", "first_seed", "precision", "device", "jobs", "gpus", "quick", "tasks", "rotations",
            "time_limit", "steps", "curriculum", "batch", "lr", "min_lr", "warmup", "d_model", "headdim",
            "curriculum_gate", "dt_init", "ema", "train_min_len", "curriculum_start", "adam_eps",
            "skewed_rows", "skew_drop", "decay", "pad", "pack", "stop_after",
        ]
    )]
    merge: Vec<PathBuf>,
    /// Continue the table in this output directory: stopped runs from their
    /// checkpoints, skipped ones from the start; finished ones are kept, and
    /// the table, its files and plots are rewritten there. Takes --jobs,
    /// --gpus, --time-limit and --stop-after; everything else is what the
    /// table was run with.
    #[arg(
        long,
        conflicts_with_all = [
            "seeds", "first_seed", "precision", "device", "quick", "tasks", "rotations",
            "steps", "curriculum", "batch", "lr", "min_lr", "warmup", "d_model", "headdim", "curriculum_gate",
            "dt_init", "ema", "train_min_len", "curriculum_start", "adam_eps", "skewed_rows",
            "skew_drop", "decay", "pad", "pack", "merge", "out",
        ]
    )]
    resume: Option<PathBuf>,
}

const PRECISIONS: &[(Precision, &str)] = &[(Precision::F32, ""), (Precision::Bf16, "")];

#[derive(Clone, Copy, clap::ValueEnum)]
enum TaskArg {
    Parity,
    ModarithPrec,
    ModarithBrackets,
    ModarithBracketsNomult,
}

fn options(a: &StArgs) -> ReproOptions {
    let device: Device = a.device.into();
    ReproOptions {
        seeds: (a.first_seed..a.first_seed.saturating_add(a.seeds)).collect(),
        precision: a.precision,
        device,
        out: a.out.clone(),
        gpus: a.gpus.clone(),
        jobs: a
            .jobs
            .unwrap_or(if matches!(device, Device::Cpu) { 1 } else { 16 }),
        quick: a.quick,
        tasks: if a.tasks.is_empty() {
            TASKS.to_vec()
        } else {
            a.tasks
                .iter()
                .map(|t| match t {
                    TaskArg::Parity => Task::Parity,
                    TaskArg::ModarithPrec => Task::ModarithPrec,
                    TaskArg::ModarithBrackets => Task::ModarithBrackets,
                    TaskArg::ModarithBracketsNomult => Task::ModarithBracketsNomult,
                })
                .collect()
        },
        rotations: if a.rotations.is_empty() {
            ROTATIONS.to_vec()
        } else {
            a.rotations.iter().map(|&r| r.into()).collect()
        },
        time_limit: a.time_limit.map(Duration::from_secs),
        stop_after: a.stop_after,
        overrides: Overrides {
            steps: a.steps,
            curriculum: a.curriculum,
            batch: a.batch,
            lr: a.lr,
            min_lr: a.min_lr,
            warmup: a.warmup,
            d_model: a.d_model,
            headdim: a.headdim,
            curriculum_gate: a.curriculum_gate,
            dt_init: a.dt_init,
            ema: a.ema,
            train_min_len: a.train_min_len,
            curriculum_start: a.curriculum_start,
            adam_eps: a.adam_eps,
            skewed_rows: a.skewed_rows,
            skew_drop: a.skew_drop,
            decay: a.decay.map(Into::into),
            pad: a.pad,
            pack: a.pack,
        },
    }
}

/// The first signal stops every run after its step; a second one exits.
fn install_handler(stop: &Arc<Stop>) {
    let stop = Arc::clone(stop);
    let handler = ctrlc::set_handler(move || match stop.on_signal(Instant::now()) {
        SignalAction::Stop => eprintln!(
            "\nstopping: every run finishes its step and checkpoints, then the table of the \
             finished runs is written (signal again to exit at once)"
        ),
        SignalAction::Duplicate => {}
        SignalAction::ExitNow => {
            eprintln!("\nsecond signal: exiting now; the table was not written");
            std::process::exit(130);
        }
    });
    if let Err(e) = handler {
        eprintln!("warning: a signal will end the runs without a table ({e})");
    }
}

/// Runs the subcommand.
pub fn run(args: &Args) -> ExitCode {
    let What::StateTracking(a) = &args.what;
    if !a.merge.is_empty() {
        println!(
            "stepgraph repro state-tracking: merging {} parts",
            a.merge.len()
        );
        return finish(merge(&a.merge, a.out.as_deref()), "in all parts");
    }
    let stop = Arc::new(Stop::new());
    install_handler(&stop);
    let print = |l: &str| println!("{l}");
    if let Some(dir) = &a.resume {
        let limit = a.time_limit.map(Duration::from_secs);
        return finish(
            resume(dir, a.jobs, &a.gpus, limit, a.stop_after, &stop, &print),
            "over all its visits",
        );
    }
    let opts = options(a);
    if let Err(e) = validate(&opts) {
        return finish(Err(e), "");
    }
    println!(
        "stepgraph repro state-tracking: {} tasks x {} rotation modes x {} seeds, {}, {} at once",
        opts.tasks.len(),
        opts.rotations.len(),
        opts.seeds.len(),
        opts.precision.name(),
        opts.jobs
    );
    let at_once = format!("{} at once", opts.jobs);
    finish(state_tracking(&opts, &stop, &print), &at_once)
}

/// Prints the table (or the error) and picks the exit code.
fn finish(result: Result<ReproReport, ReproError>, how: &str) -> ExitCode {
    match result {
        Ok(r) => {
            if let Some(n) = &r.notice {
                println!("{n}");
            }
            println!(
                "\nscaled accuracy (%) at the reported size: mean [min, max] over seeds (paper)\n"
            );
            print!("{}", r.table);
            println!(
                "\nwall time {:.1} s for {} runs ({how}); table, runs, plots and JSONL in {}",
                r.wall.as_secs_f64(),
                r.results.len(),
                r.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) if e.exit_code() == 2 => crate::usage_error("repro", e),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
