//! Launch wrappers for the chunk-parallel tensor-core scan
//! (`kernels/mamba3_chunk.cu`), the bf16 step's scan.
//!
//! The scalar scan (`kernels/mamba3_scan.cu`) gives each (batch row, head)
//! one block that walks every chunk, so a step has only `B x H` blocks and
//! does its chunk products with scalar FMAs from shared memory. Here every
//! (chunk, batch row, head) gets a block, the products run as bf16
//! `mma.sync` with f32 accumulation on operands staged once as bf16 tiles
//! and loaded with `ldmatrix`, and only the `P x N` state recurrence is
//! walked serially (by [`CHUNK_PASS_THREADS`]-thread blocks, one thread per
//! state element). Forward: chunk states, the walk, the outputs. Backward:
//! chunk dL/dS contributions, the reverse walk into `gstates`, the
//! gradients.
//!
//! The kernels need C and P to be multiples of 16 up to 64, N a multiple
//! of 16, and their shared tiles to fit one SM; [`supported`] says whether a
//! shape qualifies, and the model falls back to the scalar scan when it
//! does not.

use cudarc::driver::{LaunchConfig, PushKernelArg as _};

use half::bf16;

use super::Kernel;
use super::mamba3::{MAX_SCAN_SMEM, Mamba3Shape, ScanScalars, check_scan_inputs, need};
use super::mamba3_bwd::ScanGrads;
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, to_u32};

/// Threads of the per-chunk kernels; must equal `M3C_THREADS` in
/// `kernels/mamba3_chunk.cu` (a unit test checks).
pub const CHUNK_THREADS: u32 = 256;

/// Threads of the state walk; must equal `M3C_PASS_THREADS`.
pub const CHUNK_PASS_THREADS: u32 = 256;

/// Threads of the one-kernel state walk `m3c_states` (`M3C_SW_THREADS`):
/// a warp per `JOB_COLS` columns of N.
pub const STATES_THREADS: u32 = 128;

/// Rows of P one `m3c_states` block owns.
const STATES_ROWS: usize = 16;

/// Row padding of every bf16 shared tile, in elements (`M3C_PAD`).
const PAD: usize = 8;

/// Warps of a per-chunk block.
const WARPS: usize = 8;

/// Output columns of one warp job (`M3C_JOB_COLS`).
const JOB_COLS: usize = 32;

/// Largest chunk and head width the kernels keep in registers
/// (`M3C_MAX_TILE`).
const MAX_TILE: usize = 64;

/// Most blocks a launch may put on grid axis y (B x H here).
const MAX_GRID_Y: usize = 65_535;

/// Bytes of a bf16 tile of `rows` rows of `cols` columns (row stride
/// `cols + PAD`).
fn bf16_tile(rows: usize, cols: usize) -> usize {
    2 * rows * (cols + PAD)
}

/// Dynamic shared memory of `m3c_chunk_state`, in bytes: the weighted x
/// rows and the key/query rows (bf16), then `cs` (C + 1) and the weights.
pub fn state_smem(sh: &Mamba3Shape) -> usize {
    let (c, n, p) = (sh.chunk, sh.d_state, sh.headdim);
    bf16_tile(c, p) + bf16_tile(c, n) + 4 * (2 * c + 1)
}

/// Chunks whose weights one `m3c_states` window builds (`M3C_SW_WIN`).
const STATES_WINDOW: usize = 16;

/// Dynamic shared memory of `m3c_states`, in bytes: 16 columns of the
/// weighted x rows and the key/query rows (bf16), then a window of chunk
/// weights and decays (`C + 1` floats a chunk).
pub fn states_smem(sh: &Mamba3Shape) -> usize {
    let (c, n) = (sh.chunk, sh.d_state);
    bf16_tile(c, STATES_ROWS) + bf16_tile(c, n) + 4 * STATES_WINDOW * (c + 1)
}

