//! stepgraph: whole Mamba-3 training steps captured into one CUDA graph.
//!
//! A step is declared once, as data, in a RON spec (`specs/*.ron`). The
//! [`TrainingGraph`] derive reads that spec at compile time and generates the
//! borrow structs, pointer snapshots and replay guards that hand-written
//! CUDA-graph trainers repeat and get wrong. This crate is the runtime those
//! generated items call into:
//!
//! The modules form layers, listed bottom to top; each uses only the layers
//! below it, modules on one layer never use each other (enforced by
//! `runtime/tests/architecture.rs`):
//!
//! 0. [`graph`]: what generated code targets: the backend trait, pointer
//!    snapshots, guards and their errors, the [`TrainingStep`](graph::TrainingStep)
//!    trait every derived step implements, the one [`Precision`] enum;
//!    [`float`]: the scalar trait host-side math is generic over;
//! 1. [`device`]: the CUDA context ([`device::Gpu`]): buffers, NVRTC,
//!    cuBLAS, scratch and the graph backend; it compiles whatever kernel
//!    modules it is handed and knows no kernel;
//! 2. [`kernels`]: the embedded CUDA kernels, their typed identities and
//!    launch wrappers (plain shapes, no model types); `Gpu::new`; a user's
//!    own kernels with typed handles ([`kernels::user`],
//!    `Gpu::with_user_kernels`);
//! 3. [`mamba3`]: the Mamba-3 SISO language model (CPU float64 oracle first,
//!    GPU forward/backward generic over the compute type); [`optim`]: AdamW
//!    with torch semantics over named tensors, knowing no model;
//! 4. [`step`]: the training step the specs describe, one struct for both
//!    precisions, joining model and optimizer;
//! 5. [`train`]: data, the step-engine seam, the CPU and GPU engines,
//!    checkpoints and the training loop behind `stepgraph train`;
//!    [`bench`](mod@bench): step time, tokens/s, MFU and cold start behind
//!    `stepgraph bench`;
//! 6. [`eval`]: a checkpoint's loss on a token set, behind `stepgraph eval`;
//!    [`repro`]: a paper's table in one command (`stepgraph repro
//!    state-tracking`: many training runs at once, the table, plots).
//!
//! The `stepgraph` binary wraps all of it: `train`, `eval`, `bench`, `check`,
//! `repro`. A training step of your own (its spec, struct, ops and kernels)
//! needs only the public API: see the README's "Your own step" and
//! `runtime/examples/mlp`.

// The derive emits `::stepgraph::...` paths; this lets the crate use its own derive.
extern crate self as stepgraph;

pub mod bench;
pub mod device;
pub mod eval;
pub mod float;
pub mod graph;
pub mod kernels;
pub mod mamba3;
pub mod optim;
pub mod repro;
pub mod step;
pub mod train;

pub use graph::Precision;
pub use stepgraph_macros::{DevicePtrs, TrainingGraph};
