//! Issue 16: `stepgraph repro state-tracking` end to end on the CPU with the
//! smoke-test recipes (every cell of the table, the table beside the paper's
//! numbers, the files it promises), its usage errors, and `train
//! --rotation`.

mod cli_common;

use cli_common::{TINY, stepgraph, text};
use serde_json::Value;

#[test]
fn the_quick_table_runs_end_to_end_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = quick_table(dir.path(), &[]);
    for needle in [
        "[  9/9]",
        "| model | Parity | Arith w/o brackets | Arith w/ brackets |",
        "| Mamba-3 | ",
        "(paper 100.00)",
        "| Mamba-3 w/ standard RoPE | ",
        "(paper 20.70)",
        "| Mamba-3 w/o RoPE | ",
        "(paper 0.72)",
        "wall time",
    ] {
        assert!(stdout.contains(needle), "`{needle}` not in\n{stdout}");
    }
    let t = dir.path().join("table");
    for f in [
        "table.md",
        "table.json",
        "results.jsonl",
        "metrics.jsonl",
        "accuracy-parity.svg",
        "accuracy-modarith-prec.svg",
        "accuracy-modarith-brackets.svg",
        "runs/parity-fixed-s0/metrics.jsonl",
        "runs/modarith-brackets-none-s0/plot.svg",
    ] {
        assert!(t.join(f).is_file(), "{f} missing");
    }
    let table: Value =
        serde_json::from_str(&std::fs::read_to_string(t.join("table.json")).unwrap()).unwrap();
    let cells = table["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 9);
    assert!(
        cells
            .iter()
            .all(|c| c["runs"] == 1 && c["mean"].is_number())
    );
    let results = std::fs::read_to_string(t.join("results.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 9);
    for line in results.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["outcome"], "finished", "{line}");
        assert!(r["dynamics"]["layers"].is_array(), "{line}");
    }
    // Every run's metrics, tagged with the run, dynamics probes included.
    let metrics = std::fs::read_to_string(t.join("metrics.jsonl")).unwrap();
    let tagged: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(tagged.iter().all(|v| v["run"].is_string()));
    assert!(
        tagged
            .iter()
            .any(|v| v["kind"] == "dynamics" && v["run"] == "modarith-prec-data-s0")
    );
    let md = std::fs::read_to_string(t.join("table.md")).unwrap();
    assert!(
        md.contains("## Runs") && md.contains("parity-none-s0"),
        "{md}"
    );
    // The runs table gives each layer's mean dt, one per layer of the
    // three-layer arithmetic model, each a positive number.
    let line = md
        .lines()
        .find(|l| l.starts_with("| modarith-prec-data-s0 |"))
        .unwrap_or_else(|| panic!("no arithmetic run line in\n{md}"));
    let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(cells.len(), 17, "{line}");
    // The sources' mixed sizes, scored beside the reported size, and the
    // zero-free products probe of the column.
    assert!(cells[6].parse::<f64>().is_ok(), "{line}");
    assert!(cells[7].ends_with(" @8"), "{line}");
    let probe: f64 = cells[7].trim_end_matches(" @8").parse().unwrap();
    assert!((0.0..=100.0).contains(&probe), "{line}");
    assert!(md.contains("sources' validation protocol"), "{md}");
    let dts: Vec<f64> = cells[13]
        .split(" / ")
        .map(|v| v.parse().unwrap_or_else(|_| panic!("dt `{v}` in {line}")))
        .collect();
    assert_eq!(dts.len(), 3, "{line}");
    assert!(dts.iter().all(|&d| d > 0.0 && d.is_finite()), "{line}");
    // Then when it cleared chance at its training size (a step, or never)
    // and how often it fell back.
    assert!(
        cells[14] == "never" || cells[14].parse::<u64>().is_ok(),
        "{line}"
    );
    assert!(cells[15].parse::<usize>().is_ok(), "{line}");
    // And when its weight average all but fitted that size: never before
    // it started, since fitting is far above chance.
    match (cells[14].parse::<u64>(), cells[16].parse::<u64>()) {
        (_, Err(_)) => assert_eq!(cells[16], "never", "{line}"),
        (Ok(started), Ok(fitted)) => assert!(fitted >= started, "{line}"),
        (Err(_), Ok(_)) => panic!("fitted but never started: {line}"),
    }
}

