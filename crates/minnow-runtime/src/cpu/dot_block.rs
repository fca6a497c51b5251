//! The unit of work of the F32 products: one block of outputs and the operands it reads. The
//! product (`linear.rs`) cuts its work into blocks and the kernels (`x86.rs`, the portable one in
//! `linear.rs`) compute them.

/// One task of `linear`: `out[t, j] = Σ_q x[t, q] · w[j, q]` for `x_rows × w_rows` outputs,
/// all operands F32 and row-major (`w` and `x` rows of `k`, `out` rows at `out_stride`).
pub(crate) struct DotBlock {
    pub w: *const f32,
    pub w_rows: usize,
    pub x: *const f32,
    pub x_rows: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}
