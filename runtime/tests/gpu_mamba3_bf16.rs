//! The bf16 mixed-precision Mamba-3 step on the GPU against the CPU float64
//! oracle, against the f32 step in training, and its graph: replay equals
//! eager bit for bit, runs are reproducible, every moved buffer or scratch
//! area is refused by name, and scratch never grows after capture.
//!
//! Every GPU test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored` (`--nocapture` shows the per-family tables).
//! Weights and tokens are fresh random draws each run; the seed is printed.

mod gpu_common;

use std::collections::BTreeMap;

use gpu_common::gpu;
use gpu_common::oracle::{cpu_tokens, fresh_seed, random_tokens, random_weights};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::device::{
    DeviceBuffer, GEMM_WORKSPACE, Gpu, GpuError, HALF_STAGING, REDUCE_PARTIALS,
};
use stepgraph::graph::{Backend as _, GraphError, ShapeKey};
use stepgraph::mamba3::cpu::{self, ScanMode};
use stepgraph::mamba3::gpu::{
    Bf16Step, F32Step, Mamba3Bf16Graph, Mamba3F32Graph, Mamba3GpuError, backward_mixed,
    forward_mixed,
};
use stepgraph::mamba3::{Mamba3Config, RopeFraction};
use stepgraph::optim::{AdamWConfig, DecayPolicy};

/// Cosine similarity of a GPU tensor with its f64 reference.
fn cosine(got: &[f32], want: &[f64]) -> f64 {
    let (mut dot, mut ng, mut nw) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let g = f64::from(g);
        dot += g * w;
        ng += g * g;
        nw += w * w;
    }
    if ng == 0.0 && nw == 0.0 {
        return 1.0;
    }
    dot / (ng.sqrt() * nw.sqrt())
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

fn base_cfg() -> Mamba3Config {
    Mamba3Config::tiny()
}

/// The oracle comparison runs the configs at head width 16
/// (d_model 64, N 32): at the 4-wide heads of `Mamba3Config::tiny()` a few
/// bf16 roundings dominate whole gradient tensors (measured on the H200: up
/// to rel 2.5e-1 for an untied-head config, seed-dependent), which says more
/// about 4-element reductions than about the step. The tiny width still runs
/// in every other bf16 test here.
fn oracle_cfg() -> Mamba3Config {
    Mamba3Config {
        d_model: 64,
        d_state: 32,
        headdim: 16,
        vocab_size: 50,
        ..Mamba3Config::tiny()
    }
}

fn new_bf16(gpu: &Gpu, cfg: &Mamba3Config, w: &cpu::Weights<f64>, b: usize, t: usize) -> Bf16Step {
    Bf16Step::new(
        gpu,
        cfg,
        w,
        &AdamWConfig::default(),
        &DecayPolicy::default(),
        b,
        t,
    )
    .expect("bf16 step")
}

/// The bound on every gradient tensor: relative error and cosine.
const GRAD_REL: f64 = 5e-2;
const GRAD_COS: f64 = 0.999;

