//! Random models and batches for comparing a GPU step with the CPU oracle.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::device::Gpu;
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::{self, ParamKind, Tokens, param_specs};
use stepgraph::mamba3::gpu::ModelCompute;
use stepgraph::optim::{AdamWConfig, DecayPolicy};
use stepgraph::step::{F32Step, Mamba3Step};

/// A seed that differs every run; tests print it so a failure can be
/// replayed with `STEPGRAPH_TEST_SEED=<seed>`, which every call then returns.
pub fn fresh_seed() -> u64 {
    if let Some(s) = std::env::var("STEPGRAPH_TEST_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return s;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7);
    u64::from(nanos) ^ 0x5eed_0000
}

/// Official init, then every tensor perturbed so that norms, biases, D and
/// dt_bias are not their init constants and every gradient path is exercised.
pub fn random_weights(cfg: &Mamba3Config, seed: u64) -> cpu::Weights<f64> {
    let mut w = cpu::Weights::<f64>::init(cfg, seed).expect("valid config");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xabcd);
    let specs = param_specs(cfg);
    for (t, spec) in w.tensors_mut().into_iter().zip(&specs) {
        for v in t.iter_mut() {
            *v += match spec.kind {
                ParamKind::Vector => rng.random_range(-0.4..0.4),
                ParamKind::Matrix => rng.random_range(-0.05..0.05),
            };
        }
    }
    w
}

pub fn random_tokens(cfg: &Mamba3Config, batch: usize, len: usize, seed: u64) -> Vec<i32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x70c3);
    let vocab = i32::try_from(cfg.vocab_size).expect("small vocab");
    (0..batch * (len + 1))
        .map(|_| rng.random_range(0..vocab))
        .collect()
}

pub fn cpu_tokens(cfg: &Mamba3Config, ids: &[i32], batch: usize, len: usize) -> Tokens {
    let wide: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    Tokens::from_rows(&wide, batch, len + 1, cfg.vocab_size).expect("valid tokens")
}

/// A step at compute type `P` with [`random_weights`] and [`random_tokens`]
/// from `seed`, default AdamW settings, nothing run yet.
pub fn random_step<P: ModelCompute>(
    gpu: &Gpu,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    seed: u64,
) -> Mamba3Step<P> {
    let w64 = random_weights(cfg, seed);
    let mut s = Mamba3Step::<P>::new(
        gpu,
        cfg,
        &w64,
        &AdamWConfig::default(),
        &DecayPolicy::default(),
        batch,
        len,
    )
    .expect("step");
    s.set_tokens(gpu, &random_tokens(cfg, batch, len, seed))
        .expect("tokens");
    s
}

/// [`random_step`] in f32.
pub fn random_f32_step(
    gpu: &Gpu,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    seed: u64,
) -> F32Step {
    random_step::<f32>(gpu, cfg, batch, len, seed)
}
