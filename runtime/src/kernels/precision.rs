//! The compute dtype of the Mamba-3 step: what the GEMM operands are stored
//! in, and how a GEMM runs on them.
//!
//! The model keeps one forward and one backward body, generic over
//! [`Compute`]. With `f32` every tensor is f32 and the GEMMs are IEEE f32;
//! with `bf16` (the mixed step, as PyTorch autocast with the official
//! kernels runs it) the GEMM operands are bf16 (weights' compute copies, the
//! norm outputs, the gate output; f32 gradients are rounded into the
//! `half_staging` scratch right before their GEMM) and cuBLAS accumulates
//! and writes in f32. Everything else (residual stream, scan, norms'
//! statistics, softplus/exp math, reductions) is f32 in both.

use half::bf16;

use super::Kernel;
use super::elementwise::f32_to_bf16_staged;
use crate::device::{DeviceBuffer, Element, Gemm, Gpu, GpuError, ScratchGuard};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// An element type the Mamba-3 step can compute its GEMMs in: `f32` or
/// `bf16`. Sealed: each needs its own kernel instantiations.
pub trait Compute: Element + sealed::Sealed {
    /// Short name, for logs and errors (`"f32"`, `"bf16"`).
    const NAME: &'static str;
    /// The row-wise RMSNorm kernel writing this type (f32 input).
    const RMSNORM_FWD: Kernel;
    /// The z-gate kernel writing this type (f32 inputs).
    const GATE_FWD: Kernel;
    /// Whether the scan runs as the chunk-parallel tensor-core kernels
    /// (`kernels/mamba3_chunk.cu`, bf16 products with f32 accumulation)
    /// where the shape allows; otherwise the scalar f32 scan.
    const TENSOR_CORE_SCAN: bool;
    /// `m3_qk_fwd_*`: rotated q/k stored in this type.
    const QK_FWD: Kernel;
    /// `m3_qk_fwd_vec_*`: the vectorised form of [`Compute::QK_FWD`].
    const QK_FWD_VEC: Kernel;
    /// The scalar scan's forward kernel reading q/k in this type.
    const SCAN_FWD: Kernel;
    /// The scalar scan's backward kernel reading q/k in this type.
    const SCAN_BWD: Kernel;
    /// The warp form of [`Compute::SCAN_FWD`] (`kernels/mamba3_warpscan.cu`).
    const WARP_SCAN_FWD: Kernel;
    /// The warp form of [`Compute::SCAN_BWD`].
    const WARP_SCAN_BWD: Kernel;

    /// `buf` as a bf16 buffer when this type is bf16 (the chunk scan reads
    /// its q/k in bf16 only), else `None`.
    fn as_bf16(buf: &DeviceBuffer<Self>) -> Option<&DeviceBuffer<bf16>>;