/// Whether the one-kernel state walk `m3c_states` takes shape `sh` (on top
/// of [`supported`]): its four warps cover N <= 128 in one pass. Otherwise
/// the walk runs as `m3c_chunk_state` + `m3c_state_pass` through an f32
/// working buffer (see [`own_elems`]).
pub fn one_kernel_states(sh: &Mamba3Shape) -> bool {
    let warps = usize::try_from(STATES_THREADS / 32).unwrap_or(0);
    supported(sh) && sh.d_state <= warps * JOB_COLS
}

/// Blocks an SM holds of `m3c_states`, the walk built for at most 80
/// registers (`__launch_bounds__(M3C_SW_THREADS, 6)`).
const STATES_BLOCKS_PER_SM: usize = 6;

/// The build of the one-kernel walk for shape `sh` on `sms` SMs:
/// `m3c_states` (80 registers, six blocks an SM) when its launch then fits
/// one wave, so every serial walk runs at once; else `m3c_states_wide`
/// (no register cap, no spills, fewer instructions), as two waves are
/// needed either way.
pub fn states_kernel(sh: &Mamba3Shape, sms: usize) -> Kernel {
    let blocks = (sh.headdim / STATES_ROWS) * sh.batch * sh.nheads;
    if blocks <= STATES_BLOCKS_PER_SM * sms {
        Kernel::M3cStates
    } else {
        Kernel::M3cStatesWide
    }
}

/// Elements of the f32 working memory the state walk needs: none (one,
/// so the buffer exists) when [`one_kernel_states`] takes the shape.
pub fn own_elems(sh: &Mamba3Shape) -> usize {
    if one_kernel_states(sh) {
        1
    } else {
        state_elems(sh)
    }
}

/// Dynamic shared memory of `m3c_scan_out`, in bytes: q, k~, v, the state
/// and the score tile (bf16), then `cs` (C + 1) and three per-row scalars.
pub fn out_smem(sh: &Mamba3Shape) -> usize {
    let (c, n, p) = (sh.chunk, sh.d_state, sh.headdim);
    2 * bf16_tile(c, n) + bf16_tile(c, p) + bf16_tile(p, n) + bf16_tile(c, c) + 4 * (4 * c + 1)
}

/// Dynamic shared memory of `m3c_scan_bwd`, in bytes: q, k~, v, dy, the
/// state (then its gradient) and two score tiles (bf16), then `cs` (C + 1),
/// five per-row scalars, the per-job partial sums and one float per warp.
pub fn bwd_smem(sh: &Mamba3Shape) -> usize {
    let (c, n, p) = (sh.chunk, sh.d_state, sh.headdim);
    let (tc, tn, tp) = (c / 16, n.div_ceil(JOB_COLS), p.div_ceil(JOB_COLS));
    2 * bf16_tile(c, n)
        + 2 * bf16_tile(c, p)
        + bf16_tile(p, n)
        + 2 * bf16_tile(c, c)
        + 4 * ((c + 1) + 5 * c + 2 * tc * c + 2 * tn * c + tp * c + WARPS)
}

/// Whether the chunk-parallel scan can run shape `sh`: C and P multiples
/// of 16 up to 64 (their tiles live in registers), N a multiple of 16,
/// every kernel's shared tiles within one SM, and B x H within a grid axis.
pub fn supported(sh: &Mamba3Shape) -> bool {
    let tile = |x: usize| x > 0 && x.is_multiple_of(16);
    tile(sh.chunk)
        && tile(sh.headdim)
        && tile(sh.d_state)
        && sh.chunk <= MAX_TILE
        && sh.headdim <= MAX_TILE
        && [state_smem(sh), out_smem(sh), bwd_smem(sh)]
            .iter()
            .all(|&b| b <= MAX_SCAN_SMEM)
        && sh.batch * sh.nheads <= MAX_GRID_Y
}

/// Elements of the per-chunk state buffers: the forward `states`, the
/// backward `gstates` and the f32 working memory `own` of both passes
/// (`[B, H, nchunks, P, N]`).
pub fn state_elems(sh: &Mamba3Shape) -> usize {
    sh.batch * sh.nheads * sh.nchunks * sh.headdim * sh.d_state
}

