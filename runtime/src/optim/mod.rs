//! The optimizer, model-agnostic: AdamW with PyTorch semantics over a list
//! of named tensors ([`Param`]s, a `torch.optim` param group), on the host
//! ([`AdamW`], with global gradient-norm clipping) and on the device
//! ([`gpu`], checked against the host one). It imports no model; the step
//! layer hands it a model's parameters, and owns what a training step does
//! around the update (loss weights, clipping, skip, schedule).

mod adamw;
pub mod gpu;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy, OptimError, Param, clip_grad_norm};
