//! `stepgraph repro state-tracking --merge DIR,DIR...`: one table from the
//! output directories of several partial reproductions.
//!
//! The whole table does not fit in one ten-minute GPU visit, so it is run in
//! parts (`--tasks`, `--rotations`, `--first-seed`); merging reads each
//! part's `table.json` (precision, quick, recipe overrides, wall time) and
//! `results.jsonl` (one run a line), and writes the files a single run of
//! the command writes, from the runs' own directories (`DIR/runs/NAME`,
//! wherever the part was moved). Parts must agree on precision, recipes and
//! quick mode. A run present in two parts is taken from the one where it
//! finished; finished in both, it is refused, since the table would count a
//! seed twice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::recipe::{self, Overrides};
use super::runner::{Job, Outcome, RunResult};
use super::{ReproError, ReproOptions, ReproReport, claim_out, invalid, io, report_runs};
use crate::Precision;
use crate::train::data::Task;
use crate::train::report::EvalResult;
use crate::train::{Device, Rotation};

/// What one part's `table.json` says about how it ran.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Header {
    pub(super) precision: Precision,
    pub(super) quick: bool,
    pub(super) overrides: Overrides,
    pub(super) wall: Duration,
    pub(super) jobs: usize,
    pub(super) device: Device,
    /// The table's selection, when its `table.json` names it (tables
    /// written before it did name only their cells).
    pub(super) selection: Option<Selection>,
}

/// The columns, rows and seeds a table was started with.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Selection {
    pub(super) tasks: Vec<Task>,
    pub(super) rotations: Vec<Rotation>,
    pub(super) seeds: Vec<u64>,
}

impl Selection {
    /// The columns, rows and seeds `runs` cover, in the table's order.
    pub(super) fn of(runs: &[RunResult]) -> Self {
        let mut seeds: Vec<u64> = runs.iter().map(|r| r.job.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        Self {
            tasks: recipe::COLUMNS
                .into_iter()
                .filter(|&t| runs.iter().any(|r| r.job.task == t))
                .collect(),
            rotations: recipe::ROTATIONS
                .into_iter()
                .filter(|&x| runs.iter().any(|r| r.job.rotation == x))
                .collect(),
            seeds,
        }
    }
}

/// The selection `table.json` records, if it records one whole.
fn selection(v: &Value, path: &Path) -> Result<Option<Selection>, ReproError> {
    let names = |key: &str| -> Option<Vec<&str>> {
        v.get(key)?.as_array()?.iter().map(Value::as_str).collect()
    };
    let (Some(tasks), Some(rotations), Some(seeds)) = (
        names("tasks"),
        names("rotations"),
        v.get("seeds")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>()),
    ) else {
        return Ok(None);
    };
    let task = |n: &str| Task::ALL.into_iter().find(|t| t.name() == n);
    let rotation = |n: &str| recipe::ROTATIONS.into_iter().find(|r| r.name() == n);
    Ok(Some(Selection {
        tasks: tasks
            .into_iter()
            .map(|n| task(n).ok_or_else(|| bad(path, format!("unknown task `{n}`"))))
            .collect::<Result<_, _>>()?,
        rotations: rotations
            .into_iter()
            .map(|n| rotation(n).ok_or_else(|| bad(path, format!("unknown rotation `{n}`"))))
            .collect::<Result<_, _>>()?,
        seeds,
    }))
}

fn bad(path: &Path, reason: impl Into<String>) -> ReproError {
    ReproError::Part {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read_json(path: &Path) -> Result<Value, ReproError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))
}

