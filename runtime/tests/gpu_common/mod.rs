//! Helpers shared by the GPU test binaries (`gpu_*.rs`).
//!
//! On the GPU machine these tests run with `--include-ignored`; there a
//! missing or unusable GPU must fail them, so [`gpu`] panics with the
//! runtime's own error message instead of skipping.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

pub mod oracle;
pub mod scan;

use std::sync::{Mutex, MutexGuard, PoisonError};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stepgraph::device::Gpu;

/// Serialises the GPU tests of one binary: libtest runs tests on parallel
/// threads, and another test creating or destroying a context (cuBLAS
/// destroys synchronize the device) while one captures would make results
/// depend on timing.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A context that holds the [`serial`] lock while it lives.
pub struct TestGpu {
    // Dropped before the lock is released.
    gpu: Gpu,
    _serial: MutexGuard<'static, ()>,
}

impl std::ops::Deref for TestGpu {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.gpu
    }
}

/// A context on GPU 0, or a test failure saying why there is none.
pub fn gpu() -> TestGpu {
    let serial = serial();
    match Gpu::new(0) {
        Ok(gpu) => TestGpu {
            gpu,
            _serial: serial,
        },
        Err(e) => panic!("GPU test needs a usable CUDA GPU: {e}"),
    }
}

/// Uniform values in `[-scale, scale)`, reproducible per seed.
pub fn random(seed: u64, len: usize, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-scale..scale)).collect()
}

/// ||got - want|| / ||want|| in f64 (`got` a GPU tensor, or another f64
/// reference).
pub fn rel_err<G: Copy + Into<f64>>(got: &[G], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        let d = (*g).into() - w;
        num += d * d;
        den += w * w;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Row-major `C = alpha * op(A) op(B) + beta * C` in f64 (the oracle).
#[expect(
    clippy::too_many_arguments,
    reason = "the BLAS GEMM's own parameters, one each"
)]
pub fn host_gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    trans_a: bool,
    b: &[f64],
    trans_b: bool,
    alpha: f64,
    beta: f64,
    c: &[f64],
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0;
            for p in 0..k {
                let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                acc += av * bv;
            }
            out[i * n + j] = alpha * acc + beta * c[i * n + j];
        }
    }
    out
}

/// Widens to f64.
pub fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Bit patterns, for bit-for-bit comparisons that also treat NaNs exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The median of some timings.
pub fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f32::NAN)
}
