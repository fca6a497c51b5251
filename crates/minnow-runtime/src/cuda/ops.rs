//! Typed launchers, one per kernel of `kernels/*.cu`: they check the shapes each kernel supports
//! (returning `CudaError::Unsupported` instead of launching something wrong) and pick grid sizes.
//! Buffers are passed as device addresses so that callers can address sub-ranges.

use super::error::{CudaError, CudaResult};
use super::gpu::{Gpu, LaunchConfig};
use super::tma::MappedTensor;
use crate::cuda_launch;

fn unsupported<T>(msg: String) -> CudaResult<T> {
    Err(CudaError::Unsupported(msg))
}

fn row_threads(width: usize) -> u32 {
    (width.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Launch shape of the row norms (`add_rmsnorm`, `moe_combine_add_rmsnorm`): one CTA per row, one
/// thread per 8 columns up to 256 threads. Both kernels must use the same block size for the
/// fused one to stay bit-identical (see kernels/elementwise.cu).
fn norm_launch(rows: usize, d: usize) -> CudaResult<LaunchConfig> {
    if !d.is_multiple_of(8) {
        return unsupported(format!("RMSNorm over rows of {d} (needs a multiple of 8)"));
    }
    Ok(LaunchConfig::new(
        (rows as u32, 1, 1),
        row_threads(d / 8),
        0,
    ))
}

/// `out[t] = table[ids[t]]` for `rows` ids (u32) in device memory; `d % 8 == 0`.
pub fn embed_rows(
    gpu: &Gpu,
    ids: u64,
    table: u64,
    out: u64,
    rows: usize,
    d: usize,
) -> CudaResult<()> {
    if !d.is_multiple_of(8) {
        return unsupported(format!("embedding width {d} is not a multiple of 8"));
    }
    let cfg = LaunchConfig::new((rows as u32, 1, 1), row_threads(d / 8), 0);
    cuda_launch!(gpu, "embed_rows", cfg, ids, table, out, d as i32)
}

/// `h = BF16(h + delta)` (when `delta` is non-zero) then `out = RMSNorm(h) * weight`, per row.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm(
    gpu: &Gpu,
    h: u64,
    delta: u64,
    weight: u64,
    out: u64,
    rows: usize,
    d: usize,
    eps: f32,
) -> CudaResult<()> {
    let cfg = norm_launch(rows, d)?;
    cuda_launch!(
        gpu,
        "add_rmsnorm",
        cfg,
        h,
        delta,
        weight,
        out,
        d as i32,
        eps
    )
}

/// `out[r] = BF16(BF16(silu(gate)) * up)` where `gu[r] = [gate | up]` of `width` each.
pub fn silu_mul(gpu: &Gpu, gu: u64, out: u64, rows: usize, width: usize) -> CudaResult<()> {
    silu_mul_groups(gpu, gu, out, 1, rows, 0, width)
}

/// [`silu_mul`] over `groups` groups of `rows` rows, group `q` starting at row `q * stride`.
pub fn silu_mul_groups(
    gpu: &Gpu,
    gu: u64,
    out: u64,
    groups: usize,
    rows: usize,
    stride: usize,
    width: usize,
) -> CudaResult<()> {
    if !width.is_multiple_of(8) {
        return unsupported(format!(
            "SiLU-multiply over {width} columns (needs a multiple of 8)"
        ));
    }
    if rows == 0 || groups == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::new(
        ((groups * rows) as u32, (width / 8).div_ceil(256) as u32, 1),
        256,
        0,
    );
    cuda_launch!(
        gpu,
        "silu_mul",
        cfg,
        gu,
        out,
        width as i32,
        rows as i32,
        stride as i32
    )
}

/// MoE mix: `out[t] = BF16(BF16(sum_j w[t,j] y[slot_pos[t,j]]) + shared[t])`, where the shared
/// expert's row is `y[shared_rows[t]]` when `shared_rows` is non-zero (it ran inside the grouped
/// GEMM), else `shared[t]` (0: no shared expert).
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    gpu: &Gpu,
    y: u64,
    slot_pos: u64,
    w: u64,
    shared: u64,
    shared_rows: u64,
    out: u64,
    tokens: usize,
    k: usize,
    d: usize,
) -> CudaResult<()> {
    let cfg = LaunchConfig::new((tokens as u32, d.div_ceil(256) as u32, 1), 256, 0);
    cuda_launch!(
        gpu,
        "moe_combine",
        cfg,
        y,
        slot_pos,
        w,
        shared,
        shared_rows,
        out,
        k as i32,
        d as i32
    )
}

