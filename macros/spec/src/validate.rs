//! The semantic checks a spec must pass, run after it deserialized.
//!
//! Every check runs and every failure is collected, so one build reports all
//! of a spec's problems. Each failure points at the text to change.

use std::collections::{HashMap, HashSet};

use crate::KNOWN_SCRATCH;
use crate::diag::Diagnostic;
use crate::locate::Locator;
use crate::model::{Access, Role, Step};

/// Checks `step`; on success returns, per buffer, whether some op writes it.
pub(crate) fn check(step: &Step, loc: &Locator) -> Result<Vec<bool>, Vec<Diagnostic>> {
    let mut out = Vec::new();

    if !is_ident(&step.name) {
        out.push(
            Diagnostic::new(format!(
                "step name `{}` is not a Rust identifier",
                step.name
            ))
            .at(loc.step_field("name"))
            .with_help(
                "it prefixes the generated types (`<name>Graph`), e.g. \"Mamba3F32\"".to_owned(),
            ),
        );
    }
    if !is_path(&step.context) {
        out.push(
            Diagnostic::new(format!(
                "context `{}` is not a Rust type path",
                step.context
            ))
            .at(loc.step_field("context")),
        );
    }

    // Buffers: names unique and usable as struct fields.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, b) in step.buffers.iter().enumerate() {
        if !is_ident(&b.name) {
            out.push(
                Diagnostic::new(format!("buffer name `{}` is not a Rust identifier", b.name))
                    .at(loc.buffer_field(i, "name"))
                    .with_help("each buffer is a field of the step struct".to_owned()),
            );
        }
        if let Some(&first) = index.get(b.name.as_str()) {
            out.push(
                Diagnostic::new(format!(
                    "buffer `{}` is declared twice (first as buffer #{})",
                    b.name,
                    first + 1
                ))
                .at(loc.buffer_field(i, "name")),
            );
        } else {
            index.insert(&b.name, i);
        }
        if !is_type(&b.ty) {
            out.push(
                Diagnostic::new(format!(
                    "type `{}` of buffer `{}` is not a Rust type path",
                    b.ty, b.name
                ))
                .at(loc.buffer_field(i, "ty")),
            );
        }
    }

    // Scratch: known to the runtime, named once.
    let mut seen_scratch = HashSet::new();
    for (i, s) in step.scratch.iter().enumerate() {
        if !KNOWN_SCRATCH.contains(&s.as_str()) {
            out.push(
                Diagnostic::new(format!("the runtime has no context scratch area `{s}`"))
                    .at(loc.scratch(i))
                    .with_help(format!("known scratch areas: {}", KNOWN_SCRATCH.join(", "))),
            );
        } else if !seen_scratch.insert(s.as_str()) {
            out.push(Diagnostic::new(format!("scratch `{s}` is listed twice")).at(loc.scratch(i)));
        }
    }

    if step.ops.is_empty() {
        out.push(
            Diagnostic::new("the step has no ops: there is nothing to capture")
                .at(loc.step_field("ops")),
        );
    }

    // Ops, in order: arguments exist, hosts own inputs, scratch is written first.
    let mut used = vec![false; step.buffers.len()];
    let mut written = vec![false; step.buffers.len()];
    let mut arg_no = 0usize;
    for (oi, op) in step.ops.iter().enumerate() {
        if !is_path(op.path()) {
            out.push(
                Diagnostic::new(format!("op `{}` is not a Rust function path", op.path()))
                    .at(loc.op_path(oi)),
            );
        }
        let mut in_this_op: HashMap<&str, Access> = HashMap::new();
        // Writes become visible to later ops only: an op that reads and
        // writes a scratch buffer (Mut) is its first writer, which is fine.
        let mut writes_here = Vec::new();
        for arg in op.args() {
            let span = loc.arg(arg_no);
            arg_no += 1;
            let name = arg.buffer();
            let Some(&bi) = index.get(name) else {
                let hint = closest(name, step.buffers.iter().map(|b| b.name.as_str()));
                out.push(
                    Diagnostic::new(format!("op `{}` takes buffer `{name}`, which is not declared", op.path()))
                        .at(span)
                        .with_help(hint.map(|h| format!("did you mean `{h}`?")).or_else(|| {
                            Some(format!("add it to `buffers`, e.g. (name: \"{name}\", ty: \"...\", role: Scratch)"))
                        })),
                );
                continue;
            };
            if let Some(prev) = in_this_op.insert(name, arg.access())
                && (prev == Access::Mut || arg.access() == Access::Mut)
            {
                {
                    out.push(
                        Diagnostic::new(format!(
                            "op `{}` takes buffer `{name}` twice, once mutably: Rust cannot borrow it both ways",
                            op.path()
                        ))
                        .at(span),
                    );
                }
            }
            used[bi] = true;
            let role = step.buffers[bi].role;
            match arg.access() {
                Access::Mut => {
                    if role == Role::Input {
                        out.push(
                            Diagnostic::new(format!(
                                "op `{}` writes buffer `{name}`, but `{name}` is an Input: the host writes it before each replay",
                                op.path()
                            ))
                            .at(span)
                            .with_help("pass it as Ref(..), or give it another role".to_owned()),
                        );
                    }
                    writes_here.push(bi);
                }
                Access::Ref => {
                    if role == Role::Scratch && !written[bi] {
                        out.push(
                            Diagnostic::new(format!(
                                "op `{}` reads Scratch buffer `{name}` before any op writes it: a replay would read the previous step's leftovers",
                                op.path()
                            ))
                            .at(span)
                            .with_help("move an op that writes it earlier, or make it State if carrying it over is intended".to_owned()),
                        );
                    }
                }
            }
        }
        for bi in writes_here {
            written[bi] = true;
        }
    }

    for (i, b) in step.buffers.iter().enumerate() {
        if index.get(b.name.as_str()) != Some(&i) {
            continue; // duplicate, reported above
        }
        if !used[i] {
            out.push(
                Diagnostic::new(format!("buffer `{}` is used by no op", b.name))
                    .at(loc.buffer_field(i, "name"))
                    .with_help("remove it, or pass it to the op that needs it".to_owned()),
            );
            continue;
        }
        match b.role {
            Role::Output if !written[i] => out.push(
                Diagnostic::new(format!(
                    "Output buffer `{}` is written by no op: the host would read stale data",
                    b.name
                ))
                .at(loc.buffer_field(i, "name"))
                .with_help("pass it as Mut(..) to the op that produces it".to_owned()),
            ),
            Role::OptimState | Role::State if !written[i] => out.push(
                Diagnostic::new(format!(
                    "buffer `{}` is declared {} (updated every step), but every op only reads it",
                    b.name,
                    b.role.as_str()
                ))
                .at(loc.buffer_field(i, "role"))
                .with_help(
                    "pass it as Mut(..) to the op that updates it, or declare it Param or Input"
                        .to_owned(),
                ),
            ),
            _ => {}
        }
    }

    if out.is_empty() {
        Ok(written)
    } else {
        Err(out)
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s != "_"
        && !RESERVED.contains(&s)
}

