//! The f32 GPU training engine against the CPU engine: the first steps'
//! loss, gradient norm and lr agree, the masked loss is the mean over answer
//! positions, clipping and the non-finite skip behave as the CPU engine's
//! (torch semantics), frozen slices never move, a resumed run is bit-identical,
//! a weight edit between replays trains on as a fresh engine would, batches
//! trimmed to their longest row train as padded ones, and graph replay
//! equals eager execution bit for bit.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored`, where a missing GPU fails them.

mod gpu_common;

use std::sync::MutexGuard;

use stepgraph::device::Gpu;
use stepgraph::graph::TrainingStep;
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::{Weights, param_specs};
use stepgraph::mamba3::gpu::ModelCompute;
use stepgraph::optim::{AdamWConfig, DecayPolicy};
use stepgraph::step::Mamba3Step;
use stepgraph::train::data::{Batch, DataSpec, Dataset, Task};
use stepgraph::train::edit::WeightEdit;
use stepgraph::train::engine::rotation_rows;
use stepgraph::train::{
    CpuEngine, EngineState, GpuEngine, GpuF32Engine, LrSchedule, OptimSettings, StepMetrics,
    TrainEngine,
};

fn cfg() -> Mamba3Config {
    Mamba3Config {
        vocab_size: Task::Parity.vocab_size(),
        n_layer: 1,
        d_model: 32,
        d_state: 16,
        headdim: 8,
        ..Mamba3Config::tiny()
    }
}

fn settings(clip: Option<f64>) -> OptimSettings {
    OptimSettings {
        adam: AdamWConfig {
            lr: 3e-3,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        },
        decay: DecayPolicy::MatricesOnly,
        clip,
        frozen: Vec::new(),
    }
}

const SCHEDULE: LrSchedule = LrSchedule {
    peak: 3e-3,
    min_lr: 3e-4,
    warmup: 3,
    total: 12,
};

/// `n` parity training batches of `rows` rows (lengths up to 12) and the
/// batch width.
fn parity(n: usize, rows: usize, seed: u64) -> (Vec<Batch>, usize) {
    let spec = DataSpec::task(Task::Parity, 12, vec![]);
    let mut data = Dataset::new(&spec, seed, rows).expect("dataset");
    let width = data.train_width();
    (
        (0..n)
            .map(|_| data.next_batch(rows).expect("batch"))
            .collect(),
        width,
    )
}

/// A fresh context, holding the binary's GPU lock.
fn context() -> (Gpu, MutexGuard<'static, ()>) {
    let lock = gpu_common::serial();
    let gpu = Gpu::new(0).unwrap_or_else(|e| panic!("no usable GPU: {e}"));
    (gpu, lock)
}

fn gpu_engine(
    gpu: Gpu,
    w: &Weights<f32>,
    s: &OptimSettings,
    rows: usize,
    width: usize,
) -> GpuF32Engine {
    engine_of::<f32>(gpu, w, s, rows, width)
}

fn engine_of<P: ModelCompute>(
    gpu: Gpu,
    w: &Weights<f32>,
    s: &OptimSettings,
    rows: usize,
    width: usize,
) -> GpuEngine<P>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let mut e = GpuEngine::<P>::new(gpu, cfg(), w, s, rows, width).expect("gpu engine");
    e.set_schedule(SCHEDULE);
    e
}

fn run(engine: &mut dyn TrainEngine, batches: &[Batch]) -> Vec<StepMetrics> {
    batches
        .iter()
        .map(|b| {
            engine.load_batch(b).expect("load");
            engine.step().expect("step");
            engine.metrics().expect("metrics")
        })
        .collect()
}

/// `run` with each step executed eagerly instead of replayed.
fn run_eager<P: ModelCompute>(e: &mut GpuEngine<P>, batches: &[Batch]) -> Vec<StepMetrics>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    batches
        .iter()
        .map(|b| {
            e.load_batch(b).expect("load");
            e.step_eager().expect("eager step");
            e.metrics().expect("metrics")
        })
        .collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

fn rel_vec(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (f64::from(x) - f64::from(y)).powi(2);
        den += f64::from(y).powi(2);
    }
    num.sqrt() / den.sqrt().max(1e-30)
}

