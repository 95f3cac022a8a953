//! The chunked ("shifted scale") form of the scan, as the official Triton
//! kernel computes it (reference doc §2.3). The GPU kernels implement this
//! form and are checked against it, so every intermediate the kernel keeps is
//! returned, under the kernel's names, in [`ChunkedHead`].
//!
//! Folding step t+1's beta term into key t turns the 3-term recurrence into a
//! plain 2-term SSD with a per-key scale:
//!
//! ```text
//! gamma_t   = lam_t dt_t
//! scale_t   = gamma_t + dt_{t+1} (1 - lam_{t+1})        (second term 0 at t = T-1)
//! k~_t      = scale_t k_t
//! qk_dot_t  = gamma_t (q̂_t · k̂_t)                        (unrotated: rotation cancels)
//! ```
//!
//! Per chunk `[c0, c1)` of `chunk` steps, with `cs_t = sum_{r=c0..=t} adt_r`
//! (inclusive, restarting at each chunk) and `S_c` the state entering the chunk:
//!
//! ```text
//! y_t  = exp(cs_t) S_c q_t                                  inter-chunk term
//!      + sum_{c0 <= s < t} exp(cs_t - cs_s) (q_t · k~_s) v_s  strictly-lower intra-chunk term
//!      + (D + qk_dot_t) v_t                                 diagonal correction + skip
//! S_{c+1} = exp(cs_{c1-1}) S_c + sum_s exp(cs_{c1-1} - cs_s) v_s k~_s^T
//! ```
//!
//! The state passed between chunks is therefore `S_t + dt_{t+1}(1-lam_{t+1}) v_t k_t^T`
//! (next beta pre-added, without its alpha). A carried-in state
//! `(S, k_prev, v_prev)` seeds chunk 0 as `S + dt_0 (1 - lam_0) v_prev k_prev^T`.
//! At the end of the window the shift is zero, so the final state equals the
//! recurrent `S_{T-1}`.

use super::ops::{axpy, dot};
use super::scan::{HeadCarry, HeadInputs, ScanShapeError};
use crate::float::Float;

/// Every intermediate of the chunked forward pass for one (batch row, head).
#[derive(Debug, Clone)]
pub struct ChunkedHead<T> {
    /// Output `y_t` before the gate `[T, P]`.
    pub y: Vec<T>,
    /// `gamma_t = lam_t dt_t` `[T]` (kernel: `Gamma`).
    pub gamma: Vec<T>,
    /// Per-key scale `[T]` (kernel: `Scale`).
    pub scale: Vec<T>,
    /// Diagonal correction `gamma_t (q̂_t · k̂_t)` `[T]` (kernel: `QK_dot`, which
    /// stores the shifted part it subtracts; the sum is the same).
    pub qk_dot: Vec<T>,
    /// Scaled rotated keys `scale_t k_t` `[T, N]` (kernel: `K_scaled`).
    pub k_scaled: Vec<T>,
    /// Within-chunk inclusive cumulative sum of `adt` `[T]` (kernel: `DA_CS`).
    pub da_cs: Vec<T>,
    /// State entering each chunk `[nchunks, P, N]`, entry 0 the seeded carry
    /// (kernel: `SSM_States`, stored there in bf16).
    pub chunk_states: Vec<T>,
    /// State after the last step `[P, N]` (equals the recurrent `S_{T-1}`).
    pub final_state: Vec<T>,
}

/// Runs the chunked form over the whole window (lengths checked first).
pub fn chunked_forward<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    chunk: usize,
) -> Result<ChunkedHead<T>, ScanShapeError> {
    x.check_unsegmented(carry)?;
    Ok(chunked_forward_unchecked(x, carry, chunk))
}

/// [`chunked_forward`] for inputs the model built itself.
pub(crate) fn chunked_forward_unchecked<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    chunk: usize,
) -> ChunkedHead<T> {
    let (p, n, len) = (x.p, x.n, x.len());
    let chunk = chunk.max(1);
    let gamma: Vec<T> = (0..len).map(|t| x.lam[t] * x.dt[t]).collect();
    let shifted = |t: usize| -> T {
        if t + 1 < len {
            x.dt[t + 1] * (T::ONE - x.lam[t + 1])
        } else {
            T::ZERO
        }
    };
    let scale: Vec<T> = (0..len).map(|t| gamma[t] + shifted(t)).collect();
    let qk_dot: Vec<T> = (0..len).map(|t| gamma[t] * x.qk_raw[t]).collect();
    let mut k_scaled = x.k.to_vec();
    for (row, &sc) in k_scaled.chunks_mut(n).zip(&scale) {
        for v in row.iter_mut() {
            *v *= sc;
        }
    }

    // Seed: carried state plus the first step's beta term without its alpha
    // (the chunk's decay applies alpha_0).
    let mut s = carry.ssm.to_vec();
    if len > 0 {
        let w = x.dt[0] * (T::ONE - x.lam[0]);
        for (row, &vp) in s.chunks_mut(n).zip(carry.v) {
            axpy(row, w * vp, carry.k);
        }
    }

    let mut y = vec![T::ZERO; len * p];
    let mut da_cs = vec![T::ZERO; len];
    let mut chunk_states = Vec::with_capacity(len.div_ceil(chunk) * p * n);
    let mut c0 = 0;
    while c0 < len {
        let c1 = (c0 + chunk).min(len);
        chunk_states.extend_from_slice(&s);
        let mut acc = T::ZERO;
        for (cs, &a) in da_cs[c0..c1].iter_mut().zip(&x.adt[c0..c1]) {
            acc += a;
            *cs = acc;
        }
        for t in c0..c1 {
            let q = &x.q[t * n..(t + 1) * n];
            let yt = &mut y[t * p..(t + 1) * p];
            // inter-chunk: exp(cs_t) S_c q_t
            let decay = da_cs[t].exp();
            for (yv, row) in yt.iter_mut().zip(s.chunks(n)) {
                *yv = decay * dot(row, q);
            }
            // intra-chunk, strictly lower: exp(cs_t - cs_s) (q_t . k~_s) v_s
            for src in c0..t {
                let w = (da_cs[t] - da_cs[src]).exp() * dot(q, &k_scaled[src * n..(src + 1) * n]);
                axpy(yt, w, &x.v[src * p..(src + 1) * p]);
            }
            // diagonal: gamma_t (q̂_t . k̂_t) v_t plus the D skip
            axpy(yt, x.d + qk_dot[t], &x.v[t * p..(t + 1) * p]);
        }
        // state passing: S <- exp(cs_last) S + sum_s exp(cs_last - cs_s) v_s k~_s^T
        let last = da_cs[c1 - 1];
        let total = last.exp();
        for v in s.iter_mut() {
            *v *= total;
        }
        for src in c0..c1 {
            let w = (last - da_cs[src]).exp();
            let ks = &k_scaled[src * n..(src + 1) * n];
            for (row, &vp) in s.chunks_mut(n).zip(&x.v[src * p..(src + 1) * p]) {
                axpy(row, w * vp, ks);
            }
        }
        c0 = c1;
    }
    ChunkedHead {
        y,
        gamma,
        scale,
        qk_dot,
        k_scaled,
        da_cs,
        chunk_states,
        final_state: s,
    }
}
