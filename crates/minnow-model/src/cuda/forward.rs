//! The BF16 forward on the GPU (docs/model.md §7): every step is a kernel of
//! `kernels/*.cu` or a cuBLAS GEMM queued on one stream. No step reads anything back, so a whole
//! forward can be captured as a CUDA graph; the start position and the token ids are read from
//! device memory for the same reason.

use half::bf16;
use minnow_runtime::cuda::ops::{self, AttentionShape, RouterShape};

use crate::batch::{pages_for, Segment, Want};
use minnow_runtime::cuda::tma::TensorMaps;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu, Profile};

use super::weights::{DenseMlp, Mlp, Moe, RouterWeights, SharedExpert, Weights};
use crate::config::Config;

/// The GPU's K/V pool: `pages` pages of `block_size` positions each, allocated once. One BF16
/// allocation laid out `[layer][K | V][page][position in page][KV head][head_dim]`, so each
/// layer's K (and V) is one `[pages * block_size, G, d]` array that the kernels index by
/// `page * block_size + offset`, and a page id names the same positions in every layer.
pub(crate) struct KvPool {
    buf: DeviceBuffer<bf16>,
    pages: usize,
    /// Elements of one layer's K (or V).
    half: usize,
}

impl KvPool {
    /// Bytes of one page: every layer's K and V of `block_size` positions.
    pub fn page_bytes(c: &Config) -> usize {
        c.num_hidden_layers * 2 * c.block_size * c.num_key_value_heads * c.head_dim * 2
    }

    pub fn new(gpu: &Gpu, c: &Config, pages: usize) -> CudaResult<Self> {
        let half = pages * c.block_size * c.num_key_value_heads * c.head_dim;
        Ok(Self {
            buf: gpu.alloc(2 * c.num_hidden_layers * half)?,
            pages,
            half,
        })
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Layer `l`'s K rows `[pages * block_size, G, d]`.
    pub fn k(&self, l: usize) -> u64 {
        self.buf.ptr_at(2 * l * self.half)
    }

    /// Layer `l`'s V rows.
    pub fn v(&self, l: usize) -> u64 {
        self.buf.ptr_at((2 * l + 1) * self.half)
    }
}

/// What one segment of a batch asks for, as far as the queued work depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WantKind {
    Nothing,
    Logits,
    Top1,
}

/// The shape of a batched forward: every segment's length and wanted rows. Everything the queued
/// launches depend on (grids, offsets into the metadata buffer) follows from it, so it is the key
/// of a captured graph; positions, block tables and ids travel in the metadata buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BatchShape {
    /// (tokens, wanted rows, what they want) per segment.
    pub segments: Vec<(usize, std::ops::Range<usize>, WantKind)>,
    /// Fixed-position attention splits the longest key range needs (batch-invariant mode; the
    /// launch grid depends on it, so it is part of a captured graph's key).
    pub key_chunks: usize,
}

impl BatchShape {
    pub fn of(segments: &[Segment<'_>]) -> Self {
        Self {
            segments: segments
                .iter()
                .map(|s| {
                    let kind = match s.want {
                        Want::Nothing => WantKind::Nothing,
                        Want::Logits(_) => WantKind::Logits,
                        Want::Top1(_) => WantKind::Top1,
                    };
                    (s.ids.len(), s.want.rows(), kind)
                })
                .collect(),
            key_chunks: segments
                .iter()
                .map(|s| (s.start + s.ids.len()).div_ceil(ops::ATTENTION_CHUNK_KEYS))
                .max()
                .unwrap_or(0)
                .max(1),
        }
    }

    /// Longest segment.
    pub fn longest(&self) -> usize {
        self.segments.iter().map(|s| s.0).max().unwrap_or(0)
    }
}

/// Sections of the per-forward metadata buffer (u32 words, each section 16-byte aligned), in
/// the order they are laid out. Block tables come last: their length grows with the prefixes
/// without moving any other section.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub tokens: usize,
    /// Batch rows that need the lm_head, in batch order (segment by segment).
    pub head_rows: Vec<u32>,
    /// The same rows when they are one contiguous run (no gather needed).
    pub head_range: Option<std::ops::Range<usize>>,
    pub logits: bool,
    pub top1: bool,
    /// Attention CTAs: (segment, first token).
    pub tiles: Vec<[i32; 2]>,
    /// Fixed-position attention splits (see [`BatchShape::key_chunks`]).
    pub key_chunks: usize,
    /// 2.2 routing blocks: (first row, rows).
    pub blocks: Vec<[i32; 2]>,
    off_pos: usize,
    off_slot: usize,
    off_head: usize,
    off_segs: usize,
    off_tiles: usize,
    off_blocks: usize,
    off_tables: usize,
}

fn align4(x: usize) -> usize {
    x.div_ceil(4) * 4
}

