//! Sequences packed in one row, a reset at each one's first token, compute
//! what they compute in rows of their own: every prediction, and the
//! gradient of a loss over those predictions (the CPU reference in f64).
//! This is the meaning the packed GPU step is checked against.

mod cpu_common;

use cpu_common::{max_rel_diff, random_token_data, random_weights, tiny};
use stepgraph::mamba3::cpu::{Grads, ModelError, ScanMode, Tokens, Weights, backward, forward};
use stepgraph::mamba3::{AActivation, Mamba3Config, RopeAngles, RopeFraction};

const MASKED: f64 = -1e30;

/// One sequence's tokens (`len + 1` ids, so `len` predictions).
fn sequence(cfg: &Mamba3Config, len: usize, seed: u64) -> Vec<i64> {
    random_token_data(1, len + 1, cfg.vocab_size, seed)
}

/// Logits and the gradient of the summed cross-entropy over the predictions
/// `scored` marks (`[B, T]`), the others masked so that they contribute
/// exactly nothing (as the training engines mask them).
fn run(
    cfg: &Mamba3Config,
    w: &Weights<f64>,
    tokens: &Tokens,
    scored: &[bool],
) -> (Vec<f64>, Grads<f64>) {
    let mut fwd = forward(cfg, w, tokens, None, ScanMode::Recurrent).expect("forward");
    let logits = fwd.logits.clone();
    let vocab = cfg.padded_vocab_size();
    for ((row, &tgt), &s) in fwd
        .logits
        .chunks_mut(vocab)
        .zip(tokens.targets())
        .zip(scored)
    {
        if !s {
            row.fill(MASKED);
            row[tgt] = 0.0;
        }
    }
    // `backward` differentiates the mean over every prediction.
    let count = f64::from(u32::try_from(tokens.count()).expect("small batch"));
    let mut g = backward(cfg, w, &fwd);
    for t in g.tensors_mut() {
        t.iter_mut().for_each(|v| *v *= count);
    }
    (logits, g)
}

/// Packs `rows` of sequence lengths into one batch (each row padded with
/// id 0 to the longest, unscored), runs it, and checks every sequence's
/// logits and the total gradient against each sequence run alone.
fn check(cfg: &Mamba3Config, rows: &[&[usize]], seed: u64) {
    let w = random_weights(cfg, seed);
    let vocab = cfg.padded_vocab_size();
    let width = rows
        .iter()
        .map(|r| r.iter().map(|l| l + 1).sum::<usize>())
        .max()
        .expect("rows");
    let t = width - 1;
    let (mut ids, mut resets, mut scored) = (Vec::new(), Vec::new(), Vec::new());
    let mut alone: Vec<(Vec<i64>, usize, usize)> = Vec::new(); // (ids, row, offset)
    let mut s = seed;
    for (r, lens) in rows.iter().enumerate() {
        let mut row = Vec::new();
        let (mut flags, mut marks) = (vec![false; t], vec![false; t]);
        for &len in *lens {
            s += 1;
            let seq = sequence(cfg, len, s);
            let at = row.len();
            flags[at] = true;
            marks[at..at + len].iter_mut().for_each(|m| *m = true);
            row.extend_from_slice(&seq);
            alone.push((seq, r, at));
        }
        row.resize(width, 0);
        ids.extend(row);
        resets.extend(flags);
        scored.extend(marks);
    }
    let packed = Tokens::from_rows(&ids, rows.len(), width, cfg.vocab_size)
        .and_then(|tk| tk.with_resets(resets))
        .expect("packed tokens");
    let (logits, grads) = run(cfg, &w, &packed, &scored);

    let mut total: Option<Grads<f64>> = None;
    for (seq, r, at) in &alone {
        let len = seq.len() - 1;
        let tokens = Tokens::from_rows(seq, 1, len + 1, cfg.vocab_size).expect("tokens");
        let (own, g) = run(cfg, &w, &tokens, &vec![true; len]);
        let start = (r * t + at) * vocab;
        let diff = max_rel_diff(&logits[start..start + len * vocab], &own);
        assert!(diff < 1e-12, "row {r} at {at}: logits differ by {diff:e}");
        total = Some(match total {
            None => g,
            Some(mut sum) => {
                for (a, b) in sum.tensors_mut().into_iter().zip(g.tensors()) {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                }
                sum
            }
        });
    }
    let total = total.expect("sequences");
    for (i, (a, b)) in grads.tensors().into_iter().zip(total.tensors()).enumerate() {
        let diff = max_rel_diff(a, b);
        assert!(
            diff < 1e-10,
            "gradient tensor {i}: packed differs by {diff:e}"
        );
    }
}

#[test]
fn packed_rows_compute_what_separate_rows_compute() {
    let cfg = tiny(RopeFraction::Half, 1, false, false);
    check(&cfg, &[&[7, 12, 3], &[5, 1, 9, 2]], 11);
}

#[test]
fn packed_rows_with_softplus_a_outproj_norm_and_two_groups() {
    let cfg = Mamba3Config {
        a_activation: AActivation::Softplus,
        ..tiny(RopeFraction::Full, 2, true, true)
    };
    check(&cfg, &[&[4, 4, 4, 4], &[15], &[1, 1, 13]], 23);
}

#[test]
fn packed_rows_with_fixed_rope() {
    let cfg = Mamba3Config {
        rope_angles: RopeAngles::Fixed,
        ..tiny(RopeFraction::Half, 1, false, false)
    };
    // Fixed angles follow the position in the row, not in the sequence;
    // the scan sees only differences of angles within a sequence.
    check(&cfg, &[&[6, 10], &[10, 6]], 5);
}

#[test]
fn resets_need_the_recurrent_scan_and_cover_every_input() {
    let cfg = tiny(RopeFraction::Half, 1, false, false);
    let w = random_weights(&cfg, 3);
    let ids = random_token_data(2, 9, cfg.vocab_size, 4);
    let tokens = Tokens::from_rows(&ids, 2, 9, cfg.vocab_size).expect("tokens");
    let short = tokens.clone().with_resets(vec![false; 15]).unwrap_err();
    assert_eq!(
        short.to_string(),
        "tokens: 15 reset flags for a batch of 16 input positions [B, T]"
    );
    let mut flags = vec![false; 16];
    flags[4] = true;
    flags[12] = true;
    let packed = tokens.with_resets(flags).expect("resets");
    let err = forward(&cfg, &w, &packed, None, ScanMode::Chunked).unwrap_err();
    assert!(
        matches!(err, ModelError::ResetsNeedRecurrentScan { count: 2 }),
        "{err}"
    );
    assert!(forward(&cfg, &w, &packed, None, ScanMode::Recurrent).is_ok());
}
