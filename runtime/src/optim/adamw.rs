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
//! matrices (for Mamba-3: embedding, `in_proj`, `out_proj`, an untied
//! `lm_head`), as the official training recipes exclude norms, biases,
//! `dt_bias` and `D`.
//!
//! The optimizer knows no model: it updates a list of named tensors, each
//! described by a [`Param`] (name, length, whether it is a matrix), like a
//! `torch.optim` param group. The step layer lists a model's parameters as
//! such a group (`step::params`).

use std::collections::HashSet;

use thiserror::Error;

use crate::float::Float;

/// One tensor the optimizer updates: what decay policies and error messages
/// need to know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name (for a model's parameters, the checkpoint name).
    pub name: String,
    /// Elements.
    pub numel: usize,
    /// Whether it is a weight matrix (decayed by [`DecayPolicy::MatricesOnly`])
    /// rather than a vector of norms, biases or per-head scalars.
    pub matrix: bool,
}

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
    /// Only matrices ([`Param::matrix`]: embedding, projections, LM head).
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
    /// Whether `param` decays under this policy.
    pub fn decays(&self, param: &Param) -> bool {
        match self {
            Self::MatricesOnly => param.matrix,
            Self::All => true,
            Self::Nothing => false,
            Self::Names(names) => names.contains(&param.name),
        }
    }
}

/// Parameters and gradients that do not line up with the optimiser state,
/// or a device update that failed.
#[derive(Debug, Error)]
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
        /// `"parameter"`, `"gradient"` or `"bf16 copy"`.
        what: &'static str,
        /// Size passed.
        found: usize,
    },
    /// The device update failed (or was refused in a capture).
    #[error(transparent)]
    Gpu(#[from] crate::device::GpuError),
}

impl crate::graph::OpError for OptimError {
    fn capture_violation(&self) -> Option<&crate::graph::CaptureViolation> {
        match self {
            Self::Gpu(e) => crate::graph::OpError::capture_violation(e),
            _ => None,
        }
    }
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
    /// Zero moments for the tensors `params` lists, in that order.
    pub fn new(config: AdamWConfig, params: &[Param], policy: &DecayPolicy) -> Self {
        Self {
            config,
            step: 0,
            names: params.iter().map(|p| p.name.clone()).collect(),
            decay: params.iter().map(|p| policy.decays(p)).collect(),
            m: params.iter().map(|p| vec![T::ZERO; p.numel]).collect(),
            v: params.iter().map(|p| vec![T::ZERO; p.numel]).collect(),
        }
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
