//! The launcher of `kernels/expert_wgmma.cu`: the grouped expert GEMM on Hopper's warpgroup
//! tensor-core instructions, for forwards whose experts get many rows each (batched denoising
//! steps, prefill), over BF16 experts and over quantized ones (`*_mma` codes). Same bits as the
//! mma.sync grouped kernels of `expert_gemm`.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::tma::MappedTensor;
use super::expert_gemm::{codes_tiled, launch_codes, CodeKind, CodeMatrices, ExpertTiles};
use super::pool_gemm::persistent_grid;
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
    wgmma_fits(gpu, grouped_wgmma_smem_bytes(), n, k)
}

/// What every kernel of the module needs: the sm_90a build is loaded (compute capability 9.0),
/// the device grants `smem` bytes of shared memory, whole items of 128 output columns and
/// 64-deep stages.
fn wgmma_fits(gpu: &Gpu, smem: usize, n: usize, k: usize) -> bool {
    gpu.uses_sm90a_ptx()
        && gpu.max_shared_optin() as usize >= smem
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
    // One CTA per multiprocessor, or per (tile, 128-row weight slice) item when there are fewer.
    let Some(cfg) = persistent_grid(gpu, t, n, 384, grouped_wgmma_smem_bytes()) else {
        return Ok(());
    };
    kernels::expert_wgmma::grouped_gemm_wgmma(
        gpu,
        cfg,
        w.map,
        w.base,
        w_ptr,
        x,
        row_token,
        y,
        t.tiles,
        t.num_tiles,
        n as i32,
        k as i32,
        i32::from(gated),
    )
}

/// Dynamic shared memory of the quantized wgmma kernels: 6 stages of 33 KB (128 activation rows
/// of 64 BF16 columns, the 16 bands' code tiles with room for a packed shared expert's BF16
/// tiles, their scale rows), 1 KB to align them to the swizzle atom, then 12 mbarriers
/// (minnow_codes_wgmma::SMEM_BYTES in kernels/expert_wgmma.cu).
pub const fn codes_wgmma_smem_bytes() -> usize {
    6 * 33 * 1024 + 1024 + 2 * 6 * 8
}

/// Whether [`grouped_gemm_codes_wgmma`] takes these codes, `n` outputs over `k` inputs: what
/// the module needs, and the groups of the tiled codes kernels (the same bits).
pub fn codes_wgmma_supported(gpu: &Gpu, w: &CodeMatrices, n: usize, k: usize) -> bool {
    wgmma_fits(gpu, codes_wgmma_smem_bytes(), n, k)
        && codes_tiled(n, w.group)
        && k.is_multiple_of(w.group)
        && w.complete()
}

/// The quantized grouped GEMM (`expert_gemm`'s `grouped_gemm_codes`, BF16 activations) over
/// tiles of up to [`GROUPED_WGMMA_ROWS`] rows, one persistent CTA per multiprocessor walking
/// (tile, 128-column) items: exactly the bits of the mma.sync codes kernels, `gated` as there.
/// Codes take [`grouped_gemm_codes_ss`] instead where `MINNOW_CODES_SS` asks and it applies.
/// Check [`codes_wgmma_supported`] (or [`codes_ss_supported`]) first.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_codes_wgmma(
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    // Codes that the kernel decoding into shared memory takes go there where `MINNOW_CODES_SS`
    // asks (opt-in until measured).
    if crate::cuda::tuning::tuning().codes_ss > 0 && codes_ss_supported(gpu, w, n, k) {
        return grouped_gemm_codes_ss(gpu, x, row_token, w, y, t, n, k, gated);
    }
    if t.rows > GROUPED_WGMMA_ROWS || !codes_wgmma_supported(gpu, w, n, k) {
        return unsupported(format!(
            "wgmma over {:?} experts of {n} x {k} with groups of {} in tiles of {} rows",
            w.kind, w.group, t.rows
        ));
    }
    use kernels::expert_wgmma::{
        grouped_gemm_f4_wgmma, grouped_gemm_f8_wgmma, grouped_gemm_i4_wgmma, grouped_gemm_i8_wgmma,
    };
    // (The codes family's launcher type: the same parameters as the mma.sync tiles.)
    let kernel: kernels::moe::CodesGemm = match w.kind {
        CodeKind::Int8 => grouped_gemm_i8_wgmma,
        CodeKind::Int4 => grouped_gemm_i4_wgmma,
        CodeKind::E2m1 => grouped_gemm_f4_wgmma,
        CodeKind::E4m3 => grouped_gemm_f8_wgmma,
    };
    launch_persistent(
        kernel,
        codes_wgmma_smem_bytes(),
        gpu,
        x,
        row_token,
        w,
        y,
        t,
        n,
        k,
        gated,
    )
}

