//! `stepgraph eval`: mean next-token cross-entropy of a checkpoint on a token
//! file, on the CPU reference model (or, with `--device cuda`, the GPU model
//! in f32, or in bf16 mixed precision with `--precision bf16`), optionally
//! with the gradient of that loss for every parameter.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::checkpoint::{self, CheckpointError};
use stepgraph::mamba3::cpu::{
    Float, ModelError, ScanMode, TokenError, Tokens, forward, try_backward,
};
use stepgraph::mamba3::gpu::{self as gpu_model, Mamba3GpuError, StepWeights};

/// Arguments of `stepgraph eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (`config.json` + `model.safetensors`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Safetensors file with one integer tensor `tokens` of shape [B, T+1].
    #[arg(long)]
    tokens: PathBuf,
    /// Precision: f64 or f32 on the CPU; on the GPU f32 (also for f64) or
    /// bf16 mixed precision (f32 masters, bf16 GEMMs, f32 scan and norms).
    #[arg(long, value_enum, default_value_t = EvalPrecision::F64)]
    precision: EvalPrecision,
    /// Where to compute: the CPU reference, or the f32 model on GPU 0.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Also write d(mean loss)/d(parameter) for every parameter here
    /// (safetensors, official parameter names).
    #[arg(long)]
    grads_out: Option<PathBuf>,
}

/// Floating-point precision of the CPU model.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Precision {
    /// float64: the reference.
    F64,
    /// float32.
    F32,
}

/// What `eval` computes in: a [`Precision`] of the CPU model, or bf16 mixed
/// precision on the GPU.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum EvalPrecision {
    /// float64 (on the GPU: f32).
    F64,
    /// float32.
    F32,
    /// bf16 mixed precision (`--device cuda` only).
    Bf16,
}

/// Where `eval` computes.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Device {
    /// The CPU reference model, in `--precision`.
    Cpu,
    /// The f32 GPU model (`mamba3::gpu`), on GPU 0.
    Cuda,
}

/// Everything that can stop an evaluation.
#[derive(Debug, thiserror::Error)]
enum EvalError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{}: {source}", path.display())]
    Tokens { path: PathBuf, source: TokenError },
    #[error(transparent)]
    Gpu(#[from] Mamba3GpuError),
    #[error("--precision bf16 needs --device cuda (the CPU model computes in f64 or f32)")]
    Bf16OnCpu,
}

/// Prints `{"loss": ..., "tokens": ...}` on success (exit 0), one error line
/// on failure (exit 1).
pub fn run(args: &Args) -> ExitCode {
    let result = match (args.device, args.precision) {
        (Device::Cuda, p) => evaluate_cuda(args, matches!(p, EvalPrecision::Bf16)),
        (Device::Cpu, EvalPrecision::F64) => evaluate::<f64>(args),
        (Device::Cpu, EvalPrecision::F32) => evaluate::<f32>(args),
        (Device::Cpu, EvalPrecision::Bf16) => Err(EvalError::Bf16OnCpu),
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::from(1)
        }
    }
}

fn evaluate<T: Float>(args: &Args) -> Result<String, EvalError> {
    let (cfg, weights) = checkpoint::load::<T>(&args.checkpoint)?;
    let tokens = read_tokens(&args.tokens, cfg.vocab_size)?;
    let out = forward(&cfg, &weights, &tokens, None, ScanMode::Chunked)?;
    if let Some(path) = &args.grads_out {
        let grads = try_backward(&cfg, &weights, &out)?;
        let named: Vec<(String, Vec<usize>, &[T])> = grads
            .named(&cfg)
            .into_iter()
            .map(|(spec, data)| (spec.name, spec.shape, data))
            .collect();
        checkpoint::write_tensors(path, &named)?;
    }
    Ok(serde_json::json!({"loss": out.loss, "tokens": tokens.count()}).to_string())
}

/// The same evaluation with the GPU ops (one forward, one backward), in f32
/// or, with `mixed`, in bf16 mixed precision.
fn evaluate_cuda(args: &Args, mixed: bool) -> Result<String, EvalError> {
    let (cfg, weights) = checkpoint::load::<f32>(&args.checkpoint)?;
    let tokens = read_tokens(&args.tokens, cfg.vocab_size)?;
    let (batch, len) = (tokens.batch(), tokens.len());
    let (values, _) = checkpoint::read_int_tensor(&args.tokens, "tokens")?;
    // Ids were range-checked by `read_tokens`, so they fit an i32.
    let ids: Vec<i32> = values
        .iter()
        .map(|&v| i32::try_from(v).unwrap_or(-1))
        .collect();
    let gpu = Gpu::new(0).map_err(Mamba3GpuError::from)?;
    let tok = gpu.to_device(&ids).map_err(Mamba3GpuError::from)?;
    let l = if mixed {
        let w = gpu_model::MixedWeights::upload(&gpu, &cfg, &weights)?;
        let mut acts = gpu_model::MixedActs::new(&gpu, &cfg, batch, len)?;
        gpu_model::presize_staging::<half::bf16>(&gpu, &acts.shape)?;
        run_cuda(&gpu, &cfg, &w, &tok, &mut acts, args.grads_out.as_deref())?
    } else {
        let w = gpu_model::Weights::upload(&gpu, &cfg, &weights)?;
        let mut acts = gpu_model::Acts::new(&gpu, &cfg, batch, len)?;
        run_cuda(&gpu, &cfg, &w, &tok, &mut acts, args.grads_out.as_deref())?
    };
    Ok(serde_json::json!({"loss": f64::from(l), "tokens": tokens.count()}).to_string())
}

/// Forward (and with `grads_out` backward) through the generic GPU bodies;
/// returns the loss.
fn run_cuda<W: StepWeights>(
    gpu: &Gpu,
    cfg: &Mamba3Config,
    w: &W,
    tok: &DeviceBuffer<i32>,
    acts: &mut gpu_model::Acts<DeviceBuffer<W::T>>,
    grads_out: Option<&Path>,
) -> Result<f32, EvalError> {
    let (batch, len) = acts.batch_len();
    let mut loss = gpu.alloc_zeros::<f32>(1).map_err(Mamba3GpuError::from)?;
    gpu_model::forward_with(gpu, w, tok, acts, &mut loss)?;
    if let Some(path) = grads_out {
        let mut grads = gpu_model::Grads::new(gpu, cfg, batch, len)?;
        gpu_model::backward_with(gpu, w, tok, acts, &mut grads)?;
        let g = grads.download(gpu)?;
        let named: Vec<(String, Vec<usize>, &[f32])> = g
            .named(cfg)
            .into_iter()
            .map(|(spec, data)| (spec.name, spec.shape, data))
            .collect();
        checkpoint::write_tensors(path, &named)?;
    }
    let l = gpu.to_host(&loss).map_err(Mamba3GpuError::from)?;
    Ok(l.first().copied().unwrap_or(f32::NAN))
}

fn read_tokens(path: &Path, vocab_size: usize) -> Result<Tokens, EvalError> {
    let (values, shape) = checkpoint::read_int_tensor(path, "tokens")?;
    Tokens::from_shaped(&values, &shape, vocab_size).map_err(|source| EvalError::Tokens {
        path: path.to_path_buf(),
        source,
    })
}

/// Error messages are one line by construction; this guards against an OS or
/// parser message that is not.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
