//! The CUDA implementation of [`graph::Backend`](crate::graph::Backend).
//!
//! **Capture mode: `THREAD_LOCAL`.** The runtime's own wrappers refuse
//! allocations, host copies and syncs during a capture before the driver sees
//! them, so the driver's mode is the second line of defence. `THREAD_LOCAL`
//! makes the driver reject such calls from the capturing thread (where every
//! op runs: [`Gpu`] is not `Sync`), while other threads of the process, such
//! as a data loader allocating pinned memory or a parallel test, keep working.
//! `GLOBAL` would fail those unrelated threads for as long as the capture is
//! open.
//!
//! **Other threads' contexts.** A capture counts itself in the device gate
//! (`gate.rs`) while it is open, so that a `Gpu` another thread opens or
//! tears down (a device-wide synchronization) waits for it.
//!
//! **Ending.** `end_capture` always ends the capture the driver holds, also
//! after an op failed, and clears the context's capture flag whatever the
//! driver says, so the stream is usable afterwards. A capture CUDA invalidated
//! (a call that bypassed the wrappers) is reported as
//! [`GpuError::CaptureInvalidated`].

use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DriverError};

use super::Gpu;
use super::error::{During as _, GpuError};
use crate::graph::{Backend, DevicePtr, TensorPath};

/// An instantiated, uploaded-on-request CUDA graph captured on a [`Gpu`].
///
/// It keeps the captured graph beside the executable one, so its nodes can be
/// inspected or the executable updated later. It holds no buffer: keeping the
/// buffers it points into alive and in place is the job of the generated step
/// code's pointer guards.
pub struct GpuGraph {
    graph: CudaGraph,
}

impl std::fmt::Debug for GpuGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuGraph")
            .field("nodes", &self.node_count().ok())
            .finish()
    }
}

impl GpuGraph {
    /// Number of nodes (kernels, memsets, copies, ...) in the captured graph.
    pub fn node_count(&self) -> Result<usize, GpuError> {
        let mut n = 0usize;
        // SAFETY: `cu_graph` is the live template graph owned by `self.graph`;
        // with a null node array cuGraphGetNodes only writes the count to `n`.
        unsafe {
            cudarc::driver::sys::cuGraphGetNodes(
                self.graph.cu_graph(),
                std::ptr::null_mut(),
                &raw mut n,
            )
        }
        .result()
        .during("count graph nodes")?;
        Ok(n)
    }
}

impl Gpu {
    /// True between `begin_capture` and `end_capture`.
    pub fn is_capturing(&self) -> bool {
        self.shared.is_capturing()
    }

    /// Whether scratch growth is currently refused.
    pub fn is_scratch_frozen(&self) -> bool {
        self.scratch.is_frozen()
    }
}

impl Backend for Gpu {
    type Exec = GpuGraph;
    type Error = GpuError;

    fn has_scratch(&self, name: &str) -> bool {
        self.scratch.area(name).is_ok()
    }

    fn visit_scratch(
        &self,
        name: &str,
        path: &TensorPath<'_>,
        visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr),
    ) {
        self.visit_scratch_area(name, path, visit);
    }

    fn set_scratch_frozen(&self, frozen: bool) {
        self.scratch.set_frozen(frozen);
    }

    fn enter_op(&self, op: Option<&'static str>) {
        self.current_op.set(op);
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        if self.shared.is_capturing() {
            return Err(GpuError::CaptureState(
                "begin_capture: a capture is already open",
            ));
        }
        // Counted before the driver opens it, so that no other thread's
        // context-wide work runs while it is open (gate.rs).
        super::gate::capture_begins();
        if let Err(e) = self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("begin a stream capture")
        {
            super::gate::capture_ends();
            return Err(e);
        }
        self.shared.capturing.store(true, Ordering::Release);
        Ok(())
    }

    fn end_capture(&self) -> Result<GpuGraph, GpuError> {
        if !self.shared.is_capturing() {
            return Err(GpuError::CaptureState("end_capture: no capture is open"));
        }
        // cuStreamEndCapture leaves capture mode also when it fails (an
        // invalidated capture returns an error and no graph), so the flag is
        // cleared whatever happens.
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        super::gate::capture_ends();
        self.shared.capturing.store(false, Ordering::Release);
        self.current_op.set(None);
        // Buffers dropped inside the capture can be freed now.
        self.shared.release_parked();
        match ended {
            Ok(Some(graph)) => Ok(GpuGraph { graph }),
            Ok(None) => Err(GpuError::CaptureState(
                "end_capture: the driver returned no graph",
            )),
            Err(source @ DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)) => {
                Err(GpuError::CaptureInvalidated { source })
            }
            Err(source) => Err(GpuError::Driver {
                during: "end the capture and instantiate the graph",
                source,
            }),
        }
    }

    fn upload(&self, exec: &GpuGraph) -> Result<(), GpuError> {
        if self.shared.is_capturing() {
            return Err(GpuError::CaptureState("upload: a capture is open"));
        }
        exec.graph.upload().during("upload the graph")
    }

    fn launch(&self, exec: &GpuGraph) -> Result<(), GpuError> {
        if self.shared.is_capturing() {
            return Err(GpuError::CaptureState("launch: a capture is open"));
        }
        exec.graph.launch().during("launch the graph")
    }
}
