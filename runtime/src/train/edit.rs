//! Parts of a model's parameters named by text, and edits of them at a
//! chosen training step (`stepgraph train --edit`).
//!
//! A part is what `examples/splice_init` trades between models and what an
//! edit scales: the tensors whose names contain a substring (`embedding`,
//! `layers.1.`, `dt_bias`), or rows `LO..HI` of each matching 2-D tensor
//! (`in_proj.weight:656-672`, at d_model 128, d_state 64 and 16 heads every
//! layer's `A` rows: the official row order is z, x, B, C, dt, A,
//! trapezoid, angles). A part that matches nothing, or rows a matching
//! tensor lacks, is an error, so a typo never edits nothing.
//!
//! An edit `PART*FACTOR@STEP` multiplies the part by `FACTOR` once the run
//! has trained `STEP` steps, before step `STEP + 1`: in the trained weights
//! and in the weight average alike, with the part's Adam moments zeroed (a
//! part changed mid-run has no history). That is the causal test of a state
//! a run has grown, made part of a run's recipe: `*0` on the middle block's
//! `A` rows gives every head of that block `A = softplus(0)`, a memory of
//! tens of tokens, whatever it had learned (tests/gpu/STATE-TRACKING.md,
//! round 34). A checkpoint of step `STEP` holds the weights before the edit,
//! so a run resumed there edits them as the uninterrupted run did.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::mamba3::cpu::{ParamSpec, Weights};

use super::engine::EngineState;

/// Why a part names no parameters, or an edit cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartError {
    /// The text is not `NAME[:LO-HI]` (with `*FACTOR@STEP` for an edit).
    #[error("`{given}` is not {expected}")]
    Syntax {
        /// The text given.
        given: String,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// No tensor's name contains the part's name.
    #[error("part `{0}` matches no tensor")]
    NoMatch(String),
    /// A matching tensor is not 2-D or has fewer rows than the range.
    #[error("part `{part}`: {tensor} of shape {shape:?} has no rows {lo}..{hi}")]
    Rows {
        /// The part's name.
        part: String,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// First row asked for.
        lo: usize,
        /// One past the last.
        hi: usize,
    },
}

/// Values `start..end` of tensor `tensor` (in [`crate::mamba3::cpu::param_specs`]
/// order): where a part lies in the flat weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Tensor index.
    pub tensor: usize,
    /// First value.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

/// The tensors whose names contain `name`, or rows `rows.0..rows.1` of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamPart {
    /// A substring of tensor names.
    pub name: String,
    /// Rows of each matching 2-D tensor (`None`: the whole tensor).
    pub rows: Option<(usize, usize)>,
}

const PART_SYNTAX: &str = "a part NAME or NAME:LO-HI (LO < HI)";
const EDIT_SYNTAX: &str = "an edit PART*FACTOR@STEP (PART: NAME or NAME:LO-HI, FACTOR finite)";

impl FromStr for ParamPart {
    type Err = PartError;

    fn from_str(s: &str) -> Result<Self, PartError> {
        let bad = || PartError::Syntax {
            given: s.to_owned(),
            expected: PART_SYNTAX,
        };
        let (name, rows) = match s.split_once(':') {
            None => (s, None),
            Some((name, range)) => {
                let (lo, hi) = range.split_once('-').ok_or_else(bad)?;
                let lo: usize = lo.parse().map_err(|_| bad())?;
                let hi: usize = hi.parse().map_err(|_| bad())?;
                if lo >= hi {
                    return Err(bad());
                }
                (name, Some((lo, hi)))
            }
        };
        if name.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            name: name.to_owned(),
            rows,
        })
    }
}

impl fmt::Display for ParamPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rows {
            None => f.write_str(&self.name),
            Some((lo, hi)) => write!(f, "{}:{lo}-{hi}", self.name),
        }
    }
}

