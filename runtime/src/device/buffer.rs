//! Device buffers, pinned host buffers, and the copy wrappers that guard them.
//!
//! Every call here that a graph capture forbids (allocating, copying to or from
//! the host, synchronizing) first asks the context whether a capture is open
//! and returns a [`CaptureViolation`] instead of calling the driver, so the
//! capture survives and the op that did it is named.
//!
//! A [`DeviceBuffer`] dropped while a capture is open does not free its memory
//! there (a free inside a capture would be recorded into the graph, or
//! invalidate it); the allocation is parked and freed when the capture ends.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    CudaEvent, CudaSlice, DevicePtr as _, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

use super::Gpu;
use super::error::{During as _, GpuError};
use crate::graph::{CaptureViolation, DevicePtr, DevicePtrs, TensorPath};

mod sealed {
    pub trait Sealed {}
}

/// Element types a buffer may hold: plain data for which every bit pattern is
/// a valid value, so uninitialised device memory is never undefined behaviour
/// when read back.
pub trait Element:
    DeviceRepr
    + ValidAsZeroBits
    + bytemuck::Pod
    + Default
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
    + sealed::Sealed
{
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}
element!(f32, f64, i32, u32, i64, u64, u8, half::bf16, half::f16);

/// State shared by a context and every buffer it allocated.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// True between `begin_capture` and `end_capture`.
    pub(crate) capturing: AtomicBool,
    /// Allocations dropped during a capture, freed when it ends.
    parked: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl Shared {
    pub(crate) fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    fn park(&self, what: Box<dyn Any + Send>) {
        self.parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// Frees what was parked; call only with no capture open.
    pub(crate) fn release_parked(&self) {
        let parked =
            std::mem::take(&mut *self.parked.lock().unwrap_or_else(PoisonError::into_inner));
        drop(parked);
    }
}

/// A typed device allocation owned by one [`Gpu`].
///
/// It lists itself through [`DevicePtrs`] as a single allocation, so a step
/// buffer of this type is guarded by the generated replay checks.
#[derive(Debug)]
pub struct DeviceBuffer<T: Element> {
    // `None` only transiently inside `Drop`.
    slice: Option<CudaSlice<T>>,
    addr: u64,
    len: usize,
    shared: Arc<Shared>,
}

impl<T: Element> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len.saturating_mul(std::mem::size_of::<T>())
    }

    /// The device address of the first element (what a captured kernel sees).
    pub fn device_addr(&self) -> u64 {
        self.addr
    }

    pub(crate) fn belongs_to(&self, gpu: &Gpu) -> bool {
        Arc::ptr_eq(&self.shared, &gpu.shared)
    }

    /// The underlying slice, for launch wrappers.
    pub(crate) fn slice(&self) -> Result<&CudaSlice<T>, GpuError> {
        self.slice
            .as_ref()
            .ok_or(GpuError::CaptureState("buffer already released"))
    }

    /// The underlying slice, mutably, for launch wrappers.
    pub(crate) fn slice_mut(&mut self) -> Result<&mut CudaSlice<T>, GpuError> {
        self.slice
            .as_mut()
            .ok_or(GpuError::CaptureState("buffer already released"))
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take()
            && self.shared.is_capturing()
        {
            self.shared.park(Box::new(slice));
        }
    }
}

impl<T: Element> DevicePtrs for DeviceBuffer<T> {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        visit(
            path,
            DevicePtr {
                addr: self.addr,
                bytes: self.num_bytes(),
            },
        );
    }
}

/// Page-locked host memory for fast, asynchronous uploads and downloads.
///
/// Host access waits for the last copy that used the buffer, so the host never
/// reads a download that has not landed or overwrites data still being
/// uploaded.
#[derive(Debug)]
pub struct PinnedBuffer<T: Element> {
    // Holds at least one element even when `len` is 0.
    host: PinnedHostSlice<T>,
    len: usize,
    // Recorded after each copy; cudarc's own event on the slice is only
    // recorded with event tracking on, which the runtime turns off.
    done: CudaEvent,
}

impl<T: Element> PinnedBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents, after the last copy involving them has finished.
    pub fn as_slice(&self) -> Result<&[T], GpuError> {
        self.done
            .synchronize()
            .during("wait for a pinned-buffer copy")?;
        let all = self.host.as_slice().during("read a pinned buffer")?;
        Ok(all.get(..self.len).unwrap_or(all))
    }

    /// The contents, mutably, after the last copy involving them has finished.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T], GpuError> {
        self.done
            .synchronize()
            .during("wait for a pinned-buffer copy")?;
        let len = self.len;
        let all = self.host.as_mut_slice().during("write a pinned buffer")?;
        let all_len = all.len();
        all.get_mut(..len).ok_or(GpuError::BufferTooSmall {
            what: "pinned buffer",
            need: len,
            have: all_len,
        })
    }
}

