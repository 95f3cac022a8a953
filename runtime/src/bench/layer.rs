//! The per-op timing of the breakdown: [`Timed`], a [`Probe`] that puts
//! every op of the step's own forward and backward bodies
//! ([`forward_probed`](crate::mamba3::gpu::forward_probed),
//! [`backward_probed`](crate::mamba3::gpu::backward_probed)) between two
//! CUDA events.
//!
//! The bodies name each op and its [`Family`] where it is launched, so the
//! breakdown times exactly the launches the step makes; there is no copy of
//! the op sequence here to drift from it.

use crate::device::{EventSpan, Gpu, GpuError};

pub use crate::mamba3::gpu::Family;
use crate::mamba3::gpu::Probe;

/// One timed launch (or group of launches under one name).
#[derive(Clone, Debug, PartialEq)]
pub struct OpSample {
    /// Its family.
    pub family: Family,
    /// What ran, e.g. `scan fwd`.
    pub name: &'static str,
    /// GPU time between the events around it.
    pub ms: f32,
}

/// Times each op between two CUDA events and records it. An op's span
/// closes (end event, then a wait for it) when the next op is entered or
/// the pass is finished, and the next span starts after that wait, as
/// [`Gpu::time_ms`] around each op would: each op's time includes its own
/// launch, which is what eager execution pays for it, and a timed pass is
/// slower end to end than an eager step. Refused during capture.
#[derive(Debug)]
pub struct Timed {
    span: EventSpan,
    open: Option<(Family, &'static str)>,
    samples: Vec<OpSample>,
}

impl Timed {
    /// A probe with no samples yet.
    pub fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self {
            span: gpu.event_span()?,
            open: None,
            samples: Vec::new(),
        })
    }

    /// Ends the open op's span, if any, and records its time.
    fn close(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        if let Some((family, name)) = self.open.take() {
            let ms = self.span.stop(gpu)?;
            self.samples.push(OpSample { family, name, ms });
        }
        Ok(())
    }

    /// Ends the last op's span and returns every sample, in launch order.
    pub fn finish(mut self, gpu: &Gpu) -> Result<Vec<OpSample>, GpuError> {
        self.close(gpu)?;
        Ok(self.samples)
    }
}

impl Probe for Timed {
    fn enter(&mut self, gpu: &Gpu, family: Family, op: &'static str) -> Result<(), GpuError> {
        self.close(gpu)?;
        self.span.start(gpu)?;
        self.open = Some((family, op));
        Ok(())
    }
}
