//! `stepgraph train` from the outside: a tiny run's files and summary, and
//! one clear line with exit code 1 (2 for usage errors) for each failure.

mod cli_common;

use cli_common::{ok, stepgraph};
use std::path::Path;
use std::process::Output;

/// Flags of a model and job small enough for a debug build, as (flag, value).
const TINY: &[(&str, &str)] = &[
    ("--d-model", "8"),
    ("--d-state", "8"),
    ("--headdim", "4"),
    ("--batch", "4"),
    ("--train-len", "4"),
    ("--eval-lens", "4,8"),
    ("--steps", "6"),
    ("--eval-every", "3"),
    ("--progress", "plain"),
];

/// `train` with the tiny flags, those named in `extra` replaced by its values
/// (and no task flags with `--data`).
fn tiny(extra: &[&str], cwd: &Path) -> Output {
    let mut args = vec!["train"];
    let file = extra.contains(&"--data");
    for &(flag, value) in TINY {
        let task_flag = matches!(flag, "--train-len" | "--eval-lens");
        let skip = extra.contains(&flag) || (file && task_flag);
        if !skip {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    stepgraph(&args, cwd)
}

/// A usage error as clap reports it: exit 2, an `error:` line naming the
/// problem, then (after the usage line, for some) the `--help` tip.
fn usage_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{stderr}");
    assert!(first.contains(needle), "`{needle}` not in: {stderr}");
    assert!(stderr.contains("try '--help'"), "{stderr}");
}

fn one_error_line(out: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    assert!(lines[0].starts_with("error"), "{stderr}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {stderr}");
}

#[test]
fn a_tiny_run_writes_metrics_plot_and_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiny(&["--run-dir", "r"], dir.path());
    let stdout = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `auto` trains on the GPU where one works, else says it fell back.
    assert!(
        stdout.contains("notice: no usable GPU") || stdout.contains("cuda graph f32"),
        "{stdout}"
    );
    assert!(stdout.contains("eval @ 3  len 4: loss"), "{stdout}");
    assert!(stdout.contains("done: step 6/6"), "{stdout}");
    assert!(
        stderr.contains("step 6/6  loss"),
        "plain progress lines off a terminal: {stderr}"
    );
    let run = dir.path().join("r");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.contains("\"kind\":\"train\""))
            .count(),
        6
    );
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.contains("\"kind\":\"eval\""))
            .count(),
        4
    );
    let svg = std::fs::read_to_string(run.join("plot.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    let ckpt = run.join("checkpoints/step-00000006");
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "train_state.json",
    ] {
        assert!(ckpt.join(f).is_file(), "{f}");
    }
}

#[test]
fn default_run_dir_is_under_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiny(&["--steps", "1", "--progress", "quiet"], dir.path());
    ok(&out);
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .collect();
    assert_eq!(runs.len(), 1);
}

#[test]
fn cuda_without_a_gpu_is_one_line() {
    if stepgraph::device::probe::driver_present() {
        // There is a driver here, so `--device cuda` may well train; the
        // refusal is only testable without one (as in CI).
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    one_error_line(&tiny(&["--device", "cuda"], dir.path()), 1, "--device cuda");
}

#[test]
fn bf16_on_the_cpu_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    one_error_line(
        &tiny(&["--precision", "bf16"], dir.path()),
        1,
        "bf16 needs a GPU",
    );
}

#[test]
fn an_unreadable_data_file_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    one_error_line(
        &tiny(&["--data", "missing.txt"], dir.path()),
        1,
        "cannot read data file missing.txt",
    );
}

#[test]
fn a_token_beyond_the_vocab_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u8> = (0..100u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
    std::fs::write(dir.path().join("tok.u32"), ids).unwrap();
    let args = [
        "--data",
        "tok.u32",
        "--data-format",
        "u32",
        "--vocab-size",
        "5",
        "--seq-len",
        "4",
    ];
    one_error_line(
        &tiny(&args, dir.path()),
        1,
        "token 5 has id 5, beyond the vocabulary",
    );
    let done = tiny(
        &[
            "--data",
            "tok.u32",
            "--data-format",
            "u32",
            "--vocab-size",
            "7",
            "--seq-len",
            "4",
        ],
        dir.path(),
    );
    ok(&done);
}

#[test]
fn a_flag_that_would_change_a_resumed_run_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        tiny(&["--run-dir", "r", "--steps", "2"], dir.path())
            .status
            .success()
    );
    let out = tiny(&["--resume", "r", "--d-model", "16"], dir.path());
    usage_error(
        &out,
        "--d-model: the run being resumed has `--d-model 8`, this command says `--d-model 16`",
    );
}