/// Elements of the D-gradient partials the backward pass writes, one per
/// (batch row, chunk, head): `[B, nchunks, H]`.
pub fn dskip_part_elems(sh: &Mamba3Shape) -> usize {
    sh.batch * sh.nchunks * sh.nheads
}

/// Opts the per-chunk kernels into the most dynamic shared memory a block
/// may use, so every supported shape launches without re-opting (a graph
/// captured for one shape stays valid after another shape ran). Called
/// outside any capture: setting a function attribute is not a stream
/// operation, but keeping it out keeps the captured work to launches.
pub fn prepare(gpu: &Gpu) -> Result<(), GpuError> {
    let bytes = i32::try_from(MAX_SCAN_SMEM).map_err(|_| GpuError::SizeOverflow {
        what: "chunk scan shared memory",
        value: 232_448,
        target: "i32",
    })?;
    for name in [
        Kernel::M3cChunkState,
        Kernel::M3cScanOut,
        Kernel::M3cScanBwd,
    ] {
        gpu.function(name)?
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .during("opt a chunk scan kernel into large shared memory")?;
    }
    Ok(())
}

fn unsupported(sh: &Mamba3Shape) -> GpuError {
    GpuError::BufferTooSmall {
        what: "chunk scan: shared memory per block, or C/P not multiples of 16 up to 64, or N not a multiple of 16",
        need: bwd_smem(sh).max(out_smem(sh)),
        have: MAX_SCAN_SMEM,
    }
}

/// One block per (chunk, batch row x head), `smem` bytes of shared memory.
/// Outside a capture the kernels are (re-)opted in first.
fn per_chunk(gpu: &Gpu, sh: &Mamba3Shape, smem: usize) -> Result<LaunchConfig, GpuError> {
    if !supported(sh) {
        return Err(unsupported(sh));
    }
    if gpu.refuse_in_capture("set a kernel attribute").is_ok() {
        prepare(gpu)?;
    }
    Ok(LaunchConfig {
        grid_dim: (
            to_u32("chunk scan: chunks", sh.nchunks)?.max(1),
            to_u32("chunk scan: batch * heads", sh.batch * sh.nheads)?.max(1),
            1,
        ),
        block_dim: (CHUNK_THREADS, 1, 1),
        shared_mem_bytes: to_u32("chunk scan shared memory", smem)?,
    })
}

fn pass_cfg(sh: &Mamba3Shape) -> Result<LaunchConfig, GpuError> {
    // Four state elements a thread (P * N is a multiple of 256).
    let pn4 = to_u32("chunk scan: P * N / 4", sh.headdim * sh.d_state / 4)?;
    Ok(LaunchConfig {
        grid_dim: (
            pn4.div_ceil(CHUNK_PASS_THREADS).max(1),
            to_u32("chunk scan: batch * heads", sh.batch * sh.nheads)?.max(1),
            1,
        ),
        block_dim: (CHUNK_PASS_THREADS, 1, 1),
        shared_mem_bytes: to_u32("chunk scan: decay table", 4 * sh.nchunks)?,
    })
}

