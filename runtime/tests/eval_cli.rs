//! The built `stepgraph` binary: `init` writes a checkpoint, `eval` reads it
//! back and reports the same loss (and gradients) as the library; bad input
//! gives one error line and exit code 1, a bad flag a usage error (exit 2).

use std::path::Path;
use std::process::{Command, Output};

use safetensors::SafeTensors;
use stepgraph::mamba3::checkpoint::{self, float_values, write_int_tensor};
use stepgraph::mamba3::cpu::{ScanMode, Tokens, backward, forward};

fn stepgraph(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepgraph"))
        .args(args)
        .output()
        .expect("run stepgraph")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn init(dir: &Path, extra: &[&str]) {
    let mut args = vec![
        "init",
        "--out",
        path(dir),
        "--d-model",
        "16",
        "--n-layer",
        "2",
        "--vocab-size",
        "37",
        "--d-state",
        "8",
        "--headdim",
        "8",
        "--seed",
        "7",
    ];
    args.extend_from_slice(extra);
    let out = stepgraph(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_one_line_failure(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

#[test]
fn eval_runs_on_a_checkpoint_it_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    init(&ck, &["--outproj-norm", "--untied"]);
    let (rows, cols) = (3, 11);
    let data: Vec<i64> = (0..rows * cols)
        .map(|i| i64::try_from(i * 7 % 37).unwrap())
        .collect();
    let tok = tmp.path().join("tokens.safetensors");
    write_int_tensor(&tok, "tokens", &[rows, cols], &data).unwrap();
    let grads_path = tmp.path().join("grads.safetensors");

    let out = stepgraph(&[
        "eval",
        "--checkpoint",
        path(&ck),
        "--tokens",
        path(&tok),
        "--grads-out",
        path(&grads_path),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1);
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["tokens"], rows * (cols - 1));

    // Same numbers from the library.
    let (cfg, w) = checkpoint::load::<f64>(&ck).unwrap();
    let tokens = Tokens::from_rows(&data, rows, cols, cfg.vocab_size).unwrap();
    let fwd = forward(&cfg, &w, &tokens, None, ScanMode::Chunked).unwrap();
    // Printed with shortest round-trip digits; serde_json's default parser may
    // land one ulp away, so compare to 1e-15 rather than bit for bit.
    let printed = json["loss"].as_f64().unwrap();
    assert!(
        (printed - fwd.loss).abs() <= 1e-15 * fwd.loss,
        "{printed} vs {}",
        fwd.loss
    );
    let grads = backward(&cfg, &w, &fwd);
    let bytes = std::fs::read(&grads_path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), grads.tensors().len());
    for (spec, g) in grads.named(&cfg) {
        let view = st.tensor(&spec.name).unwrap();
        assert_eq!(view.shape(), spec.shape.as_slice(), "{}", spec.name);
        assert_eq!(
            float_values::<f64>(&spec.name, &view).unwrap(),
            g,
            "{}",
            spec.name
        );
    }

    // f32 agrees with the f64 reference to f32 accuracy.
    let out = stepgraph(&[
        "eval",
        "--checkpoint",
        path(&ck),
        "--tokens",
        path(&tok),
        "--precision",
        "f32",
    ]);
    assert!(out.status.success());
    let json32: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rel = (json32["loss"].as_f64().unwrap() - fwd.loss).abs() / fwd.loss;
    assert!(rel < 1e-5, "f32 vs f64 loss: relative difference {rel:e}");
}

#[test]
fn bad_input_gives_one_error_line_and_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    init(&ck, &[]);
    let eval =
        |tokens: &Path| stepgraph(&["eval", "--checkpoint", path(&ck), "--tokens", path(tokens)]);
    let write = |name: &str, shape: &[usize], data: &[i64]| {
        let p = tmp.path().join(name);
        write_int_tensor(&p, "tokens", shape, data).unwrap();
        p
    };

    let mut data = vec![1i64; 2 * 6];
    data[6 + 4] = 37;
    let out = eval(&write("oov.safetensors", &[2, 6], &data));
    assert_one_line_failure(&out, "id 37 at batch row 1, position 4");
    data[6 + 4] = -2;
    assert_one_line_failure(
        &eval(&write("neg.safetensors", &[2, 6], &data)),
        "id -2 at batch row 1, position 4",
    );
    assert_one_line_failure(
        &eval(&write("b0.safetensors", &[0, 6], &[])),
        "batch size B is 0",
    );
    assert_one_line_failure(
        &eval(&write("t0.safetensors", &[2, 1], &[1, 2])),
        "sequence length T is 0",
    );
    assert_one_line_failure(&eval(&write("rank.safetensors", &[12], &[1; 12])), "2-D");
    let other = tmp.path().join("other.safetensors");
    write_int_tensor(&other, "ids", &[2, 6], &[1; 12]).unwrap();
    assert_one_line_failure(&eval(&other), "`tokens`");
    assert_one_line_failure(
        &eval(&tmp.path().join("absent.safetensors")),
        "absent.safetensors",
    );
    let out = stepgraph(&[
        "eval",
        "--checkpoint",
        path(&tmp.path().join("none")),
        "--tokens",
        path(&other),
    ]);
    assert_one_line_failure(&out, "config.json");
}

/// `init` of a one-layer model into `dir/bad` with one bad flag (and its
/// value) added: a usage error, exit 2, that writes nothing; its stderr.
fn refused_init(dir: &Path, bad: &[&str]) -> String {
    let out_dir = dir.join("bad");
    let mut args = vec![
        "init",
        "--out",
        path(&out_dir),
        "--d-model",
        "16",
        "--n-layer",
        "1",
        "--vocab-size",
        "9",
    ];
    args.extend_from_slice(bad);
    let out = stepgraph(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!out_dir.exists());
    err
}

#[test]
fn init_flags_that_describe_no_model_are_a_usage_error_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let err = refused_init(tmp.path(), &["--headdim", "5"]);
    assert!(err.starts_with("error: --headdim: must divide"), "{err}");
}

