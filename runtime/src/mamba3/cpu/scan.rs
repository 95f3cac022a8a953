//! The exponential-trapezoidal recurrence of one (batch row, head), step by
//! step, and its exact reverse-mode gradient.
//!
//! This is the official `mamba3_siso_step_ref` in f64:
//!
//! ```text
//! alpha_t = exp(adt_t)   beta_t = (1 - lam_t) dt_t alpha_t   gamma_t = lam_t dt_t
//! S_t = alpha_t S_{t-1} + beta_t v_{t-1} k_{t-1}^T + gamma_t v_t k_t^T     (S: P x N)
//! y_t = S_t q_t + D v_t
//! ```
//!
//! with `(S_{-1}, k_{-1}, v_{-1})` the carried state (zeros for a fresh
//! window). A token flagged in [`HeadInputs::resets`] starts a new sequence
//! inside the window (several instances packed in one row): there
//! `alpha_t = beta_t = 0`, so the state and the previous token's term are
//! dropped as they are for a fresh window, and no gradient flows back
//! across it. The backward pass recomputes states chunk by chunk from the
//! checkpoints the forward pass keeps at chunk starts, so memory stays at
//! `O(T/C * P * N)` per head instead of `O(T * P * N)`.

use thiserror::Error;

use super::ops::{axpy, dot};
use crate::float::Float;

/// Per-head scan inputs whose lengths do not agree with each other.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("scan input `{field}` has {found} values, expected {expected}")]
pub struct ScanShapeError {
    /// The offending input.
    pub field: &'static str,
    /// Length implied by T, P and N.
    pub expected: usize,
    /// Length given.
    pub found: usize,
}

/// Per-step inputs of one (batch row, head) sequence, all already projected,
/// normalised, biased and rotated. Slices are row-major with time outermost.
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a, T> {
    /// Rotated queries `q_t` `[T, N]`.
    pub q: &'a [T],
    /// Rotated keys `k_t` `[T, N]`.
    pub k: &'a [T],
    /// Values `v_t` (the head's slice of x) `[T, P]`.
    pub v: &'a [T],
    /// `A_t * dt_t` `[T]`.
    pub adt: &'a [T],
    /// `dt_t` `[T]`.
    pub dt: &'a [T],
    /// Trapezoid weight `lam_t = sigmoid(trap_t)` `[T]`.
    pub lam: &'a [T],
    /// `q̂_t · k̂_t` before rotation (rotation cancels on the diagonal) `[T]`;
    /// only the chunked form reads it.
    pub qk_raw: &'a [T],
    /// Tokens that start a new sequence (`[T]`, or empty for none): the
    /// decay and the trapezoid's previous-token term are zero there. Only
    /// the recurrent form takes them ([`super::chunked`] refuses a window
    /// with any).
    pub resets: &'a [bool],
    /// The head's skip weight `D[h]`.
    pub d: T,
    /// Head dimension P.
    pub p: usize,
    /// State size N.
    pub n: usize,
}