fn state_bits(s: &EngineState) -> Vec<u32> {
    let mut out: Vec<u32> = s
        .weights
        .tensors()
        .iter()
        .flat_map(|t| t.iter().map(|v| v.to_bits()))
        .collect();
    for (m, v) in &s.moments {
        out.extend(m.iter().chain(v).map(|x| x.to_bits()));
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn first_steps_match_the_cpu_engine() {
    let (gpu, _lock) = context();
    let w = Weights::<f32>::init(&cfg(), 11).expect("weights");
    let (batches, width) = parity(6, 8, 5);
    let s = settings(Some(1.0));
    let mut cpu = CpuEngine::new(cfg(), w.clone(), s.clone()).expect("cpu engine");
    cpu.set_schedule(SCHEDULE);
    let mut dev = gpu_engine(gpu, &w, &s, 8, width);
    let (mc, mg) = (run(&mut cpu, &batches), run(&mut dev, &batches));
    for (i, (c, g)) in mc.iter().zip(&mg).enumerate() {
        println!(
            "step {}: loss cpu {:.7} gpu {:.7} | norm cpu {:.6} gpu {:.6} | lr {:e} {:e}",
            c.step, c.loss, g.loss, c.grad_norm, g.grad_norm, c.lr, g.lr
        );
        assert_eq!((c.step, c.skipped), (g.step, g.skipped));
        assert!(rel(g.lr, c.lr) < 1e-12, "step {i}: lr {} vs {}", g.lr, c.lr);
        // Step 0 runs on identical weights; later steps on weights that
        // differ by f32 rounding of the earlier updates.
        let (tl, tn) = if i == 0 { (1e-5, 1e-4) } else { (1e-3, 1e-2) };
        assert!(
            rel(g.loss, c.loss) < tl,
            "step {i}: loss {} vs {}",
            g.loss,
            c.loss
        );
        assert!(
            rel(g.grad_norm, c.grad_norm) < tn,
            "step {i}: grad norm {} vs {}",
            g.grad_norm,
            c.grad_norm
        );
    }
    let (sc, sg) = (cpu.export_state().unwrap(), dev.export_state().unwrap());
    assert_eq!((sg.steps, sg.adam_steps, sg.skipped), (6, 6, 0));
    for (a, b) in sg.weights.tensors().iter().zip(sc.weights.tensors()) {
        assert!(rel_vec(a, b) < 1e-3, "weights after 6 steps");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn clipping_matches_torch_semantics() {
    let (gpu, _lock) = context();
    let w = Weights::<f32>::init(&cfg(), 12).expect("weights");
    let (batches, width) = parity(1, 8, 6);
    // Probe the norm, then clip at a fifth of it so the coefficient is 0.2.
    let mut probe = CpuEngine::new(cfg(), w.clone(), settings(None)).unwrap();
    let norm = run(&mut probe, &batches)[0].grad_norm;
    let s = settings(Some(norm / 5.0));
    let mut cpu = CpuEngine::new(cfg(), w.clone(), s.clone()).unwrap();
    let mut dev = gpu_engine(gpu, &w, &s, 8, width);
    cpu.set_schedule(SCHEDULE);
    let (c, g) = (run(&mut cpu, &batches)[0], run(&mut dev, &batches)[0]);
    // The reported norm is the one before clipping.
    assert!(rel(g.grad_norm, norm) < 1e-4, "{} vs {norm}", g.grad_norm);
    assert!(rel(c.grad_norm, norm) < 1e-12);
    let (sc, sg) = (cpu.export_state().unwrap(), dev.export_state().unwrap());
    for (i, ((a, b), ((ma, va), (mb, vb)))) in sg
        .weights
        .tensors()
        .iter()
        .zip(sc.weights.tensors())
        .zip(sg.moments.iter().zip(&sc.moments))
        .enumerate()
    {
        assert!(rel_vec(a, b) < 1e-5, "tensor {i}: weights");
        assert!(rel_vec(ma, mb) < 1e-4, "tensor {i}: first moments");
        assert!(rel_vec(va, vb) < 1e-4, "tensor {i}: second moments");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn masked_loss_is_the_mean_over_answer_positions() {
    let (gpu, _lock) = context();
    let w = Weights::<f32>::init(&cfg(), 13).expect("weights");
    let (batches, width) = parity(1, 8, 7);
    let b = &batches[0];
    let mut dev = gpu_engine(gpu, &w, &settings(None), 8, width);
    let mut cpu = CpuEngine::new(cfg(), w, settings(None)).unwrap();
    let (eg, ec) = (dev.eval(b).unwrap(), cpu.eval(b).unwrap());
    let (mut sum, mut n) = (0.0, 0);
    for (i, (&lg, &lc)) in eg.token_loss.iter().zip(&ec.token_loss).enumerate() {
        assert!(rel(f64::from(lg), f64::from(lc)) < 1e-4, "prediction {i}");
        if b.scored(i) {
            sum += f64::from(lg);
            n += 1;
        }
    }
    assert_eq!(eg.argmax, ec.argmax, "eval arg-max");
    assert_eq!(n, 8, "one answer per parity row");
    let m = run(&mut dev, &batches)[0];
    assert!(rel(m.loss, sum / 8.0) < 1e-6, "{} vs {}", m.loss, sum / 8.0);
}

/// Batches of ids below 4 (`clean`) or holding id 5 (`poisoned`).
fn hand_batch(poisoned: bool) -> Batch {
    let mut tokens: Vec<u32> = (0..2 * 9).map(|i| (i * 7 + 3) % 4).collect();
    if poisoned {
        tokens[4] = 5;
    }
    Batch {
        rows: 2,
        width: 9,
        tokens,
        mask: None,
        resets: None,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_non_finite_batch_is_skipped_and_counted() {
    let (gpu, _lock) = context();
    // Untied, so the poisoned embedding row only enters through its id.
    let c = Mamba3Config {
        tie_embeddings: false,
        vocab_size: 8,
        ..cfg()
    };
    let mut w = Weights::<f32>::init(&c, 14).expect("weights");
    let d = c.d_model;
    w.embedding[5 * d..6 * d].fill(f32::NAN);
    let mut dev = GpuF32Engine::new(gpu, c.clone(), &w, &settings(Some(1.0)), 2, 9).unwrap();
    let mut cpu = CpuEngine::new(c, w, settings(Some(1.0))).unwrap();
    let batches = [hand_batch(false), hand_batch(true), hand_batch(false)];
    let mut states = Vec::new();
    for b in &batches {
        for e in [&mut dev as &mut dyn TrainEngine, &mut cpu] {
            e.load_batch(b).unwrap();
            e.step().unwrap();
        }
        let (g, k) = (dev.metrics().unwrap(), cpu.metrics().unwrap());
        assert_eq!(
            (g.step, g.skipped, g.skipped_total),
            (k.step, k.skipped, k.skipped_total)
        );
        assert_eq!(g.grad_norm.is_finite(), !g.skipped);
        states.push(dev.export_state().unwrap());
    }
    assert!(states[1].steps == 2 && states[1].skipped == 1 && states[1].adam_steps == 1);
    assert_eq!(
        state_bits(&states[0]),
        state_bits(&states[1]),
        "the skipped step changed nothing"
    );
    assert_eq!(
        (states[2].steps, states[2].skipped, states[2].adam_steps),
        (3, 1, 2)
    );
    assert_ne!(state_bits(&states[1]), state_bits(&states[2]));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn frozen_slices_never_move() {
    let (gpu, _lock) = context();
    let c = cfg();
    let frozen = rotation_rows(&c);
    let mut w = Weights::<f32>::init(&c, 15).expect("weights");
    let f = frozen[0].clone();
    w.layers[0].in_proj[f.start..f.end].fill(0.0);
    let s = OptimSettings {
        frozen,
        ..settings(Some(1.0))
    };
    let (batches, width) = parity(4, 8, 8);
    let mut dev = gpu_engine(gpu, &w, &s, 8, width);
    run(&mut dev, &batches);
    let after = dev.export_state().unwrap();
    let ip = &after.weights.layers[0].in_proj;
    assert!(
        ip[f.start..f.end].iter().all(|&v| v == 0.0),
        "angle rows stay zero"
    );
    assert_ne!(
        &ip[..f.start],
        &w.layers[0].in_proj[..f.start],
        "the rest trains"
    );
}

/// N steps straight equal N/2, export, a fresh engine importing, N/2.
fn resume_case<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let w = Weights::<f32>::init(&cfg(), 16).expect("weights");
    let (batches, width) = parity(8, 8, 9);
    let s = settings(Some(0.5));
    let straight = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        let m = run(&mut e, &batches);
        (m, e.export_state().unwrap())
    };
    let half = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        run(&mut e, &batches[..4]);
        e.export_state().unwrap()
    };
    let resumed = {
        let (gpu, _lock) = context();
        // Other weights: everything must come from the imported state.
        let other = Weights::<f32>::init(&cfg(), 99).expect("weights");
        let mut e = engine_of::<P>(gpu, &other, &s, 8, width);
        e.import_state(half).unwrap();
        let m = run(&mut e, &batches[4..]);
        (m, e.export_state().unwrap())
    };
    assert_eq!(&straight.0[4..], &resumed.0[..], "metrics of steps 5..8");
    assert_eq!(state_bits(&straight.1), state_bits(&resumed.1));
    assert_eq!(
        (straight.1.steps, straight.1.adam_steps, straight.1.skipped),
        (resumed.1.steps, resumed.1.adam_steps, resumed.1.skipped)
    );
}

/// Ten replayed steps equal ten eager ones, metrics and state, bit for bit.
fn replay_case<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let w = Weights::<f32>::init(&cfg(), 17).expect("weights");
    let (batches, width) = parity(10, 8, 10);
    let s = settings(Some(0.5));
    let replayed = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        (run(&mut e, &batches), e.export_state().unwrap())
    };
    let eager = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        (run_eager(&mut e, &batches), e.export_state().unwrap())
    };
    assert_eq!(replayed.0, eager.0);
    assert_eq!(state_bits(&replayed.1), state_bits(&eager.1));
}

/// Other weights swapped in for an evaluation mid-run and the trained ones
/// put back (what `--ema` does at every evaluation): the run goes on bit for
/// bit as one never swapped, and the evaluation scored the other weights.
fn swap_case<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let w = Weights::<f32>::init(&cfg(), 19).expect("weights");
    let other = Weights::<f32>::init(&cfg(), 98).expect("weights");
    let (batches, width) = parity(8, 8, 12);
    let s = settings(Some(0.5));
    let straight = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        (run(&mut e, &batches), e.export_state().unwrap())
    };
    let swapped = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        let mut m = run(&mut e, &batches[..4]);
        let trained = e.weights().unwrap();
        assert_eq!(trained, e.export_state().unwrap().weights);
        let before = e.eval(&batches[0]).unwrap();
        e.set_weights(&other).unwrap();
        let theirs = e.eval(&batches[0]).unwrap();
        assert_ne!(
            theirs.token_loss, before.token_loss,
            "scored the other weights"
        );
        e.set_weights(&trained).unwrap();
        assert_eq!(
            e.eval(&batches[0]).unwrap(),
            before,
            "the trained weights are back"
        );
        m.extend(run(&mut e, &batches[4..]));
        (m, e.export_state().unwrap())
    };
    assert_eq!(straight.0, swapped.0, "every step's metrics");
    assert_eq!(state_bits(&straight.1), state_bits(&swapped.1));
}