impl Layout {
    pub fn new(c: &Config, shape: &BatchShape) -> Self {
        let lens: Vec<usize> = shape.segments.iter().map(|s| s.0).collect();
        let tokens: usize = lens.iter().sum();
        let mut head_rows = Vec::new();
        let (mut logits, mut top1) = (false, false);
        let mut row0 = 0;
        let mut blocks = Vec::new();
        for (n, rows, kind) in &shape.segments {
            match kind {
                WantKind::Nothing => {}
                WantKind::Logits => logits |= !rows.is_empty(),
                WantKind::Top1 => top1 |= !rows.is_empty(),
            }
            if *kind != WantKind::Nothing {
                head_rows.extend(rows.clone().map(|r| (row0 + r) as u32));
            }
            for b0 in (0..*n).step_by(c.block_size.max(1)) {
                blocks.push([(row0 + b0) as i32, (c.block_size.min(n - b0)) as i32]);
            }
            row0 += n;
        }
        let head_range = match (head_rows.first(), head_rows.last()) {
            (Some(&a), Some(&b)) if (b - a) as usize + 1 == head_rows.len() => {
                Some(a as usize..b as usize + 1)
            }
            _ => None,
        };
        let tiles = ops::attention_tiles(&attention_shape(c), &lens);
        let off_pos = align4(tokens);
        let off_slot = off_pos + align4(tokens);
        let off_head = off_slot + align4(tokens);
        let off_segs = off_head + align4(head_rows.len());
        let off_tiles = off_segs + 4 * lens.len();
        let off_blocks = off_tiles + align4(2 * tiles.len());
        let off_tables = off_blocks + align4(2 * blocks.len());
        Self {
            tokens,
            head_rows,
            head_range,
            logits,
            top1,
            tiles,
            key_chunks: shape.key_chunks,
            blocks,
            off_pos,
            off_slot,
            off_head,
            off_segs,
            off_tiles,
            off_blocks,
            off_tables,
        }
    }

