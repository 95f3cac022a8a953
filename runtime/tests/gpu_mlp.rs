//! Issue 17: the MLP example (`runtime/examples/mlp`, `specs/mlp.ron`), a
//! step built from stepgraph's public API with kernels of its own, on the
//! GPU: it matches its CPU reference, its graph replays the eager step bit
//! for bit, it learns, every moved allocation refuses the replay by name,
//! and a custom-kernel op that allocates or synchronizes inside the capture
//! is a capture violation naming it.
//!
//! The example's modules are compiled into this binary as they are; the
//! derive's guard tests (no GPU) run here too, in CI. On the GPU machine:
//! `bash .gpu/run-tests.sh mlp` after `bash tests/gpu/stage` (every test
//! here has `mlp` in its name).

#[path = "../examples/mlp/data.rs"]
mod data;
#[path = "../examples/mlp/model.rs"]
mod model;
#[path = "../examples/mlp/reference.rs"]
mod reference;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use data::{DIMS, HostParams, Teacher};
use model::{KERNELS, MlpStep, SEED};
use stepgraph::TrainingGraph;
use stepgraph::device::{DeviceBuffer, Element, GEMM_WORKSPACE, Gpu, GpuError, REDUCE_PARTIALS};
use stepgraph::graph::{Backend as _, GraphError, ShapeKey, TrainingStep as _};
use stepgraph::kernels::launch::BLOCK;
use stepgraph::kernels::user::Grid;

const SHAPE: ShapeKey = ShapeKey {
    batch: DIMS.batch,
    seq_len: 1,
};

/// One context at a time in this binary (libtest runs tests in parallel).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The example's context (its kernels loaded), or a failure saying why.
fn gpu() -> (Gpu, MutexGuard<'static, ()>) {
    let lock = serial();
    match model::open_gpu() {
        Ok(gpu) => (gpu, lock),
        Err(e) => panic!("GPU test needs a usable CUDA GPU: {e}"),
    }
}

fn new_step(gpu: &Gpu) -> MlpStep {
    MlpStep::new(gpu, DIMS, &HostParams::init(DIMS, SEED)).unwrap()
}