/// Where an MoE layer's output goes in [`moe_combine_add_rmsnorm`]: the residual stream `h`
/// (`[tokens, d]`, updated in place) and the RMSNorm that follows it (`weight`, `eps`), whose
/// BF16 result is written to `out`.
#[derive(Clone, Copy, Debug)]
pub struct ResidualNorm {
    pub h: u64,
    pub weight: u64,
    pub out: u64,
    pub eps: f32,
}

/// Most experts per token [`moe_combine_add_rmsnorm`] takes (`COMBINE_NORM_MAX_K` in
/// `kernels/elementwise.cu`).
pub const COMBINE_NORM_MAX_K: usize = 32;

/// [`moe_combine`] fused with the [`add_rmsnorm`] that follows it: `h[t] = BF16(h[t] + mix[t])`,
/// `out[t] = RMSNorm(h[t]) * weight`, one launch instead of two and bit-identical to them (the
/// mix is never stored). `k` must be at most [`COMBINE_NORM_MAX_K`].
#[allow(clippy::too_many_arguments)]
pub fn moe_combine_add_rmsnorm(
    gpu: &Gpu,
    y: u64,
    slot_pos: u64,
    w: u64,
    shared: u64,
    shared_rows: u64,
    norm: &ResidualNorm,
    tokens: usize,
    k: usize,
    d: usize,
) -> CudaResult<()> {
    if k > COMBINE_NORM_MAX_K {
        return unsupported(format!(
            "moe_combine_add_rmsnorm takes at most {COMBINE_NORM_MAX_K} experts per token, got {k}"
        ));
    }
    // add_rmsnorm's launch shape: the same columns per thread and the same reduction tree.
    let cfg = norm_launch(tokens, d)?;
    cuda_launch!(
        gpu,
        "moe_combine_add_rmsnorm",
        cfg,
        y,
        slot_pos,
        w,
        shared,
        shared_rows,
        norm.h,
        norm.weight,
        norm.out,
        k as i32,
        d as i32,
        norm.eps
    )
}

pub fn bf16_to_f32(gpu: &Gpu, x: u64, y: u64, n: usize) -> CudaResult<()> {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    cuda_launch!(
        gpu,
        "bf16_to_f32",
        LaunchConfig::new((blocks, 1, 1), 256, 0),
        x,
        y,
        n as i64
    )
}

/// Slices each logits row is split into by [`top1_softmax`].
pub const TOP1_SLICES: usize = 16;

/// Per row of BF16 logits: argmax (lowest index on ties) and its softmax probability. Each row is
/// read once, in `TOP1_SLICES` slices by separate CTAs (one CTA per row cannot pull a 300 KB row
/// at full bandwidth); `scratch` holds `rows * TOP1_SLICES * 3` floats.
pub fn top1_softmax(
    gpu: &Gpu,
    logits: u64,
    scratch: u64,
    token: u64,
    confidence: u64,
    rows: usize,
    vocab: usize,
) -> CudaResult<()> {
    let cfg = LaunchConfig::new((rows as u32, TOP1_SLICES as u32, 1), 256, 0);
    cuda_launch!(gpu, "top1_partial", cfg, logits, scratch, vocab as i32)?;
    let cfg = LaunchConfig::new((rows as u32, 1, 1), 32, 0);
    cuda_launch!(
        gpu,
        "top1_finish",
        cfg,
        scratch,
        token,
        confidence,
        TOP1_SLICES as i32
    )
}

/// Reproducible uniform random BF16 values in `[-scale, scale)`.
pub fn fill_random_bf16(gpu: &Gpu, x: u64, n: usize, seed: u64, scale: f32) -> CudaResult<()> {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    cuda_launch!(
        gpu,
        "fill_random_bf16",
        LaunchConfig::new((blocks, 1, 1), 256, 0),
        x,
        n as i64,
        seed,
        scale
    )
}

/// Shapes of the attention part of one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub block: usize,
}

impl AttentionShape {
    pub fn check(&self) -> CudaResult<()> {
        let s = self;
        if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
            return unsupported(format!(
                "{} query heads over {} KV heads",
                s.heads, s.kv_heads
            ));
        }
        let group = s.heads / s.kv_heads;
        if group > 64 {
            return unsupported(format!(
                "GQA group of {group} query heads (an attention CTA holds at most 64)"
            ));
        }
        if ![16, 32, 64, 128, 256].contains(&s.head_dim) {
            return unsupported(format!("head_dim {}", s.head_dim));
        }
        if !s.rotary_dim.is_multiple_of(2) || s.rotary_dim > s.head_dim {
            return unsupported(format!(
                "rotary dim {} of head dim {}",
                s.rotary_dim, s.head_dim
            ));
        }
        if s.block == 0 {
            return unsupported("block size 0".into());
        }
        Ok(())
    }
}

