//! The backward op: gradients of the mean loss with respect to every
//! parameter, from the activations the forward op kept.
//!
//! Every parameter gradient is written (never accumulated onto what was
//! there), except the tied embedding, whose LM-head share is written first
//! and the token scatter added after; so the op does not depend on
//! `zero_grads` having run.

use crate::device::{DeviceBuffer, Gemm, Gpu};
use crate::kernels::mamba3::Mamba3Shape;
use crate::kernels::mamba3_bwd::{self as kb, ScanGrads};

use super::acts::{BackwardWork, LayerActs};
use super::forward::check_step;
use super::weights::{Grads, LayerWeights};
use super::{Acts, Mamba3GpuError, Weights};

/// Backward pass for the window `forward` last ran on.
pub fn backward(
    gpu: &Gpu,
    w: &Weights,
    tokens: &DeviceBuffer<i32>,
    acts: &Acts,
    grads: &mut Grads,
) -> Result<(), Mamba3GpuError> {
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
    let Grads { params: g, work } = grads;

    kb::ce_bwd(gpu, &sh, &acts.logits, &acts.lse, tokens, &mut work.dlogits)?;
    if g.lm_head.is_none() {
        // Tied: the head's share is written here, the scatter adds to it.
        gpu.gemm_f32(
            &Gemm::new(vocab, dm, rows).trans_a(),
            &work.dlogits,
            &acts.normed,
            &mut g.embedding,
        )?;
    } else {
        gpu.zero(&mut g.embedding)?;
        if let Some(gh) = g.lm_head.as_mut() {
            gpu.gemm_f32(
                &Gemm::new(vocab, dm, rows).trans_a(),
                &work.dlogits,
                &acts.normed,
                gh,
            )?;
        }
    }
    gpu.gemm_f32(
        &Gemm::new(rows, dm, vocab),
        &work.dlogits,
        w.head(),
        &mut work.dnorm,
    )?;
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

    for ((lw, lg), la) in w
        .layers
        .iter()
        .zip(g.layers.iter_mut())
        .zip(&acts.layers)
        .rev()
    {
        mixer_backward(gpu, &sh, lw, la, lg, work)?;
    }
    kb::embed_bwd(gpu, &sh, tokens, &work.dh, &mut g.embedding)?;
    Ok(())
}

/// One block in reverse: adds the block's input gradient into `work.dh` and
/// writes its parameter gradients into `lg`.
fn mixer_backward(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    lw: &LayerWeights,
    la: &LayerActs,
    lg: &mut LayerWeights,
    work: &mut BackwardWork,
) -> Result<(), Mamba3GpuError> {
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

    // out = o W_out^T
    gpu.gemm_f32(
        &Gemm::new(dm, di, rows).trans_a(),
        dh,
        &la.o,
        &mut lg.out_proj,
    )?;
    gpu.gemm_f32(&Gemm::new(rows, di, dm), dh, &lw.out_proj, d_o)?;
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
        kb::colsum(gpu, contrib, rows, di, di, 0, partials, gn)?;
    }

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
    kb::scan_bwd(
        gpu, sh, &la.q, &la.k, &la.proj, scalars, &lw.d, &la.states, dy, out,
    )?;
    kb::colsum(gpu, dskip_part, sh.batch, nh, nh, 0, partials, &mut lg.d)?;

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
    )?;
    kb::colsum(gpu, dk, rows, nh * n, nh * n, 0, partials, &mut lg.b_bias)?;
    kb::colsum(gpu, dq, rows, nh * n, nh * n, 0, partials, &mut lg.c_bias)?;

    kb::angle_bwd(gpu, sh, dphi)?;
    kb::scalar_bwd(
        gpu,
        sh,
        &la.proj,
        &lw.dt_bias,
        [&la.dt, &la.lam, &la.theta, &la.qk_raw],
        [dphi, dadt, dscale, dqkdot],
        dproj,
    )?;
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
    )?;
    kb::colsum(gpu, contrib, rows * ng, n, n, 0, partials, &mut lg.b_norm)?;
    kb::colsum(gpu, contrib_c, rows * ng, n, n, 0, partials, &mut lg.c_norm)?;

    // proj = u W_in^T
    gpu.gemm_f32(
        &Gemm::new(e, dm, rows).trans_a(),
        dproj,
        &la.u,
        &mut lg.in_proj,
    )?;
    gpu.gemm_f32(&Gemm::new(rows, dm, e), dproj, &lw.in_proj, dnorm)?;
    kb::rmsnorm_bwd(
        gpu, rows, dm, &la.h_in, &lw.norm, &la.rstd, dnorm, dh, contrib, true,
    )?;
    kb::colsum(gpu, contrib, rows, dm, dm, 0, partials, &mut lg.norm)?;
    Ok(())
}
