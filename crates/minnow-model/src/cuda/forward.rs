//! The BF16 forward on the GPU (docs/llada2-model.md §7): every step is a kernel of
//! `kernels/*.cu` or a cuBLAS GEMM queued on one stream. No step reads anything back, so a whole
//! forward can be captured as a CUDA graph; the start position and the token ids are read from
//! device memory for the same reason.

use half::bf16;
use minnow_runtime::cuda::ops::{self, AttentionShape, RouterShape};
use minnow_runtime::cuda::tma::TensorMaps;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu, Profile};

use super::weights::{DenseMlp, Mlp, Moe, RouterWeights, SharedExpert, Weights};
use crate::config::Config;

/// K/V cache of one sequence: per layer `[capacity, G, d]` BF16 for K (normed, rotated) and V.
pub(crate) struct KvCache {
    pub k: Vec<DeviceBuffer<bf16>>,
    pub v: Vec<DeviceBuffer<bf16>>,
    pub capacity: usize,
    pub len: usize,
}

impl KvCache {
    pub fn new(gpu: &Gpu, config: &Config, capacity: usize) -> CudaResult<Self> {
        let row = config.num_key_value_heads * config.head_dim;
        let mut k = Vec::with_capacity(config.num_hidden_layers);
        let mut v = Vec::with_capacity(config.num_hidden_layers);
        for _ in 0..config.num_hidden_layers {
            k.push(gpu.alloc(capacity * row)?);
            v.push(gpu.alloc(capacity * row)?);
        }
        Ok(Self {
            k,
            v,
            capacity,
            len: 0,
        })
    }

    /// Makes room for `needed` positions, reallocating (and copying the cached rows) by doubling.
    /// Returns true when the buffers moved (captured graphs that use them are stale).
    pub fn reserve(&mut self, gpu: &Gpu, config: &Config, needed: usize) -> CudaResult<bool> {
        if needed <= self.capacity {
            return Ok(false);
        }
        let capacity = needed.next_power_of_two().max(1024);
        let mut grown = KvCache::new(gpu, config, capacity)?;
        let row_bytes = config.num_key_value_heads * config.head_dim * 2;
        for l in 0..self.k.len() {
            gpu.copy_bytes(grown.k[l].ptr(), self.k[l].ptr(), self.len * row_bytes)?;
            gpu.copy_bytes(grown.v[l].ptr(), self.v[l].ptr(), self.len * row_bytes)?;
        }
        grown.len = self.len;
        *self = grown;
        Ok(true)
    }
}

/// Scratch buffers for forwards of up to `tokens` tokens and `logit_rows` logits rows.
pub(crate) struct Workspace {
    pub tokens: usize,
    pub logit_rows: usize,
    /// Capacity of the attention partials in (token x split) rows.
    attn_rows: usize,
    pub ids: DeviceBuffer<u32>,
    pub pos0: DeviceBuffer<i32>,
    h: DeviceBuffer<bf16>,
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
    /// Tensor maps of the pool GEMMs' inputs `[a, expert_act]` (see `Moe::pool_maps`).
    pool_maps: Option<TensorMaps>,
    pub logits_bf16: DeviceBuffer<bf16>,
    pub logits_f32: DeviceBuffer<f32>,
    pub top_token: DeviceBuffer<u32>,
    pub top_conf: DeviceBuffer<f32>,
    top_scratch: DeviceBuffer<f32>,
}

/// Key splits of the attention for a forward of `tokens` tokens: enough CTAs to fill the GPU
/// (about two per multiprocessor) when the forward itself is short. Depends on the token count
/// only, so a captured graph stays valid as the prefix grows (the split length adapts in-kernel).
pub(crate) fn attention_splits(config: &Config, tokens: usize, sm_count: u32) -> usize {
    let group = config.num_attention_heads / config.num_key_value_heads.max(1);
    let ctas = tokens.div_ceil((64 / group.max(1)).max(1)) * config.num_key_value_heads;
    (2 * sm_count as usize)
        .div_ceil(ctas.max(1))
        .clamp(1, minnow_runtime::cuda::tuning::tuning().attn_max_splits)
}

