//! `stepgraph repro state-tracking`: the Mamba-3 paper's state-tracking table
//! (Table 5b) in one command. Three tasks (parity, modular arithmetic
//! without and with brackets; [`recipe::TASKS`]) times three rotation modes
//! (Mamba-3's data-dependent angles, standard RoPE, none;
//! [`recipe::ROTATIONS`]) times N seeds, each run trained by
//! [`crate::train::train`] with its column's [`recipe`], several at once
//! ([`runner`]); then the table of scaled accuracy (mean and spread over
//! seeds) beside the paper's, one line per run with its dynamics, the plots
//! and the JSONL of every run ([`report`]).
//!
//! Everything lands in the output directory:
//!
//! ```text
//! OUT/table.md        the table, the settings, one line per run
//! OUT/table.json      the cells (mean, min, max, runs, paper)
//! OUT/results.jsonl   one object per run, written as each run ends
//! OUT/metrics.jsonl   every run's evaluations, dynamics probes and one training
//!                     step in 10, each line tagged "run"
//! OUT/accuracy-TASK.svg  scaled accuracy at the reported size over steps
//! OUT/runs/TASK-ROTATION-sSEED/  each run's own directory (stepgraph train's)
//! ```
//!
//! The table of one GPU visit can be a part of the whole ([`ReproOptions`]'s
//! tasks, rotations and seeds); [`merge`] joins parts into one table, and
//! [`resume`] continues a part whose runs a time limit stopped.

pub mod curve;
pub mod merge;
pub mod recipe;
pub mod report;
pub mod resume;
pub mod runner;

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thiserror::Error;

use crate::Precision;
use crate::train::data::Task;
use crate::train::run::{Resolved, resolve_device};
use crate::train::{DEFAULT_ADAM_EPS, Decay, Device, Rotation, Stop, TrainError};
use runner::{Outcome, Plan, RunResult, Start};

/// Why the reproduction could not run.
#[derive(Debug, Error)]
pub enum ReproError {
    /// A flag value it cannot use (a usage error: exit code 2).
    #[error("{flag}: {reason}")]
    InvalidOption {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A file of the output directory could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A part named to `--merge` is not a reproduction's output directory
    /// (a file missing or malformed).
    #[error("{}: {reason}", path.display())]
    Part {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Opening the device, or writing a plot, failed.
    #[error(transparent)]
    Train(#[from] TrainError),
}

impl ReproError {
    /// Process exit code: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::InvalidOption { .. } => 2,
            Self::Train(e) => e.exit_code(),
            Self::Io { .. } | Self::Part { .. } => 1,
        }
    }
}

/// What `stepgraph repro state-tracking` was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct ReproOptions {
    /// Seeds of every cell.
    pub seeds: Vec<u64>,
    /// Precision of every run.
    pub precision: Precision,
    /// Where the runs train.
    pub device: Device,
    /// Output directory (`None`: `runs/repro-state-tracking-<UTC timestamp>`).
    pub out: Option<PathBuf>,
    /// Runs trained at once.
    pub jobs: usize,
    /// The GPUs the runs share (ordinals; empty: every GPU the driver
    /// lists). Worker `k` trains on the `k % len`-th, so `jobs` runs spread
    /// evenly over them. Not a setting of the table: a later visit may use
    /// other GPUs.
    pub gpus: Vec<usize>,
    /// Smoke-test recipes (a few steps on tiny instances).
    pub quick: bool,
    /// Columns.
    pub tasks: Vec<Task>,
    /// Rows.
    pub rotations: Vec<Rotation>,
    /// Stop every run (as a signal would) after this long.
    pub time_limit: Option<Duration>,
    /// Stop every run (as a signal would) at this step: a screen to the
    /// curriculum's end, continued later with `--resume`. Not a setting of
    /// the table, as the time limit is not.
    pub stop_after: Option<u64>,
    /// Changes to every column's recipe.
    pub overrides: recipe::Overrides,
}

