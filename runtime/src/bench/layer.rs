//! The f32 step's op sequence, rebuilt from the public kernel wrappers with
//! every launch passed through a [`Probe`], so one code path serves both
//! the backbone-only step (probe off: it runs, and is captured, like any op)
//! and the per-family breakdown (probe on: each launch between two CUDA
//! events).
//!
//! Why a rebuild: the f32 step's per-block pieces (`mixer_forward`,
//! `mixer_backward` in `mamba3::gpu`) are private, and its public ops cover
//! whole passes with the embedding and LM head inside. The sequence here
//! follows theirs call for call; [`super::f32`] checks at run time that it
//! still reproduces the step's loss bit for bit, so a change to the step
//! that this file does not follow shows up in the report, not as silently
//! wrong timings.

use crate::device::{DeviceBuffer, Gemm, Gpu, GpuError};
use crate::kernels::mamba3::{self as k, Mamba3Shape};
use crate::kernels::mamba3_bwd::{self as kb, ScanGrads};
use crate::kernels::precision::Compute;
use crate::mamba3::gpu::{
    Acts, BackwardWork, GemmPair, Grads, LayerActs, LayerWeights, Mamba3GpuError, StepWeights,
};

/// The families of the eager-time breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// cuBLAS GEMMs (projections, LM head).
    Gemm,
    /// The chunked scan and the angle cumsums, forward and backward.
    Scan,
    /// Norms, gates, rotations, per-head scalars, residual copies, the
    /// embedding, and the column sums that finish parameter gradients.
    NormElementwise,
    /// Cross-entropy forward and backward, the mean.
    Loss,
    /// Zeroing gradients, the schedule and AdamW.
    Optimizer,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 5] = [
        Family::Gemm,
        Family::Scan,
        Family::NormElementwise,
        Family::Loss,
        Family::Optimizer,
    ];

    /// The table's column label.
    pub fn label(self) -> &'static str {
        match self {
            Family::Gemm => "GEMM",
            Family::Scan => "scan",
            Family::NormElementwise => "norm/elem",
            Family::Loss => "loss",
            Family::Optimizer => "optimizer",
        }
    }
}

/// One timed launch (or group of launches under one name).
#[derive(Clone, Debug, PartialEq)]
pub struct OpSample {
    /// Its family.
    pub family: Family,
    /// What ran, e.g. `scan fwd`.
    pub name: &'static str,
    /// GPU time between the events around it.
    pub ms: f32,
}

/// Runs ops either plainly (capturable) or each between two CUDA events,
/// recording the time. Timing synchronizes after every op, so a timed pass
/// is slower end to end than an eager step; each op's own time includes its
/// launch, which is what eager execution pays for it.
pub struct Probe<'g> {
    gpu: &'g Gpu,
    samples: Option<Vec<OpSample>>,
}

impl<'g> Probe<'g> {
    /// Ops run as they are: for eager steps and graph capture.
    pub fn plain(gpu: &'g Gpu) -> Self {
        Self { gpu, samples: None }
    }

    /// Every op timed with CUDA events.
    pub fn timed(gpu: &'g Gpu) -> Self {
        Self {
            gpu,
            samples: Some(Vec::new()),
        }
    }

    /// The context ops run on.
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Runs `f`, timing it when the probe is on.
    pub fn run<E: From<GpuError>>(
        &mut self,
        family: Family,
        name: &'static str,
        f: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        match &mut self.samples {
            None => f(),
            Some(samples) => {
                let (r, ms) = self.gpu.time_ms(|| Ok(f()))?;
                r?;
                samples.push(OpSample { family, name, ms });
                Ok(())
            }
        }
    }

    /// The samples recorded so far (empty when plain).
    pub fn into_samples(self) -> Vec<OpSample> {
        self.samples.unwrap_or_default()
    }
}

fn same_layers(weights: usize, found: usize) -> Result<(), Mamba3GpuError> {
    if weights == found {
        Ok(())
    } else {
        Err(Mamba3GpuError::Shape {
            what: "bench: layers of the step's buffers vs its weights",
            expected: weights,
            found,
        })
    }
}

use Family::{Gemm as G, Loss as L, NormElementwise as E, Optimizer as O, Scan as S};