    /// The metadata of `segments` (whose shape this layout was made from): ids, positions, pool
    /// rows, wanted rows, segments, attention tiles, routing blocks, then the block tables.
    pub fn fill(&self, c: &Config, segments: &[Segment<'_>]) -> Vec<u32> {
        let p = c.block_size;
        let table_len: usize = segments
            .iter()
            .map(|s| pages_for(s.start + s.ids.len(), p))
            .sum();
        let mut m = vec![0u32; self.off_tables + table_len];
        let mut row = 0;
        let mut table_off = 0;
        for (si, s) in segments.iter().enumerate() {
            let pages = &s.pages[..pages_for(s.start + s.ids.len(), p)];
            for (i, &id) in s.ids.iter().enumerate() {
                let pos = s.start + i;
                m[row + i] = id;
                m[self.off_pos + row + i] = pos as u32;
                m[self.off_slot + row + i] = pages[pos / p] * p as u32 + (pos % p) as u32;
            }
            let seg = [row, s.ids.len(), s.start, table_off];
            for (k, v) in seg.iter().enumerate() {
                m[self.off_segs + 4 * si + k] = *v as u32;
            }
            m[self.off_tables + table_off..self.off_tables + table_off + pages.len()]
                .copy_from_slice(pages);
            table_off += pages.len();
            row += s.ids.len();
        }
        m[self.off_head..self.off_head + self.head_rows.len()].copy_from_slice(&self.head_rows);
        for (i, t) in self.tiles.iter().enumerate() {
            m[self.off_tiles + 2 * i] = t[0] as u32;
            m[self.off_tiles + 2 * i + 1] = t[1] as u32;
        }
        for (i, b) in self.blocks.iter().enumerate() {
            m[self.off_blocks + 2 * i] = b[0] as u32;
            m[self.off_blocks + 2 * i + 1] = b[1] as u32;
        }
        m
    }
}

/// Device addresses of a [`Layout`]'s sections inside the metadata buffer at `base`.
struct Meta {
    ids: u64,
    pos: u64,
    slot: u64,
    head: u64,
    attention: ops::AttentionBatch,
    blocks: ops::RoutingBlocks,
}

impl Meta {
    fn new(base: u64, l: &Layout) -> Self {
        let at = |off: usize| base + 4 * off as u64;
        Self {
            ids: at(0),
            pos: at(l.off_pos),
            slot: at(l.off_slot),
            head: at(l.off_head),
            attention: ops::AttentionBatch {
                segs: at(l.off_segs),
                tiles: at(l.off_tiles),
                tables: at(l.off_tables),
                tiles_count: l.tiles.len(),
            },
            blocks: ops::RoutingBlocks::Listed {
                ptr: at(l.off_blocks),
                count: l.blocks.len(),
            },
        }
    }
}

/// Scratch buffers for forwards of up to `tokens` tokens and `logit_rows` logits rows.
pub(crate) struct Workspace {
    pub tokens: usize,
    pub logit_rows: usize,
    /// Capacity of the attention partials in (token x split) rows.
    pub attn_rows: usize,
    h: DeviceBuffer<bf16>,
    /// The rows that need the lm_head, gathered when they are not one contiguous run.
    head: DeviceBuffer<bf16>,
    a: DeviceBuffer<bf16>,
    delta: DeviceBuffer<bf16>,
    qkv: DeviceBuffer<bf16>,
    q: DeviceBuffer<bf16>,
    attn: DeviceBuffer<bf16>,
    part_o: DeviceBuffer<f32>,
    part_ml: DeviceBuffer<f32>,
    gu: DeviceBuffer<bf16>,
    act: DeviceBuffer<bf16>,
    shared_out: DeviceBuffer<bf16>,
    a_f32: DeviceBuffer<f32>,
    router_logits: DeviceBuffer<f32>,
    topk_idx: DeviceBuffer<i32>,
    topk_w: DeviceBuffer<f32>,
    slot_pos: DeviceBuffer<i32>,
    row_token: DeviceBuffer<i32>,
    tiles: DeviceBuffer<i32>,
    num_tiles: DeviceBuffer<i32>,
    expert_gu: DeviceBuffer<bf16>,
    /// Entries of the admitted pool of a 2.2 denoising step (capacity + the shared expert; 0
    /// when the model has no such pool) and the u64 address arrays of its batched GEMMs:
    /// activations in (all `a`), outputs (rows `q * block_size..` of `expert_gu`, `expert_act`,
    /// `expert_out`), and the weights `ops::route_pooled` picks.
    pool_entries: usize,
    pool_x: DeviceBuffer<u64>,
    pool_gate_up_out: DeviceBuffer<u64>,
    pool_act: DeviceBuffer<u64>,
    pool_out: DeviceBuffer<u64>,
    pool_w_gate_up: DeviceBuffer<u64>,
    pool_w_down: DeviceBuffer<u64>,
    expert_act: DeviceBuffer<bf16>,
    expert_out: DeviceBuffer<bf16>,
    /// Tensor maps of the pool GEMMs' inputs `[a, expert_act]` (see `Moe::expert_maps`).
    pool_maps: Option<TensorMaps>,
    pub logits_bf16: DeviceBuffer<bf16>,
    pub logits_f32: DeviceBuffer<f32>,
    /// The wanted rows' argmax tokens (`[0, rows)`) then their confidences as F32 bits
    /// (`[rows, 2 rows)`): a step reads both back in one copy.
    pub top: DeviceBuffer<u32>,
    top_scratch: DeviceBuffer<f32>,
}

/// Key splits of the attention for a forward of `tiles` attention tiles: enough CTAs to fill the
/// GPU (about two per multiprocessor) when the forward itself is short. Depends on the batch's
/// shape only, so a captured graph stays valid as the prefixes grow (the split length adapts
/// in-kernel).
pub(crate) fn attention_splits(config: &Config, tiles: usize, sm_count: u32) -> usize {
    let ctas = tiles * config.num_key_value_heads;
    (2 * sm_count as usize)
        .div_ceil(ctas.max(1))
        .clamp(1, minnow_runtime::cuda::tuning::tuning().attn_max_splits)
}

impl Workspace {
    /// `attn_rows`: (token x split) rows of attention partials wanted at least (batch-invariant
    /// attention needs tokens x fixed-position splits).
    pub fn new(
        gpu: &Gpu,
        c: &Config,
        tokens: usize,
        logit_rows: usize,
        attn_rows: usize,
    ) -> CudaResult<Self> {
        let t = tokens.max(1);
        let r = logit_rows.max(1);
        let d = c.hidden_size;
        let heads = c.num_attention_heads;
        let hd = c.head_dim;
        let qkv = (heads + 2 * c.num_key_value_heads) * hd;
        // Room for the packed shared expert: one more expert and one more assignment per token.
        let e = c.num_experts.max(1) + 1;
        let k = c.num_experts_per_tok.max(1);
        let a = t * (k + 1);
        let wide = (c.intermediate_size).max(c.moe_intermediate_size * c.num_shared_experts.max(1));
        // Short forwards split their keys (attention_splits, or fixed-position splits that the
        // runner grows this for).
        let attn_rows = t.max(2048).max(attn_rows);
        let shape = attention_shape(c);
        let (po, pml) = ops::attention_scratch_len(&shape, attn_rows, 1);
        let max_tiles = ops::moe_max_tiles(a, e, 16);
        let pool_entries = match c.expert_capacity {
            Some(cap) if super::weights::shared_packs(c) => cap + 1,
            _ => 0,
        };
        let iw = c.moe_intermediate_size;
        let expert_rows = a.max(pool_entries * c.block_size);
        let expert_gu: DeviceBuffer<bf16> = gpu.alloc(expert_rows * 2 * iw)?;
        let expert_act: DeviceBuffer<bf16> = gpu.alloc(expert_rows * iw)?;
        let expert_out: DeviceBuffer<bf16> = gpu.alloc(expert_rows * d)?;
        // At least one token box of the pool GEMM (its maps' rows).
        let a_alloc_rows = t.max(ops::POOL_GEMM_TOKEN_ROWS as usize);
        let a_rows: DeviceBuffer<bf16> = gpu.alloc(a_alloc_rows * d)?;
        // Row q * block_size of a buffer of `width` BF16 columns, for every pool entry q.
        let entry_rows = |base: u64, width: usize| -> Vec<u64> {
            (0..pool_entries.max(1))
                .map(|q| base + (q * c.block_size * width * 2) as u64)
                .collect()
        };
        let pool_x = gpu.upload(&vec![a_rows.ptr(); pool_entries.max(1)])?;
        let pool_gate_up_out = gpu.upload(&entry_rows(expert_gu.ptr(), 2 * iw))?;
        let pool_act = gpu.upload(&entry_rows(expert_act.ptr(), iw))?;
        let pool_out = gpu.upload(&entry_rows(expert_out.ptr(), d))?;
        let pool_maps = if pool_entries > 0
            && ops::pool_gemm_supported(gpu, 1, 2 * iw, d)
            && ops::pool_gemm_supported(gpu, 1, d, iw)
        {
            TensorMaps::try_rows(
                gpu,
                ops::POOL_GEMM_TOKEN_ROWS,
                &[
                    (a_rows.ptr(), d, a_alloc_rows),
                    (expert_act.ptr(), iw, expert_rows),
                ],
            )
        } else {
            None
        };
        Ok(Self {
            tokens: t,
            logit_rows: r,
            attn_rows,
            h: gpu.alloc(t * d)?,
            head: gpu.alloc(r * d)?,
            a: a_rows,
            delta: gpu.alloc(t * d)?,
            qkv: gpu.alloc(t * qkv)?,
            q: gpu.alloc(t * heads * hd)?,
            attn: gpu.alloc(t * heads * hd)?,
            part_o: gpu.alloc(po)?,
            part_ml: gpu.alloc(pml)?,
            gu: gpu.alloc(t * 2 * wide)?,
            act: gpu.alloc(t * wide)?,
            shared_out: gpu.alloc(t * d)?,
            a_f32: gpu.alloc(t * d)?,
            router_logits: gpu.alloc(t * e)?,
            topk_idx: gpu.alloc(a)?,
            topk_w: gpu.alloc(a)?,
            slot_pos: gpu.alloc(a)?,
            row_token: gpu.alloc(a)?,
            tiles: gpu.alloc(4 * max_tiles)?,
            num_tiles: gpu.alloc(1)?,
            expert_gu,
            pool_entries,
            pool_x,
            pool_gate_up_out,
            pool_act,
            pool_out,
            pool_w_gate_up: gpu.alloc(pool_entries.max(1))?,
            pool_w_down: gpu.alloc(pool_entries.max(1))?,
            expert_act,
            expert_out,
            pool_maps,
            logits_bf16: gpu.alloc(r * c.vocab_size)?,
            logits_f32: gpu.alloc(r * c.vocab_size)?,
            top: gpu.alloc(2 * r)?,
            top_scratch: gpu.alloc(r * ops::TOP1_SLICES * 3)?,
        })
    }
}

pub(crate) fn attention_shape(c: &Config) -> AttentionShape {
    AttentionShape {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        block: c.block_size,
    }
}

pub(crate) fn router_shape(c: &Config) -> RouterShape {
    RouterShape {
        experts: c.num_experts,
        top_k: c.num_experts_per_tok,
        groups: c.n_group.zip(c.topk_group),
        capacity: c.expert_capacity,
        block: c.block_size,
        scale: c.routed_scaling_factor,
    }
}

/// Queues one batched forward laid out by `layout`, its metadata (`Layout::fill`) already in
/// device memory at `meta`: every segment's rows at once, writing their K/V into the pool pages
/// their block tables name, leaving the wanted rows' outputs in the workspace.
#[allow(clippy::too_many_arguments)]
pub(crate) fn queue_forward(
    gpu: &Gpu,
    c: &Config,
    w: &Weights,
    pool: &KvPool,
    ws: &Workspace,
    meta: u64,
    layout: &Layout,
    mut prof: Option<&mut Profile>,
    mut routing: Option<&mut Vec<Vec<i32>>>,
) -> CudaResult<()> {
    let t = layout.tokens;
    let m = Meta::new(meta, layout);
    let wants_head = !layout.head_rows.is_empty();
    let mut mark = |label: &'static str| -> CudaResult<()> {
        match prof.as_deref_mut() {
            Some(p) => p.mark(label),
            None => Ok(()),
        }
    };
    let d = c.hidden_size;
    let eps = c.rms_norm_eps;
    let shape = attention_shape(c);
    let hd = c.head_dim;
    let qkv_rows = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd;
    let attn_width = c.num_attention_heads * hd;
    let blas = gpu.blas();
    let invariant = minnow_runtime::cuda::tuning::tuning().invariant;
    let splits = if invariant {
        ops::AttentionSplits::FixedChunks(layout.key_chunks)
    } else {
        ops::AttentionSplits::Even(
            attention_splits(c, layout.tiles.len(), gpu.sm_count())
                .min(ws.attn_rows / t)
                .max(1),
        )
    };