/// A weight edit between two replays of the captured step (what `train
/// --edit` does: export, edit, import into the live engine) trains on as a
/// fresh engine importing the same edited state does, bit for bit; the
/// edited part reads back as edited before the next step.
fn edit_case<P: ModelCompute>()
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let w = Weights::<f32>::init(&cfg(), 21).expect("weights");
    let (batches, width) = parity(8, 8, 13);
    let s = settings(Some(0.5));
    let edit: WeightEdit = "mixer.in_proj.weight:0-8*0@4".parse().unwrap();
    let specs = param_specs(&cfg());
    let edited = |e: &mut dyn TrainEngine| {
        let mut state = e.export_state().unwrap();
        edit.apply(&specs, &mut state, None).unwrap();
        state
    };
    let live = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        run(&mut e, &batches[..4]);
        let state = edited(&mut e);
        e.import_state(state.clone()).unwrap();
        assert_eq!(state_bits(&e.export_state().unwrap()), state_bits(&state));
        let m = run(&mut e, &batches[4..]);
        (m, e.export_state().unwrap())
    };
    let at_edit = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        run(&mut e, &batches[..4]);
        edited(&mut e)
    };
    let fresh = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        e.import_state(at_edit).unwrap();
        let m = run(&mut e, &batches[4..]);
        (m, e.export_state().unwrap())
    };
    assert_eq!(live.0, fresh.0, "metrics of steps 5..8");
    assert_eq!(state_bits(&live.1), state_bits(&fresh.1));
}

