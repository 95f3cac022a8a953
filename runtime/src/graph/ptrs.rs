//! Listing, snapshotting and verifying the device addresses of a buffer.
//!
//! A buffer handed to a captured step may be a single allocation or a tree of
//! them (all layers' weights, say). [`DevicePtrs`] walks that tree and reports
//! every allocation with a dotted path (`layers.3.in_proj`), so a guard failure
//! names the exact tensor that moved, not just the buffer.

use std::fmt;

use super::error::GraphError;

/// One allocation as a captured kernel sees it: its address and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevicePtr {
    /// Device address of the first byte.
    pub addr: u64,
    /// Size of the allocation (or view) in bytes.
    pub bytes: usize,
}

/// Where a tensor sits inside a buffer: a chain of field names and indices.
///
/// Built on the stack while walking a buffer, so listing pointers allocates
/// nothing; it is formatted only when a snapshot is taken or a guard fails.
#[derive(Clone, Copy, Debug)]
pub struct TensorPath<'a> {
    seg: Seg<'a>,
    parent: Option<&'a TensorPath<'a>>,
}

#[derive(Clone, Copy, Debug)]
enum Seg<'a> {
    Root,
    Field(&'a str),
    Index(usize),
}

impl<'a> TensorPath<'a> {
    /// The path of a buffer itself.
    pub const fn root() -> Self {
        Self {
            seg: Seg::Root,
            parent: None,
        }
    }

    /// The path of a named part of this one.
    pub fn field(&'a self, name: &'a str) -> TensorPath<'a> {
        TensorPath {
            seg: Seg::Field(name),
            parent: Some(self),
        }
    }

    /// The path of the `i`-th element of this one.
    pub fn index(&'a self, i: usize) -> TensorPath<'a> {
        TensorPath {
            seg: Seg::Index(i),
            parent: Some(self),
        }
    }

    /// True for the path of a whole buffer.
    pub fn is_root(&self) -> bool {
        matches!(self.seg, Seg::Root)
    }
}

impl fmt::Display for TensorPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent
            && !parent.is_root()
        {
            write!(f, "{parent}.")?;
        }
        match self.seg {
            Seg::Root => Ok(()),
            Seg::Field(name) => f.write_str(name),
            Seg::Index(i) => write!(f, "{i}"),
        }
    }
}

/// Lists every device allocation a value owns, in a fixed order.
///
/// Implement it for each type a step spec names as a buffer; the derive
/// `#[derive(DevicePtrs)]` implements it for structs whose fields do. The order
/// must depend only on the value's structure, never on addresses, because the
/// guards compare snapshots position by position.
pub trait DevicePtrs {
    /// Calls `visit` once per allocation with its path below `path`.
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr));
}

impl<T: DevicePtrs + ?Sized> DevicePtrs for &T {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        (**self).visit_ptrs(path, visit);
    }
}

impl<T: DevicePtrs + ?Sized> DevicePtrs for Box<T> {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        (**self).visit_ptrs(path, visit);
    }
}

impl<T: DevicePtrs> DevicePtrs for [T] {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        for (i, item) in self.iter().enumerate() {
            item.visit_ptrs(&path.index(i), visit);
        }
    }
}

impl<T: DevicePtrs> DevicePtrs for Vec<T> {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        self.as_slice().visit_ptrs(path, visit);
    }
}

impl<T: DevicePtrs, const N: usize> DevicePtrs for [T; N] {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        self.as_slice().visit_ptrs(path, visit);
    }
}

/// An absent optional tensor owns nothing; a present one is listed as itself.
/// Switching between the two changes the tensor count, which the guard refuses.
impl<T: DevicePtrs> DevicePtrs for Option<T> {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        if let Some(inner) = self {
            inner.visit_ptrs(path, visit);
        }
    }
}

/// One allocation recorded at capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRecord {
    /// Dotted path inside the buffer (empty for a single-allocation buffer).
    pub path: String,
    /// What the captured kernels were given.
    pub ptr: DevicePtr,
}

/// The addresses of every allocation in one buffer, as captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtrSnapshot {
    buffer: &'static str,
    tensors: Vec<TensorRecord>,
}

impl PtrSnapshot {
    /// Records every allocation `src` lists. Runs before a capture opens.
    pub fn take(buffer: &'static str, src: &dyn DevicePtrs) -> Self {
        let mut tensors = Vec::new();
        src.visit_ptrs(&TensorPath::root(), &mut |path, ptr| {
            tensors.push(TensorRecord {
                path: path.to_string(),
                ptr,
            });
        });
        Self { buffer, tensors }
    }

    /// The buffer this snapshot belongs to.
    pub fn buffer(&self) -> &'static str {
        self.buffer
    }

    /// The recorded allocations, in listing order.
    pub fn tensors(&self) -> &[TensorRecord] {
        &self.tensors
    }

    /// Compares the live allocations of `src` with the snapshot.
    ///
    /// Allocates nothing unless it fails, so it can run before every replay.
    /// A size change is reported before an address change: a new batch size
    /// usually means both, and the size is the more useful of the two.
    pub fn verify(&self, step: &'static str, src: &dyn DevicePtrs) -> Result<(), GraphError> {
        let mut seen = 0usize;
        let mut failure: Option<GraphError> = None;
        src.visit_ptrs(&TensorPath::root(), &mut |path, live| {
            if failure.is_some() {
                return;
            }
            match self.tensors.get(seen) {
                Some(rec) if rec.ptr.bytes != live.bytes => {
                    failure = Some(GraphError::ShapeChanged {
                        step,
                        buffer: self.buffer,
                        tensor: path.to_string(),
                        captured_bytes: rec.ptr.bytes,
                        live_bytes: live.bytes,
                    });
                }
                Some(rec) if rec.ptr.addr != live.addr => {
                    failure = Some(GraphError::PointerMoved {
                        step,
                        buffer: self.buffer,
                        tensor: path.to_string(),
                        captured: rec.ptr.addr,
                        live: live.addr,
                    });
                }
                Some(_) => {}
                None => {
                    failure = Some(GraphError::TensorSetChanged {
                        step,
                        buffer: self.buffer,
                        captured: self.tensors.len(),
                        live: seen + 1,
                    });
                }
            }
            seen += 1;
        });
        match failure {
            Some(e) => Err(e),
            None if seen != self.tensors.len() => Err(GraphError::TensorSetChanged {
                step,
                buffer: self.buffer,
                captured: self.tensors.len(),
                live: seen,
            }),
            None => Ok(()),
        }
    }
}
