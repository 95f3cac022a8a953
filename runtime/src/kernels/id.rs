//! Kernel identities: one [`Kernel`] variant per function the module table
//! ([`MODULES`](super::MODULES)) loads, so a wrapper names its kernel by a
//! value the compiler checks instead of a string. A unit test holds the enum
//! and the table to the same set of names.

use cudarc::driver::CudaFunction;

use crate::device::{Gpu, GpuError};

/// A kernel of [`MODULES`](super::MODULES).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    // kernels/elementwise.cu
    /// `fill_f32`.
    FillF32,
    /// `axpy_f32`.
    AxpyF32,
    /// `mul_f32`.
    MulF32,
    /// `silu_f32`.
    SiluF32,
    /// `add_one_f32`.
    AddOneF32,
    // kernels/reduce.cu
    /// `sumsq_partials_f32`.
    SumsqPartialsF32,
    /// `sum_partials_f32`.
    SumPartialsF32,
    // kernels/convert.cu
    /// `f32_to_bf16`.
    F32ToBf16,
    /// `bf16_to_f32`.
    Bf16ToF32,
    // kernels/mamba3_fwd.cu
    /// `m3_embed_fwd_f32`.
    M3EmbedFwdF32,
    /// `m3_rmsnorm_fwd_f32`.
    M3RmsnormFwdF32,
    /// `m3_prep_f32`.
    M3PrepF32,
    /// `m3_angle_fwd_f32`.
    M3AngleFwdF32,
    /// `m3_angle_fwd_serial_f32`.
    M3AngleFwdSerialF32,
    /// `m3_angle_fixed_f32`.
    M3AngleFixedF32,
    /// `m3_qk_fwd_f32`.
    M3QkFwdF32,
    /// `m3_qk_fwd_bf16qk`.
    M3QkFwdBf16qk,
    /// `m3_qk_fwd_vec_f32`.
    M3QkFwdVecF32,
    /// `m3_qk_fwd_vec_bf16qk`.
    M3QkFwdVecBf16qk,
    /// `m3_gate_fwd_f32`.
    M3GateFwdF32,
    /// `m3_rmsnorm_fwd_bf16`.
    M3RmsnormFwdBf16,
    /// `m3_gate_fwd_bf16`.
    M3GateFwdBf16,
    /// `m3_ce_fwd_f32`.
    M3CeFwdF32,
    /// `m3_mean_f32`.
    M3MeanF32,
    // kernels/mamba3_scan.cu
    /// `m3_scan_fwd_f32`.
    M3ScanFwdF32,
    /// `m3_scan_fwd_bf16qk`.
    M3ScanFwdBf16qk,
    /// `m3_scan_bwd_f32`.
    M3ScanBwdF32,
    /// `m3_scan_bwd_bf16qk`.
    M3ScanBwdBf16qk,
    // kernels/mamba3_warpscan.cu
    /// `m3_wscan_fwd_f32`.
    M3WscanFwdF32,
    /// `m3_wscan_fwd_bf16qk`.
    M3WscanFwdBf16qk,
    /// `m3_wscan_bwd_f32`.
    M3WscanBwdF32,
    /// `m3_wscan_bwd_bf16qk`.
    M3WscanBwdBf16qk,
    // kernels/mamba3_chunk.cu
    /// `m3c_chunk_state`.
    M3cChunkState,
    /// `m3c_state_pass`.
    M3cStatePass,
    /// `m3c_states`.
    M3cStates,
    /// `m3c_states_wide`.
    M3cStatesWide,
    /// `m3c_scan_out`.
    M3cScanOut,
    /// `m3c_scan_bwd`.
    M3cScanBwd,
    // kernels/mamba3_bwd.cu
    /// `m3_ce_bwd_f32`.
    M3CeBwdF32,
    /// `m3_rmsnorm_bwd_f32`.
    M3RmsnormBwdF32,
    /// `m3_gate_bwd_f32`.
    M3GateBwdF32,
    /// `m3_rot_bcnorm_bwd_f32`.
    M3RotBcnormBwdF32,
    /// `m3_rot_bcnorm_bwd_tiled_f32`.
    M3RotBcnormBwdTiledF32,
    /// `m3_angle_bwd_f32`.
    M3AngleBwdF32,
    /// `m3_angle_bwd_serial_f32`.
    M3AngleBwdSerialF32,
    /// `m3_scalar_bwd_f32`.
    M3ScalarBwdF32,
    /// `m3_dtheta_bwd_f32`.
    M3DthetaBwdF32,
    /// `m3_colsum_partials_f32`.
    M3ColsumPartialsF32,
    /// `m3_colsum_partials_f32x4`.
    M3ColsumPartialsF32x4,
    /// `m3_colsum_finish_f32`.
    M3ColsumFinishF32,
    /// `m3_embed_bwd_f32`.
    M3EmbedBwdF32,
    // kernels/mamba3_adamw.cu
    /// `m3_advance_schedule`.
    M3AdvanceSchedule,
    // kernels/optim.cu
    /// `mt_sumsq_partials`.
    MtSumsqPartials,
    /// `mt_adamw`.
    MtAdamw,
    // kernels/train.cu
    /// `tr_weighted_loss_f32`.
    TrWeightedLossF32,
    /// `tr_mask_rows_f32`.
    TrMaskRowsF32,
    /// `tr_zero_range_f32`.
    TrZeroRangeF32,
    /// `tr_schedule`.
    TrSchedule,
    /// `tr_argmax_f32`.
    TrArgmaxF32,
}

