//! The launchers of `kernels/pool_gemm.cu`, GEMMs whose weights stream through TMA on Hopper: a
//! 2.2 denoising step's experts as batched GEMMs over the admitted pool, and the opt-in TMA
//! version of the grouped expert GEMM.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels::{self, pool_gemm::GroupedTma};
use super::super::launch::LaunchConfig;
use super::super::tma::MappedTensor;
use super::expert_gemm::ExpertTiles;
use super::unsupported::unsupported;

/// Dynamic shared memory of `pool_gemm_tma`: 5 stages of 128 weight rows and 32 token rows in
/// two 64-column halves (BF16), 1 KB to align them to the swizzle atom, the gated epilogue's
/// 64 x 32 F32 exchange, then 10 mbarriers (minnow_pool::SMEM_BYTES in kernels/pool_gemm.cu).
pub const fn pool_gemm_smem_bytes() -> usize {
    5 * (2 * 128 + 2 * 32) * 64 * 2 + 1024 + 64 * 32 * 4 + 2 * 5 * 8
}

/// Rows of a token box of `pool_gemm_tma` (its X tensor maps are made with these).
pub const POOL_GEMM_TOKEN_ROWS: u32 = 32;
/// Rows of a weight box of `pool_gemm_tma` (a tile is two of them).
pub const POOL_GEMM_WEIGHT_ROWS: u32 = 64;

/// Whether [`pool_gemm`] takes `Y[t, n] = X[t, k] . W[n, k]^T` per pool entry: the sm_90 kernels
/// are loaded (TMA and mbarriers are Hopper instructions), the device grants its shared memory
/// (datacenter Hopper and Blackwell do; GPUs with ~99 KiB per CTA do not), at most 32 tokens,
/// whole 128-row tiles and 128-deep stages, and the knob leaves it on.
pub fn pool_gemm_supported(gpu: &Gpu, tokens: usize, n: usize, k: usize) -> bool {
    gpu.uses_sm90_ptx()
        && gpu.max_shared_optin() as usize >= pool_gemm_smem_bytes()
        && super::super::tuning::tuning().pool_gemm
        && (1..=32).contains(&tokens)
        && n.is_multiple_of(128)
        && k.is_multiple_of(128)
}

/// `Y_q[t, n] = X_q[t, :] . W_q[n, :]` for pool entries `q < entries` (BF16, F32 accumulation):
/// the product of [`super::super::blas::Blas::gemm_bf16_batched`] over device arrays of the entries'
/// X, W and Y addresses (row pitches k, k and n), streamed by `pool_gemm_tma` with one
/// persistent CTA per multiprocessor. Every X_q and W_q lies inside the tensor `x` / `w` (maps
/// with boxes of [`POOL_GEMM_TOKEN_ROWS`] / [`POOL_GEMM_WEIGHT_ROWS`] rows and k columns). Check
/// [`pool_gemm_supported`] first.
#[allow(clippy::too_many_arguments)]
pub fn pool_gemm(
    gpu: &Gpu,
    x: MappedTensor,
    w: MappedTensor,
    x_ptrs: u64,
    w_ptrs: u64,
    y_ptrs: u64,
    tokens: usize,
    n: usize,
    k: usize,
    entries: usize,
    gated: bool,
    weights_ready: bool,
) -> CudaResult<()> {
    if !pool_gemm_supported(gpu, tokens, n, k) {
        return unsupported(format!("pool GEMM of {tokens} x {n} x {k}"));
    }
    let tiles = entries * n / 128;
    let cfg = LaunchConfig::new(
        ((tiles as u32).min(gpu.sm_count()).max(1), 1, 1),
        288,
        pool_gemm_smem_bytes() as u32,
    );
    kernels::pool_gemm::pool_gemm_tma(
        gpu,
        cfg,
        x.map,
        x.base,
        w.map,
        w.base,
        x_ptrs,
        w_ptrs,
        y_ptrs,
        tokens as i32,
        n as i32,
        k as i32,
        entries as i32,
        i32::from(gated),
        i32::from(weights_ready),
    )
}

/// Dynamic shared memory of `grouped_gemm_tma_r{16,64}` (mirrors `minnow_grouped::Shape` in
/// kernels/pool_gemm.cu): the weight and row stages, 1 KB of swizzle alignment, the gated
/// epilogue's up values and the stage barriers.
pub const fn grouped_tma_smem_bytes(tile_rows: usize) -> usize {
    let stages = if tile_rows > 32 { 4 } else { 5 };
    stages * 2 * (128 * 64 * 2 + tile_rows * 64 * 2) + 1024 + tile_rows * 72 * 4 + 2 * stages * 8
}

/// Whether [`grouped_gemm_tma`] can take an expert GEMM of `n` outputs over `k` inputs cut in
/// `tile_rows`-row tiles: the sm_90 kernels are loaded, the device grants their shared memory,
/// whole 128-row weight slices and 128-deep stages. (The forward uses it only with
/// `MINNOW_GROUPED_TMA` on, the default: see `tuning::Tuning::grouped_tma`.)
pub fn grouped_tma_supported(gpu: &Gpu, tile_rows: usize, n: usize, k: usize) -> bool {
    gpu.uses_sm90_ptx()
        && [16, 64].contains(&tile_rows)
        && gpu.max_shared_optin() as usize >= grouped_tma_smem_bytes(tile_rows)
        && n.is_multiple_of(128)
        && k.is_multiple_of(128)
}

