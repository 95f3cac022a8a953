//! Reverse pass of the chunked form (see [`super::chunked`]) for one
//! (batch row, head), structured as the official backward kernels are:
//! first the gradients of the 2-term SSD's own inputs (rotated `q`, scaled
//! keys `k~`, `v`, `adt`, the diagonal `qk_dot`, `D`), then the fold back
//! through `k~ = scale k`, `qk_dot = gamma (q̂ · k̂)` and
//! `scale_t = gamma_t + dt_{t+1} (1 - lam_{t+1})` to `dt` and `lam`.
//!
//! Walking chunks last to first with `dS` the gradient of the state entering
//! the next chunk (zero after the last one), per chunk `[c0, c1)`, `L = c1 - 1`:
//!
//! ```text
//! dq_t   = e^{cs_t} S_c^T dy_t + sum_{s<t} e^{cs_t-cs_s} (dy_t . v_s) k~_s
//! dk~_s  = sum_{t>s} e^{cs_t-cs_s} (dy_t . v_s) q_t + e^{cs_L-cs_s} dS^T v_s
//! dv_s   = sum_{t>s} e^{cs_t-cs_s} (q_t . k~_s) dy_t + (D + qk_dot_s) dy_s + e^{cs_L-cs_s} dS k~_s
//! dS_c   = e^{cs_L} dS + sum_t e^{cs_t} dy_t q_t^T
//! d cs   : every exponent above, then d adt_r = sum_{t >= r, same chunk} d cs_t
//! ```
//!
//! These per-head results equal [`super::scan::recurrent_backward`]'s to
//! rounding (tested); the model uses this pass after a chunked forward, and a
//! chunked GPU backward can be checked against it stage by stage.

use super::chunked::ChunkedHead;
use super::ops::{axpy, dot};
use super::scan::{HeadCarry, HeadGrads, HeadInputs, ScanShapeError};
use crate::float::Float;

/// Gradients of one head's chunked scan: the SSD-level intermediates and the
/// totals with respect to the per-step inputs.
#[derive(Debug, Clone)]
pub struct ChunkedHeadGrads<T> {
    /// `dL/dk~_t`, the scaled keys `[T, N]` (kernel: `dK` from `compute_dqkv`).
    pub dk_scaled: Vec<T>,
    /// `dL/d qk_dot_t` `[T]`.
    pub dqk_dot: Vec<T>,
    /// `dL/d scale_t` `[T]`.
    pub dscale: Vec<T>,
    /// `dL/d gamma_t` (through the scale and the diagonal) `[T]`.
    pub dgamma: Vec<T>,
    /// Gradient of the seeded state entering chunk 0 `[P, N]`.
    pub dstate_in: Vec<T>,
    /// Totals, comparable one to one with the recurrent backward pass.
    pub totals: HeadGrads<T>,
}

/// Reverse pass of the chunked form given `dL/dy` `[T, P]` and the forward
/// intermediates (lengths checked first).
pub fn chunked_backward<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    fwd: &ChunkedHead<T>,
    dy: &[T],
    chunk: usize,
) -> Result<ChunkedHeadGrads<T>, ScanShapeError> {
    x.check_unsegmented(carry)?;
    let (len, p, n) = (x.len(), x.p, x.n);
    let ck = len.div_ceil(chunk.max(1)) * p * n;
    for (field, found, expected) in [
        ("dy", dy.len(), len * p),
        ("chunk_states", fwd.chunk_states.len(), ck),
        ("k_scaled", fwd.k_scaled.len(), len * n),
        ("da_cs", fwd.da_cs.len(), len),
    ] {
        if found != expected {
            return Err(ScanShapeError {
                field,
                expected,
                found,
            });
        }
    }
    Ok(chunked_backward_unchecked(x, carry, fwd, dy, chunk))
}

