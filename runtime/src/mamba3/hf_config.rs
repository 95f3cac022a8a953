//! `config.json` in the official `MambaConfig` layout
//! (`mamba_ssm/models/config_mamba.py`), so a PyTorch user can build the same
//! model with `MambaLMHeadModel(MambaConfig(**json.load(f)))`:
//!
//! ```json
//! {"d_model": 768, "d_intermediate": 0, "n_layer": 24, "vocab_size": 50277,
//!  "ssm_cfg": {"layer": "Mamba3", "d_state": 128, "expand": 2, "headdim": 64,
//!              "ngroups": 1, "rope_fraction": 0.5, "dt_min": 0.001, "dt_max": 0.1,
//!              "dt_init_floor": 0.0001, "A_floor": 0.0001, "is_outproj_norm": false,
//!              "is_mimo": false, "chunk_size": 64},
//!  "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": true, "residual_in_fp32": true,
//!  "fused_add_norm": true, "pad_vocab_size_multiple": 8, "tie_embeddings": true}
//! ```
//!
//! Omitted fields take the official defaults. Fields that would describe a
//! model this implementation does not have (an MLP, attention layers,
//! LayerNorm, MIMO) are errors naming the field, as are unknown fields.
//!
//! Two keys are this crate's own: `ssm_cfg.A_activation` (`"softplus"`) is
//! written only for a model that uses the paper's softplus decay map instead
//! of the official heavy-tail one, and `ssm_cfg.rope_angles` (`"fixed"`) only
//! for the standard-RoPE ablation (fixed rotation frequencies). The official
//! module has no such arguments and rejects the keys, which is right: they
//! would build a different model.

use serde_json::{Map, Value, json};

use super::config::{AActivation, ConfigError, Mamba3Config, RopeAngles, RopeFraction};

/// The RMSNorm epsilon the official `MambaConfig` cannot change (no field).
const OFFICIAL_NORM_EPS: f64 = 1e-5;

/// Serializes `cfg` as an official `config.json` object.
///
/// Fails if `cfg` is invalid or uses an epsilon other than the official 1e-5,
/// which `config.json` has no field for.
pub fn config_to_json(cfg: &Mamba3Config) -> Result<Value, ConfigError> {
    cfg.validate()?;
    if cfg.norm_eps != OFFICIAL_NORM_EPS {
        return Err(ConfigError::invalid(
            "norm_epsilon",
            format!(
                "the official config.json cannot express eps {} (only {OFFICIAL_NORM_EPS})",
                cfg.norm_eps
            ),
        ));
    }
    let mut out = json!({
        "d_model": cfg.d_model,
        "d_intermediate": 0,
        "n_layer": cfg.n_layer,
        "vocab_size": cfg.vocab_size,
        "ssm_cfg": {
            "layer": "Mamba3",
            "d_state": cfg.d_state,
            "expand": cfg.expand,
            "headdim": cfg.headdim,
            "ngroups": cfg.ngroups,
            "rope_fraction": cfg.rope_fraction.as_f64(),
            "dt_min": cfg.dt_min,
            "dt_max": cfg.dt_max,
            "dt_init_floor": cfg.dt_init_floor,
            "A_floor": cfg.a_floor,
            "is_outproj_norm": cfg.is_outproj_norm,
            "is_mimo": false,
            "chunk_size": cfg.chunk_size,
        },
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": true,
        "residual_in_fp32": cfg.residual_in_fp32,
        "fused_add_norm": cfg.fused_add_norm,
        "pad_vocab_size_multiple": cfg.pad_vocab_size_multiple,
        "tie_embeddings": cfg.tie_embeddings,
    });
    if cfg.a_activation != AActivation::HeavyTail {
        out["ssm_cfg"]["A_activation"] = json!(cfg.a_activation.name());
    }
    if cfg.rope_angles != RopeAngles::Data {
        out["ssm_cfg"]["rope_angles"] = json!(cfg.rope_angles.name());
    }
    Ok(out)
}

/// Parses an official `config.json` text into a validated config.
pub fn config_from_json_str(text: &str) -> Result<Mamba3Config, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
        reason: e.to_string(),
    })?;
    config_from_json(&value)
}

