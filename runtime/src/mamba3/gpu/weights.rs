//! Device-resident parameters (and, with the same layout, gradients and
//! AdamW moments), uploaded from and downloaded to the CPU model's
//! [`cpu::Weights`] in the official tensor order.

use half::bf16;

use crate::device::{DeviceBuffer, Gpu};
use crate::graph::DevicePtrs;
use crate::kernels::precision::Compute;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{self, check_weights, param_specs};
use crate::{DevicePtrs, Precision};

use super::acts::BackwardWork;
use super::{Mamba3GpuError, same};

/// Parameters of one block, f32 on the device, official layouts.
#[derive(Debug, DevicePtrs)]
pub struct LayerWeights {
    /// `layers.{i}.norm.weight` `[d_model]`.
    pub norm: DeviceBuffer<f32>,
    /// `mixer.in_proj.weight` `[d_in_proj, d_model]`.
    pub in_proj: DeviceBuffer<f32>,
    /// `mixer.dt_bias` `[H]`.
    pub dt_bias: DeviceBuffer<f32>,
    /// `mixer.B_bias` `[H, 1, N]`.
    pub b_bias: DeviceBuffer<f32>,
    /// `mixer.C_bias` `[H, 1, N]`.
    pub c_bias: DeviceBuffer<f32>,
    /// `mixer.B_norm.weight` `[N]`.
    pub b_norm: DeviceBuffer<f32>,
    /// `mixer.C_norm.weight` `[N]`.
    pub c_norm: DeviceBuffer<f32>,
    /// `mixer.D` `[H]`.
    pub d: DeviceBuffer<f32>,
    /// `mixer.norm.weight` `[d_inner]` (only with `is_outproj_norm`).
    pub out_norm: Option<DeviceBuffer<f32>>,
    /// `mixer.out_proj.weight` `[d_model, d_inner]`.
    pub out_proj: DeviceBuffer<f32>,
}

/// Every parameter of the language model on the device. Gradients and
/// AdamW moments use the same type.
#[derive(Debug, DevicePtrs)]
pub struct Weights {
    /// The configuration the tensors are shaped for.
    #[ptrs(skip)]
    pub cfg: Mamba3Config,
    /// `backbone.embedding.weight` `[V, d_model]`.
    pub embedding: DeviceBuffer<f32>,
    /// One entry per block.
    pub layers: Vec<LayerWeights>,
    /// `backbone.norm_f.weight` `[d_model]`.
    pub norm_f: DeviceBuffer<f32>,
    /// `lm_head.weight` `[V, d_model]`; `None` when tied to the embedding.
    pub lm_head: Option<DeviceBuffer<f32>>,
}