impl<T> HeadInputs<'_, T> {
    /// Checks every length against `T = adt.len()`, `p` and `n`.
    pub fn check(&self, carry: &HeadCarry<'_, T>) -> Result<(), ScanShapeError> {
        let (t, p, n) = (self.len(), self.p, self.n);
        let parts = [
            ("q", self.q.len(), t * n),
            ("k", self.k.len(), t * n),
            ("v", self.v.len(), t * p),
            ("dt", self.dt.len(), t),
            ("lam", self.lam.len(), t),
            ("qk_raw", self.qk_raw.len(), t),
            (
                "resets",
                self.resets.len(),
                if self.resets.is_empty() { 0 } else { t },
            ),
            ("carry.ssm", carry.ssm.len(), p * n),
            ("carry.k", carry.k.len(), n),
            ("carry.v", carry.v.len(), p),
        ];
        for (field, found, expected) in parts {
            if found != expected {
                return Err(ScanShapeError {
                    field,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }

    /// Sequence length T.
    pub fn len(&self) -> usize {
        self.adt.len()
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.adt.is_empty()
    }

    /// [`Self::check`] for a form that takes no resets (the chunked one):
    /// any flag set is refused.
    pub fn check_unsegmented(&self, carry: &HeadCarry<'_, T>) -> Result<(), ScanShapeError> {
        self.check(carry)?;
        let set = self.resets.iter().filter(|&&r| r).count();
        if set > 0 {
            return Err(ScanShapeError {
                field: "resets set (the chunked form takes none)",
                expected: 0,
                found: set,
            });
        }
        Ok(())
    }

    /// Whether token `t` starts a new sequence.
    pub fn resets_at(&self, t: usize) -> bool {
        self.resets.get(t).copied().unwrap_or(false)
    }

    /// Whether any token starts a new sequence.
    pub fn has_resets(&self) -> bool {
        self.resets.iter().any(|&r| r)
    }

    /// Step `t`'s `(alpha, beta, gamma)`, zero decay at a reset.
    fn coefficients_at(&self, t: usize) -> (T, T, T)
    where
        T: Float,
    {
        let (alpha, beta, gamma) = coefficients(self.adt[t], self.dt[t], self.lam[t]);
        if self.resets_at(t) {
            (T::ZERO, T::ZERO, gamma)
        } else {
            (alpha, beta, gamma)
        }
    }
}

/// The state entering a window for one (batch row, head): SSM state `[P, N]`,
/// last rotated key `[N]` and last value `[P]`.
#[derive(Debug, Clone, Copy)]
pub struct HeadCarry<'a, T> {
    /// `S_{-1}` `[P, N]`.
    pub ssm: &'a [T],
    /// `k_{-1}` `[N]` (post-bias, post-rotation, unscaled).
    pub k: &'a [T],
    /// `v_{-1}` `[P]`.
    pub v: &'a [T],
}

/// Result of the recurrent forward pass of one head.
#[derive(Debug, Clone)]
pub struct RecurrentOut<T> {
    /// `y_t` `[T, P]` (before the gate).
    pub y: Vec<T>,
    /// `S_{T-1}` `[P, N]`.
    pub final_state: Vec<T>,
    /// State entering each chunk of `chunk` steps, `[nchunks, P, N]`
    /// (entry 0 is `S_{-1}`); the backward pass restarts from these.
    pub checkpoints: Vec<T>,
}

/// Scalar coefficients of step t: `(alpha, beta, gamma)`.
pub fn coefficients<T: Float>(adt: T, dt: T, lam: T) -> (T, T, T) {
    let alpha = adt.exp();
    (alpha, (T::ONE - lam) * dt * alpha, lam * dt)
}

/// `S += a * v k^T` for `S: P x N`.
fn rank1<T: Float>(s: &mut [T], a: T, v: &[T], k: &[T]) {
    for (row, &vp) in s.chunks_mut(k.len()).zip(v) {
        axpy(row, a * vp, k);
    }
}

/// One recurrence step in place: `S <- alpha S + beta v_prev k_prev^T + gamma v k^T`.
fn step<T: Float>(s: &mut [T], coef: (T, T, T), prev: (&[T], &[T]), cur: (&[T], &[T])) {
    let (alpha, beta, gamma) = coef;
    for x in s.iter_mut() {
        *x *= alpha;
    }
    rank1(s, beta, prev.1, prev.0);
    rank1(s, gamma, cur.1, cur.0);
}

/// Runs the recurrence over the whole window (lengths checked first).
pub fn recurrent_forward<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    chunk: usize,
) -> Result<RecurrentOut<T>, ScanShapeError> {
    x.check(carry)?;
    Ok(recurrent_forward_unchecked(x, carry, chunk))
}

/// [`recurrent_forward`] for inputs the model built itself (lengths consistent by construction).
pub(crate) fn recurrent_forward_unchecked<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    chunk: usize,
) -> RecurrentOut<T> {
    let (p, n, len) = (x.p, x.n, x.len());
    let chunk = chunk.max(1);
    let mut s = carry.ssm.to_vec();
    let mut y = vec![T::ZERO; len * p];
    let mut checkpoints = Vec::with_capacity(len.div_ceil(chunk) * p * n);
    for t in 0..len {
        if t % chunk == 0 {
            checkpoints.extend_from_slice(&s);
        }
        let prev = if t == 0 {
            (carry.k, carry.v)
        } else {
            (&x.k[(t - 1) * n..t * n], &x.v[(t - 1) * p..t * p])
        };
        let cur = (&x.k[t * n..(t + 1) * n], &x.v[t * p..(t + 1) * p]);
        step(&mut s, x.coefficients_at(t), prev, cur);
        let q = &x.q[t * n..(t + 1) * n];
        for ((yv, row), &vv) in y[t * p..(t + 1) * p].iter_mut().zip(s.chunks(n)).zip(cur.1) {
            *yv = dot(row, q) + x.d * vv;
        }
    }
    RecurrentOut {
        y,
        final_state: s,
        checkpoints,
    }
}

