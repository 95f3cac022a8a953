//! Optimisers for the CPU reference: AdamW with PyTorch semantics and
//! global gradient-norm clipping; [`gpu`] is the device AdamW, checked against these.
//! (The device-side schedule, clipping, skip and loss weights are the training
//! step's: [`crate::step::control`].)

mod adamw;
pub mod gpu;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy, OptimError, clip_grad_norm};
