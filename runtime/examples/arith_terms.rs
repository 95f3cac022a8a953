//! Where a `modarith-prec` checkpoint goes wrong: it scores the checkpoint
//! on held-out instances of one size with the CPU reference model (f64) and
//! splits the accuracy by the longest product term that holds no zero
//! (`train::data::arith::longest_unit_term`). Adding mod 5 and multiplying
//! mod 5 are different rotations (steps of `2 pi / 5` against the discrete
//! log's `2 pi / 4`, with a reset at every `+` or `-`); a model whose
//! multiplication is inexact fails on long terms first, and longer rows hold
//! longer terms. Round 14 of tests/gpu/STATE-TRACKING.md reads its
//! checkpoints this way.
//!
//! ```sh
//! cargo run --release --example arith_terms -- CHECKPOINT SIZE[-MAX] [ROWS] [SEED] [sums|products]
//! ```
//!
//! SIZE counts operands (the training size of the table's recipe is 80, the
//! reported one 128); ROWS (default 512) instances are drawn from the
//! held-out split with SEED (default 1). `SIZE-MAX` draws each row's size
//! uniformly from `SIZE..=MAX`: `20-128` is the validation protocol of the
//! sources' code (Grazzi et al.'s configs score one accuracy over rows of
//! 40-256 tokens, i.e. 20-128 operands), where the table scores every row at
//! the reported size. `sums` and `products` score
//! rows outside the task's distribution that isolate one half of it:
//! `sums` turns every `*` into a random `+` or `-` (only additions of
//! signed operands), `products` makes every operator `*` and every operand
//! non-zero (one zero-free product of SIZE factors); accuracy that falls
//! with SIZE in one of them locates the inexact rotation.

use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use stepgraph::mamba3::checkpoint;
use stepgraph::train::data::Task;
use stepgraph::train::data::arith::{MINUS, MODULUS, PLUS, TIMES, longest_unit_term};

#[path = "support/score.rs"]
mod score;
use score::positive;

/// Terms of this many operands and more share the last bucket.
const LONG: usize = 6;

/// Which rows are scored.
#[derive(Clone, Copy, PartialEq)]
enum Rows {
    /// The task's own held-out rows.
    Task,
    /// Only `+` and `-`.
    Sums,
    /// Only `*`, operands 1-4.
    Products,
}

struct Args {
    checkpoint: PathBuf,
    size: usize,
    max: usize,
    rows: usize,
    seed: u64,
    kind: Rows,
}

fn main() -> ExitCode {
    score::main(
        "arith_terms CHECKPOINT SIZE>=1[-MAX] [ROWS>=1] [SEED] [sums|products]",
        parse,
        run,
    )
}

fn parse(v: Vec<String>) -> Option<Args> {
    if !(2..=5).contains(&v.len()) {
        return None;
    }
    let (size, max) = match v[1].split_once('-') {
        Some((lo, hi)) => (positive(lo)?, positive(hi)?),
        None => (positive(&v[1])?, positive(&v[1])?),
    };
    if max < size {
        return None;
    }
    Some(Args {
        checkpoint: PathBuf::from(&v[0]),
        size,
        max,
        rows: v.get(2).map_or(Some(512), |s| positive(s))?,
        seed: v.get(3).map_or(Some(1), |s| s.parse().ok())?,
        kind: match v.get(4).map(String::as_str) {
            None => Rows::Task,
            Some("sums") => Rows::Sums,
            Some("products") => Rows::Products,
            Some(_) => return None,
        },
    })
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let (cfg, weights) = checkpoint::load::<f64>(&args.checkpoint)?;
    let task = Task::ModarithPrec;
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let examples: Vec<_> = (0..args.rows)
        .map(|_| {
            // One size draws nothing, so its rows stay those of earlier runs.
            let size = if args.max > args.size {
                rng.random_range(args.size..=args.max)
            } else {
                args.size
            };
            let mut ex = task.sample(size, true, &mut rng);
            restrict(&mut ex.tokens, ex.answers[0], args.kind, &mut rng);
            ex
        })
        .collect();
    let (acc, buckets) = score::by_bucket(
        &cfg,
        &weights,
        task,
        &examples,
        task.width(args.max),
        LONG,
        |ex| longest_unit_term(&ex.tokens[..ex.answers[0]]),
    )?;
    let mut report = format!(
        "{} operands, {} held-out rows{}: accuracy {:.1}% ({:.1} scaled)",
        if args.max == args.size {
            args.size.to_string()
        } else {
            format!("{}-{}", args.size, args.max)
        },
        args.rows,
        match args.kind {
            Rows::Task => "",
            Rows::Sums => " made sums (no `*`)",
            Rows::Products => " made products (only `*`, no 0)",
        },
        100.0 * acc,
        100.0 * task.scaled_accuracy(acc)
    );
    writeln!(report)?;
    score::write_buckets(
        &mut report,
        "longest zero-free product term (operands)",
        &buckets,
        LONG,
    )?;
    score::print(&report)
}

/// Rewrites the expression `tokens[..eq]` (then its answer after `=`) into
/// the rows `kind` asks for; the task's own rows stay as drawn.
fn restrict(tokens: &mut [u32], eq: usize, kind: Rows, rng: &mut ChaCha20Rng) {
    if kind == Rows::Task {
        return;
    }
    for (i, t) in tokens[..eq].iter_mut().enumerate() {
        match (kind, i % 2) {
            (Rows::Sums, 1) if *t == TIMES => *t = rng.random_range(PLUS..=MINUS),
            (Rows::Products, 1) => *t = TIMES,
            (Rows::Products, _) if *t == 0 => *t = rng.random_range(1..MODULUS),
            _ => {}
        }
    }
    // Both kinds hold one operator type, so the value is a plain fold.
    let mut value = tokens[0];
    for pair in tokens[1..eq].chunks(2) {
        let (op, a) = (pair[0], pair[1]);
        value = match op {
            PLUS => (value + a) % MODULUS,
            MINUS => (value + MODULUS - a) % MODULUS,
            _ => value * a % MODULUS,
        };
    }
    tokens[eq + 1] = value;
}
