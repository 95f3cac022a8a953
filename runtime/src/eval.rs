//! Scoring a checkpoint (what `stepgraph eval` runs): the mean next-token
//! cross-entropy of a checkpoint on a token set, on the CPU reference model
//! (f64 or f32) or on the GPU model (f32, or bf16 mixed precision),
//! optionally with the gradient of that loss for every parameter.
//!
//! The tokens come from a safetensors file (one integer tensor `tokens` of
//! shape `[B, T+1]`), or straight from a file in `train --data`'s formats:
//! its held-out tail, cut into the same windows training evaluates on, so
//! the loss is comparable with a run's `held-out` eval.
//!
//! Layering: this module sits on top, beside `train` whose data reader it
//! uses; the CLI parses flags into an [`EvalRequest`] and prints the
//! [`EvalReport`].

use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::Precision;
use crate::device::{DeviceBuffer, Gpu};
use crate::float::Float;
use crate::mamba3::Mamba3Config;
use crate::mamba3::checkpoint::{self, CheckpointError};
use crate::mamba3::cpu::{ModelError, ScanMode, TokenError, Tokens, forward, try_backward};
use crate::mamba3::gpu::{self as gpu_model, Mamba3GpuError, ModelCompute, StepWeights};
use crate::train::TrainError;
use crate::train::data::{DataFormat, FileData};

/// Where the tokens come from.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// A safetensors file with one integer tensor `tokens` of shape `[B, T+1]`.
    Safetensors(PathBuf),
    /// A text or token file as `train --data` reads it: the windows of its
    /// held-out tail.
    File {
        /// The file.
        path: PathBuf,
        /// How it encodes tokens (u16/u32 ids are checked against the
        /// checkpoint's vocabulary).
        format: DataFormat,
        /// Window length T (each row holds T + 1 tokens).
        seq_len: usize,
        /// Fraction of the file held out at its end.
        eval_fraction: f64,
        /// Most windows evaluated.
        max_rows: usize,
    },
}

impl TokenSource {
    fn path(&self) -> &Path {
        match self {
            Self::Safetensors(p) | Self::File { path: p, .. } => p,
        }
    }
}

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalDevice {
    /// The CPU reference model.
    Cpu,
    /// The GPU model, on GPU 0.
    Cuda,
}

/// One evaluation.
#[derive(Clone, Debug)]
pub struct EvalRequest {
    /// Checkpoint directory (`config.json` + `model.safetensors`).
    pub checkpoint: PathBuf,
    /// The tokens.
    pub tokens: TokenSource,
    /// f64 or f32 on the CPU; on the GPU f32 (also for f64) or bf16.
    pub precision: Precision,
    /// CPU or GPU.
    pub device: EvalDevice,
    /// Also write d(mean loss)/d(parameter) for every parameter here
    /// (safetensors, official parameter names).
    pub grads_out: Option<PathBuf>,
}

/// What an evaluation measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EvalReport {
    /// Mean next-token cross-entropy.
    pub loss: f64,
    /// Predictions it averages over.
    pub tokens: usize,
}

/// Everything that can stop an evaluation.
#[derive(Debug, Error)]
pub enum EvalError {
    /// The checkpoint (or the gradient file) could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The CPU model refused the weights or tokens.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The tokens do not fit the model.
    #[error("{}: {source}", path.display())]
    Tokens {
        /// The token file.
        path: PathBuf,
        /// What is wrong.
        source: TokenError,
    },
    /// A GPU call failed.
    #[error(transparent)]
    Gpu(#[from] Mamba3GpuError),
    /// bf16 asked of the CPU model.
    #[error("--precision bf16 needs --device cuda (the CPU model computes in f64 or f32)")]
    Bf16OnCpu,
    /// The data file could not be read.
    #[error(transparent)]
    Data(#[from] TrainError),
    /// Byte-level data for a model whose vocabulary is smaller than 256.
    #[error(
        "--data-format bytes has ids up to 255, the checkpoint's vocabulary is {0} (use the \
         format the model was trained on)"
    )]
    BytesVocab(usize),
}

