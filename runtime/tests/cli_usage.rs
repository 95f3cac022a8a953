//! Issue 18, problems 6 and 7: usage errors are clap's own (the argument
//! named, possible values, a did-you-mean, the subcommand list), exit code
//! 2; every model, size and value problem is reported against the flag the
//! user typed, before anything is allocated (an impossible model is refused
//! by the memory estimate in well under a second, not by the allocator).

mod cli_common;

use std::time::{Duration, Instant};

use cli_common::{stepgraph, text};

/// Runs `args` in a fresh directory and returns (exit code, stderr); no run
/// directory may be left behind by a usage error.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = stepgraph(args, dir.path());
    assert!(
        !dir.path().join("runs").exists(),
        "a refused run leaves no directory: {args:?}"
    );
    (out.status.code(), text(&out.stderr) + &text(&out.stdout))
}

fn usage(args: &[&str], needles: &[&str]) {
    let (code, out) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {out}");
    assert!(
        out.starts_with("error: ") || out.contains("Usage:"),
        "{out}"
    );
    for n in needles {
        assert!(out.contains(n), "{args:?}: `{n}` not in\n{out}");
    }
}

#[test]
fn problem_6_clap_names_the_argument_values_and_suggestions() {
    usage(
        &["init", "--out", "x", "--d-model", "8"],
        &[
            "required arguments were not provided",
            "--n-layer <N_LAYER>",
            "--vocab-size",
        ],
    );
    usage(
        &["train", "--task", "sorting"],
        &[
            "invalid value 'sorting' for '--task <TASK>'",
            "[possible values: parity, modarith, modarith-prec, modarith-brackets, modarith-brackets-nomult, copy, mqar]",
        ],
    );
    usage(
        &["train", "--stpes", "5"],
        &[
            "unexpected argument '--stpes'",
            "a similar argument exists: '--steps'",
        ],
    );
    usage(
        &["trian"],
        &[
            "unrecognized subcommand 'trian'",
            "a similar subcommand exists: 'train'",
        ],
    );
    usage(
        &[],
        &["Commands:", "train", "eval", "init", "check", "bench"],
    );
    usage(
        &["train", "--lr", "-1"],
        &["invalid value '-1' for '--lr <LR>': must be > 0"],
    );
    usage(
        &["train", "--data", "x.txt", "--train-len", "4"],
        &["'--data <DATA>' cannot be used with '--train-len <TRAIN_LEN>'"],
    );
}

#[test]
fn problem_6_model_sizes_are_reported_against_their_flags() {
    usage(
        &["train", "--d-model", "3"],
        &["error: --headdim: 16 must divide d_inner = --expand 2 x --d-model 3"],
    );
    usage(
        &["train", "--headdim", "128"],
        &["error: --headdim: 128 must divide d_inner = --expand 2 x --d-model 32"],
    );
    usage(
        &["train", "--d-state", "7"],
        &["error: --d-state: must be even"],
    );
    usage(
        &["train", "--d-model", "0"],
        &["invalid value '0' for '--d-model <D_MODEL>': must be at least 1"],
    );
}

#[test]
fn problem_7_sizes_and_values_are_checked_up_front() {
    let t = Instant::now();
    usage(
        &["train", "--d-model", "1000000", "--device", "cpu"],
        &[
            "error: memory: this run needs about",
            "available; lower --d-model",
        ],
    );
    usage(
        &[
            "train",
            "--device",
            "cpu",
            "--d-model",
            "2048",
            "--d-state",
            "128",
            "--headdim",
            "64",
            "--train-len",
            "4",
            "--eval-lens",
            "4,1000000",
        ],
        &["error: memory:", "lower --eval-lens"],
    );
    usage(
        &[
            "train",
            "--device",
            "cpu",
            "--d-model",
            "2048",
            "--d-state",
            "128",
            "--headdim",
            "64",
            "--batch",
            "4096",
            "--train-len",
            "100000",
            "--eval-lens",
            "4",
        ],
        &["error: memory:", "lower --batch/--train-len"],
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "refused before allocating: {:?}",
        t.elapsed()
    );
    usage(
        &["train", "--clip", "nan"],
        &["invalid value 'nan' for '--clip <CLIP>': must be a finite number"],
    );
    usage(
        &["train", "--clip=-1"],
        &["invalid value '-1' for '--clip <CLIP>': must be >= 0"],
    );
    usage(
        &["train", "--adam-eps", "0"],
        &["invalid value '0' for '--adam-eps <ADAM_EPS>': must be > 0"],
    );
    usage(
        &["train", "--beta2", "1"],
        &["invalid value '1' for '--beta2 <BETA2>': must lie strictly between 0 and 1"],
    );
    usage(
        &["train", "--lr", "0.001", "--min-lr", "0.01"],
        &["error: --min-lr: 0.01 is above --lr 0.001"],
    );
    usage(
        &["train", "--curriculum-gate", "0.5"],
        &["error: --curriculum-gate: gates a curriculum: give --curriculum N"],
    );
    usage(
        &["train", "--curriculum-gate=-1"],
        &["invalid value '-1' for '--curriculum-gate <CURRICULUM_GATE>': must be >= 0"],
    );
    usage(
        &["train", "--keep", "0"],
        &["invalid value '0' for '--keep <KEEP>': must be at least 1"],
    );
    usage(
        &["train", "--data", "README.md", "--vocab-size", "300"],
        &["error: --vocab-size: only for --data-format u16|u32 (bytes have vocabulary 256)"],
    );
    usage(
        &["train", "--data", "x.u16", "--data-format", "u16"],
        &["error: --vocab-size: required with --data-format u16"],
    );
    usage(
        &["train", "--vocab-size", "300"],
        &[
            "the following required arguments were not provided",
            "--data <DATA>",
        ],
    );
}