/// One of the module's codes kernels on one persistent CTA per multiprocessor (or per item when
/// there are fewer), with `smem` bytes of dynamic shared memory.
#[allow(clippy::too_many_arguments)]
fn launch_persistent(
    kernel: kernels::moe::CodesGemm,
    smem: usize,
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    match persistent_grid(gpu, t, n, 384, smem) {
        Some(cfg) => launch_codes(kernel, gpu, cfg, x, row_token, w, y, t, n, k, gated, false),
        None => Ok(()),
    }
}

/// Dynamic shared memory of the shared-memory codes kernels (`grouped_gemm_*_wgmma_ss`) for codes
/// of `bits` bits: 5 (4-bit) or 4 (8-bit) stages of the decoded BF16 weights of 128 rows and the
/// 128 activation rows, 64 columns each, the stage's codes and scale rows; 1 KB to align them to
/// the swizzle atom, then the stages' mbarriers (minnow_codes_ss::smem_bytes in
/// kernels/expert_wgmma.cu).
pub const fn codes_ss_smem_bytes(bits: usize) -> usize {
    let stages = if bits == 4 { 5 } else { 4 };
    let stage = 2 * 128 * 64 * 2 + 128 * 64 * bits / 8 + 16 * 4 * 16;
    stages * stage + 1024 + 2 * stages * 8
}

/// Whether [`grouped_gemm_codes_ss`] takes these codes: INT4, INT8 or E4M3 (NVFP4's block scales
/// multiply the weights there, not the sums) without a packed shared expert (its BF16 tiles are
/// not read there), and what [`grouped_gemm_codes_wgmma`] needs.
pub fn codes_ss_supported(gpu: &Gpu, w: &CodeMatrices, n: usize, k: usize) -> bool {
    codes_ss_kernel(w.kind).is_some_and(|(_, smem)| {
        w.shared.is_none()
            && wgmma_fits(gpu, smem, n, k)
            && codes_tiled(n, w.group)
            && k.is_multiple_of(w.group)
    })
}

/// The shared-memory kernel of a kind of codes and its dynamic shared memory; none for E2M1.
fn codes_ss_kernel(kind: CodeKind) -> Option<(kernels::moe::CodesGemm, usize)> {
    use kernels::expert_wgmma::{
        grouped_gemm_f8_wgmma_ss, grouped_gemm_i4_wgmma_ss, grouped_gemm_i8_wgmma_ss,
    };
    match kind {
        CodeKind::Int4 => Some((grouped_gemm_i4_wgmma_ss, codes_ss_smem_bytes(4))),
        CodeKind::Int8 => Some((grouped_gemm_i8_wgmma_ss, codes_ss_smem_bytes(8))),
        CodeKind::E4m3 => Some((grouped_gemm_f8_wgmma_ss, codes_ss_smem_bytes(8))),
        CodeKind::E2m1 => None,
    }
}

/// [`grouped_gemm_codes_wgmma`] with the weights decoded into shared memory by the producer
/// warpgroup, so the consumers run the BF16 kernel's products (tokens the M side): the same
/// bits as the codes tiles. Check [`codes_ss_supported`] first. Not yet run on a GPU
/// (docs/performance.md, session forty-three).
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_codes_ss(
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    match codes_ss_kernel(w.kind) {
        Some((kernel, smem)) if t.rows <= GROUPED_WGMMA_ROWS && codes_ss_supported(gpu, w, n, k) => {
            launch_persistent(kernel, smem, gpu, x, row_token, w, y, t, n, k, gated)
        }
        _ => unsupported(format!(
            "{:?} codes decoded into shared memory for experts of {n} x {k} with groups of {} in tiles of {} rows",
            w.kind, w.group, t.rows
        )),
    }
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
        // minnow_codes_wgmma::SMEM_BYTES, the same module.
        assert_eq!(codes_wgmma_smem_bytes(), 6 * 33792 + 1024 + 96);
        assert!(codes_wgmma_smem_bytes() <= module.max_dynamic_shared as usize);
        // minnow_codes_ss::smem_bytes<4> and <8>.
        assert_eq!(codes_ss_smem_bytes(4), 5 * 37888 + 1024 + 80);
        assert_eq!(codes_ss_smem_bytes(8), 4 * 41984 + 1024 + 64);
        assert!(codes_ss_smem_bytes(4) <= module.max_dynamic_shared as usize);
        assert!(codes_ss_smem_bytes(8) <= module.max_dynamic_shared as usize);
    }
}
