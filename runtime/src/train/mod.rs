//! Training: what a run is ([`config`]) and how much memory it needs
//! ([`memory`]), data ([`data`]), the step engine seam ([`engine`]) and its
//! CPU and GPU implementations ([`cpu`], [`gpu`]), what a state-tracking
//! model learned about its own decay and rotation ([`dynamics`]), edits of
//! the weights at a chosen step ([`edit`]), the lr schedule
//! ([`schedule`]), run directories ([`rundir`]) and checkpoints
//! ([`checkpoint`]), stopping on a signal ([`stop`]), what the user sees
//! ([`report`], [`plot`]) and the loop ([`run`]).
//!
//! `stepgraph train` is a thin shell over [`run::train`]: it turns flags into
//! [`run::TrainOptions`], installs the signal handler, and maps
//! [`TrainError`] to exit codes ([`TrainError::exit_code`]).

pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod data;
pub mod dynamics;
pub mod edit;
pub mod ema;
pub mod engine;
pub mod gpu;
pub mod memory;
pub mod plot;
pub mod report;
pub mod run;
pub mod rundir;
pub mod schedule;
pub mod stop;

use std::path::PathBuf;

use thiserror::Error;

pub use config::{
    DEFAULT_ADAM_EPS, DEFAULT_BETA2, DEFAULT_CHUNK_SIZE, Decay, Device, DtInit, ModelSize,
    Rotation, RunConfig, Setting,
};
pub use cpu::CpuEngine;
pub use engine::{
    EngineError, EngineInfo, EngineState, EvalOutput, Frozen, OptimSettings, StepMetrics,
    TrainEngine,
};
pub use gpu::{GpuBf16Engine, GpuEngine, GpuF32Engine};
pub use run::{Resume, RunStatus, RunSummary, TrainOptions, train};
pub use schedule::LrSchedule;
pub use stop::{SignalAction, Stop};

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
    /// `--precision f64` (a hand-edited run file: the flag refuses it).
    #[error(
        "--precision f64 is the CPU reference's (stepgraph eval); training computes in f32 or bf16"
    )]
    F64NotTrained,
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
    /// The run would not fit in memory (a usage error: exit code 2).
    #[error(
        "memory: this run needs about {need} ({parts}), {place} has {have} available; \
         lower {flags}"
    )]
    TooBig {
        /// The flags that size the biggest part.
        flags: &'static str,
        /// The estimate.
        need: String,
        /// The estimate by part.
        parts: String,
        /// What is available.
        have: String,
        /// `the host` or the GPU's name.
        place: String,
    },
    /// `--run-dir` names a directory that is not empty (exit code 2).
    #[error(
        "--run-dir {}: {}",
        dir.display(),
        if *holds_run {
            format!(
                "already holds a run; continue it with `stepgraph train --resume {}`, \
                 or choose another --run-dir",
                dir.display()
            )
        } else {
            "exists and is not empty; choose another --run-dir".to_owned()
        }
    )]
    RunDirTaken {
        /// The directory.
        dir: PathBuf,
        /// Whether it holds a run (checkpoints or metrics).
        holds_run: bool,
    },
    /// Another process trains in this run directory.
    #[error(
        "run {} is in use by another stepgraph process{}; wait for it or stop it first",
        dir.display(),
        pid.map_or_else(String::new, |p| format!(" (pid {p})"))
    )]
    RunInUse {
        /// The run directory.
        dir: PathBuf,
        /// The process holding it, as its lock file says.
        pid: Option<u32>,
    },
    /// A flag given with `--resume` would change the run (exit code 2).
    #[error(
        "{flag}: the run being resumed has `{saved}`, this command says `{given}`; a resumed run \
         keeps its settings (leave {flag} out, or start a new run to change it)"
    )]
    ResumeChange {
        /// The flag.
        flag: &'static str,
        /// Its value in the run, as flags.
        saved: String,
        /// The value given.
        given: String,
    },
    /// The run's data file is not the one it trained on.
    #[error(
        "data file {}: changed since the run started ({reason}); a resumed run needs the same data",
        path.display()
    )]
    DataChanged {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
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
    /// An `--init-from` model is not the model the flags describe (exit
    /// code 2).
    #[error(
        "--init-from {}: {field} is {found} there, {expected} in the model the flags describe",
        dir.display()
    )]
    InitMismatch {
        /// The model directory.
        dir: PathBuf,
        /// The differing setting of its `config.json`.
        field: String,
        /// Its value there.
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
    /// The plot could not be drawn.
    #[error("{}: {source}", path.display())]
    Plot {
        /// The plot file.
        path: PathBuf,
        /// What plotters reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The engine failed.
    #[error("step: {0}")]
    Engine(#[from] EngineError),
}

impl TrainError {
    /// Process exit code: 2 for usage errors (a flag the run cannot use),
    /// 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::InvalidOption { .. }
            | Self::TooBig { .. }
            | Self::RunDirTaken { .. }
            | Self::ResumeChange { .. }
            | Self::InitMismatch { .. } => 2,
            _ => 1,
        }
    }

    /// Whether this is a usage error (exit code 2).
    pub fn is_usage(&self) -> bool {
        self.exit_code() == 2
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
