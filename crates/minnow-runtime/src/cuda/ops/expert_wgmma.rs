//! The launcher of `kernels/expert_wgmma.cu`: the grouped expert GEMM on Hopper's warpgroup
//! tensor-core instructions, for forwards whose experts get many rows each (batched denoising
//! steps, prefill). Same bits as the mma.sync grouped kernels of `expert_gemm`.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::tma::MappedTensor;
use super::expert_gemm::ExpertTiles;
use super::pool_gemm::launch_persistent;
use super::unsupported::unsupported;

/// Most rows of a tile [`grouped_gemm_wgmma`] takes (two consumer warpgroups of 64): dispatch
/// at this height for it.
pub const GROUPED_WGMMA_ROWS: usize = 128;

/// Dynamic shared memory of `grouped_gemm_wgmma`: 6 stages of 128 weight rows and 128 activation
/// rows, 64 BF16 columns each, 1 KB to align them to the swizzle atom, then 12 mbarriers
/// (minnow_wgmma::SMEM_BYTES in kernels/expert_wgmma.cu).
pub const fn grouped_wgmma_smem_bytes() -> usize {
    6 * (128 + 128) * 64 * 2 + 1024 + 2 * 6 * 8
}

/// Whether [`grouped_gemm_wgmma`] takes an expert GEMM of `n` outputs over `k` inputs: the
/// sm_90a build is loaded (compute capability 9.0), the device grants its shared memory, whole
/// 128-row weight slices and 64-deep stages.
pub fn grouped_wgmma_supported(gpu: &Gpu, n: usize, k: usize) -> bool {
    gpu.uses_sm90a_ptx()
        && gpu.max_shared_optin() as usize >= grouped_wgmma_smem_bytes()
        && n.is_multiple_of(128)
        && k.is_multiple_of(64)
}

/// `Y[p] = X[row_token[p] or p] . W[e]^T` over the dispatched tiles (at most
/// [`GROUPED_WGMMA_ROWS`] rows each), one persistent CTA per multiprocessor: exactly the bits of
/// [`grouped_gemm`](super::expert_gemm::grouped_gemm) (the same tensor-core products in the same
/// order over K). `w` is the tensor map (boxes of 64 rows) of a tensor holding the experts'
/// `[E, n, k]` rows at `w_ptr`. With `gated` (gate/up, `n` = 2I) it writes `silu_mul`'s result
/// instead, `[rows, I]`. Check [`grouped_wgmma_supported`] first.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_wgmma(
    gpu: &Gpu,
    w: MappedTensor,
    w_ptr: u64,
    x: u64,
    row_token: u64,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    if t.rows > GROUPED_WGMMA_ROWS || !grouped_wgmma_supported(gpu, n, k) {
        return unsupported(format!(
            "wgmma expert GEMM of {n} x {k} in tiles of {} rows",
            t.rows
        ));
    }
    let kernel = kernels::expert_wgmma::grouped_gemm_wgmma;
    let smem = grouped_wgmma_smem_bytes();
    launch_persistent(
        gpu, kernel, 384, smem, w, w_ptr, x, row_token, y, t, n, k, gated,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_shared_memory_fits_its_opt_in() {
        // minnow_wgmma::SMEM_BYTES in kernels/expert_wgmma.cu (static_assert there), within the
        // module's opt-in and a multiprocessor's 227 KiB.
        assert_eq!(grouped_wgmma_smem_bytes(), 6 * 32768 + 1024 + 96);
        let module = crate::cuda::kernels::MODULES
            .iter()
            .find(|m| m.name == "expert_wgmma")
            .unwrap();
        assert!(grouped_wgmma_smem_bytes() <= module.max_dynamic_shared as usize);
        assert!(module.max_dynamic_shared as usize <= 227 * 1024);
    }
}
