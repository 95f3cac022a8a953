//! Checkpoints in the official layout: round trips in every precision,
//! `config.json` fields, and one clear error per kind of bad input.

mod cpu_common;

use std::path::Path;

use cpu_common::{random_tokens, tiny};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use stepgraph::mamba3::checkpoint::{
    self, CheckpointError, config_from_json_str, config_to_json, write_tensors,
};
use stepgraph::mamba3::cpu::{ScanMode, Weights, forward, param_specs};
use stepgraph::mamba3::{AActivation, ConfigError, Mamba3Config, RopeAngles, RopeFraction};

fn named(cfg: &Mamba3Config, w: &Weights<f64>) -> Vec<(String, Vec<usize>, Vec<f64>)> {
    w.named(cfg)
        .into_iter()
        .map(|(s, d)| (s.name, s.shape, d.to_vec()))
        .collect()
}

/// Writes `config.json` for `cfg` and the given tensors as `model.safetensors`.
fn write_dir(dir: &Path, cfg: &Mamba3Config, tensors: &[(String, Vec<usize>, Vec<f64>)]) {
    std::fs::create_dir_all(dir).unwrap();
    let json = config_to_json(cfg).unwrap();
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let refs: Vec<(String, Vec<usize>, &[f64])> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_slice()))
        .collect();
    write_tensors(&dir.join("model.safetensors"), &refs).unwrap();
}

#[test]
fn round_trip_in_f64_and_f32_keeps_weights_and_loss() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, cfg) in [
        tiny(RopeFraction::Half, 1, false, true),
        tiny(RopeFraction::Full, 2, true, false),
    ]
    .into_iter()
    .enumerate()
    {
        let w = Weights::<f64>::init(&cfg, 3).unwrap();
        let dir = tmp.path().join(format!("f64-{i}"));
        checkpoint::save(&dir, &cfg, &w).unwrap();
        let (cfg2, w2) = checkpoint::load::<f64>(&dir).unwrap();
        assert_eq!(cfg2, cfg);
        assert_eq!(w2, w);
        let tokens = random_tokens(&cfg, 2, 5, 1);
        let a = forward(&cfg, &w, &tokens, None, ScanMode::Chunked)
            .unwrap()
            .loss;
        let b = forward(&cfg2, &w2, &tokens, None, ScanMode::Chunked)
            .unwrap()
            .loss;
        assert_eq!(a.to_bits(), b.to_bits());
        // An f64 checkpoint read as f32 rounds once.
        let (_, w32) = checkpoint::load::<f32>(&dir).unwrap();
        assert_eq!(w32, w.cast::<f32>());

        let w32 = Weights::<f32>::init(&cfg, 4).unwrap();
        let dir = tmp.path().join(format!("f32-{i}"));
        checkpoint::save(&dir, &cfg, &w32).unwrap();
        let (_, back) = checkpoint::load::<f64>(&dir).unwrap();
        assert_eq!(back, w32.cast::<f64>());
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert!(st.iter().all(|(_, t)| t.dtype() == Dtype::F32));
        // Official names and shapes, lm_head only when untied.
        let mut names: Vec<&str> = st.names();
        names.sort_unstable();
        let mut expected: Vec<String> = param_specs(&cfg).into_iter().map(|s| s.name).collect();
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(names.contains(&"lm_head.weight"), !cfg.tie_embeddings);
    }
}

