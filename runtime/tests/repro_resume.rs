//! Issue 16: `stepgraph repro state-tracking --resume`. A table stopped in
//! the middle of a run and resumed ends exactly where the same table run
//! without a stop ends: the stopped run continues from its checkpoint, the
//! skipped one starts, and the files are rewritten in place.

use std::path::Path;
use std::time::Duration;

use stepgraph::Precision;
use stepgraph::repro::recipe::Overrides;
use stepgraph::repro::resume::{Next, next, resume};
use stepgraph::repro::runner::{Outcome, RunResult, Start};
use stepgraph::repro::{ReproOptions, ReproReport, state_tracking};
use stepgraph::train::data::Task;
use stepgraph::train::{Device, Rotation, Stop};

fn options(out: &Path, time_limit: Option<Duration>) -> ReproOptions {
    ReproOptions {
        seeds: vec![0],
        precision: Precision::F32,
        device: Device::Cpu,
        out: Some(out.to_path_buf()),
        jobs: 1,
        gpus: Vec::new(),
        quick: true,
        tasks: vec![Task::Parity],
        rotations: vec![Rotation::Data, Rotation::None],
        time_limit,
        stop_after: None,
        overrides: Overrides {
            steps: Some(60),
            ..Overrides::default()
        },
    }
}

fn outcome(results: &[RunResult], rotation: Rotation) -> &RunResult {
    results.iter().find(|r| r.job.rotation == rotation).unwrap()
}

/// Resumes the table in `dir`, keeping the lines it announces.
fn resume_logged(dir: &Path) -> (ReproReport, Vec<String>) {
    let lines = std::sync::Mutex::new(Vec::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_owned());
    let report = resume(dir, None, &[], None, None, &Stop::new(), &log).unwrap();
    (report, lines.into_inner().unwrap())
}

/// The two-run table trained in one go, in `dir/whole`: what a stopped and
/// resumed one must equal.
fn uninterrupted(dir: &Path) -> ReproReport {
    state_tracking(
        &options(&dir.join("whole"), None),
        &Stop::new(),
        &|_: &str| {},
    )
    .unwrap()
}

/// Both runs of `resumed` finished, with `whole`'s evaluations to the last
/// bit.
fn assert_ends_as(whole: &ReproReport, resumed: &ReproReport) {
    for rotation in [Rotation::Data, Rotation::None] {
        let (a, b) = (
            outcome(&whole.results, rotation),
            outcome(&resumed.results, rotation),
        );
        assert_eq!((&a.outcome, a.steps), (&Outcome::Finished, 60));
        assert_eq!((&b.outcome, b.steps), (&Outcome::Finished, 60));
        assert_eq!(a.eval.len(), b.eval.len());
        for (x, y) in a.eval.iter().zip(&b.eval) {
            assert_eq!(
                x.loss.to_bits(),
                y.loss.to_bits(),
                "{rotation:?}: {x:?} vs {y:?}"
            );
            assert_eq!(x.accuracy.to_bits(), y.accuracy.to_bits());
        }
    }
}

