//! Central finite differences in f64 against the analytic backward pass, on
//! sampled entries of every parameter tensor, over configs covering
//! rope_fraction 0.5 and 1.0, ngroups 1 and 2, is_outproj_norm on and off,
//! tied and untied heads, B > 1, T = 130 (three chunks of 64), a carried-in
//! state, both scan forms (each differentiated by its own reverse pass), and
//! the fixed-RoPE rotation (`--rotation fixed`), whose angles depend on no
//! parameter.

mod cpu_common;

use cpu_common::{random_tokens, random_weights, tiny};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::mamba3::cpu::{
    ModelState, ScanMode, Tokens, Weights, backward, forward, param_specs,
};
use stepgraph::mamba3::{AActivation, Mamba3Config, RopeAngles, RopeFraction};

/// Entries checked per tensor: its largest-gradient entry plus this many
/// random ones among entries with a gradient of non-negligible size.
const RANDOM_ENTRIES: usize = 2;
const TOLERANCE: f64 = 1e-6;

fn loss(
    cfg: &Mamba3Config,
    w: &Weights<f64>,
    tokens: &Tokens,
    state: Option<&ModelState<f64>>,
    mode: ScanMode,
) -> f64 {
    forward(cfg, w, tokens, state, mode).expect("forward").loss
}

/// Fourth-order central difference: truncation error O(h^4), so h can stay
/// large enough that f64 round-off in the loss is negligible.
fn finite_difference(
    cfg: &Mamba3Config,
    w: &mut Weights<f64>,
    tensor: usize,
    idx: usize,
    tokens: &Tokens,
    state: Option<&ModelState<f64>>,
    mode: ScanMode,
) -> f64 {
    let values = w.tensors()[tensor];
    let orig = values[idx];
    // The step follows the tensor's own scale: an embedding row of norm ~0.05
    // needs a much smaller step than a norm weight of ~1.
    let rms = (values.iter().map(|v| v * v).sum::<f64>()
        / f64::from(u32::try_from(values.len()).unwrap()))
    .sqrt();
    let h = 1e-3 * rms.clamp(1e-3, 1.0);
    let mut at = |delta: f64| {
        w.tensors_mut()[tensor][idx] = orig + delta;
        loss(cfg, w, tokens, state, mode)
    };
    let (p1, m1, p2, m2) = (at(h), at(-h), at(2.0 * h), at(-2.0 * h));
    w.tensors_mut()[tensor][idx] = orig;
    (8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h)
}

fn check(
    cfg: &Mamba3Config,
    batch: usize,
    len: usize,
    seed: u64,
    carried: bool,
    mode: ScanMode,
) -> f64 {
    let mut w = random_weights(cfg, seed);
    let tokens = random_tokens(cfg, batch, len, seed + 1);
    let state = carried.then(|| {
        let warm = random_tokens(cfg, batch, 7, seed + 2);
        forward(cfg, &w, &warm, None, ScanMode::Recurrent)
            .expect("warm-up")
            .final_state
    });
    let fwd = forward(cfg, &w, &tokens, state.as_ref(), mode).expect("forward");
    let grads = backward(cfg, &w, &fwd);
    let specs = param_specs(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 3);
    let mut worst = 0.0f64;
    let analytic: Vec<Vec<f64>> = grads.tensors().into_iter().map(<[f64]>::to_vec).collect();
    for (ti, (spec, g)) in specs.iter().zip(&analytic).enumerate() {
        let gmax = g.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(gmax > 0.0, "{}: gradient is identically zero", spec.name);
        let argmax = g.iter().position(|x| x.abs() == gmax).expect("non-empty");
        // Entries far below 1e-4 are dominated by the difference's round-off
        // (about 1e-12 absolute here), not by any error in the gradient.
        let floor = (1e-2 * gmax).max(1e-4);
        let mut candidates: Vec<usize> = (0..g.len()).filter(|&i| g[i].abs() >= floor).collect();
        if candidates.is_empty() {
            candidates.push(argmax);
        }
        let mut picks = vec![argmax];
        for _ in 0..RANDOM_ENTRIES {
            picks.push(candidates[rng.random_range(0..candidates.len())]);
        }
        for idx in picks {
            let fd = finite_difference(cfg, &mut w, ti, idx, &tokens, state.as_ref(), mode);
            let an = g[idx];
            let rel = (fd - an).abs() / fd.abs().max(an.abs());
            assert!(
                rel < TOLERANCE,
                "{}[{idx}]: analytic {an:e} vs finite difference {fd:e} (relative error {rel:e})",
                spec.name
            );
            worst = worst.max(rel);
        }
    }
    worst
}

#[test]
fn gradients_rope_half_one_group_plain_gate_tied() {
    let cfg = tiny(RopeFraction::Half, 1, false, true);
    let worst = check(&cfg, 2, 130, 11, false, ScanMode::Recurrent);
    eprintln!("max relative error (rope 0.5, G 1, no outproj norm, tied): {worst:e}");
}

