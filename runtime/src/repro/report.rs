//! What the reproduction reports: the table (mean and spread of scaled
//! accuracy per cell beside the paper's number), one line per run with the
//! dynamics that tell a run that generalizes from one that does not, and
//! the files: `table.md`, `table.json`, `results.jsonl`, `metrics.jsonl`
//! (every run's metrics, tagged with the run) and one accuracy-over-steps
//! plot per task.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::recipe::{column, paper, recipe, row};
use super::runner::{Outcome, RunResult};
use super::{ReproError, curve};
use crate::train::Rotation;
use crate::train::data::Task;
use crate::train::plot::{Line, eval_accuracy, write_lines_plot};
use crate::train::report::EvalResult;
use crate::train::report::METRICS_FILE;

/// Mean, spread and count of one cell's scaled accuracies (%).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    /// Mean over finished runs.
    pub mean: f64,
    /// Lowest.
    pub min: f64,
    /// Highest.
    pub max: f64,
    /// Finished runs it covers.
    pub n: usize,
}

/// Which accuracy a table reads from a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Rows of exactly the reported size (the paper's "at 256").
    Size,
    /// The mixed set of sizes from the recipe's `mix_from` to the reported
    /// one (the sources' validation protocol, rows of 40-256 tokens).
    Mix,
}

impl Reading {
    /// A run's scaled accuracy (%) as this reading takes it.
    pub fn scaled(self, r: &RunResult, quick: bool) -> Option<f64> {
        let rc = recipe(r.job.task, quick);
        match self {
            Self::Size => r.scaled_at(rc.eval_len),
            Self::Mix => r.scaled_mix(rc.mix_from, rc.eval_len),
        }
    }
}

/// The cell of `(task, rotation)` over the finished runs' scaled accuracy
/// at the reported length; `None` when no run finished.
pub fn cell(results: &[RunResult], task: Task, rotation: Rotation, quick: bool) -> Option<Cell> {
    cell_of(results, task, rotation, quick, Reading::Size)
}

/// [`cell`] as `reading` takes each run's accuracy; `None` when no finished
/// run has one.
pub fn cell_of(
    results: &[RunResult],
    task: Task,
    rotation: Rotation,
    quick: bool,
    reading: Reading,
) -> Option<Cell> {
    let v: Vec<f64> = results
        .iter()
        .filter(|r| r.job.task == task && r.job.rotation == rotation)
        .filter(|r| r.outcome == Outcome::Finished)
        .filter_map(|r| reading.scaled(r, quick))
        .collect();
    let n = v.len();
    (n > 0).then(|| Cell {
        mean: v.iter().sum::<f64>() / f64::from(u32::try_from(n).unwrap_or(u32::MAX)),
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        n,
    })
}

/// The table as markdown: one row per rotation mode, one column per task,
/// `mean [min, max]` of the scaled accuracy beside the paper's number; then
/// the same cells on the sources' mixed sizes, where any run has them.
pub fn table(
    results: &[RunResult],
    tasks: &[Task],
    rotations: &[Rotation],
    seeds: usize,
    quick: bool,
) -> String {
    let mut out = table_of(results, tasks, rotations, seeds, quick, Reading::Size);
    out.push_str(&stopped_summary(results, tasks, rotations, quick));
    let any_mix = results
        .iter()
        .any(|r| Reading::Mix.scaled(r, quick).is_some());
    if any_mix {
        out.push_str(
            "\nThe same runs on the sources' validation protocol (one accuracy over rows of \
             every size from 40 tokens to the reported one; the paper does not say which \
             reading its table uses):\n\n",
        );
        out.push_str(&table_of(
            results,
            tasks,
            rotations,
            seeds,
            quick,
            Reading::Mix,
        ));
    }
    out
}

