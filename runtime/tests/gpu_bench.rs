//! `stepgraph bench` on the GPU: a quick S run in both precisions gives
//! sane numbers (graph no slower than eager, MFU in (0, 1), the bench's op
//! sequence reproduces the step), and the cold-start children run.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`; run with
//! `--include-ignored` on the GPU machine.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use stepgraph::Precision;
use stepgraph::bench::cold::cold_start;
use stepgraph::bench::{BenchConfig, BenchOptions, ConfigOutcome, run_on, runner_for};
use stepgraph::device::Gpu;

/// The two tests run one at a time: the bench reads the step's memory as
/// the change of the device-wide free memory (`cuMemGetInfo`), and the
/// cold-start test's child processes allocating and freeing beside it made
/// that reading 0 now and then (the H200 runs saw it twice).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quick_s_bench_gives_sane_numbers_in_both_precisions() {
    let _one = one_at_a_time();
    let gpu = Gpu::new(0).expect("GPU");
    for precision in [Precision::F32, Precision::Bf16] {
        let opts = BenchOptions {
            configs: vec![BenchConfig::parse("S").expect("preset")],
            precision,
            steps: 20,
            warmup: 3,
            breakdown_reps: 2,
            ceiling_n: 4096,
            ..BenchOptions::default()
        };
        let r = run_on(&gpu, &opts, runner_for(precision).expect("runner")).expect("bench");
        print!("{}", r.table());
        assert!(r.ceiling.tflops > 100.0, "{:?}", r.ceiling);
        let ConfigOutcome::Measured(c) = &r.configs[0] else {
            panic!("S skipped: {:?}", r.configs[0]);
        };
        for (what, t) in [("full", &c.full), ("backbone", &c.backbone)] {
            assert!(
                t.graph.median_ms <= t.eager.median_ms,
                "{precision:?} {what}: graph {} ms > eager {} ms",
                t.graph.median_ms,
                t.eager.median_ms
            );
            assert!(
                t.mfu_graph > 0.0 && t.mfu_graph < 1.0,
                "{what}: {}",
                t.mfu_graph
            );
            assert!(t.tokens_per_s_graph > 0.0);
        }
        assert!(c.replica_matches_step, "{precision:?}: replica drifted");
        assert!(c.breakdown.sum_ms > 0.0);
        assert!(c.memory.full_step_bytes > 0 && c.memory.backbone_step_bytes > 0);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cold_start_compiles_then_reads_the_cache() {
    let _one = one_at_a_time();
    // On the GPU machine the binaries are staged, not built: gpu-stage puts
    // the CLI in .gpu/bin beside the tests.
    let built = Path::new(env!("CARGO_BIN_EXE_stepgraph"));
    let staged = Path::new(".gpu/bin/stepgraph");
    let exe = if built.exists() { built } else { staged };
    for precision in [Precision::F32, Precision::Bf16] {
        let r = cold_start(exe, "S", precision).expect("cold start");
        print!("{}", r.table());
        assert_eq!(r.cold.phases.precision, precision);
        assert_eq!(r.cold.phases.modules_cached, 0);
        assert!(r.cold.phases.modules_compiled > 0);
        assert_eq!(r.warm.phases.modules_compiled, 0);
        assert!(r.warm.phases.first_step_ms > 0.0);
    }
}
