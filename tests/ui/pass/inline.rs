use stepgraph::TrainingGraph;
use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};

fn bump(ctx: &FakeBackend, _c: &mut FakePtrs) -> Result<(), FakeError> {
    ctx.record("bump");
    Ok(())
}

/// A step whose spec is inline: handy for examples and tests.
#[derive(TrainingGraph)]
#[graph(spec_inline = r#"Step(
    name: "Counter", precision: F32,
    context: "::stepgraph::graph::testing::FakeBackend",
    buffers: [(name: "count", ty: "::stepgraph::graph::testing::FakePtrs", role: State)],
    ops: [("bump", [Mut("count")])],
)"#)]
pub struct Counter<'a> {
    count: &'a mut FakePtrs,
}

fn main() {
    let ctx = FakeBackend::new();
    let mut c = FakePtrs::new(7, 1);
    let mut step = Counter { count: &mut c };
    let g = CounterGraph::capture(&ctx, step.capture_view(), Default::default()).unwrap();
    g.replay(&ctx, step.replay_view()).unwrap();
    assert_eq!(g.exec().events, ["bump"]);
}
