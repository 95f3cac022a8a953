//! The bf16 mixed-precision model: f32 master weights with bf16 compute
//! copies of the GEMM weights, and the mixed step's ops
//! (`specs/mamba3_bf16.ron`).
//!
//! The forward and backward ops are the generic bodies
//! ([`super::forward`], [`super::backward`]) at `bf16`; AdamW updates the f32
//! masters exactly as in the f32 step and, in the same multi-tensor pass,
//! rounds each updated GEMM weight into its bf16 copy
//! ([`StepWeights::masters_and_copies`] lists them), so the next forward pass
//! sees them. [`sync_master_to_compute`] does that rounding on its own, for
//! masters written from the host (upload, checkpoint import).

use half::bf16;

use crate::DevicePtrs;
use crate::device::{DeviceBuffer, Gpu, HALF_STAGING};
use crate::kernels::f32_to_bf16;
use crate::kernels::mamba3::Mamba3Shape;
use crate::kernels::precision::Compute;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu;

use super::Mamba3GpuError;
use super::weights::{GemmPair, StepWeights, Weights};

/// One block's GEMM weights in bf16.
#[derive(Debug, DevicePtrs)]
pub struct MixedLayer {
    /// `mixer.in_proj.weight` `[d_in_proj, d_model]`, bf16 copy.
    pub in_proj: DeviceBuffer<bf16>,
    /// `mixer.out_proj.weight` `[d_model, d_inner]`, bf16 copy.
    pub out_proj: DeviceBuffer<bf16>,
}

/// f32 master weights (what AdamW updates and checkpoints hold) and bf16
/// compute copies of the GEMM weights (what the GEMMs read).
#[derive(Debug, DevicePtrs)]
pub struct MixedWeights {
    /// Every parameter in f32.
    pub master: Weights,
    /// `backbone.embedding.weight` in bf16 (the LM head when tied).
    pub embedding: DeviceBuffer<bf16>,
    /// One entry per block.
    pub layers: Vec<MixedLayer>,
    /// `lm_head.weight` in bf16; `None` when tied to the embedding.
    pub lm_head: Option<DeviceBuffer<bf16>>,
}

impl MixedWeights {
    /// Allocates bf16 copies for `master` and fills them from it.
    pub fn from_master(gpu: &Gpu, master: Weights) -> Result<Self, Mamba3GpuError> {
        let copy = |b: &DeviceBuffer<f32>| gpu.alloc_zeros::<bf16>(b.len());
        let mut layers = Vec::with_capacity(master.layers.len());
        for l in &master.layers {
            layers.push(MixedLayer {
                in_proj: copy(&l.in_proj)?,
                out_proj: copy(&l.out_proj)?,
            });
        }
        let mut out = Self {
            embedding: copy(&master.embedding)?,
            lm_head: master.lm_head.as_ref().map(copy).transpose()?,
            layers,
            master,
        };
        sync_master_to_compute(gpu, &mut out)?;
        Ok(out)
    }

    /// The configuration the tensors are shaped for.
    pub fn cfg(&self) -> &Mamba3Config {
        &self.master.cfg
    }
}

impl StepWeights for MixedWeights {
    type T = bf16;

