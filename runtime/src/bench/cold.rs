//! The first training step of a fresh process, kernel compilation included:
//! once with an empty kernel cache (`STEPGRAPH_CACHE` pointing at a new
//! directory) and once more with the cache the first run filled.
//!
//! Each run is a child process (`stepgraph bench --first-step`), so the
//! times include everything a user waits for: process start, CUDA driver
//! initialisation, NVRTC compilation or cache reads, the weights, the first
//! eager step and the graph capture. The child reports its phases as one
//! JSON line; the parent adds the wall time it saw.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::device::nvrtc::{CACHE_ENV, CacheOutcome};
use crate::device::{Gpu, GpuOptions};
use crate::graph::{ShapeKey, TrainingStep};
use crate::mamba3::cpu;
use crate::mamba3::gpu::{Mamba3GpuError, ModelCompute};
use crate::optim::{AdamWConfig, DecayPolicy};
use crate::step::Mamba3Step;
use crate::{Precision, mamba3::Mamba3Config};

use super::{BenchConfig, BenchError};

/// Phases of one first step, measured inside the process (milliseconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FirstStep {
    /// The step's precision.
    pub precision: Precision,
    /// `Gpu::new`: driver, context, kernels (compiled or read), cuBLAS, warm-up.
    pub gpu_init_ms: f64,
    /// Kernel modules compiled (cache misses).
    pub modules_compiled: usize,
    /// Kernel modules read from the cache.
    pub modules_cached: usize,
    /// Time spent obtaining kernel modules (part of `gpu_init_ms`).
    pub kernels_ms: f64,
    /// Official-init weights on the host and every step buffer on the device.
    pub build_ms: f64,
    /// The first eager step, up to its loss on the host.
    pub first_step_ms: f64,
    /// Capturing the graph and its first replay.
    pub capture_ms: f64,
    /// From entering the bench to the end of the first replay.
    pub total_ms: f64,
}

/// One child run: what it reported and the wall time the parent saw.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChildRun {
    /// Process start to exit, as the parent timed it.
    pub wall_ms: f64,
    /// The child's own phases.
    pub phases: FirstStep,
}

/// Cold and warm first steps of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ColdStart {
    /// Configuration name.
    pub config: String,
    /// Empty kernel cache.
    pub cold: ChildRun,
    /// The cache the cold run filled.
    pub warm: ChildRun,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Runs the first step in this process (the child side of [`cold_start`]).
pub fn first_step(
    cfg: &BenchConfig,
    vocab: usize,
    precision: Precision,
) -> Result<FirstStep, BenchError> {
    let t0 = Instant::now();
    let gpu = Gpu::with_options(GpuOptions::default())?;
    let gpu_init_ms = ms_since(t0);
    let reports = gpu.compile_reports();
    let modules_cached = reports
        .iter()
        .filter(|r| r.outcome == CacheOutcome::Hit)
        .count();
    let kernels_ms = reports.iter().map(|r| r.millis).sum();

    let t1 = Instant::now();
    let model = cfg.model(vocab);
    let weights = cpu::Weights::<f32>::init(&model, 1).map_err(Mamba3GpuError::from)?;
    let vocab_i = i32::try_from(model.vocab_size).unwrap_or(i32::MAX);
    let ids: Vec<i32> = (0..cfg.batch * (cfg.seq_len + 1))
        .map(|i| i32::try_from(i % 251).unwrap_or(0) % vocab_i)
        .collect();
    let key = ShapeKey {
        batch: cfg.batch,
        seq_len: cfg.seq_len,
    };
    let built = (t1, &model, &weights, ids.as_slice(), key);
    let (build_ms, first_step_ms, capture_ms) = match precision {
        Precision::F32 => phases::<f32>(&gpu, built)?,
        Precision::Bf16 => phases::<half::bf16>(&gpu, built)?,
        Precision::F64 => {
            return Err(BenchError::Option(
                "--precision f64: the GPU steps compute in f32 or bf16",
            ));
        }
    };
    Ok(FirstStep {
        precision,
        gpu_init_ms,
        modules_compiled: reports.len() - modules_cached,
        modules_cached,
        kernels_ms,
        build_ms,
        first_step_ms,
        capture_ms,
        total_ms: ms_since(t0),
    })
}

/// What [`phases`] builds a step from: the start of the build, the model,
/// its weights, the token window and the capture's shape.
type Build<'a> = (
    Instant,
    &'a Mamba3Config,
    &'a cpu::Weights<f32>,
    &'a [i32],
    ShapeKey,
);

