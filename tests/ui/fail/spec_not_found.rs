use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "does_not_exist.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {}
