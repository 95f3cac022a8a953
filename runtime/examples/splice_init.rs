//! Crosses two models tensor by tensor, or by rows of a tensor, and scales
//! parts of one: a model directory holding one model's weights except the
//! parts taken from the other or multiplied by a factor. `stepgraph train
//! --init-from` starts a run from it, so a run that learns and one that does
//! not can trade parts of their initial weights until the part that decides
//! is found (tests/gpu/STATE-TRACKING.md, "Next: round 26"), and a part can
//! be drawn smaller or larger than the recipe draws it without a new flag.
//!
//! ```sh
//! cargo run --release --example splice_init -- BASE DONOR OUT PART...
//! cargo run --release --example splice_init -- BASE - OUT PART*FACTOR...
//! cargo run --release --example splice_init -- --run CHECKPOINT - OUT PART*FACTOR...
//! ```
//!
//! BASE and DONOR are model directories of one config (`config.json` and
//! `model.safetensors`: a checkpoint, its `ema/`, or `stepgraph init`'s
//! output). OUT, created, holds BASE's weights with every PART from DONOR. A
//! PART (`stepgraph::train::edit::ParamPart`, as `stepgraph train --edit`
//! reads it) is a substring of tensor names (`embedding`, `layers.1.`,
//! `dt_bias`), optionally with a row range `NAME:LO-HI`: rows `LO..HI` of
//! every matching 2-D tensor. `in_proj.weight:640-704` at d_model 128,
//! d_state 64 and 16 heads is every layer's `dt`, `A`, trapezoid and angle
//! rows (the rows follow the official order: z, x, B, C, dt, A, trapezoid,
//! angles). `PART*FACTOR` (a finite factor) multiplies BASE's part instead
//! of taking DONOR's; DONOR `-` names no donor, for scaled parts alone. A
//! part that matches no tensor, or rows that a matching tensor does not
//! have, is an error: a typo never splices nothing.
//!
//! With `--run` first, BASE is a training checkpoint
//! (`<run>/checkpoints/step-N`, with its `train_state.json`) and OUT becomes
//! a new run directory whose one checkpoint `stepgraph train --resume OUT`
//! continues at the same step, rows and schedule, with the parts changed in
//! the weights and in the weight average alike and their Adam moments
//! zeroed (a part changed mid-run has no history). That is the causal test of a state a run has
//! grown: change it at step N and see whether the run's course changes
//! (tests/gpu/STATE-TRACKING.md, the middle layer's long memory). `stepgraph
//! train --edit PART*FACTOR@N` makes the same edit inside a run.

use std::path::PathBuf;
use std::process::ExitCode;

use stepgraph::mamba3::checkpoint::{self, CheckpointError};
use stepgraph::mamba3::cpu::{ParamSpec, Weights, param_specs};
use stepgraph::train::TrainError;
use stepgraph::train::checkpoint::{
    self as run_ckpt, CHECKPOINTS_DIR, STATE_FILE, config_difference,
};
use stepgraph::train::edit::{ParamPart, PartError, Span, zero_moments};

/// One part taken from the donor, or scaled in place.
#[derive(Debug, Clone, PartialEq)]
struct Part {
    /// The tensors, or rows of them, it takes.
    part: ParamPart,
    /// `Some(f)`: BASE's part times `f`; `None`: DONOR's part.
    scale: Option<f32>,
}

#[derive(Debug, thiserror::Error)]
enum SpliceError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("{0}: OUT must not exist yet (a resumable copy is a new run)")]
    OutExists(String),
    #[error(
        "{0}: --run needs a training checkpoint (`<run>/checkpoints/step-N`, with {STATE_FILE})"
    )]
    NotARun(String),
    #[error("{donor}: another model than {base}'s: {field} is {found} there, {expected} in BASE")]
    Mismatch {
        base: String,
        donor: String,
        field: String,
        found: String,
        expected: String,
    },
    #[error(transparent)]
    Part(#[from] PartError),
    #[error("part `{0}` is taken from the donor, but DONOR is `-`")]
    NoDonor(String),
}

struct Args {
    /// `--run`: BASE is a training checkpoint and OUT a resumable run.
    run: bool,
    base: PathBuf,
    /// `None`: DONOR `-`, every part scaled.
    donor: Option<PathBuf>,
    out: PathBuf,
    parts: Vec<Part>,
}

