//! Context-owned scratch areas: grow-only, presized before capture, frozen after.
//!
//! Some work needs temporary device memory whose size depends on the shapes
//! of the step: cuBLAS's workspace, the reduction's per-block partials, bf16
//! staging. The context owns one area per name in
//! [`KNOWN_SCRATCH`](stepgraph_spec::KNOWN_SCRATCH), so a captured step never
//! allocates: the eager run before capture grows each area to what the step
//! needs, the capture records those addresses, and `set_scratch_frozen(true)`
//! turns any later growth (which would move the area under the graph) into a
//! typed error. The areas are listed through the same pointer snapshots as
//! step buffers, so a moved area is caught at replay.

use std::cell::{Cell, RefCell, RefMut};

use cudarc::driver::CudaViewMut;

use super::Gpu;
use super::buffer::{DeviceBuffer, Element};
use super::error::GpuError;
use crate::graph::{DevicePtr, TensorPath};

/// The cuBLAS workspace, bound to the handle with `cublasSetWorkspace`.
pub const GEMM_WORKSPACE: &str = "gemm_workspace";
/// Staging for bf16 copies of f32 tensors in the mixed-precision step.
pub const HALF_STAGING: &str = "half_staging";
/// Per-block partial sums of the deterministic reductions.
pub const REDUCE_PARTIALS: &str = "reduce_partials";

/// Alignment of every scratch size, so typed views of any element start aligned.
const ALIGN: usize = 256;

/// One named area.
#[derive(Debug)]
pub(crate) struct Area {
    pub(crate) name: &'static str,
    buf: RefCell<Option<DeviceBuffer<u8>>>,
}

/// All scratch areas of a context.
#[derive(Debug)]
pub(crate) struct ScratchSet {
    areas: Vec<Area>,
    frozen: Cell<bool>,
}

impl ScratchSet {
    pub(crate) fn new() -> Self {
        let areas = stepgraph_spec::KNOWN_SCRATCH
            .iter()
            .map(|name| Area {
                name,
                buf: RefCell::new(None),
            })
            .collect();
        Self {
            areas,
            frozen: Cell::new(false),
        }
    }

    pub(crate) fn area(&self, name: &str) -> Result<&Area, GpuError> {
        self.areas
            .iter()
            .find(|a| a.name == name)
            .ok_or_else(|| GpuError::UnknownScratch {
                name: name.to_owned(),
                known: stepgraph_spec::KNOWN_SCRATCH.join(", "),
            })
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.get()
    }

    pub(crate) fn set_frozen(&self, frozen: bool) {
        self.frozen.set(frozen);
    }
}

/// The size a growing area gets: at least `want`, at least double the old
/// size (so a slowly growing demand reallocates rarely), rounded to [`ALIGN`].
pub fn grown_size(have: usize, want: usize) -> usize {
    let target = want.max(have.saturating_mul(2));
    target.checked_next_multiple_of(ALIGN).unwrap_or(target)
}

/// A borrowed scratch area, viewed as `len` elements of `T`.
///
/// Held while a wrapper launches the kernel that uses it; a second borrow of
/// the same area meanwhile is [`GpuError::ScratchBusy`].
pub struct ScratchGuard<'a, T> {
    buf: RefMut<'a, Option<DeviceBuffer<u8>>>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Element> ScratchGuard<'_, T> {
    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the view's first element (for cuBLAS operands).
    pub(crate) fn device_addr(&self) -> Result<u64, GpuError> {
        self.buf
            .as_ref()
            .map(DeviceBuffer::device_addr)
            .ok_or(GpuError::CaptureState("scratch area not allocated"))
    }

    /// True when the area belongs to `gpu` (a guard of another context's
    /// area must not reach this context's kernels).
    pub(crate) fn belongs_to(&self, gpu: &Gpu) -> bool {
        self.buf.as_ref().is_some_and(|b| b.belongs_to(gpu))
    }

    /// The view, for a launch builder argument.
    pub(crate) fn view_mut(&mut self) -> Result<CudaViewMut<'_, T>, GpuError> {
        let len = self.len;
        let buf = self
            .buf
            .as_mut()
            .ok_or(GpuError::CaptureState("scratch area not allocated"))?;
        let slice = buf.slice_mut()?;
        // SAFETY: `scratch_view` grew the area to at least `len *
        // size_of::<T>()` bytes (and `transmute_mut` re-checks that, returning
        // None otherwise); the base address is a fresh allocation, aligned far
        // beyond any `Element`; and `Element` types accept any bit pattern.
        unsafe { slice.transmute_mut::<T>(len) }.ok_or(GpuError::BufferTooSmall {
            what: "scratch area",
            need: len,
            have: 0,
        })
    }
}