/// Gradients of one head's scan with respect to its per-step inputs.
#[derive(Debug, Clone)]
pub struct HeadGrads<T> {
    /// `dL/dq_t` `[T, N]` (rotated frame).
    pub dq: Vec<T>,
    /// `dL/dk_t` `[T, N]` (rotated frame).
    pub dk: Vec<T>,
    /// `dL/dv_t` `[T, P]`.
    pub dv: Vec<T>,
    /// `dL/d(adt_t)` `[T]`.
    pub dadt: Vec<T>,
    /// `dL/d(dt_t)` through alpha/beta/gamma only (the rotation-angle path
    /// is added by the caller) `[T]`.
    pub ddt: Vec<T>,
    /// `dL/d(lam_t)` `[T]`.
    pub dlam: Vec<T>,
    /// `dL/dD[h]` for this (row, head).
    pub dd: T,
}

/// Reverse pass of [`recurrent_forward`] given `dL/dy` `[T, P]`. The carried
/// state is a constant (truncated backpropagation across windows).
pub fn recurrent_backward<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    fwd: &RecurrentOut<T>,
    dy: &[T],
    chunk: usize,
) -> Result<HeadGrads<T>, ScanShapeError> {
    x.check(carry)?;
    let (t, p, n) = (x.len(), x.p, x.n);
    let ck = t.div_ceil(chunk.max(1)) * p * n;
    for (field, found, expected) in [
        ("dy", dy.len(), t * p),
        ("checkpoints", fwd.checkpoints.len(), ck),
    ] {
        if found != expected {
            return Err(ScanShapeError {
                field,
                expected,
                found,
            });
        }
    }
    Ok(recurrent_backward_unchecked(
        x,
        carry,
        &fwd.checkpoints,
        dy,
        chunk,
    ))
}

