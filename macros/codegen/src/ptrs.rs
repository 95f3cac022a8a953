//! `#[derive(DevicePtrs)]`: list a composite buffer's allocations field by field.
//!
//! Each field is visited in declaration order under its own name, so a guard
//! failure reads `weights.layers.3.in_proj`. Fields that own no device memory
//! (sizes, configs) are marked `#[ptrs(skip)]`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Index};

/// Expands `#[derive(DevicePtrs)]`.
pub fn derive_device_ptrs(input: &DeriveInput) -> TokenStream {
    match expand(input) {
        Ok(t) => t,
        Err(e) => e.to_compile_error(),
    }
}

fn skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for a in field.attrs.iter().filter(|a| a.path().is_ident("ptrs")) {
        a.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("the only option is `#[ptrs(skip)]`"))
            }
        })?;
    }
    Ok(skip)
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "#[derive(DevicePtrs)] supports structs only",
        ));
    };
    let mut visits = Vec::new();
    let mut errors: Option<syn::Error> = None;
    let mut push_err = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    match &data.fields {
        Fields::Named(named) => {
            for f in &named.named {
                match skipped(f) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        push_err(e);
                        continue;
                    }
                }
                if let Some(id) = &f.ident {
                    let label = id.to_string();
                    visits.push(quote! {
                        ::stepgraph::graph::DevicePtrs::visit_ptrs(&self.#id, &path.field(#label), visit);
                    });
                }
            }
        }
        Fields::Unnamed(unnamed) => {
            for (i, f) in unnamed.unnamed.iter().enumerate() {
                match skipped(f) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        push_err(e);
                        continue;
                    }
                }
                let idx = Index::from(i);
                visits.push(quote! {
                    ::stepgraph::graph::DevicePtrs::visit_ptrs(&self.#idx, &path.index(#i), visit);
                });
            }
        }
        Fields::Unit => {}
    }
    if let Some(e) = errors {
        return Err(e);
    }
    let ident = &input.ident;
    let mut generics = input.generics.clone();
    for p in generics.type_params_mut() {
        p.bounds
            .push(syn::parse_quote!(::stepgraph::graph::DevicePtrs));
    }
    let (impl_g, ty_g, where_c) = generics.split_for_impl();
    Ok(quote! {
        impl #impl_g ::stepgraph::graph::DevicePtrs for #ident #ty_g #where_c {
            fn visit_ptrs(
                &self,
                path: &::stepgraph::graph::TensorPath<'_>,
                visit: &mut dyn ::core::ops::FnMut(&::stepgraph::graph::TensorPath<'_>, ::stepgraph::graph::DevicePtr),
            ) {
                #(#visits)*
                let _ = (path, visit);
            }
        }
    })
}