#[test]
fn the_bracketed_column_without_times_runs_beside_the_papers_number() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = quick_table(
        dir.path(),
        &[
            "--tasks",
            "modarith-brackets,modarith-brackets-nomult",
            "--rotations",
            "data",
        ],
    );
    assert!(
        stdout.contains("| model | Arith w/ brackets | Arith w/ brackets, + - only |"),
        "{stdout}"
    );
    // Beside both readings: the table at the reported size and on the
    // sources' mixed sizes.
    assert_eq!(stdout.matches("(paper 87.75)").count(), 4, "{stdout}");
    let t = dir.path().join("table");
    for f in [
        "accuracy-modarith-brackets-nomult.svg",
        "runs/modarith-brackets-nomult-data-s0/metrics.jsonl",
    ] {
        assert!(t.join(f).is_file(), "{f} missing");
    }
    let md = std::fs::read_to_string(t.join("table.md")).unwrap();
    assert!(md.contains("--task modarith-brackets-nomult"), "{md}");
}

#[test]
fn a_screen_with_another_decay_and_warmup_stops_its_runs_and_says_how_they_trained() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = quick_table(
        dir.path(),
        &[
            "--tasks",
            "parity",
            "--rotations",
            "data",
            "--steps",
            "6",
            "--decay",
            "matrices",
            "--warmup",
            "3",
            "--stop-after",
            "2",
        ],
    );
    let md = std::fs::read_to_string(dir.path().join("table/table.md")).unwrap();
    assert!(
        md.contains("weight decay 0.1 on every matrix, in_proj too (`--decay matrices`)"),
        "{md}"
    );
    assert!(
        md.contains(" --warmup 3 "),
        "the recipes line takes the warmup: {md}"
    );
    let line = md
        .lines()
        .find(|l| l.starts_with("| parity-data-s0 |"))
        .unwrap_or_else(|| panic!("no run line in\n{md}"));
    assert!(line.contains("| stopped | 2/6 |"), "{line}");
    // The table says where its stopped runs stand, which its cells cannot.
    assert!(
        stdout.contains("Stopped runs, not yet in the cells above")
            && stdout.contains("- Parity, Mamba-3: 1 stopped at step 2; "),
        "{stdout}"
    );
    // The run's own checkpoint says it trained with the wider decay.
    let cfg = std::fs::read_to_string(
        dir.path()
            .join("table/runs/parity-data-s0/checkpoints/step-00000002/train_state.json"),
    )
    .unwrap();
    assert!(cfg.contains("\"decay\": \"matrices\""), "{cfg}");
    assert!(cfg.contains("\"warmup\": 3"), "{cfg}");
    // Resumed past the screen, it finishes.
    let out = stepgraph(
        &["repro", "state-tracking", "--resume", "table"],
        dir.path(),
    );
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.path().join("table/table.md")).unwrap();
    assert!(md.contains("| parity-data-s0 | finished | 6/6 |"), "{md}");
    assert!(
        md.contains(" --warmup 3 "),
        "the resumed table keeps the warmup: {md}"
    );
}

#[test]
fn a_packed_table_packs_every_run_and_resumes_packed() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--tasks",
        "modarith-prec",
        "--rotations",
        "data",
        "--steps",
        "6",
        "--pack",
        "2",
        "--stop-after",
        "3",
    ];
    quick_table(dir.path(), &args);
    let md = std::fs::read_to_string(dir.path().join("table/table.md")).unwrap();
    assert!(md.contains(" --pack 2`"), "the recipes line packs: {md}");
    let state = std::fs::read_to_string(
        dir.path()
            .join("table/runs/modarith-prec-data-s0/checkpoints/step-00000003/train_state.json"),
    )
    .unwrap();
    assert!(state.contains("\"pack\": 2"), "{state}");
    let out = stepgraph(
        &["repro", "state-tracking", "--resume", "table"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.path().join("table/table.md")).unwrap();
    assert!(
        md.contains("| modarith-prec-data-s0 | finished | 6/6 |"),
        "{md}"
    );
    assert!(
        md.contains(" --pack 2`"),
        "the resumed table still packs: {md}"
    );
}

