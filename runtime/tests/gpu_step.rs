//! A spec-driven step on the GPU: `#[derive(TrainingGraph)]` over
//! `gpu_step.ron`, captured and replayed on a real `Gpu`.
//!
//! The derive's own guard tests (fake backend, no GPU) also run in this
//! binary, in CI; the tests below need a GPU.

// The derive's `verify_ptrs`/`replay_ptrs`/`__from_parts` take one argument
// per buffer and scratch area (9 here); until the generated code allows this
// lint itself, allow it for this file.

mod gpu_common;

use std::sync::atomic::{AtomicU8, Ordering};

use gpu_common::{bits, gpu, random};
use half::bf16;
use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::graph::{Backend, GraphError, MovePolicy, Replayed, ShapeKey};
use stepgraph::{DevicePtrs, TrainingGraph};

const M: usize = 64;
const K: usize = 96;
const N: usize = 128;
const P: usize = 80;
const SHAPE: ShapeKey = ShapeKey {
    batch: 1,
    seq_len: M,
};

/// Step-local activations: one composite buffer, so guard failures name a
/// tensor inside it.
#[derive(DevicePtrs)]
pub struct Acts {
    h: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
    y2: DeviceBuffer<f32>,
    yb: DeviceBuffer<bf16>,
    acc: DeviceBuffer<f32>,
}

mod ops {
    use super::*;
    use stepgraph::device::{Gemm, GpuError};
    use stepgraph::kernels;

    /// h = silu(x); y = h w; y += 0.5 y^2; yb = bf16(y).
    pub fn hidden(
        gpu: &Gpu,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        a: &mut Acts,
    ) -> Result<(), GpuError> {
        kernels::silu(gpu, x, &mut a.h)?;
        gpu.gemm_f32(&Gemm::new(M, N, K), &a.h, w, &mut a.y)?;
        kernels::mul(gpu, &a.y, &a.y, &mut a.y2)?;
        kernels::axpy(gpu, 0.5, &a.y2, &mut a.y)?;
        kernels::f32_to_bf16(gpu, &a.y, &mut a.yb)
    }

    /// acc = 0; acc += 2 (yb wb) (bf16 GEMM, f32 out); z = acc.
    pub fn project(
        gpu: &Gpu,
        a: &mut Acts,
        wb: &DeviceBuffer<bf16>,
        z: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        gpu.gemm_bf16_f32(&Gemm::new(M, P, N), &a.yb, wb, z)?;
        gpu.zero(&mut a.acc)?;
        kernels::axpy(gpu, 2.0, z, &mut a.acc)?;
        gpu.copy_device(&a.acc, z)
    }

    /// loss = sum(z^2).
    pub fn loss(
        gpu: &Gpu,
        z: &DeviceBuffer<f32>,
        loss: &mut DeviceBuffer<f32>,
    ) -> Result<(), GpuError> {
        kernels::sum_squares(gpu, z, loss)
    }

    pub fn bump(gpu: &Gpu, x: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
        kernels::add_one(gpu, x)
    }

    /// Allocates (mode 1) or synchronizes (mode 2), as a buggy op might.
    pub fn sneaky(gpu: &Gpu, x: &mut DeviceBuffer<f32>) -> Result<(), GpuError> {
        match super::SNEAKY.load(Ordering::SeqCst) {
            1 => drop(gpu.alloc::<f32>(x.len())?),
            2 => gpu.synchronize()?,
            _ => {}
        }
        kernels::add_one(gpu, x)
    }
}

/// What `ops::sneaky` does: 0 nothing wrong, 1 allocate, 2 synchronize.
static SNEAKY: AtomicU8 = AtomicU8::new(0);

#[derive(TrainingGraph)]
#[graph(spec = "gpu_step.ron")]
struct Step {
    x: DeviceBuffer<f32>,
    w: DeviceBuffer<f32>,
    wb: DeviceBuffer<bf16>,
    acts: Acts,
    z: DeviceBuffer<f32>,
    loss: DeviceBuffer<f32>,
}