fn feed(gpu: &Gpu, step: &mut MlpStep, teacher: &Teacher, index: u64) {
    let (x, labels) = teacher.batch(index);
    step.set_batch(gpu, &x, &labels).unwrap();
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// ||got - want|| / ||want||.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        num += (f64::from(*g) - w).powi(2);
        den += w * w;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Every f32 tensor the step updates, downloaded: parameters, then both
/// AdamW moments.
fn state_bits(gpu: &Gpu, s: &MlpStep) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = s
        .params
        .tensors()
        .iter()
        .map(|t| bits(&gpu.to_host(t).unwrap()))
        .collect();
    for moments in [&s.adam.m, &s.adam.v] {
        for t in moments.tensors() {
            out.push(bits(&gpu.to_host(t).unwrap()));
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_first_step_matches_the_cpu_reference() {
    let (gpu, _lock) = gpu();
    let teacher = Teacher::new(DIMS, SEED);
    let init = HostParams::init(DIMS, SEED);
    let mut s = new_step(&gpu);
    stepgraph::kernels::fill(&gpu, &mut s.loss, f32::NAN).unwrap();
    feed(&gpu, &mut s, &teacher, 0);
    s.run_eager(&gpu).unwrap();
    let (x, labels) = teacher.batch(0);
    let (want_loss, want) =
        reference::loss_and_grads(DIMS, &reference::Tensors::from_host(&init), &x, &labels);
    let loss = s.loss(&gpu).unwrap();
    println!("step 0 loss: gpu {loss}, cpu {want_loss}");
    assert!(
        (f64::from(loss) - want_loss).abs() <= 1e-5 * want_loss,
        "loss {loss} vs {want_loss}"
    );
    for ((name, got), want) in ["w1", "b1", "w2", "b2"]
        .iter()
        .zip(s.grads.tensors())
        .zip(&want.all)
    {
        let err = rel_err(&gpu.to_host(got).unwrap(), want);
        println!("grad {name}: rel err {err:.2e}");
        assert!(err < 1e-4, "gradient of {name}: rel err {err}");
    }
    assert_eq!(s.sched.steps(&gpu).unwrap(), 1, "one AdamW step counted");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_replay_equals_the_eager_step_bit_for_bit_over_50_steps() {
    let (gpu, _lock) = gpu();
    let teacher = Teacher::new(DIMS, SEED);
    let (mut eager, mut replayed) = (new_step(&gpu), new_step(&gpu));
    // Step 0 runs eagerly on both: the warm-up a capture wants.
    for s in [&mut eager, &mut replayed] {
        feed(&gpu, s, &teacher, 0);
        s.run_eager(&gpu).unwrap();
    }
    let graph = replayed.capture(&gpu, SHAPE).unwrap();
    println!(
        "{} ops captured into {} graph nodes",
        MlpStep::INFO.ops.len(),
        graph.exec().node_count().unwrap()
    );
    for i in 1..=50 {
        feed(&gpu, &mut eager, &teacher, i);
        eager.run_eager(&gpu).unwrap();
        feed(&gpu, &mut replayed, &teacher, i);
        stepgraph::kernels::fill(&gpu, &mut replayed.loss, f32::NAN).unwrap();
        replayed.replay(&gpu, &graph).unwrap();
        let (a, b) = (eager.loss(&gpu).unwrap(), replayed.loss(&gpu).unwrap());
        assert!(!b.is_nan(), "step {i}: the replay left the poison");
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "step {i}: loss {a} eager vs {b} replayed"
        );
    }
    assert_eq!(
        state_bits(&gpu, &eager),
        state_bits(&gpu, &replayed),
        "parameters and moments after 50 steps"
    );
    assert_eq!(replayed.sched.steps(&gpu).unwrap(), 51);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_loss_falls_over_300_replayed_steps() {
    let (gpu, _lock) = gpu();
    let teacher = Teacher::new(DIMS, SEED);
    let mut s = new_step(&gpu);
    feed(&gpu, &mut s, &teacher, 0);
    s.run_eager(&gpu).unwrap();
    let mut losses = vec![f64::from(s.loss(&gpu).unwrap())];
    let graph = s.capture(&gpu, SHAPE).unwrap();
    for i in 1..300 {
        feed(&gpu, &mut s, &teacher, i);
        s.replay(&gpu, &graph).unwrap();
        losses.push(f64::from(s.loss(&gpu).unwrap()));
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let (first, last) = reference::first_and_last(&losses, 20);
    println!("loss {first:.4} -> {last:.4} over 300 steps");
    assert!(first > 1.2, "starts near ln(8): {first}");
    assert!(last < 0.6 * first, "{first} -> {last}");
}

/// Moves `b` to a fresh allocation holding the same values.
fn moved<T: Element>(gpu: &Gpu, b: &mut DeviceBuffer<T>) {
    let mut fresh = gpu.alloc::<T>(b.len()).unwrap();
    gpu.copy_device(b, &mut fresh).unwrap();
    *b = fresh;
}

/// Moves the `n`-th allocation of the step; the buffer and tensor a guard
/// must name, or `None` past the last.
fn move_nth(gpu: &Gpu, s: &mut MlpStep, n: usize) -> Option<(&'static str, String)> {
    let mut i = 0;
    macro_rules! candidate {
        ($buffer:expr, $tensor:expr, $buf:expr) => {
            if i == n {
                moved(gpu, $buf);
                return Some(($buffer, $tensor.to_string()));
            }
            i += 1;
        };
    }
    for (name, t) in s.params.named_mut() {
        candidate!("params", name, t);
    }
    for (name, t) in s.grads.named_mut() {
        candidate!("grads", name, t);
    }
    let a = &mut s.acts;
    for (name, t) in [
        ("h", &mut a.h),
        ("logits", &mut a.logits),
        ("dlogits", &mut a.dlogits),
        ("dh", &mut a.dh),
    ] {
        candidate!("acts", name, t);
    }
    let names = s.adam.m.names().to_vec();
    for (moment, tensors) in [("m", s.adam.m.tensors_mut()), ("v", s.adam.v.tensors_mut())] {
        for (name, t) in names.iter().zip(tensors) {
            candidate!("adam", format!("{moment}.{name}"), t);
        }
    }
    candidate!("sched", "hyper", &mut s.sched.hyper);
    candidate!("sched", "step", &mut s.sched.step);
    candidate!("sched", "derived", &mut s.sched.derived);
    candidate!("x", "", &mut s.x);
    candidate!("labels", "", &mut s.labels);
    candidate!("loss", "", &mut s.loss);
    assert!(n >= i, "every index below the count moved something");
    None
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_moving_any_allocation_refuses_the_replay_naming_it() {
    let (gpu, _lock) = gpu();
    let teacher = Teacher::new(DIMS, SEED);
    let mut s = new_step(&gpu);
    feed(&gpu, &mut s, &teacher, 0);
    s.run_eager(&gpu).unwrap();
    let mut checked = 0;
    for n in 0.. {
        let graph = s.capture(&gpu, SHAPE).unwrap();
        let Some((buffer, tensor)) = move_nth(&gpu, &mut s, n) else {
            break;
        };
        gpu.copy_from_host(&[-7.0f32], &mut s.loss).unwrap();
        match s.replay(&gpu, &graph) {
            Err(GraphError::PointerMoved {
                step: "Mlp",
                buffer: b,
                tensor: t,
                captured,
                live,
            }) => {
                assert_eq!((b, t.as_str()), (buffer, tensor.as_str()));
                assert_ne!(captured, live);
            }
            other => panic!("moving {buffer}.{tensor} must refuse the replay, got {other:?}"),
        }
        assert_eq!(
            s.loss(&gpu).unwrap(),
            -7.0,
            "{buffer}.{tensor}: a refused replay launched"
        );
        checked += 1;
    }
    assert_eq!(checked, 26, "every allocation of the step");
    // The context's scratch areas the spec lists are guarded the same way.
    for area in [GEMM_WORKSPACE, REDUCE_PARTIALS] {
        let graph = s.capture(&gpu, SHAPE).unwrap();
        gpu.set_scratch_frozen(false);
        gpu.reallocate_scratch(area).unwrap();
        match s.replay(&gpu, &graph) {
            Err(GraphError::PointerMoved { buffer, .. }) => {
                assert_eq!(buffer, format!("scratch:{area}"));
            }
            other => panic!("moving scratch {area} must refuse the replay, got {other:?}"),
        }
    }
}

/// What `sneaky_bias_relu` does besides its kernel: 0 nothing, 1 allocate,
/// 2 synchronize.
static SNEAKY: AtomicU8 = AtomicU8::new(0);

/// An op with a custom kernel, `h = relu(h + bias)`, that breaks the
/// capture rules on request.
fn sneaky_bias_relu(
    gpu: &Gpu,
    bias: &DeviceBuffer<f32>,
    h: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let cols = stepgraph::device::to_u32("cols", bias.len())?;
    let rows = stepgraph::device::to_u32("rows", h.len() / bias.len())?;
    KERNELS.bias_act.launch(
        gpu,
        Grid::cover(h.len(), BLOCK)?,
        (&mut *h, bias, rows, cols, 1),
    )?;
    match SNEAKY.load(Ordering::SeqCst) {
        1 => drop(gpu.alloc::<f32>(h.len())?),
        2 => gpu.synchronize()?,
        _ => {}
    }
    Ok(())
}

#[derive(TrainingGraph)]
#[graph(spec_inline = r#"Step(
    name: "MlpSneaky",
    precision: F32,
    context: "::stepgraph::device::Gpu",
    buffers: [
        (name: "bias", ty: "::stepgraph::device::DeviceBuffer<f32>", role: Input),
        (name: "h", ty: "::stepgraph::device::DeviceBuffer<f32>", role: State),
    ],
    ops: [("crate::sneaky_bias_relu", [Ref("bias"), Mut("h")])],
)"#)]
struct SneakyStep {
    bias: DeviceBuffer<f32>,
    h: DeviceBuffer<f32>,
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_custom_kernel_op_that_allocates_or_syncs_is_a_capture_violation_naming_it() {
    let (gpu, _lock) = gpu();
    let (rows, cols) = (8usize, 32usize);
    let bias: Vec<f32> = (0..cols)
        .map(|c| 0.25 * f32::from(u8::try_from(c % 5).unwrap()))
        .collect();
    let h0: Vec<f32> = (0..rows * cols)
        .map(|i| f32::from(u16::try_from(i % 7).unwrap()))
        .collect();
    let mut s = SneakyStep {
        bias: gpu.to_device(&bias).unwrap(),
        h: gpu.to_device(&h0).unwrap(),
    };
    SNEAKY.store(0, Ordering::SeqCst);
    s.run_eager(&gpu).unwrap();
    for (mode, action) in [(1u8, "allocate"), (2, "synchronize")] {
        SNEAKY.store(mode, Ordering::SeqCst);
        let result = s.capture(&gpu, SHAPE);
        SNEAKY.store(0, Ordering::SeqCst);
        match result {
            Err(GraphError::CaptureViolation {
                step: "MlpSneaky",
                op: "crate::sneaky_bias_relu",
                action: a,
            }) => assert!(a.contains(action), "{a}"),
            Err(other) => {
                panic!("mode {mode}: expected a CaptureViolation naming the op, got {other:?}")
            }
            Ok(_) => panic!("mode {mode}: the capture must fail"),
        }
        assert!(!gpu.is_capturing(), "the capture must have been ended");
    }
    // The context is usable: a clean capture replays the kernel.
    gpu.set_scratch_frozen(false);
    let before = gpu.to_host(&s.h).unwrap();
    let graph = s.capture(&gpu, SHAPE).unwrap();
    for _ in 0..3 {
        s.replay(&gpu, &graph).unwrap();
    }
    let mut want = before;
    for _ in 0..3 {
        for (i, v) in want.iter_mut().enumerate() {
            *v = (*v + bias[i % cols]).max(0.0);
        }
    }
    assert_eq!(bits(&gpu.to_host(&s.h).unwrap()), bits(&want));
}