/// One block forward: `h_next = h_in + out_proj(mixer(norm(h_in)))`.
/// `gemm_w` is the block's `[in_proj, out_proj]` in the compute type `T`.
pub(crate) fn layer_forward<T: Compute>(
    p: &mut Probe<'_>,
    sh: &Mamba3Shape,
    lw: &LayerWeights,
    gemm_w: GemmPair<'_, T>,
    la: &mut LayerActs<DeviceBuffer<T>>,
    h_next: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let gpu = p.gpu();
    let [w_in, w_out] = gemm_w;
    let (rows, dm) = (sh.rows, sh.d_model);
    p.run(E, "rmsnorm fwd", || {
        k::rmsnorm_fwd(
            gpu,
            rows,
            dm,
            sh.eps,
            &la.h_in,
            &lw.norm,
            &mut la.u,
            &mut la.rstd,
        )
    })?;
    p.run(G, "in_proj fwd", || {
        T::gemm(
            gpu,
            &Gemm::new(rows, sh.width, dm).trans_b(),
            &la.u,
            w_in,
            &mut la.proj,
        )
    })?;
    p.run(E, "prep (dt, A dt, lam, theta)", || {
        k::prep(
            gpu,
            sh,
            &la.proj,
            &lw.dt_bias,
            &mut la.rstd_b,
            &mut la.rstd_c,
            &mut la.theta,
            &mut la.dt,
            &mut la.adt,
            &mut la.lam,
        )
    })?;
    p.run(S, "angle cumsum fwd", || {
        k::angle_fwd(gpu, sh, &la.dt, &la.theta, &mut la.phi)
    })?;
    p.run(E, "qk norm + rotate fwd", || {
        k::qk_fwd(
            gpu,
            sh,
            &la.proj,
            &la.rstd_b,
            &la.rstd_c,
            [&lw.b_norm, &lw.c_norm, &lw.b_bias, &lw.c_bias],
            &la.phi,
            &mut la.q,
            &mut la.k,
            &mut la.qk_raw,
        )
    })?;
    p.run(S, "scan fwd", || {
        k::scan_fwd(
            gpu,
            sh,
            &la.q,
            &la.k,
            &la.proj,
            [&la.dt, &la.adt, &la.lam, &la.qk_raw],
            &lw.d,
            &mut la.y,
            &mut la.states,
        )
    })?;
    p.run(E, "gate fwd", || {
        k::gate_fwd(
            gpu,
            sh,
            &la.y,
            &la.proj,
            lw.out_norm.as_ref(),
            &mut la.o,
            &mut la.gate_rstd,
        )
    })?;
    p.run(E, "residual copy", || gpu.copy_device(&la.h_in, h_next))?;
    p.run(G, "out_proj fwd", || {
        T::gemm(
            gpu,
            &Gemm::new(rows, dm, sh.d_inner).trans_b().scaled(1.0, 1.0),
            &la.o,
            w_out,
            h_next,
        )
    })
}

/// Every block forward, from `acts.layers[0].h_in` to `acts.h_final`.
pub(crate) fn blocks_forward<W: StepWeights>(
    p: &mut Probe<'_>,
    weights: &W,
    acts: &mut Acts<DeviceBuffer<W::T>>,
) -> Result<(), Mamba3GpuError> {
    let sh = acts.shape;
    let w = weights.master();
    same_layers(w.layers.len(), acts.layers.len())?;
    let nl = acts.layers.len();
    for l in 0..nl {
        let (cur, rest) = acts.layers.split_at_mut(l + 1);
        let next = match rest.first_mut() {
            Some(n) => &mut n.h_in,
            None => &mut acts.h_final,
        };
        layer_forward(
            p,
            &sh,
            &w.layers[l],
            weights.layer_gemm(l)?,
            &mut cur[l],
            next,
        )?;
    }
    Ok(())
}

