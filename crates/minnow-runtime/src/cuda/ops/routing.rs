//! Launchers of `kernels/router.cu`'s routing: the router logits, group-limited top-k (2.0/2.1)
//! and 2.2 block admission, which can also lay out a routing block's admitted pool.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::unsupported::unsupported;

/// Router parameters of one MoE layer.
#[derive(Clone, Copy, Debug)]
pub struct RouterShape {
    pub experts: usize,
    pub top_k: usize,
    /// 2.0/2.1 group-limited routing: (n_group, topk_group).
    pub groups: Option<(usize, usize)>,
    /// 2.2 block routing: experts admitted per block.
    pub capacity: Option<usize>,
    pub block: usize,
    pub scale: f32,
}

impl RouterShape {
    pub fn check(&self) -> CudaResult<()> {
        let s = self;
        if s.experts == 0 || s.experts > 1024 {
            return unsupported(format!("{} experts (1..=1024 supported)", s.experts));
        }
        if s.top_k == 0 || s.top_k > s.experts {
            return unsupported(format!("top-{} of {} experts", s.top_k, s.experts));
        }
        match (s.capacity, s.groups) {
            (Some(c), _) if c < s.top_k || c > s.experts => {
                unsupported(format!("expert capacity {c}"))
            }
            (Some(_), _) if s.top_k > ROUTE_MAX_K || s.block == 0 => unsupported(format!(
                "block routing with top-{} over blocks of {}",
                s.top_k, s.block
            )),
            (Some(_), _) => Ok(()),
            (None, Some((g, kg)))
                if g == 0
                    || g > 64
                    || !s.experts.is_multiple_of(g)
                    || kg == 0
                    || kg > g
                    || kg * (s.experts / g) < s.top_k =>
            {
                unsupported(format!(
                    "{g} expert groups (keep {kg}) over {} experts",
                    s.experts
                ))
            }
            (None, Some(_)) => Ok(()),
            (None, None) => unsupported("router needs groups or an expert capacity".into()),
        }
    }
}

/// The fixed K ranges every tensor-core router logit is summed over, folded in order
/// (ROUTER_MMA_WARPS in kernels/router.cu): CTAs per tile of the cluster kernel.
const ROUTER_SUM_RANGES: usize = 8;
/// Most tokens one `route_block` CTA routes and the largest top-k it takes (ROUTE_MAX_TOKENS and
/// ROUTE_MAX_K in kernels/router.cu).
const ROUTE_MAX_TOKENS: usize = 32;
pub const ROUTE_MAX_K: usize = 32;

/// The 2.2 routing blocks of a forward.
#[derive(Clone, Copy, Debug)]
pub enum RoutingBlocks {
    /// One sequence: rows cut every `block` rows (the last block may be partial).
    Uniform,
    /// `count` `(first row, rows)` i32 pairs in device memory (a batch's segments, each cut at its
    /// own block boundaries).
    Listed { ptr: u64, count: usize },
}

/// Routes `tokens` rows of F32 router logits: writes `topk_idx [tokens, k]` (i32) and
/// `topk_w [tokens, k]` (F32). 2.2 block routing admits experts per routing block of `blocks`.
#[allow(clippy::too_many_arguments)]
pub fn route(
    gpu: &Gpu,
    shape: &RouterShape,
    logits: u64,
    bias: u64,
    topk_idx: u64,
    topk_w: u64,
    tokens: usize,
    blocks: RoutingBlocks,
) -> CudaResult<()> {
    shape.check()?;
    if shape.capacity.is_some() {
        return launch_route_block(
            gpu, shape, logits, bias, topk_idx, topk_w, tokens, blocks, None, None,
        );
    }
    let e = shape.experts;
    let (n_group, topk_group) = shape.groups.unwrap_or((1, 1));
    let shared = 4 * (2 * e + 64 + shape.top_k);
    let cfg = LaunchConfig::new((tokens as u32, 1, 1), thread_per_expert(e), shared as u32);
    kernels::router::route_topk(
        gpu,
        cfg,
        logits,
        bias,
        e as i32,
        shape.top_k as i32,
        n_group as i32,
        topk_group as i32,
        shape.scale,
        topk_idx,
        topk_w,
    )
}

