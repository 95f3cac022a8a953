//! The interface between generated step code and an execution context.
//!
//! The generated `capture` and `replay` are written once against [`Backend`];
//! the CUDA context implements it for real graphs and
//! [`FakeBackend`](super::testing::FakeBackend) implements it on the host, so
//! the guard logic the generated tests exercise is the very code a GPU replay
//! runs.

use std::error::Error as StdError;

use super::error::GraphError;
use super::precision::Precision;
use super::ptrs::{DevicePtr, DevicePtrs, TensorPath};
use stepgraph_spec::{Access, Role};

/// An execution context that can capture, instantiate and launch graphs.
///
/// Methods take `&self`: ops receive the same context while a capture is open,
/// so state that changes during capture (the current op, scratch freezing)
/// lives behind interior mutability.
pub trait Backend {
    /// An instantiated, launchable graph.
    type Exec;
    /// What capture, upload and launch can fail with.
    type Error: StdError + Send + Sync + 'static;

    /// True when the context owns a scratch area with this name.
    fn has_scratch(&self, name: &str) -> bool;
    /// Lists the allocations of scratch area `name` (nothing if unknown).
    fn visit_scratch(
        &self,
        name: &str,
        path: &TensorPath<'_>,
        visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr),
    );
    /// Freezes (or thaws) every scratch area: while frozen, a request that
    /// would grow one is an error instead of a reallocation under the graph.
    fn set_scratch_frozen(&self, frozen: bool);
    /// Records which spec op runs now (`None` between ops), so that a capture
    /// violation raised inside it can name it.
    fn enter_op(&self, op: Option<&'static str>);
    /// Opens a capture on the context's capture stream.
    fn begin_capture(&self) -> Result<(), Self::Error>;
    /// Closes the capture opened by `begin_capture` and instantiates it. Must
    /// be called after every successful `begin_capture`, also when an op failed.
    fn end_capture(&self) -> Result<Self::Exec, Self::Error>;
    /// Moves the instantiated graph to the device so the first launch is not slow.
    fn upload(&self, exec: &Self::Exec) -> Result<(), Self::Error>;
    /// Launches the graph once on the capture stream.
    fn launch(&self, exec: &Self::Exec) -> Result<(), Self::Error>;
}

/// What to do when a replay finds that a buffer moved or changed shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MovePolicy {
    /// Refuse the replay and return the error (the default: moves are bugs).
    #[default]
    Error,
    /// Re-capture the step against the live buffers, then launch.
    Recapture,
}

/// How a replay went when the caller allowed re-capture.
#[derive(Debug)]
pub enum Replayed {
    /// The captured graph was launched as is.
    Launched,
    /// The graph was stale; it was captured again and launched.
    Recaptured {
        /// Why the old graph was refused.
        reason: GraphError,
    },
}

/// The shape a graph was captured for, kept for logs and for callers that
/// bucket graphs by shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
}

/// A step's spec as constants: for logs, `stepgraph check` and tests.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    /// Step name.
    pub name: &'static str,
    /// Spec file, as written in the attribute.
    pub spec: &'static str,
    /// Precision of the step.
    pub precision: Precision,
    /// Buffers in spec order.
    pub buffers: &'static [BufferInfo],
    /// Context scratch areas the step uses.
    pub scratch: &'static [&'static str],
    /// Ops in execution order.
    pub ops: &'static [OpInfo],
}

/// One spec buffer.
#[derive(Clone, Copy, Debug)]
pub struct BufferInfo {
    /// Buffer name (also the step struct's field name).
    pub name: &'static str,
    /// Rust type as written in the spec.
    pub ty: &'static str,
    /// Role in the step.
    pub role: Role,
    /// Whether any op writes it.
    pub written: bool,
}

/// One spec op.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// Function path as written in the spec.
    pub path: &'static str,
    /// Buffer arguments in call order.
    pub args: &'static [(&'static str, Access)],
}

/// A context-owned scratch area seen through [`DevicePtrs`], so it is
/// snapshotted and guarded exactly like a step buffer.
pub struct ScratchPtrs<'a, B: ?Sized> {
    backend: &'a B,
    name: &'static str,
}

impl<'a, B: Backend + ?Sized> ScratchPtrs<'a, B> {
    /// The scratch area `name` of `backend`.
    pub fn new(backend: &'a B, name: &'static str) -> Self {
        Self { backend, name }
    }
}

impl<B: Backend + ?Sized> DevicePtrs for ScratchPtrs<'_, B> {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        self.backend.visit_scratch(self.name, path, visit);
    }
}
