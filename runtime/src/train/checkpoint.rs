//! Run checkpoints: everything a bit-identical resume needs, in one directory
//! per step under `<run>/checkpoints/`:
//!
//! ```text
//! step-00000200/
//!   config.json            official MambaConfig   (mamba3::checkpoint)
//!   model.safetensors      official parameter names, f32
//!   optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name>, f32
//!   train_state.json       the run's whole configuration, step counters,
//!                          data fingerprint and position, file checksums
//!   ema/                   with `--ema`: the weight average, itself an
//!                          official-layout checkpoint (config.json,
//!                          model.safetensors)
//! ```
//!
//! The model files are a plain official-layout checkpoint, so `stepgraph
//! eval` (or PyTorch) loads a training checkpoint as it is.
//!
//! Writes are atomic: the directory is built as `.tmp-step-N`, every file
//! and the directory are fsynced, then it is renamed into place and the
//! parent is fsynced. A crash leaves either the previous set of checkpoints
//! or the new one, never a half-written `step-N`. After a save, the run's
//! checkpoints up to that step are pruned to the newest `keep`; newer ones
//! (which a rewound run has moved away anyway) are never touched.
//!
//! `train_state.json` records an xxh3 checksum of the other three files, so
//! a checkpoint damaged after it was written (a torn copy, a bad disk) is
//! recognised: [`find`] then falls back to the newest intact one.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read as _;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::config::RunConfig;
use super::data::{DataPosition, Fingerprint};
use super::engine::{EngineState, Moments};
use crate::mamba3::Mamba3Config;
use crate::mamba3::checkpoint::{self as model_ckpt, CheckpointError};
use crate::mamba3::cpu::{Weights, param_specs};

/// Training state file inside a checkpoint.
pub const STATE_FILE: &str = "train_state.json";
/// Optimizer moments file inside a checkpoint.
pub const OPTIM_FILE: &str = "optimizer.safetensors";
/// Subdirectory of a checkpoint holding the weight average (`--ema`).
pub const EMA_DIR: &str = "ema";
/// Subdirectory of a run holding its checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Layout version of `train_state.json` this build writes and reads.
pub const FORMAT: u32 = 2;

/// `train_state.json`: what the run is and where it stood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Layout version of this file ([`FORMAT`]).
    pub format: u32,
    /// Steps run (skipped ones included).
    pub step: u64,
    /// AdamW updates applied.
    pub adam_steps: u64,
    /// Steps skipped for non-finite gradients.
    pub skipped: u64,
    /// The run's whole configuration: `--resume` alone continues it.
    pub run: RunConfig,
    /// The engine that ran the steps so far (`cpu f32`, `cuda graph bf16`).
    pub engine: String,
    /// Size and hash of a `--data` file.
    pub data_fingerprint: Option<Fingerprint>,
    /// Training batches drawn.
    pub data_batches: u64,
    /// Word position of the training stream (decimal: JSON numbers are f64).
    pub data_word_pos: String,
    /// xxh3-64 (hex) of each other file of the checkpoint.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// A gated curriculum's clock (absent: ungated, the clock is
    /// `data_batches`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_clock: Option<u64>,
    /// A gated curriculum's smoothed loss at the saved position, and the
    /// loss of the saved step, which the gate sees after the next batch is
    /// drawn. Decimal strings: Rust prints the shortest text that parses
    /// back to the same f64, which a JSON number read as f64 need not be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_smoothed_loss: Option<String>,
    /// See `data_smoothed_loss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_last_loss: Option<String>,
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
            clock: self.data_clock.unwrap_or(self.data_batches),
            smoothed_loss: parse_loss(
                dir,
                "data_smoothed_loss",
                self.data_smoothed_loss.as_deref(),
            )?,
        })
    }

    /// The saved step's training loss, for a gated curriculum.
    pub fn last_loss(&self, dir: &Path) -> Result<Option<f64>, TrainError> {
        parse_loss(dir, "data_last_loss", self.data_last_loss.as_deref())
    }
}

fn parse_loss(dir: &Path, field: &str, text: Option<&str>) -> Result<Option<f64>, TrainError> {
    text.map(|t| {
        t.parse::<f64>().map_err(|_| TrainError::BadCheckpoint {
            dir: dir.to_path_buf(),
            reason: format!("{field} `{t}` is not a number"),
        })
    })
    .transpose()
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

/// xxh3-64 of a file's bytes, as 16 hex digits.
pub fn file_hash(path: &Path) -> Result<String, TrainError> {
    let mut file = File::open(path).map_err(TrainError::io(path))?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(TrainError::io(path))?;
        if n == 0 {
            return Ok(format!("{:016x}", hasher.digest()));
        }
        hasher.update(&buf[..n]);
    }
}

