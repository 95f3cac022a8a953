//! What the user sees: a progress bar (or plain lines when stderr is not a
//! terminal), eval lines, `metrics.jsonl` in the run directory, and an SVG
//! plot of loss and accuracy written at the end.
//!
//! The plot is hand-written SVG (two panels, polylines, min/max labels): it
//! needs no plotting dependency and opens in any browser. It is drawn from
//! `metrics.jsonl`, so a resumed run's plot covers the whole run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
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

type Series = Vec<(f64, f64)>;

/// Writes `plot.svg` from the run's `metrics.jsonl`; returns its path.
pub fn write_plot(run_dir: &Path) -> Result<PathBuf, TrainError> {
    let metrics = run_dir.join(METRICS_FILE);
    let file = File::open(&metrics).map_err(TrainError::io(&metrics))?;
    let mut train: Series = Vec::new();
    let mut eval_loss: BTreeMap<String, Series> = BTreeMap::new();
    let mut eval_acc: BTreeMap<String, Series> = BTreeMap::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(TrainError::io(&metrics))?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let step = v["step"].as_f64().unwrap_or(0.0);
        match v["kind"].as_str() {
            Some("train") => {
                if let Some(l) = v["loss"].as_f64() {
                    train.push((step, l));
                }
            }
            Some("eval") => {
                let set = v["set"].as_str().unwrap_or("eval").to_owned();
                if let Some(l) = v["loss"].as_f64() {
                    eval_loss.entry(set.clone()).or_default().push((step, l));
                }
                if let Some(a) = v["accuracy"].as_f64() {
                    eval_acc.entry(set).or_default().push((step, 100.0 * a));
                }
            }
            _ => {}
        }
    }
    // Loss spans decades (ln V at the start, ~1e-4 once a task is solved):
    // plot log10 of it. Long runs are thinned to bucket means.
    let log = |s: Series| -> Series {
        thin(s)
            .into_iter()
            .map(|(x, y)| (x, y.max(1e-4).log10()))
            .collect()
    };
    let mut loss_series = vec![("train".to_owned(), log(train))];
    loss_series.extend(
        eval_loss
            .into_iter()
            .map(|(k, s)| (format!("eval {k}"), log(s))),
    );
    let acc_series: Vec<(String, Series)> =
        eval_acc.into_iter().map(|(k, s)| (k, thin(s))).collect();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"450\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"1000\" height=\"450\" fill=\"white\"/>\n"
    );
    panel(&mut svg, 0.0, "loss (log scale)", &loss_series, None, true);
    panel(
        &mut svg,
        500.0,
        "eval accuracy (%)",
        &acc_series,
        Some((0.0, 100.0)),
        false,
    );
    svg.push_str("</svg>\n");
    let path = run_dir.join(PLOT_FILE);
    std::fs::write(&path, svg).map_err(TrainError::io(&path))?;
    Ok(path)
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One 500x420 panel at x offset `x0`: frame, axis labels, polylines, legend.
fn panel(
    svg: &mut String,
    x0: f64,
    title: &str,
    series: &[(String, Series)],
    y_fixed: Option<(f64, f64)>,
    log: bool,
) {
    let ylabel = |v: f64| if log { tick(10f64.powf(v)) } else { tick(v) };
    let (left, top, w, h) = (x0 + 60.0, 30.0, 410.0, 330.0);
    let points = series.iter().flat_map(|(_, s)| s.iter());
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymin = ymin.min(y);
        ymax = ymax.max(y);
    }
    if let Some((lo, hi)) = y_fixed {
        (ymin, ymax) = (lo, hi);
    }
    if xmin > xmax {
        (xmin, xmax, ymin, ymax) = (0.0, 1.0, 0.0, 1.0);
    }
    if xmax - xmin < 1e-12 {
        xmax = xmin + 1.0;
    }
    if ymax - ymin < 1e-12 {
        ymax = ymin + 1.0;
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"18\" font-size=\"14\">{title}</text>\n\
         <rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"none\" stroke=\"#888\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{left:.1}\" y=\"{:.1}\">{}</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">step {}</text>",
        left,
        left - 4.0,
        top + 10.0,
        ylabel(ymax),
        left - 4.0,
        top + h,
        ylabel(ymin),
        top + h + 16.0,
        tick(xmin),
        left + w,
        top + h + 16.0,
        tick(xmax),
    );
    for (i, (name, s)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .iter()
            .map(|&(x, y)| {
                let px = left + (x - xmin) / (xmax - xmin) * w;
                let py = top + h - (y.clamp(ymin, ymax) - ymin) / (ymax - ymin) * h;
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let width = if i == 0 && log { 1.0 } else { 2.0 };
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{}\"/>",
            pts.join(" ")
        );
        let ly = top + h + 34.0 + 14.0 * f64::from(u8::try_from(i / 3).unwrap_or(u8::MAX));
        let lx = left + 140.0 * f64::from(u8::try_from(i % 3).unwrap_or(0));
        let _ = writeln!(
            svg,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"10\" height=\"3\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>",
            ly - 4.0,
            lx + 14.0,
            escape(name)
        );
    }
}

fn tick(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() < 0.01 {
        format!("{v:.0e}")
    } else {
        format!("{v:.3}")
    }
}

/// At most [`MAX_POINTS`] points: consecutive buckets replaced by their means.
fn thin(s: Series) -> Series {
    if s.len() <= MAX_POINTS {
        return s;
    }
    let per = s.len().div_ceil(MAX_POINTS);
    s.chunks(per)
        .map(|c| {
            let n = c.len() as f64;
            (
                c.iter().map(|p| p.0).sum::<f64>() / n,
                c.iter().map(|p| p.1).sum::<f64>() / n,
            )
        })
        .collect()
}

/// Points per plotted series.
const MAX_POINTS: usize = 1000;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
