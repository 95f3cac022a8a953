//! Run checkpoints and resume on the CPU engine: atomic writes keeping the
//! last K, N steps = N/2 + resume + N/2 bit for bit, refusal of a checkpoint
//! from another configuration, and a tiny run whose loss falls.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use stepgraph::mamba3::cpu::Weights;
use stepgraph::mamba3::{AActivation, Mamba3Config};
use stepgraph::optim::DecayPolicy;
use stepgraph::train::checkpoint::{self, TrainState};
use stepgraph::train::data::{DataSpec, Task};
use stepgraph::train::report::ProgressMode;
use stepgraph::train::run::ModelSize;
use stepgraph::train::{Device, EngineState, Precision, TrainError, TrainOptions, train};

fn options(run_dir: &Path, steps: u64) -> TrainOptions {
    TrainOptions {
        data: DataSpec::Task {
            task: Task::Parity,
            train_len: 6,
            eval_lens: vec![6, 12],
            curriculum: 0,
        },
        model: ModelSize {
            d_model: 8,
            n_layer: 1,
            d_state: 8,
            headdim: 4,
            expand: 2,
            full_rope: false,
            rotation: true,
            a_activation: AActivation::HeavyTail,
        },
        device: Device::Cpu,
        precision: Precision::F32,
        batch: 6,
        steps,
        lr: 1e-2,
        min_lr: 1e-3,
        warmup: 2,
        weight_decay: 0.1,
        decay: DecayPolicy::MatricesOnly,
        clip: Some(1.0),
        seed: 5,
        eval_every: 3,
        log_every: 1,
        checkpoint_every: 0,
        keep: 2,
        run_dir: Some(run_dir.to_path_buf()),
        resume: None,
        stop_after: None,
        progress: ProgressMode::Quiet,
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn train_lines(run: &Path) -> Vec<String> {
    // The train records minus their timing fields, which differ run to run.
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"kind\":\"train\""))
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("elapsed_s");
            o.remove("tokens_per_s");
            v.to_string()
        })
        .collect()
}

#[test]
fn resume_continues_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    let stop = AtomicBool::new(false);
    let n = 8;
    let a = train(&options(&whole, n), &stop).unwrap();
    assert_eq!((a.step, a.interrupted), (n, false));

    let first = TrainOptions {
        stop_after: Some(n / 2),
        ..options(&split, n)
    };
    let b = train(&first, &stop).unwrap();
    assert_eq!((b.step, b.interrupted), (n / 2, true));
    let resume = TrainOptions {
        resume: Some(split.clone()),
        run_dir: None,
        ..options(&split, n)
    };
    let c = train(&resume, &stop).unwrap();
    assert_eq!(
        (c.step, c.interrupted, c.run_dir.clone()),
        (n, false, split.clone())
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
        train_lines(&whole),
        train_lines(&split),
        "every step's loss, lr and grad norm agree"
    );
    assert!(split.join("plot.svg").is_file());
}

#[test]
fn a_checkpoint_from_another_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let stop = AtomicBool::new(false);
    train(&options(&run, 2), &stop).unwrap();
    let mut other = options(&run, 4);
    other.resume = Some(run.clone());
    other.model.d_model = 16;
    let err = train(&other, &stop).err().unwrap();
    assert!(
        matches!(&err, TrainError::ConfigMismatch { field, .. } if field == "d_model"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 1);
    let mut other = options(&run, 4);
    other.resume = Some(run.clone());
    other.data = DataSpec::Task {
        task: Task::Parity,
        train_len: 7,
        eval_lens: vec![6, 12],
        curriculum: 0,
    };
    let err = train(&other, &stop).err().unwrap();
    assert!(
        err.to_string().contains(
            "data is `task parity, train_len 6, eval 6,12` there, `task parity, train_len 7"
        ),
        "{err}"
    );
    let mut other = options(&run, 4);
    other.resume = Some(run.clone());
    other.model.rotation = false;
    let err = train(&other, &stop).err().unwrap();
    assert!(
        matches!(&err, TrainError::ConfigMismatch { field, .. } if field == "rotation"),
        "{err}"
    );
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
        format: 1,
        step,
        adam_steps: step,
        skipped: 0,
        seed: 0,
        batch: 2,
        precision: "f32".into(),
        data: DataSpec::Task {
            task: Task::Parity,
            train_len: 4,
            eval_lens: vec![4],
            curriculum: 0,
        },
        rotation: true,
        data_batches: step,
        data_word_pos: (u128::from(u64::MAX) + 7).to_string(),
    };
    (engine, train)
}

#[test]
fn checkpoints_are_atomic_and_only_the_last_k_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let cfg = Mamba3Config {
        vocab_size: 4,
        n_layer: 1,
        ..Mamba3Config::tiny()
    };
    // A crash mid-write leaves a temp directory: it is neither listed nor resumed.
    std::fs::create_dir_all(root.join(".tmp-step-00000009")).unwrap();
    for step in 1..=5 {
        let (e, t) = state(&cfg, step);
        let out = checkpoint::save(&root, &cfg, &e, &t, 2).unwrap();
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
    let latest = checkpoint::resolve(dir.path()).unwrap();
    assert_eq!(latest, root.join("step-00000005"));
    let (cfg2, e, t) = checkpoint::load(&latest).unwrap();
    let (want_e, want_t) = state(&cfg, 5);
    assert_eq!(cfg2, cfg);
    assert_eq!(e, want_e);
    assert_eq!(t, want_t);
    assert_eq!(
        t.data_position(&latest).unwrap().word_pos,
        u128::from(u64::MAX) + 7
    );
    // The weights are an official-layout checkpoint on their own.
    let (_, w) = stepgraph::mamba3::checkpoint::load::<f32>(&latest).unwrap();
    assert_eq!(w, want_e.weights);
}

#[test]
fn a_tiny_run_learns() {
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let opts = TrainOptions {
        eval_every: 0,
        ..options(&dir.path().join("run"), 60)
    };
    let s = train(&opts, &stop).unwrap();
    // Parity answers start near ln(8) (uniform over the padded vocab) and
    // quickly fall toward ln(2) once the model predicts a bit.
    assert!(s.first_loss > 1.5, "{}", s.first_loss);
    assert!(s.last_loss < 0.8, "{} -> {}", s.first_loss, s.last_loss);
    assert_eq!(s.eval.len(), 2, "final eval of both lengths");
    assert_eq!(s.skipped, 0);
}
