//! Activations the forward pass keeps for the backward pass, and the
//! backward pass's own working memory, all allocated once per
//! (batch, seq_len) so the ops never allocate (they run under capture).
//!
//! Layouts (row = b * T + t): per-token `[rows, width]`; per-head scalars
//! `[rows, H]`; queries/keys `[rows, H, N]`; angles `[rows, H, S]`; scan
//! chunk-entry states `[B, H, nchunks, P, N]`.
//!
//! Buffers only one scan path uses (the f32 states of the scalar scan, the
//! bf16 states of the chunk scan, per-layer or shared q/k) are allocated
//! with one element on the other path, so the struct stays one type.
//!
//! The three activations that feed a GEMM (`u`, `o`, `normed`) are stored in
//! the step's compute type: the buffer type parameter `B` is
//! `DeviceBuffer<f32>` for the f32 step ([`Acts`]) and `DeviceBuffer<bf16>`
//! for the mixed step ([`MixedActs`]); everything else is f32 in both.

use crate::DevicePtrs;
use half::bf16;

use crate::device::{DeviceBuffer, Element, Gpu, GpuError};
use crate::kernels::mamba3::{Mamba3Shape, ScanForm};
use crate::kernels::mamba3_bwd::colsum_partials;
use crate::kernels::mamba3_chunk as kc;
use crate::kernels::precision::Compute;
use crate::mamba3::Mamba3Config;

use super::Mamba3GpuError;

fn buf(gpu: &Gpu, n: Result<usize, GpuError>) -> Result<DeviceBuffer<f32>, Mamba3GpuError> {
    Ok(gpu.alloc_zeros::<f32>(n?)?)
}

fn buf_of<T: Element>(
    gpu: &Gpu,
    n: Result<usize, GpuError>,
) -> Result<DeviceBuffer<T>, Mamba3GpuError> {
    Ok(gpu.alloc_zeros::<T>(n?)?)
}

/// Checks the config and a non-empty window, and returns the shape.
pub(crate) fn shape_of(
    cfg: &Mamba3Config,
    batch: usize,
    seq_len: usize,
) -> Result<Mamba3Shape, Mamba3GpuError> {
    cfg.validate()?;
    if batch == 0 || seq_len == 0 {
        return Err(Mamba3GpuError::Shape {
            what: "batch and seq_len must be at least 1; batch * seq_len",
            expected: 1,
            found: 0,
        });
    }
    Ok(super::kernel_shape(cfg, batch, seq_len))
}

/// One block's forward activations; `B` is the storage of the GEMM operands.
#[derive(Debug, DevicePtrs)]
pub struct LayerActs<B = DeviceBuffer<f32>> {
    /// Residual stream entering the block `[rows, d_model]`.
    pub h_in: DeviceBuffer<f32>,
    /// Reciprocal RMS of the pre-norm `[rows]`.
    pub rstd: DeviceBuffer<f32>,
    /// Mixer input (pre-normed residual, in_proj operand) `[rows, d_model]`.
    pub u: B,
    /// `in_proj` output `[rows, E]`.
    pub proj: DeviceBuffer<f32>,
    /// Reciprocal RMS of each B group `[rows, G]`.
    pub rstd_b: DeviceBuffer<f32>,
    /// Reciprocal RMS of each C group `[rows, G]`.
    pub rstd_c: DeviceBuffer<f32>,
    /// `pi tanh(angles)` `[rows, S]`.
    pub theta: DeviceBuffer<f32>,
    /// `dt` `[rows, H]`.
    pub dt: DeviceBuffer<f32>,
    /// `A dt` `[rows, H]`.
    pub adt: DeviceBuffer<f32>,
    /// `sigmoid(trap)` `[rows, H]`.
    pub lam: DeviceBuffer<f32>,
    /// Wrapped cumulative angles `[rows, H, S]`.
    pub phi: DeviceBuffer<f32>,
    /// Unrotated `Ĉ · B̂` `[rows, H]`.
    pub qk_raw: DeviceBuffer<f32>,
    /// Rotated queries `[rows, H, N]`, kept for the backward pass by the
    /// mixed step (see `keeps_qk`); one element otherwise.
    pub q: B,
    /// Rotated keys `[rows, H, N]`, kept like `q`.
    pub k: B,
    /// Scalar scan: state entering each chunk `[B, H, nchunks, P, N]`
    /// (one element on the chunk scan's path).
    pub states: DeviceBuffer<f32>,
    /// Chunk scan: the same states in bf16, the precision its products
    /// read them in (one element on the scalar scan's path).
    pub states16: DeviceBuffer<bf16>,
    /// Scan output before the gate `[rows, d_inner]`.
    pub y: DeviceBuffer<f32>,
    /// Per-head reciprocal RMS of y `[rows, H]` (written with `is_outproj_norm`).
    pub gate_rstd: DeviceBuffer<f32>,
    /// Gated output fed to `out_proj` `[rows, d_inner]`.
    pub o: B,
}

