//! CUDA graph capture and replay through the `graph::Backend` implementation
//! of `Gpu`, driven in the order the generated step code uses: presize and
//! snapshot, begin capture, ops (each between `enter_op` calls), end capture
//! (always), freeze scratch, upload; then verify snapshots and launch.

mod gpu_common;

use gpu_common::{bits, gpu, random};
use half::bf16;
use stepgraph::device::{
    DeviceBuffer, GEMM_WORKSPACE, Gemm, Gpu, GpuError, GpuGraph, HALF_STAGING, REDUCE_PARTIALS,
};
use stepgraph::graph::{Backend, CaptureViolation, GraphError, OpError, PtrSnapshot, ScratchPtrs};
use stepgraph::kernels;

const M: usize = 64;
const K: usize = 96;
const N: usize = 128;
const P: usize = 80;

/// The buffers of a small step with several kernels, two GEMMs, a memset and
/// two reductions.
struct Bufs {
    x: DeviceBuffer<f32>,   // input  [M x K]
    w: DeviceBuffer<f32>,   // param  [K x N]
    wb: DeviceBuffer<bf16>, // param  [N x P], bf16
    h: DeviceBuffer<f32>,   // [M x K]
    y: DeviceBuffer<f32>,   // [M x N]
    y2: DeviceBuffer<f32>,  // [M x N]
    yb: DeviceBuffer<bf16>, // [M x N]
    z: DeviceBuffer<f32>,   // [M x P]
    acc: DeviceBuffer<f32>, // [M x P]
    loss: DeviceBuffer<f32>,
    loss2: DeviceBuffer<f32>,
    tmp: DeviceBuffer<f32>,
}

fn bufs(gpu: &Gpu) -> Bufs {
    let wb: Vec<bf16> = random(3, N * P, 0.2)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    Bufs {
        x: gpu.alloc(M * K).unwrap(),
        w: gpu.to_device(&random(2, K * N, 0.2)).unwrap(),
        wb: gpu.to_device(&wb).unwrap(),
        h: gpu.alloc(M * K).unwrap(),
        y: gpu.alloc(M * N).unwrap(),
        y2: gpu.alloc(M * N).unwrap(),
        yb: gpu.alloc(M * N).unwrap(),
        z: gpu.alloc(M * P).unwrap(),
        acc: gpu.alloc(M * P).unwrap(),
        loss: gpu.alloc(1).unwrap(),
        loss2: gpu.alloc(1).unwrap(),
        tmp: gpu.alloc(1000).unwrap(),
    }
}

