//! The multi-tensor optimizer kernels and the parameter-gradient column sum
//! against host references: the fused global-norm partials, schedule and
//! AdamW pass against the CPU [`AdamW`] with torch-style clipping (odd
//! lengths, more tensors than one launch holds, decay on some, bf16 copies on
//! some, clipping active and inactive, a rescaled gradient, a non-finite
//! gradient that skips the step), AdamW without a gate, the norm partials'
//! determinism, the wrappers' size checks, the column sum against a host
//! sum, bit-identical run to run, and the embedding gradient (`embed_bwd`)
//! against a host scatter-add, bit-identical run to run.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored`, where a missing GPU fails them. Inputs are
//! fresh random draws; the seed is printed so a failure can be replayed.

mod gpu_common;

use std::collections::HashSet;

use gpu_common::oracle::fresh_seed;
use gpu_common::{gpu, random};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::device::{DeviceBuffer, Gpu, GpuError};
use stepgraph::kernels::mamba3::Mamba3Shape;
use stepgraph::kernels::mamba3_bwd::{advance_schedule, colsum, colsum_partials, embed_bwd};
use stepgraph::kernels::optim::{self as ko, AdamTensor};
use stepgraph::kernels::train::{ScheduleArgs, schedule};
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::gpu::kernel_shape;
use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy, Param, clip_grad_norm};

const LR: f64 = 1e-2;
const WD: f64 = 0.1;

/// Odd lengths around the unit boundaries, then many short tensors, so the
/// list spans two norm launches and four AdamW launches.
fn lengths(seed: u64, short: usize) -> Vec<usize> {
    let mut lens = vec![1, 3, 17, 1000, 16_383, 16_385, 65_537, 70_001, 200_003];
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1e45);
    lens.extend((0..short).map(|_| rng.random_range(1..=300)));
    lens
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// `|got - want| <= rtol |want| + atol` element by element.
fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (f64::from(g) - w).abs();
        assert!(
            d <= rtol * w.abs() + atol,
            "{what}[{i}]: gpu {g:e} vs cpu {w:e} (diff {d:e})"
        );
    }
}

/// Parameters, gradients, moments and bf16 copies of one tensor list.
struct Tensors {
    p: Vec<DeviceBuffer<f32>>,
    g: Vec<DeviceBuffer<f32>>,
    m: Vec<DeviceBuffer<f32>>,
    v: Vec<DeviceBuffer<f32>>,
    copy: Vec<Option<DeviceBuffer<bf16>>>,
    decay: Vec<bool>,
}

impl Tensors {
    /// Random parameters, zero moments, NaN-poisoned copies on every fourth
    /// tensor, decay on every third.
    fn new(gpu: &Gpu, lens: &[usize], seed: u64) -> (Self, Vec<Vec<f32>>) {
        let mut host = Vec::new();
        let mut t = Self {
            p: Vec::new(),
            g: Vec::new(),
            m: Vec::new(),
            v: Vec::new(),
            copy: Vec::new(),
            decay: Vec::new(),
        };
        for (i, &n) in lens.iter().enumerate() {
            let k = u64::try_from(i).expect("index");
            let p = random(seed ^ (k << 20), n, 1.0);
            t.p.push(gpu.to_device(&p).expect("param"));
            host.push(p);
            t.g.push(gpu.alloc_zeros::<f32>(n).expect("grad"));
            t.m.push(gpu.alloc_zeros::<f32>(n).expect("m"));
            t.v.push(gpu.alloc_zeros::<f32>(n).expect("v"));
            t.copy
                .push((i % 4 == 1).then(|| gpu.to_device(&vec![bf16::NAN; n]).expect("copy")));
            t.decay.push(i % 3 == 0);
        }
        (t, host)
    }

