//! Timing primitives of the bench: medians of CUDA-event times, the device's
//! bf16 GEMM ceiling measured in the same run, and device-memory readings.

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

use crate::device::{Gemm, Gpu, GpuError};

use super::BenchError;

/// Median and range of a set of step times, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Median.
    pub median_ms: f64,
    /// Fastest.
    pub min_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// How many samples.
    pub samples: usize,
}

impl Stats {
    /// Statistics of `v` (all zero when empty). The median of an even count
    /// is the mean of the two middle samples.
    pub fn of(v: &[f32]) -> Self {
        let mut s: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        if n == 0 {
            return Self::default();
        }
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            0.5 * (s[n / 2 - 1] + s[n / 2])
        };
        Self {
            median_ms: median,
            min_ms: s[0],
            max_ms: s[n - 1],
            samples: n,
        }
    }
}

/// Times `f` `reps` times, each between two CUDA events on the context's
/// stream (each reading synchronizes, so every sample starts from an idle
/// GPU), after `warmup` untimed calls.
pub fn time_reps<E>(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<Stats, BenchError>
where
    BenchError: From<E>,
{
    for _ in 0..warmup {
        f()?;
    }
    gpu.synchronize()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (r, ms) = gpu.time_ms(|| Ok(f()))?;
        r?;
        v.push(ms);
    }
    Ok(Stats::of(&v))
}

/// The measured bf16 GEMM ceiling.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Ceiling {
    /// Square size `n` of the `n x n x n` product.
    pub n: usize,
    /// Median time of one product.
    pub median_ms: f64,
    /// `2 n^3` over the median time.
    pub tflops: f64,
}

/// Times a square bf16 GEMM (f32 accumulation, bf16 result) through cuBLAS
/// on random data in [-1, 1]: random rather than constant inputs, since a
/// product of zeros runs measurably faster than real data.
pub fn bf16_ceiling(gpu: &Gpu, n: usize, reps: usize) -> Result<Ceiling, BenchError> {
    let elems = crate::device::checked_elems("ceiling: n x n", n, n)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0xce11);
    let host: Vec<half::bf16> = (0..elems)
        .map(|_| half::bf16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let a = gpu.to_device(&host)?;
    let b = gpu.to_device(&host)?;
    drop(host);
    let mut c = gpu.alloc_zeros::<half::bf16>(elems)?;
    let g = Gemm::new(n, n, n).trans_b();
    let stats = time_reps(gpu, 3, reps, || gpu.gemm_bf16(&g, &a, &b, &mut c))?;
    let flops = 2.0 * f64::from(u32::try_from(n).unwrap_or(u32::MAX)).powi(3);
    Ok(Ceiling {
        n,
        median_ms: stats.median_ms,
        tflops: tflops(flops, stats.median_ms),
    })
}

/// TFLOP/s of `flops` done in `ms`.
pub fn tflops(flops: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        flops / (ms * 1e-3) / 1e12
    } else {
        0.0
    }
}

/// Bytes in use on the device now (`total - free`), after a synchronize and
/// a trim of the memory pool so stream-ordered frees have landed and are
/// returned (a step built after another would otherwise reuse the pool's
/// memory and read as 0 bytes).
pub fn used_bytes(gpu: &Gpu) -> Result<usize, GpuError> {
    gpu.trim_memory_pool()?;
    let (free, total) = gpu.mem_info()?;
    Ok(total.saturating_sub(free))
}

/// Free device bytes now.
pub fn free_bytes(gpu: &Gpu) -> Result<usize, GpuError> {
    gpu.trim_memory_pool()?;
    Ok(gpu.mem_info()?.0)
}
