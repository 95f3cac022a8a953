//! `#[derive(TrainingGraph)]` and `#[derive(DevicePtrs)]`.
//!
//! A thin shim: it finds and reads the spec file, runs the shared checks of
//! `stepgraph-spec`, and hands everything else to `stepgraph-codegen`, where
//! it can be tested without rustc in the loop.
//!
//! The spec path resolves against the directory of the file that holds the
//! derive, then against the crate root (`CARGO_MANIFEST_DIR`), which is all
//! rust-analyzer offers. rustc names a workspace member's files relative to
//! the workspace root; that root is found among the crate root's ancestors,
//! never from the process's working directory, so the result does not depend
//! on where the compiler was started. Absolute paths are refused: they would
//! bake one machine's layout into the build.

use std::path::{Path, PathBuf};

use proc_macro::TokenStream;
use stepgraph_codegen::{GraphAttr, SpecSource};
use stepgraph_spec::Spec;
use syn::{DeriveInput, parse_macro_input};

/// Generates `<Name>Capture`, `<Name>Replay` and `<Name>Graph` for a step
/// struct from the RON spec named in `#[graph(spec = "...")]`. See the
/// `stepgraph` README for the spec language and the generated API.
#[proc_macro_derive(TrainingGraph, attributes(graph))]
pub fn derive_training_graph(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let attrs = match GraphAttr::parse_all(&input) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    // One set of items per spec: a generic struct names one spec per
    // instantiation.
    let mut out = proc_macro2::TokenStream::new();
    for attr in &attrs {
        out.extend(expand_one(&input, attr));
    }
    out.into()
}

fn expand_one(input: &DeriveInput, attr: &GraphAttr) -> proc_macro2::TokenStream {
    let (shown, src, include) = match &attr.source {
        SpecSource::Inline(lit) => ("<inline spec>".to_owned(), lit.value(), None),
        SpecSource::Path(lit) => match resolve(lit) {
            Ok((path, src)) => (lit.value(), src, Some(path.display().to_string())),
            Err(e) => return e.to_compile_error(),
        },
    };
    match Spec::parse(&shown, &src) {
        Ok(spec) => stepgraph_codegen::expand(input, attr, &spec, include.as_deref()),
        Err(diags) => stepgraph_codegen::spec_errors(&diags.rendered(), attr, include.as_deref()),
    }
}

/// Implements `stepgraph::graph::DevicePtrs` for a struct by visiting each
/// field (skip one with `#[ptrs(skip)]`).
#[proc_macro_derive(DevicePtrs, attributes(ptrs))]
pub fn derive_device_ptrs(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    stepgraph_codegen::derive_device_ptrs(&input).into()
}

fn resolve(lit: &syn::LitStr) -> syn::Result<(PathBuf, String)> {
    let rel = lit.value();
    if Path::new(&rel).is_absolute() {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "spec path `{rel}` is absolute; give it relative to this file or to the crate root"
            ),
        ));
    }
    let mut tried = Vec::new();
    if let Some(dir) = lit
        .span()
        .unwrap()
        .local_file()
        .and_then(|f| absolute_dir(&f))
    {
        tried.push(dir.join(&rel));
    }
    if let Ok(root) = std::env::var("CARGO_MANIFEST_DIR") {
        tried.push(Path::new(&root).join(&rel));
    }
    for path in &tried {
        if path.is_file() {
            return match std::fs::read_to_string(path) {
                Ok(src) => Ok((path.canonicalize().unwrap_or_else(|_| path.clone()), src)),
                Err(e) => Err(syn::Error::new(
                    lit.span(),
                    format!("cannot read spec `{}`: {e}", path.display()),
                )),
            };
        }
    }
    Err(syn::Error::new(
        lit.span(),
        format!(
            "spec file `{rel}` not found (looked relative to this source file, then to the crate root)"
        ),
    ))
}

/// The directory of a source file as rustc names it: absolute as it is, or
/// relative to the workspace root, which is the crate root
/// (`CARGO_MANIFEST_DIR`) or one of its ancestors: the first of them that
/// holds the file.
fn absolute_dir(file: &Path) -> Option<PathBuf> {
    if file.is_absolute() {
        return file.parent().map(Path::to_path_buf);
    }
    let root = std::env::var_os("CARGO_MANIFEST_DIR")?;
    Path::new(&root)
        .ancestors()
        .map(|a| a.join(file))
        .find(|p| p.is_file())
        .and_then(|p| p.parent().map(Path::to_path_buf))
}
