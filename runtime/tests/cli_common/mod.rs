//! Helpers shared by the tests that run the built `stepgraph` binary: tiny
//! flags, running it, reading a run's metrics and checkpoint files.

#![allow(dead_code, reason = "each test binary uses its own subset")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stepgraph"))
}

/// Runs `stepgraph ARGS` in `cwd`.
pub fn stepgraph(args: &[&str], cwd: &Path) -> Output {
    bin()
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run stepgraph")
}

/// A model small enough for a debug build, on the CPU (no task flags: a
/// `--data` run may not take them).
pub const TINY_MODEL: &[&str] = &[
    "--device",
    "cpu",
    "--d-model",
    "8",
    "--d-state",
    "8",
    "--headdim",
    "4",
    "--batch",
    "4",
];

/// A model and job small enough for a debug build: [`TINY_MODEL`] plus
/// these task flags.
pub const TINY: &[&str] = &[
    "--device",
    "cpu",
    "--d-model",
    "8",
    "--d-state",
    "8",
    "--headdim",
    "4",
    "--batch",
    "4",
    "--train-len",
    "4",
    "--eval-lens",
    "4,8",
    "--progress",
    "quiet",
];

/// `train` with the tiny flags and `extra`.
pub fn train(extra: &[&str], cwd: &Path) -> Output {
    let mut args = vec!["train"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    stepgraph(&args, cwd)
}

/// Text of an output stream.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Panics with both streams unless the command exited 0.
pub fn ok(out: &Output) -> String {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status.code()
    );
    stdout
}

/// The checkpoint directory of `step` in run `run`.
pub fn ckpt(run: &Path, step: u64) -> PathBuf {
    run.join("checkpoints").join(format!("step-{step:08}"))
}

/// Steps of the checkpoints a run holds, oldest first.
pub fn ckpt_steps(run: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(run.join("checkpoints"))
        .map(|rd| {
            rd.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("step-")?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// The bytes of the model and optimizer files of a checkpoint.
pub fn state_bytes(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let read = |f: &str| {
        std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
    };
    (read("model.safetensors"), read("optimizer.safetensors"))
}

/// Asserts that two checkpoints hold byte-identical weights and moments.
pub fn assert_same_state(a: &Path, b: &Path) {
    let (ma, oa) = state_bytes(a);
    let (mb, ob) = state_bytes(b);
    assert!(
        ma == mb,
        "model.safetensors differs: {} vs {}",
        a.display(),
        b.display()
    );
    assert!(
        oa == ob,
        "optimizer.safetensors differs: {} vs {}",
        a.display(),
        b.display()
    );
}

/// The metrics records of a run, without their timing fields.
pub fn records(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            if let Some(o) = v.as_object_mut() {
                o.remove("elapsed_s");
                o.remove("tokens_per_s");
            }
            v
        })
        .collect()
}

/// The steps of a run's train records, in file order.
pub fn train_steps(run: &Path) -> Vec<u64> {
    records(run)
        .iter()
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| v["step"].as_u64())
        .collect()
}
