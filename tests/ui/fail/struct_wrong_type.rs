use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

mod ops {
    use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};
    pub fn layer(_: &FakeBackend, _x: &FakePtrs, _h: &mut FakePtrs) -> Result<(), FakeError> { Ok(()) }
    pub fn head(_: &FakeBackend, _h: &FakePtrs, _y: &mut FakePtrs) -> Result<(), FakeError> { Ok(()) }
}

#[derive(TrainingGraph)]
#[graph(spec = "struct_wrong_type.ron")]
struct Step {
    x: FakePtrs,
    h: Vec<FakePtrs>,
    y: FakePtrs,
}

fn main() {}
