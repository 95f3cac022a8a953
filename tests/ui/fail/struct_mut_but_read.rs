use stepgraph::TrainingGraph;
use stepgraph::graph::testing::FakePtrs;

#[derive(TrainingGraph)]
#[graph(spec = "struct_mut_but_read.ron")]
struct Step<'a> {
    x: &'a mut FakePtrs,
    h: FakePtrs,
    y: FakePtrs,
}

fn main() {}
