//! `stepgraph init`: writes a checkpoint with fresh official-init weights, in
//! the official layout, so `eval` (or PyTorch) can load it.
//!
//! The checkpoint is built in a temporary sibling directory and renamed into
//! place, so `--out` never mixes old and new files: a directory that holds
//! anything is refused (a usage error), and `--force` replaces it whole
//! (the old one is renamed aside first and removed only once the new one is
//! in place).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stepgraph::Precision;
use stepgraph::mamba3::checkpoint::CheckpointError;
use stepgraph::mamba3::cpu::{Float, ModelError, Weights};
use stepgraph::mamba3::{ConfigError, Mamba3Config, RopeFraction, checkpoint};
use stepgraph::train::{DtInit, Rotation};

use crate::train::{AActArg, RotationArg};

/// Arguments of `stepgraph init`. Omitted mixer options take the official defaults.
#[derive(clap::Args)]
pub struct Args {
    /// Output checkpoint directory: created; an existing one must be empty.
    #[arg(long)]
    out: PathBuf,
    /// Replace a non-empty --out directory whole.
    #[arg(long)]
    force: bool,
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
    /// Range of every head's initial dt, drawn log-uniform: MIN,MAX (the
    /// official dt_min, dt_max).
    #[arg(long, value_name = "MIN,MAX", default_value_t = DtInit::default())]
    dt_init: DtInit,
    /// Decay map f of A = -max(f(dd_A), A_floor): the official heavy-tail, or the paper's softplus.
    #[arg(long, value_enum, default_value_t = AActArg::HeavyTail)]
    a_activation: AActArg,
    /// Rotation angles: data (Mamba-3's), fixed (standard RoPE) or none; as
    /// `train --rotation`, which also zeroes the angle rows of fixed and none
    /// when a run starts (the checkpoint keeps them as drawn).
    #[arg(long, value_enum, default_value_t = RotationArg::Data)]
    rotation: RotationArg,
    /// Seed of the initialisation stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Precision the tensors are stored in.
    #[arg(long, default_value_t = Precision::F32, value_parser = crate::parse::precision(crate::eval::CPU_PRECISIONS))]
    dtype: Precision,
}

/// Why no checkpoint was written.
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--dtype {0}: the CPU model stores f64 or f32")]
    Dtype(Precision),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InitError {
    let path = path.to_path_buf();
    move |source| InitError::Io { path, source }
}

/// What a non-empty `--out` holds, for the refusal (`None`: absent or empty).
fn contents(dir: &Path) -> Option<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    (!names.is_empty()).then_some(names)
}

/// Writes the checkpoint and prints its directory (exit 0), one error line
/// (exit 1), or a usage error (exit 2: a configuration the model cannot
/// have, or a non-empty `--out` without `--force`).
pub fn run(args: &Args) -> ExitCode {
    let cfg = match config(args) {
        Ok(cfg) => cfg,
        Err(ConfigError::Invalid { field, reason }) => {
            // Each config field is set by the flag of the same name, but
            // for the dt range, which --dt-init sets whole.
            let flag = match field.trim_start_matches("ssm_cfg.") {
                "dt_min" | "dt_max" => "dt-init".to_owned(),
                f => f.replace('_', "-"),
            };
            crate::usage_error("init", format!("--{flag}: {reason}"))
        }
        Err(e) => crate::usage_error("init", e),
    };
    if !args.force
        && let Some(names) = contents(&args.out)
    {
        crate::usage_error(
            "init",
            format!(
                "--out {} is not empty (it holds {}); choose another directory, or add --force \
                 to replace it whole",
                args.out.display(),
                names.join(", ")
            ),
        );
    }
    let result = match args.dtype {
        Precision::F64 => write::<f64>(args, &cfg),
        Precision::F32 => write::<f32>(args, &cfg),
        // The flag offers f64 and f32 only.
        Precision::Bf16 => Err(InitError::Dtype(args.dtype)),
    };
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
        dt_min: args.dt_init.min,
        dt_max: args.dt_init.max,
        a_activation: args.a_activation.into(),
        rope_angles: Rotation::from(args.rotation).angles(),
        ..Mamba3Config::default()
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Builds the checkpoint beside `--out`, then moves it into place.
fn write<T: Float>(args: &Args, cfg: &Mamba3Config) -> Result<(), InitError> {
    let out = &args.out;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io(parent))?;
    let name = out
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    let pid = std::process::id();
    let tmp = parent.join(format!(".{name}.init-{pid}"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    let weights = Weights::<T>::init(cfg, args.seed)?;
    checkpoint::save(&tmp, cfg, &weights)?;
    let old = parent.join(format!(".{name}.replaced-{pid}"));
    let had_old = match contents(out) {
        Some(_) => {
            fs::rename(out, &old).map_err(io(out))?;
            true
        }
        None => {
            if out.is_dir() {
                fs::remove_dir(out).map_err(io(out))?;
            }
            false
        }
    };
    fs::rename(&tmp, out).map_err(io(out))?;
    if had_old {
        fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}
