//! Launch wrappers for the Mamba-3 backward kernels (`kernels/mamba3_bwd.cu`,
//! the backward half of `kernels/mamba3_scan.cu`) and the device AdamW's
//! schedule (`kernels/mamba3_adamw.cu`; the update itself is
//! [`super::optim::adamw`]). Same contract as [`super::mamba3`]: lengths
//! are checked against the shape before any launch.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg as _};

use super::Kernel;
use super::launch::{self, BLOCK};
use super::mamba3::{
    AngleForm, BcParams, Mamba3Shape, ScanForm, ScanScalars, check_scan_inputs, gate_lanes,
    gate_launch, need, pair_slots_fit, pair_tile_grid, row_blocks, scan_bwd_smem, scan_launch,
    thread_blocks, warp_blocks, warp_scan_launch,
};
use super::precision::Compute;
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, to_u32};

/// `dlogits = (softmax(logits) - onehot(target)) / rows`.
pub fn ce_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    logits: &DeviceBuffer<f32>,
    lse: &DeviceBuffer<f32>,
    tokens: &DeviceBuffer<i32>,
    dlogits: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let n = sh.per_row(sh.vocab)?;
    need(gpu, "ce_bwd: logits", logits, n)?;
    need(gpu, "ce_bwd: lse", lse, sh.rows)?;
    need(gpu, "ce_bwd: tokens", tokens, sh.batch * (sh.len + 1))?;
    need(gpu, "ce_bwd: dlogits", dlogits, n)?;
    let (v, len, rows) = (
        to_u32("vocab", sh.vocab)?,
        to_u32("len", sh.len)?,
        to_u32("rows", sh.rows)?,
    );
    // The CPU oracle scales by 1 / rows too; rows fits in u32, so in f64 exactly.
    let inv = 1.0 / f64::from(rows.max(1));
    #[expect(
        clippy::cast_possible_truncation,
        reason = "one rounding of 1 / rows to the f32 the kernel scales by"
    )]
    let inv = inv as f32;
    let f = gpu.function(Kernel::M3CeBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(logits.slice()?)
        .arg(lse.slice()?)
        .arg(tokens.slice()?)
        .arg(dlogits.slice_mut()?);
    b.arg(&v).arg(&len).arg(&rows).arg(&inv);
    // SAFETY: elementwise over rows x vocab (logits and dlogits checked),
    // lse [rows] and tokens [B x (T + 1)] checked.
    unsafe { b.launch(thread_blocks(n)?) }.during("launch m3_ce_bwd_f32")?;
    Ok(())
}

/// RMSNorm backward over `rows x width`: `dx` (written, or added to when
/// `accumulate`), and the weight's per-row share in `contrib`.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn rmsnorm_bwd(
    gpu: &Gpu,
    rows: usize,
    width: usize,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    rstd: &DeviceBuffer<f32>,
    dy: &DeviceBuffer<f32>,
    dx: &mut DeviceBuffer<f32>,
    contrib: &mut DeviceBuffer<f32>,
    accumulate: bool,
) -> Result<(), GpuError> {
    let n = crate::device::checked_elems("rmsnorm_bwd: rows x width", rows, width)?;
    need(gpu, "rmsnorm_bwd: x", x, n)?;
    need(gpu, "rmsnorm_bwd: w", w, width)?;
    need(gpu, "rmsnorm_bwd: rstd", rstd, rows)?;
    need(gpu, "rmsnorm_bwd: dy", dy, n)?;
    need(gpu, "rmsnorm_bwd: dx", dx, n)?;
    need(gpu, "rmsnorm_bwd: contrib", contrib, n)?;
    let (wu, ru, acc) = (
        to_u32("width", width)?,
        to_u32("rows", rows)?,
        u32::from(accumulate),
    );
    let f = gpu.function(Kernel::M3RmsnormBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?)
        .arg(w.slice()?)
        .arg(rstd.slice()?)
        .arg(dy.slice()?);
    b.arg(dx.slice_mut()?)
        .arg(contrib.slice_mut()?)
        .arg(&wu)
        .arg(&acc)
        .arg(&ru);
    // SAFETY: one block per row touches [row * width, row * width + width)
    // of x, dy, dx and contrib, w[0 .. width) and rstd[row]; all checked.
    unsafe { b.launch(row_blocks(rows)?) }.during("launch m3_rmsnorm_bwd_f32")?;
    Ok(())
}

