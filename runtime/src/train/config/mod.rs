//! What a run *is*: [`RunConfig`] holds every setting that decides the
//! numbers a run produces (data, model, device, precision, schedule,
//! optimizer, seed) and its reporting cadence. It is saved with every
//! checkpoint, so `--resume DIR` alone continues exactly that run.
//!
//! [`Setting`] names each of those settings by the flag that sets it. A
//! resume compares the flags the user typed again with the saved run: an
//! equal value is accepted, a changed one is refused naming the flag, except
//! the few that may change ([`Setting::may_change`]), which are applied and
//! logged. Validation ([`validate`], [`model_config`]) reports every problem
//! against its flag, before anything is allocated.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::TrainError;
use super::data::{DataFormat, DataSpec};
use super::edit::WeightEdit;
use crate::Precision;
use crate::mamba3::{AActivation, ConfigError, Mamba3Config, RopeAngles, RopeFraction};
use crate::optim::DecayPolicy;

mod setting;

pub use setting::{Change, Setting, merge_resume};

/// The `--chunk-size` default: the official chunk length.
pub use crate::mamba3::DEFAULT_CHUNK_SIZE;

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The GPU engine when `Gpu::new(0)` succeeds, else the CPU (with a notice).
    Auto,
    /// The CPU engine.
    Cpu,
    /// The GPU engine (an error without a usable GPU).
    Cuda,
}

impl Device {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

/// `--decay`: which tensors AdamW decays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// The 2-D matrices (embedding, projections).
    Matrices,
    /// The matrices that scale the output (embedding / LM head, every
    /// `out_proj`), not `in_proj`, whose decay and angle rows must grow
    /// large: bounded logits keep the loss, and so the pressure toward
    /// exact rotations, from vanishing once every training instance is
    /// right (README, "Seed sensitivity").
    Outputs,
    /// Every tensor.
    All,
    /// No tensor.
    None,
}

impl Decay {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Matrices => "matrices",
            Self::Outputs => "outputs",
            Self::All => "all",
            Self::None => "none",
        }
    }

    /// The optimizer's policy over a model's parameters.
    pub fn policy(self, params: &[crate::optim::Param]) -> DecayPolicy {
        match self {
            Self::Matrices => DecayPolicy::MatricesOnly,
            Self::Outputs => DecayPolicy::Names(
                params
                    .iter()
                    .filter(|p| p.matrix && !p.name.ends_with("in_proj.weight"))
                    .map(|p| p.name.clone())
                    .collect(),
            ),
            Self::All => DecayPolicy::All,
            Self::None => DecayPolicy::Nothing,
        }
    }
}

/// `--rotation`: where the state rotation's angles come from (the three
/// rows of the paper's Table 5b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rotation {
    /// Mamba-3's input-dependent angles.
    Data,
    /// Standard RoPE: fixed frequencies, independent of the input
    /// ([`RopeAngles::Fixed`]); the angle rows of every `in_proj` start at
    /// zero and never train (they would feed nothing).
    Fixed,
    /// No rotation (`--no-rotation`): the angle rows start at zero and never
    /// train, so every angle stays 0.
    None,
}

impl Rotation {
    /// Every mode, in `--help` order.
    pub const ALL: [Rotation; 3] = [Self::Data, Self::Fixed, Self::None];

    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Fixed => "fixed",
            Self::None => "none",
        }
    }

    /// The model's angle source.
    pub fn angles(self) -> RopeAngles {
        match self {
            Self::Fixed => RopeAngles::Fixed,
            Self::Data | Self::None => RopeAngles::Data,
        }
    }

    /// Whether the `in_proj` angle rows are zeroed and frozen.
    pub fn freezes_angle_rows(self) -> bool {
        self != Self::Data
    }
}

impl std::str::FromStr for Rotation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown rotation `{s}` (expected data, fixed or none)"))
    }
}

