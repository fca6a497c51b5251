//! A MoE layer's experts on the GPU, after its router logits: over a 2.2 denoising step's admitted
//! pool, or as the dispatched grouped GEMMs of any other forward.

use minnow_runtime::cuda::ops::{self, RouterShape};
use minnow_runtime::cuda::tma::MappedTensor;
use minnow_runtime::cuda::tuning::tuning;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu};

use super::dense::{queue_swiglu, queue_swiglu_at};
use super::weights::{Mlp, Moe, SharedExpert, Weights};
use super::workspace::Workspace;
use crate::config::Config;

/// Marks the end of a profiled stage (a no-op without a profile).
pub(super) type Mark<'a> = dyn FnMut(&'static str) -> CudaResult<()> + 'a;

/// The experts of a 2.2 denoising step (one routing block) as two GEMMs over the block's admitted
/// pool (`ops::ExpertPool`), after the router logits: the TMA pool kernel on Hopper (SiLU in its
/// gate/up epilogue), else cuBLAS's batched GEMM around `silu_mul`. Returns the shared expert's
/// (`shared`, `shared_rows`) inputs of the combine.
pub(super) fn queue_pooled_experts(
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

/// `rows` x `cols` BF16 expert inputs at `x` as E4M3 rows in `buffers` (codes, scales), per
/// group of `group` columns, for the W8A8 expert GEMM.
fn quantize_input(
    gpu: &Gpu,
    buffers: &(DeviceBuffer<u8>, DeviceBuffer<f32>),
    x: u64,
    rows: usize,
    cols: usize,
    group: usize,
    mark: &mut Mark,
) -> CudaResult<ops::E4m3Rows> {
    let q = ops::E4m3Rows {
        codes: buffers.0.ptr(),
        scales: buffers.1.ptr(),
    };
    ops::quantize_rows_e4m3(gpu, x, rows, cols, group, &q)?;
    mark("experts quantize")?;
    Ok(q)
}

/// The activation groups (gate/up, down) when this layer's FP8 experts multiply E4M3
/// activations on FP8 tensor cores (`MINNOW_FP8_ACTIVATIONS=1` on Hopper, both projections).
fn moe_w8a8_groups(gpu: &Gpu, c: &Config, moe: &Moe) -> Option<(usize, usize)> {
    if !tuning().fp8_activations {
        return None;
    }
    let (d, iw) = (c.hidden_size, c.moe_intermediate_size);
    let up = moe.experts_gate_up.w8a8_group(gpu, 2 * iw, d)?;
    let down = moe.experts_down.w8a8_group(gpu, d, iw)?;
    Some((up, down))
}

/// Whether any MoE layer of `weights` runs its FP8 experts on FP8 tensor cores (the workspace
/// then holds their E4M3 inputs).
pub(super) fn runs_w8a8(gpu: &Gpu, c: &Config, weights: &Weights) -> bool {
    weights.layers.iter().any(|l| match &l.mlp {
        Mlp::Moe(m) => moe_w8a8_groups(gpu, c, m).is_some(),
        Mlp::Dense(_) => false,
    })
}

/// The tile rows of quantized experts' mma.sync kernels in a forward of `assignments` rows over
/// `busy` experts whose dispatch would cut `tile_rows`: 32 instead of 64 while the experts
/// average fewer than `below` rows (`Tuning::codes32_below`; 0: never). A 64-row stage's
/// activation room holds two stages where a 32-row one holds three, so the tiles of a batch of
/// ~16 blocks (about 18 rows per expert) keep more codes in flight; an expert with more rows
/// than a tile takes one tile more, streaming its weights once more. Same bits (every row's
/// output is one chain over K whatever the tile).
fn codes_tile_rows(tile_rows: usize, assignments: usize, busy: usize, below: usize) -> usize {
    if tile_rows == 64 && assignments < below * busy.max(1) {
        32
    } else {
        tile_rows
    }
}

/// A grouped expert GEMM over BF16 weights read through their tensor map, with the gated
/// (SiLU) epilogue for gate/up: `ops::grouped_gemm_wgmma` or `ops::grouped_gemm_tma`.
type StreamedGemm = fn(
    &Gpu,
    MappedTensor,
    u64,
    u64,
    u64,
    u64,
    &ops::ExpertTiles,
    usize,
    usize,
    bool,
) -> CudaResult<()>;

/// How a grouped MoE layer runs: the batch's routing blocks, how many experts can get rows,
/// the expert GEMM's tile rows and whether the shared expert rides in it.
pub(super) struct Grouping {
    pub(super) blocks: ops::RoutingBlocks,
    pub(super) busy: usize,
    pub(super) tile_rows: usize,
    pub(super) packed: bool,
}

/// The experts of any other forward, after the router logits: routing, the device-side dispatch,
/// two grouped GEMMs over the used experts (with the packed shared expert among them when
/// `packed`), and the shared expert on its own unless `shared_queued` (the caller queued
/// [`queue_shared_alone`] already). Returns the combine's shared-expert inputs.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_grouped_experts(
    gpu: &Gpu,
    c: &Config,
    ws: &Workspace,
    moe: &Moe,
    router: &RouterShape,
    t: usize,
    grouping: &Grouping,
    shared_queued: bool,
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
    let busy = grouping.busy + usize::from(packed);
    // FP8 experts on FP8 tensor cores (W8A8): the workspace's E4M3 rows and the two groups.
    let w8a8 = match &ws.e4m3_rows {
        Some(buffers) => moe_w8a8_groups(gpu, c, moe).map(|groups| (buffers, groups)),
        None => None,
    };
    // BF16 experts with many rows each on compute capability 9.0 (MINNOW_GROUPED_WGMMA=0 turns it
    // off): the wgmma kernel over 128-row tiles, so an expert's weights stream once for up to
    // 128 rows.
    let bf16_maps = moe.expert_maps.as_ref().zip(moe.bf16_experts());
    let many_rows = grouping.tile_rows == 64;
    let wgmma = if bf16_maps.is_some() {
        many_rows
            && tuning().grouped_wgmma
            && ops::grouped_wgmma_supported(gpu, 2 * iw, d)
            && ops::grouped_wgmma_supported(gpu, d, iw)
    } else {
        // Quantized experts likewise on their wgmma kernels (BF16 activations: not with W8A8)
        // when `Tuning::codes_wgmma` asks (off by default: slower than the tiles), and INT4,
        // INT8 and E4M3 ones on the kernels that decode into shared memory when
        // `Tuning::codes_ss` asks (1: these forwards; 2: every forward, the denoising steps of
        // few rows too; off until measured; `ops::grouped_gemm_codes_wgmma` picks them).
        let ss = match tuning().codes_ss {
            0 => false,
            1 => many_rows,
            _ => true,
        };
        w8a8.is_none()
            && ((many_rows
                && tuning().codes_wgmma
                && moe.experts_gate_up.codes_wgmma(gpu, 2 * iw, d)
                && moe.experts_down.codes_wgmma(gpu, d, iw))
                || (ss
                    && moe.experts_gate_up.codes_ss(gpu, 2 * iw, d)
                    && moe.experts_down.codes_ss(gpu, d, iw)))
    };
    let tile_rows = if wgmma {
        ops::GROUPED_WGMMA_ROWS
    } else if moe.experts_gate_up.bf16().is_none()
        && moe.experts_down.bf16().is_none()
        && w8a8.is_none()
    {
        // Both projections in codes: a file whose down projections the loader widened to BF16
        // keeps the tiles the BF16 kernels take.
        codes_tile_rows(grouping.tile_rows, a, busy, tuning().codes32_below)
    } else {
        grouping.tile_rows
    };
    let dispatch = ops::DispatchAfter {
        experts: slots,
        tile_rows,
        shared_expert: packed.then_some(e),
        slot_pos: ws.slot_pos.ptr(),
        row_token: ws.row_token.ptr(),
        tiles: ws.tiles.ptr(),
        num_tiles: ws.num_tiles.ptr(),
        arrivals: ws.route_arrivals.ptr(),
    };
    if tuning().route_dispatch && ops::routes_and_dispatches_in_one_launch(router, t, &dispatch) {
        // A denoising step's few assignments dispatched by the routing's own launch (on unless
        // `MINNOW_ROUTE_DISPATCH=0`): one kernel boundary fewer in its chain of short launches.
        ops::route_and_dispatch_in_one_launch(
            gpu,
            router,
            ws.router_logits.ptr(),
            moe.bias.ptr(),
            ws.topk_idx.ptr(),
            ws.topk_w.ptr(),
            t,
            grouping.blocks,
            &dispatch,
        )?;
        mark("router + dispatch")?;
    } else {
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
        // The same outputs as the one launch's, from the same description.
        ops::moe_dispatch(
            gpu,
            ws.topk_idx.ptr(),
            t,
            k,
            dispatch.experts,
            dispatch.tile_rows,
            dispatch.shared_expert,
            dispatch.slot_pos,
            dispatch.row_token,
            dispatch.tiles,
            dispatch.num_tiles,
            ws.dispatch_scratch.ptr(),
        )?;
        mark("dispatch")?;
    }
    let tiles = ops::ExpertTiles {
        tiles: ws.tiles.ptr(),
        num_tiles: ws.num_tiles.ptr(),
        max_tiles: ops::moe_max_tiles(a, busy, tile_rows),
        rows: tile_rows,
        settled: false,
    };
    // BF16 experts whose weights stream through TMA, SiLU in the gate/up epilogue (the same bits
    // as the 4-warp tiles below): the wgmma kernel for 128-row tiles, else on Hopper the TMA-fed
    // mma.sync kernel (MINNOW_GROUPED_TMA, on by default).
    let streamed = bf16_maps.and_then(|weights| {
        let gemm: StreamedGemm = if wgmma {
            ops::grouped_gemm_wgmma
        } else if tuning().grouped_tma
            && ops::grouped_tma_supported(gpu, tile_rows, 2 * iw, d)
            && ops::grouped_tma_supported(gpu, tile_rows, d, iw)
        {
            ops::grouped_gemm_tma
        } else {
            return None;
        };
        Some((gemm, weights))
    });
    match streamed {
        Some((gemm, (maps, (gate_up, down)))) => {
            let (x, row_token, act) = (ws.a.ptr(), ws.row_token.ptr(), ws.expert_act.ptr());
            let out = ws.expert_out.ptr();
            let (w, w_ptr) = (maps.get(0), gate_up.ptr());
            if !wgmma && tuning().grouped_pair {
                // The TMA kernel runs the down projection behind gate/up in the same launch
                // (same bits): one launch's tail instead of two, and no second kernel start.
                let down = ops::DownProjection {
                    w: maps.get(1),
                    w_ptr: down.ptr(),
                    y: out,
                    n: d,
                    ready: ws.tile_ready.ptr(),
                };
                ops::grouped_gemm_tma_pair(
                    gpu,
                    w,
                    w_ptr,
                    x,
                    row_token,
                    act,
                    &tiles,
                    2 * iw,
                    d,
                    &down,
                )?;
                mark("experts gate/up + down")?;
            } else {
                gemm(gpu, w, w_ptr, x, row_token, act, &tiles, 2 * iw, d, true)?;
                mark("experts gate/up")?;
                gemm(
                    gpu,
                    maps.get(1),
                    down.ptr(),
                    act,
                    0,
                    out,
                    &tiles,
                    d,
                    iw,
                    false,
                )?;
                mark("experts down")?;
            }
        }
        None => {
            // FP8 experts on FP8 tensor cores: each input row quantized once, per column group.
            let (x, row_token, gu) = (ws.a.ptr(), ws.row_token.ptr(), ws.expert_gu.ptr());
            let xq = w8a8
                .map(|(b, g)| quantize_input(gpu, &b[0], x, t, d, g.0, mark))
                .transpose()?;
            // Codes times BF16 rows write silu_mul's result in the gate/up kernel (same bits).
            let act = ws.expert_act.ptr();
            let gated = moe.experts_gate_up.gates_in_gemm(2 * iw, xq.is_some());
            moe.experts_gate_up.grouped_gemm(
                gpu,
                x,
                xq.as_ref(),
                row_token,
                if gated { act } else { gu },
                &tiles,
                2 * iw,
                d,
                gated,
            )?;
            mark("experts gate/up")?;
            if !gated {
                ops::silu_mul(gpu, gu, act, a, iw)?;
                mark("experts silu")?;
            }
            let actq = w8a8
                .map(|(b, g)| quantize_input(gpu, &b[1], act, a, iw, g.1, mark))
                .transpose()?;
            let out = ws.expert_out.ptr();
            // Gate/up (and silu_mul or the quantization) came between the dispatch and this
            // launch, so it may read the tile list before waiting for the kernel before it.
            let settled = ops::ExpertTiles {
                settled: tuning().codes_settled,
                ..tiles
            };
            moe.experts_down.grouped_gemm(
                gpu,
                act,
                actq.as_ref(),
                0,
                out,
                &settled,
                d,
                iw,
                false,
            )?;
            mark("experts down")?;
        }
    }
    Ok(match &moe.shared {
        // Its rows are where the dispatch put assignments t * k + t'.
        SharedExpert::Packed if packed => (0, ws.slot_pos.ptr_at(t * k)),
        SharedExpert::None => (0, 0),
        _ if shared_queued => (ws.shared_out.ptr(), 0),
        _ => {
            let out = queue_shared_alone(gpu, c, ws, moe, t)?;
            mark("shared expert")?;
            out
        }
    })
}