/// [`recurrent_backward`] for inputs the model built itself.
pub(crate) fn recurrent_backward_unchecked<T: Float>(
    x: &HeadInputs<'_, T>,
    carry: &HeadCarry<'_, T>,
    checkpoints: &[T],
    dy: &[T],
    chunk: usize,
) -> HeadGrads<T> {
    let (p, n, len) = (x.p, x.n, x.len());
    let chunk = chunk.max(1);
    let mut g = HeadGrads {
        dq: vec![T::ZERO; len * n],
        dk: vec![T::ZERO; len * n],
        dv: vec![T::ZERO; len * p],
        dadt: vec![T::ZERO; len],
        ddt: vec![T::ZERO; len],
        dlam: vec![T::ZERO; len],
        dd: T::ZERO,
    };
    let pn = p * n;
    let mut ds = vec![T::ZERO; pn];
    // states[j] = S_{c0 + j - 1}: the chunk's entry state followed by each step's state.
    let mut states = vec![T::ZERO; (chunk + 1) * pn];
    let nchunks = len.div_ceil(chunk);
    let prev_of = |t: usize| -> (&[T], &[T]) {
        if t == 0 {
            (carry.k, carry.v)
        } else {
            (&x.k[(t - 1) * n..t * n], &x.v[(t - 1) * p..t * p])
        }
    };
    for c in (0..nchunks).rev() {
        let (c0, c1) = (c * chunk, ((c + 1) * chunk).min(len));
        states[..pn].copy_from_slice(&checkpoints[c * pn..(c + 1) * pn]);
        for t in c0..c1 {
            let j = t - c0;
            let (before, after) = states.split_at_mut((j + 1) * pn);
            let s = &mut after[..pn];
            s.copy_from_slice(&before[j * pn..]);
            let cur = (&x.k[t * n..(t + 1) * n], &x.v[t * p..(t + 1) * p]);
            step(s, x.coefficients_at(t), prev_of(t), cur);
        }
        for t in (c0..c1).rev() {
            let j = t - c0;
            let s_prev = &states[j * pn..(j + 1) * pn];
            let s_cur = &states[(j + 1) * pn..(j + 2) * pn];
            // At a reset alpha = beta = 0: dadt, beta's share of ddt and dlam,
            // and the gradient into S_{t-1} (ds scaled by alpha) all vanish.
            let (alpha, beta, gamma) = x.coefficients_at(t);
            let q = &x.q[t * n..(t + 1) * n];
            let (kt, vt) = (&x.k[t * n..(t + 1) * n], &x.v[t * p..(t + 1) * p]);
            let dyt = &dy[t * p..(t + 1) * p];
            // y_t = S_t q_t + D v_t
            {
                let dq = &mut g.dq[t * n..(t + 1) * n];
                for (row, &gy) in s_cur.chunks(n).zip(dyt) {
                    axpy(dq, gy, row);
                }
            }
            g.dd += dot(dyt, vt);
            axpy(&mut g.dv[t * p..(t + 1) * p], x.d, dyt);
            rank1(&mut ds, T::ONE, dyt, q);
            // S_t = alpha S_{t-1} + beta v_{t-1} k_{t-1}^T + gamma v_t k_t^T
            let (kp, vp) = prev_of(t);
            let dalpha = dot(&ds, s_prev);
            let dbeta = bilinear(&ds, vp, kp);
            let dgamma = bilinear(&ds, vt, kt);
            add_ds_k(&mut g.dv[t * p..(t + 1) * p], gamma, &ds, kt);
            add_dst_v(&mut g.dk[t * n..(t + 1) * n], gamma, &ds, vt);
            if t > 0 {
                add_ds_k(&mut g.dv[(t - 1) * p..t * p], beta, &ds, kp);
                add_dst_v(&mut g.dk[(t - 1) * n..t * n], beta, &ds, vp);
            }
            for v in ds.iter_mut() {
                *v *= alpha;
            }
            let (dt, lam) = (x.dt[t], x.lam[t]);
            g.dadt[t] = dalpha * alpha + dbeta * beta;
            g.ddt[t] = dbeta * (T::ONE - lam) * alpha + dgamma * lam;
            g.dlam[t] = (dgamma - dbeta * alpha) * dt;
        }
    }
    g
}

/// `v^T M k` for `M: P x N`.
fn bilinear<T: Float>(m: &[T], v: &[T], k: &[T]) -> T {
    m.chunks(k.len())
        .zip(v)
        .map(|(row, &vp)| vp * dot(row, k))
        .sum()
}

/// `out += a * M k` (`out: P`).
fn add_ds_k<T: Float>(out: &mut [T], a: T, m: &[T], k: &[T]) {
    for (o, row) in out.iter_mut().zip(m.chunks(k.len())) {
        *o += a * dot(row, k);
    }
}

/// `out += a * M^T v` (`out: N`).
fn add_dst_v<T: Float>(out: &mut [T], a: T, m: &[T], v: &[T]) {
    for (row, &vp) in m.chunks(out.len()).zip(v) {
        axpy(out, a * vp, row);
    }
}