/// Where a routing's [`super::expert_gemm::moe_dispatch`] puts its outputs (that function's
/// arguments but the routing's own), and the counter that lets
/// [`route_and_dispatch_in_one_launch`] run both in one launch.
#[derive(Clone, Copy, Debug)]
pub struct DispatchAfter {
    /// Experts, the packed shared one (`shared_expert`) included.
    pub experts: usize,
    pub tile_rows: usize,
    pub shared_expert: Option<usize>,
    pub slot_pos: u64,
    pub row_token: u64,
    pub tiles: u64,
    pub num_tiles: u64,
    /// One i32 that is 0 (and is 0 again after every launch that uses it): the launch's count
    /// of CTAs done routing. Never used by two launches at once.
    pub arrivals: u64,
}

/// Whether [`route_and_dispatch_in_one_launch`] takes this routing: 2.2 block routing, fewer
/// assignments than the multi-CTA dispatch takes, and a CTA with a thread per expert slot.
pub fn routes_and_dispatches_in_one_launch(
    shape: &RouterShape,
    tokens: usize,
    dispatch: &DispatchAfter,
) -> bool {
    let (_, threads) = route_launch_shape(
        tokens,
        shape.experts,
        shape.block,
        super::super::tuning::tuning().route_shared,
    );
    shape.check().is_ok()
        && shape.capacity.is_some()
        && tokens * shape.top_k < super::expert_gemm::DISPATCH_MULTI_MIN
        && dispatch.experts <= threads as usize
        && dispatch.shared_expert.is_none_or(|s| s < dispatch.experts)
}

/// [`route`], then the one-CTA [`super::expert_gemm::moe_dispatch`] of its choices, in one
/// launch (`route_block_dispatch`: the last routing CTA to finish dispatches), saving a kernel
/// boundary per MoE layer in a denoising step's chain of short launches. The outputs mean what
/// the two launches' do (rows of a routed expert are in no particular order in both). An error
/// where [`routes_and_dispatches_in_one_launch`] refuses. The forward takes it wherever that
/// accepts, unless `Tuning::route_dispatch` is off (`MINNOW_ROUTE_DISPATCH=0`: two launches).
#[allow(clippy::too_many_arguments)]
pub fn route_and_dispatch_in_one_launch(
    gpu: &Gpu,
    shape: &RouterShape,
    logits: u64,
    bias: u64,
    topk_idx: u64,
    topk_w: u64,
    tokens: usize,
    blocks: RoutingBlocks,
    dispatch: &DispatchAfter,
) -> CudaResult<()> {
    let d = dispatch;
    if !routes_and_dispatches_in_one_launch(shape, tokens, d) {
        return unsupported(format!(
            "routing {tokens} tokens under {shape:?} and dispatching to {} experts in one launch",
            d.experts
        ));
    }
    if d.arrivals == 0 {
        return unsupported("routing and dispatch in one launch without its counter".into());
    }
    launch_route_block(
        gpu,
        shape,
        logits,
        bias,
        topk_idx,
        topk_w,
        tokens,
        blocks,
        None,
        Some(d),
    )
}

/// The experts of a 2.2 forward of one routing block (a denoising step) run as batched GEMMs over
/// the block's admitted pool: entry `q < capacity` is the q-th admitted expert, entry `capacity`
/// the packed shared expert. Every entry multiplies all the block's tokens (the pool is at most
/// 48 experts, and streaming each expert's weights is the whole cost; see docs/performance.md),
/// its rows `q * row_stride..` of the pooled outputs. [`route_pooled`] fills the weight-address
/// arrays and each assignment's row; the activation and output address arrays are fixed per
/// workspace.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertPool {
    /// Packed `[E + 1, 2I, D]` gate/up and `[E + 1, D, I]` down weights of the layer.
    pub gate_up: u64,
    pub gate_up_stride: usize,
    pub down: u64,
    pub down_stride: usize,
    /// Device arrays of `capacity + 1` u64 weight addresses, written by [`route_pooled`].
    pub gate_up_ptrs: u64,
    pub down_ptrs: u64,
    /// `[tokens * k + tokens]` i32: row of each assignment (then of each token's shared-expert
    /// row) in the pooled outputs.
    pub slot_pos: u64,
    /// Rows per pool entry in the pooled buffers (at least the token count).
    pub row_stride: usize,
}