/// [`chunked_backward`] for inputs the model built itself.
pub(crate) fn chunked_backward_unchecked<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    fwd: &ChunkedHead<T>,
    dy: &[T],
    chunk: usize,
) -> ChunkedHeadGrads<T> {
    let chunk = chunk.max(1);
    let (len, p, n, pn) = (x.len(), x.p, x.n, x.p * x.n);
    let (q, v, ks, cs) = (x.q, x.v, &fwd.k_scaled, &fwd.da_cs);
    let mut dq = vec![T::ZERO; len * n];
    let mut dks = vec![T::ZERO; len * n];
    let mut dv = vec![T::ZERO; len * p];
    let mut dcs = vec![T::ZERO; len];
    let mut dqk_dot = vec![T::ZERO; len];
    let mut dd = T::ZERO;
    let mut ds = vec![T::ZERO; pn];
    let nchunks = len.div_ceil(chunk);
    for c in (0..nchunks).rev() {
        let (c0, c1) = (c * chunk, ((c + 1) * chunk).min(len));
        let last = c1 - 1;
        let s_c = &fwd.chunk_states[c * pn..(c + 1) * pn];
        // State passing: S_next = e^{cs_L} S_c + sum_s e^{cs_L - cs_s} v_s k~_s^T.
        let total = cs[last].exp();
        dcs[last] += total * dot(&ds, s_c);
        for src in c0..c1 {
            let w = (cs[last] - cs[src]).exp();
            let (vs, kss) = (&v[src * p..(src + 1) * p], &ks[src * n..(src + 1) * n]);
            let mut u = T::ZERO;
            for (row, &vp) in ds.chunks(n).zip(vs) {
                let rk = dot(row, kss);
                u += vp * rk;
            }
            u *= w;
            dcs[last] += u;
            dcs[src] -= u;
            for (o, row) in dv[src * p..(src + 1) * p].iter_mut().zip(ds.chunks(n)) {
                *o += w * dot(row, kss);
            }
            let dk = &mut dks[src * n..(src + 1) * n];
            for (row, &vp) in ds.chunks(n).zip(vs) {
                axpy(dk, w * vp, row);
            }
        }
        // dS_c = e^{cs_L} dS_next + sum_t e^{cs_t} dy_t q_t^T (computed after its uses above).
        let mut ds_c: Vec<T> = ds.iter().map(|&g| g * total).collect();
        for t in c0..c1 {
            let dyt = &dy[t * p..(t + 1) * p];
            let qt = &q[t * n..(t + 1) * n];
            let vt = &v[t * p..(t + 1) * p];
            let e = cs[t].exp();
            // inter-chunk read-out: e^{cs_t} S_c q_t
            let mut sq = T::ZERO;
            let dqt = &mut dq[t * n..(t + 1) * n];
            for ((row, &g), dsrow) in s_c.chunks(n).zip(dyt).zip(ds_c.chunks_mut(n)) {
                sq += g * dot(row, qt);
                axpy(dqt, e * g, row);
                axpy(dsrow, e * g, qt);
            }
            dcs[t] += e * sq;
            // strictly-lower intra-chunk terms
            for src in c0..t {
                let w = (cs[t] - cs[src]).exp();
                let kss = &ks[src * n..(src + 1) * n];
                let vs = &v[src * p..(src + 1) * p];
                let qk = dot(qt, kss);
                let gv = dot(dyt, vs);
                let wt = w * qk * gv;
                dcs[t] += wt;
                dcs[src] -= wt;
                axpy(&mut dq[t * n..(t + 1) * n], w * gv, kss);
                axpy(&mut dks[src * n..(src + 1) * n], w * gv, qt);
                axpy(&mut dv[src * p..(src + 1) * p], w * qk, dyt);
            }
            // diagonal correction and skip
            let gv = dot(dyt, vt);
            dqk_dot[t] = gv;
            dd += gv;
            axpy(&mut dv[t * p..(t + 1) * p], x.d + fwd.qk_dot[t], dyt);
        }
        ds = ds_c;
    }

    // cs_t = sum_{r=c0..=t} adt_r, restarting per chunk.
    let mut dadt = vec![T::ZERO; len];
    for c in 0..nchunks {
        let (c0, c1) = (c * chunk, ((c + 1) * chunk).min(len));
        let mut acc = T::ZERO;
        for t in (c0..c1).rev() {
            acc += dcs[t];
            dadt[t] = acc;
        }
    }

    // Fold back: k~ = scale k, qk_dot = gamma qk_raw, scale = gamma + shift.
    let mut dk = vec![T::ZERO; len * n];
    let mut dscale = vec![T::ZERO; len];
    let mut dgamma = vec![T::ZERO; len];
    let mut ddt = vec![T::ZERO; len];
    let mut dlam = vec![T::ZERO; len];
    for t in 0..len {
        let (kt, dkst) = (&x.k[t * n..(t + 1) * n], &dks[t * n..(t + 1) * n]);
        dscale[t] = dot(dkst, kt);
        axpy(&mut dk[t * n..(t + 1) * n], fwd.scale[t], dkst);
        // qk_raw = q̂·k̂ = q·k: its gradient lands on the rotated q and k.
        let g = dqk_dot[t] * fwd.gamma[t];
        axpy(&mut dk[t * n..(t + 1) * n], g, &q[t * n..(t + 1) * n]);
        axpy(&mut dq[t * n..(t + 1) * n], g, kt);
        dgamma[t] = dqk_dot[t] * x.qk_raw[t] + dscale[t];
    }
    for t in 0..len {
        let (dt, lam) = (x.dt[t], x.lam[t]);
        // gamma_t = lam_t dt_t
        ddt[t] += dgamma[t] * lam;
        dlam[t] += dgamma[t] * dt;
        // scale_{t-1} holds dt_t (1 - lam_t)
        if t > 0 {
            ddt[t] += dscale[t - 1] * (T::ONE - lam);
            dlam[t] -= dscale[t - 1] * dt;
        }
    }
    // After the walk, `ds` is the gradient of the seeded state entering chunk 0:
    // S_init + dt_0 (1 - lam_0) v_prev k_prev^T.
    let dstate_in = ds;
    if len > 0 {
        let mut dw = T::ZERO;
        for (row, &vp) in dstate_in.chunks(n).zip(carry.v) {
            dw += vp * dot(row, carry.k);
        }
        ddt[0] += dw * (T::ONE - x.lam[0]);
        dlam[0] -= dw * x.dt[0];
    }
    ChunkedHeadGrads {
        dk_scaled: dks,
        dqk_dot,
        dscale,
        dgamma,
        dstate_in,
        totals: HeadGrads {
            dq,
            dk,
            dv,
            dadt,
            ddt,
            dlam,
            dd,
        },
    }
}
