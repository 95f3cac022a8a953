//! cuBLAS: one handle on the capture stream, a preallocated workspace, and
//! row-major GEMM wrappers.
//!
//! **Layout.** Every matrix the runtime hands to these wrappers is row-major
//! (C order), as in the CPU reference. cuBLAS is column-major; a row-major
//! `r x c` matrix is, to cuBLAS, its `c x r` transpose. So `C = op(A) op(B)`
//! (row-major) is computed as `C^T = op(B)^T op(A)^T` (column-major): the
//! operands are swapped, `m` and `n` are swapped, each transpose flag is kept,
//! and each leading dimension is the number of columns of that operand's
//! storage. [`Gemm::col_major`] does this mapping and is unit-tested.
//!
//! **Precision.** f32 GEMMs compute in IEEE f32 by default (no TF32), so GPU
//! results match the f64 reference closely and graph replays match eager runs
//! bit for bit. TF32 is an explicit opt-in ([`F32GemmMath::Tf32`]). bf16 GEMMs
//! take bf16 inputs and accumulate in f32 (`CUBLAS_COMPUTE_32F`), with a bf16
//! or an f32 output.
//!
//! **Capture.** The handle's workspace is the `gemm_workspace` scratch area,
//! bound with `cublasSetWorkspace_v2`, so cuBLAS never allocates inside a
//! capture. `alpha`/`beta` are passed by host pointer: their values are frozen
//! into a captured graph.

use std::cell::Cell;
use std::ffi::c_void;

use cudarc::cublas::result as blas_result;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::CudaStream;
use half::bf16;

use super::buffer::{DeviceBuffer, Element};
use super::error::{During as _, GpuError, checked_elems, to_i32};
use super::{Gpu, ScratchGuard};

/// How f32 GEMMs compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum F32GemmMath {
    /// IEEE f32 multiply-adds (`CUBLAS_COMPUTE_32F`), no TF32. The default.
    #[default]
    Ieee,
    /// Like `Ieee`, and additionally forbids any reduced-precision internal
    /// step (`CUBLAS_COMPUTE_32F_PEDANTIC`); for numerics studies, may be slower.
    Pedantic,
    /// TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`): much faster, about
    /// 10 mantissa bits per product. Opt-in only.
    Tf32,
}

/// One product of a staged bf16 GEMM: its shape, B operand and C result.
pub type StagedJob<'a> = (&'a Gemm, &'a DeviceBuffer<bf16>, &'a mut DeviceBuffer<f32>);
impl F32GemmMath {
    fn compute_type(self) -> blas_sys::cublasComputeType_t {
        match self {
            F32GemmMath::Ieee => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            F32GemmMath::Pedantic => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
            F32GemmMath::Tf32 => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        }
    }
}

/// A row-major GEMM: `C = alpha * op(A) * op(B) + beta * C`, with `op(A)`
/// `m x k`, `op(B)` `k x n` and `C` `m x n`.
///
/// Storage: `A` is `m x k` (or `k x m` when `trans_a`), `B` is `k x n` (or
/// `n x k` when `trans_b`), `C` is `m x n`, all row-major and dense.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// Rows of `C` and of `op(A)`.
    pub m: usize,
    /// Columns of `C` and of `op(B)`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Use `A^T` (A stored `k x m`).
    pub trans_a: bool,
    /// Use `B^T` (B stored `n x k`).
    pub trans_b: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the old `C` (0 overwrites it, even if it held NaNs).
    pub beta: f32,
}

/// The column-major cuBLAS arguments of a row-major [`Gemm`]; operand 1 is
/// the row-major `B`, operand 2 the row-major `A`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColMajorGemm {
    /// Transpose flag of operand 1 (`B`'s flag).
    pub trans_1: bool,
    /// Transpose flag of operand 2 (`A`'s flag).
    pub trans_2: bool,
    /// cuBLAS `m` (= row-major `n`).
    pub m: i32,
    /// cuBLAS `n` (= row-major `m`).
    pub n: i32,
    /// cuBLAS `k`.
    pub k: i32,
    /// Leading dimension of operand 1 (`B`).
    pub ld_1: i32,
    /// Leading dimension of operand 2 (`A`).
    pub ld_2: i32,
    /// Leading dimension of `C`.
    pub ldc: i32,
}

impl Gemm {
    /// `C = A * B` with `A` `m x k` and `B` `k x n`.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// Uses `A^T` (A stored `k x m`).
    pub fn trans_a(self) -> Self {
        Self {
            trans_a: true,
            ..self
        }
    }

    /// Uses `B^T` (B stored `n x k`).
    pub fn trans_b(self) -> Self {
        Self {
            trans_b: true,
            ..self
        }
    }

