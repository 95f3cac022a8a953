//! The data model of a spec, as RON spells it.

use serde::Deserialize;

/// One training step: the root of a spec file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Prefix of the generated items: `<name>Capture`, `<name>Replay`, `<name>Graph`.
    pub name: String,
    /// Compute precision of the step.
    pub precision: Precision,
    /// Rust type of the execution context every op receives first (`&Context`);
    /// it must implement `stepgraph::graph::Backend`.
    pub context: String,
    /// Every allocation the captured body touches.
    pub buffers: Vec<Buffer>,
    /// Context-owned scratch areas the ops use: presized before capture, frozen after.
    #[serde(default)]
    pub scratch: Vec<String>,
    /// The body, in execution order.
    pub ops: Vec<Op>,
}

/// A buffer of the step: one field of the step struct.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    /// Field name in the step struct.
    pub name: String,
    /// Rust type of the field (it must implement `stepgraph::graph::DevicePtrs`).
    pub ty: String,
    /// What the buffer is for; decides which checks apply.
    pub role: Role,
}

/// What a buffer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Role {
    /// Trainable parameters; may be read only (eval) or updated (optimizer).
    Param,
    /// Optimizer state (moments, step count); the step must update it.
    OptimState,
    /// State carried from step to step (e.g. SSM state across windows); the step must update it.
    State,
    /// Step-local memory (activations, gradients); must be written before it is read.
    Scratch,
    /// Written by the host before each replay; no op may write it.
    Input,
    /// Read by the host after each replay; some op must write it.
    Output,
}

impl Role {
    /// The spelling used in specs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Param => "Param",
            Role::OptimState => "OptimState",
            Role::State => "State",
            Role::Scratch => "Scratch",
            Role::Input => "Input",
            Role::Output => "Output",
        }
    }
}

/// Compute precision of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Precision {
    /// Everything in f32.
    F32,
    /// bf16 GEMM operands and activations, f32 master weights, state and reductions.
    Bf16,
}

impl Precision {
    /// Lower-case name, as the CLI spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// One op: a runtime function and its buffer arguments in call order.
///
/// Spelled as a tuple: `("crate::ops::adamw", [Ref("grads"), Mut("weights")])`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Op(pub String, pub Vec<Arg>);

impl Op {
    /// The function path.
    pub fn path(&self) -> &str {
        &self.0
    }

    /// The buffer arguments.
    pub fn args(&self) -> &[Arg] {
        &self.1
    }
}

/// One buffer argument of an op.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum Arg {
    /// Passed as `&buffer`.
    Ref(String),
    /// Passed as `&mut buffer`.
    Mut(String),
}

impl Arg {
    /// The buffer it names.
    pub fn buffer(&self) -> &str {
        match self {
            Arg::Ref(b) | Arg::Mut(b) => b,
        }
    }

    /// How it is passed.
    pub fn access(&self) -> Access {
        match self {
            Arg::Ref(_) => Access::Ref,
            Arg::Mut(_) => Access::Mut,
        }
    }
}

/// How an op receives a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Shared borrow: read only.
    Ref,
    /// Exclusive borrow: read and write.
    Mut,
}
