//! Kernel modules a user brings at run time: compiled and cached by the same
//! NVRTC path as the crate's own, loaded and forced to load (`cuFuncLoad`)
//! when the context opens, so no user kernel loads lazily inside a capture.
//!
//! The typed side (handles, parameter lists, launches) is the kernels
//! layer's `kernels::user`; this module only sees names and the byte size of
//! each declared parameter. It checks those sizes against the parameter
//! layout the driver reads from the compiled code (`cuFuncGetParamInfo`), so
//! a handle whose parameter list does not match its kernel never launches:
//! the driver would copy the wrong number of bytes into the kernel's
//! parameter space.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::error::{During as _, GpuError};
use super::nvrtc::{self, CompileReport, Source, SourceFile, SourceText};

/// One kernel a user module declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserFunction {
    /// Its `extern "C"` name.
    pub(crate) name: String,
    /// The byte size of each parameter its handle passes, in order.
    pub(crate) param_bytes: Vec<usize>,
}

/// One user `.cu` source and the kernels declared from it.
#[derive(Clone, Debug)]
pub(crate) struct UserModule {
    pub(crate) source: SourceText,
    pub(crate) functions: Vec<UserFunction>,
}

/// Every user module of one context, with the headers they may include.
#[derive(Clone, Debug, Default)]
pub(crate) struct UserModules {
    /// Identifies the set, so a handle declared for another set is refused.
    pub(crate) set: u64,
    pub(crate) headers: Vec<SourceText>,
    pub(crate) modules: Vec<UserModule>,
}

impl UserModules {
    /// Refuses empty names and a kernel, module or header named twice:
    /// errors and reports name kernels and modules, so each must be one
    /// thing, and NVRTC finds a header by its name.
    pub(crate) fn check(&self) -> Result<(), GpuError> {
        let mut seen_modules = std::collections::BTreeSet::new();
        let mut seen_kernels = std::collections::BTreeSet::new();
        let mut seen_headers = std::collections::BTreeSet::new();
        for h in &self.headers {
            if h.file.is_empty() {
                return Err(bad("empty header name", &h.label));
            }
            if !seen_headers.insert(h.file.as_str()) {
                return Err(bad("header declared twice", &h.file));
            }
        }
        for m in &self.modules {
            if m.source.file.is_empty() {
                return Err(bad("empty module name", &m.source.label));
            }
            if !seen_modules.insert(m.source.label.as_str()) {
                return Err(bad("module declared twice", &m.source.label));
            }
            for f in &m.functions {
                if f.name.is_empty() {
                    return Err(bad("empty kernel name in module", &m.source.file));
                }
                if !seen_kernels.insert(f.name.as_str()) {
                    return Err(bad("kernel declared twice", &f.name));
                }
            }
        }
        Ok(())
    }
}

fn bad(problem: &'static str, name: &str) -> GpuError {
    GpuError::UserKernelSet {
        problem,
        name: name.to_owned(),
    }
}

/// The loaded user kernels of one context, in declaration order.
#[derive(Debug, Default)]
pub(crate) struct UserTable {
    /// The set they came from; `None` when the context has no user kernels.
    set: Option<u64>,
    funcs: Vec<CudaFunction>,
}

impl UserTable {
    /// Compiles (or reads from `cache`) and loads every user module for
    /// `arch`; each may include the crate's `builtin` headers and the set's
    /// own. Every declared kernel is looked up, force-loaded and its
    /// parameter layout checked.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        user: &UserModules,
        builtin: &[SourceFile],
        arch: &str,
        cache: Option<&Path>,
        reports: &mut Vec<CompileReport>,
    ) -> Result<Self, GpuError> {
        if user.modules.is_empty() {
            return Ok(Self::default());
        }
        user.check()?;
        if let Some(h) = user
            .headers
            .iter()
            .find(|h| builtin.iter().any(|b| b.file == h.file))
        {
            return Err(bad("header name taken by a built-in header", &h.file));
        }
        let headers: Vec<&dyn Source> = builtin
            .iter()
            .map(|h| h as &dyn Source)
            .chain(user.headers.iter().map(|h| h as &dyn Source))
            .collect();
        let mut funcs = Vec::new();
        for m in &user.modules {
            let (cubin, report) = nvrtc::obtain_cubin(&m.source, &headers, arch, cache)?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .during("load a compiled user kernel module")?;
            for decl in &m.functions {
                let f =
                    module
                        .load_function(&decl.name)
                        .map_err(|_| GpuError::UserKernelNotFound {
                            module: m.source.label.clone(),
                            kernel: decl.name.clone(),
                        })?;
                force_load(&f)?;
                let found = param_bytes(&f)?;
                if found != decl.param_bytes {
                    return Err(GpuError::KernelSignature {
                        kernel: decl.name.clone(),
                        declared: decl.param_bytes.clone(),
                        found,
                    });
                }
                funcs.push(f);
            }
            reports.push(report);
        }
        Ok(Self {
            set: Some(user.set),
            funcs,
        })
    }

    /// The kernel declared `index`-th in set `set`.
    pub(crate) fn get(
        &self,
        set: u64,
        index: usize,
        name: &str,
    ) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .get(index)
            .filter(|_| self.set == Some(set))
            .ok_or_else(|| GpuError::ForeignKernel {
                kernel: name.to_owned(),
            })
    }
}