impl ParamPart {
    /// Where the part lies in weights of `specs`, one span per matching
    /// tensor, in `specs` order.
    pub fn spans(&self, specs: &[ParamSpec]) -> Result<Vec<Span>, PartError> {
        let mut spans = Vec::new();
        for (tensor, spec) in specs.iter().enumerate() {
            if !spec.name.contains(&self.name) {
                continue;
            }
            let (start, end) = match (self.rows, spec.shape.as_slice()) {
                (None, _) => (0, spec.numel()),
                (Some((lo, hi)), [n, cols]) if hi <= *n => (lo * cols, hi * cols),
                (Some((lo, hi)), shape) => {
                    return Err(PartError::Rows {
                        part: self.name.clone(),
                        tensor: spec.name.clone(),
                        shape: shape.to_vec(),
                        lo,
                        hi,
                    });
                }
            };
            spans.push(Span { tensor, start, end });
        }
        if spans.is_empty() {
            return Err(PartError::NoMatch(self.name.clone()));
        }
        Ok(spans)
    }
}

/// `PART*FACTOR@STEP`: the part times `factor` after step `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WeightEdit {
    /// What is edited.
    pub part: ParamPart,
    /// The factor (finite; 0 resets the part).
    pub factor: f32,
    /// Steps trained before the edit.
    pub step: u64,
}

impl FromStr for WeightEdit {
    type Err = PartError;

    fn from_str(s: &str) -> Result<Self, PartError> {
        let bad = || PartError::Syntax {
            given: s.to_owned(),
            expected: EDIT_SYNTAX,
        };
        let (rest, step) = s.rsplit_once('@').ok_or_else(bad)?;
        let (part, factor) = rest.rsplit_once('*').ok_or_else(bad)?;
        let factor: f32 = factor.parse().map_err(|_| bad())?;
        if !factor.is_finite() {
            return Err(bad());
        }
        Ok(Self {
            part: part.parse().map_err(|_| bad())?,
            factor,
            step: step.parse().map_err(|_| bad())?,
        })
    }
}

impl TryFrom<String> for WeightEdit {
    type Error = PartError;

    fn try_from(s: String) -> Result<Self, PartError> {
        s.parse()
    }
}

impl From<WeightEdit> for String {
    fn from(e: WeightEdit) -> String {
        e.to_string()
    }
}

impl fmt::Display for WeightEdit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}*{}@{}", self.part, self.factor, self.step)
    }
}

impl WeightEdit {
    /// Applies the edit to a run's state and weight average: the part
    /// scaled in both, its Adam moments zeroed. Returns the spans changed.
    pub fn apply(
        &self,
        specs: &[ParamSpec],
        state: &mut EngineState,
        avg: Option<&mut Weights<f32>>,
    ) -> Result<Vec<Span>, PartError> {
        let spans = self.part.spans(specs)?;
        scale(&mut state.weights, &spans, self.factor);
        if let Some(avg) = avg {
            scale(avg, &spans, self.factor);
        }
        zero_moments(state, &spans);
        Ok(spans)
    }
}

/// Zeroes the Adam moments of `spans`: a part changed mid-run has no
/// history (`--edit`, and `examples/splice_init --run`).
pub fn zero_moments(state: &mut EngineState, spans: &[Span]) {
    for s in spans {
        if let Some((m, v)) = state.moments.get_mut(s.tensor) {
            for moment in [m, v] {
                if let Some(vals) = moment.get_mut(s.start..s.end) {
                    vals.fill(0.0);
                }
            }
        }
    }
}

