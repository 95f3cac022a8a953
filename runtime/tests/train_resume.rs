//! Run checkpoints and resume on the CPU engine, through the library: atomic
//! writes keeping the last K, N steps = N/2 + resume + N/2 bit for bit (the
//! resume given nothing but the run), refusal of a setting that would change
//! the run, and a tiny run whose loss falls.

mod train_common;

use std::path::Path;

use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::Weights;
use stepgraph::train::checkpoint::{self, TrainState};
use stepgraph::train::data::{DataSpec, Task};
use stepgraph::train::{
    EngineState, Rotation, RunConfig, RunStatus, Setting, Stop, TrainError, TrainOptions, train,
};
use train_common::{options, records, resume, run_config};

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Trains `cfg(n)` whole, and again stopped after `stop_at` steps and
/// resumed from the place alone; asserts the checkpoints, train states and
/// every metrics record agree, and returns the final train state.
fn assert_resume_identical(cfg: fn(u64) -> RunConfig, n: u64, stop_at: u64) -> TrainState {
    let dir = tempfile::tempdir().unwrap();
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    let stop = Stop::new();
    let with = |run_dir: &Path| TrainOptions {
        run: cfg(n),
        ..options(run_dir, n)
    };
    let a = train(&with(&whole), &stop).unwrap();
    assert_eq!((a.step, a.status), (n, RunStatus::Finished));

    let first = TrainOptions {
        stop_after: Some(stop_at),
        ..with(&split)
    };
    let b = train(&first, &stop).unwrap();
    assert_eq!((b.step, b.status), (stop_at, RunStatus::Stopped));
    // Resumed with the same stop step, it stops again before any step, and
    // leaves its checkpoints and metrics as they were.
    let metrics_before = records(&split);
    let held = TrainOptions {
        stop_after: Some(stop_at),
        ..resume(&split, run_config(1), Vec::new())
    };
    let h = train(&held, &stop).unwrap();
    assert_eq!((h.step, h.status), (stop_at, RunStatus::Stopped));
    let newest = checkpoint::list(&split.join("checkpoints"))
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .max();
    assert_eq!(newest, Some(stop_at), "no checkpoint past the stop step");
    assert_eq!(metrics_before, records(&split));
    // Nothing but the place: the run's settings come from its checkpoint.
    let c = train(&resume(&split, run_config(1), Vec::new()), &stop).unwrap();
    assert_eq!(
        (c.step, c.status, c.run_dir.clone()),
        (n, RunStatus::Finished, split.clone())
    );

    let name = checkpoint::step_dir_name(n);
    let (ca, cc) = (
        whole.join("checkpoints").join(&name),
        split.join("checkpoints").join(&name),
    );
    for file in ["model.safetensors", "optimizer.safetensors", "config.json"] {
        assert!(
            read(&ca.join(file)) == read(&cc.join(file)),
            "{file} differs after resume"
        );
    }
    let (sa, sc): (TrainState, TrainState) = (
        serde_json::from_slice(&read(&ca.join("train_state.json"))).unwrap(),
        serde_json::from_slice(&read(&cc.join("train_state.json"))).unwrap(),
    );
    assert_eq!(sa, sc, "counters and data position agree");
    assert_eq!(
        records(&whole),
        records(&split),
        "every step's loss, lr and grad norm, and every evaluation, agree"
    );
    assert!(split.join("plot.svg").is_file());
    sa
}

#[test]
fn resume_continues_bit_identically() {
    let state = assert_resume_identical(run_config, 8, 4);
    assert_eq!(state.data_clock, None, "an ungated run saves no clock");
}

/// A curriculum over 12 steps gated at a loss the run's smoothed loss
/// crosses after a few steps (its answer loss starts at ~2.10 and falls),
/// so its clock falls behind the batches drawn.
fn gated_config(steps: u64) -> RunConfig {
    let mut cfg = run_config(steps);
    if let DataSpec::Task {
        curriculum,
        curriculum_gate,
        ..
    } = &mut cfg.data
    {
        (*curriculum, *curriculum_gate) = (12, GATE);
    }
    cfg
}

const GATE: f64 = 2.08;

#[test]
fn a_gated_curriculum_resumes_bit_identically() {
    // Stopped where the gate's state is mid-flight (its smoothed loss and
    // the saved step's loss both matter to the next batches).
    for stop_at in [3, 7] {
        let state = assert_resume_identical(gated_config, 14, stop_at);
        let clock = state.data_clock.expect("a gated run saves its clock");
        assert!(
            clock > 0 && clock < state.data_batches,
            "the gate was open on some batches and shut on others: clock {clock} of {} batches",
            state.data_batches
        );
        assert!(state.data_last_loss.is_some() && state.data_smoothed_loss.is_some());
    }
}

