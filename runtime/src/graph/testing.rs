//! Host-side stand-ins for a GPU: a fake backend and fake buffers.
//!
//! The tests that `#[derive(TrainingGraph)]` generates run in every `cargo
//! test`, on machines without a GPU. They drive the generated capture and
//! replay code through [`FakeBackend`], which records what would have been
//! launched, and they move pointers in [`FakePtrs`] buffers to prove that every
//! guard fires. Step specs can also name `FakeBackend` as their context to run
//! whole steps on the host.

use std::cell::{Cell, RefCell};

use super::backend::Backend;
use super::error::CaptureViolation;
use super::ptrs::{DevicePtr, DevicePtrs, TensorPath};

/// Errors of the fake backend.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// `begin_capture` while a capture was already open.
    #[error("a capture is already open")]
    AlreadyCapturing,
    /// `end_capture` with no capture open.
    #[error("no capture is open")]
    NotCapturing,
    /// An op tried to grow a frozen scratch area.
    #[error("scratch `{name}` is frozen at {have} bytes; {want} requested")]
    ScratchFrozen {
        /// Scratch name.
        name: String,
        /// Current size.
        have: usize,
        /// Requested size.
        want: usize,
    },
    /// An op broke a capture rule.
    #[error(transparent)]
    Violation(#[from] CaptureViolation),
}

impl super::OpError for FakeError {
    fn capture_violation(&self) -> Option<&CaptureViolation> {
        match self {
            FakeError::Violation(v) => Some(v),
            _ => None,
        }
    }
}

/// A recorded graph: the ops captured into it, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeExec {
    /// Events recorded between begin and end of the capture.
    pub events: Vec<String>,
}

/// A backend that captures "graphs" as lists of events and counts launches.
#[derive(Debug, Default)]
pub struct FakeBackend {
    capturing: Cell<bool>,
    current_op: Cell<Option<&'static str>>,
    frozen: Cell<bool>,
    scratch: RefCell<Vec<(String, usize, u64)>>,
    recorded: RefCell<Vec<String>>,
    launches: Cell<u64>,
    uploads: Cell<u64>,
    next_addr: Cell<u64>,
}

impl FakeBackend {
    /// A backend with no scratch areas.
    pub fn new() -> Self {
        Self {
            next_addr: Cell::new(0x7000_0000_0000),
            ..Self::default()
        }
    }

    /// A backend with the given scratch areas, each `bytes` large.
    pub fn with_scratch(names: &[&str], bytes: usize) -> Self {
        let b = Self::new();
        for name in names {
            let addr = b.fresh_addr(bytes);
            b.scratch
                .borrow_mut()
                .push(((*name).to_owned(), bytes, addr));
        }
        b
    }

    fn fresh_addr(&self, bytes: usize) -> u64 {
        let addr = self.next_addr.get();
        let step = u64::try_from(bytes.max(1).next_multiple_of(256)).unwrap_or(u64::MAX);
        self.next_addr.set(addr.saturating_add(step));
        addr
    }

    /// Records an event: into the open capture, or as executed eagerly.
    pub fn record(&self, event: impl Into<String>) {
        self.recorded.borrow_mut().push(event.into());
    }

    /// Events recorded outside any capture, and clears them.
    pub fn take_eager_events(&self) -> Vec<String> {
        std::mem::take(&mut self.recorded.borrow_mut())
    }

    /// A stand-in for a device allocation: refused while capturing, like the
    /// CUDA context's own wrapper.
    pub fn alloc(&self, bytes: usize) -> Result<u64, FakeError> {
        if self.capturing.get() {
            return Err(CaptureViolation {
                op: self.current_op.get(),
                action: "allocate device memory",
            }
            .into());
        }
        Ok(self.fresh_addr(bytes))
    }

    /// Asks scratch `name` for at least `bytes`: grows it (moving it) unless
    /// frozen, in which case growth is an error.
    pub fn scratch(&self, name: &str, bytes: usize) -> Result<u64, FakeError> {
        let mut areas = self.scratch.borrow_mut();
        let Some(area) = areas.iter_mut().find(|a| a.0 == name) else {
            return Err(FakeError::ScratchFrozen {
                name: name.to_owned(),
                have: 0,
                want: bytes,
            });
        };
        if area.1 >= bytes {
            return Ok(area.2);
        }
        if self.frozen.get() || self.capturing.get() {
            return Err(FakeError::ScratchFrozen {
                name: name.to_owned(),
                have: area.1,
                want: bytes,
            });
        }
        area.1 = bytes;
        area.2 = self.fresh_addr(bytes);
        Ok(area.2)
    }

