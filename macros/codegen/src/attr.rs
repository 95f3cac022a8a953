//! Parsing `#[graph(spec = "path")]` / `#[graph(spec_inline = "...")]`, and
//! the `with(P = Type, ..)` that instantiates a generic step struct for one
//! spec.
//!
//! A struct without type parameters names one spec. A struct generic over
//! its precision (or any other type) names one spec per instantiation, each
//! binding every type parameter: the struct is written once, every spec
//! stays a plain data file, and the derive emits one set of items per spec.

use proc_macro2::Span;
use syn::{DeriveInput, Ident, LitStr, Type};

/// Where the spec comes from.
#[derive(Clone, Debug)]
pub enum SpecSource {
    /// A file, relative to the file holding the derive (or the crate root).
    Path(LitStr),
    /// The spec text itself, for small examples and tests.
    Inline(LitStr),
}

/// One parsed `#[graph(...)]` attribute of a step struct: a spec, and the
/// types it binds the struct's type parameters to.
#[derive(Clone, Debug)]
pub struct GraphAttr {
    /// The spec.
    pub source: SpecSource,
    /// `with(P = f32)`: each type parameter and the type this spec uses.
    pub bindings: Vec<(Ident, Type)>,
}

impl GraphAttr {
    /// Reads the one spec attribute of a struct that names one spec.
    pub fn parse(input: &DeriveInput) -> syn::Result<GraphAttr> {
        let mut all = Self::parse_all(input)?.into_iter();
        match (all.next(), all.next()) {
            (Some(a), None) => Ok(a),
            (_, Some(second)) => Err(syn::Error::new(
                second.span(),
                "this struct names several specs; read them with `GraphAttr::parse_all`",
            )),
            (None, None) => Err(missing(input)),
        }
    }

    /// Reads every spec attribute: one, or one per instantiation of a
    /// generic struct (each with its `with(..)`).
    pub fn parse_all(input: &DeriveInput) -> syn::Result<Vec<GraphAttr>> {
        let mut out: Vec<GraphAttr> = Vec::new();
        for a in input.attrs.iter().filter(|a| a.path().is_ident("graph")) {
            let mut source = None;
            let mut bindings = Vec::new();
            a.parse_nested_meta(|meta| {
                if meta.path.is_ident("with") {
                    return meta.parse_nested_meta(|bind| {
                        let Some(param) = bind.path.get_ident().cloned() else {
                            return Err(bind.error("expected `with(P = Type)`"));
                        };
                        let ty: Type = bind.value()?.parse()?;
                        bindings.push((param, ty));
                        Ok(())
                    });
                }
                let inline = if meta.path.is_ident("spec") {
                    false
                } else if meta.path.is_ident("spec_inline") {
                    true
                } else {
                    return Err(meta.error(
                        "expected `spec = \"path/to/step.ron\"` or `spec_inline = \"...\"`",
                    ));
                };
                let lit: LitStr = meta.value()?.parse()?;
                if source.is_some() {
                    return Err(syn::Error::new(lit.span(), "the spec is given twice"));
                }
                source = Some(if inline {
                    SpecSource::Inline(lit)
                } else {
                    SpecSource::Path(lit)
                });
                Ok(())
            })?;
            let Some(source) = source else {
                return Err(syn::Error::new_spanned(
                    a,
                    "expected `spec = \"path/to/step.ron\"` or `spec_inline = \"...\"`",
                ));
            };
            let attr = GraphAttr { source, bindings };
            // Several specs only make sense as instantiations of a generic
            // struct; without `with(..)` the second one is a mistake.
            if !out.is_empty() && (attr.bindings.is_empty() || out[0].bindings.is_empty()) {
                return Err(syn::Error::new(attr.span(), "the spec is given twice"));
            }
            out.push(attr);
        }
        if out.is_empty() {
            return Err(missing(input));
        }
        Ok(out)
    }

    /// The literal errors about the spec are reported on.
    pub fn lit(&self) -> &LitStr {
        match &self.source {
            SpecSource::Path(l) | SpecSource::Inline(l) => l,
        }
    }

    /// Its span.
    pub fn span(&self) -> Span {
        self.lit().span()
    }

    /// The spec file as written, for messages and `StepInfo::spec`.
    pub fn shown(&self) -> String {
        match &self.source {
            SpecSource::Path(l) => l.value(),
            SpecSource::Inline(_) => "<inline spec>".to_owned(),
        }
    }
}

fn missing(input: &DeriveInput) -> syn::Error {
    syn::Error::new(
        input.ident.span(),
        "#[derive(TrainingGraph)] needs #[graph(spec = \"path/to/step.ron\")]",
    )
}