/// The tiny run keeping a weight average (folded every 10 steps).
fn ema_config(steps: u64) -> RunConfig {
    RunConfig {
        ema: Some(0.9),
        ..run_config(steps)
    }
}

fn kinds(run: &Path, kind: &str) -> Vec<String> {
    let tag = format!("\"kind\":\"{kind}\"");
    records(run)
        .into_iter()
        .filter(|l| l.contains(&tag))
        .collect()
}

#[test]
fn a_weight_average_resumes_bit_identically_and_leaves_training_alone() {
    // Stopped between two folds and right at one.
    for stop_at in [13, 20] {
        assert_resume_identical(ema_config, 25, stop_at);
    }
    let dir = tempfile::tempdir().unwrap();
    let (plain, avg) = (dir.path().join("plain"), dir.path().join("avg"));
    let stop = Stop::new();
    train(&options(&plain, 25), &stop).unwrap();
    let s = train(
        &TrainOptions {
            run: ema_config(25),
            ..options(&avg, 25)
        },
        &stop,
    )
    .unwrap();
    // Scoring the average swaps the weights in and back: the trained
    // weights' steps and scores are those of a run without it.
    for kind in ["train", "eval"] {
        assert_eq!(kinds(&plain, kind), kinds(&avg, kind), "{kind} records");
    }
    assert!(kinds(&plain, "eval_ema").is_empty());
    // Evaluations at steps 3, 6, ..., 24 and 25; the average exists from
    // step 10 on, so at 12, 15, 18, 21, 24 and 25: 6 evaluations of 2 sets.
    assert_eq!(kinds(&avg, "eval_ema").len(), 12);
    assert_eq!(s.eval_ema.len(), 2);
    assert_ne!(s.eval_ema, s.eval, "the average is not the trained weights");
    let last = avg.join("checkpoints").join(checkpoint::step_dir_name(25));
    let (cfg, trained) = stepgraph::mamba3::checkpoint::load::<f32>(&last).unwrap();
    let (ema_cfg, average) =
        stepgraph::mamba3::checkpoint::load::<f32>(&last.join(checkpoint::EMA_DIR)).unwrap();
    assert_eq!(cfg, ema_cfg);
    assert_ne!(trained, average);
    assert!(
        !plain
            .join("checkpoints")
            .join(checkpoint::step_dir_name(25))
            .join("ema")
            .exists()
    );

    // A checkpoint of such a run without its average is not resumed.
    let (e, mut t) = state(&cfg, 20);
    t.run = ema_config(25);
    let root = dir.path().join("lost").join("checkpoints");
    checkpoint::save(&root, &cfg, &e, None, &t, 1, &[]).unwrap();
    let err = checkpoint::find(&root).unwrap_err().to_string();
    assert!(err.contains("--ema") && err.contains("ema/"), "{err}");
}

#[test]
fn a_setting_that_changes_the_run_is_refused_naming_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let stop = Stop::new();
    train(&options(&run, 2), &stop).unwrap();
    let refused = |typed: RunConfig, setting: Setting| {
        let err = train(&resume(&run, typed, vec![setting]), &stop)
            .err()
            .unwrap();
        assert!(
            matches!(&err, TrainError::ResumeChange { flag, .. } if *flag == setting.flag()),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
        err.to_string()
    };
    let mut typed = run_config(4);
    typed.model.d_model = 16;
    let msg = refused(typed, Setting::DModel);
    assert!(
        msg.contains("has `--d-model 8`, this command says `--d-model 16`"),
        "{msg}"
    );
    let mut typed = run_config(4);
    typed.data = DataSpec::task(Task::Parity, 7, vec![6, 12]);
    refused(typed, Setting::TrainLen);
    let mut typed = run_config(4);
    typed.model.rotation = Rotation::None;
    let msg = refused(typed, Setting::Rotation);
    assert!(
        msg.contains("has `--rotation data`, this command says `--rotation none`"),
        "{msg}"
    );
    let typed = RunConfig {
        data_seed: Some(6),
        ..run_config(4)
    };
    let msg = refused(typed, Setting::DataSeed);
    assert!(
        msg.contains("has `no --data-seed`, this command says `--data-seed 6`"),
        "{msg}"
    );
    // The same value typed again is no change.
    let again = train(&resume(&run, run_config(2), vec![Setting::Steps]), &stop).unwrap();
    assert_eq!(again.status, RunStatus::AlreadyFinished);
}

/// The one-layer model the checkpoint tests save.
fn checkpoint_model() -> Mamba3Config {
    Mamba3Config {
        vocab_size: 4,
        n_layer: 1,
        ..Mamba3Config::tiny()
    }
}

