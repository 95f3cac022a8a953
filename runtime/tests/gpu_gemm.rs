//! cuBLAS GEMMs against an f64 host matmul.

mod gpu_common;

use gpu_common::{gpu, host_gemm, random, rel_err, wide};
use half::bf16;
use stepgraph::device::{F32GemmMath, Gemm, GpuError};

/// Odd and even shapes, including a 1x1x1 and a tall-skinny one.
const SHAPES: &[(usize, usize, usize)] = &[(1, 1, 1), (37, 53, 71), (128, 256, 64), (300, 7, 513)];

#[test]
#[ignore = "needs a CUDA GPU"]
fn f32_gemm_matches_f64_host_in_every_layout() {
    let gpu = gpu();
    assert_eq!(
        gpu.f32_gemm_math(),
        F32GemmMath::Ieee,
        "TF32 must be off by default"
    );
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, -1.25)] {
                let seed = u64::try_from(s).unwrap() * 10;
                let (ah, bh, ch) = (
                    random(seed, m * k, 1.0),
                    random(seed + 1, k * n, 1.0),
                    random(seed + 2, m * n, 1.0),
                );
                let a = gpu.to_device(&ah).unwrap();
                let b = gpu.to_device(&bh).unwrap();
                // beta = 0 must overwrite whatever C held, NaNs included.
                let c0 = if beta == 0.0 {
                    vec![f32::NAN; m * n]
                } else {
                    ch.clone()
                };
                let mut c = gpu.to_device(&c0).unwrap();
                let mut g = Gemm::new(m, n, k).scaled(alpha, beta);
                g.trans_a = trans_a;
                g.trans_b = trans_b;
                gpu.gemm_f32(&g, &a, &b, &mut c).unwrap();
                let want = host_gemm(
                    m,
                    n,
                    k,
                    &wide(&ah),
                    trans_a,
                    &wide(&bh),
                    trans_b,
                    f64::from(alpha),
                    f64::from(beta),
                    &wide(&ch),
                );
                let err = rel_err(&gpu.to_host(&c).unwrap(), &want);
                assert!(
                    err < 1e-5,
                    "f32 {m}x{n}x{k} ta={trans_a} tb={trans_b} a={alpha} b={beta}: rel err {err:e}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tf32_is_opt_in_and_less_exact() {
    let gpu = gpu();
    let (m, n, k) = (256, 256, 1024);
    let (ah, bh) = (random(1, m * k, 1.0), random(2, k * n, 1.0));
    let a = gpu.to_device(&ah).unwrap();
    let b = gpu.to_device(&bh).unwrap();
    let mut c = gpu.alloc::<f32>(m * n).unwrap();
    let want = host_gemm(
        m,
        n,
        k,
        &wide(&ah),
        false,
        &wide(&bh),
        false,
        1.0,
        0.0,
        &vec![0.0; m * n],
    );
    let g = Gemm::new(m, n, k);
    gpu.gemm_f32(&g, &a, &b, &mut c).unwrap();
    let ieee = rel_err(&gpu.to_host(&c).unwrap(), &want);
    gpu.set_f32_gemm_math(F32GemmMath::Tf32);
    gpu.gemm_f32(&g, &a, &b, &mut c).unwrap();
    let tf32 = rel_err(&gpu.to_host(&c).unwrap(), &want);
    gpu.set_f32_gemm_math(F32GemmMath::Pedantic);
    gpu.gemm_f32(&g, &a, &b, &mut c).unwrap();
    let pedantic = rel_err(&gpu.to_host(&c).unwrap(), &want);
    println!(
        "{m}x{n}x{k} rel err vs f64: ieee {ieee:.2e}, pedantic {pedantic:.2e}, tf32 {tf32:.2e}"
    );
    assert!(
        ieee < 1e-5 && pedantic < 1e-5,
        "ieee {ieee:e} pedantic {pedantic:e}"
    );
    assert!(tf32 < 2e-2, "tf32 {tf32:e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_gemm_accumulates_in_f32() {
    let gpu = gpu();
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        for (trans_a, trans_b) in [(false, false), (true, true)] {
            let seed = 1000 + u64::try_from(s).unwrap();
            let ah: Vec<bf16> = random(seed, m * k, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let bh: Vec<bf16> = random(seed + 1, k * n, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let (aw, bw): (Vec<f64>, Vec<f64>) = (
                ah.iter().map(|v| f64::from(v.to_f32())).collect(),
                bh.iter().map(|v| f64::from(v.to_f32())).collect(),
            );
            let a = gpu.to_device(&ah).unwrap();
            let b = gpu.to_device(&bh).unwrap();
            let mut g = Gemm::new(m, n, k);
            g.trans_a = trans_a;
            g.trans_b = trans_b;
            let want = host_gemm(
                m,
                n,
                k,
                &aw,
                trans_a,
                &bw,
                trans_b,
                1.0,
                0.0,
                &vec![0.0; m * n],
            );

            let mut c32 = gpu.to_device(&vec![f32::NAN; m * n]).unwrap();
            gpu.gemm_bf16_f32(&g, &a, &b, &mut c32).unwrap();
            let err32 = rel_err(&gpu.to_host(&c32).unwrap(), &want);
            assert!(err32 < 1e-4, "bf16->f32 {m}x{n}x{k}: rel err {err32:e}");

            let mut c16 = gpu.to_device(&vec![bf16::NAN; m * n]).unwrap();
            gpu.gemm_bf16(&g, &a, &b, &mut c16).unwrap();
            let got: Vec<f32> = gpu
                .to_host(&c16)
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let err16 = rel_err(&got, &want);
            assert!(err16 < 8e-3, "bf16->bf16 {m}x{n}x{k}: rel err {err16:e}");
            println!(
                "bf16 {m}x{n}x{k} ta={trans_a} tb={trans_b}: f32 out {err32:.2e}, bf16 out {err16:.2e}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_checks_sizes() {
    let gpu = gpu();
    let a = gpu.alloc_zeros::<f32>(6).unwrap();
    let b = gpu.alloc_zeros::<f32>(12).unwrap();
    let mut c = gpu.alloc_zeros::<f32>(7).unwrap();
    let err = gpu
        .gemm_f32(&Gemm::new(2, 4, 3), &a, &b, &mut c)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::BufferTooSmall {
                what: "GEMM C",
                need: 8,
                have: 7
            }
        ),
        "{err}"
    );
    let err = gpu
        .gemm_f32(&Gemm::new(3, 3, 3), &a, &b, &mut c)
        .unwrap_err();
    assert!(
        matches!(err, GpuError::BufferTooSmall { what: "GEMM A", .. }),
        "{err}"
    );
    // Empty products are a no-op.
    gpu.gemm_f32(&Gemm::new(0, 4, 3), &a, &b, &mut c).unwrap();
    gpu.synchronize().unwrap();
}
