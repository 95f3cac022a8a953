//! Model configuration: the official `MambaLMHeadModel` + `Mamba3` (SISO)
//! hyper-parameters, their defaults, validation and derived sizes.
//!
//! One `Mamba3Config` describes a model for every implementation (CPU oracle,
//! GPU f32, GPU mixed precision), so sizes are computed here once.
//! Field names follow the official Python code; `config.json` (de)serialization
//! lives in [`super::checkpoint`].

use thiserror::Error;

/// A configuration that cannot describe a model. Each variant names the field.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// A field holds a value the model cannot use.
    #[error("config field `{field}`: {reason}")]
    Invalid {
        /// The offending field (dotted for nested ones, e.g. `ssm_cfg.d_state`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `config.json` holds a field this implementation does not know.
    #[error("config.json: unknown field `{field}`")]
    UnknownField {
        /// The unknown field (dotted when nested).
        field: String,
    },
    /// `config.json` lacks a field that has no default.
    #[error("config.json: missing required field `{field}`")]
    MissingField {
        /// The missing field.
        field: String,
    },
    /// `config.json` is not JSON, or not a JSON object.
    #[error("config.json: {reason}")]
    Syntax {
        /// The parser's message.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }
}

/// The map `f` from the `dd_A` projection to the decay rate, `A = -max(f(dd_A), A_floor)`.
///
/// The official code's head (since PR #962) uses the heavy-tail map; the
/// paper and the first release used softplus. The two differ in how hard a
/// rate near zero (a state kept over hundreds of tokens) is to learn:
/// softplus reaches `A = 1e-3` at `dd_A = -6.9`, the heavy-tail map only at
/// `dd_A = -999`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AActivation {
    /// `1 + x` for `x >= 0`, `1 / (1 - x)` below (official default).
    #[default]
    HeavyTail,
    /// `ln(1 + e^x)`, as in the Mamba-3 paper.
    Softplus,
}

impl AActivation {
    /// The name `config.json` and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            Self::HeavyTail => "heavy_tail",
            Self::Softplus => "softplus",
        }
    }

    /// Parses [`Self::name`]'s output.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "heavy_tail" => Some(Self::HeavyTail),
            "softplus" => Some(Self::Softplus),
            _ => None,
        }
    }
}

/// Where the state rotation's angles come from.
///
/// Mamba-3's rotation is data-dependent: each token advances the angle of
/// head `h`, pair `s` by `dt_t[h] * pi * tanh(angles_t[s])`. The paper's
/// "standard RoPE" ablation (Table 5b) replaces that by data-independent
/// angles: every token advances pair `s` by the fixed frequency
/// `omega_s = 10000^(-s / S)` of rotary position embeddings (Su et al.),
/// whatever the input and the head, so `phi_t = (t + 1) omega_s` and the
/// angle projections are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeAngles {
    /// Input-dependent angles (Mamba-3, the official code).
    #[default]
    Data,
    /// Fixed RoPE frequencies, independent of the input.
    Fixed,
}

/// The base of the fixed RoPE frequencies (the standard 10000).
pub const ROPE_BASE: f64 = 10_000.0;

impl RopeAngles {
    /// The name `config.json` uses (`ssm_cfg.rope_angles`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Fixed => "fixed",
        }
    }

    /// Parses [`Self::name`]'s output.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "data" => Some(Self::Data),
            "fixed" => Some(Self::Fixed),
            _ => None,
        }
    }
}

/// How many of the `d_state` dims are rotated: half (the default) or all.
///
/// The official module asserts `rope_fraction in [0.5, 1.0]`, so only these two
/// values exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeFraction {
    /// `rope_fraction = 0.5`: the first `d_state / 2` dims rotate.
    Half,
    /// `rope_fraction = 1.0`: every state dim rotates.
    Full,
}

impl RopeFraction {
    /// The value as written in `config.json`.
    pub fn as_f64(self) -> f64 {
        match self {
            Self::Half => 0.5,
            Self::Full => 1.0,
        }
    }

    /// Parses the official float value; anything else is an error naming the field.
    pub fn from_f64(v: f64) -> Result<Self, ConfigError> {
        if v == 0.5 {
            Ok(Self::Half)
        } else if v == 1.0 {
            Ok(Self::Full)
        } else {
            Err(ConfigError::invalid(
                "ssm_cfg.rope_fraction",
                format!("must be 0.5 or 1.0 (as in the official Mamba3), got {v}"),
            ))
        }
    }
}