#[test]
fn gradients_rope_full_two_groups_outproj_norm_untied_carried() {
    let cfg = tiny(RopeFraction::Full, 2, true, false);
    let worst = check(&cfg, 2, 130, 23, true, ScanMode::Chunked);
    eprintln!(
        "max relative error (rope 1.0, G 2, outproj norm, untied, carried state, chunked): {worst:e}"
    );
}

#[test]
fn gradients_rope_half_two_groups_outproj_norm_short_chunks() {
    let cfg = Mamba3Config {
        chunk_size: 5,
        ..tiny(RopeFraction::Half, 2, true, true)
    };
    let worst = check(&cfg, 3, 17, 37, true, ScanMode::Chunked);
    eprintln!("max relative error (rope 0.5, G 2, outproj norm, chunk 5, chunked): {worst:e}");
}

#[test]
fn gradients_softplus_a() {
    let cfg = Mamba3Config {
        a_activation: AActivation::Softplus,
        ..tiny(RopeFraction::Half, 1, false, true)
    };
    let worst = check(&cfg, 2, 40, 41, false, ScanMode::Recurrent);
    eprintln!("max relative error (softplus A, rope 0.5, G 1): {worst:e}");
}

#[test]
fn gradients_fixed_rope_recurrent_carried() {
    let cfg = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        a_activation: AActivation::Softplus,
        ..tiny(RopeFraction::Half, 1, false, true)
    };
    let worst = check(&cfg, 2, 40, 43, true, ScanMode::Recurrent);
    eprintln!("max relative error (fixed RoPE, carried state, recurrent): {worst:e}");
}

#[test]
fn gradients_fixed_rope_full_chunked() {
    let cfg = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..tiny(RopeFraction::Full, 2, true, false)
    };
    let worst = check(&cfg, 2, 130, 61, false, ScanMode::Chunked);
    eprintln!("max relative error (fixed RoPE, rope 1.0, G 2, chunked): {worst:e}");
}

/// Fixed RoPE turns pair `s` by `omega_s = 10000^(-s / S)` per token, in
/// every head, whatever the weights: `phi_t = (t + 1) omega_s mod 2 pi`, the
/// angle rows of `in_proj` get an exactly zero gradient and changing them
/// changes nothing, while the rotation itself still shapes the loss.
#[test]
fn fixed_rope_angles_ignore_the_angle_rows() {
    let cfg = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..tiny(RopeFraction::Half, 1, false, true)
    };
    let (len, nh, ns) = (20, cfg.nheads(), cfg.num_rope_angles());
    let mut w = random_weights(&cfg, 51);
    let tokens = random_tokens(&cfg, 2, len, 52);
    let fwd = forward(&cfg, &w, &tokens, None, ScanMode::Chunked).expect("forward");
    let omega = cfg.rope_frequencies();
    assert_eq!(omega.len(), ns);
    assert!((omega[0] - 1.0).abs() < 1e-15 && omega[ns - 1] < omega[0]);
    let phi = &fwd.blocks[0].mixer.phi;
    for b in 0..2 {
        for h in 0..nh {
            for t in 0..len {
                for (s, &om) in omega.iter().enumerate() {
                    let want = (f64::from(u32::try_from(t + 1).unwrap()) * om)
                        .rem_euclid(std::f64::consts::TAU);
                    let got = phi[((b * nh + h) * len + t) * ns + s];
                    assert!(
                        (got - want).abs() < 1e-9,
                        "phi[{b},{h},{t},{s}] {got} vs {want}"
                    );
                }
            }
        }
    }
    let grads = backward(&cfg, &w, &fwd);
    let layout = cfg.in_proj_layout();
    let in_proj = |w: &Weights<f64>| w.layers[0].in_proj.clone();
    let g = &grads.layers[0].in_proj;
    let angle_rows = layout.angles * cfg.d_model..layout.width * cfg.d_model;
    assert!(g[angle_rows.clone()].iter().all(|&x| x == 0.0));
    assert!(g[..angle_rows.start].iter().any(|&x| x != 0.0));
    let before = fwd.loss;
    let saved = in_proj(&w);
    for v in &mut w.layers[0].in_proj[angle_rows] {
        *v += 0.7;
    }
    let after = forward(&cfg, &w, &tokens, None, ScanMode::Chunked).expect("forward");
    assert_eq!(
        after.loss.to_bits(),
        before.to_bits(),
        "angle rows change nothing"
    );
    w.layers[0].in_proj = saved;
    let data = Mamba3Config {
        rope_angles: RopeAngles::Data,
        ..cfg.clone()
    };
    let other = forward(&data, &w, &tokens, None, ScanMode::Chunked).expect("forward");
    assert!(
        (other.loss - before).abs() > 1e-6,
        "fixed and data angles differ"
    );
}