/// QK-norm + partial RoPE of `tokens` rows of fused QKV, row `t` at absolute position
/// `tok_pos[t]` (i32, device); writes Q and the K/V of row `t` into row `tok_slot[t]` (= page *
/// page size + position within the page) of the layer's pools `k_pool`/`v_pool`
/// (`[pages * page size, G, d]`).
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    gpu: &Gpu,
    shape: &AttentionShape,
    qkv: u64,
    q_weight: u64,
    k_weight: u64,
    q_out: u64,
    k_pool: u64,
    v_pool: u64,
    tok_pos: u64,
    tok_slot: u64,
    tokens: usize,
    theta: f32,
    eps: f32,
) -> CudaResult<()> {
    shape.check()?;
    let heads = shape.heads + 2 * shape.kv_heads;
    let cfg = LaunchConfig::new((tokens as u32, heads as u32, 1), 32, 0);
    cuda_launch!(
        gpu,
        "qk_norm_rope",
        cfg,
        qkv,
        q_weight,
        k_weight,
        q_out,
        k_pool,
        v_pool,
        tok_pos,
        tok_slot,
        shape.heads as i32,
        shape.kv_heads as i32,
        shape.head_dim as i32,
        shape.rotary_dim as i32,
        theta,
        eps
    )
}

/// Whether head dim `d` runs the register-resident tensor-core kernel (`attention_fa_d{D}`)
/// rather than the general WMMA one (`attention_d{D}`).
pub fn attention_uses_fa(d: usize) -> bool {
    d == 64 || d == 128
}

/// Dynamic shared memory of the attention kernel for head dim `d`; mirrors `Smem<D>` and
/// `FaSmem<D>` in kernels/attention.cu.
pub fn attention_smem_bytes(d: usize) -> usize {
    let (rows, kt) = (64, 64);
    let ldq = d + 8;
    if attention_uses_fa(d) {
        return 2 * (rows * ldq + 4 * kt * ldq);
    }
    let lds = kt + 4;
    let ldp = kt + 8;
    let ldo = d + 4;
    2 * rows * ldq
        + 2 * 2 * kt * ldq
        + 4 * rows * lds
        + 2 * rows * ldp
        + 4 * rows * ldo
        + 4 * rows * 4
}

/// Scratch floats the attention needs for `splits` key splits over `tokens` query tokens:
/// (partial outputs, partial (max, sum) pairs).
pub fn attention_scratch_len(
    shape: &AttentionShape,
    tokens: usize,
    splits: usize,
) -> (usize, usize) {
    (
        splits * tokens * shape.heads * shape.head_dim,
        splits * tokens * shape.heads * 2,
    )
}

/// Tokens of one segment that one attention CTA takes: the GQA group's heads times this many
/// tokens fill its 64 query rows (some stay idle when the group does not divide 64).
pub fn attention_tile_tokens(shape: &AttentionShape) -> usize {
    (64 / (shape.heads / shape.kv_heads.max(1)).max(1)).max(1)
}

/// One segment of a batched forward as the attention kernels see it (`segs` entries, i32):
/// its first row in the batch, its length, the absolute position of its first row and the
/// offset of its block table in `tables`.
pub type AttentionSegment = [i32; 4];

/// The attention CTAs' work list for segments of these lengths: `(segment, first token)` i32
/// pairs, [`attention_tile_tokens`] tokens each.
pub fn attention_tiles(shape: &AttentionShape, lens: &[usize]) -> Vec<[i32; 2]> {
    let tq = attention_tile_tokens(shape);
    lens.iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).step_by(tq).map(move |t| [s as i32, t as i32]))
        .collect()
}

/// Device arrays describing a batched forward to the attention kernels: `segs`
/// ([`AttentionSegment`] per segment), `tiles` (from [`attention_tiles`]; `tiles_count` of them)
/// and `tables` (every segment's block table: page ids of the layer pools, page size = block).
#[derive(Clone, Copy, Debug)]
pub struct AttentionBatch {
    pub segs: u64,
    pub tiles: u64,
    pub tables: u64,
    pub tiles_count: usize,
}

/// Keys per split of the batch-invariant attention: split `z` covers key positions
/// `[z · 256, (z + 1) · 256)` of every query row, whatever the forward around it.
pub const ATTENTION_CHUNK_KEYS: usize = 256;
/// Most splits `attention_combine` merges (a 64K-token context).
pub const ATTENTION_MAX_SPLITS: usize = 256;