const RESERVED: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while",
];

/// `a::b::c`, `::a::b` or `crate::a`: segments are identifiers, the first may
/// be `crate`, `self` or `super`.
fn is_path(s: &str) -> bool {
    let body = s.strip_prefix("::").unwrap_or(s);
    !body.is_empty()
        && body.split("::").enumerate().all(|(i, seg)| {
            is_ident(seg)
                || (i == 0 && matches!(seg, "crate" | "self" | "super"))
                || (i > 0 && seg == "super")
        })
}

/// A type path with optional generic arguments, checked for shape only: the
/// compiler checks the rest when the derive uses it.
fn is_type(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            c if c.is_alphanumeric()
                || matches!(
                    c,
                    '_' | ':' | ',' | ' ' | '&' | '\'' | '[' | ']' | ';' | '(' | ')'
                ) => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    let head = s.split('<').next().unwrap_or("").trim();
    depth == 0 && (is_path(head) || head.starts_with('[') || head.starts_with('('))
}

/// The declared name closest to a misspelt one, if any is close.
fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_types() {
        assert!(is_path("crate::mamba3::forward"));
        assert!(is_path("::stepgraph::graph::testing::FakeBackend"));
        assert!(!is_path("crate::"));
        assert!(!is_path("a b"));
        assert!(is_type("DeviceBuffer<i32>"));
        assert!(is_type("crate::x::Y<Vec<f32>, 3>"));
        assert!(!is_type("Vec<f32"));
        assert!(!is_type("x + y"));
    }

    #[test]
    fn suggests_close_names() {
        assert_eq!(
            closest("grad", ["grads", "weights"].into_iter()),
            Some("grads")
        );
        assert_eq!(closest("zzz", ["grads", "weights"].into_iter()), None);
    }
}
