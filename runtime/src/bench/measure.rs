//! The bench of one configuration at one precision: full LM step and
//! backbone step, eager and graph, the per-op breakdown (the step's own
//! forward and backward bodies with a timing probe), and memory.
//! [`bench_with`] is one body for both precisions: it drives
//! [`Mamba3Step<P>`] and [`Backbone<P>`] through
//! [`TrainingStep`], as the derive implements it.

use std::collections::BTreeMap;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

use half::bf16;

use crate::device::{DeviceBuffer, Gpu, GpuError};
use crate::graph::{ShapeKey, TrainingStep};
use crate::mamba3::gpu::{
    Family, Mamba3GpuError, ModelCompute, backward, backward_probed, forward, forward_probed,
};
use crate::mamba3::{Mamba3Config, cpu};
use crate::optim::{AdamWConfig, DecayPolicy};

use crate::step::Mamba3Step;

use super::backbone::Backbone;
use super::flops::{param_count, step_flops};
use super::layer::{OpSample, Timed};
use super::report::{
    Breakdown, ConfigOutcome, ConfigReport, FamilyTime, Memory, OpTime, Shape, Skipped, StepResult,
};
use super::timing::{Ceiling, Stats, free_bytes, time_reps, used_bytes};
use super::{BenchConfig, BenchError, BenchOptions};

/// The f32 bench: the full f32 step and the f32 backbone step.
pub fn bench_f32(
    gpu: &Gpu,
    cfg: &BenchConfig,
    opts: &BenchOptions,
    ceiling: &Ceiling,
) -> Result<ConfigOutcome, BenchError> {
    bench_with::<f32>(gpu, cfg, opts, ceiling)
}

/// The bf16 bench: the mixed-precision full and backbone steps.
pub fn bench_bf16(
    gpu: &Gpu,
    cfg: &BenchConfig,
    opts: &BenchOptions,
    ceiling: &Ceiling,
) -> Result<ConfigOutcome, BenchError> {
    bench_with::<bf16>(gpu, cfg, opts, ceiling)
}

const SEED: u64 = 0x00be_4c00;

fn w(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Bytes a step allocates for `batch x seq_len` windows: weights, gradients
/// and both AdamW moments, the forward activations and the backward working
/// memory, as `mamba3::gpu` sizes them: 4 bytes each, except the GEMM
/// operands (`u`, `o`, `normed`) at `operand_bytes`; with 2 (bf16) also the
/// bf16 weight copies and the gradient staging. The fit check uses it
/// before allocating; the report shows it next to the measured footprint,
/// so drift is visible.
pub fn estimate_bytes(cfg: &Mamba3Config, batch: usize, seq_len: usize, operand_bytes: u64) -> u64 {
    let sh = crate::mamba3::gpu::kernel_shape(cfg, batch, seq_len);
    let rows = w(sh.rows);
    let (dm, di, e, v) = (w(sh.d_model), w(sh.d_inner), w(sh.width), w(sh.vocab));
    let (h, n, g, s) = (w(sh.nheads), w(sh.d_state), w(sh.ngroups), w(sh.angles));
    let hn = h * n;
    let ob = operand_bytes;
    // The mixed step keeps each layer's rotated q and k and runs the chunk
    // scan where the shape allows (bf16 states, an f32 working buffer
    // shared by the layers); the f32 step shares one q/k pair (see
    // `acts::keeps_qk`, `acts::chunk_scan`).
    let mixed = ob < 4;
    let chunk = mixed && crate::mamba3::gpu::tensor_core_scan(&sh);
    let state_elems = w(crate::kernels::mamba3_chunk::state_elems(&sh));
    let (kept_qk, shared_qk) = if mixed { (2 * hn, 0) } else { (0, 2 * hn) };
    let per_layer_row =
        4 * (dm + 1 + e + 2 * g + s + 3 * h + h * s + h + di + h) + ob * (dm + di + kept_qk);
    let states = if chunk { 2 } else { 4 } * state_elems;
    let layers = w(cfg.n_layer) * (rows * per_layer_row + states);
    let own_elems = w(crate::kernels::mamba3_chunk::own_elems(&sh));
    let chunk_own = if chunk { 4 * own_elems } else { 0 };
    let globals = rows * (4 * (dm + 1 + v + 2) + ob * (dm + shared_qk)) + chunk_own;
    let widest = dm.max(di).max(g * n);
    // The chunk scan's backward working memory (bf16 state gradients, and
    // f32 contributions where the one-kernel walk does not take the
    // shape), allocated only for a step that runs the chunk scan.
    let gstates = if chunk {
        2 * state_elems + 4 * own_elems
    } else {
        0
    };
    // dq and dk, and in the f32 step the q/k it rebuilds (the mixed step
    // keeps its own, so it has no rebuilt pair).
    let qk_work = if mixed { 2 * hn } else { 4 * hn };
    let work =
        4 * rows * (2 * dm + v + 2 * di + e + qk_work + 4 * h + h * s + widest + g * n) + gstates;
    let params = param_count(cfg);
    let (copies, staging) = if ob < 4 {
        (ob * params, ob * rows * v.max(dm).max(e))
    } else {
        (0, 0)
    };
    layers + globals + work + 16 * params + copies + staging
}

fn gib(b: u64) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "byte counts shown in GiB; rounding is fine"
    )]
    let b = b as f64;
    b / f64::from(1u32 << 30)
}

