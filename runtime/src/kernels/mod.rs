//! The CUDA kernels: embedded sources, the loaded kernel table, and one typed
//! launch wrapper per kernel.
//!
//! The `.cu` files live in the workspace's top-level `kernels/` folder and are
//! embedded here with `include_str!`; [`Gpu::new`](crate::device::Gpu::new)
//! (defined in this layer, which alone knows the kernels) opens a context
//! that compiles them with NVRTC for the device's own architecture (cached on
//! disk, see [`device::nvrtc`](crate::device::nvrtc)), loads every function
//! listed in [`MODULES`] and forces each to load (`cuFuncLoad`) before
//! anything can be captured, so no kernel is loaded lazily inside a capture;
//! then every generic kernel runs once.
//!
//! The wrappers are the only place that pushes kernel arguments: each names
//! its kernel by a [`Kernel`] value, takes typed buffers and plain shapes
//! ([`mamba3::Mamba3Shape`], never a model type), checks lengths and that
//! every size fits the kernel's `unsigned` parameter (`u32::try_from`), and
//! launches on the context's capture stream. They are plain functions `fn(&Gpu, ...) -> Result<(),
//! GpuError>`, so a step spec can name them (or functions built from them) as
//! ops directly.
//!
//! # Adding a kernel
//!
//! 1. Write it in `kernels/<family>.cu` as `extern "C" __global__`, element
//!    count last as `unsigned n`, looping with `SG_FOR_EACH` from
//!    `common.cuh` (a grid-stride loop with a 64-bit index), which also holds
//!    the helpers every family shares (warp and block sums, pi); the Mamba-3
//!    files' own helpers are in `mamba3_common.cuh`.
//! 2. List its name in that file's entry of [`MODULES`] (add an entry, with
//!    `include_str!`, for a new file; a new shared header goes in [`HEADERS`]),
//!    and add its [`Kernel`] variant (a unit test holds the two to the same
//!    names).
//! 3. Write its wrapper next to the others: check lengths, convert sizes with
//!    [`to_u32`](crate::device::to_u32), build the config with
//!    [`launch::grid`], push arguments in the kernel's order, and launch
//!    inside an `unsafe` block whose `// SAFETY:` names the lengths checked.
//! 4. Test it against a host computation in `runtime/tests/gpu_kernels.rs`.
//!
//! # Your own kernels
//!
//! Kernels outside this crate do not go in [`MODULES`]: [`user`] declares
//! them at run time (a source string or file, its entry points, each with
//! its parameter list as a type, [`user_params`]) and
//! [`Gpu::with_user_kernels`](crate::device::Gpu::with_user_kernels) opens
//! a context that compiles, caches and loads them through the same path,
//! handing back typed [`UserKernel`](user::UserKernel) handles.

mod context;
pub mod elementwise;
mod id;
pub mod launch;
pub mod mamba3;
pub mod mamba3_bwd;
pub mod mamba3_chunk;
mod mamba3_shape;
pub mod optim;
pub mod precision;
pub mod reduce;
pub mod train;
pub mod user;
pub mod user_params;

pub use context::KERNELS;
pub use elementwise::{add_one, axpy, bf16_to_f32, f32_to_bf16, fill, mul, silu};
pub use id::Kernel;
pub use reduce::{sum_squares, sum_squares_blocks};

pub use crate::device::Module;
use crate::device::nvrtc::SourceFile;

/// Headers the `.cu` files may `#include "..."`; served to NVRTC from memory.
pub const HEADERS: &[SourceFile] = &[
    SourceFile {
        file: "common.cuh",
        src: include_str!("../../../kernels/common.cuh"),
    },
    SourceFile {
        file: "mamba3_common.cuh",
        src: include_str!("../../../kernels/mamba3_common.cuh"),
    },
];

