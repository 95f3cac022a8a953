//! Opening a context with this crate's kernels: `Gpu::new`,
//! `Gpu::with_options` and `Gpu::with_user_kernels` live here, above the
//! device layer, because only this layer knows the kernels (the device layer
//! compiles and loads whatever [`Modules`] it is handed).

use crate::device::{Gpu, GpuError, GpuOptions, Modules, REDUCE_PARTIALS};

use super::user::UserKernels;
use super::{HEADERS, MODULES};

/// Every module of [`MODULES`], with [`HEADERS`].
pub const KERNELS: Modules = Modules {
    headers: HEADERS,
    modules: MODULES,
};

impl Gpu {
    /// A context on GPU `ordinal` with default options and the crate's
    /// kernels.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        Self::with_options(GpuOptions {
            ordinal,
            ..GpuOptions::default()
        })
    }

    /// A context with explicit options and the crate's kernels
    /// ([`Gpu::open`] with [`KERNELS`]): the reduction partials are presized
    /// and every kernel runs once (warm-up), before any capture.
    pub fn with_options(opts: GpuOptions) -> Result<Self, GpuError> {
        ready(Self::open(opts, &KERNELS)?)
    }

    /// A context with the crate's kernels and the `user` kernels (see
    /// [`crate::kernels::user`]): every user module is compiled (or read
    /// from the kernel cache) and every declared kernel loaded and checked
    /// against its handle's parameter list, before this returns; the
    /// handles `user` gave out launch on this context.
    pub fn with_user_kernels(opts: GpuOptions, user: &UserKernels) -> Result<Self, GpuError> {
        ready(Self::open_with(opts, &KERNELS, user.modules())?)
    }
}

/// Presizes the reduction partials and warms the crate's kernels up.
fn ready(gpu: Gpu) -> Result<Gpu, GpuError> {
    let partials = std::mem::size_of::<f32>()
        .saturating_mul(usize::try_from(super::reduce::MAX_PARTIALS).unwrap_or(usize::MAX));
    gpu.presize_scratch(REDUCE_PARTIALS, partials)?;
    warm_up(&gpu)?;
    Ok(gpu)
}

/// Runs the generic kernels once, eagerly, then synchronizes: their modules
/// are loaded and their first launch is not paid inside a capture.
fn warm_up(gpu: &Gpu) -> Result<(), GpuError> {
    use super as k;
    let mut a = gpu.alloc::<f32>(300)?;
    let mut b = gpu.alloc::<f32>(300)?;
    let mut c = gpu.alloc::<f32>(300)?;
    let mut h = gpu.alloc::<half::bf16>(300)?;
    k::fill(gpu, &mut a, 1.0)?;
    k::fill(gpu, &mut b, 2.0)?;
    k::axpy(gpu, 0.5, &a, &mut b)?;
    k::mul(gpu, &a, &b, &mut c)?;
    k::silu(gpu, &a, &mut c)?;
    k::add_one(gpu, &mut c)?;
    k::f32_to_bf16(gpu, &c, &mut h)?;
    k::bf16_to_f32(gpu, &h, &mut a)?;
    let mut out = gpu.alloc::<f32>(1)?;
    k::sum_squares(gpu, &a, &mut out)?;
    gpu.synchronize()
}
