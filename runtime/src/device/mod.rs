//! The GPU execution context: a cudarc context, its capture stream, buffers,
//! compiled kernels, cuBLAS and scratch areas, behind one type, [`Gpu`].
//!
//! All CUDA FFI of the runtime lives in this module and in [`crate::kernels`];
//! every `unsafe` block says what it relies on. This module knows no kernel
//! and no model: the kernel modules to compile are handed to [`Gpu::open`]
//! by the layer above (`kernels`, whose `Gpu::new` opens a context with the
//! crate's kernels loaded and warmed up).
//!
//! # Start-up
//!
//! [`Gpu::new`] never panics and never hangs on a machine without CUDA: it
//! probes for the driver library before the first driver call, then checks the
//! GPU count, the driver version and the compute capability, each failure a
//! [`GpuError`] that says what is missing. Then, in this order:
//!
//! 1. the context is created and **event tracking is turned off before any
//!    allocation**: cudarc's per-buffer events would otherwise be waited on
//!    and recorded around every launch, which is illegal inside a capture
//!    when they were recorded outside it;
//! 2. a dedicated non-blocking stream is created for all work (capture cannot
//!    begin on the legacy default stream, and a non-blocking stream is not
//!    serialised behind other libraries' work on it);
//! 3. the given kernel modules, then any user modules, are compiled (or read
//!    from the disk cache) and every function is loaded eagerly
//!    (`cuFuncLoad`); a user kernel's parameter layout is checked against
//!    its handle's;
//! 4. the cuBLAS handle is bound to the stream with a preallocated workspace;
//! 5. every GEMM flavour runs once (warm-up), before any capture (the
//!    kernels layer then warms up its own kernels).
//!
//! # Capture rules
//!
//! [`Gpu`] implements [`graph::Backend`](crate::graph::Backend), capturing in
//! `THREAD_LOCAL` mode on its own stream (see [`GpuGraph`] and the `graph`
//! submodule's docs for why). While a capture is open, the wrappers that would allocate, copy
//! to or from the host, or synchronize return
//! [`GpuError::Violation`] before calling the driver, so the capture is never
//! invalidated; the generated step code reports it as
//! `GraphError::CaptureViolation` naming the op.
//!
//! # Writing an op
//!
//! An op a step spec can name is a function taking the context first and
//! the step buffers in spec order, returning `Result<(), GpuError>`:
//!
//! ```ignore
//! fn scale_and_norm(gpu: &Gpu, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>,
//!                   norm: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
//!     kernels::fill(gpu, y, 0.0)?;
//!     kernels::axpy(gpu, 0.5, x, y)?;
//!     kernels::sum_squares(gpu, y, norm)
//! }
//! ```
//!
//! It must not allocate, download or synchronize (those calls fail during
//! capture); buffers it needs are step buffers or context scratch. Kernels
//! of the op's own launch through `kernels::user` handles, on the same
//! stream; the stream itself is never handed out, so every call an op makes
//! goes through these checks.

mod blas;
mod buffer;
pub(crate) mod error;
mod gate;
mod graph;
mod modules;
pub mod nvrtc;
pub mod probe;
mod scratch;
mod user_modules;

use std::cell::Cell;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream};

pub use blas::{ColMajorGemm, F32GemmMath, Gemm};
pub use buffer::{DeviceBuffer, Element, PinnedBuffer};
pub use error::{GpuError, checked_elems, to_i32, to_u32};
pub use graph::GpuGraph;
pub use modules::{Module, Modules};
pub use nvrtc::{CacheOutcome, CachePolicy, CompileReport, SourceText};
pub use scratch::{GEMM_WORKSPACE, HALF_STAGING, REDUCE_PARTIALS, ScratchGuard};

use blas::Blas;
use buffer::Shared;
use error::During as _;
use modules::FunctionTable;
use scratch::ScratchSet;
pub(crate) use user_modules::{UserFunction, UserModule, UserModules};

/// Default size of the cuBLAS workspace: NVIDIA recommends 32 MiB on Hopper.
pub const DEFAULT_GEMM_WORKSPACE: usize = 32 << 20;

/// How to create a [`Gpu`].
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Device ordinal.
    pub ordinal: usize,
    /// Where compiled kernels are cached.
    pub cache: CachePolicy,
    /// Initial size of the cuBLAS workspace (`gemm_workspace`), in bytes.
    pub gemm_workspace: usize,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            ordinal: 0,
            cache: CachePolicy::Default,
            gemm_workspace: DEFAULT_GEMM_WORKSPACE,
        }
    }
}

/// Facts about the device a [`Gpu`] runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// The architecture kernels are compiled for, e.g. `sm_90`.
    pub arch: String,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// The driver's CUDA version, e.g. `(13, 0)`.
    pub driver_version: (i32, i32),
    /// NVRTC's version.
    pub nvrtc_version: (i32, i32),
}

