//! `--trim` on the CPU engine, through the library: a run whose batches are
//! cut to their longest row trains exactly as the run that pads them to
//! the training size (the model is causal and padding is never scored), and
//! it does train on narrower batches while its curriculum is short.

mod train_common;

use std::path::{Path, PathBuf};

use stepgraph::train::checkpoint::load;
use stepgraph::train::data::{DataSpec, Task};
use stepgraph::train::{RunConfig, Stop, TrainOptions, train};
use train_common::{losses, options, run_config};

/// Parity of up to 40 bits, the largest size growing from 2 over the run,
/// so that the first batches' rows are far shorter than the training size.
fn config(trim: bool) -> RunConfig {
    RunConfig {
        data: DataSpec::task(Task::Parity, 40, vec![40]).with_curriculum(16, 2),
        trim,
        ..run_config(20)
    }
}

fn run(dir: &Path, trim: bool) -> PathBuf {
    let opts = TrainOptions {
        run: config(trim),
        log_dynamics: true,
        ..options(dir, 20)
    };
    train(&opts, &Stop::new()).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_trimmed_run_trains_as_the_padded_one() {
    let dir = tempfile::tempdir().unwrap();
    let padded = run(&dir.path().join("padded"), false);
    let trimmed = run(&dir.path().join("trimmed"), true);
    let last = |run: &Path| load(&run.join("checkpoints").join("step-00000020")).unwrap();
    let ((_, a, _), (_, b, _)) = (last(&padded), last(&trimmed));
    // Not bit for bit: the weight gradients' sums run over rows x window,
    // and a narrower window groups the same nonzero terms differently. A
    // gap of zero would mean no batch was cut.
    let gap = train_common::weight_gap(&a.weights, &b.weights);
    assert!(gap > 0.0 && gap < 1e-5, "weights {gap}");
    let moments = a
        .moments
        .iter()
        .zip(&b.moments)
        .flat_map(|((m, v), (n, w))| m.iter().zip(n).chain(v.iter().zip(w)))
        .fold(0.0f32, |g, (x, y)| g.max((x - y).abs()));
    assert!(moments < 1e-5, "moments {moments}");
    let (la, lb) = (losses(&padded), losses(&trimmed));
    assert_eq!(la.len(), lb.len());
    assert!(la.len() > 20, "every step's loss and the evaluations");
    for (x, y) in la.iter().zip(&lb) {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "loss {x} against {y}"
        );
    }
}