fn table_of(
    results: &[RunResult],
    tasks: &[Task],
    rotations: &[Rotation],
    seeds: usize,
    quick: bool,
    reading: Reading,
) -> String {
    let mut out = String::from("| model |");
    for &t in tasks {
        let _ = write!(out, " {} |", column(t));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(tasks.len()));
    out.push('\n');
    for &r in rotations {
        let _ = write!(out, "| {} |", row(r));
        for &t in tasks {
            let ours = cell_of(results, t, r, quick, reading).map_or_else(
                || "n/a".to_owned(),
                |c| {
                    let partial = if c.n < seeds {
                        format!(" ({}/{seeds} runs)", c.n)
                    } else {
                        String::new()
                    };
                    format!("{:.1} [{:.1}, {:.1}]{partial}", c.mean, c.min, c.max)
                },
            );
            let theirs = paper(t, r).map_or_else(String::new, |p| format!(" (paper {p:.2})"));
            let _ = write!(out, " {ours}{theirs} |");
        }
        out.push('\n');
    }
    out
}

/// Per layer, `f` of the run's last dynamics probe, as `a / b / c`.
fn per_layer(
    r: &RunResult,
    f: impl Fn(&crate::train::dynamics::LayerDynamics) -> String,
) -> String {
    r.dynamics.as_ref().map_or_else(
        || "-".into(),
        |d| d.layers.iter().map(f).collect::<Vec<_>>().join(" / "),
    )
}

/// `(step, raw accuracy %)` in step order, as a run's evaluations logged
/// them.
type Series = Vec<(f64, f64)>;

/// A run's accuracy over steps at its training size: the trained weights'
/// and the weight average's (the trained weights' again where the run kept
/// no average); `None` where it has no evaluation there.
fn train_size_series(r: &RunResult, train_len: usize) -> Option<(Series, Series)> {
    let mut series = eval_accuracy(&r.dir).ok()?;
    let label = format!("len {train_len}");
    let trained = series.remove(&label)?;
    let averaged = series
        .remove(&format!("{label} ema"))
        .unwrap_or_else(|| trained.clone());
    Some((trained, averaged))
}

/// The first step at which the run all but fitted its training size
/// ([`curve::fitted`], on the weight average where the run kept one: the
/// reading its table scores).
fn fitted_step(r: &RunResult, train_len: usize) -> Option<f64> {
    let (_, averaged) = train_size_series(r, train_len)?;
    curve::fitted(&averaged, r.job.task)
}

/// When the run first cleared chance at its training size, how often it
/// fell back ([`curve::started_and_relapses`], on the trained weights) and
/// when it all but fitted it ([`fitted_step`]), as table cells; `-` where
/// it has no evaluation there.
fn learning(r: &RunResult, train_len: usize) -> [String; 3] {
    let Some((trained, averaged)) = train_size_series(r, train_len) else {
        return ["-".into(), "-".into(), "-".into()];
    };
    let (started, relapses) = curve::started_and_relapses(&trained, r.job.task);
    let step = |s: Option<f64>| s.map_or_else(|| "never".into(), |s| format!("{s:.0}"));
    [
        step(started),
        relapses.to_string(),
        step(curve::fitted(&averaged, r.job.task)),
    ]
}

