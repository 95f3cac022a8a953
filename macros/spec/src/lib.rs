//! The stepgraph step-spec language.
//!
//! A spec is a RON file that declares one training step as data: the buffers
//! it touches, the context scratch it uses and the ops it runs, in order. This
//! crate parses a spec, checks it, and reports every problem as a
//! [`Diagnostic`] located at `line:col` in the spec, with the source line and a
//! caret. It has no proc-macro dependencies so that the same checks run in
//! `#[derive(TrainingGraph)]` at compile time and in `stepgraph check` at run
//! time, with the same messages.
//!
//! ```
//! let src = r#"Step(
//!     name: "Tiny", precision: F32, context: "crate::Ctx",
//!     buffers: [
//!         (name: "x", ty: "Buf", role: Input),
//!         (name: "y", ty: "Buf", role: Output),
//!     ],
//!     ops: [("crate::copy", [Ref("x"), Mut("y")])],
//! )"#;
//! let spec = stepgraph_spec::Spec::parse("tiny.ron", src).unwrap();
//! assert_eq!(spec.step.ops.len(), 1);
//! ```

mod diag;
mod locate;
mod model;
mod validate;

pub use diag::{Diagnostic, Diagnostics, SrcSpan};
pub use model::{Access, Arg, Buffer, Op, Precision, Role, Step};

use locate::Locator;

/// Context scratch areas the runtime provides. A spec may name only these.
pub const KNOWN_SCRATCH: &[&str] = &["gemm_workspace", "half_staging", "reduce_partials"];

/// A parsed spec that passed every check.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The step as declared.
    pub step: Step,
    /// For each buffer (spec order): whether any op writes it.
    pub written: Vec<bool>,
    path: String,
    src: String,
    locator: Locator,
}

impl Spec {
    /// Parses and checks `src`; `path` is only used in messages.
    ///
    /// Returns every problem found, not just the first. Never panics.
    pub fn parse(path: &str, src: &str) -> Result<Spec, Diagnostics> {
        let step: Step = match ron::from_str(src) {
            Ok(step) => step,
            Err(e) => {
                let d = Diagnostic::new(e.code.to_string())
                    .at(SrcSpan::from_ron(&e.span, src))
                    .with_help(ron_help(&e.code));
                return Err(Diagnostics::new(path, src, vec![d]));
            }
        };
        let locator = Locator::scan(src);
        match validate::check(&step, &locator) {
            Ok(written) => Ok(Spec {
                step,
                written,
                path: path.to_owned(),
                src: src.to_owned(),
                locator,
            }),
            Err(list) => Err(Diagnostics::new(path, src, list)),
        }
    }

    /// Reads and checks the spec file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Spec, Diagnostics> {
        let shown = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(src) => Spec::parse(&shown, &src),
            Err(e) => Err(Diagnostics::new(
                &shown,
                "",
                vec![Diagnostic::new(format!(
                    "cannot read spec file `{shown}`: {e}"
                ))],
            )),
        }
    }

    /// The path given to [`Spec::parse`].
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The spec source text.
    pub fn source(&self) -> &str {
        &self.src
    }

    /// Where buffer `i`'s name is declared.
    pub fn buffer_span(&self, i: usize) -> Option<SrcSpan> {
        self.locator.buffer_field(i, "name")
    }

    /// Where buffer `i`'s type is declared.
    pub fn buffer_ty_span(&self, i: usize) -> Option<SrcSpan> {
        self.locator.buffer_field(i, "ty")
    }

    /// Where op `i`'s function path is written.
    pub fn op_span(&self, i: usize) -> Option<SrcSpan> {
        self.locator.op_path(i)
    }

    /// Where the context type is written.
    pub fn context_span(&self) -> Option<SrcSpan> {
        self.locator.step_field("context")
    }

    /// Where the step name is written.
    pub fn name_span(&self) -> Option<SrcSpan> {
        self.locator.step_field("name")
    }

    /// Renders one diagnostic against this spec's source.
    pub fn render(&self, d: &Diagnostic) -> String {
        d.render(&self.path, &self.src)
    }

    /// Index of the first op that writes buffer `i`, if any.
    pub fn first_writer(&self, i: usize) -> Option<usize> {
        let name = &self.step.buffers.get(i)?.name;
        self.step.ops.iter().position(|op| {
            op.args()
                .iter()
                .any(|a| a.access() == Access::Mut && a.buffer() == name)
        })
    }

    /// One line for `stepgraph check`.
    pub fn summary(&self) -> String {
        let s = &self.step;
        format!(
            "{}: step `{}` ok ({}, {} buffers, {} ops, {} scratch)",
            self.path,
            s.name,
            s.precision.as_str(),
            s.buffers.len(),
            s.ops.len(),
            s.scratch.len()
        )
    }
}

fn ron_help(code: &ron::Error) -> Option<String> {
    use ron::Error as E;
    match code {
        E::NoSuchStructField { .. } | E::MissingStructField { .. } => Some(
            "a step has `name`, `precision`, `context`, `buffers`, `scratch` (optional) and `ops`; a buffer has `name`, `ty` and `role`".to_owned(),
        ),
        E::NoSuchEnumVariant { .. } => Some(
            "roles: Param, OptimState, State, Scratch, Input, Output; precisions: F32, Bf16; arguments: Ref(\"buf\"), Mut(\"buf\")".to_owned(),
        ),
        _ => None,
    }
}
