//! Issue 17: kernels of your own (`stepgraph::kernels::user`) on the GPU.
//! Every parameter kind reaches the kernel as declared; sources come from a
//! string or a file and may include the crate's headers and their own; they
//! go through the kernel cache; a missing kernel, a parameter list that
//! does not match the compiled one, a compile error, a duplicate name, a
//! handle of another set, a foreign buffer and a grid beyond CUDA's limits
//! are typed errors, never a launch.

mod gpu_common;

use gpu_common::serial;
use half::bf16;
use stepgraph::device::{CacheOutcome, CachePolicy, Gpu, GpuError, GpuOptions, REDUCE_PARTIALS};
use stepgraph::kernels::user::{Grid, UserKernel, UserKernels};
use stepgraph::kernels::user_params::{In, Out, Scratch};

const SRC: &str = r#"
#include <cuda_bf16.h>
#include "common.cuh"

// Every scalar kind, added to a*x: integer-valued inputs keep the f32 sums exact.
extern "C" __global__ void every_kind(const float* x, float* y, float a, double b, int c,
                                      unsigned d, long long e, unsigned long long f,
                                      __nv_bfloat16 g, unsigned n) {
    SG_FOR_EACH(i, n) {
        y[i] = a * x[i] + (float)b + (float)c + (float)d + (float)e + (float)f
             + __bfloat162float(g);
    }
}

extern "C" __global__ void to_scratch(const float* x, float* s, unsigned n) {
    SG_FOR_EACH(i, n) { s[i] = 2.0f * x[i]; }
}

extern "C" __global__ void from_scratch(const float* s, float* y, unsigned n) {
    SG_FOR_EACH(i, n) { y[i] = s[i] + 1.0f; }
}
"#;

type EveryKind = UserKernel<(In<f32>, Out<f32>, f32, f64, i32, u32, i64, u64, bf16, u32)>;

struct Kernels {
    set: UserKernels,
    every_kind: EveryKind,
    to_scratch: UserKernel<(In<f32>, Scratch<f32>, u32)>,
    from_scratch: UserKernel<(Scratch<f32>, Out<f32>, u32)>,
}

fn kernels() -> Kernels {
    let mut set = UserKernels::new();
    let mut m = set.module("user_test.cu", SRC);
    let every_kind = m.kernel("every_kind");
    let to_scratch = m.kernel("to_scratch");
    let from_scratch = m.kernel("from_scratch");
    Kernels {
        set,
        every_kind,
        to_scratch,
        from_scratch,
    }
}

fn open(set: &UserKernels) -> Result<Gpu, GpuError> {
    Gpu::with_user_kernels(GpuOptions::default(), set)
}