/// `repro state-tracking --quick` on the CPU, one seed, into `dir/table`,
/// with `extra` arguments; its standard output, once it has succeeded.
fn quick_table(dir: &std::path::Path, extra: &[&str]) -> String {
    let mut args = vec![
        "repro",
        "state-tracking",
        "--quick",
        "--device",
        "cpu",
        "--seeds",
        "1",
        "--out",
        "table",
    ];
    args.extend_from_slice(extra);
    let out = stepgraph(&args, dir);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    stdout
}

fn usage(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = stepgraph(args, dir.path());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in\n{err}");
    assert!(err.starts_with("error: "), "{err}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    usage(
        &["repro", "state-tracking", "--seeds", "0"],
        "invalid value '0' for '--seeds <SEEDS>': must be at least 1",
    );
    usage(
        &["repro", "state-tracking", "--tasks", "copy"],
        "invalid value 'copy' for '--tasks <TASKS>'",
    );
    usage(
        &["repro", "state-tracking", "--precision", "f64"],
        "invalid value 'f64' for '--precision <PRECISION>'",
    );
    usage(&["repro", "tables"], "unrecognized subcommand 'tables'");
    usage(
        &[
            "repro",
            "state-tracking",
            "--steps",
            "10",
            "--curriculum",
            "99",
        ],
        "--curriculum: 99 steps of curriculum do not fit in 10 steps",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--tasks",
            "modarith-prec",
            "--train-min-len",
            "81",
        ],
        "--train-min-len: 81 is above the modarith-prec recipe's training size 80",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--tasks",
            "modarith-prec",
            "--curriculum-start",
            "81",
        ],
        "--curriculum-start: 81 is above the modarith-prec recipe's training size 80",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--tasks",
            "parity",
            "--curriculum",
            "0",
            "--curriculum-start",
            "20",
        ],
        "--curriculum-start: starts a curriculum, and the parity recipe has none here",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--d-model",
            "20",
            "--tasks",
            "parity",
        ],
        "--d-model: ",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--headdim",
            "48",
            "--tasks",
            "parity",
        ],
        "--headdim: ",
    );
    usage(
        &["repro", "state-tracking", "--lr", "-1"],
        "invalid value '-1' for '--lr <LR>'",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--min-lr",
            "0.01",
            "--tasks",
            "parity",
        ],
        "--min-lr: 0.01 is above --lr 0.001",
    );
    usage(
        &["repro", "state-tracking", "--adam-eps", "0"],
        "invalid value '0' for '--adam-eps <ADAM_EPS>': must be > 0",
    );
    usage(
        &["repro", "state-tracking", "--resume", "t", "--seeds", "2"],
        "'--resume <RESUME>' cannot be used with '--seeds <SEEDS>'",
    );
    usage(
        &["repro", "state-tracking", "--decay", "inputs"],
        "[possible values: matrices, outputs, all, none]",
    );
    usage(
        &["repro", "state-tracking", "--resume", "t", "--decay", "all"],
        "'--resume <RESUME>' cannot be used with '--decay <DECAY>'",
    );
    usage(
        &[
            "repro",
            "state-tracking",
            "--resume",
            "t",
            "--warmup",
            "4000",
        ],
        "'--resume <RESUME>' cannot be used with '--warmup <WARMUP>'",
    );
    usage(
        &["repro", "state-tracking", "--stop-after", "0"],
        "invalid value '0' for '--stop-after <STOP_AFTER>': must be at least 1",
    );
    usage(
        &["train", "--rotation", "random"],
        "[possible values: data, fixed, none]",
    );
    usage(
        &["train", "--rotation", "fixed", "--no-rotation"],
        "'--rotation <ROTATION>' cannot be used with '--no-rotation'",
    );
}

