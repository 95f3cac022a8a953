//! `stepgraph repro state-tracking --resume DIR`: continue a table that a
//! time limit or a signal stopped, in its own directory.
//!
//! An arithmetic run of the full recipe takes minutes of a GPU to itself,
//! and runs that share the GPU share its throughput, so a table rarely
//! finishes within one visit to a GPU machine. Every stopped run has
//! checkpointed its state; resuming continues each one from its newest
//! intact checkpoint (bit-identically, as `stepgraph train --resume` does),
//! starts the runs the stop skipped, and keeps the finished ones. The table
//! is what one uninterrupted command would have written; its wall time is
//! the sum of the visits.
//!
//! A table writes a provisional `table.json` naming all its runs before the
//! first starts, so even one whose process was killed outright (no time to
//! checkpoint or write its results) resumes: its runs without a results
//! line start again if their directories are empty, continue if they hold a
//! checkpoint, and are otherwise left as failed, named, for the user to
//! move away. What `table.json` records (precision, device, quick mode,
//! recipe overrides) decides how the runs train; every setting of a
//! continued run is also compared with the one it saved, so a binary whose
//! recipe changed since refuses the run (it is reported failed, naming the
//! setting) instead of mixing two recipes in one run.

use std::path::Path;
use std::time::{Duration, Instant};

use super::merge::{Selection, header, results};
use super::recipe;
use super::runner::{self, Outcome, RunResult, Start};
use super::{
    ReproError, ReproOptions, ReproReport, drain, io, open_device, report_runs, write_results,
};
use crate::train::Stop;

/// How a run of the saved table goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Finished: kept as it is.
    Keep,
    /// Trained again from the start or from its checkpoint.
    Train(Start),
    /// Failed or stopped with no checkpoint, in a directory that is not
    /// empty: left as it is (moving the directory away lets a later resume
    /// start it again).
    Stuck,
}

/// What to do with a run of the saved table whose directory is `dir`.
pub fn next(outcome: &Outcome, dir: &Path) -> Next {
    if *outcome == Outcome::Finished {
        return Next::Keep;
    }
    let has_checkpoint = std::fs::read_dir(dir.join("checkpoints"))
        .is_ok_and(|mut entries| entries.next().is_some());
    let empty = std::fs::read_dir(dir).map_or(true, |mut entries| entries.next().is_none());
    if has_checkpoint {
        Next::Train(Start::Resume)
    } else if empty {
        Next::Train(Start::Fresh)
    } else {
        Next::Stuck
    }
}

/// Continues the table in `dir` (see the module docs) with `jobs` runs at
/// once (default: as many as it ran with) on `gpus` (empty: every GPU), an
/// optional time limit for this visit and an optional step at which its
/// runs stop (a run stopped there before goes on past it when none is
/// given); `line` gets one line per run as it ends.
pub fn resume(
    dir: &Path,
    jobs: Option<usize>,
    gpus: &[usize],
    time_limit: Option<Duration>,
    stop_after: Option<u64>,
    stop: &Stop,
    line: &(dyn Fn(&str) + Sync),
) -> Result<ReproReport, ReproError> {
    let head = header(dir)?;
    // A table killed outright has no results.jsonl yet, or lines for only
    // some of its runs; its provisional table.json still names them all.
    let results_path = dir.join("results.jsonl");
    let mut saved = if results_path.exists() {
        results(dir)?
    } else {
        Vec::new()
    };
    let (device, gpus, notice) = open_device(head.device, head.precision, gpus)?;
    let Selection {
        tasks,
        rotations,
        seeds,
    } = head
        .selection
        .clone()
        .unwrap_or_else(|| Selection::of(&saved));
    let opts = ReproOptions {
        seeds,
        precision: head.precision,
        device,
        out: Some(dir.to_path_buf()),
        jobs: jobs.unwrap_or(head.jobs).max(1),
        gpus: gpus.clone(),
        quick: head.quick,
        tasks,
        rotations,
        time_limit,
        stop_after,
        overrides: head.overrides,
    };
    // The queue in the order a fresh table would run it, of the runs that
    // still train. A run with no line of its own ended with its process.
    let mut queue = Vec::new();
    let mut stuck = Vec::new();
    for job in runner::jobs(
        &opts.tasks,
        &opts.rotations,
        &opts.seeds,
        opts.quick,
        &opts.overrides,
    ) {
        if !saved.iter().any(|r| r.job == job) {
            saved.push(RunResult {
                job,
                outcome: Outcome::Failed("its process ended before the run did".into()),
                dir: dir.join("runs").join(job.name()),
                steps: 0,
                total_steps: recipe::recipe_with(job.task, opts.quick, &opts.overrides).steps,
                wall: Duration::ZERO,
                eval: Vec::new(),
                eval_ema: Vec::new(),
                dynamics: None,
                last_loss: None,
            });
        }
        let Some(r) = saved.iter().find(|r| r.job == job) else {
            continue;
        };
        match next(&r.outcome, &r.dir) {
            // Already at this visit's stop step: kept with its scores, as
            // training it would stop it again at once.
            Next::Train(Start::Resume) if stop_after.is_some_and(|s| r.steps >= s) => {}
            Next::Train(start) => queue.push((job, start)),
            Next::Stuck => stuck.push(job.name()),
            Next::Keep => {}
        }
    }
    line(&format!(
        "resuming {}: {} of {} runs to train ({} to continue from a checkpoint)",
        dir.display(),
        queue.len(),
        saved.len(),
        queue.iter().filter(|(_, s)| *s == Start::Resume).count()
    ));
    if !stuck.is_empty() {
        line(&format!(
            "left as they are (no checkpoint, in a directory that is not empty; move it away \
             to start the run again): {}",
            stuck.join(", ")
        ));
    }
    let results_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&results_path)
        .map_err(io(&results_path))?;
    let t0 = Instant::now();
    let trained = drain(&opts, device, &gpus, dir, queue, results_file, stop, line);
    let mut runs = saved;
    for mut r in trained {
        if let Some(earlier) = runs.iter_mut().find(|x| x.job == r.job) {
            // A continued run's wall time covers every visit.
            r.wall += earlier.wall;
            *earlier = r;
        }
    }
    let note = format!(
        "Resumed in {}; the wall time is the sum of its visits.\n\n",
        dir.display()
    );
    let wall = head.wall + t0.elapsed();
    let mut report = report_runs(&opts, dir.to_path_buf(), runs, wall, device, &note)?;
    write_results(&report.results, dir, opts.quick)?;
    report.notice = notice;
    Ok(report)
}
