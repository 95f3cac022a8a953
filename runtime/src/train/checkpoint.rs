//! Run checkpoints: everything a bit-identical resume needs, in one directory
//! per step under `<run>/checkpoints/`:
//!
//! ```text
//! step-00000200/
//!   config.json            official MambaConfig   (mamba3::checkpoint)
//!   model.safetensors      official parameter names, f32
//!   optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name>, f32
//!   train_state.json       step counters, seed, data spec and position
//! ```
//!
//! The model files are a plain official-layout checkpoint, so `stepgraph
//! eval` (or PyTorch) loads a training checkpoint as it is.
//!
//! Writes are atomic: the directory is built as `.tmp-step-N`, every file
//! and the directory are fsynced, then it is renamed into place and the
//! parent is fsynced. A crash leaves either the previous set of checkpoints
//! or the new one, never a half-written `step-N`. After a save, only the
//! newest `keep` checkpoints remain.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::data::{DataPosition, DataSpec};
use super::engine::{EngineState, Moments};
use crate::mamba3::Mamba3Config;
use crate::mamba3::checkpoint::{self as model_ckpt, CheckpointError};
use crate::mamba3::cpu::param_specs;

/// Training state file inside a checkpoint.
pub const STATE_FILE: &str = "train_state.json";
/// Optimizer moments file inside a checkpoint.
pub const OPTIM_FILE: &str = "optimizer.safetensors";
/// Subdirectory of a run holding its checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
const FORMAT: u32 = 1;

/// `train_state.json`: what the run was and where it stood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Layout version of this file.
    pub format: u32,
    /// Steps run (skipped ones included).
    pub step: u64,
    /// AdamW updates applied.
    pub adam_steps: u64,
    /// Steps skipped for non-finite gradients.
    pub skipped: u64,
    /// The run's seed.
    pub seed: u64,
    /// Batch rows.
    pub batch: usize,
    /// `f32` or `bf16`.
    pub precision: String,
    /// The data the run trains on.
    pub data: DataSpec,
    /// Whether the states rotate (`false`: the `--no-rotation` ablation).
    #[serde(default = "yes")]
    pub rotation: bool,
    /// Training batches drawn.
    pub data_batches: u64,
    /// Word position of the training stream (decimal: JSON numbers are f64).
    pub data_word_pos: String,
}

impl TrainState {
    /// The saved data position.
    pub fn data_position(&self, dir: &Path) -> Result<DataPosition, TrainError> {
        let word_pos = self
            .data_word_pos
            .parse()
            .map_err(|_| TrainError::BadCheckpoint {
                dir: dir.to_path_buf(),
                reason: format!("data_word_pos `{}` is not a number", self.data_word_pos),
            })?;
        Ok(DataPosition {
            batches: self.data_batches,
            word_pos,
        })
    }
}

fn yes() -> bool {
    true
}

/// Name of the checkpoint directory of step `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

fn sync_path(path: &Path) -> Result<(), TrainError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(TrainError::io(path))
}

/// Writes one checkpoint atomically under `root` and prunes all but the
/// newest `keep` (at least 1). Returns its directory.
pub fn save(
    root: &Path,
    cfg: &Mamba3Config,
    state: &EngineState,
    train: &TrainState,
    keep: usize,
) -> Result<PathBuf, TrainError> {
    fs::create_dir_all(root).map_err(TrainError::io(root))?;
    let name = step_dir_name(train.step);
    let tmp = root.join(format!(".tmp-{name}"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(TrainError::io(&tmp))?;
    }
    model_ckpt::save(&tmp, cfg, &state.weights)?;
    let specs = param_specs(cfg);
    let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::with_capacity(2 * specs.len());
    for (spec, (m, v)) in specs.iter().zip(&state.moments) {
        tensors.push((format!("exp_avg.{}", spec.name), spec.shape.clone(), m));
        tensors.push((format!("exp_avg_sq.{}", spec.name), spec.shape.clone(), v));
    }
    model_ckpt::write_tensors(&tmp.join(OPTIM_FILE), &tensors)?;
    let json = serde_json::to_string_pretty(train).unwrap_or_default();
    let state_path = tmp.join(STATE_FILE);
    fs::write(&state_path, json + "\n").map_err(TrainError::io(&state_path))?;
    for file in [
        model_ckpt::CONFIG_FILE,
        model_ckpt::WEIGHTS_FILE,
        OPTIM_FILE,
        STATE_FILE,
    ] {
        sync_path(&tmp.join(file))?;
    }
    sync_path(&tmp)?;
    let dest = root.join(&name);
    if dest.exists() {
        // Only a resumed run re-saving the step it resumed from gets here.
        fs::remove_dir_all(&dest).map_err(TrainError::io(&dest))?;
    }
    fs::rename(&tmp, &dest).map_err(TrainError::io(&dest))?;
    sync_path(root)?;
    prune(root, keep)?;
    Ok(dest)
}

/// Checkpoint directories under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(TrainError::io(root)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(TrainError::io(root))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn prune(root: &Path, keep: usize) -> Result<(), TrainError> {
    let all = list(root)?;
    let excess = all.len().saturating_sub(keep.max(1));
    for (_, dir) in &all[..excess] {
        fs::remove_dir_all(dir).map_err(TrainError::io(dir))?;
    }
    Ok(())
}

