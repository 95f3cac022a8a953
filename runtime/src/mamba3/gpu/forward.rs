//! The forward op (tokens -> loss, keeping activations) and `zero_grads`.
//!
//! One body, [`forward_probed`], generic over the weights' compute type and
//! over a timing [`Probe`]: the step op [`forward`] calls it with
//! [`NoProbe`] at either precision; the bench calls it with a probe that
//! times each op, and runs [`blocks_forward`] alone as its backbone-only
//! step.

use crate::device::{DeviceBuffer, Gemm, Gpu};
use crate::kernels::mamba3 as k;
use crate::kernels::mamba3_chunk as kc;
use crate::kernels::precision::Compute;

use super::acts::{Acts, LayerActs, ScanOperands, keeps_qk, scan_operands};
use super::probe::Family::{Gemm as G, Loss as L, NormElementwise as E, Scan as S};
use super::probe::{NoProbe, Probe};
use super::weights::{Grads, LayerWeights, StepWeights, Weights};
use super::{Mamba3GpuError, same};

/// Zeroes every parameter gradient (memset nodes under capture). The
/// training steps do not run it: the backward op writes every parameter
/// gradient rather than adding to it (see `backward`'s docs), so zeroing
/// first would only cost a pass over the gradients.
pub fn zero_grads(gpu: &Gpu, grads: &mut Grads) -> Result<(), Mamba3GpuError> {
    for g in grads.params.tensors_mut() {
        gpu.zero(g)?;
    }
    Ok(())
}

/// Checks that weights, tokens and activations describe the same step.
pub(crate) fn check_step<B>(
    w: &Weights,
    tokens: &DeviceBuffer<i32>,
    acts: &Acts<B>,
) -> Result<(), Mamba3GpuError> {
    let sh = &acts.shape;
    let expect = super::acts::shape_of(&w.cfg, sh.batch, sh.len)?;
    if expect != *sh {
        return Err(Mamba3GpuError::Shape {
            what: "activations built for another config (d_inner)",
            expected: expect.d_inner,
            found: sh.d_inner,
        });
    }
    same(
        "activation layers vs weight layers",
        w.layers.len(),
        acts.layers.len(),
    )?;
    super::at_least(
        "tokens (at least batch * (seq_len + 1))",
        sh.batch * (sh.len + 1),
        tokens.len(),
    )?;
    Ok(())
}

/// Forward pass over one `[batch, seq_len + 1]` token window from a zero
/// state: fills `acts` and writes the mean next-token cross-entropy to
/// `loss[0]`. One body for every compute type: `W::T` is what the GEMM
/// operands (weights' compute copies, `u`, `o`, `normed`) are stored in.
pub fn forward<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &mut Acts<DeviceBuffer<W::T>>,
    loss: &mut DeviceBuffer<f32>,
) -> Result<(), Mamba3GpuError> {
    forward_probed(gpu, weights, tokens, acts, loss, &mut NoProbe)
}

/// [`forward`] telling `probe` where each op begins (the bench's
/// per-family breakdown times the step's own sequence through it).
pub fn forward_probed<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &mut Acts<DeviceBuffer<W::T>>,
    loss: &mut DeviceBuffer<f32>,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let w = weights.master();
    check_step(w, tokens, acts)?;
    let sh = acts.shape;
    // The embedding gather reads the f32 master: a gather is no GEMM, and
    // autocast leaves it in the weight's own precision.
    probe.enter(gpu, E, "embedding fwd")?;
    let Some(first) = acts.layers.first_mut() else {
        k::embed_fwd(gpu, &sh, tokens, &w.embedding, &mut acts.h_final)?;
        return head_and_loss(gpu, weights, tokens, acts, loss, probe);
    };
    k::embed_fwd(gpu, &sh, tokens, &w.embedding, &mut first.h_in)?;
    blocks_forward(gpu, weights, acts, probe)?;
    head_and_loss(gpu, weights, tokens, acts, loss, probe)
}

/// Every block forward, from `acts.layers[0].h_in` to `acts.h_final`: the
/// backbone between the embedding and the head (the bench's backbone-only
/// step runs it alone).
pub fn blocks_forward<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    acts: &mut Acts<DeviceBuffer<W::T>>,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let w = weights.master();
    let sh = acts.shape;
    let nl = acts.layers.len();
    same("activation layers vs weight layers", w.layers.len(), nl)?;
    let Acts {
        layers,
        q,
        k,
        chunk_own,
        h_final,
        resets,
        packed,
        ..
    } = acts;
    let starts = packed.then_some(&*resets);
    for l in 0..nl {
        let (cur, rest) = layers.split_at_mut(l + 1);
        let la = &mut cur[l];
        let next = match rest.first_mut() {
            Some(n) => &mut n.h_in,
            None => &mut *h_final,
        };
        let gemm_w = weights.layer_gemm(l)?;
        let lw = w.layers.get(l).ok_or(Mamba3GpuError::Shape {
            what: "weight layers",
            expected: nl,
            found: w.layers.len(),
        })?;
        let shared = Shared {
            qk: [&mut *q, &mut *k],
            chunk_own: &mut *chunk_own,
            starts,
        };
        mixer_forward(gpu, &sh, lw, gemm_w, la, shared, next, probe)?;
    }
    Ok(())
}

/// Working buffers every block of a forward pass shares.
struct Shared<'a, T: Compute> {
    /// Rotated q and k, for a step whose layers do not keep their own.
    qk: [&'a mut DeviceBuffer<T>; 2],
    /// The chunk scan's f32 working memory.
    chunk_own: &'a mut DeviceBuffer<f32>,
    /// Where sequences start inside the rows, when packed
    /// ([`Acts::set_packed`]).
    starts: Option<&'a DeviceBuffer<f32>>,
}