impl Kernel {
    /// Every kernel, in module-table order.
    pub const ALL: &[Kernel] = &[
        Kernel::FillF32,
        Kernel::AxpyF32,
        Kernel::MulF32,
        Kernel::SiluF32,
        Kernel::AddOneF32,
        Kernel::SumsqPartialsF32,
        Kernel::SumPartialsF32,
        Kernel::F32ToBf16,
        Kernel::Bf16ToF32,
        Kernel::M3EmbedFwdF32,
        Kernel::M3RmsnormFwdF32,
        Kernel::M3PrepF32,
        Kernel::M3AngleFwdF32,
        Kernel::M3AngleFwdSerialF32,
        Kernel::M3AngleFixedF32,
        Kernel::M3QkFwdF32,
        Kernel::M3QkFwdBf16qk,
        Kernel::M3QkFwdVecF32,
        Kernel::M3QkFwdVecBf16qk,
        Kernel::M3GateFwdF32,
        Kernel::M3RmsnormFwdBf16,
        Kernel::M3GateFwdBf16,
        Kernel::M3CeFwdF32,
        Kernel::M3MeanF32,
        Kernel::M3ScanFwdF32,
        Kernel::M3ScanFwdBf16qk,
        Kernel::M3ScanBwdF32,
        Kernel::M3ScanBwdBf16qk,
        Kernel::M3WscanFwdF32,
        Kernel::M3WscanFwdBf16qk,
        Kernel::M3WscanBwdF32,
        Kernel::M3WscanBwdBf16qk,
        Kernel::M3cChunkState,
        Kernel::M3cStatePass,
        Kernel::M3cStates,
        Kernel::M3cStatesWide,
        Kernel::M3cScanOut,
        Kernel::M3cScanBwd,
        Kernel::M3CeBwdF32,
        Kernel::M3RmsnormBwdF32,
        Kernel::M3GateBwdF32,
        Kernel::M3RotBcnormBwdF32,
        Kernel::M3RotBcnormBwdTiledF32,
        Kernel::M3AngleBwdF32,
        Kernel::M3AngleBwdSerialF32,
        Kernel::M3ScalarBwdF32,
        Kernel::M3DthetaBwdF32,
        Kernel::M3ColsumPartialsF32,
        Kernel::M3ColsumPartialsF32x4,
        Kernel::M3ColsumFinishF32,
        Kernel::M3EmbedBwdF32,
        Kernel::M3AdvanceSchedule,
        Kernel::MtSumsqPartials,
        Kernel::MtAdamw,
        Kernel::TrWeightedLossF32,
        Kernel::TrMaskRowsF32,
        Kernel::TrZeroRangeF32,
        Kernel::TrSchedule,
        Kernel::TrArgmaxF32,
    ];

