//! `stepgraph eval`: the flags of [`stepgraph::eval`], which scores a
//! checkpoint on a token file (CPU reference model, or with `--device cuda`
//! the GPU model in f32, or bf16 mixed precision with `--precision bf16`),
//! optionally with the gradient of the loss for every parameter.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stepgraph::Precision;
use stepgraph::eval::{EvalDevice, EvalRequest, TokenSource, evaluate};
use stepgraph::train::data::{DataFormat, FILE_EVAL_ROWS};

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

/// The request the flags describe.
fn request(args: &Args) -> EvalRequest {
    let tokens = match &args.data {
        Some(path) => TokenSource::File {
            path: path.clone(),
            format: match args.data_format {
                FormatArg::Bytes => DataFormat::Bytes,
                FormatArg::U16 => DataFormat::U16,
                FormatArg::U32 => DataFormat::U32,
            },
            seq_len: args.seq_len,
            eval_fraction: args.eval_fraction,
            max_rows: args.max_rows,
        },
        None => TokenSource::Safetensors(
            args.tokens
                .clone()
                .unwrap_or_else(|| Path::new("tokens.safetensors").to_path_buf()),
        ),
    };
    EvalRequest {
        checkpoint: args.checkpoint.clone(),
        tokens,
        precision: args.precision,
        device: match args.device {
            Device::Cpu => EvalDevice::Cpu,
            Device::Cuda => EvalDevice::Cuda,
        },
        grads_out: args.grads_out.clone(),
    }
}

/// Prints `{"loss": ..., "tokens": ...}` on success (exit 0), one error line
/// on failure (exit 1).
pub fn run(args: &Args) -> ExitCode {
    let result = evaluate(&request(args))
        .map_err(|e| e.to_string())
        .and_then(|r| serde_json::to_string(&r).map_err(|e| e.to_string()));
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// Error messages are one line by construction; this guards against an OS or
/// parser message that is not.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
