//! End to end on the CPU: forward, backward and AdamW together learn a
//! periodic sequence, in f32 and in f64, and the two precisions track each other.

use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::{Float, ScanMode, Tokens, Weights, backward, forward};
use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy};

fn train<T: Float>(cfg: &Mamba3Config, tokens: &Tokens, steps: usize) -> Vec<f64> {
    let mut w = Weights::<T>::init(cfg, 1).unwrap();
    let adam = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::<T>::new(adam, &stepgraph::step::params(cfg), &DecayPolicy::default());
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let fwd = forward(cfg, &w, tokens, None, ScanMode::Chunked).unwrap();
        let grads = backward(cfg, &w, &fwd);
        opt.step(&mut w.tensors_mut(), &grads.tensors()).unwrap();
        losses.push(fwd.loss);
    }
    losses
}

#[test]
fn adamw_training_reduces_the_loss() {
    let cfg = Mamba3Config::tiny();
    // Period-5 pattern; what follows a 1 depends on the token before it.
    let (rows, cols) = (2, 33);
    let data: Vec<i64> = (0..rows * cols).map(|i| [3, 1, 4, 1, 5][i % 5]).collect();
    let tokens = Tokens::from_rows(&data, rows, cols, cfg.vocab_size).unwrap();
    let l32 = train::<f32>(&cfg, &tokens, 40);
    let l64 = train::<f64>(&cfg, &tokens, 40);
    eprintln!("f64 loss: {:.4} -> {:.4}", l64[0], l64[39]);
    assert!(l64[39] < 0.5 * l64[0], "{l64:?}");
    // Same trajectory to f32 accuracy (the optimiser amplifies rounding a little).
    for (a, b) in l32.iter().zip(&l64) {
        assert!((a - b).abs() < 1e-3 * b.max(1.0), "{a} vs {b}");
    }
}
