//! Forward pass of one official `Mamba3` mixer (SISO) on the CPU.
//!
//! ```text
//! proj = u W_in^T = [z, x, B, C, dd_dt, dd_A, trap, angles]
//! dt   = softplus(dd_dt + dt_bias)     A = -max(f(dd_A), A_floor), f heavy-tail or softplus     lam = sigmoid(trap)
//! B̂    = RMSNorm_N(B_g) w_B + B_bias[h]    Ĉ = RMSNorm_N(C_g) w_C + C_bias[h]
//! phi_t = (phi_{t-1} + dt_t * pi tanh(angles_t)) mod 2 pi           (per head, per angle)
//!         (phi_{t-1} + omega) mod 2 pi, omega fixed (RopeAngles::Fixed, standard RoPE)
//! k = Rot(phi) B̂   q = Rot(phi) Ĉ                  (interleaved pairs, first 2S dims)
//! y = scan(q, k, v = x, A dt, dt, lam) + D x        (see `scan` / `chunked`)
//! o = y * silu(z)   or   RMSNorm_P(y) w_norm * silu(z)   (is_outproj_norm)
//! out = o W_out^T
//! ```
//!
//! Per-token tensors are token-major (`[B*T, ...]`); the per-head scan inputs
//! are head-major (`[B, H, T, ...]`) so each (row, head) scan reads contiguous
//! slices and runs on its own rayon task.

use rayon::prelude::*;

use super::chunked::{ChunkedHead, chunked_forward_unchecked};
use super::ops::{a_rate, dot, matmul_nt, rstd, sigmoid, silu, softplus};
use super::scan::{HeadCarry, HeadInputs, recurrent_forward_unchecked};
use super::state::LayerState;
use super::weights::LayerWeights;
use crate::float::Float;
use crate::mamba3::config::{Mamba3Config, RopeAngles};

/// Which form of the scan the forward pass runs. Both give the same outputs
/// (up to rounding), and so do their reverse passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScanMode {
    /// Step-by-step recurrence (official `mamba3_siso_step_ref`).
    Recurrent,
    /// Chunked SSD form with per-key scale (the form the kernels use).
    #[default]
    Chunked,
}

/// Everything one mixer's forward pass keeps for the backward pass (and for
/// tensor-by-tensor comparison with a GPU implementation).
#[derive(Debug, Clone)]
pub struct MixerTape<T> {
    /// Mixer input (the pre-normed residual stream) `[B*T, d_model]`.
    pub u: Vec<T>,
    /// `in_proj` output `[B*T, d_in_proj]`.
    pub proj: Vec<T>,
    /// Reciprocal RMS of each B group `[B*T, G]`.
    pub rstd_b: Vec<T>,
    /// Reciprocal RMS of each C group `[B*T, G]`.
    pub rstd_c: Vec<T>,
    /// `theta = pi tanh(angles)` `[B*T, S]`.
    pub theta: Vec<T>,
    /// `dt` `[B, H, T]`.
    pub dt: Vec<T>,
    /// `A dt` `[B, H, T]`.
    pub adt: Vec<T>,
    /// `lam = sigmoid(trap)` `[B, H, T]`.
    pub lam: Vec<T>,
    /// Wrapped cumulative angles `[B, H, T, S]`.
    pub phi: Vec<T>,
    /// Rotated queries `[B, H, T, N]`.
    pub q: Vec<T>,
    /// Rotated keys `[B, H, T, N]`.
    pub k: Vec<T>,
    /// Values `[B, H, T, P]`.
    pub v: Vec<T>,
    /// Unrotated `Ĉ·B̂` `[B, H, T]`.
    pub qk_raw: Vec<T>,
    /// Recurrent states entering each chunk, per (row, head) `[B, H, nchunks, P, N]`
    /// ([`ScanMode::Recurrent`] only; the chunked form keeps its own in `chunked`).
    pub checkpoints: Vec<T>,
    /// Chunked-form intermediates per (row, head), when run in [`ScanMode::Chunked`].
    pub chunked: Vec<ChunkedHead<T>>,
    /// Scan output before the gate `[B*T, d_inner]`.
    pub y: Vec<T>,
    /// Per-head reciprocal RMS of y `[B*T, H]` (only with `is_outproj_norm`).
    pub gate_rstd: Vec<T>,
    /// Gated output fed to `out_proj` `[B*T, d_inner]`.
    pub o: Vec<T>,
    /// Tokens that start a new sequence `[B*T]` (empty: none), see
    /// [`HeadInputs::resets`].
    pub resets: Vec<bool>,
    /// The state the window started from.
    pub carry: LayerState<T>,
    /// Batch rows B.
    pub batch: usize,
    /// Window length T.
    pub len: usize,
}

