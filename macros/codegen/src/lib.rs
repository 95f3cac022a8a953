//! Code generation for `#[derive(TrainingGraph)]` and `#[derive(DevicePtrs)]`.
//!
//! This is a plain library, not a proc-macro crate, so that every step of the
//! expansion can be unit- and snapshot-tested in process. The pipeline is the
//! one thiserror and serde use: parse the attribute ([`attr`]), match the step
//! struct against its checked spec (`fields`), then emit tokens (`emit`,
//! `guard_tests`). Errors are collected into one `syn::Error` so a single
//! build reports all of them.
//!
//! The proc-macro shim (`stepgraph-macros`) only resolves the spec path and
//! reads the file; everything else happens here.

pub mod attr;
mod emit;
mod fields;
mod guard_tests;
mod ptrs;

use proc_macro2::TokenStream;
use quote::quote;
use stepgraph_spec::Spec;
use syn::DeriveInput;

pub use attr::{GraphAttr, SpecSource};
pub use ptrs::derive_device_ptrs;

/// Expands `#[derive(TrainingGraph)]` for `input` against an already checked
/// `spec`. `include` is the absolute spec path to depend on (so editing the
/// spec rebuilds the crate); `None` for inline specs.
pub fn expand(
    input: &DeriveInput,
    attr: &GraphAttr,
    spec: &Spec,
    include: Option<&str>,
) -> TokenStream {
    let dep = include_dep(include);
    match fields::match_struct(input, attr, spec) {
        Ok(step) => {
            let body = emit::emit(&step);
            let tests = guard_tests::emit(&step);
            quote! { #dep #body #tests }
        }
        Err(e) => {
            let e = e.to_compile_error();
            quote! { #dep #e }
        }
    }
}

/// Turns spec diagnostics into compile errors on the attribute, keeping the
/// file dependency so that fixing the spec triggers a rebuild.
pub fn spec_errors(rendered: &[String], attr: &GraphAttr, include: Option<&str>) -> TokenStream {
    let dep = include_dep(include);
    let errors = rendered
        .iter()
        .map(|r| syn::Error::new(attr.span(), r).to_compile_error());
    quote! { #dep #(#errors)* }
}

fn include_dep(include: Option<&str>) -> TokenStream {
    match include {
        Some(path) => quote! { const _: &[u8] = ::core::include_bytes!(#path); },
        None => TokenStream::new(),
    }
}
