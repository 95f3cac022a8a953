//! [`Precision`]: the one precision enum of the crate.
//!
//! Steps declare theirs in the spec (`precision: F32`), the training engine
//! and the bench pick a step by it, `eval` picks the CPU reference's float
//! type or the GPU step by it, and `init` the dtype of the weights it
//! writes. Each command accepts the subset it can run (see its `--help`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a model computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float64: the CPU reference.
    F64,
    /// float32 everywhere.
    F32,
    /// bf16 mixed precision: bf16 GEMM operands, f32 master weights, f32
    /// scan, norms and reductions (GPU only).
    Bf16,
}

impl Precision {
    /// Every precision, widest first.
    pub const ALL: [Precision; 3] = [Precision::F64, Precision::F32, Precision::Bf16];

    /// The name flags, files and reports use: `f64`, `f32`, `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F64 => "f64",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }

    /// Bytes of one GEMM operand element (8, 4, 2).
    pub const fn operand_bytes(self) -> u8 {
        match self {
            Self::F64 => 8,
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision name that is none of `f64`, `f32`, `bf16`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}` (expected f64, f32 or bf16)")]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPrecision(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse_and_serde() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{p}\""));
            assert_eq!(serde_json::from_str::<Precision>(&json).unwrap(), p);
        }
        assert!("fp16".parse::<Precision>().is_err());
    }
}
