//! `stepgraph eval`: mean next-token cross-entropy of a checkpoint on a token
//! file, on the CPU reference model (or, with `--device cuda`, the GPU model
//! in f32, or in bf16 mixed precision with `--precision bf16`), optionally
//! with the gradient of that loss for every parameter.
//!
//! The tokens come from a safetensors file (`--tokens`, one integer tensor
//! `tokens` of shape `[B, T+1]`), or straight from a file in `train --data`'s
//! formats (`--data`): its held-out tail, cut into the same windows `train`
//! evaluates on, so the loss is comparable with a run's `held-out` eval.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stepgraph::Precision;
use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::checkpoint::{self, CheckpointError};
use stepgraph::mamba3::cpu::{
    Float, ModelError, ScanMode, TokenError, Tokens, forward, try_backward,
};
use stepgraph::mamba3::gpu::{self as gpu_model, Mamba3GpuError, ModelCompute, StepWeights};
use stepgraph::train::TrainError;
use stepgraph::train::data::{DataFormat, FILE_EVAL_ROWS, FileData};

/// Arguments of `stepgraph eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (`config.json` + `model.safetensors`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Safetensors file with one integer tensor `tokens` of shape [B, T+1].
    #[arg(long, required_unless_present = "data", conflicts_with = "data")]
    tokens: Option<PathBuf>,
    /// A text or token file as `train --data` reads it: the windows of its
    /// held-out tail (the last --eval-fraction) are evaluated.
    #[arg(long)]
    data: Option<PathBuf>,
    /// How --data encodes tokens (u16/u32 ids are checked against the model's vocabulary).
    #[arg(long, value_enum, default_value_t = FormatArg::Bytes, requires = "data")]
    data_format: FormatArg,
    /// Window length T of --data (each row holds T + 1 tokens).
    #[arg(long, default_value_t = 64, value_parser = crate::parse::at_least_one, requires = "data")]
    seq_len: usize,
    /// Fraction of --data held out at its end (as `train --eval-fraction`).
    #[arg(long, default_value_t = 0.1, value_parser = crate::parse::open_fraction, requires = "data")]
    eval_fraction: f64,
    /// Most --data windows evaluated.
    #[arg(long, default_value_t = FILE_EVAL_ROWS, value_parser = crate::parse::at_least_one, requires = "data")]
    max_rows: usize,
    /// Precision: f64 or f32 on the CPU; on the GPU f32 (also for f64) or
    /// bf16 mixed precision (f32 masters, bf16 GEMMs, f32 scan and norms).
    #[arg(long, default_value_t = Precision::F64, value_parser = crate::parse::precision(EVAL_PRECISIONS))]
    precision: Precision,
    /// Where to compute: the CPU reference, or the f32 model on GPU 0.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Also write d(mean loss)/d(parameter) for every parameter here
    /// (safetensors, official parameter names).
    #[arg(long)]
    grads_out: Option<PathBuf>,
}

/// `--data-format`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum FormatArg {
    /// One token per byte (vocabulary 256).
    Bytes,
    /// Little-endian u16 ids.
    U16,
    /// Little-endian u32 ids.
    U32,
}

/// What `eval --precision` accepts: the CPU model's float types, or bf16
/// mixed precision on the GPU.
const EVAL_PRECISIONS: &[(Precision, &str)] = &[
    (Precision::F64, "float64 (on the GPU: f32)"),
    (Precision::F32, "float32"),
    (
        Precision::Bf16,
        "bf16 mixed precision (`--device cuda` only)",
    ),
];

/// What `init --dtype` accepts: the CPU model's float types.
pub const CPU_PRECISIONS: &[(Precision, &str)] = &[
    (Precision::F64, "float64: the reference"),
    (Precision::F32, "float32"),
];

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
    #[error(transparent)]
    Data(#[from] TrainError),
    #[error(
        "--data-format bytes has ids up to 255, the checkpoint's vocabulary is {0} (use the \
         format the model was trained on)"
    )]
    BytesVocab(usize),
}

