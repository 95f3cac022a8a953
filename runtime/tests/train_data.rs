//! Training data: task token formats, determinism, train/eval disjointness,
//! length generalization sets, saved positions, and token files.

use std::collections::HashSet;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use stepgraph::train::TrainError;
use stepgraph::train::data::tasks::is_eval_instance;
use stepgraph::train::data::{Batch, DataFormat, DataSpec, Dataset, Task};

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

#[test]
fn parity_format() {
    let mut r = rng(1);
    for n in [1, 2, 7, 40] {
        let ex = Task::Parity.generate(n, &mut r);
        assert_eq!(ex.tokens.len(), Task::Parity.width(n));
        assert!(ex.tokens[..n].iter().all(|&b| b < 2));
        assert_eq!(ex.tokens[n], 2, "`=` follows the bits");
        let xor = ex.tokens[..n].iter().fold(0, |a, &b| a ^ b);
        assert_eq!(ex.tokens[n + 1], xor);
        assert_eq!(ex.answers, vec![n], "scored: the prediction at `=`");
    }
}

#[test]
fn modarith_format_is_left_to_right_mod_5() {
    let mut r = rng(2);
    for n in [1, 2, 5, 30] {
        let ex = Task::Modarith.generate(n, &mut r);
        let t = &ex.tokens;
        assert_eq!(t.len(), 2 * n + 1);
        let mut acc = t[0];
        for i in 1..n {
            let (op, a) = (t[2 * i - 1], t[2 * i]);
            assert!((5..8).contains(&op) && a < 5);
            acc = match op {
                5 => (acc + a) % 5,
                6 => (acc + 5 - a) % 5,
                _ => (acc * a) % 5,
            };
        }
        assert_eq!(t[2 * n - 1], 8);
        assert_eq!(t[2 * n], acc);
        assert_eq!(ex.answers, vec![2 * n - 1]);
    }
}

#[test]
fn copy_format() {
    let mut r = rng(3);
    for n in [4, 10, 50] {
        let ex = Task::Copy.generate(n, &mut r);
        let t = &ex.tokens;
        assert_eq!(t.len(), n + 5);
        let data: Vec<u32> = t[..n].iter().copied().filter(|&x| x != 8).collect();
        assert_eq!(data.len(), 4, "four data tokens among blanks");
        assert_eq!(t[n], 9, "separator");
        assert_eq!(&t[n + 1..], data.as_slice(), "copied in order");
        assert_eq!(ex.answers, (n..n + 4).collect::<Vec<_>>());
    }
}

#[test]
fn mqar_format() {
    let mut r = rng(4);
    for n in [1, 5, 32] {
        let ex = Task::Mqar.generate(n, &mut r);
        let t = &ex.tokens;
        assert_eq!(t.len(), 4 * n);
        let pairs: Vec<(u32, u32)> = t[..2 * n].chunks(2).map(|c| (c[0], c[1])).collect();
        let keys: HashSet<u32> = pairs.iter().map(|p| p.0).collect();
        assert_eq!(keys.len(), n, "distinct keys");
        assert!(pairs.iter().all(|&(k, v)| k < 32 && (32..64).contains(&v)));
        for (i, &p) in ex.answers.iter().enumerate() {
            assert_eq!(p, 2 * n + 2 * i);
            let want = pairs.iter().find(|q| q.0 == t[p]).map(|q| q.1);
            assert_eq!(Some(t[p + 1]), want, "the answer is the key's value");
        }
    }
}

#[test]
fn batches_pad_and_mask_only_answers() {
    let mut r = rng(5);
    let exs = vec![
        Task::Parity.generate(2, &mut r),
        Task::Parity.generate(5, &mut r),
    ];
    let b = Batch::from_examples(&exs, Task::Parity.width(5), Task::Parity.pad());
    assert_eq!((b.rows, b.width), (2, 7));
    assert_eq!(&b.tokens[4..7], &[3, 3, 3], "row 0 right-padded");
    assert_eq!(b.scored_count(), 2);
    assert!(b.scored(2) && b.scored(6 + 5));
    assert!(!b.scored(0) && !b.scored(3));
}

