//! Optimisers for the CPU reference: AdamW with PyTorch semantics and
//! global gradient-norm clipping; [`gpu`] is the device AdamW, checked against these.

mod adamw;
pub mod gpu;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy, OptimError, clip_grad_norm};
