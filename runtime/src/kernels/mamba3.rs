//! Launch wrappers for the Mamba-3 forward kernels (`kernels/mamba3_fwd.cu`,
//! `kernels/mamba3_scan.cu`); the shape record every Mamba-3 kernel takes
//! is [`Mamba3Shape`] (in `mamba3_shape.rs`, re-exported here).
//!
//! Each wrapper checks that every buffer holds at least what the kernel
//! touches for the given [`Mamba3Shape`] before it launches, so a kernel can
//! never index past an allocation. The backward and optimizer wrappers are in
//! [`super::mamba3_bwd`].

use cudarc::driver::{LaunchConfig, PushKernelArg as _};

use super::Kernel;
use super::launch::{self, BLOCK, MAX_ELEMENTWISE_BLOCKS};
use super::precision::Compute;
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Element, Gpu, GpuError, to_u32};

#[cfg(test)]
pub(crate) use super::mamba3_shape::test_shape;
pub use super::mamba3_shape::{AngleSource, DecayMap, M3Dims, Mamba3Shape, ProjLayout, ScanForm};

/// Fails unless `buf` holds at least `need` elements.
pub(crate) fn need<T: Element>(
    gpu: &Gpu,
    what: &'static str,
    buf: &DeviceBuffer<T>,
    need: usize,
) -> Result<(), GpuError> {
    gpu.check_owned(what, buf)?;
    if buf.len() < need {
        return Err(GpuError::BufferTooSmall {
            what,
            need,
            have: buf.len(),
        });
    }
    Ok(())
}

/// One block per row (grid-stride over rows beyond the cap).
pub(crate) fn row_blocks(rows: usize) -> Result<LaunchConfig, GpuError> {
    let r = to_u32("mamba3: rows", rows)?;
    Ok(launch::grid(r.clamp(1, MAX_ELEMENTWISE_BLOCKS)))
}

/// One warp per item, `BLOCK / 32` warps per block.
pub(crate) fn warp_blocks(items: usize) -> Result<LaunchConfig, GpuError> {
    let n = to_u32("mamba3: warp items", items)?;
    Ok(launch::grid(
        n.div_ceil(BLOCK / 32).clamp(1, MAX_ELEMENTWISE_BLOCKS),
    ))
}

/// Threads of the angle cumsum kernels; must equal `M3_ANGLE_THREADS` in
/// `kernels/mamba3_common.cuh` (a unit test checks).
pub const ANGLE_THREADS: u32 = 1024;