    /// Fresh random gradients (scale 1), uploaded; returns them.
    fn fill_grads(&mut self, gpu: &Gpu, seed: u64) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for (i, g) in self.g.iter_mut().enumerate() {
            let k = u64::try_from(i).expect("index");
            let h = random(seed ^ (k << 24) ^ 0x9a, g.len(), 1.0);
            gpu.copy_from_host(&h, g).expect("grad upload");
            out.push(h);
        }
        out
    }

    fn list(&mut self) -> Vec<AdamTensor<'_>> {
        let Self {
            p,
            g,
            m,
            v,
            copy,
            decay,
        } = self;
        p.iter_mut()
            .zip(g.iter())
            .zip(m.iter_mut())
            .zip(v.iter_mut())
            .zip(copy.iter_mut())
            .zip(decay.iter())
            .map(|(((((param, grad), m), v), c), &decay)| AdamTensor {
                param,
                grad,
                m,
                v,
                copy: c.as_mut(),
                decay,
            })
            .collect()
    }

    /// Every value of p, m, v and the copies, as bits.
    fn state_bits(&self, gpu: &Gpu) -> Vec<u32> {
        let mut out = Vec::new();
        for b in self.p.iter().chain(&self.m).chain(&self.v) {
            out.extend(bits(&gpu.to_host(b).expect("download")));
        }
        for c in self.copy.iter().flatten() {
            out.extend(
                gpu.to_host(c)
                    .expect("download")
                    .iter()
                    .map(|x| u32::from(x.to_bits())),
            );
        }
        out
    }
}

/// The step's device scalars (layouts in kernels/train.cu and
/// kernels/mamba3_adamw.cu).
struct Scalars {
    hyper: DeviceBuffer<f64>,
    params: DeviceBuffer<f64>,
    counters: DeviceBuffer<u64>,
    adam_step: DeviceBuffer<i32>,
    derived: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    loss: DeviceBuffer<f32>,
    report: DeviceBuffer<f64>,
    partials: DeviceBuffer<f64>,
}

impl Scalars {
    fn new(gpu: &Gpu, c: &AdamWConfig, lens: &[usize]) -> Self {
        Self {
            hyper: gpu
                .to_device(&[c.lr, c.beta1, c.beta2, c.eps, c.weight_decay])
                .expect("hyper"),
            // Constant lr: peak = min.
            params: gpu.to_device(&[c.lr, c.lr, 0.0]).expect("params"),
            counters: gpu.alloc_zeros::<u64>(4).expect("counters"),
            adam_step: gpu.alloc_zeros::<i32>(1).expect("adam step"),
            derived: gpu.to_device(&[f32::NAN; 8]).expect("derived"),
            gate: gpu.to_device(&[1.0f32, 0.0, 1.0]).expect("gate"),
            loss: gpu.alloc_zeros::<f32>(1).expect("loss"),
            report: gpu.alloc_zeros::<f64>(8).expect("report"),
            partials: gpu
                .to_device(&vec![f64::NAN; ko::norm_partials(lens.iter().copied())])
                .expect("partials"),
        }
    }

    /// `max_norm` (`<= 0`: no clipping) and the gradient scale.
    fn set(&mut self, gpu: &Gpu, max_norm: f64, gscale: f32) {
        gpu.copy_from_host(&[LR, LR, max_norm], &mut self.params)
            .expect("params");
        let mut gate = gpu.to_host(&self.gate).expect("gate");
        gate[2] = gscale;
        gpu.copy_from_host(&gate, &mut self.gate).expect("gate");
    }
}

/// The guarded step's optimizer half on the device: norm partials (one
/// multi-tensor launch per 192 tensors), the schedule kernel, then the fused
/// AdamW; returns the report.
fn device_step(gpu: &Gpu, t: &mut Tensors, s: &mut Scalars) -> Vec<f64> {
    let grads: Vec<&DeviceBuffer<f32>> = t.g.iter().collect();
    let count = ko::sumsq_partials(gpu, &grads, &mut s.partials).expect("norm partials");
    assert_eq!(count, s.partials.len(), "every partial written");
    schedule(
        gpu,
        ScheduleArgs {
            partials: &s.partials,
            count,
            params: &s.params,
            counters: &mut s.counters,
            hyper: &s.hyper,
            adam_step: &mut s.adam_step,
            derived: &mut s.derived,
            gate: &mut s.gate,
            loss: &s.loss,
            report: &mut s.report,
        },
    )
    .expect("schedule");
    ko::adamw(gpu, &mut t.list(), &s.derived, Some(&s.gate)).expect("fused adamw");
    gpu.to_host(&s.report).expect("report")
}

