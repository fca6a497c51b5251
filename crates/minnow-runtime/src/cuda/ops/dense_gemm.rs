//! The batch-invariant dense GEMM: a planned cuBLASLt algorithm where one sums in minnow's
//! order, else the expert GEMM's tiles of `kernels/moe.cu` over one weight matrix.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::expert_gemm::{grouped_gemm_smem_bytes, grouped_gemm_tiled};
use super::unsupported::unsupported;

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
    if m <= tuning.dense_skinny_rows && skinny_dense_fits(m, n, k, tuning.dense_skinny_warps) {
        return skinny_dense_gemm(gpu, x, w, y, m, n, k, tuning.dense_skinny_warps);
    }
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

/// Rows the streaming kernel of `kernels/dense.cu` holds.
pub const SKINNY_DENSE_ROWS: usize = 32;

/// Whether [`skinny_dense_gemm`] takes this shape with `warps` warps per CTA (1, 2 or 4): at most
/// [`SKINNY_DENSE_ROWS`] rows, whole CTAs of 16 `warps` output columns, and K in whole stages of
/// 64 columns.
pub fn skinny_dense_fits(m: usize, n: usize, k: usize, warps: usize) -> bool {
    matches!(warps, 1 | 2 | 4)
        && (1..=SKINNY_DENSE_ROWS).contains(&m)
        && n.is_multiple_of(16 * warps)
        && k.is_multiple_of(64)
        && k > 0
}

/// The dense GEMM of [`dense_gemm`] for few rows on the kernel that streams the weights (each
/// warp 16 output columns over all of K, 6 or 8 stages of 64 columns in flight, the first stages'
/// weights copied before the kernel waits for its predecessor): the same bits as
/// [`own_dense_gemm`]. Check [`skinny_dense_fits`] first.
#[allow(clippy::too_many_arguments)]
pub fn skinny_dense_gemm(
    gpu: &Gpu,
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    warps: usize,
) -> CudaResult<()> {
    if !skinny_dense_fits(m, n, k, warps) {
        return unsupported(format!(
            "the streaming dense GEMM with {warps} warps takes at most {SKINNY_DENSE_ROWS} rows, \
             N a multiple of {} and K of 64 (got {m} x {n} x {k})",
            16 * warps
        ));
    }
    use kernels::dense::{
        dense_gemm_skinny_w1, dense_gemm_skinny_w2, dense_gemm_skinny_w4, SkinnyGemm,
    };
    let kernel: SkinnyGemm = match warps {
        1 => dense_gemm_skinny_w1,
        2 => dense_gemm_skinny_w2,
        _ => dense_gemm_skinny_w4,
    };
    let cfg = LaunchConfig::new(
        ((n / (16 * warps)) as u32, 1, 1),
        32 * warps as u32,
        skinny_dense_smem_bytes(warps) as u32,
    );
    kernel(gpu, cfg, x, w, y, m as i32, n as i32, k as i32)
}

/// Dynamic shared memory of `dense_gemm_skinny_w{warps}` (mirrors `minnow_dense::Skinny` in
/// kernels/dense.cu): 8 stages (6 for 4 warps) of the 32 activation rows and the CTA's 16 `warps`
/// weight rows, 64 columns each at a pitch of 72.
pub const fn skinny_dense_smem_bytes(warps: usize) -> usize {
    let stages = if warps == 4 { 6 } else { 8 };
    stages * (SKINNY_DENSE_ROWS + 16 * warps) * 72 * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streaming_kernel_takes_only_few_rows_whole_ctas_and_whole_stages() {
        assert!(skinny_dense_fits(32, 3072, 2048, 2));
        assert!(skinny_dense_fits(1, 2048, 512, 4));
        assert!(skinny_dense_fits(7, 16, 64, 1));
        assert!(
            !skinny_dense_fits(33, 3072, 2048, 2),
            "more rows than it holds"
        );
        assert!(!skinny_dense_fits(0, 3072, 2048, 2), "no rows");
        assert!(
            !skinny_dense_fits(32, 3056, 2048, 2),
            "a CTA's columns cut short"
        );
        assert!(!skinny_dense_fits(32, 3072, 2000, 2), "a stage cut short");
        assert!(
            !skinny_dense_fits(32, 3072, 2048, 3),
            "no kernel of 3 warps"
        );
        assert_eq!(skinny_dense_smem_bytes(1), 55_296);
        assert_eq!(skinny_dense_smem_bytes(2), 73_728);
        assert_eq!(skinny_dense_smem_bytes(4), 82_944);
    }
}
