//! Located diagnostics, rendered like rustc's: message, `--> path:line:col`,
//! the source line and a caret under the offending text.

use std::fmt::Write as _;

/// A position and length in a spec, 1-based, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrcSpan {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub col: usize,
    /// Characters to underline (at least one caret is drawn).
    pub len: usize,
}

impl SrcSpan {
    pub(crate) fn from_ron(span: &ron::error::Span, src: &str) -> SrcSpan {
        let (line, col) = (span.start.line.max(1), span.start.col.max(1));
        let len = if span.end.line == span.start.line && span.end.col > span.start.col {
            span.end.col - span.start.col
        } else {
            1
        };
        // ron reports end of input one column past the last character.
        let line_count = src.lines().count().max(1);
        SrcSpan {
            line: line.min(line_count + 1),
            col,
            len,
        }
    }
}

/// One problem in a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// What is wrong.
    pub message: String,
    /// Where, when it can be pinned down.
    pub span: Option<SrcSpan>,
    /// How to fix it.
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic with no location yet.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            span: None,
            help: None,
        }
    }

    /// Places it.
    pub fn at(mut self, span: impl Into<Option<SrcSpan>>) -> Self {
        self.span = span.into();
        self
    }

    /// Adds a fix-it hint.
    pub fn with_help(mut self, help: impl Into<Option<String>>) -> Self {
        self.help = help.into();
        self
    }

    /// Renders message, location, source line and caret, without an
    /// `error:` prefix (rustc and the CLI add their own).
    pub fn render(&self, path: &str, src: &str) -> String {
        let mut out = self.message.clone();
        if let Some(span) = self.span {
            let text = src.lines().nth(span.line.saturating_sub(1)).unwrap_or("");
            let gutter = span.line.to_string();
            let pad = " ".repeat(gutter.len());
            let _ = write!(out, "\n{pad}--> {path}:{}:{}", span.line, span.col);
            let _ = write!(out, "\n{pad} |\n{gutter} | {text}");
            let lead: String = text
                .chars()
                .take(span.col.saturating_sub(1))
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let _ = write!(out, "\n{pad} | {lead}{}", "^".repeat(span.len.max(1)));
        } else {
            let _ = write!(out, "\n --> {path}");
        }
        if let Some(help) = &self.help {
            let _ = write!(out, "\n  = help: {help}");
        }
        out
    }
}

/// Every problem found in one spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics {
    path: String,
    src: String,
    list: Vec<Diagnostic>,
}

impl Diagnostics {
    /// Diagnostics for the spec at `path` with source `src`.
    pub fn new(path: &str, src: &str, list: Vec<Diagnostic>) -> Self {
        Self {
            path: path.to_owned(),
            src: src.to_owned(),
            list,
        }
    }

    /// The problems, in source order of discovery.
    pub fn list(&self) -> &[Diagnostic] {
        &self.list
    }

    /// Each problem rendered (see [`Diagnostic::render`]).
    pub fn rendered(&self) -> Vec<String> {
        self.list
            .iter()
            .map(|d| d.render(&self.path, &self.src))
            .collect()
    }
}

impl std::fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.rendered().iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "error: {r}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}
