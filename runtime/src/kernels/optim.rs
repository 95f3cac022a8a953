//! Launch wrappers for `kernels/optim.cu`: the multi-tensor kernels of the
//! optimizer. [`sumsq_partials`] writes the global gradient norm's
//! sum-of-squares partials of every gradient tensor, and [`adamw`] runs
//! AdamW over every parameter tensor (refreshing bf16 compute copies in the
//! same pass), each in one launch per [`NORM_MAX`] / [`ADAM_MAX`] tensors
//! instead of one launch per tensor.
//!
//! The tensor list is the kernel's by-value argument ([`MtNormList`],
//! [`MtAdamList`], `#[repr(C)]` mirrors of the `.cu` structs): device
//! addresses, lengths, and each tensor's first work unit. Nothing is kept on
//! the device between calls, so there is no pointer table that could go
//! stale when a step's buffer is replaced, and a captured graph bakes in
//! exactly the addresses of the parameter, gradient and moment tensors,
//! which the step's generated guards compare before every replay (a moved
//! tensor refuses the replay; a re-capture builds the lists afresh).
//!
//! Work is split into units of [`NORM_CHUNK`] / [`ADAM_CHUNK`] elements; which
//! thread touches which element depends only on the tensor lengths, so the
//! norm partials are bit-identical run to run and eager vs replayed.

use cudarc::driver::{DeviceRepr, PushKernelArg as _};
use half::bf16;

use super::Kernel;
use super::launch::{self, MAX_ELEMENTWISE_BLOCKS};
use super::mamba3::need;
use crate::device::error::During as _;
use crate::device::{DeviceBuffer, Gpu, GpuError, to_u32};

/// Most tensors in one [`MtNormList`] (`MT_NORM_MAX`).
pub const NORM_MAX: usize = 192;
/// Elements per norm unit, hence per partial (`MT_NORM_CHUNK`).
pub const NORM_CHUNK: usize = 65_536;
/// Most tensors in one [`MtAdamList`] (`MT_ADAM_MAX`).
pub const ADAM_MAX: usize = 64;
/// Elements per AdamW unit (`MT_ADAM_CHUNK`).
pub const ADAM_CHUNK: usize = 16_384;

/// The `MtNormList` struct of `kernels/optim.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MtNormList {
    /// Gradient addresses (`const float*`).
    pub grad: [u64; NORM_MAX],
    /// Address of the partials (`double*`).
    pub partials: u64,
    /// Lengths.
    pub n: [u32; NORM_MAX],
    /// First unit of each tensor; `first[count]` is the list's unit count.
    pub first: [u32; NORM_MAX + 1],
    /// Tensors in the list.
    pub count: u32,
    /// Partial index of the list's unit 0.
    pub partial_offset: u32,
    /// Keeps the size a multiple of 8 with no implicit padding.
    pub pad: u32,
}

// SAFETY: `#[repr(C)]`, field for field the `MtNormList` of kernels/optim.cu
// (u64 arrays and u64 first, then u32s, no padding: the test below checks the
// size and every offset against the numbers the .cu file asserts), and only
// integers, so its bytes are exactly what the kernel reads.
unsafe impl DeviceRepr for MtNormList {}

/// The `MtAdamList` struct of `kernels/optim.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MtAdamList {
    /// Parameter addresses (`float*`).
    pub param: [u64; ADAM_MAX],
    /// Gradient addresses (`const float*`).
    pub grad: [u64; ADAM_MAX],
    /// First-moment addresses.
    pub m: [u64; ADAM_MAX],
    /// Second-moment addresses.
    pub v: [u64; ADAM_MAX],
    /// bf16 compute-copy addresses, 0 where a tensor has none.
    pub copy: [u64; ADAM_MAX],
    /// Address of AdamW's 8 per-step scalars.
    pub derived: u64,
    /// Address of the `[clip coef, skip flag, grad scale]` gate, or 0.
    pub gate: u64,
    /// Lengths.
    pub n: [u32; ADAM_MAX],
    /// First unit of each tensor; `first[count]` is the list's unit count.
    pub first: [u32; ADAM_MAX + 1],
    /// 1 where the tensor decays.
    pub decay: [u32; ADAM_MAX],
    /// Tensors in the list.
    pub count: u32,
}