fn is_out_of_memory(e: &impl std::fmt::Display) -> bool {
    let t = e.to_string().to_ascii_lowercase();
    t.contains("out_of_memory") || t.contains("out of memory")
}

/// Benchmarks `cfg` with the full step and the backbone step at compute
/// type `P`; both are driven through [`TrainingStep`] only.
pub fn bench_with<P: ModelCompute>(
    gpu: &Gpu,
    cfg: &BenchConfig,
    opts: &BenchOptions,
    ceiling: &Ceiling,
) -> Result<ConfigOutcome, BenchError>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
    Backbone<P>: TrainingStep<Context = Gpu>,
{
    let model = cfg.model(opts.vocab);
    model.validate().map_err(Mamba3GpuError::from)?;
    let shape = Shape::of(cfg, opts.vocab);
    let skip = |reason: String| {
        Ok(ConfigOutcome::Skipped(Skipped {
            name: cfg.name.clone(),
            shape: shape.clone(),
            reason,
        }))
    };
    let (batch, len) = (cfg.batch, cfg.seq_len);
    let estimate = estimate_bytes(&model, batch, len, u64::from(P::PRECISION.operand_bytes()));
    let free = w(free_bytes(gpu)?);
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "planning only: the fraction of free memory a config may take"
    )]
    let allowed = (free as f64 * opts.memory_fraction) as u64;
    if estimate > allowed {
        return skip(format!(
            "the step needs about {:.1} GiB (activations, gradients, weights and AdamW state), {:.1} GiB of the device is free",
            gib(estimate),
            gib(free)
        ));
    }

    let base = w(used_bytes(gpu)?);
    let weights = cpu::Weights::<f32>::init(&model, SEED).map_err(Mamba3GpuError::from)?;
    let (adamw, decay) = (AdamWConfig::default(), DecayPolicy::default());
    let built = Mamba3Step::<P>::new(gpu, &model, &weights, &adamw, &decay, batch, len);
    drop(weights);
    let mut step = match built {
        Ok(s) => s,
        Err(e) if is_out_of_memory(&e) => {
            return skip(format!("the step does not fit: {e}"));
        }
        Err(e) => return Err(e.into()),
    };
    step.set_tokens(gpu, &random_tokens(&model, batch, len))?;
    let full_bytes = w(used_bytes(gpu)?).saturating_sub(base);
    let mut peak = base + full_bytes;

    // One eager step, timed, sizes the rest against the budget.
    let first = time_reps(gpu, 1, 1, || step.run_eager(gpu))?;
    let passes = 4 * (opts.warmup + opts.steps) + 3 * opts.breakdown_reps + 4;
    #[expect(
        clippy::cast_precision_loss,
        reason = "budget arithmetic on small counts; f64 is exact here"
    )]
    let planned_s = first.median_ms * 1e-3 * passes as f64;
    if planned_s > opts.budget_s {
        return skip(format!(
            "one step takes {:.0} ms; {passes} steps (eager, graph, breakdown, backbone) would take about {planned_s:.0} s, over the {:.0} s budget (--budget-s)",
            first.median_ms, opts.budget_s
        ));
    }

    let eager = time_reps(gpu, opts.warmup, opts.steps, || step.run_eager(gpu))?;
    let key = ShapeKey {
        batch,
        seq_len: len,
    };
    let graph = step.capture(gpu, key)?;
    let replay = time_reps(gpu, opts.warmup, opts.steps, || step.replay(gpu, &graph))?;
    drop(graph);
    let (breakdown, replica_ok) = breakdown(gpu, &mut step, opts.breakdown_reps, eager.median_ms)?;
    peak = peak.max(w(used_bytes(gpu)?));
    drop(step);

    let base_bb = w(used_bytes(gpu)?);
    let mut bb = Backbone::<P>::new(gpu, &model, batch, len, SEED)?;
    let bb_bytes = w(used_bytes(gpu)?).saturating_sub(base_bb);
    let bb_eager = time_reps(gpu, opts.warmup, opts.steps, || bb.run_eager(gpu))?;
    let bb_graph = bb.capture(gpu, key)?;
    let bb_replay = time_reps(gpu, opts.warmup, opts.steps, || bb.replay(gpu, &bb_graph))?;
    peak = peak.max(w(used_bytes(gpu)?));
    drop(bb_graph);
    drop(bb);
    // Capture froze the context's scratch areas (growth would move them
    // under a graph). Both of this config's graphs are gone, so no capture
    // records their addresses any more: the next, larger config may grow
    // them (the bf16 step's gradient staging does).
    crate::graph::Backend::set_scratch_frozen(gpu, false);

    let flops = step_flops(&model, batch, len);
    Ok(ConfigOutcome::Measured(Box::new(ConfigReport {
        name: cfg.name.clone(),
        shape,
        params: param_count(&model),
        flops,
        full_flops_per_token: flops.full_per_token(),
        backbone_flops_per_token: flops.backbone_per_token(),
        full: StepResult::new(eager, replay, flops.full(), flops.tokens, ceiling),
        backbone: StepResult::new(bb_eager, bb_replay, flops.backbone(), flops.tokens, ceiling),
        breakdown,
        memory: Memory {
            full_step_bytes: full_bytes,
            backbone_step_bytes: bb_bytes,
            estimate_bytes: estimate,
            peak_used_bytes: peak,
        },
        replica_matches_step: replica_ok,
    })))
}

