//! Issue 18, problem 4: `--resume DIR` continues the run saved in DIR, with
//! its own settings. Nothing typed again is needed; a typed flag that would
//! change the run is refused naming it, one that may change is logged; a
//! finished run says so and trains nothing; a `--data` run needs its data,
//! not its flags, and refuses a changed file; resuming an older checkpoint
//! never leaves a step twice in the metrics. And: a damaged newest
//! checkpoint makes `--resume` fall back to the newest intact one, saying so.

mod cli_common;

use std::path::Path;

use cli_common::{
    assert_same_state, ckpt, ckpt_steps, ok, records, stepgraph, text, train, train_steps,
};

/// A run that differs from the defaults in every schedule and data setting.
const JOB: &[&str] = &[
    "--task",
    "modarith",
    "--train-len",
    "3",
    "--eval-lens",
    "3,5",
    "--lr",
    "0.01",
    "--min-lr",
    "0.001",
    "--warmup",
    "3",
    "--seed",
    "3",
    "--clip",
    "0.5",
    "--decay",
    "all",
    "--weight-decay",
    "0.05",
    "--eval-every",
    "4",
    "--steps",
    "12",
];

fn job(extra: &[&str], cwd: &Path) -> std::process::Output {
    let mut args = vec!["train"];
    args.extend_from_slice(cli_common::TINY_MODEL);
    args.extend(["--progress", "quiet"]);
    args.extend_from_slice(JOB);
    args.extend_from_slice(extra);
    stepgraph(&args, cwd)
}

#[test]
fn problem_4_resume_alone_continues_the_saved_run_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    ok(&job(&["--run-dir", "whole"], dir.path()));
    ok(&job(
        &["--run-dir", "split", "--stop-after", "5"],
        dir.path(),
    ));
    let out = stepgraph(&["train", "--resume", "split"], dir.path());
    let stdout = ok(&out);
    assert!(stdout.contains("resuming at 5"), "{stdout}");
    assert!(stdout.contains("done: step 12/12"), "{stdout}");
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    assert_same_state(&ckpt(&whole, 12), &ckpt(&split, 12));
    let strip = |run: &Path| {
        records(run)
            .into_iter()
            .filter(|v| v["kind"] != "resume")
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&whole), strip(&split), "same losses, lrs and evals");
}

#[test]
fn problem_4_a_finished_run_says_so_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    ok(&train(&["--run-dir", "r", "--steps", "3"], dir.path()));
    let run = dir.path().join("r");
    let before = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let out = stepgraph(&["train", "--resume", "r"], dir.path());
    let stdout = ok(&out);
    assert!(
        stdout.starts_with("run r is already finished: step 3/3, nothing to train"),
        "{stdout}"
    );
    assert!(!stdout.contains("tok/s"), "{stdout}");
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), before);
    assert_eq!(ckpt_steps(&run), vec![3]);
    // Extending it is a logged change, and trains the new steps only.
    let stdout = ok(&stepgraph(
        &["train", "--resume", "r", "--steps", "5"],
        dir.path(),
    ));
    assert!(
        stdout.contains("resume: --steps 5 (was --steps 3)"),
        "{stdout}"
    );
    assert_eq!(train_steps(&run), vec![1, 2, 3, 4, 5]);
    let resume = records(&run)
        .into_iter()
        .find(|v| v["kind"] == "resume")
        .unwrap();
    assert_eq!(resume["changes"][0]["to"], "--steps 5");
}