/// Resolves a `--resume` argument: a checkpoint directory itself, or a run
/// directory (or its `checkpoints/`) whose newest checkpoint is taken.
pub fn resolve(path: &Path) -> Result<PathBuf, TrainError> {
    if path.join(STATE_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    for root in [path.join(CHECKPOINTS_DIR), path.to_path_buf()] {
        if let Some((_, dir)) = list(&root)?.pop() {
            return Ok(dir);
        }
    }
    Err(TrainError::BadCheckpoint {
        dir: path.to_path_buf(),
        reason: format!("no checkpoint here (no {STATE_FILE}, no step-* directory)"),
    })
}

/// The run directory a checkpoint belongs to (`<run>/checkpoints/step-N`).
pub fn run_dir_of(ckpt: &Path) -> Option<PathBuf> {
    let root = ckpt.parent()?;
    (root.file_name()? == CHECKPOINTS_DIR).then(|| root.parent().map(Path::to_path_buf))?
}

/// Reads a checkpoint written by [`save`].
pub fn load(dir: &Path) -> Result<(Mamba3Config, EngineState, TrainState), TrainError> {
    let bad = |reason: String| TrainError::BadCheckpoint {
        dir: dir.to_path_buf(),
        reason,
    };
    let state_path = dir.join(STATE_FILE);
    let text = fs::read_to_string(&state_path).map_err(TrainError::io(&state_path))?;
    let train: TrainState =
        serde_json::from_str(&text).map_err(|e| bad(format!("{STATE_FILE}: {e}")))?;
    if train.format != FORMAT {
        return Err(bad(format!(
            "{STATE_FILE} has format {}, this build reads {FORMAT}",
            train.format
        )));
    }
    let (cfg, weights) = model_ckpt::load::<f32>(dir)?;
    let optim_path = dir.join(OPTIM_FILE);
    let bytes = fs::read(&optim_path).map_err(TrainError::io(&optim_path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|source| CheckpointError::SafeTensors {
        path: optim_path.clone(),
        source,
    })?;
    let mut moments: Vec<Moments> = Vec::new();
    for spec in param_specs(&cfg) {
        let mut pair = Vec::with_capacity(2);
        for prefix in ["exp_avg", "exp_avg_sq"] {
            let name = format!("{prefix}.{}", spec.name);
            let view = st.tensor(&name).map_err(|_| CheckpointError::Missing {
                name: name.clone(),
                expected: spec.shape.clone(),
            })?;
            if view.shape() != spec.shape.as_slice() {
                return Err(CheckpointError::Shape {
                    name,
                    expected: spec.shape.clone(),
                    found: view.shape().to_vec(),
                }
                .into());
            }
            pair.push(model_ckpt::float_values::<f32>(&name, &view)?);
        }
        let v = pair.pop().unwrap_or_default();
        let m = pair.pop().unwrap_or_default();
        moments.push((m, v));
    }
    let state = EngineState {
        weights,
        moments,
        adam_steps: train.adam_steps,
        steps: train.step,
        skipped: train.skipped,
    };
    Ok((cfg, state, train))
}

pub use model_ckpt::config_to_json;

/// The first setting in which two model configs differ, as
/// `(field, found, expected)`, comparing their `config.json` forms.
pub fn config_difference(
    found: &Mamba3Config,
    expected: &Mamba3Config,
) -> Option<(String, String, String)> {
    let (Ok(a), Ok(b)) = (config_to_json(found), config_to_json(expected)) else {
        return Some((
            "config".into(),
            format!("{found:?}"),
            format!("{expected:?}"),
        ));
    };
    first_difference("", &a, &b)
}

fn first_difference(
    prefix: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let field = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let (va, vb) = (x.get(k), y.get(k));
                match (va, vb) {
                    (Some(va), Some(vb)) => first_difference(&field, va, vb),
                    _ => Some((field, show(va), show(vb))),
                }
            })
        }
        _ if a == b => None,
        _ => Some((prefix.to_owned(), a.to_string(), b.to_string())),
    }
}

fn show(v: Option<&serde_json::Value>) -> String {
    v.map_or_else(|| "absent".into(), serde_json::Value::to_string)
}