/// Chunk contributions to a state recurrence, written into `own` (f32
/// working memory), then walked in f32 into `out` (bf16, the precision the
/// chunk kernels stage it in; both `[B, H, nchunks, P, N]`): the per-chunk
/// states (`dir` 0) or state gradients (`dir` 1). `x` is `proj` (x columns
/// at `x_off`, forward) or `dy` (backward); `y` is `k` or `q`.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the two kernels read or write"
)]
fn states_and_walk(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    x: (&DeviceBuffer<f32>, usize, usize),
    y: &DeviceBuffer<bf16>,
    scalars: ScanScalars<'_>,
    own: &mut DeviceBuffer<f32>,
    out: &mut DeviceBuffer<bf16>,
    dir: u32,
) -> Result<(), GpuError> {
    let d = sh.dims()?;
    let [dt, adt, lam, _] = scalars;
    let (xb, stride, off) = x;
    let (stride, off) = (
        to_u32("chunk scan: x row stride", stride)?,
        to_u32("chunk scan: x offset", off)?,
    );
    if one_kernel_states(sh) {
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32("chunk scan: P / 16", sh.headdim / STATES_ROWS)?.max(1),
                to_u32("chunk scan: batch * heads", sh.batch * sh.nheads)?.max(1),
                1,
            ),
            block_dim: (STATES_THREADS, 1, 1),
            shared_mem_bytes: to_u32("chunk scan: state walk shared memory", states_smem(sh))?,
        };
        let sms = usize::try_from(gpu.info().sm_count).unwrap_or(1);
        let f = gpu.function(states_kernel(sh, sms))?;
        let mut b = gpu.stream().launch_builder(f);
        b.arg(xb.slice()?).arg(&stride).arg(&off).arg(y.slice()?);
        b.arg(dt.slice()?).arg(adt.slice()?).arg(lam.slice()?);
        b.arg(out.slice_mut()?).arg(&d).arg(&dir);
        // SAFETY: block (j, b*H + h) reads rows [b T, b T + T) of x at
        // columns x_off + h P + 16 j .. + 16 (stride and offset checked by
        // the callers against x's length), the same rows of y [rows, H, N]
        // and of the [rows, H] scalars (lengths checked by the callers),
        // and writes rows 16 j .. 16 j + 16 of every chunk's P x N slice of
        // (b, h) in `out` (checked to hold `state_elems`); N <= 128 and P a
        // multiple of 16 (`one_kernel_states`); shared memory is
        // `states_smem`, under the 48 KB every kernel may use.
        unsafe { b.launch(cfg) }.during("launch m3c_states")?;
        return Ok(());
    }
    let cfg = per_chunk(gpu, sh, state_smem(sh))?;
    let f = gpu.function(Kernel::M3cChunkState)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(xb.slice()?).arg(&stride).arg(&off).arg(y.slice()?);
    b.arg(dt.slice()?).arg(adt.slice()?).arg(lam.slice()?);
    b.arg(own.slice_mut()?).arg(&d).arg(&dir);
    // SAFETY: block (c, b*H + h) reads rows [b T + c C, + C) of x (stride
    // and offset checked by the callers against x's length), of y
    // [rows, H, N] and of the [rows, H] scalars, and writes its own P x N
    // slice of `own` (length checked); shared memory is `state_smem`.
    unsafe { b.launch(cfg) }.during("launch m3c_chunk_state")?;

    let f = gpu.function(Kernel::M3cStatePass)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(adt.slice()?).arg(own.slice()?).arg(out.slice_mut()?);
    b.arg(&d).arg(&dir);
    // SAFETY: thread i of block (x, b*H + h) reads elements 4 (x*256 + i)
    // .. + 4 < P*N of every chunk slice of (b, h) in `own` and writes the
    // same elements of `out` (both checked to hold `state_elems`; P*N is a
    // multiple of 4, so the f32 slices start 16-byte and the bf16 slices
    // 8-byte aligned); adt is [rows, H] (checked); shared memory holds
    // nchunks floats.
    unsafe { b.launch(pass_cfg(sh)?) }.during("launch m3c_state_pass")?;
    Ok(())
}

