use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

mod ops {
    use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};
    pub fn layer(_: &FakeBackend, _x: &FakePtrs, _h: &mut FakePtrs) -> Result<(), FakeError> { Ok(()) }
    pub fn head(_: &FakeBackend, _h: &FakePtrs, _y: &mut FakePtrs) -> Result<(), FakeError> { Ok(()) }
}

#[derive(TrainingGraph)]
#[graph(spec = "toy.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {
    use stepgraph::graph::testing::FakeBackend;
    let ctx = FakeBackend::new();
    let mut s = Step { x: FakePtrs::new(1, 1), h: FakePtrs::new(2, 2), y: FakePtrs::new(3, 1) };
    s.run_eager(&ctx).unwrap();
    let g = ToyGraph::capture(&ctx, s.capture_view(), Default::default()).unwrap();
    g.replay(&ctx, s.replay_view()).unwrap();
    assert_eq!(ctx.launches(), 1);
}