fn must_open(set: &UserKernels) -> Gpu {
    open(set).unwrap_or_else(|e| panic!("GPU test needs a usable CUDA GPU: {e}"))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn user_kernel_every_parameter_kind_reaches_the_kernel() {
    let _serial = serial();
    let k = kernels();
    let gpu = must_open(&k.set);
    let n = 1000usize;
    let x: Vec<f32> = (0..n)
        .map(|i| f32::from(u16::try_from(i % 97).unwrap()))
        .collect();
    let dx = gpu.to_device(&x).unwrap();
    let mut y = gpu.to_device(&vec![f32::NAN; n]).unwrap();
    let n32 = u32::try_from(n).unwrap();
    let args = (
        &dx,
        &mut y,
        2.0f32,
        0.5f64,
        -3i32,
        4u32,
        -5i64,
        6u64,
        bf16::from_f32(1.5),
        n32,
    );
    k.every_kind
        .launch(&gpu, Grid::cover(n, 128).unwrap(), args)
        .unwrap();
    let want: Vec<f32> = x
        .iter()
        .map(|v| 2.0 * v + 0.5 - 3.0 + 4.0 - 5.0 + 6.0 + 1.5)
        .collect();
    assert_eq!(gpu.to_host(&y).unwrap(), want);

    // A scratch area as an argument, written by one kernel, read by the next.
    let mut out = gpu.to_device(&vec![f32::NAN; n]).unwrap();
    let mut s = gpu.scratch_view::<f32>(REDUCE_PARTIALS, n).unwrap();
    k.to_scratch
        .launch(&gpu, Grid::cover(n, 256).unwrap(), (&dx, s.arg(), n32))
        .unwrap();
    k.from_scratch
        .launch(&gpu, Grid::cover(n, 256).unwrap(), (s.arg(), &mut out, n32))
        .unwrap();
    drop(s);
    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_eq!(gpu.to_host(&out).unwrap(), want);
    let names: Vec<String> = gpu
        .compile_reports()
        .iter()
        .map(|r| r.file.clone())
        .collect();
    assert!(names.contains(&"user_test.cu".to_owned()), "{names:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn user_kernel_module_from_a_file_with_its_own_header_goes_through_the_cache() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("triple.cu");
    std::fs::write(
        &path,
        "#include \"common.cuh\"\n#include \"scale.cuh\"\n\
         extern \"C\" __global__ void triple(float* y, unsigned n) {\n\
         SG_FOR_EACH(i, n) { y[i] *= MY_SCALE; }\n}\n",
    )
    .unwrap();
    let declare = || {
        let mut set = UserKernels::new();
        set.header("scale.cuh", "#define MY_SCALE 3.0f\n");
        let triple: UserKernel<(Out<f32>, u32)> = set.module_file(&path).unwrap().kernel("triple");
        (set, triple)
    };
    let opts = || GpuOptions {
        cache: CachePolicy::Dir(dir.path().join("cache")),
        ..GpuOptions::default()
    };
    let label = path.display().to_string();
    for (round, outcome) in [(0, CacheOutcome::Miss), (1, CacheOutcome::Hit)] {
        let (set, triple) = declare();
        let gpu = Gpu::with_user_kernels(opts(), &set)
            .unwrap_or_else(|e| panic!("GPU test needs a usable CUDA GPU: {e}"));
        let report = gpu
            .compile_reports()
            .iter()
            .find(|r| r.file == label)
            .unwrap_or_else(|| panic!("no report for {label}: {:?}", gpu.compile_reports()))
            .clone();
        println!("round {round}: {report}");
        assert_eq!(report.outcome, outcome, "round {round}");
        let mut y = gpu.to_device(&[1.0f32, -2.0, 0.5]).unwrap();
        triple.launch(&gpu, Grid::new(1, 32), (&mut y, 3)).unwrap();
        assert_eq!(gpu.to_host(&y).unwrap(), vec![3.0, -6.0, 1.5]);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn user_kernel_bad_declarations_are_refused_when_the_context_opens() {
    let _serial = serial();
    // A parameter list that is not the kernel's.
    let mut set = UserKernels::new();
    let _wrong: UserKernel<(In<f32>, Scratch<f32>)> =
        set.module("user_test.cu", SRC).kernel("to_scratch");
    match open(&set) {
        Err(GpuError::KernelSignature {
            kernel,
            declared,
            found,
        }) => {
            assert_eq!(kernel, "to_scratch");
            assert_eq!((declared, found), (vec![8, 8], vec![8, 8, 4]));
        }
        other => panic!("expected KernelSignature, got {other:?}"),
    }
    // A kernel the module does not define.
    let mut set = UserKernels::new();
    let _nope: UserKernel<()> = set.module("user_test.cu", SRC).kernel("nope");
    match open(&set) {
        Err(GpuError::UserKernelNotFound { module, kernel }) => {
            assert_eq!((module.as_str(), kernel.as_str()), ("user_test.cu", "nope"));
        }
        other => panic!("expected UserKernelNotFound, got {other:?}"),
    }
    // A source NVRTC rejects: the error names the module and carries the log.
    let mut set = UserKernels::new();
    let _k: UserKernel<(Out<f32>,)> = set
        .module(
            "broken.cu",
            "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        )
        .kernel("k");
    match open(&set) {
        Err(e @ GpuError::Compile { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("broken.cu") && msg.contains("undefined_name"),
                "{msg}"
            );
        }
        other => panic!("expected Compile, got {other:?}"),
    }
    // One name declared twice.
    let mut set = UserKernels::new();
    let mut m = set.module("user_test.cu", SRC);
    let _a: UserKernel<(Out<f32>, u32)> = m.kernel("from_scratch");
    let _b: UserKernel<(Out<f32>, u32)> = m.kernel("from_scratch");
    assert!(matches!(
        open(&set),
        Err(GpuError::UserKernelSet {
            problem: "kernel declared twice",
            ..
        })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn user_kernel_foreign_handles_buffers_and_bad_grids_are_refused_before_launching() {
    let _serial = serial();
    let (mine, other) = (kernels(), kernels());
    let gpu = must_open(&mine.set);
    let x = gpu.to_device(&[1.0f32; 64]).unwrap();
    let mut y = gpu.to_device(&[-1.0f32; 64]).unwrap();
    let mut s = gpu.scratch_view::<f32>(REDUCE_PARTIALS, 64).unwrap();
    // A handle of another set (same source, same names) does not launch here.
    match other
        .to_scratch
        .launch(&gpu, Grid::new(1, 64), (&x, s.arg(), 64))
    {
        Err(GpuError::ForeignKernel { kernel }) => assert_eq!(kernel, "to_scratch"),
        r => panic!("expected ForeignKernel, got {r:?}"),
    }
    drop(s);
    // Nor does any handle on a context opened without user kernels.
    let plain = Gpu::new(0).unwrap();
    let mut ys = plain.to_device(&[0.0f32; 64]).unwrap();
    let mut ps = plain.scratch_view::<f32>(REDUCE_PARTIALS, 64).unwrap();
    assert!(matches!(
        mine.from_scratch
            .launch(&plain, Grid::new(1, 64), (ps.arg(), &mut ys, 64)),
        Err(GpuError::ForeignKernel { .. })
    ));
    drop(ps);
    // A buffer of another context.
    let mut s = gpu.scratch_view::<f32>(REDUCE_PARTIALS, 64).unwrap();
    let foreign = plain.to_device(&[1.0f32; 64]).unwrap();
    assert!(matches!(
        mine.to_scratch
            .launch(&gpu, Grid::new(1, 64), (&foreign, s.arg(), 64)),
        Err(GpuError::ForeignBuffer { .. })
    ));
    // A grid beyond CUDA's limits.
    match mine
        .from_scratch
        .launch(&gpu, Grid::new(1, 2048), (s.arg(), &mut y, 64))
    {
        Err(GpuError::LaunchShape { kernel, what, .. }) => {
            assert_eq!((kernel.as_str(), what), ("from_scratch", "threads.x"));
        }
        r => panic!("expected LaunchShape, got {r:?}"),
    }
    drop(s);
    assert_eq!(gpu.to_host(&y).unwrap(), vec![-1.0; 64], "nothing launched");
}
