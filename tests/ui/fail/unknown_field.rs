use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "unknown_field.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {}