/// How the attention cuts each query row's keys over CTAs (`gridDim.z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionSplits {
    /// Each tile's keys in this many equal parts: fills the GPU on short forwards, but the cut
    /// (and so a row's rounding) moves with the batch.
    Even(usize),
    /// Splits of [`ATTENTION_CHUNK_KEYS`] at fixed key positions, this many of them (enough for
    /// the forward's longest key range): a row's result depends on its own keys only.
    FixedChunks(usize),
}

impl AttentionSplits {
    pub fn count(self) -> usize {
        match self {
            AttentionSplits::Even(n) | AttentionSplits::FixedChunks(n) => n.max(1),
        }
    }
}

/// Block-causal attention of a batch's `tokens` query rows, each segment over its own keys
/// `0..pos0 + len` read through its block table from the layer's pools (`[pages * block, G, d]`),
/// the key range split over `splits` CTAs, merged into `out [tokens, H, d]` (BF16).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: u64,
    k_pool: u64,
    v_pool: u64,
    part_o: u64,
    part_ml: u64,
    out: u64,
    batch: &AttentionBatch,
    tokens: usize,
    splits: AttentionSplits,
) -> CudaResult<()> {
    shape.check()?;
    let (splits, chunk_tiles) = match splits {
        AttentionSplits::Even(n) => (n.max(1), 0),
        AttentionSplits::FixedChunks(n) => (n.max(1), ATTENTION_CHUNK_KEYS / 64),
    };
    if splits > ATTENTION_MAX_SPLITS {
        return unsupported(format!(
            "{splits} attention key splits (at most {ATTENTION_MAX_SPLITS}: a context of {} keys)",
            ATTENTION_MAX_SPLITS * ATTENTION_CHUNK_KEYS
        ));
    }
    if batch.tiles_count == 0 || tokens == 0 {
        return Ok(());
    }
    let d = shape.head_dim;
    let cfg = LaunchConfig {
        grid: (
            batch.tiles_count as u32,
            shape.kv_heads as u32,
            splits.max(1) as u32,
        ),
        block: (128, 1, 1),
        shared_bytes: attention_smem_bytes(d) as u32,
    };
    let scale = 1.0 / (d as f32).sqrt();
    let name = if attention_uses_fa(d) {
        format!("attention_fa_d{d}")
    } else {
        format!("attention_d{d}")
    };
    cuda_launch!(
        gpu,
        &name,
        cfg,
        q,
        k_pool,
        v_pool,
        part_o,
        part_ml,
        batch.segs,
        batch.tiles,
        batch.tables,
        tokens as i32,
        shape.heads as i32,
        shape.kv_heads as i32,
        shape.block as i32,
        scale,
        chunk_tiles as i32
    )?;
    let cfg = LaunchConfig::new((tokens as u32, shape.heads as u32, 1), d.min(256) as u32, 0);
    cuda_launch!(
        gpu,
        "attention_combine",
        cfg,
        part_o,
        part_ml,
        out,
        tokens as i32,
        shape.heads as i32,
        d as i32,
        splits as i32
    )
}

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
            gpu, shape, logits, bias, topk_idx, topk_w, tokens, blocks, None,
        );
    }
    let e = shape.experts;
    let (n_group, topk_group) = shape.groups.unwrap_or((1, 1));
    let shared = 4 * (2 * e + 64 + shape.top_k);
    let cfg = LaunchConfig::new((tokens as u32, 1, 1), thread_per_expert(e), shared as u32);
    cuda_launch!(
        gpu,
        "route_topk",
        cfg,
        logits,
        bias,
        e as i32,
        shape.top_k as i32,
        n_group as i32,
        topk_group as i32,
        shape.scale,
        topk_idx,
        topk_w
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
    )
}

/// A thread per expert, rounded up to whole warps (the router kernels' thread j owns expert j).
fn thread_per_expert(experts: usize) -> u32 {
    (experts.div_ceil(32) * 32) as u32
}

/// Tokens per `route_block` CTA and its threads: one token and a thread per expert for short
/// forwards (a denoising step's 32 CTAs work side by side), a whole routing block on 1,024
/// threads for long ones (prefill: each block's admission computed once, as many CTAs as blocks),
/// as far as the block's scores fit the shared-memory opt-in.
fn route_launch_shape(tokens: usize, experts: usize, block: usize) -> (usize, u32) {
    let per_expert = thread_per_expert(experts);
    if tokens <= 256 {
        return (1, per_expert);
    }
    let fits = super::ptx::ROUTER_MAX_SHARED as usize / (8 * experts);
    let tpc = block.min(ROUTE_MAX_TOKENS).min(fits).max(1);
    (tpc, per_expert.max(1024))
}

