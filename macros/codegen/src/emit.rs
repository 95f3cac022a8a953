//! Emitting the generated items for a matched step.
//!
//! Generated code names runtime items by absolute path (`::stepgraph::graph`)
//! and calls trait methods in UFCS form, so nothing depends on what the user
//! has imported. Spec-provided paths (ops, types, context) are emitted as
//! written, spanned on the spec attribute.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use stepgraph_spec::{Access, Precision, Role};

use crate::fields::{Hold, StepModel};

pub(crate) fn emit(m: &StepModel<'_>) -> TokenStream {
    let info = emit_info(m);
    let views = emit_views(m);
    let graph = emit_graph(m);
    let step = emit_training_step(m);
    let asserts = emit_asserts(m);
    quote! { #info #views #graph #step #asserts }
}

fn role_tokens(r: Role) -> TokenStream {
    match r {
        Role::Param => quote!(::stepgraph::graph::Role::Param),
        Role::OptimState => quote!(::stepgraph::graph::Role::OptimState),
        Role::State => quote!(::stepgraph::graph::Role::State),
        Role::Scratch => quote!(::stepgraph::graph::Role::Scratch),
        Role::Input => quote!(::stepgraph::graph::Role::Input),
        Role::Output => quote!(::stepgraph::graph::Role::Output),
    }
}

fn access_tokens(a: Access) -> TokenStream {
    match a {
        Access::Ref => quote!(::stepgraph::graph::Access::Ref),
        Access::Mut => quote!(::stepgraph::graph::Access::Mut),
    }
}

pub(crate) fn snap_ident(name: &str) -> Ident {
    format_ident!("{}_ptrs", name)
}

pub(crate) fn scratch_snap_ident(name: &str) -> Ident {
    format_ident!("scratch_{}_ptrs", name)
}

fn emit_info(m: &StepModel<'_>) -> TokenStream {
    let info = &m.info;
    let name = &m.name;
    let spec = &m.spec_shown;
    let precision = match m.precision {
        Precision::F32 => quote!(::stepgraph::graph::Precision::F32),
        Precision::Bf16 => quote!(::stepgraph::graph::Precision::Bf16),
    };
    let buffers = m.buffers.iter().map(|b| {
        let (n, ty, role, w) = (&b.name, &b.spec_ty, role_tokens(b.role), b.written);
        quote!(::stepgraph::graph::BufferInfo { name: #n, ty: #ty, role: #role, written: #w })
    });
    let scratch = &m.scratch;
    let ops = m.ops.iter().map(|o| {
        let p = &o.path_str;
        let args = o.args.iter().map(|(i, a)| {
            let n = &m.buffers[*i].name;
            let a = access_tokens(*a);
            quote!((#n, #a))
        });
        quote!(::stepgraph::graph::OpInfo { path: #p, args: &[#(#args),*] })
    });
    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #info: ::stepgraph::graph::StepInfo = ::stepgraph::graph::StepInfo {
            name: #name,
            spec: #spec,
            precision: #precision,
            buffers: &[#(#buffers),*],
            scratch: &[#(#scratch),*],
            ops: &[#(#ops),*],
        };
    }
}

fn emit_views(m: &StepModel<'_>) -> TokenStream {
    let vis = &m.input.vis;
    let (capture, replay, name, ctx, info) = (&m.capture, &m.replay, &m.name, &m.context, &m.info);
    let (impl_g, self_ty, where_c) = (
        &m.self_impl.impl_generics,
        &m.self_impl.self_ty,
        &m.self_impl.where_clause,
    );

    let cap_fields = m.buffers.iter().map(|b| {
        let (f, ty) = (&b.ident, &b.ty);
        let doc = format!(
            "`{}` ({}, {}).",
            b.name,
            b.role.as_str(),
            if b.written { "written" } else { "read only" }
        );
        if b.written {
            quote!(#[doc = #doc] pub #f: &'__sg mut #ty)
        } else {
            quote!(#[doc = #doc] pub #f: &'__sg #ty)
        }
    });
    let rep_fields = m.buffers.iter().map(|b| {
        let (f, ty) = (&b.ident, &b.ty);
        let doc = format!("`{}` ({}).", b.name, b.role.as_str());
        quote!(#[doc = #doc] pub #f: &'__sg #ty)
    });
    // Spanned on the field's type, so a type mismatch points at the field.
    let cap_init = m.buffers.iter().map(|b| {
        let f = &b.ident;
        let span = syn::spanned::Spanned::span(&b.field_ty);
        match (b.hold, b.written) {
            (Hold::Owned, true) => quote_spanned!(span=> #f: &mut self.#f),
            (Hold::Owned, false) => quote_spanned!(span=> #f: &self.#f),
            (Hold::Exclusive, _) => quote_spanned!(span=> #f: &mut *self.#f),
            (Hold::Shared, _) => quote_spanned!(span=> #f: &*self.#f),
        }
    });
    let rep_init = m.buffers.iter().map(|b| {
        let f = &b.ident;
        let span = syn::spanned::Spanned::span(&b.field_ty);
        match b.hold {
            Hold::Owned => quote_spanned!(span=> #f: &self.#f),
            Hold::Exclusive | Hold::Shared => quote_spanned!(span=> #f: &*self.#f),
        }
    });
    let reborrow = m.buffers.iter().map(|b| {
        let f = &b.ident;
        if b.written {
            quote!(#f: &mut *self.#f)
        } else {
            quote!(#f: &*self.#f)
        }
    });
    let as_rep = m.buffers.iter().map(|b| {
        let f = &b.ident;
        quote!(#f: &*self.#f)
    });
    let op_calls = m.ops.iter().map(|o| {
        let path = &o.path;
        let op = &o.path_str;
        let args = o.args.iter().map(|(i, a)| {
            let f = &m.buffers[*i].ident;
            match a {
                Access::Mut => quote!(&mut *bufs.#f),
                Access::Ref => quote!(&*bufs.#f),
            }
        });
        quote! {
            ::stepgraph::graph::Backend::enter_op(ctx, ::core::option::Option::Some(#op));
            let result = #path(ctx #(, #args)*);
            ::stepgraph::graph::Backend::enter_op(ctx, ::core::option::Option::None);
            if let ::core::result::Result::Err(e) = result {
                return ::core::result::Result::Err(::stepgraph::graph::GraphError::from_op(#name, #op, e));
            }
        }
    });
    let cap_doc = format!(
        "Borrows of every buffer of step `{name}` for capturing or running it: `&mut` to each buffer an op writes, `&` to the rest. Generated from `{}`.",
        m.spec_shown
    );
    let rep_doc = format!("Shared borrows of every buffer of step `{name}`, for a guarded replay.");
    quote! {
        #[doc = #cap_doc]
        #vis struct #capture<'__sg> { #(#cap_fields,)* }

        #[doc = #rep_doc]
        #[derive(Clone, Copy)]
        #vis struct #replay<'__sg> { #(#rep_fields,)* }

        #[allow(clippy::too_many_arguments)]
        impl<'__sg> #capture<'__sg> {
            /// Runs the step's ops once, in spec order, without capturing: the
            /// eager baseline and the warm-up before a capture. The capture runs
            /// this very function.
            pub fn run_eager(&mut self, ctx: &#ctx) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                Self::__run_ops(ctx, self)
            }

            /// Shorter-lived borrows of the same buffers.
            pub fn reborrow(&mut self) -> #capture<'_> {
                #capture { #(#reborrow,)* }
            }

            /// Read-only view of the same buffers.
            pub fn as_replay(&self) -> #replay<'_> {
                #replay { #(#as_rep,)* }
            }

            #[doc(hidden)]
            pub fn __run_ops(ctx: &#ctx, bufs: &mut #capture<'_>) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                #(#op_calls)*
                ::core::result::Result::Ok(())
            }
        }

        impl #impl_g #self_ty #where_c {
            /// The step as declared in its spec.
            pub const STEP: ::stepgraph::graph::StepInfo = #info;

            /// Borrows every buffer for capture or an eager run.
            pub fn capture_view(&mut self) -> #capture<'_> {
                #capture { #(#cap_init,)* }
            }

            /// Borrows every buffer for a guarded replay.
            pub fn replay_view(&self) -> #replay<'_> {
                #replay { #(#rep_init,)* }
            }

            /// Runs the ops once, eagerly, in spec order.
            pub fn run_eager(&mut self, ctx: &#ctx) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                self.capture_view().run_eager(ctx)
            }
        }
    }
}

fn emit_graph(m: &StepModel<'_>) -> TokenStream {
    let vis = &m.input.vis;
    let (capture, replay, graph, name, ctx, info) = (
        &m.capture, &m.replay, &m.graph, &m.name, &m.context, &m.info,
    );
    let snaps: Vec<Ident> = m.buffers.iter().map(|b| snap_ident(&b.name)).collect();
    let scratch_snaps: Vec<Ident> = m.scratch.iter().map(|s| scratch_snap_ident(s)).collect();
    let bufs: Vec<&Ident> = m.buffers.iter().map(|b| &b.ident).collect();
    let buf_names: Vec<&str> = m.buffers.iter().map(|b| b.name.as_str()).collect();
    let scratch_names: Vec<&str> = m.scratch.iter().map(String::as_str).collect();
    let scratch_labels: Vec<String> = m.scratch.iter().map(|s| format!("scratch:{s}")).collect();

    let snap_fields = m.buffers.iter().zip(&snaps).map(|(b, s)| {
        let doc = format!("Every allocation of buffer `{}` at capture.", b.name);
        quote!(#[doc = #doc] #s: ::stepgraph::graph::PtrSnapshot)
    });
    let scratch_fields = m.scratch.iter().zip(&scratch_snaps).map(|(n, s)| {
        let doc = format!("Every allocation of context scratch `{n}` at capture.");
        quote!(#[doc = #doc] #s: ::stepgraph::graph::PtrSnapshot)
    });
    // One guard per buffer and per scratch area: this list is what the
    // generated tests prove complete.
    let guards = snaps
        .iter()
        .zip(&bufs)
        .map(|(s, b)| quote!(self.#s.verify(#name, #b)?;));
    let scratch_guards = scratch_snaps.iter().zip(&scratch_names).map(
        |(s, n)| quote!(self.#s.verify(#name, &::stepgraph::graph::ScratchPtrs::new(ctx, #n))?;),
    );
    let ptr_params: Vec<TokenStream> = bufs
        .iter()
        .map(|b| quote!(#b: &dyn ::stepgraph::graph::DevicePtrs))
        .collect();
    let take_bufs = snaps
        .iter()
        .zip(&bufs)
        .zip(&buf_names)
        .map(|((s, b), n)| quote!(#s: ::stepgraph::graph::PtrSnapshot::take(#n, #b)));
    let take_scratch = scratch_snaps.iter().zip(&scratch_names).zip(&scratch_labels).map(|((s, n), l)| {
        quote!(#s: ::stepgraph::graph::PtrSnapshot::take(#l, &::stepgraph::graph::ScratchPtrs::new(ctx, #n)))
    });
    let from_view = bufs.iter().map(|b| quote!(&*bufs.#b));
    let from_view2 = from_view.clone();
    let from_view3 = from_view.clone();
    let graph_doc = format!(
        "The captured graph of step `{name}`, with a snapshot of every allocation it was captured with. `replay` compares each one with the live buffers before launching, and refuses a replay whose memory moved. Generated from `{}`.",
        m.spec_shown
    );
    quote! {
        #[doc = #graph_doc]
        #vis struct #graph<B: ::stepgraph::graph::Backend = #ctx> {
            exec: B::Exec,
            shape: ::stepgraph::graph::ShapeKey,
            policy: ::stepgraph::graph::MovePolicy,
            #(#snap_fields,)*
            #(#scratch_fields,)*
        }

        // Generated signatures take one argument per buffer.
        #[allow(clippy::too_many_arguments)]
        impl<B: ::stepgraph::graph::Backend> #graph<B> {
            /// The step as declared in its spec.
            pub const INFO: ::stepgraph::graph::StepInfo = #info;

            /// Builds a graph from an instantiated exec and the allocations it was
            /// captured with. `capture` uses it; so do the generated guard tests.
            #[doc(hidden)]
            pub fn __from_parts(ctx: &B, exec: B::Exec, shape: ::stepgraph::graph::ShapeKey, #(#ptr_params,)*) -> Self {
                Self {
                    exec,
                    shape,
                    policy: ::stepgraph::graph::MovePolicy::Error,
                    #(#take_bufs,)*
                    #(#take_scratch,)*
                }
            }

            /// Checks every allocation of every buffer and scratch area against
            /// the capture, without launching.
            pub fn verify_ptrs(&self, ctx: &B, #(#ptr_params,)*) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                #(#guards)*
                #(#scratch_guards)*
                ::core::result::Result::Ok(())
            }

            /// Verifies, then launches. Nothing is launched if any check fails.
            pub fn replay_ptrs(&self, ctx: &B, #(#ptr_params,)*) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                self.verify_ptrs(ctx, #(#bufs,)*)?;
                ::stepgraph::graph::Backend::launch(ctx, &self.exec)
                    .map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "launch", e))
            }

            /// The shape the graph was captured for.
            pub fn shape(&self) -> ::stepgraph::graph::ShapeKey {
                self.shape
            }

            /// What `replay_or_recapture` does with a stale graph.
            pub fn policy(&self) -> ::stepgraph::graph::MovePolicy {
                self.policy
            }

            /// Sets the policy for stale graphs.
            pub fn with_policy(mut self, policy: ::stepgraph::graph::MovePolicy) -> Self {
                self.policy = policy;
                self
            }

            /// The instantiated graph.
            pub fn exec(&self) -> &B::Exec {
                &self.exec
            }

            /// Snapshots, in spec order (buffers, then scratch), for logs and tests.
            pub fn snapshots(&self) -> ::std::vec::Vec<&::stepgraph::graph::PtrSnapshot> {
                ::std::vec![#(&self.#snaps,)* #(&self.#scratch_snaps,)*]
            }
        }

        impl #graph<#ctx> {
            /// Captures the step: checks the context's scratch areas, snapshots
            /// every allocation, freezes scratch, runs the ops on the capture
            /// stream, always ends the capture (also when an op failed), then
            /// instantiates and uploads the graph. Run the step eagerly once
            /// before (`run_eager`) so kernels, libraries and scratch are warm.
            pub fn capture(ctx: &#ctx, mut bufs: #capture<'_>, shape: ::stepgraph::graph::ShapeKey) -> ::core::result::Result<Self, ::stepgraph::graph::GraphError> {
                #(
                    if !::stepgraph::graph::Backend::has_scratch(ctx, #scratch_names) {
                        return ::core::result::Result::Err(::stepgraph::graph::GraphError::UnknownScratch { step: #name, name: #scratch_names });
                    }
                )*
                ::stepgraph::graph::Backend::set_scratch_frozen(ctx, true);
                ::stepgraph::graph::Backend::begin_capture(ctx)
                    .map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "begin capture", e))?;
                let body = #capture::__run_ops(ctx, &mut bufs);
                ::stepgraph::graph::Backend::enter_op(ctx, ::core::option::Option::None);
                let ended = ::stepgraph::graph::Backend::end_capture(ctx);
                body?;
                let exec = ended.map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "end capture", e))?;
                ::stepgraph::graph::Backend::upload(ctx, &exec)
                    .map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "upload", e))?;
                ::core::result::Result::Ok(Self::__from_parts(ctx, exec, shape, #(#from_view,)*))
            }

            /// Replays the step after checking that no allocation moved or
            /// changed size since capture. On a difference it returns
            /// `GraphError::PointerMoved` (or `ShapeChanged`) naming the buffer
            /// and tensor, and launches nothing.
            pub fn replay(&self, ctx: &#ctx, bufs: #replay<'_>) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                self.replay_ptrs(ctx, #(#from_view2,)*)
            }

            /// Replays like `replay`; if the graph is stale and the policy is
            /// `Recapture`, captures the step again against the live buffers
            /// and launches that.
            pub fn replay_or_recapture(&mut self, ctx: &#ctx, mut bufs: #capture<'_>) -> ::core::result::Result<::stepgraph::graph::Replayed, ::stepgraph::graph::GraphError> {
                match self.verify_ptrs(ctx, #(#from_view3,)*) {
                    ::core::result::Result::Ok(()) => {
                        ::stepgraph::graph::Backend::launch(ctx, &self.exec)
                            .map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "launch", e))?;
                        ::core::result::Result::Ok(::stepgraph::graph::Replayed::Launched)
                    }
                    ::core::result::Result::Err(reason)
                        if reason.is_stale_graph() && self.policy == ::stepgraph::graph::MovePolicy::Recapture =>
                    {
                        let policy = self.policy;
                        *self = Self::capture(ctx, bufs.reborrow(), self.shape)?.with_policy(policy);
                        ::stepgraph::graph::Backend::launch(ctx, &self.exec)
                            .map_err(|e| ::stepgraph::graph::GraphError::backend(#name, "launch", e))?;
                        ::core::result::Result::Ok(::stepgraph::graph::Replayed::Recaptured { reason })
                    }
                    ::core::result::Result::Err(e) => ::core::result::Result::Err(e),
                }
            }
        }

    }
}

/// `impl TrainingStep for Step`: the one trait engines and benches take, so
/// they need no adapter per step.
fn emit_training_step(m: &StepModel<'_>) -> TokenStream {
    let (graph, ctx, info) = (&m.graph, &m.context, &m.info);
    let (impl_g, self_ty, where_c) = (
        &m.self_impl.impl_generics,
        &m.self_impl.self_ty,
        &m.self_impl.where_clause,
    );
    quote! {
        impl #impl_g ::stepgraph::graph::TrainingStep for #self_ty #where_c {
            type Context = #ctx;
            type Graph = #graph<#ctx>;
            const INFO: ::stepgraph::graph::StepInfo = #info;

            fn run_eager(&mut self, ctx: &#ctx) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                self.capture_view().run_eager(ctx)
            }

            fn capture(&mut self, ctx: &#ctx, shape: ::stepgraph::graph::ShapeKey) -> ::core::result::Result<Self::Graph, ::stepgraph::graph::GraphError> {
                <#graph<#ctx>>::capture(ctx, self.capture_view(), shape)
            }

            fn replay(&self, ctx: &#ctx, graph: &Self::Graph) -> ::core::result::Result<(), ::stepgraph::graph::GraphError> {
                graph.replay(ctx, self.replay_view())
            }

            fn replay_or_recapture(&mut self, ctx: &#ctx, graph: &mut Self::Graph) -> ::core::result::Result<::stepgraph::graph::Replayed, ::stepgraph::graph::GraphError> {
                graph.replay_or_recapture(ctx, self.capture_view())
            }
        }
    }
}

/// Compile-time checks spanned on the user's code: each field has its spec
/// type and lists its allocations.
fn emit_asserts(m: &StepModel<'_>) -> TokenStream {
    if m.self_impl.instantiated {
        return emit_instance_asserts(m);
    }
    let checks = m.buffers.iter().map(|b| {
        let (fty, sty) = (&b.field_ty, &b.ty);
        let span = syn::spanned::Spanned::span(&b.field_ty);
        quote_spanned! {span=>
            __same::<#fty, #sty>();
            __ptrs::<#fty>();
        }
    });
    let ctx = &m.context;
    let ctx_span = Span::call_site();
    let ctx_check = quote_spanned!(ctx_span=> __backend::<#ctx>(););
    quote! {
        const _: () = {
            fn __same<A: ?::core::marker::Sized + ::stepgraph::graph::SameType<B>, B: ?::core::marker::Sized>() {}
            fn __ptrs<A: ?::core::marker::Sized + ::stepgraph::graph::DevicePtrs>() {}
            fn __backend<A: ::stepgraph::graph::Backend>() {}
            #[allow(dead_code)]
            fn __check() {
                #(#checks)*
                #ctx_check
            }
        };
    }
}

/// The same checks for one instantiation of a generic struct: the field
/// types mention the struct's type parameters, which are not in scope in a
/// free function, so each field is checked through a value of the
/// instantiated struct.
fn emit_instance_asserts(m: &StepModel<'_>) -> TokenStream {
    let (impl_g, self_ty) = (&m.self_impl.impl_generics, &m.self_impl.self_ty);
    let checks = m.buffers.iter().map(|b| {
        let (f, sty) = (&b.ident, &b.ty);
        let span = syn::spanned::Spanned::span(&b.field_ty);
        let place = match b.hold {
            Hold::Owned => quote_spanned!(span=> &s.#f),
            Hold::Shared | Hold::Exclusive => quote_spanned!(span=> &*s.#f),
        };
        quote_spanned! {span=>
            __same::<_, #sty>(#place);
            __ptrs(#place);
        }
    });
    let ctx = &m.context;
    quote! {
        const _: () = {
            fn __same<A: ?::core::marker::Sized + ::stepgraph::graph::SameType<B>, B: ?::core::marker::Sized>(_: &A) {}
            fn __ptrs<A: ?::core::marker::Sized + ::stepgraph::graph::DevicePtrs>(_: &A) {}
            fn __backend<A: ::stepgraph::graph::Backend>() {}
            #[allow(dead_code)]
            fn __check #impl_g (s: &#self_ty) {
                #(#checks)*
                __backend::<#ctx>();
            }
        };
    }
}
