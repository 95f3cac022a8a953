//! A whole step derived from a spec and run on the host-side fake backend:
//! capture runs the ops in order, replay launches, guards refuse moved
//! memory, re-capture follows the policy, capture violations name their op.
//! The derive's own generated guard tests also run in this binary.

use stepgraph::TrainingGraph;
use stepgraph::graph::testing::{FakeBackend, FakeError, FakePtrs};
use stepgraph::graph::{GraphError, MovePolicy, Replayed, ShapeKey, TrainingStep};

mod ops {
    use super::*;

    pub fn forward(
        ctx: &FakeBackend,
        _w: &FakePtrs,
        _t: &FakePtrs,
        _a: &mut FakePtrs,
        _l: &mut FakePtrs,
    ) -> Result<(), FakeError> {
        ctx.record("forward");
        ctx.scratch("reduce_partials", 64)?;
        Ok(())
    }

    pub fn update(
        ctx: &FakeBackend,
        _a: &FakePtrs,
        w: &mut FakePtrs,
        _m: &mut FakePtrs,
    ) -> Result<(), FakeError> {
        ctx.record("update");
        if w.len() > 3 {
            // A buffer that grew is "reallocated" here, during capture.
            ctx.alloc(1024)?;
        }
        Ok(())
    }
}

#[derive(TrainingGraph)]
#[graph(spec = "specs/fake_step.ron")]
struct Step {
    weights: FakePtrs,
    adam: FakePtrs,
    acts: FakePtrs,
    tokens: FakePtrs,
    loss: FakePtrs,
    #[graph(skip)]
    steps_done: u64,
}

fn step() -> Step {
    Step {
        weights: FakePtrs::new(1, 3),
        adam: FakePtrs::new(2, 6),
        acts: FakePtrs::new(3, 2),
        tokens: FakePtrs::new(4, 1),
        loss: FakePtrs::new(5, 1),
        steps_done: 0,
    }
}

const SHAPE: ShapeKey = ShapeKey {
    batch: 2,
    seq_len: 8,
};

#[test]
fn capture_records_the_ops_in_spec_order_and_replay_launches() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    s.run_eager(&ctx).unwrap();
    assert_eq!(ctx.take_eager_events(), ["forward", "update"]);
    let g = FakeGraph::capture(&ctx, s.capture_view(), SHAPE).unwrap();
    assert_eq!(g.exec().events, ["forward", "update"]);
    assert_eq!((ctx.uploads(), ctx.launches()), (1, 0));
    for _ in 0..5 {
        g.replay(&ctx, s.replay_view()).unwrap();
        s.steps_done += 1;
    }
    assert_eq!(ctx.launches(), 5);
    assert_eq!(g.shape(), SHAPE);
    assert!(!ctx.is_capturing());
}

#[test]
fn a_moved_buffer_is_refused_by_name_and_nothing_launches() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    let g = FakeGraph::capture(&ctx, s.capture_view(), SHAPE).unwrap();
    s.adam.move_tensor(4);
    let err = g.replay(&ctx, s.replay_view()).unwrap_err();
    match &err {
        GraphError::PointerMoved {
            step,
            buffer,
            tensor,
            ..
        } => {
            assert_eq!((*step, *buffer, tensor.as_str()), ("Fake", "adam", "t4"));
        }
        other => panic!("expected PointerMoved, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("buffer `adam` (tensor `t4`) moved since capture"),
        "{err}"
    );
    assert_eq!(ctx.launches(), 0);
}

#[test]
fn recapture_policy_captures_again_and_launches() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    let mut g = FakeGraph::capture(&ctx, s.capture_view(), SHAPE)
        .unwrap()
        .with_policy(MovePolicy::Recapture);
    assert!(matches!(
        g.replay_or_recapture(&ctx, s.capture_view()).unwrap(),
        Replayed::Launched
    ));
    s.tokens.move_tensor(0);
    match g.replay_or_recapture(&ctx, s.capture_view()).unwrap() {
        Replayed::Recaptured {
            reason: GraphError::PointerMoved {
                buffer: "tokens", ..
            },
        } => {}
        other => panic!("expected a re-capture for tokens, got {other:?}"),
    }
    assert_eq!((ctx.launches(), ctx.uploads()), (2, 2));
    g.replay(&ctx, s.replay_view()).unwrap();
}