/// Builds the step at compute type `P` and times its phases: the build
/// (from `t1`, after a synchronize), the first eager step up to its loss on
/// the host, and the capture with its first replay. A non-finite first loss
/// is an error.
fn phases<P: ModelCompute>(
    gpu: &Gpu,
    (t1, model, weights, ids, key): Build<'_>,
) -> Result<(f64, f64, f64), BenchError>
where
    Mamba3Step<P>: TrainingStep<Context = Gpu>,
{
    let (adamw, policy) = (AdamWConfig::default(), DecayPolicy::default());
    let mut step =
        Mamba3Step::<P>::new(gpu, model, weights, &adamw, &policy, key.batch, key.seq_len)?;
    step.set_tokens(gpu, ids)?;
    gpu.synchronize()?;
    let build_ms = ms_since(t1);
    let t2 = Instant::now();
    step.run_eager(gpu)?;
    let loss = step.loss(gpu)?;
    let first_step_ms = ms_since(t2);
    if !loss.is_finite() {
        return Err(BenchError::FirstStepLoss(loss));
    }
    let t3 = Instant::now();
    let graph = step.capture(gpu, key)?;
    step.replay(gpu, &graph)?;
    gpu.synchronize()?;
    Ok((build_ms, first_step_ms, ms_since(t3)))
}

fn child(
    exe: &Path,
    cache: &Path,
    config: &str,
    precision: Precision,
) -> Result<ChildRun, BenchError> {
    let t = Instant::now();
    let out = Command::new(exe)
        .args(["bench", "--first-step", "--config", config])
        .args(["--precision", precision.name()])
        .env(CACHE_ENV, cache)
        .output()
        .map_err(|source| BenchError::Spawn {
            exe: exe.to_owned(),
            source,
        })?;
    let wall_ms = ms_since(t);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(BenchError::Child {
            status: out.status,
            last: err.lines().last().unwrap_or("").to_owned(),
        });
    }
    let line = stdout.lines().rfind(|l| l.starts_with('{')).unwrap_or("");
    let phases: FirstStep =
        serde_json::from_str(line).map_err(|source| BenchError::ChildReport {
            line: line.to_owned(),
            source,
        })?;
    Ok(ChildRun { wall_ms, phases })
}

/// A fresh cache directory under the system temp dir.
fn fresh_cache_dir() -> Result<PathBuf, BenchError> {
    let dir = std::env::temp_dir().join(format!("stepgraph-cold-start-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|source| BenchError::Io {
            action: "clear",
            path: dir.clone(),
            source,
        })?;
    }
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        action: "create",
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Runs `exe bench --first-step` twice for `config`: with an empty kernel
/// cache, then with the one it filled. The cache is removed afterwards.
pub fn cold_start(exe: &Path, config: &str, precision: Precision) -> Result<ColdStart, BenchError> {
    let dir = fresh_cache_dir()?;
    let run = || child(exe, &dir, config, precision);
    let runs = run().and_then(|cold| Ok((cold, run()?)));
    // Best effort: a leftover temp directory is harmless.
    let _ = std::fs::remove_dir_all(&dir);
    let (cold, warm) = runs?;
    Ok(ColdStart {
        config: config.to_owned(),
        cold,
        warm,
    })
}

impl ColdStart {
    /// The terminal table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "first training step of a fresh process, config {} ({}):",
            self.config,
            self.cold.phases.precision.name()
        );
        let _ = writeln!(
            s,
            "{:<12} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>10}",
            "kernel cache",
            "wall s",
            "gpu init",
            "kernels",
            "build",
            "1st step",
            "capture",
            "compiled"
        );
        for (label, r) in [("empty", &self.cold), ("warm", &self.warm)] {
            let p = &r.phases;
            let _ = writeln!(
                s,
                "{:<12} {:>9.2} {:>9.2}s {:>8.2}s {:>8.2}s {:>9.3}s {:>8.3}s {:>5}/{}",
                label,
                r.wall_ms / 1e3,
                p.gpu_init_ms / 1e3,
                p.kernels_ms / 1e3,
                p.build_ms / 1e3,
                p.first_step_ms / 1e3,
                p.capture_ms / 1e3,
                p.modules_compiled,
                p.modules_compiled + p.modules_cached
            );
        }
        s
    }
}
