//! Launch wrappers for `kernels/elementwise.cu` and `kernels/convert.cu`.
//!
//! All are capturable, and none allocates: outputs are caller-owned buffers of
//! the same length as the inputs.

use half::bf16;

use cudarc::driver::PushKernelArg as _;

use super::Kernel;
use super::launch::{self, MAX_ELEMENTWISE_BLOCKS};
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, ScratchGuard, to_u32};

fn same_len(what: &'static str, expected: usize, actual: usize) -> Result<(), GpuError> {
    if expected == actual {
        Ok(())
    } else {
        Err(GpuError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// `y[i] = value` for every element.
pub fn fill(gpu: &Gpu, y: &mut DeviceBuffer<f32>, value: f32) -> Result<(), GpuError> {
    gpu.check_owned("fill: y", y)?;
    let n = to_u32("fill: y.len()", y.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::FillF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(y.slice_mut()?).arg(&value).arg(&n);
    // SAFETY: fill_f32(float* y, float value, unsigned n) writes y[0..n), and
    // y holds n f32s; argument order and types match the kernel.
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch fill_f32")?;
    Ok(())
}

/// `y = a * x + y`, as one fused multiply-add per element.
pub fn axpy(
    gpu: &Gpu,
    a: f32,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    gpu.check_owned("axpy: x", x)?;
    gpu.check_owned("axpy: y", y)?;
    same_len("axpy: y", x.len(), y.len())?;
    let n = to_u32("axpy: x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::AxpyF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(y.slice_mut()?).arg(&a).arg(&n);
    // SAFETY: axpy_f32(const float* x, float* y, float a, unsigned n) reads
    // x[0..n) and updates y[0..n); both hold n f32s (checked), and `&mut y`
    // cannot alias `x`.
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch axpy_f32")?;
    Ok(())
}

/// `out[i] = a[i] * b[i]`.
pub fn mul(
    gpu: &Gpu,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    gpu.check_owned("mul: a", a)?;
    gpu.check_owned("mul: b", b)?;
    gpu.check_owned("mul: out", out)?;
    same_len("mul: b", a.len(), b.len())?;
    same_len("mul: out", a.len(), out.len())?;
    let n = to_u32("mul: a.len()", a.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::MulF32)?;
    let mut l = gpu.stream().launch_builder(f);
    l.arg(a.slice()?)
        .arg(b.slice()?)
        .arg(out.slice_mut()?)
        .arg(&n);
    // SAFETY: mul_f32(const float* a, const float* b, float* out, unsigned n)
    // touches [0..n) of each; all three hold n f32s (checked).
    unsafe { l.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch mul_f32")?;
    Ok(())
}

/// `y[i] = x[i] * sigmoid(x[i])` (SiLU).
pub fn silu(gpu: &Gpu, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
    gpu.check_owned("silu: x", x)?;
    gpu.check_owned("silu: y", y)?;
    same_len("silu: y", x.len(), y.len())?;
    let n = to_u32("silu: x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::SiluF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(y.slice_mut()?).arg(&n);
    // SAFETY: silu_f32(const float* x, float* y, unsigned n) touches [0..n)
    // of each; both hold n f32s (checked).
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch silu_f32")?;
    Ok(())
}

/// `x[i] += 1`: the tiny kernel of the launch-overhead benchmark.
pub fn add_one(gpu: &Gpu, x: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
    gpu.check_owned("add_one: x", x)?;
    let n = to_u32("add_one: x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::AddOneF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice_mut()?).arg(&n);
    // SAFETY: add_one_f32(float* x, unsigned n) updates x[0..n); x holds n f32s.
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch add_one_f32")?;
    Ok(())
}

/// `y[i] = bf16(x[i])`, rounding to nearest even.
pub fn f32_to_bf16(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<bf16>,
) -> Result<(), GpuError> {
    gpu.check_owned("f32_to_bf16: x", x)?;
    gpu.check_owned("f32_to_bf16: y", y)?;
    same_len("f32_to_bf16: y", x.len(), y.len())?;
    let n = to_u32("f32_to_bf16: x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::F32ToBf16)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(y.slice_mut()?).arg(&n);
    // SAFETY: f32_to_bf16(const float* x, __nv_bfloat16* y, unsigned n) reads
    // n f32s and writes n bf16s (2 bytes each, as half::bf16); both buffers
    // hold n elements (checked).
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch f32_to_bf16")?;
    Ok(())
}

/// `stage[i] = bf16(x[i])` into a borrowed scratch view of `x.len()`
/// elements: the downcast of an f32 gradient feeding a bf16 GEMM.
pub(crate) fn f32_to_bf16_staged(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    stage: &mut ScratchGuard<'_, bf16>,
) -> Result<(), GpuError> {
    gpu.check_owned("f32_to_bf16 (staged): x", x)?;
    same_len("f32_to_bf16 (staged): staging", x.len(), stage.len())?;
    let n = to_u32("f32_to_bf16 (staged): x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::F32ToBf16)?;
    let mut b = gpu.stream().launch_builder(f);
    let mut view = stage.view_mut()?;
    b.arg(x.slice()?).arg(&mut view).arg(&n);
    // SAFETY: f32_to_bf16(const float* x, __nv_bfloat16* y, unsigned n) reads
    // n f32s of x and writes n bf16s of the staging view, which is exactly n
    // elements long (checked above, and `view_mut` re-checks the area's size).
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch f32_to_bf16 (staged)")?;
    Ok(())
}

/// `y[i] = f32(x[i])` (exact).
pub fn bf16_to_f32(
    gpu: &Gpu,
    x: &DeviceBuffer<bf16>,
    y: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    gpu.check_owned("bf16_to_f32: x", x)?;
    gpu.check_owned("bf16_to_f32: y", y)?;
    same_len("bf16_to_f32: y", x.len(), y.len())?;
    let n = to_u32("bf16_to_f32: x.len()", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Kernel::Bf16ToF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(y.slice_mut()?).arg(&n);
    // SAFETY: bf16_to_f32(const __nv_bfloat16* x, float* y, unsigned n) reads
    // n bf16s and writes n f32s; both buffers hold n elements (checked).
    unsafe { b.launch(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS))) }
        .during("launch bf16_to_f32")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_mismatch_names_the_argument() {
        let e = same_len("mul: out", 4, 3).unwrap_err();
        assert_eq!(e.to_string(), "mul: out: expected 4 elements, got 3");
        assert!(same_len("x", 2, 2).is_ok());
    }
}
