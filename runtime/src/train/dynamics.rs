//! What a state-tracking model has learned about its own dynamics, measured
//! on a few held-out rows (`--log-dynamics`, and every run of `stepgraph
//! repro`): the quantities that decide whether a solution found on short
//! instances still holds on long ones.
//!
//! A linear recurrence tracks a group element through the rotation of its
//! state, and keeps it through its decay. On an instance of `L` tokens:
//!
//! * **Retention.** The state is multiplied by `exp(A_t dt_t)` at every token,
//!   so what a head wrote at the start reaches the answer scaled by
//!   `exp(sum_t A_t dt_t)`. A head that keeps 0.9 of it over a training
//!   instance of 160 tokens keeps 0.84 over 256; one that keeps 0.5 keeps
//!   0.33, and the answer's margin shrinks with it.
//! * **Angle exactness.** Each token turns pair `s` of head `h` by an
//!   increment; an exact solution of a task modulo `m` turns by multiples of
//!   `2 pi / m`. An error `e` per token adds up to about `L e`, and the
//!   answer flips once that reaches `pi / m`: a model whose error is small
//!   enough for 160 tokens can still fail at 256.
//!
//! [`probe`] runs the CPU reference (f64) over the rows with the engine's
//! current weights and reports, per block, the best head's retention over
//! the rows and the best rotating channel's worst per-token distance to the
//! lattice `(2 pi / m) Z` ([`LayerDynamics`]).

use serde::{Deserialize, Serialize};

use super::data::{Batch, Task};
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{ModelError, ScanMode, Tokens, Weights, forward};

/// Rows of an eval set the probe runs on.
pub const PROBE_ROWS: usize = 4;

/// What [`probe`] measured in one block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerDynamics {
    /// Mean `dt` over tokens and heads.
    pub dt_mean: f64,
    /// Mean `-A dt` (decay per token) over tokens and heads.
    pub decay_mean: f64,
    /// `exp(sum_t A_t dt_t)` over a whole probe row, for the head that keeps
    /// the most (mean over the rows).
    pub retention_best: f64,
    /// The same, averaged over heads.
    pub retention_mean: f64,
    /// Largest rotation increment of any token, head and pair, in units of
    /// pi (how far the angles have grown from their start near 0).
    pub angle_max: f64,
    /// For a task modulo `m`: among the channels (head, pair) that tell
    /// tokens apart (two token ids whose increments differ by at least half
    /// a step, `pi / m`), the one whose worst per-token increment lies
    /// closest to a multiple of `2 pi / m`, and that distance in radians
    /// (`None`: no such channel; fixed or no rotation has none).
    pub lattice_error: Option<f64>,
    /// That channel as `[head, pair]`.
    pub lattice_channel: Option<[usize; 2]>,
    /// That channel's mean increment per token id (units of pi; `None` for
    /// ids absent from the probe rows).
    pub lattice_steps: Vec<Option<f64>>,
}

/// The probe's result: one entry per block, and the row length it ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dynamics {
    /// Tokens per probe row.
    pub row_len: usize,
    /// Per block, first to last.
    pub layers: Vec<LayerDynamics>,
}

/// Runs the CPU reference over the first [`PROBE_ROWS`] rows of `batch` with
/// `weights` and measures each block's dynamics (see the module docs).
pub fn probe(
    cfg: &Mamba3Config,
    weights: &Weights<f32>,
    task: Task,
    batch: &Batch,
) -> Result<Dynamics, ModelError> {
    let rows = batch.rows.min(PROBE_ROWS);
    let part = batch.slice_rows(0, rows);
    let ids: Vec<i64> = part.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tokens::from_rows(&ids, rows, part.width, cfg.vocab_size)?;
    let w = weights.cast::<f64>();
    let out = forward(cfg, &w, &tokens, None, ScanMode::Recurrent)?;
    let len = tokens.len();
    let layers = out
        .blocks
        .iter()
        .map(|b| {
            let m = &b.mixer;
            layer(
                cfg,
                Heads {
                    dt: &m.dt,
                    adt: &m.adt,
                    phi: &m.phi,
                    rows,
                    len,
                },
                tokens.inputs(),
                task,
            )
        })
        .collect();
    Ok(Dynamics {
        row_len: len,
        layers,
    })
}

/// One block's per-head scalars `[B, H, T]` and angles `[B, H, T, S]`.
struct Heads<'a> {
    dt: &'a [f64],
    adt: &'a [f64],
    phi: &'a [f64],
    rows: usize,
    len: usize,
}

/// `x` wrapped to `(-pi, pi]`.
fn wrap(x: f64) -> f64 {
    let tau = std::f64::consts::TAU;
    let r = x - tau * (x / tau).round();
    if r <= -std::f64::consts::PI {
        r + tau
    } else {
        r
    }
}

/// Distance of `x` to the nearest multiple of `step`.
fn lattice_distance(x: f64, step: f64) -> f64 {
    (x - step * (x / step).round()).abs()
}

fn count(n: usize) -> f64 {
    f64::from(u32::try_from(n).unwrap_or(u32::MAX))
}

