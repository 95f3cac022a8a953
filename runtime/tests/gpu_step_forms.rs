//! The per-token kernels that come in two forms, picked by shape: the angle
//! cumsum (segmented blocks for long windows, a thread per (row, head,
//! angle) for short ones) and the z gate (a warp per (row, head), or a group
//! of `headdim / 4` lanes with 16-byte accesses). Each form is held to an
//! f64 host computation of the same formula on the same inputs, at shapes
//! that pick each form; the state-tracking shape's times are printed.
//!
//! The oracle tests (`gpu_mamba3`) run whichever form a whole step picks;
//! these run both at every shape.
//!
//! Every test is `#[ignore = "needs a CUDA GPU"]`.

mod gpu_common;

use gpu_common::scan::{host, host16, median_ms};
use gpu_common::{gpu, random};
use stepgraph::device::{DeviceBuffer, Gpu};
use stepgraph::kernels::mamba3::{self as k, AngleForm, Mamba3Shape};
use stepgraph::kernels::mamba3_bwd as kb;
use stepgraph::mamba3::Mamba3Config;
use stepgraph::mamba3::gpu::kernel_shape;

const TWO_PI: f64 = std::f64::consts::TAU;

fn shape(d_model: usize, headdim: usize, d_state: usize, batch: usize, len: usize) -> Mamba3Shape {
    let cfg = Mamba3Config {
        d_model,
        n_layer: 1,
        vocab_size: 64,
        d_state,
        headdim,
        ..Mamba3Config::default()
    };
    kernel_shape(&cfg, batch, len)
}

fn upload(gpu: &Gpu, v: &[f32]) -> DeviceBuffer<f32> {
    gpu.to_device(v).expect("upload")
}

