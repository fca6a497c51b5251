//! Launchers of `kernels/rope.cu` and `kernels/attention.cu`: the attention shapes they take,
//! QK-norm with RoPE into the paged K/V pools, and the block-causal attention over key splits
//! with its combine.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::unsupported::unsupported;

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

/// Words of [`rope_cos_sin`]'s table for `tokens` rows: one (cos, sin) BF16 pair per row and
/// rotary frequency.
pub fn rope_cos_sin_len(shape: &AttentionShape, tokens: usize) -> usize {
    tokens * (shape.rotary_dim / 2)
}

/// The BF16 cosines and sines of the rotary angles of `tokens` rows, row `t` at absolute position
/// `tok_pos[t]` (i32, device), into `cos_sin` ([`rope_cos_sin_len`] u32 words): computed once per
/// forward for every layer's [`qk_norm_rope`].
pub fn rope_cos_sin(
    gpu: &Gpu,
    shape: &AttentionShape,
    tok_pos: u64,
    cos_sin: u64,
    tokens: usize,
    theta: f32,
) -> CudaResult<()> {
    shape.check()?;
    let n = rope_cos_sin_len(shape, tokens);
    if n == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::new((n.div_ceil(256) as u32, 1, 1), 256, 0);
    kernels::rope::rope_cos_sin(
        gpu,
        cfg,
        tok_pos,
        cos_sin,
        tokens as i32,
        shape.rotary_dim as i32,
        theta,
    )
}

/// QK-norm + partial RoPE of `tokens` rows of fused QKV, row `t`'s angles in row `t` of
/// `cos_sin` ([`rope_cos_sin`]); writes Q and the K/V of row `t` into row `tok_slot[t]` (= page *
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
    cos_sin: u64,
    tok_slot: u64,
    tokens: usize,
    eps: f32,
) -> CudaResult<()> {
    shape.check()?;
    let heads = shape.heads + 2 * shape.kv_heads;
    // ROPE_WARPS (kernels/rope.cu) heads of one token per CTA.
    const ROPE_WARPS: usize = 8;
    let cfg = LaunchConfig::new(
        (tokens as u32, heads.div_ceil(ROPE_WARPS) as u32, 1),
        32 * ROPE_WARPS as u32,
        0,
    );
    // Up to 4 elements per lane where the head dim allows: fewer registers a thread, so more
    // CTAs fit an SM (kernels/rope.cu); the same arithmetic.
    let launch: kernels::rope::QkNormRope = if shape.head_dim <= 128 {
        kernels::rope::qk_norm_rope_d128
    } else {
        kernels::rope::qk_norm_rope
    };
    launch(
        gpu,
        cfg,
        qkv,
        q_weight,
        k_weight,
        q_out,
        k_pool,
        v_pool,
        cos_sin,
        tok_slot,
        shape.heads as i32,
        shape.kv_heads as i32,
        shape.head_dim as i32,
        shape.rotary_dim as i32,
        eps,
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
    tiles_of(attention_tile_tokens(shape), lens)
}

/// The work list of the wgmma kernel (one CTA per 128 query rows, two tiles of
/// [`attention_tiles`]): `(segment, first token)` pairs, twice [`attention_tile_tokens`] tokens
/// each.
pub fn attention_wide_tiles(shape: &AttentionShape, lens: &[usize]) -> Vec<[i32; 2]> {
    tiles_of(2 * attention_tile_tokens(shape), lens)
}

fn tiles_of(tokens: usize, lens: &[usize]) -> Vec<[i32; 2]> {
    lens.iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).step_by(tokens).map(move |t| [s as i32, t as i32]))
        .collect()
}

/// Device arrays describing a batched forward to the attention kernels: `segs`
/// ([`AttentionSegment`] per segment), `tiles` (from [`attention_tiles`]; `tiles_count` of them),
/// `wide_tiles` (from [`attention_wide_tiles`]; `wide_tiles_count`) and `tables` (every segment's
/// block table: page ids of the layer pools, page size = block).
#[derive(Clone, Copy, Debug)]
pub struct AttentionBatch {
    pub segs: u64,
    pub tiles: u64,
    pub tables: u64,
    pub tiles_count: usize,
    pub wide_tiles: u64,
    pub wide_tiles_count: usize,
}

