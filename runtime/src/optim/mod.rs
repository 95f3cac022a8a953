//! Optimisers for the CPU reference: AdamW with PyTorch semantics and
//! global gradient-norm clipping. The GPU optimiser is checked against these.

mod adamw;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy, OptimError, clip_grad_norm};