/// One line per cell that holds stopped runs (a screen's `--stop-after`,
/// or a visit's time limit): how many stopped, at which step, and how many
/// had all but fitted their training size by then ([`fitted_step`]). In
/// the arithmetic that split the runs that went on to generalize from the
/// ones that did not (tests/gpu/STATE-TRACKING.md, round 23), so a screen
/// reads here what its table's cells cannot show yet. Empty when no run
/// stopped.
pub fn stopped_summary(
    results: &[RunResult],
    tasks: &[Task],
    rotations: &[Rotation],
    quick: bool,
) -> String {
    let mut out = String::new();
    for &t in tasks {
        let train_len = recipe(t, quick).train_len;
        for &rot in rotations {
            let stopped: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.job.task == t && r.job.rotation == rot)
                .filter(|r| r.outcome == Outcome::Stopped)
                .collect();
            let (Some(lo), Some(hi)) = (
                stopped.iter().map(|r| r.steps).min(),
                stopped.iter().map(|r| r.steps).max(),
            ) else {
                continue;
            };
            let at = if lo == hi {
                format!("step {lo}")
            } else {
                format!("steps {lo}-{hi}")
            };
            let fitted: Vec<String> = stopped
                .iter()
                .filter_map(|r| fitted_step(r, train_len))
                .map(|s| format!("{s:.0}"))
                .collect();
            let when = if fitted.is_empty() {
                String::new()
            } else {
                format!(" (at steps {})", fitted.join(", "))
            };
            let _ = writeln!(
                out,
                "- {}, {}: {} stopped at {at}; {} of them had fitted the training size \
                 (>= {} scaled){when}",
                column(t),
                row(rot),
                stopped.len(),
                fitted.len(),
                curve::FITTED
            );
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\nStopped runs, not yet in the cells above:\n\n{out}")
}

/// The reported scaled accuracy of a run's line: the weight average's, with
/// the trained weights' beside it when the run kept an average.
fn scaled_report(r: &RunResult, len: usize) -> String {
    let pct = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    if r.eval_ema.is_empty() {
        pct(r.scaled_at(len))
    } else {
        format!(
            "{} (trained {})",
            pct(r.scaled_at(len)),
            pct(r.scaled_trained_at(len))
        )
    }
}

/// One markdown line per run: outcome, scaled accuracy at the training and
/// the reported length, the training-length loss, the dynamics (retention,
/// angle lattice error, largest angle step, mean `dt`), when the run
/// started, how often it relapsed and when it all but fitted its training
/// size.
pub fn runs_table(results: &[RunResult], quick: bool) -> String {
    let mut out = String::from(
        "| run | outcome | steps | wall s | scaled acc @train | scaled acc @report | \
         scaled acc @mix | zero-free products (raw %) | loss @train | last train loss | \
         retention (best head, per layer) | lattice error rad (per layer) | max angle step /pi | \
         mean dt (per layer) | started @step | relapses | fitted @step |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let rc = recipe(r.job.task, quick);
        let pct = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
        let loss_train = r
            .eval
            .iter()
            .find(|e| e.length == Some(rc.train_len))
            .map_or_else(|| "-".into(), |e| format!("{:.4}", e.loss));
        let [started, relapses, fitted] = learning(r, rc.train_len);
        let outcome = match &r.outcome {
            Outcome::Finished => "finished".to_owned(),
            Outcome::Stopped => "stopped".to_owned(),
            Outcome::Skipped => "skipped".to_owned(),
            Outcome::Failed(e) => format!("failed: {}", e.replace('|', "/")),
        };
        let _ = writeln!(
            out,
            "| {} | {outcome} | {}/{} | {:.1} | {} | {} | {} | {} | {loss_train} | {} | {} | {} | \
             {} | {} | {started} | {relapses} | {fitted} |",
            r.job.name(),
            r.steps,
            r.total_steps,
            r.wall.as_secs_f64(),
            pct(r.scaled_at(rc.train_len)),
            scaled_report(r, rc.eval_len),
            pct(Reading::Mix.scaled(r, quick)),
            rc.eval_products.map_or_else(
                || "-".into(),
                |k| format!("{} @{k}", pct(r.products_accuracy(k)))
            ),
            r.last_loss
                .map_or_else(|| "-".into(), |l| format!("{l:.4}")),
            per_layer(r, |l| format!("{:.3}", l.retention_best)),
            per_layer(r, |l| {
                let mut s = l
                    .lattice_error
                    .map_or_else(|| "none".into(), |e| format!("{e:.4}"));
                for f in &l.other_lattices {
                    let _ = write!(s, " (m {}: {:.4})", f.modulus, f.error);
                }
                s
            }),
            per_layer(r, |l| format!("{:.2}", l.angle_max)),
            // A quiet middle layer (dt ~0.01-0.03) marked the arithmetic
            // runs still at chance on the H200 (tests/gpu/STATE-TRACKING.md,
            // rounds 6 and 7).
            per_layer(r, |l| format!("{:.3}", l.dt_mean)),
        );
    }
    out
}

/// One JSON object describing a run (a line of `results.jsonl`).
pub fn result_json(r: &RunResult, quick: bool) -> Value {
    let rc = recipe(r.job.task, quick);
    json!({
        "run": r.job.name(),
        "task": r.job.task.name(),
        "rotation": r.job.rotation.name(),
        "seed": r.job.seed,
        "outcome": match &r.outcome {
            Outcome::Finished => "finished".to_owned(),
            Outcome::Stopped => "stopped".to_owned(),
            Outcome::Skipped => "skipped".to_owned(),
            Outcome::Failed(e) => format!("failed: {e}"),
        },
        "steps": r.steps,
        "total_steps": r.total_steps,
        "wall_s": r.wall.as_secs_f64(),
        "train_len": rc.train_len,
        "report_len": rc.eval_len,
        "scaled_accuracy_train": r.scaled_at(rc.train_len),
        "scaled_accuracy_report": r.scaled_at(rc.eval_len),
        "scaled_accuracy_report_trained": r.scaled_trained_at(rc.eval_len),
        "mix_sizes": [rc.mix_from, rc.eval_len],
        "scaled_accuracy_mix": Reading::Mix.scaled(r, quick),
        "products_factors": rc.eval_products,
        "products_accuracy": rc.eval_products.and_then(|k| r.products_accuracy(k)),
        "eval": scores_json(&r.eval),
        "eval_ema": (!r.eval_ema.is_empty()).then(|| scores_json(&r.eval_ema)),
        "last_train_loss": r.last_loss,
        "dynamics": r.dynamics,
        "dir": r.dir.display().to_string(),
    })
}

fn scores_json(scores: &[EvalResult]) -> Value {
    scores
        .iter()
        .map(|e| {
            json!({
                "set": e.label, "length": e.length, "loss": e.loss, "accuracy": e.accuracy,
                "count": e.count,
            })
        })
        .collect()
}

/// The table as JSON: every cell's numbers beside the paper's.
pub fn table_json(
    results: &[RunResult],
    tasks: &[Task],
    rotations: &[Rotation],
    quick: bool,
) -> Value {
    let cells: Vec<Value> = rotations
        .iter()
        .flat_map(|&r| tasks.iter().map(move |&t| (t, r)))
        .map(|(t, r)| {
            let c = cell(results, t, r, quick);
            let m = cell_of(results, t, r, quick, Reading::Mix);
            let rc = recipe(t, quick);
            json!({
                "task": t.name(), "rotation": r.name(), "model": row(r), "column": column(t),
                "report_len": rc.eval_len,
                "mean": c.map(|c| c.mean), "min": c.map(|c| c.min), "max": c.map(|c| c.max),
                "runs": c.map_or(0, |c| c.n), "paper": paper(t, r),
                "mix": {
                    "sizes": [rc.mix_from, rc.eval_len],
                    "mean": m.map(|c| c.mean), "min": m.map(|c| c.min), "max": m.map(|c| c.max),
                    "runs": m.map_or(0, |c| c.n),
                },
            })
        })
        .collect();
    json!({ "cells": cells })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReproError {
    let path = path.to_path_buf();
    move |source| ReproError::Io { path, source }
}

/// Training lines the merged metrics keep: one step in this many (each
/// run's own `metrics.jsonl` keeps them all).
pub const TRAIN_LINE_EVERY: u64 = 10;

/// Writes every run's `metrics.jsonl` into one file, each line tagged with
/// its run's name (`"run": "parity-data-s0"`): every evaluation and
/// dynamics line, and one training line in [`TRAIN_LINE_EVERY`] (a table's
/// worth of runs logs hundreds of thousands of steps).
pub fn merge_metrics(results: &[RunResult], path: &Path) -> Result<(), ReproError> {
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut out = std::io::BufWriter::new(file);
    for r in results {
        let src = r.dir.join(METRICS_FILE);
        let Ok(f) = std::fs::File::open(&src) else {
            continue;
        };
        for line in BufReader::new(f).lines() {
            let line = line.map_err(io(&src))?;
            let Ok(Value::Object(mut v)) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let step = v.get("step").and_then(Value::as_u64).unwrap_or(0);
            if v.get("kind") == Some(&json!("train")) && !step.is_multiple_of(TRAIN_LINE_EVERY) {
                continue;
            }
            v.insert("run".into(), json!(r.job.name()));
            writeln!(out, "{}", Value::Object(v)).map_err(io(path))?;
        }
    }
    out.flush().map_err(io(path))
}

/// One plot per task: the scaled accuracy at the reported length over
/// steps (the weight average's where a run kept one), one line per run, a
/// colour per rotation mode. Returns the files.
pub fn plots(
    results: &[RunResult],
    tasks: &[Task],
    dir: &Path,
    quick: bool,
) -> Result<Vec<PathBuf>, ReproError> {
    let mut written = Vec::new();
    for &task in tasks {
        let label = format!("len {}", recipe(task, quick).eval_len);
        let mut lines = Vec::new();
        for r in results.iter().filter(|r| r.job.task == task) {
            let Ok(series) = eval_accuracy(&r.dir) else {
                continue;
            };
            // The reported series: the weight average's when the run kept one.
            let key = if r.eval_ema.is_empty() {
                label.clone()
            } else {
                format!("{label} ema")
            };
            let Some(points) = series.get(&key) else {
                continue;
            };
            let group = match r.job.rotation {
                Rotation::Data => 0,
                Rotation::Fixed => 1,
                Rotation::None => 2,
            };
            lines.push(Line {
                label: row(r.job.rotation).to_owned(),
                group,
                points: points
                    .iter()
                    .map(|&(s, a)| (s, 100.0 * task.scaled_accuracy(a / 100.0)))
                    .collect(),
            });
        }
        let path = dir.join(format!("accuracy-{}.svg", task.name()));
        let title = format!(
            "{}: scaled accuracy at size {} over steps",
            column(task),
            recipe(task, quick).eval_len
        );
        // Below chance, scaled accuracy goes down to -chance / (1 - chance).
        let floor = 100.0 * task.scaled_accuracy(0.0);
        write_lines_plot(&path, &title, "scaled accuracy (%)", (floor, 100.0), &lines)
            .map_err(ReproError::Train)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::repro::runner::Job;

    /// A stopped arithmetic run of seed `seed` whose weight average logged
    /// `ema` (raw %) at 80 operands every 1000 steps from 1000, and whose
    /// trained weights logged 50% throughout.
    fn stopped(dir: &Path, seed: u64, ema: &[f64]) -> RunResult {
        let run_dir = dir.join(format!("s{seed}"));
        std::fs::create_dir_all(&run_dir).unwrap();
        let mut lines = String::new();
        for (k, a) in (1u32..).zip(ema) {
            let step = 1000 * k;
            for (kind, acc) in [("eval", 50.0), ("eval_ema", *a)] {
                let v =
                    json!({"kind": kind, "step": step, "set": "len 80", "accuracy": acc / 100.0});
                lines.push_str(&format!("{v}\n"));
            }
        }
        std::fs::write(run_dir.join(METRICS_FILE), lines).unwrap();
        RunResult {
            job: Job {
                task: Task::ModarithPrec,
                rotation: Rotation::Data,
                seed,
            },
            outcome: Outcome::Stopped,
            dir: run_dir,
            steps: u64::try_from(1000 * ema.len()).unwrap(),
            total_steps: 40_000,
            wall: Duration::ZERO,
            eval: Vec::new(),
            eval_ema: Vec::new(),
            dynamics: None,
            last_loss: None,
        }
    }

    #[test]
    fn a_screen_reads_which_stopped_runs_had_fitted() {
        let dir = tempfile::tempdir().unwrap();
        let runs = [
            // 94% raw (92.5 scaled) at step 2000: fitted there.
            stopped(dir.path(), 1, &[60.0, 94.0, 99.0]),
            // 91% at best (88.75 scaled): not fitted.
            stopped(dir.path(), 2, &[40.0, 80.0, 91.0]),
        ];
        // Read on the weight average: the trained weights' 50% fits nothing.
        let s = stopped_summary(&runs, &[Task::ModarithPrec], &[Rotation::Data], false);
        assert!(
            s.contains("- Arith w/o brackets, Mamba-3: 2 stopped at step 3000; 1 of them had fitted the training size (>= 92.5 scaled) (at steps 2000)"),
            "{s}"
        );
        let finished: Vec<RunResult> = runs
            .into_iter()
            .map(|r| RunResult {
                outcome: Outcome::Finished,
                ..r
            })
            .collect();
        assert_eq!(
            stopped_summary(&finished, &[Task::ModarithPrec], &[Rotation::Data], false),
            "",
            "nothing stopped, nothing to say"
        );
    }
}
