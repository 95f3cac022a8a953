//! The parameter lists of user kernels, as Rust types: a handle
//! `UserKernel<(In<f32>, Out<f32>, u32)>` launches a kernel declared
//! `(const float* x, float* y, unsigned n)` and takes
//! `(&DeviceBuffer<f32>, &mut DeviceBuffer<f32>, u32)` at each launch.
//!
//! | Rust parameter | CUDA parameter | launch argument |
//! |---|---|---|
//! | [`In<T>`] | `const T*` | `&DeviceBuffer<T>` |
//! | [`Out<T>`] | `T*` | `&mut DeviceBuffer<T>` |
//! | [`Scratch<T>`] | `T*` | [`ScratchArg<T>`], from [`ScratchGuard::arg`] |
//! | `f32`, `f64`, `i32`, `u32`, `i64`, `u64`, `bf16` | `float`, `double`, `int`, `unsigned`, `long long`, `unsigned long long`, `__nv_bfloat16` | the value |
//!
//! The traits are sealed: the list of kinds is what the launch knows how to
//! pass safely. Each kind lowers to one fixed-size value; the byte
//! sizes of a list are checked against the compiled kernel's own when the
//! context loads it, so a list of the wrong length or with a parameter of
//! the wrong size is refused before it can launch. (Two kinds of one size,
//! `f32` for `int` say, are the kernel's own contract, as in C.)

use std::marker::PhantomData;

use half::bf16;

use crate::device::{DeviceBuffer, Element, Gpu, GpuError, ScratchGuard};
use sealed::Raw;

/// A `const T*` parameter: the launch passes a `&DeviceBuffer<T>`.
#[derive(Debug)]
pub struct In<T>(PhantomData<fn() -> T>);

/// A `T*` parameter the kernel writes: the launch passes a
/// `&mut DeviceBuffer<T>`, so nothing else holds that buffer meanwhile.
#[derive(Debug)]
pub struct Out<T>(PhantomData<fn() -> T>);

/// A `T*` parameter into a context scratch area: the launch passes a
/// [`ScratchArg`] borrowed from a [`ScratchGuard`].
#[derive(Debug)]
pub struct Scratch<T>(PhantomData<fn() -> T>);

/// A scratch area as a launch argument. Made from a mutable borrow of its
/// guard, so the area is passed to one parameter of one launch at a time.
pub struct ScratchArg<'a, T> {
    guard: &'a ScratchGuard<'a, T>,
}

impl<T> std::fmt::Debug for ScratchArg<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchArg").finish_non_exhaustive()
    }
}

impl<T: Element> ScratchGuard<'_, T> {
    /// This scratch view as a [`Scratch<T>`] kernel argument.
    pub fn arg(&mut self) -> ScratchArg<'_, T> {
        ScratchArg { guard: self }
    }
}

pub(crate) mod sealed {
    use half::bf16;

    use super::{Gpu, GpuError};