/// What the reproduction produced.
#[derive(Debug)]
pub struct ReproReport {
    /// The output directory.
    pub out: PathBuf,
    /// The table (markdown).
    pub table: String,
    /// One result per run, in table order.
    pub results: Vec<RunResult>,
    /// Wall time of the whole reproduction.
    pub wall: Duration,
    /// The plots written.
    pub plots: Vec<PathBuf>,
    /// A line to show before the table (`auto` fell back to the CPU).
    pub notice: Option<String>,
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> ReproError {
    ReproError::InvalidOption {
        flag,
        reason: reason.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReproError {
    let path = path.to_path_buf();
    move |source| ReproError::Io { path, source }
}

/// Checks the options, before anything is created: each problem names its
/// flag. [`state_tracking`] checks them again, so callers need not.
pub fn validate(o: &ReproOptions) -> Result<(), ReproError> {
    if o.seeds.is_empty() {
        return Err(invalid("--seeds", "must be at least 1"));
    }
    if o.jobs == 0 {
        return Err(invalid("--jobs", "must be at least 1"));
    }
    if o.tasks.is_empty() {
        return Err(invalid("--tasks", "name at least one task"));
    }
    if let Some(t) = o.tasks.iter().find(|t| !recipe::COLUMNS.contains(t)) {
        return Err(invalid(
            "--tasks",
            format!(
                "`{}` is not a column of the table (parity, modarith-prec, modarith-brackets, \
                 modarith-brackets-nomult)",
                t.name()
            ),
        ));
    }
    if o.rotations.is_empty() {
        return Err(invalid("--rotations", "name at least one rotation mode"));
    }
    for &t in &o.tasks {
        let r = recipe::recipe_with(t, o.quick, &o.overrides);
        // Options that shape a curriculum need one.
        for (flag, verb, set) in [
            ("--curriculum-gate", "gates", r.curriculum_gate > 0.0),
            ("--curriculum-start", "starts", r.curriculum_start > 0),
        ] {
            if set && r.curriculum == 0 {
                return Err(invalid(
                    flag,
                    format!(
                        "{verb} a curriculum, and the {} recipe has none here: give --curriculum N too",
                        t.name()
                    ),
                ));
            }
        }
        for (flag, size) in [
            ("--curriculum-start", r.curriculum_start),
            ("--train-min-len", r.train_min_len),
        ] {
            if size > r.train_len {
                return Err(invalid(
                    flag,
                    format!(
                        "{size} is above the {} recipe's training size {}",
                        t.name(),
                        r.train_len
                    ),
                ));
            }
        }
        if r.curriculum > r.steps {
            return Err(invalid(
                "--curriculum",
                format!(
                    "{} steps of curriculum do not fit in {} steps ({})",
                    r.curriculum,
                    r.steps,
                    t.name()
                ),
            ));
        }
        for rotation in &o.rotations {
            let run = r.run(*rotation, 0, o.precision, o.device, o.quick);
            crate::train::config::model_config(
                run.model,
                crate::train::config::vocab_of(&run.data),
            )
            .map_err(|e| {
                // The width's flag, unless only the head dimension changed.
                let flag = if o.overrides.d_model.is_none() && o.overrides.headdim.is_some() {
                    "--headdim"
                } else {
                    "--d-model"
                };
                invalid(flag, e.to_string())
            })?;
            // Every other setting a run checks (e.g. --min-lr against the
            // recipe's peak), refused before any run starts.
            crate::train::config::validate(&run).map_err(|e| match e {
                TrainError::InvalidOption { flag, reason } => invalid(flag, reason),
                other => ReproError::Train(other),
            })?;
        }
    }
    Ok(())
}

/// The output directory, created; an existing one must be empty.
fn claim_out(out: Option<&Path>) -> Result<PathBuf, ReproError> {
    let dir = out.map_or_else(
        || {
            Path::new("runs").join(format!(
                "repro-state-tracking-{}",
                crate::train::rundir::utc_stamp()
            ))
        },
        Path::to_path_buf,
    );
    if let Ok(mut entries) = std::fs::read_dir(&dir)
        && entries.next().is_some()
    {
        return Err(invalid(
            "--out",
            format!(
                "{} exists and is not empty; choose another --out",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(dir.join("runs")).map_err(io(&dir))?;
    Ok(dir)
}

/// Runs the table (see the module docs). `stop` ends every run early, as a
/// signal does; the table then covers the runs that finished. `line` gets
/// one line per finished run, as it finishes.
pub fn state_tracking(
    opts: &ReproOptions,
    stop: &Stop,
    line: &(dyn Fn(&str) + Sync),
) -> Result<ReproReport, ReproError> {
    validate(opts)?;
    let (device, gpus, notice) = open_device(opts.device, opts.precision, &opts.gpus)?;
    let out = claim_out(opts.out.as_deref())?;
    // A provisional table.json names the whole table at once, so that a
    // table whose process was killed outright can still be resumed.
    let path = out.join("table.json");
    let head = header_json(opts, device, Duration::ZERO, false);
    std::fs::write(&path, head.to_string()).map_err(io(&path))?;
    let t0 = Instant::now();
    let queue = runner::jobs(
        &opts.tasks,
        &opts.rotations,
        &opts.seeds,
        opts.quick,
        &opts.overrides,
    )
    .into_iter()
    .map(|j| (j, Start::Fresh))
    .collect();
    let results_path = out.join("results.jsonl");
    let results_file = std::fs::File::create(&results_path).map_err(io(&results_path))?;
    let results = drain(opts, device, &gpus, &out, queue, results_file, stop, line);
    let mut report = report_runs(opts, out, results, t0.elapsed(), device, "")?;
    report.notice = notice;
    Ok(report)
}

/// The device the runs train on, the GPUs they share (`gpus`, or every
/// GPU when it is empty; none on the CPU), and the notice of an `auto` that
/// fell back to the CPU. Opening the first GPU here compiles the kernels
/// into the disk cache once, before the workers each open their own
/// context and load them; an ordinal the driver does not list is refused
/// naming `--gpus`.
fn open_device(
    device: Device,
    precision: Precision,
    gpus: &[usize],
) -> Result<(Device, Vec<usize>, Option<String>), ReproError> {
    let first = gpus.first().copied().unwrap_or(0);
    Ok(match resolve_device(device, precision, first)? {
        Resolved::Cpu(notice) => (Device::Cpu, Vec::new(), notice),
        Resolved::Cuda(_) => {
            let count = crate::device::device_count()
                .map_err(|source| ReproError::Train(TrainError::NoGpu { source }))?;
            (Device::Cuda, gpu_list(gpus, count)?, None)
        }
    })
}

/// `gpus` checked against the `count` GPUs the driver lists (every one
/// when `gpus` is empty).
fn gpu_list(gpus: &[usize], count: usize) -> Result<Vec<usize>, ReproError> {
    if gpus.is_empty() {
        return Ok((0..count.max(1)).collect());
    }
    if let Some(g) = gpus.iter().find(|&&g| g >= count) {
        return Err(invalid(
            "--gpus",
            format!("GPU {g} does not exist: the driver lists {count} (0..{count})"),
        ));
    }
    Ok(gpus.to_vec())
}

/// The GPU worker `k` of a table trains on: the workers go round `gpus`
/// (GPU 0 when the list is empty: CPU runs ignore it).
fn worker_gpu(gpus: &[usize], k: usize) -> usize {
    gpus.get(k % gpus.len().max(1)).copied().unwrap_or(0)
}

/// Trains `queue` with `opts.jobs` workers into `out/runs`, appending each
/// result to `results_file` (`results.jsonl`) and announcing it through
/// `line` as it ends; `opts.time_limit`, counted from the call, stops the
/// runs as a signal would.
#[expect(
    clippy::too_many_arguments,
    reason = "the table's parts, each used once; a struct would only rename them"
)]
fn drain(
    opts: &ReproOptions,
    device: Device,
    gpus: &[usize],
    out: &Path,
    queue: Vec<(runner::Job, Start)>,
    results_file: std::fs::File,
    stop: &Stop,
    line: &(dyn Fn(&str) + Sync),
) -> Vec<RunResult> {
    let t0 = Instant::now();
    let total = queue.len();
    let runs_dir = out.join("runs");
    let plan = Plan {
        queue: Mutex::new(VecDeque::from(queue)),
        runs_dir: &runs_dir,
        precision: opts.precision,
        device,
        quick: opts.quick,
        overrides: opts.overrides,
        stop_after: opts.stop_after,
        stop,
    };
    let sink = Mutex::new((Vec::new(), results_file));
    let done = |r: RunResult| {
        let mut guard = sink.lock().unwrap_or_else(|p| p.into_inner());
        let (results, file) = &mut *guard;
        // A results line that cannot be written loses nothing the table
        // needs: the run's own directory holds its metrics.
        let _ = writeln!(file, "{}", report::result_json(&r, opts.quick));
        line(&progress_line(&r, results.len() + 1, total, opts.quick));
        results.push(r);
    };
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        if let Some(limit) = opts.time_limit {
            let finished = &finished;
            s.spawn(move || watchdog(limit, t0, stop, finished));
        }
        let (plan, done) = (&plan, &done);
        let workers: Vec<_> = (0..opts.jobs.min(total.max(1)))
            .map(|k| {
                let gpu = worker_gpu(gpus, k);
                s.spawn(move || runner::work(plan, gpu, done))
            })
            .collect();
        for w in workers {
            // A worker that panicked has lost only its own run.
            let _ = w.join();
        }
        finished.store(true, Ordering::SeqCst);
    });
    sink.into_inner().unwrap_or_else(|p| p.into_inner()).0
}

/// The recipes line's words for AdamW's weight decay of `decay`.
fn decay_words(decay: Decay) -> String {
    let on = match decay {
        Decay::Outputs => "on the embedding and out_proj only",
        Decay::Matrices => "on every matrix, in_proj too",
        Decay::All => "on every tensor",
        Decay::None => return format!("no weight decay (`--decay {}`)", decay.name()),
    };
    format!(
        "weight decay {} {on} (`--decay {}`)",
        recipe::WEIGHT_DECAY,
        decay.name()
    )
}

/// Puts `results` in table order (task, rotation, seed, as `opts` lists
/// them), then writes the table, its files and the plots into `out`.
fn report_runs(
    opts: &ReproOptions,
    out: PathBuf,
    mut results: Vec<RunResult>,
    wall: Duration,
    device: Device,
    note: &str,
) -> Result<ReproReport, ReproError> {
    results.sort_by_key(|r| {
        (
            opts.tasks.iter().position(|&t| t == r.job.task),
            opts.rotations.iter().position(|&x| x == r.job.rotation),
            r.job.seed,
        )
    });
    let table = report::table(
        &results,
        &opts.tasks,
        &opts.rotations,
        opts.seeds.len(),
        opts.quick,
    );
    write_files(opts, &out, &results, &table, wall, device, note)?;
    let plots = report::plots(&results, &opts.tasks, &out, opts.quick)?;
    Ok(ReproReport {
        out,
        table,
        results,
        wall,
        plots,
        notice: None,
    })
}

/// Requests a stop once `limit` has passed since `t0`, unless the runs
/// finished first.
fn watchdog(limit: Duration, t0: Instant, stop: &Stop, finished: &AtomicBool) {
    while !finished.load(Ordering::SeqCst) {
        if t0.elapsed() >= limit {
            stop.request();
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn progress_line(r: &RunResult, k: usize, total: usize, quick: bool) -> String {
    let rc = recipe::recipe(r.job.task, quick);
    let pct = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    let how = match &r.outcome {
        Outcome::Finished => String::new(),
        Outcome::Stopped => format!(" (stopped at step {})", r.steps),
        Outcome::Skipped => " (skipped: stop requested)".into(),
        Outcome::Failed(e) => format!(" (failed: {e})"),
    };
    format!(
        "[{k:>3}/{total}] {:<28} scaled acc {} at size {}, {} at {}; {:.1} s{how}",
        r.job.name(),
        pct(r.scaled_at(rc.eval_len)),
        rc.eval_len,
        pct(r.scaled_at(rc.train_len)),
        rc.train_len,
        r.wall.as_secs_f64(),
    )
}

fn write_files(
    opts: &ReproOptions,
    out: &Path,
    results: &[RunResult],
    table: &str,
    wall: Duration,
    device: Device,
    note: &str,
) -> Result<(), ReproError> {
    let mut md = format!(
        "# State tracking (Mamba-3 paper, Table 5b)\n\n\
         Scaled accuracy (%, chance 0, perfect 100) at the reported size: mean [min, max] \
         over seeds {:?}, {} on {}{}; wall time {:.0} s with {} runs at once.\n\n",
        opts.seeds,
        opts.precision.name(),
        device.name(),
        if opts.quick {
            ", quick (smoke-test) recipes"
        } else {
            ""
        },
        wall.as_secs_f64(),
        opts.jobs
    );
    md.push_str(note);
    md.push_str(table);
    md.push_str("\n## Recipes\n\n");
    for &t in &opts.tasks {
        let r = recipe::recipe_with(t, opts.quick, &opts.overrides);
        md.push_str(&format!(
            "- {}: `--task {} --n-layer {} --d-model {} --headdim {} --train-len {} \
             --eval-lens {},{} --eval-mix {}-{} --curriculum {}{}{}{}{}{} --steps {} --batch {} --lr {} --min-lr {} --warmup {} \
             --dt-init {}{}{}`, d_state {}, softplus A, AdamW beta2 {} (`--beta2`){}, {}, clip 1, scan chunk {} \
             (`--chunk-size`){}\n",
            recipe::column(t),
            t.name(),
            r.n_layer,
            r.d_model,
            r.headdim,
            r.train_len,
            r.train_len,
            r.eval_len,
            r.mix_from,
            r.eval_len,
            r.curriculum,
            if r.curriculum_gate > 0.0 {
                format!(" --curriculum-gate {}", r.curriculum_gate)
            } else {
                String::new()
            },
            if r.curriculum_start > 0 {
                format!(" --curriculum-start {}", r.curriculum_start)
            } else {
                String::new()
            },
            if r.train_min_len > 0 {
                format!(" --train-min-len {}", r.train_min_len)
            } else {
                String::new()
            },
            if r.skewed_rows > 0.0 {
                format!(" --skewed-rows {}", r.skewed_rows)
            } else {
                String::new()
            },
            if r.skew_drop > 0.0 {
                format!(" --skew-drop {}", r.skew_drop)
            } else {
                String::new()
            },
            r.steps,
            r.batch,
            r.lr,
            r.min_lr,
            r.warmup,
            r.dt_init,
            r.ema.map_or_else(String::new, |d| format!(" --ema {d}")),
            match (r.pack, r.trim) {
                (k, _) if k > 1 => format!(" --pack {k}"),
                (_, true) => " --trim".to_owned(),
                _ => String::new(),
            },
            recipe::d_state(opts.quick),
            recipe::BETA2,
            if r.adam_eps == DEFAULT_ADAM_EPS {
                String::new()
            } else {
                format!(" and eps {} (`--adam-eps`)", r.adam_eps)
            },
            decay_words(r.decay),
            recipe::chunk_size(opts.precision),
            if r.ema.is_some() {
                "; scores are the weight average's (the trained weights' in brackets in the runs table)"
            } else {
                ""
            },
        ));
    }
    md.push_str("\n## Runs\n\n");
    md.push_str(&report::runs_table(results, opts.quick));
    let path = out.join("table.md");
    std::fs::write(&path, md).map_err(io(&path))?;
    let mut tj = header_json(opts, device, wall, true);
    tj["cells"] =
        report::table_json(results, &opts.tasks, &opts.rotations, opts.quick)["cells"].take();
    let path = out.join("table.json");
    let text = serde_json::to_string_pretty(&tj).unwrap_or_else(|_| tj.to_string());
    std::fs::write(&path, text).map_err(io(&path))?;
    report::merge_metrics(results, &out.join("metrics.jsonl"))
}

/// What `table.json` says of how the table runs: what [`merge`] and
/// [`resume`] read back. `complete` is false in the provisional file a
/// table writes before its first run.
fn header_json(opts: &ReproOptions, device: Device, wall: Duration, complete: bool) -> Value {
    json!({
        "precision": opts.precision.name(),
        "device": device.name(),
        "tasks": opts.tasks.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "rotations": opts.rotations.iter().map(|r| r.name()).collect::<Vec<_>>(),
        "seeds": opts.seeds,
        "quick": opts.quick,
        "jobs": opts.jobs,
        "gpus": opts.gpus,
        "wall_s": wall.as_secs_f64(),
        "overrides": opts.overrides,
        "complete": complete,
    })
}

/// Writes `results.jsonl` whole (a run of the table appends to it as each
/// run ends instead).
fn write_results(results: &[RunResult], out: &Path, quick: bool) -> Result<(), ReproError> {
    let path = out.join("results.jsonl");
    let mut text = String::new();
    for r in results {
        text.push_str(&report::result_json(r, quick).to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).map_err(io(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_go_round_the_gpus() {
        assert_eq!(gpu_list(&[], 4).unwrap(), vec![0, 1, 2, 3], "every GPU");
        assert_eq!(gpu_list(&[2, 0], 4).unwrap(), vec![2, 0]);
        let e = gpu_list(&[1, 4], 4).unwrap_err().to_string();
        assert!(e.contains("--gpus") && e.contains("GPU 4"), "{e}");
        let gpus = [3, 1];
        let of: Vec<usize> = (0..5).map(|k| worker_gpu(&gpus, k)).collect();
        assert_eq!(of, vec![3, 1, 3, 1, 3]);
        assert_eq!(worker_gpu(&[], 7), 0, "CPU runs ignore it");
    }
}
