//! The shape record every Mamba-3 kernel takes, [`Mamba3Shape`], and its
//! by-value kernel argument [`M3Dims`]: plain numbers (with the kernel-side
//! [`ProjLayout`], [`DecayMap`] and [`AngleSource`]), so the kernels layer needs no model
//! type; the model builds a shape from its configuration
//! (`mamba3::gpu::kernel_shape`).

use cudarc::driver::DeviceRepr;

use crate::device::{GpuError, to_u32};

/// Column offsets of the blocks of the `in_proj` output row (z, x, B, C,
/// dd_dt, dd_A, trap, angles) and its width: plain numbers, so the kernels
/// layer needs no model type (the model fills them from its config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjLayout {
    /// Gate z.
    pub z: usize,
    /// Input x.
    pub x: usize,
    /// B.
    pub b: usize,
    /// C.
    pub c: usize,
    /// dt pre-activation.
    pub dd_dt: usize,
    /// A pre-activation.
    pub dd_a: usize,
    /// Trapezoid gate.
    pub trap: usize,
    /// Rotation angles.
    pub angles: usize,
    /// The row's width.
    pub width: usize,
}

/// The map `f` of `A = -max(f(dd_A), A_floor)` a kernel applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecayMap {
    /// The official code's heavy-tail map.
    #[default]
    HeavyTail,
    /// `softplus`.
    Softplus,
}

/// Where a mixer's rotation angles `phi` come from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum AngleSource {
    /// The cumulative sum of `dt_t theta_t` (Mamba-3's input-dependent
    /// angles; `m3_angle_fwd_f32`).
    #[default]
    Cumsum,
    /// Standard RoPE: `phi_t = (t + 1) base^(-s / S)` whatever the input
    /// (`m3_angle_fixed_f32`); no parameter reaches `phi`.
    Fixed {
        /// The frequency base (10000 in RoPE).
        base: f64,
    },
}

/// Which form of the scalar (f32-product) scan a shape runs; the
/// chunk-parallel tensor-core scan is a separate path, picked by the compute
/// type (`mamba3::gpu::chunk_scan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScanForm {
    /// One block of 1024 threads per (row, head) walking chunks of the
    /// window (`kernels/mamba3_scan.cu`): any shape whose tiles fit shared
    /// memory.
    #[default]
    Block,
    /// One warp per (row, head) walking the window token by token, the
    /// state in registers (`kernels/mamba3_warpscan.cu`): the heads of at
    /// most 1024 state values it was written for ([`ScanForm::warp_takes`]).
    Warp,
}

impl ScanForm {
    /// Whether the warp scan takes heads of `headdim` x `d_state`: the
    /// (P, N) pairs `M3W_DISPATCH` instantiates (a lane keeps P x N / 32
    /// state values, at most 32, in registers).
    pub fn warp_takes(headdim: usize, d_state: usize) -> bool {
        matches!((headdim, d_state), (8 | 16, 32 | 64) | (32, 32))
    }

    /// The faster form at this head shape: the warp scan wherever it
    /// applies (`BENCHMARKS.md`, "Issue 16: a warp per head").
    pub fn for_head(headdim: usize, d_state: usize) -> Self {
        if Self::warp_takes(headdim, d_state) {
            Self::Warp
        } else {
            Self::Block
        }
    }
}

/// Shapes of one model at one (batch, seq_len): everything a kernel needs to
/// index its buffers, in host `usize`s. The model builds it from its
/// configuration (`mamba3::gpu::kernel_shape`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mamba3Shape {
    /// Batch rows B.
    pub batch: usize,
    /// Window length T.
    pub len: usize,
    /// `B * T`.
    pub rows: usize,
    /// Residual width.
    pub d_model: usize,
    /// Padded vocabulary.
    pub vocab: usize,
    /// Heads H.
    pub nheads: usize,
    /// Head dimension P.
    pub headdim: usize,
    /// State size N.
    pub d_state: usize,
    /// B/C groups G.
    pub ngroups: usize,
    /// Rotated pairs S.
    pub angles: usize,
    /// in_proj output width E.
    pub width: usize,
    /// `H * P`.
    pub d_inner: usize,
    /// Scan chunk length C.
    pub chunk: usize,
    /// `ceil(T / C)`.
    pub nchunks: usize,
    /// Column offsets of the in_proj output blocks.
    pub layout: ProjLayout,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// `A_floor`.
    pub a_floor: f32,
    /// The map of `A = -max(f(dd_A), A_floor)`.
    pub a_activation: DecayMap,
    /// Where the rotation angles come from.
    pub angles_from: AngleSource,
    /// The scalar scan's form (a test may pick either where both apply).
    pub scan_form: ScanForm,
}

