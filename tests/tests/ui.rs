//! Compile-fail and compile-pass cases for `#[derive(TrainingGraph)]`: each
//! `tests/ui/fail/*.rs` is one diagnostic, with its spec beside it and the
//! exact compiler output in the `.stderr` file. Refresh the expected output
//! with `TRYBUILD=overwrite cargo test -p stepgraph-tests --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