fn scale(weights: &mut Weights<f32>, spans: &[Span], factor: f32) {
    let mut tensors = weights.tensors_mut();
    for s in spans {
        if let Some(vals) = tensors
            .get_mut(s.tensor)
            .and_then(|t| t.get_mut(s.start..s.end))
        {
            vals.iter_mut().for_each(|v| *v *= factor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mamba3::Mamba3Config;
    use crate::mamba3::cpu::param_specs;

    #[test]
    fn parts_and_edits_read_back_as_written() {
        for s in ["embedding", "layers.1.mixer.in_proj.weight:656-672"] {
            assert_eq!(s.parse::<ParamPart>().unwrap().to_string(), s);
        }
        for s in ["layers.1.mixer.in_proj.weight:2-5*0@4000", "dt_bias*-0.5@7"] {
            let e: WeightEdit = s.parse().unwrap();
            assert_eq!(e.to_string(), s);
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<WeightEdit>(&json).unwrap(), e);
        }
        let e: WeightEdit = "in_proj.weight:2-5*0.25@10".parse().unwrap();
        assert_eq!(
            (e.part.name.as_str(), e.part.rows, e.factor, e.step),
            ("in_proj.weight", Some((2, 5)), 0.25, 10)
        );
    }

    #[test]
    fn malformed_text_is_refused_naming_it() {
        for s in ["", ":1-2", "x:5-5", "x:1", "x:a-2"] {
            assert!(s.parse::<ParamPart>().is_err(), "{s}");
        }
        for s in [
            "x*0",
            "x@3",
            "x*inf@3",
            "x*0@-1",
            "x*@3",
            ":1-2*0@3",
            "x:3-1*0@3",
        ] {
            let err = s.parse::<WeightEdit>().unwrap_err().to_string();
            assert!(err.starts_with(&format!("`{s}` is not an edit")), "{err}");
        }
    }

    #[test]
    fn an_edit_scales_its_rows_in_weights_and_average_and_zeroes_their_moments() {
        let cfg = Mamba3Config::tiny();
        let specs = param_specs(&cfg);
        let w = Weights::<f32>::init(&cfg, 1).unwrap();
        let ones: Vec<(Vec<f32>, Vec<f32>)> = specs
            .iter()
            .map(|s| (vec![1.0; s.numel()], vec![1.0; s.numel()]))
            .collect();
        let mut state = EngineState {
            weights: w.clone(),
            moments: ones,
            adam_steps: 3,
            steps: 3,
            skipped: 0,
        };
        let mut avg = w.clone();
        let e: WeightEdit = "layers.0.mixer.in_proj.weight:1-3*-2@3".parse().unwrap();
        let spans = e.apply(&specs, &mut state, Some(&mut avg)).unwrap();
        assert_eq!(spans.len(), 1);
        let Span { tensor, start, end } = spans[0];
        let cols = specs[tensor].shape[1];
        assert_eq!((start, end), (cols, 3 * cols));
        for (got, name) in [(&state.weights, "weights"), (&avg, "average")] {
            for (i, (g, o)) in got.tensors().iter().zip(w.tensors()).enumerate() {
                for (j, (a, b)) in g.iter().zip(o.iter()).enumerate() {
                    let inside = i == tensor && (start..end).contains(&j);
                    let want = if inside { b * -2.0 } else { *b };
                    assert_eq!(*a, want, "{name} {} [{j}]", specs[i].name);
                }
            }
        }
        for (i, (m, v)) in state.moments.iter().enumerate() {
            for (j, (a, b)) in m.iter().zip(v).enumerate() {
                let want = if i == tensor && (start..end).contains(&j) {
                    0.0
                } else {
                    1.0
                };
                assert_eq!((*a, *b), (want, want), "{} [{j}]", specs[i].name);
            }
        }
    }

    #[test]
    fn a_part_that_names_nothing_is_an_error() {
        let specs = param_specs(&Mamba3Config::tiny());
        let spans = |s: &str| s.parse::<ParamPart>().unwrap().spans(&specs);
        assert_eq!(
            spans("embeding").unwrap_err().to_string(),
            "part `embeding` matches no tensor"
        );
        assert_eq!(
            spans("dt_bias:0-1").unwrap_err().to_string(),
            "part `dt_bias`: backbone.layers.0.mixer.dt_bias of shape [4] has no rows 0..1"
        );
        assert_eq!(
            spans("dt_bias").unwrap().len(),
            Mamba3Config::tiny().n_layer
        );
    }
}