/// Hyper-parameters of a Mamba-3 SISO language model (official
/// `MambaLMHeadModel` with `ssm_cfg = {"layer": "Mamba3", ...}`, no MLP, no
/// attention layers, RMSNorm everywhere).
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba3Config {
    /// Residual stream width.
    pub d_model: usize,
    /// Number of (RMSNorm -> Mamba3 -> residual add) blocks.
    pub n_layer: usize,
    /// Vocabulary size as given; the embedding is padded up to
    /// `pad_vocab_size_multiple` (see [`Self::padded_vocab_size`]).
    pub vocab_size: usize,
    /// The embedding/LM head row count is rounded up to a multiple of this.
    pub pad_vocab_size_multiple: usize,
    /// LM head shares the embedding matrix (official default `true`).
    pub tie_embeddings: bool,
    /// State size N per head.
    pub d_state: usize,
    /// `d_inner = expand * d_model`.
    pub expand: usize,
    /// Head dimension P; `nheads = d_inner / headdim`.
    pub headdim: usize,
    /// Number of B/C groups (heads share B/C within a group).
    pub ngroups: usize,
    /// Fraction of state dims rotated by the data-dependent RoPE.
    pub rope_fraction: RopeFraction,
    /// Lower end of the `dt` range `dt_bias` is initialised from.
    pub dt_min: f64,
    /// Upper end of the `dt` range `dt_bias` is initialised from.
    pub dt_max: f64,
    /// Floor applied to the sampled `dt` before inverting softplus.
    pub dt_init_floor: f64,
    /// `A = -max(f(dd_A), A_floor)`.
    pub a_floor: f64,
    /// The `f` above: the official code's heavy-tail map or the paper's softplus.
    pub a_activation: AActivation,
    /// Input-dependent rotation angles (Mamba-3) or fixed RoPE frequencies.
    pub rope_angles: RopeAngles,
    /// Grouped RMSNorm (group = headdim) on y before the z gate.
    pub is_outproj_norm: bool,
    /// Chunk length of the chunked scan (official default 64).
    pub chunk_size: usize,
    /// Epsilon of every RMSNorm (official `norm_epsilon` and the mixer norms: 1e-5).
    pub norm_eps: f64,
    /// Recorded for `config.json`; the f64 oracle keeps everything in f64 anyway.
    pub residual_in_fp32: bool,
    /// Recorded for `config.json`; a kernel-fusion switch with no effect on the math.
    pub fused_add_norm: bool,
}

/// The official scan chunk length (`ssm_cfg.chunk_size`), the default of
/// [`Mamba3Config`], `train --chunk-size` and `bench`.
pub const DEFAULT_CHUNK_SIZE: usize = 64;

impl Default for Mamba3Config {
    /// The official defaults (`MambaConfig` + `Mamba3.__init__`), with the
    /// official `MambaConfig` model size.
    fn default() -> Self {
        Self {
            d_model: 2560,
            n_layer: 64,
            vocab_size: 50277,
            pad_vocab_size_multiple: 8,
            tie_embeddings: true,
            d_state: 128,
            expand: 2,
            headdim: 64,
            ngroups: 1,
            rope_fraction: RopeFraction::Half,
            dt_min: 0.001,
            dt_max: 0.1,
            dt_init_floor: 1e-4,
            a_floor: 1e-4,
            a_activation: AActivation::HeavyTail,
            rope_angles: RopeAngles::Data,
            is_outproj_norm: false,
            chunk_size: DEFAULT_CHUNK_SIZE,
            norm_eps: 1e-5,
            residual_in_fp32: true,
            fused_add_norm: true,
        }
    }
}