/// The chunk-parallel scan forward: `y` `[rows, d_inner]` and the state
/// entering every chunk, `states` `[B, H, nchunks, P, N]` in bf16 (the
/// outputs of [`super::mamba3::scan_fwd`], the states rounded as the
/// products read them); `own` (f32, as long as `states`) is working memory.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn scan_fwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    q: &DeviceBuffer<bf16>,
    k: &DeviceBuffer<bf16>,
    proj: &DeviceBuffer<f32>,
    scalars: ScanScalars<'_>,
    dskip: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
    own: &mut DeviceBuffer<f32>,
    states: &mut DeviceBuffer<bf16>,
) -> Result<(), GpuError> {
    check_scan_inputs(gpu, sh, [q, k], proj, scalars, dskip)?;
    need(gpu, "chunk scan: y", y, sh.per_row(sh.d_inner)?)?;
    need(gpu, "chunk scan: own contributions", own, own_elems(sh))?;
    need(gpu, "chunk scan: states", states, state_elems(sh))?;
    states_and_walk(
        gpu,
        sh,
        (proj, sh.width, sh.layout.x),
        k,
        scalars,
        own,
        states,
        0,
    )?;

    let d = sh.dims()?;
    let [dt, adt, lam, qk_raw] = scalars;
    let cfg = per_chunk(gpu, sh, out_smem(sh))?;
    let f = gpu.function(Kernel::M3cScanOut)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(q.slice()?).arg(k.slice()?).arg(proj.slice()?);
    b.arg(dt.slice()?)
        .arg(adt.slice()?)
        .arg(lam.slice()?)
        .arg(qk_raw.slice()?)
        .arg(dskip.slice()?);
    b.arg(states.slice()?).arg(y.slice_mut()?).arg(&d);
    // SAFETY: block (c, b*H + h) reads its chunk's rows of q/k/proj/scalars,
    // D[h] and its state slice, and writes its rows of y's head-h columns;
    // all lengths checked above; shared memory is `out_smem`.
    unsafe { b.launch(cfg) }.during("launch m3c_scan_out")?;
    Ok(())
}