#[derive(TrainingGraph)]
#[graph(spec = "gpu_step_sneaky.ron")]
struct SneakyStep {
    x: DeviceBuffer<f32>,
}

fn new_step(gpu: &Gpu) -> Step {
    let wb: Vec<bf16> = random(3, N * P, 0.2)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    Step {
        x: gpu.to_device(&random(1, M * K, 2.0)).unwrap(),
        w: gpu.to_device(&random(2, K * N, 0.2)).unwrap(),
        wb: gpu.to_device(&wb).unwrap(),
        acts: Acts {
            h: gpu.alloc(M * K).unwrap(),
            y: gpu.alloc(M * N).unwrap(),
            y2: gpu.alloc(M * N).unwrap(),
            yb: gpu.alloc(M * N).unwrap(),
            acc: gpu.alloc(M * P).unwrap(),
        },
        z: gpu.alloc(M * P).unwrap(),
        loss: gpu.alloc(1).unwrap(),
    }
}

/// The step's outputs as bit patterns.
fn outputs(gpu: &Gpu, s: &Step) -> (Vec<u32>, Vec<u32>) {
    (
        bits(&gpu.to_host(&s.z).unwrap()),
        bits(&gpu.to_host(&s.loss).unwrap()),
    )
}

/// Overwrites the outputs with a sentinel, eagerly.
fn poison(gpu: &Gpu, s: &mut Step, value: f32) {
    stepgraph::kernels::fill(gpu, &mut s.z, value).unwrap();
    stepgraph::kernels::fill(gpu, &mut s.loss, value).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_equals_eager_bit_for_bit_over_100_fresh_inputs() {
    let gpu = gpu();
    let mut s = new_step(&gpu);
    let mut pinned = gpu.alloc_pinned::<f32>(M * K).unwrap();
    s.run_eager(&gpu).unwrap();
    let g = GpuTestGraph::capture(&gpu, s.capture_view(), SHAPE).unwrap();
    assert_eq!(g.shape(), SHAPE);
    println!(
        "{} ops captured into {} nodes",
        Step::STEP.ops.len(),
        g.exec().node_count().unwrap()
    );
    for i in 0..100u64 {
        let input = random(500 + i, M * K, 2.0);
        pinned.as_mut_slice().unwrap().copy_from_slice(&input);
        gpu.copy_from_pinned(&pinned, &mut s.x).unwrap();
        s.run_eager(&gpu).unwrap();
        let eager = outputs(&gpu, &s);

        poison(&gpu, &mut s, f32::NAN);
        pinned.as_mut_slice().unwrap().copy_from_slice(&input);
        gpu.copy_from_pinned(&pinned, &mut s.x).unwrap();
        g.replay(&gpu, s.replay_view()).unwrap();
        let replayed = outputs(&gpu, &s);
        assert_eq!(eager, replayed, "replay {i} differs from the eager run");
        assert!(
            !f32::from_bits(replayed.1[0]).is_nan(),
            "replay {i} left the poison"
        );
    }
}

/// Moves allocation `which` of the step to a fresh one with the same
/// contents; returns the buffer and tensor a guard must name.
fn reallocate(gpu: &Gpu, s: &mut Step, which: usize) -> (&'static str, &'static str) {
    fn moved<T: stepgraph::device::Element>(gpu: &Gpu, b: &mut DeviceBuffer<T>) {
        let mut fresh = gpu.alloc::<T>(b.len()).unwrap();
        gpu.copy_device(b, &mut fresh).unwrap();
        *b = fresh;
    }
    match which {
        0 => {
            moved(gpu, &mut s.x);
            ("x", "")
        }
        1 => {
            moved(gpu, &mut s.w);
            ("w", "")
        }
        2 => {
            moved(gpu, &mut s.wb);
            ("wb", "")
        }
        3 => {
            moved(gpu, &mut s.acts.h);
            ("acts", "h")
        }
        4 => {
            moved(gpu, &mut s.acts.y);
            ("acts", "y")
        }
        5 => {
            moved(gpu, &mut s.acts.y2);
            ("acts", "y2")
        }
        6 => {
            moved(gpu, &mut s.acts.yb);
            ("acts", "yb")
        }
        7 => {
            moved(gpu, &mut s.acts.acc);
            ("acts", "acc")
        }
        8 => {
            moved(gpu, &mut s.z);
            ("z", "")
        }
        _ => {
            moved(gpu, &mut s.loss);
            ("loss", "")
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_moved_allocation_is_refused_by_name_and_recapture_fixes_it() {
    let gpu = gpu();
    let mut s = new_step(&gpu);
    s.run_eager(&gpu).unwrap();
    for which in 0..10 {
        let g = GpuTestGraph::capture(&gpu, s.capture_view(), SHAPE).unwrap();
        let (buffer, tensor) = reallocate(&gpu, &mut s, which);
        poison(&gpu, &mut s, -7.0);
        let sentinel = outputs(&gpu, &s);
        match g.replay(&gpu, s.replay_view()) {
            Err(GraphError::PointerMoved {
                step: "GpuTest",
                buffer: b,
                tensor: t,
                captured,
                live,
            }) => {
                assert_eq!((b, t.as_str()), (buffer, tensor));
                assert_ne!(captured, live);
            }
            other => panic!("moving {buffer}.{tensor} must refuse the replay, got {other:?}"),
        }
        assert_eq!(
            outputs(&gpu, &s),
            sentinel,
            "{buffer}.{tensor}: a refused replay must launch nothing"
        );

        let mut g = g.with_policy(MovePolicy::Recapture);
        match g.replay_or_recapture(&gpu, s.capture_view()).unwrap() {
            Replayed::Recaptured {
                reason: GraphError::PointerMoved { buffer: b, .. },
            } => assert_eq!(b, buffer),
            other => panic!("expected a re-capture after moving {buffer}, got {other:?}"),
        }
        let recaptured = outputs(&gpu, &s);
        poison(&gpu, &mut s, f32::NAN);
        s.run_eager(&gpu).unwrap();
        assert_eq!(
            recaptured,
            outputs(&gpu, &s),
            "{buffer}.{tensor}: the re-captured step is wrong"
        );
        assert!(matches!(
            g.replay_or_recapture(&gpu, s.capture_view()).unwrap(),
            Replayed::Launched
        ));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_op_that_allocates_or_syncs_is_a_capture_violation_naming_it() {
    let gpu = gpu();
    let mut s = SneakyStep {
        x: gpu.to_device(&[0.0f32; 256]).unwrap(),
    };
    SNEAKY.store(0, Ordering::SeqCst);
    s.run_eager(&gpu).unwrap();
    for (mode, action) in [(1u8, "allocate"), (2, "synchronize")] {
        SNEAKY.store(mode, Ordering::SeqCst);
        let Err(err) = SneakyGraph::capture(&gpu, s.capture_view(), SHAPE) else {
            panic!("mode {mode}: the capture must fail");
        };
        SNEAKY.store(0, Ordering::SeqCst);
        match &err {
            GraphError::CaptureViolation {
                step: "Sneaky",
                op: "ops::sneaky",
                action: a,
            } => {
                assert!(a.contains(action), "{a}");
            }
            other => panic!("expected a CaptureViolation naming ops::sneaky, got {other:?}"),
        }
        println!("{err}");
        assert!(!gpu.is_capturing(), "the capture must have been ended");
    }
    // The stream is usable: eager work, a fresh capture and its replays.
    gpu.set_scratch_frozen(false);
    s.run_eager(&gpu).unwrap();
    let before = gpu.to_host(&s.x).unwrap()[0];
    let g = SneakyGraph::capture(&gpu, s.capture_view(), SHAPE).unwrap();
    for _ in 0..3 {
        g.replay(&gpu, s.replay_view()).unwrap();
    }
    let after = gpu.to_host(&s.x).unwrap();
    assert!(
        after.iter().all(|&v| v == before + 6.0),
        "{} vs {}",
        after[0],
        before + 6.0
    );
}