impl<T: Float> MixerTape<T> {
    /// Scan inputs of (row `b`, head `h`).
    pub fn head_inputs(
        &self,
        cfg: &Mamba3Config,
        d: &[T],
        b: usize,
        h: usize,
    ) -> HeadInputs<'_, T> {
        let (t, p, n) = (self.len, cfg.headdim, cfg.d_state);
        let bh = b * cfg.nheads() + h;
        HeadInputs {
            q: &self.q[bh * t * n..(bh + 1) * t * n],
            k: &self.k[bh * t * n..(bh + 1) * t * n],
            v: &self.v[bh * t * p..(bh + 1) * t * p],
            adt: &self.adt[bh * t..(bh + 1) * t],
            dt: &self.dt[bh * t..(bh + 1) * t],
            lam: &self.lam[bh * t..(bh + 1) * t],
            qk_raw: &self.qk_raw[bh * t..(bh + 1) * t],
            resets: self.resets.get(b * t..(b + 1) * t).unwrap_or(&[]),
            d: d[h],
            p,
            n,
        }
    }
}

/// One head's scan results: `y` `[T, P]`, final state, recurrent
/// checkpoints, and the chunked intermediates when run chunked.
type HeadScan<T> = (Vec<T>, Vec<T>, Vec<T>, Option<ChunkedHead<T>>);

/// Carried state of (row, head) `bh` as scan input.
pub(crate) fn head_carry<'a, T>(
    cfg: &Mamba3Config,
    s: &'a LayerState<T>,
    bh: usize,
) -> HeadCarry<'a, T> {
    let (p, n) = (cfg.headdim, cfg.d_state);
    HeadCarry {
        ssm: &s.ssm[bh * p * n..(bh + 1) * p * n],
        k: &s.k[bh * n..(bh + 1) * n],
        v: &s.v[bh * p..(bh + 1) * p],
    }
}

/// Rotates interleaved pairs `(2i, 2i+1)`, `i < angles.len()`, by `+angle`;
/// the remaining dims pass through.
pub(crate) fn rotate<T: Float>(src: &[T], angles: &[T], dst: &mut [T]) {
    dst.copy_from_slice(src);
    for (i, &a) in angles.iter().enumerate() {
        let (c, s) = (a.cos(), a.sin());
        let (x0, x1) = (src[2 * i], src[2 * i + 1]);
        dst[2 * i] = x0 * c - x1 * s;
        dst[2 * i + 1] = x0 * s + x1 * c;
    }
}

