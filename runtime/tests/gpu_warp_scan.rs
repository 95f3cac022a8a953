//! The warp form of the scalar scan (`kernels/mamba3_warpscan.cu`, one warp
//! per (row, head), token by token) against the block form
//! (`kernels/mamba3_scan.cu`, chunked, one block per (row, head)) on the
//! same inputs: every output of the forward and backward kernels, with f32
//! and with bf16 q/k, at every head shape the warp form takes, with partial
//! last chunks and a one-token window; bit-identical reruns; a typed refusal
//! of a head it does not take; sequence starts inside a row (`--pack`)
//! against the CPU reference's recurrent scan; and the time of the three
//! scans at the state-tracking models' layer shape.
//!
//! Both forms compute in f32 in different orders (a recurrence per token
//! against chunked products), so they are held to a relative error, not to
//! bits. The gpu_mamba3 oracle tests check the warp form against the f64
//! CPU model end to end (their heads of 16 take it).
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`.

mod gpu_common;

use gpu_common::scan::{
    Path, check, grads, host, layer_cfg as cfg, median_ms, outputs, outs, run, step,
};
use gpu_common::{gpu, random};
use stepgraph::device::GpuError;
use stepgraph::kernels::mamba3::{self as k, ScanForm};

#[test]
#[ignore = "needs a CUDA GPU"]
fn warp_scan_matches_the_block_scan() {
    let gpu = gpu();
    // (config, batch, len): each (P, N) the warp form instantiates, partial
    // last chunks, two groups, and a window of one token.
    let cases = [
        (cfg(64, 16, 32, 1), 3, 77),
        (cfg(32, 16, 16, 2), 2, 40),
        (cfg(64, 8, 64, 1), 2, 130),
        (cfg(32, 8, 32, 1), 2, 33),
        (cfg(32, 32, 64, 1), 2, 200),
        (cfg(64, 16, 64, 1), 1, 1),
    ];
    let mut worst = (0.0f64, 1.0f64);
    for (i, (c, batch, len)) in cases.iter().enumerate() {
        let seed = 300 + u64::try_from(i).expect("index");
        let s = step(&gpu, c, *batch, *len, seed);
        let warp = s.acts.shape;
        assert_eq!(
            warp.scan_form,
            ScanForm::Warp,
            "case {i} must default to the warp form"
        );
        let block = k::Mamba3Shape {
            scan_form: ScanForm::Block,
            ..warp
        };
        let dy = gpu
            .to_device(&random(seed + 7, warp.rows * warp.d_inner, 1.0))
            .expect("dy");
        for path in [Path::ScalarF32, Path::ScalarBf16] {
            let (mut a, mut b) = (outs(&gpu, &warp, &s), outs(&gpu, &warp, &s));
            run(&gpu, &s, &warp, &dy, &mut a, path);
            run(&gpu, &s, &block, &dy, &mut b, path);
            let label = format!(
                "case {i} {path:?}: N {} P {} C {} G {} B {} T {}",
                warp.d_state, warp.headdim, warp.chunk, warp.ngroups, warp.batch, warp.len
            );
            // Both forms multiply f32 values in f32; what differs is the
            // order of the sums (and e^{cs_t - cs_s} against a product of
            // per-token decays).
            check(
                &label,
                &outputs(&gpu, &a, &warp, path),
                &outputs(&gpu, &b, &block, path),
                (1e-4, 0.9999999),
                &mut worst,
            );
        }
    }
    println!(
        "worst over all outputs: rel {:.2e}, cos {:.9}",
        worst.0, worst.1
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn warp_scan_reruns_are_bit_identical() {
    let gpu = gpu();
    let s = step(&gpu, &cfg(64, 16, 64, 1), 3, 150, 11);
    let sh = s.acts.shape;
    assert_eq!(sh.scan_form, ScanForm::Warp);
    let dy = gpu
        .to_device(&random(12, sh.rows * sh.d_inner, 1.0))
        .expect("dy");
    let (mut a, mut b) = (outs(&gpu, &sh, &s), outs(&gpu, &sh, &s));
    run(&gpu, &s, &sh, &dy, &mut a, Path::ScalarF32);
    run(&gpu, &s, &sh, &dy, &mut b, Path::ScalarF32);
    let mut pairs = vec![
        (host(&gpu, &a.y), host(&gpu, &b.y)),
        (host(&gpu, &a.dskip_part), host(&gpu, &b.dskip_part)),
    ];
    for ((_, x), (_, y)) in grads(&gpu, &a).into_iter().zip(grads(&gpu, &b)) {
        pairs.push((x, y));
    }
    for (x, y) in pairs {
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "a rerun changed bits"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn warp_scan_refuses_a_head_it_has_no_instance_for() {
    let gpu = gpu();
    let s = step(&gpu, &cfg(128, 64, 64, 1), 1, 8, 21);
    let block = s.acts.shape;
    assert_eq!(
        block.scan_form,
        ScanForm::Block,
        "P 64 x N 128 runs the block form"
    );
    let warp = k::Mamba3Shape {
        scan_form: ScanForm::Warp,
        ..block
    };
    let mut o = outs(&gpu, &warp, &s);
    let (lw, la) = (&s.weights.layers[0], &s.acts.layers[0]);
    let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
    let err = k::scan_fwd(
        &gpu,
        &warp,
        &s.acts.q,
        &s.acts.k,
        &la.proj,
        (scalars, None),
        &lw.d,
        &mut o.y,
        &mut o.states,
    )
    .expect_err("the warp form has no P 64 x N 128 instance");
    assert!(
        matches!(
            err,
            GpuError::WarpScanShape {
                headdim: 64,
                d_state: 128
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("not 64x128"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scan_times_at_the_state_tracking_shape() {
    let gpu = gpu();
    // One layer of the arithmetic recipe: d_model 128, 16 heads of 16,
    // N 64, batch 256, rows of 160 tokens.
    for chunk in [64, 32] {
        let s = step(&gpu, &cfg(64, 16, chunk, 1), 256, 160, 5);
        let warp = s.acts.shape;
        let block = k::Mamba3Shape {
            scan_form: ScanForm::Block,
            ..warp
        };
        let dy = gpu
            .to_device(&random(6, warp.rows * warp.d_inner, 1.0))
            .expect("dy");
        let mut o = outs(&gpu, &warp, &s);
        let mut time = |sh: &k::Mamba3Shape, path: Path| {
            median_ms(&gpu, 10, &mut || run(&gpu, &s, sh, &dy, &mut o, path))
        };
        let t_chunk = time(&warp, Path::Chunk);
        let t_block = time(&block, Path::ScalarF32);
        let t_warp = time(&warp, Path::ScalarF32);
        let t_warp16 = time(&warp, Path::ScalarBf16);
        println!(
            "B 256, T 160, H 16, P 16, N 64, C {chunk}, one layer's scan forward + backward: \
             chunk (bf16 tensor cores) {t_chunk:.3} ms, block f32 {t_block:.3} ms, \
             warp f32 {t_warp:.3} ms, warp with bf16 q/k {t_warp16:.3} ms"
        );
        assert!(
            t_warp < t_block,
            "the warp form must beat the block form here"
        );
    }
}

/// Sequence starts inside the rows (`--pack`): the warp scan, forward and
/// backward, against the CPU reference's recurrent scan (f64) with the same
/// starts, head by head: y, dq, dk, dv, the log-decay gradient (whose
/// suffix sum restarts at a start) and dL/dD. Starts at a row's first
/// token, mid-row, on adjacent tokens and on the last token.
#[test]
#[ignore = "needs a CUDA GPU"]
fn warp_scan_restarts_at_sequence_starts_as_the_reference_does() {
    use stepgraph::kernels::mamba3_bwd::{self as kb, ScanGrads};
    use stepgraph::mamba3::cpu::{HeadCarry, HeadInputs, recurrent_backward, recurrent_forward};

    let gpu = gpu();
    let (batch, len) = (2, 70);
    let s = step(&gpu, &cfg(64, 16, 64, 1), batch, len, 900);
    let sh = s.acts.shape;
    assert_eq!(sh.scan_form, ScanForm::Warp);
    let starts: [&[usize]; 2] = [&[0, 17, 40, 69], &[0, 1, 2, 33]];
    let mut flags = vec![0.0f32; batch * len];
    for (b, row) in starts.iter().enumerate() {
        for &t in *row {
            flags[b * len + t] = 1.0;
        }
    }
    let resets = gpu.to_device(&flags).expect("resets");
    let dy = gpu
        .to_device(&random(901, sh.rows * sh.d_inner, 1.0))
        .expect("dy");
    let mut o = outs(&gpu, &sh, &s);
    let (lw, la) = (&s.weights.layers[0], &s.acts.layers[0]);
    let scalars = [&la.dt, &la.adt, &la.lam, &la.qk_raw];
    let (q, k_rot) = (&s.acts.q, &s.acts.k);
    k::scan_fwd(
        &gpu,
        &sh,
        q,
        k_rot,
        &la.proj,
        (scalars, Some(&resets)),
        &lw.d,
        &mut o.y,
        &mut o.states,
    )
    .expect("scan forward");
    let out = ScanGrads {
        dq: &mut o.dq,
        dk: &mut o.dk,
        dproj: &mut o.dproj,
        dadt: &mut o.dadt,
        dscale: &mut o.dscale,
        dqkdot: &mut o.dqkdot,
        dskip_part: &mut o.dskip_part,
    };
    let inputs = (scalars, Some(&resets));
    kb::scan_bwd(
        &gpu, &sh, q, k_rot, &la.proj, inputs, &lw.d, &o.states, &dy, out,
    )
    .expect("scan backward");

    let f64s = |b: &stepgraph::device::DeviceBuffer<f32>| -> Vec<f64> {
        host(&gpu, b).into_iter().map(f64::from).collect()
    };
    let (hq, hk, proj, dyh) = (f64s(q), f64s(k_rot), f64s(&la.proj), f64s(&dy));
    let [dt, adt, lam, qk_raw] = scalars.map(&f64s);
    let d_skip = f64s(&lw.d);
    let (y, mut dq, mut dk, dproj, dadt, dqkdot) = (
        f64s(&o.y),
        f64s(&o.dq),
        f64s(&o.dk),
        f64s(&o.dproj),
        f64s(&o.dadt),
        f64s(&o.dqkdot),
    );
    let dd_gpu: Vec<f64> = gpu_common::scan::dskip(&gpu, &o.dskip_part, sh.batch, sh.nheads)
        .into_iter()
        .map(f64::from)
        .collect();
    let (nh, p, n, di, width) = (sh.nheads, sh.headdim, sh.d_state, sh.d_inner, sh.width);
    let off_x = sh.layout.x;
    // The reference's dq and dk hold the current token's term gamma_t
    // (dy_t . v_t) k_t (q_t), which the GPU scan leaves to the q . k path
    // (`dqkdot`, applied with qk_raw's gradient after the scan).
    for r in 0..batch * len {
        for h in 0..nh {
            let gdy = lam[r * nh + h] * dt[r * nh + h] * dqkdot[r * nh + h];
            let at = (r * nh + h) * n;
            for j in at..at + n {
                dq[j] += gdy * hk[j];
                dk[j] += gdy * hq[j];
            }
        }
    }
    // (got, want) pairs by name, gathered over every (row, head).
    let mut pairs: Vec<(&str, Vec<f64>, Vec<f64>)> = ["y", "dq", "dk", "dv", "dadt"]
        .into_iter()
        .map(|name| (name, Vec::new(), Vec::new()))
        .collect();
    let mut dd_cpu = vec![0.0f64; nh];
    let zeros = (vec![0.0f64; p * n], vec![0.0f64; n], vec![0.0f64; p]);
    for b in 0..batch {
        let resets: Vec<bool> = (0..len).map(|t| flags[b * len + t] != 0.0).collect();
        for h in 0..nh {
            let tok = |t: usize| b * len + t;
            let gather = |src: &[f64], w: usize, at: &dyn Fn(usize) -> usize| -> Vec<f64> {
                (0..len)
                    .flat_map(|t| src[at(t)..at(t) + w].to_vec())
                    .collect()
            };
            let x_q = gather(&hq, n, &|t| (tok(t) * nh + h) * n);
            let x_k = gather(&hk, n, &|t| (tok(t) * nh + h) * n);
            let x_v = gather(&proj, p, &|t| tok(t) * width + off_x + h * p);
            let per =
                |src: &[f64]| -> Vec<f64> { (0..len).map(|t| src[tok(t) * nh + h]).collect() };
            let (x_dt, x_adt, x_lam, x_qk) = (per(&dt), per(&adt), per(&lam), per(&qk_raw));
            let x = HeadInputs {
                q: &x_q,
                k: &x_k,
                v: &x_v,
                adt: &x_adt,
                dt: &x_dt,
                lam: &x_lam,
                qk_raw: &x_qk,
                resets: &resets,
                d: d_skip[h],
                p,
                n,
            };
            let carry = HeadCarry {
                ssm: &zeros.0,
                k: &zeros.1,
                v: &zeros.2,
            };
            let fwd = recurrent_forward(&x, &carry, 16).expect("reference forward");
            let dy_h = gather(&dyh, p, &|t| tok(t) * di + h * p);
            let g = recurrent_backward(&x, &carry, &fwd, &dy_h, 16).expect("reference backward");
            dd_cpu[h] += g.dd;
            let got = [
                gather(&y, p, &|t| tok(t) * di + h * p),
                gather(&dq, n, &|t| (tok(t) * nh + h) * n),
                gather(&dk, n, &|t| (tok(t) * nh + h) * n),
                gather(&dproj, p, &|t| tok(t) * width + off_x + h * p),
                per(&dadt),
            ];
            let want = [fwd.y, g.dq, g.dk, g.dv, g.dadt];
            for ((_, gs, ws), (gv, wv)) in pairs.iter_mut().zip(got.into_iter().zip(want)) {
                gs.extend(gv);
                ws.extend(wv);
            }
        }
    }
    pairs.push(("dD", dd_gpu, dd_cpu));
    for (name, got, want) in &pairs {
        let (num, den) = got.iter().zip(want).fold((0.0, 0.0), |(a, b), (x, y)| {
            (a + (x - y) * (x - y), b + y * y)
        });
        let rel = (num / den.max(1e-300)).sqrt();
        println!("  {name:<5} rel {rel:.2e}");
        assert!(rel < 1e-4, "{name}: rel {rel:.3e} against the reference");
    }
    // The starts change the answer: the same scan without them differs.
    let mut plain = outs(&gpu, &sh, &s);
    k::scan_fwd(
        &gpu,
        &sh,
        q,
        k_rot,
        &la.proj,
        (scalars, None),
        &lw.d,
        &mut plain.y,
        &mut plain.states,
    )
    .expect("scan forward");
    let (rel, _) = gpu_common::scan::compare(&host(&gpu, &plain.y), &host(&gpu, &o.y));
    assert!(rel > 1e-3, "the starts made no difference ({rel:.2e})");
}