/// `route_block` (kernels/router.cu): 2.2 admission and top-k, a few tokens per CTA; with a pool
/// it also lays out the admitted pool (one routing block only).
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
) -> CudaResult<()> {
    let (e, capacity) = (shape.experts, shape.capacity.unwrap_or(0));
    let (tpc, threads) = route_launch_shape(tokens, e, shape.block);
    let (blocks_ptr, n_blocks) = match blocks {
        RoutingBlocks::Uniform => (0, tokens.div_ceil(shape.block)),
        RoutingBlocks::Listed { ptr, count } => (ptr, count),
    };
    if n_blocks == 0 {
        return Ok(());
    }
    let ctas = n_blocks * shape.block.div_ceil(tpc);
    let cfg = LaunchConfig::new((ctas as u32, 1, 1), threads, (2 * tpc * e * 4) as u32);
    // No pool: null address arrays tell the kernel to skip the pool outputs.
    let p = pool.copied().unwrap_or_default();
    cuda_launch!(
        gpu,
        "route_block",
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
        p.row_stride as i32
    )
}

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
        && super::tuning::tuning().pool_gemm
        && (1..=32).contains(&tokens)
        && n.is_multiple_of(128)
        && k.is_multiple_of(128)
}

/// `Y_q[t, n] = X_q[t, :] . W_q[n, :]` for pool entries `q < entries` (BF16, F32 accumulation):
/// the product of [`super::blas::Blas::gemm_bf16_batched`] over device arrays of the entries'
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
    cuda_launch!(
        gpu,
        "pool_gemm_tma",
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
        i32::from(weights_ready)
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
/// `MINNOW_GROUPED_TMA=1`: see `tuning::Tuning::grouped_tma`.)
pub fn grouped_tma_supported(gpu: &Gpu, tile_rows: usize, n: usize, k: usize) -> bool {
    gpu.uses_sm90_ptx()
        && [16, 64].contains(&tile_rows)
        && gpu.max_shared_optin() as usize >= grouped_tma_smem_bytes(tile_rows)
        && n.is_multiple_of(128)
        && k.is_multiple_of(128)
}

/// The grouped expert GEMM of [`grouped_gemm`] with the weights streamed through TMA by one
/// persistent CTA per multiprocessor: `Y[p] = X[row_token[p] or p] . W[e]^T` over the dispatched
/// tiles, the same bits as [`grouped_gemm`] (same tensor-core products, same order over K).
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
    tiles: u64,
    num_tiles: u64,
    max_tiles: usize,
    tile_rows: usize,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    if !grouped_tma_supported(gpu, tile_rows, n, k) {
        return unsupported(format!(
            "TMA expert GEMM of {n} x {k} in tiles of {tile_rows} rows"
        ));
    }
    let items = max_tiles * n / 128;
    if items == 0 {
        return Ok(());
    }
    let name = if tile_rows == 16 {
        "grouped_gemm_tma_r16"
    } else {
        "grouped_gemm_tma_r64"
    };
    let cfg = LaunchConfig::new(
        ((items as u32).min(gpu.sm_count()), 1, 1),
        288,
        grouped_tma_smem_bytes(tile_rows) as u32,
    );
    cuda_launch!(
        gpu,
        name,
        cfg,
        w.map,
        w.base,
        w_ptr,
        x,
        row_token,
        y,
        tiles,
        num_tiles,
        n as i32,
        k as i32,
        i32::from(gated)
    )
}

/// Rows per tile of the grouped expert GEMM for `assignments` rows over `experts` that can get
/// them: 16 when experts get few rows each (decoding; the kernel then streams weights), 64 when
/// they get 12 or more (`MINNOW_MOE64_ROWS`; prefill, batches of many denoising blocks: a 16-row tile would
/// stream the same expert's weights once per tile; a 128-row tile with these 4-warp CTAs measured
/// slower, docs/performance.md).
pub fn moe_tile_rows(assignments: usize, experts: usize) -> usize {
    let busy = experts.min(assignments).max(1);
    if assignments / busy >= super::tuning::tuning().moe64_rows {
        64
    } else {
        16
    }
}

/// Upper bound of the tiles `moe_dispatch` can produce for `assignments` rows over `experts`
/// (the most experts that can receive rows: with 2.2 block admission far fewer than all, which
/// keeps the grouped GEMM's grid, whose CTAs past the real tile count exit at once, small).
pub fn moe_max_tiles(assignments: usize, experts: usize, tile_rows: usize) -> usize {
    assignments.div_ceil(tile_rows) + experts.min(assignments)
}

