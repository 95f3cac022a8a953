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
use crate::graph::{DevicePtr, TensorPath};
use crate::kernels::mamba3_bwd as kb;
use crate::kernels::optim as ko;

use super::{AdamWConfig, DecayPolicy, OptimError, Param};

/// One f32 device tensor per [`Param`] of a group, named like it: an AdamW
/// moment. Guard messages name a moved tensor by its parameter name.
#[derive(Debug)]
pub struct Moments {
    names: Vec<String>,
    tensors: Vec<DeviceBuffer<f32>>,
}

impl Moments {
    /// Zero tensors, one per param.
    pub fn zeros(gpu: &Gpu, params: &[Param]) -> Result<Self, GpuError> {
        let mut tensors = Vec::with_capacity(params.len());
        for p in params {
            tensors.push(gpu.alloc_zeros::<f32>(p.numel)?);
        }
        Ok(Self {
            names: params.iter().map(|p| p.name.clone()).collect(),
            tensors,
        })
    }

    /// The tensors, in param order.
    pub fn tensors(&self) -> Vec<&DeviceBuffer<f32>> {
        self.tensors.iter().collect()
    }

    /// The tensors, mutably, in param order.
    pub fn tensors_mut(&mut self) -> Vec<&mut DeviceBuffer<f32>> {
        self.tensors.iter_mut().collect()
    }

    /// The param names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The tensor of the param called `name`.
    pub fn by_name_mut(&mut self, name: &str) -> Option<&mut DeviceBuffer<f32>> {
        let i = self.names.iter().position(|n| n == name)?;
        self.tensors.get_mut(i)
    }

    /// Every tensor copied to the host, in param order (synchronizes).
    pub fn download(&self, gpu: &Gpu) -> Result<Vec<Vec<f32>>, GpuError> {
        self.tensors.iter().map(|t| gpu.to_host(t)).collect()
    }
}

impl crate::graph::DevicePtrs for Moments {
    fn visit_ptrs(&self, path: &TensorPath<'_>, visit: &mut dyn FnMut(&TensorPath<'_>, DevicePtr)) {
        for (name, t) in self.names.iter().zip(&self.tensors) {
            t.visit_ptrs(&path.field(name), visit);
        }
    }
}

/// First and second moments, one pair per parameter tensor.
#[derive(Debug, DevicePtrs)]
pub struct AdamWState {
    /// First moments.
    pub m: Moments,
    /// Second moments.
    pub v: Moments,
    /// Whether each tensor (in param order) decays.
    #[ptrs(skip)]
    pub decay: Vec<bool>,
}

impl AdamWState {
    /// Zero moments for the tensors `params` lists.
    pub fn new(gpu: &Gpu, params: &[Param], policy: &DecayPolicy) -> Result<Self, GpuError> {
        Ok(Self {
            m: Moments::zeros(gpu, params)?,
            v: Moments::zeros(gpu, params)?,
            decay: params.iter().map(|p| policy.decays(p)).collect(),
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

/// One tensor of a [`fused_update`]: the parameter (f32 master), its
/// gradient, and its bf16 compute copy if it has one.
pub struct Update<'a> {
    /// The parameter, updated in place.
    pub param: &'a mut DeviceBuffer<f32>,
    /// Its gradient.
    pub grad: &'a DeviceBuffer<f32>,
    /// A bf16 copy the pass rewrites from the updated parameter.
    pub copy: Option<&'a mut DeviceBuffer<bf16>>,
}

/// AdamW on every tensor of `updates` (in the order the state was built
/// with) in one multi-tensor pass
/// ([`kernels::optim::adamw`](crate::kernels::optim::adamw)): `derived` holds
/// the step's scalars, `gate` (when given) the clip coefficient, skip flag
/// and gradient scale; each bf16 copy is rewritten from its updated master
/// in the same pass.
pub fn fused_update(
    gpu: &Gpu,
    updates: Vec<Update<'_>>,
    derived: &DeviceBuffer<f32>,
    gate: Option<&DeviceBuffer<f32>>,
    adam: &mut AdamWState,
) -> Result<(), OptimError> {
    let AdamWState { m, v, decay } = adam;
    let n = m.tensors.len();
    for found in [updates.len(), v.tensors.len(), decay.len()] {
        if found != n {
            return Err(OptimError::TensorCount { expected: n, found });
        }
    }
    let mut list = Vec::with_capacity(n);
    for (((u, (name, m)), v), &decay) in updates
        .into_iter()
        .zip(m.names.iter().zip(m.tensors.iter_mut()))
        .zip(v.tensors.iter_mut())
        .zip(decay.iter())
    {
        // A tensor of another length would be a mis-ordered list.
        let copy_len = u.copy.as_deref().map_or(m.len(), DeviceBuffer::len);
        for (what, found) in [
            ("parameter", u.param.len()),
            ("gradient", u.grad.len()),
            ("bf16 copy", copy_len),
        ] {
            if found != m.len() {
                return Err(OptimError::TensorSize {
                    name: name.clone(),
                    expected: m.len(),
                    what,
                    found,
                });
            }
        }
        list.push(ko::AdamTensor {
            param: u.param,
            grad: u.grad,
            m,
            v,
            copy: u.copy,
            decay,
        });
    }
    ko::adamw(gpu, &mut list, derived, gate)?;
    Ok(())
}
