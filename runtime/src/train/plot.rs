//! `plot.svg`: the run's training and evaluation loss (log scale) and its
//! evaluation accuracy, drawn with `plotters` (SVG backend: axes, ticks,
//! labelled axes, a legend per panel). It is drawn from `metrics.jsonl`, so
//! a resumed run's plot covers the whole run.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

use super::TrainError;
use super::report::{METRICS_FILE, PLOT_FILE};

/// `(step, value)` points of one plotted line.
pub type Series = Vec<(f64, f64)>;

/// Points per plotted series: longer ones are thinned to bucket means.
const MAX_POINTS: usize = 1000;

/// Loss values below this are drawn at it (a solved task reaches ~1e-6,
/// which would squash the rest of the log axis).
const LOSS_FLOOR: f64 = 1e-4;

/// What the metrics file holds, by series.
#[derive(Debug, Default)]
struct Metrics {
    train: Series,
    eval_loss: BTreeMap<String, Series>,
    eval_acc: BTreeMap<String, Series>,
}

fn read_metrics(path: &Path) -> Result<Metrics, TrainError> {
    let file = File::open(path).map_err(TrainError::io(path))?;
    let mut m = Metrics::default();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(TrainError::io(path))?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let step = v["step"].as_f64().unwrap_or(0.0);
        match v["kind"].as_str() {
            Some("train") => {
                if let Some(l) = v["loss"].as_f64() {
                    m.train.push((step, l));
                }
            }
            Some(kind @ ("eval" | "eval_ema")) => {
                let mut set = v["set"].as_str().unwrap_or("eval").to_owned();
                // The weight average's scores (`--ema`) are series of their own.
                if kind == "eval_ema" {
                    set.push_str(" ema");
                }
                if let Some(l) = v["loss"].as_f64() {
                    m.eval_loss.entry(set.clone()).or_default().push((step, l));
                }
                if let Some(a) = v["accuracy"].as_f64() {
                    m.eval_acc.entry(set).or_default().push((step, 100.0 * a));
                }
            }
            _ => {}
        }
    }
    Ok(m)
}

/// The eval accuracy series (percent, by set label) of a run directory's
/// `metrics.jsonl`.
pub fn eval_accuracy(run_dir: &Path) -> Result<BTreeMap<String, Series>, TrainError> {
    Ok(read_metrics(&run_dir.join(METRICS_FILE))?.eval_acc)
}

/// One line of [`write_lines_plot`]: lines of one `group` share a colour and
/// one legend entry, `label` (the group's first line's).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend text of the group.
    pub label: String,
    /// Colour group.
    pub group: usize,
    /// `(x, y)` points.
    pub points: Series,
}

/// One panel of lines over steps, `y` in `y_range`, with a legend per group
/// (several runs of a setting drawn in one colour): the state-tracking
/// reproduction's accuracy-over-steps plots.
pub fn write_lines_plot(
    path: &Path,
    title: &str,
    y_desc: &str,
    y_range: (f64, f64),
    lines: &[Line],
) -> Result<(), TrainError> {
    let mut svg = String::new();
    draw_lines(&mut svg, title, y_desc, y_range, lines).map_err(plot_error(path))?;
    std::fs::write(path, svg).map_err(TrainError::io(path))
}