fn state(cfg: &Mamba3Config, step: u64) -> (EngineState, TrainState) {
    let weights = Weights::<f32>::init(cfg, step).unwrap();
    let moments = weights
        .tensors()
        .iter()
        .map(|t| (vec![0.5; t.len()], vec![0.25; t.len()]))
        .collect();
    let engine = EngineState {
        weights,
        moments,
        adam_steps: step,
        steps: step,
        skipped: 0,
    };
    let train = TrainState {
        format: checkpoint::FORMAT,
        step,
        adam_steps: step,
        skipped: 0,
        run: run_config(10),
        engine: "cpu f32".into(),
        data_fingerprint: None,
        data_batches: step,
        data_word_pos: (u128::from(u64::MAX) + 7).to_string(),
        files: Default::default(),
        data_clock: None,
        data_smoothed_loss: None,
        data_last_loss: None,
    };
    (engine, train)
}

#[test]
fn checkpoints_are_atomic_and_only_the_last_k_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let cfg = checkpoint_model();
    // A crash mid-write leaves a temp directory: it is neither listed nor resumed.
    std::fs::create_dir_all(root.join(".tmp-step-00000009")).unwrap();
    for step in 1..=5 {
        let (e, t) = state(&cfg, step);
        let out = checkpoint::save(&root, &cfg, &e, None, &t, 2, &[]).unwrap();
        assert_eq!(out, root.join(checkpoint::step_dir_name(step)));
    }
    let kept: Vec<u64> = checkpoint::list(&root)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(kept, vec![4, 5]);
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with(".tmp-step-0000000") && n != ".tmp-step-00000009")
    );
    let found = checkpoint::find(dir.path()).unwrap();
    let latest = found.dir.clone();
    assert_eq!(latest, root.join("step-00000005"));
    assert!(found.skipped.is_empty());
    let (cfg2, e, t) = checkpoint::load(&latest).unwrap();
    let (want_e, want_t) = state(&cfg, 5);
    assert_eq!(cfg2, cfg);
    assert_eq!(e, want_e);
    assert_eq!(
        TrainState {
            files: Default::default(),
            ..t.clone()
        },
        want_t
    );
    assert_eq!(t.files.len(), 3, "a checksum per file");
    assert_eq!(
        t.data_position(&latest).unwrap().word_pos,
        u128::from(u64::MAX) + 7
    );
    // The weights are an official-layout checkpoint on their own.
    let (_, w) = stepgraph::mamba3::checkpoint::load::<f32>(&latest).unwrap();
    assert_eq!(w, want_e.weights);
}

#[test]
fn kept_steps_are_saved_and_outlive_the_newest_k() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let cfg = checkpoint_model();
    for step in 1..=6 {
        let (e, t) = state(&cfg, step);
        checkpoint::save(&root, &cfg, &e, None, &t, 2, &[2]).unwrap();
    }
    let steps = |root: &Path| -> Vec<u64> {
        checkpoint::list(root)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    };
    assert_eq!(steps(&root), vec![2, 5, 6], "step 2 pinned, not counted");
    // A run saves the steps of --keep-at without --checkpoint-every, keeps
    // them past --keep 1, and a resume may add one.
    let run = dir.path().join("run");
    let stop = Stop::new();
    let opts = TrainOptions {
        run: RunConfig {
            keep: 1,
            keep_at: vec![3],
            ..run_config(8)
        },
        stop_after: Some(5),
        ..options(&run, 8)
    };
    train(&opts, &stop).unwrap();
    let typed = RunConfig {
        keep_at: vec![3, 7],
        ..run_config(8)
    };
    let done = train(&resume(&run, typed, vec![Setting::KeepAt]), &stop).unwrap();
    assert_eq!(done.status, RunStatus::Finished);
    assert_eq!(steps(&run.join("checkpoints")), vec![3, 7, 8]);
}

#[test]
fn a_tiny_run_learns() {
    let dir = tempfile::tempdir().unwrap();
    let stop = Stop::new();
    let mut opts = options(&dir.path().join("run"), 60);
    opts.run.eval_every = 0;
    let s = train(&opts, &stop).unwrap();
    // Parity answers start near ln(8) (uniform over the padded vocab) and
    // quickly fall toward ln(2) once the model predicts a bit.
    let (first, last) = (s.first_loss.unwrap(), s.last_loss.unwrap());
    assert_eq!(
        (first.first, first.last, last.first, last.last),
        (1, 30, 31, 60)
    );
    assert!(first.mean > 1.2, "{}", first.mean);
    assert!(last.mean < 0.8, "{} -> {}", first.mean, last.mean);
    assert_eq!(s.eval.len(), 2, "final eval of both lengths");
    assert_eq!(s.skipped, 0);
}
