//! The CPU implementation of the Mamba-3 SISO language model: the float64
//! oracle every other implementation is checked against, and a quick f32 path
//! for tiny models (rayon over matmul rows and over (batch row, head) scans).
//!
//! # Checking another implementation against this one
//!
//! - [`Weights::init`] gives official-init weights from a seed;
//!   [`Weights::named`] lists `(ParamSpec { name, shape, .. }, data)` in the
//!   official `state_dict` naming, in a fixed order; [`Weights::cast`] moves
//!   between f64 and f32.
//! - [`forward`] returns a [`ForwardOutput`]: the mean loss, the logits
//!   `[B, T, padded_vocab]`, the carried state after the window
//!   ([`ModelState`], official inference-cache layouts) and per-block tapes
//!   ([`BlockTape`], [`MixerTape`]: projections, dt, A dt, lam, angles, rotated
//!   q/k, v, pre-gate y, gated o; with [`ScanMode::Chunked`] also every
//!   [`ChunkedHead`] intermediate: gamma, scale, qk_dot, scaled keys, chunk
//!   cumsums, chunk states).
//! - [`backward`] returns [`Grads`] (same type and names as the weights), the
//!   gradient of the mean loss for every parameter.
//! - Per (batch row, head): [`recurrent_forward`] / [`recurrent_backward`]
//!   (official step reference) and [`chunked_forward`] / [`chunked_backward`]
//!   (the kernel's chunked form, with its backward intermediates in
//!   [`ChunkedHeadGrads`]) take [`HeadInputs`] and a [`HeadCarry`].
//!
//! Comparison is meant per tensor by relative error `|x - ref| / |ref|` with
//! this module's f64 results as `ref`.

mod chunked;
mod chunked_backward;
mod mixer;
mod mixer_backward;
mod model;
mod ops;
mod scan;
mod state;
mod tokens;
mod weights;

pub use crate::float::Float;
pub use chunked::{ChunkedHead, chunked_forward};
pub use chunked_backward::{ChunkedHeadGrads, chunked_backward};
pub use mixer::{MixerTape, ScanMode};
pub use model::{
    BlockTape, ForwardOutput, ModelError, backward, check_weights, forward, loss_and_grads,
    try_backward,
};
pub use scan::{
    HeadCarry, HeadGrads, HeadInputs, RecurrentOut, ScanShapeError, recurrent_backward,
    recurrent_forward,
};
pub use state::{LayerState, ModelState, StateShapeError};
pub use tokens::{TokenError, Tokens};
pub use weights::{Grads, LayerWeights, ParamKind, ParamSpec, Weights, param_specs};
