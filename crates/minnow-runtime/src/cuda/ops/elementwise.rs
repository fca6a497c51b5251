//! Launchers of `kernels/elementwise.cu`: the embedding gather, RMSNorm with the residual add,
//! SiLU-multiply, the MoE combine (alone or fused with the next norm), BF16 widening, the
//! per-row top-1 and the random fill.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::unsupported::unsupported;

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
    let cfg = embed_launch(rows, d)?;
    kernels::elementwise::embed_rows(gpu, cfg, ids, table, out, d as i32)
}

/// [`embed_rows`] widened to F32 into `out` (`[rows, d]` F32): the residual stream's first
/// value, exact.
pub fn embed_rows_f32(
    gpu: &Gpu,
    ids: u64,
    table: u64,
    out: u64,
    rows: usize,
    d: usize,
) -> CudaResult<()> {
    let cfg = embed_launch(rows, d)?;
    kernels::elementwise::embed_rows_f32(gpu, cfg, ids, table, out, d as i32)
}

/// One CTA per gathered row, 8 columns per thread.
fn embed_launch(rows: usize, d: usize) -> CudaResult<LaunchConfig> {
    if !d.is_multiple_of(8) {
        return unsupported(format!("embedding width {d} is not a multiple of 8"));
    }
    Ok(LaunchConfig::new(
        (rows as u32, 1, 1),
        row_threads(d / 8),
        0,
    ))
}

/// `h = h + F32(delta)` (when `delta` is non-zero) then `out = RMSNorm(h) * weight`, per row. The
/// residual stream `h` is F32 (`[rows, d]`); `delta`, `weight` and `out` are BF16.
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
    kernels::elementwise::add_rmsnorm(gpu, cfg, h, delta, weight, out, d as i32, eps)
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
    kernels::elementwise::silu_mul(gpu, cfg, gu, out, width as i32, rows as i32, stride as i32)
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
    kernels::elementwise::moe_combine(
        gpu,
        cfg,
        y,
        slot_pos,
        w,
        shared,
        shared_rows,
        out,
        k as i32,
        d as i32,
    )
}

/// Where an MoE layer's output goes in [`moe_combine_add_rmsnorm`]: the F32 residual stream `h`
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

/// [`moe_combine`] fused with the [`add_rmsnorm`] that follows it: `h[t] += F32(mix[t])`,
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
    kernels::elementwise::moe_combine_add_rmsnorm(
        gpu,
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
        norm.eps,
    )
}

pub fn bf16_to_f32(gpu: &Gpu, x: u64, y: u64, n: usize) -> CudaResult<()> {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    kernels::elementwise::bf16_to_f32(
        gpu,
        LaunchConfig::new((blocks, 1, 1), 256, 0),
        x,
        y,
        n as i64,
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
    kernels::elementwise::top1_partial(gpu, cfg, logits, scratch, vocab as i32)?;
    let cfg = LaunchConfig::new((rows as u32, 1, 1), 32, 0);
    kernels::elementwise::top1_finish(gpu, cfg, scratch, token, confidence, TOP1_SLICES as i32)
}

/// Most ids [`topk_rows`] returns per row (the kernel's `TOPK_MAX`).
pub const TOPK_MAX: usize = 64;

/// Per row of BF16 logits `[rows, vocab]`: the first `k` ids (`k <= TOPK_MAX`, `k <= vocab`) in
/// the order larger value first (NaN below every number, -0 equal to +0), lower id first, into
/// `ids[rows, k]` (u32), and their logits into `values[rows, k]` (F32). One CTA per row.
pub fn topk_rows(
    gpu: &Gpu,
    logits: u64,
    ids: u64,
    values: u64,
    rows: usize,
    vocab: usize,
    k: usize,
) -> CudaResult<()> {
    if k == 0 || k > TOPK_MAX || k > vocab {
        return unsupported(format!(
            "top-{k} of rows of {vocab} logits (1 to {TOPK_MAX}, at most the vocabulary)"
        ));
    }
    let cfg = LaunchConfig::new((rows as u32, 1, 1), 512, 0);
    kernels::elementwise::topk_rows(gpu, cfg, logits, ids, values, vocab as i32, k as i32)
}

/// Reproducible uniform random BF16 values in `[-scale, scale)`.
pub fn fill_random_bf16(gpu: &Gpu, x: u64, n: usize, seed: u64, scale: f32) -> CudaResult<()> {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    kernels::elementwise::fill_random_bf16(
        gpu,
        LaunchConfig::new((blocks, 1, 1), 256, 0),
        x,
        n as i64,
        seed,
        scale,
    )
}
