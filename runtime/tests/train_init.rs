//! Where a run's first weights and its rows come from, on the CPU engine:
//! `--seed` draws both unless `--data-seed` draws the rows (and eval sets)
//! from another seed, and `--init-from` starts from a model directory's
//! weights, refused unless its config is the run's model.

mod train_common;

use std::path::{Path, PathBuf};

use stepgraph::mamba3::checkpoint as model_ckpt;
use stepgraph::mamba3::cpu::Weights;
use stepgraph::train::checkpoint;
use stepgraph::train::{RunConfig, RunSummary, Stop, TrainError, TrainOptions, train};
use train_common::{options, records, run_config, weight_gap};

/// Trains `run` as a new run in `path`.
fn new_run(path: &Path, run: RunConfig) -> Result<RunSummary, TrainError> {
    let opts = TrainOptions {
        run,
        ..options(path, 6)
    };
    train(&opts, &Stop::new())
}

/// A run whose weights stay where they start: a learning rate far below
/// f32's resolution of any weight the init draws (none is zero), no decay.
/// A difference in its losses is a difference in rows or first weights.
fn frozen(dir: &Path, name: &str, cfg: RunConfig) -> (Vec<String>, Weights<f32>) {
    let path = dir.join(name);
    let run = RunConfig {
        lr: 1e-30,
        min_lr: 0.0,
        weight_decay: 0.0,
        ..cfg
    };
    new_run(&path, run).unwrap();
    (records(&path), last_weights(&path).1)
}

/// The model directory of a run's newest checkpoint and its weights.
fn last_weights(run: &Path) -> (PathBuf, Weights<f32>) {
    let (_, dir) = checkpoint::list(&run.join("checkpoints"))
        .unwrap()
        .into_iter()
        .max_by_key(|(s, _)| *s)
        .unwrap();
    let (_, weights) = model_ckpt::load::<f32>(&dir).unwrap();
    (dir, weights)
}

#[test]
fn the_data_seed_moves_the_rows_and_leaves_the_initial_weights_to_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = |seed, data_seed| RunConfig {
        seed,
        data_seed,
        ..run_config(6)
    };
    let (plain, plain_w) = frozen(dir.path(), "plain", seeds(5, None));
    let (same, same_w) = frozen(dir.path(), "same", seeds(5, Some(5)));
    let (crossed, crossed_w) = frozen(dir.path(), "crossed", seeds(5, Some(6)));
    let (other, _) = frozen(dir.path(), "other", seeds(6, None));
    // The default draws the data from --seed: nothing changes.
    assert_eq!(same, plain);
    assert_eq!(weight_gap(&same_w, &plain_w), 0.0);
    // --seed alone sets the weights: the crossed run holds seed 5's init ...
    let (model, _) = model_ckpt::load::<f32>(&last_weights(&dir.path().join("plain")).0).unwrap();
    let init5 = Weights::<f32>::init(&model, 5).unwrap();
    let init6 = Weights::<f32>::init(&model, 6).unwrap();
    assert_eq!(weight_gap(&crossed_w, &init5), 0.0);
    assert!(weight_gap(&crossed_w, &init6) > 1e-3);
    // ... and trains on other rows, scored on other eval sets.
    let kind = |r: &[String], kind: &str| -> Vec<String> {
        let tag = format!("\"kind\":\"{kind}\"");
        r.iter().filter(|l| l.contains(&tag)).cloned().collect()
    };
    assert_ne!(kind(&crossed, "train"), kind(&plain, "train"));
    assert_ne!(kind(&crossed, "eval"), kind(&plain, "eval"));
    assert_ne!(crossed, other);
}

#[test]
fn a_run_from_a_model_directory_starts_from_its_weights() {
    let dir = tempfile::tempdir().unwrap();
    // Seed 5's first weights, saved as a model directory.
    frozen(dir.path(), "init5", run_config(6));
    let (init5, _) = last_weights(&dir.path().join("init5"));
    // Seed 7 draws the rows; the weights are the directory's, so the run
    // is seed 7's data on seed 5's init, step for step.
    let started = dir.path().join("from");
    let from = RunConfig {
        seed: 7,
        init_from: Some(init5.clone()),
        ..run_config(6)
    };
    new_run(&started, from).unwrap();
    let crossed = RunConfig {
        seed: 5,
        data_seed: Some(7),
        ..run_config(6)
    };
    new_run(&dir.path().join("crossed"), crossed).unwrap();
    assert_eq!(records(&started), records(&dir.path().join("crossed")));
    // The run records the directory, absolute; a resume reads its own
    // checkpoint and never the directory again.
    let (_, _, state) = checkpoint::load(&last_weights(&started).0).unwrap();
    assert_eq!(state.run.init_from.as_deref(), Some(init5.as_path()));
    assert!(init5.is_absolute());
    let more = TrainOptions {
        run: run_config(8),
        run_dir: None,
        resume: Some(stepgraph::train::Resume {
            from: started.clone(),
            given: vec![stepgraph::train::Setting::Steps],
        }),
        ..options(&started, 8)
    };
    std::fs::remove_dir_all(dir.path().join("init5")).unwrap();
    let done = train(&more, &Stop::new()).unwrap();
    assert_eq!(done.step, 8);
}

#[test]
fn a_model_directory_of_another_model_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    frozen(dir.path(), "small", run_config(6));
    let (small, _) = last_weights(&dir.path().join("small"));
    let mut wide = run_config(6);
    wide.model.d_model = 16;
    wide.init_from = Some(small.clone());
    let run = dir.path().join("wide");
    let err = new_run(&run, wide).err().unwrap();
    assert!(
        matches!(&err, TrainError::InitMismatch { field, .. } if field == "d_model"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 2);
    assert_eq!(
        err.to_string(),
        format!(
            "--init-from {}: d_model is 8 there, 16 in the model the flags describe",
            small.display()
        )
    );
    assert!(!run.exists(), "a refused run leaves no directory");
    // A directory that is not there is a usage error naming the flag.
    let missing = RunConfig {
        init_from: Some(dir.path().join("nowhere")),
        ..run_config(6)
    };
    let err = new_run(&run, missing).err().unwrap();
    assert!(err.to_string().starts_with("--init-from: "), "{err}");
    assert_eq!(err.exit_code(), 2);
    assert!(!run.exists());
}
