//! The two scan forms agree, and carrying state across windows equals one
//! forward over the concatenated windows.

mod cpu_common;

use cpu_common::{max_rel_diff, random_token_data, random_weights, tiny};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::mamba3::cpu::{
    HeadCarry, HeadInputs, ModelState, ScanMode, Tokens, backward, chunked_backward,
    chunked_forward, forward, recurrent_backward, recurrent_forward, try_backward,
};
use stepgraph::mamba3::{Mamba3Config, RopeFraction};

fn flat_state(s: &ModelState<f64>) -> Vec<f64> {
    s.layers
        .iter()
        .flat_map(|l| {
            l.ssm
                .iter()
                .chain(&l.k)
                .chain(&l.v)
                .chain(&l.angle)
                .copied()
        })
        .collect()
}

fn configs() -> Vec<Mamba3Config> {
    vec![
        tiny(RopeFraction::Half, 1, false, true),
        tiny(RopeFraction::Full, 2, true, false),
    ]
}

#[test]
fn recurrent_and_chunked_forward_agree_on_the_model() {
    for cfg in configs() {
        let w = random_weights(&cfg, 5);
        let warm = Tokens::from_rows(
            &random_token_data(2, 9, cfg.vocab_size, 6),
            2,
            9,
            cfg.vocab_size,
        )
        .unwrap();
        let carried = forward(&cfg, &w, &warm, None, ScanMode::Recurrent)
            .unwrap()
            .final_state;
        let tokens = Tokens::from_rows(
            &random_token_data(2, 131, cfg.vocab_size, 7),
            2,
            131,
            cfg.vocab_size,
        )
        .unwrap();
        for state in [None, Some(&carried)] {
            let rec = forward(&cfg, &w, &tokens, state, ScanMode::Recurrent).unwrap();
            let chk = forward(&cfg, &w, &tokens, state, ScanMode::Chunked).unwrap();
            let d_logits = max_rel_diff(&chk.logits, &rec.logits);
            let d_state =
                max_rel_diff(&flat_state(&chk.final_state), &flat_state(&rec.final_state));
            let d_loss = (chk.loss - rec.loss).abs() / rec.loss;
            let (gr, gc) = (
                backward(&cfg, &w, &rec),
                try_backward(&cfg, &w, &chk).unwrap(),
            );
            let d_grads = gr
                .tensors()
                .iter()
                .zip(gc.tensors())
                .map(|(a, b)| max_rel_diff(b, a))
                .fold(0.0f64, f64::max);
            eprintln!("recurrent vs chunked gradients (worst tensor): {d_grads:e}");
            assert!(d_grads < 1e-12);
            eprintln!(
                "recurrent vs chunked: logits {d_logits:e}, final state {d_state:e}, loss {d_loss:e}"
            );
            assert!(d_logits < 1e-12 && d_state < 1e-12 && d_loss < 1e-13);
        }
    }
}

/// Random per-head scan inputs of length `len` (keys/queries of unit scale,
/// decays in the range the model produces).
fn head_data(len: usize, p: usize, n: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uni = |k: usize, lo: f64, hi: f64| -> Vec<f64> {
        (0..k).map(|_| rng.random_range(lo..hi)).collect()
    };
    vec![
        uni(len * n, -1.0, 1.0), // q
        uni(len * n, -1.0, 1.0), // k
        uni(len * p, -1.0, 1.0), // v
        uni(len, -0.5, -0.001),  // adt
        uni(len, 0.001, 0.5),    // dt
        uni(len, 0.0, 1.0),      // lam
        uni(p * n, -1.0, 1.0),   // carried S
        uni(n, -1.0, 1.0),       // carried k
        uni(p, -1.0, 1.0),       // carried v
    ]
}

#[test]
fn recurrent_and_chunked_scan_agree_per_head() {
    let (p, n) = (4, 6);
    for (len, chunk) in [(130, 64), (64, 64), (1, 64), (17, 1), (23, 5)] {
        let d = head_data(len, p, n, 42);
        // qk_raw is the unrotated dot; with no rotation in this synthetic head it
        // equals the rotated one.
        let qk: Vec<f64> = (0..len)
            .map(|t| (0..n).map(|j| d[0][t * n + j] * d[1][t * n + j]).sum())
            .collect();
        let x = HeadInputs {
            q: &d[0],
            k: &d[1],
            v: &d[2],
            adt: &d[3],
            dt: &d[4],
            lam: &d[5],
            qk_raw: &qk,
            resets: &[],
            d: 0.7,
            p,
            n,
        };
        let carry = HeadCarry {
            ssm: &d[6],
            k: &d[7],
            v: &d[8],
        };
        let rec = recurrent_forward(&x, &carry, chunk).unwrap();
        let chk = chunked_forward(&x, &carry, chunk).unwrap();
        let dy = max_rel_diff(&chk.y, &rec.y);
        let ds = max_rel_diff(&chk.final_state, &rec.final_state);
        eprintln!("T {len}, chunk {chunk}: y {dy:e}, final state {ds:e}");
        assert!(
            dy < 1e-12 && ds < 1e-12,
            "T {len}, chunk {chunk}: y {dy:e}, state {ds:e}"
        );
        // The chunked form's per-key scale and the state it passes between chunks.
        assert_eq!(chk.chunk_states.len(), len.div_ceil(chunk) * p * n);
        let last = len - 1;
        assert!((chk.scale[last] - chk.gamma[last]).abs() < 1e-15);
    }
}

