//! CPU operators in F32. Matrix products go through [`linear`] (weights in their stored type) or
//! [`matmul`] (two F32 operands with arbitrary strides); everything else is element-wise or
//! row-wise and small.

mod linear;
mod ops;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use linear::{linear, matmul, matmul_nn, widen, Par};
pub use ops::{
    rms_norm, rms_norm_rows, rope_rotate_half, scaled_softmax, sigmoid, silu, softmax_in_place,
};