type Op = (&'static str, fn(&Gpu, &mut Bufs) -> Result<(), GpuError>);

const OPS: &[Op] = &[
    ("silu", |g, b| kernels::silu(g, &b.x, &mut b.h)),
    ("gemm_f32", |g, b| {
        g.gemm_f32(&Gemm::new(M, N, K), &b.h, &b.w, &mut b.y)
    }),
    ("square", |g, b| kernels::mul(g, &b.y, &b.y, &mut b.y2)),
    ("axpy", |g, b| kernels::axpy(g, 0.5, &b.y2, &mut b.y)),
    ("loss", |g, b| kernels::sum_squares(g, &b.y, &mut b.loss)),
    ("to_bf16", |g, b| kernels::f32_to_bf16(g, &b.y, &mut b.yb)),
    ("gemm_bf16", |g, b| {
        g.gemm_bf16_f32(&Gemm::new(M, P, N), &b.yb, &b.wb, &mut b.z)
    }),
    ("zero_acc", |g, b| g.zero(&mut b.acc)),
    ("accumulate", |g, b| kernels::axpy(g, 2.0, &b.z, &mut b.acc)),
    ("loss2", |g, b| {
        kernels::sum_squares(g, &b.acc, &mut b.loss2)
    }),
    ("fill_tmp", |g, b| kernels::fill(g, &mut b.tmp, 1.0)),
    ("add_one", |g, b| kernels::add_one(g, &mut b.tmp)),
];

fn run_ops(gpu: &Gpu, b: &mut Bufs) -> Result<(), GpuError> {
    for (name, op) in OPS {
        gpu.enter_op(Some(name));
        let r = op(gpu, b);
        gpu.enter_op(None);
        r?;
    }
    Ok(())
}

/// Every output, widened to bit patterns.
fn outputs(gpu: &Gpu, b: &Bufs) -> Vec<Vec<u32>> {
    let yb: Vec<f32> = gpu
        .to_host(&b.yb)
        .unwrap()
        .iter()
        .map(|v| v.to_f32())
        .collect();
    [&b.h, &b.y, &b.y2, &b.z, &b.acc, &b.loss, &b.loss2, &b.tmp]
        .iter()
        .map(|buf| bits(&gpu.to_host(buf).unwrap()))
        .chain(std::iter::once(bits(&yb)))
        .collect()
}

fn poison(gpu: &Gpu, b: &mut Bufs) {
    for buf in [
        &mut b.h,
        &mut b.y,
        &mut b.y2,
        &mut b.z,
        &mut b.acc,
        &mut b.loss,
        &mut b.loss2,
        &mut b.tmp,
    ] {
        kernels::fill(gpu, buf, f32::NAN).unwrap();
    }
    let nan = vec![bf16::NAN; M * N];
    gpu.copy_from_host(&nan, &mut b.yb).unwrap();
}

/// Captures the step the way the generated code does.
fn capture(gpu: &Gpu, b: &mut Bufs) -> GpuGraph {
    gpu.set_scratch_frozen(false);
    gpu.begin_capture().unwrap();
    let body = run_ops(gpu, b);
    let exec = gpu.end_capture();
    body.unwrap();
    let exec = exec.unwrap();
    gpu.set_scratch_frozen(true);
    gpu.upload(&exec).unwrap();
    exec
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_eager_bit_for_bit_over_100_fresh_inputs() {
    let gpu = gpu();
    let mut b = bufs(&gpu);
    let mut pinned = gpu.alloc_pinned::<f32>(M * K).unwrap();

    // Eager run first: loads cuBLAS kernels for these shapes, presizes scratch.
    pinned
        .as_mut_slice()
        .unwrap()
        .copy_from_slice(&random(99, M * K, 2.0));
    gpu.copy_from_pinned(&pinned, &mut b.x).unwrap();
    run_ops(&gpu, &mut b).unwrap();
    gpu.synchronize().unwrap();

    let snaps: Vec<PtrSnapshot> = vec![
        PtrSnapshot::take("x", &b.x),
        PtrSnapshot::take("w", &b.w),
        PtrSnapshot::take("y", &b.y),
        PtrSnapshot::take("z", &b.z),
        PtrSnapshot::take(
            "scratch:reduce_partials",
            &ScratchPtrs::new(&*gpu, REDUCE_PARTIALS),
        ),
        PtrSnapshot::take(
            "scratch:gemm_workspace",
            &ScratchPtrs::new(&*gpu, GEMM_WORKSPACE),
        ),
    ];
    let exec = capture(&gpu, &mut b);
    let nodes = exec.node_count().unwrap();
    println!("captured {} ops into {nodes} graph nodes", OPS.len());
    assert!(nodes >= OPS.len(), "{nodes} nodes");

    for i in 0..100u64 {
        let input = random(1000 + i, M * K, 2.0);
        pinned.as_mut_slice().unwrap().copy_from_slice(&input);

        gpu.copy_from_pinned(&pinned, &mut b.x).unwrap();
        run_ops(&gpu, &mut b).unwrap();
        let eager = outputs(&gpu, &b);

        poison(&gpu, &mut b);
        pinned.as_mut_slice().unwrap().copy_from_slice(&input);
        gpu.copy_from_pinned(&pinned, &mut b.x).unwrap();
        let live = [&b.x, &b.w, &b.y, &b.z];
        for (snap, buf) in snaps.iter().zip(live) {
            snap.verify("Test", buf).unwrap();
        }
        snaps[4]
            .verify("Test", &ScratchPtrs::new(&*gpu, REDUCE_PARTIALS))
            .unwrap();
        snaps[5]
            .verify("Test", &ScratchPtrs::new(&*gpu, GEMM_WORKSPACE))
            .unwrap();
        gpu.launch(&exec).unwrap();
        let replayed = outputs(&gpu, &b);

        assert_eq!(eager, replayed, "replay {i} differs from eager");
        assert!(
            replayed
                .iter()
                .flatten()
                .all(|&u| !f32::from_bits(u).is_nan()),
            "replay {i} left poison"
        );
    }
    // The step's own oracle on the last iteration: tmp is 1 + 1 everywhere.
    assert!(gpu.to_host(&b.tmp).unwrap().iter().all(|&v| v == 2.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn capture_violations_are_refused_and_the_stream_stays_usable() {
    let gpu = gpu();
    let mut buf = gpu.to_device(&[1.0f32; 1000]).unwrap();
    let mut pinned = gpu.alloc_pinned::<f32>(1000).unwrap();
    let doomed = gpu.alloc::<f32>(1 << 20).unwrap();

    gpu.begin_capture().unwrap();
    assert!(gpu.is_capturing());
    gpu.enter_op(Some("test::legit"));
    kernels::add_one(&gpu, &mut buf).unwrap();

    let expect = |r: Result<(), GpuError>, op: &'static str, action: &str| {
        let e = r.expect_err("must be refused during capture");
        let v = e
            .capture_violation()
            .unwrap_or_else(|| panic!("not a violation: {e}"));
        assert_eq!(
            v,
            &CaptureViolation {
                op: Some(op),
                action: v.action
            }
        );
        assert!(v.action.contains(action), "{}", v.action);
        match GraphError::from_op("Test", op, e) {
            GraphError::CaptureViolation {
                step: "Test",
                op: o,
                ..
            } => assert_eq!(o, op),
            other => panic!("expected GraphError::CaptureViolation, got {other}"),
        }
    };
    gpu.enter_op(Some("test::allocates"));
    expect(
        gpu.alloc::<f32>(16).map(drop),
        "test::allocates",
        "allocate device memory",
    );
    expect(
        gpu.alloc_zeros::<f32>(16).map(drop),
        "test::allocates",
        "allocate device memory",
    );
    expect(
        gpu.alloc_pinned::<f32>(16).map(drop),
        "test::allocates",
        "pinned",
    );
    expect(
        gpu.to_device(&[1.0f32]).map(drop),
        "test::allocates",
        "allocate device memory",
    );
    expect(
        gpu.presize_scratch(HALF_STAGING, 1 << 20),
        "test::allocates",
        "scratch",
    );
    gpu.enter_op(Some("test::syncs"));
    expect(gpu.synchronize(), "test::syncs", "synchronize");
    expect(gpu.time_ms(|| Ok(())).map(drop), "test::syncs", "timing");
    gpu.enter_op(Some("test::copies"));
    expect(gpu.to_host(&buf).map(drop), "test::copies", "to the host");
    expect(
        gpu.copy_from_host(&[0.0; 1000], &mut buf),
        "test::copies",
        "from the host",
    );
    expect(
        gpu.copy_from_pinned(&pinned, &mut buf),
        "test::copies",
        "from the host",
    );
    expect(
        gpu.copy_to_pinned(&buf, &mut pinned),
        "test::copies",
        "to the host",
    );
    // A buffer dropped inside the capture is parked, not freed into the graph.
    drop(doomed);
    gpu.enter_op(None);

    // The capture was never invalidated: it ends cleanly with the one kernel.
    let exec = gpu.end_capture().unwrap();
    assert!(!gpu.is_capturing());
    assert_eq!(exec.node_count().unwrap(), 1);

    // Stream usable: replay, eager work, allocation and sync all work again.
    gpu.launch(&exec).unwrap();
    assert!(gpu.to_host(&buf).unwrap().iter().all(|&v| v == 2.0));
    kernels::add_one(&gpu, &mut buf).unwrap();
    assert!(gpu.to_host(&buf).unwrap().iter().all(|&v| v == 3.0));
    let fresh = gpu.to_device(&[5.0f32; 3]).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(gpu.to_host(&fresh).unwrap(), vec![5.0; 3]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn capture_state_misuse_is_an_error() {
    let gpu = gpu();
    assert!(matches!(gpu.end_capture(), Err(GpuError::CaptureState(_))));
    gpu.begin_capture().unwrap();
    assert!(matches!(
        gpu.begin_capture(),
        Err(GpuError::CaptureState(_))
    ));
    let empty = gpu.end_capture().unwrap();
    assert_eq!(empty.node_count().unwrap(), 0);
    gpu.begin_capture().unwrap();
    assert!(matches!(gpu.launch(&empty), Err(GpuError::CaptureState(_))));
    assert!(matches!(gpu.upload(&empty), Err(GpuError::CaptureState(_))));
    gpu.end_capture().unwrap();
    gpu.launch(&empty).unwrap();
    gpu.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_failing_op_still_ends_the_capture() {
    let gpu = gpu();
    let mut x = gpu.to_device(&[0.0f32; 64]).unwrap();
    let y = gpu.alloc_zeros::<f32>(65).unwrap();
    gpu.begin_capture().unwrap();
    gpu.enter_op(Some("test::ok"));
    kernels::add_one(&gpu, &mut x).unwrap();
    gpu.enter_op(Some("test::fails"));
    let err = kernels::axpy(&gpu, 1.0, &y, &mut x).unwrap_err();
    assert!(matches!(
        GraphError::from_op("Test", "test::fails", err),
        GraphError::Op {
            op: "test::fails",
            ..
        }
    ));
    // The generated code ends the capture on every path.
    let partial = gpu.end_capture().unwrap();
    drop(partial);
    kernels::add_one(&gpu, &mut x).unwrap();
    assert!(
        gpu.to_host(&x).unwrap().iter().all(|&v| v == 1.0),
        "only the eager add ran"
    );
    gpu.begin_capture().unwrap();
    kernels::add_one(&gpu, &mut x).unwrap();
    let exec = gpu.end_capture().unwrap();
    gpu.launch(&exec).unwrap();
    assert!(gpu.to_host(&x).unwrap().iter().all(|&v| v == 2.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn frozen_scratch_refuses_growth_with_a_typed_error() {
    let gpu = gpu();
    gpu.presize_scratch(HALF_STAGING, 4096).unwrap();
    let snap = PtrSnapshot::take(
        "scratch:half_staging",
        &ScratchPtrs::new(&*gpu, HALF_STAGING),
    );
    assert_eq!(snap.tensors().len(), 1);

    gpu.set_scratch_frozen(true);
    assert!(gpu.is_scratch_frozen());
    match gpu.presize_scratch(HALF_STAGING, 1 << 20) {
        Err(GpuError::ScratchFrozen {
            name,
            have: 4096,
            want,
        }) => {
            assert_eq!((name.as_str(), want), (HALF_STAGING, 1 << 20));
        }
        other => panic!("expected ScratchFrozen, got {other:?}"),
    }
    assert!(matches!(
        gpu.scratch_view::<f32>(HALF_STAGING, 1 << 18),
        Err(GpuError::ScratchFrozen { .. })
    ));
    assert!(matches!(
        gpu.presize_scratch(GEMM_WORKSPACE, 1 << 30),
        Err(GpuError::ScratchFrozen { .. })
    ));
    // Requests within the frozen size are fine, and nothing moved.
    assert_eq!(
        gpu.scratch_view::<f32>(HALF_STAGING, 1024).unwrap().len(),
        1024
    );
    snap.verify("Test", &ScratchPtrs::new(&*gpu, HALF_STAGING))
        .unwrap();
    // A reduction never needs more than the presized partials, frozen or not.
    let x = gpu.to_device(&vec![1.0f32; 5_000_000]).unwrap();
    let mut out = gpu.alloc::<f32>(1).unwrap();
    kernels::sum_squares(&gpu, &x, &mut out).unwrap();
    assert_eq!(gpu.to_host(&out).unwrap(), vec![5_000_000.0]);

    // Thawed, growth reallocates, and the snapshot guard notices.
    gpu.set_scratch_frozen(false);
    gpu.presize_scratch(HALF_STAGING, 1 << 20).unwrap();
    assert!(gpu.scratch_bytes(HALF_STAGING).unwrap() >= 1 << 20);
    let err = snap
        .verify("Test", &ScratchPtrs::new(&*gpu, HALF_STAGING))
        .unwrap_err();
    assert!(err.is_stale_graph(), "{err}");
    println!("{err}");
    // Two borrows of one area at once are an error, not a panic.
    let held = gpu.scratch_view::<u8>(HALF_STAGING, 16).unwrap();
    assert!(matches!(
        gpu.scratch_view::<u8>(HALF_STAGING, 16),
        Err(GpuError::ScratchBusy { .. })
    ));
    drop(held);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pointer_snapshot_catches_a_reallocated_buffer() {
    let gpu = gpu();
    let mut x = gpu.alloc_zeros::<f32>(4096).unwrap();
    let snap = PtrSnapshot::take("x", &x);
    let old = x.device_addr();
    x = gpu.alloc_zeros::<f32>(4096).unwrap();
    match snap.verify("Test", &x) {
        Err(GraphError::PointerMoved {
            buffer: "x",
            captured,
            live,
            ..
        }) => {
            assert_eq!((captured, live), (old, x.device_addr()));
        }
        other => panic!("expected PointerMoved, got {other:?}"),
    }
    let y = gpu.alloc_zeros::<f32>(4097).unwrap();
    assert!(matches!(
        snap.verify("Test", &y),
        Err(GraphError::ShapeChanged { .. })
    ));
}
