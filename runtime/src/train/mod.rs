//! Training: data ([`data`]), the step engine seam ([`engine`]) and its CPU
//! and f32 GPU implementations ([`cpu`], [`gpu`]), the lr schedule ([`schedule`]), run checkpoints
//! ([`checkpoint`]), what the user sees ([`report`]) and the loop ([`run`]).
//!
//! `stepgraph train` is a thin shell over [`run::train`]: it turns flags into
//! [`run::TrainOptions`], picks an engine, and maps [`TrainError`] to exit
//! codes ([`TrainError::exit_code`]).

pub mod checkpoint;
pub mod cpu;
pub mod data;
pub mod engine;
pub mod gpu;
pub mod report;
pub mod run;
pub mod schedule;

use std::path::PathBuf;

use thiserror::Error;

pub use cpu::CpuEngine;
pub use engine::{
    EngineError, EngineInfo, EngineState, EvalOutput, Frozen, OptimSettings, StepMetrics,
    TrainEngine,
};
pub use gpu::{GpuBf16Engine, GpuEngine, GpuF32Engine, GraphStep};
pub use run::{Device, Precision, RunSummary, TrainOptions, train};
pub use schedule::LrSchedule;

use crate::mamba3::ConfigError;
use crate::mamba3::checkpoint::CheckpointError;

/// Why a training run could not start or continue. Each message is one line.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A flag value the run cannot use (a usage error: exit code 2).
    #[error("{flag}: {reason}")]
    InvalidOption {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `--device cuda`, and no GPU could be opened.
    #[error("--device cuda: no usable GPU ({}); use --device cpu", run::one_line(&.source.to_string()))]
    NoGpu {
        /// Why the GPU could not be opened.
        #[source]
        source: crate::device::GpuError,
    },
    /// `--precision bf16` on the CPU engine.
    #[error(
        "--precision bf16 needs a GPU engine; the CPU engine trains in f32 (use --precision f32)"
    )]
    Bf16NeedsGpu,
    /// The data file cannot be read.
    #[error("cannot read data file {}: {source}", path.display())]
    DataRead {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The data file is read but unusable.
    #[error("data file {}: {reason}", path.display())]
    DataInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A token id at or beyond the vocabulary.
    #[error(
        "data file {}: token {index} has id {token}, beyond the vocabulary (--vocab-size {vocab_size})",
        path.display()
    )]
    TokenOutOfRange {
        /// The file.
        path: PathBuf,
        /// Token index in the file.
        index: usize,
        /// The id.
        token: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// The model flags describe no valid model.
    #[error("model: {0}")]
    Config(#[from] ConfigError),
    /// A checkpoint could not be read or written.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A resumed checkpoint does not match this run.
    #[error(
        "checkpoint {} is from another configuration: {field} is {found} there, {expected} here",
        dir.display()
    )]
    ConfigMismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The differing setting.
        field: String,
        /// Its value in the checkpoint.
        found: String,
        /// Its value in this run.
        expected: String,
    },
    /// A checkpoint's training state is missing or malformed.
    #[error("checkpoint {}: {reason}", dir.display())]
    BadCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file of the run directory could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The engine failed.
    #[error("step: {0}")]
    Engine(#[from] EngineError),
}

impl TrainError {
    /// Process exit code: 2 for usage errors, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::InvalidOption { .. } => 2,
            _ => 1,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
