use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "struct_shared_but_written.ron")]
struct Step<'a> {
    x: &'a FakePtrs,
    h: &'a FakePtrs,
    y: FakePtrs,
}

fn main() {}