    /// Sets `alpha` and `beta`.
    pub fn scaled(self, alpha: f32, beta: f32) -> Self {
        Self {
            alpha,
            beta,
            ..self
        }
    }

    /// Elements each operand must hold: `(A, B, C)`.
    pub fn lens(&self) -> Result<(usize, usize, usize), GpuError> {
        Ok((
            checked_elems("GEMM m*k", self.m, self.k)?,
            checked_elems("GEMM k*n", self.k, self.n)?,
            checked_elems("GEMM m*n", self.m, self.n)?,
        ))
    }

    /// The cuBLAS (column-major) arguments; see the module docs.
    pub fn col_major(&self) -> Result<ColMajorGemm, GpuError> {
        // Leading dimension = columns of the operand's row-major storage;
        // cuBLAS wants at least 1 even for empty operands.
        let ld_a = if self.trans_a { self.m } else { self.k };
        let ld_b = if self.trans_b { self.k } else { self.n };
        Ok(ColMajorGemm {
            trans_1: self.trans_b,
            trans_2: self.trans_a,
            m: to_i32("GEMM n", self.n)?,
            n: to_i32("GEMM m", self.m)?,
            k: to_i32("GEMM k", self.k)?,
            ld_1: to_i32("GEMM ldb", ld_b.max(1))?,
            ld_2: to_i32("GEMM lda", ld_a.max(1))?,
            ldc: to_i32("GEMM ldc", self.n.max(1))?,
        })
    }

    /// Checks the operand lengths and returns the cuBLAS arguments.
    pub fn check(
        &self,
        a_len: usize,
        b_len: usize,
        c_len: usize,
    ) -> Result<ColMajorGemm, GpuError> {
        let (a, b, c) = self.lens()?;
        for (what, need, have) in [
            ("GEMM A", a, a_len),
            ("GEMM B", b, b_len),
            ("GEMM C", c, c_len),
        ] {
            if have < need {
                return Err(GpuError::BufferTooSmall { what, need, have });
            }
        }
        self.col_major()
    }
}

/// The cuBLAS handle of a context.
#[derive(Debug)]
pub(crate) struct Blas {
    handle: blas_sys::cublasHandle_t,
    f32_math: Cell<F32GemmMath>,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as calls are
// not concurrent; `Blas` is only reachable through `Gpu`, which is `!Sync`,
// and every call binds the context to the calling thread first.
unsafe impl Send for Blas {}

impl Blas {
    /// Creates the handle and binds it to `stream` (the capture stream).
    pub(crate) fn new(stream: &CudaStream) -> Result<Self, GpuError> {
        stream
            .context()
            .bind_to_thread()
            .during("bind the context before creating the cuBLAS handle")?;
        let handle = blas_result::create_handle().during("create the cuBLAS handle")?;
        let blas = Self {
            handle,
            f32_math: Cell::new(F32GemmMath::default()),
        };
        // SAFETY: `handle` was just created and `stream` is a live stream of the
        // context current on this thread; the cast only renames the opaque
        // stream type between cudarc's driver and cuBLAS bindings.
        unsafe { blas_result::set_stream(blas.handle, stream.cu_stream().cast()) }
            .during("bind cuBLAS to the capture stream")?;
        // SAFETY: valid handle; DEFAULT_MATH keeps f32 GEMMs off TF32 unless a
        // call asks for it through its compute type.
        unsafe {
            blas_sys::cublasSetMathMode(blas.handle, blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
        }
        .result()
        .during("set the cuBLAS math mode")?;
        Ok(blas)
    }

    /// Points cuBLAS at `ws`. Must not run after `set_stream` is called again
    /// (that resets the workspace), and `ws` must outlive its use: the scratch
    /// area keeps it until it is replaced by a larger one, bound here first.
    pub(crate) fn bind_workspace(&self, ws: &DeviceBuffer<u8>) -> Result<(), GpuError> {
        let ptr = device_ptr(ws.device_addr())?;
        // SAFETY: `ptr` is the start of a live device allocation of
        // `ws.num_bytes()` bytes (256-byte aligned, as cuMemAlloc returns),
        // owned by the `gemm_workspace` scratch area, which replaces it only
        // after binding its successor here.
        unsafe { blas_sys::cublasSetWorkspace_v2(self.handle, ptr.cast_mut(), ws.num_bytes()) }
            .result()
            .during("bind the cuBLAS workspace")
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once here.
        // An error cannot be returned from drop and leaves nothing to undo.
        let _ = unsafe { blas_result::destroy_handle(self.handle) };
    }
}

/// A device address as the `void*` cuBLAS takes.
fn device_ptr(addr: u64) -> Result<*const c_void, GpuError> {
    let addr = usize::try_from(addr).map_err(|_| GpuError::SizeOverflow {
        what: "device address",
        value: u128::from(addr),
        target: "usize",
    })?;
    Ok(std::ptr::with_exposed_provenance(addr))
}

struct GemmEx {
    a: u64,
    b: u64,
    c: u64,
    ab_type: blas_sys::cudaDataType,
    c_type: blas_sys::cudaDataType,
    compute: blas_sys::cublasComputeType_t,
}

impl Gpu {
    /// How f32 GEMMs compute from now on (captured graphs keep what they had).
    pub fn set_f32_gemm_math(&self, math: F32GemmMath) {
        self.blas.f32_math.set(math);
    }