#[test]
fn default_policy_refuses_instead_of_recapturing() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    let mut g = FakeGraph::capture(&ctx, s.capture_view(), SHAPE).unwrap();
    s.loss.resize_tensor(0, 4096);
    let err = g.replay_or_recapture(&ctx, s.capture_view()).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::ShapeChanged {
                buffer: "loss",
                live_bytes: 4096,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(ctx.launches(), 0);
}

#[test]
fn an_allocation_during_capture_is_a_violation_naming_the_op() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    s.weights.push_tensor();
    let err = FakeGraph::capture(&ctx, s.capture_view(), SHAPE)
        .map(|_| ())
        .unwrap_err();
    match err {
        GraphError::CaptureViolation {
            step: "Fake",
            op: "ops::update",
            action,
        } => assert_eq!(action, "allocate device memory"),
        other => panic!("expected a capture violation in ops::update, got {other:?}"),
    }
    // The capture was ended, so the context works again.
    assert!(!ctx.is_capturing());
    s.weights = FakePtrs::new(1, 3);
    FakeGraph::capture(&ctx, s.capture_view(), SHAPE).unwrap();
}

#[test]
fn scratch_growth_after_freezing_fails_the_op_instead_of_moving_memory() {
    // 32 bytes is too small for ops::forward's 64: the capture must fail in
    // that op, because scratch is frozen before the capture opens.
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 32);
    let mut s = step();
    let err = FakeGraph::capture(&ctx, s.capture_view(), SHAPE)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::Op {
                op: "ops::forward",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!ctx.is_capturing());
}

#[test]
fn a_context_without_the_scratch_is_refused() {
    let ctx = FakeBackend::new();
    let mut s = step();
    let err = FakeGraph::capture(&ctx, s.capture_view(), SHAPE)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::UnknownScratch {
                name: "reduce_partials",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn step_info_mirrors_the_spec() {
    let info = Step::STEP;
    assert_eq!(info.name, "Fake");
    assert_eq!(
        info.ops.iter().map(|o| o.path).collect::<Vec<_>>(),
        ["ops::forward", "ops::update"]
    );
    let written: Vec<_> = info
        .buffers
        .iter()
        .filter(|b| b.written)
        .map(|b| b.name)
        .collect();
    assert_eq!(written, ["weights", "adam", "acts", "loss"]);
    assert_eq!(FakeGraph::<FakeBackend>::INFO.scratch, ["reduce_partials"]);
}

/// What an engine or a bench does with any derived step, written once
/// against the trait the derive implements.
fn drive<S: TrainingStep>(ctx: &S::Context, s: &mut S, replays: usize) -> Result<(), GraphError> {
    s.run_eager(ctx)?;
    let g = s.capture(ctx, SHAPE)?;
    for _ in 0..replays {
        s.replay(ctx, &g)?;
    }
    Ok(())
}

#[test]
fn the_derived_step_is_a_training_step() {
    let ctx = FakeBackend::with_scratch(&["reduce_partials"], 256);
    let mut s = step();
    drive(&ctx, &mut s, 3).unwrap();
    assert_eq!((ctx.uploads(), ctx.launches()), (1, 3));
    assert_eq!(<Step as TrainingStep>::INFO.name, Step::STEP.name);

    // Through the trait, a moved buffer is refused exactly as by the graph.
    let mut g = <Step as TrainingStep>::capture(&mut s, &ctx, SHAPE).unwrap();
    s.weights.move_tensor(0);
    assert!(matches!(
        s.replay(&ctx, &g),
        Err(GraphError::PointerMoved {
            buffer: "weights",
            ..
        })
    ));
    g = g.with_policy(MovePolicy::Recapture);
    assert!(matches!(
        s.replay_or_recapture(&ctx, &mut g),
        Ok(Replayed::Recaptured { .. })
    ));
}
