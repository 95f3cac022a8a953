//! The Mamba-3 training step on the GPU against the CPU float64 oracle, in
//! both precisions: loss, logits and every gradient (one generic body, run
//! with each precision's configs and bounds), one AdamW step, the two
//! precisions training side by side, and the ops run one by one.
//! `gpu_mamba3_graph` tests the captured graphs.
//!
//! Every GPU test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored` (add `--nocapture` to see the per-family
//! error tables). Weights and tokens are fresh random draws each run; the
//! seed is printed so a failure can be replayed.

mod gpu_common;

use std::collections::BTreeMap;

use gpu_common::gpu;
use gpu_common::oracle::{cpu_tokens, fresh_seed, random_step, random_tokens, random_weights};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::device::Gpu;
use stepgraph::float::Float;
use stepgraph::graph::TrainingStep;
use stepgraph::mamba3::cpu::{self, ScanMode, param_specs};
use stepgraph::mamba3::gpu::{ModelCompute, StepWeights, backward, forward, zero_grads};
use stepgraph::mamba3::{AActivation, Mamba3Config, RopeAngles, RopeFraction};
use stepgraph::optim::gpu::advance_schedule;
use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy};
use stepgraph::step::{F32Step, Mamba3Step, adamw_step};

/// Cosine similarity of a GPU tensor (or another f64 reference) with its
/// f64 reference.
fn cosine<G: Copy + Into<f64>>(got: &[G], want: &[f64]) -> f64 {
    let (mut dot, mut ng, mut nw) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let g: f64 = g.into();
        dot += g * w;
        ng += g * g;
        nw += w * w;
    }
    if ng == 0.0 && nw == 0.0 {
        return 1.0;
    }
    dot / (ng.sqrt() * nw.sqrt())
}

/// `w` with the tensors the bf16 step keeps bf16 copies of (every
/// `in_proj` and `out_proj`, the embedding, an untied LM head) rounded as
/// the step rounds them: to the f32 master, then to bf16.
fn gemm_weights_in_bf16(cfg: &Mamba3Config, w: &cpu::Weights<f64>) -> cpu::Weights<f64> {
    let names: Vec<String> = w.named(cfg).into_iter().map(|(s, _)| s.name).collect();
    let mut out = w.clone();
    for (t, name) in out.tensors_mut().into_iter().zip(&names) {
        if ["in_proj", "out_proj", "embedding", "lm_head"]
            .iter()
            .any(|k| name.contains(k))
        {
            for v in t.iter_mut() {
                // f64 -> f32 is the master's own rounding, as the step's upload does.
                *v = f64::from(bf16::from_f32(f32::from_f64(*v)));
            }
        }
    }
    out
}