    ops::embed_rows(gpu, m.ids, w.embed.ptr(), ws.h.ptr(), t, d)?;
    mark("embed")?;
    // True when the previous layer's MoE combine already added its output to `h` and wrote the
    // next RMSNorm (this layer's input norm, or the final norm) into `a`: one launch fewer.
    let mut normed = false;
    for (l, layer) in w.layers.iter().enumerate() {
        if !normed {
            // The previous layer's MLP output joins the residual stream here (none before
            // layer 0).
            let delta = if l == 0 { 0 } else { ws.delta.ptr() };
            ops::add_rmsnorm(
                gpu,
                ws.h.ptr(),
                delta,
                layer.input_norm.ptr(),
                ws.a.ptr(),
                t,
                d,
                eps,
            )?;
            mark("norms")?;
        }
        normed = false;
        dense_gemm(
            gpu,
            ws.a.ptr(),
            layer.qkv.ptr(),
            ws.qkv.ptr(),
            t,
            qkv_rows,
            d,
        )?;
        mark("qkv gemm")?;
        ops::qk_norm_rope(
            gpu,
            &shape,
            ws.qkv.ptr(),
            layer.q_norm.ptr(),
            layer.k_norm.ptr(),
            ws.q.ptr(),
            pool.k(l),
            pool.v(l),
            m.pos,
            m.slot,
            t,
            c.rope_theta,
            eps,
        )?;
        mark("qk-norm + rope")?;
        ops::attention(
            gpu,
            &shape,
            ws.q.ptr(),
            pool.k(l),
            pool.v(l),
            ws.part_o.ptr(),
            ws.part_ml.ptr(),
            ws.attn.ptr(),
            &m.attention,
            t,
            splits,
        )?;
        mark("attention")?;
        dense_gemm(
            gpu,
            ws.attn.ptr(),
            layer.dense.ptr(),
            ws.delta.ptr(),
            t,
            d,
            attn_width,
        )?;
        mark("o gemm")?;
        ops::add_rmsnorm(
            gpu,
            ws.h.ptr(),
            ws.delta.ptr(),
            layer.post_norm.ptr(),
            ws.a.ptr(),
            t,
            d,
            eps,
        )?;
        mark("norms")?;
        match &layer.mlp {
            Mlp::Dense(mlp) => {
                queue_swiglu(gpu, ws, mlp, ws.a.ptr(), ws.delta.ptr(), t, d)?;
                mark("dense mlp")?;
            }
            Mlp::Moe(moe) => {
                let router = router_shape(c);
                let (e, k) = (c.num_experts, c.num_experts_per_tok);
                // Experts that can get rows: with 2.2 block admission at most `capacity` per
                // routing block, far fewer than all of them.
                let busy = match router.capacity {
                    Some(cap) => (cap * layout.blocks.len()).min(e),
                    None => e,
                };
                let tile_rows = ops::moe_tile_rows(t * k, busy);
                // A packed shared expert is expert `e` with one extra assignment per token.
                // It joins the grouped GEMM when experts get few rows each and the forward is at
                // most four blocks (decoding: it then streams at the grouped kernel's bandwidth,
                // with no extra launches); for longer forwards cuBLAS multiplies its slice of the
                // packed buffers faster (reading it once, not once per 16-row tile).
                let packed = matches!(moe.shared, SharedExpert::Packed)
                    && tile_rows == 16
                    && t <= 4 * c.block_size.max(32);
                match &moe.router {
                    RouterWeights::Bf16(w) if invariant => ops::router_logits(
                        gpu,
                        ws.a.ptr(),
                        w.ptr(),
                        false,
                        ws.router_logits.ptr(),
                        t,
                        e,
                        d,
                    )?,
                    RouterWeights::F32(w) if invariant => ops::router_logits(
                        gpu,
                        ws.a.ptr(),
                        w.ptr(),
                        true,
                        ws.router_logits.ptr(),
                        t,
                        e,
                        d,
                    )?,
                    RouterWeights::Bf16(w) => {
                        blas.gemm_bf16_f32out(ws.a.ptr(), w.ptr(), ws.router_logits.ptr(), t, e, d)?
                    }
                    RouterWeights::F32(w) => {
                        ops::bf16_to_f32(gpu, ws.a.ptr(), ws.a_f32.ptr(), t * d)?;
                        blas.gemm_f32(ws.a_f32.ptr(), w.ptr(), ws.router_logits.ptr(), t, e, d)?;
                    }
                }
                // A denoising step of 2.2 (one routing block in the whole batch) runs its experts
                // over the admitted pool (queue_pooled_experts); other forwards, batches of
                // several blocks too, as grouped GEMMs over the dispatched assignments (each
                // expert's weights read once for the rows of every block that admitted it).
                // Not in batch-invariant mode: the pool GEMM's tensor-core path rounds differently
                // from the grouped GEMM that the same rows take inside a larger batch.
                let pooled = !invariant
                    && ws.pool_entries > 0
                    && packed
                    && layout.blocks.len() == 1
                    && minnow_runtime::cuda::tuning::tuning().moe_pooled
                    && ops::pooled_experts_supported(&router, t);
                let (shared, shared_rows) = if pooled {
                    queue_pooled_experts(gpu, c, ws, moe, &router, t, &mut mark)?
                } else {
                    let grouping = Grouping {
                        blocks: m.blocks,
                        busy,
                        tile_rows,
                        packed,
                    };
                    queue_grouped_experts(gpu, c, ws, moe, &router, t, &grouping, &mut mark)?
                };
                if let Some(r) = routing.as_deref_mut() {
                    // Diagnostics only (never under capture): this layer's expert choices.
                    let mut ids = vec![0i32; t * k];
                    gpu.read(&ws.topk_idx, 0, &mut ids)?;
                    r.push(ids);
                }
                // The RMSNorm after this layer, fused into the combine: the next layer's input
                // norm, or the final norm when logits follow (over all rows: the ones outside
                // the logits range are normed but never read).
                let next_norm = match w.layers.get(l + 1) {
                    _ if k > ops::COMBINE_NORM_MAX_K => None,
                    Some(next) => Some(next.input_norm.ptr()),
                    None if wants_head => Some(w.final_norm.ptr()),
                    None => None,
                };
                match next_norm {
                    Some(weight) => {
                        let norm = ops::ResidualNorm {
                            h: ws.h.ptr(),
                            weight,
                            out: ws.a.ptr(),
                            eps,
                        };
                        ops::moe_combine_add_rmsnorm(
                            gpu,
                            ws.expert_out.ptr(),
                            ws.slot_pos.ptr(),
                            ws.topk_w.ptr(),
                            shared,
                            shared_rows,
                            &norm,
                            t,
                            k,
                            d,
                        )?;
                        mark("combine + norm")?;
                        normed = true;
                    }
                    None => {
                        ops::moe_combine(
                            gpu,
                            ws.expert_out.ptr(),
                            ws.slot_pos.ptr(),
                            ws.topk_w.ptr(),
                            shared,
                            shared_rows,
                            ws.delta.ptr(),
                            t,
                            k,
                            d,
                        )?;
                        mark("combine")?;
                    }
                }
            }
        }
    }
    if !wants_head {
        return Ok(());
    }
    let rows = layout.head_rows.len();
    // The final-normed rows that need logits: one contiguous run of `a`, or gathered.
    let (start, normed_rows) = match &layout.head_range {
        Some(r) => (r.start, r.len()),
        None => (0, t),
    };
    if !normed {
        // Final residual add and norm (only over the wanted run when there is one).
        ops::add_rmsnorm(
            gpu,
            ws.h.ptr_at(start * d),
            ws.delta.ptr_at(start * d),
            w.final_norm.ptr(),
            ws.a.ptr_at(start * d),
            normed_rows,
            d,
            eps,
        )?;
        mark("final norm")?;
    }
    let head_in = if layout.head_range.is_some() {
        ws.a.ptr_at(start * d)
    } else {
        ops::embed_rows(gpu, m.head, ws.a.ptr(), ws.head.ptr(), rows, d)?;
        mark("gather head rows")?;
        ws.head.ptr()
    };
    let v = c.vocab_size;
    dense_gemm(
        gpu,
        head_in,
        w.lm_head.ptr(),
        ws.logits_bf16.ptr(),
        rows,
        v,
        d,
    )?;
    mark("lm_head")?;
    if layout.top1 {
        ops::top1_softmax(
            gpu,
            ws.logits_bf16.ptr(),
            ws.top_scratch.ptr(),
            ws.top.ptr(),
            ws.top.ptr_at(rows),
            rows,
            v,
        )?;
    }
    if layout.logits {
        ops::bf16_to_f32(gpu, ws.logits_bf16.ptr(), ws.logits_f32.ptr(), rows * v)?;
    }
    mark("top-1 / logits")
}

