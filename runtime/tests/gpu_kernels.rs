//! Kernel compilation, the disk cache, and every launch wrapper against a
//! host computation.

mod gpu_common;

use std::process::Command;

use gpu_common::{bits, gpu, random, rel_err};
use half::bf16;
use stepgraph::device::{CacheOutcome, GpuError};
use stepgraph::kernels;

/// Set in the environment of the child process `kernel_cache_child` runs in.
const CHILD_ENV: &str = "STEPGRAPH_TEST_CACHE_CHILD";

/// Runs this test binary's `kernel_cache_child` in a fresh process with
/// `STEPGRAPH_CACHE=dir` and returns its report lines.
fn child_reports(dir: &std::path::Path) -> Vec<String> {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "kernel_cache_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STEPGRAPH_CACHE", dir)
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        // libtest may print `test kernel_cache_child ... ` on the same line
        // before the child's first report, so look for the marker anywhere.
        .filter_map(|l| l.split_once("CACHE-REPORT ").map(|(_, r)| r.to_owned()))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_cache_is_hit_on_the_second_process_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = child_reports(dir.path());
    let second = child_reports(dir.path());
    println!("first process start (empty cache):");
    for l in &first {
        println!("  {l}");
    }
    println!("second process start:");
    for l in &second {
        println!("  {l}");
    }
    assert_eq!(first.len(), kernels::MODULES.len(), "{first:?}");
    assert_eq!(second.len(), kernels::MODULES.len(), "{second:?}");
    assert!(first.iter().all(|l| l.contains("cache=miss ")), "{first:?}");
    assert!(
        second.iter().all(|l| l.contains("cache=hit ")),
        "{second:?}"
    );
    let entries = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        entries,
        kernels::MODULES.len(),
        "one cache entry per module"
    );
}