pub(super) fn header(dir: &Path) -> Result<Header, ReproError> {
    let path = dir.join("table.json");
    let v = read_json(&path)?;
    let precision = match v.get("precision").and_then(Value::as_str) {
        Some("f32") => Precision::F32,
        Some("bf16") => Precision::Bf16,
        other => {
            return Err(bad(
                &path,
                format!("precision {other:?} is not f32 or bf16"),
            ));
        }
    };
    let overrides = match v.get("overrides") {
        None | Some(Value::Null) => Overrides::of_an_early_table(),
        Some(o) => {
            serde_json::from_value(o.clone()).map_err(|e| bad(&path, format!("overrides: {e}")))?
        }
    };
    let wall = v.get("wall_s").and_then(Value::as_f64).unwrap_or(0.0);
    let device = match v.get("device").and_then(Value::as_str) {
        Some("cpu") => Device::Cpu,
        _ => Device::Cuda,
    };
    Ok(Header {
        selection: selection(&v, &path)?,
        device,
        precision,
        quick: v.get("quick").and_then(Value::as_bool).unwrap_or(false),
        overrides,
        wall: Duration::try_from_secs_f64(wall).map_err(|e| bad(&path, format!("wall_s: {e}")))?,
        jobs: v
            .get("jobs")
            .and_then(Value::as_u64)
            .and_then(|j| usize::try_from(j).ok())
            .unwrap_or(1),
    })
}

fn field<'a>(v: &'a Value, name: &str, path: &Path, line: usize) -> Result<&'a Value, ReproError> {
    v.get(name)
        .ok_or_else(|| bad(path, format!("line {line}: no `{name}`")))
}

fn text<'a>(v: &'a Value, name: &str, path: &Path, line: usize) -> Result<&'a str, ReproError> {
    field(v, name, path, line)?
        .as_str()
        .ok_or_else(|| bad(path, format!("line {line}: `{name}` is not a string")))
}

fn count(v: &Value, name: &str, path: &Path, line: usize) -> Result<u64, ReproError> {
    field(v, name, path, line)?
        .as_u64()
        .ok_or_else(|| bad(path, format!("line {line}: `{name}` is not a count")))
}

/// One line of `results.jsonl` back into a [`RunResult`] whose directory is
/// the part's `runs/NAME`.
fn run_result(v: &Value, dir: &Path, path: &Path, line: usize) -> Result<RunResult, ReproError> {
    let task_name = text(v, "task", path, line)?;
    let task = Task::ALL
        .into_iter()
        .find(|t| t.name() == task_name)
        .ok_or_else(|| bad(path, format!("line {line}: unknown task `{task_name}`")))?;
    let rotation_name = text(v, "rotation", path, line)?;
    let rotation = recipe::ROTATIONS
        .into_iter()
        .find(|r| r.name() == rotation_name)
        .ok_or_else(|| {
            bad(
                path,
                format!("line {line}: unknown rotation `{rotation_name}`"),
            )
        })?;
    let job = Job {
        task,
        rotation,
        seed: count(v, "seed", path, line)?,
    };
    let outcome = match text(v, "outcome", path, line)? {
        "finished" => Outcome::Finished,
        "stopped" => Outcome::Stopped,
        "skipped" => Outcome::Skipped,
        other => Outcome::Failed(other.strip_prefix("failed: ").unwrap_or(other).to_owned()),
    };
    let eval = scores(field(v, "eval", path, line)?, "eval", path, line)?;
    // Absent from tables written before the weight average existed.
    let eval_ema = match v.get("eval_ema") {
        None | Some(Value::Null) => Vec::new(),
        Some(list) => scores(list, "eval_ema", path, line)?,
    };
    let dynamics = match v.get("dynamics") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            serde_json::from_value(d.clone())
                .map_err(|e| bad(path, format!("line {line}: dynamics: {e}")))?,
        ),
    };
    let wall = v.get("wall_s").and_then(Value::as_f64).unwrap_or(0.0);
    Ok(RunResult {
        dir: dir.join("runs").join(job.name()),
        job,
        outcome,
        steps: count(v, "steps", path, line)?,
        total_steps: count(v, "total_steps", path, line)?,
        wall: Duration::try_from_secs_f64(wall)
            .map_err(|e| bad(path, format!("line {line}: wall_s: {e}")))?,
        eval,
        eval_ema,
        dynamics,
        last_loss: v.get("last_train_loss").and_then(Value::as_f64),
    })
}

