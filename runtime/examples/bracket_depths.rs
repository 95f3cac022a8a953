//! Where a bracketed-arithmetic checkpoint (`modarith-brackets` or
//! `modarith-brackets-nomult`) goes wrong: it scores the checkpoint on
//! held-out instances of one size with the CPU reference model (f64) and
//! splits the accuracy by the row's deepest nesting. Without `*` the answer
//! is a signed sum whose signs come from the enclosing `-`, so a model that
//! keeps one sign per nesting level fails on rows deeper than the levels it
//! learned, while a model whose sum steps are a little off `2 pi / 5` fails
//! on long rows whatever their depth. Scoring the same checkpoint at the
//! training size and at the reported one tells the two apart
//! (tests/gpu/STATE-TRACKING.md, "Brackets without `*`", reads its
//! checkpoints this way).
//!
//! ```sh
//! cargo run --release --example bracket_depths -- CHECKPOINT nomult|times SIZE [ROWS] [SEED] [skewed]
//! ```
//!
//! SIZE counts expression tokens (the recipe trains on 160 and reports
//! 256); ROWS (default 512) instances are drawn from the held-out split
//! with SEED (default 1). `skewed` draws each row's operand and operator
//! frequencies as `--skewed-rows` draws a skewed training row's: a model
//! whose sum step is off shows it on such rows at the training size, where
//! the skewed rows would train it.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use stepgraph::mamba3::checkpoint;
use stepgraph::train::data::Task;
use stepgraph::train::data::arith::{CLOSE, OPEN};

#[path = "support/score.rs"]
mod score;
use score::positive;

/// Rows this deep and deeper share the last bucket.
const DEEP: usize = 16;

struct Args {
    checkpoint: PathBuf,
    task: Task,
    size: usize,
    rows: usize,
    seed: u64,
    skewed: bool,
}

fn main() -> ExitCode {
    score::main(
        "bracket_depths CHECKPOINT nomult|times SIZE>=1 [ROWS>=1] [SEED] [skewed]",
        parse,
        run,
    )
}

fn parse(v: Vec<String>) -> Option<Args> {
    if !(3..=6).contains(&v.len()) {
        return None;
    }
    Some(Args {
        checkpoint: PathBuf::from(&v[0]),
        task: match v[1].as_str() {
            "nomult" => Task::ModarithBracketsNomult,
            "times" => Task::ModarithBrackets,
            _ => return None,
        },
        size: positive(&v[2])?,
        rows: v.get(3).map_or(Some(512), |s| positive(s))?,
        seed: v.get(4).map_or(Some(1), |s| s.parse().ok())?,
        skewed: match v.get(5).map(String::as_str) {
            None => false,
            Some("skewed") => true,
            Some(_) => return None,
        },
    })
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let (cfg, weights) = checkpoint::load::<f64>(&args.checkpoint)?;
    let task = args.task;
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let examples: Vec<_> = (0..args.rows)
        .map(|_| {
            if args.skewed {
                let symbols = task.skewed_symbols(0.0, &mut rng);
                task.sample_from(args.size, true, &symbols, &mut rng)
            } else {
                task.sample(args.size, true, &mut rng)
            }
        })
        .collect();
    let (acc, buckets) = score::by_bucket(
        &cfg,
        &weights,
        task,
        &examples,
        task.width(args.size),
        DEEP,
        |ex| deepest(&ex.tokens[..ex.answers[0]]),
    )?;
    let mut report = format!(
        "{} tokens, {} held-out{} rows of {}: accuracy {:.1}% ({:.1} scaled)\n",
        args.size,
        args.rows,
        if args.skewed { " skewed" } else { "" },
        task.name(),
        100.0 * acc,
        100.0 * task.scaled_accuracy(acc)
    );
    score::write_buckets(&mut report, "deepest nesting", &buckets, DEEP)?;
    score::print(&report)
}

/// The most brackets open at once in an expression.
fn deepest(expr: &[u32]) -> usize {
    let (mut depth, mut most) = (0usize, 0usize);
    for &t in expr {
        if t == OPEN {
            depth += 1;
            most = most.max(depth);
        } else if t == CLOSE {
            depth = depth.saturating_sub(1);
        }
    }
    most
}