/// A GPU execution context; see the [module docs](self).
///
/// Not `Sync`: capture state, the running op and scratch borrows are tracked
/// per context with interior mutability, and a CUDA graph may only be driven
/// from one thread at a time.
#[derive(Debug)]
pub struct Gpu {
    // Field order is drop order: the graph-free parts first, the context
    // last, all of it between the two gate fields, so that no other thread's
    // capture is open while this context tears down (gate.rs).
    _teardown_begins: gate::TeardownBegins,
    scratch: ScratchSet,
    blas: Blas,
    kernels: FunctionTable,
    current_op: Cell<Option<&'static str>>,
    shared: Arc<Shared>,
    info: DeviceInfo,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    _teardown_ends: gate::TeardownEnds,
}

/// How many GPUs the driver lists (after `CUDA_VISIBLE_DEVICES`): the
/// ordinals a context can be opened on are `0..count`.
pub fn device_count() -> Result<usize, GpuError> {
    if !probe::driver_present() {
        return Err(GpuError::NoDriver {
            tried: "libcuda.so, libcuda.so.1".to_owned(),
        });
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) => Err(GpuError::NoDevice {
            detail: format!("{e}"),
        }),
    }
}

impl Gpu {
    /// A context that compiles and loads `modules`; see the [module
    /// docs](self) for what happens, in order. (`Gpu::new` and
    /// `Gpu::with_options`, in [`crate::kernels`], open one with the crate's
    /// kernels; `Gpu::with_user_kernels` adds a user's.)
    pub fn open(opts: GpuOptions, modules: &Modules) -> Result<Self, GpuError> {
        Self::open_with(opts, modules, &UserModules::default())
    }

