//! The settings of a [`RunConfig`] by flag, and what a resume does with
//! them: [`Setting`] reads each one back as the user would type it, and
//! [`merge_resume`] accepts a flag typed again with the saved value,
//! applies one of the few that may change, and refuses any other change
//! naming the flag.

use std::fmt;

use super::{AActivation, DataSpec, RunConfig, TrainError};

/// One setting of a [`RunConfig`], named by its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[expect(missing_docs, reason = "each variant is the flag of the same name")]
pub enum Setting {
    Task,
    TrainLen,
    EvalLens,
    Curriculum,
    CurriculumGate,
    CurriculumStart,
    TrainMinLen,
    SkewedRows,
    SkewDrop,
    EvalMix,
    EvalProducts,
    Data,
    DataFormat,
    VocabSize,
    EvalFraction,
    SeqLen,
    DModel,
    NLayer,
    DState,
    Headdim,
    Expand,
    FullRope,
    Rotation,
    AActivation,
    OutprojNorm,
    ChunkSize,
    DtInit,
    Device,
    Precision,
    Batch,
    Steps,
    Lr,
    MinLr,
    Warmup,
    WeightDecay,
    Beta2,
    AdamEps,
    Decay,
    Clip,
    Seed,
    DataSeed,
    InitFrom,
    EvalEvery,
    LogEvery,
    CheckpointEvery,
    Keep,
    KeepAt,
    Ema,
    Edit,
    Trim,
    Pack,
}

/// A setting a resume changed (only [`Setting::may_change`] ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The setting.
    pub setting: Setting,
    /// Its value in the saved run, as flags (`--steps 50`).
    pub from: String,
    /// Its value from now on.
    pub to: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (was {})", self.to, self.from)
    }
}

impl Setting {
    /// Every setting, in `--help` order.
    pub const ALL: [Setting; 51] = [
        Self::Task,
        Self::TrainLen,
        Self::EvalLens,
        Self::Curriculum,
        Self::CurriculumGate,
        Self::CurriculumStart,
        Self::TrainMinLen,
        Self::SkewedRows,
        Self::SkewDrop,
        Self::EvalMix,
        Self::EvalProducts,
        Self::Data,
        Self::DataFormat,
        Self::VocabSize,
        Self::EvalFraction,
        Self::SeqLen,
        Self::DModel,
        Self::NLayer,
        Self::DState,
        Self::Headdim,
        Self::Expand,
        Self::FullRope,
        Self::Rotation,
        Self::AActivation,
        Self::OutprojNorm,
        Self::ChunkSize,
        Self::DtInit,
        Self::Device,
        Self::Precision,
        Self::Batch,
        Self::Steps,
        Self::Lr,
        Self::MinLr,
        Self::Warmup,
        Self::WeightDecay,
        Self::Beta2,
        Self::AdamEps,
        Self::Decay,
        Self::Clip,
        Self::Seed,
        Self::DataSeed,
        Self::InitFrom,
        Self::EvalEvery,
        Self::LogEvery,
        Self::CheckpointEvery,
        Self::Keep,
        Self::KeepAt,
        Self::Ema,
        Self::Edit,
        Self::Trim,
        Self::Pack,
    ];

