//! Finds where a value sits in a spec's source.
//!
//! ron reports positions for syntax and schema errors but keeps none for the
//! values it deserializes, so the semantic checks would have nothing to point
//! at. A second, tolerant pass over the source records every string literal
//! and identifier with its position and its place in the nesting
//! (`buffers/*` + key `name` is a buffer's name, `ops/*/*/Mut` an op
//! argument). Because serde reads a document in order, the n-th buffer in the
//! model is the n-th `buffers/*` entry here. The pass never fails: on text it
//! does not understand it simply records less, and the diagnostic loses its
//! caret rather than the build panicking.

use crate::diag::SrcSpan;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    /// Frame labels from the root's children down: a field key, `Ref`/`Mut`, or `*`.
    path: String,
    /// Field key in the innermost frame, or empty.
    key: String,
    span: SrcSpan,
}

/// Token positions of one spec source.
#[derive(Debug, Clone, Default)]
pub(crate) struct Locator {
    tokens: Vec<Token>,
}

struct Frame {
    label: String,
    key: String,
}

impl Locator {
    pub(crate) fn scan(src: &str) -> Locator {
        let chars: Vec<char> = src.chars().collect();
        let mut tokens = Vec::new();
        let mut frames: Vec<Frame> = Vec::new();
        let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
        let mut last_ident: Option<String> = None;
        // Advances over one char, keeping line/col right.
        let bump = |i: &mut usize, line: &mut usize, col: &mut usize, c: char| {
            *i += 1;
            if c == '\n' {
                *line += 1;
                *col = 1;
            } else {
                *col += 1;
            }
        };
        let path_of = |frames: &[Frame]| -> String {
            frames
                .iter()
                .skip(1)
                .map(|f| f.label.as_str())
                .collect::<Vec<_>>()
                .join("/")
        };
        while let Some(&c) = chars.get(i) {
            let next = chars.get(i + 1).copied();
            if c == '/' && next == Some('/') {
                while let Some(&c) = chars.get(i) {
                    if c == '\n' {
                        break;
                    }
                    bump(&mut i, &mut line, &mut col, c);
                }
                continue;
            }
            if c == '/' && next == Some('*') {
                bump(&mut i, &mut line, &mut col, '/');
                bump(&mut i, &mut line, &mut col, '*');
                while let Some(&c) = chars.get(i) {
                    if c == '*' && chars.get(i + 1) == Some(&'/') {
                        bump(&mut i, &mut line, &mut col, '*');
                        bump(&mut i, &mut line, &mut col, '/');
                        break;
                    }
                    bump(&mut i, &mut line, &mut col, c);
                }
                continue;
            }
            if c == '"' || (c == 'r' && matches!(next, Some('"') | Some('#'))) {
                let (start_line, start_col) = (line, col);
                let start = i;
                let raw_hashes = if c == 'r' {
                    bump(&mut i, &mut line, &mut col, 'r');
                    let mut n = 0;
                    while chars.get(i) == Some(&'#') {
                        n += 1;
                        bump(&mut i, &mut line, &mut col, '#');
                    }
                    Some(n)
                } else {
                    None
                };
                if chars.get(i) != Some(&'"') {
                    // `r` followed by `#` but not a raw string: an identifier.
                    last_ident = Some("r".to_owned());
                    continue;
                }
                bump(&mut i, &mut line, &mut col, '"');
                while let Some(&c) = chars.get(i) {
                    if raw_hashes.is_none() && c == '\\' {
                        bump(&mut i, &mut line, &mut col, c);
                        if let Some(&e) = chars.get(i) {
                            bump(&mut i, &mut line, &mut col, e);
                        }
                        continue;
                    }
                    bump(&mut i, &mut line, &mut col, c);
                    if c == '"' {
                        let n = raw_hashes.unwrap_or(0);
                        if (0..n).all(|k| chars.get(i + k) == Some(&'#')) {
                            for _ in 0..n {
                                bump(&mut i, &mut line, &mut col, '#');
                            }
                            break;
                        }
                    }
                }
                let len = if line == start_line { i - start } else { 1 };
                if let Some(frame) = frames.last() {
                    tokens.push(Token {
                        path: path_of(&frames),
                        key: frame.key.clone(),
                        span: SrcSpan {
                            line: start_line,
                            col: start_col,
                            len,
                        },
                    });
                }
                last_ident = None;
                continue;
            }
            if c.is_alphabetic() || c == '_' {
                let (start_line, start_col) = (line, col);
                let mut ident = String::new();
                while let Some(&c) = chars.get(i) {
                    if !(c.is_alphanumeric() || c == '_') {
                        break;
                    }
                    ident.push(c);
                    bump(&mut i, &mut line, &mut col, c);
                }
                // An identifier used as a value (an enum variant such as a role)
                // is located like a string; one used as a key is replaced below.
                if let Some(frame) = frames.last() {
                    tokens.push(Token {
                        path: path_of(&frames),
                        key: frame.key.clone(),
                        span: SrcSpan {
                            line: start_line,
                            col: start_col,
                            len: ident.chars().count(),
                        },
                    });
                }
                last_ident = Some(ident);
                continue;
            }
            match c {
                ':' => {
                    if let (Some(key), Some(frame)) = (last_ident.take(), frames.last_mut()) {
                        // The identifier was a field key, not a value.
                        tokens.pop();
                        frame.key = key;
                    }
                }
                '(' | '[' | '{' => {
                    let label = match last_ident.take() {
                        Some(w) if (w == "Ref" || w == "Mut") && c == '(' => w,
                        Some(_) => {
                            // A struct name such as `Step(`: not a value.
                            tokens.pop();
                            frames
                                .last()
                                .map(|f| f.key.clone())
                                .filter(|k| !k.is_empty())
                                .unwrap_or_else(|| "*".to_owned())
                        }
                        None => frames
                            .last()
                            .map(|f| f.key.clone())
                            .filter(|k| !k.is_empty())
                            .unwrap_or_else(|| "*".to_owned()),
                    };
                    if label == "Ref" || label == "Mut" {
                        tokens.pop();
                    }
                    frames.push(Frame {
                        label,
                        key: String::new(),
                    });
                }
                ')' | ']' | '}' => {
                    frames.pop();
                    last_ident = None;
                }
                ',' => {
                    if let Some(frame) = frames.last_mut() {
                        frame.key.clear();
                    }
                    last_ident = None;
                }
                _ => {
                    if !c.is_whitespace() {
                        last_ident = None;
                    }
                }
            }
            bump(&mut i, &mut line, &mut col, c);
        }
        Locator { tokens }
    }