/// The angle cumsum launch: one block per (batch row, head, 32 angles),
/// grid-strided past [`MAX_ELEMENTWISE_BLOCKS`].
pub(crate) fn angle_blocks(sh: &Mamba3Shape) -> Result<LaunchConfig, GpuError> {
    let bh = crate::device::checked_elems("mamba3: batch x heads", sh.batch, sh.nheads)?;
    let units =
        crate::device::checked_elems("mamba3: angle cumsum blocks", bh, sh.angles.div_ceil(32))?;
    let n = to_u32("mamba3: angle cumsum blocks", units)?;
    Ok(LaunchConfig {
        grid_dim: (n.clamp(1, MAX_ELEMENTWISE_BLOCKS), 1, 1),
        block_dim: (ANGLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// How the angle cumsum kernels (forward and backward) walk the window.
/// Both forms compute the same double sums; they differ in the order of the
/// additions (so in the last bits) and in how they spread the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AngleForm {
    /// One 1024-thread block per (batch row, head, 32 angles), the window
    /// cut into 32 time segments: long windows over few (row, head) pairs.
    Segmented,
    /// One thread per (batch row, head, angle) walking the whole window:
    /// short windows over many of them (the state-tracking models).
    Serial,
}

impl AngleForm {
    /// Fewest (row, head, angle) threads the serial form is picked for:
    /// 256 warps, two an SM of an H200, enough loads in flight to beat one
    /// wave of segmented blocks.
    pub const SERIAL_MIN_THREADS: usize = 8192;
    /// Longest window the serial form is picked for: its chain of dependent
    /// double additions is one a token.
    pub const SERIAL_MAX_LEN: usize = 1024;

    /// The form the step uses at `sh`.
    pub fn for_shape(sh: &Mamba3Shape) -> Self {
        let threads = sh.batch.saturating_mul(sh.nheads).saturating_mul(sh.angles);
        if threads >= Self::SERIAL_MIN_THREADS && sh.len <= Self::SERIAL_MAX_LEN {
            Self::Serial
        } else {
            Self::Segmented
        }
    }

    /// The launch of this form at `sh`.
    pub(crate) fn launch(self, sh: &Mamba3Shape) -> Result<LaunchConfig, GpuError> {
        match self {
            Self::Segmented => angle_blocks(sh),
            Self::Serial => {
                let bh =
                    crate::device::checked_elems("mamba3: batch x heads", sh.batch, sh.nheads)?;
                thread_blocks(crate::device::checked_elems(
                    "mamba3: angle cumsum threads",
                    bh,
                    sh.angles,
                )?)
            }
        }
    }
}

/// One thread per item.
pub(crate) fn thread_blocks(items: usize) -> Result<LaunchConfig, GpuError> {
    let n = to_u32("mamba3: items", items)?;
    Ok(launch::grid(launch::blocks(n, MAX_ELEMENTWISE_BLOCKS)))
}

/// `h[row, :] = emb[tokens[b, t], :]` for the `[B, T + 1]` token batch.
pub fn embed_fwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    tokens: &DeviceBuffer<i32>,
    emb: &DeviceBuffer<f32>,
    h: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    need(gpu, "embed: tokens", tokens, sh.batch * (sh.len + 1))?;
    need(gpu, "embed: embedding", emb, sh.vocab * sh.d_model)?;
    need(gpu, "embed: h", h, sh.per_row(sh.d_model)?)?;
    let (len, width, vocab, rows) = (
        to_u32("len", sh.len)?,
        to_u32("d_model", sh.d_model)?,
        to_u32("vocab", sh.vocab)?,
        to_u32("rows", sh.rows)?,
    );
    let f = gpu.function(Kernel::M3EmbedFwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(tokens.slice()?)
        .arg(emb.slice()?)
        .arg(h.slice_mut()?)
        .arg(&len)
        .arg(&width)
        .arg(&vocab)
        .arg(&rows);
    // SAFETY: reads tokens[b * (T + 1) + t] for t < T (B * (T + 1) checked),
    // emb rows only for ids in [0, vocab) (vocab * d_model checked), writes
    // h[0 .. rows * d_model) (checked); argument order matches the kernel.
    unsafe { b.launch(thread_blocks(sh.rows * sh.d_model)?) }.during("launch m3_embed_fwd_f32")?;
    Ok(())
}

/// Row-wise RMSNorm `y = x * rstd * w` over `rows x width`, keeping `rstd`
/// (f32 statistics; `y` in the compute type `T`, a GEMM operand).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn rmsnorm_fwd<T: Compute>(
    gpu: &Gpu,
    rows: usize,
    width: usize,
    eps: f32,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<T>,
    rstd: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let n = crate::device::checked_elems("rmsnorm: rows x width", rows, width)?;
    need(gpu, "rmsnorm: x", x, n)?;
    need(gpu, "rmsnorm: w", w, width)?;
    need(gpu, "rmsnorm: y", y, n)?;
    need(gpu, "rmsnorm: rstd", rstd, rows)?;
    let (wu, ru) = (
        to_u32("rmsnorm width", width)?,
        to_u32("rmsnorm rows", rows)?,
    );
    let f = gpu.function(T::RMSNORM_FWD)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?)
        .arg(w.slice()?)
        .arg(y.slice_mut()?)
        .arg(rstd.slice_mut()?)
        .arg(&wu)
        .arg(&eps)
        .arg(&ru);
    // SAFETY: touches x/y[0 .. rows * width), w[0 .. width), rstd[0 .. rows),
    // all checked above; the kernel named by `T::RMSNORM_FWD` writes y as
    // `T` (f32 or __nv_bfloat16, both matching the Rust element's layout);
    // `&mut y` and `&mut rstd` cannot alias the inputs.
    unsafe { b.launch(row_blocks(rows)?) }.during("launch m3_rmsnorm_fwd")?;
    Ok(())
}

/// The per-token split: B/C reciprocal RMS, theta, dt, A dt and lam.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn prep(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    proj: &DeviceBuffer<f32>,
    dt_bias: &DeviceBuffer<f32>,
    rstd_b: &mut DeviceBuffer<f32>,
    rstd_c: &mut DeviceBuffer<f32>,
    theta: &mut DeviceBuffer<f32>,
    dt: &mut DeviceBuffer<f32>,
    adt: &mut DeviceBuffer<f32>,
    lam: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    need(gpu, "prep: proj", proj, sh.per_row(sh.width)?)?;
    need(gpu, "prep: dt_bias", dt_bias, sh.nheads)?;
    need(gpu, "prep: rstd_b", rstd_b, sh.per_row(sh.ngroups)?)?;
    need(gpu, "prep: rstd_c", rstd_c, sh.per_row(sh.ngroups)?)?;
    need(gpu, "prep: theta", theta, sh.per_row(sh.angles)?)?;
    for (what, buf) in [
        ("prep: dt", &*dt),
        ("prep: adt", &*adt),
        ("prep: lam", &*lam),
    ] {
        need(gpu, what, buf, sh.per_row(sh.nheads)?)?;
    }
    let f = gpu.function(Kernel::M3PrepF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(proj.slice()?)
        .arg(dt_bias.slice()?)
        .arg(rstd_b.slice_mut()?)
        .arg(rstd_c.slice_mut()?);
    b.arg(theta.slice_mut()?)
        .arg(dt.slice_mut()?)
        .arg(adt.slice_mut()?)
        .arg(lam.slice_mut()?)
        .arg(&d);
    // SAFETY: per row the kernel reads proj[row * E .. row * E + E) and
    // dt_bias[0 .. H) and writes rows x {G, G, S, H, H, H} outputs; every
    // length was checked against the shape `d` is built from.
    unsafe { b.launch(row_blocks(sh.rows)?) }.during("launch m3_prep_f32")?;
    Ok(())
}

/// The angle cumsum `phi_t = (phi_{t-1} + dt_t theta_t) mod 2 pi`, in the
/// form [`AngleForm::for_shape`] picks.
pub fn angle_fwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    dt: &DeviceBuffer<f32>,
    theta: &DeviceBuffer<f32>,
    phi: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    angle_fwd_as(gpu, sh, AngleForm::for_shape(sh), dt, theta, phi)
}

