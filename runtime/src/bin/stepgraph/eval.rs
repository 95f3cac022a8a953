//! `stepgraph eval`: mean next-token cross-entropy of a checkpoint on a token
//! file, on the CPU reference model, optionally with the gradient of that loss
//! for every parameter.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stepgraph::mamba3::checkpoint::{self, CheckpointError};
use stepgraph::mamba3::cpu::{
    Float, ModelError, ScanMode, TokenError, Tokens, forward, try_backward,
};

/// Arguments of `stepgraph eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (`config.json` + `model.safetensors`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Safetensors file with one integer tensor `tokens` of shape [B, T+1].
    #[arg(long)]
    tokens: PathBuf,
    /// Precision of the CPU computation.
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    precision: Precision,
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

/// Everything that can stop an evaluation.
#[derive(Debug, thiserror::Error)]
enum EvalError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{}: {source}", path.display())]
    Tokens { path: PathBuf, source: TokenError },
}

/// Prints `{"loss": ..., "tokens": ...}` on success (exit 0), one error line
/// on failure (exit 1).
pub fn run(args: &Args) -> ExitCode {
    let result = match args.precision {
        Precision::F64 => evaluate::<f64>(args),
        Precision::F32 => evaluate::<f32>(args),
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
