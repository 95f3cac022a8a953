use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "state_never_written.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {}