#[test]
fn a_non_empty_out_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/x"), "x").unwrap();
    let out = stepgraph(
        &[
            "repro",
            "state-tracking",
            "--quick",
            "--device",
            "cpu",
            "--out",
            "taken",
        ],
        dir.path(),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--out: ") && err.contains("is not empty"),
        "{err}"
    );
}

#[test]
fn train_rotation_fixed_runs_and_is_saved_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&["--rotation", "fixed", "--log-dynamics", "--run-dir", "r"]);
    let out = stepgraph(&args, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run = dir.path().join("r");
    let ckpt = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let json = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(ckpt.join(f)).unwrap()).unwrap()
    };
    assert_eq!(
        json("train_state.json")["run"]["model"]["rotation"],
        "fixed"
    );
    assert_eq!(json("config.json")["ssm_cfg"]["rope_angles"], "fixed");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"kind\":\"dynamics\""));
    // The alias of --rotation none: resuming with --rotation data is refused.
    let out = stepgraph(
        &["train", "--resume", "r", "--rotation", "data"],
        dir.path(),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("has `--rotation fixed`, this command says `--rotation data`"),
        "{err}"
    );
}

/// A quick parity-only part of the table on the CPU, seeds `first..first+n`.
fn part(dir: &std::path::Path, name: &str, first: &str, n: &str) {
    let out = stepgraph(
        &[
            "repro",
            "state-tracking",
            "--quick",
            "--device",
            "cpu",
            "--tasks",
            "parity",
            "--first-seed",
            first,
            "--seeds",
            n,
            "--out",
            name,
        ],
        dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn parts_of_the_table_merge_into_one_and_bad_merges_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    part(dir.path(), "a", "0", "1");
    part(dir.path(), "b", "1", "2");
    let out = stepgraph(
        &["repro", "state-tracking", "--merge", "a,b", "--out", "m"],
        dir.path(),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("for 9 runs (in all parts)"), "{stdout}");
    let m = dir.path().join("m");
    let tj: Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("table.json")).unwrap()).unwrap();
    assert_eq!(tj["seeds"], serde_json::json!([0, 1, 2]));
    let cells = tj["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3, "parity x three rotation modes");
    assert!(cells.iter().all(|c| c["runs"] == 3), "{tj}");
    let results = std::fs::read_to_string(m.join("results.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 9);
    let metrics = std::fs::read_to_string(m.join("metrics.jsonl")).unwrap();
    for run in ["parity-data-s0", "parity-fixed-s1", "parity-none-s2"] {
        assert!(metrics.contains(&format!("\"run\":\"{run}\"")), "{run}");
    }
    assert!(m.join("accuracy-parity.svg").is_file());
    let md = std::fs::read_to_string(m.join("table.md")).unwrap();
    assert!(md.contains("Merged from 2 parts (a, b)"), "{md}");

    let twice = stepgraph(&["repro", "state-tracking", "--merge", "a,a"], dir.path());
    assert_eq!(twice.status.code(), Some(2));
    assert!(
        text(&twice.stderr).contains("run parity-data-s0 finished in both a and a"),
        "{}",
        text(&twice.stderr)
    );
    let tj_b = dir.path().join("b/table.json");
    let edited = std::fs::read_to_string(&tj_b)
        .unwrap()
        .replace("\"f32\"", "\"bf16\"");
    std::fs::write(&tj_b, edited).unwrap();
    let mixed = stepgraph(&["repro", "state-tracking", "--merge", "a,b"], dir.path());
    assert_eq!(mixed.status.code(), Some(2));
    assert!(text(&mixed.stderr).contains("a and b differ in precision"));
    let missing = stepgraph(
        &["repro", "state-tracking", "--merge", "a,nowhere"],
        dir.path(),
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("nowhere/table.json"));
    usage(
        &["repro", "state-tracking", "--merge", "a", "--seeds", "3"],
        "'--merge <MERGE>' cannot be used with '--seeds <SEEDS>'",
    );
}