/// The files a checksum covers.
const CHECKED_FILES: [&str; 3] = [
    model_ckpt::CONFIG_FILE,
    model_ckpt::WEIGHTS_FILE,
    OPTIM_FILE,
];

/// The files of the weight average inside a checkpoint, relative to it.
fn ema_files() -> [String; 2] {
    [model_ckpt::CONFIG_FILE, model_ckpt::WEIGHTS_FILE].map(|f| format!("{EMA_DIR}/{f}"))
}

/// Writes one checkpoint atomically under `root` (with the weight average
/// `ema` in [`EMA_DIR`], when the run keeps one) and prunes the checkpoints
/// up to its step to the newest `keep` (at least 1), never one of a step in
/// `pinned` (`--keep-at`). Returns its directory.
pub fn save(
    root: &Path,
    cfg: &Mamba3Config,
    state: &EngineState,
    ema: Option<&Weights<f32>>,
    train: &TrainState,
    keep: usize,
    pinned: &[u64],
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
    let mut train = train.clone();
    let mut files: Vec<String> = CHECKED_FILES.map(str::to_owned).to_vec();
    if let Some(avg) = ema {
        model_ckpt::save(&tmp.join(EMA_DIR), cfg, avg)?;
        files.extend(ema_files());
    }
    for file in &files {
        train
            .files
            .insert(file.clone(), file_hash(&tmp.join(file))?);
    }
    let json = serde_json::to_string_pretty(&train).map_err(|e| TrainError::BadCheckpoint {
        dir: tmp.clone(),
        reason: format!("{STATE_FILE}: {e}"),
    })?;
    let state_path = tmp.join(STATE_FILE);
    fs::write(&state_path, json + "\n").map_err(TrainError::io(&state_path))?;
    files.push(STATE_FILE.to_owned());
    for file in &files {
        sync_path(&tmp.join(file))?;
    }
    if ema.is_some() {
        sync_path(&tmp.join(EMA_DIR))?;
    }
    sync_path(&tmp)?;
    let dest = root.join(&name);
    if dest.exists() {
        // Only a resumed run re-saving the step it resumed from gets here.
        fs::remove_dir_all(&dest).map_err(TrainError::io(&dest))?;
    }
    fs::rename(&tmp, &dest).map_err(TrainError::io(&dest))?;
    sync_path(root)?;
    prune(root, keep, pinned, train.step)?;
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

/// Removes the oldest checkpoints at or before `step` until `keep` of them
/// remain, besides the `pinned` steps, which are never removed nor counted.
/// Checkpoints after `step` are not this run's past: never touched.
fn prune(root: &Path, keep: usize, pinned: &[u64], step: u64) -> Result<(), TrainError> {
    let past: Vec<(u64, PathBuf)> = list(root)?
        .into_iter()
        .filter(|&(s, _)| s <= step && !pinned.contains(&s))
        .collect();
    let excess = past.len().saturating_sub(keep.max(1));
    for (_, dir) in &past[..excess] {
        fs::remove_dir_all(dir).map_err(TrainError::io(dir))?;
    }
    Ok(())
}

/// The run directory a `--resume` argument belongs to: the run of a
/// checkpoint in `<run>/checkpoints/step-N`, a run directory itself, or the
/// run of its `checkpoints/`. `None` for a checkpoint outside any run.
pub fn run_dir_for(path: &Path) -> Option<PathBuf> {
    if path.join(STATE_FILE).is_file() {
        return run_dir_of(path);
    }
    if path.join(CHECKPOINTS_DIR).is_dir() {
        return Some(path.to_path_buf());
    }
    if path.file_name()? == CHECKPOINTS_DIR {
        return path.parent().map(Path::to_path_buf);
    }
    None
}

/// A checkpoint found for `--resume`, loaded and verified.
#[derive(Debug)]
pub struct Found {
    /// Its directory.
    pub dir: PathBuf,
    /// The model.
    pub cfg: Mamba3Config,
    /// Weights, moments, counters.
    pub state: EngineState,
    /// The run and its position.
    pub train: TrainState,
    /// The weight average it saved (`--ema`), if any.
    pub ema: Option<Weights<f32>>,
    /// Newer checkpoints that could not be used, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Resolves and loads a `--resume` argument: a checkpoint directory itself
/// (which must be intact), or a run directory (or its `checkpoints/`),
/// whose newest *intact* checkpoint is taken; the unusable newer ones are
/// listed in [`Found::skipped`].
pub fn find(path: &Path) -> Result<Found, TrainError> {
    if path.join(STATE_FILE).is_file() {
        let (cfg, state, train) = load(path)?;
        let ema = load_ema(path, &cfg, &train)?;
        return Ok(Found {
            dir: path.to_path_buf(),
            cfg,
            state,
            train,
            ema,
            skipped: Vec::new(),
        });
    }
    let root = if path.join(CHECKPOINTS_DIR).is_dir() {
        path.join(CHECKPOINTS_DIR)
    } else {
        path.to_path_buf()
    };
    let mut skipped = Vec::new();
    for (_, dir) in list(&root)?.into_iter().rev() {
        match load(&dir).and_then(|(cfg, state, train)| {
            let ema = load_ema(&dir, &cfg, &train)?;
            Ok((cfg, state, train, ema))
        }) {
            Ok((cfg, state, train, ema)) => {
                return Ok(Found {
                    dir,
                    cfg,
                    state,
                    train,
                    ema,
                    skipped,
                });
            }
            Err(TrainError::BadCheckpoint { reason, .. }) => skipped.push((dir, reason)),
            Err(e) => skipped.push((dir, e.to_string())),
        }
    }
    let reason = if skipped.is_empty() {
        format!("no checkpoint here (no {STATE_FILE}, no step-* directory)")
    } else {
        let each: Vec<String> = skipped
            .iter()
            .map(|(d, why)| format!("{}: {why}", d.display()))
            .collect();
        format!("no intact checkpoint ({})", each.join("; "))
    };
    Err(TrainError::BadCheckpoint {
        dir: path.to_path_buf(),
        reason,
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
    let format = serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| bad(format!("{STATE_FILE}: {e}")))?
        .get("format")
        .and_then(serde_json::Value::as_u64);
    if format != Some(u64::from(FORMAT)) {
        return Err(bad(format!(
            "{STATE_FILE} has format {}, this build reads {FORMAT} (format 1 did not save the \
             run's settings; its weights still load with `stepgraph eval --checkpoint`)",
            format.map_or_else(|| "none".into(), |f| f.to_string())
        )));
    }
    let train: TrainState =
        serde_json::from_str(&text).map_err(|e| bad(format!("{STATE_FILE}: {e}")))?;
    for file in CHECKED_FILES {
        verify(dir, &train, file)?;
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

/// Checks that `file` of checkpoint `dir` exists and matches the checksum
/// `train_state.json` recorded for it.
fn verify(dir: &Path, train: &TrainState, file: &str) -> Result<(), TrainError> {
    let bad = |reason: String| TrainError::BadCheckpoint {
        dir: dir.to_path_buf(),
        reason,
    };
    let want = train
        .files
        .get(file)
        .ok_or_else(|| bad(format!("{STATE_FILE} has no checksum of {file}")))?;
    let path = dir.join(file);
    if !path.is_file() {
        return Err(bad(format!("{file} is missing")));
    }
    if &file_hash(&path)? != want {
        return Err(bad(format!(
            "{file} does not match its checksum (damaged or changed after it was written)"
        )));
    }
    Ok(())
}

/// The weight average of a checkpoint that [`load`] read: `None` when it
/// saved none; an error when its files are missing or fail their checksums
/// (recorded in `train_state.json` by [`save`]), or when a run that keeps an
/// average saved none after its first fold.
pub fn load_ema(
    dir: &Path,
    cfg: &Mamba3Config,
    train: &TrainState,
) -> Result<Option<Weights<f32>>, TrainError> {
    let bad = |reason: String| TrainError::BadCheckpoint {
        dir: dir.to_path_buf(),
        reason,
    };
    let listed = ema_files()
        .iter()
        .filter(|f| train.files.contains_key(*f))
        .count();
    if listed == 0 {
        if train.run.ema.is_some() && super::ema::Ema::due_by(train.step) {
            return Err(bad(format!(
                "the run keeps a weight average (--ema) but {STATE_FILE} lists no {EMA_DIR}/ files"
            )));
        }
        return Ok(None);
    }
    for file in ema_files() {
        verify(dir, train, &file)?;
    }
    let (ema_cfg, weights) = model_ckpt::load::<f32>(&dir.join(EMA_DIR))?;
    if let Some((field, found, expected)) = config_difference(&ema_cfg, cfg) {
        return Err(bad(format!(
            "{EMA_DIR}/{}: {field} is {found}, the model's is {expected}",
            model_ckpt::CONFIG_FILE
        )));
    }
    Ok(Some(weights))
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