// SAFETY: `#[repr(C)]`, field for field the `MtAdamList` of kernels/optim.cu
// (every u64 ahead of every u32, no padding: the test below checks the size
// and offsets against the numbers the .cu file asserts), integers only.
unsafe impl DeviceRepr for MtAdamList {}

/// Norm units (and partials) of an `n`-element tensor.
pub fn norm_units(n: usize) -> usize {
    n.div_ceil(NORM_CHUNK)
}

/// Partials [`sumsq_partials`] writes for tensors of these lengths.
pub fn norm_partials(lens: impl IntoIterator<Item = usize>) -> usize {
    lens.into_iter().map(norm_units).sum()
}

/// `first[0..=lens.len()]`: the running unit count, in `u32`.
fn unit_starts(
    what: &'static str,
    lens: &[usize],
    chunk: usize,
    first: &mut [u32],
) -> Result<u32, GpuError> {
    let mut total = 0usize;
    for (slot, &n) in first.iter_mut().zip(lens) {
        *slot = to_u32(what, total)?;
        total = total.saturating_add(n.div_ceil(chunk));
    }
    let units = to_u32(what, total)?;
    if let Some(slot) = first.get_mut(lens.len()) {
        *slot = units;
    }
    Ok(units)
}

/// A grid of `units` blocks, capped (the kernels stride over units).
fn unit_grid(units: u32) -> cudarc::driver::LaunchConfig {
    launch::grid(units.clamp(1, MAX_ELEMENTWISE_BLOCKS))
}

/// Writes the sum of squares (in double) of every [`NORM_CHUNK`]-element
/// unit of every tensor of `grads`, in list order, to `partials[0 ..]`, and
/// returns how many ([`norm_partials`] of the lengths). One launch per
/// [`NORM_MAX`] tensors.
pub fn sumsq_partials(
    gpu: &Gpu,
    grads: &[&DeviceBuffer<f32>],
    partials: &mut DeviceBuffer<f64>,
) -> Result<usize, GpuError> {
    let total = norm_partials(grads.iter().map(|g| g.len()));
    need(gpu, "sumsq_partials: partials", partials, total)?;
    to_u32("sumsq_partials: partials", total)?;
    let f = gpu.function(Kernel::MtSumsqPartials)?;
    let mut offset = 0usize;
    for part in grads.chunks(NORM_MAX) {
        let mut list = MtNormList {
            grad: [0; NORM_MAX],
            partials: partials.device_addr(),
            n: [0; NORM_MAX],
            first: [0; NORM_MAX + 1],
            count: to_u32("sumsq_partials: tensors", part.len())?,
            partial_offset: to_u32("sumsq_partials: partials", offset)?,
            pad: 0,
        };
        let mut lens = [0usize; NORM_MAX];
        for (i, g) in part.iter().enumerate() {
            gpu.check_owned("sumsq_partials: gradient", g)?;
            list.grad[i] = g.device_addr();
            list.n[i] = to_u32("sumsq_partials: tensor length", g.len())?;
            lens[i] = g.len();
        }
        let units = unit_starts(
            "sumsq_partials: units",
            &lens[..part.len()],
            NORM_CHUNK,
            &mut list.first,
        )?;
        if units > 0 {
            let mut b = gpu.stream().launch_builder(f);
            b.arg(&list);
            // SAFETY: every address in `list` is a live allocation of this
            // context (check_owned) borrowed for the call: the kernel reads
            // grad[t][0 .. n[t]) with n[t] its length, and writes
            // partials[offset .. offset + units), inside the `total` checked
            // above; `partials` is borrowed mutably, so nothing else
            // references it.
            unsafe { b.launch(unit_grid(units)) }.during("launch mt_sumsq_partials")?;
        }
        offset += usize::try_from(units).map_err(|_| GpuError::SizeOverflow {
            what: "sumsq_partials: units",
            value: u128::from(units),
            target: "usize",
        })?;
    }
    Ok(offset)
}

