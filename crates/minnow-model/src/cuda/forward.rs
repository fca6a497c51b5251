//! The BF16 forward on the GPU (docs/model.md §7): every step is a kernel of
//! `kernels/*.cu` or a cuBLAS GEMM queued on one stream. No step reads anything back, so a whole
//! forward can be captured as a CUDA graph; the start position and the token ids are read from
//! device memory for the same reason.

use minnow_runtime::cuda::ops;
use minnow_runtime::cuda::{CudaResult, Gpu, Profile};

use super::batch_layout::{Layout, Meta};
use super::dense::{dense_gemm, queue_swiglu};
use super::kv_pool::KvPool;
use super::moe::{queue_grouped_experts, queue_pooled_experts, queue_shared_alone, Grouping};
use super::shapes::{attention_shape, attention_splits, invariant_attention_splits, router_shape};
use super::weights::{Mlp, RouterWeights, SharedExpert, Weights};
use super::workspace::Workspace;
use crate::batch::TOP_K;
use crate::config::Config;

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
    let wants_head = layout.head_rows > 0;
    let profiling = prof.is_some();
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
        invariant_attention_splits(c, layout.tiles.len(), layout.key_chunks, gpu.sm_count())
    } else {
        ops::AttentionSplits::Even(
            attention_splits(c, layout.tiles.len(), gpu.sm_count())
                .min(ws.attn_rows / t)
                .max(1),
        )
    };

    ops::embed_rows_f32(gpu, m.ids, w.embed.ptr(), ws.h.ptr(), t, d)?;
    mark("embed")?;
    ops::rope_cos_sin(gpu, &shape, m.pos, ws.rope_cos_sin.ptr(), t, c.rope_theta)?;
    mark("qk-norm + rope")?;
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
            ws.rope_cos_sin.ptr(),
            m.slot,
            t,
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
                // Beside quantized experts it always joins (their kernel reads it in the codes'
                // fragment order, which no other GEMM reads).
                let packed = matches!(moe.shared, SharedExpert::Packed)
                    && (moe.bf16_experts().is_none()
                        || (tile_rows == 16 && t <= 4 * c.block_size.max(32)));
                // A denoising step of 2.2 (one routing block in the whole batch) runs its experts
                // over the admitted pool (queue_pooled_experts); other forwards, batches of
                // several blocks too, as grouped GEMMs over the dispatched assignments (each
                // expert's weights read once for the rows of every block that admitted it).
                // Not in batch-invariant mode: the pool GEMM's tensor-core path rounds differently
                // from the grouped GEMM that the same rows take inside a larger batch.
                let pooled = !invariant
                    && ws.pool_entries > 0
                    && packed
                    && moe.bf16_experts().is_some()
                    && layout.blocks.len() == 1
                    && minnow_runtime::cuda::tuning::tuning().moe_pooled
                    && ops::pooled_experts_supported(&router, t);
                // A shared expert that runs on its own goes on the side stream, beside the router
                // and the routed experts (three small launches overlapping theirs), joined
                // before the combine. Not when profiling: the stages are timed on one stream.
                let beside = if !pooled
                    && !packed
                    && !matches!(moe.shared, SharedExpert::None)
                    && invariant
                    && !profiling
                    && minnow_runtime::cuda::tuning::tuning().shared_beside
                {
                    Some(gpu.beside(|| queue_shared_alone(gpu, c, ws, moe, t).map(drop))?)
                } else {
                    None
                };
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
                mark("router logits")?;
                let (shared, shared_rows) = if pooled {
                    queue_pooled_experts(gpu, c, ws, moe, &router, t, &mut mark)?
                } else {
                    let grouping = Grouping {
                        blocks: m.blocks,
                        busy,
                        tile_rows,
                        packed,
                    };
                    let shared_queued = beside.is_some();
                    queue_grouped_experts(
                        gpu,
                        c,
                        ws,
                        moe,
                        &router,
                        t,
                        &grouping,
                        shared_queued,
                        &mut mark,
                    )?
                };
                if let Some(r) = routing.as_deref_mut() {
                    // Diagnostics only (never under capture): this layer's expert choices.
                    let mut ids = vec![0i32; t * k];
                    gpu.read(&ws.topk_idx, 0, &mut ids)?;
                    r.push(ids);
                }
                if let Some(beside) = beside {
                    beside.join()?;
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
    let rows = layout.head_rows;
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
    if layout.top1 || layout.topk {
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
    if layout.topk {
        let k = TOP_K.min(v);
        let best = &ws.best;
        ops::topk_rows(
            gpu,
            ws.logits_bf16.ptr(),
            best.ptr(),
            best.ptr_at(rows * k),
            rows,
            v,
            k,
        )?;
    }
    if layout.logits {
        ops::bf16_to_f32(gpu, ws.logits_bf16.ptr(), ws.logits_f32.ptr(), rows * v)?;
    }
    mark("top-1 / logits")
}