/// `n` parity batches of `rows` rows whose largest size grows from 2 to
/// 40 over `2 n` batches (so the first ones are far narrower than the
/// training width), and that width.
fn growing(n: usize, rows: usize, seed: u64) -> (Vec<Batch>, usize) {
    let steps = u64::try_from(2 * n).expect("steps");
    let spec = DataSpec::task(Task::Parity, 40, vec![]).with_curriculum(steps, 2);
    let mut data = Dataset::new(&spec, seed, rows).expect("dataset");
    let width = data.train_width();
    let batches = (0..n)
        .map(|_| data.next_batch(rows).expect("batch"))
        .collect();
    (batches, width)
}

/// A run's metrics and final state.
type Trained = (Vec<StepMetrics>, EngineState);

/// `replayed` equals `eager` bit for bit (the same batches replayed and run
/// eagerly), and trains what `padded` trains up to `tolerance`: every
/// step's loss and gradient norm, and the final weights.
fn trains_alike(padded: &Trained, replayed: &Trained, eager: &Trained, tolerance: f64) {
    assert_eq!(replayed.0, eager.0, "replayed and eager metrics");
    assert_eq!(state_bits(&replayed.1), state_bits(&eager.1));
    for (a, b) in padded.0.iter().zip(&replayed.0) {
        println!("step {}: loss {:.6} against {:.6}", a.step, b.loss, a.loss);
        assert!(
            rel(b.loss, a.loss) < tolerance,
            "loss {} vs {}",
            b.loss,
            a.loss
        );
        assert!(rel(b.grad_norm, a.grad_norm) < tolerance, "grad norm");
    }
    for (x, y) in padded
        .1
        .weights
        .tensors()
        .iter()
        .zip(replayed.1.weights.tensors())
    {
        assert!(rel_vec(y, x) < tolerance, "weights");
    }
}

