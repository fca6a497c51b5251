//! The batch-invariant dense GEMM: a planned cuBLASLt algorithm where one sums in minnow's
//! order, else the expert GEMM's tiles of `kernels/moe.cu` over one weight matrix.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::expert_gemm::{grouped_gemm_smem_bytes, grouped_gemm_tiled};

/// The batch-invariant dense GEMM `Y[m, n] = X[m, k] · W[n, k]ᵀ` (BF16, F32 accumulation, row
/// pitch `n`): the expert GEMM's tiles over one weight matrix, so every output is the same
/// fixed-order sum whatever `m` (the tile height is chosen for speed only; it never changes an
/// output's bits). Shapes the tiled kernels refuse run `dense_gemm_any`.
pub fn dense_gemm(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let tuning = super::super::tuning::tuning();
    // A planned cuBLASLt algorithm gives the same bits as the kernels below (checked when it
    // was planned: `blaslt::plan_dense_gemms`), faster at this row count.
    if let Some(lt) = gpu
        .blas_lt_if_created()
        .filter(|_| m >= tuning.dense_lt_min_rows)
    {
        if let Some(algo) = lt.planned(m, n, k) {
            return lt.gemm_bf16(gpu, &algo, x, w, y, m, n, k);
        }
    }
    own_dense_gemm(gpu, x, w, y, m, n, k)
}

/// [`dense_gemm`] with minnow's own tiles only (the reference a cuBLASLt plan must equal).
pub fn own_dense_gemm(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !grouped_gemm_tiled(n, k) {
        let cfg = LaunchConfig::new((n.div_ceil(64) as u32, m.div_ceil(16) as u32, 1), 64, 0);
        return kernels::moe::dense_gemm_any(gpu, cfg, x, w, y, m as i32, n as i32, k as i32);
    }
    let tuning = super::super::tuning::tuning();
    // 16-row tiles stream the weights with the most CTAs in flight; the lm_head (a vocabulary
    // of rows) fills the GPU with 64-row tiles anyway and then reads each weight panel once.
    use kernels::moe::{dense_gemm_m128, dense_gemm_m16, dense_gemm_m64, DenseGemm};
    let (kernel, rows, cols, threads, smem): (DenseGemm, _, _, _, _) =
        if m <= tuning.dense16_rows && n < 32768 {
            (dense_gemm_m16, 16, 64, 128, grouped_gemm_smem_bytes(16, 3))
        } else if m < tuning.dense128_rows || !n.is_multiple_of(128) {
            (dense_gemm_m64, 64, 64, 128, grouped_gemm_smem_bytes(64, 3))
        } else {
            (dense_gemm_m128, 128, 128, 256, 3 * 256 * 72 * 2)
        };
    let cfg = LaunchConfig::new(
        (m.div_ceil(rows) as u32, (n / cols) as u32, 1),
        threads,
        smem as u32,
    );
    kernel(gpu, cfg, x, w, y, m as i32, n as i32, k as i32)
}
