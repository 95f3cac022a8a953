//! One step struct generic over its precision, instantiated by two specs
//! (`with(P = ..)`): each spec gets its own capture/replay/graph types, its
//! own guard tests and its own `TrainingStep` impl, and code written against
//! the trait drives both.

use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};
use stepgraph::graph::{DevicePtrs, GraphError, Precision, ShapeKey, TrainingStep};
use stepgraph::{DevicePtrs, TrainingGraph};

/// Weights of the wide precision: a master and a copy.
#[derive(DevicePtrs)]
pub struct Pair {
    master: FakePtrs,
    copy: FakePtrs,
}

/// What a precision decides: the type of its weights.
pub trait Prec {
    /// The weights.
    type W: DevicePtrs;
    /// Weights for the test.
    fn weights() -> Self::W;
}

/// The narrow precision.
pub struct Lo;
/// The wide one.
pub struct Hi;

impl Prec for Lo {
    type W = FakePtrs;
    fn weights() -> FakePtrs {
        FakePtrs::new(1, 2)
    }
}

impl Prec for Hi {
    type W = Pair;
    fn weights() -> Pair {
        Pair {
            master: FakePtrs::new(1, 2),
            copy: FakePtrs::new(6, 2),
        }
    }
}

mod ops {
    use super::*;

    pub fn forward<W: DevicePtrs>(
        ctx: &FakeBackend,
        _w: &W,
        _a: &mut FakePtrs,
    ) -> Result<(), FakeError> {
        ctx.record("forward");
        Ok(())
    }

    pub fn update<W: DevicePtrs>(
        ctx: &FakeBackend,
        _a: &FakePtrs,
        _w: &mut W,
    ) -> Result<(), FakeError> {
        ctx.record("update");
        Ok(())
    }
}

#[derive(TrainingGraph)]
#[graph(
    spec_inline = r#"Step(name: "GenLo", precision: F32,
        context: "::stepgraph::graph::testing::FakeBackend",
        buffers: [
            (name: "weights", ty: "::stepgraph::graph::testing::FakePtrs", role: Param),
            (name: "acts", ty: "::stepgraph::graph::testing::FakePtrs", role: Scratch),
        ],
        ops: [("ops::forward", [Ref("weights"), Mut("acts")]), ("ops::update", [Ref("acts"), Mut("weights")])],
    )"#,
    with(P = Lo)
)]
#[graph(
    spec_inline = r#"Step(name: "GenHi", precision: Bf16,
        context: "::stepgraph::graph::testing::FakeBackend",
        buffers: [
            (name: "weights", ty: "crate::Pair", role: Param),
            (name: "acts", ty: "::stepgraph::graph::testing::FakePtrs", role: Scratch),
        ],
        ops: [("ops::forward", [Ref("weights"), Mut("acts")]), ("ops::update", [Ref("acts"), Mut("weights")])],
    )"#,
    with(P = Hi)
)]
struct Gen<P: Prec> {
    weights: P::W,
    acts: FakePtrs,
    #[graph(skip)]
    steps: u64,
}

fn build<P: Prec>() -> Gen<P> {
    Gen {
        weights: P::weights(),
        acts: FakePtrs::new(3, 1),
        steps: 0,
    }
}

const SHAPE: ShapeKey = ShapeKey {
    batch: 1,
    seq_len: 4,
};

/// Written once, for every instantiation.
fn run<P: Prec>() -> Result<(FakeBackend, Gen<P>), GraphError>
where
    Gen<P>: TrainingStep<Context = FakeBackend>,
{
    let ctx = FakeBackend::with_scratch(&[], 0);
    let mut s = build::<P>();
    s.run_eager(&ctx)?;
    let g = s.capture(&ctx, SHAPE)?;
    for _ in 0..2 {
        s.replay(&ctx, &g)?;
        s.steps += 1;
    }
    Ok((ctx, s))
}

#[test]
fn both_instantiations_capture_and_replay_through_the_trait() {
    let (lo, s) = run::<Lo>().unwrap();
    assert_eq!((lo.launches(), s.steps), (2, 2));
    let (hi, _) = run::<Hi>().unwrap();
    assert_eq!(hi.launches(), 2);
}

#[test]
fn each_instantiation_has_its_own_spec() {
    let lo = <Gen<Lo> as TrainingStep>::INFO;
    let hi = <Gen<Hi> as TrainingStep>::INFO;
    assert_eq!((lo.name, lo.precision), ("GenLo", Precision::F32));
    assert_eq!((hi.name, hi.precision), ("GenHi", Precision::Bf16));
    assert_eq!(Gen::<Hi>::STEP.buffers[0].ty, "crate::Pair");
}

#[test]
fn a_moved_copy_of_the_wide_weights_is_refused_by_tensor() {
    let ctx = FakeBackend::with_scratch(&[], 0);
    let mut s = build::<Hi>();
    let g = s.capture(&ctx, SHAPE).unwrap();
    s.weights.copy.move_tensor(1);
    match s.replay(&ctx, &g) {
        Err(GraphError::PointerMoved { buffer, tensor, .. }) => {
            assert_eq!((buffer, tensor.as_str()), ("weights", "copy.t1"));
        }
        other => panic!("expected a refused replay, got {other:?}"),
    }
    assert_eq!(ctx.launches(), 0);
}