/// The CPU side of one applied step: rescale, clip (torch), AdamW. Returns
/// the norm before clipping.
fn cpu_step(
    opt: &mut AdamW<f64>,
    params: &mut [Vec<f64>],
    grads: &[Vec<f32>],
    gscale: f64,
    max_norm: Option<f64>,
) -> f64 {
    let mut g64: Vec<Vec<f64>> = grads
        .iter()
        .map(|g| g.iter().map(|&x| f64::from(x) * gscale).collect())
        .collect();
    let mut refs: Vec<&mut Vec<f64>> = g64.iter_mut().collect();
    let norm = clip_grad_norm(&mut refs, max_norm.unwrap_or(f64::INFINITY));
    let mut prefs: Vec<&mut Vec<f64>> = params.iter_mut().collect();
    let grefs: Vec<&[f64]> = g64.iter().map(Vec::as_slice).collect();
    opt.step(&mut prefs, &grefs).expect("cpu adamw");
    norm
}

fn host_norm(grads: &[Vec<f32>], gscale: f64) -> f64 {
    grads
        .iter()
        .flatten()
        .map(|&x| (f64::from(x) * gscale).powi(2))
        .sum::<f64>()
        .sqrt()
}

fn cpu_optimizer(lens: &[usize], decay: &[bool], config: AdamWConfig) -> AdamW<f64> {
    let specs: Vec<Param> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| Param {
            name: format!("t{i}"),
            numel: n,
            matrix: false,
        })
        .collect();
    let names: HashSet<String> = decay
        .iter()
        .enumerate()
        .filter(|(_, d)| **d)
        .map(|(i, _)| format!("t{i}"))
        .collect();
    AdamW::new(config, &specs, &DecayPolicy::Names(names))
}

