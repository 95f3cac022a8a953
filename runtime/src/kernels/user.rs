//! Your own kernels: CUDA C sources compiled, cached, loaded and launched
//! exactly like the crate's, with typed handles.
//!
//! ```ignore
//! use stepgraph::device::{DeviceBuffer, Gpu, GpuOptions};
//! use stepgraph::kernels::user::{Grid, In, Out, UserKernel, UserKernels};
//!
//! const SRC: &str = r#"
//! extern "C" __global__ void scale(const float* x, float* y, float a, unsigned n) {
//!     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) y[i] = a * x[i];
//! }"#;
//!
//! let mut set = UserKernels::new();
//! let scale: UserKernel<(In<f32>, Out<f32>, f32, u32)> = set.module("scale.cu", SRC).kernel("scale");
//! let gpu = Gpu::with_user_kernels(GpuOptions::default(), &set)?;   // compiled, loaded, checked
//! let x = gpu.to_device(&[1.0f32, 2.0, 3.0])?;
//! let mut y = gpu.alloc::<f32>(3)?;
//! scale.launch(&gpu, Grid::cover(3, 256)?, (&x, &mut y, 2.0, 3))?;
//! ```
//!
//! **Declaring.** [`UserKernels`] collects modules (a source string, or a
//! file read at once) and headers they may `#include` (the crate's
//! `common.cuh` is always available: `SG_FOR_EACH`, warp and block sums).
//! Each [`ModuleDecl::kernel`] declares one `extern "C" __global__` entry
//! point with its parameter list as a type (see [`super::user_params`]) and
//! returns its [`UserKernel`] handle.
//!
//! **Opening.** [`Gpu::with_user_kernels`] opens a context with the crate's
//! kernels and the set's: each module is compiled by NVRTC for the device's
//! architecture (or read from the same disk cache, keyed by its source, the
//! headers, the options and the NVRTC version), every declared kernel is
//! looked up and loaded (`cuFuncLoad`) before anything can be captured, and
//! its parameter layout, read from the compiled code, must match the
//! handle's list: a kernel that is missing, or takes other parameters, is an
//! error when the context opens, never a bad launch later.
//!
//! **Launching.** [`UserKernel::launch`] takes the context, a [`Grid`] and
//! the arguments as a tuple typed by the handle, checks that every buffer
//! belongs to that context and that the grid is within CUDA's limits, and
//! launches on the context's stream, the one a capture records. It never
//! allocates, copies to or from the host or synchronizes, so it is legal in
//! a captured op; an op that does any of those through the context is
//! refused with a capture violation naming it, like any other op. The
//! unsafe part is here, not in the caller: what remains the caller's is the
//! kernel's own correctness (staying inside the buffers it is given).

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{LaunchConfig, PushKernelArg as _};

use super::user_params::KernelParams;
use super::user_params::sealed::Raw;
use crate::device::error::During as _;
use crate::device::{Gpu, GpuError, SourceText, UserFunction, UserModule, UserModules};

/// A set of user kernel modules, and the handles declared from them; see
/// the [module docs](self).
#[derive(Debug)]
pub struct UserKernels {
    modules: UserModules,
    declared: usize,
}

impl Default for UserKernels {
    fn default() -> Self {
        Self::new()
    }
}

impl UserKernels {
    /// An empty set, with an identity of its own: its handles launch only on
    /// a context opened with it.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            modules: UserModules {
                set: NEXT.fetch_add(1, Ordering::Relaxed),
                ..UserModules::default()
            },
            declared: 0,
        }
    }

    /// Adds a header the modules may `#include "<name>"`.
    pub fn header(&mut self, name: &str, src: &str) -> &mut Self {
        self.modules.headers.push(SourceText {
            file: name.to_owned(),
            src: src.to_owned(),
            label: name.to_owned(),
        });
        self
    }

    /// Adds a module compiled from `src`; `name` (say `mlp.cu`) names it in
    /// reports, errors and the cache.
    pub fn module(&mut self, name: &str, src: &str) -> ModuleDecl<'_> {
        self.push_module(SourceText {
            file: name.to_owned(),
            src: src.to_owned(),
            label: name.to_owned(),
        })
    }

    /// Adds a module read from the file at `path` (now, not when the
    /// context opens); its file name names it, errors show the path.
    pub fn module_file(&mut self, path: impl AsRef<Path>) -> Result<ModuleDecl<'_>, GpuError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| GpuError::ReadSource {
            path: path.to_path_buf(),
            source,
        })?;
        let file = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Ok(self.push_module(SourceText {
            file,
            src,
            label: path.display().to_string(),
        }))
    }

    /// Kernels declared so far.
    pub fn kernel_count(&self) -> usize {
        self.declared
    }

    fn push_module(&mut self, source: SourceText) -> ModuleDecl<'_> {
        self.modules.modules.push(UserModule {
            source,
            functions: Vec::new(),
        });
        ModuleDecl { set: self }
    }

    /// The device layer's view of the set.
    pub(crate) fn modules(&self) -> &UserModules {
        &self.modules
    }
}