/// `backbone.layers.3.mixer.D` -> `layers.*.mixer.D`.
fn family(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').filter(|p| *p != "backbone").collect();
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i > 0 && parts[i - 1] == "layers" && p.parse::<usize>().is_ok() {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Worst (largest relative error, smallest cosine) per family.
type Table = BTreeMap<String, (f64, f64)>;

fn record(table: &mut Table, key: String, err: f64, cos: f64) {
    let e = table.entry(key).or_insert((0.0, 1.0));
    e.0 = e.0.max(err);
    e.1 = e.1.min(cos);
}

fn print_table(title: &str, table: &Table) {
    println!("== {title}: worst relative error / cosine per tensor family");
    for (k, (e, c)) in table {
        println!("  {k:<40} rel {e:.3e}  cos {c:.6}");
    }
}

/// What one precision is held to against the oracle.
struct Bounds {
    /// Relative error of the loss.
    loss: f64,
    /// Relative error of the logits, when checked.
    logits: Option<f64>,
    /// Relative error of every gradient tensor.
    grad_rel: f64,
    /// Smallest cosine of every gradient tensor with its reference.
    grad_cos: f64,
    /// For bf16: a gradient tensor whose exact value itself moves by rel
    /// `s` (cosine `1 - d`) when only the GEMM weights are rounded to bf16,
    /// as the step rounds them, is held to `max(grad_rel, c s)` and
    /// `min(grad_cos, 1 - c d)` with this `c`. A small tensor summed over a
    /// short batch can cancel to a fraction of its terms, and then no bf16
    /// step can meet a fixed bound: on the CPU, rounding the GEMM weights
    /// alone moved `dt_bias`'s gradient (8 values, batch 3 x 20 tokens) by
    /// rel 6.9e-2 at seed 1221579693, where the H200 step was at 5.9e-2 and
    /// failed the 5e-2 bound, and by more than 5e-2 at about one seed in
    /// 150 of each config tried. `c = 3` leaves room for the activations'
    /// rounding (u, o and the final norm's output, GEMM operands too),
    /// which adds perturbations of the same size.
    conditioning: Option<f64>,
}

/// f32 against f64: tight everywhere.
const F32_BOUNDS: Bounds = Bounds {
    loss: 1e-5,
    logits: Some(1e-5),
    grad_rel: 1e-4,
    grad_cos: 0.0,
    conditioning: None,
};

/// bf16 mixed precision: the bound on every gradient tensor.
const BF16_BOUNDS: Bounds = Bounds {
    loss: 1e-2,
    logits: None,
    grad_rel: 5e-2,
    grad_cos: 0.999,
    conditioning: Some(3.0),
};

/// Loss, logits and every gradient of one config against the oracle, at
/// compute type `P`; the per-family worst values go into `table`, and every
/// (config, tensor) past `bounds` into `over` (checked once all configs
/// ran, so one run shows the whole picture).
#[expect(
    clippy::too_many_arguments,
    reason = "one config's case plus the tables every case adds to"
)]
fn check_against_oracle<P: ModelCompute>(
    gpu: &Gpu,
    label: &str,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    bounds: &Bounds,
    table: &mut Table,
    over: &mut Vec<String>,
) {
    let seed = fresh_seed();
    let w64 = random_weights(cfg, seed);
    let ids = random_tokens(cfg, batch, len, seed);
    let toks = cpu_tokens(cfg, &ids, batch, len);
    let fwd = cpu::forward(cfg, &w64, &toks, None, ScanMode::Chunked).expect("oracle forward");
    let g64 = cpu::backward(cfg, &w64, &fwd);
    // The exact gradients again from the GEMM weights the bf16 step holds.
    let g64_rounded = bounds.conditioning.map(|_| {
        let w = gemm_weights_in_bf16(cfg, &w64);
        let f = cpu::forward(cfg, &w, &toks, None, ScanMode::Chunked).expect("oracle forward");
        cpu::backward(cfg, &w, &f)
    });

    // The same weights and tokens, drawn from the same seed.
    let mut step = random_step::<P>(gpu, cfg, batch, len, seed);
    // Poison the outputs first: nothing may pass by leaving old values.
    for g in step.grads.params.tensors_mut() {
        stepgraph::kernels::fill(gpu, g, f32::NAN).expect("poison");
    }
    stepgraph::kernels::fill(gpu, &mut step.acts.logits, f32::NAN).expect("poison");
    stepgraph::kernels::fill(gpu, &mut step.loss, f32::NAN).expect("poison");
    forward(
        gpu,
        &step.weights,
        &step.tokens,
        &mut step.acts,
        &mut step.loss,
    )
    .expect("gpu forward");
    backward(
        gpu,
        &step.weights,
        &step.tokens,
        &step.acts,
        &mut step.grads,
    )
    .expect("gpu backward");

    let loss = step.loss(gpu).expect("loss");
    let loss_err = (f64::from(loss) - fwd.loss).abs() / fwd.loss.abs();
    let logits = gpu.to_host(&step.acts.logits).expect("logits");
    let logit_err = gpu_common::rel_err(&logits, &fwd.logits);
    record(table, "loss".into(), loss_err, 1.0);
    record(
        table,
        "logits".into(),
        logit_err,
        cosine(&logits, &fwd.logits),
    );
    if loss_err.is_nan() || loss_err > bounds.loss {
        over.push(format!("[{label}] seed {seed}: loss rel err {loss_err:e}"));
    }
    if bounds
        .logits
        .is_some_and(|b| logit_err.is_nan() || logit_err > b)
    {
        over.push(format!(
            "[{label}] seed {seed}: logits rel err {logit_err:e}"
        ));
    }
    let got = step.grads.download(gpu).expect("grads");
    let (mut worst, mut worst_cos) = ((0.0f64, String::new()), (1.0f64, String::new()));
    let rounded = g64_rounded.as_ref().map(|g| g.tensors());
    for (i, ((spec, want), have)) in g64.named(cfg).into_iter().zip(got.tensors()).enumerate() {
        let moved = rounded.as_ref().map(|r| r[i]);
        let e = gpu_common::rel_err(have, want);
        let c = cosine(have, want);
        record(table, format!("grad {}", family(&spec.name)), e, c);
        if e > worst.0 {
            worst = (e, spec.name.clone());
        }
        if c < worst_cos.0 {
            worst_cos = (c, spec.name.clone());
        }
        let (mut rel_bound, mut cos_bound) = (bounds.grad_rel, bounds.grad_cos);
        if let (Some(k), Some(moved)) = (bounds.conditioning, moved) {
            let (s, d) = (gpu_common::rel_err(moved, want), 1.0 - cosine(moved, want));
            if k * s > rel_bound || 1.0 - k * d < cos_bound {
                rel_bound = rel_bound.max(k * s);
                cos_bound = cos_bound.min(1.0 - k * d);
                println!(
                    "[{label}] seed {seed}: {} moves by rel {s:.2e} (cosine {:.6}) with the GEMM weights in bf16: held to rel {rel_bound:.2e}, cosine {cos_bound:.6}",
                    spec.name,
                    1.0 - d
                );
            }
        }
        if !(e <= rel_bound && c >= cos_bound) {
            over.push(format!(
                "[{label}] seed {seed}: gradient {} rel err {e:.3e}, cosine {c:.6} (bounds {rel_bound:.2e}, {cos_bound:.6})",
                spec.name
            ));
        }
    }
    println!(
        "[{label}] {} seed {seed}: loss gpu {loss} f64 {} rel {loss_err:.2e}; logits rel {logit_err:.2e}; worst grad rel {:.3e} ({}), worst cos {:.6} ({})",
        P::PRECISION,
        fwd.loss,
        worst.0,
        worst.1,
        worst_cos.0,
        worst_cos.1
    );
}

