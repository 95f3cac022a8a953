//! Issue 16 on the GPU: `stepgraph repro state-tracking` end to end with the
//! smoke-test recipes, several runs training at once in one process (each
//! on its own context stream; captures and context teardowns of different
//! threads kept apart by the device gate), in both precisions, and a run
//! trained among others bit-identical to the same run trained alone.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`; on the GPU machine they
//! run with `--include-ignored`, where a missing GPU fails them.

mod gpu_common;

use std::path::Path;

use stepgraph::Precision;
use stepgraph::repro::recipe::{ROTATIONS, TASKS};
use stepgraph::repro::runner::Outcome;
use stepgraph::repro::{ReproOptions, ReproReport, state_tracking};
use stepgraph::train::data::Task;
use stepgraph::train::{Device, Rotation, Stop};

fn repro(
    out: &Path,
    precision: Precision,
    tasks: &[Task],
    rotations: &[Rotation],
    seeds: &[u64],
    jobs: usize,
) -> ReproReport {
    let opts = ReproOptions {
        seeds: seeds.to_vec(),
        precision,
        device: Device::Cuda,
        out: Some(out.to_path_buf()),
        jobs,
        // Every GPU the driver lists.
        gpus: Vec::new(),
        quick: true,
        tasks: tasks.to_vec(),
        rotations: rotations.to_vec(),
        time_limit: None,
        stop_after: None,
        overrides: Default::default(),
    };
    let print = |l: &str| eprintln!("{l}");
    state_tracking(&opts, &Stop::new(), &print).expect("the reproduction runs")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_quick_table_trains_many_runs_at_once_in_both_precisions() {
    let _serial = gpu_common::serial();
    let dir = tempfile::tempdir().unwrap();
    for (precision, seeds) in [(Precision::F32, vec![0, 1]), (Precision::Bf16, vec![0])] {
        let out = dir.path().join(precision.name());
        let r = repro(&out, precision, &TASKS, &ROTATIONS, &seeds, 6);
        assert_eq!(r.results.len(), 9 * seeds.len());
        for run in &r.results {
            assert_eq!(run.outcome, Outcome::Finished, "{}", run.job.name());
            assert!(run.dynamics.is_some(), "{}", run.job.name());
            // The training and reported sizes, the sources' mix, and for
            // the arithmetic without brackets the zero-free products.
            let probes = usize::from(run.job.task == Task::ModarithPrec);
            assert_eq!(run.eval.len(), 3 + probes, "{}", run.job.name());
        }
        for f in ["table.md", "table.json", "results.jsonl", "metrics.jsonl"] {
            assert!(out.join(f).is_file(), "{f}");
        }
        assert_eq!(r.plots.len(), 3);
        eprintln!("{}\n{:.1} s", r.table, r.wall.as_secs_f64());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_run_among_others_equals_the_run_alone_bit_for_bit() {
    let _serial = gpu_common::serial();
    let dir = tempfile::tempdir().unwrap();
    let crowd = repro(
        &dir.path().join("crowd"),
        Precision::F32,
        &TASKS,
        &ROTATIONS,
        &[3],
        9,
    );
    let alone = repro(
        &dir.path().join("alone"),
        Precision::F32,
        &[Task::ModarithBrackets],
        &[Rotation::Fixed],
        &[3],
        1,
    );
    let pick = |r: &ReproReport| {
        r.results
            .iter()
            .find(|x| x.job.task == Task::ModarithBrackets && x.job.rotation == Rotation::Fixed)
            .map(|x| x.eval.iter().map(|e| e.loss.to_bits()).collect::<Vec<_>>())
            .expect("the run")
    };
    assert_eq!(pick(&crowd), pick(&alone));
}