/// Batches trimmed to their longest row (`--trim`) replay the graphs
/// captured at their widths: bit for bit what the step computes eagerly at
/// those widths, and, up to the sums' rounding, what the padded batches
/// train.
fn trim_case<P: ModelCompute>(tolerance: f64)
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let w = Weights::<f32>::init(&cfg(), 22).expect("weights");
    let (batches, width) = growing(8, 8, 14);
    let trimmed: Vec<Batch> = batches.iter().map(|b| b.trimmed(8)).collect();
    assert!(
        trimmed.iter().any(|b| b.width < width),
        "some batch is narrower than the training width"
    );
    let s = settings(Some(0.5));
    let padded = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        (run(&mut e, &batches), e.export_state().unwrap())
    };
    let replayed = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        e.capture_widths(&Batch::trimmed_widths(width, 8)).unwrap();
        (run(&mut e, &trimmed), e.export_state().unwrap())
    };
    let eager = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<P>(gpu, &w, &s, 8, width);
        e.capture_widths(&Batch::trimmed_widths(width, 8)).unwrap();
        (run_eager(&mut e, &trimmed), e.export_state().unwrap())
    };
    trains_alike(&padded, &replayed, &eager, tolerance);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn trimmed_batches_train_as_padded_ones() {
    trim_case::<f32>(1e-4);
    trim_case::<half::bf16>(2e-2);
}

/// Heads the warp scan takes (headdim 8, d_state 32), in two layers: the
/// shape packed rows need.
fn warp_cfg() -> Mamba3Config {
    Mamba3Config {
        d_state: 32,
        n_layer: 2,
        ..cfg()
    }
}

