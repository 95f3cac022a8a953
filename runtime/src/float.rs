//! The scalar trait the host-side math is generic over: the CPU Mamba-3
//! model and the host AdamW. It sits at the bottom of the crate (it imports
//! nothing of it), so the model and the optimizer share it without either
//! importing the other.
//!
//! Only `f32` and `f64` implement it: `f64` is the oracle every other
//! implementation is checked against, `f32` is the quick path for tiny models.
//! The trait is deliberately small (the handful of transcendental functions the
//! Mamba-3 math uses), so it needs no external numeric crate.

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use safetensors::Dtype;

/// A floating-point scalar the host-side math (CPU model, host AdamW)
/// computes in.
pub trait Float:
    Copy
    + Send
    + Sync
    + Debug
    + Display
    + Default
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// The safetensors dtype this scalar is stored as.
    const DTYPE: Dtype;
    /// Short name used in messages and CLI flags (`"f32"`, `"f64"`).
    const NAME: &'static str;

    /// Rounds an `f64` to this type (exact for `f64`).
    fn from_f64(v: f64) -> Self;
    /// Widens to `f64` (exact for both implementors).
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// `ln(1 + self)`, accurate near zero.
    fn ln_1p(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Largest integer value not above `self`.
    fn floor(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// The larger of two values.
    fn max(self, other: Self) -> Self;
    /// Appends the little-endian bytes of `self` (checkpoint serialization).
    fn write_le(self, out: &mut Vec<u8>);

    /// A small count as a float: sizes here are far below 2^53, so the
    /// conversion is exact in `f64` (a size never goes through `as` elsewhere).
    fn from_count(n: usize) -> Self {
        #[expect(
            clippy::cast_precision_loss,
            reason = "exact: model dimensions and token counts stay far below 2^53"
        )]
        let v = n as f64;
        Self::from_f64(v)
    }
}

macro_rules! impl_float {
    ($t:ty, $dtype:expr, $name:literal) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const DTYPE: Dtype = $dtype;
            const NAME: &'static str = $name;

            fn from_f64(v: f64) -> Self {
                // `allow`, not `expect`: the f64 instance casts to itself.
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "rounding to the nearest representable value is the intent"
                )]
                let r = v as $t;
                r
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}

impl_float!(f32, Dtype::F32, "f32");
impl_float!(f64, Dtype::F64, "f64");
