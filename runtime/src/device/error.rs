//! The error type of the GPU runtime.
//!
//! One enum for the device layer and the kernel wrappers, so an op function can
//! `?` anything it calls and still return a single type. Every variant that
//! wraps a CUDA library error also says what the runtime was doing, because a
//! bare `CUDA_ERROR_INVALID_VALUE` does not tell which of twenty calls failed.

use std::path::PathBuf;

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

use crate::graph::{CaptureViolation, OpError};

/// Everything the GPU runtime can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver library found (tried {tried}): this machine has no NVIDIA driver, or it is not on the loader path"
    )]
    NoDriver {
        /// Library names that were tried.
        tried: String,
    },
    /// The driver loaded but reports no usable GPU.
    #[error("the CUDA driver reports no GPU ({detail})")]
    NoDevice {
        /// What the driver said.
        detail: String,
    },
    /// The requested ordinal is past the last GPU.
    #[error("GPU {ordinal} does not exist: the driver reports {count} GPU(s)")]
    NoSuchDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// GPUs the driver sees.
        count: usize,
    },
    /// The installed driver is older than the CUDA version the runtime is built for.
    #[error(
        "the CUDA driver supports CUDA {found_major}.{found_minor}, stepgraph needs {need_major}.{need_minor} or newer (driver 580+)"
    )]
    DriverTooOld {
        /// Driver's CUDA major version.
        found_major: i32,
        /// Driver's CUDA minor version.
        found_minor: i32,
        /// Required major version.
        need_major: i32,
        /// Required minor version.
        need_minor: i32,
    },
    /// The GPU is too old for the kernels and GEMMs the runtime uses.
    #[error(
        "GPU {ordinal} (`{name}`) has compute capability {major}.{minor}; stepgraph needs {min_major}.{min_minor} or newer (bf16 tensor cores)"
    )]
    UnsupportedComputeCapability {
        /// Device ordinal.
        ordinal: usize,
        /// Device name.
        name: String,
        /// Compute capability major.
        major: i32,
        /// Compute capability minor.
        minor: i32,
        /// Oldest supported major.
        min_major: i32,
        /// Oldest supported minor.
        min_minor: i32,
    },
    /// NVRTC cannot generate code for the device's architecture.
    #[error("NVRTC {nvrtc} cannot compile for `{arch}` (it supports: {supported})")]
    UnsupportedArch {
        /// The device's architecture, e.g. `sm_90`.
        arch: String,
        /// NVRTC version.
        nvrtc: String,
        /// Architectures NVRTC lists.
        supported: String,
    },
    /// A CUDA library other than the driver (NVRTC, cuBLAS) could not be loaded.
    #[error(
        "{what} library not found (tried {tried}); install the CUDA 13 toolkit or set CUDA_HOME to it"
    )]
    LibraryMissing {
        /// Which library.
        what: &'static str,
        /// Names and directories tried.
        tried: String,
    },
    /// The CUDA headers NVRTC needs (for `cuda_bf16.h`) were not found.
    #[error(
        "CUDA headers not found: {reason}; set CUDA_HOME to the CUDA toolkit root (the folder holding include/cuda_bf16.h)"
    )]
    CudaHeadersNotFound {
        /// Where the runtime looked and why each place failed.
        reason: String,
    },
    /// NVRTC rejected a kernel source file.
    #[error("NVRTC failed to compile {file}:\n{log}")]
    Compile {
        /// The module: `kernels/<file>` for the crate's own, the name or
        /// path a user module was given otherwise.
        file: String,
        /// NVRTC's log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed while trying to {during}: {source}")]
    Driver {
        /// What the runtime was doing.
        during: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An NVRTC call failed (other than a compile error, which is [`GpuError::Compile`]).
    #[error("NVRTC call failed while trying to {during}: {source}")]
    Nvrtc {
        /// What the runtime was doing.
        during: &'static str,
        /// NVRTC's error.
        #[source]
        source: NvrtcError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS call failed while trying to {during}: {source}")]
    Cublas {
        /// What the runtime was doing.
        during: &'static str,
        /// cuBLAS's status.
        #[source]
        source: CublasError,
    },
    /// The capture ended but CUDA had invalidated it: some call bypassed the
    /// runtime's own wrappers (which refuse such calls before the driver sees
    /// them). The stream is out of capture mode and usable again.
    #[error(
        "the graph capture was invalidated by a CUDA call that bypassed stepgraph's wrappers ({source}); the capture was ended and the stream is usable"
    )]
    CaptureInvalidated {
        /// The driver's error from ending the capture.
        #[source]
        source: DriverError,
    },
    /// An allocation, host copy or synchronization was attempted while a
    /// capture was open; it was refused before reaching the driver.
    #[error(transparent)]
    Violation(#[from] CaptureViolation),
    /// `begin_capture` with a capture already open, `end_capture` without one,
    /// or a graph launch while capturing.
    #[error("graph capture state: {0}")]
    CaptureState(&'static str),
    /// A scratch area would have to grow while frozen (or while capturing).
    #[error(
        "scratch area `{name}` is frozen at {have} bytes and {want} were requested; presize it before capture (an eager run of the step does)"
    )]
    ScratchFrozen {
        /// Scratch name.
        name: String,
        /// Current size in bytes.
        have: usize,
        /// Requested size in bytes.
        want: usize,
    },
    /// The context has no scratch area with this name.
    #[error("the GPU context has no scratch area `{name}` (known: {known})")]
    UnknownScratch {
        /// Requested name.
        name: String,
        /// Names the context provides.
        known: String,
    },
    /// A scratch area is already borrowed by an enclosing call.
    #[error("scratch area `{name}` is already in use by an enclosing call")]
    ScratchBusy {
        /// Scratch name.
        name: String,
    },
    /// A size does not fit the integer type a kernel or cuBLAS takes.
    #[error("{what} = {value} does not fit in {target}")]
    SizeOverflow {
        /// Which size.
        what: &'static str,
        /// Its value (saturated at `u128::MAX` when even that overflowed).
        value: u128,
        /// The type it had to fit (`u32`, `i32`, ...).
        target: &'static str,
    },
    /// Two lengths that must agree do not.
    #[error("{what}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// Which buffer or argument.
        what: &'static str,
        /// Length required.
        expected: usize,
        /// Length given.
        actual: usize,
    },
    /// A size beyond what a kernel's register tiles hold.
    #[error("{what} is {value}, but the kernel supports at most {max}")]
    ShapeLimit {
        /// Which size.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The largest supported.
        max: usize,
    },
    /// A head shape the warp form of the scan has no instance for.
    #[error(
        "the warp scan takes heads of headdim x d_state 8x32, 8x64, 16x32, 16x64 or 32x32, \
         not {headdim}x{d_state}; run the block form (ScanForm::Block)"
    )]
    WarpScanShape {
        /// P.
        headdim: usize,
        /// N.
        d_state: usize,
    },
    /// Sequence starts inside rows given to a scan form that takes none
    /// (only the warp form restarts its state inside a row).
    #[error(
        "only the warp scan takes sequence starts inside a row (packed rows); \
         this scan runs the block form at heads of {headdim}x{d_state}"
    )]
    SequenceStarts {
        /// P.
        headdim: usize,
        /// N.
        d_state: usize,
    },
    /// A buffer whose device address a kernel's vector loads cannot take.
    #[error("{what} starts at device address {addr:#x}, not a multiple of {align} bytes")]
    Misaligned {
        /// Which buffer.
        what: &'static str,
        /// Its address.
        addr: u64,
        /// The alignment the kernel needs.
        align: u64,
    },
    /// A buffer is smaller than an operation needs.
    #[error("{what} holds {have} elements but {need} are needed")]
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Elements needed.
        need: usize,
        /// Elements present.
        have: usize,
    },
    /// A buffer created by another [`Gpu`](super::Gpu) was passed in.
    #[error("{what} was allocated by a different GPU context")]
    ForeignBuffer {
        /// Which buffer.
        what: &'static str,
    },
    /// A kernel name is not in the loaded kernel table.
    #[error(
        "kernel `{name}` is not loaded (is it listed in the modules the context was opened with?)"
    )]
    MissingKernel {
        /// Function name.
        name: &'static str,
    },
    /// A kernel source contained an interior NUL byte.
    #[error("kernel source {file} contains a NUL byte")]
    InvalidSource {
        /// The `.cu` or `.cuh` file, named as in [`GpuError::Compile`].
        file: String,
    },
    /// A user kernel source file could not be read.
    #[error("cannot read kernel source {path}: {source}")]
    ReadSource {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A user kernel set is malformed: a name declared twice or empty.
    #[error("user kernels: {problem} `{name}`")]
    UserKernelSet {
        /// What is wrong (`kernel declared twice`, `empty kernel name`, ...).
        problem: &'static str,
        /// The kernel, module or header involved.
        name: String,
    },
    /// A declared user kernel is not defined by its compiled module.
    #[error(
        "kernel `{kernel}` is not defined in {module} (a kernel must be `extern \"C\" __global__`, so its name is not mangled)"
    )]
    UserKernelNotFound {
        /// The module, named as in [`GpuError::Compile`].
        module: String,
        /// The kernel's name.
        kernel: String,
    },
    /// A user kernel's parameters (as the driver reads them from the
    /// compiled code) do not match the parameter list its handle declares.
    #[error(
        "kernel `{kernel}` takes {} parameter(s) of {found:?} bytes, but its handle declares {} of {declared:?} bytes",
        found.len(),
        declared.len()
    )]
    KernelSignature {
        /// The kernel's name.
        kernel: String,
        /// Byte sizes of the declared parameters, in order.
        declared: Vec<usize>,
        /// Byte sizes of the compiled kernel's parameters, in order.
        found: Vec<usize>,
    },
    /// A user kernel handle was used with a context opened with another
    /// kernel set (or with none).
    #[error("kernel `{kernel}` does not belong to the kernel set this GPU context was opened with")]
    ForeignKernel {
        /// The kernel's name.
        kernel: String,
    },
    /// A user kernel launch's grid, block or shared memory is out of range.
    #[error("launch of `{kernel}`: {what} = {value} is outside {min}..={max}")]
    LaunchShape {
        /// The kernel's name.
        kernel: String,
        /// Which dimension (`threads per block`, `blocks.y`, ...).
        what: &'static str,
        /// The value asked for.
        value: u64,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
    /// The kernel cache directory could not be used and caching was required.
    #[error("kernel cache at {path}: {source}")]
    Cache {
        /// File or directory involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl OpError for GpuError {
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        match self {
            GpuError::Violation(v) => Some(v),
            _ => None,
        }
    }
}

