//! stepgraph: whole Mamba-3 training steps captured into one CUDA graph.
//!
//! A step is declared once, as data, in a RON spec (`specs/*.ron`). The
//! [`TrainingGraph`] derive reads that spec at compile time and generates the
//! borrow structs, pointer snapshots and replay guards that hand-written
//! CUDA-graph trainers repeat and get wrong. This crate is the runtime those
//! generated items call into:
//!
//! * [`graph`]: the backend trait, pointer snapshots, guards and their errors,
//!   the [`TrainingStep`](graph::TrainingStep) trait and the one
//!   [`Precision`] enum;
//! * [`float`]: the scalar trait host-side math is generic over;
//! * [`device`]: the CUDA context ([`device::Gpu`]): buffers, NVRTC, cuBLAS,
//!   scratch, and the graph backend;
//! * [`kernels`]: the embedded CUDA kernels and their typed launch wrappers;
//! * [`mamba3`]: the Mamba-3 SISO language model (CPU float64 oracle first);
//! * [`optim`]: AdamW with torch semantics;
//! * [`step`]: the training step the specs describe, one struct for both
//!   precisions, joining model and optimizer;
//! * [`train`]: data, the step-engine seam, the CPU engine, checkpoints and
//!   the training loop behind `stepgraph train`;
//! * [`bench`]: step time, tokens/s, MFU and cold start behind `stepgraph bench`;
//! * [`eval`]: a checkpoint's loss on a token set, behind `stepgraph eval`.
//!
//! The `stepgraph` binary wraps all of it: `train`, `eval`, `bench`, `check`.

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
pub mod step;
pub mod train;

pub use graph::Precision;
pub use stepgraph_macros::{DevicePtrs, TrainingGraph};
