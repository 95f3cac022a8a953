//! The f32 Mamba-3 training step on the GPU against the CPU float64 oracle,
//! and its graph: replay equals eager bit for bit, runs are reproducible,
//! moved or resized buffers are refused by name.
//!
//! Every GPU test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored` (add `--nocapture` to see the per-family
//! error table). Weights and tokens are fresh random draws each run; the
//! seed is printed so a failure can be replayed.

mod gpu_common;

use std::collections::BTreeMap;

use gpu_common::gpu;
use gpu_common::oracle::{cpu_tokens, fresh_seed, random_f32_step, random_tokens, random_weights};
use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::graph::{GraphError, MovePolicy, Replayed, ShapeKey};
use stepgraph::mamba3::cpu::{self, ScanMode, param_specs};
use stepgraph::mamba3::gpu::{Acts, F32Step, Grads, Mamba3F32Graph, backward, forward, zero_grads};
use stepgraph::mamba3::{AActivation, Mamba3Config, RopeFraction};
use stepgraph::optim::gpu::{adamw_step, advance_schedule};
use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy};

fn rel(got: &[f32], want: &[f64]) -> f64 {
    gpu_common::rel_err(got, want)
}

/// `backbone.layers.3.mixer.D` -> `layers.*.mixer.D`.
fn family(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        if parts[i] == "backbone" {
            i += 1;
            continue;
        }
        if i > 0 && parts[i - 1] == "layers" && parts[i].parse::<usize>().is_ok() {
            out.push("*");
        } else {
            out.push(parts[i]);
        }
        i += 1;
    }
    out.join(".")
}

fn record(table: &mut BTreeMap<String, f64>, key: String, err: f64) {
    let e = table.entry(key).or_insert(0.0);
    *e = e.max(err);
}

fn base_cfg() -> Mamba3Config {
    Mamba3Config::tiny()
}

/// Loss, logits and every gradient of one config against the oracle; the
/// per-family maxima are merged into `table`.
fn check_against_oracle(
    gpu: &Gpu,
    label: &str,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    table: &mut BTreeMap<String, f64>,
) {
    let seed = fresh_seed();
    let w64 = random_weights(cfg, seed);
    let ids = random_tokens(cfg, batch, len, seed);
    let toks = cpu_tokens(cfg, &ids, batch, len);
    let fwd = cpu::forward(cfg, &w64, &toks, None, ScanMode::Chunked).expect("oracle forward");
    let g64 = cpu::backward(cfg, &w64, &fwd);

    // The same weights and tokens, drawn from the same seed.
    let mut step = random_f32_step(gpu, cfg, batch, len, seed);
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
    let logit_err = rel(&logits, &fwd.logits);
    println!(
        "[{label}] seed {seed}: loss gpu {loss} cpu {} rel {loss_err:.2e}; logits rel {logit_err:.2e}",
        fwd.loss
    );
    record(table, "loss".into(), loss_err);
    record(table, "logits".into(), logit_err);
    assert!(
        loss_err <= 1e-5,
        "[{label}] seed {seed}: loss rel err {loss_err:e}"
    );
    assert!(
        logit_err <= 1e-5,
        "[{label}] seed {seed}: logits rel err {logit_err:e}"
    );

    let got = step.grads.download(gpu).expect("grads");
    for ((spec, want), have) in g64.named(cfg).into_iter().zip(got.tensors()) {
        let e = rel(have, want);
        record(table, format!("grad {}", family(&spec.name)), e);
        assert!(
            e <= 1e-4,
            "[{label}] seed {seed}: gradient {} rel err {e:e}",
            spec.name
        );
    }
}

