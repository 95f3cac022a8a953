//! The captured Mamba-3 step in both precisions (one generic body per
//! property, run for each): replay equals eager bit for bit, runs are
//! reproducible, every moved buffer or scratch area is refused by name,
//! scratch never grows after capture, a new shape is refused or
//! re-captured; and the eager vs graph step time.
//!
//! Every GPU test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored` (`--nocapture` shows the timings). Weights
//! and tokens are fresh random draws each run; the seed is printed.

mod gpu_common;

use gpu_common::gpu;
use gpu_common::oracle::{fresh_seed, random_step, random_tokens, random_weights};
use half::bf16;
use stepgraph::device::{DeviceBuffer, Element, Gpu, GpuError, HALF_STAGING};
use stepgraph::graph::{Backend as _, GraphError, MovePolicy, Replayed, ShapeKey, TrainingStep};
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::RopeFraction;
use stepgraph::mamba3::gpu::{
    Acts, Grads, Mamba3GpuError, ModelCompute, StepWeights, backward, forward,
};
use stepgraph::optim::{AdamWConfig, DecayPolicy};
use stepgraph::step::{Bf16Step, F32Step, Mamba3Step, StepError, loss_weights_for};

fn shape(batch: usize, seq_len: usize) -> ShapeKey {
    ShapeKey { batch, seq_len }
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

/// Loss, f32 masters and both moments, and the bf16 copies (none in f32),
/// as bits.
fn all_bits<P: ModelCompute>(gpu: &Gpu, s: &mut Mamba3Step<P>) -> (Vec<u32>, Vec<u16>) {
    let mut out = bits(gpu, &s.loss);
    for t in s.adam.m.tensors().into_iter().chain(s.adam.v.tensors()) {
        out.extend(bits(gpu, t));
    }
    let (master, copies) = s.weights.masters_and_copies().expect("copies");
    for t in master.tensors() {
        out.extend(bits(gpu, t));
    }
    let half = copies.into_iter().flatten().flat_map(|c| bits16(gpu, c));
    (out, half.collect())
}

/// Fails unless every bf16 copy equals its master rounded to nearest even
/// (what the fused AdamW pass must leave); nothing to check in f32.
fn copies_in_sync<P: ModelCompute>(gpu: &Gpu, s: &mut Mamba3Step<P>, seed: u64) {
    let (master, copies) = s.weights.masters_and_copies().expect("copies");
    for (m, c) in master.tensors().into_iter().zip(copies) {
        let Some(c) = c else { continue };
        let want: Vec<u16> = gpu
            .to_host(m)
            .expect("master")
            .into_iter()
            .map(|v| bf16::from_f32(v).to_bits())
            .collect();
        assert_eq!(bits16(gpu, c), want, "seed {seed}: bf16 copy out of sync");
    }
}

/// 50 replays of a captured step equal 50 eager steps of a twin, bit for bit.
fn replay_equals_eager<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let gpu = gpu();
    let cfg = Mamba3Config {
        is_outproj_norm: true,
        ngroups: 2,
        tie_embeddings: false,
        ..Mamba3Config::tiny()
    };
    let (batch, len) = (2, 70);
    let seed = fresh_seed();
    let mut eager = random_step::<P>(&gpu, &cfg, batch, len, seed);
    let mut graphed = random_step::<P>(&gpu, &cfg, batch, len, seed);
    let graph = graphed.capture(&gpu, shape(batch, len)).expect("capture");
    for i in 0..50 {
        eager.run_eager(&gpu).expect("eager");
        graphed.replay(&gpu, &graph).expect("replay");
        assert_eq!(
            bits(&gpu, &eager.loss),
            bits(&gpu, &graphed.loss),
            "seed {seed}: loss differs at step {i}"
        );
    }
    assert_eq!(
        all_bits(&gpu, &mut eager),
        all_bits(&gpu, &mut graphed),
        "seed {seed}: state differs after 50 steps"
    );
    assert_eq!(graphed.sched.steps(&gpu).expect("steps"), 50);
    copies_in_sync(&gpu, &mut graphed, seed);
    let l = eager.loss(&gpu).expect("loss");
    assert!(l.is_finite(), "loss {l}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_equals_eager_bit_for_bit_over_50_steps() {
    replay_equals_eager::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_graph_replay_equals_eager_bit_for_bit_over_50_steps() {
    replay_equals_eager::<bf16>();
}

/// Two fresh steps from the same seed, three steps each: the same bits.
fn fresh_runs_agree<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let gpu = gpu();
    let cfg = Mamba3Config {
        rope_fraction: RopeFraction::Full,
        ..Mamba3Config::tiny()
    };
    let seed = fresh_seed();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut s = random_step::<P>(&gpu, &cfg, 3, 100, seed);
        for _ in 0..3 {
            s.run_eager(&gpu).expect("eager");
        }
        runs.push(all_bits(&gpu, &mut s));
    }
    assert_eq!(runs[0], runs[1], "seed {seed}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_fresh_runs_are_bit_identical() {
    fresh_runs_agree::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_fresh_bf16_runs_are_bit_identical() {
    fresh_runs_agree::<bf16>();
}

/// Reallocates one buffer of the step (same size and contents), keeping the
/// old allocation alive so the new address must differ.
fn move_buffer<P: ModelCompute>(
    gpu: &Gpu,
    s: &mut Mamba3Step<P>,
    which: &str,
    keep: &mut Vec<Box<dyn std::any::Any>>,
) {
    fn realloc<T: Element>(
        gpu: &Gpu,
        b: &mut DeviceBuffer<T>,
        keep: &mut Vec<Box<dyn std::any::Any>>,
    ) {
        let mut fresh = gpu.alloc::<T>(b.len()).expect("alloc");
        gpu.copy_device(b, &mut fresh).expect("copy");
        keep.push(Box::new(std::mem::replace(b, fresh)));
    }
    match which {
        "weights" => realloc(gpu, &mut s.weights.master_mut().layers[1].out_proj, keep),
        "adam" => {
            let norm_f = s.adam.v.by_name_mut("backbone.norm_f.weight");
            realloc(gpu, norm_f.expect("norm_f moment"), keep);
        }
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

/// Every buffer and every scratch area the step's spec lists, moved in
/// turn: the replay is refused naming it.
fn moves_are_refused<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let gpu = gpu();
    let cfg = Mamba3Config::tiny();
    let mut s = random_step::<P>(&gpu, &cfg, 2, 16, fresh_seed());
    s.run_eager(&gpu).expect("warm-up");
    let mut keep = Vec::new();
    let info = <Mamba3Step<P> as TrainingStep>::INFO;
    let buffers = info.buffers.iter().map(|b| (b.name, false));
    let scratch = info.scratch.iter().map(|&n| (n, true));
    for (name, is_scratch) in buffers.chain(scratch) {
        let graph = s.capture(&gpu, shape(2, 16)).expect("capture");
        s.replay(&gpu, &graph).expect("replay before the move");
        let want = if is_scratch {
            move_scratch(&gpu, name);
            format!("scratch:{name}")
        } else {
            move_buffer(&gpu, &mut s, name, &mut keep);
            name.to_owned()
        };
        match s.replay(&gpu, &graph) {
            Err(GraphError::PointerMoved { buffer, .. }) => assert_eq!(buffer, want),
            other => panic!("moving `{want}`: expected PointerMoved, got {other:?}"),
        }
        println!("{}: moved {want}, refused by name", P::PRECISION);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_moved_buffer_is_refused_by_name() {
    moves_are_refused::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_moved_buffer_and_scratch_area_is_refused_by_name() {
    moves_are_refused::<bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn changed_batch_or_length_is_refused_or_recaptured() {
    let gpu = gpu();
    let cfg = Mamba3Config::tiny();
    let seed = fresh_seed();
    let mut s = random_step::<f32>(&gpu, &cfg, 2, 16, seed);
    let mut graph = s.capture(&gpu, shape(2, 16)).expect("capture");
    s.replay(&gpu, &graph).expect("replay");
    for (batch, len) in [(3, 16), (2, 17)] {
        s.acts = Acts::new(&gpu, &cfg, batch, len).expect("acts");
        s.grads = Grads::new::<f32>(&gpu, &cfg, batch, len).expect("grads");
        s.tokens = gpu.alloc_zeros::<i32>(batch * (len + 1)).expect("tokens");
        s.set_tokens(&gpu, &random_tokens(&cfg, batch, len, seed))
            .expect("tokens");
        let uniform = loss_weights_for(batch * len, |_| true).expect("weights");
        s.loss_weights = gpu.to_device(&uniform).expect("loss weights");
        let err = s.replay(&gpu, &graph).unwrap_err();
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
    match s.replay_or_recapture(&gpu, &mut graph).expect("recapture") {
        Replayed::Recaptured { .. } => {}
        other => panic!("expected a re-capture, got {other:?}"),
    }
    s.replay(&gpu, &graph).expect("replay after re-capture");
    assert!(s.loss(&gpu).expect("loss").is_finite());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scratch_that_would_grow_after_capture_is_a_typed_error() {
    let gpu = gpu();
    let cfg = Mamba3Config::tiny();
    let mut s = random_step::<bf16>(&gpu, &cfg, 2, 16, fresh_seed());
    let graph = s.capture(&gpu, shape(2, 16)).expect("capture");
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
        Err(StepError::Model(Mamba3GpuError::Gpu(GpuError::ScratchFrozen {
            name,
            have,
            want,
        }))) => {
            assert_eq!(name, HALF_STAGING);
            assert_eq!(have, before);
            assert!(want > have, "{want} vs {have}");
        }
        other => panic!("expected ScratchFrozen, got {other:?}"),
    }
    // The same growth reached from inside an op (the staged GEMM) is refused too.
    let mut big = unpresized_step(&gpu, &cfg, before);
    let err = forward(
        &gpu,
        &big.weights,
        &big.tokens,
        &mut big.acts,
        &mut big.loss,
    )
    .and_then(|()| backward(&gpu, &big.weights, &big.tokens, &big.acts, &mut big.grads));
    assert!(
        matches!(
            err,
            Err(Mamba3GpuError::Gpu(GpuError::ScratchFrozen { .. }))
        ),
        "{err:?}"
    );
    assert_eq!(gpu.scratch_bytes(HALF_STAGING).expect("size"), before);
    s.replay(&gpu, &graph)
        .expect("the captured step still replays");
    assert!(s.loss(&gpu).expect("loss").is_finite());
}

/// A bigger bf16 step whose `half_staging` keeps its captured size
/// (`before` bytes): built at the captured shape (fits), then given bigger
/// activations, gradients and tokens; nothing here grows scratch.
fn unpresized_step(gpu: &Gpu, cfg: &Mamba3Config, before: usize) -> Bf16Step {
    let mut s = random_step::<bf16>(gpu, cfg, 2, 16, 5);
    let (batch, len) = (16, 16);
    s.acts = Acts::new(gpu, cfg, batch, len).expect("acts");
    s.grads = Grads::new::<bf16>(gpu, cfg, batch, len).expect("grads");
    s.tokens = gpu.alloc_zeros::<i32>(batch * (len + 1)).expect("tokens");
    s.set_tokens(gpu, &random_tokens(cfg, batch, len, 5))
        .expect("tokens");
    assert_eq!(gpu.scratch_bytes(HALF_STAGING).expect("size"), before);
    s
}

/// Median eager and graph step times (ms) of a step at compute type `P`.
fn step_times<P: ModelCompute>(
    gpu: &Gpu,
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
) -> (f32, f32, f32)
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let time = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> f32 {
        let (r, ms) = gpu.time_ms(|| Ok(f())).expect("timing");
        r.expect("step");
        ms
    };
    let mut s = random_step::<P>(gpu, cfg, batch, len, 1);
    for _ in 0..3 {
        s.run_eager(gpu).expect("warm-up");
    }
    let eager = gpu_common::median((0..20).map(|_| time(&mut || s.run_eager(gpu))).collect());
    let graph = s.capture(gpu, shape(batch, len)).expect("capture");
    for _ in 0..3 {
        s.replay(gpu, &graph).expect("warm-up replay");
    }
    let replay = gpu_common::median(
        (0..20)
            .map(|_| time(&mut || s.replay(gpu, &graph)))
            .collect(),
    );
    let loss = s.loss(gpu).expect("loss");
    assert!(loss.is_finite(), "{} loss {loss}", P::PRECISION);
    (eager, replay, loss)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn eager_vs_graph_step_time() {
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
    let tps = |ms: f32| tokens / f64::from(ms) * 1e3;
    // Both precisions in one process, for a like-for-like comparison, each
    // on its own context: a context's scratch areas freeze at its first
    // capture, and the bf16 step stages GEMM operands through a scratch
    // area the f32 step never grows (ScratchFrozen otherwise).
    let (fe, fg, fl) = step_times::<f32>(&gpu(), &cfg, batch, len);
    let (se, sg, sl) = step_times::<bf16>(&gpu(), &cfg, batch, len);
    println!(
        "step d_model 256, 4 layers, N 64, P 64, B 16, T 256, vocab 256:\n  f32  eager {fe:.3} ms, graph {fg:.3} ms ({:.0} / {:.0} tokens/s)\n  bf16 eager {se:.3} ms, graph {sg:.3} ms ({:.0} / {:.0} tokens/s); loss f32 {fl} bf16 {sl}",
        tps(fe),
        tps(fg),
        tps(se),
        tps(sg),
    );
}

/// Median GPU time of `f` over `reps` runs, in ms.
fn median_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> Result<(), String>) -> f32 {
    let v: Vec<f32> = (0..reps)
        .map(|_| {
            let (r, ms) = gpu.time_ms(|| Ok(f())).expect("timing");
            r.expect("timed op");
            ms
        })
        .collect();
    gpu_common::median(v)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn step_time_breakdown() {
    use stepgraph::kernels::{mamba3 as k, mamba3_bwd as kb};
    use stepgraph::optim::gpu::advance_schedule;
    use stepgraph::step::adamw_step;
    let gpu = gpu();
    let cfg = Mamba3Config {
        d_model: 256,
        n_layer: 4,
        vocab_size: 256,
        d_state: 64,
        headdim: 64,
        ..Mamba3Config::default()
    };
    let mut s: F32Step = random_step::<f32>(&gpu, &cfg, 16, 256, 2);
    s.run_eager(&gpu).expect("warm-up");
    let e = |r: Result<(), Mamba3GpuError>| r.map_err(|e| e.to_string());
    let g = |r: Result<(), GpuError>| r.map_err(|e| e.to_string());
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
            adamw_step(&gpu, &s.grads, &s.sched, &mut s.weights, &mut s.adam)
                .map_err(|e| e.to_string())
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
                ([&la.dt, &la.adt, &la.lam, &la.qk_raw], None),
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
                ([&la.dt, &la.adt, &la.lam, &la.qk_raw], None),
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