    /// The `extern "C"` name the module defines it under.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::FillF32 => "fill_f32",
            Kernel::AxpyF32 => "axpy_f32",
            Kernel::MulF32 => "mul_f32",
            Kernel::SiluF32 => "silu_f32",
            Kernel::AddOneF32 => "add_one_f32",
            Kernel::SumsqPartialsF32 => "sumsq_partials_f32",
            Kernel::SumPartialsF32 => "sum_partials_f32",
            Kernel::F32ToBf16 => "f32_to_bf16",
            Kernel::Bf16ToF32 => "bf16_to_f32",
            Kernel::M3EmbedFwdF32 => "m3_embed_fwd_f32",
            Kernel::M3RmsnormFwdF32 => "m3_rmsnorm_fwd_f32",
            Kernel::M3PrepF32 => "m3_prep_f32",
            Kernel::M3AngleFwdF32 => "m3_angle_fwd_f32",
            Kernel::M3AngleFwdSerialF32 => "m3_angle_fwd_serial_f32",
            Kernel::M3AngleFixedF32 => "m3_angle_fixed_f32",
            Kernel::M3QkFwdF32 => "m3_qk_fwd_f32",
            Kernel::M3QkFwdBf16qk => "m3_qk_fwd_bf16qk",
            Kernel::M3QkFwdVecF32 => "m3_qk_fwd_vec_f32",
            Kernel::M3QkFwdVecBf16qk => "m3_qk_fwd_vec_bf16qk",
            Kernel::M3GateFwdF32 => "m3_gate_fwd_f32",
            Kernel::M3RmsnormFwdBf16 => "m3_rmsnorm_fwd_bf16",
            Kernel::M3GateFwdBf16 => "m3_gate_fwd_bf16",
            Kernel::M3CeFwdF32 => "m3_ce_fwd_f32",
            Kernel::M3MeanF32 => "m3_mean_f32",
            Kernel::M3ScanFwdF32 => "m3_scan_fwd_f32",
            Kernel::M3ScanFwdBf16qk => "m3_scan_fwd_bf16qk",
            Kernel::M3ScanBwdF32 => "m3_scan_bwd_f32",
            Kernel::M3ScanBwdBf16qk => "m3_scan_bwd_bf16qk",
            Kernel::M3WscanFwdF32 => "m3_wscan_fwd_f32",
            Kernel::M3WscanFwdBf16qk => "m3_wscan_fwd_bf16qk",
            Kernel::M3WscanBwdF32 => "m3_wscan_bwd_f32",
            Kernel::M3WscanBwdBf16qk => "m3_wscan_bwd_bf16qk",
            Kernel::M3cChunkState => "m3c_chunk_state",
            Kernel::M3cStatePass => "m3c_state_pass",
            Kernel::M3cStates => "m3c_states",
            Kernel::M3cStatesWide => "m3c_states_wide",
            Kernel::M3cScanOut => "m3c_scan_out",
            Kernel::M3cScanBwd => "m3c_scan_bwd",
            Kernel::M3CeBwdF32 => "m3_ce_bwd_f32",
            Kernel::M3RmsnormBwdF32 => "m3_rmsnorm_bwd_f32",
            Kernel::M3GateBwdF32 => "m3_gate_bwd_f32",
            Kernel::M3RotBcnormBwdF32 => "m3_rot_bcnorm_bwd_f32",
            Kernel::M3RotBcnormBwdTiledF32 => "m3_rot_bcnorm_bwd_tiled_f32",
            Kernel::M3AngleBwdF32 => "m3_angle_bwd_f32",
            Kernel::M3AngleBwdSerialF32 => "m3_angle_bwd_serial_f32",
            Kernel::M3ScalarBwdF32 => "m3_scalar_bwd_f32",
            Kernel::M3DthetaBwdF32 => "m3_dtheta_bwd_f32",
            Kernel::M3ColsumPartialsF32 => "m3_colsum_partials_f32",
            Kernel::M3ColsumPartialsF32x4 => "m3_colsum_partials_f32x4",
            Kernel::M3ColsumFinishF32 => "m3_colsum_finish_f32",
            Kernel::M3EmbedBwdF32 => "m3_embed_bwd_f32",
            Kernel::M3AdvanceSchedule => "m3_advance_schedule",
            Kernel::MtSumsqPartials => "mt_sumsq_partials",
            Kernel::MtAdamw => "mt_adamw",
            Kernel::TrWeightedLossF32 => "tr_weighted_loss_f32",
            Kernel::TrMaskRowsF32 => "tr_mask_rows_f32",
            Kernel::TrZeroRangeF32 => "tr_zero_range_f32",
            Kernel::TrSchedule => "tr_schedule",
            Kernel::TrArgmaxF32 => "tr_argmax_f32",
        }
    }
}

impl Gpu {
    /// The loaded function of kernel `k`, for the launch wrappers.
    pub(crate) fn function(&self, k: Kernel) -> Result<&CudaFunction, GpuError> {
        self.kernel(k.name())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_enum_and_the_module_table_name_the_same_kernels() {
        let table: Vec<&str> = super::super::MODULES
            .iter()
            .flat_map(|m| m.functions.iter().copied())
            .collect();
        let listed: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            table.iter().collect::<BTreeSet<_>>(),
            listed.iter().collect::<BTreeSet<_>>(),
            "add a Kernel variant for each new MODULES entry (and drop removed ones)"
        );
        assert_eq!(table.len(), listed.len(), "a kernel listed twice");
    }
}