#[test]
fn a_resumed_run_keeps_its_chunk_size() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        tiny(&["--run-dir", "r", "--steps", "2"], dir.path())
            .status
            .success()
    );
    let out = tiny(&["--resume", "r", "--chunk-size", "8"], dir.path());
    usage_error(
        &out,
        "--chunk-size: the run being resumed has `--chunk-size 64`, this command says \
         `--chunk-size 8`",
    );
}

#[test]
fn a_resumed_run_keeps_its_dt_init() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        tiny(
            &["--run-dir", "r", "--steps", "2", "--dt-init", "0.02,0.05"],
            dir.path()
        )
        .status
        .success()
    );
    let config = dir.path().join("r/checkpoints/step-00000002/config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).expect("config.json"))
            .expect("config.json parses");
    assert_eq!(config["ssm_cfg"]["dt_min"], 0.02, "{config}");
    assert_eq!(config["ssm_cfg"]["dt_max"], 0.05, "{config}");
    let out = tiny(&["--resume", "r", "--dt-init", "0.01,0.1"], dir.path());
    usage_error(
        &out,
        "--dt-init: the run being resumed has `--dt-init 0.02,0.05`, this command says \
         `--dt-init 0.01,0.1`",
    );
}

#[test]
fn a_resumed_run_keeps_its_training_floor() {
    let dir = tempfile::tempdir().unwrap();
    let first = tiny(
        &["--run-dir", "r", "--steps", "2", "--train-min-len", "3"],
        dir.path(),
    );
    let stdout = ok(&first);
    assert!(stdout.contains("train sizes 3..=4"), "{stdout}");
    let out = tiny(&["--resume", "r", "--train-min-len", "2"], dir.path());
    usage_error(
        &out,
        "--train-min-len: the run being resumed has `--train-min-len 3`, this command says \
         `--train-min-len 2`",
    );
}

#[test]
fn a_resumed_run_keeps_its_curriculum_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = tiny(
        &[
            "--run-dir",
            "r",
            "--steps",
            "2",
            "--curriculum",
            "2",
            "--curriculum-start",
            "3",
        ],
        dir.path(),
    );
    let stdout = ok(&first);
    assert!(
        stdout.contains("largest size growing from 3 over 2 batches"),
        "{stdout}"
    );
    let out = tiny(
        &[
            "--resume",
            "r",
            "--curriculum",
            "2",
            "--curriculum-start",
            "2",
        ],
        dir.path(),
    );
    usage_error(
        &out,
        "--curriculum-start: the run being resumed has `--curriculum-start 3`, this command \
         says `--curriculum-start 2`",
    );
}

#[test]
fn a_fresh_run_probes_its_initial_dt_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    // Step 0's probe reads the initial weights: every head's dt drawn in
    // the --dt-init range (times the spread softplus(dd_dt + bias) adds).
    let probe0 = |name: &str, range: &str| {
        let out = tiny(
            &[
                "--device",
                "cpu",
                "--log-dynamics",
                "--run-dir",
                name,
                "--dt-init",
                range,
            ],
            dir.path(),
        );
        ok(&out);
        let text = std::fs::read_to_string(dir.path().join(name).join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        let first = lines.iter().position(|v| v["kind"] == "dynamics").unwrap();
        assert_eq!(lines[first]["step"], 0, "{}", lines[first]);
        assert!(
            lines[..first].iter().all(|v| v["kind"] != "train"),
            "the step-0 probe comes before any step"
        );
        let probes = lines.iter().filter(|v| v["kind"] == "dynamics").count();
        assert_eq!(probes, 3, "step 0 and the two evaluations (steps 3, 6)");
        lines[first]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["dt_mean"].as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    for dt in probe0("wide", "0.05,0.05") {
        assert!((0.02..0.12).contains(&dt), "{dt}");
    }
    for dt in probe0("narrow", "0.002,0.002") {
        assert!(dt < 0.006, "{dt}");
    }
}

/// The training losses a run logged, in step order.
fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|v| v["kind"] == "train")
        .map(|v| v["loss"].as_f64().expect("a loss"))
        .collect()
}

/// The training losses of a tiny CPU run in `dir/name` with `extra` flags,
/// which must succeed.
fn cpu_losses(dir: &Path, name: &str, extra: &[&str]) -> Vec<f64> {
    let mut args = vec!["--device", "cpu", "--run-dir", name];
    args.extend(extra);
    let out = tiny(&args, dir);
    ok(&out);
    losses(&dir.join(name))
}