#[test]
fn a_trimmed_batch_keeps_every_answer_and_drops_only_padding() {
    let mut r = rng(6);
    let exs: Vec<_> = [3, 17, 9]
        .iter()
        .map(|&n| Task::Parity.generate(n, &mut r))
        .collect();
    let full = Batch::from_examples(&exs, Task::Parity.width(60), Task::Parity.pad());
    assert_eq!(full.seq_len(), 61);
    // The longest row scores its answer at prediction 17: 18 predictions,
    // rounded up to 32.
    let cut = full.trimmed(16);
    assert_eq!((cut.rows, cut.width), (3, 33));
    assert_eq!(cut.scored_count(), full.scored_count());
    for r in 0..3 {
        let (a, b) = (r * full.width, r * cut.width);
        assert_eq!(cut.tokens[b..b + 33], full.tokens[a..a + 33], "row {r}");
        assert!(
            full.tokens[a + 33..a + full.width]
                .iter()
                .all(|&t| t == Task::Parity.pad()),
            "only padding is cut"
        );
        for p in 0..32 {
            assert_eq!(cut.scored(r * 32 + p), full.scored(r * 61 + p));
        }
    }
    assert_eq!(cut.trimmed(16), cut, "trimming twice changes nothing");
    assert_eq!(full.trimmed(64), full, "a step past the width keeps it");
    assert_eq!(Batch::trimmed_widths(62, 16), vec![17, 33, 49, 62]);
    assert_eq!(Batch::trimmed_widths(33, 16), vec![17, 33]);
    let file = Batch {
        mask: None,
        ..full.clone()
    };
    assert_eq!(
        file.trimmed(16),
        file,
        "a batch scoring every prediction stays whole"
    );
}

fn task_spec(task: Task, train_len: usize, eval_lens: Vec<usize>) -> DataSpec {
    DataSpec::task(task, train_len, eval_lens)
}

#[test]
fn datasets_are_deterministic_from_the_seed() {
    for task in Task::ALL {
        let spec = task_spec(task, 8, vec![8, 16]);
        let mut a = Dataset::new(&spec, 7, 4).unwrap();
        let mut b = Dataset::new(&spec, 7, 4).unwrap();
        let mut c = Dataset::new(&spec, 8, 4).unwrap();
        let (ba, bb, bc) = (
            a.next_batch(16).unwrap(),
            b.next_batch(16).unwrap(),
            c.next_batch(16).unwrap(),
        );
        assert_eq!(ba, bb, "{task:?}");
        assert_ne!(ba, bc, "{task:?}: another seed, other data");
        assert_eq!(a.eval_sets()[1].batches, b.eval_sets()[1].batches);
    }
}

#[test]
fn train_and_eval_splits_are_disjoint() {
    let spec = task_spec(Task::Parity, 12, vec![12]);
    let mut data = Dataset::new(&spec, 3, 32).unwrap();
    let eval: HashSet<Vec<u32>> = data.eval_sets()[0]
        .batches
        .iter()
        .flat_map(|b| b.tokens.chunks(b.width).map(<[u32]>::to_vec))
        .collect();
    assert!(eval.iter().all(|t| is_eval_instance(t)));
    let mut seen = 0;
    for _ in 0..40 {
        let b = data.next_batch(64).unwrap();
        for row in b.tokens.chunks(b.width) {
            // Training rows of other sizes are padded; compare the unpadded instance.
            let inst: Vec<u32> = row.iter().copied().filter(|&t| t != 3).collect();
            if inst.len() == 14 {
                seen += 1;
                assert!(!eval.contains(&inst), "an eval instance in training");
            }
            if inst.len() > 5 {
                assert!(!is_eval_instance(&inst));
            }
        }
    }
    assert!(
        seen > 50,
        "enough length-12 training rows compared ({seen})"
    );
}

