//! The graph layer: what `#[derive(TrainingGraph)]` generates code against.
//!
//! A captured CUDA graph freezes every device address its kernels were launched
//! with. If any allocation a captured step touches is freed or moved, a replay
//! silently reads and writes memory that now belongs to someone else. This module
//! holds the pieces that make that impossible to miss:
//!
//! * [`DevicePtrs`] lists every allocation inside a buffer, composite or not;
//! * [`PtrSnapshot`] records those addresses at capture and compares them on every
//!   replay, before anything is launched;
//! * [`Backend`] is the capture/launch interface the generated code drives; the
//!   CUDA context implements it, and [`testing::FakeBackend`] implements it on the
//!   host so the generated guard tests run without a GPU;
//! * [`GraphError`] is what a refused capture or replay returns;
//! * [`TrainingStep`] is the trait every derived step implements, so engines
//!   and benches take any step without adapters.
//!
//! The files import in a line, never back: `precision` and `error` (no
//! imports) <- `ptrs` <- `backend` <- `step` <- `testing`.

mod backend;
mod error;
mod precision;
mod ptrs;
mod step;
pub mod testing;

pub use backend::{
    Backend, BufferInfo, MovePolicy, OpInfo, Replayed, ScratchPtrs, ShapeKey, StepInfo,
};
pub use error::{CaptureViolation, GraphError, OpError};
pub use precision::{Precision, UnknownPrecision};
pub use ptrs::{DevicePtr, DevicePtrs, PtrSnapshot, TensorPath};
pub use step::TrainingStep;
pub use stepgraph_spec::{Access, Role};

/// Compile-time proof that a step struct's field has the type its spec declares.
///
/// The derive emits a bound `FieldType: SameType<SpecType>` per buffer; it holds
/// only when both name the same type.
#[diagnostic::on_unimplemented(
    message = "the step struct's field has type `{Self}`, but the spec declares `{T}`",
    label = "does not match the spec's `ty`"
)]
pub trait SameType<T: ?Sized> {}

impl<T: ?Sized> SameType<T> for T {}