impl Mamba3Config {
    /// Checks every consistency rule the official module asserts (and the ones
    /// it leaves implicit), returning the first violation by field name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("d_model", self.d_model),
            ("n_layer", self.n_layer),
            ("vocab_size", self.vocab_size),
            ("pad_vocab_size_multiple", self.pad_vocab_size_multiple),
            ("ssm_cfg.d_state", self.d_state),
            ("ssm_cfg.expand", self.expand),
            ("ssm_cfg.headdim", self.headdim),
            ("ssm_cfg.ngroups", self.ngroups),
            ("ssm_cfg.chunk_size", self.chunk_size),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(ConfigError::invalid(field, "must be at least 1"));
            }
        }
        let d_inner = self
            .d_model
            .checked_mul(self.expand)
            .ok_or_else(|| ConfigError::invalid("ssm_cfg.expand", "expand * d_model overflows"))?;
        if !d_inner.is_multiple_of(self.headdim) {
            return Err(ConfigError::invalid(
                "ssm_cfg.headdim",
                format!("must divide d_inner = expand * d_model = {d_inner}"),
            ));
        }
        let nheads = d_inner / self.headdim;
        if !nheads.is_multiple_of(self.ngroups) {
            return Err(ConfigError::invalid(
                "ssm_cfg.ngroups",
                format!("must divide nheads = {nheads}"),
            ));
        }
        // The SISO kernel rotates (2i, 2i+1) pairs and asserts an even qk head dim.
        if !self.d_state.is_multiple_of(2) {
            return Err(ConfigError::invalid(
                "ssm_cfg.d_state",
                format!(
                    "must be even (rotation acts on pairs), got {}",
                    self.d_state
                ),
            ));
        }
        if self.num_rope_angles() == 0 {
            return Err(ConfigError::invalid(
                "ssm_cfg.d_state",
                "too small for at least one rotation angle",
            ));
        }
        let finite_pos = [
            ("ssm_cfg.dt_min", self.dt_min),
            ("ssm_cfg.dt_max", self.dt_max),
            ("norm_epsilon", self.norm_eps),
        ];
        for (field, v) in finite_pos {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be finite and > 0, got {v}"),
                ));
            }
        }
        if self.dt_max < self.dt_min {
            return Err(ConfigError::invalid(
                "ssm_cfg.dt_max",
                format!("must be >= dt_min = {}, got {}", self.dt_min, self.dt_max),
            ));
        }
        for (field, v) in [
            ("ssm_cfg.dt_init_floor", self.dt_init_floor),
            ("ssm_cfg.A_floor", self.a_floor),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be finite and >= 0, got {v}"),
                ));
            }
        }
        let vocab = self.padded_vocab_size_checked()?;
        // Every tensor's element count must fit in memory arithmetic, so no
        // size computation elsewhere can overflow.
        let gn = self.ngroups.checked_mul(self.d_state);
        let in_proj = gn
            .and_then(|gn| gn.checked_mul(2))
            .and_then(|x| x.checked_add(d_inner.checked_mul(2)?))
            .and_then(|x| x.checked_add(nheads.checked_mul(3)?))
            .and_then(|x| x.checked_mul(self.d_model));
        let state = nheads
            .checked_mul(self.headdim)
            .and_then(|x| x.checked_mul(self.d_state));
        let embed = vocab.checked_mul(self.d_model);
        for (field, v) in [
            ("ssm_cfg.d_state", in_proj),
            ("ssm_cfg.d_state", state),
            ("vocab_size", embed),
        ] {
            if v.is_none() {
                return Err(ConfigError::invalid(field, "tensor sizes overflow"));
            }
        }
        Ok(())
    }

    /// `expand * d_model`.
    pub fn d_inner(&self) -> usize {
        self.expand * self.d_model
    }

    /// Number of SSM heads H.
    pub fn nheads(&self) -> usize {
        self.d_inner() / self.headdim
    }

    /// Heads per B/C group (`nheads / ngroups`); head h uses group `h / this`.
    pub fn heads_per_group(&self) -> usize {
        self.nheads() / self.ngroups
    }

    /// Number of rotation angles S (official `num_rope_angles`).
    pub fn num_rope_angles(&self) -> usize {
        let mut split = match self.rope_fraction {
            RopeFraction::Half => self.d_state / 2,
            RopeFraction::Full => self.d_state,
        };
        if !split.is_multiple_of(2) {
            split -= 1;
        }
        split / 2
    }

    /// The fixed RoPE frequency of each rotated pair, `omega_s = ROPE_BASE^(-s / S)`
    /// (used when [`Self::rope_angles`] is [`RopeAngles::Fixed`]).
    pub fn rope_frequencies(&self) -> Vec<f64> {
        let count = self.num_rope_angles();
        let s_total = f64::from(u32::try_from(count).unwrap_or(u32::MAX)).max(1.0);
        (0..count)
            .map(|s| {
                let s = f64::from(u32::try_from(s).unwrap_or(u32::MAX));
                ROPE_BASE.powf(-s / s_total)
            })
            .collect()
    }

    /// Output width of `in_proj`: `[z, x, B, C, dd_dt, dd_A, trap, angles]`.
    pub fn d_in_proj(&self) -> usize {
        2 * self.d_inner()
            + 2 * self.ngroups * self.d_state
            + 3 * self.nheads()
            + self.num_rope_angles()
    }

    /// Embedding / LM-head rows: `vocab_size` rounded up to the padding multiple.
    pub fn padded_vocab_size(&self) -> usize {
        self.padded_vocab_size_checked().unwrap_or(self.vocab_size)
    }

    fn padded_vocab_size_checked(&self) -> Result<usize, ConfigError> {
        let m = self.pad_vocab_size_multiple.max(1);
        self.vocab_size
            .checked_next_multiple_of(m)
            .ok_or_else(|| ConfigError::invalid("vocab_size", "padded vocabulary overflows"))
    }

    /// Column offsets of the eight `in_proj` output blocks, in split order.
    pub fn in_proj_layout(&self) -> InProjLayout {
        let di = self.d_inner();
        let gn = self.ngroups * self.d_state;
        let h = self.nheads();
        let z = 0;
        let x = z + di;
        let b = x + di;
        let c = b + gn;
        let dd_dt = c + gn;
        let dd_a = dd_dt + h;
        let trap = dd_a + h;
        let angles = trap + h;
        InProjLayout {
            z,
            x,
            b,
            c,
            dd_dt,
            dd_a,
            trap,
            angles,
            width: angles + self.num_rope_angles(),
        }
    }

    /// A tiny valid configuration for tests and examples.
    pub fn tiny() -> Self {
        Self {
            d_model: 8,
            n_layer: 2,
            vocab_size: 13,
            pad_vocab_size_multiple: 8,
            d_state: 8,
            expand: 2,
            headdim: 4,
            ..Self::default()
        }
    }
}