fn random_tokens(cfg: &Mamba3Config, batch: usize, len: usize) -> Vec<i32> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ 0x70c3);
    let vocab = i32::try_from(cfg.vocab_size).unwrap_or(i32::MAX);
    (0..batch * (len + 1))
        .map(|_| rng.random_range(0..vocab))
        .collect()
}

fn bits(gpu: &Gpu, b: &DeviceBuffer<f32>) -> Result<Vec<u32>, GpuError> {
    Ok(gpu.to_host(b)?.into_iter().map(f32::to_bits).collect())
}

/// The loss and the first block's `in_proj` gradient, as bits.
fn snapshot<P: ModelCompute>(
    gpu: &Gpu,
    s: &Mamba3Step<P>,
) -> Result<(Vec<u32>, Vec<u32>), GpuError> {
    let grad = match s.grads.params.layers.first() {
        Some(l) => bits(gpu, &l.in_proj)?,
        None => Vec::new(),
    };
    Ok((bits(gpu, &s.loss)?, grad))
}

/// `reps` passes of the step's `forward` and `backward` bodies with every op
/// timed (the bodies' [`Timed`] probe). The step's remaining ops (loss
/// weighting, gradient norm, schedule, AdamW; whatever the spec runs after
/// `backward`) are timed as one: the eager step's median minus the median of
/// the step's own `forward` and `backward` ops between one pair of events.
/// They count as the optimizer family. (The steps zero no gradients: the
/// backward op writes every one.)
///
/// Also returns whether the timed pass and the step's own ops, on the same
/// weights and tokens, left the same loss and first-block `in_proj`
/// gradient, bit for bit: the probe only records events, so they must.
fn breakdown<P: ModelCompute>(
    gpu: &Gpu,
    s: &mut Mamba3Step<P>,
    reps: usize,
    eager_ms: f64,
) -> Result<(Breakdown, bool), BenchError> {
    let mut passes: Vec<Vec<OpSample>> = Vec::with_capacity(reps);
    for _ in 0..reps {
        let mut p = Timed::new(gpu)?;
        forward_probed(gpu, &s.weights, &s.tokens, &mut s.acts, &mut s.loss, &mut p)?;
        backward_probed(gpu, &s.weights, &s.tokens, &s.acts, &mut s.grads, &mut p)?;
        passes.push(p.finish(gpu)?);
    }
    let probed = snapshot(gpu, s)?;
    let fwd_bwd = time_reps(gpu, 1, reps.max(1), || -> Result<(), Mamba3GpuError> {
        forward(gpu, &s.weights, &s.tokens, &mut s.acts, &mut s.loss)?;
        backward(gpu, &s.weights, &s.tokens, &s.acts, &mut s.grads)
    })?;
    let same_bits = reps == 0 || probed == snapshot(gpu, s)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "statistics: the rest of the step as one sample per pass"
    )]
    let rest = (eager_ms - fwd_bwd.median_ms).max(0.0) as f32;
    for pass in &mut passes {
        pass.push(OpSample {
            family: Family::Optimizer,
            name: REST_OF_STEP,
            ms: rest,
        });
    }
    Ok((summarize(&passes), same_bits))
}