#[test]
fn carried_state_equals_concatenation() {
    for cfg in configs() {
        let w = random_weights(&cfg, 9);
        let (rows, len) = (2, 130);
        let data = random_token_data(rows, len + 1, cfg.vocab_size, 10);
        let whole = Tokens::from_rows(&data, rows, len + 1, cfg.vocab_size).unwrap();
        let window = |c0: usize, c1: usize| {
            let cols = c1 - c0 + 1;
            let sub: Vec<i64> = (0..rows)
                .flat_map(|r| data[r * (len + 1) + c0..=r * (len + 1) + c1].to_vec())
                .collect();
            Tokens::from_rows(&sub, rows, cols, cfg.vocab_size).unwrap()
        };
        for mode in [ScanMode::Recurrent, ScanMode::Chunked] {
            let full = forward(&cfg, &w, &whole, None, mode).unwrap();
            // Three windows: positions [0, 50), [50, 117), [117, 130).
            let cuts = [0, 50, 117, 130];
            let mut state: Option<ModelState<f64>> = None;
            let mut logits = vec![Vec::new(); rows];
            let vocab = cfg.padded_vocab_size();
            for pair in cuts.windows(2) {
                let out =
                    forward(&cfg, &w, &window(pair[0], pair[1]), state.as_ref(), mode).unwrap();
                let wl = pair[1] - pair[0];
                for (r, l) in logits.iter_mut().enumerate() {
                    l.extend_from_slice(&out.logits[r * wl * vocab..(r + 1) * wl * vocab]);
                }
                state = Some(out.final_state);
            }
            let joined: Vec<f64> = logits.concat();
            let d_logits = max_rel_diff(&joined, &full.logits);
            let d_state = max_rel_diff(
                &flat_state(state.as_ref().unwrap()),
                &flat_state(&full.final_state),
            );
            eprintln!(
                "{mode:?}: carried vs concatenated logits {d_logits:e}, final state {d_state:e}"
            );
            assert!(d_logits < 1e-12 && d_state < 1e-12);
        }
    }
}

#[test]
fn inconsistent_scan_inputs_are_errors() {
    let (p, n, len) = (2, 4, 3);
    let d = head_data(len, p, n, 1);
    let qk = vec![0.0; len];
    let short = &d[4][..len - 1];
    let x = HeadInputs {
        q: &d[0],
        k: &d[1],
        v: &d[2],
        adt: &d[3],
        dt: short,
        lam: &d[5],
        qk_raw: &qk,
        resets: &[],
        d: 1.0,
        p,
        n,
    };
    let carry = HeadCarry {
        ssm: &d[6],
        k: &d[7],
        v: &d[8],
    };
    let err = recurrent_forward(&x, &carry, 64).unwrap_err();
    assert_eq!(err.to_string(), "scan input `dt` has 2 values, expected 3");
    assert!(chunked_forward(&x, &carry, 64).is_err());
}

#[test]
fn chunked_backward_equals_recurrent_backward_per_head() {
    let (p, n) = (4, 6);
    for (len, chunk) in [(130, 64), (64, 64), (1, 64), (17, 1), (23, 5)] {
        let d = head_data(len, p, n, 77);
        let qk: Vec<f64> = (0..len)
            .map(|t| (0..n).map(|j| d[0][t * n + j] * d[1][t * n + j]).sum())
            .collect();
        let x = HeadInputs {
            q: &d[0],
            k: &d[1],
            v: &d[2],
            adt: &d[3],
            dt: &d[4],
            lam: &d[5],
            qk_raw: &qk,
            resets: &[],
            d: 0.7,
            p,
            n,
        };
        let carry = HeadCarry {
            ssm: &d[6],
            k: &d[7],
            v: &d[8],
        };
        let dy: Vec<f64> = head_data(len, p, n, 78)[2].clone();
        let rec = recurrent_forward(&x, &carry, chunk).unwrap();
        let rg = recurrent_backward(&x, &carry, &rec, &dy, chunk).unwrap();
        let chk = chunked_forward(&x, &carry, chunk).unwrap();
        let cg = chunked_backward(&x, &carry, &chk, &dy, chunk)
            .unwrap()
            .totals;
        let diffs = [
            ("dq", max_rel_diff(&cg.dq, &rg.dq)),
            ("dk", max_rel_diff(&cg.dk, &rg.dk)),
            ("dv", max_rel_diff(&cg.dv, &rg.dv)),
            ("dadt", max_rel_diff(&cg.dadt, &rg.dadt)),
            ("ddt", max_rel_diff(&cg.ddt, &rg.ddt)),
            ("dlam", max_rel_diff(&cg.dlam, &rg.dlam)),
            ("dD", max_rel_diff(&[cg.dd], &[rg.dd])),
        ];
        eprintln!("T {len}, chunk {chunk}: {diffs:?}");
        for (name, diff) in diffs {
            assert!(
                diff < 1e-12,
                "T {len}, chunk {chunk}: {name} differs by {diff:e}"
            );
        }
    }
}