/// Sorts the `tokens * k` assignments by expert — plus, with `shared_expert`, one more per token to
/// that expert (assignment `tokens * k + t`) — into `slot_pos [A]`, `row_token [A]` (i32), the
/// tile list `tiles [max_tiles, 4]` (i32) cut at `tile_rows` rows, and `num_tiles [1]`. `experts`
/// counts the shared expert too.
#[allow(clippy::too_many_arguments)]
pub fn moe_dispatch(
    gpu: &Gpu,
    topk_idx: u64,
    tokens: usize,
    k: usize,
    experts: usize,
    tile_rows: usize,
    shared_expert: Option<usize>,
    slot_pos: u64,
    row_token: u64,
    tiles: u64,
    num_tiles: u64,
) -> CudaResult<()> {
    if shared_expert.is_some_and(|s| s >= experts) {
        return unsupported(format!(
            "shared expert index {shared_expert:?} of {experts} experts"
        ));
    }
    if experts > 1024 {
        return unsupported(format!("{experts} experts (at most 1024)"));
    }
    let cfg = LaunchConfig::new((1, 1, 1), 1024, (8 * experts) as u32);
    cuda_launch!(
        gpu,
        "moe_dispatch",
        cfg,
        topk_idx,
        (tokens * k) as i32,
        k as i32,
        experts as i32,
        tile_rows as i32,
        shared_expert.map_or(-1, |s| s as i32),
        slot_pos,
        row_token,
        tiles,
        num_tiles
    )
}

/// Dynamic shared memory of `grouped_gemm_m{16,64}`; mirrors `Tile<BM, STAGES>` in kernels/moe.cu.
fn grouped_gemm_smem_bytes(tile_rows: usize, stages: usize) -> usize {
    stages * (tile_rows + 64) * 72 * 2
}

/// Whether the tiled tensor-core kernels take an expert GEMM of `n` outputs over `k` inputs
/// (`n % 64 == 0`, `k % 32 == 0`); other shapes run `grouped_gemm_any`, slower but general.
pub fn grouped_gemm_tiled(n: usize, k: usize) -> bool {
    n.is_multiple_of(64) && k.is_multiple_of(32)
}

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
    // A planned cuBLASLt algorithm gives the same bits as the kernels below (checked when it
    // was planned: `blaslt::plan_dense_gemms`), faster at this row count.
    if let Some(lt) = gpu.blas_lt_if_created() {
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
        return cuda_launch!(
            gpu,
            "dense_gemm_any",
            cfg,
            x,
            w,
            y,
            m as i32,
            n as i32,
            k as i32
        );
    }
    let tuning = super::tuning::tuning();
    // 16-row tiles stream the weights with the most CTAs in flight; the lm_head (a vocabulary
    // of rows) fills the GPU with 64-row tiles anyway and then reads each weight panel once.
    let (name, rows, cols, threads, smem) = if m <= tuning.dense16_rows && n < 32768 {
        (
            "dense_gemm_m16",
            16,
            64,
            128,
            grouped_gemm_smem_bytes(16, 3),
        )
    } else if m < tuning.dense128_rows || !n.is_multiple_of(128) {
        (
            "dense_gemm_m64",
            64,
            64,
            128,
            grouped_gemm_smem_bytes(64, 3),
        )
    } else {
        ("dense_gemm_m128", 128, 128, 256, 3 * 256 * 72 * 2)
    };
    let cfg = LaunchConfig::new(
        (m.div_ceil(rows) as u32, (n / cols) as u32, 1),
        threads,
        smem as u32,
    );
    cuda_launch!(gpu, name, cfg, x, w, y, m as i32, n as i32, k as i32)
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
    // Both kernels compute every output in the same order (bits equal); the wide one shares
    // each loaded row among 4 experts per warp and wins once there are enough rows to fill the
    // GPU with its 4x fewer CTAs.
    let wide = t >= super::tuning::tuning().router_wide_rows;
    let (name, experts_per_cta) = match (wide, w_f32) {
        (false, true) => ("router_logits_f32w", 8),
        (false, false) => ("router_logits_bf16w", 8),
        (true, true) => ("router_logits_wide_f32w", 32),
        (true, false) => ("router_logits_wide_bf16w", 32),
    };
    let cfg = LaunchConfig::new(
        (t.div_ceil(16) as u32, e.div_ceil(experts_per_cta) as u32, 1),
        256,
        0,
    );
    cuda_launch!(gpu, name, cfg, x, w, logits, t as i32, e as i32, k as i32)
}

