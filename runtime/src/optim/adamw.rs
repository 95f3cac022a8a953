//! AdamW exactly as `torch.optim.AdamW` (non-amsgrad, non-foreach semantics):
//!
//! ```text
//! t += 1
//! p *= 1 - lr * weight_decay                      (decoupled decay, before the update)
//! m = beta1 m + (1 - beta1) g
//! v = beta2 v + (1 - beta2) g^2
//! p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//!
//! Bias corrections are computed in f64 (Python floats in torch). Which
//! tensors decay is a [`DecayPolicy`]; the default decays only the 2-D
//! matrices (embedding, `in_proj`, `out_proj`, an untied `lm_head`), as the
//! official training recipes exclude norms, biases, `dt_bias` and `D`.

use std::collections::HashSet;

use thiserror::Error;

use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{Float, Grads, ParamKind, ParamSpec, Weights, param_specs};

/// Hyper-parameters (torch defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (applied to tensors the policy selects).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// Which parameters receive weight decay.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DecayPolicy {
    /// Only [`ParamKind::Matrix`] tensors (embedding, projections, LM head).
    #[default]
    MatricesOnly,
    /// Every tensor.
    All,
    /// No tensor.
    Nothing,
    /// Exactly the named tensors.
    Names(HashSet<String>),
}

impl DecayPolicy {
    /// Whether `spec` decays under this policy.
    pub fn decays(&self, spec: &ParamSpec) -> bool {
        match self {
            Self::MatricesOnly => spec.kind == ParamKind::Matrix,
            Self::All => true,
            Self::Nothing => false,
            Self::Names(names) => names.contains(&spec.name),
        }
    }
}

/// Parameters and gradients that do not line up with the optimiser state.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OptimError {
    /// A different number of tensors than the optimiser was built for.
    #[error("optimizer built for {expected} tensors, got {found}")]
    TensorCount {
        /// Tensors in the optimiser state.
        expected: usize,
        /// Tensors passed.
        found: usize,
    },
    /// A tensor (or its gradient) of the wrong size.
    #[error("tensor `{name}`: optimizer state has {expected} values, {what} has {found}")]
    TensorSize {
        /// Parameter name.
        name: String,
        /// Size in the optimiser state.
        expected: usize,
        /// `"parameter"` or `"gradient"`.
        what: &'static str,
        /// Size passed.
        found: usize,
    },
}

/// AdamW state for a list of named tensors.
#[derive(Debug, Clone)]
pub struct AdamW<T> {
    /// Hyper-parameters (the learning rate may be changed between steps).
    pub config: AdamWConfig,
    step: u64,
    names: Vec<String>,
    decay: Vec<bool>,
    m: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Float> AdamW<T> {
    /// Zero moments for the tensors described by `specs`.
    pub fn new(config: AdamWConfig, specs: &[ParamSpec], policy: &DecayPolicy) -> Self {
        Self {
            config,
            step: 0,
            names: specs.iter().map(|s| s.name.clone()).collect(),
            decay: specs.iter().map(|s| policy.decays(s)).collect(),
            m: specs.iter().map(|s| vec![T::ZERO; s.numel()]).collect(),
            v: specs.iter().map(|s| vec![T::ZERO; s.numel()]).collect(),
        }
    }

    /// Zero moments for every parameter of a model with config `cfg`.
    pub fn for_model(cfg: &Mamba3Config, config: AdamWConfig, policy: &DecayPolicy) -> Self {
        Self::new(config, &param_specs(cfg), policy)
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Whether tensor `i` decays.
    pub fn decays(&self, i: usize) -> bool {
        self.decay.get(i).copied().unwrap_or(false)
    }

    /// First and second moments of tensor `i`.
    pub fn moments(&self, i: usize) -> Option<(&[T], &[T])> {
        Some((self.m.get(i)?.as_slice(), self.v.get(i)?.as_slice()))
    }

    /// One update of `params` by `grads` (both in the order the optimiser was
    /// built with). Nothing changes if the sizes do not match.
    pub fn step(&mut self, params: &mut [&mut Vec<T>], grads: &[&[T]]) -> Result<(), OptimError> {
        for found in [params.len(), grads.len()] {
            if found != self.m.len() {
                return Err(OptimError::TensorCount {
                    expected: self.m.len(),
                    found,
                });
            }
        }
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            for (what, found) in [("parameter", p.len()), ("gradient", g.len())] {
                if found != self.m[i].len() {
                    return Err(OptimError::TensorSize {
                        name: self.names[i].clone(),
                        expected: self.m[i].len(),
                        what,
                        found,
                    });
                }
            }
        }
        self.step += 1;
        let c = self.config;
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let step_size = T::from_f64(c.lr / bc1);
        let (b1, b2) = (T::from_f64(c.beta1), T::from_f64(c.beta2));
        let (one_b1, one_b2) = (T::from_f64(1.0 - c.beta1), T::from_f64(1.0 - c.beta2));
        let (eps, bc2s) = (T::from_f64(c.eps), T::from_f64(bc2_sqrt));
        let shrink = T::from_f64(1.0 - c.lr * c.weight_decay);
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let decay = self.decay[i];
            for (((pv, &gv), mv), vv) in
                p.iter_mut().zip(*g).zip(&mut self.m[i]).zip(&mut self.v[i])
            {
                if decay {
                    *pv *= shrink;
                }
                *mv = b1 * *mv + one_b1 * gv;
                *vv = b2 * *vv + one_b2 * gv * gv;
                *pv -= step_size * *mv / (vv.sqrt() / bc2s + eps);
            }
        }
        Ok(())
    }

    /// One update of a model's weights by its gradients.
    pub fn step_weights(
        &mut self,
        weights: &mut Weights<T>,
        grads: &Grads<T>,
    ) -> Result<(), OptimError> {
        let mut params = weights.tensors_mut();
        self.step(&mut params, &grads.tensors())
    }
}

/// `torch.nn.utils.clip_grad_norm_`: scales all gradients by
/// `max_norm / (norm + 1e-6)` when that is below 1; returns the total L2 norm
/// (accumulated in f64) before clipping.
pub fn clip_grad_norm<T: Float>(grads: &mut [&mut Vec<T>], max_norm: f64) -> f64 {
    let total = grads
        .iter()
        .flat_map(|g| g.iter())
        .map(|v| v.to_f64() * v.to_f64())
        .sum::<f64>()
        .sqrt();
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        let c = T::from_f64(coef);
        for g in grads.iter_mut() {
            for v in g.iter_mut() {
                *v *= c;
            }
        }
    }
    total
}
