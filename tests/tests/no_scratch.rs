//! A step with no context scratch and eight buffers: its generated guard
//! tests must compile and run (an empty scratch list and long generated
//! signatures are both edge cases of the generator).

use stepgraph::TrainingGraph;
use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};

#[expect(
    clippy::too_many_arguments,
    reason = "an op taking every buffer of the spec, in spec order"
)]
fn all(
    ctx: &FakeBackend,
    a: &FakePtrs,
    b: &FakePtrs,
    c: &mut FakePtrs,
    d: &mut FakePtrs,
    e: &mut FakePtrs,
    f: &mut FakePtrs,
    g: &mut FakePtrs,
    h: &mut FakePtrs,
) -> Result<(), FakeError> {
    let _ = (a, b, c, d, e, f, g, h);
    ctx.record("all");
    Ok(())
}

#[derive(TrainingGraph)]
#[graph(spec_inline = r#"Step(
    name: "Wide", precision: Bf16,
    context: "::stepgraph::graph::testing::FakeBackend",
    buffers: [
        (name: "a", ty: "::stepgraph::graph::testing::FakePtrs", role: Input),
        (name: "b", ty: "::stepgraph::graph::testing::FakePtrs", role: Param),
        (name: "c", ty: "::stepgraph::graph::testing::FakePtrs", role: State),
        (name: "d", ty: "::stepgraph::graph::testing::FakePtrs", role: OptimState),
        (name: "e", ty: "::stepgraph::graph::testing::FakePtrs", role: Scratch),
        (name: "f", ty: "::stepgraph::graph::testing::FakePtrs", role: Scratch),
        (name: "g", ty: "::stepgraph::graph::testing::FakePtrs", role: Output),
        (name: "h", ty: "::stepgraph::graph::testing::FakePtrs", role: Output),
    ],
    ops: [("all", [Ref("a"), Ref("b"), Mut("c"), Mut("d"), Mut("e"), Mut("f"), Mut("g"), Mut("h")])],
)"#)]
struct Wide {
    a: FakePtrs,
    b: FakePtrs,
    c: FakePtrs,
    d: FakePtrs,
    e: FakePtrs,
    f: FakePtrs,
    g: FakePtrs,
    h: FakePtrs,
}

#[test]
fn wide_step_captures_and_replays() {
    let ctx = FakeBackend::new();
    let mut w = Wide {
        a: FakePtrs::new(1, 1),
        b: FakePtrs::new(2, 2),
        c: FakePtrs::new(3, 1),
        d: FakePtrs::new(4, 1),
        e: FakePtrs::new(5, 1),
        f: FakePtrs::new(6, 1),
        g: FakePtrs::new(7, 1),
        h: FakePtrs::new(8, 1),
    };
    let g = WideGraph::capture(&ctx, w.capture_view(), Default::default()).unwrap();
    g.replay(&ctx, w.replay_view()).unwrap();
    assert_eq!(g.snapshots().len(), 8);
    assert_eq!(Wide::STEP.scratch.len(), 0);
}