#[test]
fn the_chunk_size_changes_the_schedule_not_the_math() {
    // Rows of 16 tokens: chunks of 3 split every row unevenly, 64 keeps it
    // whole; the chunked recurrence is exact, so only f32 rounding differs.
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, chunk: &str| {
        cpu_losses(
            dir.path(),
            name,
            &["--train-len", "16", "--chunk-size", chunk],
        )
    };
    let (short, whole) = (run("c3", "3"), run("c64", "64"));
    assert_eq!(short.len(), 6);
    assert_eq!(short.len(), whole.len());
    for (a, b) in short.iter().zip(&whole) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "{short:?} vs {whole:?}");
    }
    // The model's config.json (the official field) records the chunk.
    let config = dir.path().join("c3/checkpoints/step-00000006/config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).expect("config.json"))
            .expect("config.json parses");
    assert_eq!(config["ssm_cfg"]["chunk_size"], 3, "{config}");
}

#[test]
fn a_packed_run_says_so_and_trains_as_the_padded_one() {
    let dir = tempfile::tempdir().unwrap();
    let padded = cpu_losses(dir.path(), "padded", &["--batch", "6"]);
    let out = tiny(
        &[
            "--device",
            "cpu",
            "--run-dir",
            "packed",
            "--batch",
            "6",
            "--pack",
            "3",
        ],
        dir.path(),
    );
    let stdout = ok(&out);
    assert!(
        stdout.contains("(3 a row in 2 rows, each cut to the fullest)"),
        "{stdout}"
    );
    let packed = losses(&dir.path().join("packed"));
    assert_eq!(packed.len(), padded.len());
    for (a, b) in packed.iter().zip(&padded) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{packed:?} vs {padded:?}");
    }
    usage_error(&tiny(&["--pack", "0"], dir.path()), "--pack");
}

#[test]
fn adam_eps_reaches_the_optimizer_and_binds_a_resume() {
    // An epsilon far above every gradient turns each AdamW step into a
    // gradient step of lr / eps: the same first batch, then other weights.
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, eps: &str| cpu_losses(dir.path(), name, &["--adam-eps", eps]);
    let (usual, damped) = (run("usual", "1e-8"), run("damped", "10"));
    assert_eq!(usual.len(), 6);
    assert_eq!(usual[0], damped[0], "the first loss precedes any update");
    assert!(
        usual.iter().zip(&damped).skip(1).any(|(a, b)| a != b),
        "{usual:?} vs {damped:?}"
    );
    let out = tiny(
        &["--resume", "damped", "--steps", "8", "--adam-eps", "1e-8"],
        dir.path(),
    );
    usage_error(
        &out,
        "--adam-eps: the run being resumed has `--adam-eps 10`, this command says \
         `--adam-eps 0.00000001`",
    );
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    usage_error(&tiny(&["--batch", "0"], dir.path()), "--batch");
    usage_error(&tiny(&["--chunk-size", "0"], dir.path()), "--chunk-size");
    usage_error(
        &tiny(&["--dt-init", "0.1,0.01"], dir.path()),
        "--dt-init <MIN,MAX>': MIN 0.1 is above MAX 0.01",
    );
    usage_error(&tiny(&["--task", "sorting"], dir.path()), "sorting");
    usage_error(
        &tiny(&["--train-min-len", "5"], dir.path()),
        "--train-min-len: 5 is above --train-len 4",
    );
    usage_error(
        &tiny(&["--curriculum-start", "2"], dir.path()),
        "--curriculum-start: starts a curriculum: give --curriculum N",
    );
    usage_error(
        &tiny(
            &["--curriculum", "3", "--curriculum-start", "5"],
            dir.path(),
        ),
        "--curriculum-start: 5 is above --train-len 4",
    );
    usage_error(
        &tiny(&["--skewed-rows", "1.5"], dir.path()),
        "--skewed-rows <SKEWED_ROWS>': must lie between 0 and 1",
    );
    usage_error(
        &tiny(&["--task", "copy", "--skewed-rows", "0.5"], dir.path()),
        "--skewed-rows: skews the values and operators of a state-tracking row",
    );
    usage_error(
        &tiny(&["--init-from", "nowhere"], dir.path()),
        "--init-from: nowhere: ",
    );
    usage_error(
        &tiny(&["--init-from", "m", "--resume", "r"], dir.path()),
        "cannot be used with",
    );
    let mqar = ["--task", "mqar", "--eval-lens", "99"];
    usage_error(
        &tiny(&mqar, dir.path()),
        "--eval-lens: 99 is outside 1..=32",
    );
    assert!(
        !dir.path().join("runs").exists(),
        "no run directory is left"
    );
}

#[test]
fn stop_after_checkpoints_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiny(&["--run-dir", "r", "--stop-after", "3"], dir.path());
    let stdout = ok(&out);
    assert!(stdout.contains("stopped: step 3/6"), "{stdout}");
    assert!(
        stdout.contains("resume: stepgraph train --resume r"),
        "{stdout}"
    );
    let out = tiny(&["--resume", "r"], dir.path());
    let stdout = ok(&out);
    assert!(
        stdout.contains("resuming at 3") && stdout.contains("done: step 6/6"),
        "{stdout}"
    );
}