#[test]
fn training_stays_within_train_len_and_eval_goes_beyond() {
    let spec = task_spec(Task::Modarith, 6, vec![6, 24]);
    let mut data = Dataset::new(&spec, 0, 8).unwrap();
    assert_eq!(data.train_width(), Task::Modarith.width(6));
    let mut sizes = HashSet::new();
    for _ in 0..20 {
        let b = data.next_batch(16).unwrap();
        assert_eq!(b.width, data.train_width(), "one training shape");
        for (r, row) in b.tokens.chunks(b.width).enumerate() {
            let eq = row.iter().position(|&t| t == 8).unwrap();
            // `=` sits at index 2n - 1.
            sizes.insert(eq.div_ceil(2));
            let mask = &b.mask.as_ref().unwrap()[r * (b.width - 1)..(r + 1) * (b.width - 1)];
            assert_eq!(mask.iter().filter(|&&m| m).count(), 1);
            assert!(mask[eq]);
        }
    }
    assert_eq!(sizes, (1..=6).collect(), "every size 1..=L is trained");
    let long = &data.eval_sets()[1];
    assert_eq!(long.length, Some(24));
    let rows: usize = long.batches.iter().map(|b| b.rows).sum();
    assert_eq!(rows, stepgraph::train::data::TASK_EVAL_ROWS);
    for b in &long.batches {
        assert_eq!(b.width, Task::Modarith.width(24));
        assert_eq!(b.scored_count(), b.rows);
    }
}

#[test]
fn a_restored_position_draws_the_same_batches() {
    let spec = task_spec(Task::Mqar, 6, vec![6]);
    let mut a = Dataset::new(&spec, 11, 4).unwrap();
    for _ in 0..3 {
        a.next_batch(8).unwrap();
    }
    let pos = a.position();
    assert_eq!(pos.batches, 3);
    let mut b = Dataset::new(&spec, 11, 4).unwrap();
    b.restore(pos);
    assert_eq!(a.next_batch(8).unwrap(), b.next_batch(8).unwrap());
}

fn file_spec(
    path: &std::path::Path,
    format: DataFormat,
    vocab: Option<usize>,
    seq_len: usize,
) -> DataSpec {
    DataSpec::File {
        path: path.to_path_buf(),
        format,
        vocab_size: vocab,
        eval_fraction: 0.25,
        seq_len,
    }
}

#[test]
fn byte_files_train_on_the_head_and_evaluate_on_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.txt");
    let text: Vec<u8> = (0..400u32)
        .map(|i| b'a' + u8::try_from(i % 26).unwrap())
        .collect();
    std::fs::write(&path, &text).unwrap();
    let mut data = Dataset::new(&file_spec(&path, DataFormat::Bytes, None, 7), 0, 4).unwrap();
    assert_eq!(data.vocab_size(), 256);
    let b = data.next_batch(5).unwrap();
    assert_eq!((b.rows, b.width), (5, 8));
    assert!(b.mask.is_none());
    for row in b.tokens.chunks(8) {
        // Windows are contiguous runs of the training part (first 300 bytes).
        let start = text
            .windows(8)
            .position(|w| w.iter().map(|&x| u32::from(x)).eq(row.iter().copied()));
        assert!(start.is_some());
    }
    let held = &data.eval_sets()[0];
    let first = &held.batches[0].tokens[..8];
    let want: Vec<u32> = text[300..308].iter().map(|&x| u32::from(x)).collect();
    assert_eq!(first, want.as_slice(), "eval reads the held-out tail");
}

#[test]
fn u16_and_u32_files_are_little_endian_and_checked_against_the_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let p16 = dir.path().join("t.u16");
    let ids: Vec<u16> = (0..64).map(|i| i % 50).collect();
    std::fs::write(
        &p16,
        ids.iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let data = Dataset::new(&file_spec(&p16, DataFormat::U16, Some(50), 7), 0, 2).unwrap();
    assert_eq!(data.eval_sets()[0].batches[0].tokens[..3], [48, 49, 0]);
    let err = Dataset::new(&file_spec(&p16, DataFormat::U16, Some(40), 7), 0, 2)
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            TrainError::TokenOutOfRange {
                index: 40,
                token: 40,
                vocab_size: 40,
                ..
            }
        ),
        "{err}"
    );
    let p32 = dir.path().join("t.u32");
    std::fs::write(&p32, [1u8, 0, 0, 0, 2, 0, 0]).unwrap();
    let err = Dataset::new(&file_spec(&p32, DataFormat::U32, Some(9), 1), 0, 2)
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a whole number"), "{err}");
    let err = Dataset::new(&file_spec(&p16, DataFormat::U16, None, 7), 0, 2)
        .err()
        .unwrap();
    assert_eq!(
        err.exit_code(),
        2,
        "a missing --vocab-size is a usage error: {err}"
    );
    let err = Dataset::new(&file_spec(&p16, DataFormat::U16, Some(50), 40), 0, 2)
        .err()
        .unwrap();
    assert!(err.to_string().contains("fewer than one window"), "{err}");
    let err = Dataset::new(
        &file_spec(&dir.path().join("nope"), DataFormat::Bytes, None, 7),
        0,
        2,
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().starts_with("cannot read data file"),
        "{err}"
    );
}