#[test]
fn a_stopped_table_resumed_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = |_: &str| {};
    let whole = uninterrupted(dir.path());
    // The time limit stops the first run (the data row) in its training;
    // the second never starts.
    let part_dir = dir.path().join("part");
    let limit = Some(Duration::from_millis(100));
    let part = state_tracking(&options(&part_dir, limit), &Stop::new(), &quiet).unwrap();
    let first = outcome(&part.results, Rotation::Data);
    assert_eq!(first.outcome, Outcome::Stopped, "{first:?}");
    assert!(first.steps < 60, "{first:?}");
    assert_eq!(
        outcome(&part.results, Rotation::None).outcome,
        Outcome::Skipped
    );
    assert_eq!(next(&first.outcome, &first.dir), Next::Train(Start::Resume));

    let (resumed, lines) = resume_logged(&part_dir);
    assert!(
        lines[0].contains("2 of 2 runs to train (1 to continue from a checkpoint)"),
        "{lines:?}"
    );
    assert_eq!(resumed.results.len(), 2);
    assert_ends_as(&whole, &resumed);
    // The files say the same: one line per run, each finished.
    let jsonl = std::fs::read_to_string(part_dir.join("results.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 2, "{jsonl}");
    assert!(
        jsonl
            .lines()
            .all(|l| l.contains("\"outcome\":\"finished\"")),
        "{jsonl}"
    );
    let md = std::fs::read_to_string(part_dir.join("table.md")).unwrap();
    assert!(md.contains("Resumed in"), "{md}");
    assert_eq!(
        md,
        md.replace("stopped", ""),
        "no run is left stopped:\n{md}"
    );

    // Resuming a finished table trains nothing and keeps it.
    let again = resume(&part_dir, None, &[], None, None, &Stop::new(), &quiet).unwrap();
    assert!(again.results.iter().all(|r| r.outcome == Outcome::Finished));
}

#[test]
fn a_screen_stops_every_run_at_its_step_and_a_resume_goes_on_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = |_: &str| {};
    let whole = uninterrupted(dir.path());
    let screen_dir = dir.path().join("screen");
    let mut o = options(&screen_dir, None);
    o.stop_after = Some(20);
    let screen = state_tracking(&o, &Stop::new(), &quiet).unwrap();
    // Every run trains (none is skipped, as under a time limit) and stops
    // at the step, checkpointed.
    for r in &screen.results {
        assert_eq!((&r.outcome, r.steps), (&Outcome::Stopped, 20), "{r:?}");
        assert_eq!(next(&r.outcome, &r.dir), Next::Train(Start::Resume));
    }
    // A resume that stops at the same step trains no further.
    let held = resume(&screen_dir, None, &[], None, Some(20), &Stop::new(), &quiet).unwrap();
    assert!(
        held.results
            .iter()
            .all(|r| (&r.outcome, r.steps) == (&Outcome::Stopped, 20)),
        "{:?}",
        held.results
    );
    // One without it finishes them, bit for bit as the uninterrupted table.
    let (done, _) = resume_logged(&screen_dir);
    assert_ends_as(&whole, &done);
}

#[test]
fn a_table_killed_outright_resumes_from_its_provisional_table_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let quiet = |_: &str| {};
    let mut o = options(&out, None);
    o.overrides = Overrides::default();
    // A stop before the first run: every run skipped, then the process
    // "dies": its results and table are lost, the provisional header and one
    // run's half-written directory remain.
    let stop = Stop::new();
    stop.request();
    state_tracking(&o, &stop, &quiet).unwrap();
    std::fs::remove_file(out.join("results.jsonl")).unwrap();
    let head = serde_json::json!({
        "precision": "f32", "device": "cpu", "tasks": ["parity"], "rotations": ["data", "none"],
        "seeds": [0], "quick": true, "jobs": 1, "wall_s": 0.0, "overrides": null,
        "complete": false,
    });
    std::fs::write(out.join("table.json"), head.to_string()).unwrap();
    let junk = out.join("runs/parity-none-s0");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("metrics.jsonl"), "{}\n").unwrap();

    let (r, lines) = resume_logged(&out);
    assert!(
        lines[0].contains("1 of 2 runs to train (0 to continue"),
        "{lines:?}"
    );
    assert!(lines[1].contains("parity-none-s0"), "{lines:?}");
    assert_eq!(
        outcome(&r.results, Rotation::Data).outcome,
        Outcome::Finished
    );
    let none = outcome(&r.results, Rotation::None);
    assert!(
        matches!(&none.outcome, Outcome::Failed(e) if e.contains("process ended")),
        "{none:?}"
    );
}

#[test]
fn what_a_run_needs_follows_its_outcome_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let used = dir.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("metrics.jsonl"), "{}\n").unwrap();
    let saved = dir.path().join("saved");
    std::fs::create_dir_all(saved.join("checkpoints/step-00000010")).unwrap();
    let failed = Outcome::Failed("boom".into());
    assert_eq!(next(&Outcome::Finished, &saved), Next::Keep);
    assert_eq!(next(&Outcome::Stopped, &saved), Next::Train(Start::Resume));
    assert_eq!(next(&failed, &saved), Next::Train(Start::Resume));
    assert_eq!(next(&Outcome::Skipped, &absent), Next::Train(Start::Fresh));
    assert_eq!(next(&failed, &empty), Next::Train(Start::Fresh));
    assert_eq!(next(&failed, &used), Next::Stuck);
    assert_eq!(next(&Outcome::Stopped, &used), Next::Stuck);
}

#[test]
fn a_directory_that_is_no_table_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = resume(
        dir.path(),
        None,
        &[],
        None,
        None,
        &Stop::new(),
        &|_: &str| {},
    )
    .unwrap_err();
    assert_eq!(e.exit_code(), 1);
    assert!(e.to_string().contains("table.json"), "{e}");
}
