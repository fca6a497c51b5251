//! Dense products: the GEMM of the mode (batch-invariant or cuBLAS) and the SwiGLU MLP built on it.

use minnow_runtime::cuda::ops;
use minnow_runtime::cuda::{CudaResult, Gpu};

use super::weights::DenseMlp;
use super::workspace::Workspace;

/// `Y[m, n] = X[m, k] . W[n, k]^T` (row pitch n): in batch-invariant mode minnow's fixed-order
/// kernel or the cuBLASLt algorithm planned for the row count, which sums in the same order
/// (a row's outputs never depend on `m`); else plain cuBLAS (which picks its algorithm by `m`).
pub(super) fn dense_gemm(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    if minnow_runtime::cuda::tuning::tuning().invariant {
        ops::dense_gemm(gpu, x, w, y, m, n, k)
    } else {
        gpu.blas().gemm_bf16(x, w, y, m, n, k, n)
    }
}

/// `out = down(BF16(silu(gate(x))) * up(x))` with gate and up stacked in one GEMM.
pub(super) fn queue_swiglu(
    gpu: &Gpu,
    ws: &Workspace,
    mlp: &DenseMlp,
    x: u64,
    out: u64,
    t: usize,
    d: usize,
) -> CudaResult<()> {
    queue_swiglu_at(
        gpu,
        ws,
        mlp.gate_up.ptr(),
        mlp.down.ptr(),
        mlp.width,
        x,
        out,
        t,
        d,
    )
}

/// [`queue_swiglu`] over weights given by address (`gate_up [2 w, d]`, `down [d, w]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_swiglu_at(
    gpu: &Gpu,
    ws: &Workspace,
    gate_up: u64,
    down: u64,
    w: usize,
    x: u64,
    out: u64,
    t: usize,
    d: usize,
) -> CudaResult<()> {
    dense_gemm(gpu, x, gate_up, ws.gu.ptr(), t, 2 * w, d)?;
    ops::silu_mul(gpu, ws.gu.ptr(), ws.act.ptr(), t, w)?;
    dense_gemm(gpu, ws.act.ptr(), down, out, t, d, w)
}