/// Runs `req`: loads the checkpoint, reads the tokens, runs the model (and
/// its backward pass for `grads_out`).
pub fn evaluate(req: &EvalRequest) -> Result<EvalReport, EvalError> {
    match (req.device, req.precision) {
        (EvalDevice::Cuda, Precision::Bf16) => evaluate_cuda::<half::bf16>(req),
        (EvalDevice::Cuda, Precision::F64 | Precision::F32) => evaluate_cuda::<f32>(req),
        (EvalDevice::Cpu, Precision::F64) => evaluate_cpu::<f64>(req),
        (EvalDevice::Cpu, Precision::F32) => evaluate_cpu::<f32>(req),
        (EvalDevice::Cpu, Precision::Bf16) => Err(EvalError::Bf16OnCpu),
    }
}

fn evaluate_cpu<T: Float>(req: &EvalRequest) -> Result<EvalReport, EvalError> {
    let (cfg, weights) = checkpoint::load::<T>(&req.checkpoint)?;
    let (values, shape) = token_values(&req.tokens, cfg.vocab_size)?;
    let tokens = shaped(&req.tokens, &values, &shape, cfg.vocab_size)?;
    let out = forward(&cfg, &weights, &tokens, None, ScanMode::Chunked)?;
    if let Some(path) = &req.grads_out {
        let grads = try_backward(&cfg, &weights, &out)?;
        let named: Vec<(String, Vec<usize>, &[T])> = grads
            .named(&cfg)
            .into_iter()
            .map(|(spec, data)| (spec.name, spec.shape, data))
            .collect();
        checkpoint::write_tensors(path, &named)?;
    }
    Ok(EvalReport {
        loss: out.loss,
        tokens: tokens.count(),
    })
}

/// The same evaluation with the GPU ops (one forward, one backward), at
/// compute type `P`: f32, or bf16 mixed precision.
fn evaluate_cuda<P: ModelCompute>(req: &EvalRequest) -> Result<EvalReport, EvalError> {
    let (cfg, weights) = checkpoint::load::<f32>(&req.checkpoint)?;
    let (values, shape) = token_values(&req.tokens, cfg.vocab_size)?;
    let tokens = shaped(&req.tokens, &values, &shape, cfg.vocab_size)?;
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
    let l = run_cuda(&gpu, &cfg, &w, &tok, &mut acts, req.grads_out.as_deref())?;
    Ok(EvalReport {
        loss: f64::from(l),
        tokens: tokens.count(),
    })
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
        let mut grads = gpu_model::Grads::new::<W::T>(gpu, cfg, batch, len)?;
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

/// The token ids and their `[B, T+1]` shape.
fn token_values(
    source: &TokenSource,
    vocab_size: usize,
) -> Result<(Vec<i64>, Vec<usize>), EvalError> {
    let TokenSource::File {
        path,
        format,
        seq_len,
        eval_fraction,
        max_rows,
    } = source
    else {
        return Ok(checkpoint::read_int_tensor(source.path(), "tokens")?);
    };
    let vocab = match format {
        DataFormat::Bytes if vocab_size < 256 => return Err(EvalError::BytesVocab(vocab_size)),
        DataFormat::Bytes => None,
        DataFormat::U16 | DataFormat::U32 => Some(vocab_size),
    };
    let window = seq_len.saturating_add(1);
    let file = FileData::open(path, *format, vocab, *eval_fraction, window)?;
    let batches = file.eval_batches(*max_rows, window, *max_rows)?;
    let mut values = Vec::new();
    let mut rows = 0;
    for b in &batches {
        values.extend(b.tokens.iter().map(|&t| i64::from(t)));
        rows += b.rows;
    }
    Ok((values, vec![rows, window]))
}

fn shaped(
    source: &TokenSource,
    values: &[i64],
    shape: &[usize],
    vocab: usize,
) -> Result<Tokens, EvalError> {
    Tokens::from_shaped(values, shape, vocab).map_err(|source_err| EvalError::Tokens {
        path: source.path().to_path_buf(),
        source: source_err,
    })
}
