//! The backward op: gradients of the mean loss with respect to every
//! parameter, from the activations the forward op kept.
//!
//! Every parameter gradient is written (never accumulated onto what was
//! there): GEMM gradients with beta = 0, every bias, norm weight, `dt_bias`
//! and `D` by a column sum that stores its result, and the embedding, whose
//! LM-head share (tied) or a memset (untied) is written first and the token
//! scatter added after. So the op does not depend on `zero_grads` having
//! run, and the step specs do not run it.
//!
//! One body, [`backward_probed`] (the step op [`backward`] calls it with
//! [`NoProbe`]; see `forward` for the probe),
//! generic over the compute type: every GEMM's
//! A operand is an f32 gradient (staged to bf16 by `Compute::gemm_grad` /
//! `gemm_grad2`, once for a layer's weight and input gradients, in
//! the mixed step), its B operand an activation or weight copy in the
//! compute type; gradients come out in f32.

use crate::device::{DeviceBuffer, Gemm, Gpu};
use crate::kernels::mamba3::{self as kf, Mamba3Shape};
use crate::kernels::mamba3_bwd::{self as kb, ScanGrads};
use crate::kernels::mamba3_chunk as kc;
use crate::kernels::precision::Compute;

use super::acts::{BackwardWork, LayerActs, ScanOperands, keeps_qk, scan_operands};
use super::forward::check_step;
use super::probe::Family::{Gemm as G, Loss as L, NormElementwise as E, Scan as S};
use super::probe::{NoProbe, Probe};
use super::weights::{Grads, LayerWeights, StepWeights};
use super::{Acts, Mamba3GpuError};

/// Backward pass for the window `forward` last ran on, for any compute
/// type (see the module docs).
pub fn backward<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &Acts<DeviceBuffer<W::T>>,
    grads: &mut Grads,
) -> Result<(), Mamba3GpuError> {
    backward_probed(gpu, weights, tokens, acts, grads, &mut NoProbe)
}

/// [`backward`] telling `probe` where each op begins (the bench's
/// per-family breakdown times the step's own sequence through it).
pub fn backward_probed<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    tokens: &DeviceBuffer<i32>,
    acts: &Acts<DeviceBuffer<W::T>>,
    grads: &mut Grads,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let w = weights.master();
    check_step(w, tokens, acts)?;
    let sh = acts.shape;
    if grads.work.shape != sh {
        return Err(Mamba3GpuError::Shape {
            what: "gradient work buffers built for another batch * seq_len",
            expected: sh.rows,
            found: grads.work.shape.rows,
        });
    }
    super::same("gradient layers", w.layers.len(), grads.params.layers.len())?;
    let (rows, dm, vocab) = (sh.rows, sh.d_model, sh.vocab);
    let Grads { params: g, work } = &mut *grads;

    probe.enter(gpu, L, "cross-entropy bwd")?;
    kb::ce_bwd(gpu, &sh, &acts.logits, &acts.lse, tokens, &mut work.dlogits)?;
    if g.lm_head.is_none() {
        // Tied: the head's share is written here, the scatter adds to it.
        probe.enter(gpu, G, "lm_head dW")?;
        W::T::gemm_grad(
            gpu,
            &Gemm::new(vocab, dm, rows).trans_a(),
            &work.dlogits,
            &acts.normed,
            &mut g.embedding,
        )?;
    } else {
        probe.enter(gpu, E, "embedding bwd")?;
        gpu.zero(&mut g.embedding)?;
        if let Some(gh) = g.lm_head.as_mut() {
            probe.enter(gpu, G, "lm_head dW")?;
            W::T::gemm_grad(
                gpu,
                &Gemm::new(vocab, dm, rows).trans_a(),
                &work.dlogits,
                &acts.normed,
                gh,
            )?;
        }
    }
    probe.enter(gpu, G, "lm_head dX")?;
    W::T::gemm_grad(
        gpu,
        &Gemm::new(rows, dm, vocab),
        &work.dlogits,
        weights.head_gemm(),
        &mut work.dnorm,
    )?;
    probe.enter(gpu, E, "rmsnorm bwd")?;
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
    )?;
    probe.enter(gpu, E, "colsum (param grads)")?;
    kb::colsum(
        gpu,
        &work.contrib,
        rows,
        dm,
        dm,
        0,
        &mut work.partials,
        &mut g.norm_f,
    )?;

    blocks_backward(gpu, weights, acts, grads, probe)?;
    let Grads { params: g, work } = grads;
    probe.enter(gpu, E, "embedding bwd")?;
    kb::embed_bwd(gpu, &sh, tokens, &work.dh, &mut g.embedding)?;
    Ok(())
}