/// Backward of the z gate: `dz` into `dproj`, `dy`, and the output norm
/// weight's per-row share in `contrib` (only with `norm_w`).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn gate_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    y: &DeviceBuffer<f32>,
    proj: &DeviceBuffer<f32>,
    norm_w: Option<&DeviceBuffer<f32>>,
    gate_rstd: &DeviceBuffer<f32>,
    d_o: &DeviceBuffer<f32>,
    dproj: &mut DeviceBuffer<f32>,
    dy: &mut DeviceBuffer<f32>,
    contrib: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let di = sh.per_row(sh.d_inner)?;
    need(gpu, "gate_bwd: y", y, di)?;
    need(gpu, "gate_bwd: proj", proj, sh.per_row(sh.width)?)?;
    need(
        gpu,
        "gate_bwd: gate_rstd",
        gate_rstd,
        sh.per_row(sh.nheads)?,
    )?;
    need(gpu, "gate_bwd: d_o", d_o, di)?;
    need(gpu, "gate_bwd: dproj", dproj, sh.per_row(sh.width)?)?;
    need(gpu, "gate_bwd: dy", dy, di)?;
    need(gpu, "gate_bwd: contrib", contrib, di)?;
    if let Some(w) = norm_w {
        need(gpu, "gate_bwd: norm weight", w, sh.d_inner)?;
    }
    let has_norm = u32::from(norm_w.is_some());
    let w = norm_w.unwrap_or(y);
    let lanes = gate_lanes(
        sh,
        &[
            y.device_addr(),
            proj.device_addr(),
            d_o.device_addr(),
            dproj.device_addr(),
            dy.device_addr(),
            contrib.device_addr(),
        ],
    );
    let f = gpu.function(Kernel::M3GateBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(y.slice()?)
        .arg(proj.slice()?)
        .arg(w.slice()?)
        .arg(gate_rstd.slice()?)
        .arg(d_o.slice()?);
    b.arg(dproj.slice_mut()?)
        .arg(dy.slice_mut()?)
        .arg(contrib.slice_mut()?)
        .arg(&has_norm)
        .arg(&lanes)
        .arg(&d);
    // SAFETY: each (row, head) stays inside the checked lengths; the norm
    // weight is read only when has_norm = 1 (then it holds d_inner); the
    // group form (lanes > 0) runs only on 16-byte aligned rows.
    unsafe { b.launch(gate_launch(sh, lanes)?) }.during("launch m3_gate_bwd_f32")?;
    Ok(())
}

/// Everything the scan backward writes.
pub struct ScanGrads<'a> {
    /// dL/dq (rotated frame) `[rows, H, N]`.
    pub dq: &'a mut DeviceBuffer<f32>,
    /// dL/dk (rotated frame, unscaled) `[rows, H, N]`.
    pub dk: &'a mut DeviceBuffer<f32>,
    /// dL/dv lands in the x columns of dL/dproj `[rows, E]`.
    pub dproj: &'a mut DeviceBuffer<f32>,
    /// dL/d(A dt) `[rows, H]`.
    pub dadt: &'a mut DeviceBuffer<f32>,
    /// dL/d scale `[rows, H]`.
    pub dscale: &'a mut DeviceBuffer<f32>,
    /// dL/d(D + gamma q̂·k̂) `[rows, H]`.
    pub dqkdot: &'a mut DeviceBuffer<f32>,
    /// dL/dD per (batch row, head) `[B, H]`.
    pub dskip_part: &'a mut DeviceBuffer<f32>,
}

impl ScanGrads<'_> {
    /// Checks every output against the shape; `dskip_part` must hold
    /// `dskip_elems` partials (the scalar and chunked scans differ there).
    pub(crate) fn check(
        &self,
        gpu: &Gpu,
        sh: &Mamba3Shape,
        dskip_elems: usize,
    ) -> Result<(), GpuError> {
        let hn = sh.per_row(sh.nheads * sh.d_state)?;
        let rh = sh.per_row(sh.nheads)?;
        need(gpu, "scan_bwd: dq", self.dq, hn)?;
        need(gpu, "scan_bwd: dk", self.dk, hn)?;
        need(gpu, "scan_bwd: dproj", self.dproj, sh.per_row(sh.width)?)?;
        need(gpu, "scan_bwd: dadt", self.dadt, rh)?;
        need(gpu, "scan_bwd: dscale", self.dscale, rh)?;
        need(gpu, "scan_bwd: dqkdot", self.dqkdot, rh)?;
        need(gpu, "scan_bwd: dD partials", self.dskip_part, dskip_elems)
    }
}