/// Runs one mixer over a `[B, T]` window; returns `out` `[B*T, d_model]`, the
/// tape and the state after the window. `resets` (`[B*T]` or empty) marks
/// the tokens that start a new sequence; the caller runs them only in
/// [`ScanMode::Recurrent`].
pub(crate) fn mixer_forward<T: Float>(
    cfg: &Mamba3Config,
    w: &LayerWeights<T>,
    u: Vec<T>,
    (batch, len): (usize, usize),
    (carry, resets): (&LayerState<T>, &[bool]),
    mode: ScanMode,
) -> (Vec<T>, MixerTape<T>, LayerState<T>) {
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
    let rows = batch * len;
    let eps = T::from_f64(cfg.norm_eps);
    let a_floor = T::from_f64(cfg.a_floor);
    let pi = T::from_f64(std::f64::consts::PI);
    let two_pi = T::from_f64(std::f64::consts::TAU);
    // Fixed RoPE advances every pair by its own frequency, whatever the token.
    let fixed: Option<Vec<T>> = (cfg.rope_angles == RopeAngles::Fixed).then(|| {
        cfg.rope_frequencies()
            .into_iter()
            .map(T::from_f64)
            .collect()
    });

    let proj = matmul_nt(&u, &w.in_proj, rows, dm, e);
    let bhtn = batch * nh * len;
    let mut tape = MixerTape {
        u,
        proj,
        rstd_b: vec![T::ZERO; rows * ng],
        rstd_c: vec![T::ZERO; rows * ng],
        theta: vec![T::ZERO; rows * ns],
        dt: vec![T::ZERO; bhtn],
        adt: vec![T::ZERO; bhtn],
        lam: vec![T::ZERO; bhtn],
        phi: vec![T::ZERO; bhtn * ns],
        q: vec![T::ZERO; bhtn * n],
        k: vec![T::ZERO; bhtn * n],
        v: vec![T::ZERO; bhtn * p],
        qk_raw: vec![T::ZERO; bhtn],
        checkpoints: Vec::new(),
        chunked: Vec::new(),
        y: vec![T::ZERO; rows * di],
        gate_rstd: Vec::new(),
        o: vec![T::ZERO; rows * di],
        resets: resets.to_vec(),
        carry: carry.clone(),
        batch,
        len,
    };

    // Per-token preprocessing. The angle accumulator makes it sequential in t.
    let mut phi_run = carry.angle.clone();
    let mut bn = vec![T::ZERO; ng * n];
    let mut cn = vec![T::ZERO; ng * n];
    let (mut kb, mut qb) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    for b in 0..batch {
        for t in 0..len {
            let i = b * len + t;
            let row = &tape.proj[i * e..(i + 1) * e];
            for g in 0..ng {
                let braw = &row[l.b + g * n..l.b + (g + 1) * n];
                let craw = &row[l.c + g * n..l.c + (g + 1) * n];
                let (rb, rc) = (rstd(braw, eps), rstd(craw, eps));
                tape.rstd_b[i * ng + g] = rb;
                tape.rstd_c[i * ng + g] = rc;
                for j in 0..n {
                    bn[g * n + j] = braw[j] * rb * w.b_norm[j];
                    cn[g * n + j] = craw[j] * rc * w.c_norm[j];
                }
            }
            let theta = &mut tape.theta[i * ns..(i + 1) * ns];
            for (th, &raw) in theta.iter_mut().zip(&row[l.angles..l.angles + ns]) {
                *th = pi * raw.tanh();
            }
            for h in 0..nh {
                let hi = (b * nh + h) * len + t;
                let dt = softplus(row[l.dd_dt + h] + w.dt_bias[h]);
                let a = -a_rate(cfg.a_activation, row[l.dd_a + h]).0.max(a_floor);
                tape.dt[hi] = dt;
                tape.adt[hi] = a * dt;
                tape.lam[hi] = sigmoid(row[l.trap + h]);
                let run = &mut phi_run[(b * nh + h) * ns..(b * nh + h + 1) * ns];
                for (s, (ph, &th)) in run.iter_mut().zip(theta.iter()).enumerate() {
                    let step = fixed.as_ref().map_or(dt * th, |w| w[s]);
                    let v = *ph + step;
                    *ph = v - two_pi * (v / two_pi).floor();
                }
                tape.phi[hi * ns..(hi + 1) * ns].copy_from_slice(run);
                let g = h / hpg;
                for j in 0..n {
                    kb[j] = bn[g * n + j] + w.b_bias[h * n + j];
                    qb[j] = cn[g * n + j] + w.c_bias[h * n + j];
                }
                tape.qk_raw[hi] = dot(&qb, &kb);
                rotate(&kb, run, &mut tape.k[hi * n..(hi + 1) * n]);
                rotate(&qb, run, &mut tape.q[hi * n..(hi + 1) * n]);
                tape.v[hi * p..(hi + 1) * p].copy_from_slice(&row[l.x + h * p..l.x + (h + 1) * p]);
            }
        }
    }

    // One independent scan per (row, head).
    let chunk = cfg.chunk_size;
    let scans: Vec<HeadScan<T>> = (0..batch * nh)
        .into_par_iter()
        .map(|bh| {
            let x = tape.head_inputs(cfg, &w.d, bh / nh, bh % nh);
            let c = head_carry(cfg, carry, bh);
            match mode {
                ScanMode::Recurrent => {
                    let r = recurrent_forward_unchecked(&x, &c, chunk);
                    (r.y, r.final_state, r.checkpoints, None)
                }
                ScanMode::Chunked => {
                    let ch = chunked_forward_unchecked(&x, &c, chunk);
                    (ch.y.clone(), ch.final_state.clone(), Vec::new(), Some(ch))
                }
            }
        })
        .collect();

    let mut next = LayerState::zeros(cfg, batch);
    next.angle = phi_run;
    for (bh, (yh, fin, ck, ch)) in scans.into_iter().enumerate() {
        let (b, h) = (bh / nh, bh % nh);
        for t in 0..len {
            let i = b * len + t;
            tape.y[i * di + h * p..i * di + (h + 1) * p].copy_from_slice(&yh[t * p..(t + 1) * p]);
        }
        next.ssm[bh * p * n..(bh + 1) * p * n].copy_from_slice(&fin);
        if len > 0 {
            let last = bh * len + len - 1;
            next.k[bh * n..(bh + 1) * n].copy_from_slice(&tape.k[last * n..(last + 1) * n]);
            next.v[bh * p..(bh + 1) * p].copy_from_slice(&tape.v[last * p..(last + 1) * p]);
        }
        tape.checkpoints.extend_from_slice(&ck);
        tape.chunked.extend(ch);
    }

    // Gate (optionally with the grouped RMSNorm before it).
    if w.out_norm.is_some() {
        tape.gate_rstd = vec![T::ZERO; rows * nh];
    }
    for i in 0..rows {
        let z = &tape.proj[i * e + l.z..i * e + l.z + di];
        for h in 0..nh {
            let span = i * di + h * p..i * di + (h + 1) * p;
            let yv = &tape.y[span.clone()];
            let o = &mut tape.o[span];
            let zh = &z[h * p..(h + 1) * p];
            if let Some(wn) = &w.out_norm {
                let r = rstd(yv, eps);
                tape.gate_rstd[i * nh + h] = r;
                for j in 0..p {
                    o[j] = yv[j] * r * wn[h * p + j] * silu(zh[j]);
                }
            } else {
                for j in 0..p {
                    o[j] = yv[j] * silu(zh[j]);
                }
            }
        }
    }
    let out = matmul_nt(&tape.o, &w.out_proj, rows, di, dm);
    (out, tape, next)
}