/// Every kernel module the runtime compiles and loads.
pub const MODULES: &[Module] = &[
    Module {
        source: SourceFile {
            file: "elementwise.cu",
            src: include_str!("../../../kernels/elementwise.cu"),
        },
        functions: &["fill_f32", "axpy_f32", "mul_f32", "silu_f32", "add_one_f32"],
    },
    Module {
        source: SourceFile {
            file: "reduce.cu",
            src: include_str!("../../../kernels/reduce.cu"),
        },
        functions: &["sumsq_partials_f32", "sum_partials_f32"],
    },
    Module {
        source: SourceFile {
            file: "convert.cu",
            src: include_str!("../../../kernels/convert.cu"),
        },
        functions: &["f32_to_bf16", "bf16_to_f32"],
    },
    Module {
        source: SourceFile {
            file: "mamba3_fwd.cu",
            src: include_str!("../../../kernels/mamba3_fwd.cu"),
        },
        functions: &[
            "m3_embed_fwd_f32",
            "m3_rmsnorm_fwd_f32",
            "m3_prep_f32",
            "m3_angle_fwd_f32",
            "m3_angle_fwd_serial_f32",
            "m3_angle_fixed_f32",
            "m3_qk_fwd_f32",
            "m3_qk_fwd_bf16qk",
            "m3_qk_fwd_vec_f32",
            "m3_qk_fwd_vec_bf16qk",
            "m3_gate_fwd_f32",
            "m3_rmsnorm_fwd_bf16",
            "m3_gate_fwd_bf16",
            "m3_ce_fwd_f32",
            "m3_mean_f32",
        ],
    },
    Module {
        source: SourceFile {
            file: "mamba3_scan.cu",
            src: include_str!("../../../kernels/mamba3_scan.cu"),
        },
        functions: &[
            "m3_scan_fwd_f32",
            "m3_scan_fwd_bf16qk",
            "m3_scan_bwd_f32",
            "m3_scan_bwd_bf16qk",
        ],
    },
    Module {
        source: SourceFile {
            file: "mamba3_warpscan.cu",
            src: include_str!("../../../kernels/mamba3_warpscan.cu"),
        },
        functions: &[
            "m3_wscan_fwd_f32",
            "m3_wscan_fwd_bf16qk",
            "m3_wscan_bwd_f32",
            "m3_wscan_bwd_bf16qk",
        ],
    },
    Module {
        source: SourceFile {
            file: "mamba3_chunk.cu",
            src: include_str!("../../../kernels/mamba3_chunk.cu"),
        },
        functions: &[
            "m3c_chunk_state",
            "m3c_state_pass",
            "m3c_states",
            "m3c_states_wide",
            "m3c_scan_out",
            "m3c_scan_bwd",
        ],
    },
    Module {
        source: SourceFile {
            file: "mamba3_bwd.cu",
            src: include_str!("../../../kernels/mamba3_bwd.cu"),
        },
        functions: &[
            "m3_ce_bwd_f32",
            "m3_rmsnorm_bwd_f32",
            "m3_gate_bwd_f32",
            "m3_rot_bcnorm_bwd_f32",
            "m3_rot_bcnorm_bwd_tiled_f32",
            "m3_angle_bwd_f32",
            "m3_angle_bwd_serial_f32",
            "m3_scalar_bwd_f32",
            "m3_dtheta_bwd_f32",
            "m3_colsum_partials_f32",
            "m3_colsum_partials_f32x4",
            "m3_colsum_finish_f32",
            "m3_embed_bwd_f32",
        ],
    },
    Module {
        source: SourceFile {
            file: "mamba3_adamw.cu",
            src: include_str!("../../../kernels/mamba3_adamw.cu"),
        },
        functions: &["m3_advance_schedule"],
    },
    Module {
        source: SourceFile {
            file: "optim.cu",
            src: include_str!("../../../kernels/optim.cu"),
        },
        functions: &["mt_sumsq_partials", "mt_adamw"],
    },
    Module {
        source: SourceFile {
            file: "train.cu",
            src: include_str!("../../../kernels/train.cu"),
        },
        functions: &[
            "tr_weighted_loss_f32",
            "tr_mask_rows_f32",
            "tr_zero_range_f32",
            "tr_schedule",
            "tr_argmax_f32",
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_its_file() {
        for m in MODULES {
            for f in m.functions {
                assert!(
                    m.source.src.contains(&format!("{f}(")),
                    "{f} not defined in kernels/{}",
                    m.source.file
                );
                assert!(m.source.src.contains("extern \"C\""), "{}", m.source.file);
            }
        }
    }

    #[test]
    fn kernel_names_are_unique() {
        let mut names: Vec<&str> = MODULES
            .iter()
            .flat_map(|m| m.functions.iter().copied())
            .collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total);
    }

    /// The source of header `file` (empty when there is none).
    fn header(file: &str) -> &'static str {
        HEADERS
            .iter()
            .find(|h| h.file == file)
            .map(|h| h.src)
            .unwrap_or_default()
    }

    #[test]
    fn block_sizes_match_the_headers() {
        assert!(
            header("common.cuh").contains(&format!("#define SG_BLOCK {}", launch::BLOCK)),
            "SG_BLOCK != launch::BLOCK"
        );
        assert!(
            header("mamba3_common.cuh").contains(&format!(
                "#define M3_ANGLE_THREADS {}",
                super::mamba3::ANGLE_THREADS
            )),
            "M3_ANGLE_THREADS != mamba3::ANGLE_THREADS"
        );
        let bwd = MODULES
            .iter()
            .find(|m| m.source.file == "mamba3_bwd.cu")
            .map(|m| m.source.src)
            .unwrap_or_default();
        assert!(
            bwd.contains(&format!(
                "#define M3_RBT_ROWS {}",
                super::mamba3_bwd::RBT_ROWS
            )),
            "M3_RBT_ROWS != mamba3_bwd::RBT_ROWS"
        );
    }
}
