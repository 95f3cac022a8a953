//! Loading compiled modules and resolving every function up front.
//!
//! The device layer knows no kernel: the layer above hands
//! [`Gpu::open`](super::Gpu::open) its [`Modules`] (the `.cu` sources, the
//! headers they include, and the functions each defines), and launch
//! wrappers look functions up by name. User modules, brought at run time,
//! are loaded beside them ([`super::user_modules`]).

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::GpuError;
use super::error::During as _;
use super::nvrtc::{self, CompileReport, SourceFile};
use super::user_modules::{UserModules, UserTable, force_load};

/// One `.cu` file and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// The source file.
    pub source: SourceFile,
    /// The `extern "C"` kernels it defines, all loaded at start-up.
    pub functions: &'static [&'static str],
}

/// What a context compiles and loads at start-up.
#[derive(Clone, Copy, Debug)]
pub struct Modules {
    /// Headers the `.cu` files may `#include "..."`; served to NVRTC from memory.
    pub headers: &'static [SourceFile],
    /// Every module, each with the functions to load from it.
    pub modules: &'static [Module],
}

/// Every function of a [`Modules`], loaded into one context.
#[derive(Debug)]
pub(crate) struct FunctionTable {
    funcs: Vec<(&'static str, CudaFunction)>,
    user: UserTable,
    reports: Vec<CompileReport>,
}

impl FunctionTable {
    /// Compiles (or reads from `cache`) and loads every module for `arch`,
    /// then the `user` modules (which may include `set`'s headers).
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        set: &Modules,
        user: &UserModules,
        arch: &str,
        cache: Option<&Path>,
    ) -> Result<Self, GpuError> {
        let mut funcs = Vec::new();
        let mut reports = Vec::new();
        for m in set.modules {
            let (cubin, report) = nvrtc::obtain_cubin(&m.source, set.headers, arch, cache)?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .during("load a compiled kernel module")?;
            for name in m.functions {
                let f = module
                    .load_function(name)
                    .during("look up a kernel in its module")?;
                force_load(&f)?;
                funcs.push((*name, f));
            }
            reports.push(report);
        }
        let user = UserTable::load(ctx, user, set.headers, arch, cache, &mut reports)?;
        Ok(Self {
            funcs,
            user,
            reports,
        })
    }

    /// The kernel called `name`.
    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f)
            .ok_or(GpuError::MissingKernel { name })
    }

    /// The user kernel declared `index`-th in user set `set`.
    pub(crate) fn user(
        &self,
        set: u64,
        index: usize,
        name: &str,
    ) -> Result<&CudaFunction, GpuError> {
        self.user.get(set, index, name)
    }

    /// How each module was obtained.
    pub(crate) fn reports(&self) -> &[CompileReport] {
        &self.reports
    }
}