/// A u16 file of `n` ids where id `i` is `i % 1000`.
fn counting_u16(path: &std::path::Path, n: usize) -> Vec<u16> {
    let ids: Vec<u16> = (0..n).map(|i| u16::try_from(i % 1000).unwrap()).collect();
    std::fs::write(
        path,
        ids.iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    ids
}

#[test]
fn large_files_are_checked_in_chunks_and_read_by_window() {
    // 1.5M ids = 3 MB: the id check runs over several scan chunks and the
    // windows come from positional reads anywhere in the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.u16");
    let n = 1_500_000;
    let ids = counting_u16(&path, n);
    let mut data = Dataset::new(&file_spec(&path, DataFormat::U16, Some(1000), 31), 5, 4).unwrap();
    for _ in 0..20 {
        let b = data.next_batch(8).unwrap();
        for row in b.tokens.chunks(32) {
            // Consecutive ids (mod 1000): a contiguous window of the file.
            for w in row.windows(2) {
                assert_eq!((w[0] + 1) % 1000, w[1]);
            }
        }
    }
    let held = &data.eval_sets()[0].batches[0];
    let split = n - n / 4;
    let want: Vec<u32> = ids[split..split + 32]
        .iter()
        .map(|&v| u32::from(v))
        .collect();
    assert_eq!(
        &held.tokens[..32],
        want.as_slice(),
        "eval starts at the held-out tail"
    );

    // One id out of range near the end, past the first scan chunk.
    let mut bad = ids.clone();
    bad[1_400_003] = 1000;
    std::fs::write(
        &path,
        bad.iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let err = Dataset::new(&file_spec(&path, DataFormat::U16, Some(1000), 31), 5, 4)
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            TrainError::TokenOutOfRange {
                index: 1_400_003,
                token: 1000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_file_truncated_under_a_run_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.u16");
    counting_u16(&path, 4000);
    let mut data = Dataset::new(&file_spec(&path, DataFormat::U16, Some(1000), 63), 0, 4).unwrap();
    data.next_batch(4).unwrap();
    std::fs::write(&path, [0u8; 10]).unwrap();
    let err = data.next_batch(64).err().unwrap();
    assert!(matches!(err, TrainError::DataRead { .. }), "{err}");
}

#[test]
fn the_mixed_eval_set_spans_its_sizes_and_leaves_the_others_alone() {
    for (task, lo, hi) in [
        (Task::ModarithPrec, 20, 128),
        (Task::Parity, 40, 256),
        (Task::ModarithBrackets, 40, 256),
    ] {
        let plain = task_spec(task, lo, vec![lo, hi]);
        let mut mixed = plain.clone();
        if let DataSpec::Task { eval_mix, .. } = &mut mixed {
            *eval_mix = Some([lo, hi]);
        }
        let a = Dataset::new(&plain, 3, 64).unwrap();
        let b = Dataset::new(&mixed, 3, 64).unwrap();
        let (sets_a, sets_b) = (a.eval_sets(), b.eval_sets());
        assert_eq!(sets_b.len(), sets_a.len() + 1, "{task:?}");
        for (x, y) in sets_a.iter().zip(sets_b) {
            assert_eq!(x.batches, y.batches, "{task:?}: {} changed", x.label);
        }
        let mix = sets_b.last().unwrap();
        assert_eq!(
            (mix.label.as_str(), mix.length),
            (format!("mix {lo}-{hi}").as_str(), None)
        );
        let width = task.width(hi);
        let mut lens = HashSet::new();
        for batch in &mix.batches {
            assert_eq!(batch.width, width, "{task:?}: padded to the largest size");
            for row in batch.tokens.chunks(batch.width) {
                let inst: Vec<u32> = row.iter().copied().filter(|&t| t != task.pad()).collect();
                assert!(
                    is_eval_instance(&inst),
                    "{task:?}: a training row in the eval set"
                );
                assert!(
                    inst.len() >= task.width(lo) && inst.len() <= width,
                    "{task:?}"
                );
                lens.insert(inst.len());
            }
        }
        // 256 rows over about a hundred sizes: many distinct lengths.
        assert!(lens.len() > 40, "{task:?}: {} lengths", lens.len());
    }
}

/// A packed batch's rows cut at their resets: each instance's tokens up to
/// its last scored target, with the scored prediction offsets inside it.
fn instances_of(b: &Batch) -> Vec<(Vec<u32>, Vec<usize>)> {
    let (t, resets) = (b.seq_len(), b.resets.as_ref().expect("packed"));
    let mut out = Vec::new();
    for r in 0..b.rows {
        let starts: Vec<usize> = (0..t).filter(|&p| resets[r * t + p]).collect();
        for (i, &s) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(t);
            let scored: Vec<usize> = (s..end)
                .filter(|&p| b.scored(r * t + p))
                .map(|p| p - s)
                .collect();
            let last = scored
                .last()
                .copied()
                .expect("an instance scores something");
            let toks = b.tokens[r * b.width + s..r * b.width + s + last + 2].to_vec();
            out.push((toks, scored));
        }
    }
    out.sort();
    out
}

#[test]
fn a_packed_batch_holds_every_instance_once_behind_a_reset() {
    let mut r = rng(8);
    let task = Task::ModarithPrec;
    // Sizes as a curriculum draws them: many short, a few at the width.
    let sizes = [1, 80, 3, 44, 17, 80, 2, 60, 9, 33, 71, 5, 12];
    let exs: Vec<_> = sizes.iter().map(|&n| task.generate(n, &mut r)).collect();
    let full = Batch::from_examples(&exs, task.width(80), task.pad());
    let want: Vec<(Vec<u32>, Vec<usize>)> = {
        let t = full.seq_len();
        let mut v: Vec<_> = (0..full.rows)
            .map(|row| {
                let scored: Vec<usize> = (0..t).filter(|&p| full.scored(row * t + p)).collect();
                let last = *scored.last().expect("scored");
                (
                    full.tokens[row * full.width..row * full.width + last + 2].to_vec(),
                    scored,
                )
            })
            .collect();
        v.sort();
        v
    };
    for per_row in [1, 2, 3, 4, 13, 20] {
        let p = full.packed(per_row, 16, task.pad());
        let (rows, cap) = Batch::packed_shape(full.rows, full.width, per_row);
        assert_eq!(p.rows, rows, "{per_row} a row");
        assert!(
            p.width <= cap,
            "{per_row} a row: width {} over {cap}",
            p.width
        );
        assert!(
            (p.width - 1).is_multiple_of(16) || p.width == cap,
            "{per_row}: width {}",
            p.width
        );
        assert_eq!(p.scored_count(), full.scored_count(), "{per_row} a row");
        assert_eq!(
            instances_of(&p),
            want,
            "{per_row} a row: the same instances"
        );
        let resets = p.resets.as_ref().expect("resets");
        assert_eq!(resets.iter().filter(|&&b| b).count(), full.rows);
        assert!(
            p.tokens[..]
                .iter()
                .all(|&x| u32::try_from(task.vocab_size()).is_ok_and(|v| x < v)),
            "ids stay in the vocabulary"
        );
    }
    // Two a row: the longest instances take the emptiest rows, so no row
    // ends more than one instance's length after another.
    let p = full.packed(2, 1, task.pad());
    let fills: Vec<usize> = (0..p.rows)
        .map(|r| {
            let t = p.seq_len();
            (0..t)
                .rev()
                .find(|&q| p.scored(r * t + q))
                .map_or(0, |q| q + 2)
        })
        .collect();
    let spread = fills.iter().max().unwrap() - fills.iter().min().unwrap();
    assert!(spread <= task.width(80), "fills {fills:?}");
    assert_eq!(
        p.width,
        *fills.iter().max().unwrap(),
        "cut at the fullest row"
    );
    // A batch that scores every prediction packs whole rows.
    let file = Batch {
        mask: None,
        ..full.clone()
    };
    let p = file.packed(4, 16, 0);
    assert_eq!(p.rows, 4);
    assert_eq!(p.scored_count(), full.rows * full.seq_len());
}