/// Grouped GEMM over the dispatched tiles (cut at `tile_rows`, 16 or 64): `Y[p] =
/// X[row_token[p] or p] . W[e]^T` with `W [E, n, k]`. `row_token` 0 means rows are read in place.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm(
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: u64,
    y: u64,
    tiles: u64,
    num_tiles: u64,
    max_tiles: usize,
    tile_rows: usize,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    if ![16, 64].contains(&tile_rows) {
        return unsupported(format!("expert GEMM tiles of {tile_rows} rows"));
    }
    if max_tiles == 0 {
        return Ok(());
    }
    if !grouped_gemm_tiled(n, k) {
        // Shapes the tiled kernels refuse (e.g. 24-wide experts): the general kernel.
        let cfg = LaunchConfig::new((n.div_ceil(64) as u32, max_tiles as u32, 1), 64, 0);
        return cuda_launch!(
            gpu,
            "grouped_gemm_any",
            cfg,
            x,
            row_token,
            w,
            y,
            tiles,
            num_tiles,
            n as i32,
            k as i32
        );
    }
    let (name, stages) = match (tile_rows, super::tuning::tuning().moe16_stages) {
        (16, 3) => ("grouped_gemm_m16s3", 3),
        (16, _) => ("grouped_gemm_m16", 4),
        _ => ("grouped_gemm_m64", 3),
    };
    let cfg = LaunchConfig::new(
        ((n / 64) as u32, max_tiles as u32, 1),
        128,
        grouped_gemm_smem_bytes(tile_rows, stages) as u32,
    );
    cuda_launch!(gpu, name, cfg, x, row_token, w, y, tiles, num_tiles, n as i32, k as i32)
}

/// Routed expert weights stored as `*_mma` codes (tiles of 8 rows x 16 columns in tensor-core
/// fragment order) with FP16 group scales: what the quantized grouped GEMM reads.
#[derive(Clone, Copy, Debug)]
pub struct CodeMatrices {
    /// 8 (`i8_mma`) or 4 (`i4_mma`).
    pub bits: u32,
    /// Columns per scale.
    pub group: usize,
    pub codes: u64,
    pub scales: u64,
}

/// Dynamic shared memory of `grouped_gemm_i{8,4}_r{16,64}`: two chunks of the tile's activation
/// rows, 256 columns each at a pitch of 264 (mirrors `codes_tile` in kernels/moe.cu).
fn codes_tile_smem_bytes(tile_rows: usize) -> usize {
    2 * tile_rows * 264 * 2
}