/// Distance of two angles on the circle.
fn angle_dist(a: f64, b: f64) -> f64 {
    let d = (a - b).rem_euclid(TWO_PI);
    d.min(TWO_PI - d)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn both_angle_cumsum_forms_match_the_host_sums() {
    let gpu = gpu();
    // (d_model, headdim, d_state, batch, len): the state-tracking heads
    // (serial by default), a long window (segmented), S 32 and S 8, one
    // token, and a window that is not a multiple of the 32 segments.
    let cases = [
        (128, 16, 64, 64, 161),
        (128, 16, 64, 2, 1500),
        (256, 64, 128, 3, 77),
        (64, 16, 32, 5, 1),
        (128, 32, 32, 4, 45),
    ];
    for (i, &(dm, p, n, batch, len)) in cases.iter().enumerate() {
        let sh = shape(dm, p, n, batch, len);
        let (hh, ss) = (sh.nheads, sh.angles);
        let seed = 40 + u64::try_from(i).expect("index");
        // dt > 0 as softplus makes it; theta = pi tanh(.) in (-pi, pi).
        let dt: Vec<f32> = random(seed, sh.rows * hh, 1.0)
            .iter()
            .map(|x| 0.5 * (x + 1.0) + 1e-3)
            .collect();
        let theta = random(seed + 1, sh.rows * ss, 3.1);
        let (dt_d, th_d) = (upload(&gpu, &dt), upload(&gpu, &theta));
        let dphi = random(seed + 2, sh.rows * hh * ss, 1.0);
        for form in [AngleForm::Segmented, AngleForm::Serial] {
            let mut phi = gpu.alloc_zeros::<f32>(sh.rows * hh * ss).expect("phi");
            k::angle_fwd_as(&gpu, &sh, form, &dt_d, &th_d, &mut phi).expect("angle fwd");
            let got = host(&gpu, &phi);
            let mut worst = 0.0f64;
            for b in 0..batch {
                for h in 0..hh {
                    for s in 0..ss {
                        let mut acc = 0.0f64;
                        for t in 0..len {
                            let row = b * len + t;
                            acc += f64::from(dt[row * hh + h]) * f64::from(theta[row * ss + s]);
                            let g = f64::from(got[(row * hh + h) * ss + s]);
                            assert!(
                                (0.0..=TWO_PI + 1e-6).contains(&g),
                                "phi {g} outside [0, 2 pi]"
                            );
                            worst = worst.max(angle_dist(g, acc));
                        }
                    }
                }
            }
            // f32 output of a double sum: half an ulp of 2 pi, plus the
            // double sums' own order.
            assert!(worst < 1e-6, "case {i} {form:?}: phi off by {worst:e} rad");

            let mut d = upload(&gpu, &dphi);
            kb::angle_bwd_as(&gpu, &sh, form, &mut d).expect("angle bwd");
            let got = host(&gpu, &d);
            let mut worst = 0.0f64;
            for b in 0..batch {
                for col in 0..hh * ss {
                    let mut acc = 0.0f64;
                    for t in (0..len).rev() {
                        let e = (b * len + t) * hh * ss + col;
                        acc += f64::from(dphi[e]);
                        let err = (f64::from(got[e]) - acc).abs() / acc.abs().max(1.0);
                        worst = worst.max(err);
                    }
                }
            }
            assert!(
                worst < 2e-7,
                "case {i} {form:?}: reverse cumsum off by {worst:e}"
            );
            println!("case {i} ({batch}x{len}, H {hh}, S {ss}) {form:?}: ok");
        }
    }
}

/// The gate's forward and backward on the host in f64: `(o, rstd, dz, dy,
/// contrib)` for rows of `y [rows, d_inner]`, z at `off_z` of
/// `proj [rows, width]`, upstream `d_o`.
struct GateRef {
    o: Vec<f64>,
    rstd: Vec<f64>,
    dz: Vec<f64>,
    dy: Vec<f64>,
    contrib: Vec<f64>,
}

fn gate_host(sh: &Mamba3Shape, y: &[f32], proj: &[f32], w: Option<&[f32]>, d_o: &[f32]) -> GateRef {
    let (p, hh, di) = (sh.headdim, sh.nheads, sh.d_inner);
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let n = sh.rows * di;
    let mut r = GateRef {
        o: vec![0.0; n],
        rstd: vec![1.0; sh.rows * hh],
        dz: vec![0.0; n],
        dy: vec![0.0; n],
        contrib: vec![0.0; n],
    };
    for row in 0..sh.rows {
        for h in 0..hh {
            let at = |j: usize| row * di + h * p + j;
            let z = |j: usize| f64::from(proj[row * sh.width + sh.layout.z + h * p + j]);
            let yv = |j: usize| f64::from(y[at(j)]);
            let wn = |j: usize| w.map_or(1.0, |w| f64::from(w[h * p + j]));
            let rs = if w.is_some() {
                let ms = (0..p).map(|j| yv(j) * yv(j)).sum::<f64>() / p as f64;
                1.0 / (ms + f64::from(sh.eps)).sqrt()
            } else {
                1.0
            };
            r.rstd[row * hh + h] = rs;
            let mut c = 0.0;
            for j in 0..p {
                let (s, go) = (sig(z(j)), f64::from(d_o[at(j)]));
                let silu = z(j) * s;
                let gz = s * (1.0 + z(j) * (1.0 - s));
                let yn = yv(j) * rs * wn(j);
                r.o[at(j)] = yn * silu;
                r.dz[at(j)] = go * yn * gz;
                let dyn_ = go * silu;
                r.contrib[at(j)] = dyn_ * yv(j) * rs;
                c += dyn_ * wn(j) * yv(j);
            }
            let c = if w.is_some() {
                rs * rs * rs * c / p as f64
            } else {
                0.0
            };
            for j in 0..p {
                let silu = z(j) * sig(z(j));
                r.dy[at(j)] = rs * wn(j) * f64::from(d_o[at(j)]) * silu - c * yv(j);
            }
        }
    }
    r
}

/// Worst relative error of `got` against `want`, scaled by `want`'s RMS.
fn rel(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len().max(1) as f64)
        .sqrt()
        .max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            assert!(g.is_finite(), "non-finite output");
            (f64::from(g) - w).abs() / rms
        })
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gate_forms_match_the_host_gate() {
    let gpu = gpu();
    // (d_model, headdim, batch, len, group lanes expected): group forms of
    // 2, 4, 16 and 32 lanes a head, and heads of 24 and 12 (warp form).
    let cases = [
        (128, 16, 3, 50, 4),
        (128, 8, 2, 33, 2),
        (256, 64, 2, 20, 16),
        (256, 128, 1, 9, 32),
        (96, 24, 2, 17, 0),
        (96, 12, 2, 11, 0),
    ];
    for (i, &(dm, p, batch, len, want_lanes)) in cases.iter().enumerate() {
        let sh = shape(dm, p, 32, batch, len);
        let seed = 70 + u64::try_from(i).expect("index");
        let n = sh.rows * sh.d_inner;
        let y = random(seed, n, 2.0);
        let proj = random(seed + 1, sh.rows * sh.width, 3.0);
        let d_o = random(seed + 2, n, 1.0);
        let w: Vec<f32> = random(seed + 3, sh.d_inner, 0.5)
            .iter()
            .map(|x| 1.0 + x)
            .collect();
        let (y_d, proj_d, do_d, w_d) = (
            upload(&gpu, &y),
            upload(&gpu, &proj),
            upload(&gpu, &d_o),
            upload(&gpu, &w),
        );
        let mut o32 = gpu.alloc_zeros::<f32>(n).expect("o");
        let mut o16 = gpu.alloc_zeros::<half::bf16>(n).expect("o16");
        let mut rstd = gpu.alloc_zeros::<f32>(sh.rows * sh.nheads).expect("rstd");
        let (mut dproj, mut dy, mut contrib) = (
            gpu.alloc_zeros::<f32>(sh.rows * sh.width).expect("dproj"),
            gpu.alloc_zeros::<f32>(n).expect("dy"),
            gpu.alloc_zeros::<f32>(n).expect("contrib"),
        );
        let lanes = k::gate_lanes(
            &sh,
            &[y_d.device_addr(), proj_d.device_addr(), o32.device_addr()],
        );
        assert_eq!(lanes, want_lanes, "case {i}: form picked");
        for norm in [false, true] {
            let nw = norm.then_some(&w_d);
            let want = gate_host(&sh, &y, &proj, norm.then_some(w.as_slice()), &d_o);
            k::gate_fwd::<f32>(&gpu, &sh, &y_d, &proj_d, nw, &mut o32, &mut rstd)
                .expect("gate f32");
            k::gate_fwd::<half::bf16>(&gpu, &sh, &y_d, &proj_d, nw, &mut o16, &mut rstd)
                .expect("gate bf16");
            kb::gate_bwd(
                &gpu,
                &sh,
                &y_d,
                &proj_d,
                nw,
                &rstd,
                &do_d,
                &mut dproj,
                &mut dy,
                &mut contrib,
            )
            .expect("gate bwd");
            let e_o = rel(&host(&gpu, &o32), &want.o);
            // bf16 storage: each value within its own rounding (2^-9
            // relative), not a bound on the RMS-scaled error.
            let e_o16 = host16(&gpu, &o16)
                .iter()
                .zip(&want.o)
                .map(|(&g, &w)| (f64::from(g) - w).abs() / (w.abs() + 1e-6))
                .fold(0.0, f64::max);
            let dz: Vec<f32> = {
                let d = host(&gpu, &dproj);
                (0..sh.rows)
                    .flat_map(|r| {
                        d[r * sh.width + sh.layout.z..r * sh.width + sh.layout.z + sh.d_inner]
                            .to_vec()
                    })
                    .collect()
            };
            let e_dz = rel(&dz, &want.dz);
            let e_dy = rel(&host(&gpu, &dy), &want.dy);
            println!(
                "case {i} (P {p}, {lanes} lanes, norm {norm}): o {e_o:.1e}, o bf16 {e_o16:.1e}, dz {e_dz:.1e}, dy {e_dy:.1e}"
            );
            for (what, e, bound) in [
                ("o", e_o, 1e-5),
                ("o bf16", e_o16, 4e-3),
                ("dz", e_dz, 1e-5),
                ("dy", e_dy, 1e-5),
            ] {
                assert!(
                    e < bound,
                    "case {i} norm {norm}: {what} off by {e:e} (bound {bound:e})"
                );
            }
            if norm {
                let e_r = rel(&host(&gpu, &rstd), &want.rstd);
                let e_c = rel(&host(&gpu, &contrib), &want.contrib);
                assert!(
                    e_r < 1e-5 && e_c < 1e-5,
                    "case {i}: rstd {e_r:e}, contrib {e_c:e}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn step_form_times_at_the_state_tracking_shape() {
    let gpu = gpu();
    // One layer of the arithmetic recipe: d_model 128, 16 heads of 16,
    // N 64 (16 angles), batch 256, rows of 160 tokens.
    let sh = shape(128, 16, 64, 256, 160);
    let (hh, ss) = (sh.nheads, sh.angles);
    let dt = upload(
        &gpu,
        &random(1, sh.rows * hh, 0.01)
            .iter()
            .map(|x| x + 0.02)
            .collect::<Vec<_>>(),
    );
    let theta = upload(&gpu, &random(2, sh.rows * ss, 3.0));
    let mut phi = gpu.alloc_zeros::<f32>(sh.rows * hh * ss).expect("phi");
    for form in [AngleForm::Segmented, AngleForm::Serial] {
        let f = median_ms(&gpu, 20, &mut || {
            k::angle_fwd_as(&gpu, &sh, form, &dt, &theta, &mut phi).expect("fwd");
        });
        let b = median_ms(&gpu, 20, &mut || {
            kb::angle_bwd_as(&gpu, &sh, form, &mut phi).expect("bwd");
        });
        println!(
            "angle cumsum {form:?} at B 256, T 160, H 16, S 16: forward {f:.3} ms, backward {b:.3} ms"
        );
    }
    assert_eq!(AngleForm::for_shape(&sh), AngleForm::Serial);
    let n = sh.rows * sh.d_inner;
    let (y, proj, d_o) = (
        upload(&gpu, &random(3, n, 1.0)),
        upload(&gpu, &random(4, sh.rows * sh.width, 1.0)),
        upload(&gpu, &random(5, n, 1.0)),
    );
    let mut o = gpu.alloc_zeros::<half::bf16>(n).expect("o");
    let mut rstd = gpu.alloc_zeros::<f32>(sh.rows * hh).expect("rstd");
    let (mut dproj, mut dy, mut contrib) = (
        gpu.alloc_zeros::<f32>(sh.rows * sh.width).expect("dproj"),
        gpu.alloc_zeros::<f32>(n).expect("dy"),
        gpu.alloc_zeros::<f32>(n).expect("contrib"),
    );
    let f = median_ms(&gpu, 20, &mut || {
        k::gate_fwd::<half::bf16>(&gpu, &sh, &y, &proj, None, &mut o, &mut rstd).expect("gate fwd");
    });
    let b = median_ms(&gpu, 20, &mut || {
        kb::gate_bwd(
            &gpu,
            &sh,
            &y,
            &proj,
            None,
            &rstd,
            &d_o,
            &mut dproj,
            &mut dy,
            &mut contrib,
        )
        .expect("gate bwd");
    });
    let lanes = k::gate_lanes(&sh, &[y.device_addr(), proj.device_addr(), o.device_addr()]);
    println!(
        "gate ({lanes} lanes a head) at the same shape: forward (bf16 out) {f:.3} ms, backward {b:.3} ms"
    );
}
