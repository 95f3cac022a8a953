//! Weight edits at a step (`stepgraph train --edit`) on the CPU engine,
//! through the library: the part is reset in the weights and the average
//! once the run reaches the step, a run stopped there and resumed edits as
//! the uninterrupted run did, and an edit naming no parameter or a step the
//! run never reaches is refused before training.

mod train_common;

use std::path::{Path, PathBuf};

use stepgraph::mamba3::cpu::{Weights, param_specs};
use stepgraph::train::checkpoint::{self, load, load_ema};
use stepgraph::train::edit::{ParamPart, WeightEdit};
use stepgraph::train::report::ProgressMode;
use stepgraph::train::{Resume, RunConfig, RunStatus, Stop, TrainOptions, train};
use train_common::{options, records, run_config};

/// Rows 0..4 of every `in_proj` (the tiny model's first `z` rows).
const PART: &str = "mixer.in_proj.weight:0-4";

/// The tiny run with a weight average (folds every 10 steps) and, unless
/// `at` is `None`, `PART` reset after step `at`.
fn edited(steps: u64, at: Option<u64>) -> RunConfig {
    RunConfig {
        ema: Some(0.9),
        edits: at
            .map(|s| format!("{PART}*0@{s}").parse::<WeightEdit>().unwrap())
            .into_iter()
            .collect(),
        ..run_config(steps)
    }
}

fn run(dir: &Path, cfg: RunConfig, stop_after: Option<u64>) -> PathBuf {
    let steps = cfg.steps;
    let opts = TrainOptions {
        run: cfg,
        stop_after,
        ..options(dir, steps)
    };
    train(&opts, &Stop::new()).unwrap();
    dir.to_path_buf()
}

fn newest(run: &Path) -> PathBuf {
    let (_, dir) = checkpoint::list(&run.join("checkpoints"))
        .unwrap()
        .into_iter()
        .max_by_key(|(s, _)| *s)
        .unwrap();
    dir
}

/// The largest magnitude in `PART` of `w`.
fn part_max(cfg: &stepgraph::mamba3::Mamba3Config, w: &Weights<f32>) -> f32 {
    let specs = param_specs(cfg);
    let spans = PART.parse::<ParamPart>().unwrap().spans(&specs).unwrap();
    let tensors = w.tensors();
    spans
        .iter()
        .flat_map(|s| tensors[s.tensor][s.start..s.end].iter())
        .fold(0.0, |m, v| m.max(v.abs()))
}

#[test]
fn an_edit_resets_its_part_in_the_weights_and_the_average() {
    let dir = tempfile::tempdir().unwrap();
    let with = run(&dir.path().join("edit"), edited(11, Some(10)), None);
    let without = run(&dir.path().join("plain"), edited(11, None), None);
    let (ckpt, plain) = (newest(&with), newest(&without));
    let (cfg, state, train_state) = load(&ckpt).unwrap();
    let (_, plain_state, plain_train) = load(&plain).unwrap();
    // One AdamW step from zeroed moments moves a value by about half the
    // learning rate (its bias corrections at step 11); untouched, the rows
    // hold their drawn values, tenths.
    assert_eq!(run_config(1).lr, 1e-2, "the peak rate the bounds below use");
    let lr = 1e-2_f32;
    assert!(
        part_max(&cfg, &state.weights) <= lr,
        "one step past the reset"
    );
    assert!(part_max(&cfg, &plain_state.weights) > 10.0 * lr);
    // The average folded at step 10, before the edit, and not since.
    let avg = load_ema(&ckpt, &cfg, &train_state).unwrap().unwrap();
    assert_eq!(part_max(&cfg, &avg), 0.0);
    let plain_avg = load_ema(&plain, &cfg, &plain_train).unwrap().unwrap();
    assert!(part_max(&cfg, &plain_avg) > 10.0 * lr);
    let events: Vec<String> = records(&with)
        .into_iter()
        .filter(|l| l.contains("\"kind\":\"edit\""))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains(&format!("\"edit\":\"{PART}*0@10\"")),
        "{events:?}"
    );
    assert!(events[0].contains("\"step\":10"), "{events:?}");
}

#[test]
fn a_run_stopped_at_its_edit_step_resumes_as_the_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let whole = run(&dir.path().join("whole"), edited(14, Some(10)), None);
    let split = run(&dir.path().join("split"), edited(14, Some(10)), Some(10));
    // The checkpoint at the edit's step holds the weights before it.
    let (cfg, at_stop, _) = load(&newest(&split)).unwrap();
    assert!(part_max(&cfg, &at_stop.weights) > 0.01);
    let resume = TrainOptions {
        run: run_config(1),
        run_dir: None,
        resume: Some(Resume {
            from: split.clone(),
            given: Vec::new(),
        }),
        stop_after: None,
        progress: ProgressMode::Quiet,
        log_dynamics: false,
        gpu: 0,
    };
    let s = train(&resume, &Stop::new()).unwrap();
    assert_eq!((s.step, s.status), (14, RunStatus::Finished));
    let (a, b) = (newest(&whole), newest(&split));
    for file in [
        "model.safetensors",
        "optimizer.safetensors",
        "ema/model.safetensors",
    ] {
        assert!(
            std::fs::read(a.join(file)).unwrap() == std::fs::read(b.join(file)).unwrap(),
            "{file} differs after the resume"
        );
    }
    assert_eq!(records(&whole), records(&split));
}

#[test]
fn an_edit_naming_nothing_or_never_reached_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    for (edit, want) in [
        (
            "embeding*0@3",
            "--edit: embeding*0@3: part `embeding` matches no tensor",
        ),
        (
            "mixer.in_proj.weight:0-4*0@11",
            "--edit: mixer.in_proj.weight:0-4*0@11: the run ends at step 11 (--steps), so an \
             edit after step 11 never applies",
        ),
    ] {
        let out = dir.path().join(edit.replace(['*', '@', ':'], "_"));
        let opts = TrainOptions {
            run: RunConfig {
                edits: vec![edit.parse().unwrap()],
                ..run_config(11)
            },
            ..options(&out, 11)
        };
        let err = train(&opts, &Stop::new()).unwrap_err();
        assert_eq!(err.to_string(), want);
        assert!(err.is_usage());
        assert!(!out.join("checkpoints").exists(), "nothing trained");
    }
}