/// Forces the lazy load a first launch (maybe inside a capture) would do.
pub(crate) fn force_load(f: &CudaFunction) -> Result<(), GpuError> {
    // SAFETY: `f` is a function handle of a module loaded by this context
    // and kept alive by `f` itself; cuFuncLoad only loads its code.
    unsafe { cudarc::driver::sys::cuFuncLoad(f.cu_function()) }
        .result()
        .during("load a kernel before any capture (cuFuncLoad)")
}

/// Most parameters a kernel may have: 32764 bytes of parameters (CUDA 12.1
/// and later), one byte each; only a bound on the loop below.
const MAX_PARAMS: usize = 32_764;

/// The byte size of each parameter of `f`, in order, as the driver reads it
/// from the compiled code.
fn param_bytes(f: &CudaFunction) -> Result<Vec<usize>, GpuError> {
    let mut sizes = Vec::new();
    for index in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `f` is a loaded function (force_load ran first) kept alive
        // by the borrow; both out-pointers are live stack integers. An index
        // past the last parameter is CUDA_ERROR_INVALID_VALUE, which ends the
        // list (the documented way to count parameters before CUDA 13.2's
        // cuFuncGetParamCount).
        let r = unsafe {
            cudarc::driver::sys::cuFuncGetParamInfo(
                f.cu_function(),
                index,
                &raw mut offset,
                &raw mut size,
            )
        };
        match r {
            CUresult::CUDA_SUCCESS => sizes.push(size),
            CUresult::CUDA_ERROR_INVALID_VALUE => break,
            other => {
                return Err(GpuError::Driver {
                    during: "read a kernel's parameter layout (cuFuncGetParamInfo)",
                    source: cudarc::driver::DriverError(other),
                });
            }
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(file: &str, kernels: &[&str]) -> UserModule {
        UserModule {
            source: SourceText {
                file: file.to_owned(),
                src: String::new(),
                label: file.to_owned(),
            },
            functions: kernels
                .iter()
                .map(|k| UserFunction {
                    name: (*k).to_owned(),
                    param_bytes: vec![8],
                })
                .collect(),
        }
    }

    #[test]
    fn a_set_refuses_duplicates_and_empty_names() {
        let ok = UserModules {
            set: 1,
            headers: Vec::new(),
            modules: vec![module("a.cu", &["f", "g"]), module("b.cu", &["h"])],
        };
        assert!(ok.check().is_ok());
        for (modules, problem, name) in [
            (
                vec![module("a.cu", &["f"]), module("b.cu", &["f"])],
                "kernel declared twice",
                "f",
            ),
            (
                vec![module("a.cu", &["f"]), module("a.cu", &["g"])],
                "module declared twice",
                "a.cu",
            ),
            (
                vec![module("a.cu", &[""])],
                "empty kernel name in module",
                "a.cu",
            ),
            (vec![module("", &["f"])], "empty module name", ""),
        ] {
            let set = UserModules {
                set: 1,
                headers: Vec::new(),
                modules,
            };
            match set.check() {
                Err(GpuError::UserKernelSet {
                    problem: p,
                    name: n,
                }) => {
                    assert_eq!((p, n.as_str()), (problem, name));
                }
                other => panic!("expected {problem}, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_context_without_user_kernels_refuses_every_handle() {
        let table = UserTable::default();
        let err = table.get(1, 0, "bias_relu").unwrap_err();
        assert!(err.to_string().contains("`bias_relu`"), "{err}");
    }
}