impl Mamba3Shape {
    /// The kernels' by-value shape argument; every size must fit a `u32`.
    pub fn dims(&self) -> Result<M3Dims, GpuError> {
        let l = &self.layout;
        Ok(M3Dims {
            batch: to_u32("mamba3: batch", self.batch)?,
            len: to_u32("mamba3: seq_len", self.len)?,
            rows: to_u32("mamba3: batch * seq_len", self.rows)?,
            nheads: to_u32("mamba3: nheads", self.nheads)?,
            headdim: to_u32("mamba3: headdim", self.headdim)?,
            d_state: to_u32("mamba3: d_state", self.d_state)?,
            ngroups: to_u32("mamba3: ngroups", self.ngroups)?,
            angles: to_u32("mamba3: angles", self.angles)?,
            width: to_u32("mamba3: d_in_proj", self.width)?,
            d_inner: to_u32("mamba3: d_inner", self.d_inner)?,
            off_z: to_u32("mamba3: in_proj z offset", l.z)?,
            off_x: to_u32("mamba3: in_proj x offset", l.x)?,
            off_b: to_u32("mamba3: in_proj B offset", l.b)?,
            off_c: to_u32("mamba3: in_proj C offset", l.c)?,
            off_dt: to_u32("mamba3: in_proj dt offset", l.dd_dt)?,
            off_a: to_u32("mamba3: in_proj A offset", l.dd_a)?,
            off_trap: to_u32("mamba3: in_proj trap offset", l.trap)?,
            off_ang: to_u32("mamba3: in_proj angles offset", l.angles)?,
            chunk: to_u32("mamba3: chunk_size", self.chunk)?,
            nchunks: to_u32("mamba3: chunks", self.nchunks)?,
            eps: self.eps,
            a_floor: self.a_floor,
            a_act: match self.a_activation {
                DecayMap::HeavyTail => 0,
                DecayMap::Softplus => 1,
            },
        })
    }

    /// The same model and batch over a window of `len` tokens: what a step
    /// captured for a narrower batch runs (its buffers sized for the wider
    /// window hold it, each layout being rows-major and shrinking with `len`).
    pub fn with_len(&self, len: usize) -> Self {
        Self {
            len,
            rows: self.batch.saturating_mul(len),
            nchunks: len.div_ceil(self.chunk.max(1)),
            ..*self
        }
    }

    /// `rows * k`, checked.
    pub fn per_row(&self, k: usize) -> Result<usize, GpuError> {
        crate::device::checked_elems("mamba3: rows x width", self.rows, k)
    }
}

/// The `M3Dims` struct of `kernels/mamba3_common.cuh`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[expect(
    missing_docs,
    reason = "the fields mirror `M3Dims` of kernels/mamba3_common.cuh one for one"
)]
pub struct M3Dims {
    pub batch: u32,
    pub len: u32,
    pub rows: u32,
    pub nheads: u32,
    pub headdim: u32,
    pub d_state: u32,
    pub ngroups: u32,
    pub angles: u32,
    pub width: u32,
    pub d_inner: u32,
    pub off_z: u32,
    pub off_x: u32,
    pub off_b: u32,
    pub off_c: u32,
    pub off_dt: u32,
    pub off_a: u32,
    pub off_trap: u32,
    pub off_ang: u32,
    pub chunk: u32,
    pub nchunks: u32,
    pub eps: f32,
    pub a_floor: f32,
    pub a_act: u32,
}

// SAFETY: `#[repr(C)]` with only 4-byte `u32`/`f32` fields (no padding, no
// pointers), field for field the `M3Dims` struct of mamba3_common.cuh, so its
// bytes are exactly what the kernels read.
unsafe impl DeviceRepr for M3Dims {}

/// A shape with the given state size, head width and chunk (d_model 256,
/// expand 2, one group, half the state dims rotating), for the shared-memory
/// and partition tests of the kernel wrappers.
#[cfg(test)]
pub(crate) fn test_shape(
    d_state: usize,
    headdim: usize,
    chunk: usize,
    batch: usize,
    len: usize,
) -> Mamba3Shape {
    let (d_model, d_inner) = (256, 512);
    let nheads = d_inner / headdim;
    let angles = d_state / 4;
    let x = d_inner;
    let b = x + d_inner;
    let c = b + d_state;
    let dd_dt = c + d_state;
    let dd_a = dd_dt + nheads;
    let trap = dd_a + nheads;
    let ang = trap + nheads;
    let width = ang + angles;
    Mamba3Shape {
        batch,
        len,
        rows: batch * len,
        d_model,
        vocab: 256,
        nheads,
        headdim,
        d_state,
        ngroups: 1,
        angles,
        width,
        d_inner,
        chunk,
        nchunks: len.div_ceil(chunk),
        layout: ProjLayout {
            z: 0,
            x,
            b,
            c,
            dd_dt,
            dd_a,
            trap,
            angles: ang,
            width,
        },
        eps: 1e-5,
        a_floor: 1e-4,
        a_activation: DecayMap::HeavyTail,
        angles_from: AngleSource::Cumsum,
        scan_form: ScanForm::for_head(headdim, d_state),
    }
}

#[cfg(test)]
mod tests {
    use super::ScanForm;

    /// `warp_takes` must name exactly the (P, N) pairs `M3W_DISPATCH`
    /// instantiates: a pair the kernel lacks would launch and do nothing.
    #[test]
    fn the_warp_form_takes_exactly_the_heads_its_kernel_instantiates() {
        let src = include_str!("../../../kernels/mamba3_warpscan.cu");
        let mut taken = 0;
        for p in [4, 8, 16, 32, 64] {
            for n in [16, 32, 64, 128] {
                let listed = src.contains(&format!("P_ == {p} && N_ == {n})"));
                assert_eq!(ScanForm::warp_takes(p, n), listed, "P {p} N {n}");
                let form = ScanForm::for_head(p, n);
                assert_eq!(form == ScanForm::Warp, listed, "P {p} N {n}");
                taken += usize::from(listed);
            }
        }
        assert_eq!(taken, 5);
    }
}
