//! Matching the step struct against its spec.
//!
//! The spec is the source of truth for what the captured body touches; the
//! struct is what owns it. Every spec buffer needs a field of the same name and
//! type, and every field must be a spec buffer (or be marked
//! `#[graph(skip)]`), with a mutability that fits: a field held by `&T` cannot
//! be passed to an op as `Mut`, and one held by `&mut T` that no op writes is a
//! mistake about what the step does.

use proc_macro2::{Span, TokenStream};
use stepgraph_spec::{Access, Diagnostic, Precision, Role, Spec};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, Type};

use crate::attr::GraphAttr;

/// How the struct holds a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// `field: T`
    Owned,
    /// `field: &'a T`
    Shared,
    /// `field: &'a mut T`
    Exclusive,
}

pub(crate) struct Buf {
    pub name: String,
    pub ident: Ident,
    /// The spec's type, spanned on the attribute.
    pub ty: Type,
    /// The field's type (without the reference), spanned on the field.
    pub field_ty: Type,
    pub hold: Hold,
    pub role: Role,
    pub written: bool,
    pub spec_ty: String,
}

pub(crate) struct OpModel {
    pub path_str: String,
    pub path: TokenStream,
    pub args: Vec<(usize, Access)>,
}

pub(crate) struct StepModel<'a> {
    pub input: &'a DeriveInput,
    /// How the generated impls name the struct: its own generics, or, for a
    /// generic struct instantiated by `with(..)`, the bound types.
    pub self_impl: SelfImpl,
    pub name: String,
    pub capture: Ident,
    pub replay: Ident,
    pub graph: Ident,
    pub info: Ident,
    pub context: Type,
    pub precision: Precision,
    pub spec_shown: String,
    pub buffers: Vec<Buf>,
    pub scratch: Vec<String>,
    pub ops: Vec<OpModel>,
}

/// The pieces of `impl<..> Trait for Step<..> where ..` for one spec.
pub(crate) struct SelfImpl {
    /// `<'a, ..>` after `impl`.
    pub impl_generics: TokenStream,
    /// `Step<'a, f32>`.
    pub self_ty: TokenStream,
    /// The struct's where clause (none for an instantiation).
    pub where_clause: TokenStream,
    /// True when type parameters were bound by `with(..)`: the field types
    /// then mention parameters that are not in scope in a free function, so
    /// the field checks go through a value of the instantiated struct.
    pub instantiated: bool,
}