#[test]
fn problem_4_a_changing_flag_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    ok(&job(&["--run-dir", "r", "--stop-after", "2"], dir.path()));
    for (flag, value) in [
        ("--lr", "0.1"),
        ("--seed", "4"),
        ("--task", "parity"),
        ("--batch", "8"),
    ] {
        let out = stepgraph(&["train", "--resume", "r", flag, value], dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: {flag}: the run being resumed has `{flag} "
            )),
            "{stderr}"
        );
    }
    // Typing the run's own values again is fine.
    ok(&stepgraph(
        &[
            "train",
            "--resume",
            "r",
            "--lr",
            "0.01",
            "--task",
            "modarith",
            "--progress",
            "quiet",
        ],
        dir.path(),
    ));
}

#[test]
fn problem_4_a_data_run_resumes_without_its_data_flags_and_refuses_other_data() {
    let dir = tempfile::tempdir().unwrap();
    let text_bytes: Vec<u8> = (0..3000usize).map(|i| b"abcdefgh "[i * 7 % 9]).collect();
    std::fs::write(dir.path().join("corpus.txt"), &text_bytes).unwrap();
    let data = ["--data", "corpus.txt", "--seq-len", "8", "--steps", "6"];
    let file_job = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--device",
            "cpu",
            "--d-model",
            "8",
            "--d-state",
            "8",
        ];
        args.extend(["--headdim", "4", "--batch", "4", "--progress", "quiet"]);
        args.extend_from_slice(&data);
        args.extend_from_slice(extra);
        stepgraph(&args, dir.path())
    };
    ok(&file_job(&["--run-dir", "whole"]));
    ok(&file_job(&["--run-dir", "split", "--stop-after", "2"]));
    ok(&stepgraph(&["train", "--resume", "split"], dir.path()));
    assert_same_state(
        &ckpt(&dir.path().join("whole"), 6),
        &ckpt(&dir.path().join("split"), 6),
    );

    ok(&file_job(&["--run-dir", "moved", "--stop-after", "2"]));
    std::fs::rename(
        dir.path().join("corpus.txt"),
        dir.path().join("elsewhere.txt"),
    )
    .unwrap();
    let out = stepgraph(&["train", "--resume", "moved"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("give its new path with --data"),
        "{}",
        text(&out.stderr)
    );
    let stdout = ok(&stepgraph(
        &[
            "train",
            "--resume",
            "moved",
            "--data",
            "elsewhere.txt",
            "--stop-after",
            "4",
        ],
        dir.path(),
    ));
    assert!(stdout.contains("resume: --data "), "{stdout}");

    let mut changed = text_bytes;
    changed[100] = b'z';
    std::fs::write(dir.path().join("elsewhere.txt"), &changed).unwrap();
    let out = stepgraph(&["train", "--resume", "moved"], dir.path());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("changed since the run started"), "{stderr}");
}

#[test]
fn problem_4_resuming_an_older_checkpoint_never_holds_a_step_twice() {
    let dir = tempfile::tempdir().unwrap();
    ok(&train(
        &[
            "--run-dir",
            "r",
            "--steps",
            "8",
            "--checkpoint-every",
            "4",
            "--eval-every",
            "2",
        ],
        dir.path(),
    ));
    let run = dir.path().join("r");
    let older = ckpt(&run, 4);
    let stdout = ok(&stepgraph(
        &["train", "--resume", older.to_str().unwrap()],
        dir.path(),
    ));
    assert!(
        stdout.contains("moved step-00000008 (past step 4)"),
        "{stdout}"
    );
    assert_eq!(train_steps(&run), (1..=8).collect::<Vec<_>>());
    let evals: Vec<u64> = records(&run)
        .iter()
        .filter(|v| v["kind"] == "eval" && v["set"] == "len 4")
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, vec![2, 4, 6, 8]);
    // The abandoned continuation is kept, and equals the new one.
    let abandoned = std::fs::read_dir(run.join("abandoned"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_same_state(&abandoned.path().join("step-00000008"), &ckpt(&run, 8));
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one() {
    let dir = tempfile::tempdir().unwrap();
    let steps = ["--steps", "6", "--checkpoint-every", "2", "--keep", "3"];
    let mut whole = vec!["--run-dir", "whole"];
    whole.extend(steps);
    ok(&train(&whole, dir.path()));
    for (name, damage) in [
        ("bitflip", "model.safetensors"),
        ("torn", "train_state.json"),
    ] {
        let mut args = vec!["--run-dir", name, "--stop-after", "4"];
        args.extend(steps);
        ok(&train(&args, dir.path()));
        let run = dir.path().join(name);
        assert_eq!(ckpt_steps(&run), vec![2, 4]);
        let file = ckpt(&run, 4).join(damage);
        let mut bytes = std::fs::read(&file).unwrap();
        if damage == "train_state.json" {
            bytes.truncate(bytes.len() / 2);
        } else {
            let mid = bytes.len() - 9;
            bytes[mid] ^= 0x10;
        }
        std::fs::write(&file, bytes).unwrap();
        let out = stepgraph(&["train", "--resume", name], dir.path());
        ok(&out);
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "warning: checkpoint {name}/checkpoints/step-00000004 is unusable ("
            )) && stderr.contains(&format!(
                "resuming from {name}/checkpoints/step-00000002, the newest intact one"
            )),
            "{stderr}"
        );
        assert_same_state(&ckpt(&dir.path().join("whole"), 6), &ckpt(&run, 6));
        assert_eq!(train_steps(&run), (1..=6).collect::<Vec<_>>());
    }
    // Naming the damaged checkpoint itself is an error, not a silent fallback.
    let out = stepgraph(
        &["train", "--resume", "whole/checkpoints/step-00000006"],
        dir.path(),
    );
    assert!(out.status.success(), "an intact one resumes (finished)");
    let file = ckpt(&dir.path().join("whole"), 6).join("optimizer.safetensors");
    std::fs::write(&file, b"not a safetensors file").unwrap();
    let out = stepgraph(
        &["train", "--resume", "whole/checkpoints/step-00000006"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("optimizer.safetensors does not match its checksum"));
}
