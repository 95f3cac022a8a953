//! `stepgraph bench`: how fast a training step runs, measured.
//!
//! For each configuration ([`BenchConfig`]: the S, M, L or any
//! `d_model/n_layer/d_state/headdim/batch/seq_len`), in one process:
//!
//! * the full LM step (tokens in, loss out, AdamW) and the backbone-only
//!   step ([`backbone`]: random activations in, random upstream gradient, no
//!   embedding, head or loss), each eagerly and as a replayed CUDA graph,
//!   median of `steps` CUDA-event timings after warm-up;
//! * tokens/s, model FLOPs per token ([`flops`], exact from the config) and
//!   achieved TFLOP/s and MFU against the device's bf16 GEMM ceiling, which
//!   the same run measures ([`timing::bf16_ceiling`]);
//! * a per-family breakdown of eager time ([`layer`]: every launch of the
//!   step between CUDA events) and the device memory the step holds.
//!
//! [`cold`] measures the first training step of a fresh process, with an
//! empty and with a warm kernel cache.
//!
//! Each precision is one [`StepBench`] function; [`runner_for`] is the one
//! match that picks it, so the bf16 step plugs in as one arm.

pub mod backbone;
pub mod cold;
pub mod config;
pub mod flops;
pub mod layer;
pub mod measure;
pub mod report;
pub mod timing;

pub use config::{BenchConfig, DEFAULT_VOCAB, PRESETS};
pub use flops::{StepFlops, step_flops};
pub use report::{BenchReport, ConfigOutcome, ConfigReport};

use std::path::PathBuf;

use thiserror::Error;

use crate::Precision;
use crate::device::{Gpu, GpuError};
use crate::graph::GraphError;
use crate::mamba3::gpu::Mamba3GpuError;

/// What the bench can fail with.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A `--config` entry that names no preset and is no valid shape.
    #[error("config `{text}`: {reason}")]
    Config {
        /// The entry as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A device call failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A model op failed.
    #[error(transparent)]
    Model(#[from] Mamba3GpuError),
    /// Building or running a training step failed.
    #[error(transparent)]
    Step(#[from] crate::step::StepError),
    /// Capture or replay failed.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The cold start needs this executable's path to start children.
    #[error("cold start: cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// The cold-start child process could not be started.
    #[error("cold start: cannot run {}: {source}", exe.display())]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The cold-start child process failed; `last` is its last stderr line.
    #[error("cold start: child exited with {status}: {last}")]
    Child {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its last line on stderr.
        last: String,
    },
    /// The cold-start child printed no readable report.
    #[error("cold start: unreadable child report ({source}): {line}")]
    ChildReport {
        /// The line that should have been the JSON report.
        line: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The first step of a fresh process gave a non-finite loss.
    #[error("cold start: first step loss is {0}")]
    FirstStepLoss(f32),
    /// A file or directory the bench writes could not be.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`write`, `create`, `clear`).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The report could not be serialized.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A bench option is out of range or missing.
    #[error("{0}")]
    Option(&'static str),
    /// A configuration failed while the others ran (its error is in the report).
    #[error("config {name} failed: {error}")]
    ConfigFailed {
        /// The configuration.
        name: String,
        /// Its error, as reported.
        error: String,
    },
}

/// How the bench runs.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Configurations, in order.
    pub configs: Vec<BenchConfig>,
    /// Step precision.
    pub precision: Precision,
    /// Vocabulary of the full LM step.
    pub vocab: usize,
    /// Timed steps per mode (eager, graph), after warm-up.
    pub steps: usize,
    /// Untimed steps before each timed series.
    pub warmup: usize,
    /// Timed passes of the per-op breakdown.
    pub breakdown_reps: usize,
    /// Seconds one configuration may take; a larger one is skipped.
    pub budget_s: f64,
    /// Free-memory fraction a configuration may plan to use.
    pub memory_fraction: f64,
    /// Size of the square bf16 GEMM that measures the ceiling.
    pub ceiling_n: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            configs: PRESETS
                .iter()
                .filter_map(|(n, _)| BenchConfig::parse(n).ok())
                .collect(),
            precision: Precision::F32,
            vocab: DEFAULT_VOCAB,
            steps: 50,
            warmup: 5,
            breakdown_reps: 5,
            budget_s: 150.0,
            memory_fraction: 0.92,
            ceiling_n: 8192,
        }
    }
}

/// Benchmarks one configuration at one precision.
pub type StepBench =
    fn(&Gpu, &BenchConfig, &BenchOptions, &timing::Ceiling) -> Result<ConfigOutcome, BenchError>;

/// The bench function of a precision: one arm per step precision.
pub fn runner_for(precision: Precision) -> Result<StepBench, BenchError> {
    match precision {
        Precision::F32 => Ok(measure::bench_f32),
        Precision::Bf16 => Ok(measure::bench_bf16),
        Precision::F64 => Err(BenchError::Option(
            "--precision f64: the GPU steps compute in f32 or bf16",
        )),
    }
}

/// Runs the bench on GPU 0 and returns the report. The precision is checked
/// before the GPU is touched.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let bench = runner_for(opts.precision)?;
    if opts.steps == 0 || opts.configs.is_empty() {
        return Err(BenchError::Option(
            "need at least one config and --steps >= 1",
        ));
    }
    let gpu = Gpu::new(0)?;
    run_on(&gpu, opts, bench)
}

/// [`run`] on an existing context.
pub fn run_on(gpu: &Gpu, opts: &BenchOptions, bench: StepBench) -> Result<BenchReport, BenchError> {
    let ceiling = timing::bf16_ceiling(gpu, opts.ceiling_n, 20)?;
    let mut configs = Vec::with_capacity(opts.configs.len());
    for cfg in &opts.configs {
        let outcome = match bench(gpu, cfg, opts, &ceiling) {
            Ok(o) => o,
            // One configuration's error is reported beside the others'
            // numbers instead of discarding them; the CLI still exits 1.
            Err(e) => ConfigOutcome::Failed(report::Failed {
                name: cfg.name.clone(),
                shape: report::Shape::of(cfg, opts.vocab),
                error: e.to_string().lines().next().unwrap_or("failed").to_owned(),
            }),
        };
        // A failed configuration's graphs are dropped by now too; thaw the
        // scratch its capture may have frozen (see `measure::bench_with`).
        crate::graph::Backend::set_scratch_frozen(gpu, false);
        configs.push(outcome);
    }
    Ok(BenchReport::new(gpu, opts, ceiling, configs))
}