/// Keys per split of the batch-invariant attention, C: split `z` covers key positions
/// `[z · C, (z + 1) · C)` of every query row, whatever the forward around it. 256 unless
/// `MINNOW_ATTN_CHUNK_KEYS` sets 128 or 512 for the whole process (`Tuning::attn_chunk_keys`:
/// other bits, since a row's keys then fold in other chunks, but the same in every forward).
pub fn attention_chunk_keys() -> usize {
    super::super::tuning::tuning().attn_chunk_keys
}
/// Most splits `attention_combine` merges (a 64K-token context at 256 keys per split).
pub const ATTENTION_MAX_SPLITS: usize = 256;

/// How the attention cuts each query row's keys over CTAs (`gridDim.z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionSplits {
    /// Each tile's keys in this many equal parts: fills the GPU on short forwards, but the cut
    /// (and so a row's rounding) moves with the batch.
    Even(usize),
    /// Splits of [`attention_chunk_keys`] keys at fixed key positions, this many of them (enough for
    /// the forward's longest key range): a row's result depends on its own keys only.
    FixedChunks(usize),
    /// The same fixed chunks walked in order by one CTA per tile, which folds them as the
    /// combine would and writes the output: the bits of [`AttentionSplits::FixedChunks`] without
    /// the partials' round trip through memory, for forwards with enough tiles to fill the GPU.
    /// Head dims of the tensor-core kernel only ([`attention_uses_fa`]); on Hopper, head dim
    /// 128 runs the wgmma kernel over wide tiles ([`attention_wgmma_supported`]), same bits.
    FixedChunksInOneCta,
}

impl AttentionSplits {
    pub fn count(self) -> usize {
        match self {
            AttentionSplits::Even(n) | AttentionSplits::FixedChunks(n) => n.max(1),
            AttentionSplits::FixedChunksInOneCta => 1,
        }
    }

    /// F32 partials (O, m, l) each query row leaves in memory for the combine: one per split,
    /// none when one CTA per tile folds the chunks itself (the scratch [`attention`] needs).
    pub fn partials_per_row(self) -> usize {
        match self {
            AttentionSplits::FixedChunksInOneCta => 0,
            other => other.count(),
        }
    }
}

/// Tiles x KV heads x `splits` CTAs of 128 threads.
fn attention_grid(shape: &AttentionShape, batch: &AttentionBatch, splits: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (
            batch.tiles_count as u32,
            shape.kv_heads as u32,
            splits as u32,
        ),
        block: (128, 1, 1),
        shared_bytes: attention_smem_bytes(shape.head_dim) as u32,
    }
}

/// Dynamic shared memory of `attention_wgmma_seq_d128`: 1 KB to align the stages to the swizzle
/// atom, two stages of a 64-key tile's K and V (32 KB each), the two warpgroups' running folds
/// (64 KB), four mbarriers (minnow_attn_wgmma::SMEM_BYTES in kernels/attention_wgmma.cu).
pub const fn attention_wgmma_smem_bytes() -> usize {
    1024 + 2 * 32 * 1024 + 64 * 1024 + 4 * 8
}

/// Whether [`AttentionSplits::FixedChunksInOneCta`] runs on the wgmma kernel: head dim 128, the
/// sm_90a build loaded (compute capability 9.0), enough shared memory, and
/// `Tuning::attention_wgmma` (`MINNOW_ATTN_WGMMA`, on by default).
pub fn attention_wgmma_supported(gpu: &Gpu, shape: &AttentionShape) -> bool {
    shape.head_dim == 128
        && gpu.uses_sm90a_ptx()
        && gpu.max_shared_optin() as usize >= attention_wgmma_smem_bytes()
        && super::super::tuning::tuning().attention_wgmma
}

