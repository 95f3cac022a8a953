//! Expansion snapshots: the full code `#[derive(TrainingGraph)]` and
//! `#[derive(DevicePtrs)]` generate, formatted with prettyplease. A change to
//! the generator shows up here as a readable diff; accept it with
//! `UPDATE_EXPECT=1 cargo test -p stepgraph-codegen`.

use expect_test::expect_file;
use stepgraph_codegen::{GraphAttr, expand};
use stepgraph_spec::Spec;

const SPEC: &str = r#"Step(
    name: "Toy",
    precision: Bf16,
    context: "crate::Gpu",
    buffers: [
        (name: "weights", ty: "crate::Weights", role: Param),
        (name: "tokens", ty: "crate::Tokens", role: Input),
        (name: "acts", ty: "crate::Acts", role: Scratch),
        (name: "loss", ty: "crate::Loss", role: Output),
    ],
    scratch: ["half_staging"],
    ops: [
        ("crate::forward", [Ref("weights"), Ref("tokens"), Mut("acts"), Mut("loss")]),
        ("crate::update", [Ref("acts"), Mut("weights")]),
    ],
)"#;

fn pretty(tokens: proc_macro2::TokenStream) -> String {
    let file: syn::File = syn::parse2(tokens).expect("generated code parses as a file");
    prettyplease::unparse(&file)
}

#[test]
fn training_graph_expansion() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[derive(TrainingGraph)]
        #[graph(spec = "toy.ron")]
        pub struct ToyStep<'a> {
            weights: crate::Weights,
            tokens: &'a crate::Tokens,
            acts: crate::Acts,
            loss: crate::Loss,
            #[graph(skip)]
            steps: u64,
        }
    };
    let attr = GraphAttr::parse(&input).unwrap();
    let spec = Spec::parse("toy.ron", SPEC).unwrap();
    let out = pretty(expand(&input, &attr, &spec, Some("/abs/specs/toy.ron")));
    expect_file!["snapshots/toy_step.rs.txt"].assert_eq(&out);
}

#[test]
fn device_ptrs_expansion() {
    let input: syn::DeriveInput = syn::parse_quote! {
        struct Layer<T> {
            in_proj: T,
            norm: Buf,
            #[ptrs(skip)]
            dims: usize,
        }
    };
    let out = pretty(stepgraph_codegen::derive_device_ptrs(&input));
    expect_file!["snapshots/layer_ptrs.rs.txt"].assert_eq(&out);
}