/// `init` takes the training recipes' mixer options and writes, for a seed,
/// exactly the weights and model a `train` run with the same flags starts
/// from (the library's `model_config` and `Weights::init`), so a run's first
/// weights can be made without training a step.
#[test]
fn init_writes_the_first_weights_of_a_train_run_with_the_same_flags() {
    use stepgraph::mamba3::cpu::Weights;
    use stepgraph::mamba3::{AActivation, RopeAngles};
    use stepgraph::train::config::model_config;
    use stepgraph::train::{DtInit, ModelSize, Rotation};

    let tmp = tempfile::tempdir().unwrap();
    for (rotation, angles) in [("data", Rotation::Data), ("fixed", Rotation::Fixed)] {
        let dir = tmp.path().join(rotation);
        init(
            &dir,
            &[
                "--dt-init",
                "0.01,0.1",
                "--a-activation",
                "softplus",
                "--rotation",
                rotation,
            ],
        );
        let (cfg, got) = checkpoint::load::<f32>(&dir).unwrap();
        let size = ModelSize {
            d_model: 16,
            n_layer: 2,
            d_state: 8,
            headdim: 8,
            expand: 2,
            full_rope: false,
            rotation: angles,
            a_activation: AActivation::Softplus,
            outproj_norm: false,
            chunk_size: 64,
            dt_init: DtInit {
                min: 0.01,
                max: 0.1,
            },
        };
        let want_cfg = model_config(size, 37).unwrap();
        assert_eq!(cfg, want_cfg, "{rotation}");
        assert_eq!((cfg.dt_min, cfg.dt_max), (0.01, 0.1));
        assert_eq!(cfg.a_activation, AActivation::Softplus);
        let fixed = rotation == "fixed";
        assert_eq!(cfg.rope_angles == RopeAngles::Fixed, fixed, "{rotation}");
        assert!(
            got == Weights::<f32>::init(&want_cfg, 7).unwrap(),
            "{rotation}"
        );
    }
    // The defaults draw another dt range: the flags are not ignored.
    let plain = tmp.path().join("plain");
    init(&plain, &[]);
    let (_, a) = checkpoint::load::<f32>(&plain).unwrap();
    let (_, b) = checkpoint::load::<f32>(&tmp.path().join("data")).unwrap();
    assert!(a != b);
    let err = refused_init(tmp.path(), &["--dt-init", "0.1,0.01"]);
    assert!(err.contains("--dt-init"), "{err}");
}