/// Runs [`check_against_oracle`] over `configs` and fails listing every
/// tensor past the bounds.
fn oracle_suite<P: ModelCompute>(configs: &[(&str, Mamba3Config, usize, usize)], bounds: &Bounds) {
    let gpu = gpu();
    let mut table = Table::new();
    let mut over = Vec::new();
    for (label, cfg, b, t) in configs {
        check_against_oracle::<P>(&gpu, label, cfg, *b, *t, bounds, &mut table, &mut over);
    }
    print_table(&format!("{} vs f64 oracle", P::PRECISION), &table);
    assert!(over.is_empty(), "past the bounds:\n{}", over.join("\n"));
}

/// The configs both precisions are checked on, around `base`; `wide` is the
/// widest shape each runs.
fn oracle_configs(
    base: &Mamba3Config,
    wide: Mamba3Config,
) -> Vec<(&'static str, Mamba3Config, usize, usize)> {
    let with = |f: &dyn Fn(&mut Mamba3Config)| {
        let mut c = base.clone();
        f(&mut c);
        c
    };
    vec![
        ("base B2 T16", base.clone(), 2, 16),
        (
            "rope 1.0",
            with(&|c| c.rope_fraction = RopeFraction::Full),
            2,
            16,
        ),
        ("ngroups 2", with(&|c| c.ngroups = 2), 2, 16),
        ("outproj norm", with(&|c| c.is_outproj_norm = true), 2, 16),
        ("untied head", with(&|c| c.tie_embeddings = false), 2, 16),
        ("B3", base.clone(), 3, 20),
        ("T130", base.clone(), 2, 130),
        // One token a sequence. With 2 sequences the bf16 norm weights'
        // gradients are sums of two bf16-rounded terms; when they cancel
        // the tensor's relative error passed the bound (5.5e-2 and 9.8e-2,
        // seen twice on the H200 over two sessions' runs: bf16 noise with
        // nothing to average); 8 sequences keep the edge case (no state
        // carried) with a sum to average over.
        ("T1", base.clone(), 8, 1),
        (
            "chunk 8, T37",
            with(&|c| {
                c.chunk_size = 8;
                c.ngroups = 2;
                c.is_outproj_norm = true;
            }),
            2,
            37,
        ),
        ("wide", wide, 2, 70),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_loss_logits_and_gradients_match_the_f64_oracle() {
    let base = Mamba3Config::tiny();
    let mut configs = oracle_configs(
        &base,
        Mamba3Config {
            d_model: 64,
            d_state: 32,
            headdim: 16,
            vocab_size: 50,
            ..Mamba3Config::tiny()
        },
    );
    let softplus = Mamba3Config {
        a_activation: AActivation::Softplus,
        ..base
    };
    configs.push(("softplus A", softplus, 2, 16));
    // N 64 takes the tiled rotation backward (N 32 and below its warp
    // form); two groups, and 140 rows: a partial last tile.
    let tiled = Mamba3Config {
        d_model: 64,
        d_state: 64,
        headdim: 16,
        ngroups: 2,
        vocab_size: 50,
        ..Mamba3Config::tiny()
    };
    configs.push(("tiled d64 N64 G2", tiled.clone(), 2, 70));
    // 160 heads in one group: past the 128 whose dqkdot * lam * dt the
    // tiled kernel stages in shared memory, so it reads them inline.
    let many_heads = Mamba3Config {
        d_model: 320,
        d_state: 64,
        headdim: 4,
        ngroups: 1,
        vocab_size: 50,
        ..Mamba3Config::tiny()
    };
    configs.push(("tiled 160 heads a group", many_heads, 2, 21));
    // Standard RoPE (`--rotation fixed`): m3_angle_fixed_f32's angles, and
    // no gradient through them, whatever the (random) angle rows hold.
    let fixed = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..tiled
    };
    configs.push(("fixed RoPE d64 N64 G2", fixed, 2, 70));
    oracle_suite::<f32>(&configs, &F32_BOUNDS);
}

/// The bf16 comparison runs at head width 16 (d_model 64, N 32): at the
/// 4-wide heads of `Mamba3Config::tiny()` a few bf16 roundings dominate
/// whole gradient tensors (measured on the H200: up to rel 2.5e-1 for an
/// untied-head config, seed-dependent), which says more about 4-element
/// reductions than about the step. The tiny width still runs in every bf16
/// graph test.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_loss_and_gradients_match_the_f64_oracle() {
    let base = Mamba3Config {
        d_model: 64,
        d_state: 32,
        headdim: 16,
        vocab_size: 50,
        ..Mamba3Config::tiny()
    };
    let wide = Mamba3Config {
        d_model: 128,
        d_state: 64,
        headdim: 32,
        ..base.clone()
    };
    let mut configs = oracle_configs(&base, wide);
    // The tiled rotation backward (N 64) with two groups and a partial last
    // tile (130 rows, tiles of 8).
    let tiled = Mamba3Config {
        d_model: 128,
        d_state: 64,
        headdim: 16,
        ngroups: 2,
        ..base.clone()
    };
    configs.push(("wider d128 N64 P16 G2", tiled.clone(), 2, 65));
    let fixed = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..tiled
    };
    configs.push(("fixed RoPE d128 N64 P16 G2", fixed, 2, 65));
    oracle_suite::<bf16>(&configs, &BF16_BOUNDS);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_adamw_step_matches_the_oracle() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        is_outproj_norm: true,
        tie_embeddings: false,
        ..Mamba3Config::tiny()
    };
    let (batch, len) = (2, 24);
    let seed = fresh_seed();
    let mut w64 = random_weights(&cfg, seed);
    let ids = random_tokens(&cfg, batch, len, seed);
    let adam_cfg = AdamWConfig {
        lr: 3e-3,
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let policy = DecayPolicy::default();
    let mut step = F32Step::new(&gpu, &cfg, &w64, &adam_cfg, &policy, batch, len).expect("step");
    step.set_tokens(&gpu, &ids).expect("tokens");
    step.run_eager(&gpu).expect("eager step");
    assert_eq!(step.sched.steps(&gpu).expect("steps"), 1);

    let toks = cpu_tokens(&cfg, &ids, batch, len);
    let fwd = cpu::forward(&cfg, &w64, &toks, None, ScanMode::Chunked).expect("oracle forward");
    let g64 = cpu::backward(&cfg, &w64, &fwd);
    let mut opt = AdamW::<f64>::new(adam_cfg, &stepgraph::step::params(&cfg), &policy);
    opt.step(&mut w64.tensors_mut(), &g64.tensors())
        .expect("cpu adamw");

    let mut table = Table::new();
    let w = step.weights.download(&gpu).expect("weights");
    let m = step.adam.m.download(&gpu).expect("m");
    let v = step.adam.v.download(&gpu).expect("v");
    let specs = param_specs(&cfg);
    for (i, spec) in specs.iter().enumerate() {
        let (m64, v64) = opt.moments(i).expect("moments");
        let ew = gpu_common::rel_err(w.tensors()[i], w64.tensors()[i]);
        let em = gpu_common::rel_err(&m[i], m64);
        let ev = gpu_common::rel_err(&v[i], v64);
        record(
            &mut table,
            format!("weight {}", family(&spec.name)),
            ew,
            1.0,
        );
        record(
            &mut table,
            format!("adam m {}", family(&spec.name)),
            em,
            1.0,
        );
        record(
            &mut table,
            format!("adam v {}", family(&spec.name)),
            ev,
            1.0,
        );
        assert!(
            ew <= 1e-5,
            "seed {seed}: weight {} rel err {ew:e}",
            spec.name
        );
        assert!(
            em <= 1e-4 && ev <= 1e-4,
            "seed {seed}: moments of {} rel err {em:e} / {ev:e}",
            spec.name
        );
    }
    print_table("after one AdamW step", &table);
}