/// The module last added to a [`UserKernels`], to declare its kernels.
#[derive(Debug)]
pub struct ModuleDecl<'a> {
    set: &'a mut UserKernels,
}

impl ModuleDecl<'_> {
    /// Declares the `extern "C" __global__` kernel `name` of this module,
    /// taking the parameters `P` (a tuple, see [`super::user_params`]).
    pub fn kernel<P: KernelParams>(&mut self, name: &str) -> UserKernel<P> {
        let set = &mut *self.set;
        // Kernels load in module order, then declaration order, and only
        // the last module can be declared into: the running count is the
        // kernel's position in the loaded table.
        let index = set.declared;
        set.declared += 1;
        if let Some(m) = set.modules.modules.last_mut() {
            m.functions.push(UserFunction {
                name: name.to_owned(),
                param_bytes: P::BYTES.to_vec(),
            });
        }
        UserKernel {
            set: set.modules.set,
            index,
            name: Arc::from(name),
            _params: PhantomData,
        }
    }
}

/// A user kernel taking the parameters `P`; launch it with
/// [`UserKernel::launch`] on a context opened with its [`UserKernels`].
pub struct UserKernel<P> {
    set: u64,
    index: usize,
    name: Arc<str>,
    _params: PhantomData<fn(P)>,
}

impl<P> Clone for UserKernel<P> {
    fn clone(&self) -> Self {
        Self {
            set: self.set,
            index: self.index,
            name: self.name.clone(),
            _params: PhantomData,
        }
    }
}

impl<P> std::fmt::Debug for UserKernel<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserKernel")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Launch geometry: blocks, threads per block, dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks in x, y, z.
    pub blocks: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub threads: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes (at most 48 KiB).
    pub shared_bytes: u32,
}

/// Dynamic shared memory a launch may ask for without an opt-in attribute.
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

impl Grid {
    /// `blocks` blocks of `threads` threads, in x.
    pub const fn new(blocks: u32, threads: u32) -> Self {
        Self {
            blocks: (blocks, 1, 1),
            threads: (threads, 1, 1),
            shared_bytes: 0,
        }
    }

    /// Enough blocks of `threads` threads for one thread per element of
    /// `n` (at least one block).
    pub fn cover(n: usize, threads: u32) -> Result<Self, GpuError> {
        let per = usize::try_from(threads.max(1)).unwrap_or(usize::MAX);
        let blocks = crate::device::to_u32("Grid::cover: blocks", n.div_ceil(per).max(1))?;
        Ok(Self::new(blocks, threads))
    }

    /// The same grid with `bytes` of dynamic shared memory per block.
    pub const fn with_shared_bytes(self, bytes: u32) -> Self {
        Self {
            shared_bytes: bytes,
            ..self
        }
    }