/// Marks the end of a profiled stage (a no-op without a profile).
type Mark<'a> = dyn FnMut(&'static str) -> CudaResult<()> + 'a;

/// The experts of a 2.2 denoising step (one routing block) as two GEMMs over the block's admitted
/// pool (`ops::ExpertPool`), after the router logits: the TMA pool kernel on Hopper (SiLU in its
/// gate/up epilogue), else cuBLAS's batched GEMM around `silu_mul`. Returns the shared expert's
/// (`shared`, `shared_rows`) inputs of the combine.
fn queue_pooled_experts(
    gpu: &Gpu,
    c: &Config,
    ws: &Workspace,
    moe: &Moe,
    router: &RouterShape,
    t: usize,
    mark: &mut Mark,
) -> CudaResult<(u64, u64)> {
    let (d, k, iw) = (
        c.hidden_size,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
    );
    let blas = gpu.blas();
    let rows = c.block_size;
    // The pool path runs only with a packed shared expert, which needs BF16 routed experts.
    let Some((gate_up, down)) = moe.bf16_experts() else {
        return Err(minnow_runtime::cuda::CudaError::Unsupported(
            "the expert pool GEMM over quantized experts".into(),
        ));
    };
    let pool = ops::ExpertPool {
        gate_up: gate_up.ptr(),
        gate_up_stride: 2 * iw * d,
        down: down.ptr(),
        down_stride: d * iw,
        gate_up_ptrs: ws.pool_w_gate_up.ptr(),
        down_ptrs: ws.pool_w_down.ptr(),
        slot_pos: ws.slot_pos.ptr(),
        row_stride: rows,
    };
    ops::route_pooled(
        gpu,
        router,
        ws.router_logits.ptr(),
        moe.bias.ptr(),
        ws.topk_idx.ptr(),
        ws.topk_w.ptr(),
        t,
        &pool,
    )?;
    mark("router")?;
    let b = ws.pool_entries;
    match (&ws.pool_maps, &moe.expert_maps) {
        // The TMA kernel where it applies (Hopper, whole tiles), SiLU in its gate/up epilogue.
        (Some(xm), Some(wm))
            if ops::pool_gemm_supported(gpu, t, 2 * iw, d)
                && ops::pool_gemm_supported(gpu, t, d, iw) =>
        {
            let (x, w) = (ws.pool_x.ptr(), ws.pool_w_gate_up.ptr());
            ops::pool_gemm(
                gpu,
                xm.get(0),
                wm.get(0),
                x,
                w,
                ws.pool_act.ptr(),
                t,
                2 * iw,
                d,
                b,
                true,
                false,
            )?;
            mark("experts gate/up")?;
            // The down projection's weight addresses came from the router two launches back, so
            // its first weights may stream while the gate/up kernel finishes.
            let (x, w) = (ws.pool_act.ptr(), ws.pool_w_down.ptr());
            ops::pool_gemm(
                gpu,
                xm.get(1),
                wm.get(1),
                x,
                w,
                ws.pool_out.ptr(),
                t,
                d,
                iw,
                b,
                false,
                true,
            )?;
        }
        // Elsewhere cuBLAS's batched GEMM, then SiLU, then the down projection.
        _ => {
            blas.gemm_bf16_batched(
                ws.pool_x.ptr(),
                ws.pool_w_gate_up.ptr(),
                ws.pool_gate_up_out.ptr(),
                t,
                2 * iw,
                d,
                b,
            )?;
            mark("experts gate/up")?;
            ops::silu_mul_groups(gpu, ws.expert_gu.ptr(), ws.expert_act.ptr(), b, t, rows, iw)?;
            mark("experts silu")?;
            blas.gemm_bf16_batched(
                ws.pool_act.ptr(),
                ws.pool_w_down.ptr(),
                ws.pool_out.ptr(),
                t,
                d,
                iw,
                b,
            )?;
        }
    }
    mark("experts down")?;
    Ok((0, ws.slot_pos.ptr_at(t * k)))
}