/// Prints `{"loss": ..., "tokens": ...}` on success (exit 0), one error line
/// on failure (exit 1).
pub fn run(args: &Args) -> ExitCode {
    let result = match (args.device, args.precision) {
        (Device::Cuda, Precision::Bf16) => evaluate_cuda::<half::bf16>(args),
        (Device::Cuda, Precision::F64 | Precision::F32) => evaluate_cuda::<f32>(args),
        (Device::Cpu, Precision::F64) => evaluate::<f64>(args),
        (Device::Cpu, Precision::F32) => evaluate::<f32>(args),
        (Device::Cpu, Precision::Bf16) => Err(EvalError::Bf16OnCpu),
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
    let (values, shape) = token_values(args, cfg.vocab_size)?;
    let tokens = shaped(args, &values, &shape, cfg.vocab_size)?;
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

/// The same evaluation with the GPU ops (one forward, one backward), at
/// compute type `P`: f32, or bf16 mixed precision.
fn evaluate_cuda<P: ModelCompute>(args: &Args) -> Result<String, EvalError> {
    let (cfg, weights) = checkpoint::load::<f32>(&args.checkpoint)?;
    let (values, shape) = token_values(args, cfg.vocab_size)?;
    let tokens = shaped(args, &values, &shape, cfg.vocab_size)?;
    let (batch, len) = (tokens.batch(), tokens.len());
    // Ids were range-checked by `read_tokens`, so they fit an i32.
    let ids: Vec<i32> = values
        .iter()
        .map(|&v| i32::try_from(v).unwrap_or(-1))
        .collect();
    let gpu = Gpu::new(0).map_err(Mamba3GpuError::from)?;
    let tok = gpu.to_device(&ids).map_err(Mamba3GpuError::from)?;
    let w = <P::Weights as StepWeights>::upload(&gpu, &cfg, &weights)?;
    let mut acts = gpu_model::Acts::<DeviceBuffer<P>>::new(&gpu, &cfg, batch, len)?;
    gpu_model::presize_staging::<P>(&gpu, &acts.shape)?;
    let l = run_cuda(&gpu, &cfg, &w, &tok, &mut acts, args.grads_out.as_deref())?;
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
    gpu_model::forward(gpu, w, tok, acts, &mut loss)?;
    if let Some(path) = grads_out {
        let mut grads = gpu_model::Grads::new(gpu, cfg, batch, len)?;
        gpu_model::backward(gpu, w, tok, acts, &mut grads)?;
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

/// The token ids and their `[B, T+1]` shape, from `--tokens` or `--data`.
fn token_values(args: &Args, vocab_size: usize) -> Result<(Vec<i64>, Vec<usize>), EvalError> {
    let Some(path) = &args.data else {
        let path = args
            .tokens
            .as_deref()
            .unwrap_or(Path::new("tokens.safetensors"));
        return Ok(checkpoint::read_int_tensor(path, "tokens")?);
    };
    let (format, vocab) = match args.data_format {
        FormatArg::Bytes if vocab_size < 256 => return Err(EvalError::BytesVocab(vocab_size)),
        FormatArg::Bytes => (DataFormat::Bytes, None),
        FormatArg::U16 => (DataFormat::U16, Some(vocab_size)),
        FormatArg::U32 => (DataFormat::U32, Some(vocab_size)),
    };
    let window = args.seq_len.saturating_add(1);
    let file = FileData::open(path, format, vocab, args.eval_fraction, window)?;
    let batches = file.eval_batches(args.max_rows, window, args.max_rows)?;
    let mut values = Vec::new();
    let mut rows = 0;
    for b in &batches {
        values.extend(b.tokens.iter().map(|&t| i64::from(t)));
        rows += b.rows;
    }
    Ok((values, vec![rows, window]))
}

fn shaped(args: &Args, values: &[i64], shape: &[usize], vocab: usize) -> Result<Tokens, EvalError> {
    Tokens::from_shaped(values, shape, vocab).map_err(|source| EvalError::Tokens {
        path: args
            .data
            .clone()
            .or_else(|| args.tokens.clone())
            .unwrap_or_default(),
        source,
    })
}

/// Error messages are one line by construction; this guards against an OS or
/// parser message that is not.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