impl Weights {
    /// Uploads CPU weights (any precision, rounded once to f32).
    pub fn upload<T: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        w: &cpu::Weights<T>,
    ) -> Result<Self, Mamba3GpuError> {
        check_weights(cfg, w)?;
        let w32: cpu::Weights<f32> = w.cast();
        let mut out = Self::zeros(gpu, cfg)?;
        for (dst, src) in out.tensors_mut().into_iter().zip(w32.tensors()) {
            gpu.copy_from_host(src, dst)?;
        }
        Ok(out)
    }

    /// Zero-filled tensors of the right shapes.
    pub fn zeros(gpu: &Gpu, cfg: &Mamba3Config) -> Result<Self, Mamba3GpuError> {
        cfg.validate()?;
        let specs = param_specs(cfg);
        let mut bufs = Vec::with_capacity(specs.len());
        for s in &specs {
            bufs.push(gpu.alloc_zeros::<f32>(s.numel())?);
        }
        let mut it = bufs.into_iter();
        let mut next = || {
            it.next().ok_or(Mamba3GpuError::Shape {
                what: "parameter count",
                expected: specs.len(),
                found: 0,
            })
        };
        let embedding = next()?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            layers.push(LayerWeights {
                norm: next()?,
                in_proj: next()?,
                dt_bias: next()?,
                b_bias: next()?,
                c_bias: next()?,
                b_norm: next()?,
                c_norm: next()?,
                d: next()?,
                out_norm: if cfg.is_outproj_norm {
                    Some(next()?)
                } else {
                    None
                },
                out_proj: next()?,
            });
        }
        let norm_f = next()?;
        let lm_head = if cfg.tie_embeddings {
            None
        } else {
            Some(next()?)
        };
        Ok(Self {
            cfg: cfg.clone(),
            embedding,
            layers,
            norm_f,
            lm_head,
        })
    }

    /// Copies every tensor back into a CPU weights value.
    pub fn download(&self, gpu: &Gpu) -> Result<cpu::Weights<f32>, Mamba3GpuError> {
        let mut out = cpu::Weights::<f32>::zeros(&self.cfg);
        let src = self.tensors();
        same("parameter count", out.tensors().len(), src.len())?;
        for (dst, s) in out.tensors_mut().into_iter().zip(src) {
            *dst = gpu.to_host(s)?;
        }
        Ok(out)
    }

    /// Every tensor, in `param_specs` order.
    pub fn tensors(&self) -> Vec<&DeviceBuffer<f32>> {
        let mut out = vec![&self.embedding];
        for l in &self.layers {
            out.extend([
                &l.norm, &l.in_proj, &l.dt_bias, &l.b_bias, &l.c_bias, &l.b_norm, &l.c_norm, &l.d,
            ]);
            if let Some(on) = &l.out_norm {
                out.push(on);
            }
            out.push(&l.out_proj);
        }
        out.push(&self.norm_f);
        if let Some(h) = &self.lm_head {
            out.push(h);
        }
        out
    }

    /// Every tensor, mutably, in `param_specs` order.
    pub fn tensors_mut(&mut self) -> Vec<&mut DeviceBuffer<f32>> {
        let mut out = vec![&mut self.embedding];
        for l in &mut self.layers {
            out.extend([
                &mut l.norm,
                &mut l.in_proj,
                &mut l.dt_bias,
                &mut l.b_bias,
                &mut l.c_bias,
                &mut l.b_norm,
                &mut l.c_norm,
                &mut l.d,
            ]);
            if let Some(on) = &mut l.out_norm {
                out.push(on);
            }
            out.push(&mut l.out_proj);
        }
        out.push(&mut self.norm_f);
        if let Some(h) = &mut self.lm_head {
            out.push(h);
        }
        out
    }

    /// The LM head actually used: `lm_head`, or the embedding when tied.
    pub fn head(&self) -> &DeviceBuffer<f32> {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }
}

/// One block's `[in_proj, out_proj]` in compute type `T`.
pub type GemmPair<'a, T> = [&'a DeviceBuffer<T>; 2];

/// What the generic forward/backward bodies read from a step's weights,
/// and what the step and the engine do with them: the f32 master tensors,
/// and the GEMM weights (in_proj, out_proj, LM head) in the compute type
/// `T`. For [`Weights`] the two are the same tensors; for
/// [`super::MixedWeights`] the GEMM weights are bf16 copies.
pub trait StepWeights: DevicePtrs + std::fmt::Debug + Sized {
    /// The compute type of the GEMM weights.
    type T: Compute;
    /// Uploads CPU weights (any precision, rounded once to f32) as masters
    /// and fills the compute copies, if any.
    fn upload<F: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        w: &cpu::Weights<F>,
    ) -> Result<Self, Mamba3GpuError>;
    /// The f32 master weights.
    fn master(&self) -> &Weights;
    /// The f32 master weights, mutably (call
    /// [`masters_changed`](Self::masters_changed) after writing them).
    fn master_mut(&mut self) -> &mut Weights;
    /// Refreshes what derives from the masters (the bf16 copies) after they
    /// were written from the host: upload, checkpoint import.
    fn masters_changed(&mut self, gpu: &Gpu) -> Result<(), Mamba3GpuError>;
    /// The masters, and for each of their tensors in `param_specs` order its
    /// bf16 compute copy (`None` where it has none; an empty list when no
    /// tensor has one): what one AdamW pass updates.
    #[expect(
        clippy::type_complexity,
        reason = "a pair of borrows, taken apart at once by the caller"
    )]
    fn masters_and_copies(
        &mut self,
    ) -> Result<(&mut Weights, Vec<Option<&mut DeviceBuffer<bf16>>>), Mamba3GpuError>;
    /// Layer `l`'s `[in_proj, out_proj]` in the compute type.
    fn layer_gemm(&self, l: usize) -> Result<GemmPair<'_, Self::T>, Mamba3GpuError>;
    /// The LM head (the embedding when tied) in the compute type.
    fn head_gemm(&self) -> &DeviceBuffer<Self::T>;
}