/// Loss, logits and every gradient of one config against the oracle; the
/// per-family worst values go into `table`, and every (config, tensor) past
/// the bounds into `over` (checked once all configs ran, so one run shows
/// the whole picture).
fn check_against_oracle(
    gpu: &Gpu,
    label: &str,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    table: &mut Table,
    over: &mut Vec<String>,
) {
    let seed = fresh_seed();
    let w64 = random_weights(cfg, seed);
    let ids = random_tokens(cfg, batch, len, seed);
    let toks = cpu_tokens(cfg, &ids, batch, len);
    let fwd = cpu::forward(cfg, &w64, &toks, None, ScanMode::Chunked).expect("oracle forward");
    let g64 = cpu::backward(cfg, &w64, &fwd);

    let mut step = new_bf16(gpu, cfg, &w64, batch, len);
    step.set_tokens(gpu, &ids).expect("tokens");
    for g in step.grads.params.tensors_mut() {
        stepgraph::kernels::fill(gpu, g, f32::NAN).expect("poison");
    }
    stepgraph::kernels::fill(gpu, &mut step.loss, f32::NAN).expect("poison");
    forward_mixed(
        gpu,
        &step.weights,
        &step.tokens,
        &mut step.acts,
        &mut step.loss,
    )
    .expect("bf16 forward");
    backward_mixed(
        gpu,
        &step.weights,
        &step.tokens,
        &step.acts,
        &mut step.grads,
    )
    .expect("bf16 backward");

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
    if loss_err > 1e-2 {
        over.push(format!("[{label}] seed {seed}: loss rel err {loss_err:e}"));
    }
    let got = step.grads.download(gpu).expect("grads");
    let (mut worst, mut worst_cos) = ((0.0f64, String::new()), (1.0f64, String::new()));
    for ((spec, want), have) in g64.named(cfg).into_iter().zip(got.tensors()) {
        let e = gpu_common::rel_err(have, want);
        let c = cosine(have, want);
        record(table, format!("grad {}", family(&spec.name)), e, c);
        if e > worst.0 {
            worst = (e, spec.name.clone());
        }
        if c < worst_cos.0 {
            worst_cos = (c, spec.name.clone());
        }
        if !(e <= GRAD_REL && c >= GRAD_COS) {
            over.push(format!(
                "[{label}] seed {seed}: gradient {} rel err {e:.3e}, cosine {c:.6}",
                spec.name
            ));
        }
    }
    println!(
        "[{label}] seed {seed}: loss bf16 {loss} f64 {} rel {loss_err:.2e}; logits rel {logit_err:.2e}; worst grad rel {:.3e} ({}), worst cos {:.6} ({})",
        fwd.loss, worst.0, worst.1, worst_cos.0, worst_cos.1
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_loss_and_gradients_match_the_f64_oracle() {
    let gpu = gpu();
    let mut table = Table::new();
    let tiny = oracle_cfg();
    let configs: Vec<(&str, Mamba3Config, usize, usize)> = vec![
        ("base B2 T16", tiny.clone(), 2, 16),
        (
            "rope 1.0",
            Mamba3Config {
                rope_fraction: RopeFraction::Full,
                ..oracle_cfg()
            },
            2,
            16,
        ),
        (
            "ngroups 2",
            Mamba3Config {
                ngroups: 2,
                ..oracle_cfg()
            },
            2,
            16,
        ),
        (
            "outproj norm",
            Mamba3Config {
                is_outproj_norm: true,
                ..oracle_cfg()
            },
            2,
            16,
        ),
        (
            "untied head",
            Mamba3Config {
                tie_embeddings: false,
                ..oracle_cfg()
            },
            2,
            16,
        ),
        ("B3", tiny.clone(), 3, 20),
        ("T130", tiny.clone(), 2, 130),
        // One token a sequence. With 2 sequences the norm weights'
        // gradients were sums of two bf16-rounded terms, and one of them
        // cancelling left a tensor at rel 5.5e-2 / 9.8e-2 on 2 of ~20 random
        // seeds on the H200 (bf16 noise, no averaging); 8 sequences keep
        // the edge case (no state carried) with a sum to average over.
        ("T1", tiny.clone(), 8, 1),
        (
            "chunk 8, T37",
            Mamba3Config {
                chunk_size: 8,
                ngroups: 2,
                is_outproj_norm: true,
                ..oracle_cfg()
            },
            2,
            37,
        ),
        (
            "wider d128 N64 P32",
            Mamba3Config {
                d_model: 128,
                d_state: 64,
                headdim: 32,
                vocab_size: 50,
                ..oracle_cfg()
            },
            2,
            70,
        ),
        (
            // The pair-tiled q/k and rotation kernels with two groups and
            // a partial last tile (130 rows, tiles of 32).
            "wider d128 N64 P16 G2",
            Mamba3Config {
                d_model: 128,
                d_state: 64,
                headdim: 16,
                ngroups: 2,
                vocab_size: 50,
                ..oracle_cfg()
            },
            2,
            65,
        ),
    ];
    let mut over = Vec::new();
    for (label, cfg, b, t) in &configs {
        check_against_oracle(&gpu, label, cfg, *b, *t, &mut table, &mut over);
    }
    println!("== bf16 vs f64 oracle: worst relative error / cosine per tensor family");
    for (k, (e, c)) in &table {
        println!("  {k:<40} rel {e:.3e}  cos {c:.6}");
    }
    assert!(over.is_empty(), "past the bounds:\n{}", over.join("\n"));
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
    let policy = DecayPolicy::default();
    let data = counter_batches(cfg.vocab_size, batch, len, steps, seed);
    let mut f32s = F32Step::new(&gpu, &cfg, &w64, &adam, &policy, batch, len).expect("f32 step");
    let mut bf16s = Bf16Step::new(&gpu, &cfg, &w64, &adam, &policy, batch, len).expect("bf16 step");
    let (mut l32, mut l16) = (Vec::new(), Vec::new());
    for ids in &data {
        f32s.set_tokens(&gpu, ids).expect("tokens");
        f32s.run_eager(&gpu).expect("f32 step");
        l32.push(f32s.loss(&gpu).expect("loss"));
        bf16s.set_tokens(&gpu, ids).expect("tokens");
        bf16s.run_eager(&gpu).expect("bf16 step");
        l16.push(bf16s.loss(&gpu).expect("loss"));
    }
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

fn bits(gpu: &Gpu, b: &DeviceBuffer<f32>) -> Vec<u32> {
    gpu.to_host(b)
        .expect("download")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn bits16(gpu: &Gpu, b: &DeviceBuffer<bf16>) -> Vec<u16> {
    gpu.to_host(b)
        .expect("download")
        .into_iter()
        .map(bf16::to_bits)
        .collect()
}

/// Loss, f32 masters, bf16 copies and both moments, as bits.
fn all_bits(gpu: &Gpu, s: &Bf16Step) -> (Vec<u32>, Vec<u16>) {
    let mut out = bits(gpu, &s.loss);
    for t in s
        .weights
        .master
        .tensors()
        .into_iter()
        .chain(s.adam.m.tensors())
        .chain(s.adam.v.tensors())
    {
        out.extend(bits(gpu, t));
    }
    let mut half = bits16(gpu, &s.weights.embedding);
    for l in &s.weights.layers {
        half.extend(bits16(gpu, &l.in_proj));
        half.extend(bits16(gpu, &l.out_proj));
    }
    (out, half)
}

fn seeded_step(gpu: &Gpu, cfg: &Mamba3Config, batch: usize, len: usize, seed: u64) -> Bf16Step {
    let mut s = new_bf16(gpu, cfg, &random_weights(cfg, seed), batch, len);
    s.set_tokens(gpu, &random_tokens(cfg, batch, len, seed))
        .expect("tokens");
    s
}

fn shape(batch: usize, seq_len: usize) -> ShapeKey {
    ShapeKey { batch, seq_len }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_graph_replay_equals_eager_bit_for_bit_over_50_steps() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        is_outproj_norm: true,
        ngroups: 2,
        tie_embeddings: false,
        ..base_cfg()
    };
    let (batch, len) = (2, 70);
    let seed = fresh_seed();
    let mut eager = seeded_step(&gpu, &cfg, batch, len, seed);
    let mut graphed = seeded_step(&gpu, &cfg, batch, len, seed);
    let graph =
        Mamba3Bf16Graph::capture(&gpu, graphed.capture_view(), shape(batch, len)).expect("capture");
    for i in 0..50 {
        eager.run_eager(&gpu).expect("eager");
        graph.replay(&gpu, graphed.replay_view()).expect("replay");
        assert_eq!(
            bits(&gpu, &eager.loss),
            bits(&gpu, &graphed.loss),
            "seed {seed}: loss differs at step {i}"
        );
    }
    assert_eq!(
        all_bits(&gpu, &eager),
        all_bits(&gpu, &graphed),
        "seed {seed}: state differs after 50 steps"
    );
    assert_eq!(graphed.sched.steps(&gpu).expect("steps"), 50);
    // The fused AdamW pass left every bf16 copy equal to its rounded master.
    let w = &graphed.weights;
    let pairs = [
        (&w.master.embedding, &w.embedding),
        (&w.master.layers[1].in_proj, &w.layers[1].in_proj),
        (&w.master.layers[0].out_proj, &w.layers[0].out_proj),
    ];
    for (m, c) in pairs
        .into_iter()
        .chain(w.master.lm_head.iter().zip(w.lm_head.iter()))
    {
        let want: Vec<u16> = gpu
            .to_host(m)
            .expect("master")
            .into_iter()
            .map(|v| bf16::from_f32(v).to_bits())
            .collect();
        assert_eq!(bits16(&gpu, c), want, "seed {seed}: bf16 copy out of sync");
    }
    let l = eager.loss(&gpu).expect("loss");
    assert!(l.is_finite(), "loss {l}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_fresh_bf16_runs_are_bit_identical() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        rope_fraction: RopeFraction::Full,
        ..base_cfg()
    };
    let seed = fresh_seed();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut s = seeded_step(&gpu, &cfg, 3, 100, seed);
        for _ in 0..3 {
            s.run_eager(&gpu).expect("eager");
        }
        runs.push(all_bits(&gpu, &s));
    }
    assert_eq!(runs[0], runs[1], "seed {seed}");
}

/// Reallocates one buffer of the step (same size and contents), keeping the
/// old allocation alive so the new address must differ.
fn move_buffer(gpu: &Gpu, s: &mut Bf16Step, which: &str, keep: &mut Vec<Box<dyn std::any::Any>>) {
    fn realloc<T: stepgraph::device::Element>(
        gpu: &Gpu,
        b: &mut DeviceBuffer<T>,
        keep: &mut Vec<Box<dyn std::any::Any>>,
    ) {
        let mut fresh = gpu.alloc::<T>(b.len()).expect("alloc");
        gpu.copy_device(b, &mut fresh).expect("copy");
        keep.push(Box::new(std::mem::replace(b, fresh)));
    }
    match which {
        "weights" => realloc(gpu, &mut s.weights.layers[1].out_proj, keep),
        "adam" => realloc(gpu, &mut s.adam.v.norm_f, keep),
        "sched" => realloc(gpu, &mut s.sched.derived, keep),
        "grads" => realloc(gpu, &mut s.grads.work.dproj, keep),
        "acts" => realloc(gpu, &mut s.acts.layers[0].u, keep),
        "loss" => realloc(gpu, &mut s.loss, keep),
        "tokens" => realloc(gpu, &mut s.tokens, keep),
        "loss_weights" => realloc(gpu, &mut s.loss_weights, keep),
        "control" => realloc(gpu, &mut s.control.gate, keep),
        other => panic!("unknown buffer {other}"),
    }
}

/// Moves scratch area `name` (same size, new address): thaws, reallocates,
/// freezes again, as a careless caller could between replays.
fn move_scratch(gpu: &Gpu, name: &str) {
    let have = gpu.scratch_bytes(name).expect("scratch size");
    gpu.set_scratch_frozen(false);
    gpu.reallocate_scratch(name).expect("move");
    gpu.set_scratch_frozen(true);
    assert_eq!(gpu.scratch_bytes(name).expect("scratch size"), have);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_moved_buffer_and_scratch_area_is_refused_by_name() {
    let gpu = gpu();
    let cfg = base_cfg();
    let mut s = seeded_step(&gpu, &cfg, 2, 16, fresh_seed());
    s.run_eager(&gpu).expect("warm-up");
    let mut keep = Vec::new();
    let buffers = [
        "weights",
        "adam",
        "sched",
        "grads",
        "acts",
        "control",
        "tokens",
        "loss_weights",
        "loss",
    ];
    let scratch = [HALF_STAGING, GEMM_WORKSPACE, REDUCE_PARTIALS];
    for name in buffers.iter().chain(&scratch) {
        let graph =
            Mamba3Bf16Graph::capture(&gpu, s.capture_view(), shape(2, 16)).expect("capture");
        graph
            .replay(&gpu, s.replay_view())
            .expect("replay before the move");
        let want = if scratch.contains(name) {
            move_scratch(&gpu, name);
            format!("scratch:{name}")
        } else {
            move_buffer(&gpu, &mut s, name, &mut keep);
            (*name).to_owned()
        };
        match graph.replay(&gpu, s.replay_view()) {
            Err(GraphError::PointerMoved { buffer, .. }) => assert_eq!(buffer, want),
            other => panic!("moving `{want}`: expected PointerMoved, got {other:?}"),
        }
        println!("moved {want}: refused by name");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scratch_that_would_grow_after_capture_is_a_typed_error() {
    let gpu = gpu();
    let cfg = base_cfg();
    let mut s = seeded_step(&gpu, &cfg, 2, 16, fresh_seed());
    let graph = Mamba3Bf16Graph::capture(&gpu, s.capture_view(), shape(2, 16)).expect("capture");
    let before = gpu.scratch_bytes(HALF_STAGING).expect("size");
    // A step 8x larger needs more staging than the captured one presized.
    let w64 = random_weights(&cfg, 3);
    match Bf16Step::new(
        &gpu,
        &cfg,
        &w64,
        &AdamWConfig::default(),
        &DecayPolicy::default(),
        16,
        16,
    ) {
        Err(Mamba3GpuError::Gpu(GpuError::ScratchFrozen { name, have, want })) => {
            assert_eq!(name, HALF_STAGING);
            assert_eq!(have, before);
            assert!(want > have, "{want} vs {have}");
        }
        other => panic!("expected ScratchFrozen, got {other:?}"),
    }
    // The same growth reached from inside an op (the staged GEMM) is refused too.
    let mut big = seeded_step_unpresized(&gpu, &cfg, before);
    let err = forward_mixed(
        &gpu,
        &big.weights,
        &big.tokens,
        &mut big.acts,
        &mut big.loss,
    )
    .and_then(|()| backward_mixed(&gpu, &big.weights, &big.tokens, &big.acts, &mut big.grads));
    assert!(
        matches!(
            err,
            Err(Mamba3GpuError::Gpu(GpuError::ScratchFrozen { .. }))
        ),
        "{err:?}"
    );
    assert_eq!(gpu.scratch_bytes(HALF_STAGING).expect("size"), before);
    graph
        .replay(&gpu, s.replay_view())
        .expect("the captured step still replays");
    assert!(s.loss(&gpu).expect("loss").is_finite());
}

/// A bigger step built while scratch is thawed only for its allocation, so
/// `half_staging` keeps its captured size (`before` bytes).
fn seeded_step_unpresized(gpu: &Gpu, cfg: &Mamba3Config, before: usize) -> Bf16Step {
    // Build at the captured shape (fits), then swap in bigger activations,
    // gradients and tokens: nothing here grows scratch.
    let mut s = seeded_step(gpu, cfg, 2, 16, 5);
    let (batch, len) = (16, 16);
    s.acts = stepgraph::mamba3::gpu::MixedActs::new(gpu, cfg, batch, len).expect("acts");
    s.grads = stepgraph::mamba3::gpu::Grads::new(gpu, cfg, batch, len).expect("grads");
    s.tokens = gpu.alloc_zeros::<i32>(batch * (len + 1)).expect("tokens");
    s.set_tokens(gpu, &random_tokens(cfg, batch, len, 5))
        .expect("tokens");
    assert_eq!(gpu.scratch_bytes(HALF_STAGING).expect("size"), before);
    s
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_eager_vs_graph_step_time() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        d_model: 256,
        n_layer: 4,
        vocab_size: 256,
        d_state: 64,
        headdim: 64,
        ..Mamba3Config::default()
    };
    let (batch, len) = (16, 256);
    let tokens = f64::from(u32::try_from(batch * len).expect("small"));
    let w64 = random_weights(&cfg, 1);
    let ids = random_tokens(&cfg, batch, len, 1);
    let time = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> f32 {
        let (r, ms) = gpu.time_ms(|| Ok(f())).expect("timing");
        r.expect("step");
        ms
    };
    let median = |mut v: Vec<f32>| {
        v.sort_by(f32::total_cmp);
        v[v.len() / 2]
    };
    // f32 first, in the same process, for a like-for-like comparison.
    let policy = DecayPolicy::default();
    let adam = AdamWConfig::default();
    let mut f = F32Step::new(&gpu, &cfg, &w64, &adam, &policy, batch, len).expect("f32 step");
    f.set_tokens(&gpu, &ids).expect("tokens");
    let mut s = Bf16Step::new(&gpu, &cfg, &w64, &adam, &policy, batch, len).expect("bf16 step");
    s.set_tokens(&gpu, &ids).expect("tokens");
    for _ in 0..3 {
        f.run_eager(&gpu).expect("warm-up");
        s.run_eager(&gpu).expect("warm-up");
    }
    let fe = median((0..20).map(|_| time(&mut || f.run_eager(&gpu))).collect());
    let se = median((0..20).map(|_| time(&mut || s.run_eager(&gpu))).collect());
    let fg_graph =
        Mamba3F32Graph::capture(&gpu, f.capture_view(), shape(batch, len)).expect("capture");
    let sg_graph =
        Mamba3Bf16Graph::capture(&gpu, s.capture_view(), shape(batch, len)).expect("capture");
    for _ in 0..3 {
        fg_graph.replay(&gpu, f.replay_view()).expect("warm-up");
        sg_graph.replay(&gpu, s.replay_view()).expect("warm-up");
    }
    let fg = median(
        (0..20)
            .map(|_| time(&mut || fg_graph.replay(&gpu, f.replay_view())))
            .collect(),
    );
    let sg = median(
        (0..20)
            .map(|_| time(&mut || sg_graph.replay(&gpu, s.replay_view())))
            .collect(),
    );
    let tps = |ms: f32| tokens / f64::from(ms) * 1e3;
    println!(
        "step d_model 256, 4 layers, N 64, P 64, B 16, T 256, vocab 256:\n  f32  eager {fe:.3} ms, graph {fg:.3} ms ({:.0} tokens/s graph)\n  bf16 eager {se:.3} ms, graph {sg:.3} ms ({:.0} tokens/s graph); loss f32 {} bf16 {}",
        tps(fg),
        tps(sg),
        f.loss(&gpu).expect("loss"),
        s.loss(&gpu).expect("loss")
    );
    assert!(s.loss(&gpu).expect("loss").is_finite());
}