/// How a grouped MoE layer runs: the batch's routing blocks, how many experts can get rows,
/// the expert GEMM's tile rows and whether the shared expert rides in it.
struct Grouping {
    blocks: ops::RoutingBlocks,
    busy: usize,
    tile_rows: usize,
    packed: bool,
}

/// The experts of any other forward, after the router logits: routing, the device-side dispatch,
/// two grouped GEMMs over the used experts (with the packed shared expert among them when
/// `packed`), or the shared expert on its own. Returns the combine's shared-expert inputs.
#[allow(clippy::too_many_arguments)]
fn queue_grouped_experts(
    gpu: &Gpu,
    c: &Config,
    ws: &Workspace,
    moe: &Moe,
    router: &RouterShape,
    t: usize,
    grouping: &Grouping,
    mark: &mut Mark,
) -> CudaResult<(u64, u64)> {
    let packed = grouping.packed;
    let (d, e, k, iw) = (
        c.hidden_size,
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
    );
    let (slots, a) = if packed {
        (e + 1, t * (k + 1))
    } else {
        (e, t * k)
    };
    let tile_rows = grouping.tile_rows;
    ops::route(
        gpu,
        router,
        ws.router_logits.ptr(),
        moe.bias.ptr(),
        ws.topk_idx.ptr(),
        ws.topk_w.ptr(),
        t,
        grouping.blocks,
    )?;
    mark("router")?;
    ops::moe_dispatch(
        gpu,
        ws.topk_idx.ptr(),
        t,
        k,
        slots,
        tile_rows,
        packed.then_some(e),
        ws.slot_pos.ptr(),
        ws.row_token.ptr(),
        ws.tiles.ptr(),
        ws.num_tiles.ptr(),
    )?;
    mark("dispatch")?;
    let busy = grouping.busy + usize::from(packed);
    let max_tiles = ops::moe_max_tiles(a, busy, tile_rows);
    match (&moe.expert_maps, moe.bf16_experts()) {
        // BF16 experts on Hopper with MINNOW_GROUPED_TMA=1: the weights stream through TMA,
        // SiLU in the gate/up epilogue (kernel by kernel the same bits as the tiles below).
        (Some(maps), Some((gate_up, down)))
            if minnow_runtime::cuda::tuning::tuning().grouped_tma
                && ops::grouped_tma_supported(gpu, tile_rows, 2 * iw, d)
                && ops::grouped_tma_supported(gpu, tile_rows, d, iw) =>
        {
            ops::grouped_gemm_tma(
                gpu,
                maps.get(0),
                gate_up.ptr(),
                ws.a.ptr(),
                ws.row_token.ptr(),
                ws.expert_act.ptr(),
                ws.tiles.ptr(),
                ws.num_tiles.ptr(),
                max_tiles,
                tile_rows,
                2 * iw,
                d,
                true,
            )?;
            mark("experts gate/up")?;
            ops::grouped_gemm_tma(
                gpu,
                maps.get(1),
                down.ptr(),
                ws.expert_act.ptr(),
                0,
                ws.expert_out.ptr(),
                ws.tiles.ptr(),
                ws.num_tiles.ptr(),
                max_tiles,
                tile_rows,
                d,
                iw,
                false,
            )?;
        }
        _ => {
            moe.experts_gate_up.grouped_gemm(
                gpu,
                ws.a.ptr(),
                ws.row_token.ptr(),
                ws.expert_gu.ptr(),
                ws.tiles.ptr(),
                ws.num_tiles.ptr(),
                max_tiles,
                tile_rows,
                2 * iw,
                d,
            )?;
            mark("experts gate/up")?;
            ops::silu_mul(gpu, ws.expert_gu.ptr(), ws.expert_act.ptr(), a, iw)?;
            mark("experts silu")?;
            moe.experts_down.grouped_gemm(
                gpu,
                ws.expert_act.ptr(),
                0,
                ws.expert_out.ptr(),
                ws.tiles.ptr(),
                ws.num_tiles.ptr(),
                max_tiles,
                tile_rows,
                d,
                iw,
            )?;
        }
    }
    mark("experts down")?;
    Ok(match &moe.shared {
        SharedExpert::Separate(mlp) => {
            queue_swiglu(gpu, ws, mlp, ws.a.ptr(), ws.shared_out.ptr(), t, d)?;
            mark("shared expert")?;
            (ws.shared_out.ptr(), 0)
        }
        // Its rows are where the dispatch put assignments t * k + t'.
        SharedExpert::Packed if packed => (0, ws.slot_pos.ptr_at(t * k)),
        SharedExpert::Packed => {
            // Packed only beside BF16 routed experts (weights.rs).
            let Some((gate_up, down)) = moe.bf16_experts() else {
                return Err(minnow_runtime::cuda::CudaError::Unsupported(
                    "a packed shared expert beside quantized experts".into(),
                ));
            };
            queue_swiglu_at(
                gpu,
                ws,
                gate_up.ptr_at(e * 2 * iw * d),
                down.ptr_at(e * d * iw),
                iw,
                ws.a.ptr(),
                ws.shared_out.ptr(),
                t,
                d,
            )?;
            mark("shared expert")?;
            (ws.shared_out.ptr(), 0)
        }
        SharedExpert::None => (0, 0),
    })
}

