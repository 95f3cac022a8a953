//! AdamW on the device, with torch semantics identical to the CPU
//! [`AdamW`](super::AdamW): decoupled decay before the update, decay only
//! where the [`DecayPolicy`] says (2-D matrices by default), bias corrections
//! in f64. Every parameter tensor is updated by one multi-tensor pass
//! ([`crate::kernels::optim::adamw`], one launch per 64 tensors), which in
//! the mixed step also rewrites the bf16 compute copies.
//!
//! Nothing a user may change is baked into a captured graph by value: the
//! hyper-parameters live in a device buffer the host rewrites between
//! replays ([`StepScalars::set_lr`], [`StepScalars::set_config`]), and
//! [`advance_schedule`] increments the step count and computes the step's
//! bias corrections on the device, so a replayed graph keeps counting.

use half::bf16;

use crate::DevicePtrs;
use crate::device::{DeviceBuffer, Gpu, GpuError};
use crate::kernels::mamba3_bwd as kb;
use crate::kernels::optim as ko;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::param_specs;
use crate::mamba3::gpu::{Grads, Mamba3GpuError, Weights};

use super::{AdamWConfig, DecayPolicy};

/// First and second moments, one pair per parameter tensor.
#[derive(Debug, DevicePtrs)]
pub struct AdamWState {
    /// First moments.
    pub m: Weights,
    /// Second moments.
    pub v: Weights,
    /// Whether each tensor (in `param_specs` order) decays.
    #[ptrs(skip)]
    pub decay: Vec<bool>,
}

impl AdamWState {
    /// Zero moments for a model with config `cfg`.
    pub fn new(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        policy: &DecayPolicy,
    ) -> Result<Self, Mamba3GpuError> {
        Ok(Self {
            m: Weights::zeros(gpu, cfg)?,
            v: Weights::zeros(gpu, cfg)?,
            decay: param_specs(cfg).iter().map(|s| policy.decays(s)).collect(),
        })
    }
}

/// The per-step scalars on the device (layout in `kernels/mamba3_adamw.cu`).
#[derive(Debug, DevicePtrs)]
pub struct StepScalars {
    /// `[lr, beta1, beta2, eps, weight_decay]`, written by the host.
    pub hyper: DeviceBuffer<f64>,
    /// Updates taken so far.
    pub step: DeviceBuffer<i32>,
    /// This step's scalars, written by [`advance_schedule`].
    pub derived: DeviceBuffer<f32>,
}

fn hyper_of(c: &AdamWConfig) -> [f64; 5] {
    [c.lr, c.beta1, c.beta2, c.eps, c.weight_decay]
}

impl StepScalars {
    /// Scalars for `config`, at step 0.
    pub fn new(gpu: &Gpu, config: &AdamWConfig) -> Result<Self, GpuError> {
        Ok(Self {
            hyper: gpu.to_device(&hyper_of(config))?,
            step: gpu.alloc_zeros::<i32>(1)?,
            derived: gpu.alloc_zeros::<f32>(8)?,
        })
    }

    /// Rewrites every hyper-parameter (between replays, never in a capture).
    pub fn set_config(&mut self, gpu: &Gpu, config: &AdamWConfig) -> Result<(), GpuError> {
        gpu.copy_from_host(&hyper_of(config), &mut self.hyper)
    }

    /// Rewrites the learning rate only (e.g. from a host-side schedule).
    pub fn set_lr(&mut self, gpu: &Gpu, lr: f64) -> Result<(), GpuError> {
        let mut h = gpu.to_host(&self.hyper)?;
        if let Some(first) = h.first_mut() {
            *first = lr;
        }
        gpu.copy_from_host(&h, &mut self.hyper)
    }

    /// Updates taken so far (synchronizes).
    pub fn steps(&self, gpu: &Gpu) -> Result<u64, GpuError> {
        let s = gpu.to_host(&self.step)?;
        Ok(s.first().and_then(|&v| u64::try_from(v).ok()).unwrap_or(0))
    }
}

/// `step += 1` and this step's bias corrections, on the device.
pub fn advance_schedule(gpu: &Gpu, sched: &mut StepScalars) -> Result<(), GpuError> {
    kb::advance_schedule(gpu, &sched.hyper, &mut sched.step, &mut sched.derived)
}

/// AdamW on every parameter tensor in one multi-tensor pass
/// ([`kernels::optim::adamw`](crate::kernels::optim::adamw)): `derived` holds
/// the step's scalars, `gate` (when given) the clip coefficient, skip flag
/// and gradient scale. `copies` is empty, or holds one entry per parameter
/// (in `param_specs` order): the bf16 compute copy the pass rewrites from the
/// updated master, where the tensor has one.
pub fn fused_update(
    gpu: &Gpu,
    grads: &Grads,
    derived: &DeviceBuffer<f32>,
    gate: Option<&DeviceBuffer<f32>>,
    weights: &mut Weights,
    mut copies: Vec<Option<&mut DeviceBuffer<bf16>>>,
    adam: &mut AdamWState,
) -> Result<(), Mamba3GpuError> {
    let gs = grads.params.tensors();
    let ps = weights.tensors_mut();
    let ms = adam.m.tensors_mut();
    let vs = adam.v.tensors_mut();
    let n = gs.len();
    for (what, found) in [
        ("weights", ps.len()),
        ("first moments", ms.len()),
        ("second moments", vs.len()),
        ("decay flags", adam.decay.len()),
    ] {
        crate::mamba3::gpu::same(what, n, found)?;
    }
    if copies.is_empty() {
        copies.resize_with(n, || None);
    }
    crate::mamba3::gpu::same("bf16 compute copies", n, copies.len())?;
    let mut list = Vec::with_capacity(n);
    for (((((grad, param), m), v), &decay), copy) in gs
        .into_iter()
        .zip(ps)
        .zip(ms)
        .zip(vs)
        .zip(&adam.decay)
        .zip(copies)
    {
        if let Some(c) = copy.as_deref() {
            // A copy of another tensor's shape would be a mis-ordered list.
            crate::mamba3::gpu::same("bf16 copy length", param.len(), c.len())?;
        }
        list.push(ko::AdamTensor {
            param,
            grad,
            m,
            v,
            copy,
            decay,
        });
    }
    ko::adamw(gpu, &mut list, derived, gate)?;
    Ok(())
}
