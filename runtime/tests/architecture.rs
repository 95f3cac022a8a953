//! The crate's layers, enforced: every module of `runtime/src` may use only
//! the layers below its own, and the files of one directory import each
//! other without a circle. The test reads the sources (no GPU, no build
//! artefacts): each `crate::<module>` path in code, comments left out.
//!
//! Bottom to top (README, "Layout"): `float` and `graph` (what generated
//! code targets); `device` (context, buffers, NVRTC, cuBLAS, the graph
//! backend); `kernels` (typed launch wrappers); `mamba3` and `optim` (the
//! model, the model-agnostic optimizer; neither uses the other); `step` (the
//! training step joining them); `train` and `bench` (engines, loop, timing;
//! neither uses the other); `eval` (scoring a checkpoint, reading data as
//! `train` does) and `repro` (a paper's table from many training runs). The binary (`src/bin`) sits on top and uses the library
//! from outside.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module and its layer (0 at the bottom). Modules on one
/// layer are peers: neither may use the other.
const LAYERS: &[(&str, u8)] = &[
    ("float", 0),
    ("graph", 0),
    ("device", 1),
    ("kernels", 2),
    ("mamba3", 3),
    ("optim", 3),
    ("step", 4),
    ("train", 5),
    ("bench", 5),
    ("eval", 6),
    ("repro", 6),
];

/// Items `lib.rs` re-exports at the crate root, and the layer they live in.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("TrainingGraph", "graph"),
    ("DevicePtrs", "graph"),
    ("Precision", "graph"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l)
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments (`//` to the end of the line, `/* */`),
/// string literals kept: paths never hide in strings, and a `//` inside a
/// string only cuts that line short.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let line_c = rest.find("//");
        let block_c = rest.find("/*");
        match (line_c, block_c) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                rest = rest[b..].find("*/").map_or("", |e| &rest[b + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                rest = "";
            }
        }
    }
    out
}

/// The identifiers that follow `prefix` in `code` (`crate::` -> `device`).
fn idents_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(prefix) {
        let start = at + i;
        let before = code[..start].chars().next_back();
        let s = start + prefix.len();
        at = s;
        // `foo_crate::x`, `$crate::x` and `a::crate::x` are other paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
            continue;
        }
        let end = code[s..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(code.len(), |e| s + e);
        if end > s {
            out.push(&code[s..end]);
        }
    }
    out
}

