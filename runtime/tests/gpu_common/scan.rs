//! Running the scans (`kernels/mamba3_scan.cu`, `mamba3_warpscan.cu`,
//! `mamba3_chunk.cu`) side by side on one real layer's inputs: an f32
//! step runs its forward pass, then a scan reads layer 0's q, k, proj and
//! per-head scalars and an upstream gradient, and its outputs are compared
//! by relative error and cosine (`gpu_chunk_scan.rs`, `gpu_warp_scan.rs`).

use half::bf16;
use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::kernels::f32_to_bf16;
use stepgraph::kernels::mamba3::{self as k, Mamba3Shape};
use stepgraph::kernels::mamba3_bwd::{self as kb, ScanGrads};
use stepgraph::kernels::mamba3_chunk as kc;
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::gpu::forward;
use stepgraph::step::F32Step;

use super::oracle::random_f32_step;

/// One layer at d_model 128 (expand 2) with the given head shape, chunk and
/// groups: the configs the scan comparisons draw their cases from.
pub fn layer_cfg(d_state: usize, headdim: usize, chunk: usize, ngroups: usize) -> Mamba3Config {
    Mamba3Config {
        d_model: 128,
        n_layer: 1,
        vocab_size: 64,
        d_state,
        headdim,
        chunk_size: chunk,
        ngroups,
        ..Mamba3Config::default()
    }
}

/// A random f32 step of `cfg` after its forward pass.
pub fn step(gpu: &Gpu, cfg: &Mamba3Config, batch: usize, len: usize, seed: u64) -> F32Step {
    let mut s = random_f32_step(gpu, cfg, batch, len, seed);
    forward(gpu, &s.weights, &s.tokens, &mut s.acts, &mut s.loss).expect("forward");
    s
}

/// Relative error ||a - b|| / ||b|| and cosine of two vectors.
pub fn compare(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut d, mut nb, mut na, mut dot) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        assert!(x.is_finite(), "non-finite output");
        d += (x - y) * (x - y);
        nb += y * y;
        na += x * x;
        dot += x * y;
    }
    let rel = if nb > 0.0 { (d / nb).sqrt() } else { d.sqrt() };
    let cos = if na > 0.0 && nb > 0.0 {
        dot / (na.sqrt() * nb.sqrt())
    } else {
        1.0
    };
    (rel, cos)
}

/// Which scan [`run`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The chunk-parallel tensor-core scan (bf16 q/k).
    Chunk,
    /// The scalar scan, in the shape's `scan_form`, on the step's f32 q/k.
    ScalarF32,
    /// The same on q/k rounded to bf16 (the mixed step's scalar path).
    ScalarBf16,
}

/// Every buffer the scans write.
pub struct Outs {
    pub y: DeviceBuffer<f32>,
    /// The scalar scan's states (f32).
    pub states: DeviceBuffer<f32>,
    /// The chunk scan's states (bf16) and its f32 working memory.
    pub states16: DeviceBuffer<bf16>,
    pub own: DeviceBuffer<f32>,
    pub dq: DeviceBuffer<f32>,
    pub dk: DeviceBuffer<f32>,
    pub dproj: DeviceBuffer<f32>,
    pub dadt: DeviceBuffer<f32>,
    pub dscale: DeviceBuffer<f32>,
    pub dqkdot: DeviceBuffer<f32>,
    pub dskip_part: DeviceBuffer<f32>,
    pub gstates: DeviceBuffer<bf16>,
    /// The step's q/k rounded to bf16: the chunk scan reads them so (the
    /// mixed step stores them in bf16), the f32 scalar scan reads f32.
    pub qk16: (DeviceBuffer<bf16>, DeviceBuffer<bf16>),
}

pub fn outs(gpu: &Gpu, sh: &Mamba3Shape, s: &F32Step) -> Outs {
    let z = |n: usize| gpu.alloc_zeros::<f32>(n.max(1)).expect("alloc");
    let bf = |x: &DeviceBuffer<f32>| {
        let mut y = gpu.alloc::<bf16>(x.len()).expect("bf16 q/k");
        f32_to_bf16(gpu, x, &mut y).expect("round q/k");
        y
    };
    let hn = sh.rows * sh.nheads * sh.d_state;
    let rh = sh.rows * sh.nheads;
    Outs {
        y: z(sh.rows * sh.d_inner),
        states: z(kc::state_elems(sh)),
        states16: gpu.alloc_zeros::<bf16>(kc::state_elems(sh)).expect("alloc"),
        own: z(kc::state_elems(sh)),
        dq: z(hn),
        dk: z(hn),
        dproj: z(sh.rows * sh.width),
        dadt: z(rh),
        dscale: z(rh),
        dqkdot: z(rh),
        dskip_part: z(kc::dskip_part_elems(sh)),
        gstates: gpu.alloc_zeros::<bf16>(kc::state_elems(sh)).expect("alloc"),
        qk16: (bf(&s.acts.q), bf(&s.acts.k)),
    }
}