/// Runs saved before `--rotation` existed hold `"rotation": true|false`
/// (data or none); newer ones hold the mode's name.
impl<'de> Deserialize<'de> for Rotation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Saved {
            Switch(bool),
            Name(String),
        }
        match Saved::deserialize(d)? {
            Saved::Switch(true) => Ok(Self::Data),
            Saved::Switch(false) => Ok(Self::None),
            Saved::Name(n) => n.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Model size flags; the vocabulary comes from the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSize {
    /// Residual width.
    pub d_model: usize,
    /// Blocks.
    pub n_layer: usize,
    /// State size N.
    pub d_state: usize,
    /// Head dimension P.
    pub headdim: usize,
    /// `d_inner / d_model`.
    pub expand: usize,
    /// Rotate all state dims (`rope_fraction` 1.0) instead of half.
    pub full_rope: bool,
    /// Where the rotation angles come from (`--rotation`): Mamba-3's
    /// data-dependent angles, or the paper's two ablations of Table 5b,
    /// standard RoPE (`fixed`) and no rotation (`none`).
    pub rotation: Rotation,
    /// The decay map of `A` (`--a-activation`).
    #[serde(with = "a_activation_name")]
    pub a_activation: AActivation,
    /// A grouped RMSNorm of `y` before the z gate (`--outproj-norm`, the
    /// official `is_outproj_norm`; the paper finds it helps length
    /// generalization in hybrids). Absent from runs saved before it existed.
    #[serde(default)]
    pub outproj_norm: bool,
    /// Chunk length of the scan (`--chunk-size`): the same math at any
    /// chunk, a different schedule and summation order. Runs saved before
    /// it was a setting trained with the official 64.
    #[serde(default = "default_chunk_size")]
    pub chunk_size: usize,
    /// The range `dt` is drawn from at initialisation (`--dt-init`; the
    /// official `dt_min` / `dt_max`, log-uniform per head). Runs saved
    /// before it was a setting used the official range.
    #[serde(default)]
    pub dt_init: DtInit,
}

fn default_chunk_size() -> usize {
    DEFAULT_CHUNK_SIZE
}

/// The initial `dt` range of every head (`dt_bias` = softplus^-1 of a
/// log-uniform draw in `[min, max]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DtInit {
    /// Smallest initial `dt` (`ssm_cfg.dt_min`).
    pub min: f64,
    /// Largest initial `dt` (`ssm_cfg.dt_max`).
    pub max: f64,
}

/// Both bounds are validated finite and positive before a run starts
/// (`model_config`), so equality is reflexive on every value a run holds.
impl Eq for DtInit {}

impl Default for DtInit {
    /// The official range, 0.001 to 0.1.
    fn default() -> Self {
        let c = Mamba3Config::default();
        Self {
            min: c.dt_min,
            max: c.dt_max,
        }
    }
}

impl fmt::Display for DtInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.min, self.max)
    }
}

impl std::str::FromStr for DtInit {
    type Err = String;

    /// `MIN,MAX`, two positive numbers with MIN <= MAX (`0.01,0.1`).
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once(',')
            .ok_or_else(|| format!("expected MIN,MAX (e.g. 0.01,0.1), got `{s}`"))?;
        let num = |t: &str| {
            t.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("`{t}` is not a positive number"))
        };
        let (min, max) = (num(a)?, num(b)?);
        if max < min {
            return Err(format!("MIN {min} is above MAX {max}"));
        }
        Ok(Self { min, max })
    }
}