    /// The f32 masters, and bf16 copies rounded from them.
    fn upload<F: cpu::Float>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        w: &cpu::Weights<F>,
    ) -> Result<Self, Mamba3GpuError> {
        let master = Weights::upload(gpu, cfg, w)?;
        Self::from_master(gpu, master)
    }

    fn master(&self) -> &Weights {
        &self.master
    }

    fn master_mut(&mut self) -> &mut Weights {
        &mut self.master
    }

    fn masters_changed(&mut self, gpu: &Gpu) -> Result<(), Mamba3GpuError> {
        sync_master_to_compute(gpu, self)
    }

    fn masters_and_copies(
        &mut self,
    ) -> Result<(&mut Weights, Vec<Option<&mut DeviceBuffer<bf16>>>), Mamba3GpuError> {
        let Self {
            master,
            embedding,
            layers,
            lm_head,
        } = self;
        super::same("bf16 weight layers", master.layers.len(), layers.len())?;
        let mut copies = vec![Some(embedding)];
        for (m, c) in master.layers.iter().zip(layers.iter_mut()) {
            // norm, in_proj, dt_bias, B_bias, C_bias, B_norm, C_norm, D
            copies.extend([
                None,
                Some(&mut c.in_proj),
                None,
                None,
                None,
                None,
                None,
                None,
            ]);
            if m.out_norm.is_some() {
                copies.push(None);
            }
            copies.push(Some(&mut c.out_proj));
        }
        // norm_f, then the untied LM head.
        copies.push(None);
        match (&master.lm_head, lm_head) {
            (Some(_), Some(c)) => copies.push(Some(c)),
            (None, None) => {}
            (m, _) => {
                return Err(Mamba3GpuError::Shape {
                    what: "untied LM heads (f32 master vs bf16 copy)",
                    expected: usize::from(m.is_some()),
                    found: usize::from(m.is_none()),
                });
            }
        }
        Ok((master, copies))
    }

    fn layer_gemm(&self, l: usize) -> Result<GemmPair<'_, bf16>, Mamba3GpuError> {
        let lw = self.layers.get(l).ok_or(Mamba3GpuError::Shape {
            what: "bf16 weight layers",
            expected: l + 1,
            found: self.layers.len(),
        })?;
        Ok([&lw.in_proj, &lw.out_proj])
    }

    fn head_gemm(&self) -> &DeviceBuffer<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }
}

/// Rounds the f32 masters of every GEMM weight into their bf16 copies
/// (nearest even): after the masters were written from the host. The steps'
/// AdamW pass keeps the copies in sync by itself.
pub fn sync_master_to_compute(gpu: &Gpu, w: &mut MixedWeights) -> Result<(), Mamba3GpuError> {
    super::same("bf16 weight layers", w.master.layers.len(), w.layers.len())?;
    f32_to_bf16(gpu, &w.master.embedding, &mut w.embedding)?;
    for (m, c) in w.master.layers.iter().zip(w.layers.iter_mut()) {
        f32_to_bf16(gpu, &m.in_proj, &mut c.in_proj)?;
        f32_to_bf16(gpu, &m.out_proj, &mut c.out_proj)?;
    }
    match (&w.master.lm_head, &mut w.lm_head) {
        (Some(m), Some(c)) => f32_to_bf16(gpu, m, c)?,
        (None, None) => {}
        (m, _) => {
            return Err(Mamba3GpuError::Shape {
                what: "untied LM heads (f32 master vs bf16 copy)",
                expected: usize::from(m.is_some()),
                found: usize::from(m.is_none()),
            });
        }
    }
    Ok(())
}

/// Bytes of `half_staging` a step of shape `sh` needs in compute type `T`:
/// the largest f32 gradient staged for a GEMM (dlogits, dh or dproj).
pub fn staging_bytes<T: Compute>(sh: &Mamba3Shape) -> Result<usize, Mamba3GpuError> {
    let widest = sh.vocab.max(sh.d_model).max(sh.width);
    let elems = T::staging_elems(sh.per_row(widest)?);
    Ok(crate::device::checked_elems(
        "half_staging bytes",
        elems,
        std::mem::size_of::<bf16>(),
    )?)
}

/// Grows `half_staging` to what a step of shape `sh` needs, before any
/// capture (the capture freezes it; an under-sized area would then be a
/// typed error, not a reallocation).
pub fn presize_staging<T: Compute>(gpu: &Gpu, sh: &Mamba3Shape) -> Result<(), Mamba3GpuError> {
    let bytes = staging_bytes::<T>(sh)?;
    if bytes > 0 {
        gpu.presize_scratch(HALF_STAGING, bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_covers_the_widest_staged_gradient_and_f32_stages_nothing() {
        let cfg = Mamba3Config {
            d_model: 256,
            vocab_size: 1000,
            ..Mamba3Config::tiny()
        };
        let sh = crate::mamba3::gpu::kernel_shape(&cfg, 4, 32);
        let widest = sh.vocab.max(sh.d_model).max(sh.width);
        assert_eq!(staging_bytes::<f32>(&sh).ok(), Some(0));
        assert_eq!(staging_bytes::<bf16>(&sh).ok(), Some(4 * 32 * widest * 2));
        assert!(widest >= sh.vocab && widest >= sh.width);
    }
}
