//! A training step of your own: a two-layer MLP classifier (not Mamba-3)
//! with its own CUDA kernels, stepgraph's AdamW, and its whole step captured
//! into one CUDA graph from its spec, `specs/mlp.ron`, using only
//! stepgraph's public API. The README's "Your own step" walks through it.
//!
//! ```sh
//! cargo run --release --example mlp          # 300 steps; the CPU reference without a GPU
//! cargo run --release --example mlp -- 1000  # more steps
//! cargo test --example mlp                   # its CPU tests and the derive's guard tests
//! ```
//!
//! `data` makes the synthetic task, `model` is the step (kernels, buffers,
//! ops, the derive), `reference` the same model on the CPU in f64.

mod data;
mod model;
mod reference;

use std::error::Error;
use std::process::ExitCode;

use stepgraph::device::Gpu;
use stepgraph::graph::{ShapeKey, TrainingStep as _};

use data::{DIMS, HostParams, Teacher};
use model::{MlpStep, SEED};

fn main() -> ExitCode {
    let steps = match std::env::args().nth(1).map(|s| s.parse::<u64>()) {
        None => 300,
        Some(Ok(n)) if n >= 2 => n,
        Some(_) => {
            eprintln!("usage: mlp [STEPS >= 2]");
            return ExitCode::from(2);
        }
    };
    let run = match model::open_gpu() {
        Ok(gpu) => train_on_gpu(&gpu, steps),
        Err(e) => {
            eprintln!("no usable GPU ({e}); training the CPU reference instead");
            train_on_cpu(steps)
        }
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One eager step (the warm-up before a capture), then the captured graph,
/// replayed once per batch.
fn train_on_gpu(gpu: &Gpu, steps: u64) -> Result<(), Box<dyn Error>> {
    let teacher = Teacher::new(DIMS, SEED);
    let mut step = MlpStep::new(gpu, DIMS, &HostParams::init(DIMS, SEED))?;
    let (x, labels) = teacher.batch(0);
    step.set_batch(gpu, &x, &labels)?;
    step.run_eager(gpu)?;
    let mut losses = vec![f64::from(step.loss(gpu)?)];
    let shape = ShapeKey {
        batch: DIMS.batch,
        seq_len: 1,
    };
    let graph = step.capture(gpu, shape)?;
    for i in 1..steps {
        let (x, labels) = teacher.batch(i);
        step.set_batch(gpu, &x, &labels)?;
        step.replay(gpu, &graph)?;
        losses.push(f64::from(step.loss(gpu)?));
        if i % 50 == 0 {
            println!("step {i:>5}  loss {:.4}", losses[losses.len() - 1]);
        }
    }
    report("gpu, graph replay", &losses);
    Ok(())
}

fn train_on_cpu(steps: u64) -> Result<(), Box<dyn Error>> {
    let teacher = Teacher::new(DIMS, SEED);
    let init = HostParams::init(DIMS, SEED);
    let losses = reference::train(DIMS, &init, &teacher, model::adamw_config(), steps)?;
    report("cpu reference", &losses);
    Ok(())
}

fn report(what: &str, losses: &[f64]) {
    let (first, last) = reference::first_and_last(losses, 20);
    println!(
        "{what}: {} steps, loss {first:.4} (mean of the first 20) -> {last:.4} (mean of the last 20)",
        losses.len()
    );
}
