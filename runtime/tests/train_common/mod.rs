//! Shared helpers for the CPU training tests: a tiny run's settings and
//! options, its metrics records, and the distance between two weight sets.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use std::path::Path;

use stepgraph::Precision;
use stepgraph::mamba3::AActivation;
use stepgraph::mamba3::cpu::Weights;
use stepgraph::train::data::{DataSpec, Task};
use stepgraph::train::report::ProgressMode;
use stepgraph::train::{
    Decay, Device, DtInit, ModelSize, Resume, Rotation, RunConfig, Setting, TrainOptions,
};

/// A one-layer parity run on the CPU: small enough for a test to train it
/// several times.
pub fn run_config(steps: u64) -> RunConfig {
    RunConfig {
        data: DataSpec::task(Task::Parity, 6, vec![6, 12]),
        model: ModelSize {
            d_model: 8,
            n_layer: 1,
            d_state: 8,
            headdim: 4,
            expand: 2,
            full_rope: false,
            rotation: Rotation::Data,
            a_activation: AActivation::HeavyTail,
            outproj_norm: false,
            chunk_size: 64,
            dt_init: DtInit::default(),
        },
        device: Device::Cpu,
        precision: Precision::F32,
        batch: 6,
        steps,
        lr: 1e-2,
        min_lr: 1e-3,
        warmup: 2,
        weight_decay: 0.1,
        beta2: 0.999,
        adam_eps: stepgraph::train::DEFAULT_ADAM_EPS,
        decay: Decay::Matrices,
        clip: Some(1.0),
        seed: 5,
        data_seed: None,
        init_from: None,
        eval_every: 3,
        log_every: 1,
        checkpoint_every: 0,
        keep: 2,
        keep_at: Vec::new(),
        ema: None,
        edits: Vec::new(),
        trim: false,
        pack: 1,
    }
}

/// `run_config(steps)` as a new run in `run_dir`, quiet.
pub fn options(run_dir: &Path, steps: u64) -> TrainOptions {
    TrainOptions {
        run: run_config(steps),
        run_dir: Some(run_dir.to_path_buf()),
        resume: None,
        stop_after: None,
        progress: ProgressMode::Quiet,
        log_dynamics: false,
        gpu: 0,
    }
}

/// A resume of the run in `run` with the settings `typed`, of which
/// `given` were typed on the command line, quiet.
pub fn resume(run: &Path, typed: RunConfig, given: Vec<Setting>) -> TrainOptions {
    TrainOptions {
        run: typed,
        run_dir: None,
        resume: Some(Resume {
            from: run.to_path_buf(),
            given,
        }),
        stop_after: None,
        progress: ProgressMode::Quiet,
        log_dynamics: false,
        gpu: 0,
    }
}

/// Every training step's and evaluation's loss of a run, in order.
pub fn losses(run: &Path) -> Vec<f64> {
    records(run)
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON record"))
        .filter(|v| v["kind"] == "train" || v["kind"] == "eval")
        .map(|v| v["loss"].as_f64().expect("a loss"))
        .collect()
}

/// A run's metrics records without the resume events and timing fields,
/// for comparing two runs line by line.
pub fn records(run: &Path) -> Vec<String> {
    // The train and eval records minus their timing fields, which differ
    // run to run.
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"kind\":\"resume\""))
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("elapsed_s");
            o.remove("tokens_per_s");
            v.to_string()
        })
        .collect()
}

/// The largest difference between two runs' weights, tensor by tensor.
pub fn weight_gap(a: &Weights<f32>, b: &Weights<f32>) -> f32 {
    a.tensors()
        .iter()
        .zip(b.tensors())
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}