/// Every block backward, last first, from the gradient in `grads.work.dh`
/// (which ends as the gradient at block 0's input): the backbone between
/// the head and the embedding (the bench's backbone-only step runs it
/// alone).
pub fn blocks_backward<W: StepWeights>(
    gpu: &Gpu,
    weights: &W,
    acts: &Acts<DeviceBuffer<W::T>>,
    grads: &mut Grads,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let w = weights.master();
    let sh = acts.shape;
    // The zip below would silently skip unmatched layers.
    super::same(
        "activation layers vs weight layers",
        w.layers.len(),
        acts.layers.len(),
    )?;
    super::same("gradient layers", w.layers.len(), grads.params.layers.len())?;
    let Grads { params: g, work } = grads;
    for (l, ((lw, lg), la)) in w
        .layers
        .iter()
        .zip(g.layers.iter_mut())
        .zip(&acts.layers)
        .enumerate()
        .rev()
    {
        let gemm_w = weights.layer_gemm(l)?;
        let starts = acts.sequence_starts();
        mixer_backward(gpu, &sh, lw, gemm_w, (la, starts), lg, work, probe)?;
    }
    Ok(())
}

/// One block in reverse: adds the block's input gradient into `work.dh` and
/// writes its parameter gradients into `lg`.
/// `gemm_w` holds the block's `[in_proj, out_proj]` in the compute type.
// The block's own buffers plus the probe; a struct around them would only
// rename them at the one call site.
#[expect(
    clippy::too_many_arguments,
    reason = "a layer's buffers, passed one by one"
)]
fn mixer_backward<T: Compute>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    lw: &LayerWeights,
    gemm_w: [&DeviceBuffer<T>; 2],
    (la, starts): (&LayerActs<DeviceBuffer<T>>, Option<&DeviceBuffer<f32>>),
    lg: &mut LayerWeights,
    work: &mut BackwardWork,
    probe: &mut impl Probe,
) -> Result<(), Mamba3GpuError> {
    let [w_in, w_out] = gemm_w;
    let (rows, dm, di, e) = (sh.rows, sh.d_model, sh.d_inner, sh.width);
    let (nh, n, ng) = (sh.nheads, sh.d_state, sh.ngroups);
    let BackwardWork {
        dh,
        dnorm,
        d_o,
        dy,
        dproj,
        q,
        k,
        q16,
        k16,
        qk_raw,
        dq,
        dk,
        dadt,
        dscale,
        dqkdot,
        dphi,
        dskip_part,
        chunk_own,
        gstates,
        contrib,
        contrib_c,
        partials,
        ..
    } = work;

    // out = o W_out^T
    probe.enter(gpu, G, "out_proj dW + dX")?;
    T::gemm_grad2(
        gpu,
        dh,
        (&Gemm::new(dm, di, rows).trans_a(), &la.o, &mut lg.out_proj),
        (&Gemm::new(rows, di, dm), w_out, d_o),
    )?;
    probe.enter(gpu, E, "gate bwd")?;
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
    )?;
    if let Some(gn) = lg.out_norm.as_mut() {
        probe.enter(gpu, E, "colsum (param grads)")?;
        kb::colsum(gpu, contrib, rows, di, di, 0, partials, gn)?;
    }

    // The mixed step kept every block's rotated q and k; the f32 step
    // rebuilds them (its forward pass kept only the last block's).
    let (q, k) = if keeps_qk::<T>() {
        (&la.q, &la.k)
    } else {
        probe.enter(gpu, E, "qk norm + rotate (recompute)")?;
        let src = kf::QkSources {
            proj: &la.proj,
            rstd: [&la.rstd_b, &la.rstd_c],
            params: [&lw.b_norm, &lw.c_norm, &lw.b_bias, &lw.c_bias],
            phi: &la.phi,
        };
        let [q, k] = T::pick([q, k], [q16, k16]);
        kf::qk_fwd(gpu, sh, &src, q, k, qk_raw)?;
        (&*q, &*k)
    };
    let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
    let out = ScanGrads {
        dq: &mut *dq,
        dk: &mut *dk,
        dproj: &mut *dproj,
        dadt: &mut *dadt,
        dscale: &mut *dscale,
        dqkdot: &mut *dqkdot,
        dskip_part: &mut *dskip_part,
    };
    probe.enter(gpu, S, "scan bwd")?;
    // The chunk-parallel scan leaves one dD partial per (row, chunk, head).
    let dd_rows = match scan_operands(sh, q, k) {
        // `Acts::set_packed` refuses every shape the chunk scan runs at.
        ScanOperands::Chunk(..) if starts.is_some() => {
            return Err(Mamba3GpuError::Packed {
                headdim: sh.headdim,
                d_state: sh.d_state,
            });
        }
        ScanOperands::Chunk(q16, k16) => {
            kc::scan_bwd(
                gpu,
                sh,
                q16,
                k16,
                &la.proj,
                scalars,
                &lw.d,
                &la.states16,
                chunk_own,
                gstates,
                dy,
                out,
            )?;
            sh.batch * sh.nchunks
        }
        ScanOperands::Scalar(q, k) => {
            let inputs = (scalars, starts);
            kb::scan_bwd(gpu, sh, q, k, &la.proj, inputs, &lw.d, &la.states, dy, out)?;
            sh.batch
        }
    };
    probe.enter(gpu, E, "colsum (param grads)")?;
    kb::colsum(gpu, dskip_part, dd_rows, nh, nh, 0, partials, &mut lg.d)?;

    probe.enter(gpu, E, "rotate + B/C norm bwd")?;
    kb::rot_bcnorm_bwd(
        gpu,
        sh,
        &la.proj,
        [&la.rstd_b, &la.rstd_c],
        [&lw.b_norm, &lw.c_norm, &lw.b_bias, &lw.c_bias],
        [&la.phi, &la.dt, &la.lam],
        dqkdot,
        kb::RotGrads { dq, dk },
        dphi,
        dproj,
        [&mut *contrib, &mut *contrib_c],
        [&mut lg.b_bias, &mut lg.c_bias],
        partials,
    )?;
    probe.enter(gpu, E, "colsum (param grads)")?;
    kb::colsum(gpu, contrib, rows * ng, n, n, 0, partials, &mut lg.b_norm)?;
    kb::colsum(gpu, contrib_c, rows * ng, n, n, 0, partials, &mut lg.c_norm)?;

    probe.enter(gpu, S, "angle cumsum bwd")?;
    match sh.angles_from {
        kf::AngleSource::Cumsum => kb::angle_bwd(gpu, sh, dphi)?,
        // Fixed angles depend on no parameter: a zero gradient at phi makes
        // the scalar pass add nothing to d dt and write zero angle columns.
        kf::AngleSource::Fixed { .. } => gpu.zero(dphi)?,
    }
    probe.enter(gpu, E, "scalar bwd (dt, A, trap)")?;
    kb::scalar_bwd(
        gpu,
        sh,
        &la.proj,
        &lw.dt_bias,
        [&la.dt, &la.lam, &la.theta, &la.qk_raw],
        [dphi, dadt, dscale, dqkdot],
        dproj,
    )?;
    probe.enter(gpu, E, "colsum (param grads)")?;
    kb::colsum(
        gpu,
        dproj,
        rows,
        nh,
        e,
        sh.layout.dd_dt,
        partials,
        &mut lg.dt_bias,
    )?;

    // proj = u W_in^T
    probe.enter(gpu, G, "in_proj dW + dX")?;
    T::gemm_grad2(
        gpu,
        dproj,
        (&Gemm::new(e, dm, rows).trans_a(), &la.u, &mut lg.in_proj),
        (&Gemm::new(rows, dm, e), w_in, dnorm),
    )?;
    probe.enter(gpu, E, "rmsnorm bwd")?;
    kb::rmsnorm_bwd(
        gpu, rows, dm, &la.h_in, &lw.norm, &la.rstd, dnorm, dh, contrib, true,
    )?;
    probe.enter(gpu, E, "colsum (param grads)")?;
    kb::colsum(gpu, contrib, rows, dm, dm, 0, partials, &mut lg.norm)?;
    Ok(())
}