fn layer(cfg: &Mamba3Config, x: Heads<'_>, ids: &[usize], task: Task) -> LayerDynamics {
    let (nh, ns, vocab) = (cfg.nheads(), cfg.num_rope_angles(), cfg.vocab_size);
    let (rows, len) = (x.rows, x.len);
    let tokens = count(rows * len * nh).max(1.0);
    let dt_mean = x.dt.iter().sum::<f64>() / tokens;
    let decay_mean = -x.adt.iter().sum::<f64>() / tokens;
    // Retention per head, averaged over rows.
    let mut retention = vec![0.0; nh];
    for b in 0..rows {
        for (h, r) in retention.iter_mut().enumerate() {
            let base = (b * nh + h) * len;
            *r += x.adt[base..base + len].iter().sum::<f64>().exp() / count(rows);
        }
    }
    let retention_best = retention.iter().copied().fold(0.0, f64::max);
    let retention_mean = retention.iter().sum::<f64>() / count(nh).max(1.0);
    // Per-token increments of every channel: phi_t - phi_{t-1}, wrapped.
    // incr[(h * ns + s) * vocab + id] = (sum of sin, sum of cos, count, worst distance)
    let step = task.modulus().map(|m| std::f64::consts::TAU / f64::from(m));
    let mut acc = vec![(0.0f64, 0.0f64, 0usize, 0.0f64); nh * ns * vocab];
    let mut angle_max = 0.0f64;
    for b in 0..rows {
        for h in 0..nh {
            for t in 0..len {
                let id = ids[b * len + t];
                let at = ((b * nh + h) * len + t) * ns;
                for s in 0..ns {
                    let prev = if t == 0 { 0.0 } else { x.phi[at - ns + s] };
                    let inc = wrap(x.phi[at + s] - prev);
                    angle_max = angle_max.max(inc.abs());
                    let e = &mut acc[(h * ns + s) * vocab + id];
                    e.0 += inc.sin();
                    e.1 += inc.cos();
                    e.2 += 1;
                    if let Some(step) = step {
                        e.3 = e.3.max(lattice_distance(inc, step));
                    }
                }
            }
        }
    }
    let mean = |e: &(f64, f64, usize, f64)| (e.2 > 0).then(|| e.0.atan2(e.1));
    let mut best: Option<(f64, usize)> = None;
    if let Some(step) = step {
        for c in 0..nh * ns {
            let tokens = &acc[c * vocab..(c + 1) * vocab];
            // A channel that turns every token alike tells no tokens apart.
            let means: Vec<f64> = tokens.iter().filter_map(mean).collect();
            let turns = means
                .iter()
                .any(|&a| means.iter().any(|&b| wrap(a - b).abs() >= step / 2.0));
            let worst = tokens.iter().map(|e| e.3).fold(0.0, f64::max);
            if turns && best.is_none_or(|(w, _)| worst < w) {
                best = Some((worst, c));
            }
        }
    }
    let pi = std::f64::consts::PI;
    LayerDynamics {
        dt_mean,
        decay_mean,
        retention_best,
        retention_mean,
        angle_max: angle_max / pi,
        lattice_error: best.map(|b| b.0),
        lattice_channel: best.map(|(_, c)| [c / ns.max(1), c % ns.max(1)]),
        lattice_steps: best.map_or_else(Vec::new, |(_, c)| {
            acc[c * vocab..(c + 1) * vocab]
                .iter()
                .map(|e| mean(e).map(|m| m / pi))
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_and_lattice_distances() {
        let pi = std::f64::consts::PI;
        assert!((wrap(3.0 * pi) - pi).abs() < 1e-12);
        assert!((wrap(-0.5) + 0.5).abs() < 1e-12);
        assert!(lattice_distance(pi + 0.01, pi) - 0.01 < 1e-12);
        assert!((lattice_distance(0.4 * pi, 0.4 * pi)).abs() < 1e-12);
    }

    #[test]
    fn a_hand_built_parity_channel_is_exact() {
        let cfg = Mamba3Config {
            d_model: 4,
            n_layer: 1,
            vocab_size: 4,
            d_state: 4,
            headdim: 4,
            expand: 2,
            ..Mamba3Config::default()
        };
        // One row, two heads, one pair: head 0 turns by pi at id 1, 0 at id 0.
        let ids = [1usize, 0, 1, 1];
        let (len, nh) = (ids.len(), cfg.nheads());
        assert_eq!((nh, cfg.num_rope_angles()), (2, 1));
        let mut phi = vec![0.0; nh * len];
        let mut run = [0.0f64; 2];
        for (t, &id) in ids.iter().enumerate() {
            run[0] += if id == 1 { std::f64::consts::PI } else { 0.0 };
            run[1] += 0.1;
            phi[t] = run[0];
            phi[len + t] = run[1];
        }
        let dt = vec![1.0; nh * len];
        let adt = vec![-0.01; nh * len];
        let d = layer(
            &cfg,
            Heads {
                dt: &dt,
                adt: &adt,
                phi: &phi,
                rows: 1,
                len,
            },
            &ids,
            Task::Parity,
        );
        assert_eq!(d.lattice_channel, Some([0, 0]));
        assert!(d.lattice_error.is_some_and(|e| e < 1e-9), "{d:?}");
        assert!((d.retention_best - (-0.04f64).exp()).abs() < 1e-12);
        let steps = &d.lattice_steps;
        assert!(steps[1].is_some_and(|s| (s.abs() - 1.0).abs() < 1e-9));
        assert!(steps[0].is_some_and(|s| s.abs() < 1e-9));
        assert_eq!(steps[2], None);
    }
}