fn main() -> ExitCode {
    let Some(args) = parse(std::env::args().skip(1).collect()) else {
        eprintln!("usage: splice_init [--run] BASE DONOR|- OUT PART[:LO-HI][*FACTOR]...");
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
    let (run, v) = match v.split_first() {
        Some((flag, rest)) if flag == "--run" => (true, rest),
        _ => (false, v.as_slice()),
    };
    let [base, donor, out, parts @ ..] = v else {
        return None;
    };
    if parts.is_empty() {
        return None;
    }
    Some(Args {
        run,
        base: base.into(),
        donor: (donor != "-").then(|| donor.into()),
        out: out.into(),
        parts: parts.iter().map(|p| part(p)).collect::<Option<_>>()?,
    })
}

fn part(s: &str) -> Option<Part> {
    let (s, scale) = match s.rsplit_once('*') {
        None => (s, None),
        Some((s, f)) => (s, Some(f.parse::<f32>().ok().filter(|f| f.is_finite())?)),
    };
    Some(Part {
        part: s.parse().ok()?,
        scale,
    })
}

/// Writes the spliced model to `args.out`; returns one line per tensor
/// taken (whole or in part) from the donor.
fn splice(args: &Args) -> Result<String, SpliceError> {
    if args.run {
        return splice_run(args);
    }
    let (cfg, mut weights) = checkpoint::load::<f32>(&args.base)?;
    let donor = donor(args, &cfg)?;
    let (report, _) = take(
        &mut weights,
        donor.as_ref(),
        &param_specs(&cfg),
        &args.parts,
    )?;
    checkpoint::save(&args.out, &cfg, &weights)?;
    Ok(report)
}

/// [`splice`] of a training checkpoint: OUT is a run directory holding the
/// changed checkpoint, for `stepgraph train --resume`.
fn splice_run(args: &Args) -> Result<String, SpliceError> {
    if !args.base.join(STATE_FILE).is_file() {
        return Err(SpliceError::NotARun(args.base.display().to_string()));
    }
    if args.out.exists() {
        return Err(SpliceError::OutExists(args.out.display().to_string()));
    }
    let (cfg, mut state, train) = run_ckpt::load(&args.base)?;
    let mut ema = run_ckpt::load_ema(&args.base, &cfg, &train)?;
    let donor = donor(args, &cfg)?;
    let specs = param_specs(&cfg);
    let (report, changed) = take(&mut state.weights, donor.as_ref(), &specs, &args.parts)?;
    if let Some(avg) = &mut ema {
        take(avg, donor.as_ref(), &specs, &args.parts)?;
    }
    zero_moments(&mut state, &changed);
    let dir = run_ckpt::save(
        &args.out.join(CHECKPOINTS_DIR),
        &cfg,
        &state,
        ema.as_ref(),
        &train,
        1,
        &[],
    )?;
    Ok(format!(
        "{report}resumable at step {} ({}); the Adam moments of the parts zeroed\n",
        train.step,
        dir.display()
    ))
}

/// The donor's weights (`None` for DONOR `-`), refused when its model is
/// another than BASE's.
fn donor(
    args: &Args,
    cfg: &stepgraph::mamba3::Mamba3Config,
) -> Result<Option<Weights<f32>>, SpliceError> {
    Ok(match &args.donor {
        None => None,
        Some(path) => {
            let (donor_cfg, donor) = checkpoint::load::<f32>(path)?;
            if let Some((field, found, expected)) = config_difference(&donor_cfg, cfg) {
                return Err(SpliceError::Mismatch {
                    base: args.base.display().to_string(),
                    donor: path.display().to_string(),
                    field,
                    found,
                    expected,
                });
            }
            Some(donor)
        }
    })
}

/// Copies every part from `donor` into `weights`, or scales it there (both
/// in `specs` order). Returns the report and where the values changed.
fn take(
    weights: &mut Weights<f32>,
    donor: Option<&Weights<f32>>,
    specs: &[ParamSpec],
    parts: &[Part],
) -> Result<(String, Vec<Span>), SpliceError> {
    let mut report = String::new();
    let mut changed = Vec::new();
    let donors = donor.map(Weights::tensors);
    let mut tensors = weights.tensors_mut();
    for p in parts {
        let rows = p
            .part
            .rows
            .map_or_else(String::new, |(lo, hi)| format!(" rows {lo}..{hi}"));
        for Span {
            tensor: i,
            start,
            end,
        } in p.part.spans(specs)?
        {
            let (name, dst) = (&specs[i].name, &mut tensors[i]);
            match (p.scale, &donors) {
                (Some(f), _) => {
                    dst[start..end].iter_mut().for_each(|v| *v *= f);
                    report.push_str(&format!("{name}{rows} times {f}\n"));
                }
                (None, Some(src)) => {
                    dst[start..end].copy_from_slice(&src[i][start..end]);
                    report.push_str(&format!("{name}{rows} from the donor\n"));
                }
                (None, None) => return Err(SpliceError::NoDonor(p.part.name.clone())),
            }
            changed.push(Span {
                tensor: i,
                start,
                end,
            });
        }
    }
    Ok((report, changed))
}

// The CPU training tests' tiny run, for the resumable mode's test.
#[cfg(test)]
#[path = "../tests/train_common/mod.rs"]
mod train_common;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
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

    /// Checks every value the model directory `out` holds against `want`,
    /// given the tensor's name, the value's row and the base's (init 1) and
    /// donor's (init 2) values there.
    fn assert_values(cfg: &Mamba3Config, out: &Path, want: impl Fn(&str, usize, f32, f32) -> f32) {
        let (_, got) = checkpoint::load::<f32>(out).unwrap();
        let (a, b) = (
            Weights::<f32>::init(cfg, 1).unwrap(),
            Weights::<f32>::init(cfg, 2).unwrap(),
        );
        for (((spec, g), a), b) in param_specs(cfg)
            .iter()
            .zip(got.tensors())
            .zip(a.tensors())
            .zip(b.tensors())
        {
            let cols = spec.shape.last().copied().unwrap_or(1);
            for (i, v) in g.iter().enumerate() {
                let w = want(&spec.name, i / cols, a[i], b[i]);
                assert_eq!(*v, w, "{} [{i}]", spec.name);
            }
        }
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
        assert_values(&cfg, &out, |name, row, a, b| {
            let from_donor = name.contains("embedding")
                || (name.contains("in_proj.weight") && (2..5).contains(&row));
            if from_donor { b } else { a }
        });
    }

    #[test]
    fn a_scaled_part_is_the_base_times_its_factor_with_or_without_a_donor() {
        let (dir, cfg, base, donor) = base_and_donor();
        for (name, with_donor) in [("scaled", false), ("both", true)] {
            let out = dir.path().join(name);
            let mut args: Vec<String> = vec![
                base.display().to_string(),
                if with_donor {
                    donor.display().to_string()
                } else {
                    "-".into()
                },
                out.display().to_string(),
                "out_proj*0.25".into(),
                "embedding.weight:1-3*-2".into(),
            ];
            if with_donor {
                args.push("dt_bias".into());
            }
            let report = splice(&parse(args).unwrap()).unwrap();
            assert!(report.contains("out_proj.weight times 0.25"), "{report}");
            assert!(
                report.contains("embedding.weight rows 1..3 times -2"),
                "{report}"
            );
            assert_values(&cfg, &out, |name, row, a, b| {
                if name.contains("out_proj") {
                    a * 0.25
                } else if name.contains("embedding") && (1..3).contains(&row) {
                    a * -2.0
                } else if with_donor && name.contains("dt_bias") {
                    b
                } else {
                    a
                }
            });
        }
    }

    /// `train_common`'s tiny parity run with two blocks (so that
    /// `layers.1.` names one) and a weight average, trained on the CPU for
    /// `steps` (checkpointed at the end) in `dir`, or resumed from `from`
    /// and extended to `steps`.
    fn tiny_run(dir: &Path, steps: u64, from: Option<&Path>) {
        use stepgraph::train::{ModelSize, Resume, RunConfig, Setting, Stop, train};
        let base = train_common::run_config(steps);
        let run = RunConfig {
            model: ModelSize {
                n_layer: 2,
                ..base.model
            },
            ema: Some(0.9),
            ..base
        };
        let opts = stepgraph::train::TrainOptions {
            run,
            run_dir: from.is_none().then(|| dir.to_path_buf()),
            resume: from.map(|f| Resume {
                from: f.to_path_buf(),
                given: vec![Setting::Steps],
            }),
            ..train_common::options(dir, steps)
        };
        train(&opts, &Stop::new()).unwrap();
    }

    #[test]
    fn a_training_checkpoint_becomes_a_resumable_run_with_the_parts_changed() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        // Past the average's first fold (every 10 steps), so it is saved.
        tiny_run(&src, 12, None);
        let ckpt = src.join(CHECKPOINTS_DIR).join(run_ckpt::step_dir_name(12));
        let out = dir.path().join("edited");
        let args = parse(args_of(&ckpt, &out)).unwrap();
        let report = splice(&args).unwrap();
        assert!(report.contains("resumable at step 12"), "{report}");
        let (cfg, base, base_train) = run_ckpt::load(&ckpt).unwrap();
        let base_avg = run_ckpt::load_ema(&ckpt, &cfg, &base_train)
            .unwrap()
            .unwrap();
        let edited_dir = out.join(CHECKPOINTS_DIR).join(run_ckpt::step_dir_name(12));
        let (_, got, train) = run_ckpt::load(&edited_dir).unwrap();
        let got_avg = run_ckpt::load_ema(&edited_dir, &cfg, &train)
            .unwrap()
            .unwrap();
        assert_eq!(train.step, 12);
        // Which values the parts cover: (tensor name, row) -> factor.
        let factor = |name: &str, row: usize| -> Option<f32> {
            if name.contains("layers.1.mixer.in_proj.weight") && (1..3).contains(&row) {
                Some(0.0)
            } else if name.contains("dt_bias") {
                Some(-1.0)
            } else {
                None
            }
        };
        let specs = param_specs(&cfg);
        let mut covered = 0;
        for (i, spec) in specs.iter().enumerate() {
            let cols = if spec.shape.len() == 2 {
                spec.shape[1]
            } else {
                1
            };
            let tensors = [
                (base.weights.tensors()[i], got.weights.tensors()[i]),
                (base_avg.tensors()[i], got_avg.tensors()[i]),
            ];
            for (b, g) in tensors {
                for (k, (b, g)) in b.iter().zip(g).enumerate() {
                    let want = factor(&spec.name, k / cols).map_or(*b, |f| b * f);
                    assert_eq!(*g, want, "{} [{k}]", spec.name);
                }
            }
            let ((bm, bv), (gm, gv)) = (&base.moments[i], &got.moments[i]);
            for k in 0..bm.len() {
                if factor(&spec.name, k / cols).is_some() {
                    covered += 1;
                    assert_eq!((gm[k], gv[k]), (0.0, 0.0), "{} moments [{k}]", spec.name);
                } else {
                    assert_eq!(
                        (gm[k], gv[k]),
                        (bm[k], bv[k]),
                        "{} moments [{k}]",
                        spec.name
                    );
                }
            }
        }
        assert!(covered > 0);
        // The copy trains on from step 12; a second copy into it is refused.
        tiny_run(&out, 14, Some(&out));
        assert!(
            out.join(CHECKPOINTS_DIR)
                .join(run_ckpt::step_dir_name(14))
                .is_dir()
        );
        assert!(
            splice(&args)
                .unwrap_err()
                .to_string()
                .contains("must not exist yet"),
            "OUT is refused once it exists"
        );
        // Without --run the same checkpoint is a model directory, as before.
        let model_dir = dir.path().join("model");
        let plain = Args {
            run: false,
            out: model_dir.clone(),
            ..parse(args_of(&ckpt, &out)).unwrap()
        };
        splice(&plain).unwrap();
        assert!(!model_dir.join(CHECKPOINTS_DIR).exists());
        assert_eq!(checkpoint::load::<f32>(&model_dir).unwrap().0, cfg);
        // --run refuses a plain model directory.
        let wrong = Args {
            base: model_dir.clone(),
            out: dir.path().join("again"),
            ..parse(args_of(&ckpt, &out)).unwrap()
        };
        let msg = splice(&wrong).unwrap_err().to_string();
        assert!(msg.contains("--run needs a training checkpoint"), "{msg}");
    }

    /// `--run CKPT - OUT` with the two parts the resumable test changes.
    fn args_of(ckpt: &Path, out: &Path) -> Vec<String> {
        let paths = [
            ckpt.display().to_string(),
            "-".into(),
            out.display().to_string(),
        ];
        let parts = ["layers.1.mixer.in_proj.weight:1-3*0", "dt_bias*-1"];
        std::iter::once("--run".to_owned())
            .chain(paths)
            .chain(parts.map(str::to_owned))
            .collect()
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
                run: false,
                base: base.clone(),
                donor: Some(donor.clone()),
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
        assert_eq!(part("x*inf"), None);
        assert_eq!(part("x*"), None);
        let no_donor = Args {
            run: false,
            base: base.clone(),
            donor: None,
            out: out.clone(),
            parts: vec![part("embedding").unwrap()],
        };
        assert_eq!(
            splice(&no_donor).unwrap_err().to_string(),
            "part `embedding` is taken from the donor, but DONOR is `-`"
        );
        assert_eq!(part(":1-2"), None);
        assert!(parse(vec!["a".into(), "b".into(), "c".into()]).is_none());
    }
}