/// Whether the step computing in `T` runs the chunk-parallel scan at shape
/// `sh`: bf16 q/k, a shape [`kc::supported`] takes, and a head too small
/// for the warp form of the scalar scan, which is faster than the chunk
/// scan at the heads it takes (`BENCHMARKS.md`, "Issue 16: a warp per
/// head").
pub fn chunk_scan<T: Compute>(sh: &Mamba3Shape) -> bool {
    T::TENSOR_CORE_SCAN && tensor_core_scan(sh)
}

/// Whether a step whose compute type allows the chunk scan runs it at `sh`
/// (`chunk_scan` without the type; the bench's memory estimate asks).
pub fn tensor_core_scan(sh: &Mamba3Shape) -> bool {
    kc::supported(sh) && sh.scan_form != ScanForm::Warp
}

/// The scan a layer runs, with the q/k it reads: the chunk-parallel
/// tensor-core scan (bf16 q/k, a shape [`kc::supported`] takes) or the
/// scalar scan. The forward and backward passes both take it from
/// [`scan_operands`], so they cannot pick different scans, and the pick is
/// the one [`chunk_scan`] sized the activations for.
pub enum ScanOperands<'a, T: Element> {
    /// The chunk scan's bf16 q and k.
    Chunk(&'a DeviceBuffer<bf16>, &'a DeviceBuffer<bf16>),
    /// The scalar scan's q and k, in the compute type.
    Scalar(&'a DeviceBuffer<T>, &'a DeviceBuffer<T>),
}

/// Which scan a step computing in `T` runs at `sh`, over its q and k.
pub fn scan_operands<'a, T: Compute>(
    sh: &Mamba3Shape,
    q: &'a DeviceBuffer<T>,
    k: &'a DeviceBuffer<T>,
) -> ScanOperands<'a, T> {
    match (T::as_bf16(q), T::as_bf16(k)) {
        (Some(q16), Some(k16)) if chunk_scan::<T>(sh) => ScanOperands::Chunk(q16, k16),
        _ => ScanOperands::Scalar(q, k),
    }
}

/// Whether the step computing in `T` keeps every layer's rotated q/k from
/// the forward pass instead of rebuilding them in the backward pass: the
/// mixed step does (bf16 q/k cost 2 x rows x H x N x 2 bytes a layer and
/// save one q/k kernel a layer); the f32 step, whose q/k would be twice
/// that, rebuilds them.
pub fn keeps_qk<T: Compute>() -> bool {
    T::TENSOR_CORE_SCAN
}

impl<T: Compute> LayerActs<DeviceBuffer<T>> {
    fn new(gpu: &Gpu, sh: &Mamba3Shape) -> Result<Self, Mamba3GpuError> {
        let states = kc::state_elems(sh);
        let chunk = chunk_scan::<T>(sh);
        let qk = if keeps_qk::<T>() {
            sh.per_row(sh.nheads * sh.d_state)?
        } else {
            1
        };
        Ok(Self {
            h_in: buf(gpu, sh.per_row(sh.d_model))?,
            rstd: buf(gpu, Ok(sh.rows))?,
            u: buf_of(gpu, sh.per_row(sh.d_model))?,
            proj: buf(gpu, sh.per_row(sh.width))?,
            rstd_b: buf(gpu, sh.per_row(sh.ngroups))?,
            rstd_c: buf(gpu, sh.per_row(sh.ngroups))?,
            theta: buf(gpu, sh.per_row(sh.angles))?,
            dt: buf(gpu, sh.per_row(sh.nheads))?,
            adt: buf(gpu, sh.per_row(sh.nheads))?,
            lam: buf(gpu, sh.per_row(sh.nheads))?,
            phi: buf(gpu, sh.per_row(sh.nheads * sh.angles))?,
            qk_raw: buf(gpu, sh.per_row(sh.nheads))?,
            q: buf_of(gpu, Ok(qk))?,
            k: buf_of(gpu, Ok(qk))?,
            states: buf(gpu, Ok(if chunk { 1 } else { states }))?,
            states16: buf_of(gpu, Ok(if chunk { states } else { 1 }))?,
            y: buf(gpu, sh.per_row(sh.d_inner))?,
            gate_rstd: buf(gpu, sh.per_row(sh.nheads))?,
            o: buf_of(gpu, sh.per_row(sh.d_inner))?,
        })
    }
}

