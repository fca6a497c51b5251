//! The scratch buffers a forward works in, sized once for the largest forward.

use half::bf16;
use minnow_runtime::cuda::ops;
use minnow_runtime::cuda::tma::TensorMaps;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu};

use super::shapes::attention_shape;
use crate::batch::TOP_K;
use crate::config::Config;

/// Scratch buffers for forwards of up to `tokens` tokens and `logit_rows` logits rows.
pub(crate) struct Workspace {
    pub tokens: usize,
    pub logit_rows: usize,
    /// Capacity of the attention partials in (token x split) rows.
    pub attn_rows: usize,
    /// The residual stream, in F32: layers' outputs join it without a rounding.
    pub(super) h: DeviceBuffer<f32>,
    /// The rows that need the lm_head, gathered when they are not one contiguous run.
    pub(super) head: DeviceBuffer<bf16>,
    pub(super) a: DeviceBuffer<bf16>,
    pub(super) delta: DeviceBuffer<bf16>,
    pub(super) qkv: DeviceBuffer<bf16>,
    pub(super) q: DeviceBuffer<bf16>,
    /// Every row's rotary cosines and sines (`ops::rope_cos_sin`), made once per forward.
    pub(super) rope_cos_sin: DeviceBuffer<u32>,
    pub(super) attn: DeviceBuffer<bf16>,
    pub(super) part_o: DeviceBuffer<f32>,
    pub(super) part_ml: DeviceBuffer<f32>,
    pub(super) gu: DeviceBuffer<bf16>,
    pub(super) act: DeviceBuffer<bf16>,
    pub(super) shared_out: DeviceBuffer<bf16>,
    pub(super) a_f32: DeviceBuffer<f32>,
    pub(super) router_logits: DeviceBuffer<f32>,
    pub(super) topk_idx: DeviceBuffer<i32>,
    pub(super) topk_w: DeviceBuffer<f32>,
    pub(super) slot_pos: DeviceBuffer<i32>,
    pub(super) row_token: DeviceBuffer<i32>,
    pub(super) tiles: DeviceBuffer<i32>,
    pub(super) num_tiles: DeviceBuffer<i32>,
    /// Per-CTA expert counts of the multi-CTA dispatch.
    pub(super) dispatch_scratch: DeviceBuffer<i32>,
    /// The zeroed counter of a routing that dispatches in the same launch
    /// (`ops::DispatchAfter::arrivals`).
    pub(super) route_arrivals: DeviceBuffer<i32>,
    /// The zeroed counters of the TMA expert GEMM's gate/up + down launch
    /// (`ops::DownProjection::ready`).
    pub(super) tile_ready: DeviceBuffer<i32>,
    pub(super) expert_gu: DeviceBuffer<bf16>,
    /// Entries of the admitted pool of a 2.2 denoising step (capacity + the shared expert; 0
    /// when the model has no such pool) and the u64 address arrays of its batched GEMMs:
    /// activations in (all `a`), outputs (rows `q * block_size..` of `expert_gu`, `expert_act`,
    /// `expert_out`), and the weights `ops::route_pooled` picks.
    pub(super) pool_entries: usize,
    pub(super) pool_x: DeviceBuffer<u64>,
    pub(super) pool_gate_up_out: DeviceBuffer<u64>,
    pub(super) pool_act: DeviceBuffer<u64>,
    pub(super) pool_out: DeviceBuffer<u64>,
    pub(super) pool_w_gate_up: DeviceBuffer<u64>,
    pub(super) pool_w_down: DeviceBuffer<u64>,
    pub(super) expert_act: DeviceBuffer<bf16>,
    pub(super) expert_out: DeviceBuffer<bf16>,
    /// Tensor maps of the pool GEMMs' inputs `[a, expert_act]` (see `Moe::expert_maps`).
    pub(super) pool_maps: Option<TensorMaps>,
    /// E4M3 copies of the experts' inputs (`a`, then `expert_act`) when FP8 experts multiply
    /// FP8 activations (`Workspace::new`'s `w8a8`): codes and F32 scales per group of at least
    /// 16 columns.
    pub(super) e4m3_rows: Option<[(DeviceBuffer<u8>, DeviceBuffer<f32>); 2]>,
    pub logits_bf16: DeviceBuffer<bf16>,
    pub logits_f32: DeviceBuffer<f32>,
    /// The wanted rows' argmax tokens (`[0, rows)`) then their confidences as F32 bits
    /// (`[rows, 2 rows)`): a step reads both back in one copy.
    pub top: DeviceBuffer<u32>,
    pub(super) top_scratch: DeviceBuffer<f32>,
    /// The wanted rows' best ids (`[rows, TOP_K]`) then their logits as F32 bits (the same
    /// shape after them): read back in one copy.
    pub best: DeviceBuffer<u32>,
    /// Device draws of sampled candidates (`ops::draw_rows`): at most one per wanted row, their
    /// parameters and their (token, confidence bits) pairs.
    pub draw_params: DeviceBuffer<u32>,
    pub draw_out: DeviceBuffer<u32>,
}

impl Workspace {
    /// `attn_rows`: (token x split) rows of attention partials wanted at least (batch-invariant
    /// attention needs tokens x fixed-position splits); `w8a8`: room for the E4M3 inputs of FP8
    /// experts on FP8 tensor cores.
    pub fn new(
        gpu: &Gpu,
        c: &Config,
        tokens: usize,
        logit_rows: usize,
        attn_rows: usize,
        w8a8: bool,
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
        let e4m3_rows = if w8a8 {
            let rows = |n: usize| -> CudaResult<(DeviceBuffer<u8>, DeviceBuffer<f32>)> {
                Ok((gpu.alloc(n)?, gpu.alloc(n / 16)?))
            };
            Some([rows(t * d)?, rows(expert_rows * iw)?])
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
            rope_cos_sin: gpu.alloc(ops::rope_cos_sin_len(&shape, t).max(1))?,
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
            dispatch_scratch: gpu.alloc(ops::moe_dispatch_scratch_len(e))?,
            route_arrivals: gpu.upload(&[0i32])?,
            tile_ready: gpu.upload(&vec![0i32; ops::grouped_tma_ready_len(max_tiles)])?,
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
            e4m3_rows,
            logits_bf16: gpu.alloc(r * c.vocab_size)?,
            logits_f32: gpu.alloc(r * c.vocab_size)?,
            top: gpu.alloc(2 * r)?,
            top_scratch: gpu.alloc(r * ops::TOP1_SLICES * 3)?,
            best: gpu.alloc(2 * r * TOP_K.min(c.vocab_size))?,
            draw_params: gpu.alloc(r * ops::DRAW_PARAM_WORDS)?,
            draw_out: gpu.alloc(2 * r)?,
        })
    }
}
