use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "truncated.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {}