/// Everything the forward pass keeps, for one (batch, seq_len); `B` is the
/// storage of the GEMM operands (f32 by default).
#[derive(Debug, DevicePtrs)]
pub struct Acts<B = DeviceBuffer<f32>> {
    /// The shape the ops run at: `capacity`, or a narrower window
    /// ([`Self::set_len`]).
    #[ptrs(skip)]
    pub shape: Mamba3Shape,
    /// The shape every buffer is sized for.
    #[ptrs(skip)]
    pub capacity: Mamba3Shape,
    /// One entry per block.
    pub layers: Vec<LayerActs<B>>,
    /// Rotated queries of the block being run `[rows, H, N]`, shared by
    /// all blocks, for the f32 step: its backward pass recomputes each
    /// block's from `proj` and `phi` (one cheap kernel) instead of keeping
    /// 2 x n_layer x rows x H x N f32 values, the largest activation of a
    /// wide model. One element when the layers keep their own
    /// (`keeps_qk`).
    pub q: B,
    /// Rotated keys of the block being run `[rows, H, N]`, shared like `q`.
    pub k: B,
    /// The chunk scan's f32 working memory: each chunk's own state
    /// contribution before the walk `[B, H, nchunks, P, N]`, for shapes the
    /// one-kernel walk does not take (one element otherwise, see
    /// [`kc::own_elems`]).
    pub chunk_own: DeviceBuffer<f32>,
    /// Residual stream after the last block `[rows, d_model]`.
    pub h_final: DeviceBuffer<f32>,
    /// Reciprocal RMS of `norm_f` `[rows]`.
    pub rstd_f: DeviceBuffer<f32>,
    /// `norm_f` output (LM head operand) `[rows, d_model]`.
    pub normed: B,
    /// Logits `[rows, V]` (padded vocabulary).
    pub logits: DeviceBuffer<f32>,
    /// Per-row log-sum-exp `[rows]`.
    pub lse: DeviceBuffer<f32>,
    /// Per-row cross-entropy `[rows]`.
    pub row_loss: DeviceBuffer<f32>,
    /// Where a sequence starts inside a row `[rows]` (1, else 0): the
    /// engine writes it with each packed batch, as it writes the tokens;
    /// the scan reads it only once [`Self::set_packed`] is on.
    pub resets: DeviceBuffer<f32>,
    /// Whether the ops read `resets` ([`Self::set_packed`]).
    #[ptrs(skip)]
    pub packed: bool,
}

/// The mixed step's activations: bf16 GEMM operands, f32 otherwise.
pub type MixedActs = Acts<DeviceBuffer<bf16>>;

impl<T: Compute> Acts<DeviceBuffer<T>> {
    /// Activations for `batch x seq_len` windows of a model with config `cfg`.
    pub fn new(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError> {
        let sh = shape_of(cfg, batch, seq_len)?;
        crate::kernels::mamba3::scan_prepare(gpu, &sh)?;
        if kc::supported(&sh) {
            kc::prepare(gpu)?;
        }
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            layers.push(LayerActs::new(gpu, &sh)?);
        }
        let qk = if keeps_qk::<T>() {
            1
        } else {
            sh.per_row(sh.nheads * sh.d_state)?
        };
        let own = if chunk_scan::<T>(&sh) {
            kc::own_elems(&sh)
        } else {
            1
        };
        Ok(Self {
            shape: sh,
            capacity: sh,
            layers,
            q: buf_of(gpu, Ok(qk))?,
            k: buf_of(gpu, Ok(qk))?,
            chunk_own: buf(gpu, Ok(own))?,
            h_final: buf(gpu, sh.per_row(sh.d_model))?,
            rstd_f: buf(gpu, Ok(sh.rows))?,
            normed: buf_of(gpu, sh.per_row(sh.d_model))?,
            logits: buf(gpu, sh.per_row(sh.vocab))?,
            lse: buf(gpu, Ok(sh.rows))?,
            row_loss: buf(gpu, Ok(sh.rows))?,
            resets: buf(gpu, Ok(sh.rows))?,
            packed: false,
        })
    }

    /// `(batch, seq_len)` these activations are sized for.
    pub fn batch_len(&self) -> (usize, usize) {
        (self.capacity.batch, self.capacity.len)
    }

