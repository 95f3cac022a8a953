//! What the user sees while a run trains: a progress bar (or plain lines
//! when stderr is not a terminal), eval lines, and `metrics.jsonl` in the
//! run directory (the plot drawn from it at the end is [`super::plot`]).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use super::TrainError;
use super::engine::StepMetrics;

/// Metrics file name inside the run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Plot file name inside the run directory.
pub const PLOT_FILE: &str = "plot.svg";

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    /// Plain lines on stderr.
    Plain,
    /// Nothing but errors (tests).
    Quiet,
}

/// One evaluated set at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalResult {
    /// The set's label (`len 64`, `held-out`).
    pub label: String,
    /// Problem size, for tasks.
    pub length: Option<usize>,
    /// Mean loss over scored predictions.
    pub loss: f64,
    /// Fraction of scored predictions whose arg-max is the target.
    pub accuracy: f64,
    /// Scored predictions.
    pub count: usize,
}

/// Appends one JSON object per line to `metrics.jsonl`.
pub struct MetricsLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsLog {
    /// Opens (appending) the metrics file of `run_dir`.
    pub fn open(run_dir: &Path) -> Result<Self, TrainError> {
        let path = run_dir.join(METRICS_FILE);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(TrainError::io(&path))?;
        Ok(Self {
            path,
            out: BufWriter::new(file),
        })
    }

    fn write(&mut self, v: &Value) -> Result<(), TrainError> {
        writeln!(self.out, "{v}").map_err(TrainError::io(&self.path))
    }

    /// One training step.
    pub fn train(
        &mut self,
        m: &StepMetrics,
        tokens_per_s: f64,
        elapsed_s: f64,
    ) -> Result<(), TrainError> {
        self.write(&json!({
            "kind": "train", "step": m.step, "loss": finite(m.loss), "lr": m.lr,
            "grad_norm": finite(m.grad_norm), "skipped": m.skipped,
            "skipped_total": m.skipped_total, "tokens_per_s": tokens_per_s, "elapsed_s": elapsed_s,
        }))
    }

    /// One eval set at `step`.
    pub fn eval(&mut self, step: u64, r: &EvalResult) -> Result<(), TrainError> {
        self.write(&json!({
            "kind": "eval", "step": step, "set": r.label, "length": r.length,
            "loss": finite(r.loss), "accuracy": r.accuracy, "count": r.count,
        }))
    }

    /// One eval set's score of the weight average (`--ema`), as
    /// [`Self::eval`] writes the trained weights' under `"kind": "eval_ema"`.
    pub fn eval_ema(&mut self, step: u64, r: &EvalResult) -> Result<(), TrainError> {
        self.write(&json!({
            "kind": "eval_ema", "step": step, "set": r.label, "length": r.length,
            "loss": finite(r.loss), "accuracy": r.accuracy, "count": r.count,
        }))
    }

    /// Any other record (a resume and what it changed).
    pub fn event(&mut self, v: &Value) -> Result<(), TrainError> {
        self.write(v)
    }

    /// Flushes to disk (before checkpoints and at the end).
    pub fn flush(&mut self) -> Result<(), TrainError> {
        self.out.flush().map_err(TrainError::io(&self.path))
    }
}

/// JSON has no NaN/inf: non-finite values are written as null.
fn finite(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// The progress bar or its plain-line fallback.
pub struct Progress {
    bar: Option<ProgressBar>,
    mode: ProgressMode,
    total: u64,
    log_every: u64,
}

impl Progress {
    /// Starts at `start` of `total` steps.
    pub fn new(mode: ProgressMode, start: u64, total: u64, log_every: u64) -> Self {
        let interactive = mode == ProgressMode::Auto && std::io::stderr().is_terminal();
        let bar = interactive.then(|| {
            let style = ProgressStyle::with_template(
                "{wide_bar:.cyan/blue} {pos}/{len} {msg} [{elapsed_precise} eta {eta}]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
                .with_style(style);
            bar.set_position(start);
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        let mode = if interactive || mode == ProgressMode::Quiet {
            mode
        } else {
            ProgressMode::Plain
        };
        Self {
            bar,
            mode,
            total,
            log_every: log_every.max(1),
        }
    }

    /// After each step: the bar's message, or a plain line every `log_every` steps.
    pub fn step(&self, m: &StepMetrics, tokens_per_s: f64, eta: Duration) {
        let skip = if m.skipped_total > 0 {
            format!("  skipped {}", m.skipped_total)
        } else {
            String::new()
        };
        let text = format!(
            "loss {:.4}  lr {:.2e}  {} tok/s{skip}",
            m.loss,
            m.lr,
            human(tokens_per_s)
        );
        if let Some(bar) = &self.bar {
            bar.set_position(m.step);
            bar.set_message(text);
        } else if self.mode == ProgressMode::Plain
            && (m.step.is_multiple_of(self.log_every) || m.step == self.total)
        {
            eprintln!("step {}/{}  {text}  eta {}", m.step, self.total, clock(eta));
        }
    }

    /// A line for the user (eval lines, notices), printed above the bar.
    pub fn line(&self, text: &str) {
        match (&self.bar, self.mode) {
            (Some(bar), _) => bar.suspend(|| println!("{text}")),
            (None, ProgressMode::Quiet) => {}
            (None, _) => println!("{text}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `12.3k`-style rate.
pub fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// `1h02m03s`-style duration.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
