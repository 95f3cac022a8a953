//! What the checkpoint-reading examples (`arith_terms`, `bracket_depths`,
//! `dynamics_probe`) share: scoring held-out rows of a task with the CPU
//! reference model (f64) at each row's answer (not `dynamics_probe`), and
//! printing a report without treating a closed pipe as an error. Cargo
//! builds no example from this directory (it has no `main.rs`); each
//! example includes it with `#[path]`.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::cpu::{ScanMode, Tokens, Weights, forward};
use stepgraph::train::data::{Batch, Example, Task};

/// An example's `main`: the command-line arguments through `parse` (a
/// `usage` line and exit code 2 when it refuses them), then `run`, whose
/// error is printed as one line with exit code 1.
pub fn main<A>(
    usage: &str,
    parse: impl FnOnce(Vec<String>) -> Option<A>,
    run: impl FnOnce(&A) -> Result<(), Box<dyn Error>>,
) -> ExitCode {
    let Some(args) = parse(std::env::args().skip(1).collect()) else {
        eprintln!("usage: {usage}");
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

/// A count of at least 1.
pub fn positive(s: &str) -> Option<usize> {
    s.parse::<usize>().ok().filter(|&n| n >= 1)
}

/// Whether the model's most likely answer class (one of the first
/// `classes` tokens) at each example's first answer position is the
/// example's answer. The rows are laid out as training lays them out, at
/// `width` tokens; an id the checkpoint's vocabulary lacks (a checkpoint of
/// another task) is refused by `Tokens`.
fn right_answers(
    cfg: &Mamba3Config,
    weights: &Weights<f64>,
    task: Task,
    examples: &[Example],
    width: usize,
    classes: usize,
) -> Result<Vec<bool>, Box<dyn Error>> {
    let batch = Batch::from_examples(examples, width, task.pad());
    let ids: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tokens::from_rows(&ids, batch.rows, batch.width, cfg.vocab_size)?;
    let out = forward(cfg, weights, &tokens, None, ScanMode::Recurrent)?;
    let (len, vocab) = (tokens.len(), cfg.padded_vocab_size());
    examples
        .iter()
        .enumerate()
        .map(|(row, ex)| {
            let p = ex.answers[0];
            let at = (row * len + p) * vocab;
            let logits = &out.logits[at..at + classes];
            let predicted =
                (0..classes).fold(0, |best, c| if logits[c] > logits[best] { c } else { best });
            Ok(usize::try_from(ex.tokens[p + 1])? == predicted)
        })
        .collect()
}

/// Rows right and rows in all, per bucket.
pub type Buckets = BTreeMap<usize, (usize, usize)>;

/// Scores `examples` of `task` (rows of `width` tokens; see
/// [`right_answers`]) and returns the accuracy over all of them and, per
/// bucket, rows right and rows in all: `key` of each example, capped at
/// `last` (the bucket of `last` and beyond).
pub fn by_bucket(
    cfg: &Mamba3Config,
    weights: &Weights<f64>,
    task: Task,
    examples: &[Example],
    width: usize,
    last: usize,
    key: impl Fn(&Example) -> usize,
) -> Result<(f64, Buckets), Box<dyn Error>> {
    let classes = usize::try_from(task.modulus().ok_or("not a state-tracking task")?)?;
    let right = right_answers(cfg, weights, task, examples, width, classes)?;
    let mut out = Buckets::new();
    for (ex, &ok) in examples.iter().zip(&right) {
        let slot = out.entry(key(ex).min(last)).or_default();
        slot.0 += usize::from(ok);
        slot.1 += 1;
    }
    let hits = right.iter().filter(|&&ok| ok).count();
    Ok((fraction(hits, examples.len()), out))
}

/// Appends the table of [`by_bucket`]'s buckets under `header`, the bucket of `last`
/// labelled `last+`.
pub fn write_buckets(
    report: &mut String,
    header: &str,
    buckets: &Buckets,
    last: usize,
) -> std::fmt::Result {
    writeln!(report, "{header} | rows | accuracy")?;
    for (k, (r, n)) in buckets {
        let label = if *k == last {
            format!("{last}+")
        } else {
            k.to_string()
        };
        writeln!(
            report,
            "{label:>3} | {n:>5} | {:5.1}%",
            100.0 * fraction(*r, *n)
        )?;
    }
    Ok(())
}

/// Writes `report` to standard output; a reader that stops early (`| head
/// -1`) is not an error of the scoring.
pub fn print(report: &str) -> Result<(), Box<dyn Error>> {
    match std::io::stdout().write_all(report.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// `part / whole` for counts (the rows here are far below 2^32).
pub fn fraction(part: usize, whole: usize) -> f64 {
    let f = |n: usize| f64::from(u32::try_from(n).unwrap_or(u32::MAX));
    f(part) / f(whole)
}