/// The chunked scan backward (reverse walk over chunks).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn scan_bwd<Q: Compute>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    q: &DeviceBuffer<Q>,
    k: &DeviceBuffer<Q>,
    proj: &DeviceBuffer<f32>,
    (scalars, resets): (ScanScalars<'_>, Option<&DeviceBuffer<f32>>),
    dskip: &DeviceBuffer<f32>,
    states: &DeviceBuffer<f32>,
    dy: &DeviceBuffer<f32>,
    out: ScanGrads<'_>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let [dt, adt, lam, qk_raw] = scalars;
    check_scan_inputs(gpu, sh, [q, k], proj, scalars, dskip)?;
    let (starts, has_starts) = super::mamba3::sequence_starts(gpu, sh, resets, dt)?;
    need(
        gpu,
        "scan_bwd: states",
        states,
        sh.batch * sh.nheads * sh.nchunks * sh.headdim * sh.d_state,
    )?;
    need(gpu, "scan_bwd: dy", dy, sh.per_row(sh.d_inner)?)?;
    out.check(gpu, sh, sh.batch * sh.nheads)?;
    let (f, cfg) = match sh.scan_form {
        ScanForm::Block => (
            gpu.function(Q::SCAN_BWD)?,
            scan_launch(gpu, sh, scan_bwd_smem(sh))?,
        ),
        ScanForm::Warp => (
            gpu.function(Q::WARP_SCAN_BWD)?,
            warp_scan_launch(sh, [q, k])?,
        ),
    };
    let mut b = gpu.stream().launch_builder(f);
    b.arg(q.slice()?).arg(k.slice()?).arg(proj.slice()?);
    b.arg(dt.slice()?)
        .arg(adt.slice()?)
        .arg(lam.slice()?)
        .arg(qk_raw.slice()?);
    if sh.scan_form == ScanForm::Warp {
        b.arg(starts.slice()?).arg(&has_starts);
    }
    b.arg(dskip.slice()?);
    b.arg(states.slice()?).arg(dy.slice()?);
    b.arg(out.dq.slice_mut()?)
        .arg(out.dk.slice_mut()?)
        .arg(out.dproj.slice_mut()?);
    b.arg(out.dadt.slice_mut()?)
        .arg(out.dscale.slice_mut()?)
        .arg(out.dqkdot.slice_mut()?);
    b.arg(out.dskip_part.slice_mut()?).arg(&d);
    // SAFETY: block (b, h) (warp (b, h) in the warp form) reads and writes
    // only its own rows/columns of buffers whose lengths were all checked
    // against the shape (the warp form's sequence starts read only with
    // has_starts set, their length then checked); the block form's shared memory is sized by
    // `scan_bwd_smem` for this shape, the warp form's q/k alignment checked
    // by `warp_scan_launch`.
    unsafe { b.launch(cfg) }.during("launch m3_scan_bwd")?;
    Ok(())
}

/// Largest `d_state` of the warp form of [`rot_bcnorm_bwd`] (a lane keeps
/// four pairs of per-group sums in registers; `M3_RB_MAX_PAIRS` in
/// mamba3_bwd.cu); the tiled form takes 64, 128, 256 and 512.
pub const ROT_BCNORM_MAX_STATE: usize = 256;

/// Rows of a tile of the tiled rotation/B-C-norm backward;
/// `M3_RBT_ROWS` in mamba3_bwd.cu (a unit test holds the two equal: the bias
/// sums are read every `RBT_ROWS` rows).
pub(crate) const RBT_ROWS: usize = 8;

/// Per-head gradients of the rotated queries and keys (from the scan),
/// overwritten by [`rot_bcnorm_bwd`].
pub struct RotGrads<'a> {
    /// `dq` `[rows, H, N]`.
    pub dq: &'a mut DeviceBuffer<f32>,
    /// `dk` `[rows, H, N]`.
    pub dk: &'a mut DeviceBuffer<f32>,
}

