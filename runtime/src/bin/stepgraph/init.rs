//! `stepgraph init`: writes a checkpoint with fresh official-init weights, in
//! the official layout, so `eval` (or PyTorch) can load it.

use std::path::PathBuf;
use std::process::ExitCode;

use stepgraph::mamba3::cpu::{Float, Weights};
use stepgraph::mamba3::{ConfigError, Mamba3Config, RopeFraction, checkpoint};

/// Arguments of `stepgraph init`. Omitted mixer options take the official defaults.
#[derive(clap::Args)]
pub struct Args {
    /// Output checkpoint directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// Residual stream width.
    #[arg(long)]
    d_model: usize,
    /// Number of Mamba-3 blocks.
    #[arg(long)]
    n_layer: usize,
    /// Vocabulary size (the embedding is padded to --pad-vocab-size-multiple).
    #[arg(long)]
    vocab_size: usize,
    /// State size N.
    #[arg(long, default_value_t = 128)]
    d_state: usize,
    /// d_inner = expand * d_model.
    #[arg(long, default_value_t = 2)]
    expand: usize,
    /// Head dimension P.
    #[arg(long, default_value_t = 64)]
    headdim: usize,
    /// B/C groups.
    #[arg(long, default_value_t = 1)]
    ngroups: usize,
    /// Fraction of state dims rotated: 0.5 or 1.0.
    #[arg(long, default_value_t = 0.5)]
    rope_fraction: f64,
    /// Grouped RMSNorm before the output gate.
    #[arg(long)]
    outproj_norm: bool,
    /// Separate LM head instead of the tied embedding.
    #[arg(long)]
    untied: bool,
    /// Vocabulary padding multiple.
    #[arg(long, default_value_t = 8)]
    pad_vocab_size_multiple: usize,
    /// Chunk length of the chunked scan.
    #[arg(long, default_value_t = 64)]
    chunk_size: usize,
    /// Seed of the initialisation stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Precision the tensors are stored in.
    #[arg(long, value_enum, default_value_t = crate::eval::Precision::F32)]
    dtype: crate::eval::Precision,
}

/// Writes the checkpoint and prints its directory (exit 0), or one error line (exit 1).
pub fn run(args: &Args) -> ExitCode {
    let result = config(args)
        .map_err(|e| e.to_string())
        .and_then(|cfg| match args.dtype {
            crate::eval::Precision::F64 => write::<f64>(args, &cfg),
            crate::eval::Precision::F32 => write::<f32>(args, &cfg),
        });
    match result {
        Ok(()) => {
            println!("{}", args.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn config(args: &Args) -> Result<Mamba3Config, ConfigError> {
    let cfg = Mamba3Config {
        d_model: args.d_model,
        n_layer: args.n_layer,
        vocab_size: args.vocab_size,
        pad_vocab_size_multiple: args.pad_vocab_size_multiple,
        tie_embeddings: !args.untied,
        d_state: args.d_state,
        expand: args.expand,
        headdim: args.headdim,
        ngroups: args.ngroups,
        rope_fraction: RopeFraction::from_f64(args.rope_fraction)?,
        is_outproj_norm: args.outproj_norm,
        chunk_size: args.chunk_size,
        ..Mamba3Config::default()
    };
    cfg.validate()?;
    Ok(cfg)
}

fn write<T: Float>(args: &Args, cfg: &Mamba3Config) -> Result<(), String> {
    let weights = Weights::<T>::init(cfg, args.seed).map_err(|e| e.to_string())?;
    checkpoint::save(&args.out, cfg, &weights).map_err(|e| e.to_string())
}
