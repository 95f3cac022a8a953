//! Dense building blocks of the CPU model: the three matmul shapes a linear
//! layer needs (forward, input gradient, weight gradient), RMSNorm forward and
//! backward, and the scalar activations with their derivatives.
//!
//! Rows are independent in every routine here, so each one splits its output
//! rows across rayon workers; inner loops run over contiguous memory.

use rayon::prelude::*;

use crate::float::Float;
use crate::mamba3::config::AActivation;

/// Rows per rayon task: below this much work per task the split costs more
/// than it saves.
fn rows_per_task(row_work: usize) -> usize {
    (16_384 / row_work.max(1)).max(1)
}

/// `y[m, n] = sum_k x[m, k] * w[n, k]` (a linear layer with torch's `[out, in]` weight).
pub fn matmul_nt<T: Float>(x: &[T], w: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    let mut y = vec![T::ZERO; m * n];
    if n == 0 || k == 0 {
        return y;
    }
    let chunk = rows_per_task(k * n);
    y.par_chunks_mut(n * chunk)
        .zip(x.par_chunks(k * chunk))
        .for_each(|(ys, xs)| {
            for (yrow, xrow) in ys.chunks_mut(n).zip(xs.chunks(k)) {
                for (yv, wrow) in yrow.iter_mut().zip(w.chunks(k)) {
                    *yv = dot(xrow, wrow);
                }
            }
        });
    y
}

/// `dx[m, k] = sum_n dy[m, n] * w[n, k]` (input gradient of [`matmul_nt`]).
pub fn matmul_nn<T: Float>(dy: &[T], w: &[T], m: usize, n: usize, k: usize) -> Vec<T> {
    let mut dx = vec![T::ZERO; m * k];
    if n == 0 || k == 0 {
        return dx;
    }
    let chunk = rows_per_task(k * n);
    dx.par_chunks_mut(k * chunk)
        .zip(dy.par_chunks(n * chunk))
        .for_each(|(dxs, dys)| {
            for (dxrow, dyrow) in dxs.chunks_mut(k).zip(dys.chunks(n)) {
                for (&g, wrow) in dyrow.iter().zip(w.chunks(k)) {
                    axpy(dxrow, g, wrow);
                }
            }
        });
    dx
}

/// `dw[n, k] += sum_m dy[m, n] * x[m, k]` (weight gradient of [`matmul_nt`]).
pub fn matmul_tn_acc<T: Float>(dw: &mut [T], dy: &[T], x: &[T], m: usize, n: usize, k: usize) {
    if n == 0 || k == 0 {
        return;
    }
    dw.par_chunks_mut(k).enumerate().for_each(|(j, dwrow)| {
        for (dyrow, xrow) in dy.chunks(n).zip(x.chunks(k)).take(m) {
            let g = dyrow[j];
            if g != T::ZERO {
                axpy(dwrow, g, xrow);
            }
        }
    });
}