/// Attaches "what were we doing" to a CUDA library result.
pub(crate) trait During<T> {
    /// Maps the library error into [`GpuError`] with `during` as context.
    fn during(self, during: &'static str) -> Result<T, GpuError>;
}

impl<T> During<T> for Result<T, DriverError> {
    fn during(self, during: &'static str) -> Result<T, GpuError> {
        self.map_err(|source| GpuError::Driver { during, source })
    }
}

impl<T> During<T> for Result<T, NvrtcError> {
    fn during(self, during: &'static str) -> Result<T, GpuError> {
        self.map_err(|source| GpuError::Nvrtc { during, source })
    }
}

impl<T> During<T> for Result<T, CublasError> {
    fn during(self, during: &'static str) -> Result<T, GpuError> {
        self.map_err(|source| GpuError::Cublas { during, source })
    }
}

/// `value` as a `u32` kernel argument, or a [`GpuError::SizeOverflow`] naming it.
pub fn to_u32(what: &'static str, value: usize) -> Result<u32, GpuError> {
    u32::try_from(value).map_err(|_| overflow(what, value, "u32"))
}

/// `value` as a cuBLAS `int`, or a [`GpuError::SizeOverflow`] naming it.
pub fn to_i32(what: &'static str, value: usize) -> Result<i32, GpuError> {
    i32::try_from(value).map_err(|_| overflow(what, value, "i32 (cuBLAS int)"))
}

/// `a * b` for element counts, or a [`GpuError::SizeOverflow`] naming it.
pub fn checked_elems(what: &'static str, a: usize, b: usize) -> Result<usize, GpuError> {
    a.checked_mul(b).ok_or_else(|| {
        let wide = u128::try_from(a)
            .unwrap_or(u128::MAX)
            .saturating_mul(u128::try_from(b).unwrap_or(u128::MAX));
        GpuError::SizeOverflow {
            what,
            value: wide,
            target: "usize",
        }
    })
}

fn overflow(what: &'static str, value: usize, target: &'static str) -> GpuError {
    GpuError::SizeOverflow {
        what,
        value: u128::try_from(value).unwrap_or(u128::MAX),
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::GraphError;

    #[test]
    fn size_checks_name_the_size() {
        assert_eq!(to_u32("n", 7).ok(), Some(7));
        let big = usize::try_from(u64::from(u32::MAX) + 1).unwrap_or(usize::MAX);
        let e = to_u32("n", big).unwrap_err();
        assert_eq!(e.to_string(), format!("n = {big} does not fit in u32"));
        let e = to_i32("lda", big).unwrap_err();
        assert!(e.to_string().starts_with("lda = "), "{e}");
        assert!(e.to_string().ends_with("i32 (cuBLAS int)"), "{e}");
        assert!(checked_elems("m*k", usize::MAX, 2).is_err());
        assert_eq!(checked_elems("m*k", 3, 4).ok(), Some(12));
    }

    #[test]
    fn violation_is_lifted_to_graph_error_naming_the_op() {
        let err = GpuError::from(CaptureViolation {
            op: Some("step::bad"),
            action: "allocate device memory",
        });
        assert!(err.capture_violation().is_some());
        match GraphError::from_op("Step", "step::bad", err) {
            GraphError::CaptureViolation { step, op, action } => {
                assert_eq!(
                    (step, op, action),
                    ("Step", "step::bad", "allocate device memory")
                );
            }
            other => panic!("expected CaptureViolation, got {other:?}"),
        }
        let other = GpuError::CaptureState("no capture is open");
        assert!(other.capture_violation().is_none());
        assert!(matches!(
            GraphError::from_op("S", "o", other),
            GraphError::Op { .. }
        ));
    }

    #[test]
    fn messages_name_what_to_fix() {
        let e = GpuError::CudaHeadersNotFound {
            reason: "no /x/include/cuda_bf16.h".into(),
        };
        assert!(e.to_string().contains("CUDA_HOME"), "{e}");
        let e = GpuError::UnsupportedComputeCapability {
            ordinal: 0,
            name: "Tesla T4".into(),
            major: 7,
            minor: 5,
            min_major: 8,
            min_minor: 0,
        };
        assert!(e.to_string().contains("compute capability 7.5"), "{e}");
        let e = GpuError::Compile {
            file: "kernels/reduce.cu".to_owned(),
            log: "error: expected a `;`".into(),
        };
        assert!(e.to_string().contains("kernels/reduce.cu"), "{e}");
        assert!(e.to_string().contains("expected a `;`"), "{e}");
        let e = GpuError::ScratchFrozen {
            name: "reduce_partials".into(),
            have: 4096,
            want: 8192,
        };
        assert!(
            e.to_string()
                .contains("`reduce_partials` is frozen at 4096 bytes"),
            "{e}"
        );
    }
}