/// Rotation and B/C-norm backward: from `dq`/`dk` (with respect to the
/// rotated q/k) writes `dphi`, the B and C columns of `dproj` (the RMSNorm
/// backward of the per-group sums over heads), `contrib` `[B, C]`
/// `[rows, G, N]` (whose column sums are the norm weight gradients) and the
/// bias gradients `bias` `[dB_bias, dC_bias]` `[H, N]`; `dq`/`dk` are used
/// as scratch. `fwd` is `[phi, dt, lam]`; the rotated q/k that `dphi` needs
/// are rebuilt from `proj`, so no per-head q/k is read.
///
/// Where `d_state` allows, one tiled kernel also sums each tile's bias
/// gradients and a column sum over the tiles finishes them; otherwise a
/// warp per (row, group) un-rotates `dq`/`dk` in place and two column sums
/// over all rows follow.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn rot_bcnorm_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    proj: &DeviceBuffer<f32>,
    rstd: [&DeviceBuffer<f32>; 2],
    params: BcParams<'_>,
    fwd: [&DeviceBuffer<f32>; 3],
    dqkdot: &DeviceBuffer<f32>,
    grads: RotGrads<'_>,
    dphi: &mut DeviceBuffer<f32>,
    dproj: &mut DeviceBuffer<f32>,
    contrib: [&mut DeviceBuffer<f32>; 2],
    bias: [&mut DeviceBuffer<f32>; 2],
    partials: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let tile = pair_slots_fit(sh.d_state).then_some(RBT_ROWS);
    if tile.is_none() && sh.d_state > ROT_BCNORM_MAX_STATE {
        return Err(GpuError::ShapeLimit {
            what: "rotation/B-C norm backward: d_state",
            value: sh.d_state,
            max: ROT_BCNORM_MAX_STATE,
        });
    }
    let d = sh.dims()?;
    let [rb, rc] = rstd;
    let [bn, cn, bb, cb] = params;
    let [phi, dt, lam] = fwd;
    let [contrib_b, contrib_c] = contrib;
    let RotGrads { dq, dk } = grads;
    let hn = sh.per_row(sh.nheads * sh.d_state)?;
    let rh = sh.per_row(sh.nheads)?;
    let hs = sh.per_row(sh.nheads * sh.angles)?;
    let gn = sh.per_row(sh.ngroups * sh.d_state)?;
    need(gpu, "rot_bcnorm_bwd: proj", proj, sh.per_row(sh.width)?)?;
    need(gpu, "rot_bcnorm_bwd: rstd_b", rb, sh.per_row(sh.ngroups)?)?;
    need(gpu, "rot_bcnorm_bwd: rstd_c", rc, sh.per_row(sh.ngroups)?)?;
    need(gpu, "rot_bcnorm_bwd: B_norm", bn, sh.d_state)?;
    need(gpu, "rot_bcnorm_bwd: C_norm", cn, sh.d_state)?;
    need(gpu, "rot_bcnorm_bwd: B_bias", bb, sh.nheads * sh.d_state)?;
    need(gpu, "rot_bcnorm_bwd: C_bias", cb, sh.nheads * sh.d_state)?;
    need(gpu, "rot_bcnorm_bwd: phi", phi, hs)?;
    need(gpu, "rot_bcnorm_bwd: dt", dt, rh)?;
    need(gpu, "rot_bcnorm_bwd: lam", lam, rh)?;
    need(gpu, "rot_bcnorm_bwd: dqkdot", dqkdot, rh)?;
    need(gpu, "rot_bcnorm_bwd: dq", dq, hn)?;
    need(gpu, "rot_bcnorm_bwd: dk", dk, hn)?;
    need(gpu, "rot_bcnorm_bwd: dphi", dphi, hs)?;
    need(gpu, "rot_bcnorm_bwd: dproj", dproj, sh.per_row(sh.width)?)?;
    need(gpu, "rot_bcnorm_bwd: contrib_b", contrib_b, gn)?;
    need(gpu, "rot_bcnorm_bwd: contrib_c", contrib_c, gn)?;
    let name = if tile.is_some() {
        Kernel::M3RotBcnormBwdTiledF32
    } else {
        Kernel::M3RotBcnormBwdF32
    };
    let f = gpu.function(name)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(proj.slice()?).arg(rb.slice()?).arg(rc.slice()?);
    b.arg(bn.slice()?)
        .arg(cn.slice()?)
        .arg(bb.slice()?)
        .arg(cb.slice()?)
        .arg(phi.slice()?);
    b.arg(dt.slice()?).arg(lam.slice()?).arg(dqkdot.slice()?);
    b.arg(dq.slice_mut()?)
        .arg(dk.slice_mut()?)
        .arg(dphi.slice_mut()?)
        .arg(dproj.slice_mut()?);
    b.arg(contrib_b.slice_mut()?)
        .arg(contrib_c.slice_mut()?)
        .arg(&d);
    let hn_cols = sh.nheads * sh.d_state;
    let [db, dc] = bias;
    let Some(tile) = tile else {
        // SAFETY: one warp per (row, group) touches that row's slices of
        // every buffer (the group's heads in dq/dk/dphi, its B/C columns of
        // proj and dproj, its [G x N] contrib slice), all lengths checked
        // above; d_state is at most ROT_BCNORM_MAX_STATE, the pairs a lane's
        // registers hold.
        unsafe { b.launch(warp_blocks(sh.rows * sh.ngroups)?) }
            .during("launch m3_rot_bcnorm_bwd_f32")?;
        colsum(gpu, dk, sh.rows, hn_cols, hn_cols, 0, partials, db)?;
        return colsum(gpu, dq, sh.rows, hn_cols, hn_cols, 0, partials, dc);
    };
    let tiles = sh.rows.div_ceil(tile);
    let cfg = pair_tile_grid(sh, tile)?;
    // SAFETY: block (tile, g) reads and writes only the rows
    // [tile * tile_rows, +tile_rows) below `rows` of every per-row buffer
    // (the group's heads of dq/dk/dphi, its B/C columns of proj and dproj,
    // its [G x N] slice of contrib), all lengths checked above; the thread
    // that owns a (head, pair) of the tile writes its bias sums over the
    // tile's first row of dq/dk after its own reads of them (no other
    // thread reads those elements); a thread per pair of the N / 2 (a whole
    // number of warps dividing the block, pair_slots_fit).
    unsafe { b.launch(cfg) }.during("launch m3_rot_bcnorm_bwd_tiled_f32")?;
    // The tile sums sit every `tile` rows of dk/dq.
    let ld = tile * hn_cols;
    colsum(gpu, dk, tiles, hn_cols, ld, 0, partials, db)?;
    colsum(gpu, dq, tiles, hn_cols, ld, 0, partials, dc)
}

