//! Reverse pass of one `Mamba3` mixer: from `dL/d out` to `dL/d u` and the
//! gradients of every mixer parameter.
//!
//! The order mirrors the official backward pipeline: out_proj, gate (`dz`,
//! `dy`), the scan (`dq`, `dk`, `dv`, `d(A dt)`, `d dt`, `d lam`, `dD`), the
//! rotation (un-rotate `dq`/`dk`, angle gradient), the angle cumsum (a reverse
//! cumsum giving `d dt` and `d theta`), biases and B/C RMSNorm, the scalar
//! activations, and finally in_proj.

use rayon::prelude::*;

use super::chunked_backward::chunked_backward_unchecked;
use super::mixer::{MixerTape, head_carry};
use super::ops::{
    a_rate, axpy, matmul_nn, matmul_tn_acc, rmsnorm_row_backward, silu, silu_grad, softplus_grad,
};
use super::scan::{HeadGrads, recurrent_backward_unchecked};
use super::weights::LayerWeights;
use crate::float::Float;
use crate::mamba3::config::{Mamba3Config, RopeAngles};

/// Adds the mixer's parameter gradients into `gw` and returns `dL/du`.
pub(crate) fn mixer_backward<T: Float>(
    cfg: &Mamba3Config,
    w: &LayerWeights<T>,
    tape: &MixerTape<T>,
    dout: &[T],
    gw: &mut LayerWeights<T>,
) -> Vec<T> {
    let l = cfg.in_proj_layout();
    let (dm, e, di) = (cfg.d_model, l.width, cfg.d_inner());
    let (nh, p, n, ng, ns) = (
        cfg.nheads(),
        cfg.headdim,
        cfg.d_state,
        cfg.ngroups,
        cfg.num_rope_angles(),
    );
    let hpg = cfg.heads_per_group();
    let (batch, len) = (tape.batch, tape.len);
    let rows = batch * len;
    let a_floor = T::from_f64(cfg.a_floor);
    let pi = T::from_f64(std::f64::consts::PI);
    // Fixed angles depend on no parameter: the angle gradient stops at phi.
    let data_angles = cfg.rope_angles == RopeAngles::Data;

    // out = o W_out^T
    matmul_tn_acc(&mut gw.out_proj, dout, &tape.o, rows, dm, di);
    let d_o = matmul_nn(dout, &w.out_proj, rows, dm, di);

    // Gate: o = y' * silu(z), y' = y or RMSNorm_P(y) w_norm.
    let mut dproj = vec![T::ZERO; rows * e];
    let mut dy_heads = vec![T::ZERO; batch * nh * len * p];
    let mut dyn_ = vec![T::ZERO; p];
    let mut dyv = vec![T::ZERO; p];
    for i in 0..rows {
        let (b, t) = (i / len, i % len);
        for h in 0..nh {
            let base = i * di + h * p;
            let yv = &tape.y[base..base + p];
            let zh = &tape.proj[i * e + l.z + h * p..i * e + l.z + (h + 1) * p];
            let go = &d_o[base..base + p];
            let dz = &mut dproj[i * e + l.z + h * p..i * e + l.z + (h + 1) * p];
            if let (Some(wn), Some(gn)) = (&w.out_norm, &mut gw.out_norm) {
                let r = tape.gate_rstd[i * nh + h];
                let wn = &wn[h * p..(h + 1) * p];
                for j in 0..p {
                    let yn = yv[j] * r * wn[j];
                    dz[j] = go[j] * yn * silu_grad(zh[j]);
                    dyn_[j] = go[j] * silu(zh[j]);
                }
                rmsnorm_row_backward(yv, wn, r, &dyn_, &mut dyv, &mut gn[h * p..(h + 1) * p]);
            } else {
                for j in 0..p {
                    dz[j] = go[j] * yv[j] * silu_grad(zh[j]);
                    dyv[j] = go[j] * silu(zh[j]);
                }
            }
            let hb = ((b * nh + h) * len + t) * p;
            dy_heads[hb..hb + p].copy_from_slice(&dyv);
        }
    }

    // Scan, one (row, head) per task.
    let chunk = cfg.chunk_size.max(1);
    let nck = len.div_ceil(chunk);
    let grads: Vec<HeadGrads<T>> = (0..batch * nh)
        .into_par_iter()
        .map(|bh| {
            let x = tape.head_inputs(cfg, &w.d, bh / nh, bh % nh);
            let c = head_carry(cfg, &tape.carry, bh);
            let dy = &dy_heads[bh * len * p..(bh + 1) * len * p];
            // Reverse the form the forward pass ran; both give the same gradients.
            match tape.chunked.get(bh) {
                Some(ch) => chunked_backward_unchecked(&x, &c, ch, dy, chunk).totals,
                None => {
                    let ck_len = nck * p * n;
                    let ck = &tape.checkpoints[bh * ck_len..(bh + 1) * ck_len];
                    recurrent_backward_unchecked(&x, &c, ck, dy, chunk)
                }
            }
        })
        .collect();

    // Per token and head: rotation, biases, scalar activations.
    let mut dtheta = vec![T::ZERO; rows * ns];
    let mut dbn = vec![T::ZERO; ng * n];
    let mut dcn = vec![T::ZERO; ng * n];
    let mut dphi = vec![T::ZERO; ns];
    for (bh, g) in grads.iter().enumerate() {
        let h = bh % nh;
        gw.d[h] += g.dd;
        // v is the head's slice of x.
        for t in 0..len {
            let i = (bh / nh) * len + t;
            dproj[i * e + l.x + h * p..i * e + l.x + (h + 1) * p]
                .copy_from_slice(&g.dv[t * p..(t + 1) * p]);
        }
    }
    for b in 0..batch {
        // Walk time backwards so the angle cumsum's reverse sum is a running total.
        let mut runs = vec![T::ZERO; nh * ns];
        for t in (0..len).rev() {
            let i = b * len + t;
            dbn.iter_mut()
                .chain(dcn.iter_mut())
                .for_each(|v| *v = T::ZERO);
            for h in 0..nh {
                let bh = b * nh + h;
                let hi = bh * len + t;
                let gr = &grads[bh];
                let phi = &tape.phi[hi * ns..(hi + 1) * ns];
                let gq = &gr.dq[t * n..(t + 1) * n];
                let gk = &gr.dk[t * n..(t + 1) * n];
                let q = &tape.q[hi * n..(hi + 1) * n];
                let k = &tape.k[hi * n..(hi + 1) * n];
                let g = h / hpg;
                for j in 0..n {
                    let (ukb, uqb) = unrotated_grad(j, gk, gq, phi);
                    dbn[g * n + j] += ukb;
                    dcn[g * n + j] += uqb;
                    gw.b_bias[h * n + j] += ukb;
                    gw.c_bias[h * n + j] += uqb;
                }
                // d phi for pair s: d(x0 c - x1 s)/dphi = -rot1, d(x0 s + x1 c)/dphi = rot0.
                for (s, dp) in dphi.iter_mut().enumerate() {
                    let (a, b2) = (2 * s, 2 * s + 1);
                    *dp = -gk[a] * k[b2] + gk[b2] * k[a] - gq[a] * q[b2] + gq[b2] * q[a];
                }
                // phi_t = phi_{t-1} + dt_t theta_t: reverse cumsum over t.
                let rs = &mut runs[h * ns..(h + 1) * ns];
                axpy(rs, T::ONE, &dphi);
                let theta = &tape.theta[i * ns..(i + 1) * ns];
                let dt = tape.dt[hi];
                let mut ddt = gr.ddt[t];
                if data_angles {
                    for s in 0..ns {
                        ddt += rs[s] * theta[s];
                        dtheta[i * ns + s] += rs[s] * dt;
                    }
                }
                // adt = A dt,  A = -max(f(dd_A), A_floor)
                let row = &tape.proj[i * e..(i + 1) * e];
                let (ht, ht_grad) = a_rate(cfg.a_activation, row[l.dd_a + h]);
                let a = -ht.max(a_floor);
                let dadt = gr.dadt[t];
                ddt += dadt * a;
                let da = dadt * dt;
                // torch's clamp passes the gradient where the bound is not exceeded
                if ht >= a_floor {
                    dproj[i * e + l.dd_a + h] = -da * ht_grad;
                }
                let dpre = ddt * softplus_grad(row[l.dd_dt + h] + w.dt_bias[h]);
                dproj[i * e + l.dd_dt + h] = dpre;
                gw.dt_bias[h] += dpre;
                let lam = tape.lam[hi];
                dproj[i * e + l.trap + h] = gr.dlam[t] * lam * (T::ONE - lam);
            }
            // theta = pi tanh(raw)
            let row = &tape.proj[i * e..(i + 1) * e];
            for s in 0..ns {
                let th = row[l.angles + s].tanh();
                dproj[i * e + l.angles + s] = dtheta[i * ns + s] * pi * (T::ONE - th * th);
            }
            // B/C RMSNorm (weights shared by groups).
            for g in 0..ng {
                let (bo, co) = (i * e + l.b + g * n, i * e + l.c + g * n);
                let braw = &tape.proj[bo..bo + n];
                let craw = &tape.proj[co..co + n];
                rmsnorm_row_backward(
                    braw,
                    &w.b_norm,
                    tape.rstd_b[i * ng + g],
                    &dbn[g * n..(g + 1) * n],
                    &mut dproj[bo..bo + n],
                    &mut gw.b_norm,
                );
                rmsnorm_row_backward(
                    craw,
                    &w.c_norm,
                    tape.rstd_c[i * ng + g],
                    &dcn[g * n..(g + 1) * n],
                    &mut dproj[co..co + n],
                    &mut gw.c_norm,
                );
            }
        }
    }

    // proj = u W_in^T
    matmul_tn_acc(&mut gw.in_proj, &dproj, &tape.u, rows, e, dm);
    matmul_nn(&dproj, &w.in_proj, rows, e, dm)
}

/// Component `j` of `R(phi)^T dk` and `R(phi)^T dq`: the gradients with
/// respect to the unrotated (biased) key and query.
fn unrotated_grad<T: Float>(j: usize, gk: &[T], gq: &[T], phi: &[T]) -> (T, T) {
    let s = j / 2;
    if s >= phi.len() {
        return (gk[j], gq[j]);
    }
    let (c, sn) = (phi[s].cos(), phi[s].sin());
    let (a, b) = (2 * s, 2 * s + 1);
    if j == a {
        (c * gk[a] + sn * gk[b], c * gq[a] + sn * gq[b])
    } else {
        (-sn * gk[a] + c * gk[b], -sn * gq[a] + c * gq[b])
    }
}