/// `[batch, len + 1]` windows of a noisy counter: each next token is the
/// previous one plus 1 or 2 (mod vocab), so the best achievable loss is
/// ln 2 and neither run can overfit to zero.
fn counter_batches(
    vocab: usize,
    batch: usize,
    len: usize,
    steps: usize,
    seed: u64,
) -> Vec<Vec<i32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let v = i32::try_from(vocab).expect("small vocab");
    (0..steps)
        .map(|_| {
            let mut out = Vec::with_capacity(batch * (len + 1));
            for _ in 0..batch {
                let mut t = rng.random_range(0..v);
                for _ in 0..=len {
                    out.push(t);
                    t = (t + rng.random_range(1..=2)) % v;
                }
            }
            out
        })
        .collect()
}

/// The loss of every eager step over `data`, at compute type `P`.
fn train_losses<P: ModelCompute>(
    gpu: &Gpu,
    cfg: &Mamba3Config,
    w64: &cpu::Weights<f64>,
    adam: &AdamWConfig,
    (batch, len): (usize, usize),
    data: &[Vec<i32>],
) -> Vec<f32>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let policy = DecayPolicy::default();
    let mut s = Mamba3Step::<P>::new(gpu, cfg, w64, adam, &policy, batch, len).expect("step");
    data.iter()
        .map(|ids| {
            s.set_tokens(gpu, ids).expect("tokens");
            s.run_eager(gpu).expect("step");
            s.loss(gpu).expect("loss")
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_and_f32_train_to_the_same_loss_in_300_steps() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        d_model: 32,
        n_layer: 2,
        vocab_size: 16,
        d_state: 16,
        headdim: 8,
        ..Mamba3Config::tiny()
    };
    let (batch, len, steps) = (8, 32, 300);
    let seed = 20_261_202;
    let w64 = cpu::Weights::<f64>::init(&cfg, seed).expect("init");
    let adam = AdamWConfig {
        lr: 3e-3,
        ..AdamWConfig::default()
    };
    let data = counter_batches(cfg.vocab_size, batch, len, steps, seed);
    let l32 = train_losses::<f32>(&gpu, &cfg, &w64, &adam, (batch, len), &data);
    let l16 = train_losses::<bf16>(&gpu, &cfg, &w64, &adam, (batch, len), &data);
    // The last step's loss is one batch's; the mean of the last 10 is the
    // same comparison with less sampling noise. Both are printed and checked.
    let tail = |v: &[f32]| v[v.len() - 10..].iter().map(|&x| f64::from(x)).sum::<f64>() / 10.0;
    let (t32, t16) = (tail(&l32), tail(&l16));
    let (f32_last, bf16_last) = (f64::from(l32[steps - 1]), f64::from(l16[steps - 1]));
    for i in [0, 50, 100, 200, 299] {
        println!("step {i:>3}: f32 {:.5}  bf16 {:.5}", l32[i], l16[i]);
    }
    println!(
        "300 steps: final loss f32 {f32_last:.5} bf16 {bf16_last:.5} ({:+.2}%); mean of last 10 f32 {t32:.5} bf16 {t16:.5} ({:+.2}%); floor ln 2 = 0.69315",
        100.0 * (bf16_last - f32_last) / f32_last,
        100.0 * (t16 - t32) / t32
    );
    assert!(t32 < f64::from(l32[0]) * 0.75, "f32 did not learn: {t32}");
    assert!((t16 - t32).abs() <= 0.02 * t32, "tail means {t32} vs {t16}");
    assert!(
        (bf16_last - f32_last).abs() <= 0.02 * f32_last,
        "final losses {f32_last} vs {bf16_last}"
    );
}

