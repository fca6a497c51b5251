//! `y = x · Wᵀ` with `W` quantized, straight from its codes: [`linear_rows`] asks a quantized
//! matrix for one block of weight rows at a time, and the matrix decodes exactly those rows
//! from their codes and scales into the product's per-thread F32 buffer
//! ([`QuantMat::dequantize_rows`]). No whole-matrix copy is made, and a row decodes to the same
//! values in any block, so the product keeps [`linear_rows`]' batch invariance: a token's
//! output is bit-identical alone or among any other tokens.

use super::linear::{linear_rows, Par, WeightRows};
use crate::quant::QuantMat;

impl WeightRows for QuantMat<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn widen_rows(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        self.dequantize_rows(r0, r1, dst)
    }
}

/// `out[m, n] = x[m, k] · W[n, k]ᵀ` for a quantized `W` (row-major `out`, overwritten).
pub fn linear_quant(x: &[f32], m: usize, w: &QuantMat<'_>, out: &mut [f32], par: Par) {
    linear_rows(x, m, w, out, par)
}