/// Reverse cumsum of `dphi` over time, in place, in the form
/// [`AngleForm::for_shape`] picks.
pub fn angle_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    dphi: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    angle_bwd_as(gpu, sh, AngleForm::for_shape(sh), dphi)
}

/// [`angle_bwd`] in the given form (both are valid at every shape).
pub fn angle_bwd_as(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    form: AngleForm,
    dphi: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    need(
        gpu,
        "angle_bwd: dphi",
        dphi,
        sh.per_row(sh.nheads * sh.angles)?,
    )?;
    let k = match form {
        AngleForm::Segmented => Kernel::M3AngleBwdF32,
        AngleForm::Serial => Kernel::M3AngleBwdSerialF32,
    };
    let f = gpu.function(k)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(dphi.slice_mut()?).arg(&d);
    // SAFETY: each thread walks one (b, h, s) column of dphi [rows x H x S]
    // (a time segment of it in the segmented form), whose length was
    // checked; the segmented kernel runs at its M3_ANGLE_THREADS block size.
    unsafe { b.launch(form.launch(sh)?) }.during("launch m3_angle_bwd")?;
    Ok(())
}

/// Scalar chain (dt, A, trap) and the angle columns of `dproj`.
/// `fwd` = `[dt, lam, theta, qk_raw]`, `grads` = `[rphi, dadt, dscale, dqkdot]`.
pub fn scalar_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    proj: &DeviceBuffer<f32>,
    dt_bias: &DeviceBuffer<f32>,
    fwd: [&DeviceBuffer<f32>; 4],
    grads: [&DeviceBuffer<f32>; 4],
    dproj: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let [dt, lam, theta, qk_raw] = fwd;
    let [rphi, dadt, dscale, dqkdot] = grads;
    let rh = sh.per_row(sh.nheads)?;
    need(gpu, "scalar_bwd: proj", proj, sh.per_row(sh.width)?)?;
    need(gpu, "scalar_bwd: dt_bias", dt_bias, sh.nheads)?;
    for (what, buf) in [
        ("scalar_bwd: dt", dt),
        ("scalar_bwd: lam", lam),
        ("scalar_bwd: qk_raw", qk_raw),
        ("scalar_bwd: dadt", dadt),
        ("scalar_bwd: dscale", dscale),
        ("scalar_bwd: dqkdot", dqkdot),
    ] {
        need(gpu, what, buf, rh)?;
    }
    need(gpu, "scalar_bwd: theta", theta, sh.per_row(sh.angles)?)?;
    need(
        gpu,
        "scalar_bwd: rphi",
        rphi,
        sh.per_row(sh.nheads * sh.angles)?,
    )?;
    need(gpu, "scalar_bwd: dproj", dproj, sh.per_row(sh.width)?)?;
    let f = gpu.function(Kernel::M3ScalarBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(proj.slice()?)
        .arg(dt_bias.slice()?)
        .arg(dt.slice()?)
        .arg(lam.slice()?)
        .arg(theta.slice()?);
    b.arg(rphi.slice()?)
        .arg(dadt.slice()?)
        .arg(dscale.slice()?)
        .arg(dqkdot.slice()?)
        .arg(qk_raw.slice()?);
    b.arg(dproj.slice_mut()?).arg(&d);
    // SAFETY: one thread per (row, head) reads/writes inside the checked
    // lengths (its row's dt/A/trap columns of dproj).
    unsafe { b.launch(thread_blocks(rh)?) }.during("launch m3_scalar_bwd_f32")?;

    let f = gpu.function(Kernel::M3DthetaBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(proj.slice()?)
        .arg(rphi.slice()?)
        .arg(dt.slice()?)
        .arg(dproj.slice_mut()?)
        .arg(&d);
    // SAFETY: one thread per (row, angle) reads rphi [rows x H x S], dt
    // [rows x H] and its proj element, and writes its dproj angle column;
    // all checked above.
    unsafe { b.launch(thread_blocks(sh.per_row(sh.angles)?)?) }
        .during("launch m3_dtheta_bwd_f32")?;
    Ok(())
}

/// Fewest rows a pass-1 column-sum split folds (8 per warp), which bounds
/// the partials at [`colsum_partials`].
pub const COLSUM_ROWS_PER_SPLIT: usize = 64;

/// Pass-1 blocks a column sum aims for: 8 resident 256-thread blocks on each
/// of an H200's 132 SMs, enough loads in flight to stream at full bandwidth.
pub const COLSUM_TARGET_BLOCKS: usize = 1056;

/// Partials a column sum over `rows x cols` may need.
pub fn colsum_partials(rows: usize, cols: usize) -> usize {
    rows.div_ceil(COLSUM_ROWS_PER_SPLIT)
        .max(1)
        .saturating_mul(cols)
}

/// The `M3Colsum` struct of `kernels/mamba3_bwd.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct M3Colsum {
    /// Rows of the input.
    pub rows: u32,
    /// Columns summed.
    pub cols: u32,
    /// Row stride of the input, in elements.
    pub ld: u32,
    /// First column summed.
    pub off: u32,
    /// Rows per pass-1 split.
    pub rows_per_split: u32,
    /// Pass-1 splits (rows of the partials).
    pub splits: u32,
}