/// Batches laid two instances a row, the state reset at each one's first
/// token (`--pack 2`), replay the graphs captured at their widths bit for
/// bit as the step runs eagerly, and train what the same instances train
/// one a row, up to rounding.
fn pack_case<P: ModelCompute>(tolerance: f64)
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let c = warp_cfg();
    let w = Weights::<f32>::init(&c, 23).expect("weights");
    let (batches, width) = growing(8, 8, 15);
    let packed: Vec<Batch> = batches
        .iter()
        .map(|b| b.packed(2, 8, Task::Parity.pad()))
        .collect();
    let (rows, cap) = Batch::packed_shape(8, width, 2);
    assert!(packed.iter().all(|b| b.rows == rows && b.width <= cap));
    let s = settings(Some(0.5));
    let build = |gpu: Gpu, pack: bool| {
        let mut e = if pack {
            GpuEngine::<P>::packed(gpu, c.clone(), &w, &s, rows, cap)
        } else {
            GpuEngine::<P>::new(gpu, c.clone(), &w, &s, 8, width)
        }
        .expect("gpu engine");
        e.set_schedule(SCHEDULE);
        if pack {
            e.capture_widths(&Batch::trimmed_widths(cap, 8)).unwrap();
        }
        e
    };
    let padded = {
        let (gpu, _lock) = context();
        let mut e = build(gpu, false);
        let err = e.load_batch(&packed[0]).unwrap_err().to_string();
        assert!(err.contains("packed"), "{err}");
        (run(&mut e, &batches), e.export_state().unwrap())
    };
    let replayed = {
        let (gpu, _lock) = context();
        let mut e = build(gpu, true);
        let err = e
            .load_batch(&batches[0].trimmed(8))
            .unwrap_err()
            .to_string();
        assert!(err.contains("packed batches only"), "{err}");
        (run(&mut e, &packed), e.export_state().unwrap())
    };
    let eager = {
        let (gpu, _lock) = context();
        let mut e = build(gpu, true);
        (run_eager(&mut e, &packed), e.export_state().unwrap())
    };
    trains_alike(&padded, &replayed, &eager, tolerance);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn packed_batches_train_as_padded_ones() {
    pack_case::<f32>(1e-4);
    pack_case::<half::bf16>(2e-2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn packing_is_refused_where_the_warp_scan_does_not_run() {
    let (gpu, _lock) = context();
    let w = Weights::<f32>::init(&cfg(), 3).expect("weights");
    // cfg(): d_state 16, a head the block scan runs.
    let err = GpuEngine::<f32>::packed(gpu, cfg(), &w, &settings(None), 4, 32)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("packed rows need the warp scan") && err.contains("8 x 16"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_edit_between_replays_trains_on_as_a_fresh_engine_would() {
    edit_case::<f32>();
    edit_case::<half::bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swapped_weights_leave_the_run_bit_identical() {
    swap_case::<f32>();
    swap_case::<half::bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn resume_is_bit_identical() {
    resume_case::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_matches_eager_bit_for_bit() {
    replay_case::<f32>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_resume_is_bit_identical() {
    resume_case::<half::bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_graph_replay_matches_eager_bit_for_bit() {
    replay_case::<half::bf16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_engine_tracks_the_f32_engine() {
    let w = Weights::<f32>::init(&cfg(), 18).expect("weights");
    let (batches, width) = parity(20, 16, 11);
    let s = settings(Some(1.0));
    let m32 = {
        let (gpu, _lock) = context();
        run(&mut engine_of::<f32>(gpu, &w, &s, 16, width), &batches)
    };
    let (m16, info) = {
        let (gpu, _lock) = context();
        let mut e = engine_of::<half::bf16>(gpu, &w, &s, 16, width);
        (run(&mut e, &batches), e.info())
    };
    assert_eq!(info.precision, "bf16");
    for (a, b) in m32.iter().zip(&m16) {
        println!(
            "step {}: loss f32 {:.5} bf16 {:.5} | norm {:.4} {:.4}",
            a.step, a.loss, b.loss, a.grad_norm, b.grad_norm
        );
        assert_eq!((a.step, a.lr, a.skipped), (b.step, b.lr, b.skipped));
    }
    assert!(rel(m16[0].loss, m32[0].loss) < 2e-2, "first loss");
    assert!(rel(m16[0].grad_norm, m32[0].grad_norm) < 5e-2, "first norm");
    let mean = |m: &[StepMetrics]| m.iter().map(|x| x.loss).sum::<f64>() / m.len() as f64;
    assert!(
        rel(mean(&m16[15..]), mean(&m32[15..])) < 5e-2,
        "last losses"
    );
}
