//! Issue 18, problem 8: the README matches the binary and the repository.
//! Every command block of its Training section runs, in order, with tiny
//! sizes; every flag the section names exists; every repository path the
//! README names exists and none lies outside the repository. Also: `eval
//! --data` scores a checkpoint on the same held-out windows as `train`, and
//! the summary says what its losses are; the GPU test runner works on
//! staged binaries.

mod cli_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use cli_common::{ckpt_steps, ok, records, stepgraph, text};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// The text of one `## ` section.
fn section(text: &str, title: &str) -> String {
    let start = text
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_owned()
}

/// The commands of the ```sh blocks of `text`: continuation lines joined,
/// comments cut, the `cargo run --release --` / `stepgraph` prefix removed.
fn commands(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = line.trim() == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let code = line.split(" #").next().unwrap_or_default().trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        let cmd = std::mem::take(&mut pending);
        let cmd = cmd.trim();
        assert!(!cmd.contains(['"', '\'']), "quoting is not handled: {cmd}");
        let cmd = cmd
            .strip_prefix("cargo run --release -- ")
            .or_else(|| cmd.strip_prefix("stepgraph "))
            .unwrap_or_else(|| panic!("not a stepgraph command: {cmd}"));
        out.push(cmd.split_whitespace().map(str::to_owned).collect());
    }
    out
}

/// Tiny values for the size flags of a `train` command, and the ones it lacks.
fn tiny(mut args: Vec<String>, cwd: &Path) -> Vec<String> {
    let value = |flag: &str| -> Option<&str> {
        Some(match flag {
            "--steps" => "3",
            "--stop-after" => "1",
            "--batch" => "2",
            "--d-model" => "8",
            "--d-state" => "8",
            "--headdim" => "4",
            "--n-layer" => "1",
            "--train-len" => "4",
            "--eval-lens" => "4",
            "--seq-len" => "8",
            "--curriculum" => "2",
            "--eval-every" => "2",
            _ => return None,
        })
    };
    match args[0].as_str() {
        "train" if args.iter().any(|a| a == "--resume") => args,
        "train" => {
            for i in 1..args.len() {
                if let Some(v) = value(&args[i - 1]) {
                    args[i] = v.into();
                }
            }
            let mut extra = vec![
                "--d-model",
                "8",
                "--d-state",
                "8",
                "--headdim",
                "4",
                "--batch",
                "2",
                "--steps",
                "3",
                "--device",
                "cpu",
                "--progress",
                "quiet",
            ];
            if !args.iter().any(|a| a == "--data") {
                extra.extend(["--train-len", "4", "--eval-lens", "4"]);
            }
            for pair in extra.chunks(2) {
                if !args.iter().any(|a| a == pair[0]) {
                    args.extend(pair.iter().map(|s| (*s).to_owned()));
                }
            }
            args
        }
        "eval" => {
            // The README's checkpoint is the one its full-size run writes;
            // the tiny run stops at another step.
            for a in &mut args {
                let p = cwd.join(&*a);
                if a.contains("/checkpoints/step-") && !p.exists() {
                    let run = p.parent().and_then(Path::parent).unwrap();
                    let last = *ckpt_steps(run).last().expect("a checkpoint");
                    *a = format!(
                        "{}/step-{last:08}",
                        Path::new(a).parent().unwrap().display()
                    );
                }
            }
            args
        }
        other => panic!("unexpected command {other}"),
    }
}

#[test]
fn every_training_command_runs_with_tiny_sizes() {
    let cmds = commands(&section(&readme(), "Training"));
    assert!(cmds.len() >= 6, "{cmds:?}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(root().join("README.md"), dir.path().join("README.md")).unwrap();
    for cmd in cmds {
        let args = tiny(cmd, dir.path());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = stepgraph(&refs, dir.path());
        assert!(
            out.status.success(),
            "`stepgraph {}` failed:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // The stopped run was continued to its end.
    assert_eq!(ckpt_steps(&dir.path().join("runs/parity")), vec![1, 3]);
}

#[test]
fn every_flag_the_training_section_names_exists() {
    let text = section(&readme(), "Training").replace("cargo run --release --", "");
    let help: String = ["train", "eval"]
        .iter()
        .map(|c| text_of(&[c, "--help"]))
        .collect();
    let mut flags: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w[2..].starts_with(|c: char| c.is_ascii_lowercase()))
        .collect();
    flags.sort_unstable();
    flags.dedup();
    assert!(flags.len() > 30, "{flags:?}");
    for flag in flags {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "README names {flag}, which `stepgraph train/eval --help` does not have"
        );
    }
}

fn text_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stepgraph"))
        .args(args)
        .output()
        .unwrap();
    text(&out.stdout)
}