/// `AActivation` as its `config.json` name (`heavy_tail`, `softplus`).
mod a_activation_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::mamba3::AActivation;

    pub fn serialize<S: Serializer>(a: &AActivation, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(a.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<AActivation, D::Error> {
        let name = String::deserialize(d)?;
        AActivation::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown a_activation `{name}`")))
    }
}

/// Everything that defines a run, saved with each of its checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// The data (a `--data` path is stored absolute, so a resume works from
    /// any directory).
    pub data: DataSpec,
    /// Model size.
    pub model: ModelSize,
    /// Device requested.
    pub device: Device,
    /// Precision requested.
    pub precision: Precision,
    /// Rows per batch.
    pub batch: usize,
    /// Total steps (the schedule spans them).
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate of the cosine.
    pub min_lr: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW's second-moment decay. Runs saved before it was a setting
    /// load with AdamW's 0.999, which they trained with.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// AdamW's denominator epsilon. It sets the gradient size below which
    /// a step shrinks with the gradient instead of moving every weight by
    /// about the learning rate. Runs saved before it was a setting load
    /// with AdamW's 1e-8, which they trained with.
    #[serde(default = "default_adam_eps")]
    pub adam_eps: f64,
    /// Which tensors decay.
    pub decay: Decay,
    /// Global-norm clip (`None`: off).
    pub clip: Option<f64>,
    /// Seed of the initial weights, and of the data unless `data_seed`
    /// gives another.
    pub seed: u64,
    /// Seed of the data alone (training rows and eval sets; `--data-seed`);
    /// `None`: `seed`'s. Crossing the two tells whether a run's outcome
    /// follows its initial weights or the order of its rows. Runs saved
    /// before it was a setting load with `None`, which they trained with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_seed: Option<u64>,
    /// A model directory (`config.json` and `model.safetensors`, as every
    /// checkpoint and `stepgraph init` write) whose weights the run starts
    /// from instead of drawing them from `seed` (`--init-from`, stored
    /// absolute). Read once, at the run's first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// Evaluate every this many steps (and at the end); 0: only at the end.
    pub eval_every: u64,
    /// Plain progress line every this many steps.
    pub log_every: u64,
    /// Checkpoint every this many steps (and at the end); 0: only at the end.
    pub checkpoint_every: u64,
    /// Checkpoints kept (at least 1).
    pub keep: usize,
    /// Steps whose checkpoints are saved and kept besides the newest `keep`
    /// (`--keep-at`): a run's state at a point of interest, such as the
    /// end of its curriculum, for analysis after it has finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_at: Vec<u64>,
    /// Per-step decay of an exponential moving average of the weights
    /// (`--ema`; `None`: none kept). The average never feeds the training
    /// step: each evaluation scores it beside the trained weights, and
    /// checkpoints save it. Runs saved before it was a setting kept none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema: Option<f64>,
    /// Edits of the weights at given steps (`--edit PART*FACTOR@STEP`,
    /// [`super::edit`]), applied in the order given. Runs saved before it
    /// was a setting made none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<WeightEdit>,
    /// Trim each training batch to its longest row, in steps of
    /// [`TRIM_STEP`] predictions (`--trim`): a task's rows are one
    /// instance each, padded to the training size, and most of a row is
    /// padding while the curriculum is short. The same mathematics (the
    /// model is causal) in fewer tokens; the GPU engines capture their step
    /// once per width. Runs saved before it was a setting did not trim.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trim: bool,
    /// Instances laid to a training row (`--pack K`, 1: one a row): the
    /// batch's `batch` instances in `batch / K` rows ([`Batch::packed`]),
    /// each behind a reset of the model's state, cut to the fullest row.
    /// The same instances and loss in fewer positions; on the GPU, one
    /// captured graph per width. Runs saved before it was a setting
    /// packed none.
    #[serde(default = "one_a_row", skip_serializing_if = "is_one_a_row")]
    pub pack: usize,
}

