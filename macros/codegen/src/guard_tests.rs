//! The guard tests every derive emits.
//!
//! They run in the user's `cargo test`, on the host: a [`FakeBackend`] stands
//! in for the GPU and fake buffers stand in for device memory. Each buffer
//! (and each scratch area) is moved, resized and regrown in turn, and the
//! generated replay must refuse, name it, and launch nothing; an untouched set
//! must replay. Because they call the same generated `replay_ptrs` a real
//! replay calls, deleting any guard from the code generator fails them.
//!
//! [`FakeBackend`]: https://docs.rs/stepgraph (stepgraph::graph::testing::FakeBackend)

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::fields::StepModel;

pub(crate) fn emit(m: &StepModel<'_>) -> TokenStream {
    let graph = &m.graph;
    let name = &m.name;
    let module = format_ident!("__stepgraph_guards_{}", name.to_lowercase());
    let n = m.buffers.len();
    let scratch: Vec<&str> = m.scratch.iter().map(String::as_str).collect();
    let n_scratch = scratch.len();
    // Buffers get 1, 2, 3, 1, 2, 3, ... allocations, so both plain and
    // composite buffers are exercised and tensor paths are checked.
    let counts: Vec<usize> = (0..n).map(|i| i % 3 + 1).collect();
    let idx: Vec<usize> = (0..n).collect();
    let args = quote!(#(&f[#idx],)*);

    let per_buffer = m.buffers.iter().enumerate().map(|(i, b)| {
        let moved = format_ident!("moving_{}_is_refused", b.name);
        let resized = format_ident!("resizing_{}_is_refused", b.name);
        let grown = format_ident!("growing_{}_is_refused", b.name);
        let bname = &b.name;
        quote! {
            #[test]
            fn #moved() {
                for t in 0..fakes()[#i].len() {
                    let (b, g) = captured();
                    let mut f = fakes();
                    f[#i].move_tensor(t);
                    match g.replay_ptrs(&b, #args) {
                        ::core::result::Result::Err(::stepgraph::graph::GraphError::PointerMoved { step, buffer, tensor, captured, live }) => {
                            assert_eq!((step, buffer), (#name, #bname));
                            assert_eq!(tensor, f[#i].path(t));
                            assert_ne!(captured, live);
                        }
                        other => panic!("moving tensor {t} of `{}` must refuse the replay, got {other:?}", #bname),
                    }
                    assert_eq!(b.launches(), 0, "a refused replay launched");
                }
            }

            #[test]
            fn #resized() {
                let (b, g) = captured();
                let mut f = fakes();
                f[#i].resize_tensor(0, 2048);
                match g.replay_ptrs(&b, #args) {
                    ::core::result::Result::Err(::stepgraph::graph::GraphError::ShapeChanged { buffer, captured_bytes, live_bytes, .. }) => {
                        assert_eq!(buffer, #bname);
                        assert_eq!((captured_bytes, live_bytes), (1024, 2048));
                    }
                    other => panic!("resizing `{}` must refuse the replay, got {other:?}", #bname),
                }
                assert_eq!(b.launches(), 0, "a refused replay launched");
            }

            #[test]
            fn #grown() {
                let (b, g) = captured();
                let mut f = fakes();
                f[#i].push_tensor();
                match g.replay_ptrs(&b, #args) {
                    ::core::result::Result::Err(::stepgraph::graph::GraphError::TensorSetChanged { buffer, .. }) => {
                        assert_eq!(buffer, #bname);
                    }
                    other => panic!("adding an allocation to `{}` must refuse the replay, got {other:?}", #bname),
                }
                assert_eq!(b.launches(), 0, "a refused replay launched");
            }
        }
    });

    let per_scratch = scratch.iter().map(|s| {
        let moved = format_ident!("moving_scratch_{}_is_refused", s);
        let label = format!("scratch:{s}");
        quote! {
            #[test]
            fn #moved() {
                let (b, g) = captured();
                let f = fakes();
                b.move_scratch(#s);
                match g.replay_ptrs(&b, #args) {
                    ::core::result::Result::Err(::stepgraph::graph::GraphError::PointerMoved { buffer, .. }) => {
                        assert_eq!(buffer, #label);
                    }
                    other => panic!("moving scratch `{}` must refuse the replay, got {other:?}", #s),
                }
                assert_eq!(b.launches(), 0, "a refused replay launched");
            }
        }
    });

    quote! {
        #[cfg(test)]
        #[allow(non_snake_case, clippy::all)]
        mod #module {
            type G = super::#graph<::stepgraph::graph::testing::FakeBackend>;

            fn fakes() -> ::std::vec::Vec<::stepgraph::graph::testing::FakePtrs> {
                let counts: [usize; #n] = [#(#counts),*];
                counts
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| ::stepgraph::graph::testing::FakePtrs::new(i + 1, c))
                    .collect()
            }

            fn captured() -> (::stepgraph::graph::testing::FakeBackend, G) {
                let b = ::stepgraph::graph::testing::FakeBackend::with_scratch(&[#(#scratch),*], 4096);
                let f = fakes();
                let g = G::__from_parts(&b, ::core::default::Default::default(), ::stepgraph::graph::ShapeKey::default(), #args);
                (b, g)
            }

            #[test]
            fn unmoved_buffers_replay() {
                let (b, g) = captured();
                let f = fakes();
                for round in 1..=3u64 {
                    g.replay_ptrs(&b, #args).expect("nothing moved, so the replay must launch");
                    assert_eq!(b.launches(), round);
                }
                assert_eq!(g.snapshots().len(), #n + #n_scratch);
            }

            #(#per_buffer)*
            #(#per_scratch)*
        }
    }
}