// SAFETY: `#[repr(C)]` with six `u32` fields (no padding, no pointers), field
// for field the `M3Colsum` of kernels/mamba3_bwd.cu (a test checks the size
// and offsets against the numbers documented there).
unsafe impl DeviceRepr for M3Colsum {}

/// The split of a column sum: `(rows_per_split, splits, vec)` where `vec`
/// (4 or 1) is the columns one lane loads at once. Depends only on the
/// shape and the alignment, so a sum always runs in the same order.
pub fn colsum_plan(
    rows: usize,
    cols: usize,
    ld: usize,
    off: usize,
    aligned: bool,
) -> (usize, usize, usize) {
    let vec = if aligned && cols.is_multiple_of(4) && ld.is_multiple_of(4) && off.is_multiple_of(4)
    {
        4
    } else {
        1
    };
    let col_blocks = cols.div_ceil(32 * vec).max(1);
    let splits = COLSUM_TARGET_BLOCKS
        .div_ceil(col_blocks)
        .clamp(1, rows.div_ceil(COLSUM_ROWS_PER_SPLIT).max(1));
    let per = rows.div_ceil(splits).max(1);
    (per, rows.div_ceil(per).max(1), vec)
}

/// `out[c] = sum_r x[r * ld + off + c]` for `c < cols`, deterministically
/// (the split depends only on the shape, and every sum runs in a fixed
/// order). Pass 1 writes `splits x cols` partials (at most
/// [`colsum_partials`]), pass 2 folds them into `out`; with a single split
/// pass 1 writes `out` directly.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn colsum(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    rows: usize,
    cols: usize,
    ld: usize,
    off: usize,
    partials: &mut DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    if cols == 0 {
        return Ok(());
    }
    if off + cols > ld {
        return Err(GpuError::BufferTooSmall {
            what: "colsum: row stride",
            need: off + cols,
            have: ld,
        });
    }
    // The last row ends at (rows - 1) * ld + off + cols, which may be short
    // of rows * ld (the strided sums of rot_bcnorm_bwd).
    let last = crate::device::checked_elems("colsum: rows x ld", rows.saturating_sub(1), ld)?;
    need(gpu, "colsum: x", x, last.saturating_add(off + cols))?;
    need(gpu, "colsum: out", out, cols)?;
    let (per, splits, vec) = colsum_plan(rows, cols, ld, off, x.device_addr().is_multiple_of(16));
    let d = M3Colsum {
        rows: to_u32("colsum: rows", rows)?,
        cols: to_u32("colsum: cols", cols)?,
        ld: to_u32("colsum: ld", ld)?,
        off: to_u32("colsum: off", off)?,
        rows_per_split: to_u32("colsum: rows per split", per)?,
        splits: to_u32("colsum: splits", splits)?,
    };
    let col_blocks = to_u32("colsum: column blocks", cols.div_ceil(32 * vec))?;
    if col_blocks > 65_535 {
        return Err(GpuError::SizeOverflow {
            what: "colsum: column blocks (grid y)",
            value: u128::from(col_blocks),
            target: "65535",
        });
    }
    let pass1 = LaunchConfig {
        grid_dim: (d.splits, col_blocks, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let name = if vec == 4 {
        Kernel::M3ColsumPartialsF32x4
    } else {
        Kernel::M3ColsumPartialsF32
    };
    let f = gpu.function(name)?;
    if splits == 1 {
        let mut b = gpu.stream().launch_builder(f);
        b.arg(x.slice()?).arg(out.slice_mut()?).arg(&d);
        // SAFETY: block (0, cb) reads x[r * ld + off + c] for r < rows and
        // c < cols (off + cols <= ld, rows * ld checked; the x4 form only
        // when x is 16-byte aligned and cols, ld, off are multiples of 4)
        // and writes out[c] for c < cols (checked).
        unsafe { b.launch(pass1) }.during("launch m3_colsum_partials")?;
        return Ok(());
    }
    need(
        gpu,
        "colsum: partials",
        partials,
        crate::device::checked_elems("colsum: splits x cols", splits, cols)?,
    )?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(partials.slice_mut()?).arg(&d);
    // SAFETY: block (split, cb) reads x[r * ld + off + c] for r < rows and
    // c < cols (as above) and writes partials[split * cols + c] for
    // split < splits and c < cols (splits * cols checked).
    unsafe { b.launch(pass1) }.during("launch m3_colsum_partials")?;
    let f = gpu.function(Kernel::M3ColsumFinishF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(partials.slice()?).arg(out.slice_mut()?).arg(&d);
    let pass2 = launch::grid(to_u32("colsum: finish blocks", cols.div_ceil(32))?);
    // SAFETY: reads partials[0 .. splits * cols), writes out[0 .. cols);
    // both checked.
    unsafe { b.launch(pass2) }.during("launch m3_colsum_finish_f32")?;
    Ok(())
}

/// Most warps in an embedding-backward block; must equal `M3_EMB_MAX_WARPS`
/// in `kernels/mamba3_bwd.cu` (a unit test checks).
pub const EMBED_MAX_WARPS: usize = 32;

/// Shared-memory floats an embedding-backward block may use: 48 KB, the most
/// a launch gets without opting in. Must equal `M3_EMB_SMEM_FLOATS` (a unit
/// test checks).
pub const EMBED_SMEM_FLOATS: usize = 12_288;

/// Warps an embedding backward aims for in all. At the kernel's ~58
/// registers an H200 SM holds 32 warps, so 132 x 32 is about one full wave:
/// a small vocabulary spreads each row's positions over up to
/// [`EMBED_MAX_WARPS`] warps, a large one runs narrow blocks that spend
/// little on the cross-warp combine.
pub const EMBED_TARGET_WARPS: usize = 4096;

/// Fewest positions worth a warp of their own (one step of the kernel's
/// four 32-position ballots).
const EMBED_MIN_POSITIONS: usize = 128;

/// `(warps, tile)` of an embedding backward over `rows` positions: warps per
/// block and columns per pass (`warps x tile` floats of shared memory).
/// Depends only on the shape, so a sum always runs in the same order.
pub fn embed_plan(vocab: usize, rows: usize, d_model: usize) -> (usize, usize) {
    let warps = EMBED_TARGET_WARPS
        .div_ceil(vocab.max(1))
        .clamp(2, EMBED_MAX_WARPS)
        .min(rows.div_ceil(EMBED_MIN_POSITIONS).max(1));
    // A multiple of 128, so a capped tile keeps the float4 path aligned.
    let cap = EMBED_SMEM_FLOATS / warps / 128 * 128;
    (warps, d_model.clamp(1, cap))
}

/// `gemb[v, :] += sum of dh[i, :]` over positions whose input token is `v`,
/// deterministically (see [`embed_plan`]); rows no position maps to are left
/// as they are.
pub fn embed_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    tokens: &DeviceBuffer<i32>,
    dh: &DeviceBuffer<f32>,
    gemb: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    // Position i reads token (i / len) * (len + 1) + i % len, so the token
    // grid must hold ceil(rows / len) batch rows (B of them when rows = B * T).
    let grid_rows = sh.batch.max(sh.rows.div_ceil(sh.len.max(1)));
    need(
        gpu,
        "embed_bwd: tokens",
        tokens,
        crate::device::checked_elems("embed_bwd: token grid", grid_rows, sh.len + 1)?,
    )?;
    need(gpu, "embed_bwd: dh", dh, sh.per_row(sh.d_model)?)?;
    need(
        gpu,
        "embed_bwd: grad",
        gemb,
        crate::device::checked_elems("embed_bwd: vocab x d_model", sh.vocab, sh.d_model)?,
    )?;
    let (len, width, vocab, rows) = (
        to_u32("len", sh.len)?,
        to_u32("d_model", sh.d_model)?,
        to_u32("vocab", sh.vocab)?,
        to_u32("rows", sh.rows)?,
    );
    let (warps, tile) = embed_plan(sh.vocab, sh.rows, sh.d_model);
    let cfg = LaunchConfig {
        grid_dim: row_blocks(sh.vocab)?.grid_dim,
        block_dim: (to_u32("embed_bwd: threads", warps * 32)?, 1, 1),
        shared_mem_bytes: to_u32(
            "embed_bwd: shared memory",
            warps * tile * std::mem::size_of::<f32>(),
        )?,
    };
    let tile = to_u32("embed_bwd: tile", tile)?;
    let f = gpu.function(Kernel::M3EmbedBwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(tokens.slice()?)
        .arg(dh.slice()?)
        .arg(gemb.slice_mut()?)
        .arg(&len)
        .arg(&width)
        .arg(&vocab)
        .arg(&rows)
        .arg(&tile);
    // SAFETY: block v (grid-stride) reads tokens at (i / len) * (len + 1) +
    // i % len for positions i < rows (inside the checked token grid) and dh
    // rows i < rows (rows x d_model checked; float4 loads only when d_model
    // and tile are multiples of 4 and dh is 16-byte aligned, which the
    // kernel tests), and updates gemb row v < vocab (vocab x d_model
    // checked). It runs warps x 32 <= 1024 threads (its launch bound) and
    // indexes warps x tile <= 12288 floats of the dynamic shared memory
    // requested here, under the 48 KB that needs no opt-in.
    unsafe { b.launch(cfg) }.during("launch m3_embed_bwd_f32")?;
    Ok(())
}

/// `step += 1` and the step's AdamW scalars, on the device.
pub fn advance_schedule(
    gpu: &Gpu,
    hyper: &DeviceBuffer<f64>,
    step: &mut DeviceBuffer<i32>,
    derived: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    need(gpu, "advance_schedule: hyper", hyper, 5)?;
    need(gpu, "advance_schedule: step", step, 1)?;
    need(gpu, "advance_schedule: derived", derived, 8)?;
    let f = gpu.function(Kernel::M3AdvanceSchedule)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(hyper.slice()?)
        .arg(step.slice_mut()?)
        .arg(derived.slice_mut()?);
    // SAFETY: one thread reads hyper[0..5), updates step[0], writes derived[0..8); checked.
    unsafe { b.launch(launch::grid(1)) }.during("launch m3_advance_schedule")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The value of `#define name value` in kernels/mamba3_bwd.cu.
    fn define(name: &str) -> usize {
        let src = include_str!("../../../kernels/mamba3_bwd.cu");
        let prefix = format!("#define {name} ");
        src.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name} not defined in kernels/mamba3_bwd.cu"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn embed_geometry_matches_the_kernel_source() {
        assert_eq!(define("M3_EMB_MAX_WARPS"), EMBED_MAX_WARPS);
        assert_eq!(define("M3_EMB_SMEM_FLOATS"), EMBED_SMEM_FLOATS);
    }

    #[test]
    fn embed_plans_fit_the_block_and_shared_memory() {
        for vocab in [0, 1, 5, 16, 256, 1000, 4096, 50_280, 1 << 20] {
            for rows in [0, 1, 127, 129, 3000, 10_240, 40_960, 1 << 22] {
                for d_model in [0, 1, 72, 128, 384, 385, 768, 2560, 100_000] {
                    let (warps, tile) = embed_plan(vocab, rows, d_model);
                    assert!((1..=EMBED_MAX_WARPS).contains(&warps));
                    assert!(tile >= 1 && tile <= d_model.max(1));
                    assert!(warps * tile <= EMBED_SMEM_FLOATS);
                    // A tile short of d_model keeps later passes 16-byte aligned.
                    assert!(tile == d_model || tile.is_multiple_of(4) || d_model == 0);
                    assert!(warps == 1 || rows > EMBED_MIN_POSITIONS);
                }
            }
        }
        // The small state-tracking shape fans each row out over 32 warps in one pass.
        assert_eq!(embed_plan(16, 256 * 160, 128), (32, 128));
        // A 50k vocabulary runs narrow blocks, d_model 768 in one pass.
        assert_eq!(embed_plan(50_280, 16 * 256, 768), (2, 768));
    }

    #[test]
    fn colsum_args_match_the_kernel_source() {
        assert_eq!(define("M3_COLSUM_SIZE"), size_of::<M3Colsum>());
        for (name, off) in [
            ("M3_COLSUM_OFF_COLS", offset_of!(M3Colsum, cols)),
            ("M3_COLSUM_OFF_LD", offset_of!(M3Colsum, ld)),
            ("M3_COLSUM_OFF_OFF", offset_of!(M3Colsum, off)),
            (
                "M3_COLSUM_OFF_ROWS_PER_SPLIT",
                offset_of!(M3Colsum, rows_per_split),
            ),
            ("M3_COLSUM_OFF_SPLITS", offset_of!(M3Colsum, splits)),
        ] {
            assert_eq!(define(name), off, "{name}");
        }
        assert_eq!(offset_of!(M3Colsum, rows), 0);
    }

    #[test]
    fn colsum_plans_stay_within_the_partials_and_cover_every_row() {
        for (rows, cols, ld, off) in [
            (8192, 3072, 3072, 0),
            (8192, 768, 768, 0),
            (8192, 128, 128, 0),
            (8192, 24, 3432, 3361),
            (128, 24, 24, 0),
            (1, 5, 5, 0),
            (0, 8, 8, 0),
            (70_001, 33, 40, 7),
        ] {
            for aligned in [true, false] {
                let (per, splits, vec) = colsum_plan(rows, cols, ld, off, aligned);
                assert!(per >= 1 && splits >= 1);
                assert!(per * splits >= rows, "{rows}x{cols}: rows uncovered");
                assert!(
                    per * (splits - 1) < rows.max(1),
                    "{rows}x{cols}: empty split"
                );
                assert!(splits * cols <= colsum_partials(rows, cols));
                assert!(
                    vec == 1
                        || (aligned
                            && cols.is_multiple_of(4)
                            && ld.is_multiple_of(4)
                            && off.is_multiple_of(4))
                );
            }
        }
        // The widest M-config sum reads 16-byte vectors over about 1k blocks.
        let (_, splits, vec) = colsum_plan(8192, 3072, 3072, 0, true);
        assert_eq!(vec, 4);
        assert_eq!(splits * 3072usize.div_ceil(128), COLSUM_TARGET_BLOCKS);
    }
}