    /// Makes the ops that follow read [`Self::resets`]: rows that pack
    /// several sequences, each from a zero state. Only the warp form of the
    /// scan takes resets; at a head shape that runs another form this is
    /// refused, and nothing reads the flags.
    pub fn set_packed(&mut self, on: bool) -> Result<(), Mamba3GpuError> {
        if on && self.capacity.scan_form != ScanForm::Warp {
            return Err(Mamba3GpuError::Packed {
                headdim: self.capacity.headdim,
                d_state: self.capacity.d_state,
            });
        }
        self.packed = on;
        Ok(())
    }

    /// The sequence starts the scan reads: `Some` once packed.
    pub fn sequence_starts(&self) -> Option<&DeviceBuffer<f32>> {
        self.packed.then_some(&self.resets)
    }

    /// Runs the ops that follow over windows of `len` tokens (at most the
    /// capacity's), in the same buffers: a step captured after it replays
    /// batches of that width.
    pub fn set_len(&mut self, len: usize) -> Result<(), Mamba3GpuError> {
        self.shape = narrowed(&self.capacity, len)?;
        Ok(())
    }
}

/// `capacity` over `len` tokens, refused beyond it or at 0.
fn narrowed(capacity: &Mamba3Shape, len: usize) -> Result<Mamba3Shape, Mamba3GpuError> {
    if len == 0 || len > capacity.len {
        return Err(Mamba3GpuError::Shape {
            what: "window length of a narrower step (1..=the buffers' seq_len)",
            expected: capacity.len,
            found: len,
        });
    }
    Ok(capacity.with_len(len))
}

/// Intermediate gradients of the backward pass (reused by every layer).
#[derive(Debug, DevicePtrs)]
pub struct BackwardWork {
    /// The shape the backward pass runs at (see [`Acts::shape`]).
    #[ptrs(skip)]
    pub shape: Mamba3Shape,
    /// The shape every buffer is sized for.
    #[ptrs(skip)]
    pub capacity: Mamba3Shape,
    /// dL/d residual stream `[rows, d_model]`.
    pub dh: DeviceBuffer<f32>,
    /// dL/d (normed input): `norm_f` output, then each mixer input `[rows, d_model]`.
    pub dnorm: DeviceBuffer<f32>,
    /// dL/d logits `[rows, V]`.
    pub dlogits: DeviceBuffer<f32>,
    /// dL/d gated output `[rows, d_inner]`.
    pub d_o: DeviceBuffer<f32>,
    /// dL/d scan output `[rows, d_inner]`.
    pub dy: DeviceBuffer<f32>,
    /// dL/d in_proj output `[rows, E]`.
    pub dproj: DeviceBuffer<f32>,
    /// The block's rotated queries, recomputed from its `proj` and `phi`
    /// (the forward pass keeps only the last block's) `[rows, H, N]`, for
    /// the f32 step; one element for a step that keeps its q/k
    /// (`keeps_qk`) or computes in bf16.
    pub q: DeviceBuffer<f32>,
    /// The block's rotated keys, recomputed like `q` `[rows, H, N]`.
    pub k: DeviceBuffer<f32>,
    /// `q` in bf16, for a bf16 step that rebuilds its q/k (`Compute::pick`
    /// chooses the pair a step uses); one element otherwise: the mixed step
    /// keeps its q/k.
    pub q16: DeviceBuffer<bf16>,
    /// `k` in bf16, like `q16`.
    pub k16: DeviceBuffer<bf16>,
    /// The recomputation's `Ĉ · B̂` (equal to the kept one) `[rows, H]`.
    pub qk_raw: DeviceBuffer<f32>,
    /// dL/dq, then dL/d(biased query) `[rows, H, N]`.
    pub dq: DeviceBuffer<f32>,
    /// dL/dk, then dL/d(biased key) `[rows, H, N]`.
    pub dk: DeviceBuffer<f32>,
    /// dL/d(A dt) `[rows, H]`.
    pub dadt: DeviceBuffer<f32>,
    /// dL/d scale `[rows, H]`.
    pub dscale: DeviceBuffer<f32>,
    /// dL/d(D + gamma q̂·k̂) `[rows, H]`.
    pub dqkdot: DeviceBuffer<f32>,
    /// dL/dphi, then its reverse cumsum `[rows, H, S]`.
    pub dphi: DeviceBuffer<f32>,
    /// dL/dD partials: per (batch row, head) `[B, H]` from the scalar scan,
    /// per (batch row, chunk, head) `[B, nchunks, H]` from the chunk scan.
    pub dskip_part: DeviceBuffer<f32>,
    /// The chunk scan's f32 working memory (each chunk's own dL/dS
    /// contribution before the reverse walk) `[B, H, nchunks, P, N]` (one
    /// element when the step does not run the chunk scan or the shape does
    /// not need it, see [`kc::own_elems`]).
    pub chunk_own: DeviceBuffer<f32>,
    /// dL/d(state leaving each chunk) in bf16, the chunk scan's backward
    /// working memory `[B, H, nchunks, P, N]` (one element when the step
    /// does not run the chunk scan).
    pub gstates: DeviceBuffer<bf16>,
    /// Per-row weight-gradient shares `[rows, max(d_model, d_inner, G N)]`.
    pub contrib: DeviceBuffer<f32>,
    /// Per-row C-norm weight shares `[rows, G N]`.
    pub contrib_c: DeviceBuffer<f32>,
    /// Column-sum partials.
    pub partials: DeviceBuffer<f32>,
}