/// Parameters, moments and bf16 copies after a step, against the CPU.
fn check_state(label: &str, gpu: &Gpu, t: &Tensors, opt: &AdamW<f64>, params: &[Vec<f64>]) {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, want) in params.iter().enumerate() {
        let p = gpu.to_host(&t.p[i]).expect("p");
        let m = gpu.to_host(&t.m[i]).expect("m");
        let v = gpu.to_host(&t.v[i]).expect("v");
        let (m64, v64) = opt.moments(i).expect("moments");
        // f32 arithmetic against f64: a few roundings per step, relative to
        // each value, plus a floor for values that cancel towards zero.
        assert_close(&format!("{label}: param {i}"), &p, want, 1e-5, 2e-6);
        assert_close(&format!("{label}: m {i}"), &m, m64, 1e-5, 1e-7);
        assert_close(&format!("{label}: v {i}"), &v, v64, 1e-5, 1e-9);
        for (&g, &w) in p.iter().zip(want) {
            num += (f64::from(g) - w).powi(2);
            den += w * w;
        }
        if let Some(c) = &t.copy[i] {
            let got = gpu.to_host(c).expect("copy");
            let exp: Vec<bf16> = p.iter().map(|&x| bf16::from_f32(x)).collect();
            assert!(
                got == exp,
                "{label}: bf16 copy {i} is not the rounded master"
            );
        }
    }
    let rel = (num / den).sqrt();
    assert!(rel < 1e-6, "{label}: parameters rel err {rel:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_adamw_with_norm_clip_and_skip_matches_the_cpu_reference() {
    let gpu = gpu();
    let seed = fresh_seed();
    println!("seed {seed}");
    let lens = lengths(seed, 190);
    assert!(lens.len() > ko::NORM_MAX && lens.len() > 3 * ko::ADAM_MAX);
    let config = AdamWConfig {
        lr: LR,
        weight_decay: WD,
        ..AdamWConfig::default()
    };
    let (mut t, p0) = Tensors::new(&gpu, &lens, seed);
    let mut s = Scalars::new(&gpu, &config, &lens);
    let mut opt = cpu_optimizer(&lens, &t.decay, config);
    let mut params: Vec<Vec<f64>> = p0.iter().map(|p| to64(p)).collect();

    // Step 1: no clipping, plain gradient. Step 2: clipped to a fifth of the
    // norm. Step 4 (after the skipped step 3): a halved gradient with a clip
    // threshold above the norm (inactive).
    for (k, clip_ratio, gscale) in [
        (1u64, None, 1.0f32),
        (2, Some(0.2), 1.0),
        (4, Some(2.0), 0.5),
    ] {
        let grads = t.fill_grads(&gpu, seed.wrapping_add(k));
        let gs = f64::from(gscale);
        let norm = host_norm(&grads, gs);
        let max_norm = clip_ratio.map(|r| r * norm);
        s.set(&gpu, max_norm.unwrap_or(0.0), gscale);
        let report = device_step(&gpu, &mut t, &mut s);
        let cpu_norm = cpu_step(&mut opt, &mut params, &grads, gs, max_norm);
        let label = format!("seed {seed} step {k}");
        let rel = (report[1] - cpu_norm).abs() / cpu_norm;
        assert!(rel < 1e-9, "{label}: norm {} vs {cpu_norm}", report[1]);
        assert_eq!(report[3], 0.0, "{label}: not skipped");
        let coef = max_norm.map_or(1.0, |m| (m / (cpu_norm + 1e-6)).min(1.0));
        assert!(
            (report[7] - coef).abs() < 1e-12,
            "{label}: coef {}",
            report[7]
        );
        check_state(&label, &gpu, &t, &opt, &params);

        if k == 2 {
            // Step 3: one non-finite gradient element: the step is skipped,
            // nothing moves, the counters say so.
            let before = t.state_bits(&gpu);
            let mut grads = t.fill_grads(&gpu, seed.wrapping_add(3));
            let victim = lens.len() - 7;
            grads[victim][0] = f32::NAN;
            gpu.copy_from_host(&grads[victim], &mut t.g[victim])
                .expect("poisoned grad");
            let report = device_step(&gpu, &mut t, &mut s);
            assert_eq!(report[3], 1.0, "seed {seed}: the step must be skipped");
            assert!(!report[1].is_finite());
            assert_eq!(report[6], 2.0, "seed {seed}: AdamW steps unchanged");
            assert!(
                t.state_bits(&gpu) == before,
                "seed {seed}: a skipped step changed parameters, moments or copies"
            );
            let counters = gpu.to_host(&s.counters).expect("counters");
            assert_eq!(counters[..2], [3, 1], "seed {seed}: steps, skipped");
        }
    }
    assert_eq!(opt.steps(), 3);
    assert_eq!(gpu.to_host(&s.adam_step).expect("adam step"), [3]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_adamw_without_a_gate_is_plain_adamw() {
    let gpu = gpu();
    let seed = fresh_seed();
    println!("seed {seed}");
    let lens = lengths(seed, 70);
    let config = AdamWConfig {
        lr: LR,
        weight_decay: WD,
        ..AdamWConfig::default()
    };
    let (mut t, p0) = Tensors::new(&gpu, &lens, seed);
    let mut s = Scalars::new(&gpu, &config, &lens);
    let mut opt = cpu_optimizer(&lens, &t.decay, config);
    let mut params: Vec<Vec<f64>> = p0.iter().map(|p| to64(p)).collect();
    for k in 1..=2u64 {
        let grads = t.fill_grads(&gpu, seed.wrapping_add(k));
        advance_schedule(&gpu, &s.hyper, &mut s.adam_step, &mut s.derived).expect("schedule");
        ko::adamw(&gpu, &mut t.list(), &s.derived, None).expect("fused adamw");
        cpu_step(&mut opt, &mut params, &grads, 1.0, None);
        check_state(&format!("seed {seed} step {k}"), &gpu, &t, &opt, &params);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_partials_are_deterministic_and_sum_to_the_host_norm() {
    let gpu = gpu();
    let seed = fresh_seed();
    println!("seed {seed}");
    let mut lens = lengths(seed, 200);
    lens.push(0);
    lens.push(1 << 20);
    let (mut t, _) = Tensors::new(&gpu, &lens, seed);
    let grads = t.fill_grads(&gpu, seed);
    let refs: Vec<&DeviceBuffer<f32>> = t.g.iter().collect();
    let total = ko::norm_partials(lens.iter().copied());
    let mut partials = gpu.to_device(&vec![f64::NAN; total]).expect("partials");
    assert_eq!(
        ko::sumsq_partials(&gpu, &refs, &mut partials).expect("partials"),
        total
    );
    let first = gpu.to_host(&partials).expect("download");
    let sum: f64 = first.iter().sum();
    let want = host_norm(&grads, 1.0).powi(2);
    let rel = (sum - want).abs() / want;
    assert!(rel < 1e-11, "seed {seed}: sum of squares rel err {rel:e}");
    for _ in 0..3 {
        ko::sumsq_partials(&gpu, &refs, &mut partials).expect("partials");
        let again = gpu.to_host(&partials).expect("download");
        assert!(
            again
                .iter()
                .map(|x| x.to_bits())
                .eq(first.iter().map(|x| x.to_bits())),
            "seed {seed}: partials differ between runs"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn optimizer_wrappers_refuse_mismatched_sizes() {
    let gpu = gpu();
    let lens = [5, 9];
    let (mut t, _) = Tensors::new(&gpu, &lens, 1);
    let refs: Vec<&DeviceBuffer<f32>> = t.g.iter().collect();
    let mut small = gpu.alloc_zeros::<f64>(1).expect("partials");
    let err = ko::sumsq_partials(&gpu, &refs, &mut small).unwrap_err();
    assert!(matches!(err, GpuError::BufferTooSmall { .. }), "{err}");

    let derived = gpu.alloc_zeros::<f32>(8).expect("derived");
    let short = gpu.alloc_zeros::<f32>(4).expect("short grad");
    let mut list = t.list();
    list[1].grad = &short;
    let err = ko::adamw(&gpu, &mut list, &derived, None).unwrap_err();
    assert!(matches!(err, GpuError::BufferTooSmall { .. }), "{err}");
    let three = gpu.alloc_zeros::<f32>(3).expect("scalars");
    let err = ko::adamw(&gpu, &mut t.list(), &three, None).unwrap_err();
    assert!(matches!(err, GpuError::BufferTooSmall { .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn colsum_matches_the_host_and_is_bit_identical_run_to_run() {
    let gpu = gpu();
    let seed = fresh_seed();
    println!("seed {seed}");
    // (rows, cols, ld, off): 16-byte loads over many splits; the model's
    // shapes (per-head biases, norms, dt_bias inside the in_proj row, D over
    // chunk partials); unaligned offsets and strides; one split (a single
    // launch); a single row and a single column.
    let shapes = [
        (4096, 3072, 3072, 0),
        (8192, 768, 768, 0),
        (8192, 128, 128, 0),
        (8192, 24, 3432, 3361),
        (128, 24, 24, 0),
        (1000, 24, 100, 37),
        (2049, 96, 101, 2),
        (64, 130, 130, 0),
        (7, 5, 9, 3),
        (1, 64, 64, 0),
        (300, 1, 1, 0),
        (70_001, 12, 16, 4),
    ];
    for (i, &(rows, cols, ld, off)) in shapes.iter().enumerate() {
        let k = u64::try_from(i).expect("index");
        let xh = random(seed ^ (k << 32), rows * ld, 2.0);
        let x = gpu.to_device(&xh).expect("x");
        let mut partials = gpu
            .to_device(&vec![f32::NAN; colsum_partials(rows, cols)])
            .expect("partials");
        let mut out = gpu.to_device(&vec![f32::NAN; cols]).expect("out");
        colsum(&gpu, &x, rows, cols, ld, off, &mut partials, &mut out).expect("colsum");
        let got = gpu.to_host(&out).expect("out");
        for c in 0..cols {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for r in 0..rows {
                let v = f64::from(xh[r * ld + off + c]);
                want += v;
                mag += v.abs();
            }
            let d = (f64::from(got[c]) - want).abs();
            assert!(
                d <= 4e-6 * mag + 1e-30,
                "seed {seed} {rows}x{cols} (ld {ld}, off {off}) column {c}: {} vs {want} (diff {d:e})",
                got[c]
            );
        }
        for _ in 0..2 {
            let mut again = gpu.to_device(&vec![f32::NAN; cols]).expect("out");
            colsum(&gpu, &x, rows, cols, ld, off, &mut partials, &mut again).expect("colsum");
            assert_eq!(
                bits(&gpu.to_host(&again).expect("out")),
                bits(&got),
                "seed {seed} {rows}x{cols}: not bit-identical run to run"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embed_bwd_matches_the_host_and_is_bit_identical_run_to_run() {
    let gpu = gpu();
    let seed = fresh_seed();
    println!("seed {seed}");
    // (vocab, d_model, batch, len): a tiny vocabulary over many positions
    // (float4 and scalar columns), the small state-tracking shape, windows
    // shorter than a warp's 32 positions, d_model over several column
    // passes, a single position, and a 50k vocabulary.
    let shapes = [
        (5, 72, 3, 1000),
        (5, 75, 3, 1000),
        (16, 128, 256, 160),
        (7, 40, 50, 7),
        (2, 33, 9, 1),
        (3, 1000, 5, 1000),
        (3, 1001, 10, 500),
        (1, 8, 1, 1),
        (50_000, 72, 4, 512),
    ];
    for (i, &(vocab, d_model, batch, len)) in shapes.iter().enumerate() {
        let sh = Mamba3Shape {
            vocab,
            d_model,
            ..kernel_shape(&Mamba3Config::tiny(), batch, len)
        };
        let rows = sh.rows;
        let k = u64::try_from(i).expect("index");
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (k << 32) ^ 0xe3b);
        // Ids in [-2, vocab + 2): some outside the vocabulary, which add
        // nothing.
        let hi = i32::try_from(vocab).expect("vocab") + 2;
        let toks: Vec<i32> = (0..batch * (len + 1))
            .map(|_| rng.random_range(-2..hi))
            .collect();
        let dhh = random(seed ^ (k << 32) ^ 1, rows * d_model, 1.0);
        let g0 = random(seed ^ (k << 32) ^ 2, vocab * d_model, 1.0);
        let tokens = gpu.to_device(&toks).expect("tokens");
        let dh = gpu.to_device(&dhh).expect("dh");
        let mut gemb = gpu.to_device(&g0).expect("gemb");
        embed_bwd(&gpu, &sh, &tokens, &dh, &mut gemb).expect("embed_bwd");
        let got = gpu.to_host(&gemb).expect("gemb");
        let mut want: Vec<f64> = g0.iter().map(|&x| f64::from(x)).collect();
        let mut mag: Vec<f64> = g0.iter().map(|&x| f64::from(x).abs()).collect();
        for r in 0..rows {
            let Ok(v) = usize::try_from(toks[r / len * (len + 1) + r % len]) else {
                continue;
            };
            if v >= vocab {
                continue;
            }
            for c in 0..d_model {
                let x = f64::from(dhh[r * d_model + c]);
                want[v * d_model + c] += x;
                mag[v * d_model + c] += x.abs();
            }
        }
        for (j, ((&g, &w), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
            let d = (f64::from(g) - w).abs();
            assert!(
                d <= 2e-5 * m + 1e-30,
                "seed {seed} vocab {vocab} d_model {d_model} {batch}x{len}: gemb[{}, {}] {g} vs {w} (diff {d:e})",
                j / d_model,
                j % d_model
            );
        }
        for _ in 0..2 {
            let mut again = gpu.to_device(&g0).expect("gemb");
            embed_bwd(&gpu, &sh, &tokens, &dh, &mut again).expect("embed_bwd");
            assert_eq!(
                bits(&gpu.to_host(&again).expect("gemb")),
                bits(&got),
                "seed {seed} vocab {vocab} d_model {d_model} {batch}x{len}: not bit-identical run to run"
            );
        }
        let reps = 20;
        gpu.synchronize().expect("sync");
        let start = std::time::Instant::now();
        for _ in 0..reps {
            embed_bwd(&gpu, &sh, &tokens, &dh, &mut gemb).expect("embed_bwd");
        }
        gpu.synchronize().expect("sync");
        let ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(reps);
        println!("embed_bwd vocab {vocab} d_model {d_model} {batch}x{len}: {ms:.4} ms");
    }
}