/// One tensor of a multi-tensor AdamW update.
#[derive(Debug)]
pub struct AdamTensor<'a> {
    /// The f32 parameter (master), updated.
    pub param: &'a mut DeviceBuffer<f32>,
    /// Its gradient.
    pub grad: &'a DeviceBuffer<f32>,
    /// First moment, updated.
    pub m: &'a mut DeviceBuffer<f32>,
    /// Second moment, updated.
    pub v: &'a mut DeviceBuffer<f32>,
    /// bf16 compute copy, rewritten from the updated parameter.
    pub copy: Option<&'a mut DeviceBuffer<bf16>>,
    /// Decoupled weight decay.
    pub decay: bool,
}

/// AdamW (torch semantics, `optim::AdamW`'s arithmetic in f32) on every
/// tensor, with `derived`'s per-step scalars (layout in
/// `kernels/mamba3_adamw.cu`). With a `gate` (`[clip coef, skip flag, grad
/// scale]`, `kernels/train.cu`) each gradient is multiplied by the scale,
/// then by the coefficient when that is below 1, and nothing is written when
/// the skip flag is set. Each bf16 copy gets its updated parameter rounded to
/// nearest even. One launch per [`ADAM_MAX`] tensors.
pub fn adamw(
    gpu: &Gpu,
    tensors: &mut [AdamTensor<'_>],
    derived: &DeviceBuffer<f32>,
    gate: Option<&DeviceBuffer<f32>>,
) -> Result<(), GpuError> {
    need(gpu, "adamw: scalars", derived, 8)?;
    if let Some(g) = gate {
        need(gpu, "adamw: gate", g, 3)?;
    }
    for t in tensors.iter() {
        let n = t.param.len();
        gpu.check_owned("adamw: param", t.param)?;
        need(gpu, "adamw: grad", t.grad, n)?;
        need(gpu, "adamw: m", t.m, n)?;
        need(gpu, "adamw: v", t.v, n)?;
        if let Some(c) = t.copy.as_deref() {
            need(gpu, "adamw: bf16 copy", c, n)?;
        }
        to_u32("adamw: tensor length", n)?;
    }
    let f = gpu.function(Kernel::MtAdamw)?;
    for part in tensors.chunks_mut(ADAM_MAX) {
        let mut list = MtAdamList {
            param: [0; ADAM_MAX],
            grad: [0; ADAM_MAX],
            m: [0; ADAM_MAX],
            v: [0; ADAM_MAX],
            copy: [0; ADAM_MAX],
            derived: derived.device_addr(),
            gate: gate.map_or(0, DeviceBuffer::device_addr),
            n: [0; ADAM_MAX],
            first: [0; ADAM_MAX + 1],
            decay: [0; ADAM_MAX],
            count: to_u32("adamw: tensors", part.len())?,
        };
        let mut lens = [0usize; ADAM_MAX];
        for (i, t) in part.iter().enumerate() {
            list.param[i] = t.param.device_addr();
            list.grad[i] = t.grad.device_addr();
            list.m[i] = t.m.device_addr();
            list.v[i] = t.v.device_addr();
            list.copy[i] = t.copy.as_deref().map_or(0, DeviceBuffer::device_addr);
            list.n[i] = to_u32("adamw: tensor length", t.param.len())?;
            list.decay[i] = u32::from(t.decay);
            lens[i] = t.param.len();
        }
        let units = unit_starts(
            "adamw: units",
            &lens[..part.len()],
            ADAM_CHUNK,
            &mut list.first,
        )?;
        if units == 0 {
            continue;
        }
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&list);
        // SAFETY: every address in `list` is a live allocation of this
        // context (check_owned / need above) borrowed for the call, the
        // written ones (param, m, v, copy) through `&mut`, so no two alias
        // and nothing else references them. The kernel touches elements
        // [0 .. n[t]) of tensor t, and param, grad, m, v and the copy all
        // hold at least n[t] (checked); it reads derived[0..8) and
        // gate[0..3) (checked).
        unsafe { b.launch(unit_grid(units)) }.during("launch mt_adamw")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The value of `#define name value` in kernels/optim.cu.
    fn define(name: &str) -> usize {
        let src = include_str!("../../../kernels/optim.cu");
        let prefix = format!("#define {name} ");
        let line = src
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name} not defined in kernels/optim.cu"));
        line.trim()
            .trim_end_matches('u')
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn list_layouts_match_the_kernel_source() {
        assert_eq!(define("MT_NORM_MAX"), NORM_MAX);
        assert_eq!(define("MT_NORM_CHUNK"), NORM_CHUNK);
        assert_eq!(define("MT_ADAM_MAX"), ADAM_MAX);
        assert_eq!(define("MT_ADAM_CHUNK"), ADAM_CHUNK);
        assert_eq!(define("MT_NORM_SIZE"), size_of::<MtNormList>());
        for (name, off) in [
            ("MT_NORM_OFF_PARTIALS", offset_of!(MtNormList, partials)),
            ("MT_NORM_OFF_N", offset_of!(MtNormList, n)),
            ("MT_NORM_OFF_FIRST", offset_of!(MtNormList, first)),
            ("MT_NORM_OFF_COUNT", offset_of!(MtNormList, count)),
            (
                "MT_NORM_OFF_PARTIAL_OFFSET",
                offset_of!(MtNormList, partial_offset),
            ),
        ] {
            assert_eq!(define(name), off, "{name}");
        }
        assert_eq!(define("MT_ADAM_SIZE"), size_of::<MtAdamList>());
        for (name, off) in [
            ("MT_ADAM_OFF_GRAD", offset_of!(MtAdamList, grad)),
            ("MT_ADAM_OFF_M", offset_of!(MtAdamList, m)),
            ("MT_ADAM_OFF_V", offset_of!(MtAdamList, v)),
            ("MT_ADAM_OFF_COPY", offset_of!(MtAdamList, copy)),
            ("MT_ADAM_OFF_DERIVED", offset_of!(MtAdamList, derived)),
            ("MT_ADAM_OFF_GATE", offset_of!(MtAdamList, gate)),
            ("MT_ADAM_OFF_N", offset_of!(MtAdamList, n)),
            ("MT_ADAM_OFF_FIRST", offset_of!(MtAdamList, first)),
            ("MT_ADAM_OFF_DECAY", offset_of!(MtAdamList, decay)),
            ("MT_ADAM_OFF_COUNT", offset_of!(MtAdamList, count)),
        ] {
            assert_eq!(define(name), off, "{name}");
        }
    }

    #[test]
    fn lists_fit_the_portable_kernel_parameter_limit() {
        // 4 KB is what every driver accepts for a launch's parameters.
        assert!(size_of::<MtNormList>() <= 4096);
        assert!(size_of::<MtAdamList>() <= 4096);
    }

    #[test]
    fn units_depend_only_on_the_lengths() {
        let mut first = [7u32; 5];
        let units = unit_starts("t", &[0, 1, 16_384, 16_385], ADAM_CHUNK, &mut first);
        assert_eq!(units.ok(), Some(4));
        assert_eq!(first, [0, 0, 1, 2, 4]);
        assert_eq!(norm_units(0), 0);
        assert_eq!(norm_units(1), 1);
        assert_eq!(norm_units(NORM_CHUNK), 1);
        assert_eq!(norm_units(NORM_CHUNK + 1), 2);
        assert_eq!(norm_partials([1, NORM_CHUNK * 3, 5]), 5);
    }
}