impl Gpu {
    /// Grows scratch area `name` to at least `bytes` (never shrinks it).
    ///
    /// Call before capture for areas whose size an eager run would not
    /// establish. Growth while frozen is [`GpuError::ScratchFrozen`]; while a
    /// capture is open it is a capture violation (it would allocate).
    pub fn presize_scratch(&self, name: &str, bytes: usize) -> Result<(), GpuError> {
        let area = self.scratch.area(name)?;
        let mut slot = area
            .buf
            .try_borrow_mut()
            .map_err(|_| GpuError::ScratchBusy {
                name: name.to_owned(),
            })?;
        let have = slot.as_ref().map_or(0, DeviceBuffer::len);
        if have >= bytes {
            return Ok(());
        }
        if self.scratch.is_frozen() {
            return Err(GpuError::ScratchFrozen {
                name: name.to_owned(),
                have,
                want: bytes,
            });
        }
        self.refuse_in_capture("grow a scratch area (allocate device memory)")?;
        let fresh = self.alloc::<u8>(grown_size(have, bytes))?;
        if area.name == GEMM_WORKSPACE {
            self.blas.bind_workspace(&fresh)?;
        }
        // The old allocation is freed stream-ordered after any queued work
        // that used it.
        *slot = Some(fresh);
        Ok(())
    }

    /// Replaces scratch area `name` with a fresh allocation of the same size
    /// (contents undefined), e.g. to hand memory back and forth with another
    /// user. The new address differs from the old one, so a graph captured
    /// before refuses to replay (`PointerMoved`). Refused while frozen
    /// ([`GpuError::ScratchFrozen`]) or capturing; a never-grown area stays
    /// empty.
    pub fn reallocate_scratch(&self, name: &str) -> Result<(), GpuError> {
        let area = self.scratch.area(name)?;
        let mut slot = area
            .buf
            .try_borrow_mut()
            .map_err(|_| GpuError::ScratchBusy {
                name: name.to_owned(),
            })?;
        let have = slot.as_ref().map_or(0, DeviceBuffer::len);
        if have == 0 {
            return Ok(());
        }
        if self.scratch.is_frozen() {
            return Err(GpuError::ScratchFrozen {
                name: name.to_owned(),
                have,
                want: have,
            });
        }
        self.refuse_in_capture("move a scratch area (allocate device memory)")?;
        // Allocated while the old area is alive, so the address must differ.
        let fresh = self.alloc::<u8>(have)?;
        if area.name == GEMM_WORKSPACE {
            self.blas.bind_workspace(&fresh)?;
        }
        *slot = Some(fresh);
        Ok(())
    }

    /// Current size of scratch area `name` in bytes (0 if never grown).
    pub fn scratch_bytes(&self, name: &str) -> Result<usize, GpuError> {
        let area = self.scratch.area(name)?;
        let slot = area.buf.try_borrow().map_err(|_| GpuError::ScratchBusy {
            name: name.to_owned(),
        })?;
        Ok(slot.as_ref().map_or(0, DeviceBuffer::len))
    }

    /// Borrows scratch area `name` as `len` elements of `T`, growing it first
    /// if allowed (see [`Gpu::presize_scratch`]).
    pub fn scratch_view<T: Element>(
        &self,
        name: &str,
        len: usize,
    ) -> Result<ScratchGuard<'_, T>, GpuError> {
        let bytes = super::error::checked_elems("scratch bytes", len, std::mem::size_of::<T>())?;
        self.presize_scratch(name, bytes)?;
        let area = self.scratch.area(name)?;
        let buf = area
            .buf
            .try_borrow_mut()
            .map_err(|_| GpuError::ScratchBusy {
                name: name.to_owned(),
            })?;
        Ok(ScratchGuard {
            buf,
            len,
            _t: std::marker::PhantomData,
        })
    }

    pub(crate) fn visit_scratch_area(
        &self,
        name: &str,
        path: &TensorPath<'_>,
        visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr),
    ) {
        let Ok(area) = self.scratch.area(name) else {
            return;
        };
        // A borrowed area is being used by a launch on this thread; snapshots
        // are taken between ops, so this only skips in misuse, and the
        // resulting tensor-count change is then reported by the guard.
        if let Ok(slot) = area.buf.try_borrow()
            && let Some(buf) = slot.as_ref()
        {
            visit(
                path,
                DevicePtr {
                    addr: buf.device_addr(),
                    bytes: buf.num_bytes(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_aligned_and_geometric() {
        assert_eq!(grown_size(0, 1), 256);
        assert_eq!(grown_size(0, 4096), 4096);
        assert_eq!(grown_size(4096, 4097), 8192);
        assert_eq!(grown_size(4096, 100_000), 100_096);
        assert_eq!(grown_size(usize::MAX, usize::MAX), usize::MAX);
    }

    #[test]
    fn every_known_scratch_name_has_an_area() {
        let set = ScratchSet::new();
        for name in stepgraph_spec::KNOWN_SCRATCH {
            assert!(set.area(name).is_ok(), "{name}");
        }
        for name in [GEMM_WORKSPACE, HALF_STAGING, REDUCE_PARTIALS] {
            assert!(stepgraph_spec::KNOWN_SCRATCH.contains(&name), "{name}");
        }
        let err = set.area("nope").unwrap_err();
        assert!(err.to_string().contains("no scratch area `nope`"), "{err}");
        assert!(err.to_string().contains("gemm_workspace"), "{err}");
    }
}