    /// How f32 GEMMs compute now.
    pub fn f32_gemm_math(&self) -> F32GemmMath {
        self.blas.f32_math.get()
    }

    /// f32 GEMM, row-major; see [`Gemm`]. Capturable.
    pub fn gemm_f32(
        &self,
        g: &Gemm,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        let compute = self.blas.f32_math.get().compute_type();
        let t = blas_sys::cudaDataType::CUDA_R_32F;
        self.gemm_ex(
            g,
            [a.len(), b.len(), c.len()],
            self.gemm_args(a, b, c, t, t, compute)?,
        )
    }

    /// bf16 GEMM with f32 accumulation and a bf16 result, row-major. Capturable.
    pub fn gemm_bf16(
        &self,
        g: &Gemm,
        a: &DeviceBuffer<bf16>,
        b: &DeviceBuffer<bf16>,
        c: &mut DeviceBuffer<bf16>,
    ) -> Result<(), GpuError> {
        let t = blas_sys::cudaDataType::CUDA_R_16BF;
        let compute = blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        self.gemm_ex(
            g,
            [a.len(), b.len(), c.len()],
            self.gemm_args(a, b, c, t, t, compute)?,
        )
    }

    /// bf16 GEMM with f32 accumulation and an f32 result, row-major. Capturable.
    pub fn gemm_bf16_f32(
        &self,
        g: &Gemm,
        a: &DeviceBuffer<bf16>,
        b: &DeviceBuffer<bf16>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        let compute = blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let args = self.gemm_args(
            a,
            b,
            c,
            blas_sys::cudaDataType::CUDA_R_16BF,
            blas_sys::cudaDataType::CUDA_R_32F,
            compute,
        )?;
        self.gemm_ex(g, [a.len(), b.len(), c.len()], args)
    }