/// [`angle_fwd`] in the given form (both are valid at every shape).
pub fn angle_fwd_as(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    form: AngleForm,
    dt: &DeviceBuffer<f32>,
    theta: &DeviceBuffer<f32>,
    phi: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    need(gpu, "angle: dt", dt, sh.per_row(sh.nheads)?)?;
    need(gpu, "angle: theta", theta, sh.per_row(sh.angles)?)?;
    need(gpu, "angle: phi", phi, sh.per_row(sh.nheads * sh.angles)?)?;
    let k = match form {
        AngleForm::Segmented => Kernel::M3AngleFwdF32,
        AngleForm::Serial => Kernel::M3AngleFwdSerialF32,
    };
    let f = gpu.function(k)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(dt.slice()?)
        .arg(theta.slice()?)
        .arg(phi.slice_mut()?)
        .arg(&d);
    // SAFETY: reads dt[rows x H], theta[rows x S], writes phi[rows x H x S];
    // all three lengths checked. The segmented kernel runs at its
    // M3_ANGLE_THREADS block size (its static shared tile is sized by it);
    // the serial one grid-strides over its B x H x S threads at any size.
    unsafe { b.launch(form.launch(sh)?) }.during("launch m3_angle_fwd")?;
    Ok(())
}

/// `phi = ((t + 1) base^(-s / S)) mod 2 pi` for every row, head and pair:
/// the fixed angles of standard RoPE ([`AngleSource::Fixed`]), in place of
/// [`angle_fwd`].
pub fn angle_fixed(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    base: f64,
    phi: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let n = sh.per_row(sh.nheads * sh.angles)?;
    need(gpu, "angle_fixed: phi", phi, n)?;
    let f = gpu.function(Kernel::M3AngleFixedF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(phi.slice_mut()?).arg(&base).arg(&d);
    // SAFETY: writes phi[0 .. rows x H x S), whose length was checked;
    // argument order and types (float*, double, M3Dims) match the kernel.
    unsafe { b.launch(thread_blocks(n)?) }.during("launch m3_angle_fixed_f32")?;
    Ok(())
}

/// Parameters the query/key kernels read: `[b_norm, c_norm, b_bias, c_bias]`.
pub type BcParams<'a> = [&'a DeviceBuffer<f32>; 4];

/// Where the rotated keys and queries come from: the in_proj output, the
/// B/C norms' rstd `[rows, G]`, `[B_norm, C_norm, B_bias, C_bias]` and the
/// angles `phi` `[rows, H, S]`.
#[derive(Clone, Copy)]
pub struct QkSources<'a> {
    /// `proj` `[rows, E]`.
    pub proj: &'a DeviceBuffer<f32>,
    /// `[rstd_b, rstd_c]`, each `[rows, G]`.
    pub rstd: [&'a DeviceBuffer<f32>; 2],
    /// `[B_norm, C_norm, B_bias, C_bias]`.
    pub params: BcParams<'a>,
    /// `phi` `[rows, H, S]`.
    pub phi: &'a DeviceBuffer<f32>,
}