    /// The flag, e.g. `--min-lr`.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Task => "--task",
            Self::TrainLen => "--train-len",
            Self::EvalLens => "--eval-lens",
            Self::Curriculum => "--curriculum",
            Self::CurriculumGate => "--curriculum-gate",
            Self::CurriculumStart => "--curriculum-start",
            Self::TrainMinLen => "--train-min-len",
            Self::SkewedRows => "--skewed-rows",
            Self::SkewDrop => "--skew-drop",
            Self::EvalMix => "--eval-mix",
            Self::EvalProducts => "--eval-products",
            Self::Data => "--data",
            Self::DataFormat => "--data-format",
            Self::VocabSize => "--vocab-size",
            Self::EvalFraction => "--eval-fraction",
            Self::SeqLen => "--seq-len",
            Self::DModel => "--d-model",
            Self::NLayer => "--n-layer",
            Self::DState => "--d-state",
            Self::Headdim => "--headdim",
            Self::Expand => "--expand",
            Self::FullRope => "--full-rope",
            Self::Rotation => "--rotation",
            Self::AActivation => "--a-activation",
            Self::OutprojNorm => "--outproj-norm",
            Self::ChunkSize => "--chunk-size",
            Self::DtInit => "--dt-init",
            Self::Device => "--device",
            Self::Precision => "--precision",
            Self::Batch => "--batch",
            Self::Steps => "--steps",
            Self::Lr => "--lr",
            Self::MinLr => "--min-lr",
            Self::Warmup => "--warmup",
            Self::WeightDecay => "--weight-decay",
            Self::Beta2 => "--beta2",
            Self::AdamEps => "--adam-eps",
            Self::Decay => "--decay",
            Self::Clip => "--clip",
            Self::Seed => "--seed",
            Self::DataSeed => "--data-seed",
            Self::InitFrom => "--init-from",
            Self::EvalEvery => "--eval-every",
            Self::LogEvery => "--log-every",
            Self::CheckpointEvery => "--checkpoint-every",
            Self::Keep => "--keep",
            Self::KeepAt => "--keep-at",
            Self::Ema => "--ema",
            Self::Edit => "--edit",
            Self::Trim => "--trim",
            Self::Pack => "--pack",
        }
    }

    /// Whether a resume may change it. The total step count (to extend a
    /// run), the reporting and checkpoint cadence, the mixed and products
    /// eval sets (their own draws, after the other sets') and the device do
    /// not change what
    /// a step computes on one engine; `--data` may name a moved
    /// file, whose contents must still match the run's fingerprint.
    pub fn may_change(self) -> bool {
        matches!(
            self,
            Self::Steps
                | Self::EvalEvery
                | Self::LogEvery
                | Self::CheckpointEvery
                | Self::Keep
                | Self::KeepAt
                | Self::EvalMix
                | Self::EvalProducts
                | Self::Device
                | Self::Data
        )
    }

    /// The setting's value in `cfg`, as the user would type it
    /// (`--lr 0.003`, `--full-rope`, `no --full-rope`); `None` when the
    /// setting does not apply (a `--data` flag of a task run, or the reverse).
    pub fn describe(self, cfg: &RunConfig) -> Option<String> {
        let flag = self.flag();
        let with = |v: String| Some(format!("{flag} {v}"));
        let switch = |on: bool| {
            Some(if on {
                flag.to_owned()
            } else {
                format!("no {flag}")
            })
        };
        let m = &cfg.model;
        match (self, &cfg.data) {
            (Self::Task, DataSpec::Task { task, .. }) => with(task.name().into()),
            (Self::TrainLen, DataSpec::Task { train_len, .. }) => with(train_len.to_string()),
            (Self::EvalLens, DataSpec::Task { eval_lens, .. }) => with(join(eval_lens)),
            (Self::Curriculum, DataSpec::Task { curriculum, .. }) => with(curriculum.to_string()),
            (
                Self::CurriculumGate,
                DataSpec::Task {
                    curriculum_gate, ..
                },
            ) => with(curriculum_gate.to_string()),
            (
                Self::CurriculumStart,
                DataSpec::Task {
                    curriculum_start, ..
                },
            ) => with(curriculum_start.to_string()),
            (Self::TrainMinLen, DataSpec::Task { train_min_len, .. }) => {
                with(train_min_len.to_string())
            }
            (Self::SkewedRows, DataSpec::Task { skewed_rows, .. }) => with(skewed_rows.to_string()),
            (Self::SkewDrop, DataSpec::Task { skew_drop, .. }) => with(skew_drop.to_string()),
            (Self::EvalMix, DataSpec::Task { eval_mix, .. }) => {
                eval_mix.and_then(|[lo, hi]| with(format!("{lo}-{hi}")))
            }
            (Self::EvalProducts, DataSpec::Task { eval_products, .. }) => {
                eval_products.and_then(|k| with(k.to_string()))
            }
            (Self::Data, DataSpec::File { path, .. }) => with(path.display().to_string()),
            (Self::DataFormat, DataSpec::File { format, .. }) => with(format.name().into()),
            (Self::VocabSize, DataSpec::File { vocab_size, .. }) => {
                vocab_size.map(|v| format!("{flag} {v}"))
            }
            (Self::EvalFraction, DataSpec::File { eval_fraction, .. }) => {
                with(eval_fraction.to_string())
            }
            (Self::SeqLen, DataSpec::File { seq_len, .. }) => with(seq_len.to_string()),
            (
                Self::Task
                | Self::TrainLen
                | Self::EvalLens
                | Self::Curriculum
                | Self::CurriculumGate
                | Self::CurriculumStart
                | Self::TrainMinLen
                | Self::SkewedRows
                | Self::SkewDrop
                | Self::EvalMix
                | Self::EvalProducts,
                DataSpec::File { .. },
            )
            | (
                Self::Data | Self::DataFormat | Self::VocabSize | Self::EvalFraction | Self::SeqLen,
                DataSpec::Task { .. },
            ) => None,
            (Self::DModel, _) => with(m.d_model.to_string()),
            (Self::NLayer, _) => with(m.n_layer.to_string()),
            (Self::DState, _) => with(m.d_state.to_string()),
            (Self::Headdim, _) => with(m.headdim.to_string()),
            (Self::Expand, _) => with(m.expand.to_string()),
            (Self::FullRope, _) => switch(m.full_rope),
            (Self::Rotation, _) => with(m.rotation.name().into()),
            (Self::AActivation, _) => with(
                match m.a_activation {
                    AActivation::HeavyTail => "heavy-tail",
                    AActivation::Softplus => "softplus",
                }
                .into(),
            ),
            (Self::OutprojNorm, _) => switch(m.outproj_norm),
            (Self::ChunkSize, _) => with(m.chunk_size.to_string()),
            (Self::DtInit, _) => with(m.dt_init.to_string()),
            (Self::Device, _) => with(cfg.device.name().into()),
            (Self::Precision, _) => with(cfg.precision.name().into()),
            (Self::Batch, _) => with(cfg.batch.to_string()),
            (Self::Steps, _) => with(cfg.steps.to_string()),
            (Self::Lr, _) => with(cfg.lr.to_string()),
            (Self::MinLr, _) => with(cfg.min_lr.to_string()),
            (Self::Warmup, _) => with(cfg.warmup.to_string()),
            (Self::WeightDecay, _) => with(cfg.weight_decay.to_string()),
            (Self::Beta2, _) => with(cfg.beta2.to_string()),
            (Self::AdamEps, _) => with(cfg.adam_eps.to_string()),
            (Self::Decay, _) => with(cfg.decay.name().into()),
            (Self::Clip, _) => with(cfg.clip.map_or_else(|| "0".into(), |c| c.to_string())),
            (Self::Seed, _) => with(cfg.seed.to_string()),
            (Self::DataSeed, _) => cfg.data_seed.map(|s| format!("{flag} {s}")),
            (Self::InitFrom, _) => cfg
                .init_from
                .as_ref()
                .map(|p| format!("{flag} {}", p.display())),
            (Self::EvalEvery, _) => with(cfg.eval_every.to_string()),
            (Self::LogEvery, _) => with(cfg.log_every.to_string()),
            (Self::CheckpointEvery, _) => with(cfg.checkpoint_every.to_string()),
            (Self::Keep, _) => with(cfg.keep.to_string()),
            (Self::KeepAt, _) => (!cfg.keep_at.is_empty()).then(|| {
                let steps: Vec<String> = cfg.keep_at.iter().map(u64::to_string).collect();
                format!("{flag} {}", steps.join(","))
            }),
            (Self::Ema, _) => with(cfg.ema.map_or_else(|| "0".into(), |d| d.to_string())),
            (Self::Trim, _) => switch(cfg.trim),
            (Self::Pack, _) => with(cfg.pack.to_string()),
            (Self::Edit, _) => (!cfg.edits.is_empty()).then(|| {
                let edits: Vec<String> = cfg.edits.iter().map(ToString::to_string).collect();
                format!("{flag} {}", edits.join(","))
            }),
        }
    }

    /// Copies this setting from `from` into `to` (only for
    /// [`Self::may_change`] settings; the others are never applied).
    fn apply(self, from: &RunConfig, to: &mut RunConfig) {
        match self {
            Self::Steps => to.steps = from.steps,
            Self::EvalEvery => to.eval_every = from.eval_every,
            Self::LogEvery => to.log_every = from.log_every,
            Self::CheckpointEvery => to.checkpoint_every = from.checkpoint_every,
            Self::Keep => to.keep = from.keep,
            Self::KeepAt => to.keep_at.clone_from(&from.keep_at),
            Self::EvalMix => {
                if let (DataSpec::Task { eval_mix: new, .. }, DataSpec::Task { eval_mix, .. }) =
                    (&from.data, &mut to.data)
                {
                    *eval_mix = *new;
                }
            }
            Self::EvalProducts => {
                if let (
                    DataSpec::Task {
                        eval_products: new, ..
                    },
                    DataSpec::Task { eval_products, .. },
                ) = (&from.data, &mut to.data)
                {
                    *eval_products = *new;
                }
            }
            Self::Device => to.device = from.device,
            Self::Data => {
                if let (DataSpec::File { path: new, .. }, DataSpec::File { path, .. }) =
                    (&from.data, &mut to.data)
                {
                    path.clone_from(new);
                }
            }
            _ => {}
        }
    }
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The run a resume continues: `saved`, with the settings the user typed
/// again (`given`, read from `typed`) compared against it. An equal value is
/// accepted; a changed one is refused naming the flag, unless it
/// [may change](Setting::may_change), in which case it is applied and
/// returned as a [`Change`] for the log.
pub fn merge_resume(
    saved: &RunConfig,
    typed: &RunConfig,
    given: &[Setting],
) -> Result<(RunConfig, Vec<Change>), TrainError> {
    let mut merged = saved.clone();
    let mut changes = Vec::new();
    for &setting in given {
        let (before, now) = (setting.describe(saved), setting.describe(typed));
        if before == now {
            continue;
        }
        let kind_kept = !matches!(
            (&saved.data, &typed.data),
            (DataSpec::Task { .. }, DataSpec::File { .. })
                | (DataSpec::File { .. }, DataSpec::Task { .. })
        );
        if !(setting.may_change() && kind_kept) {
            return Err(TrainError::ResumeChange {
                flag: setting.flag(),
                saved: before.unwrap_or_else(|| format!("no {}", setting.flag())),
                given: now.unwrap_or_else(|| format!("no {}", setting.flag())),
            });
        }
        setting.apply(typed, &mut merged);
        changes.push(Change {
            setting,
            from: before.unwrap_or_default(),
            to: now.unwrap_or_default(),
        });
    }
    Ok((merged, changes))
}