    /// [`Gpu::open`], also compiling and loading the `user` modules (step 3).
    pub(crate) fn open_with(
        opts: GpuOptions,
        modules: &Modules,
        user: &UserModules,
    ) -> Result<Self, GpuError> {
        let count = device_count()?;
        if count == 0 {
            return Err(GpuError::NoDevice {
                detail: "device count is 0".to_owned(),
            });
        }
        if opts.ordinal >= count {
            return Err(GpuError::NoSuchDevice {
                ordinal: opts.ordinal,
                count,
            });
        }
        let driver_version = driver_version()?;
        if driver_version < probe::REQUIRED_DRIVER_VERSION {
            let (found_major, found_minor) = probe::split_version(driver_version);
            let (need_major, need_minor) = probe::split_version(probe::REQUIRED_DRIVER_VERSION);
            return Err(GpuError::DriverTooOld {
                found_major,
                found_minor,
                need_major,
                need_minor,
            });
        }

        // Loading modules and creating cuBLAS touch the whole device: no
        // other thread's capture may be open meanwhile (gate.rs).
        let _opening = gate::Exclusive::acquire();
        let ctx = CudaContext::new(opts.ordinal).during("create the CUDA context")?;
        // SAFETY: called before this context allocates anything, so every
        // buffer is untracked; the runtime uses one stream for all work, so
        // stream-order alone synchronizes it (no cross-stream events needed).
        unsafe { ctx.disable_event_tracking() };

        let name = ctx.name().during("read the device name")?;
        let compute_capability = ctx
            .compute_capability()
            .during("read the compute capability")?;
        probe::check_compute_capability(opts.ordinal, &name, compute_capability)?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during("read the multiprocessor count")?;
        let total_memory = ctx.total_mem().during("read the device memory size")?;
        let stream = ctx.new_stream().during("create the capture stream")?;

        probe::ensure_library(probe::Library::Nvrtc)?;
        probe::ensure_library(probe::Library::Cublas)?;
        let nvrtc_version = nvrtc::nvrtc_version()?;
        let arch = format!("sm_{}{}", compute_capability.0, compute_capability.1);
        let arch_num = compute_capability.0 * 10 + compute_capability.1;
        let archs = nvrtc::supported_archs()?;
        if !archs.contains(&arch_num) {
            return Err(GpuError::UnsupportedArch {
                arch,
                nvrtc: format!("{}.{}", nvrtc_version.0, nvrtc_version.1),
                supported: archs
                    .iter()
                    .map(|a| format!("sm_{a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }

        let cache_dir = opts.cache.resolve();
        let kernels = FunctionTable::load(&ctx, modules, user, &arch, cache_dir.as_deref())?;
        let blas = Blas::new(&stream)?;
        let info = DeviceInfo {
            ordinal: opts.ordinal,
            name,
            compute_capability,
            arch,
            sm_count,
            total_memory,
            driver_version: probe::split_version(driver_version),
            nvrtc_version,
        };
        let gpu = Gpu {
            _teardown_begins: gate::TeardownBegins,
            scratch: ScratchSet::new(),
            blas,
            kernels,
            current_op: Cell::new(None),
            shared: Arc::new(Shared::default()),
            info,
            stream,
            ctx,
            _teardown_ends: gate::TeardownEnds,
        };
        gpu.presize_scratch(GEMM_WORKSPACE, opts.gemm_workspace.max(1))?;
        gpu.warm_up_blas()?;
        Ok(gpu)
    }

    /// The device this context runs on.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// `(free, total)` device memory in bytes, as the driver reports it
    /// (`cuMemGetInfo`): what the bench reads before and after building a
    /// step to report its footprint.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        self.ctx.mem_get_info().during("read free device memory")
    }

    /// Waits for the stream, then hands the device's default memory pool's
    /// unused memory back to the driver, so that a following [`mem_info`]
    /// counts only live buffers: stream-ordered frees otherwise stay in the
    /// pool, and a buffer built after one reuses its memory unseen.
    ///
    /// [`mem_info`]: Self::mem_info
    pub fn trim_memory_pool(&self) -> Result<(), GpuError> {
        self.synchronize()?;
        let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a live stack handle the driver writes; the
        // device ordinal comes from this context's own device.
        unsafe {
            cudarc::driver::sys::cuDeviceGetDefaultMemPool(&raw mut pool, self.ctx.cu_device())
        }
        .result()
        .during("look up the default memory pool")?;
        // SAFETY: `pool` is the device's default pool returned just above;
        // trimming releases only memory no allocation holds, and the
        // stream was synchronized, so no free is still in flight.
        unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .during("trim the default memory pool")?;
        Ok(())
    }

    /// How each kernel module was obtained at start-up (cache hit or compile,
    /// and how long it took).
    pub fn compile_reports(&self) -> &[CompileReport] {
        self.kernels.reports()
    }

    /// Whether cudarc tracks buffer uses with events (always false: turned
    /// off at creation, before any allocation).
    pub fn is_event_tracking(&self) -> bool {
        self.ctx.is_event_tracking()
    }

    /// True when work runs on the legacy default stream (never: the context
    /// owns a dedicated stream).
    pub fn uses_legacy_stream(&self) -> bool {
        self.stream.cu_stream().is_null()
    }

    /// The op the generated step code says is running, if any.
    pub fn current_op(&self) -> Option<&'static str> {
        self.current_op.get()
    }

    /// The capture stream, for launch wrappers in this crate.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A loaded function, by name, for launch wrappers in this crate.
    pub(crate) fn kernel(&self, name: &'static str) -> Result<&CudaFunction, GpuError> {
        self.kernels.get(name)
    }

    /// The user kernel declared `index`-th in user kernel set `set`, for
    /// the user kernel handles of [`crate::kernels`]; a handle of another
    /// set is [`GpuError::ForeignKernel`].
    pub(crate) fn user_kernel(
        &self,
        set: u64,
        index: usize,
        name: &str,
    ) -> Result<&CudaFunction, GpuError> {
        self.kernels.user(set, index, name)
    }

    /// Runs `f` between two timing events on the capture stream and returns
    /// its result with the GPU time in milliseconds. Refused during capture.
    pub fn time_ms<R>(
        &self,
        f: impl FnOnce() -> Result<R, GpuError>,
    ) -> Result<(R, f32), GpuError> {
        let span = self.event_span()?;
        span.start(self)?;
        let out = f()?;
        let ms = span.stop(self)?;
        Ok((out, ms))
    }

    /// A reusable pair of timing events, for timing work that is not one
    /// closure (e.g. the spans a probe opens between ops of a pass).
    /// Refused during capture, like recording.
    pub fn event_span(&self) -> Result<EventSpan, GpuError> {
        self.refuse_in_capture("record timing events")?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(EventSpan {
            start: self.ctx.new_event(flags).during("create a timing event")?,
            end: self.ctx.new_event(flags).during("create a timing event")?,
        })
    }
}

/// Two CUDA events on the context's stream: [`EventSpan::start`] records the
/// first, [`EventSpan::stop`] the second and reads the time between them.
/// Both refuse to run while a capture is open, so timing never becomes an
/// event node of a captured graph. A span may be started again after a stop.
pub struct EventSpan {
    start: CudaEvent,
    end: CudaEvent,
}

impl EventSpan {
    /// Records the start event after the work queued so far.
    pub fn start(&self, gpu: &Gpu) -> Result<(), GpuError> {
        gpu.refuse_in_capture("record timing events")?;
        self.start
            .record(&gpu.stream)
            .during("record a timing event")
    }

    /// Records the end event and waits for it: the GPU time in milliseconds
    /// since the last [`EventSpan::start`].
    pub fn stop(&self, gpu: &Gpu) -> Result<f32, GpuError> {
        gpu.refuse_in_capture("record timing events")?;
        self.end
            .record(&gpu.stream)
            .during("record a timing event")?;
        self.start
            .elapsed_ms(&self.end)
            .during("read a timing event")
    }
}

impl std::fmt::Debug for EventSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSpan").finish_non_exhaustive()
    }
}

fn driver_version() -> Result<i32, GpuError> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: `v` is a live stack integer; the driver library was found by
    // `probe::driver_present` and cuDriverGetVersion needs no cuInit.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&raw mut v) }
        .result()
        .during("read the driver version")?;
    Ok(v)
}
