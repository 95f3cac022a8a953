//! Recurrent state carried from one window to the next, in the official
//! inference-cache layouts (`allocate_inference_cache`): per layer the SSM
//! state `(B, H, P, N)`, the last rotated key `(B, H, N)` (official
//! `(B, 1, H, N)`), the last value `(B, H, P)` and the angle accumulator
//! `(B, H, S)`.

use thiserror::Error;

use crate::float::Float;
use crate::mamba3::config::Mamba3Config;

/// A carried state that does not fit the model or the batch.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("carried state: {field} has {found} values, expected {expected} ({detail})")]
pub struct StateShapeError {
    /// Which part (e.g. `layers[1].ssm`).
    pub field: String,
    /// Expected element count.
    pub expected: usize,
    /// Actual element count.
    pub found: usize,
    /// The expected shape in words.
    pub detail: String,
}

/// One layer's carried state.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerState<T> {
    /// SSM state `S` `[B, H, P, N]`.
    pub ssm: Vec<T>,
    /// Last rotated, biased, unscaled key `[B, H, N]`.
    pub k: Vec<T>,
    /// Last value `[B, H, P]`.
    pub v: Vec<T>,
    /// Cumulative rotation angle, wrapped to `[0, 2 pi)`, `[B, H, S]`.
    pub angle: Vec<T>,
}

/// The carried state of every layer for a batch of `batch` rows.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState<T> {
    /// Batch rows the state belongs to.
    pub batch: usize,
    /// One entry per layer.
    pub layers: Vec<LayerState<T>>,
}

impl<T: Float> LayerState<T> {
    /// The zero state (the start of a fresh sequence).
    pub fn zeros(cfg: &Mamba3Config, batch: usize) -> Self {
        let bh = batch * cfg.nheads();
        Self {
            ssm: vec![T::ZERO; bh * cfg.headdim * cfg.d_state],
            k: vec![T::ZERO; bh * cfg.d_state],
            v: vec![T::ZERO; bh * cfg.headdim],
            angle: vec![T::ZERO; bh * cfg.num_rope_angles()],
        }
    }

    fn check(&self, cfg: &Mamba3Config, batch: usize, layer: usize) -> Result<(), StateShapeError> {
        let bh = batch * cfg.nheads();
        let parts = [
            (
                "ssm",
                self.ssm.len(),
                bh * cfg.headdim * cfg.d_state,
                "[B, H, P, N]",
            ),
            ("k", self.k.len(), bh * cfg.d_state, "[B, H, N]"),
            ("v", self.v.len(), bh * cfg.headdim, "[B, H, P]"),
            (
                "angle",
                self.angle.len(),
                bh * cfg.num_rope_angles(),
                "[B, H, S]",
            ),
        ];
        for (name, found, expected, shape) in parts {
            if found != expected {
                return Err(StateShapeError {
                    field: format!("layers[{layer}].{name}"),
                    expected,
                    found,
                    detail: format!("{shape} with B = {batch}"),
                });
            }
        }
        Ok(())
    }
}

impl<T: Float> ModelState<T> {
    /// The zero state for every layer.
    pub fn zeros(cfg: &Mamba3Config, batch: usize) -> Self {
        Self {
            batch,
            layers: (0..cfg.n_layer)
                .map(|_| LayerState::zeros(cfg, batch))
                .collect(),
        }
    }

    /// Checks that the state fits `cfg` and a batch of `batch` rows.
    pub fn check(&self, cfg: &Mamba3Config, batch: usize) -> Result<(), StateShapeError> {
        if self.batch != batch || self.layers.len() != cfg.n_layer {
            return Err(StateShapeError {
                field: "layers".into(),
                expected: cfg.n_layer,
                found: self.layers.len(),
                detail: format!(
                    "one state per layer for B = {batch} (state has B = {})",
                    self.batch
                ),
            });
        }
        for (i, l) in self.layers.iter().enumerate() {
            l.check(cfg, batch, i)?;
        }
        Ok(())
    }
}