    /// bf16 GEMMs with f32 accumulation and f32 results whose shared A
    /// operand is staged in the `half_staging` scratch area: `stage` writes
    /// the `a_len` bf16 values of A into the area (the caller's conversion
    /// of an f32 gradient: a kernel, which this layer does not know), then
    /// each `(g, b, c)` runs from the staged copy. One product or two (a
    /// layer's weight and input gradients share A). The area must already be
    /// large enough when this runs under a capture (growth there is refused,
    /// see [`Gpu::presize_scratch`]). Capturable.
    pub fn gemm_bf16_f32_staged(
        &self,
        a_len: usize,
        stage: impl FnOnce(&mut ScratchGuard<'_, bf16>) -> Result<(), GpuError>,
        jobs: [Option<StagedJob<'_>>; 2],
    ) -> Result<(), GpuError> {
        let mut view = self.scratch_view::<bf16>(super::HALF_STAGING, a_len)?;
        stage(&mut view)?;
        for (g, b, c) in jobs.into_iter().flatten() {
            self.check_owned("GEMM B", b)?;
            self.check_owned("GEMM C", c)?;
            let args = GemmEx {
                a: view.device_addr()?,
                b: b.device_addr(),
                c: c.device_addr(),
                ab_type: blas_sys::cudaDataType::CUDA_R_16BF,
                c_type: blas_sys::cudaDataType::CUDA_R_32F,
                compute: blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            };
            // The staging view holds exactly a_len bf16s: A's length.
            self.gemm_ex(g, [view.len(), b.len(), c.len()], args)?;
        }
        Ok(())
    }

    fn gemm_args<T: Element, U: Element>(
        &self,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        c: &DeviceBuffer<U>,
        ab_type: blas_sys::cudaDataType,
        c_type: blas_sys::cudaDataType,
        compute: blas_sys::cublasComputeType_t,
    ) -> Result<GemmEx, GpuError> {
        self.check_owned("GEMM A", a)?;
        self.check_owned("GEMM B", b)?;
        self.check_owned("GEMM C", c)?;
        Ok(GemmEx {
            a: a.device_addr(),
            b: b.device_addr(),
            c: c.device_addr(),
            ab_type,
            c_type,
            compute,
        })
    }

    fn gemm_ex(
        &self,
        g: &Gemm,
        [a_len, b_len, c_len]: [usize; 3],
        x: GemmEx,
    ) -> Result<(), GpuError> {
        let cm = g.check(a_len, b_len, c_len)?;
        if cm.m == 0 || cm.n == 0 {
            return Ok(());
        }
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (g.alpha, g.beta);
        let (p1, p2, pc) = (device_ptr(x.b)?, device_ptr(x.a)?, device_ptr(x.c)?);
        self.ctx
            .bind_to_thread()
            .during("bind the context before a GEMM")?;
        // SAFETY: `g.check` verified that A, B and C hold at least m*k, k*n and
        // m*n elements of the types named by `ab_type`/`c_type` (the wrappers
        // pair each element type with its cudaDataType), so with the leading
        // dimensions from `col_major` every access stays inside the three
        // allocations, which the borrows keep alive; `&mut` on C rules out
        // aliasing with A or B. alpha/beta are f32 on the stack, matching the
        // f32 compute types, read during the call (host pointer mode). The
        // handle is bound to this context's capture stream.
        unsafe {
            blas_result::gemm_ex(
                self.blas.handle,
                op(cm.trans_1),
                op(cm.trans_2),
                cm.m,
                cm.n,
                cm.k,
                std::ptr::from_ref(&alpha).cast(),
                p1,
                x.ab_type,
                cm.ld_1,
                p2,
                x.ab_type,
                cm.ld_2,
                std::ptr::from_ref(&beta).cast(),
                pc.cast_mut(),
                x.c_type,
                cm.ldc,
                x.compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .during("run a GEMM (cublasGemmEx)")
    }

    /// Runs each GEMM flavour once on small matrices so cuBLAS loads its
    /// kernels and heuristics before any capture.
    pub(crate) fn warm_up_blas(&self) -> Result<(), GpuError> {
        let g = Gemm::new(64, 64, 64);
        let a = self.alloc_zeros::<f32>(64 * 64)?;
        let b = self.alloc_zeros::<f32>(64 * 64)?;
        let mut c = self.alloc_zeros::<f32>(64 * 64)?;
        let saved = self.f32_gemm_math();
        for math in [F32GemmMath::Ieee, F32GemmMath::Tf32] {
            self.set_f32_gemm_math(math);
            let run = self.gemm_f32(&g, &a, &b, &mut c);
            self.set_f32_gemm_math(saved);
            run?;
        }
        let ah = self.alloc_zeros::<bf16>(64 * 64)?;
        let bh = self.alloc_zeros::<bf16>(64 * 64)?;
        let mut ch = self.alloc_zeros::<bf16>(64 * 64)?;
        self.gemm_bf16(&g, &ah, &bh, &mut ch)?;
        self.gemm_bf16_f32(&g, &ah, &bh, &mut c)?;
        self.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_product_swaps_operands_and_dims() {
        let cm = Gemm::new(2, 3, 4).col_major().unwrap();
        assert_eq!(
            cm,
            ColMajorGemm {
                trans_1: false,
                trans_2: false,
                m: 3,
                n: 2,
                k: 4,
                ld_1: 3,
                ld_2: 4,
                ldc: 3
            }
        );
    }

    #[test]
    fn transposes_keep_flags_and_use_storage_columns() {
        // A stored k x m = 4 x 2 (ld 2), B stored n x k = 3 x 4 (ld 4).
        let cm = Gemm::new(2, 3, 4).trans_a().trans_b().col_major().unwrap();
        assert_eq!(
            cm,
            ColMajorGemm {
                trans_1: true,
                trans_2: true,
                m: 3,
                n: 2,
                k: 4,
                ld_1: 4,
                ld_2: 2,
                ldc: 3
            }
        );
    }

    #[test]
    fn sizes_are_checked() {
        let g = Gemm::new(2, 3, 4);
        assert!(g.check(8, 12, 6).is_ok());
        let e = g.check(7, 12, 6).unwrap_err();
        assert_eq!(e.to_string(), "GEMM A holds 7 elements but 8 are needed");
        let e = g.check(8, 12, 5).unwrap_err();
        assert!(e.to_string().starts_with("GEMM C"), "{e}");
        let huge = usize::try_from(i64::from(i32::MAX) + 1).unwrap_or(usize::MAX);
        let e = Gemm::new(huge, 1, 1).col_major().unwrap_err();
        assert!(e.to_string().contains("GEMM m"), "{e}");
        assert!(Gemm::new(usize::MAX, 2, 2).lens().is_err());
    }

    #[test]
    fn empty_dims_keep_valid_leading_dims() {
        let cm = Gemm::new(0, 0, 0).col_major().unwrap();
        assert_eq!((cm.ld_1, cm.ld_2, cm.ldc), (1, 1, 1));
    }
}
