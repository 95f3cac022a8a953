//! The GPU context: creation, device facts, buffers and copies.
//!
//! `no_gpu_is_an_error_not_a_panic` runs everywhere (in CI it proves that a
//! machine without CUDA gets an `Err`); the rest need a GPU.

mod gpu_common;

use gpu_common::{gpu, random};
use half::bf16;
use stepgraph::device::{
    DEFAULT_GEMM_WORKSPACE, GEMM_WORKSPACE, Gpu, GpuError, HALF_STAGING, REDUCE_PARTIALS,
};
use stepgraph::graph::{Backend, DevicePtrs, PtrSnapshot, TensorPath};

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    match Gpu::new(0) {
        Ok(gpu) => assert!(gpu.info().compute_capability >= (8, 0)),
        Err(e) => {
            let msg = e.to_string();
            let known = matches!(
                e,
                GpuError::NoDriver { .. }
                    | GpuError::NoDevice { .. }
                    | GpuError::DriverTooOld { .. }
                    | GpuError::UnsupportedComputeCapability { .. }
                    | GpuError::LibraryMissing { .. }
                    | GpuError::CudaHeadersNotFound { .. }
            );
            assert!(known, "unexpected start-up error: {msg}");
            eprintln!("no usable GPU here, as expected off the GPU machine: {msg}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn context_is_ready_for_capture() {
    let gpu = gpu();
    let info = gpu.info();
    println!("{info:?}");
    for r in gpu.compile_reports() {
        println!("{r}");
    }
    assert!(info.compute_capability >= (8, 0), "{info:?}");
    assert_eq!(
        info.arch,
        format!(
            "sm_{}{}",
            info.compute_capability.0, info.compute_capability.1
        )
    );
    assert!(info.driver_version >= (13, 0), "{info:?}");
    assert!(!gpu.is_event_tracking(), "event tracking must be off");
    assert!(
        !gpu.uses_legacy_stream(),
        "work must not run on the legacy default stream"
    );
    assert!(!gpu.is_capturing());
    assert_eq!(
        gpu.compile_reports().len(),
        stepgraph::kernels::MODULES.len()
    );

    for name in stepgraph_spec::KNOWN_SCRATCH {
        assert!(gpu.has_scratch(name), "{name}");
    }
    assert!(!gpu.has_scratch("nope"));
    assert_eq!(
        gpu.scratch_bytes(GEMM_WORKSPACE).unwrap(),
        DEFAULT_GEMM_WORKSPACE
    );
    assert_eq!(gpu.scratch_bytes(REDUCE_PARTIALS).unwrap(), 4096);
    assert_eq!(gpu.scratch_bytes(HALF_STAGING).unwrap(), 0);
    let mut seen = Vec::new();
    gpu.visit_scratch(GEMM_WORKSPACE, &TensorPath::root(), &mut |_, p| {
        seen.push(p)
    });
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].bytes, DEFAULT_GEMM_WORKSPACE);
    assert_ne!(seen[0].addr, 0);
    seen.clear();
    gpu.visit_scratch(HALF_STAGING, &TensorPath::root(), &mut |_, p| seen.push(p));
    assert!(seen.is_empty(), "an area never grown lists nothing");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_ordinal_is_an_error() {
    match Gpu::new(4096) {
        Err(GpuError::NoSuchDevice {
            ordinal: 4096,
            count,
        }) => assert!(count >= 1),
        other => panic!("expected NoSuchDevice, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn buffers_round_trip() {
    let gpu = gpu();
    let host = random(1, 10_001, 3.0);
    let buf = gpu.to_device(&host).unwrap();
    assert_eq!(buf.len(), host.len());
    assert_eq!(buf.num_bytes(), host.len() * 4);
    assert_eq!(gpu.to_host(&buf).unwrap(), host);

    // The buffer lists itself as one allocation, and a snapshot of it verifies.
    let mut ptrs = Vec::new();
    buf.visit_ptrs(&TensorPath::root(), &mut |path, p| {
        ptrs.push((path.to_string(), p))
    });
    assert_eq!(ptrs.len(), 1);
    assert_eq!(ptrs[0].0, "");
    assert_eq!(
        (ptrs[0].1.addr, ptrs[0].1.bytes),
        (buf.device_addr(), 40_004)
    );
    assert!(PtrSnapshot::take("buf", &buf).verify("T", &buf).is_ok());

    let halves: Vec<bf16> = host.iter().map(|&x| bf16::from_f32(x)).collect();
    let hbuf = gpu.to_device(&halves).unwrap();
    assert_eq!(gpu.to_host(&hbuf).unwrap(), halves);

    let mut copy = gpu.alloc::<f32>(host.len()).unwrap();
    gpu.copy_device(&buf, &mut copy).unwrap();
    assert_eq!(gpu.to_host(&copy).unwrap(), host);
    gpu.zero(&mut copy).unwrap();
    assert!(gpu.to_host(&copy).unwrap().iter().all(|&x| x == 0.0));
    let zeros = gpu.alloc_zeros::<u32>(77).unwrap();
    assert_eq!(gpu.to_host(&zeros).unwrap(), vec![0u32; 77]);

    let empty = gpu.alloc::<f32>(0).unwrap();
    assert!(empty.is_empty());
    assert!(gpu.to_host(&empty).unwrap().is_empty());

    // Pinned staging both ways.
    let mut pinned = gpu.alloc_pinned::<f32>(host.len()).unwrap();
    pinned.as_mut_slice().unwrap().copy_from_slice(&host);
    let mut dst = gpu.alloc::<f32>(host.len()).unwrap();
    gpu.copy_from_pinned(&pinned, &mut dst).unwrap();
    let mut back = gpu.alloc_pinned::<f32>(host.len()).unwrap();
    gpu.copy_to_pinned(&dst, &mut back).unwrap();
    assert_eq!(back.as_slice().unwrap(), host.as_slice());
    assert_eq!(gpu.alloc_pinned::<f32>(0).unwrap().len(), 0);

    // Bad input is an error, not a panic.
    let mut short = gpu.alloc::<f32>(3).unwrap();
    assert!(matches!(
        gpu.copy_from_host(&host, &mut short),
        Err(GpuError::LengthMismatch { .. })
    ));
    assert!(matches!(
        gpu.copy_device(&buf, &mut short),
        Err(GpuError::LengthMismatch { .. })
    ));
    let mut four = [0.0f32; 4];
    assert!(matches!(
        gpu.copy_to_host(&short, &mut four),
        Err(GpuError::LengthMismatch { .. })
    ));
    assert!(matches!(
        gpu.copy_from_pinned(&gpu.alloc_pinned::<f32>(2).unwrap(), &mut short),
        Err(GpuError::BufferTooSmall { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn buffers_of_another_context_are_refused() {
    let a = gpu();
    let b = Gpu::new(0).expect("a second context");
    let x = a.to_device(&[1.0f32; 8]).unwrap();
    let mut y = b.alloc::<f32>(8).unwrap();
    assert!(matches!(
        b.copy_device(&x, &mut y),
        Err(GpuError::ForeignBuffer { .. })
    ));
    assert!(matches!(
        stepgraph::kernels::axpy(&b, 1.0, &x, &mut y),
        Err(GpuError::ForeignBuffer { .. })
    ));
    assert!(matches!(b.to_host(&x), Err(GpuError::ForeignBuffer { .. })));
}
