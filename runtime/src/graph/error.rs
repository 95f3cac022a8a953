//! Errors of capture and replay.
//!
//! Every variant names the step, and where it applies the spec op and the
//! buffer and tensor involved: a refused replay must say exactly which
//! allocation moved, because the fix (keep that buffer alive, allocate it
//! before capture, re-capture) depends on which one it was.

use std::error::Error as StdError;

/// Why a capture or replay was refused. A refused replay launched nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// An allocation the graph was captured with now lives somewhere else.
    #[error(
        "step `{step}`: buffer `{buffer}`{} moved since capture (captured at {captured:#x}, now at {live:#x}); replay refused, nothing launched",
        tensor_suffix(tensor)
    )]
    PointerMoved {
        /// Step name from the spec.
        step: &'static str,
        /// Spec buffer (or `scratch:<name>`) holding the tensor.
        buffer: &'static str,
        /// Dotted path of the tensor inside the buffer; empty for the buffer itself.
        tensor: String,
        /// Address frozen into the graph.
        captured: u64,
        /// Address the buffer has now.
        live: u64,
    },
    /// An allocation changed size: a new batch or sequence length, usually.
    #[error(
        "step `{step}`: buffer `{buffer}`{} is {live_bytes} bytes, the graph was captured with {captured_bytes}; a new shape needs a new capture",
        tensor_suffix(tensor)
    )]
    ShapeChanged {
        /// Step name from the spec.
        step: &'static str,
        /// Spec buffer holding the tensor.
        buffer: &'static str,
        /// Dotted path of the tensor inside the buffer.
        tensor: String,
        /// Size at capture.
        captured_bytes: usize,
        /// Size now.
        live_bytes: usize,
    },
    /// A composite buffer gained or lost allocations since capture.
    #[error(
        "step `{step}`: buffer `{buffer}` holds {live} allocations, the graph was captured with {captured}"
    )]
    TensorSetChanged {
        /// Step name from the spec.
        step: &'static str,
        /// Spec buffer.
        buffer: &'static str,
        /// Allocation count at capture.
        captured: usize,
        /// Allocation count now (at least this many).
        live: usize,
    },
    /// The spec names a context scratch area this backend does not provide.
    #[error("step `{step}`: the execution context has no scratch area `{name}`")]
    UnknownScratch {
        /// Step name from the spec.
        step: &'static str,
        /// Scratch name from the spec.
        name: &'static str,
    },
    /// An op did something a capture forbids (allocate, copy to or from the
    /// host, synchronize). The runtime catches it before CUDA invalidates the
    /// capture, and the capture is ended cleanly.
    #[error("step `{step}`: op `{op}` tried to {action} while the graph capture was open")]
    CaptureViolation {
        /// Step name from the spec.
        step: &'static str,
        /// Spec op that did it.
        op: &'static str,
        /// What it tried to do.
        action: &'static str,
    },
    /// An op returned an error (while running eagerly or while capturing).
    #[error("step `{step}`: op `{op}` failed")]
    Op {
        /// Step name from the spec.
        step: &'static str,
        /// Spec op path.
        op: &'static str,
        /// What the op reported.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The backend failed to begin, end, upload or launch the graph.
    #[error("step `{step}`: graph {stage} failed")]
    Backend {
        /// Step name from the spec.
        step: &'static str,
        /// `begin capture`, `end capture`, `upload` or `launch`.
        stage: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

fn tensor_suffix(tensor: &str) -> String {
    if tensor.is_empty() {
        String::new()
    } else {
        format!(" (tensor `{tensor}`)")
    }
}

impl GraphError {
    /// Wraps an op's error, lifting a capture violation to its own variant.
    pub fn from_op<E: OpError>(step: &'static str, op: &'static str, err: E) -> Self {
        match err.capture_violation() {
            Some(v) => GraphError::CaptureViolation {
                step,
                op,
                action: v.action,
            },
            None => GraphError::Op {
                step,
                op,
                source: Box::new(err),
            },
        }
    }

    /// Wraps a backend error at one stage of the graph's life.
    pub fn backend<E: StdError + Send + Sync + 'static>(
        step: &'static str,
        stage: &'static str,
        err: E,
    ) -> Self {
        GraphError::Backend {
            step,
            stage,
            source: Box::new(err),
        }
    }

    /// True when the graph no longer matches its buffers (moved, resized or
    /// restructured) and a re-capture would fix it.
    pub fn is_stale_graph(&self) -> bool {
        matches!(
            self,
            GraphError::PointerMoved { .. }
                | GraphError::ShapeChanged { .. }
                | GraphError::TensorSetChanged { .. }
        )
    }
}

/// Raised by the runtime's allocation, copy and sync wrappers when they are
/// called while a capture is open, before the driver call that would
/// invalidate the capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tried to {action} while a graph capture was open{}", op.map(|o| format!(" (op `{o}`)")).unwrap_or_default())]
pub struct CaptureViolation {
    /// The spec op that was running, when known.
    pub op: Option<&'static str>,
    /// What was attempted: `allocate`, `copy to the host`, `synchronize`, ...
    pub action: &'static str,
}

/// Errors that spec ops may return.
///
/// Anything `std::error::Error + Send + Sync` qualifies; an error type that can
/// carry a [`CaptureViolation`] exposes it here so the generated code reports it
/// as [`GraphError::CaptureViolation`].
pub trait OpError: StdError + Send + Sync + 'static {
    /// The capture violation this error reports, if it is one.
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        None
    }
}

impl OpError for CaptureViolation {
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        Some(self)
    }
}

impl OpError for std::convert::Infallible {}