impl QkSources<'_> {
    /// Checks every source's owner and length against `sh`.
    pub(crate) fn check(&self, gpu: &Gpu, sh: &Mamba3Shape) -> Result<(), GpuError> {
        let [rb, rc] = self.rstd;
        let [bn, cn, bb, cb] = self.params;
        need(gpu, "qk: proj", self.proj, sh.per_row(sh.width)?)?;
        need(gpu, "qk: rstd_b", rb, sh.per_row(sh.ngroups)?)?;
        need(gpu, "qk: rstd_c", rc, sh.per_row(sh.ngroups)?)?;
        need(gpu, "qk: B_norm", bn, sh.d_state)?;
        need(gpu, "qk: C_norm", cn, sh.d_state)?;
        need(gpu, "qk: B_bias", bb, sh.nheads * sh.d_state)?;
        need(gpu, "qk: C_bias", cb, sh.nheads * sh.d_state)?;
        need(gpu, "qk: phi", self.phi, sh.per_row(sh.nheads * sh.angles)?)
    }
}

/// Rotated keys `k` and queries `q` `[rows, H, N]`, stored as `Q` (the
/// step's compute type: the mixed step keeps them in bf16, which is what
/// the scans round them to for their products), and their unrotated dot
/// products `qk_raw` `[rows, H]`.
pub fn qk_fwd<Q: Compute>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    src: &QkSources<'_>,
    q: &mut DeviceBuffer<Q>,
    k: &mut DeviceBuffer<Q>,
    qk_raw: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    src.check(gpu, sh)?;
    let [rb, rc] = src.rstd;
    let [bn, cn, bb, cb] = src.params;
    need(gpu, "qk: q", q, sh.per_row(sh.nheads * sh.d_state)?)?;
    need(gpu, "qk: k", k, sh.per_row(sh.nheads * sh.d_state)?)?;
    need(gpu, "qk: qk_raw", qk_raw, sh.per_row(sh.nheads)?)?;
    // The vectorised kernel: N / 8 lanes per (row, head), a power of two
    // that fits a warp.
    let lanes = sh.d_state / 8;
    let vec = sh.d_state.is_multiple_of(8) && lanes.is_power_of_two() && lanes <= 32;
    let name = if vec { Q::QK_FWD_VEC } else { Q::QK_FWD };
    let f = gpu.function(name)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(src.proj.slice()?).arg(rb.slice()?).arg(rc.slice()?);
    b.arg(bn.slice()?)
        .arg(cn.slice()?)
        .arg(bb.slice()?)
        .arg(cb.slice()?)
        .arg(src.phi.slice()?);
    b.arg(q.slice_mut()?)
        .arg(k.slice_mut()?)
        .arg(qk_raw.slice_mut()?)
        .arg(&d);
    let items = sh.rows * sh.nheads;
    let warps = if vec {
        items.div_ceil(32 / lanes)
    } else {
        items
    };
    // SAFETY: each (row, head) item (a warp, or N / 8 lanes of one in the
    // vectorised kernel) reads proj's B/C columns, the norm weights [N],
    // biases [H x N], phi [rows x H x S] and writes q/k [rows x H x N] and
    // qk_raw [rows x H]; all lengths checked. The vectorised kernel's
    // 16-byte accesses start at multiples of 8 elements (N is one) of
    // allocations aligned to 256 bytes.
    unsafe { b.launch(warp_blocks(warps)?) }.during("launch m3_qk_fwd")?;
    Ok(())
}

/// Whether a kernel that runs a thread per interleaved pair of N, the
/// block split into whole slots of N / 2 threads (the tiled rotation
/// backward), takes `d_state`: N / 2 a whole number of warps that divides
/// the block.
pub(crate) fn pair_slots_fit(d_state: usize) -> bool {
    let np = d_state / 2;
    let block = BLOCK as usize;
    d_state.is_multiple_of(2) && np > 0 && np.is_multiple_of(32) && block.is_multiple_of(np)
}

