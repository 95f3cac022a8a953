//! `--pack` on the CPU engine, through the library: a run whose batches lay
//! several instances to a row, the state reset at each one's first token,
//! trains as the run that gives each instance a padded row of its own (the
//! same instances, the same mean loss over their answers), and a resume
//! keeps the packing it was saved with.

mod train_common;

use std::path::{Path, PathBuf};

use stepgraph::train::checkpoint::load;
use stepgraph::train::data::{DataSpec, Task};
use stepgraph::train::{RunConfig, Setting, Stop, TrainError, TrainOptions, train};
use train_common::{losses, options, resume, run_config};

/// Arithmetic with precedence on up to 12 operands, the largest size
/// growing from 2, so the packed rows hold instances of mixed lengths.
fn config(pack: usize) -> RunConfig {
    RunConfig {
        data: DataSpec::task(Task::ModarithPrec, 12, vec![12]).with_curriculum(12, 2),
        pack,
        ..run_config(16)
    }
}

fn run(dir: &Path, pack: usize) -> PathBuf {
    let opts = TrainOptions {
        run: config(pack),
        ..options(dir, 16)
    };
    train(&opts, &Stop::new()).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_packed_run_trains_as_the_padded_one() {
    let dir = tempfile::tempdir().unwrap();
    let padded = run(&dir.path().join("padded"), 1);
    let last = |run: &Path| load(&run.join("checkpoints").join("step-00000016")).unwrap();
    let (_, a, _) = last(&padded);
    let la = losses(&padded);
    assert!(la.len() > 16, "every step's loss and the evaluations");
    // Two, three and all six instances of a batch to a row.
    for pack in [2, 3, 6] {
        let packed = run(&dir.path().join(format!("pack{pack}")), pack);
        let (_, b, state) = last(&packed);
        assert_eq!(state.run.pack, pack, "the checkpoint records the packing");
        let gap = train_common::weight_gap(&a.weights, &b.weights);
        assert!(gap < 1e-5, "{pack} a row: weights {gap}");
        let lb = losses(&packed);
        assert_eq!(la.len(), lb.len());
        for (x, y) in la.iter().zip(&lb) {
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                "{pack} a row: loss {x} against {y}"
            );
        }
    }
}

#[test]
fn a_resume_keeps_its_packing_and_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let saved = run(&dir.path().join("run"), 2);
    let err = train(
        &resume(&saved, config(3), vec![Setting::Pack]),
        &Stop::new(),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, TrainError::ResumeChange { flag, .. } if *flag == "--pack"),
        "{err}"
    );
    assert!(err.to_string().contains("--pack 2"), "{err}");
    let opts = TrainOptions {
        run: config(0),
        ..options(&dir.path().join("zero"), 16)
    };
    let err = train(&opts, &Stop::new()).err().unwrap().to_string();
    assert!(
        err.contains("--pack") && err.contains("at least 1"),
        "{err}"
    );
}