/// A compute type the model runs in, and the weights a step keeps for it:
/// the one type parameter of everything above the forward and backward
/// bodies (`step::Mamba3Step<P>`, the engines, the bench).
pub trait ModelCompute: Compute {
    /// The step's weights: f32 [`Weights`] for `f32`, f32 masters with bf16
    /// copies ([`super::MixedWeights`]) for `bf16`.
    type Weights: StepWeights<T = Self>;
    /// The precision's name in specs, flags and reports.
    const PRECISION: Precision;
}

impl ModelCompute for f32 {
    type Weights = Weights;
    const PRECISION: Precision = Precision::F32;
}

impl ModelCompute for bf16 {
    type Weights = super::MixedWeights;
    const PRECISION: Precision = Precision::Bf16;
}

impl StepWeights for Weights {
    type T = f32;

    fn upload<F: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        w: &cpu::Weights<F>,
    ) -> Result<Self, Mamba3GpuError> {
        Weights::upload(gpu, cfg, w)
    }

    fn master(&self) -> &Weights {
        self
    }

    fn master_mut(&mut self) -> &mut Weights {
        self
    }

    fn masters_changed(&mut self, _gpu: &Gpu) -> Result<(), Mamba3GpuError> {
        // The f32 weights are their own masters: nothing derives from them.
        Ok(())
    }

    fn masters_and_copies(
        &mut self,
    ) -> Result<(&mut Weights, Vec<Option<&mut DeviceBuffer<bf16>>>), Mamba3GpuError> {
        Ok((self, Vec::new()))
    }

    fn layer_gemm(&self, l: usize) -> Result<GemmPair<'_, f32>, Mamba3GpuError> {
        let lw = self.layers.get(l).ok_or(Mamba3GpuError::Shape {
            what: "weight layers",
            expected: l + 1,
            found: self.layers.len(),
        })?;
        Ok([&lw.in_proj, &lw.out_proj])
    }

    fn head_gemm(&self) -> &DeviceBuffer<f32> {
        self.head()
    }
}

/// Gradients of the mean loss (same layout as [`Weights`]) and the backward
/// pass's working memory, sized for one (batch, seq_len).
#[derive(Debug, DevicePtrs)]
pub struct Grads {
    /// One gradient per parameter.
    pub params: Weights,
    /// Intermediate gradients of the backward pass.
    pub work: BackwardWork,
}

impl Grads {
    /// Zeroed gradients and working memory for `batch x seq_len` windows of
    /// a step computing in `T`.
    pub fn new<T: Compute>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError> {
        Ok(Self {
            params: Weights::zeros(gpu, cfg)?,
            work: BackwardWork::new::<T>(gpu, cfg, batch, seq_len)?,
        })
    }

    /// The parameter gradients as a CPU value.
    pub fn download(&self, gpu: &Gpu) -> Result<cpu::Grads<f32>, Mamba3GpuError> {
        self.params.download(gpu)
    }
}