/// One block backward: adds the block's input gradient into `work.dh`,
/// writes its parameter gradients into `lg`.
pub(crate) fn layer_backward<T: Compute>(
    p: &mut Probe<'_>,
    sh: &Mamba3Shape,
    lw: &LayerWeights,
    gemm_w: GemmPair<'_, T>,
    la: &LayerActs<DeviceBuffer<T>>,
    lg: &mut LayerWeights,
    work: &mut BackwardWork,
) -> Result<(), GpuError> {
    let gpu = p.gpu();
    let [w_in, w_out] = gemm_w;
    let (rows, dm, di, e) = (sh.rows, sh.d_model, sh.d_inner, sh.width);
    let (nh, n, ng) = (sh.nheads, sh.d_state, sh.ngroups);
    let BackwardWork {
        dh,
        dnorm,
        d_o,
        dy,
        dproj,
        dq,
        dk,
        dadt,
        dscale,
        dqkdot,
        dphi,
        dskip_part,
        contrib,
        contrib_c,
        partials,
        ..
    } = work;
    p.run(G, "out_proj dW", || {
        T::gemm_grad(
            gpu,
            &Gemm::new(dm, di, rows).trans_a(),
            dh,
            &la.o,
            &mut lg.out_proj,
        )
    })?;
    p.run(G, "out_proj dX", || {
        T::gemm_grad(gpu, &Gemm::new(rows, di, dm), dh, w_out, d_o)
    })?;
    p.run(E, "gate bwd", || {
        kb::gate_bwd(
            gpu,
            sh,
            &la.y,
            &la.proj,
            lw.out_norm.as_ref(),
            &la.gate_rstd,
            d_o,
            dproj,
            dy,
            contrib,
        )
    })?;
    if let Some(gn) = lg.out_norm.as_mut() {
        p.run(E, "colsum (param grads)", || {
            kb::colsum(gpu, contrib, rows, di, di, 0, partials, gn)
        })?;
    }
    p.run(S, "scan bwd", || {
        let out = ScanGrads {
            dq: &mut *dq,
            dk: &mut *dk,
            dproj: &mut *dproj,
            dadt: &mut *dadt,
            dscale: &mut *dscale,
            dqkdot: &mut *dqkdot,
            dskip_part: &mut *dskip_part,
        };
        let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
        kb::scan_bwd(
            gpu, sh, &la.q, &la.k, &la.proj, scalars, &lw.d, &la.states, dy, out,
        )
    })?;
    p.run(E, "colsum (param grads)", || {
        kb::colsum(gpu, dskip_part, sh.batch, nh, nh, 0, partials, &mut lg.d)
    })?;
    p.run(E, "rotate bwd", || {
        kb::rot_bwd(
            gpu,
            sh,
            &la.proj,
            [&la.rstd_b, &la.rstd_c],
            [&lw.b_norm, &lw.c_norm, &lw.b_bias, &lw.c_bias],
            [&la.phi, &la.q, &la.k, &la.dt, &la.lam],
            dqkdot,
            dq,
            dk,
            dphi,
        )
    })?;
    p.run(E, "colsum (param grads)", || {
        kb::colsum(gpu, dk, rows, nh * n, nh * n, 0, partials, &mut lg.b_bias)?;
        kb::colsum(gpu, dq, rows, nh * n, nh * n, 0, partials, &mut lg.c_bias)
    })?;
    p.run(S, "angle cumsum bwd", || kb::angle_bwd(gpu, sh, dphi))?;
    p.run(E, "scalar bwd (dt, A, trap)", || {
        kb::scalar_bwd(
            gpu,
            sh,
            &la.proj,
            &lw.dt_bias,
            [&la.dt, &la.lam, &la.theta, &la.qk_raw],
            [dphi, dadt, dscale, dqkdot],
            dproj,
        )
    })?;
    p.run(E, "colsum (param grads)", || {
        kb::colsum(
            gpu,
            dproj,
            rows,
            nh,
            e,
            sh.layout.dd_dt,
            partials,
            &mut lg.dt_bias,
        )
    })?;
    p.run(E, "B/C norm bwd", || {
        kb::bcnorm_bwd(
            gpu,
            sh,
            &la.proj,
            [&la.rstd_b, &la.rstd_c],
            [&lw.b_norm, &lw.c_norm],
            dk,
            dq,
            dproj,
            contrib,
            contrib_c,
        )
    })?;
    p.run(E, "colsum (param grads)", || {
        kb::colsum(gpu, contrib, rows * ng, n, n, 0, partials, &mut lg.b_norm)?;
        kb::colsum(gpu, contrib_c, rows * ng, n, n, 0, partials, &mut lg.c_norm)
    })?;
    p.run(G, "in_proj dW", || {
        T::gemm_grad(
            gpu,
            &Gemm::new(e, dm, rows).trans_a(),
            dproj,
            &la.u,
            &mut lg.in_proj,
        )
    })?;
    p.run(G, "in_proj dX", || {
        T::gemm_grad(gpu, &Gemm::new(rows, dm, e), dproj, w_in, dnorm)
    })?;
    p.run(E, "rmsnorm bwd", || {
        kb::rmsnorm_bwd(
            gpu, rows, dm, &la.h_in, &lw.norm, &la.rstd, dnorm, dh, contrib, true,
        )
    })?;
    p.run(E, "colsum (param grads)", || {
        kb::colsum(gpu, contrib, rows, dm, dm, 0, partials, &mut lg.norm)
    })
}

/// Every block backward, last first, from the gradient in `work.dh`.
pub(crate) fn blocks_backward<W: StepWeights>(
    p: &mut Probe<'_>,
    weights: &W,
    acts: &Acts<DeviceBuffer<W::T>>,
    grads: &mut Grads,
) -> Result<(), Mamba3GpuError> {
    let sh = acts.shape;
    let w = weights.master();
    same_layers(w.layers.len(), grads.params.layers.len())?;
    let Grads { params, work } = grads;
    for (l, ((lw, lg), la)) in w
        .layers
        .iter()
        .zip(params.layers.iter_mut())
        .zip(&acts.layers)
        .enumerate()
        .rev()
    {
        layer_backward(p, &sh, lw, weights.layer_gemm(l)?, la, lg, work)?;
    }
    Ok(())
}