impl Workspace {
    pub fn new(gpu: &Gpu, c: &Config, tokens: usize, logit_rows: usize) -> CudaResult<Self> {
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
        // Short forwards split their keys (attention_splits); t x splits stays under ~1100 rows.
        let attn_rows = t.max(2048);
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
            ids: gpu.alloc(t)?,
            pos0: gpu.alloc(1)?,
            h: gpu.alloc(t * d)?,
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
            top_token: gpu.alloc(r)?,
            top_conf: gpu.alloc(r)?,
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

/// What a forward leaves in the workspace for the caller to read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Output {
    /// Nothing (prefill, commit refresh): the lm_head is skipped.
    None,
    /// F32 logits of rows `start..end` in `logits_f32`.
    Logits { start: usize, end: usize },
    /// Argmax token and its softmax probability of rows `start..end` in `top_token`/`top_conf`.
    Top1 { start: usize, end: usize },
}

impl Output {
    /// What a forward leaves for `rows` of its tokens: nothing when no row is asked for, else
    /// their logits or (`top1`) their argmax and confidence.
    pub fn for_rows(rows: std::ops::Range<usize>, top1: bool) -> Self {
        match (rows.is_empty(), top1) {
            (true, _) => Output::None,
            (false, false) => Output::Logits {
                start: rows.start,
                end: rows.end,
            },
            (false, true) => Output::Top1 {
                start: rows.start,
                end: rows.end,
            },
        }
    }
}

/// Queues one forward of `tokens` tokens (ids already in `ws.ids`, start position in `ws.pos0`)
/// over `cache`, whose rows `pos0..pos0 + tokens` it writes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn queue_forward(
    gpu: &Gpu,
    c: &Config,
    w: &Weights,
    cache: &KvCache,
    ws: &Workspace,
    tokens: usize,
    output: Output,
    mut prof: Option<&mut Profile>,
) -> CudaResult<()> {
    let t = tokens;
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
    let splits = attention_splits(c, t, gpu.sm_count())
        .min(ws.attn_rows / t)
        .max(1);

    ops::embed_rows(gpu, ws.ids.ptr(), w.embed.ptr(), ws.h.ptr(), t, d)?;
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
            cache.k[l].ptr(),
            cache.v[l].ptr(),
            ws.pos0.ptr(),
            t,
            c.rope_theta,
            eps,
        )?;
        mark("qk-norm + rope")?;
        ops::attention(
            gpu,
            &shape,
            ws.q.ptr(),
            cache.k[l].ptr(),
            cache.v[l].ptr(),
            ws.part_o.ptr(),
            ws.part_ml.ptr(),
            ws.attn.ptr(),
            ws.pos0.ptr(),
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
                // A packed shared expert is expert `e` with one extra assignment per token.
                // It joins the grouped GEMM when experts get few rows each
                // (decoding: it then streams at the grouped kernel's bandwidth, with no extra
                // launches); for prefill cuBLAS multiplies its slice of the packed buffers faster.
                let packed = matches!(moe.shared, SharedExpert::Packed)
                    && ops::moe_tile_rows(t * k, e) == 16;
                match &moe.router {
                    RouterWeights::Bf16(w) => {
                        blas.gemm_bf16_f32out(ws.a.ptr(), w.ptr(), ws.router_logits.ptr(), t, e, d)?
                    }
                    RouterWeights::F32(w) => {
                        ops::bf16_to_f32(gpu, ws.a.ptr(), ws.a_f32.ptr(), t * d)?;
                        blas.gemm_f32(ws.a_f32.ptr(), w.ptr(), ws.router_logits.ptr(), t, e, d)?;
                    }
                }
                // A denoising step of 2.2 (one routing block) runs its experts over the admitted
                // pool (queue_pooled_experts); other forwards as grouped GEMMs over the
                // dispatched assignments.
                let pooled = ws.pool_entries > 0
                    && packed
                    && minnow_runtime::cuda::tuning::tuning().moe_pooled
                    && ops::pooled_experts_supported(&router, t);
                let (shared, shared_rows) = if pooled {
                    queue_pooled_experts(gpu, c, ws, moe, &router, t, &mut mark)?
                } else {
                    queue_grouped_experts(gpu, c, ws, moe, &router, t, packed, &mut mark)?
                };
                // The RMSNorm after this layer, fused into the combine: the next layer's input
                // norm, or the final norm when logits follow (over all rows: the ones outside
                // the logits range are normed but never read).
                let next_norm = match w.layers.get(l + 1) {
                    _ if k > ops::COMBINE_NORM_MAX_K => None,
                    Some(next) => Some(next.input_norm.ptr()),
                    None if output != Output::None => Some(w.final_norm.ptr()),
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
    let (start, end) = match output {
        Output::None => return Ok(()),
        Output::Logits { start, end } | Output::Top1 { start, end } => (start, end),
    };
    let rows = end - start;
    if !normed {
        // Final residual add and norm only for the rows that need logits, then the lm_head.
        ops::add_rmsnorm(
            gpu,
            ws.h.ptr_at(start * d),
            ws.delta.ptr_at(start * d),
            w.final_norm.ptr(),
            ws.a.ptr_at(start * d),
            rows,
            d,
            eps,
        )?;
        mark("final norm")?;
    }
    let v = c.vocab_size;
    blas.gemm_bf16(
        ws.a.ptr_at(start * d),
        w.lm_head.ptr(),
        ws.logits_bf16.ptr(),
        rows,
        v,
        d,
        v,
    )?;
    mark("lm_head")?;
    match output {
        Output::Top1 { .. } => ops::top1_softmax(
            gpu,
            ws.logits_bf16.ptr(),
            ws.top_scratch.ptr(),
            ws.top_token.ptr(),
            ws.top_conf.ptr(),
            rows,
            v,
        )?,
        _ => ops::bf16_to_f32(gpu, ws.logits_bf16.ptr(), ws.logits_f32.ptr(), rows * v)?,
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
    let pool = ops::ExpertPool {
        gate_up: moe.experts_gate_up.ptr(),
        gate_up_stride: 2 * iw * d,
        down: moe.experts_down.ptr(),
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
    match (&ws.pool_maps, &moe.pool_maps) {
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
    packed: bool,
    mark: &mut Mark,
) -> CudaResult<(u64, u64)> {
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
    let tile_rows = ops::moe_tile_rows(a, slots);
    ops::route(
        gpu,
        router,
        ws.router_logits.ptr(),
        moe.bias.ptr(),
        ws.topk_idx.ptr(),
        ws.topk_w.ptr(),
        t,
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
    // Experts that can get rows: with 2.2 block admission at most `capacity` per
    // routing block (plus the packed shared expert), far fewer than all of them.
    let busy = match router.capacity {
        Some(cap) => (cap * t.div_ceil(c.block_size.max(1))).min(e) + usize::from(packed),
        None => slots,
    };
    let max_tiles = ops::moe_max_tiles(a, busy, tile_rows);
    ops::grouped_gemm(
        gpu,
        ws.a.ptr(),
        ws.row_token.ptr(),
        moe.experts_gate_up.ptr(),
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
    ops::grouped_gemm(
        gpu,
        ws.expert_act.ptr(),
        0,
        moe.experts_down.ptr(),
        ws.expert_out.ptr(),
        ws.tiles.ptr(),
        ws.num_tiles.ptr(),
        max_tiles,
        tile_rows,
        d,
        iw,
    )?;
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
            queue_swiglu_at(
                gpu,
                ws,
                moe.experts_gate_up.ptr_at(e * 2 * iw * d),
                moe.experts_down.ptr_at(e * d * iw),
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

/// `Y[m, n] = X[m, k] . W[n, k]^T` (row pitch n) through cuBLAS.
fn dense_gemm(gpu: &Gpu, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> CudaResult<()> {
    gpu.blas().gemm_bf16(x, w, y, m, n, k, n)
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
