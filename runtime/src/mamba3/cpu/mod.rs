//! The CPU implementation of the Mamba-3 SISO language model: the float64
//! oracle every other implementation is checked against, and a quick f32 path
//! for tiny models.
//!
//! Entry points: [`Weights::init`] (official initialisation), [`forward`]
//! (loss, logits, carried state, tapes), [`backward`] (a gradient for every
//! parameter, named like the checkpoint), [`Weights::named`] (the ordered
//! `(name, shape, data)` list a GPU implementation compares against).
//! The scan runs in either form ([`ScanMode`]); the per-head functions
//! [`recurrent_forward`] and [`chunked_forward`] are public so kernels can be
//! checked against one (row, head) at a time.

mod chunked;
mod chunked_backward;
mod float;
mod mixer;
mod mixer_backward;
mod model;
mod ops;
mod scan;
mod state;
mod tokens;
mod weights;

pub use chunked::{ChunkedHead, chunked_forward};
pub use chunked_backward::{ChunkedHeadGrads, chunked_backward};
pub use float::Float;
pub use mixer::{MixerTape, ScanMode};
pub use model::{
    BlockTape, ForwardOutput, ModelError, backward, check_weights, forward, loss_and_grads,
};
pub use scan::{
    HeadCarry, HeadGrads, HeadInputs, RecurrentOut, ScanShapeError, recurrent_backward,
    recurrent_forward,
};
pub use state::{LayerState, ModelState, StateShapeError};
pub use tokens::{TokenError, Tokens};
pub use weights::{Grads, LayerWeights, ParamKind, ParamSpec, Weights, param_specs};
