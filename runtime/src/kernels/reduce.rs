//! Launch wrapper for `kernels/reduce.cu`: a deterministic sum of squares.
//!
//! Two launches: pass 1 writes one partial per block into the context's
//! `reduce_partials` scratch area, pass 2 folds them in one block. The grid
//! size depends only on `n`, and every sum runs in a fixed order, so the
//! result is bit-identical across runs and between eager execution and graph
//! replay; no float atomics are involved.

use cudarc::driver::PushKernelArg as _;

use super::Kernel;
use super::launch;
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, REDUCE_PARTIALS, to_u32};

/// Most pass-1 blocks, hence most partials (4 KiB of scratch).
pub const MAX_PARTIALS: u32 = 1024;

/// Pass-1 blocks (and partials) for `n` elements.
pub fn sum_squares_blocks(n: u32) -> u32 {
    launch::blocks(n, MAX_PARTIALS)
}

/// `out[0] = sum(x[i]^2)`, deterministically. `out` needs at least one
/// element; only the first is written. An empty `x` gives 0.
pub fn sum_squares(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    gpu.check_owned("sum_squares: x", x)?;
    gpu.check_owned("sum_squares: out", out)?;
    if out.is_empty() {
        return Err(GpuError::BufferTooSmall {
            what: "sum_squares: out",
            need: 1,
            have: 0,
        });
    }
    let n = to_u32("sum_squares: x.len()", x.len())?;
    let blocks = sum_squares_blocks(n);
    let count = usize::try_from(blocks).map_err(|_| GpuError::SizeOverflow {
        what: "sum_squares: partials",
        value: u128::from(blocks),
        target: "usize",
    })?;
    let mut partials = gpu.scratch_view::<f32>(REDUCE_PARTIALS, count)?;
    let mut view = partials.view_mut()?;

    let f1 = gpu.function(Kernel::SumsqPartialsF32)?;
    let mut b = gpu.stream().launch_builder(f1);
    b.arg(x.slice()?).arg(&n).arg(&mut view);
    // SAFETY: sumsq_partials_f32(const float* x, unsigned n, float* partials)
    // reads x[0..n) (x holds n f32s) and writes partials[0..gridDim.x), and
    // the scratch view holds `blocks` f32s, the grid size used here.
    unsafe { b.launch(launch::grid(blocks)) }.during("launch sumsq_partials_f32")?;

    let f2 = gpu.function(Kernel::SumPartialsF32)?;
    let mut b = gpu.stream().launch_builder(f2);
    b.arg(&mut view).arg(&blocks).arg(out.slice_mut()?);
    // SAFETY: sum_partials_f32(const float* partials, unsigned count, float*
    // out) reads partials[0..count) (the view holds `blocks` = count f32s)
    // and writes out[0] (out holds at least one, checked). One block, as the
    // kernel's single-block tree requires.
    unsafe { b.launch(launch::grid(1)) }.during("launch sum_partials_f32")?;
    Ok(())
}