fn draw_lines(
    svg: &mut String,
    title: &str,
    y_desc: &str,
    (y0, y1): (f64, f64),
    lines: &[Line],
) -> DrawResult {
    let root = SVGBackend::with_string(svg, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let named: Vec<(String, Series)> = lines
        .iter()
        .map(|l| (l.label.clone(), thin(l.points.clone())))
        .collect();
    let (x0, x1) = x_range(named.iter());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .draw()
        .map_err(boxed)?;
    let mut labelled = std::collections::BTreeSet::new();
    for (line, (_, points)) in lines.iter().zip(&named) {
        let color = Palette99::pick(line.group).to_rgba();
        let drawn = chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(boxed)?;
        if labelled.insert(line.group) {
            drawn.label(line.label.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
    }
    if !labelled.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(boxed)?;
    }
    root.present().map_err(boxed)?;
    Ok(())
}

fn plot_error(path: &Path) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> TrainError {
    let path = path.to_path_buf();
    move |source| TrainError::Plot { path, source }
}

/// Writes `plot.svg` from the run's `metrics.jsonl`; returns its path.
pub fn write_plot(run_dir: &Path) -> Result<PathBuf, TrainError> {
    let m = read_metrics(&run_dir.join(METRICS_FILE))?;
    let mut loss: Vec<(String, Series)> = vec![("train".into(), thin(m.train))];
    loss.extend(
        m.eval_loss
            .into_iter()
            .map(|(k, s)| (format!("eval {k}"), thin(s))),
    );
    for (_, s) in &mut loss {
        for p in s.iter_mut() {
            p.1 = p.1.max(LOSS_FLOOR);
        }
    }
    let acc: Vec<(String, Series)> = m
        .eval_acc
        .into_iter()
        .map(|(k, s)| (format!("eval {k}"), thin(s)))
        .collect();
    let path = run_dir.join(PLOT_FILE);
    let mut svg = String::new();
    draw(&mut svg, &loss, &acc).map_err(plot_error(&path))?;
    std::fs::write(&path, svg).map_err(TrainError::io(&path))?;
    Ok(path)
}

type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn boxed<E: std::error::Error + Send + Sync + 'static>(
    e: DrawingAreaErrorKind<E>,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

/// Two panels side by side: loss on a log axis, accuracy in percent.
fn draw(svg: &mut String, loss: &[(String, Series)], acc: &[(String, Series)]) -> DrawResult {
    let root = SVGBackend::with_string(svg, (1100, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (left, right) = root.split_horizontally(560);
    let (x0, x1) = x_range(loss.iter().chain(acc));
    let (lo, hi) = y_range(loss).unwrap_or((LOSS_FLOOR, 1.0));
    let mut chart = ChartBuilder::on(&left)
        .caption("loss (log scale)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, (lo..hi).log_scale())
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy (nats)")
        .y_label_formatter(&|v| format!("{v:.3}"))
        .draw()
        .map_err(boxed)?;
    lines(&mut chart, loss)?;
    let mut chart = ChartBuilder::on(&right)
        .caption("eval accuracy at scored positions (%)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, 0.0..100.0)
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("accuracy (%)")
        .draw()
        .map_err(boxed)?;
    lines(&mut chart, acc)?;
    root.present().map_err(boxed)?;
    Ok(())
}

/// One line per series, with a legend entry each.
fn lines<'a, Y>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    series: &[(String, Series)],
) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    if series.iter().all(|(_, s)| s.is_empty()) {
        return Ok(());
    }
    for (i, (name, s)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let width = if i == 0 && series.len() > 1 { 1 } else { 2 };
        chart
            .draw_series(LineSeries::new(
                s.iter().copied(),
                color.stroke_width(width),
            ))
            .map_err(boxed)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(boxed)
}

fn x_range<'a>(series: impl Iterator<Item = &'a (String, Series)>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for (_, s) in series {
        for &(x, _) in s {
            lo = lo.min(x);
            hi = hi.max(x);
        }
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    if hi - lo < 1.0 {
        hi = lo + 1.0;
    }
    (lo, hi)
}

/// The loss axis: the data's range, widened to a factor of at least 2.
fn y_range(series: &[(String, Series)]) -> Option<(f64, f64)> {
    let ys = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
    let (lo, hi) = ys
        .filter(|y| y.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, y| {
            Some(acc.map_or((y, y), |(a, b)| (a.min(y), b.max(y))))
        })?;
    Some((lo / 1.2, (hi * 1.2).max(lo * 2.0)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_axes_ticks_and_a_legend() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for step in 1..=40u32 {
            let loss = 2.0 * 0.9f64.powi(i32::try_from(step).unwrap());
            text.push_str(&format!(
                "{{\"kind\":\"train\",\"step\":{step},\"loss\":{loss}}}\n"
            ));
            if step % 10 == 0 {
                text.push_str(&format!(
                    "{{\"kind\":\"eval\",\"step\":{step},\"set\":\"len 8\",\"loss\":{loss},\"accuracy\":0.75}}\n"
                ));
            }
        }
        std::fs::write(dir.path().join(METRICS_FILE), text).unwrap();
        let path = write_plot(dir.path()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for needle in [
            "loss (log scale)",
            "step",
            "eval len 8",
            "train",
            "<polyline",
        ] {
            assert!(svg.contains(needle), "`{needle}` missing");
        }
        assert!(svg.matches("<text").count() > 15, "tick labels");
    }

    #[test]
    fn a_lines_plot_has_one_legend_entry_per_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.svg");
        let line = |label: &str, group, k: f64| Line {
            label: label.into(),
            group,
            points: (0..5).map(|i| (f64::from(i), k * f64::from(i))).collect(),
        };
        let lines = [
            line("data", 0, 10.0),
            line("data", 0, 12.0),
            line("none", 1, 1.0),
        ];
        write_lines_plot(&path, "parity", "scaled accuracy (%)", (0.0, 100.0), &lines).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            svg.matches("\ndata\n").count(),
            1,
            "one legend entry per group"
        );
        assert!(svg.contains("\nnone\n") && svg.contains("parity"));
        assert_eq!(
            svg.matches("stroke-width=\"2\" points").count(),
            5,
            "three lines, two legend marks"
        );
    }

    #[test]
    fn the_weight_average_is_a_series_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let text = "{\"kind\":\"eval\",\"step\":10,\"set\":\"len 8\",\"loss\":1.0,\"accuracy\":0.5}\n\
                    {\"kind\":\"eval_ema\",\"step\":10,\"set\":\"len 8\",\"loss\":0.5,\"accuracy\":0.75}\n";
        std::fs::write(dir.path().join(METRICS_FILE), text).unwrap();
        let acc = eval_accuracy(dir.path()).unwrap();
        assert_eq!(acc["len 8"], vec![(10.0, 50.0)]);
        assert_eq!(acc["len 8 ema"], vec![(10.0, 75.0)]);
    }

    #[test]
    fn an_empty_metrics_file_still_draws_axes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_FILE), "").unwrap();
        let svg = std::fs::read_to_string(write_plot(dir.path()).unwrap()).unwrap();
        assert!(svg.contains("accuracy"));
    }
}