impl BackwardWork {
    /// Working memory for `batch x seq_len` windows of a step computing in
    /// `T` (which q/k pair it rebuilds, if any).
    pub fn new<T: Compute>(
        gpu: &Gpu,
        cfg: &Mamba3Config,
        batch: usize,
        seq_len: usize,
    ) -> Result<Self, Mamba3GpuError> {
        let sh = shape_of(cfg, batch, seq_len)?;
        let rebuilt = |used: bool| -> Result<usize, Mamba3GpuError> {
            if used && !keeps_qk::<T>() {
                Ok(sh.per_row(sh.nheads * sh.d_state)?)
            } else {
                Ok(1)
            }
        };
        let in_f32 = std::mem::size_of::<T>() == std::mem::size_of::<f32>();
        let (qk32, qk16) = (rebuilt(in_f32)?, rebuilt(!in_f32)?);
        let gn = sh.ngroups * sh.d_state;
        let widest = sh.d_model.max(sh.d_inner).max(gn);
        let hn = sh.nheads * sh.d_state;
        // The chunk scan's backward working memory, only for a step that
        // runs it (`chunk_scan`: not the f32 step, not the warp scan's heads).
        let chunk = chunk_scan::<T>(&sh);
        let chunk_states = if chunk { kc::state_elems(&sh) } else { 1 };
        // The largest column sum: rows (or rows * G) by the widest column set.
        let partials = [
            colsum_partials(sh.rows, sh.d_model),
            colsum_partials(sh.rows, sh.d_inner),
            colsum_partials(sh.rows, hn),
            colsum_partials(sh.rows, sh.nheads),
            colsum_partials(sh.rows * sh.ngroups, sh.d_state),
            colsum_partials(sh.batch * sh.nchunks, sh.nheads),
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        Ok(Self {
            shape: sh,
            capacity: sh,
            dh: buf(gpu, sh.per_row(sh.d_model))?,
            dnorm: buf(gpu, sh.per_row(sh.d_model))?,
            dlogits: buf(gpu, sh.per_row(sh.vocab))?,
            d_o: buf(gpu, sh.per_row(sh.d_inner))?,
            dy: buf(gpu, sh.per_row(sh.d_inner))?,
            dproj: buf(gpu, sh.per_row(sh.width))?,
            q: buf(gpu, Ok(qk32))?,
            k: buf(gpu, Ok(qk32))?,
            q16: buf_of(gpu, Ok(qk16))?,
            k16: buf_of(gpu, Ok(qk16))?,
            qk_raw: buf(gpu, sh.per_row(sh.nheads))?,
            dq: buf(gpu, sh.per_row(hn))?,
            dk: buf(gpu, sh.per_row(hn))?,
            dadt: buf(gpu, sh.per_row(sh.nheads))?,
            dscale: buf(gpu, sh.per_row(sh.nheads))?,
            dqkdot: buf(gpu, sh.per_row(sh.nheads))?,
            dphi: buf(gpu, sh.per_row(sh.nheads * sh.angles))?,
            dskip_part: buf(gpu, Ok(kc::dskip_part_elems(&sh)))?,
            chunk_own: buf(gpu, Ok(if chunk { kc::own_elems(&sh) } else { 1 }))?,
            gstates: buf_of(gpu, Ok(chunk_states))?,
            contrib: buf(gpu, sh.per_row(widest))?,
            contrib_c: buf(gpu, sh.per_row(gn))?,
            partials: buf(gpu, Ok(partials))?,
        })
    }

    /// The backward pass's side of [`Acts::set_len`].
    pub fn set_len(&mut self, len: usize) -> Result<(), Mamba3GpuError> {
        self.shape = narrowed(&self.capacity, len)?;
        Ok(())
    }
}