/// Whether a forward of `tokens` tokens under `shape` can run its experts over the admitted pool:
/// 2.2 block routing and one routing block.
pub fn pooled_experts_supported(shape: &RouterShape, tokens: usize) -> bool {
    shape.check().is_ok() && shape.capacity.is_some() && (1..=shape.block).contains(&tokens)
}

/// [`route`] for a forward of one 2.2 routing block that also lays out the admitted pool for
/// batched expert GEMMs (see [`ExpertPool`]).
#[allow(clippy::too_many_arguments)]
pub fn route_pooled(
    gpu: &Gpu,
    shape: &RouterShape,
    logits: u64,
    bias: u64,
    topk_idx: u64,
    topk_w: u64,
    tokens: usize,
    pool: &ExpertPool,
) -> CudaResult<()> {
    if !pooled_experts_supported(shape, tokens) || pool.row_stride < tokens {
        return unsupported(format!(
            "pooled experts for {tokens} tokens under {shape:?} (rows per entry {})",
            pool.row_stride
        ));
    }
    launch_route_block(
        gpu,
        shape,
        logits,
        bias,
        topk_idx,
        topk_w,
        tokens,
        RoutingBlocks::Uniform,
        Some(pool),
        None,
    )
}

/// A thread per expert, rounded up to whole warps (the router kernels' thread j owns expert j).
fn thread_per_expert(experts: usize) -> u32 {
    (experts.div_ceil(32) * 32) as u32
}

/// Tokens per `route_block` CTA and its threads: one token per CTA for short forwards (a denoising
/// step's 32 CTAs work side by side), on 1,024 threads that share each expert's admission loops
/// (`shared`; else a thread per expert), a whole routing block on 1,024 threads for long ones
/// (prefill: each block's admission computed once, as many CTAs as blocks), as far as the
/// block's scores fit the shared-memory opt-in. The choices are the same in every shape.
fn route_launch_shape(tokens: usize, experts: usize, block: usize, shared: bool) -> (usize, u32) {
    let per_expert = thread_per_expert(experts);
    if tokens <= 256 {
        return (
            1,
            if shared {
                per_expert.max(1024)
            } else {
                per_expert
            },
        );
    }
    let fits = super::super::kernels::ROUTER_MAX_SHARED as usize / (8 * experts);
    let tpc = block.min(ROUTE_MAX_TOKENS).min(fits).max(1);
    (tpc, per_expert.max(1024))
}

/// `route_block` (kernels/router.cu): 2.2 admission and top-k, a few tokens per CTA; with a pool
/// it also lays out the admitted pool (one routing block only); with a dispatch,
/// `route_block_dispatch` (no pool) also dispatches the choices in the same launch.
#[allow(clippy::too_many_arguments)]
fn launch_route_block(
    gpu: &Gpu,
    shape: &RouterShape,
    logits: u64,
    bias: u64,
    topk_idx: u64,
    topk_w: u64,
    tokens: usize,
    blocks: RoutingBlocks,
    pool: Option<&ExpertPool>,
    dispatch: Option<&DispatchAfter>,
) -> CudaResult<()> {
    let (e, capacity) = (shape.experts, shape.capacity.unwrap_or(0));
    let shared = super::super::tuning::tuning().route_shared;
    let (tpc, threads) = route_launch_shape(tokens, e, shape.block, shared);
    let (blocks_ptr, n_blocks) = match blocks {
        RoutingBlocks::Uniform => (0, tokens.div_ceil(shape.block)),
        RoutingBlocks::Listed { ptr, count } => (ptr, count),
    };
    if n_blocks == 0 {
        return Ok(());
    }
    let ctas = n_blocks * shape.block.div_ceil(tpc);
    // The block's scores of the CTA's tokens (then the dispatch's counts and cursors).
    let scores = 2 * tpc * e * 4;
    // No pool: null address arrays tell the kernel to skip the pool outputs.
    let p = pool.copied().unwrap_or_default();
    if let Some(d) = dispatch {
        let cfg = LaunchConfig::new(
            (ctas as u32, 1, 1),
            threads,
            scores.max(8 * d.experts) as u32,
        );
        return kernels::router::route_block_dispatch(
            gpu,
            cfg,
            logits,
            bias,
            blocks_ptr,
            tokens as i32,
            e as i32,
            shape.block as i32,
            capacity as i32,
            shape.top_k as i32,
            shape.scale,
            tpc as i32,
            topk_idx,
            topk_w,
            p.gate_up,
            p.gate_up_stride as i64,
            p.down,
            p.down_stride as i64,
            p.gate_up_ptrs,
            p.down_ptrs,
            p.slot_pos,
            p.row_stride as i32,
            d.experts as i32,
            d.tile_rows as i32,
            d.shared_expert.map_or(-1, |s| s as i32),
            d.slot_pos,
            d.row_token,
            d.tiles,
            d.num_tiles,
            d.arrivals,
        );
    }
    let cfg = LaunchConfig::new((ctas as u32, 1, 1), threads, scores as u32);
    kernels::router::route_block(
        gpu,
        cfg,
        logits,
        bias,
        blocks_ptr,
        tokens as i32,
        e as i32,
        shape.block as i32,
        capacity as i32,
        shape.top_k as i32,
        shape.scale,
        tpc as i32,
        topk_idx,
        topk_w,
        p.gate_up,
        p.gate_up_stride as i64,
        p.down,
        p.down_stride as i64,
        p.gate_up_ptrs,
        p.down_ptrs,
        p.slot_pos,
        p.row_stride as i32,
    )
}

