//! The MLP on the CPU, in f64: the oracle the GPU step is checked against,
//! and what the example trains when there is no GPU.
//!
//! ```text
//! h      = relu(x w1 + b1)                     [batch x hidden]
//! z      = h w2 + b2                           [batch x classes]
//! loss   = mean_r (logsumexp(z_r) - z_r[y_r])
//! dz     = (softmax(z) - onehot(y)) / batch
//! dw2    = h^T dz,  db2 = colsum(dz)
//! dh     = (dz w2^T) * (h > 0)
//! dw1    = x^T dh,  db1 = colsum(dh)
//! ```
//!
//! The update is stepgraph's host AdamW ([`stepgraph::optim::AdamW`]), the
//! same arithmetic the device one runs.

use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy, OptimError, Param};

use crate::data::{Dims, HostParams, Teacher};

/// Parameters or gradients in f64, in the optimizer's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensors {
    /// `w1`, `b1`, `w2`, `b2`.
    pub all: [Vec<f64>; 4],
}

impl Tensors {
    /// The f32 parameters, widened.
    pub fn from_host(p: &HostParams) -> Self {
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect();
        Self {
            all: [wide(&p.w1), wide(&p.b1), wide(&p.w2), wide(&p.b2)],
        }
    }
}

/// The names, sizes and kinds of the parameters: one optimizer param group.
pub fn param_group(d: Dims) -> Vec<Param> {
    let p = |name: &str, numel: usize, matrix: bool| Param {
        name: name.to_owned(),
        numel,
        matrix,
    };
    vec![
        p("w1", d.input * d.hidden, true),
        p("b1", d.hidden, false),
        p("w2", d.hidden * d.classes, true),
        p("b2", d.classes, false),
    ]
}

/// Row-major `a [m x k]` times `b [k x n]`.
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += av * b[p * n + j];
            }
        }
    }
    out
}

/// `a^T` for a row-major `a [rows x cols]`.
fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = a[r * cols + c];
        }
    }
    out
}

fn colsum(g: &[f64], cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for row in g.chunks(cols) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
    out
}

/// The mean loss of one batch and the gradients of every parameter.
pub fn loss_and_grads(d: Dims, p: &Tensors, x: &[f32], labels: &[i32]) -> (f64, Tensors) {
    let [w1, b1, w2, b2] = &p.all;
    let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut h = matmul(&x, w1, d.batch, d.input, d.hidden);
    for row in h.chunks_mut(d.hidden) {
        for (v, b) in row.iter_mut().zip(b1) {
            *v = (*v + b).max(0.0);
        }
    }
    let mut z = matmul(&h, w2, d.batch, d.hidden, d.classes);
    let scale = 1.0 / f64::from(u32::try_from(d.batch).unwrap_or(u32::MAX));
    let mut loss = 0.0;
    for (row, &y) in z.chunks_mut(d.classes).zip(labels) {
        for (v, b) in row.iter_mut().zip(b2) {
            *v += b;
        }
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let y = usize::try_from(y).unwrap_or(usize::MAX);
        loss += m + s.ln() - row.get(y).copied().unwrap_or(f64::NAN);
        for (c, v) in row.iter_mut().enumerate() {
            let p = (*v - m).exp() / s;
            *v = (p - if c == y { 1.0 } else { 0.0 }) * scale;
        }
    }
    let dz = z;
    let dw2 = matmul(
        &transpose(&h, d.batch, d.hidden),
        &dz,
        d.hidden,
        d.batch,
        d.classes,
    );
    let db2 = colsum(&dz, d.classes);
    let mut dh = matmul(
        &dz,
        &transpose(w2, d.hidden, d.classes),
        d.batch,
        d.classes,
        d.hidden,
    );
    for (g, hv) in dh.iter_mut().zip(&h) {
        if *hv <= 0.0 {
            *g = 0.0;
        }
    }
    let dw1 = matmul(
        &transpose(&x, d.batch, d.input),
        &dh,
        d.input,
        d.batch,
        d.hidden,
    );
    let db1 = colsum(&dh, d.hidden);
    (
        loss * scale,
        Tensors {
            all: [dw1, db1, dw2, db2],
        },
    )
}

/// Trains from `init` for `steps` steps on the batches of `teacher`; the
/// loss of every step.
pub fn train(
    d: Dims,
    init: &HostParams,
    teacher: &Teacher,
    adamw: AdamWConfig,
    steps: u64,
) -> Result<Vec<f64>, OptimError> {
    let mut p = Tensors::from_host(init);
    let mut opt = AdamW::<f64>::new(adamw, &param_group(d), &DecayPolicy::MatricesOnly);
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, labels) = teacher.batch(step);
        let (loss, g) = loss_and_grads(d, &p, &x, &labels);
        let grads: Vec<&[f64]> = g.all.iter().map(Vec::as_slice).collect();
        let mut params: Vec<&mut Vec<f64>> = p.all.iter_mut().collect();
        opt.step(&mut params, &grads)?;
        losses.push(loss);
    }
    Ok(losses)
}

/// The mean of the first and of the last `n` values.
pub fn first_and_last(losses: &[f64], n: usize) -> (f64, f64) {
    let n = n.clamp(1, losses.len().max(1));
    let mean =
        |s: &[f64]| s.iter().sum::<f64>() / f64::from(u32::try_from(s.len().max(1)).unwrap_or(1));
    (
        mean(losses.get(..n).unwrap_or_default()),
        mean(
            losses
                .get(losses.len().saturating_sub(n)..)
                .unwrap_or_default(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DIMS, Rng};

    /// Central differences of the loss against the analytic gradient, on a
    /// small batch, for a sample of every tensor's entries.
    #[test]
    fn gradients_match_finite_differences() {
        let d = Dims { batch: 6, ..DIMS };
        let init = HostParams::init(d, 5);
        let mut p = Tensors::from_host(&init);
        // Non-zero biases, so their gradients are exercised off zero.
        let mut rng = Rng::new(9);
        for t in [1, 3] {
            for v in &mut p.all[t] {
                *v = 0.1 * f64::from(rng.uniform());
            }
        }
        let (x, labels) = Teacher::new(d, 2).batch(0);
        let (_, g) = loss_and_grads(d, &p, &x, &labels);
        let eps = 1e-6;
        for t in 0..4 {
            for i in (0..p.all[t].len()).step_by(7) {
                let mut up = p.clone();
                up.all[t][i] += eps;
                let mut down = p.clone();
                down.all[t][i] -= eps;
                let numeric = (loss_and_grads(d, &up, &x, &labels).0
                    - loss_and_grads(d, &down, &x, &labels).0)
                    / (2.0 * eps);
                let analytic = g.all[t][i];
                assert!(
                    (numeric - analytic).abs() <= 1e-6 + 1e-4 * analytic.abs(),
                    "tensor {t} entry {i}: numeric {numeric} vs analytic {analytic}"
                );
            }
        }
    }

    /// The recipe the GPU example uses learns the task (a smaller batch,
    /// to keep the unoptimised test build quick).
    #[test]
    fn the_loss_falls_on_the_cpu() {
        let d = Dims { batch: 64, ..DIMS };
        let teacher = Teacher::new(d, crate::model::SEED);
        let init = HostParams::init(d, crate::model::SEED);
        let losses = train(d, &init, &teacher, crate::model::adamw_config(), 200).unwrap();
        let (first, last) = first_and_last(&losses, 20);
        println!("cpu loss {first:.4} -> {last:.4}");
        assert!(first > 1.5, "starts near ln(8): {first}");
        assert!(last < 0.6 * first, "{first} -> {last}");
    }
}
