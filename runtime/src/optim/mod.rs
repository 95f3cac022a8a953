//! Optimisers for the CPU reference: AdamW with PyTorch semantics and
//! global gradient-norm clipping; [`gpu`] is the device AdamW, checked against these,
//! and [`step_control`] the device-side schedule, clipping, skip and loss weights.

mod adamw;
pub mod gpu;
pub mod step_control;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy, OptimError, clip_grad_norm};