/// Runs one scan forward and backward on layer 0 of `s` at shape `sh`
/// (the step's shape, possibly with another `scan_form`).
pub fn run(
    gpu: &Gpu,
    s: &F32Step,
    sh: &Mamba3Shape,
    dy: &DeviceBuffer<f32>,
    o: &mut Outs,
    path: Path,
) {
    let (lw, la) = (&s.weights.layers[0], &s.acts.layers[0]);
    let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
    let (q16, k16) = &o.qk16;
    match path {
        Path::Chunk => kc::scan_fwd(
            gpu,
            sh,
            q16,
            k16,
            &la.proj,
            scalars,
            &lw.d,
            &mut o.y,
            &mut o.own,
            &mut o.states16,
        )
        .expect("chunk scan forward"),
        Path::ScalarF32 => k::scan_fwd(
            gpu,
            sh,
            &s.acts.q,
            &s.acts.k,
            &la.proj,
            (scalars, None),
            &lw.d,
            &mut o.y,
            &mut o.states,
        )
        .expect("scalar scan forward"),
        Path::ScalarBf16 => k::scan_fwd(
            gpu,
            sh,
            q16,
            k16,
            &la.proj,
            (scalars, None),
            &lw.d,
            &mut o.y,
            &mut o.states,
        )
        .expect("scalar scan forward (bf16 q/k)"),
    }
    let grads = ScanGrads {
        dq: &mut o.dq,
        dk: &mut o.dk,
        dproj: &mut o.dproj,
        dadt: &mut o.dadt,
        dscale: &mut o.dscale,
        dqkdot: &mut o.dqkdot,
        dskip_part: &mut o.dskip_part,
    };
    // Every backward pass reads the states its own forward pass wrote.
    match path {
        Path::Chunk => kc::scan_bwd(
            gpu,
            sh,
            q16,
            k16,
            &la.proj,
            scalars,
            &lw.d,
            &o.states16,
            &mut o.own,
            &mut o.gstates,
            dy,
            grads,
        )
        .expect("chunk scan backward"),
        Path::ScalarF32 => kb::scan_bwd(
            gpu,
            sh,
            &s.acts.q,
            &s.acts.k,
            &la.proj,
            (scalars, None),
            &lw.d,
            &o.states,
            dy,
            grads,
        )
        .expect("scalar scan backward"),
        Path::ScalarBf16 => kb::scan_bwd(
            gpu,
            sh,
            q16,
            k16,
            &la.proj,
            (scalars, None),
            &lw.d,
            &o.states,
            dy,
            grads,
        )
        .expect("scalar scan backward (bf16 q/k)"),
    }
}

pub fn host(gpu: &Gpu, b: &DeviceBuffer<f32>) -> Vec<f32> {
    gpu.to_host(b).expect("download")
}

pub fn host16(gpu: &Gpu, b: &DeviceBuffer<bf16>) -> Vec<f32> {
    let v = gpu.to_host(b).expect("download");
    v.iter().map(|x| x.to_f32()).collect()
}

/// dL/dD per head from the partials (`rows` partial rows of H).
pub fn dskip(gpu: &Gpu, b: &DeviceBuffer<f32>, rows: usize, heads: usize) -> Vec<f32> {
    let v = host(gpu, b);
    (0..heads)
        .map(|h| (0..rows).map(|r| v[r * heads + h]).sum())
        .collect()
}

/// The gradients both scalar forms write, by name, downloaded.
pub fn grads(gpu: &Gpu, o: &Outs) -> Vec<(&'static str, Vec<f32>)> {
    [
        ("dq", &o.dq),
        ("dk", &o.dk),
        ("dproj (dv)", &o.dproj),
        ("dadt", &o.dadt),
        ("dscale", &o.dscale),
        ("dqkdot", &o.dqkdot),
    ]
    .into_iter()
    .map(|(name, b)| (name, host(gpu, b)))
    .collect()
}

/// Every output of a run of `path` by name: y, the chunk states, the
/// gradients and dL/dD summed from its partials (one per row and chunk for
/// the chunk scan, one per row for the scalar forms).
pub fn outputs(gpu: &Gpu, o: &Outs, sh: &Mamba3Shape, path: Path) -> Vec<(&'static str, Vec<f32>)> {
    let n = kc::state_elems(sh);
    let (states, dd_rows) = if path == Path::Chunk {
        (host16(gpu, &o.states16), sh.batch * sh.nchunks)
    } else {
        (host(gpu, &o.states), sh.batch)
    };
    let mut v = vec![("y", host(gpu, &o.y)), ("states", states[..n].to_vec())];
    v.extend(grads(gpu, o));
    v.push(("dD", dskip(gpu, &o.dskip_part, dd_rows, sh.nheads)));
    v
}

/// Holds every output of one run to the other's (`rel < rel_max` and
/// `cos > cos_min`), printing each comparison under `label`, and folds the
/// worst relative error and cosine into `worst`.
pub fn check(
    label: &str,
    got: &[(&'static str, Vec<f32>)],
    want: &[(&'static str, Vec<f32>)],
    (rel_max, cos_min): (f64, f64),
    worst: &mut (f64, f64),
) {
    println!("{label}");
    for ((name, x), (_, y)) in got.iter().zip(want) {
        let (rel, cos) = compare(x, y);
        println!("  {name:<12} rel {rel:.2e}  cos {cos:.9}");
        *worst = (worst.0.max(rel), worst.1.min(cos));
        assert!(
            rel < rel_max && cos > cos_min,
            "{label} {name}: rel {rel:.3e} cos {cos:.9}"
        );
    }
}

/// Median wall time of `f` over `reps` calls after one warm-up, in ms.
pub fn median_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut()) -> f32 {
    f();
    gpu.synchronize().expect("sync");
    let mut v = Vec::new();
    for _ in 0..reps {
        let start = std::time::Instant::now();
        f();
        gpu.synchronize().expect("sync");
        v.push(start.elapsed().as_secs_f32() * 1e3);
    }
    super::median(v)
}
