//! Checkpoints in the official layout: a directory holding `config.json`
//! (official `MambaConfig` fields, see [`config_to_json`]) and
//! `model.safetensors` (official `MambaLMHeadModel` parameter names and
//! shapes, see [`param_specs`]). `lm_head.weight` is written only when the
//! head is untied; a tied checkpoint that carries it anyway (as
//! `torch.save(state_dict())` conversions do) loads if it equals the embedding.
//!
//! F32, F64, BF16 and F16 tensors load into either precision; saving writes the
//! model's own precision. The same safetensors helpers read token files and
//! write gradient files.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use thiserror::Error;

pub use super::hf_config::{config_from_json, config_from_json_str, config_to_json};

use super::config::{ConfigError, Mamba3Config};
use super::cpu::{Float, ParamSpec, Weights, param_specs};

/// File name of the configuration inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the weights inside a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Why a checkpoint (or token / gradient file) could not be read or written.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// Filesystem failure.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a safetensors file, or one that cannot be serialized.
    #[error("{}: invalid safetensors data: {source}", path.display())]
    SafeTensors {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: SafeTensorError,
    },
    /// `config.json` is invalid.
    #[error("{}: {source}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ConfigError,
    },
    /// A parameter the config requires is absent.
    #[error("tensor `{name}` is missing (expected shape {expected:?})")]
    Missing {
        /// Official name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// A tensor that is no parameter of this config.
    #[error(
        "unexpected tensor `{name}` with shape {shape:?}: not a parameter of this configuration"
    )]
    Unexpected {
        /// Its name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A parameter with the wrong shape.
    #[error("tensor `{name}`: expected shape {expected:?}, found shape {found:?}")]
    Shape {
        /// Official name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A tensor stored in a dtype that cannot be read.
    #[error("tensor `{name}` (shape {shape:?}) has dtype {dtype}; expected {expected}")]
    Dtype {
        /// Its name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The dtype found.
        dtype: String,
        /// The dtypes accepted.
        expected: &'static str,
    },
    /// A tied checkpoint whose `lm_head.weight` is not the embedding.
    #[error(
        "`lm_head.weight` differs from `backbone.embedding.weight` although tie_embeddings is true"
    )]
    TiedHeadDiffers,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn st_err(path: &Path) -> impl FnOnce(SafeTensorError) -> CheckpointError + '_ {
    move |source| CheckpointError::SafeTensors {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `config.json` and `model.safetensors` into `dir` (created if needed).
pub fn save<T: Float>(
    dir: &Path,
    cfg: &Mamba3Config,
    weights: &Weights<T>,
) -> Result<(), CheckpointError> {
    let cfg_path = dir.join(CONFIG_FILE);
    let json = config_to_json(cfg).map_err(|source| CheckpointError::Config {
        path: cfg_path.clone(),
        source,
    })?;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    fs::write(&cfg_path, text + "\n").map_err(io_err(&cfg_path))?;
    let named: Vec<(String, Vec<usize>, &[T])> = weights
        .named(cfg)
        .into_iter()
        .map(|(spec, data)| (spec.name, spec.shape, data))
        .collect();
    write_tensors(&dir.join(WEIGHTS_FILE), &named)
}

/// Reads a checkpoint directory into a config and weights in precision `T`.
pub fn load<T: Float>(dir: &Path) -> Result<(Mamba3Config, Weights<T>), CheckpointError> {
    let cfg_path = dir.join(CONFIG_FILE);
    let text = fs::read_to_string(&cfg_path).map_err(io_err(&cfg_path))?;
    let cfg = config_from_json_str(&text).map_err(|source| CheckpointError::Config {
        path: cfg_path.clone(),
        source,
    })?;
    let w_path = dir.join(WEIGHTS_FILE);
    let bytes = fs::read(&w_path).map_err(io_err(&w_path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(st_err(&w_path))?;
    let weights = weights_from_safetensors(&cfg, &st)?;
    Ok((cfg, weights))
}

/// Builds weights from a parsed safetensors file, checking every name, shape
/// and dtype against `cfg`.
pub fn weights_from_safetensors<T: Float>(
    cfg: &Mamba3Config,
    st: &SafeTensors<'_>,
) -> Result<Weights<T>, CheckpointError> {
    let specs = param_specs(cfg);
    let expected: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut names: Vec<&str> = st.names();
    names.sort_unstable();
    let tied_extra = "lm_head.weight";
    for name in &names {
        let tied_copy = cfg.tie_embeddings && *name == tied_extra;
        if !expected.contains(name) && !tied_copy {
            let shape = st
                .tensor(name)
                .map(|t| t.shape().to_vec())
                .unwrap_or_default();
            return Err(CheckpointError::Unexpected {
                name: (*name).to_owned(),
                shape,
            });
        }
    }
    let mut tensors = Vec::with_capacity(specs.len());
    for spec in &specs {
        tensors.push(read_param(st, spec)?);
    }
    let weights = Weights::from_ordered(cfg, tensors);
    if cfg.tie_embeddings && names.contains(&tied_extra) {
        let spec = ParamSpec {
            name: tied_extra.into(),
            shape: specs[0].shape.clone(),
            kind: specs[0].kind,
        };
        let head: Vec<T> = read_param(st, &spec)?;
        if head != weights.embedding {
            return Err(CheckpointError::TiedHeadDiffers);
        }
    }
    Ok(weights)
}

fn read_param<T: Float>(st: &SafeTensors<'_>, spec: &ParamSpec) -> Result<Vec<T>, CheckpointError> {
    let view = st
        .tensor(&spec.name)
        .map_err(|_| CheckpointError::Missing {
            name: spec.name.clone(),
            expected: spec.shape.clone(),
        })?;
    if view.shape() != spec.shape.as_slice() {
        return Err(CheckpointError::Shape {
            name: spec.name.clone(),
            expected: spec.shape.clone(),
            found: view.shape().to_vec(),
        });
    }
    float_values(&spec.name, &view)
}

/// Decodes a floating-point tensor (F64, F32, BF16, F16) into `T`.
pub fn float_values<T: Float>(
    name: &str,
    view: &TensorView<'_>,
) -> Result<Vec<T>, CheckpointError> {
    let data = view.data();
    let out = match view.dtype() {
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|b| {
                T::from_f64(f64::from_le_bytes([
                    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                ]))
            })
            .collect(),
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| T::from_f64(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| T::from_f64(half::bf16::from_le_bytes([b[0], b[1]]).to_f64()))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| T::from_f64(half::f16::from_le_bytes([b[0], b[1]]).to_f64()))
            .collect(),
        other => {
            return Err(CheckpointError::Dtype {
                name: name.to_owned(),
                shape: view.shape().to_vec(),
                dtype: format!("{other:?}"),
                expected: "F32, F64, BF16 or F16",
            });
        }
    };
    Ok(out)
}

/// Writes named tensors of precision `T` to a safetensors file.
pub fn write_tensors<T: Float>(
    path: &Path,
    tensors: &[(String, Vec<usize>, &[T])],
) -> Result<(), CheckpointError> {
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (name, shape, data) in tensors {
        let mut bytes = Vec::with_capacity(data.len() * 8);
        for &v in *data {
            v.write_le(&mut bytes);
        }
        buffers.push((name.clone(), shape.clone(), bytes));
    }
    let mut views = Vec::with_capacity(buffers.len());
    for (name, shape, bytes) in &buffers {
        let view = TensorView::new(T::DTYPE, shape.clone(), bytes).map_err(st_err(path))?;
        views.push((name.clone(), view));
    }
    // "format": "pt" lets `safetensors.torch` and `transformers` load the file as-is.
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let out = safetensors::serialize(views, Some(meta)).map_err(st_err(path))?;
    fs::write(path, out).map_err(io_err(path))
}

/// Reads the integer tensor `name` (I32 or I64) from a safetensors file:
/// returns its values and shape.
pub fn read_int_tensor(path: &Path, name: &str) -> Result<(Vec<i64>, Vec<usize>), CheckpointError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(st_err(path))?;
    let view = st.tensor(name).map_err(|_| CheckpointError::Missing {
        name: name.to_owned(),
        expected: vec![],
    })?;
    let data = view.data();
    let values = match view.dtype() {
        Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect(),
        Dtype::I32 => data
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => {
            return Err(CheckpointError::Dtype {
                name: name.to_owned(),
                shape: view.shape().to_vec(),
                dtype: format!("{other:?}"),
                expected: "I32 or I64",
            });
        }
    };
    Ok((values, view.shape().to_vec()))
}

/// Writes `values` as the I64 tensor `name` of `shape` (e.g. a token file).
pub fn write_int_tensor(
    path: &Path,
    name: &str,
    shape: &[usize],
    values: &[i64],
) -> Result<(), CheckpointError> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::I64, shape.to_vec(), &bytes).map_err(st_err(path))?;
    let out = safetensors::serialize([(name, view)], None).map_err(st_err(path))?;
    fs::write(path, out).map_err(io_err(path))
}