impl Gpu {
    /// Refuses `action` while a capture is open, naming the running op.
    pub(crate) fn refuse_in_capture(&self, action: &'static str) -> Result<(), GpuError> {
        if self.shared.is_capturing() {
            return Err(CaptureViolation {
                op: self.current_op.get(),
                action,
            }
            .into());
        }
        Ok(())
    }

    pub(crate) fn check_owned<T: Element>(
        &self,
        what: &'static str,
        buf: &DeviceBuffer<T>,
    ) -> Result<(), GpuError> {
        if buf.belongs_to(self) {
            Ok(())
        } else {
            Err(GpuError::ForeignBuffer { what })
        }
    }

    fn wrap<T: Element>(&self, slice: CudaSlice<T>, len: usize) -> DeviceBuffer<T> {
        // With event tracking off (the context turns it off before any
        // allocation) this reads the address and records nothing.
        let addr = slice.device_ptr(&self.stream).0;
        DeviceBuffer {
            slice: Some(slice),
            addr,
            len,
            shared: self.shared.clone(),
        }
    }

    /// Allocates `len` elements, uninitialised (any bit pattern is a valid
    /// `T`). Stream-ordered on the capture stream. Refused during capture.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        self.refuse_in_capture("allocate device memory")?;
        // cudarc multiplies unchecked; a zero-byte allocation is an error in
        // the driver, so an empty buffer still owns one element.
        super::error::checked_elems("device buffer bytes", len.max(1), std::mem::size_of::<T>())?;
        // SAFETY: the memory is uninitialised, which `Element` makes harmless:
        // every bit pattern is a valid `T`. The byte count was checked above.
        let slice =
            unsafe { self.stream.alloc::<T>(len.max(1)) }.during("allocate device memory")?;
        Ok(self.wrap(slice, len))
    }

    /// Allocates `len` zeroed elements. Refused during capture.
    pub fn alloc_zeros<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        let mut buf = self.alloc::<T>(len)?;
        self.zero(&mut buf)?;
        Ok(buf)
    }

    /// Allocates a buffer holding a copy of `src`. Refused during capture.
    pub fn to_device<T: Element>(&self, src: &[T]) -> Result<DeviceBuffer<T>, GpuError> {
        let mut buf = self.alloc::<T>(src.len())?;
        self.copy_from_host(src, &mut buf)?;
        Ok(buf)
    }

    /// Copies `src` into `dst` (same length). `src` may be reused as soon as
    /// this returns. Refused during capture.
    pub fn copy_from_host<T: Element>(
        &self,
        src: &[T],
        dst: &mut DeviceBuffer<T>,
    ) -> Result<(), GpuError> {
        self.refuse_in_capture("copy from the host to the device")?;
        self.check_owned("destination", dst)?;
        if src.len() != dst.len() {
            return Err(GpuError::LengthMismatch {
                what: "host-to-device copy",
                expected: dst.len(),
                actual: src.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(src, dst.slice_mut()?)
            .during("copy from the host to the device")
    }

    /// Copies `src` to a new host vector, waiting for it. Refused during capture.
    pub fn to_host<T: Element>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>, GpuError> {
        let mut out = vec![T::default(); src.len()];
        self.copy_to_host(src, &mut out)?;
        Ok(out)
    }

    /// Copies `src` into `dst` (same length), waiting for it. Refused during capture.
    pub fn copy_to_host<T: Element>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut [T],
    ) -> Result<(), GpuError> {
        self.refuse_in_capture("copy from the device to the host")?;
        self.check_owned("source", src)?;
        if src.len() != dst.len() {
            return Err(GpuError::LengthMismatch {
                what: "device-to-host copy",
                expected: src.len(),
                actual: dst.len(),
            });
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_dtoh(src.slice()?, dst)
            .during("copy from the device to the host")?;
        self.stream
            .synchronize()
            .during("wait for a device-to-host copy")
    }

    /// Copies `src` into `dst` on the device (same length). Allowed during
    /// capture: it becomes a memcpy node.
    pub fn copy_device<T: Element>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<(), GpuError> {
        self.check_owned("source", src)?;
        self.check_owned("destination", dst)?;
        if src.len() != dst.len() {
            return Err(GpuError::LengthMismatch {
                what: "device-to-device copy",
                expected: dst.len(),
                actual: src.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_dtod(src.slice()?, dst.slice_mut()?)
            .during("copy between device buffers")
    }

    /// Sets every byte of `dst` to zero. Allowed during capture (a memset node).
    pub fn zero<T: Element>(&self, dst: &mut DeviceBuffer<T>) -> Result<(), GpuError> {
        self.check_owned("destination", dst)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.stream
            .memset_zeros(dst.slice_mut()?)
            .during("zero a device buffer")
    }

    /// Allocates `len` zeroed elements of page-locked host memory. Refused
    /// during capture.
    pub fn alloc_pinned<T: Element>(&self, len: usize) -> Result<PinnedBuffer<T>, GpuError> {
        self.refuse_in_capture("allocate pinned host memory")?;
        // cudarc asserts on the byte count; check first so bad input is an error.
        let bytes = super::error::checked_elems(
            "pinned buffer bytes",
            len.max(1),
            std::mem::size_of::<T>(),
        )?;
        if isize::try_from(bytes).is_err() {
            return Err(GpuError::SizeOverflow {
                what: "pinned buffer bytes",
                value: u128::try_from(bytes).unwrap_or(u128::MAX),
                target: "isize",
            });
        }
        // Flags 0: plain page-locked memory. cudarc's default adds
        // write-combining, which makes host reads of downloads very slow.
        // SAFETY: the memory is uninitialised until the `fill` below, and
        // nothing reads it before; `Element` types accept any bits anyway.
        let host = unsafe { self.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }
            .during("allocate pinned host memory")?;
        let done = self
            .ctx
            .new_event(None)
            .during("create a pinned-buffer event")?;
        // A zero-byte pinned allocation is not portable, so an empty buffer
        // still owns one element.
        let mut buf = PinnedBuffer { host, len, done };
        buf.host
            .as_mut_slice()
            .during("write a pinned buffer")?
            .fill(T::default());
        Ok(buf)
    }

    /// Starts copying the first `dst.len()` elements of `src` (which may be
    /// longer, a reusable staging buffer) into `dst`; host writes to `src`
    /// wait until the copy is done. Refused during capture.
    pub fn copy_from_pinned<T: Element>(
        &self,
        src: &PinnedBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<(), GpuError> {
        self.refuse_in_capture("copy from the host to the device")?;
        self.check_owned("destination", dst)?;
        if src.len() < dst.len() {
            return Err(GpuError::BufferTooSmall {
                what: "pinned source",
                need: dst.len(),
                have: src.len(),
            });
        }
        if dst.is_empty() {
            return Ok(());
        }
        let host = src.as_slice()?;
        let head = host.get(..dst.len()).ok_or(GpuError::BufferTooSmall {
            what: "pinned source",
            need: dst.len(),
            have: host.len(),
        })?;
        // A plain slice into pinned memory: the driver sees page-locked
        // memory and copies asynchronously, and `done` keeps host writers out.
        self.stream
            .memcpy_htod(head, dst.slice_mut()?)
            .during("copy from the host to the device")?;
        src.done
            .record(&self.stream)
            .during("record a pinned-buffer event")
    }

    /// Starts copying `src` into the first `src.len()` elements of `dst`
    /// (which may be longer); host reads of `dst` wait until the copy is
    /// done. Refused during capture.
    pub fn copy_to_pinned<T: Element>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut PinnedBuffer<T>,
    ) -> Result<(), GpuError> {
        self.refuse_in_capture("copy from the device to the host")?;
        self.check_owned("source", src)?;
        if dst.len() < src.len() {
            return Err(GpuError::BufferTooSmall {
                what: "pinned destination",
                need: src.len(),
                have: dst.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        let len = src.len();
        let host = dst.as_mut_slice()?;
        let head = host.get_mut(..len).ok_or(GpuError::BufferTooSmall {
            what: "pinned destination",
            need: len,
            have: 0,
        })?;
        self.stream
            .memcpy_dtoh(src.slice()?, head)
            .during("copy from the device to the host")?;
        dst.done
            .record(&self.stream)
            .during("record a pinned-buffer event")
    }

    /// Waits for all work queued on the capture stream. Refused during capture.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.refuse_in_capture("synchronize")?;
        self.stream
            .synchronize()
            .during("synchronize the capture stream")
    }
}