    /// One kernel parameter's value, exactly as the kernel receives it.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Raw {
        /// A device address.
        Ptr(u64),
        /// `float`.
        F32(f32),
        /// `double`.
        F64(f64),
        /// `int`.
        I32(i32),
        /// `unsigned`.
        U32(u32),
        /// `long long`.
        I64(i64),
        /// `unsigned long long`.
        U64(u64),
        /// `__nv_bfloat16`.
        Bf16(bf16),
    }

    /// How one parameter kind is passed; see the [module docs](super).
    pub trait Param {
        /// What a launch takes for it.
        type Arg<'a>;
        /// Its size in the kernel's parameter space.
        const BYTES: usize;
        /// Checks the argument against the launching context and lowers it.
        fn lower(gpu: &Gpu, arg: Self::Arg<'_>) -> Result<Raw, GpuError>;
    }

    /// A whole parameter list (a tuple of [`Param`]s).
    pub trait Params {
        /// What a launch takes: the tuple of each parameter's argument.
        type Args<'a>;
        /// The byte size of each parameter, in order.
        const BYTES: &'static [usize];
        /// Lowers every argument, in order, into `out`.
        fn lower(gpu: &Gpu, args: Self::Args<'_>, out: &mut Vec<Raw>) -> Result<(), GpuError>;
    }
}

/// One parameter kind of a user kernel (see the [module docs](self));
/// sealed.
pub trait KernelParam: sealed::Param {}

/// A user kernel's parameter list: a tuple of up to 12 [`KernelParam`]s;
/// sealed.
pub trait KernelParams: sealed::Params {}

/// A pointer parameter's size: every device address is 8 bytes.
const PTR: usize = std::mem::size_of::<u64>();

impl<T: Element> sealed::Param for In<T> {
    type Arg<'a> = &'a DeviceBuffer<T>;
    const BYTES: usize = PTR;
    fn lower(gpu: &Gpu, arg: Self::Arg<'_>) -> Result<Raw, GpuError> {
        gpu.check_owned("user kernel argument (In)", arg)?;
        Ok(Raw::Ptr(arg.device_addr()))
    }
}
impl<T: Element> KernelParam for In<T> {}

impl<T: Element> sealed::Param for Out<T> {
    type Arg<'a> = &'a mut DeviceBuffer<T>;
    const BYTES: usize = PTR;
    fn lower(gpu: &Gpu, arg: Self::Arg<'_>) -> Result<Raw, GpuError> {
        gpu.check_owned("user kernel argument (Out)", arg)?;
        Ok(Raw::Ptr(arg.device_addr()))
    }
}
impl<T: Element> KernelParam for Out<T> {}

impl<T: Element> sealed::Param for Scratch<T> {
    type Arg<'a> = ScratchArg<'a, T>;
    const BYTES: usize = PTR;
    fn lower(gpu: &Gpu, arg: Self::Arg<'_>) -> Result<Raw, GpuError> {
        if !arg.guard.belongs_to(gpu) {
            return Err(GpuError::ForeignBuffer {
                what: "user kernel argument (Scratch)",
            });
        }
        Ok(Raw::Ptr(arg.guard.device_addr()?))
    }
}
impl<T: Element> KernelParam for Scratch<T> {}

macro_rules! scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl sealed::Param for $t {
            type Arg<'a> = $t;
            const BYTES: usize = std::mem::size_of::<$t>();
            fn lower(_gpu: &Gpu, arg: $t) -> Result<Raw, GpuError> {
                Ok(Raw::$v(arg))
            }
        }
        impl KernelParam for $t {}
    )*};
}
scalar!(f32 => F32, f64 => F64, i32 => I32, u32 => U32, i64 => I64, u64 => U64, bf16 => Bf16);

macro_rules! params {
    ($($p:ident),*) => {
        impl<$($p: KernelParam),*> sealed::Params for ($($p,)*) {
            type Args<'a> = ($(<$p as sealed::Param>::Arg<'a>,)*);
            const BYTES: &'static [usize] = &[$(<$p as sealed::Param>::BYTES),*];
            #[allow(
                non_snake_case,
                unused_variables,
                reason = "each argument is named after its parameter's type; the empty list uses neither gpu nor out (allow, not expect: not every arity triggers both)"
            )]
            fn lower(gpu: &Gpu, args: Self::Args<'_>, out: &mut Vec<Raw>) -> Result<(), GpuError> {
                let ($($p,)*) = args;
                $(out.push(<$p as sealed::Param>::lower(gpu, $p)?);)*
                Ok(())
            }
        }
        impl<$($p: KernelParam),*> KernelParams for ($($p,)*) {}
    };
}
params!();
params!(A);
params!(A, B);
params!(A, B, C);
params!(A, B, C, D);
params!(A, B, C, D, E);
params!(A, B, C, D, E, F);
params!(A, B, C, D, E, F, G);
params!(A, B, C, D, E, F, G, H);
params!(A, B, C, D, E, F, G, H, I);
params!(A, B, C, D, E, F, G, H, I, J);
params!(A, B, C, D, E, F, G, H, I, J, K);
params!(A, B, C, D, E, F, G, H, I, J, K, L);

#[cfg(test)]
mod tests {
    use super::sealed::Params;
    use super::*;

    #[test]
    fn sizes_are_what_the_kernel_parameter_space_holds() {
        assert_eq!(
            <(In<f32>, Out<bf16>, Scratch<f64>) as Params>::BYTES,
            &[8, 8, 8]
        );
        assert_eq!(
            <(f32, f64, i32, u32, i64, u64, bf16) as Params>::BYTES,
            &[4, 8, 4, 4, 8, 8, 2]
        );
        assert_eq!(<() as Params>::BYTES, &[] as &[usize]);
        let twelve = <(
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            In<i32>,
        ) as Params>::BYTES;
        assert_eq!(twelve.len(), 12);
    }
}
