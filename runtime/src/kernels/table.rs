//! Loading the compiled modules and resolving every kernel up front.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::{HEADERS, MODULES};
use crate::device::GpuError;
use crate::device::error::During as _;
use crate::device::nvrtc::{self, CompileReport};

/// Every kernel of [`MODULES`], loaded into one context.
#[derive(Debug)]
pub(crate) struct KernelTable {
    funcs: Vec<(&'static str, CudaFunction)>,
    reports: Vec<CompileReport>,
}

impl KernelTable {
    /// Compiles (or reads from `cache`) and loads every module for `arch`.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        arch: &str,
        cache: Option<&Path>,
    ) -> Result<Self, crate::device::GpuError> {
        let mut funcs = Vec::new();
        let mut reports = Vec::new();
        for m in MODULES {
            let (cubin, report) = nvrtc::obtain_cubin(&m.source, HEADERS, arch, cache)?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .during("load a compiled kernel module")?;
            for name in m.functions {
                let f = module
                    .load_function(name)
                    .during("look up a kernel in its module")?;
                // SAFETY: `f` is a function handle of a module loaded just
                // above and kept alive by `f` itself; cuFuncLoad only forces
                // the lazy load that a first launch (maybe inside a capture)
                // would otherwise do.
                unsafe { cudarc::driver::sys::cuFuncLoad(f.cu_function()) }
                    .result()
                    .during("load a kernel before any capture (cuFuncLoad)")?;
                funcs.push((*name, f));
            }
            reports.push(report);
        }
        Ok(Self { funcs, reports })
    }

    /// The kernel called `name`.
    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f)
            .ok_or(GpuError::MissingKernel { name })
    }

    /// How each module was obtained.
    pub(crate) fn reports(&self) -> &[CompileReport] {
        &self.reports
    }
}