/// The breakdown's name for the ops after `backward`, timed together.
pub const REST_OF_STEP: &str = "after backward (loss weights, grad norm, schedule, AdamW)";

/// Medians of per-pass totals by family and by op name.
pub fn summarize(passes: &[Vec<OpSample>]) -> Breakdown {
    let median = |mut v: Vec<f32>| {
        Stats::of(&{
            v.sort_by(f32::total_cmp);
            v
        })
        .median_ms
    };
    let mut fam: BTreeMap<Family, Vec<f32>> = BTreeMap::new();
    let mut ops: BTreeMap<&'static str, (Family, usize, Vec<f32>)> = BTreeMap::new();
    for pass in passes {
        let mut f_tot: BTreeMap<Family, f32> = Family::ALL.iter().map(|&f| (f, 0.0)).collect();
        let mut o_tot: BTreeMap<&'static str, (Family, usize, f32)> = BTreeMap::new();
        for sm in pass {
            *f_tot.entry(sm.family).or_default() += sm.ms;
            let e = o_tot.entry(sm.name).or_insert((sm.family, 0, 0.0));
            e.1 += 1;
            e.2 += sm.ms;
        }
        for (f, ms) in f_tot {
            fam.entry(f).or_default().push(ms);
        }
        for (name, (f, calls, ms)) in o_tot {
            let e = ops.entry(name).or_insert((f, calls, Vec::new()));
            e.2.push(ms);
        }
    }
    let families: Vec<(Family, f64)> = Family::ALL
        .iter()
        .map(|f| (*f, fam.get(f).map_or(0.0, |v| median(v.clone()))))
        .collect();
    let sum: f64 = families.iter().map(|(_, ms)| ms).sum();
    let mut op_times: Vec<OpTime> = ops
        .into_iter()
        .map(|(name, (family, calls, v))| OpTime {
            name: name.to_owned(),
            family,
            calls,
            ms: median(v),
        })
        .collect();
    op_times.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    Breakdown {
        reps: passes.len(),
        families: families
            .into_iter()
            .map(|(family, ms)| FamilyTime {
                family,
                ms,
                share: if sum > 0.0 { ms / sum } else { 0.0 },
            })
            .collect(),
        ops: op_times,
        sum_ms: sum,
    }
}