    fn nth(&self, path: &str, key: &str, n: usize) -> Option<SrcSpan> {
        self.tokens
            .iter()
            .filter(|t| t.path == path && t.key == key)
            .nth(n)
            .map(|t| t.span)
    }

    /// A field of the step itself (`name`, `context`, ...).
    pub(crate) fn step_field(&self, key: &str) -> Option<SrcSpan> {
        self.nth("", key, 0)
    }

    /// The value of `key` in the `i`-th buffer.
    pub(crate) fn buffer_field(&self, i: usize, key: &str) -> Option<SrcSpan> {
        self.nth("buffers/*", key, i)
    }

    /// The `i`-th scratch name.
    pub(crate) fn scratch(&self, i: usize) -> Option<SrcSpan> {
        self.nth("scratch", "", i)
    }

    /// The function path of the `i`-th op.
    pub(crate) fn op_path(&self, i: usize) -> Option<SrcSpan> {
        self.nth("ops/*", "", i)
    }

    /// The `n`-th op argument of the whole body, counting in order.
    pub(crate) fn arg(&self, n: usize) -> Option<SrcSpan> {
        self.tokens
            .iter()
            .filter(|t| t.key.is_empty() && (t.path == "ops/*/*/Ref" || t.path == "ops/*/*/Mut"))
            .nth(n)
            .map(|t| t.span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"// a comment with "quotes"
Step(
    name: "S", precision: F32, context: "crate::Ctx",
    buffers: [
        (name: "a", ty: "A<f32>", role: Input),
        (name: "b", ty: "B", role: Output), /* block "c" */
    ],
    scratch: ["half_staging"],
    ops: [
        ("crate::f", [Ref("a"), Mut("b")]),
    ],
)"#;

    #[test]
    fn finds_every_kind_of_value() {
        let l = Locator::scan(SRC);
        assert_eq!(
            l.step_field("name"),
            Some(SrcSpan {
                line: 3,
                col: 11,
                len: 3
            })
        );
        assert_eq!(
            l.step_field("context"),
            Some(SrcSpan {
                line: 3,
                col: 41,
                len: 12
            })
        );
        assert_eq!(
            l.buffer_field(1, "name"),
            Some(SrcSpan {
                line: 6,
                col: 16,
                len: 3
            })
        );
        assert_eq!(
            l.buffer_field(0, "role"),
            Some(SrcSpan {
                line: 5,
                col: 41,
                len: 5
            })
        );
        assert_eq!(
            l.scratch(0),
            Some(SrcSpan {
                line: 8,
                col: 15,
                len: 14
            })
        );
        assert_eq!(
            l.op_path(0),
            Some(SrcSpan {
                line: 10,
                col: 10,
                len: 10
            })
        );
        assert_eq!(
            l.arg(1),
            Some(SrcSpan {
                line: 10,
                col: 37,
                len: 3
            })
        );
        assert_eq!(l.arg(2), None);
    }

    #[test]
    fn survives_garbage() {
        for src in [
            "",
            "(",
            ")))",
            "\"unterminated",
            "r#\"x",
            "/* open",
            "Step(name: [(((",
            "é\u{0}",
        ] {
            let l = Locator::scan(src);
            let _ = (l.op_path(0), l.arg(0), l.buffer_field(0, "name"));
        }
    }
}
