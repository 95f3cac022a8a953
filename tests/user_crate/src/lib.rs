//! A training step written in a crate of its own, against stepgraph's
//! public API only: its spec (`specs/tiny.ron`), its step struct, its ops
//! and a kernel of its own. `cargo test` runs the guard tests the derive
//! generates for it (no GPU needed).

use std::sync::LazyLock;

use stepgraph::device::{DeviceBuffer, Gpu, GpuError};
use stepgraph::kernels::user::{Grid, UserKernel, UserKernels};
use stepgraph::kernels::user_params::{In, Out};
use stepgraph::{DevicePtrs, TrainingGraph};

/// `h = x * w` elementwise: the crate's own kernel.
const SRC: &str = r#"
#include "common.cuh"
extern "C" __global__ void scale(const float* x, const float* w, float* h, unsigned n) {
    SG_FOR_EACH(i, n) { h[i] = x[i] * w[i]; }
}
"#;

/// The crate's kernels, declared once.
pub struct Kernels {
    /// Opens a context with them: `Gpu::with_user_kernels(opts, &KERNELS.set)`.
    pub set: UserKernels,
    /// `scale(const float* x, const float* w, float* h, unsigned n)`.
    pub scale: UserKernel<(In<f32>, In<f32>, Out<f32>, u32)>,
}

/// The handles, made on first use.
pub static KERNELS: LazyLock<Kernels> = LazyLock::new(|| {
    let mut set = UserKernels::new();
    let scale = set.module("userstep.cu", SRC).kernel("scale");
    Kernels { set, scale }
});

/// Step-local activations.
#[derive(DevicePtrs)]
pub struct Hidden {
    /// `x * w`.
    pub h: DeviceBuffer<f32>,
    /// `silu(h)`.
    pub act: DeviceBuffer<f32>,
}

/// `hidden.h = x * w` (the crate's kernel), `hidden.act = silu(hidden.h)`.
pub fn layer(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    hidden: &mut Hidden,
) -> Result<(), GpuError> {
    let n = stepgraph::device::to_u32("x.len()", x.len())?;
    KERNELS
        .scale
        .launch(gpu, Grid::cover(x.len(), 256)?, (x, w, &mut hidden.h, n))?;
    stepgraph::kernels::silu(gpu, &hidden.h, &mut hidden.act)
}

/// `y = sum(act^2)`, stepgraph's deterministic reduction.
pub fn head(gpu: &Gpu, hidden: &Hidden, y: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
    stepgraph::kernels::sum_squares(gpu, &hidden.act, y)
}

/// The step `specs/tiny.ron` describes.
#[derive(TrainingGraph)]
#[graph(spec = "../specs/tiny.ron")]
pub struct TinyStep {
    /// Input.
    pub x: DeviceBuffer<f32>,
    /// Weights.
    pub w: DeviceBuffer<f32>,
    /// Activations.
    pub hidden: Hidden,
    /// Output.
    pub y: DeviceBuffer<f32>,
}