    /// CUDA's limits, checked (compute capability 8.0 and later).
    fn config(&self, kernel: &str) -> Result<LaunchConfig, GpuError> {
        let (bx, by, bz) = self.blocks;
        let (tx, ty, tz) = self.threads;
        let per_block = u64::from(tx) * u64::from(ty) * u64::from(tz);
        let checks: [(&'static str, u64, u64, u64); 8] = [
            ("blocks.x", u64::from(bx), 1, (1 << 31) - 1),
            ("blocks.y", u64::from(by), 1, 65_535),
            ("blocks.z", u64::from(bz), 1, 65_535),
            ("threads.x", u64::from(tx), 1, 1024),
            ("threads.y", u64::from(ty), 1, 1024),
            ("threads.z", u64::from(tz), 1, 64),
            ("threads per block", per_block, 1, 1024),
            (
                "shared_bytes",
                u64::from(self.shared_bytes),
                0,
                u64::from(MAX_SHARED_BYTES),
            ),
        ];
        for (what, value, min, max) in checks {
            if !(min..=max).contains(&value) {
                return Err(GpuError::LaunchShape {
                    kernel: kernel.to_owned(),
                    what,
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(LaunchConfig {
            grid_dim: self.blocks,
            block_dim: self.threads,
            shared_mem_bytes: self.shared_bytes,
        })
    }
}

impl<P: KernelParams> UserKernel<P> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The byte size of each parameter the handle passes, in order: what
    /// the context checks against the compiled kernel when it loads it.
    pub fn param_bytes(&self) -> &'static [usize] {
        P::BYTES
    }

    /// Launches the kernel on `gpu`'s stream with `args`, one per parameter
    /// of `P`; see the [module docs](self) for what is checked.
    pub fn launch(&self, gpu: &Gpu, grid: Grid, args: P::Args<'_>) -> Result<(), GpuError> {
        let f = gpu.user_kernel(self.set, self.index, &self.name)?;
        let cfg = grid.config(&self.name)?;
        let mut raw = Vec::with_capacity(P::BYTES.len());
        P::lower(gpu, args, &mut raw)?;
        let mut b = gpu.stream().launch_builder(f);
        for r in &raw {
            match r {
                Raw::Ptr(v) | Raw::U64(v) => b.arg(v),
                Raw::F32(v) => b.arg(v),
                Raw::F64(v) => b.arg(v),
                Raw::I32(v) => b.arg(v),
                Raw::U32(v) => b.arg(v),
                Raw::I64(v) => b.arg(v),
                Raw::Bf16(v) => b.arg(v),
            };
        }
        // SAFETY: the driver copies one value per kernel parameter from
        // the pointers pushed above, which point into `raw`, alive until
        // after this call. `raw` holds one value per entry of `P::BYTES`,
        // each exactly that many bytes, and the context checked `P::BYTES`
        // against the compiled kernel's own parameter sizes when it loaded
        // it (UserTable::load, cuFuncGetParamInfo), so the count and every
        // size match what the kernel reads. Each pointer value is the
        // address of a live allocation of this context (checked by
        // `lower`), borrowed for the call (shared for `In`, exclusive for
        // `Out` and `Scratch`) and freed only stream-ordered after the
        // kernel; `grid` is within CUDA's limits (checked). What the kernel
        // does inside those allocations is its own contract, as for any
        // CUDA launch.
        unsafe { b.launch(cfg) }.during("launch a user kernel")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::user_params::{In, Out, Scratch};
    use super::*;

    #[test]
    fn handles_index_the_table_in_load_order() {
        let mut set = UserKernels::new();
        let a: UserKernel<(In<f32>, Out<f32>, u32)> = set.module("a.cu", "src a").kernel("fa");
        let mut m = set.module("b.cu", "src b");
        let b: UserKernel<(Scratch<f64>,)> = m.kernel("fb");
        let c: UserKernel<()> = m.kernel("fc");
        assert_eq!((a.index, b.index, c.index), (0, 1, 2));
        assert_eq!(
            (a.param_bytes(), c.param_bytes()),
            (&[8, 8, 4][..], &[][..])
        );
        assert_eq!(set.kernel_count(), 3);
        let modules = set.modules();
        assert!(modules.set > 0 && a.set == modules.set && c.set == modules.set);
        let layout: Vec<(&str, Vec<usize>)> = modules
            .modules
            .iter()
            .flat_map(|m| {
                m.functions
                    .iter()
                    .map(|f| (f.name.as_str(), f.param_bytes.clone()))
            })
            .collect();
        assert_eq!(
            layout,
            vec![("fa", vec![8, 8, 4]), ("fb", vec![8]), ("fc", vec![])]
        );
        assert_ne!(
            UserKernels::new().modules().set,
            modules.set,
            "each set is its own"
        );
        assert_eq!(format!("{b:?}"), "UserKernel { name: \"fb\", .. }");
    }

    #[test]
    fn a_missing_source_file_is_a_typed_error() {
        let mut set = UserKernels::new();
        match set.module_file("/nonexistent/dir/k.cu") {
            Err(GpuError::ReadSource { path, .. }) => {
                assert_eq!(path, Path::new("/nonexistent/dir/k.cu"));
            }
            other => panic!("expected ReadSource, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mine.cu");
        std::fs::write(&p, "extern \"C\" __global__ void k() {}").unwrap();
        let _k: UserKernel<()> = set.module_file(&p).unwrap().kernel("k");
        let m = &set.modules().modules[0];
        assert_eq!(m.source.file, "mine.cu");
        assert_eq!(m.source.label, p.display().to_string());
    }

    #[test]
    fn grids_outside_cudas_limits_are_refused_by_name() {
        assert!(Grid::new(1, 256).config("k").is_ok());
        assert_eq!(Grid::cover(0, 256).unwrap(), Grid::new(1, 256));
        assert_eq!(Grid::cover(257, 256).unwrap(), Grid::new(2, 256));
        for (grid, what) in [
            (Grid::new(0, 256), "blocks.x"),
            (Grid::new(1, 0), "threads.x"),
            (Grid::new(1, 2048), "threads.x"),
            (
                Grid {
                    threads: (64, 64, 1),
                    ..Grid::new(1, 1)
                },
                "threads per block",
            ),
            (
                Grid::new(1, 32).with_shared_bytes(64 * 1024),
                "shared_bytes",
            ),
        ] {
            match grid.config("bias_relu") {
                Err(GpuError::LaunchShape {
                    kernel, what: w, ..
                }) => {
                    assert_eq!((kernel.as_str(), w), ("bias_relu", what));
                }
                other => panic!("{grid:?}: expected {what} refused, got {other:?}"),
            }
        }
        let e = Grid::new(1, 2048).config("k").unwrap_err();
        assert_eq!(
            e.to_string(),
            "launch of `k`: threads.x = 2048 is outside 1..=1024"
        );
    }
}
