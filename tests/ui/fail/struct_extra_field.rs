use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "struct_extra_field.ron")]
struct Step {
    x: FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
    cache: FakePtrs,
}

fn main() {}