#[test]
fn bf16_and_f16_tensors_load() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(RopeFraction::Half, 1, false, true);
    let w = Weights::<f64>::init(&cfg, 5).unwrap();
    for (dtype, width) in [(Dtype::BF16, 2), (Dtype::F16, 2)] {
        let dir = tmp.path().join(format!("{dtype:?}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            config_to_json(&cfg).unwrap().to_string(),
        )
        .unwrap();
        let mut rounded = Vec::new();
        let buffers: Vec<(String, Vec<usize>, Vec<u8>)> = named(&cfg, &w)
            .into_iter()
            .map(|(n, s, d)| {
                let mut bytes = Vec::with_capacity(d.len() * width);
                let mut r = Vec::new();
                for v in d {
                    if dtype == Dtype::BF16 {
                        let h = half::bf16::from_f64(v);
                        bytes.extend_from_slice(&h.to_le_bytes());
                        r.push(h.to_f64());
                    } else {
                        let h = half::f16::from_f64(v);
                        bytes.extend_from_slice(&h.to_le_bytes());
                        r.push(h.to_f64());
                    }
                }
                rounded.push(r);
                (n, s, bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = buffers
            .iter()
            .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        std::fs::write(
            dir.join("model.safetensors"),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        let (_, loaded) = checkpoint::load::<f64>(&dir).unwrap();
        let got: Vec<Vec<f64>> = loaded.tensors().into_iter().map(<[f64]>::to_vec).collect();
        assert_eq!(got, rounded, "{dtype:?}");
    }
}

#[test]
fn config_json_uses_official_fields() {
    let cfg = tiny(RopeFraction::Full, 2, true, false);
    let json = config_to_json(&cfg).unwrap();
    let top: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for field in [
        "d_model",
        "d_intermediate",
        "n_layer",
        "vocab_size",
        "ssm_cfg",
        "attn_layer_idx",
        "attn_cfg",
        "rms_norm",
        "residual_in_fp32",
        "fused_add_norm",
        "pad_vocab_size_multiple",
        "tie_embeddings",
    ] {
        assert!(top.contains(&field), "missing {field}");
    }
    assert_eq!(json["ssm_cfg"]["layer"], "Mamba3");
    assert_eq!(json["ssm_cfg"]["A_floor"], 1e-4);
    assert_eq!(json["ssm_cfg"]["rope_fraction"], 1.0);
    assert_eq!(config_from_json_str(&json.to_string()).unwrap(), cfg);
    // Omitted fields take the official defaults.
    let minimal = r#"{"d_model": 16, "n_layer": 1, "vocab_size": 10,
        "ssm_cfg": {"layer": "Mamba3", "d_state": 8, "headdim": 8, "expand": 2.0}}"#;
    let c = config_from_json_str(minimal).unwrap();
    assert!(
        c.tie_embeddings
            && c.pad_vocab_size_multiple == 8
            && c.chunk_size == 64
            && c.a_floor == 1e-4
            && c.a_activation == AActivation::HeavyTail
    );
    // The official heavy-tail map writes no key (the official module has
    // none); the paper's softplus writes one and reads back.
    assert!(json["ssm_cfg"].get("A_activation").is_none());
    let soft = Mamba3Config {
        a_activation: AActivation::Softplus,
        ..cfg
    };
    let sj = config_to_json(&soft).unwrap();
    assert_eq!(sj["ssm_cfg"]["A_activation"], "softplus");
    assert_eq!(config_from_json_str(&sj.to_string()).unwrap(), soft);
    // Likewise the standard-RoPE ablation's fixed angles.
    assert!(json["ssm_cfg"].get("rope_angles").is_none());
    let fixed = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..soft
    };
    let fj = config_to_json(&fixed).unwrap();
    assert_eq!(fj["ssm_cfg"]["rope_angles"], "fixed");
    assert_eq!(config_from_json_str(&fj.to_string()).unwrap(), fixed);
}

/// An edit applied to a valid `config.json` value.
type Edit = dyn Fn(&mut serde_json::Value);

#[test]
fn bad_config_json_names_the_field() {
    let base = config_to_json(&Mamba3Config::tiny()).unwrap();
    let cases: [(&Edit, &str); 11] = [
        (&|v| v["bogus"] = 1.into(), "bogus"),
        (&|v| v["ssm_cfg"]["bogus"] = 1.into(), "ssm_cfg.bogus"),
        (
            &|v| v["ssm_cfg"]["layer"] = "Mamba2".into(),
            "ssm_cfg.layer",
        ),
        (&|v| v["d_intermediate"] = 64.into(), "d_intermediate"),
        (&|v| v["ssm_cfg"]["headdim"] = 3.into(), "ssm_cfg.headdim"),
        (&|v| v["ssm_cfg"]["ngroups"] = 3.into(), "ssm_cfg.ngroups"),
        (
            &|v| v["ssm_cfg"]["rope_fraction"] = 0.25.into(),
            "ssm_cfg.rope_fraction",
        ),
        (
            &|v| v["ssm_cfg"]["is_mimo"] = true.into(),
            "ssm_cfg.is_mimo",
        ),
        (&|v| v["d_model"] = "wide".into(), "d_model"),
        (
            &|v| v["ssm_cfg"]["A_activation"] = "relu".into(),
            "ssm_cfg.A_activation",
        ),
        (
            &|v| v["ssm_cfg"]["rope_angles"] = "random".into(),
            "ssm_cfg.rope_angles",
        ),
    ];
    for (edit, field) in cases {
        let mut v = base.clone();
        edit(&mut v);
        let err = config_from_json_str(&v.to_string()).unwrap_err();
        assert!(
            err.to_string().contains(&format!("`{field}`")),
            "{field}: {err}"
        );
    }
    assert!(matches!(
        config_from_json_str("{"),
        Err(ConfigError::Syntax { .. })
    ));
}

#[test]
fn bad_tensors_name_the_tensor_and_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(RopeFraction::Half, 1, true, true);
    let w = Weights::<f64>::init(&cfg, 6).unwrap();
    let good = named(&cfg, &w);
    let load = |name: &str, tensors: Vec<(String, Vec<usize>, Vec<f64>)>| {
        let dir = tmp.path().join(name);
        write_dir(&dir, &cfg, &tensors);
        checkpoint::load::<f64>(&dir).unwrap_err()
    };

    let missing: Vec<_> = good
        .iter()
        .filter(|t| t.0 != "backbone.layers.1.mixer.D")
        .cloned()
        .collect();
    let err = load("missing", missing);
    assert!(matches!(err, CheckpointError::Missing { .. }));
    assert_eq!(
        err.to_string(),
        "tensor `backbone.layers.1.mixer.D` is missing (expected shape [4])"
    );

    let mut extra = good.clone();
    extra.push((
        "backbone.layers.0.mixer.A_log".into(),
        vec![4],
        vec![0.0; 4],
    ));
    let err = load("extra", extra);
    assert!(
        err.to_string().contains("`backbone.layers.0.mixer.A_log`")
            && err.to_string().contains("[4]"),
        "{err}"
    );

    let mut reshaped = good.clone();
    let b = reshaped
        .iter_mut()
        .find(|t| t.0 == "backbone.layers.0.mixer.B_bias")
        .unwrap();
    b.1 = vec![4, 8];
    let err = load("reshaped", reshaped);
    assert_eq!(
        err.to_string(),
        "tensor `backbone.layers.0.mixer.B_bias`: expected shape [4, 1, 8], found shape [4, 8]"
    );

    // A tied checkpoint may carry lm_head.weight only as a copy of the embedding.
    let mut head = good.clone();
    head.push((
        "lm_head.weight".into(),
        good[0].1.clone(),
        good[0].2.clone(),
    ));
    let dir = tmp.path().join("tied-copy");
    write_dir(&dir, &cfg, &head);
    assert_eq!(checkpoint::load::<f64>(&dir).unwrap().1, w);
    head.last_mut().unwrap().2[0] += 1.0;
    assert!(matches!(
        load("tied-diff", head),
        CheckpointError::TiedHeadDiffers
    ));

    // Wrongly typed: an integer tensor where a float parameter belongs.
    let dir = tmp.path().join("typed");
    write_dir(&dir, &cfg, &good);
    let buffers: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = good
        .iter()
        .map(|(n, s, d)| {
            if n == "backbone.norm_f.weight" {
                let bytes = d.iter().flat_map(|_| 1i64.to_le_bytes()).collect();
                (n.clone(), s.clone(), Dtype::I64, bytes)
            } else {
                (
                    n.clone(),
                    s.clone(),
                    Dtype::F64,
                    d.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )
            }
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(n, s, t, b)| (n.clone(), TensorView::new(*t, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let err = checkpoint::load::<f64>(&dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `backbone.norm_f.weight` (shape [8]) has dtype I64; expected F32, F64, BF16 or F16"
    );

    // Not a checkpoint at all.
    let err = checkpoint::load::<f64>(&tmp.path().join("nowhere")).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
}
