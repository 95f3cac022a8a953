//! Crosses two models tensor by tensor, or by rows of a tensor: a model
//! directory holding one model's weights except the parts taken from the
//! other. `stepgraph train --init-from` starts a run from it, so a run that
//! learns and one that does not can trade parts of their initial weights
//! until the part that decides is found (tests/gpu/STATE-TRACKING.md,
//! "Next: round 26").
//!
//! ```sh
//! cargo run --release --example splice_init -- BASE DONOR OUT PART...
//! ```
//!
//! BASE and DONOR are model directories of one config (`config.json` and
//! `model.safetensors`: a checkpoint, its `ema/`, or `stepgraph init`'s
//! output). OUT, created, holds BASE's weights with every PART from DONOR. A
//! PART is a substring of tensor names (`embedding`, `layers.1.`,
//! `dt_bias`), optionally with a row range `NAME:LO-HI`: rows `LO..HI` of
//! every matching 2-D tensor. `in_proj.weight:640-704` at d_model 128,
//! d_state 64 and 16 heads is every layer's `dt`, `A`, trapezoid and angle
//! rows (the rows follow the official order: z, x, B, C, dt, A, trapezoid,
//! angles). A part that matches no tensor, or rows that a matching tensor
//! does not have, is an error: a typo never splices nothing.

use std::path::PathBuf;
use std::process::ExitCode;

use stepgraph::mamba3::checkpoint::{self, CheckpointError};
use stepgraph::mamba3::cpu::{Weights, param_specs};
use stepgraph::train::checkpoint::config_difference;

/// One part taken from the donor.
#[derive(Debug, Clone, PartialEq)]
struct Part {
    /// A substring of the tensor names it takes.
    name: String,
    /// Rows `lo..hi` of each matching tensor; `None`: the whole tensor.
    rows: Option<(usize, usize)>,
}

#[derive(Debug, thiserror::Error)]
enum SpliceError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{donor}: another model than {base}'s: {field} is {found} there, {expected} in BASE")]
    Mismatch {
        base: String,
        donor: String,
        field: String,
        found: String,
        expected: String,
    },
    #[error("part `{0}` matches no tensor")]
    NoMatch(String),
    #[error("part `{part}`: {tensor} of shape {shape:?} has no rows {lo}..{hi}")]
    Rows {
        part: String,
        tensor: String,
        shape: Vec<usize>,
        lo: usize,
        hi: usize,
    },
}

struct Args {
    base: PathBuf,
    donor: PathBuf,
    out: PathBuf,
    parts: Vec<Part>,
}