/// Experts per CTA of the tensor-core router kernel for `t` rows of `e` experts: 32, or 8 when
/// CTAs of 32 would number fewer than the GPU's `sms` (speed only: both give the same bits).
fn mma_router_experts_per_cta(t: usize, e: usize, sms: usize) -> usize {
    if t.div_ceil(16) * e.div_ceil(32) < sms {
        8
    } else {
        32
    }
}

/// Whether `router_logits_mma_bf16w_e8s` takes `k` columns (each of its 8 warps stages at most 16
/// steps of 16) on a device whose per-CTA shared-memory opt-in is `optin` bytes (the staged
/// operands plus the kernel's 4.6 KB of partial tiles; consumer GPUs allow ~99 KB, so they keep
/// the direct kernel).
fn staged_router_fits(k: usize, optin: u32) -> bool {
    const PARTIAL_TILES: u32 = 8 * 16 * 9 * 4;
    k <= 8 * 16 * 16 && kernels::ROUTER_STAGED_SHARED + PARTIAL_TILES <= optin
}

/// Router logits `logits[t, e] = X[t] · W[e]` in F32 with a fixed summation order per output
/// (batch-invariant; `kernels/router.cu`). `w_f32` says whether `W [e, k]` is F32 or BF16.
#[allow(clippy::too_many_arguments)]
pub fn router_logits(
    gpu: &Gpu,
    x: u64,
    w: u64,
    w_f32: bool,
    logits: u64,
    t: usize,
    e: usize,
    k: usize,
) -> CudaResult<()> {
    if t == 0 || e == 0 {
        return Ok(());
    }
    let tuning = super::super::tuning::tuning();
    if !w_f32 && k.is_multiple_of(16) && tuning.router_mma {
        // BF16 weights on tensor cores, for every row count: each output's sum is cut by K
        // alone (kernels/router.cu), so a row's bits do not depend on the batch, nor on how
        // many experts a CTA covers: 32, or 8 when CTAs of 32 would leave SMs idle (a
        // denoising step's 32 rows make 16 CTAs of 32 experts, 64 of 8).
        if (tuning.router_cluster_rows..tuning.router_cluster_below).contains(&t)
            && gpu.uses_sm90_ptx()
        {
            // Hopper, batched steps and short prefills: the tiled kernel's 64 x 64 tiles with each
            // of the eight summation ranges on a CTA of its own (a cluster of eight per tile,
            // folding through distributed shared memory; kernels/router.cu): eight times the
            // CTAs, the same sums. From 4,096 rows the tiled kernel fills the GPU itself and is
            // faster.
            let grid = (
                (t.div_ceil(64) * ROUTER_SUM_RANGES) as u32,
                e.div_ceil(64) as u32,
                1,
            );
            return kernels::router::router_logits_mma_cluster_bf16w(
                gpu,
                LaunchConfig::new(grid, 128, 0),
                x,
                w,
                logits,
                t as i32,
                e as i32,
                k as i32,
            );
        }
        if t >= tuning.router_tiled_rows {
            // Many rows (prefill, large batches): 64 rows x 64 experts per CTA through shared
            // memory (ROUTER_TILED_ROWS / _COLS in kernels/router.cu; the same sums).
            let cfg = LaunchConfig::new((t.div_ceil(64) as u32, e.div_ceil(64) as u32, 1), 128, 0);
            return kernels::router::router_logits_mma_tiled_bf16w(
                gpu, cfg, x, w, logits, t as i32, e as i32, k as i32,
            );
        }
        let rows = t.div_ceil(16);
        let experts_per_cta = mma_router_experts_per_cta(t, e, gpu.sm_count() as usize);
        let grid = (rows as u32, e.div_ceil(experts_per_cta) as u32, 1);
        if experts_per_cta == 8
            && tuning.router_staged
            && staged_router_fits(k, gpu.max_shared_optin())
        {
            let shared = kernels::ROUTER_STAGED_SHARED;
            let cfg = LaunchConfig::new(grid, 256, shared);
            return kernels::router::router_logits_mma_bf16w_e8s(
                gpu, cfg, x, w, logits, t as i32, e as i32, k as i32,
            );
        }
        let kernel: kernels::router::RouterLogits = if experts_per_cta == 8 {
            kernels::router::router_logits_mma_bf16w_e8
        } else {
            kernels::router::router_logits_mma_bf16w
        };
        let cfg = LaunchConfig::new(grid, 256, 0);
        return kernel(gpu, cfg, x, w, logits, t as i32, e as i32, k as i32);
    }
    // Both kernels compute every output in the same order (bits equal); the wide one shares
    // each loaded row among 4 experts per warp and wins once there are enough rows to fill the
    // GPU with its 4x fewer CTAs.
    let wide = t >= tuning.router_wide_rows;
    // The narrow kernels' rows per warp: 4 for few rows (more warps in flight), else 16.
    let few = !wide && t <= tuning.router_few_rows;
    use kernels::router::{
        router_logits_bf16w, router_logits_bf16w_r4, router_logits_f32w, router_logits_f32w_r4,
        router_logits_wide_bf16w, router_logits_wide_f32w, RouterLogits,
    };
    let (kernel, experts_per_cta, rows_per_cta): (RouterLogits, _, _) = match (wide, few, w_f32) {
        (false, true, true) => (router_logits_f32w_r4, 8, 4),
        (false, true, false) => (router_logits_bf16w_r4, 8, 4),
        (false, false, true) => (router_logits_f32w, 8, 16),
        (false, false, false) => (router_logits_bf16w, 8, 16),
        (true, _, true) => (router_logits_wide_f32w, 32, 16),
        (true, _, false) => (router_logits_wide_bf16w, 32, 16),
    };
    let cfg = LaunchConfig::new(
        (
            t.div_ceil(rows_per_cta) as u32,
            e.div_ceil(experts_per_cta) as u32,
            1,
        ),
        256,
        0,
    );
    kernel(gpu, cfg, x, w, logits, t as i32, e as i32, k as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(
        experts: usize,
        top_k: usize,
        groups: Option<(usize, usize)>,
        capacity: Option<usize>,
    ) -> RouterShape {
        RouterShape {
            experts,
            top_k,
            groups,
            capacity,
            block: 32,
            scale: 2.5,
        }
    }

    fn dispatch_to(experts: usize, shared_expert: Option<usize>) -> DispatchAfter {
        DispatchAfter {
            experts,
            tile_rows: 16,
            shared_expert,
            slot_pos: 0,
            row_token: 0,
            tiles: 0,
            num_tiles: 0,
            arrivals: 0,
        }
    }

    #[test]
    fn one_launch_routes_and_dispatches_steps_of_few_blocks_under_block_routing_only() {
        let (mini, packed) = (router(256, 8, None, Some(48)), dispatch_to(257, Some(256)));
        // A refinement step, 16 blocks, the largest forward under the multi-CTA dispatch's
        // threshold (1,023 x 8 assignments).
        for tokens in [32, 512, 1023] {
            assert!(
                routes_and_dispatches_in_one_launch(&mini, tokens, &packed),
                "{tokens} tokens"
            );
        }
        // 64 blocks' 16,384 assignments take the three-launch dispatch.
        assert!(!routes_and_dispatches_in_one_launch(&mini, 2048, &packed));
        assert!(
            !routes_and_dispatches_in_one_launch(&router(256, 8, Some((8, 4)), None), 32, &packed),
            "2.0 / 2.1 group routing has its own kernel"
        );
        assert!(
            !routes_and_dispatches_in_one_launch(&mini, 32, &dispatch_to(257, Some(257))),
            "the shared expert's slot must be one of the dispatch's"
        );
        assert!(
            !routes_and_dispatches_in_one_launch(&mini, 32, &dispatch_to(2000, None)),
            "more expert slots than a CTA's threads"
        );
        assert!(
            !routes_and_dispatches_in_one_launch(&router(0, 8, None, Some(48)), 32, &packed),
            "an invalid shape"
        );
    }

    #[test]
    fn router_shapes() {
        assert!(router(256, 8, Some((8, 4)), None).check().is_ok());
        assert!(
            router(256, 8, Some((8, 4)), Some(48)).check().is_ok(),
            "2.2 ignores the groups"
        );
        assert!(router(16, 4, Some((4, 2)), None).check().is_ok());
        assert!(
            router(256, 8, None, None).check().is_err(),
            "no routing rule"
        );
        assert!(
            router(256, 8, None, Some(4)).check().is_err(),
            "capacity below top-k"
        );
        assert!(router(256, 8, Some((8, 0)), None).check().is_err());
        assert!(
            router(256, 8, Some((7, 4)), None).check().is_err(),
            "groups must divide the experts"
        );
        assert!(
            router(16, 4, Some((8, 1)), None).check().is_err(),
            "kept groups hold fewer than k experts"
        );
        assert!(
            router(2048, 8, None, Some(48)).check().is_err(),
            "too many experts for one CTA"
        );
    }

    #[test]
    fn the_tensor_core_router_narrows_its_ctas_only_when_the_gpu_would_idle() {
        // A denoising step of mini (32 rows, 256 experts) on an H200's 132 SMs: 16 CTAs of 32
        // experts, so 64 of 8.
        assert_eq!(mma_router_experts_per_cta(32, 256, 132), 8);
        // 16 concurrent steps (512 rows): 256 CTAs of 32 already fill it.
        assert_eq!(mma_router_experts_per_cta(512, 256, 132), 32);
        // The boundary: 132 CTAs of 32 are enough.
        assert_eq!(mma_router_experts_per_cta(16 * 33, 128, 132), 32);
        assert_eq!(mma_router_experts_per_cta(16 * 32, 128, 132), 8);
    }

    #[test]
    fn the_staged_router_needs_a_short_k_and_a_hopper_sized_opt_in() {
        // Mini's hidden 2,048 is 16 steps per warp; flash's 4,096 would be 32.
        assert!(staged_router_fits(2048, 227 * 1024));
        assert!(!staged_router_fits(4096, 227 * 1024));
        // An RTX 4090's 99 KB opt-in is short of the staged operands.
        assert!(!staged_router_fits(2048, 99 * 1024));
    }

    #[test]
    fn route_block_shapes() {
        // A denoising step: one token per CTA, on 1,024 threads sharing each expert's loops, or
        // a thread per expert.
        assert_eq!(route_launch_shape(32, 256, 32, true), (1, 1024));
        assert_eq!(route_launch_shape(32, 256, 32, false), (1, 256));
        assert_eq!(route_launch_shape(5, 16, 32, false), (1, 32));
        // Prefill: a routing block per CTA on 1,024 threads, as far as its scores fit.
        for shared in [true, false] {
            assert_eq!(route_launch_shape(4096, 256, 32, shared), (32, 1024));
            assert_eq!(route_launch_shape(4096, 1024, 32, shared), (8, 1024));
        }
        assert!(2 * 32 * 256 * 4 <= crate::cuda::kernels::ROUTER_MAX_SHARED as usize);
    }
}
