//! AdamW against values computed by hand from the torch update rule, the
//! weight-decay policy, size errors, and gradient clipping.

use stepgraph::mamba3::cpu::{Weights, param_specs};
use stepgraph::mamba3::{Mamba3Config, RopeFraction};
use stepgraph::optim::{AdamW, AdamWConfig, DecayPolicy, OptimError, Param, clip_grad_norm};
use stepgraph::step::params;

fn spec(name: &str, matrix: bool) -> Param {
    Param {
        name: name.into(),
        numel: 1,
        matrix,
    }
}

const CFG: AdamWConfig = AdamWConfig {
    lr: 0.1,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.01,
};

/// Both tensors start at 1.0 and see gradients 0.5, -0.25, 2.0.
///
/// Step 1 by hand (decayed tensor): p = 1 * (1 - 0.1 * 0.01) = 0.999;
/// m = 0.05, v = 0.00025; bias corrections 0.1 and 0.001, so
/// m̂ = 0.5, sqrt(v̂) = 0.5; p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899000002.
/// Step 2: p = 0.899000002 * 0.999 = 0.898101001998; m = 0.02, v = 0.00031225;
/// m̂ = 0.02 / 0.19, v̂ = 0.00031225 / 0.001999; p -= 0.1 m̂ / (sqrt(v̂) + 1e-8)
/// = 0.8714672987058463. Step 3 continues the same arithmetic.
#[test]
fn adamw_matches_hand_computed_torch_updates() {
    let specs = [spec("w", true), spec("b", false)];
    let mut opt = AdamW::<f64>::new(CFG, &specs, &DecayPolicy::default());
    let (mut w, mut b) = (vec![1.0], vec![1.0]);
    let decayed = [0.899000002, 0.8714672987058463, 0.8035310672284472];
    let plain = [0.900000002, 0.8733662987078463, 0.8063015345291531];
    for (step, g) in [0.5, -0.25, 2.0].into_iter().enumerate() {
        opt.step(&mut [&mut w, &mut b], &[&[g], &[g]]).unwrap();
        assert!(
            (w[0] - decayed[step]).abs() < 1e-15,
            "step {step}: {} vs {}",
            w[0],
            decayed[step]
        );
        assert!(
            (b[0] - plain[step]).abs() < 1e-15,
            "step {step}: {} vs {}",
            b[0],
            plain[step]
        );
    }
    assert_eq!(opt.steps(), 3);
}

#[test]
fn default_policy_decays_only_matrices_of_the_model() {
    let cfg = Mamba3Config {
        tie_embeddings: false,
        is_outproj_norm: true,
        rope_fraction: RopeFraction::Full,
        ..Mamba3Config::tiny()
    };
    let opt = AdamW::<f64>::new(
        AdamWConfig::default(),
        &params(&cfg),
        &DecayPolicy::default(),
    );
    let decayed: Vec<String> = param_specs(&cfg)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| opt.decays(*i))
        .map(|(_, s)| s.name)
        .collect();
    assert_eq!(
        decayed,
        [
            "backbone.embedding.weight",
            "backbone.layers.0.mixer.in_proj.weight",
            "backbone.layers.0.mixer.out_proj.weight",
            "backbone.layers.1.mixer.in_proj.weight",
            "backbone.layers.1.mixer.out_proj.weight",
            "lm_head.weight",
        ]
    );
    let names = DecayPolicy::Names(["backbone.norm_f.weight".to_owned()].into());
    let only = AdamW::<f64>::new(AdamWConfig::default(), &params(&cfg), &names);
    let n = param_specs(&cfg).len();
    assert!(only.decays(n - 2) && (0..n).filter(|&i| only.decays(i)).count() == 1);
    let all = AdamW::<f64>::new(AdamWConfig::default(), &params(&cfg), &DecayPolicy::All);
    assert!((0..n).all(|i| all.decays(i)));
}

#[test]
fn step_on_model_weights_and_size_errors() {
    let cfg = Mamba3Config::tiny();
    let mut w = Weights::<f32>::init(&cfg, 1).unwrap();
    let before = w.clone();
    let mut g = Weights::<f32>::zeros(&cfg);
    g.norm_f[0] = 1.0;
    let mut opt = AdamW::<f32>::new(AdamWConfig::default(), &params(&cfg), &DecayPolicy::Nothing);
    opt.step(&mut w.tensors_mut(), &g.tensors()).unwrap();
    // Only the entry with a gradient moves, by lr (m̂ / sqrt(v̂) = 1).
    assert!((w.norm_f[0] - (before.norm_f[0] - 1e-3)).abs() < 1e-6);
    assert_eq!(w.embedding, before.embedding);

    let mut short = vec![0.0f32; 3];
    let err = opt.step(&mut [&mut short], &[&[0.0; 3]]).unwrap_err();
    assert!(matches!(err, OptimError::TensorCount { .. }), "{err}");
    let specs = [spec("x", false)];
    let mut small = AdamW::<f64>::new(CFG, &specs, &DecayPolicy::All);
    let mut p = vec![0.0; 2];
    let err = small.step(&mut [&mut p], &[&[0.0, 0.0]]).unwrap_err();
    assert!(err.to_string().contains("`x`"), "{err}");
    assert_eq!(small.steps(), 0);
}

#[test]
fn gradient_clipping_follows_torch() {
    let (mut a, mut b) = (vec![3.0f64], vec![4.0f64]);
    let norm = clip_grad_norm(&mut [&mut a, &mut b], 1.0);
    assert!((norm - 5.0).abs() < 1e-15);
    let coef = 1.0 / (5.0 + 1e-6);
    assert!((a[0] - 3.0 * coef).abs() < 1e-15 && (b[0] - 4.0 * coef).abs() < 1e-15);
    let norm = clip_grad_norm(&mut [&mut a, &mut b], 10.0);
    assert!(norm < 1.0 && (a[0] - 3.0 * coef).abs() < 1e-15);
}
