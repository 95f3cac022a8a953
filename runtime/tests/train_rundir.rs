//! Issue 18, problems 1-3: a run directory belongs to one run. Reusing one is
//! refused with a message saying how to resume it (problem 1), runs started
//! together never share `runs/<timestamp>` (problem 2), and `init --out`
//! never mixes a fresh checkpoint with an old one's files (problem 3).

mod cli_common;

use std::path::Path;

use cli_common::{ckpt, ckpt_steps, ok, records, stepgraph, text, train, train_steps};

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn problem_1_a_reused_run_dir_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    ok(&train(
        &["--run-dir", "r", "--steps", "10", "--checkpoint-every", "5"],
        dir.path(),
    ));
    let run = dir.path().join("r");
    let before = (
        std::fs::read(run.join("metrics.jsonl")).unwrap(),
        ckpt_steps(&run),
    );
    assert_eq!(before.1, vec![5, 10]);
    let out = train(&["--run-dir", "r", "--steps", "5"], dir.path());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: --run-dir r: already holds a run; continue it with `stepgraph train --resume r`"
        ),
        "{stderr}"
    );
    assert_eq!(
        (
            std::fs::read(run.join("metrics.jsonl")).unwrap(),
            ckpt_steps(&run)
        ),
        before,
        "the old run is untouched"
    );
    // An empty directory (made by mktemp -d, say) is a fine run directory.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    ok(&train(&["--run-dir", "empty", "--steps", "2"], dir.path()));
    assert_eq!(ckpt_steps(&dir.path().join("empty")), vec![2]);
}

#[test]
fn problem_1_pruning_never_removes_a_newer_checkpoint() {
    // A checkpoint resumed from an older step, with --keep 1: the run's
    // newer checkpoints move aside, never get pruned in favour of the old.
    let dir = tempfile::tempdir().unwrap();
    ok(&train(
        &[
            "--run-dir",
            "r",
            "--steps",
            "9",
            "--checkpoint-every",
            "3",
            "--keep",
            "3",
        ],
        dir.path(),
    ));
    let run = dir.path().join("r");
    let older = ckpt(&run, 3);
    let out = stepgraph(
        &[
            "train",
            "--resume",
            older.to_str().unwrap(),
            "--keep",
            "1",
            "--stop-after",
            "4",
        ],
        dir.path(),
    );
    ok(&out);
    assert_eq!(
        ckpt_steps(&run),
        vec![4],
        "the new run's checkpoint is kept"
    );
    let abandoned = std::fs::read_dir(run.join("abandoned"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        files(&abandoned.path()),
        vec!["metrics.jsonl", "step-00000006", "step-00000009"],
        "the newer checkpoints and their metrics moved aside, not deleted"
    );
}

#[test]
fn problem_2_runs_started_together_get_their_own_directories() {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            cli_common::bin()
                .arg("train")
                .args(cli_common::TINY)
                .args(["--steps", "4"])
                .current_dir(dir.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        ok(&child.wait_with_output().unwrap());
    }
    let runs = files(&dir.path().join("runs"));
    assert_eq!(runs.len(), 3, "{runs:?}");
    for name in runs {
        let run = dir.path().join("runs").join(&name);
        assert_eq!(
            train_steps(&run),
            vec![1, 2, 3, 4],
            "{name}: one run's metrics"
        );
        assert_eq!(ckpt_steps(&run), vec![4], "{name}");
    }
}

#[test]
fn problem_3_init_never_mixes_old_and_new_files() {
    let dir = tempfile::tempdir().unwrap();
    ok(&train(&["--run-dir", "r", "--steps", "2"], dir.path()));
    let target = ckpt(&dir.path().join("r"), 2);
    let t = target.to_str().unwrap();
    let before = files(&target);
    let init = |extra: &[&str]| {
        let mut args = vec![
            "init",
            "--out",
            t,
            "--d-model",
            "16",
            "--n-layer",
            "1",
            "--vocab-size",
            "4",
            "--d-state",
            "8",
            "--headdim",
            "8",
        ];
        args.extend_from_slice(extra);
        stepgraph(&args, dir.path())
    };
    let out = init(&[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not empty (it holds config.json"),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(files(&target), before, "untouched");

    ok(&init(&["--force"]));
    assert_eq!(
        files(&target),
        vec!["config.json", "model.safetensors"],
        "replaced whole: no optimizer or train state of the old run is left"
    );
    assert!(
        files(target.parent().unwrap())
            .iter()
            .all(|n| !n.starts_with('.')),
        "no temporary directory is left"
    );
    // The fresh checkpoint is not mistaken for a training checkpoint.
    let out = stepgraph(&["train", "--resume", t], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no checkpoint here"),
        "{}",
        text(&out.stderr)
    );
    assert!(records(&dir.path().join("r")).len() > 1);
}
