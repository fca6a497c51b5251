//! CPU operators in F32. Matrix products go through [`linear`] (weights in their stored type) or
//! [`matmul`] (two F32 operands with arbitrary strides); everything else is element-wise or
//! row-wise and small.

mod dot_block;
mod linear;
mod ops;
mod quant_linear;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use linear::{kernel_name, linear, linear_rows, matmul, matmul_nn, widen, Par, WeightRows};
pub use quant_linear::linear_quant;

/// Whether the AVX-512 kernels run (the CPU has them and `MINNOW_CPU_PORTABLE` is unset);
/// otherwise the portable path does the same work.
pub fn uses_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::has_avx512();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

pub use ops::{
    rms_norm, rms_norm_rows, rope_rotate_half, scaled_softmax, sigmoid, silu, softmax_in_place,
};