/// Splits the struct's generics for the generated impls, substituting the
/// attribute's `with(..)` bindings; reports unbound or unknown parameters.
fn self_impl(input: &DeriveInput, attr: &GraphAttr, errors: &mut Vec<syn::Error>) -> SelfImpl {
    let ident = &input.ident;
    if attr.bindings.is_empty() {
        if let Some(p) = input.generics.type_params().next() {
            errors.push(syn::Error::new(
                p.span(),
                "step structs cannot have type parameters unless each spec binds them: \
                 #[graph(spec = \"...\", with(P = f32))]",
            ));
        }
        let (i, t, w) = input.generics.split_for_impl();
        return SelfImpl {
            impl_generics: quote::quote!(#i),
            self_ty: quote::quote!(#ident #t),
            where_clause: quote::quote!(#w),
            instantiated: false,
        };
    }
    for (param, _) in &attr.bindings {
        if !input.generics.type_params().any(|p| p.ident == *param) {
            errors.push(syn::Error::new(
                param.span(),
                format!("`{param}` is not a type parameter of `{ident}`"),
            ));
        }
    }
    let lifetimes: Vec<_> = input.generics.lifetimes().collect();
    let args: Vec<TokenStream> = input
        .generics
        .params
        .iter()
        .map(|p| match p {
            syn::GenericParam::Lifetime(l) => {
                let l = &l.lifetime;
                quote::quote!(#l)
            }
            syn::GenericParam::Type(t) => match attr.bindings.iter().find(|(b, _)| *b == t.ident) {
                Some((_, ty)) => quote::quote!(#ty),
                None => {
                    errors.push(syn::Error::new(
                        t.ident.span(),
                        format!(
                            "spec {} does not bind type parameter `{}`; add it to its `with(..)`",
                            attr.shown(),
                            t.ident
                        ),
                    ));
                    quote::quote!(())
                }
            },
            syn::GenericParam::Const(c) => {
                let c = &c.ident;
                quote::quote!(#c)
            }
        })
        .collect();
    SelfImpl {
        impl_generics: if lifetimes.is_empty() {
            TokenStream::new()
        } else {
            quote::quote!(<#(#lifetimes),*>)
        },
        self_ty: quote::quote!(#ident<#(#args),*>),
        where_clause: TokenStream::new(),
        instantiated: true,
    }
}

/// Parses spec-provided Rust text as tokens located on the attribute, so that
/// type errors in generated calls point at the spec attribute.
fn respan<T: syn::parse::Parse>(text: &str, span: Span) -> Option<T> {
    let tokens: TokenStream = text.parse().ok()?;
    let tokens = tokens.into_iter().map(|mut t| {
        set_span(&mut t, span);
        t
    });
    syn::parse2(tokens.collect()).ok()
}

fn set_span(t: &mut proc_macro2::TokenTree, span: Span) {
    match t {
        proc_macro2::TokenTree::Group(g) => {
            let inner = g
                .stream()
                .into_iter()
                .map(|mut t| {
                    set_span(&mut t, span);
                    t
                })
                .collect();
            let mut ng = proc_macro2::Group::new(g.delimiter(), inner);
            ng.set_span(span);
            *g = ng;
        }
        other => other.set_span(span),
    }
}

/// True when the field carries `#[graph(skip)]`.
fn is_skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for a in field.attrs.iter().filter(|a| a.path().is_ident("graph")) {
        a.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("the only field option is `#[graph(skip)]`"))
            }
        })?;
    }
    Ok(skip)
}

pub(crate) fn match_struct<'a>(
    input: &'a DeriveInput,
    attr: &GraphAttr,
    spec: &Spec,
) -> syn::Result<StepModel<'a>> {
    let at = attr.span();
    let mut errors: Vec<syn::Error> = Vec::new();
    let spec_err = |d: Diagnostic, span: Span| syn::Error::new(span, spec.render(&d));

    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => &named.named,
            _ => {
                return Err(syn::Error::new(
                    input.ident.span(),
                    "#[derive(TrainingGraph)] needs a struct with named fields, one per spec buffer",
                ));
            }
        },
        _ => {
            return Err(syn::Error::new(
                input.ident.span(),
                "#[derive(TrainingGraph)] applies to structs that own the step's buffers",
            ));
        }
    };
    let self_impl = self_impl(input, attr, &mut errors);
    if let Some(p) = input.generics.const_params().next() {
        errors.push(syn::Error::new(
            p.span(),
            "step structs cannot have const parameters",
        ));
    }

    let step = &spec.step;
    let name = step.name.clone();
    let ident = |suffix: &str| Ident::new(&format!("{name}{suffix}"), at);
    let context: Option<Type> = respan(&step.context, at);
    if context.is_none() {
        errors.push(spec_err(
            Diagnostic::new(format!("context `{}` is not a Rust type", step.context))
                .at(spec.context_span()),
            at,
        ));
    }

    // Every field either is a buffer or is skipped.
    let mut by_name = std::collections::HashMap::new();
    for f in fields {
        let Some(id) = &f.ident else { continue };
        match is_skipped(f) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                errors.push(e);
                continue;
            }
        }
        let fname = id.to_string();
        if !step.buffers.iter().any(|b| b.name == fname) {
            let known: Vec<_> = step
                .buffers
                .iter()
                .map(|b| format!("`{}`", b.name))
                .collect();
            errors.push(syn::Error::new(
                id.span(),
                format!(
                    "field `{fname}` is not a buffer of spec {} (buffers: {}); add it to the spec's `buffers` or mark it #[graph(skip)]",
                    attr.shown(),
                    known.join(", ")
                ),
            ));
        }
        by_name.insert(fname, f);
    }

    let mut buffers = Vec::new();
    for (i, b) in step.buffers.iter().enumerate() {
        let written = spec.written.get(i).copied().unwrap_or(false);
        let ty: Option<Type> = respan(&b.ty, at);
        if ty.is_none() {
            errors.push(spec_err(
                Diagnostic::new(format!(
                    "type `{}` of buffer `{}` is not a Rust type",
                    b.ty, b.name
                ))
                .at(spec.buffer_ty_span(i)),
                at,
            ));
        }
        let Some(field) = by_name.get(&b.name) else {
            let d = Diagnostic::new(format!(
                "struct `{}` has no field `{}` for spec buffer `{}`",
                input.ident, b.name, b.name
            ))
            .at(spec.buffer_span(i))
            .with_help(format!("add `{}: {},` to the struct", b.name, b.ty));
            errors.push(spec_err(d, input.ident.span()));
            continue;
        };
        let (hold, field_ty) = match &field.ty {
            Type::Reference(r) if r.mutability.is_some() => (Hold::Exclusive, (*r.elem).clone()),
            Type::Reference(r) => (Hold::Shared, (*r.elem).clone()),
            other => (Hold::Owned, other.clone()),
        };
        if hold == Hold::Shared && written {
            let op = spec
                .first_writer(i)
                .and_then(|o| step.ops.get(o))
                .map(|o| o.path().to_owned())
                .unwrap_or_default();
            let d = Diagnostic::new(format!(
                "field `{}` is a shared reference, but op `{op}` writes buffer `{}`",
                b.name, b.name
            ))
            .at(spec.first_writer(i).and_then(|o| spec.op_span(o)))
            .with_help(format!("hold it as `&mut {}` or own it", b.ty));
            errors.push(spec_err(d, field.ty.span()));
        }
        if hold == Hold::Exclusive && !written {
            let d = Diagnostic::new(format!(
                "field `{}` is `&mut`, but no op of the spec writes buffer `{}`",
                b.name, b.name
            ))
            .at(spec.buffer_span(i))
            .with_help(format!(
                "hold it as `&{}`, or pass it as Mut(\"{}\") to the op that writes it",
                b.ty, b.name
            ));
            errors.push(spec_err(d, field.ty.span()));
        }
        if let (Some(ty), Some(fid)) = (ty, &field.ident) {
            buffers.push(Buf {
                name: b.name.clone(),
                ident: fid.clone(),
                ty,
                field_ty,
                hold,
                role: b.role,
                written,
                spec_ty: b.ty.clone(),
            });
        }
    }

    let mut ops = Vec::new();
    for (oi, op) in step.ops.iter().enumerate() {
        let path: Option<syn::Path> = respan(op.path(), at);
        let Some(path) = path else {
            errors.push(spec_err(
                Diagnostic::new(format!("op `{}` is not a Rust path", op.path()))
                    .at(spec.op_span(oi)),
                at,
            ));
            continue;
        };
        let args = op
            .args()
            .iter()
            .filter_map(|a| {
                step.buffers
                    .iter()
                    .position(|b| b.name == a.buffer())
                    .map(|i| (i, a.access()))
            })
            .collect();
        ops.push(OpModel {
            path_str: op.path().to_owned(),
            path: quote::quote!(#path),
            args,
        });
    }

    if let Some(first) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return Err(first);
    }
    let context =
        context.ok_or_else(|| syn::Error::new(at, "unreachable: context checked above"))?;
    Ok(StepModel {
        input,
        self_impl,
        capture: ident("Capture"),
        replay: ident("Replay"),
        graph: ident("Graph"),
        info: Ident::new(&format!("__STEPGRAPH_INFO_{}", name.to_uppercase()), at),
        name,
        context,
        precision: step.precision,
        spec_shown: attr.shown(),
        buffers,
        scratch: step.scratch.clone(),
        ops,
    })
}