fn one_a_row() -> usize {
    1
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_one_a_row(k: &usize) -> bool {
    *k == 1
}

/// The granularity of `--trim`, in predictions: coarse enough that a run
/// captures a handful of graphs (ten at 160 tokens), fine enough that a
/// batch keeps at most 15 columns of padding past its longest row.
pub const TRIM_STEP: usize = 16;

impl RunConfig {
    /// Whether the run lays several instances to a row (`--pack` above 1).
    pub fn packs(&self) -> bool {
        self.pack > 1
    }

    /// The seed the data draws from: `data_seed`, else `seed`.
    pub fn seed_of_data(&self) -> u64 {
        self.data_seed.unwrap_or(self.seed)
    }
}

/// AdamW's usual second-moment decay, the `--beta2` default.
pub const DEFAULT_BETA2: f64 = 0.999;

fn default_beta2() -> f64 {
    DEFAULT_BETA2
}

/// AdamW's usual denominator epsilon, the `--adam-eps` default.
pub const DEFAULT_ADAM_EPS: f64 = 1e-8;

fn default_adam_eps() -> f64 {
    DEFAULT_ADAM_EPS
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> TrainError {
    TrainError::InvalidOption {
        flag,
        reason: reason.into(),
    }
}

/// Checks every value a run's flags can hold; each problem names its flag.
pub fn validate(o: &RunConfig) -> Result<(), TrainError> {
    let at_least_one = [
        ("--batch", u64::try_from(o.batch).unwrap_or(u64::MAX)),
        ("--pack", u64::try_from(o.pack).unwrap_or(u64::MAX)),
        ("--steps", o.steps),
        ("--keep", u64::try_from(o.keep).unwrap_or(u64::MAX)),
        ("--log-every", o.log_every),
    ];
    for (flag, v) in at_least_one {
        if v == 0 {
            return Err(invalid(flag, "must be at least 1"));
        }
    }
    if !(o.lr.is_finite() && o.lr > 0.0) {
        return Err(invalid(
            "--lr",
            format!("must be finite and > 0, got {}", o.lr),
        ));
    }
    for (flag, v) in [("--min-lr", o.min_lr), ("--weight-decay", o.weight_decay)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(invalid(flag, format!("must be finite and >= 0, got {v}")));
        }
    }
    if !(o.beta2.is_finite() && o.beta2 > 0.0 && o.beta2 < 1.0) {
        return Err(invalid(
            "--beta2",
            format!("must be in (0, 1), got {}", o.beta2),
        ));
    }
    if !(o.adam_eps.is_finite() && o.adam_eps > 0.0) {
        return Err(invalid(
            "--adam-eps",
            format!("must be finite and > 0, got {}", o.adam_eps),
        ));
    }
    if let Some(d) = o.ema
        && !(d.is_finite() && d > 0.0 && d < 1.0)
    {
        return Err(invalid(
            "--ema",
            format!("must be in (0, 1) (0: off), got {d}"),
        ));
    }
    if o.min_lr > o.lr {
        return Err(invalid(
            "--min-lr",
            format!(
                "{} is above --lr {}: the cosine decays from --lr down to --min-lr",
                o.min_lr, o.lr
            ),
        ));
    }
    if let Some(c) = o.clip
        && !(c.is_finite() && c > 0.0)
    {
        return Err(invalid(
            "--clip",
            format!("must be finite and >= 0 (0: off), got {c}"),
        ));
    }
    match &o.data {
        DataSpec::Task {
            task,
            train_len,
            eval_lens,
            curriculum,
            curriculum_gate,
            curriculum_start,
            train_min_len,
            skewed_rows,
            skew_drop,
            eval_mix,
            eval_products,
        } => {
            if let Some(k) = *eval_products
                && (!task.has_products() || k < 1 || k > task.max_len())
            {
                return Err(invalid(
                    "--eval-products",
                    format!(
                        "probes products of K operands, 1..={}, of modarith or modarith-prec; \
                         got {k} for task {}",
                        task.max_len(),
                        task.name()
                    ),
                ));
            }
            if let Some([lo, hi]) = *eval_mix
                && (lo > hi || lo < task.min_len() || hi > task.max_len())
            {
                return Err(invalid(
                    "--eval-mix",
                    format!(
                        "{lo}-{hi} is not a range LO-HI (LO <= HI) inside {}..={} for task {}",
                        task.min_len(),
                        task.max_len(),
                        task.name()
                    ),
                ));
            }
            if !(0.0..1.0).contains(skew_drop) {
                return Err(invalid(
                    "--skew-drop",
                    format!(
                        "is the probability that a symbol is left out of a skewed row, in 0..1; \
                         got {skew_drop}"
                    ),
                ));
            }
            if *skew_drop > 0.0 && *skewed_rows == 0.0 {
                return Err(invalid(
                    "--skew-drop",
                    "leaves symbols out of skewed rows: give --skewed-rows F (> 0) too",
                ));
            }
            if !(0.0..=1.0).contains(skewed_rows) {
                return Err(invalid(
                    "--skewed-rows",
                    format!("is a fraction of the training rows, in 0..=1; got {skewed_rows}"),
                ));
            }
            if *skewed_rows > 0.0 && !task.skewable() {
                return Err(invalid(
                    "--skewed-rows",
                    format!(
                        "skews the values and operators of a state-tracking row (parity, \
                         modarith, modarith-prec, modarith-brackets[-nomult]); {} has none",
                        task.name()
                    ),
                ));
            }
            if *curriculum_start > 0 && *curriculum == 0 {
                return Err(invalid(
                    "--curriculum-start",
                    "starts a curriculum: give --curriculum N (the steps it grows over) too",
                ));
            }
            if *curriculum_start > *train_len {
                return Err(invalid(
                    "--curriculum-start",
                    format!(
                        "{curriculum_start} is above --train-len {train_len}: the curriculum grows \
                         from it to --train-len (0: from the task's smallest size)"
                    ),
                ));
            }
            if *train_min_len > *train_len {
                return Err(invalid(
                    "--train-min-len",
                    format!(
                        "{train_min_len} is above --train-len {train_len}: rows are drawn \
                         between the two (0: from the task's smallest size)"
                    ),
                ));
            }
            if !(curriculum_gate.is_finite() && *curriculum_gate >= 0.0) {
                return Err(invalid(
                    "--curriculum-gate",
                    format!("must be finite and >= 0 (0: off), got {curriculum_gate}"),
                ));
            }
            if *curriculum_gate > 0.0 && *curriculum == 0 {
                return Err(invalid(
                    "--curriculum-gate",
                    "gates a curriculum: give --curriculum N (the steps it grows over) too",
                ));
            }
            for (flag, n) in std::iter::once(("--train-len", *train_len))
                .chain(eval_lens.iter().map(|&n| ("--eval-lens", n)))
            {
                if n < task.min_len() || n > task.max_len() {
                    return Err(invalid(
                        flag,
                        format!(
                            "{n} is outside {}..={} for task {}",
                            task.min_len(),
                            task.max_len(),
                            task.name()
                        ),
                    ));
                }
            }
        }
        DataSpec::File {
            format,
            vocab_size,
            eval_fraction,
            seq_len,
            ..
        } => {
            if !(eval_fraction.is_finite() && *eval_fraction > 0.0 && *eval_fraction < 1.0) {
                return Err(invalid(
                    "--eval-fraction",
                    format!("must lie in (0, 1), got {eval_fraction}"),
                ));
            }
            if *seq_len == 0 {
                return Err(invalid("--seq-len", "must be at least 1"));
            }
            match (format, vocab_size) {
                (DataFormat::Bytes, Some(_)) => {
                    return Err(invalid(
                        "--vocab-size",
                        "only for --data-format u16|u32 (bytes have vocabulary 256)",
                    ));
                }
                (DataFormat::U16 | DataFormat::U32, None) => {
                    return Err(invalid(
                        "--vocab-size",
                        format!("required with --data-format {}", format.name()),
                    ));
                }
                (_, Some(0)) => return Err(invalid("--vocab-size", "must be at least 1")),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The vocabulary the data implies (checked by [`validate`]).
pub fn vocab_of(data: &DataSpec) -> usize {
    match data {
        DataSpec::Task { task, .. } => task.vocab_size(),
        DataSpec::File { vocab_size, .. } => vocab_size.unwrap_or(256),
    }
}

/// The model of a run, each problem reported against its flag.
pub fn model_config(size: ModelSize, vocab: usize) -> Result<Mamba3Config, TrainError> {
    let cfg = Mamba3Config {
        d_model: size.d_model,
        n_layer: size.n_layer,
        vocab_size: vocab,
        d_state: size.d_state,
        headdim: size.headdim,
        expand: size.expand,
        rope_fraction: if size.full_rope {
            RopeFraction::Full
        } else {
            RopeFraction::Half
        },
        a_activation: size.a_activation,
        rope_angles: size.rotation.angles(),
        is_outproj_norm: size.outproj_norm,
        chunk_size: size.chunk_size,
        dt_min: size.dt_init.min,
        dt_max: size.dt_init.max,
        ..Mamba3Config::default()
    };
    cfg.validate().map_err(|e| flag_error(&size, e))?;
    Ok(cfg)
}

/// A config error about a field the flags set, restated with the flags.
fn flag_error(size: &ModelSize, e: ConfigError) -> TrainError {
    let ConfigError::Invalid { field, reason } = &e else {
        return TrainError::Config(e);
    };
    let flag = match field.as_str() {
        "d_model" => "--d-model",
        "n_layer" => "--n-layer",
        "vocab_size" => "--vocab-size",
        "ssm_cfg.d_state" => "--d-state",
        "ssm_cfg.expand" => "--expand",
        "ssm_cfg.headdim" => "--headdim",
        "ssm_cfg.chunk_size" => "--chunk-size",
        "ssm_cfg.dt_min" | "ssm_cfg.dt_max" => "--dt-init",
        _ => return TrainError::Config(e),
    };
    let reason = match flag {
        "--headdim" => format!(
            "{} must divide d_inner = --expand {} x --d-model {}; pick a --d-model whose \
             expand x d_model is a multiple of --headdim, or a smaller --headdim",
            size.headdim, size.expand, size.d_model
        ),
        _ => reason.clone(),
    };
    invalid(flag, reason)
}

#[cfg(test)]
mod tests {
    use super::Rotation;

    #[test]
    fn outputs_decay_every_matrix_but_in_proj() {
        let cfg = crate::mamba3::Mamba3Config::tiny();
        let params = crate::step::params(&cfg);
        let policy = super::Decay::Outputs.policy(&params);
        let decayed: Vec<&str> = params
            .iter()
            .filter(|p| policy.decays(p))
            .map(|p| p.name.as_str())
            .collect();
        assert!(decayed.iter().any(|n| n.ends_with("embedding.weight")));
        assert_eq!(
            decayed
                .iter()
                .filter(|n| n.ends_with("out_proj.weight"))
                .count(),
            cfg.n_layer
        );
        assert!(
            !decayed
                .iter()
                .any(|n| n.contains("in_proj") || n.contains("norm"))
        );
    }

    #[test]
    fn a_model_saved_before_chunk_size_was_a_setting_reads_as_64() {
        let saved = r#"{"d_model":8,"n_layer":1,"d_state":8,"headdim":4,"expand":2,
            "full_rope":false,"rotation":"data","a_activation":"softplus"}"#;
        let size: super::ModelSize = serde_json::from_str(saved).unwrap();
        assert_eq!(size.chunk_size, super::DEFAULT_CHUNK_SIZE);
        assert_eq!(super::DEFAULT_CHUNK_SIZE, 64, "the official default");
        assert_eq!(
            size.dt_init,
            super::DtInit {
                min: 0.001,
                max: 0.1
            },
            "the official range"
        );
    }

    #[test]
    fn dt_init_reads_min_max_and_refuses_anything_else() {
        let ok: super::DtInit = "0.01,0.1".parse().unwrap();
        assert_eq!((ok.min, ok.max), (0.01, 0.1));
        assert_eq!(ok.to_string(), "0.01,0.1", "prints as it parses");
        assert_eq!("0.05, 0.05".parse::<super::DtInit>().unwrap().max, 0.05);
        for (bad, says) in [
            ("0.1", "expected MIN,MAX"),
            ("0.1,0.01", "MIN 0.1 is above MAX 0.01"),
            ("0,0.1", "`0` is not a positive number"),
            ("0.01,inf", "`inf` is not a positive number"),
            ("a,0.1", "`a` is not a positive number"),
        ] {
            let e = bad.parse::<super::DtInit>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_dt_init_range_reaches_the_model_and_its_initial_weights() {
        let size = super::ModelSize {
            dt_init: super::DtInit {
                min: 0.02,
                max: 0.05,
            },
            ..a_run().model
        };
        let cfg = super::model_config(size, 4).unwrap();
        assert_eq!((cfg.dt_min, cfg.dt_max), (0.02, 0.05));
        let w = crate::mamba3::cpu::Weights::<f64>::init(&cfg, 3).unwrap();
        for l in &w.layers {
            for &b in &l.dt_bias {
                let dt = b.exp().ln_1p();
                assert!((0.02 - 1e-12..=0.05 + 1e-12).contains(&dt), "{dt}");
            }
        }
        // A range the model refuses is reported against the flag.
        let e = super::model_config(
            super::ModelSize {
                dt_init: super::DtInit {
                    min: 0.1,
                    max: 0.01,
                },
                ..size
            },
            4,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--dt-init"), "{e}");
    }

    #[test]
    fn rotation_reads_runs_saved_before_it_and_round_trips() {
        let read = |s: &str| serde_json::from_str::<Rotation>(s).unwrap();
        assert_eq!(read("true"), Rotation::Data, "a run saved with rotation on");
        assert_eq!(read("false"), Rotation::None, "a --no-rotation run");
        for r in Rotation::ALL {
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(text, format!("\"{}\"", r.name()));
            assert_eq!(read(&text), r);
        }
        assert!(serde_json::from_str::<Rotation>("\"spin\"").is_err());
    }

    /// [`a_run`] on `data` after `set` changed it.
    fn task_run(
        mut data: crate::train::data::DataSpec,
        set: impl FnOnce(&mut crate::train::data::DataSpec),
    ) -> super::RunConfig {
        set(&mut data);
        super::RunConfig { data, ..a_run() }
    }

    fn a_run() -> super::RunConfig {
        use crate::train::data::{DataSpec, Task};
        super::RunConfig {
            data: DataSpec::task(Task::Parity, 6, vec![6, 12]),
            model: super::ModelSize {
                d_model: 8,
                n_layer: 1,
                d_state: 8,
                headdim: 4,
                expand: 2,
                full_rope: false,
                rotation: Rotation::Data,
                a_activation: crate::mamba3::AActivation::Softplus,
                outproj_norm: false,
                chunk_size: super::DEFAULT_CHUNK_SIZE,
                dt_init: super::DtInit::default(),
            },
            device: super::Device::Cpu,
            precision: crate::Precision::F32,
            batch: 4,
            steps: 10,
            lr: 1e-3,
            min_lr: 1e-5,
            warmup: 2,
            weight_decay: 0.1,
            beta2: 0.95,
            adam_eps: super::DEFAULT_ADAM_EPS,
            decay: super::Decay::Outputs,
            clip: Some(1.0),
            seed: 1,
            data_seed: None,
            init_from: None,
            eval_every: 5,
            log_every: 5,
            checkpoint_every: 0,
            keep: 1,
            keep_at: Vec::new(),
            ema: None,
            edits: Vec::new(),
            trim: false,
            pack: 1,
        }
    }

    /// `run` as a run saved before `field` was a setting would load.
    fn saved_without(run: &super::RunConfig, field: &str) -> super::RunConfig {
        let mut json = serde_json::to_value(run).unwrap();
        json.as_object_mut().unwrap().remove(field).unwrap();
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn runs_saved_before_beta2_load_with_adamw_default() {
        let old = saved_without(&a_run(), "beta2");
        assert_eq!(old.beta2, super::DEFAULT_BETA2);
        assert_eq!(
            super::DEFAULT_BETA2,
            crate::optim::AdamWConfig::default().beta2
        );
    }

    #[test]
    fn runs_saved_before_data_seed_draw_their_data_from_the_seed() {
        let run = super::RunConfig {
            data_seed: Some(9),
            ..a_run()
        };
        assert_eq!(serde_json::to_value(&run).unwrap()["data_seed"], 9);
        assert_eq!(run.seed_of_data(), 9);
        let old = saved_without(&run, "data_seed");
        assert_eq!((old.data_seed, old.seed_of_data()), (None, 1));
        // Unset, it is not written, so a saved run reads as before it existed.
        assert!(
            serde_json::to_value(a_run())
                .unwrap()
                .get("data_seed")
                .is_none()
        );
    }

    #[test]
    fn runs_saved_before_adam_eps_load_with_adamw_default() {
        let run = super::RunConfig {
            adam_eps: 1e-5,
            ..a_run()
        };
        assert_eq!(serde_json::to_value(&run).unwrap()["adam_eps"], 1e-5);
        let old = saved_without(&run, "adam_eps");
        assert_eq!(old.adam_eps, super::DEFAULT_ADAM_EPS);
        assert_eq!(
            super::DEFAULT_ADAM_EPS,
            crate::optim::AdamWConfig::default().eps
        );
    }

    #[test]
    fn runs_saved_before_skewed_rows_load_with_uniform_rows_and_bad_fractions_are_refused() {
        use crate::train::data::{DataSpec, Task};
        let with_drop = |task, rows, drop| {
            task_run(DataSpec::task(task, 6, vec![6]), |spec| {
                if let DataSpec::Task {
                    skewed_rows,
                    skew_drop,
                    ..
                } = spec
                {
                    (*skewed_rows, *skew_drop) = (rows, drop);
                }
            })
        };
        let with = |task, skewed_rows| with_drop(task, skewed_rows, 0.0);
        let mut json = serde_json::to_value(with(Task::Parity, 0.5)).unwrap();
        json["data"]
            .as_object_mut()
            .unwrap()
            .remove("skewed_rows")
            .unwrap();
        json["data"]
            .as_object_mut()
            .unwrap()
            .remove("skew_drop")
            .unwrap();
        let old: super::RunConfig = serde_json::from_value(json).unwrap();
        assert!(matches!(old.data, DataSpec::Task { skewed_rows, .. } if skewed_rows == 0.0));
        super::validate(&with(Task::ModarithBrackets, 1.0)).unwrap();
        for (task, bad) in [(Task::Parity, 1.5), (Task::Parity, -0.1), (Task::Copy, 0.5)] {
            let err = super::validate(&with(task, bad)).unwrap_err().to_string();
            assert!(err.contains("--skewed-rows"), "{task:?} {bad}: {err}");
        }
        super::validate(&with_drop(Task::ModarithPrec, 0.5, 0.5)).unwrap();
        for (rows, drop) in [(0.5, 1.0), (0.5, -0.5), (0.5, f64::NAN), (0.0, 0.5)] {
            let err = super::validate(&with_drop(Task::ModarithPrec, rows, drop))
                .unwrap_err()
                .to_string();
            assert!(err.contains("--skew-drop"), "{rows} {drop}: {err}");
        }
    }

    #[test]
    fn a_mixed_eval_set_must_lie_inside_the_tasks_sizes() {
        use crate::train::data::{DataSpec, Task};
        let with = |mix| {
            task_run(DataSpec::task(Task::ModarithPrec, 8, vec![8]), |spec| {
                if let DataSpec::Task { eval_mix, .. } = spec {
                    *eval_mix = mix;
                }
            })
        };
        super::validate(&with(Some([2, 16]))).unwrap();
        super::validate(&with(None)).unwrap();
        let too_big = Task::ModarithPrec.max_len() + 1;
        for bad in [[16, 2], [0, 8], [2, too_big]] {
            let err = super::validate(&with(Some(bad))).unwrap_err().to_string();
            assert!(err.contains("--eval-mix"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_products_probe_needs_an_arithmetic_without_brackets() {
        use crate::train::data::{DataSpec, Task};
        let with = |task, k| {
            task_run(DataSpec::task(task, 8, vec![8]), |spec| {
                if let DataSpec::Task { eval_products, .. } = spec {
                    *eval_products = k;
                }
            })
        };
        super::validate(&with(Task::ModarithPrec, Some(8))).unwrap();
        super::validate(&with(Task::Modarith, Some(1))).unwrap();
        super::validate(&with(Task::Parity, None)).unwrap();
        for (task, k) in [
            (Task::Parity, 8),
            (Task::ModarithBrackets, 8),
            (Task::ModarithPrec, 0),
        ] {
            let err = super::validate(&with(task, Some(k)))
                .unwrap_err()
                .to_string();
            assert!(err.contains("--eval-products"), "{task:?} {k}: {err}");
        }
    }

    #[test]
    fn adam_eps_must_be_finite_and_positive() {
        for bad in [0.0, -1e-8, f64::NAN, f64::INFINITY] {
            let run = super::RunConfig {
                adam_eps: bad,
                ..a_run()
            };
            let err = super::validate(&run).unwrap_err().to_string();
            assert!(err.contains("--adam-eps"), "{bad}: {err}");
        }
        super::validate(&super::RunConfig {
            adam_eps: 1e-5,
            ..a_run()
        })
        .unwrap();
    }

    #[test]
    fn beta2_outside_the_open_unit_interval_is_refused_by_name() {
        for bad in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
            let run = super::RunConfig {
                beta2: bad,
                ..a_run()
            };
            let err = super::validate(&run).unwrap_err().to_string();
            assert!(err.contains("--beta2"), "{bad}: {err}");
        }
        super::validate(&super::RunConfig {
            beta2: 0.95,
            ..a_run()
        })
        .unwrap();
    }

    #[test]
    fn ema_decay_outside_the_open_unit_interval_is_refused_by_name() {
        for bad in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
            let run = super::RunConfig {
                ema: Some(bad),
                ..a_run()
            };
            let err = super::validate(&run).unwrap_err().to_string();
            assert!(err.contains("--ema"), "{bad}: {err}");
        }
        let run = super::RunConfig {
            ema: Some(0.999),
            ..a_run()
        };
        super::validate(&run).unwrap();
        assert_eq!(
            super::Setting::Ema.describe(&run).as_deref(),
            Some("--ema 0.999")
        );
        // Runs saved before the setting kept no average, and one without an
        // average does not write the key.
        let json = serde_json::to_value(a_run()).unwrap();
        assert!(json.get("ema").is_none());
        let old: super::RunConfig = serde_json::from_value(json).unwrap();
        assert_eq!(old.ema, None);
    }
}