/// The grouped expert GEMM of [`grouped_gemm`](super::expert_gemm::grouped_gemm) with the weights streamed through TMA by one
/// persistent CTA per multiprocessor: `Y[p] = X[row_token[p] or p] . W[e]^T` over the dispatched
/// tiles, the same bits as [`grouped_gemm`](super::expert_gemm::grouped_gemm) (same tensor-core products, same order over K).
/// `w` is the tensor map (boxes of [`POOL_GEMM_WEIGHT_ROWS`] rows) of a tensor holding the
/// experts' `[E, n, k]` rows at `w_ptr`. With `gated` (gate/up, `n` = 2I) it writes
/// `silu_mul`'s result instead, `[rows, I]`. Check [`grouped_tma_supported`] first.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_tma(
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
    launch_grouped_tma(gpu, w, w_ptr, x, row_token, y, t, n, k, gated, None)
}

/// The down projection that [`grouped_gemm_tma_pair`] runs behind the gate/up GEMM in the same
/// launch.
#[derive(Clone, Copy, Debug)]
pub struct DownProjection {
    /// The tensor map of the experts' `[E, n, I]` down weights, which start at `w_ptr`.
    pub w: MappedTensor,
    pub w_ptr: u64,
    /// `[rows, n]` outputs.
    pub y: u64,
    pub n: usize,
    /// [`grouped_tma_ready_len`] zeroed `i32` counters, left zeroed (by which each tile's down
    /// items wait for its gate/up items).
    pub ready: u64,
}

/// The `i32` counters [`DownProjection::ready`] needs for tile lists of up to `max_tiles`.
pub const fn grouped_tma_ready_len(max_tiles: usize) -> usize {
    2 * max_tiles
}

/// The gate/up GEMM of [`grouped_gemm_tma`] (gated: `act [rows, I]` from `w` of `[E, 2I, k]`)
/// and the down projection `down.y = act . W_down[e]^T` in one persistent launch: every CTA
/// walks the gate/up items first, then the down items, each of which waits until all gate/up
/// slices of its tile are written. Outputs are the bits of the two separate launches (each item
/// computes as there); the launch saves the second kernel's start and the first one's tail, when
/// most multiprocessors would idle (a refinement's 400 gate/up items fill 132 of them three
/// times and four of them a fourth time). Check [`grouped_tma_supported`] for both shapes first.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_tma_pair(
    gpu: &Gpu,
    w: MappedTensor,
    w_ptr: u64,
    x: u64,
    row_token: u64,
    act: u64,
    t: &ExpertTiles,
    two_i: usize,
    k: usize,
    down: &DownProjection,
) -> CudaResult<()> {
    if !grouped_tma_supported(gpu, t.rows, down.n, two_i / 2) {
        return unsupported(format!(
            "TMA down projection of {} x {} in tiles of {} rows",
            down.n,
            two_i / 2,
            t.rows
        ));
    }
    launch_grouped_tma(
        gpu,
        w,
        w_ptr,
        x,
        row_token,
        act,
        t,
        two_i,
        k,
        true,
        Some(down),
    )
}

/// Launches `grouped_gemm_tma_r{16,64}` over the items of the gate/up (or any one) GEMM and,
/// with `down`, those of the down projection behind it.
#[allow(clippy::too_many_arguments)]
fn launch_grouped_tma(
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
    down: Option<&DownProjection>,
) -> CudaResult<()> {
    let tile_rows = t.rows;
    if !grouped_tma_supported(gpu, tile_rows, n, k) {
        return unsupported(format!(
            "TMA expert GEMM of {n} x {k} in tiles of {tile_rows} rows"
        ));
    }
    use kernels::pool_gemm::{grouped_gemm_tma_r16, grouped_gemm_tma_r64};
    let kernel: GroupedTma = if tile_rows == 16 {
        grouped_gemm_tma_r16
    } else {
        grouped_gemm_tma_r64
    };
    let smem = grouped_tma_smem_bytes(tile_rows);
    let down_n = down.map_or(0, |d| d.n);
    let Some(cfg) = persistent_grid(gpu, t, n + down_n, 288, smem) else {
        return Ok(());
    };
    let (down_map, down_base, down_ptr, down_y, ready) = down.map_or((0, 0, 0, 0, 0), |d| {
        (d.w.map, d.w.base, d.w_ptr, d.y, d.ready)
    });
    kernel(
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
        down_map,
        down_base,
        down_ptr,
        down_y,
        down_n as i32,
        ready,
    )
}

/// The launch of a persistent grouped expert GEMM whose items are (tile, 128 of the `n` output
/// columns): one CTA per multiprocessor, or per item when there are fewer; `None` when the tile
/// list cannot hold any.
pub(super) fn persistent_grid(
    gpu: &Gpu,
    t: &ExpertTiles,
    n: usize,
    threads: u32,
    smem: usize,
) -> Option<LaunchConfig> {
    let items = t.max_tiles * n / 128;
    (items > 0).then(|| {
        LaunchConfig::new(
            ((items as u32).min(gpu.sm_count()), 1, 1),
            threads,
            smem as u32,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_gemm_shared_memory_fits_its_opt_in() {
        // minnow_pool::SMEM_BYTES in kernels/pool_gemm.cu (static_assert there) within the
        // module's opt-in and a multiprocessor's 227 KiB.
        assert_eq!(pool_gemm_smem_bytes(), 5 * 40960 + 1024 + 8192 + 80);
        let module = crate::cuda::kernels::MODULES
            .iter()
            .find(|m| m.name == "pool_gemm")
            .unwrap();
        assert!(pool_gemm_smem_bytes() <= module.max_dynamic_shared as usize);
        assert!(module.max_dynamic_shared as usize <= 227 * 1024);
    }
}
