//! The one trait every derived step implements.
//!
//! `#[derive(TrainingGraph)]` emits, next to the step's own `XCapture`,
//! `XReplay` and `XGraph`, an implementation of [`TrainingStep`] for the step
//! struct. Code that drives steps (the training engine, the bench) is written
//! once against it and takes any derived step, the way serde's data formats
//! take any `Serialize`: no wrapper trait, no adapter macro per step.

use super::backend::{Backend, Replayed, ShapeKey, StepInfo};
use super::error::GraphError;

/// A training step derived from a spec: it runs eagerly, captures itself
/// into a graph, and replays that graph behind the generated pointer guards.
pub trait TrainingStep {
    /// The execution context the spec names (`context:`).
    type Context: Backend;
    /// The captured graph (`XGraph<Context>`), holding a snapshot of every
    /// allocation it was captured with.
    type Graph;
    /// The step as its spec declares it: name, precision, buffers, ops.
    const INFO: StepInfo;

    /// Runs the spec's ops once, in order, without capturing: the eager
    /// baseline and the warm-up before a capture.
    fn run_eager(&mut self, ctx: &Self::Context) -> Result<(), GraphError>;

    /// Captures the step for `shape` (see the generated `XGraph::capture`).
    fn capture(&mut self, ctx: &Self::Context, shape: ShapeKey) -> Result<Self::Graph, GraphError>;

    /// Replays `graph` after checking that no allocation moved or changed
    /// size since capture; launches nothing when one did.
    fn replay(&self, ctx: &Self::Context, graph: &Self::Graph) -> Result<(), GraphError>;

    /// Replays `graph`; when it is stale and its policy is
    /// [`MovePolicy::Recapture`](super::MovePolicy::Recapture), captures the
    /// step again against the live buffers and launches that.
    fn replay_or_recapture(
        &mut self,
        ctx: &Self::Context,
        graph: &mut Self::Graph,
    ) -> Result<Replayed, GraphError>;
}
