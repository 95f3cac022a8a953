//! The backbone-only steps (`backbone.ron` in f32, `backbone_bf16.ron` in
//! bf16 mixed precision): random activations enter block 0, a random
//! gradient arrives at the last block's output, every block runs forward
//! and backward, and AdamW updates the weights. No embedding, LM head or
//! loss: the shape of the peers' measurements in issue 8, so the numbers
//! compare like for like.
//!
//! One struct, [`Backbone<P>`], generic over the compute type like the full
//! step and instantiated by both specs, so its graphs are captured and
//! guarded by the same generated code; the ops run the full step's own
//! block loops ([`blocks_forward`], [`blocks_backward`]), generic over the
//! weights' compute type.

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

use crate::TrainingGraph;
use crate::device::{DeviceBuffer, Gpu};
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu;
use crate::mamba3::gpu::{
    Acts, Grads, Mamba3GpuError, ModelCompute, NoProbe, StepWeights, blocks_backward,
    blocks_forward, presize_staging,
};
use crate::optim::gpu::{AdamWState, StepScalars};
use crate::optim::{AdamWConfig, DecayPolicy};
use crate::step::StepError;

/// The backbone step's buffers at compute type `P`.
#[derive(Debug, TrainingGraph)]
#[graph(spec = "backbone.ron", with(P = f32))]
#[graph(spec = "backbone_bf16.ron", with(P = half::bf16))]
pub struct Backbone<P: ModelCompute> {
    /// Trainable parameters (embedding and head present but unused): f32
    /// masters, and in bf16 their GEMM copies.
    pub weights: P::Weights,
    /// AdamW moments.
    pub adam: AdamWState,
    /// Device-side schedule scalars.
    pub sched: StepScalars,
    /// Gradients and backward working memory.
    pub grads: Grads,
    /// Forward activations (GEMM operands in `P`).
    pub acts: Acts<DeviceBuffer<P>>,
    /// Residual stream entering block 0 `[rows, d_model]`.
    pub input: DeviceBuffer<f32>,
    /// Gradient at the last block's output `[rows, d_model]`.
    pub upstream: DeviceBuffer<f32>,
}

/// Uniform random input in [-1, 1] and upstream gradient in [-1, 1] / rows
/// (the scale a mean loss gives), `rows x d_model` each.
fn random_inputs(
    gpu: &Gpu,
    rows: usize,
    d_model: usize,
    seed: u64,
) -> Result<[DeviceBuffer<f32>; 2], Mamba3GpuError> {
    let n = crate::device::checked_elems("backbone: rows x d_model", rows, d_model)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb0b0);
    let input: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let scale = 1.0 / f64::from(u32::try_from(rows).unwrap_or(u32::MAX).max(1));
    let upstream: Vec<f32> = (0..n)
        .map(|_| {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "statistics-scale values; f64 -> f32 rounding is intended"
            )]
            let v = (rng.random_range(-1.0..1.0) * scale) as f32;
            v
        })
        .collect();
    Ok([gpu.to_device(&input)?, gpu.to_device(&upstream)?])
}

impl<P: ModelCompute> Backbone<P> {
    /// Official-init weights from `seed`, random input and upstream
    /// gradient, and `half_staging` presized for the shape (bf16).
    pub fn new(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        batch: usize,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self, StepError> {
        let w = cpu::Weights::<f32>::init(cfg, seed).map_err(Mamba3GpuError::from)?;
        let acts = Acts::<DeviceBuffer<P>>::new(gpu, cfg, batch, seq_len)?;
        presize_staging::<P>(gpu, &acts.shape)?;
        let [input, upstream] = random_inputs(gpu, acts.shape.rows, cfg.d_model, seed)?;
        Ok(Self {
            weights: P::Weights::upload(gpu, cfg, &w)?,
            adam: AdamWState::new(gpu, &crate::step::params(cfg), &DecayPolicy::default())?,
            sched: StepScalars::new(gpu, &AdamWConfig::default())?,
            grads: Grads::new::<P>(gpu, cfg, batch, seq_len)?,
            acts,
            input,
            upstream,
        })
    }
}

/// Copies `input` into block 0's residual input and runs every block.
pub fn forward<W: StepWeights>(
    gpu: &Gpu,
    w: &W,
    input: &DeviceBuffer<f32>,
    acts: &mut Acts<DeviceBuffer<W::T>>,
) -> Result<(), Mamba3GpuError> {
    let first = acts.layers.first_mut().ok_or(Mamba3GpuError::Shape {
        what: "backbone: layers (at least one)",
        expected: 1,
        found: 0,
    })?;
    gpu.copy_device(input, &mut first.h_in)?;
    blocks_forward(gpu, w, acts, &mut NoProbe)
}

/// Seeds the residual gradient with `upstream` and runs every block
/// backward (embedding and `norm_f` gradients stay as they are: zero).
pub fn backward<W: StepWeights>(
    gpu: &Gpu,
    w: &W,
    acts: &Acts<DeviceBuffer<W::T>>,
    upstream: &DeviceBuffer<f32>,
    grads: &mut Grads,
) -> Result<(), Mamba3GpuError> {
    gpu.copy_device(upstream, &mut grads.work.dh)?;
    blocks_backward(gpu, w, acts, grads, &mut NoProbe)
}