#[test]
#[ignore = "needs NVRTC (CUDA_HOME)"]
fn every_mamba3_kernel_module_compiles_with_nvrtc() {
    use stepgraph::device::nvrtc;
    use stepgraph::kernels::{HEADERS, MODULES};
    for m in MODULES
        .iter()
        .filter(|m| m.source.file.starts_with("mamba3"))
    {
        let mut opts = nvrtc::compile_options("sm_90");
        // The runtime adds the toolkit's include directory (cuda_bf16.h for
        // the bf16 instantiations); so does this check.
        let toolkit = stepgraph::device::probe::toolkit_from_env().expect("CUDA_HOME");
        opts.push(format!("--include-path={}", toolkit.include.display()));
        if let Err(e) = nvrtc::compile(&m.source, HEADERS, &opts) {
            panic!("{e}");
        }
    }
}

/// Every op of the step called by hand, in spec order, at compute type `P`.
fn ops_run_directly<P: ModelCompute>() {
    let gpu = gpu();
    let cfg = Mamba3Config::tiny();
    let mut s = random_step::<P>(&gpu, &cfg, 2, 8, fresh_seed());
    zero_grads(&gpu, &mut s.grads).expect("zero");
    for g in s.grads.params.tensors() {
        assert!(gpu.to_host(g).expect("download").iter().all(|&v| v == 0.0));
    }
    forward(&gpu, &s.weights, &s.tokens, &mut s.acts, &mut s.loss).expect("forward");
    backward(&gpu, &s.weights, &s.tokens, &s.acts, &mut s.grads).expect("backward");
    advance_schedule(&gpu, &mut s.sched).expect("schedule");
    let before = s.weights.master().download(&gpu).expect("weights");
    adamw_step(&gpu, &s.grads, &s.sched, &mut s.weights, &mut s.adam).expect("adamw");
    assert_eq!(s.sched.steps(&gpu).expect("steps"), 1);
    let after = s.weights.master().download(&gpu).expect("weights");
    assert_ne!(before.tensors(), after.tensors(), "AdamW changed nothing");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ops_run_directly_and_zero_grads_zeroes() {
    ops_run_directly::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_ops_run_directly_and_zero_grads_zeroes() {
    ops_run_directly::<bf16>();
}