    /// The one of two pairs of buffers that holds this type (work buffers
    /// kept in both types, used by one step each).
    fn pick<'a>(
        f32s: [&'a mut DeviceBuffer<f32>; 2],
        bf16s: [&'a mut DeviceBuffer<bf16>; 2],
    ) -> [&'a mut DeviceBuffer<Self>; 2];

    /// `C = alpha op(A) op(B) + beta C` with A and B in this type, C in f32.
    fn gemm(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<Self>,
        b: &DeviceBuffer<Self>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError>;

    /// The same GEMM with an f32 A operand (a gradient): used as is in f32,
    /// rounded to bf16 in `half_staging` first in bf16.
    fn gemm_grad(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<Self>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError>;

    /// Two [`gemm_grad`](Self::gemm_grad)s that share the f32 A operand
    /// (a layer's weight and input gradients): the mixed step rounds A to
    /// bf16 once for both.
    fn gemm_grad2(
        gpu: &Gpu,
        a: &DeviceBuffer<f32>,
        first: (&Gemm, &DeviceBuffer<Self>, &mut DeviceBuffer<f32>),
        second: (&Gemm, &DeviceBuffer<Self>, &mut DeviceBuffer<f32>),
    ) -> Result<(), GpuError>;

    /// Elements of `half_staging` a gradient GEMM of `a_len` A elements needs
    /// (0 when nothing is staged).
    fn staging_elems(a_len: usize) -> usize;
}

impl Compute for f32 {
    const NAME: &'static str = "f32";
    const RMSNORM_FWD: Kernel = Kernel::M3RmsnormFwdF32;
    const GATE_FWD: Kernel = Kernel::M3GateFwdF32;
    // The f32 step is held to the f64 oracle at 1e-4; bf16 products are not.
    const TENSOR_CORE_SCAN: bool = false;
    const QK_FWD: Kernel = Kernel::M3QkFwdF32;
    const QK_FWD_VEC: Kernel = Kernel::M3QkFwdVecF32;
    const SCAN_FWD: Kernel = Kernel::M3ScanFwdF32;
    const SCAN_BWD: Kernel = Kernel::M3ScanBwdF32;
    const WARP_SCAN_FWD: Kernel = Kernel::M3WscanFwdF32;
    const WARP_SCAN_BWD: Kernel = Kernel::M3WscanBwdF32;

    fn as_bf16(_buf: &DeviceBuffer<f32>) -> Option<&DeviceBuffer<bf16>> {
        None
    }

    fn pick<'a>(
        f32s: [&'a mut DeviceBuffer<f32>; 2],
        _bf16s: [&'a mut DeviceBuffer<bf16>; 2],
    ) -> [&'a mut DeviceBuffer<f32>; 2] {
        f32s
    }

    fn gemm(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        gpu.gemm_f32(g, a, b, c)
    }

    fn gemm_grad(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        gpu.gemm_f32(g, a, b, c)
    }

    fn gemm_grad2(
        gpu: &Gpu,
        a: &DeviceBuffer<f32>,
        first: (&Gemm, &DeviceBuffer<f32>, &mut DeviceBuffer<f32>),
        second: (&Gemm, &DeviceBuffer<f32>, &mut DeviceBuffer<f32>),
    ) -> Result<(), GpuError> {
        for (g, b, c) in [first, second] {
            gpu.gemm_f32(g, a, b, c)?;
        }
        Ok(())
    }

    fn staging_elems(_a_len: usize) -> usize {
        0
    }
}

impl Compute for bf16 {
    const NAME: &'static str = "bf16";
    const RMSNORM_FWD: Kernel = Kernel::M3RmsnormFwdBf16;
    const GATE_FWD: Kernel = Kernel::M3GateFwdBf16;
    const TENSOR_CORE_SCAN: bool = true;
    const QK_FWD: Kernel = Kernel::M3QkFwdBf16qk;
    const QK_FWD_VEC: Kernel = Kernel::M3QkFwdVecBf16qk;
    const SCAN_FWD: Kernel = Kernel::M3ScanFwdBf16qk;
    const SCAN_BWD: Kernel = Kernel::M3ScanBwdBf16qk;
    const WARP_SCAN_FWD: Kernel = Kernel::M3WscanFwdBf16qk;
    const WARP_SCAN_BWD: Kernel = Kernel::M3WscanBwdBf16qk;

    fn as_bf16(buf: &DeviceBuffer<bf16>) -> Option<&DeviceBuffer<bf16>> {
        Some(buf)
    }

    fn pick<'a>(
        _f32s: [&'a mut DeviceBuffer<f32>; 2],
        bf16s: [&'a mut DeviceBuffer<bf16>; 2],
    ) -> [&'a mut DeviceBuffer<bf16>; 2] {
        bf16s
    }

    fn gemm(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<bf16>,
        b: &DeviceBuffer<bf16>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        gpu.gemm_bf16_f32(g, a, b, c)
    }

    fn gemm_grad(
        gpu: &Gpu,
        g: &Gemm,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<bf16>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        let stage = |s: &mut ScratchGuard<'_, bf16>| f32_to_bf16_staged(gpu, a, s);
        gpu.gemm_bf16_f32_staged(a.len(), stage, [Some((g, b, c)), None])
    }

    fn gemm_grad2(
        gpu: &Gpu,
        a: &DeviceBuffer<f32>,
        first: (&Gemm, &DeviceBuffer<bf16>, &mut DeviceBuffer<f32>),
        second: (&Gemm, &DeviceBuffer<bf16>, &mut DeviceBuffer<f32>),
    ) -> Result<(), GpuError> {
        // A is rounded into `half_staging` once for both products.
        let stage = |s: &mut ScratchGuard<'_, bf16>| f32_to_bf16_staged(gpu, a, s);
        gpu.gemm_bf16_f32_staged(a.len(), stage, [Some(first), Some(second)])
    }

    fn staging_elems(a_len: usize) -> usize {
        a_len
    }
}
