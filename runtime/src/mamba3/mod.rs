//! The Mamba-3 SISO language model: configuration shared by every
//! implementation, the CPU float64 reference ([`cpu`]), and checkpoints in the
//! official `MambaLMHeadModel` layout ([`checkpoint`]).
//!
//! The semantics are those of the official state-spaces/mamba code
//! (`mamba_ssm/modules/mamba3.py`, `mixer_seq_simple.py`, the Triton SISO
//! reference in `tests/ops/triton/test_mamba3_siso.py`), not the paper where
//! the two differ: heavy-tail A with an `A_floor` clamp, `pi tanh` angles shared
//! by heads and scaled by each head's dt, rotation by `+phi` of interleaved
//! pairs, biases added after B/C RMSNorm, D applied before the z gate.

pub mod checkpoint;
mod config;
pub mod cpu;
pub mod gpu;
mod hf_config;

pub use config::{
    AActivation, ConfigError, DEFAULT_CHUNK_SIZE, InProjLayout, Mamba3Config, ROPE_BASE,
    RopeAngles, RopeFraction,
};