/// The shared expert of `moe` on its own (not inside the grouped expert GEMM), over the normed
/// rows `a` into `shared_out`, through the workspace's `gu` and `act`, which no routed-expert
/// launch touches (so it may run beside them, `Gpu::beside`). Returns the combine's
/// shared-expert inputs.
pub(super) fn queue_shared_alone(
    gpu: &Gpu,
    c: &Config,
    ws: &Workspace,
    moe: &Moe,
    t: usize,
) -> CudaResult<(u64, u64)> {
    let (d, e, iw) = (c.hidden_size, c.num_experts, c.moe_intermediate_size);
    match &moe.shared {
        SharedExpert::Separate(mlp) => {
            queue_swiglu(gpu, ws, mlp, ws.a.ptr(), ws.shared_out.ptr(), t, d)?;
        }
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
        }
        SharedExpert::None => return Ok((0, 0)),
    }
    Ok((ws.shared_out.ptr(), 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Mini's shapes: 8 of 256 routed experts per token plus the packed shared expert, so a
    // forward of t tokens has 9 t assignments over at most 257 experts.
    const BUSY: usize = 257;

    #[test]
    fn sixteen_block_batches_take_32_row_codes_tiles_and_larger_ones_keep_64() {
        let (x16, x64, prefill) = (16 * 32 * 9, 64 * 32 * 9, 4096 * 9);
        let below = minnow_runtime::cuda::tuning::Tuning::default().codes32_below;
        assert_eq!(codes_tile_rows(64, x16, BUSY, below), 32);
        assert_eq!(codes_tile_rows(64, x64, BUSY, below), 64);
        assert_eq!(codes_tile_rows(64, prefill, BUSY, below), 64);
        // 16-row tiles (a denoising step, x4) stay; 0 turns the 32-row tiles off.
        assert_eq!(codes_tile_rows(16, 4 * 32 * 9, BUSY, below), 16);
        assert_eq!(codes_tile_rows(64, x16, BUSY, 0), 64);
    }
}
