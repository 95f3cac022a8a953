use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "struct_missing_field.ron")]
struct Step {
    x: FakePtrs,
    y: FakePtrs,
}

fn main() {}
