//! Parsing `#[graph(spec = "path")]` / `#[graph(spec_inline = "...")]`.

use proc_macro2::Span;
use syn::{DeriveInput, LitStr};

/// Where the spec comes from.
#[derive(Clone, Debug)]
pub enum SpecSource {
    /// A file, relative to the file holding the derive (or the crate root).
    Path(LitStr),
    /// The spec text itself, for small examples and tests.
    Inline(LitStr),
}

/// The parsed `#[graph(...)]` attribute of a step struct.
#[derive(Clone, Debug)]
pub struct GraphAttr {
    /// The spec.
    pub source: SpecSource,
}

impl GraphAttr {
    /// Reads the attribute from the derive input.
    pub fn parse(input: &DeriveInput) -> syn::Result<GraphAttr> {
        let mut source = None;
        for a in input.attrs.iter().filter(|a| a.path().is_ident("graph")) {
            a.parse_nested_meta(|meta| {
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
        }
        match source {
            Some(source) => Ok(GraphAttr { source }),
            None => Err(syn::Error::new(
                input.ident.span(),
                "#[derive(TrainingGraph)] needs #[graph(spec = \"path/to/step.ron\")]",
            )),
        }
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