fn print_table(title: &str, table: &BTreeMap<String, f64>) {
    println!("== {title}: max relative error per tensor family");
    for (k, v) in table {
        println!("  {k:<40} {v:.3e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_loss_logits_and_gradients_match_the_f64_oracle() {
    let gpu = gpu();
    let mut table = BTreeMap::new();
    let tiny = base_cfg();
    check_against_oracle(&gpu, "tiny B2 T16", &tiny, 2, 16, &mut table);
    let full = Mamba3Config {
        rope_fraction: RopeFraction::Full,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "rope 1.0", &full, 2, 16, &mut table);
    let groups = Mamba3Config {
        ngroups: 2,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "ngroups 2", &groups, 2, 16, &mut table);
    let outnorm = Mamba3Config {
        is_outproj_norm: true,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "outproj norm", &outnorm, 2, 16, &mut table);
    let untied = Mamba3Config {
        tie_embeddings: false,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "untied head", &untied, 2, 16, &mut table);
    let softplus = Mamba3Config {
        a_activation: AActivation::Softplus,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "softplus A", &softplus, 2, 16, &mut table);
    check_against_oracle(&gpu, "B3", &tiny, 3, 20, &mut table);
    check_against_oracle(&gpu, "T130", &tiny, 2, 130, &mut table);
    check_against_oracle(&gpu, "T1", &tiny, 2, 1, &mut table);
    let small_chunks = Mamba3Config {
        chunk_size: 8,
        ngroups: 2,
        is_outproj_norm: true,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "chunk 8, T37", &small_chunks, 2, 37, &mut table);
    let wide = Mamba3Config {
        d_model: 64,
        d_state: 32,
        headdim: 16,
        vocab_size: 50,
        ..base_cfg()
    };
    check_against_oracle(&gpu, "wider d64 N32 P16", &wide, 2, 70, &mut table);
    // N 64 takes the pair-tiled q/k forward and rotation backward (the
    // others run their warp forms); two groups, and 140 rows: a partial
    // last tile.
    let tiled = Mamba3Config {
        d_state: 64,
        ngroups: 2,
        ..wide
    };
    check_against_oracle(&gpu, "tiled d64 N64 G2", &tiled, 2, 70, &mut table);
    print_table("f32 vs f64 oracle", &table);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_adamw_step_matches_the_oracle() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        is_outproj_norm: true,
        tie_embeddings: false,
        ..base_cfg()
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
    let mut opt = AdamW::<f64>::for_model(&cfg, adam_cfg, &policy);
    opt.step_weights(&mut w64, &g64).expect("cpu adamw");

    let mut table = BTreeMap::new();
    let w = step.weights.download(&gpu).expect("weights");
    let m = step.adam.m.download(&gpu).expect("m");
    let v = step.adam.v.download(&gpu).expect("v");
    let specs = param_specs(&cfg);
    for (i, spec) in specs.iter().enumerate() {
        let (m64, v64) = opt.moments(i).expect("moments");
        let ew = rel(w.tensors()[i], w64.tensors()[i]);
        let em = rel(m.tensors()[i], m64);
        let ev = rel(v.tensors()[i], v64);
        record(&mut table, format!("weight {}", family(&spec.name)), ew);
        record(&mut table, format!("adam m {}", family(&spec.name)), em);
        record(&mut table, format!("adam v {}", family(&spec.name)), ev);
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

fn bits(gpu: &Gpu, b: &DeviceBuffer<f32>) -> Vec<u32> {
    gpu.to_host(b)
        .expect("download")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn all_bits(gpu: &Gpu, s: &F32Step) -> Vec<u32> {
    let mut out = bits(gpu, &s.loss);
    for t in s
        .weights
        .tensors()
        .into_iter()
        .chain(s.adam.m.tensors())
        .chain(s.adam.v.tensors())
    {
        out.extend(bits(gpu, t));
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_equals_eager_bit_for_bit_over_50_steps() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        is_outproj_norm: true,
        ngroups: 2,
        ..base_cfg()
    };
    let (batch, len) = (2, 70);
    let seed = fresh_seed();
    let mut eager = random_f32_step(&gpu, &cfg, batch, len, seed);
    let mut graphed = random_f32_step(&gpu, &cfg, batch, len, seed);
    let graph = Mamba3F32Graph::capture(
        &gpu,
        graphed.capture_view(),
        ShapeKey {
            batch,
            seq_len: len,
        },
    )
    .expect("capture");
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
    let l = eager.loss(&gpu).expect("loss");
    assert!(l.is_finite(), "loss {l}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_fresh_runs_are_bit_identical() {
    let gpu = gpu();
    let cfg = Mamba3Config {
        rope_fraction: RopeFraction::Full,
        ..base_cfg()
    };
    let seed = fresh_seed();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut s = random_f32_step(&gpu, &cfg, 3, 100, seed);
        for _ in 0..3 {
            s.run_eager(&gpu).expect("eager");
        }
        runs.push(all_bits(&gpu, &s));
    }
    assert_eq!(runs[0], runs[1], "seed {seed}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn changed_batch_or_length_is_refused_or_recaptured() {
    let gpu = gpu();
    let cfg = base_cfg();
    let seed = fresh_seed();
    let mut s = random_f32_step(&gpu, &cfg, 2, 16, seed);
    let mut graph = Mamba3F32Graph::capture(
        &gpu,
        s.capture_view(),
        ShapeKey {
            batch: 2,
            seq_len: 16,
        },
    )
    .expect("capture");
    graph.replay(&gpu, s.replay_view()).expect("replay");
    for (batch, len) in [(3, 16), (2, 17)] {
        s.acts = Acts::new(&gpu, &cfg, batch, len).expect("acts");
        s.grads = Grads::new(&gpu, &cfg, batch, len).expect("grads");
        s.tokens = gpu.alloc_zeros::<i32>(batch * (len + 1)).expect("tokens");
        s.set_tokens(&gpu, &random_tokens(&cfg, batch, len, seed))
            .expect("tokens");
        let uniform = stepgraph::optim::step_control::loss_weights_for(batch * len, |_| true)
            .expect("weights");
        s.loss_weights = gpu.to_device(&uniform).expect("loss weights");
        let err = graph.replay(&gpu, s.replay_view()).unwrap_err();
        assert!(
            matches!(
                err,
                GraphError::ShapeChanged { .. }
                    | GraphError::PointerMoved { .. }
                    | GraphError::TensorSetChanged { .. }
            ),
            "{err}"
        );
        assert!(err.is_stale_graph(), "{err}");
    }
    graph = graph.with_policy(MovePolicy::Recapture);
    match graph
        .replay_or_recapture(&gpu, s.capture_view())
        .expect("recapture")
    {
        Replayed::Recaptured { .. } => {}
        other => panic!("expected a re-capture, got {other:?}"),
    }
    graph
        .replay(&gpu, s.replay_view())
        .expect("replay after re-capture");
    assert!(s.loss(&gpu).expect("loss").is_finite());
}

/// Reallocates one buffer of the step (same size, same contents), keeping
/// the old allocation alive so the new address must differ.
fn move_buffer(
    gpu: &Gpu,
    s: &mut F32Step,
    which: &str,
    keep: &mut Vec<DeviceBuffer<f32>>,
    keep_i: &mut Vec<DeviceBuffer<i32>>,
) {
    fn realloc(gpu: &Gpu, b: &mut DeviceBuffer<f32>, keep: &mut Vec<DeviceBuffer<f32>>) {
        let mut fresh = gpu.alloc::<f32>(b.len()).expect("alloc");
        gpu.copy_device(b, &mut fresh).expect("copy");
        keep.push(std::mem::replace(b, fresh));
    }
    match which {
        "weights" => realloc(gpu, &mut s.weights.layers[1].out_proj, keep),
        "adam" => realloc(gpu, &mut s.adam.v.norm_f, keep),
        "sched" => realloc(gpu, &mut s.sched.derived, keep),
        "grads" => realloc(gpu, &mut s.grads.work.dproj, keep),
        "acts" => realloc(gpu, &mut s.acts.layers[0].states, keep),
        "loss" => realloc(gpu, &mut s.loss, keep),
        "loss_weights" => realloc(gpu, &mut s.loss_weights, keep),
        "control" => realloc(gpu, &mut s.control.gate, keep),
        "tokens" => {
            let mut fresh = gpu.alloc::<i32>(s.tokens.len()).expect("alloc");
            gpu.copy_device(&s.tokens, &mut fresh).expect("copy");
            keep_i.push(std::mem::replace(&mut s.tokens, fresh));
        }
        other => panic!("unknown buffer {other}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_moved_buffer_is_refused_by_name() {
    let gpu = gpu();
    let cfg = base_cfg();
    let mut s = random_f32_step(&gpu, &cfg, 2, 16, fresh_seed());
    let (mut keep, mut keep_i) = (Vec::new(), Vec::new());
    for name in [
        "weights",
        "adam",
        "sched",
        "grads",
        "acts",
        "control",
        "tokens",
        "loss_weights",
        "loss",
    ] {
        let graph = Mamba3F32Graph::capture(
            &gpu,
            s.capture_view(),
            ShapeKey {
                batch: 2,
                seq_len: 16,
            },
        )
        .expect("capture");
        graph
            .replay(&gpu, s.replay_view())
            .expect("replay before the move");
        move_buffer(&gpu, &mut s, name, &mut keep, &mut keep_i);
        match graph.replay(&gpu, s.replay_view()) {
            Err(GraphError::PointerMoved { buffer, .. }) => assert_eq!(buffer, name),
            other => panic!("moving `{name}`: expected PointerMoved, got {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn eager_vs_graph_step_time() {
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
    let mut s = random_f32_step(&gpu, &cfg, batch, len, 1);
    let time = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> f32 {
        let (r, ms) = gpu.time_ms(|| Ok(f())).expect("timing");
        r.expect("step");
        ms
    };
    for _ in 0..3 {
        s.run_eager(&gpu).expect("warm-up");
    }
    let mut eager: Vec<f32> = (0..20).map(|_| time(&mut || s.run_eager(&gpu))).collect();
    let graph = Mamba3F32Graph::capture(
        &gpu,
        s.capture_view(),
        ShapeKey {
            batch,
            seq_len: len,
        },
    )
    .expect("capture");
    for _ in 0..3 {
        graph.replay(&gpu, s.replay_view()).expect("warm-up replay");
    }
    let mut replay: Vec<f32> = (0..20)
        .map(|_| time(&mut || graph.replay(&gpu, s.replay_view())))
        .collect();
    eager.sort_by(f32::total_cmp);
    replay.sort_by(f32::total_cmp);
    let (e, r) = (eager[eager.len() / 2], replay[replay.len() / 2]);
    let tokens = f64::from(u32::try_from(batch * len).expect("small"));
    println!(
        "f32 step d_model 256, 4 layers, N 64, P 64, B 16, T 256, vocab 256: eager {e:.3} ms, graph {r:.3} ms ({:.0} / {:.0} tokens/s); loss {}",
        tokens / f64::from(e) * 1e3,
        tokens / f64::from(r) * 1e3,
        s.loss(&gpu).expect("loss")
    );
    assert!(s.loss(&gpu).expect("loss").is_finite());
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn ops_run_directly_and_zero_grads_zeroes() {
    let gpu = gpu();
    let cfg = base_cfg();
    let mut s = random_f32_step(&gpu, &cfg, 2, 8, fresh_seed());
    zero_grads(&gpu, &mut s.grads).expect("zero");
    for g in s.grads.params.tensors() {
        assert!(gpu.to_host(g).expect("download").iter().all(|&v| v == 0.0));
    }
    forward(&gpu, &s.weights, &s.tokens, &mut s.acts, &mut s.loss).expect("forward");
    backward(&gpu, &s.weights, &s.tokens, &s.acts, &mut s.grads).expect("backward");
    advance_schedule(&gpu, &mut s.sched).expect("schedule");
    adamw_step(&gpu, &s.grads, &s.sched, &mut s.weights, &mut s.adam).expect("adamw");
    assert_eq!(s.sched.steps(&gpu).expect("steps"), 1);
}

/// Median GPU time of `f` over `reps` runs, in ms.
fn median_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> Result<(), String>) -> f32 {
    let mut v: Vec<f32> = (0..reps)
        .map(|_| {
            let (r, ms) = gpu.time_ms(|| Ok(f())).expect("timing");
            r.expect("timed op");
            ms
        })
        .collect();
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn step_time_breakdown() {
    use stepgraph::kernels::{mamba3 as k, mamba3_bwd as kb};
    let gpu = gpu();
    let cfg = Mamba3Config {
        d_model: 256,
        n_layer: 4,
        vocab_size: 256,
        d_state: 64,
        headdim: 64,
        ..Mamba3Config::default()
    };
    let mut s = random_f32_step(&gpu, &cfg, 16, 256, 2);
    s.run_eager(&gpu).expect("warm-up");
    let e = |r: Result<(), stepgraph::mamba3::gpu::Mamba3GpuError>| r.map_err(|e| e.to_string());
    let g = |r: Result<(), stepgraph::device::GpuError>| r.map_err(|e| e.to_string());
    let sh = s.acts.shape;
    let mut rows = Vec::new();
    rows.push((
        "forward (4 layers + head + loss)",
        median_ms(&gpu, 10, &mut || {
            e(forward(
                &gpu,
                &s.weights,
                &s.tokens,
                &mut s.acts,
                &mut s.loss,
            ))
        }),
    ));
    rows.push((
        "backward",
        median_ms(&gpu, 10, &mut || {
            e(backward(&gpu, &s.weights, &s.tokens, &s.acts, &mut s.grads))
        }),
    ));
    rows.push((
        "schedule + fused adamw",
        median_ms(&gpu, 10, &mut || {
            g(advance_schedule(&gpu, &mut s.sched))?;
            e(adamw_step(
                &gpu,
                &s.grads,
                &s.sched,
                &mut s.weights,
                &mut s.adam,
            ))
        }),
    ));
    // The shared q/k hold the last layer's; the timing does not care.
    let (qa, ka) = (&s.acts.q, &s.acts.k);
    let (lw, la) = (&s.weights.layers[0], &mut s.acts.layers[0]);
    rows.push((
        "layer 0: scan forward",
        median_ms(&gpu, 10, &mut || {
            g(k::scan_fwd(
                &gpu,
                &sh,
                qa,
                ka,
                &la.proj,
                [&la.dt, &la.adt, &la.lam, &la.qk_raw],
                &lw.d,
                &mut la.y,
                &mut la.states,
            ))
        }),
    ));
    rows.push((
        "layer 0: angle cumsum forward",
        median_ms(&gpu, 10, &mut || {
            g(k::angle_fwd(&gpu, &sh, &la.dt, &la.theta, &mut la.phi))
        }),
    ));
    rows.push((
        "layer 0: in_proj GEMM",
        median_ms(&gpu, 10, &mut || {
            g(gpu.gemm_f32(
                &stepgraph::device::Gemm::new(sh.rows, sh.width, sh.d_model).trans_b(),
                &la.u,
                &lw.in_proj,
                &mut la.proj,
            ))
        }),
    ));
    let w = &mut s.grads.work;
    rows.push((
        "layer 0: scan backward",
        median_ms(&gpu, 10, &mut || {
            g(kb::scan_bwd(
                &gpu,
                &sh,
                qa,
                ka,
                &la.proj,
                [&la.dt, &la.adt, &la.lam, &la.qk_raw],
                &lw.d,
                &la.states,
                &w.dy,
                kb::ScanGrads {
                    dq: &mut w.dq,
                    dk: &mut w.dk,
                    dproj: &mut w.dproj,
                    dadt: &mut w.dadt,
                    dscale: &mut w.dscale,
                    dqkdot: &mut w.dqkdot,
                    dskip_part: &mut w.dskip_part,
                },
            ))
        }),
    ));
    rows.push((
        "layer 0: angle cumsum backward",
        median_ms(&gpu, 10, &mut || g(kb::angle_bwd(&gpu, &sh, &mut w.dphi))),
    ));
    rows.push((
        "embedding backward",
        median_ms(&gpu, 10, &mut || {
            g(kb::embed_bwd(
                &gpu,
                &sh,
                &s.tokens,
                &w.dh,
                &mut s.grads.params.embedding,
            ))
        }),
    ));
    println!("== f32 step breakdown (d_model 256, 4 layers, N 64, P 64, B 16, T 256)");
    for (name, ms) in rows {
        println!("  {name:<36} {ms:8.3} ms");
    }
}
