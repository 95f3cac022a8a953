//! Shared helpers for the CPU model tests: small configs, perturbed weights
//! and random token batches.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::mamba3::cpu::{Tokens, Weights};
use stepgraph::mamba3::{Mamba3Config, RopeFraction};

/// A tiny model: d_model 8, 2 layers, N = 8, P = 4, H = 4.
pub fn tiny(rope: RopeFraction, ngroups: usize, outproj_norm: bool, tied: bool) -> Mamba3Config {
    Mamba3Config {
        rope_fraction: rope,
        ngroups,
        is_outproj_norm: outproj_norm,
        tie_embeddings: tied,
        ..Mamba3Config::tiny()
    }
}

/// Official-init weights with every tensor perturbed, so that no gradient is
/// hidden by a symmetric initial value (ones, identical biases) and the
/// dynamics (trap, A, angles) are far from their init point.
pub fn random_weights(cfg: &Mamba3Config, seed: u64) -> Weights<f64> {
    let mut w = Weights::<f64>::init(cfg, seed).expect("valid config");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    for t in w.tensors_mut() {
        let scale = t.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(0.05);
        for v in t.iter_mut() {
            *v += 0.5 * scale * (2.0 * rng.random::<f64>() - 1.0);
        }
    }
    w
}

/// A random `[rows, cols]` token tensor with ids below `vocab`.
pub fn random_token_data(rows: usize, cols: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let vocab = i64::try_from(vocab).expect("small vocab");
    (0..rows * cols)
        .map(|_| rng.random_range(0..vocab))
        .collect()
}

/// Random tokens as a validated batch of `rows` x `len` predictions.
pub fn random_tokens(cfg: &Mamba3Config, rows: usize, len: usize, seed: u64) -> Tokens {
    let data = random_token_data(rows, len + 1, cfg.vocab_size, seed);
    Tokens::from_rows(&data, rows, len + 1, cfg.vocab_size).expect("valid tokens")
}

/// Largest `|a - b|` relative to the largest `|b|`.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}