fn main() -> ExitCode {
    let Some(args) = parse(std::env::args().skip(1).collect()) else {
        eprintln!("usage: splice_init BASE DONOR OUT PART[:LO-HI]...");
        return ExitCode::from(2);
    };
    match splice(&args) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(v: Vec<String>) -> Option<Args> {
    let [base, donor, out, parts @ ..] = v.as_slice() else {
        return None;
    };
    if parts.is_empty() {
        return None;
    }
    Some(Args {
        base: base.into(),
        donor: donor.into(),
        out: out.into(),
        parts: parts.iter().map(|p| part(p)).collect::<Option<_>>()?,
    })
}

fn part(s: &str) -> Option<Part> {
    let (name, rows) = match s.split_once(':') {
        None => (s, None),
        Some((name, range)) => {
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (lo.parse().ok()?, hi.parse().ok()?);
            (name, (lo < hi).then_some((lo, hi)).map(Some)?)
        }
    };
    (!name.is_empty()).then(|| Part {
        name: name.to_owned(),
        rows,
    })
}

/// Writes the spliced model to `args.out`; returns one line per tensor
/// taken (whole or in part) from the donor.
fn splice(args: &Args) -> Result<String, SpliceError> {
    let (cfg, mut weights) = checkpoint::load::<f32>(&args.base)?;
    let (donor_cfg, donor) = checkpoint::load::<f32>(&args.donor)?;
    if let Some((field, found, expected)) = config_difference(&donor_cfg, &cfg) {
        return Err(SpliceError::Mismatch {
            base: args.base.display().to_string(),
            donor: args.donor.display().to_string(),
            field,
            found,
            expected,
        });
    }
    let report = take(&mut weights, &donor, &param_specs(&cfg), &args.parts)?;
    checkpoint::save(&args.out, &cfg, &weights)?;
    Ok(report)
}

/// Copies every part from `donor` into `weights` (both in `specs` order).
fn take(
    weights: &mut Weights<f32>,
    donor: &Weights<f32>,
    specs: &[stepgraph::mamba3::cpu::ParamSpec],
    parts: &[Part],
) -> Result<String, SpliceError> {
    let mut report = String::new();
    let mut tensors = weights.tensors_mut();
    for p in parts {
        let mut matched = false;
        for ((spec, dst), src) in specs.iter().zip(&mut tensors).zip(donor.tensors()) {
            if !spec.name.contains(&p.name) {
                continue;
            }
            matched = true;
            let (lo, hi, rows) = match (p.rows, spec.shape.as_slice()) {
                (None, _) => (0, src.len(), String::new()),
                (Some((lo, hi)), [n, cols]) if hi <= *n => {
                    (lo * cols, hi * cols, format!(" rows {lo}..{hi}"))
                }
                (Some((lo, hi)), shape) => {
                    return Err(SpliceError::Rows {
                        part: p.name.clone(),
                        tensor: spec.name.clone(),
                        shape: shape.to_vec(),
                        lo,
                        hi,
                    });
                }
            };
            dst[lo..hi].copy_from_slice(&src[lo..hi]);
            report.push_str(&format!("{}{rows} from the donor\n", spec.name));
        }
        if !matched {
            return Err(SpliceError::NoMatch(p.name.clone()));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepgraph::mamba3::Mamba3Config;

    fn model(dir: &std::path::Path, name: &str, cfg: &Mamba3Config, seed: u64) -> PathBuf {
        let path = dir.join(name);
        checkpoint::save(&path, cfg, &Weights::<f32>::init(cfg, seed).unwrap()).unwrap();
        path
    }

    /// A temporary directory holding the tiny model's inits of seeds 1
    /// (the base) and 2 (the donor).
    fn base_and_donor() -> (tempfile::TempDir, Mamba3Config, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Mamba3Config::tiny();
        let base = model(dir.path(), "a", &cfg, 1);
        let donor = model(dir.path(), "b", &cfg, 2);
        (dir, cfg, base, donor)
    }

    #[test]
    fn parts_come_from_the_donor_and_the_rest_from_the_base() {
        let (dir, cfg, base, donor) = base_and_donor();
        let out = dir.path().join("out");
        let args = parse(
            [&base, &donor, &out]
                .iter()
                .map(|p| p.display().to_string())
                .chain(["embedding".into(), "in_proj.weight:2-5".into()])
                .collect(),
        )
        .unwrap();
        let report = splice(&args).unwrap();
        assert!(
            report.contains("backbone.embedding.weight from the donor"),
            "{report}"
        );
        let (_, got) = checkpoint::load::<f32>(&out).unwrap();
        let (a, b) = (
            Weights::<f32>::init(&cfg, 1).unwrap(),
            Weights::<f32>::init(&cfg, 2).unwrap(),
        );
        for (((spec, g), a), b) in param_specs(&cfg)
            .iter()
            .zip(got.tensors())
            .zip(a.tensors())
            .zip(b.tensors())
        {
            let cols = spec.shape.last().copied().unwrap_or(1);
            for (i, v) in g.iter().enumerate() {
                let from_donor = spec.name.contains("embedding")
                    || (spec.name.contains("in_proj.weight") && (2..5).contains(&(i / cols)));
                assert_eq!(
                    *v,
                    if from_donor { b[i] } else { a[i] },
                    "{} [{i}]",
                    spec.name
                );
            }
        }
    }

    #[test]
    fn a_part_that_takes_nothing_or_another_model_is_refused() {
        let (dir, cfg, base, donor) = base_and_donor();
        let wide = Mamba3Config {
            d_model: 2 * cfg.d_model,
            ..cfg.clone()
        };
        let other = model(dir.path(), "c", &wide, 2);
        let out = dir.path().join("out");
        let run = |donor: &PathBuf, parts: &[&str]| {
            let args = Args {
                base: base.clone(),
                donor: donor.clone(),
                out: out.clone(),
                parts: parts.iter().map(|p| part(p).unwrap()).collect(),
            };
            splice(&args).unwrap_err().to_string()
        };
        assert_eq!(
            run(&donor, &["embeding"]),
            "part `embeding` matches no tensor"
        );
        assert_eq!(
            run(&donor, &["dt_bias:0-1"]),
            "part `dt_bias`: backbone.layers.0.mixer.dt_bias of shape [4] has no rows 0..1"
        );
        let too_far = run(&donor, &["in_proj.weight:0-100000"]);
        assert!(
            too_far.ends_with("in_proj.weight of shape [62, 8] has no rows 0..100000"),
            "{too_far}"
        );
        let msg = run(&other, &["embedding"]);
        assert!(msg.contains("d_model is 16 there, 8 in BASE"), "{msg}");
        assert!(!out.exists(), "nothing is written when refused");
        assert_eq!(part("x:5-5"), None);
        assert_eq!(part(":1-2"), None);
        assert!(parse(vec!["a".into(), "b".into(), "c".into()]).is_none());
    }
}
