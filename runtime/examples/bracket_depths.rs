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
//! cargo run --release --example bracket_depths -- CHECKPOINT nomult|times SIZE [ROWS] [SEED]
//! ```
//!
//! SIZE counts expression tokens (the recipe trains on 160 and reports
//! 256); ROWS (default 512) instances are drawn from the held-out split
//! with SEED (default 1).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use stepgraph::mamba3::checkpoint;
use stepgraph::mamba3::cpu::{ScanMode, Tokens, forward};
use stepgraph::train::data::arith::{CLOSE, MODULUS, OPEN};
use stepgraph::train::data::{Batch, Task};

/// Rows this deep and deeper share the last bucket.
const DEEP: usize = 16;

struct Args {
    checkpoint: PathBuf,
    task: Task,
    size: usize,
    rows: usize,
    seed: u64,
}

fn main() -> ExitCode {
    let Some(args) = parse(std::env::args().skip(1).collect()) else {
        eprintln!("usage: bracket_depths CHECKPOINT nomult|times SIZE>=1 [ROWS>=1] [SEED]");
        return ExitCode::from(2);
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(v: Vec<String>) -> Option<Args> {
    let positive = |s: &str| s.parse::<usize>().ok().filter(|&n| n >= 1);
    if !(3..=5).contains(&v.len()) {
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
    })
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let (cfg, weights) = checkpoint::load::<f64>(&args.checkpoint)?;
    let task = args.task;
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let examples: Vec<_> = (0..args.rows)
        .map(|_| task.sample(args.size, true, &mut rng))
        .collect();
    let batch = Batch::from_examples(&examples, task.width(args.size), task.pad());
    let ids: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tokens::from_rows(&ids, batch.rows, batch.width, cfg.vocab_size)?;
    let out = forward(&cfg, &weights, &tokens, None, ScanMode::Recurrent)?;
    let (len, width) = (tokens.len(), cfg.padded_vocab_size());
    let classes = usize::try_from(MODULUS)?;
    // deepest nesting -> (right, instances)
    let mut buckets = BTreeMap::<usize, (usize, usize)>::new();
    for (row, ex) in examples.iter().enumerate() {
        let p = ex.answers[0];
        let at = (row * len + p) * width;
        let logits = &out.logits[at..at + classes];
        let predicted =
            (0..classes).fold(0, |best, c| if logits[c] > logits[best] { c } else { best });
        let right = usize::try_from(ex.tokens[p + 1])? == predicted;
        let slot = buckets
            .entry(deepest(&ex.tokens[..p]).min(DEEP))
            .or_default();
        slot.0 += usize::from(right);
        slot.1 += 1;
    }
    let right: usize = buckets.values().map(|b| b.0).sum();
    let acc = fraction(right, args.rows);
    let mut report = format!(
        "{} tokens, {} held-out rows of {}: accuracy {:.1}% ({:.1} scaled)\n",
        args.size,
        args.rows,
        task.name(),
        100.0 * acc,
        100.0 * task.scaled_accuracy(acc)
    );
    writeln!(report, "deepest nesting | rows | accuracy")?;
    for (d, (r, n)) in &buckets {
        let label = if *d == DEEP {
            format!("{DEEP}+")
        } else {
            d.to_string()
        };
        writeln!(
            report,
            "{label:>3} | {n:>5} | {:5.1}%",
            100.0 * fraction(*r, *n)
        )?;
    }
    // A reader that stops early (`| head -1`) is not an error of the scoring.
    match std::io::stdout().write_all(report.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
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

/// `part / whole` for counts (the rows here are far below 2^32).
fn fraction(part: usize, whole: usize) -> f64 {
    let f = |n: usize| f64::from(u32::try_from(n).unwrap_or(u32::MAX));
    f(part) / f(whole)
}