    /// Moves scratch `name` to a new address, as a regrowth would.
    pub fn move_scratch(&self, name: &str) {
        let bytes = self
            .scratch
            .borrow()
            .iter()
            .find(|a| a.0 == name)
            .map(|a| a.1);
        if let Some(bytes) = bytes {
            let addr = self.fresh_addr(bytes);
            if let Some(area) = self.scratch.borrow_mut().iter_mut().find(|a| a.0 == name) {
                area.2 = addr;
            }
        }
    }

    /// Graph launches so far.
    pub fn launches(&self) -> u64 {
        self.launches.get()
    }

    /// Graph uploads so far.
    pub fn uploads(&self) -> u64 {
        self.uploads.get()
    }

    /// True while a capture is open.
    pub fn is_capturing(&self) -> bool {
        self.capturing.get()
    }

    /// The op the generated code says is running.
    pub fn current_op(&self) -> Option<&'static str> {
        self.current_op.get()
    }
}

impl Backend for FakeBackend {
    type Exec = FakeExec;
    type Error = FakeError;

    fn has_scratch(&self, name: &str) -> bool {
        self.scratch.borrow().iter().any(|a| a.0 == name)
    }

    fn visit_scratch(
        &self,
        name: &str,
        path: &TensorPath<'_>,
        visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr),
    ) {
        let found = self
            .scratch
            .borrow()
            .iter()
            .find(|a| a.0 == name)
            .map(|a| (a.1, a.2));
        if let Some((bytes, addr)) = found {
            visit(path, DevicePtr { addr, bytes });
        }
    }

    fn set_scratch_frozen(&self, frozen: bool) {
        self.frozen.set(frozen);
    }

    fn enter_op(&self, op: Option<&'static str>) {
        self.current_op.set(op);
    }

    fn begin_capture(&self) -> Result<(), FakeError> {
        if self.capturing.replace(true) {
            return Err(FakeError::AlreadyCapturing);
        }
        self.recorded.borrow_mut().clear();
        Ok(())
    }

    fn end_capture(&self) -> Result<FakeExec, FakeError> {
        if !self.capturing.replace(false) {
            return Err(FakeError::NotCapturing);
        }
        Ok(FakeExec {
            events: std::mem::take(&mut self.recorded.borrow_mut()),
        })
    }

    fn upload(&self, _exec: &FakeExec) -> Result<(), FakeError> {
        self.uploads.set(self.uploads.get() + 1);
        Ok(())
    }

    fn launch(&self, _exec: &FakeExec) -> Result<(), FakeError> {
        self.launches.set(self.launches.get() + 1);
        Ok(())
    }
}

/// A buffer of fake allocations with chosen paths and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakePtrs {
    tensors: Vec<(String, DevicePtr)>,
}

impl FakePtrs {
    /// `count` allocations of 1 KiB each, named `t0`, `t1`, ... (a single
    /// allocation is unnamed, like a plain device buffer), at addresses
    /// derived from `seed` so no two fake buffers overlap.
    pub fn new(seed: usize, count: usize) -> Self {
        let seed = u64::try_from(seed).unwrap_or(u64::MAX);
        let base = 0x1000_0000_0000u64.wrapping_add(seed.wrapping_mul(0x10_0000));
        let tensors = (0..count)
            .map(|i| {
                let name = if count == 1 {
                    String::new()
                } else {
                    format!("t{i}")
                };
                let offset = u64::try_from(i).unwrap_or(0).wrapping_mul(0x1000);
                (
                    name,
                    DevicePtr {
                        addr: base.wrapping_add(offset),
                        bytes: 1024,
                    },
                )
            })
            .collect();
        Self { tensors }
    }

    /// Number of allocations.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the buffer holds no allocation.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The path a guard reports for allocation `i`.
    pub fn path(&self, i: usize) -> &str {
        self.tensors.get(i).map_or("", |t| t.0.as_str())
    }

    /// Moves allocation `i` to a new address, as a reallocation would.
    pub fn move_tensor(&mut self, i: usize) {
        if let Some(t) = self.tensors.get_mut(i) {
            t.1.addr = t.1.addr.wrapping_add(0x8_0000);
        }
    }

    /// Resizes allocation `i`, as a new batch size would.
    pub fn resize_tensor(&mut self, i: usize, bytes: usize) {
        if let Some(t) = self.tensors.get_mut(i) {
            t.1.bytes = bytes;
        }
    }

    /// Adds one allocation, as a structural change would.
    pub fn push_tensor(&mut self) {
        let last = self.tensors.last().map_or(0, |t| t.1.addr);
        let name = format!("t{}", self.tensors.len());
        self.tensors.push((
            name,
            DevicePtr {
                addr: last.wrapping_add(0x1000),
                bytes: 1024,
            },
        ));
    }
}

impl DevicePtrs for FakePtrs {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        for (name, ptr) in &self.tensors {
            if name.is_empty() {
                visit(path, *ptr);
            } else {
                visit(&path.field(name), *ptr);
            }
        }
    }
}