/// Parses an official `config.json` value into a validated config.
pub fn config_from_json(value: &Value) -> Result<Mamba3Config, ConfigError> {
    let top = value.as_object().ok_or_else(|| ConfigError::Syntax {
        reason: "expected a JSON object at the top level".into(),
    })?;
    let mut cfg = Mamba3Config::default();
    let mut saw_ssm_cfg = false;
    for (key, v) in top {
        match key.as_str() {
            "d_model" => cfg.d_model = count(v, "d_model")?,
            "n_layer" => cfg.n_layer = count(v, "n_layer")?,
            "vocab_size" => cfg.vocab_size = count(v, "vocab_size")?,
            "pad_vocab_size_multiple" => {
                cfg.pad_vocab_size_multiple = count(v, "pad_vocab_size_multiple")?;
            }
            "d_intermediate" => {
                if count(v, "d_intermediate")? != 0 {
                    return Err(ConfigError::invalid(
                        "d_intermediate",
                        "gated MLP blocks are not supported; must be 0",
                    ));
                }
            }
            "attn_layer_idx" => {
                if !v.as_array().is_some_and(Vec::is_empty) {
                    return Err(ConfigError::invalid(
                        "attn_layer_idx",
                        "attention layers are not supported; must be []",
                    ));
                }
            }
            "attn_cfg" => {
                if !v.as_object().is_some_and(Map::is_empty) {
                    return Err(ConfigError::invalid(
                        "attn_cfg",
                        "attention layers are not supported; must be {}",
                    ));
                }
            }
            "rms_norm" => {
                if !flag(v, "rms_norm")? {
                    return Err(ConfigError::invalid(
                        "rms_norm",
                        "only RMSNorm is supported; must be true",
                    ));
                }
            }
            "residual_in_fp32" => cfg.residual_in_fp32 = flag(v, "residual_in_fp32")?,
            "fused_add_norm" => cfg.fused_add_norm = flag(v, "fused_add_norm")?,
            "tie_embeddings" => cfg.tie_embeddings = flag(v, "tie_embeddings")?,
            "ssm_cfg" => {
                saw_ssm_cfg = true;
                parse_ssm_cfg(v, &mut cfg)?;
            }
            other => {
                return Err(ConfigError::UnknownField {
                    field: other.to_owned(),
                });
            }
        }
    }
    if !saw_ssm_cfg {
        return Err(ConfigError::MissingField {
            field: "ssm_cfg (with \"layer\": \"Mamba3\"; the official default layer is Mamba1)"
                .into(),
        });
    }
    cfg.validate()?;
    Ok(cfg)
}

fn parse_ssm_cfg(v: &Value, cfg: &mut Mamba3Config) -> Result<(), ConfigError> {
    let map = v
        .as_object()
        .ok_or_else(|| ConfigError::invalid("ssm_cfg", "must be a JSON object"))?;
    match map.get("layer").and_then(Value::as_str) {
        Some("Mamba3") => {}
        Some(other) => {
            return Err(ConfigError::invalid(
                "ssm_cfg.layer",
                format!("only \"Mamba3\" is supported, got {other:?}"),
            ));
        }
        None => {
            return Err(ConfigError::MissingField {
                field: "ssm_cfg.layer".into(),
            });
        }
    }
    for (key, v) in map {
        let field = format!("ssm_cfg.{key}");
        let f = field.as_str();
        match key.as_str() {
            "layer" => {}
            "d_state" => cfg.d_state = count(v, f)?,
            "expand" => cfg.expand = count(v, f)?,
            "headdim" => cfg.headdim = count(v, f)?,
            "ngroups" => cfg.ngroups = count(v, f)?,
            "chunk_size" => cfg.chunk_size = count(v, f)?,
            "rope_fraction" => cfg.rope_fraction = RopeFraction::from_f64(number(v, f)?)?,
            "dt_min" => cfg.dt_min = number(v, f)?,
            "dt_max" => cfg.dt_max = number(v, f)?,
            "dt_init_floor" => cfg.dt_init_floor = number(v, f)?,
            "A_floor" => cfg.a_floor = number(v, f)?,
            "A_activation" => {
                cfg.a_activation =
                    v.as_str().and_then(AActivation::from_name).ok_or_else(|| {
                        ConfigError::invalid(
                            f,
                            format!("must be \"heavy_tail\" or \"softplus\", got {v}"),
                        )
                    })?;
            }
            "rope_angles" => {
                cfg.rope_angles = v.as_str().and_then(RopeAngles::from_name).ok_or_else(|| {
                    ConfigError::invalid(f, format!("must be \"data\" or \"fixed\", got {v}"))
                })?;
            }
            "is_outproj_norm" => cfg.is_outproj_norm = flag(v, f)?,
            "is_mimo" => {
                if flag(v, f)? {
                    return Err(ConfigError::invalid(
                        f,
                        "MIMO is not supported; must be false",
                    ));
                }
            }
            // Ignored by the official module unless is_mimo; accepted for round trips.
            "mimo_rank" => {
                count(v, f)?;
            }
            // The official module absorbs it; there is no dropout in the model.
            "dropout" => {
                number(v, f)?;
            }
            // Only affects the MIMO + outproj-norm kernel path.
            "fuse_pregate_headwise_norm" => {
                flag(v, f)?;
            }
            _ => {
                return Err(ConfigError::UnknownField {
                    field: field.clone(),
                });
            }
        }
    }
    Ok(())
}

fn count(v: &Value, field: &str) -> Result<usize, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(float_to_u64)
        }),
        _ => None,
    };
    n.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
        ConfigError::invalid(field, format!("must be a non-negative integer, got {v}"))
    })
}

/// An integral, non-negative float as an integer (saturating at the top,
/// which `usize::try_from` and validation then reject as absurd).
fn float_to_u64(f: f64) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "the caller checked that `f` is integral and non-negative"
    )]
    let n = f as u64;
    n
}

fn number(v: &Value, field: &str) -> Result<f64, ConfigError> {
    v.as_f64()
        .ok_or_else(|| ConfigError::invalid(field, format!("must be a number, got {v}")))
}

fn flag(v: &Value, field: &str) -> Result<bool, ConfigError> {
    v.as_bool()
        .ok_or_else(|| ConfigError::invalid(field, format!("must be true or false, got {v}")))
}