#[test]
fn every_path_the_readme_names_is_in_the_repository() {
    let text = readme();
    assert!(
        !text.contains("../shared"),
        "the README uses only what the repository has"
    );
    assert!(!text.contains("scripts/"), "scripts/ moved to tests/gpu/");
    let mut checked = 0;
    for word in text.split(|c: char| c.is_whitespace() || "`()[],;:".contains(c)) {
        let word = word.trim_end_matches('.');
        let is_path = [
            "tests/", "specs/", "kernels/", "runtime/", "macros/", ".ci/",
        ]
        .iter()
        .any(|p| word.starts_with(p));
        if !is_path {
            continue;
        }
        // The last component may hold one `*` (`specs/*.ron`).
        let (dir, name) = word.rsplit_once('/').unwrap_or((".", word));
        let (prefix, suffix) = name.split_once('*').unwrap_or((name, ""));
        let found = std::fs::read_dir(root().join(dir))
            .map(|rd| {
                rd.filter_map(Result::ok).any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(prefix) && n.ends_with(suffix)
                })
            })
            .unwrap_or(false);
        assert!(found, "README names {word}, which is not in the repository");
        checked += 1;
    }
    assert!(checked >= 5, "{checked} paths");
}

#[test]
fn eval_reads_a_data_file_and_agrees_with_trains_held_out_eval() {
    let dir = tempfile::tempdir().unwrap();
    let corpus: Vec<u8> = (0..4000usize)
        .map(|i| b"stepgraph trains mamba "[i * 5 % 23])
        .collect();
    std::fs::write(dir.path().join("c.txt"), corpus).unwrap();
    let args = [
        &["train"][..],
        cli_common::TINY_MODEL,
        &[
            "--steps",
            "4",
            "--data",
            "c.txt",
            "--seq-len",
            "16",
            "--run-dir",
            "r",
            "--progress",
            "plain",
        ],
    ]
    .concat();
    let stdout = ok(&stepgraph(&args, dir.path()));
    // The summary says what its losses are.
    assert!(
        stdout.contains("train loss ")
            && stdout.contains(" (mean of steps 1-2) -> ")
            && stdout.contains(" (mean of steps 3-4)"),
        "{stdout}"
    );
    let held_out = records(&dir.path().join("r"))
        .into_iter()
        .rfind(|v| v["kind"] == "eval")
        .unwrap()["loss"]
        .as_f64()
        .unwrap();
    let out = ok(&stepgraph(
        &[
            "eval",
            "--checkpoint",
            "r/checkpoints/step-00000004",
            "--data",
            "c.txt",
            "--seq-len",
            "16",
            "--precision",
            "f32",
        ],
        dir.path(),
    ));
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let loss = json["loss"].as_f64().unwrap();
    assert!(
        (loss - held_out).abs() <= 1e-5 * held_out,
        "eval --data {loss} vs train's held-out eval {held_out}"
    );
    // 400 held-out tokens (10% of 4000) make 23 windows of 17.
    assert_eq!(json["tokens"], 23 * 16);
}

#[test]
fn the_gpu_runner_runs_every_staged_binary_and_reports_failures() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join(".gpu/t");
    std::fs::create_dir_all(&t).unwrap();
    let fake = |name: &str, body: &str| {
        let p = t.join(name);
        std::fs::write(&p, format!("#!/bin/sh\necho \"args: $*\"\n{body}\n")).unwrap();
        Command::new("chmod").arg("+x").arg(&p).status().unwrap();
    };
    fake("good", "echo 'test result: ok. 2 passed; 0 failed'");
    fake(
        "bad",
        "echo 'test result: FAILED. 1 passed; 1 failed'; exit 101",
    );
    let out = Command::new("bash")
        .arg(root().join("tests/gpu/run-tests.sh"))
        .arg("some_filter")
        .current_dir(dir.path())
        .env("OUT", dir.path().join("out"))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("=== bad FAILED (rc=101)"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("good") && l.contains("rc=0") && l.contains("2 passed")),
        "{stdout}"
    );
    let log = std::fs::read_to_string(dir.path().join("out/gpu-tests.log")).unwrap();
    assert!(log.contains("args: --include-ignored some_filter"), "{log}");
    // Nothing staged: says how to stage.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root().join("tests/gpu/run-tests.sh"))
        .current_dir(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("bash tests/gpu/stage"));
}