/// An evaluation's list of set scores, as [`super::report`] writes it.
fn scores(
    list: &Value,
    key: &str,
    path: &Path,
    line: usize,
) -> Result<Vec<EvalResult>, ReproError> {
    list.as_array()
        .ok_or_else(|| bad(path, format!("line {line}: `{key}` is not a list")))?
        .iter()
        .map(|e| {
            let num = |k: &str| e.get(k).and_then(Value::as_f64);
            Some(EvalResult {
                label: e.get("set")?.as_str()?.to_owned(),
                length: e
                    .get("length")
                    .and_then(Value::as_u64)
                    .and_then(|l| usize::try_from(l).ok()),
                loss: num("loss")?,
                accuracy: num("accuracy")?,
                count: usize::try_from(e.get("count")?.as_u64()?).ok()?,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad(path, format!("line {line}: an `{key}` entry is incomplete")))
}

/// The runs of one output directory's `results.jsonl`. A resumed table
/// appends a later line for a run it continued, so the last line of a run
/// is the one that counts.
pub(super) fn results(dir: &Path) -> Result<Vec<RunResult>, ReproError> {
    let path = dir.join("results.jsonl");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let mut runs: Vec<RunResult> = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(l).map_err(|e| bad(&path, format!("line {}: {e}", i + 1)))?;
        let r = run_result(&v, dir, &path, i + 1)?;
        match runs.iter_mut().find(|x| x.job == r.job) {
            Some(earlier) => *earlier = r,
            None => runs.push(r),
        }
    }
    Ok(runs)
}

/// Adds `r` (from `part`) to `runs`, where `from[i]` is the part of
/// `runs[i]`: a finished run replaces an unfinished one of the same job.
fn add(
    runs: &mut Vec<RunResult>,
    from: &mut Vec<PathBuf>,
    r: RunResult,
    part: &Path,
) -> Result<(), ReproError> {
    let Some(i) = runs.iter().position(|x| x.job == r.job) else {
        runs.push(r);
        from.push(part.to_path_buf());
        return Ok(());
    };
    let finished = |x: &RunResult| x.outcome == Outcome::Finished;
    match (finished(&runs[i]), finished(&r)) {
        (true, true) => Err(invalid(
            "--merge",
            format!(
                "run {} finished in both {} and {}; merge each seed once",
                r.job.name(),
                from[i].display(),
                part.display()
            ),
        )),
        (false, true) => {
            runs[i] = r;
            from[i] = part.to_path_buf();
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Merges the output directories `parts` into `out` (default:
/// `runs/repro-state-tracking-<UTC timestamp>`); see the module docs.
pub fn merge(parts: &[PathBuf], out: Option<&Path>) -> Result<ReproReport, ReproError> {
    let Some(first) = parts.first() else {
        return Err(invalid("--merge", "name at least one output directory"));
    };
    let head = header(first)?;
    let (mut runs, mut from) = (Vec::new(), Vec::new());
    let mut wall = Duration::ZERO;
    let mut jobs = 0;
    for part in parts {
        let h = header(part)?;
        for (what, same) in [
            ("precision", h.precision == head.precision),
            ("quick mode", h.quick == head.quick),
            ("device", h.device == head.device),
            ("recipe overrides", h.overrides == head.overrides),
        ] {
            if !same {
                return Err(invalid(
                    "--merge",
                    format!(
                        "{} and {} differ in {what}; a table merges runs trained alike",
                        first.display(),
                        part.display()
                    ),
                ));
            }
        }
        wall += h.wall;
        jobs = jobs.max(h.jobs);
        for r in results(part)? {
            add(&mut runs, &mut from, r, part)?;
        }
    }
    let Selection {
        tasks,
        rotations,
        seeds,
    } = Selection::of(&runs);
    let out = claim_out(out)?;
    let opts = ReproOptions {
        seeds,
        precision: head.precision,
        device: head.device,
        out: Some(out.clone()),
        jobs,
        gpus: Vec::new(),
        quick: head.quick,
        tasks,
        rotations,
        time_limit: None,
        stop_after: None,
        overrides: head.overrides,
    };
    let note = format!(
        "Merged from {} parts ({}); the wall time is their sum.\n\n",
        parts.len(),
        parts
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let report = report_runs(&opts, out, runs, wall, opts.device, &note)?;
    super::write_results(&report.results, &report.out, opts.quick)?;
    Ok(report)
}
