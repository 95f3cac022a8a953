//! The dynamics probe of `--log-dynamics` (`train::dynamics`), run on a
//! saved checkpoint: per block, the mean `dt` and decay, the best head's
//! retention over a row, and the rotating channel nearest the task's lattice.
//! Runs trained without `--log-dynamics` (`stepgraph train`, as the
//! init-crossing rounds ran them) logged none, so their checkpoints are the
//! only place to read them; tests/gpu/STATE-TRACKING.md compares runs that
//! fitted with runs that never started this way.
//!
//! ```sh
//! cargo run --release --example dynamics_probe -- CHECKPOINT TASK SIZE [SEED]
//! ```
//!
//! TASK is a `--task` name (`modarith-prec`, `parity`, ...), SIZE the
//! instance size in the task's own unit (operands, bits; the arithmetic
//! recipe trains at 80). The probe reads the first `PROBE_ROWS` held-out
//! rows drawn with SEED (default 1), as training's probe reads its eval set.

use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use stepgraph::mamba3::checkpoint;
use stepgraph::train::data::{Batch, Task};
use stepgraph::train::dynamics::{PROBE_ROWS, probe};

// Only the shared main, argument and print helpers; the scoring ones are
// for the accuracy examples.
#[allow(dead_code)]
#[path = "support/score.rs"]
mod score;
use score::positive;

struct Args {
    checkpoint: PathBuf,
    task: Task,
    size: usize,
    seed: u64,
}

fn main() -> ExitCode {
    score::main("dynamics_probe CHECKPOINT TASK SIZE>=1 [SEED]", parse, run)
}

fn parse(v: Vec<String>) -> Option<Args> {
    if !(3..=4).contains(&v.len()) {
        return None;
    }
    Some(Args {
        checkpoint: PathBuf::from(&v[0]),
        task: v[1].parse().ok()?,
        size: positive(&v[2])?,
        seed: v.get(3).map_or(Some(1), |s| s.parse().ok())?,
    })
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let (cfg, weights) = checkpoint::load::<f32>(&args.checkpoint)?;
    let task = args.task;
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let examples: Vec<_> = (0..PROBE_ROWS)
        .map(|_| task.sample(args.size, true, &mut rng))
        .collect();
    let batch = Batch::from_examples(&examples, task.width(args.size), task.pad());
    let d = probe(&cfg, &weights, task, &batch)?;
    let mut report = format!(
        "{} rows of {} tokens\nlayer | dt mean | decay mean | retention best / mean | angle max /pi | lattice error rad (channel)\n",
        PROBE_ROWS, d.row_len
    );
    for (i, l) in d.layers.iter().enumerate() {
        let lattice = match (l.lattice_error, l.lattice_channel) {
            (Some(e), Some([h, s])) => format!("{e:.4} (head {h}, pair {s})"),
            _ => "-".to_owned(),
        };
        writeln!(
            report,
            "{} | {:.4} | {:.4} | {:.3} / {:.3} | {:.2} | {lattice}",
            i + 1,
            l.dt_mean,
            l.decay_mean,
            l.retention_best,
            l.retention_mean,
            l.angle_max
        )?;
    }
    score::print(&report)
}