/// The launch of a pair-tiled kernel: one block per (tile of `tile` rows,
/// group).
pub(crate) fn pair_tile_grid(sh: &Mamba3Shape, tile: usize) -> Result<LaunchConfig, GpuError> {
    if sh.ngroups > 65_535 {
        return Err(GpuError::SizeOverflow {
            what: "pair-tiled kernel: groups (grid y)",
            value: u128::try_from(sh.ngroups).unwrap_or(u128::MAX),
            target: "65535",
        });
    }
    Ok(LaunchConfig {
        grid_dim: (
            to_u32("pair-tiled kernel: row tiles", sh.rows.div_ceil(tile))?,
            to_u32("pair-tiled kernel: groups", sh.ngroups)?,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Per-head scan inputs: `[dt, adt, lam, qk_raw]`, each `[rows, H]`.
pub type ScanScalars<'a> = [&'a DeviceBuffer<f32>; 4];

/// Checks the inputs every scan kernel (scalar or chunked, forward or
/// backward) reads: q and k (in the step's q/k type), `proj`, the per-head
/// scalars and `D`.
pub(crate) fn check_scan_inputs<Q: Element>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    qk: [&DeviceBuffer<Q>; 2],
    proj: &DeviceBuffer<f32>,
    scalars: ScanScalars<'_>,
    dskip: &DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let [q, k] = qk;
    let hn = sh.per_row(sh.nheads * sh.d_state)?;
    need(gpu, "scan: q", q, hn)?;
    need(gpu, "scan: k", k, hn)?;
    need(gpu, "scan: proj", proj, sh.per_row(sh.width)?)?;
    check_scan_scalars(gpu, sh, scalars, dskip)
}

/// Checks the per-head scalars and `D` every scan kernel reads.
pub(crate) fn check_scan_scalars(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    scalars: ScanScalars<'_>,
    dskip: &DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let [dt, adt, lam, qk_raw] = scalars;
    for (what, buf) in [
        ("scan: dt", dt),
        ("scan: adt", adt),
        ("scan: lam", lam),
        ("scan: qk_raw", qk_raw),
    ] {
        need(gpu, what, buf, sh.per_row(sh.nheads)?)?;
    }
    need(gpu, "scan: D", dskip, sh.nheads)
}

/// Dynamic shared memory of the forward scan, in bytes.
pub fn scan_fwd_smem(sh: &Mamba3Shape) -> usize {
    let (p, n, c) = (sh.headdim, sh.d_state + 1, sh.chunk);
    4 * (p * n + 2 * c * n + c * p + c * c + 3 * c)
}

/// Dynamic shared memory of the backward scan, in bytes.
pub fn scan_bwd_smem(sh: &Mamba3Shape) -> usize {
    let (p, n, c) = (sh.headdim, sh.d_state + 1, sh.chunk);
    4 * (p * n + 3 * c * n + 3 * c * p + 2 * c * (c + 1) + 8 * c + SCAN_WARPS)
}

/// Threads per scan block; must equal `M3_SCAN_THREADS` in
/// `kernels/mamba3_scan.cu` (a unit test checks).
pub const SCAN_THREADS: u32 = 1024;

/// Warps per scan block (the size of the block-sum staging array).
const SCAN_WARPS: usize = 32;

/// Most dynamic shared memory a block may opt into on sm_90 (227 KiB).
pub const MAX_SCAN_SMEM: usize = 232_448;

/// Opts both scan kernels into the dynamic shared memory `sh` needs. Called
/// when activations are allocated (outside any capture): setting a function
/// attribute is not a stream operation, but keeping it out of the capture
/// keeps the captured work to launches and copies.
pub fn scan_prepare(gpu: &Gpu, sh: &Mamba3Shape) -> Result<(), GpuError> {
    for (name, smem) in [
        (Kernel::M3ScanFwdF32, scan_fwd_smem(sh)),
        (Kernel::M3ScanBwdF32, scan_bwd_smem(sh)),
        (Kernel::M3ScanFwdBf16qk, scan_fwd_smem(sh)),
        (Kernel::M3ScanBwdBf16qk, scan_bwd_smem(sh)),
    ] {
        let bytes = check_smem(smem)?;
        let opt_in = i32::try_from(bytes).map_err(|_| GpuError::SizeOverflow {
            what: "scan shared memory",
            value: u128::from(bytes),
            target: "i32",
        })?;
        gpu.function(name)?
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                opt_in,
            )
            .during("opt a scan kernel into large shared memory")?;
    }
    Ok(())
}

fn check_smem(smem: usize) -> Result<u32, GpuError> {
    if smem > MAX_SCAN_SMEM {
        return Err(GpuError::BufferTooSmall {
            what: "scan shared memory per block (bytes; lower chunk_size, d_state or headdim)",
            need: smem,
            have: MAX_SCAN_SMEM,
        });
    }
    to_u32("scan shared memory", smem)
}

/// Launch configuration of a scan kernel: one block per (batch row, head)
/// with `smem` bytes of dynamic shared memory. Outside a capture the
/// kernels are (re-)opted into that size first.
pub(crate) fn scan_launch(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    smem: usize,
) -> Result<LaunchConfig, GpuError> {
    let bytes = check_smem(smem)?;
    if gpu.refuse_in_capture("set a kernel attribute").is_ok() {
        scan_prepare(gpu, sh)?;
    }
    let blocks = to_u32("mamba3: batch * nheads", sh.batch * sh.nheads)?;
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (SCAN_THREADS, 1, 1),
        shared_mem_bytes: bytes,
    })
}