/// Where each block of the `in_proj` output starts (official split order
/// `[z, x, B, C, dd_dt, dd_A, trap, angles]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProjLayout {
    /// Gate z, `d_inner` wide.
    pub z: usize,
    /// Values x (V), `d_inner` wide.
    pub x: usize,
    /// Keys B, `ngroups * d_state` wide, laid out `(g n)`.
    pub b: usize,
    /// Queries C, `ngroups * d_state` wide.
    pub c: usize,
    /// Per-head dt pre-activation.
    pub dd_dt: usize,
    /// Per-head A pre-activation.
    pub dd_a: usize,
    /// Per-head trapezoid mixing pre-activation.
    pub trap: usize,
    /// Per-token angle pre-activations, shared by heads.
    pub angles: usize,
    /// Total width (`d_in_proj`).
    pub width: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_sizes_match_the_official_module() {
        // Reference example: d_model 2048 with the Mamba3 defaults gives
        // d_inner 4096, H 64, S 32 and an in_proj output of 8192 + 256 + 192 + 32.
        let cfg = Mamba3Config {
            d_model: 2048,
            ..Mamba3Config::default()
        };
        cfg.validate().unwrap();
        assert_eq!(
            (cfg.d_inner(), cfg.nheads(), cfg.num_rope_angles()),
            (4096, 64, 32)
        );
        assert_eq!(cfg.d_in_proj(), 8672);
        let l = cfg.in_proj_layout();
        assert_eq!(
            (l.b, l.c, l.dd_dt, l.angles, l.width),
            (8192, 8320, 8448, 8640, 8672)
        );
        let full = Mamba3Config {
            rope_fraction: RopeFraction::Full,
            ..cfg
        };
        assert_eq!(full.num_rope_angles(), 64);
        assert_eq!(Mamba3Config::default().padded_vocab_size(), 50280);
    }

    #[test]
    fn every_inconsistency_names_its_field() {
        type Edit = fn(&mut Mamba3Config);
        let cases: [(Edit, &str); 9] = [
            (|c| c.d_model = 0, "d_model"),
            (|c| c.headdim = 3, "ssm_cfg.headdim"),
            (|c| c.ngroups = 3, "ssm_cfg.ngroups"),
            (|c| c.d_state = 7, "ssm_cfg.d_state"),
            (|c| c.d_state = 2, "ssm_cfg.d_state"),
            (|c| c.dt_max = 1e-5, "ssm_cfg.dt_max"),
            (|c| c.a_floor = f64::NAN, "ssm_cfg.A_floor"),
            (|c| c.chunk_size = 0, "ssm_cfg.chunk_size"),
            (|c| c.d_state = usize::MAX / 2, "ssm_cfg.d_state"),
        ];
        for (edit, field) in cases {
            let mut cfg = Mamba3Config::tiny();
            edit(&mut cfg);
            match cfg.validate() {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(RopeFraction::from_f64(0.75).is_err());
    }
}
