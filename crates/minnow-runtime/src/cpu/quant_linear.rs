//! `y = x · Wᵀ` with `W` quantized: the matrix is dequantized into an F32 scratch buffer of the
//! calling thread, then multiplied by [`linear`]. Callers hand one selected expert's matrix at a
//! time, so the widened copy is one expert projection (a few MiB), never the whole model.

use std::cell::Cell;

use super::linear::{linear, Par};
use crate::dtype::MatRef;
use crate::quant::QuantMat;

thread_local! {
    /// The dequantized matrix of this thread's current product, kept to avoid a page-faulting
    /// allocation per expert.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `out[m, n] = x[m, k] · W[n, k]ᵀ` for a quantized `W` (row-major `out`, overwritten).
pub fn linear_quant(x: &[f32], m: usize, w: &QuantMat<'_>, out: &mut [f32], par: Par) {
    // Taken out of the cell (not borrowed) so that a nested product that rayon runs on this
    // thread while `linear` waits finds an empty buffer instead of a live borrow.
    let mut scratch = SCRATCH.take();
    scratch.clear();
    scratch.resize(w.rows * w.cols, 0.0);
    w.dequantize(&mut scratch);
    linear(x, m, MatRef::from_f32(w.rows, w.cols, &scratch), out, par);
    SCRATCH.set(scratch);
}