/// The chunk-parallel scan backward. Same outputs as
/// [`super::mamba3_bwd::scan_bwd`] except `dskip_part`, which holds one
/// partial per (batch row, chunk, head) (see [`dskip_part_elems`]);
/// `states` are [`scan_fwd`]'s (bf16); `own` (f32) and `gstates` (bf16),
/// both `[B, H, nchunks, P, N]`, are working memory.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per buffer the kernel reads or writes"
)]
pub fn scan_bwd(
    gpu: &Gpu,
    sh: &Mamba3Shape,
    q: &DeviceBuffer<bf16>,
    k: &DeviceBuffer<bf16>,
    proj: &DeviceBuffer<f32>,
    scalars: ScanScalars<'_>,
    dskip: &DeviceBuffer<f32>,
    states: &DeviceBuffer<bf16>,
    own: &mut DeviceBuffer<f32>,
    gstates: &mut DeviceBuffer<bf16>,
    dy: &DeviceBuffer<f32>,
    out: ScanGrads<'_>,
) -> Result<(), GpuError> {
    check_scan_inputs(gpu, sh, [q, k], proj, scalars, dskip)?;
    need(gpu, "chunk scan bwd: states", states, state_elems(sh))?;
    need(gpu, "chunk scan bwd: own contributions", own, own_elems(sh))?;
    need(gpu, "chunk scan bwd: gstates", gstates, state_elems(sh))?;
    need(gpu, "chunk scan bwd: dy", dy, sh.per_row(sh.d_inner)?)?;
    out.check(gpu, sh, dskip_part_elems(sh))?;
    states_and_walk(gpu, sh, (dy, sh.d_inner, 0), q, scalars, own, gstates, 1)?;

    let d = sh.dims()?;
    let [dt, adt, lam, qk_raw] = scalars;
    let cfg = per_chunk(gpu, sh, bwd_smem(sh))?;
    let f = gpu.function(Kernel::M3cScanBwd)?;
    let mut b = gpu.stream().launch_builder(f);
    b.arg(q.slice()?).arg(k.slice()?).arg(proj.slice()?);
    b.arg(dt.slice()?)
        .arg(adt.slice()?)
        .arg(lam.slice()?)
        .arg(qk_raw.slice()?)
        .arg(dskip.slice()?);
    b.arg(states.slice()?)
        .arg(gstates.slice()?)
        .arg(dy.slice()?);
    b.arg(out.dq.slice_mut()?)
        .arg(out.dk.slice_mut()?)
        .arg(out.dproj.slice_mut()?);
    b.arg(out.dadt.slice_mut()?)
        .arg(out.dscale.slice_mut()?)
        .arg(out.dqkdot.slice_mut()?);
    b.arg(out.dskip_part.slice_mut()?).arg(&d);
    // SAFETY: block (c, b*H + h) reads its chunk's rows of every input and
    // its state slices, and writes its chunk's rows of the outputs and its
    // own dD partial; all lengths checked above; shared memory is `bwd_smem`.
    unsafe { b.launch(cfg) }.during("launch m3c_scan_bwd")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_match_the_kernel() {
        let src = include_str!("../../../kernels/mamba3_chunk.cu");
        assert!(src.contains(&format!("#define M3C_THREADS {CHUNK_THREADS}")));
        assert!(src.contains(&format!("#define M3C_PASS_THREADS {CHUNK_PASS_THREADS}")));
        assert!(src.contains(&format!("#define M3C_PAD {PAD}")));
        assert!(src.contains(&format!("#define M3C_JOB_COLS {JOB_COLS}")));
        assert!(src.contains(&format!("#define M3C_MAX_TILE {MAX_TILE}")));
        assert!(src.contains("#define M3C_SW_THREADS (32 * M3C_SW_WARPS)"));
        assert!(src.contains(&format!("#define M3C_SW_WIN {STATES_WINDOW}")));
        assert!(src.contains(&format!(
            "__launch_bounds__(M3C_SW_THREADS, {STATES_BLOCKS_PER_SM})"
        )));
        assert!(src.contains(&format!("#define M3C_SW_WARPS {}", STATES_THREADS / 32)));
        assert!(src.contains("#define M3C_WARPS (M3C_THREADS / 32)"));
        assert_eq!(usize::try_from(CHUNK_THREADS / 32).ok(), Some(WARPS));
    }

    fn shape(d_state: usize, headdim: usize, chunk: usize) -> Mamba3Shape {
        crate::kernels::mamba3::test_shape(d_state, headdim, chunk, 2, 300)
    }

    #[test]
    fn the_walk_build_follows_the_wave_count() {
        // B 8, H 8, P 64: 256 blocks, one wave on 132 SMs, not on one.
        let m = crate::kernels::mamba3::test_shape(128, 64, 64, 8, 1024);
        let blocks = (m.headdim / 16) * m.batch * m.nheads;
        let want = if blocks <= 6 * 132 {
            Kernel::M3cStates
        } else {
            Kernel::M3cStatesWide
        };
        assert_eq!(states_kernel(&m, 132), want);
        assert_eq!(states_kernel(&m, 1), Kernel::M3cStatesWide);
        assert_eq!(states_kernel(&m, 10_000), Kernel::M3cStates);
    }

    #[test]
    fn the_official_default_shape_fits() {
        // N 128, P 64, chunk 64: the bench's M and L shapes.
        let sh = shape(128, 64, 64);
        assert!(supported(&sh), "bwd {} B", bwd_smem(&sh));
        assert!(bwd_smem(&sh) > out_smem(&sh));
        // Two backward and three forward blocks share an SM (227 KiB).
        assert!(
            2 * (bwd_smem(&sh) + 1024) <= 232_448,
            "bwd {} B",
            bwd_smem(&sh)
        );
        assert!(
            3 * (out_smem(&sh) + 1024) <= 232_448,
            "out {} B",
            out_smem(&sh)
        );
    }

    #[test]
    fn odd_or_oversized_shapes_fall_back() {
        assert!(!supported(&shape(128, 64, 8)));
        assert!(!supported(&shape(40, 64, 64)));
        assert!(!supported(&shape(128, 4, 64)));
        assert!(!supported(&shape(128, 128, 64)));
        assert!(!supported(&shape(128, 64, 128)));
        assert!(!supported(&shape(1024, 64, 64)));
    }

    #[test]
    fn partials_cover_every_chunk() {
        let sh = shape(64, 16, 64);
        assert_eq!(sh.nchunks, 5);
        assert_eq!(dskip_part_elems(&sh), 2 * 5 * sh.nheads);
        assert_eq!(state_elems(&sh), 2 * sh.nheads * 5 * 16 * 64);
    }
}