/// A file or directory name as a module name: `blas.rs` -> `blas`.
fn module_name(name: &std::ffi::OsStr) -> String {
    name.to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// `device/blas.rs` -> `device`; `lib.rs` -> `lib`.
fn top_module(rel: &Path) -> String {
    module_name(rel.components().next().expect("a path").as_os_str())
}

fn rel_str(rel: &Path) -> String {
    rel.to_string_lossy().replace('\\', "/")
}

#[test]
fn the_layer_table_names_every_top_level_module() {
    let mut missing = Vec::new();
    for entry in fs::read_dir(src()).expect("src") {
        let p = entry.expect("entry").path();
        let name = module_name(p.file_name().expect("name"));
        if name == "lib" || name == "bin" {
            continue;
        }
        if layer(&name).is_none() {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "modules without a layer in LAYERS: {missing:?}"
    );
}

#[test]
fn no_module_uses_a_layer_above_or_beside_it() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut wrong = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(src()).expect("under src");
        let own = top_module(rel);
        if own == "lib" || own == "bin" {
            continue;
        }
        let own_layer = layer(&own).unwrap_or_else(|| panic!("{own} has no layer"));
        let code = code_of(&fs::read_to_string(path).expect("read"));
        let used: BTreeSet<&str> = idents_after(&code, "crate::").into_iter().collect();
        for name in used {
            let module = ROOT_ITEMS
                .iter()
                .find(|(item, _)| *item == name)
                .map_or(name, |&(_, m)| m);
            if module == own {
                continue;
            }
            let Some(l) = layer(module) else {
                wrong.push(format!(
                    "{}: `crate::{name}` is no module of the layer table",
                    rel_str(rel)
                ));
                continue;
            };
            if l < own_layer {
                continue;
            }
            let how = if l == own_layer { "beside" } else { "above" };
            wrong.push(format!(
                "{}: uses `crate::{module}`, a layer {how} `{own}`",
                rel_str(rel)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// Files (and subdirectories) of one directory and the siblings each uses,
/// through `super::x` (from a file directly in it) or `crate::<dir>::x`.
fn sibling_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let rel = dir.strip_prefix(src()).expect("under src");
    let module_path = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("::");
    let mut nodes: BTreeMap<String, Vec<(PathBuf, bool)>> = BTreeMap::new();
    for entry in fs::read_dir(dir).expect("dir") {
        let p = entry.expect("entry").path();
        let name = module_name(p.file_name().expect("name"));
        if p.is_dir() {
            let mut files = Vec::new();
            rust_files(&p, &mut files);
            nodes.insert(name, files.into_iter().map(|f| (f, false)).collect());
        } else if p.extension().is_some_and(|x| x == "rs") && name != "mod" && name != "lib" {
            nodes.insert(name, vec![(p, true)]);
        }
    }
    let names: BTreeSet<String> = nodes.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (node, files) in &nodes {
        let mut out = BTreeSet::new();
        for (file, direct) in files {
            let code = code_of(&fs::read_to_string(file).expect("read"));
            let mut used: Vec<&str> = Vec::new();
            if *direct {
                used.extend(idents_after(&code, "super::"));
            }
            if !module_path.is_empty() {
                used.extend(idents_after(&code, &format!("crate::{module_path}::")));
            }
            for u in used {
                if u != node && names.contains(u) {
                    out.insert(u.to_owned());
                }
            }
        }
        edges.insert(node.clone(), out);
    }
    edges
}

/// A circle in `edges`, if there is one, as the nodes along it.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Every directory under `dir`, itself included.
fn dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    for entry in fs::read_dir(dir).expect("dir") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            dirs(&p, out);
        }
    }
}

#[test]
fn the_files_of_each_directory_import_each_other_without_a_circle() {
    let mut all = Vec::new();
    dirs(&src(), &mut all);
    let mut circles = Vec::new();
    for d in all {
        if d.ends_with("bin") || d.parent().is_some_and(|p| p.ends_with("bin")) {
            continue;
        }
        if let Some(c) = find_cycle(&sibling_edges(&d)) {
            let rel = d.strip_prefix(src()).expect("under src");
            circles.push(format!("{}/: {}", rel_str(rel), c.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "files in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_graph_layer_files_form_a_line() {
    let edges = sibling_edges(&src().join("graph"));
    // Exactly the order the module docs give.
    let order = ["precision", "error", "ptrs", "backend", "step", "testing"];
    for (node, uses) in &edges {
        let at = order
            .iter()
            .position(|o| o == node)
            .unwrap_or_else(|| panic!("graph/{node}.rs is not in the documented order"));
        for u in uses {
            let u_at = order.iter().position(|o| o == u).expect("known file");
            assert!(
                u_at < at,
                "graph/{node}.rs uses graph/{u}.rs, which comes after it"
            );
        }
    }
}

#[test]
fn the_checker_sees_paths_and_skips_comments() {
    let code = code_of(
        "use crate::device::Gpu; // crate::train\n/* crate::bench */ x::crate::y; crate::kernels::fill",
    );
    assert_eq!(idents_after(&code, "crate::"), ["device", "kernels"]);
    let mut e = BTreeMap::new();
    e.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    e.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        find_cycle(&e).map(|c| c.join(" -> ")),
        Some("a -> b -> a".to_owned())
    );
    e.insert("b".to_owned(), BTreeSet::new());
    assert!(find_cycle(&e).is_none());
}