/// Plans the model's dense GEMMs (`minnow_runtime::cuda::plan_dense_gemms`): each distinct
/// (n, k) of the layers' QKV, O, dense MLP and shared expert up to `tokens` rows, the lm_head up
/// to `logit_rows`. Returns the load log's lines. Only in batch-invariant mode, and not with
/// `MINNOW_DENSE_LT=0`.
pub(crate) fn plan_dense_gemms(
    gpu: &Gpu,
    c: &Config,
    weights: &Weights,
    tokens: usize,
    logit_rows: usize,
) -> CudaResult<Vec<String>> {
    use minnow_runtime::cuda::DenseShape;
    if !minnow_runtime::cuda::tuning::tuning().invariant
        || std::env::var("MINNOW_DENSE_LT").is_ok_and(|v| v == "0")
    {
        return Ok(Vec::new());
    }
    let mut shapes: Vec<DenseShape> = Vec::new();
    let mut add = |name: &'static str, n: usize, k: usize, w: u64| {
        if !shapes.iter().any(|s| (s.n, s.k) == (n, k)) {
            shapes.push(DenseShape { name, n, k, w });
        }
    };
    for layer in &weights.layers {
        let d = layer.post_norm.len();
        add("qkv", layer.qkv.len() / d, d, layer.qkv.ptr());
        add("o", d, layer.dense.len() / d, layer.dense.ptr());
        let mlp = match &layer.mlp {
            Mlp::Dense(mlp) => Some(("dense mlp", mlp)),
            Mlp::Moe(moe) => match &moe.shared {
                SharedExpert::Separate(mlp) => Some(("shared expert", mlp)),
                _ => None,
            },
        };
        if let Some((name, mlp)) = mlp {
            add(name, 2 * mlp.width, d, mlp.gate_up.ptr());
            add(name, d, mlp.width, mlp.down.ptr());
        }
        // A packed shared expert runs as dense GEMMs over its slice of the expert buffers in
        // forwards too long for the grouped GEMM to take it (queue_grouped_experts).
        if let Mlp::Moe(moe) = &layer.mlp {
            if let (SharedExpert::Packed, Some((gate_up, down))) = (&moe.shared, moe.bf16_experts())
            {
                let (e, iw) = (c.num_experts, c.moe_intermediate_size);
                add("shared expert", 2 * iw, d, gate_up.ptr_at(e * 2 * iw * d));
                add("shared expert", d, iw, down.ptr_at(e * d * iw));
            }
        }
    }
    let mut report = minnow_runtime::cuda::plan_dense_gemms(gpu, &shapes, tokens)?;
    if let Some(layer) = weights.layers.first() {
        let d = layer.post_norm.len();
        let lm_head = DenseShape {
            name: "lm_head",
            n: weights.lm_head.len() / d,
            k: d,
            w: weights.lm_head.ptr(),
        };
        report.extend(minnow_runtime::cuda::plan_dense_gemms(
            gpu,
            &[lm_head],
            logit_rows,
        )?);
    }
    Ok(report)
}

/// `Y[m, n] = X[m, k] . W[n, k]^T` (row pitch n): in batch-invariant mode minnow's fixed-order
/// kernel or the cuBLASLt algorithm planned for the row count, which sums in the same order
/// (a row's outputs never depend on `m`); else plain cuBLAS (which picks its algorithm by `m`).
fn dense_gemm(gpu: &Gpu, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> CudaResult<()> {
    if minnow_runtime::cuda::tuning::tuning().invariant {
        ops::dense_gemm(gpu, x, w, y, m, n, k)
    } else {
        gpu.blas().gemm_bf16(x, w, y, m, n, k, n)
    }
}

/// `out = down(BF16(silu(gate(x))) * up(x))` with gate and up stacked in one GEMM.
fn queue_swiglu(
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
fn queue_swiglu_at(
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