/// [`attention`] with [`AttentionSplits::FixedChunksInOneCta`]: one CTA per tile walks its fixed
/// chunks and writes the output (no partials, no combine).
#[allow(clippy::too_many_arguments)]
fn attention_in_one_cta(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: u64,
    k_pool: u64,
    v_pool: u64,
    out: u64,
    batch: &AttentionBatch,
    tokens: usize,
) -> CudaResult<()> {
    use kernels::attention::{attention_fa_seq_d128, attention_fa_seq_d64, AttentionOneCta};
    let d = shape.head_dim;
    let chunk_tiles = (attention_chunk_keys() / 64) as i32;
    if batch.wide_tiles_count > 0 && tokens > 0 && attention_wgmma_supported(gpu, shape) {
        let cfg = LaunchConfig {
            grid: (batch.wide_tiles_count as u32, shape.kv_heads as u32, 1),
            block: (384, 1, 1),
            shared_bytes: attention_wgmma_smem_bytes() as u32,
        };
        return kernels::attention_wgmma::attention_wgmma_seq_d128(
            gpu,
            cfg,
            q,
            k_pool,
            v_pool,
            out,
            batch.segs,
            batch.wide_tiles,
            batch.tables,
            tokens as i32,
            shape.heads as i32,
            shape.kv_heads as i32,
            shape.block as i32,
            1.0 / (d as f32).sqrt(),
            chunk_tiles,
        );
    }
    let kernel: AttentionOneCta = match d {
        64 => attention_fa_seq_d64,
        128 => attention_fa_seq_d128,
        _ => {
            return unsupported(format!(
                "attention in one CTA per tile for head_dim {d} (64 or 128)"
            ))
        }
    };
    if batch.tiles_count == 0 || tokens == 0 {
        return Ok(());
    }
    kernel(
        gpu,
        attention_grid(shape, batch, 1),
        q,
        k_pool,
        v_pool,
        out,
        batch.segs,
        batch.tiles,
        batch.tables,
        tokens as i32,
        shape.heads as i32,
        shape.kv_heads as i32,
        shape.block as i32,
        1.0 / (d as f32).sqrt(),
        chunk_tiles,
    )
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
    let d = shape.head_dim;
    let scale = 1.0 / (d as f32).sqrt();
    let (splits, chunk_tiles) = match splits {
        AttentionSplits::Even(n) => (n.max(1), 0),
        AttentionSplits::FixedChunks(n) => (n.max(1), attention_chunk_keys() / 64),
        AttentionSplits::FixedChunksInOneCta => {
            return attention_in_one_cta(gpu, shape, q, k_pool, v_pool, out, batch, tokens)
        }
    };
    if splits > ATTENTION_MAX_SPLITS {
        return unsupported(format!(
            "{splits} attention key splits (at most {ATTENTION_MAX_SPLITS}: a context of {} keys)",
            ATTENTION_MAX_SPLITS * attention_chunk_keys()
        ));
    }
    if batch.tiles_count == 0 || tokens == 0 {
        return Ok(());
    }
    use kernels::attention::{
        attention_d128, attention_d16, attention_d256, attention_d32, attention_d64,
        attention_fa_d128, attention_fa_d64, Attention,
    };
    let kernel: Attention = match (attention_uses_fa(d), d) {
        (true, 64) => attention_fa_d64,
        (true, 128) => attention_fa_d128,
        (false, 16) => attention_d16,
        (false, 32) => attention_d32,
        (false, 64) => attention_d64,
        (false, 128) => attention_d128,
        (false, 256) => attention_d256,
        _ => return unsupported(format!("head_dim {d}")),
    };
    kernel(
        gpu,
        attention_grid(shape, batch, splits),
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
        chunk_tiles as i32,
    )?;
    let cfg = LaunchConfig::new((tokens as u32, shape.heads as u32, 1), d.min(256) as u32, 0);
    kernels::attention::attention_combine(
        gpu,
        cfg,
        part_o,
        part_ml,
        out,
        tokens as i32,
        shape.heads as i32,
        d as i32,
        splits as i32,
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
    fn wide_tiles_pair_the_tiles_inside_each_segment() {
        // Mini's group of 4: 32 tokens (one block) per wgmma CTA; a segment's last wide tile may
        // hold a single narrow one.
        let s = attention(16, 4, 128, 32);
        assert_eq!(
            attention_wide_tiles(&s, &[70, 32]),
            vec![[0, 0], [0, 32], [0, 64], [1, 0]]
        );
        let s = attention(6, 2, 64, 32);
        assert_eq!(attention_wide_tiles(&s, &[43]), vec![[0, 0], [0, 42]]);
    }

    #[test]
    fn wgmma_attention_shared_memory_mirrors_the_kernel() {
        // minnow_attn_wgmma::SMEM_BYTES in kernels/attention_wgmma.cu (static_assert there).
        assert_eq!(attention_wgmma_smem_bytes(), 1024 + 2 * 32768 + 65536 + 32);
        assert!(attention_wgmma_smem_bytes() <= 200 * 1024);
    }

    #[test]
    fn attention_shared_memory_mirrors_the_kernels() {
        // FaSmem<128>::total and Smem<16>::total in kernels/attention.cu (static_asserts there).
        assert_eq!(attention_smem_bytes(128), 64 * 136 * 2 * 5);
        assert!(attention_uses_fa(128) && attention_uses_fa(64) && !attention_uses_fa(16));
        assert!(attention_smem_bytes(256) <= 200 * 1024);
    }
}