/// The grouped GEMM of [`grouped_gemm`] over quantized experts: each weight is used as
/// BF16(code x scale), the products summed in F32 in the same fixed order as the BF16 kernels
/// (so a row's result does not depend on the batch). Needs `n % 8 == 0`, `k % 16 == 0` and a
/// group that divides `k` (the format's rules for `*_mma`).
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_codes(
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    tiles: u64,
    num_tiles: u64,
    max_tiles: usize,
    tile_rows: usize,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    if ![16, 64].contains(&tile_rows) {
        return unsupported(format!("expert GEMM tiles of {tile_rows} rows"));
    }
    // The kernels per encoding: (16-row tiles, 64-row tiles, the general kernel).
    let (r16, r64, any) = match w.bits {
        8 => (
            "grouped_gemm_i8_r16",
            "grouped_gemm_i8_r64",
            "grouped_gemm_i8_any",
        ),
        4 => (
            "grouped_gemm_i4_r16",
            "grouped_gemm_i4_r64",
            "grouped_gemm_i4_any",
        ),
        b => return unsupported(format!("{b}-bit expert codes")),
    };
    if !n.is_multiple_of(8) || !k.is_multiple_of(16) || w.group == 0 || !k.is_multiple_of(w.group) {
        return unsupported(format!(
            "quantized experts of {n} x {k} with groups of {}",
            w.group
        ));
    }
    if max_tiles == 0 {
        return Ok(());
    }
    // Shapes the tiled kernels refuse take the general kernel; tiles of 16 and 64 rows load
    // fragments straight from memory into registers (`codes_tile` in kernels/moe.cu).
    let (name, cfg) = if grouped_gemm_tiled(n, k) {
        (
            if tile_rows == 16 { r16 } else { r64 },
            LaunchConfig::new(
                ((n / 64) as u32, max_tiles as u32, 1),
                128,
                codes_tile_smem_bytes(tile_rows) as u32,
            ),
        )
    } else {
        (
            any,
            LaunchConfig::new((n.div_ceil(64) as u32, max_tiles as u32, 1), 64, 0),
        )
    };
    cuda_launch!(
        gpu,
        name,
        cfg,
        x,
        row_token,
        w.codes,
        w.scales,
        w.group as i32,
        y,
        tiles,
        num_tiles,
        n as i32,
        k as i32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attention(
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        rotary_dim: usize,
    ) -> AttentionShape {
        AttentionShape {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block: 32,
        }
    }

    #[test]
    fn attention_shapes_of_the_family_are_supported() {
        // mini / flash (16 or 32 query heads over 4 KV heads of 128) and the tiny fixtures.
        assert!(attention(16, 4, 128, 64).check().is_ok());
        assert!(attention(32, 4, 128, 64).check().is_ok());
        assert!(attention(4, 2, 16, 8).check().is_ok());
    }

    #[test]
    fn unsupported_attention_shapes_are_errors_not_launches() {
        assert!(
            attention(16, 3, 128, 64).check().is_err(),
            "heads not a multiple of KV heads"
        );
        assert!(
            attention(48, 2, 128, 64).check().is_ok(),
            "a group of 24 leaves 16 of a CTA's 64 rows idle"
        );
        assert!(attention(6, 2, 64, 32).check().is_ok(), "GQA group 3");
        assert!(
            attention(130, 2, 128, 64).check().is_err(),
            "a group of 65 does not fit a CTA"
        );
        assert!(
            attention(16, 4, 96, 48).check().is_err(),
            "head dim without a kernel"
        );
        assert!(attention(16, 4, 128, 65).check().is_err(), "odd rotary dim");
        assert!(attention(16, 0, 128, 64).check().is_err());
    }

    #[test]
    fn attention_tiles_stay_inside_their_segment() {
        // Group 3: 21 tokens per CTA; segments of 5, 21 and 43 tokens.
        let s = attention(6, 2, 64, 32);
        assert_eq!(attention_tile_tokens(&s), 21);
        assert_eq!(
            attention_tiles(&s, &[5, 21, 43]),
            vec![[0, 0], [1, 0], [2, 0], [2, 21], [2, 42]]
        );
        assert_eq!(attention_tile_tokens(&attention(16, 4, 128, 64)), 16);
    }

    #[test]
    fn attention_shared_memory_mirrors_the_kernels() {
        // FaSmem<128>::total and Smem<16>::total in kernels/attention.cu (static_asserts there).
        assert_eq!(attention_smem_bytes(128), 64 * 136 * 2 * 5);
        assert!(attention_uses_fa(128) && attention_uses_fa(64) && !attention_uses_fa(16));
        assert!(attention_smem_bytes(256) <= 200 * 1024);
    }

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
    fn pool_gemm_shared_memory_fits_its_opt_in() {
        // minnow_pool::SMEM_BYTES in kernels/pool_gemm.cu (static_assert there) within the
        // module's opt-in and a multiprocessor's 227 KiB.
        assert_eq!(pool_gemm_smem_bytes(), 5 * 40960 + 1024 + 8192 + 80);
        let module = super::super::ptx::MODULES
            .iter()
            .find(|m| m.name == "pool_gemm")
            .unwrap();
        assert!(pool_gemm_smem_bytes() <= module.max_dynamic_shared as usize);
        assert!(module.max_dynamic_shared as usize <= 227 * 1024);
    }

    #[test]
    fn route_block_shapes() {
        // A denoising step: one token per CTA, a thread per expert.
        assert_eq!(route_launch_shape(32, 256, 32), (1, 256));
        assert_eq!(route_launch_shape(5, 16, 32), (1, 32));
        // Prefill: a routing block per CTA on 1,024 threads, as far as its scores fit.
        assert_eq!(route_launch_shape(4096, 256, 32), (32, 1024));
        assert_eq!(route_launch_shape(4096, 1024, 32), (8, 1024));
        assert!(2 * 32 * 256 * 4 <= super::super::ptx::ROUTER_MAX_SHARED as usize);
    }

    #[test]
    fn expert_tiles_follow_rows_per_expert() {
        // A denoising step: 32 tokens x 8 picks over 256 experts -> few rows per expert.
        assert_eq!(moe_tile_rows(256, 256), 16);
        // An 8K prefill: 65,536 picks -> 256 rows per expert on average.
        assert_eq!(moe_tile_rows(65_536, 256), 64);
        // 4, 16 and 64 denoising blocks of 2.2 (up to 48 admitted experts per block).
        assert_eq!(moe_tile_rows(4 * 32 * 8, 4 * 48), 16);
        assert_eq!(moe_tile_rows(16 * 32 * 8, 256), 64);
        assert_eq!(moe_tile_rows(64 * 32 * 8, 256), 64);
        // The bound covers the worst case: every expert gets a partial tile.
        assert_eq!(moe_max_tiles(256, 256, 16), 16 + 256);
        assert_eq!(moe_max_tiles(4, 256, 16), 1 + 4);
        assert_eq!(grouped_gemm_smem_bytes(16, 3), 3 * 80 * 72 * 2);
        assert_eq!(grouped_gemm_smem_bytes(64, 3), 3 * 128 * 72 * 2);
        assert_eq!(codes_tile_smem_bytes(64), 67584);
    }
}
