//! The chunk-parallel tensor-core scan (`kernels/mamba3_chunk.cu`) against
//! the scalar f32 scan (`kernels/mamba3_scan.cu`, or its warp form,
//! `mamba3_warpscan.cu`, at the heads that take it) on the same inputs: every
//! output of the forward and backward kernels, at shapes with a partial last
//! chunk, one chunk, several groups and the official N 128 / P 64 / C 64;
//! bit-identical reruns; and the time of both at the bench's M shape.
//!
//! The inputs are a real layer's activations: an f32 step runs its forward
//! pass (which uses the scalar scan), then both scans read layer 0's q, k,
//! proj and per-head scalars and a random upstream gradient. The chunk scan
//! rounds its product operands to bf16 (f32 accumulation), so it is held to
//! a relative error and a cosine, not to bits.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`.

mod gpu_common;

use gpu_common::scan::{Path, check, host, layer_cfg as cfg, median_ms, outputs, outs, run, step};
use gpu_common::{gpu, random};
use stepgraph::kernels::mamba3_chunk as kc;
use stepgraph::mamba3::Mamba3Config;

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunk_scan_matches_the_scalar_scan() {
    let gpu = gpu();
    // (config, batch, len): partial last chunk, a single short chunk, two
    // groups, the official N 128 / P 64 / C 64 over 16 chunks, and N 160,
    // past the one-kernel state walk (the two-kernel walk through f32
    // working memory).
    let cases = [
        (cfg(64, 64, 64, 1), 2, 300),
        (cfg(32, 16, 32, 1), 3, 20),
        (cfg(32, 16, 16, 2), 2, 77),
        (cfg(128, 64, 64, 1), 2, 1024),
        (cfg(160, 16, 32, 1), 2, 150),
        (cfg(32, 16, 32, 1), 64, 40),
    ];
    // The last case launches 1024 walk blocks: more than one wave of the
    // 80-register build, so it runs the uncapped one (on GPUs below 171
    // SMs; the H200 has 132).
    let mut wide = false;
    let mut worst = (0.0f64, 1.0f64);
    for (i, (c, batch, len)) in cases.iter().enumerate() {
        let seed = 100 + u64::try_from(i).expect("index");
        let s = step(&gpu, c, *batch, *len, seed);
        let sh = s.acts.shape;
        assert!(kc::supported(&sh), "case {i} must take the chunk path");
        assert_eq!(
            kc::one_kernel_states(&sh),
            sh.d_state <= 128,
            "case {i}: which state walk"
        );
        let sms = usize::try_from(gpu.info().sm_count).expect("SM count");
        wide |= kc::states_kernel(&sh, sms) == stepgraph::kernels::Kernel::M3cStatesWide;
        let dy = gpu
            .to_device(&random(seed + 7, sh.rows * sh.d_inner, 1.0))
            .expect("dy");
        let (mut a, mut b) = (outs(&gpu, &sh, &s), outs(&gpu, &sh, &s));
        run(&gpu, &s, &sh, &dy, &mut a, Path::Chunk);
        run(&gpu, &s, &sh, &dy, &mut b, Path::ScalarF32);
        let label = format!(
            "case {i}: N {} P {} C {} G {} B {} T {}",
            sh.d_state, sh.headdim, sh.chunk, sh.ngroups, sh.batch, sh.len
        );
        // bf16 operands (8-bit mantissa) with f32 accumulation: the official
        // kernel's precision, checked against f32 products.
        check(
            &label,
            &outputs(&gpu, &a, &sh, Path::Chunk),
            &outputs(&gpu, &b, &sh, Path::ScalarF32),
            (2e-2, 0.9998),
            &mut worst,
        );
    }
    println!(
        "worst over all outputs: rel {:.2e}, cos {:.7}",
        worst.0, worst.1
    );
    assert!(wide, "no case ran the uncapped state walk build");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunk_scan_reruns_are_bit_identical() {
    let gpu = gpu();
    let c = cfg(64, 64, 64, 1);
    let s = step(&gpu, &c, 2, 200, 5);
    let sh = s.acts.shape;
    let dy = gpu
        .to_device(&random(9, sh.rows * sh.d_inner, 1.0))
        .expect("dy");
    let (mut a, mut b) = (outs(&gpu, &sh, &s), outs(&gpu, &sh, &s));
    run(&gpu, &s, &sh, &dy, &mut a, Path::Chunk);
    run(&gpu, &s, &sh, &dy, &mut b, Path::Chunk);
    for (x, y) in [
        (&a.y, &b.y),
        (&a.dq, &b.dq),
        (&a.dk, &b.dk),
        (&a.dproj, &b.dproj),
        (&a.dadt, &b.dadt),
        (&a.dskip_part, &b.dskip_part),
    ] {
        let (x, y) = (host(&gpu, x), host(&gpu, y));
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "a rerun changed bits"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunk_scan_time_at_the_m_shape() {
    let gpu = gpu();
    // Bench M's mixer: d_model 768, N 128, P 64, batch 8, seq_len 1024.
    let c = Mamba3Config {
        d_model: 768,
        n_layer: 1,
        vocab_size: 256,
        d_state: 128,
        headdim: 64,
        ..Mamba3Config::default()
    };
    let s = step(&gpu, &c, 8, 1024, 3);
    let sh = s.acts.shape;
    let dy = gpu
        .to_device(&random(4, sh.rows * sh.d_inner, 1.0))
        .expect("dy");
    let (mut a, mut b) = (outs(&gpu, &sh, &s), outs(&gpu, &sh, &s));
    let chunked = median_ms(&gpu, 10, &mut || {
        run(&gpu, &s, &sh, &dy, &mut a, Path::Chunk);
    });
    let scalar = median_ms(&gpu, 5, &mut || {
        run(&gpu, &s, &sh, &dy, &mut b, Path::ScalarF32);
    });
    println!(
        "M shape (B 8, T 1024, H {}, N 128, P 64), one layer's scan forward + backward: \
         chunk {chunked:.3} ms, scalar {scalar:.3} ms ({:.1}x)",
        sh.nheads,
        scalar / chunked
    );
    assert!(chunked < scalar, "the chunk scan must be faster");
}