/// The full LM forward (embedding, blocks, `norm_f`, head, loss), as
/// `mamba3::gpu::forward` runs it.
pub(crate) fn lm_forward<W: StepWeights>(
    p: &mut Probe<'_>,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &mut Acts<DeviceBuffer<W::T>>,
    loss: &mut DeviceBuffer<f32>,
) -> Result<(), Mamba3GpuError> {
    let gpu = p.gpu();
    let w = weights.master();
    let sh = acts.shape;
    let first = acts.layers.first_mut().ok_or(Mamba3GpuError::Shape {
        what: "bench: layers (at least one)",
        expected: 1,
        found: 0,
    })?;
    p.run(E, "embedding fwd", || {
        k::embed_fwd(gpu, &sh, tokens, &w.embedding, &mut first.h_in)
    })?;
    blocks_forward(p, weights, acts)?;
    p.run(E, "rmsnorm fwd", || {
        k::rmsnorm_fwd(
            gpu,
            sh.rows,
            sh.d_model,
            sh.eps,
            &acts.h_final,
            &w.norm_f,
            &mut acts.normed,
            &mut acts.rstd_f,
        )
    })?;
    p.run(G, "lm_head fwd", || {
        W::T::gemm(
            gpu,
            &Gemm::new(sh.rows, sh.vocab, sh.d_model).trans_b(),
            &acts.normed,
            weights.head_gemm(),
            &mut acts.logits,
        )
    })?;
    p.run(L, "cross-entropy fwd", || {
        k::ce_fwd(
            gpu,
            &sh,
            &acts.logits,
            tokens,
            &mut acts.lse,
            &mut acts.row_loss,
        )
    })?;
    p.run(L, "mean loss", || {
        k::mean(gpu, &acts.row_loss, sh.rows, loss)
    })?;
    Ok(())
}

/// The full LM backward, as `mamba3::gpu::backward` runs it.
pub(crate) fn lm_backward<W: StepWeights>(
    p: &mut Probe<'_>,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &Acts<DeviceBuffer<W::T>>,
    grads: &mut Grads,
) -> Result<(), Mamba3GpuError> {
    let gpu = p.gpu();
    let w = weights.master();
    let sh = acts.shape;
    let (rows, dm, vocab) = (sh.rows, sh.d_model, sh.vocab);
    {
        let Grads { params: g, work } = &mut *grads;
        p.run(L, "cross-entropy bwd", || {
            kb::ce_bwd(gpu, &sh, &acts.logits, &acts.lse, tokens, &mut work.dlogits)
        })?;
        p.run(G, "lm_head dW", || {
            let dst = match g.lm_head.as_mut() {
                Some(h) => h,
                None => &mut g.embedding,
            };
            W::T::gemm_grad(
                gpu,
                &Gemm::new(vocab, dm, rows).trans_a(),
                &work.dlogits,
                &acts.normed,
                dst,
            )
        })?;
        if g.lm_head.is_some() {
            p.run(E, "embedding bwd", || gpu.zero(&mut g.embedding))?;
        }
        p.run(G, "lm_head dX", || {
            W::T::gemm_grad(
                gpu,
                &Gemm::new(rows, dm, vocab),
                &work.dlogits,
                weights.head_gemm(),
                &mut work.dnorm,
            )
        })?;
        p.run(E, "rmsnorm bwd", || {
            kb::rmsnorm_bwd(
                gpu,
                rows,
                dm,
                &acts.h_final,
                &w.norm_f,
                &acts.rstd_f,
                &work.dnorm,
                &mut work.dh,
                &mut work.contrib,
                false,
            )
        })?;
        p.run(E, "colsum (param grads)", || {
            kb::colsum(
                gpu,
                &work.contrib,
                rows,
                dm,
                dm,
                0,
                &mut work.partials,
                &mut g.norm_f,
            )
        })?;
    }
    blocks_backward(p, weights, acts, grads)?;
    let Grads { params: g, work } = grads;
    p.run(E, "embedding bwd", || {
        kb::embed_bwd(gpu, &sh, tokens, &work.dh, &mut g.embedding)
    })?;
    Ok(())
}

/// The step's first op: zero every parameter gradient.
pub(crate) fn zero_grads(p: &mut Probe<'_>, grads: &mut Grads) -> Result<(), Mamba3GpuError> {
    let gpu = p.gpu();
    p.run(O, "zero grads", || {
        crate::mamba3::gpu::zero_grads(gpu, grads)
    })
}