/// Helper of `kernel_cache_is_hit_on_the_second_process_start`: does nothing
/// unless started by it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_cache_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let gpu = gpu();
    for r in gpu.compile_reports() {
        println!("CACHE-REPORT {r}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_cache_entries_are_recompiled() {
    let _serial = gpu_common::serial();
    let dir = tempfile::tempdir().unwrap();
    let opts = || stepgraph::device::GpuOptions {
        cache: stepgraph::device::CachePolicy::Dir(dir.path().to_path_buf()),
        ..Default::default()
    };
    let first = stepgraph::device::Gpu::with_options(opts()).unwrap();
    assert!(
        first
            .compile_reports()
            .iter()
            .all(|r| r.outcome == CacheOutcome::Miss)
    );
    for r in first.compile_reports() {
        let path = r.path.as_ref().expect("cache path");
        let mut bytes = std::fs::read(path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(path, bytes).unwrap();
    }
    drop(first);
    let second = stepgraph::device::Gpu::with_options(opts()).unwrap();
    assert!(
        second
            .compile_reports()
            .iter()
            .all(|r| r.outcome == CacheOutcome::Miss),
        "{:?}",
        second.compile_reports()
    );
    drop(second);
    let third = stepgraph::device::Gpu::with_options(opts()).unwrap();
    assert!(
        third
            .compile_reports()
            .iter()
            .all(|r| r.outcome == CacheOutcome::Hit)
    );
}

/// Sizes around block and grid boundaries, and one past the elementwise cap.
const SIZES: &[usize] = &[1, 255, 256, 257, 4099, 1 << 20, (65_536 * 256) + 3];

#[test]
#[ignore = "needs a CUDA GPU"]
fn elementwise_wrappers_match_the_host() {
    let gpu = gpu();
    for (s, &n) in SIZES.iter().enumerate() {
        let seed = u64::try_from(s).unwrap();
        let xh = random(seed, n, 4.0);
        let yh = random(seed + 100, n, 4.0);
        let x = gpu.to_device(&xh).unwrap();

        let mut y = gpu.to_device(&yh).unwrap();
        kernels::fill(&gpu, &mut y, -1.5).unwrap();
        assert!(
            gpu.to_host(&y)
                .unwrap()
                .iter()
                .all(|&v| v.to_bits() == (-1.5f32).to_bits()),
            "fill n={n}"
        );

        let mut y = gpu.to_device(&yh).unwrap();
        kernels::axpy(&gpu, 0.75, &x, &mut y).unwrap();
        let want: Vec<f32> = xh
            .iter()
            .zip(&yh)
            .map(|(&a, &b)| 0.75f32.mul_add(a, b))
            .collect();
        assert_eq!(bits(&gpu.to_host(&y).unwrap()), bits(&want), "axpy n={n}");

        let b = gpu.to_device(&yh).unwrap();
        let mut out = gpu.to_device(&vec![f32::NAN; n]).unwrap();
        kernels::mul(&gpu, &x, &b, &mut out).unwrap();
        let want: Vec<f32> = xh.iter().zip(&yh).map(|(&a, &b)| a * b).collect();
        assert_eq!(bits(&gpu.to_host(&out).unwrap()), bits(&want), "mul n={n}");

        kernels::silu(&gpu, &x, &mut out).unwrap();
        let want: Vec<f64> = xh
            .iter()
            .map(|&v| f64::from(v) / (1.0 + (-f64::from(v)).exp()))
            .collect();
        let err = rel_err(&gpu.to_host(&out).unwrap(), &want);
        assert!(err < 1e-6, "silu n={n}: rel err {err:e}");

        let mut z = gpu.to_device(&xh).unwrap();
        kernels::add_one(&gpu, &mut z).unwrap();
        let want: Vec<f32> = xh.iter().map(|&v| v + 1.0).collect();
        assert_eq!(
            bits(&gpu.to_host(&z).unwrap()),
            bits(&want),
            "add_one n={n}"
        );

        let mut h = gpu.to_device(&vec![bf16::NAN; n]).unwrap();
        kernels::f32_to_bf16(&gpu, &x, &mut h).unwrap();
        let hh = gpu.to_host(&h).unwrap();
        let want: Vec<bf16> = xh.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(hh, want, "f32_to_bf16 n={n}");
        kernels::bf16_to_f32(&gpu, &h, &mut out).unwrap();
        let want: Vec<f32> = want.iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            bits(&gpu.to_host(&out).unwrap()),
            bits(&want),
            "bf16_to_f32 n={n}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sum_of_squares_matches_the_host_and_is_deterministic() {
    let gpu = gpu();
    let mut out = gpu.to_device(&[f32::NAN, 7.0]).unwrap();
    let empty = gpu.alloc::<f32>(0).unwrap();
    kernels::sum_squares(&gpu, &empty, &mut out).unwrap();
    assert_eq!(
        gpu.to_host(&out).unwrap(),
        vec![0.0, 7.0],
        "empty input gives 0, out[1] untouched"
    );

    for (s, &n) in SIZES.iter().chain(&[3_000_001]).enumerate() {
        let xh = random(u64::try_from(s).unwrap() + 7, n, 2.0);
        let x = gpu.to_device(&xh).unwrap();
        kernels::sum_squares(&gpu, &x, &mut out).unwrap();
        let first = gpu.to_host(&out).unwrap()[0];
        let want: f64 = xh.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let err = rel_err(&[first], &[want]);
        assert!(
            err < 1e-5,
            "sum_squares n={n}: {first} vs {want} (rel {err:e})"
        );
        for _ in 0..5 {
            kernels::fill(&gpu, &mut out, f32::NAN).unwrap();
            kernels::sum_squares(&gpu, &x, &mut out).unwrap();
            assert_eq!(
                gpu.to_host(&out).unwrap()[0].to_bits(),
                first.to_bits(),
                "n={n}: not deterministic"
            );
        }
        println!(
            "sum_squares n={n}: blocks={} rel err {err:.2e}",
            kernels::sum_squares_blocks(u32::try_from(n).unwrap())
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wrappers_check_sizes() {
    let gpu = gpu();
    let x = gpu.alloc_zeros::<f32>(10).unwrap();
    let mut y = gpu.alloc_zeros::<f32>(11).unwrap();
    assert!(matches!(
        kernels::axpy(&gpu, 1.0, &x, &mut y),
        Err(GpuError::LengthMismatch { .. })
    ));
    assert!(matches!(
        kernels::silu(&gpu, &x, &mut y),
        Err(GpuError::LengthMismatch { .. })
    ));
    let mut h = gpu.alloc_zeros::<bf16>(9).unwrap();
    assert!(matches!(
        kernels::f32_to_bf16(&gpu, &x, &mut h),
        Err(GpuError::LengthMismatch { .. })
    ));
    let mut none = gpu.alloc::<f32>(0).unwrap();
    let err = kernels::sum_squares(&gpu, &x, &mut none).unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::BufferTooSmall {
                need: 1,
                have: 0,
                ..
            }
        ),
        "{err}"
    );
    // Zero-length buffers are a no-op, not a launch error.
    kernels::fill(&gpu, &mut none, 1.0).unwrap();
    gpu.synchronize().unwrap();
}