/// One block: `h_next = h_in + out_proj(mixer(norm(h_in)))`.
/// `gemm_w` holds the block's `[in_proj, out_proj]` in the compute type.
// The block's buffers plus the probe, as in `mixer_backward`.
#[expect(
    clippy::too_many_arguments,
    reason = "a layer's buffers, passed one by one"
)]
fn mixer_forward<T: Compute>(
    gpu: &Gpu,
    sh: &k::Mamba3Shape,
    lw: &LayerWeights,
    gemm_w: [&DeviceBuffer<T>; 2],
    la: &mut LayerActs<DeviceBuffer<T>>,
    shared: Shared<'_, T>,
    h_next: &mut DeviceBuffer<f32>,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let [w_in, w_out] = gemm_w;
    let Shared {
        qk: [shared_q, shared_k],
        chunk_own,
        starts,
    } = shared;
    let (q, k_rot) = if keeps_qk::<T>() {
        (&mut la.q, &mut la.k)
    } else {
        (shared_q, shared_k)
    };
    let (rows, dm) = (sh.rows, sh.d_model);
    probe.enter(gpu, E, "rmsnorm fwd")?;
    k::rmsnorm_fwd(
        gpu,
        rows,
        dm,
        sh.eps,
        &la.h_in,
        &lw.norm,
        &mut la.u,
        &mut la.rstd,
    )?;
    probe.enter(gpu, G, "in_proj fwd")?;
    T::gemm(
        gpu,
        &Gemm::new(rows, sh.width, dm).trans_b(),
        &la.u,
        w_in,
        &mut la.proj,
    )?;
    probe.enter(gpu, E, "prep (dt, A dt, lam, theta)")?;
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
    )?;
    probe.enter(gpu, S, "angle cumsum fwd")?;
    match sh.angles_from {
        k::AngleSource::Cumsum => k::angle_fwd(gpu, sh, &la.dt, &la.theta, &mut la.phi)?,
        k::AngleSource::Fixed { base } => k::angle_fixed(gpu, sh, base, &mut la.phi)?,
    }
    probe.enter(gpu, E, "qk norm + rotate fwd")?;
    let src = k::QkSources {
        proj: &la.proj,
        rstd: [&la.rstd_b, &la.rstd_c],
        params: [&lw.b_norm, &lw.c_norm, &lw.b_bias, &lw.c_bias],
        phi: &la.phi,
    };
    k::qk_fwd(gpu, sh, &src, q, k_rot, &mut la.qk_raw)?;
    probe.enter(gpu, S, "scan fwd")?;
    let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
    match scan_operands(sh, &*q, &*k_rot) {
        // `Acts::set_packed` refuses every shape the chunk scan runs at.
        ScanOperands::Chunk(..) if starts.is_some() => {
            return Err(Mamba3GpuError::Packed {
                headdim: sh.headdim,
                d_state: sh.d_state,
            });
        }
        ScanOperands::Chunk(q16, k16) => kc::scan_fwd(
            gpu,
            sh,
            q16,
            k16,
            &la.proj,
            scalars,
            &lw.d,
            &mut la.y,
            chunk_own,
            &mut la.states16,
        )?,
        ScanOperands::Scalar(q, k_rot) => k::scan_fwd(
            gpu,
            sh,
            q,
            k_rot,
            &la.proj,
            (scalars, starts),
            &lw.d,
            &mut la.y,
            &mut la.states,
        )?,
    }
    probe.enter(gpu, E, "gate fwd")?;
    k::gate_fwd(
        gpu,
        sh,
        &la.y,
        &la.proj,
        lw.out_norm.as_ref(),
        &mut la.o,
        &mut la.gate_rstd,
    )?;
    // Residual: h_next = h_in, then h_next += o W_out^T (beta = 1).
    probe.enter(gpu, E, "residual copy")?;
    gpu.copy_device(&la.h_in, h_next)?;
    probe.enter(gpu, G, "out_proj fwd")?;
    T::gemm(
        gpu,
        &Gemm::new(rows, dm, sh.d_inner).trans_b().scaled(1.0, 1.0),
        &la.o,
        w_out,
        h_next,
    )?;
    Ok(())
}

/// `norm_f`, the LM head and the mean cross-entropy.
fn head_and_loss<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &mut Acts<DeviceBuffer<W::T>>,
    loss: &mut DeviceBuffer<f32>,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let w = weights.master();
    let sh = acts.shape;
    probe.enter(gpu, E, "rmsnorm fwd")?;
    k::rmsnorm_fwd(
        gpu,
        sh.rows,
        sh.d_model,
        sh.eps,
        &acts.h_final,
        &w.norm_f,
        &mut acts.normed,
        &mut acts.rstd_f,
    )?;
    probe.enter(gpu, G, "lm_head fwd")?;
    W::T::gemm(
        gpu,
        &Gemm::new(sh.rows, sh.vocab, sh.d_model).trans_b(),
        &acts.normed,
        weights.head_gemm(),
        &mut acts.logits,
    )?;
    probe.enter(gpu, L, "cross-entropy fwd")?;
    k::ce_fwd(
        gpu,
        &sh,
        &acts.logits,
        tokens,
        &mut acts.lse,
        &mut acts.row_loss,
    )?;
    probe.enter(gpu, L, "mean loss")?;
    k::mean(gpu, &acts.row_loss, sh.rows, loss)?;
    Ok(())
}