/// Inner product. Eight independent partial sums let the compiler vectorise
/// (a single running sum is a serial dependency chain under strict IEEE
/// semantics); the summation order is fixed, so results stay deterministic.
pub fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [T::ZERO; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = T::ZERO;
    for (&x, &y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += a * x`.
pub fn axpy<T: Float>(y: &mut [T], a: T, x: &[T]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// Reciprocal RMS of `x`: `1 / sqrt(mean(x^2) + eps)`.
pub fn rstd<T: Float>(x: &[T], eps: T) -> T {
    let ms = x.iter().map(|&v| v * v).sum::<T>() / T::from_count(x.len());
    T::ONE / (ms + eps).sqrt()
}

/// Row-wise RMSNorm of `x` (`rows x width`) with weight `w`; returns the
/// output and the per-row reciprocal RMS (kept for the backward pass).
pub fn rmsnorm_rows<T: Float>(x: &[T], w: &[T], width: usize, eps: T) -> (Vec<T>, Vec<T>) {
    let rows = x.len() / width.max(1);
    let mut y = vec![T::ZERO; x.len()];
    let mut r = vec![T::ZERO; rows];
    let chunk = rows_per_task(width * 4);
    y.par_chunks_mut(width * chunk)
        .zip(r.par_chunks_mut(chunk))
        .zip(x.par_chunks(width * chunk))
        .for_each(|((ys, rs), xs)| {
            for ((yrow, rv), xrow) in ys
                .chunks_mut(width)
                .zip(rs.iter_mut())
                .zip(xs.chunks(width))
            {
                *rv = rstd(xrow, eps);
                for ((yv, &xv), &wv) in yrow.iter_mut().zip(xrow).zip(w) {
                    *yv = xv * *rv * wv;
                }
            }
        });
    (y, r)
}

/// Backward of one RMSNorm row `y = x * r * w`: adds `dL/dw` into `dw` and
/// returns `dL/dx` into `dx` (overwritten).
pub fn rmsnorm_row_backward<T: Float>(
    x: &[T],
    w: &[T],
    r: T,
    dy: &[T],
    dx: &mut [T],
    dw: &mut [T],
) {
    let n = T::from_count(x.len());
    // s = sum_i (dy_i * w_i) * x_i drives the gradient through r.
    let mut s = T::ZERO;
    for (((&xv, &wv), &g), dwv) in x.iter().zip(w).zip(dy).zip(dw.iter_mut()) {
        *dwv += g * xv * r;
        s += g * wv * xv;
    }
    let c = r * r * r * s / n;
    for (((dxv, &xv), &wv), &g) in dx.iter_mut().zip(x).zip(w).zip(dy) {
        *dxv = r * wv * g - c * xv;
    }
}

/// Row-wise RMSNorm backward for `rows x width` data; returns `dx` and adds into `dw`.
pub fn rmsnorm_rows_backward<T: Float>(
    x: &[T],
    w: &[T],
    r: &[T],
    dy: &[T],
    width: usize,
    dw: &mut [T],
) -> Vec<T> {
    let mut dx = vec![T::ZERO; x.len()];
    let chunk = rows_per_task(width * 4);
    let partial: Vec<Vec<T>> = dx
        .par_chunks_mut(width * chunk)
        .zip(x.par_chunks(width * chunk))
        .zip(dy.par_chunks(width * chunk))
        .zip(r.par_chunks(chunk))
        .map(|(((dxs, xs), dys), rs)| {
            let mut dwp = vec![T::ZERO; width];
            for (((dxrow, xrow), dyrow), &rv) in dxs
                .chunks_mut(width)
                .zip(xs.chunks(width))
                .zip(dys.chunks(width))
                .zip(rs)
            {
                rmsnorm_row_backward(xrow, w, rv, dyrow, dxrow, &mut dwp);
            }
            dwp
        })
        .collect();
    // Summing the per-task partials in task order keeps the result deterministic.
    for p in partial {
        axpy(dw, T::ONE, &p);
    }
    dx
}

/// Logistic sigmoid, stable for large |x|.
pub fn sigmoid<T: Float>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// Threshold above which torch's `softplus` returns its input unchanged.
const SOFTPLUS_THRESHOLD: f64 = 20.0;

/// `torch.nn.functional.softplus` (beta 1, threshold 20).
pub fn softplus<T: Float>(x: T) -> T {
    if x > T::from_f64(SOFTPLUS_THRESHOLD) {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Derivative of [`softplus`] as torch computes it (1 above the threshold).
pub fn softplus_grad<T: Float>(x: T) -> T {
    if x > T::from_f64(SOFTPLUS_THRESHOLD) {
        T::ONE
    } else {
        sigmoid(x)
    }
}

/// `f(dd_A)` of `A = -max(f(dd_A), A_floor)` and its derivative.
pub fn a_rate<T: Float>(act: AActivation, x: T) -> (T, T) {
    match act {
        AActivation::HeavyTail => (heavy_tail(x), heavy_tail_grad(x)),
        AActivation::Softplus => (softplus(x), softplus_grad(x)),
    }
}

/// Official `heavy_tail_activation`: `1 + x` for `x >= 0`, `1 / (1 - x)` below.
pub fn heavy_tail<T: Float>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE + x
    } else {
        T::ONE / (T::ONE - x)
    }
}

/// Derivative of [`heavy_tail`]. Both one-sided derivatives are 1 at `x = 0`;
/// torch's clamp-based autograd would report 2 at exactly 0, a measure-zero
/// point this oracle does not reproduce.
pub fn heavy_tail_grad<T: Float>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE
    } else {
        let d = T::ONE - x;
        T::ONE / (d * d)
    }
}

/// `x * sigmoid(x)`.
pub fn silu<T: Float>(x: T) -> T {
    x * sigmoid(x)
}

/// Derivative of [`silu`].
pub fn silu_grad<T: Float>(x: T) -> T {
    let s = sigmoid(x);
    s * (T::ONE + x * (T::ONE - s))
}