/// Warps per block of the warp scan; `M3W_WARPS` in
/// `kernels/mamba3_warpscan.cu` (a unit test checks).
pub const WARP_SCAN_WARPS: u32 = 4;

/// Launch configuration of the warp scan: one warp per (batch row, head),
/// [`WARP_SCAN_WARPS`] to a block, no shared memory. Refuses a head shape
/// the kernel has no instance for, and q/k its vector loads cannot read
/// (their rows are 16-byte multiples; the buffers must start on one).
pub(crate) fn warp_scan_launch<Q: Compute>(
    sh: &Mamba3Shape,
    qk: [&DeviceBuffer<Q>; 2],
) -> Result<LaunchConfig, GpuError> {
    if !ScanForm::warp_takes(sh.headdim, sh.d_state) {
        return Err(GpuError::WarpScanShape {
            headdim: sh.headdim,
            d_state: sh.d_state,
        });
    }
    for (what, buf) in [("scan: q", qk[0]), ("scan: k", qk[1])] {
        if buf.device_addr() % 16 != 0 {
            return Err(GpuError::Misaligned {
                what,
                addr: buf.device_addr(),
                align: 16,
            });
        }
    }
    let pairs = to_u32("mamba3: batch * nheads", sh.batch * sh.nheads)?;
    Ok(LaunchConfig {
        grid_dim: (pairs.div_ceil(WARP_SCAN_WARPS).max(1), 1, 1),
        block_dim: (WARP_SCAN_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The chunked scan forward: `y` `[rows, d_inner]` and the state entering
/// every chunk, `states` `[B, H, nchunks, P, N]`.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn scan_fwd<Q: Compute>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    q: &DeviceBuffer<Q>,
    k: &DeviceBuffer<Q>,
    proj: &DeviceBuffer<f32>,
    (scalars, resets): (ScanScalars<'_>, Option<&DeviceBuffer<f32>>),
    dskip: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
    states: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let [dt, adt, lam, qk_raw] = scalars;
    check_scan_inputs(gpu, sh, [q, k], proj, scalars, dskip)?;
    let (starts, has_starts) = sequence_starts(gpu, sh, resets, dt)?;
    need(gpu, "scan: y", y, sh.per_row(sh.d_inner)?)?;
    need(
        gpu,
        "scan: states",
        states,
        sh.batch * sh.nheads * sh.nchunks * sh.headdim * sh.d_state,
    )?;
    let (f, cfg) = match sh.scan_form {
        ScanForm::Block => (
            gpu.function(Q::SCAN_FWD)?,
            scan_launch(gpu, sh, scan_fwd_smem(sh))?,
        ),
        ScanForm::Warp => (
            gpu.function(Q::WARP_SCAN_FWD)?,
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
    b.arg(y.slice_mut()?).arg(states.slice_mut()?).arg(&d);
    // SAFETY: block (b, h) (warp (b, h) in the warp form) reads its rows of
    // q/k [rows x H x N], proj's x columns, the [rows x H] scalars and D[h]
    // (the warp form also row b's sequence starts [rows], only when
    // has_starts is set, their length then checked), and writes its y
    // columns and its B x H x nchunks x P x N slice of `states`; all
    // lengths checked; the block form's dynamic shared memory is the size
    // its layout needs, the warp form's q/k are 16-byte aligned for its
    // vector loads (`warp_scan_launch`).
    unsafe { b.launch(cfg) }.during("launch m3_scan_fwd")?;
    Ok(())
}

/// The warp scan's sequence-start arguments: the flags `[rows]` and 1, or
/// a stand-in buffer the kernel does not read and 0. Refused for a form
/// that takes none (the block scan), so packed rows never run it.
pub(crate) fn sequence_starts<'a>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    resets: Option<&'a DeviceBuffer<f32>>,
    stand_in: &'a DeviceBuffer<f32>,
) -> Result<(&'a DeviceBuffer<f32>, u32), GpuError> {
    match resets {
        None => Ok((stand_in, 0)),
        Some(_) if sh.scan_form != ScanForm::Warp => Err(GpuError::SequenceStarts {
            headdim: sh.headdim,
            d_state: sh.d_state,
        }),
        Some(r) => {
            need(gpu, "scan: sequence starts", r, sh.rows)?;
            Ok((r, 1))
        }
    }
}

/// The z gate, optionally with the grouped output RMSNorm (`norm_w`); `o`
/// (the out_proj GEMM operand) in the compute type `T`.
pub fn gate_fwd<T: Compute>(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    y: &DeviceBuffer<f32>,
    proj: &DeviceBuffer<f32>,
    norm_w: Option<&DeviceBuffer<f32>>,
    o: &mut DeviceBuffer<T>,
    gate_rstd: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    need(gpu, "gate: y", y, sh.per_row(sh.d_inner)?)?;
    need(gpu, "gate: proj", proj, sh.per_row(sh.width)?)?;
    need(gpu, "gate: o", o, sh.per_row(sh.d_inner)?)?;
    need(gpu, "gate: gate_rstd", gate_rstd, sh.per_row(sh.nheads)?)?;
    let has_norm = u32::from(norm_w.is_some());
    if let Some(w) = norm_w {
        need(gpu, "gate: norm weight", w, sh.d_inner)?;
    }
    // Without the norm the kernel never reads the weight; y stands in.
    let w = norm_w.unwrap_or(y);
    let lanes = gate_lanes(sh, &[y.device_addr(), proj.device_addr(), o.device_addr()]);
    let f = gpu.function(T::GATE_FWD)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(y.slice()?)
        .arg(proj.slice()?)
        .arg(w.slice()?)
        .arg(o.slice_mut()?)
        .arg(gate_rstd.slice_mut()?);
    b.arg(&has_norm).arg(&lanes).arg(&d);
    // SAFETY: each (row, head) reads y/proj/norm weight inside the checked
    // lengths (the weight only when has_norm = 1, when it holds d_inner
    // values) and writes o [rows x d_inner] (as `T`, the type the kernel
    // named by `T::GATE_FWD` stores), gate_rstd [rows x H]; the group form
    // (lanes > 0) runs only on 16-byte aligned rows (`gate_lanes`).
    unsafe { b.launch(gate_launch(sh, lanes)?) }.during("launch m3_gate_fwd")?;
    Ok(())
}

/// Lanes a (row, head) in the gate kernels' group form, or 0 for the warp
/// form: the group form takes four adjacent values a lane with 16-byte
/// accesses, so it needs `headdim / 4` to be a power of two up to 32 and
/// every row of y, z (at `off_z` in rows of `width`) and the outputs to
/// start 16-byte aligned. `addrs` are the buffers' device addresses.
pub fn gate_lanes(sh: &Mamba3Shape, addrs: &[u64]) -> u32 {
    let g = sh.headdim / 4;
    let fits = sh.headdim.is_multiple_of(4)
        && g.is_power_of_two()
        && g <= 32
        && sh.width.is_multiple_of(4)
        && sh.layout.z.is_multiple_of(4)
        && addrs.iter().all(|a| a.is_multiple_of(16));
    match u32::try_from(g) {
        Ok(g) if fits => g,
        _ => 0,
    }
}

/// The gate kernels' launch: a warp per (row, head), or `lanes` threads per
/// (row, head) in the group form.
pub(crate) fn gate_launch(sh: &Mamba3Shape, lanes: u32) -> Result<LaunchConfig, GpuError> {
    let units = crate::device::checked_elems("mamba3: rows x heads", sh.rows, sh.nheads)?;
    if lanes == 0 {
        warp_blocks(units)
    } else {
        let g = usize::try_from(lanes).map_err(|_| GpuError::SizeOverflow {
            what: "gate lanes",
            value: u128::from(lanes),
            target: "usize",
        })?;
        thread_blocks(crate::device::checked_elems(
            "mamba3: gate threads",
            units,
            g,
        )?)
    }
}

/// Per-row log-sum-exp and loss of the logits against `tokens[:, 1:]`.
pub fn ce_fwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    logits: &DeviceBuffer<f32>,
    tokens: &DeviceBuffer<i32>,
    lse: &mut DeviceBuffer<f32>,
    row_loss: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    need(gpu, "ce: logits", logits, sh.per_row(sh.vocab)?)?;
    need(gpu, "ce: tokens", tokens, sh.batch * (sh.len + 1))?;
    need(gpu, "ce: lse", lse, sh.rows)?;
    need(gpu, "ce: row_loss", row_loss, sh.rows)?;
    let (v, len, rows) = (
        to_u32("vocab", sh.vocab)?,
        to_u32("len", sh.len)?,
        to_u32("rows", sh.rows)?,
    );
    let f = gpu.function(Kernel::M3CeFwdF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(logits.slice()?)
        .arg(tokens.slice()?)
        .arg(lse.slice_mut()?)
        .arg(row_loss.slice_mut()?);
    b.arg(&v).arg(&len).arg(&rows);
    // SAFETY: reads logits [rows x vocab] and tokens [B x (T + 1)], writes
    // lse/row_loss [rows]; all checked. Targets outside the vocabulary are
    // never used as an index.
    unsafe { b.launch(row_blocks(sh.rows)?) }.during("launch m3_ce_fwd_f32")?;
    Ok(())
}

/// `out[0] = mean(x[0 .. n))` in a fixed order (one block).
pub fn mean(
    gpu: &Gpu,
    x: &DeviceBuffer<f32>,
    n: usize,
    out: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    need(gpu, "mean: x", x, n)?;
    need(gpu, "mean: out", out, 1)?;
    let nu = to_u32("mean: n", n)?;
    let f = gpu.function(Kernel::M3MeanF32)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(x.slice()?).arg(&nu).arg(out.slice_mut()?);
    // SAFETY: one block reads x[0 .. n) and writes out[0]; both checked.
    unsafe { b.launch(launch::grid(1)) }.during("launch m3_mean_f32")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_thread_count_matches_the_kernel() {
        let src = include_str!("../../../kernels/mamba3_scan.cu");
        assert!(src.contains(&format!("#define M3_SCAN_THREADS {SCAN_THREADS}")));
        let warp = include_str!("../../../kernels/mamba3_warpscan.cu");
        assert!(warp.contains(&format!("#define M3W_WARPS {WARP_SCAN_WARPS}")));
        assert_eq!(usize::try_from(SCAN_THREADS / 32).ok(), Some(SCAN_WARPS));
    }

    #[test]
    fn default_sized_scans_fit_in_shared_memory() {
        // The official default (N 128, P 64, chunk 64) must fit on sm_90.
        let sh = test_shape(128, 64, 64, 2, 256);
        assert!(
            scan_fwd_smem(&sh) <= MAX_SCAN_SMEM,
            "{}",
            scan_fwd_smem(&sh)
        );
        assert!(
            scan_bwd_smem(&sh) <= MAX_SCAN_SMEM,
            "{}",
            scan_bwd_smem(&sh)
        );
        assert!(check_smem(scan_bwd_smem(&sh)).is_ok());
    }

    #[test]
    fn angle_form_by_shape() {
        // test_shape: d_inner 512, S = N / 4. The state-tracking layer
        // (32 heads of 16 here, B 256, T 161) and parity's batch 64 walk
        // serially; the bench presets' shapes (S: B 16, 8 heads of 64, T
        // 256) and long windows keep the segmented blocks.
        for (batch, len, want) in [
            (256, 161, AngleForm::Serial),
            (64, 161, AngleForm::Serial),
            (256, 4096, AngleForm::Segmented),
        ] {
            let sh = test_shape(64, 16, 64, batch, len);
            assert_eq!(AngleForm::for_shape(&sh), want, "B {batch}, T {len}");
        }
        let preset_s = test_shape(64, 64, 64, 16, 256);
        assert_eq!(AngleForm::for_shape(&preset_s), AngleForm::Segmented);
        let sh = test_shape(64, 16, 64, 256, 161);
        let threads = |f: AngleForm| {
            let c = f.launch(&sh).expect("launch");
            u64::from(c.grid_dim.0) * u64::from(c.block_dim.0)
        };
        assert!(threads(AngleForm::Serial) >= 256 * 32 * 16);
        assert_eq!(
            AngleForm::Segmented
                .launch(&sh)
                .expect("launch")
                .block_dim
                .0,
            ANGLE_THREADS
        );
    }

    #[test]
    fn gate_group_form_needs_power_of_two_quarters_and_alignment() {
        let a = [0x1000_u64, 0x2000];
        assert_eq!(gate_lanes(&test_shape(64, 16, 64, 2, 8), &a), 4);
        assert_eq!(gate_lanes(&test_shape(64, 8, 64, 2, 8), &a), 2);
        assert_eq!(gate_lanes(&test_shape(64, 128, 64, 2, 8), &a), 32);
        assert_eq!(
            gate_lanes(&test_shape(64, 256, 64, 2, 8), &a),
            0,
            "64 lanes a head"
        );
        assert_eq!(
            gate_lanes(&test_shape(64, 16, 64, 2, 8), &[0x1000, 0x2008]),
            0,
            "misaligned"
        );
        let mut sh = test_shape(64, 16, 64, 2, 8);
        sh.width += 1;
        assert_eq!(gate_lanes(&sh, &a), 0, "rows of odd width");
        sh = test_shape(64, 16, 64, 2, 8);
        sh.headdim = 12;
        assert_eq!(gate_lanes(&sh, &a), 0, "three lanes a head");
        let c = gate_launch(&test_shape(64, 16, 64, 2, 8), 4).expect("launch");
        assert!(u64::from(c.grid_dim.0) * u64::from(c.block_dim.0) >= 2 * 8 * 32 * 4);
    }
}
