//! Launch-shape knobs that only change speed, read once from the environment so that one bench
//! run can compare variants on the same binary (docs/performance.md records which won). Unless
//! a line says otherwise, every setting gives the same bits.
//! - `MINNOW_MOE16_STAGES` (3 or 4): pipeline depth of the 16-row expert GEMM; 3 measured 3 %
//!   faster per refinement step on the H200.
//! - `MINNOW_ATTN_MAX_SPLITS` (1..=64): most key splits of a short forward's attention; 16 beat
//!   8 and 32.
//! - `MINNOW_ATTN_ONE_CTA_PERCENT`: tiles x KV heads, in percent of the SMs, from which
//!   batch-invariant attention walks a tile's key chunks in one CTA.
//! - `MINNOW_ATTN_CHUNK_KEYS` (128, 256 or 512): keys per fixed attention chunk (other bits,
//!   still batch-invariant; the longest context is 256 chunks).
//! - `MINNOW_ROUTER_MMA=0`: BF16 router weights on the F32 CUDA-core kernels instead of tensor
//!   cores (other bits).
//! - `MINNOW_ROUTER_TILED_ROWS`: rows from which BF16 router logits take the shared-memory tiled
//!   kernel.
//! - `MINNOW_DENSE_LT_MIN_ROWS`: dense GEMMs of fewer rows skip their cuBLASLt plan.
//! - `MINNOW_MOE64_ROWS` (1..=1024): rows per busy expert from which the grouped expert GEMM
//!   takes 64-row tiles.
//! - `MINNOW_MOE_POOLED=0` turns off the batched experts of 2.2 denoising steps, and
//!   `MINNOW_POOL_GEMM=0` runs them with cuBLAS instead of the bulk-copy kernel.
//! - `MINNOW_GROUPED_TMA=0` keeps BF16 experts with few rows on the 4-warp tiles instead of the
//!   TMA-fed kernel; `MINNOW_GROUPED_PAIR=0` runs that kernel's gate/up and down as two launches.
//! - `MINNOW_GROUPED_WGMMA=0` keeps experts with many rows off the wgmma kernel.
//! - `MINNOW_BATCH_INVARIANT=0` turns batch invariance off (the default is on): cuBLAS for dense
//!   GEMMs and the router, the pooled experts, attention splits sized to the batch. Faster in
//!   places, but a request's tokens then depend on the load.
//! - `MINNOW_FP8_ACTIVATIONS=1` multiplies FP8 experts by E4M3 activations on FP8 tensor cores
//!   (W8A8: other bits, still invariant; measured slower than the default, see
//!   docs/performance.md).
//!
//! The rest (`MINNOW_ATTN_WGMMA`, `MINNOW_CODES_WGMMA`, `MINNOW_CODES_SS`, `MINNOW_CODES_GATED`,
//! `MINNOW_CODES32_BELOW`, `MINNOW_CODES_SETTLED`, `MINNOW_SHARED_BESIDE`, `MINNOW_DENSE16_ROWS`, `MINNOW_DENSE128_ROWS`,
//! `MINNOW_ROUTER_WIDE_ROWS`, `MINNOW_ROUTER_FEW_ROWS`, `MINNOW_ROUTER_CLUSTER_ROWS`,
//! `MINNOW_ROUTER_CLUSTER_BELOW`, `MINNOW_ROUTE_DISPATCH`) are described on the fields of
//! [`Tuning`] they set.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub moe16_stages: usize,
    pub attn_max_splits: usize,
    /// Rows per busy expert from which the grouped expert GEMM cuts 64-row tiles (else 16).
    pub moe64_rows: usize,
    /// 2.2 denoising steps run their experts as batched cuBLAS GEMMs over the admitted pool
    /// (`MINNOW_MOE_POOLED=0`: the grouped GEMM over dispatched rows instead).
    pub moe_pooled: bool,
    /// The pooled experts use the bulk-copy kernel where it applies (`MINNOW_POOL_GEMM=0`: cuBLAS's
    /// batched GEMM).
    pub pool_gemm: bool,
    /// The grouped expert GEMM over BF16 experts streams its weights through TMA where it applies
    /// (Hopper and newer; with the wgmma kernel on, that is the 16-row tiles of short forwards:
    /// a refinement step measured 5-6 % faster). `MINNOW_GROUPED_TMA=0` keeps the 4-warp tiles.
    /// Same bits either way. (It was opt-in while whole forwards with it decoded differently
    /// from run to run; fencing its barrier initialisation for the async proxy ended that:
    /// docs/performance.md.)
    pub grouped_tma: bool,
    /// That TMA kernel runs the down projection behind gate/up in one launch
    /// (`MINNOW_GROUPED_PAIR=0`: two launches; same bits).
    pub grouped_pair: bool,
    /// Forwards whose experts get many rows each (where the grouped GEMM cuts 64-row tiles) run
    /// BF16 experts through the wgmma kernel over 128-row tiles on compute capability 9.0
    /// (`MINNOW_GROUPED_WGMMA=0`: the mma.sync tiles; same bits, batched steps and prefill
    /// slower). It was off for a while when a stage release could let one warp fall a stage
    /// behind and hang the launch (docs/performance.md, sessions thirty-one and thirty-two).
    pub grouped_wgmma: bool,
    /// Quantized experts of such forwards on their wgmma kernel (128-row tiles, the same bits as
    /// the mma.sync codes tiles; `MINNOW_CODES_WGMMA=1`). Off by default: since the codes tiles
    /// compute their copy addresses once per tile, the mma.sync tiles are faster for every
    /// encoding at every batch size (FP8 and INT8, which took the wgmma kernel from 32 rows per
    /// expert, measured 14-20 % faster at x64 and in prefill on them; docs/performance.md,
    /// session thirty-four).
    pub codes_wgmma: bool,
    /// INT4, INT8 and E4M3 experts (without a packed shared expert) take the wgmma kernels that
    /// decode their codes into shared memory for the BF16 kernel's products (same bits), whether
    /// or not [`Tuning::codes_wgmma`] is on: `MINNOW_CODES_SS=1` in forwards whose experts get
    /// many rows each (batched steps, prefill), `=2` in every forward (a lone request's
    /// denoising steps too). 0, off, until measured: written in session forty-three without a
    /// GPU.
    pub codes_ss: usize,
    /// The quantized experts' gate/up kernels write silu_mul's result themselves (the gate and
    /// up bands of the same columns side by side in a CTA) instead of the products for a
    /// separate `silu_mul` launch. `MINNOW_CODES_GATED=0`: two launches. Same bits either way.
    pub codes_gated: bool,
    /// Rows per busy expert, on average, below which quantized experts' mma.sync kernels cut
    /// 32-row tiles where 64-row ones would be cut (`MINNOW_CODES32_BELOW=N`; 0: never). Same
    /// bits. 64 by default: with the tiles' addressing hoisted, a batch of 16 denoising blocks
    /// (about 18 rows per expert) measured 4-6 % faster on 32-row tiles for INT4, INT8 and FP8,
    /// and 128 (which also moves 64-block batches) slower (docs/performance.md, session
    /// thirty-four).
    pub codes32_below: usize,
    /// A quantized down projection's codes tiles read their tile list, and copy their first
    /// stages' weights, before waiting for the gate/up kernel before them
    /// (`ExpertTiles::settled`; `MINNOW_CODES_SETTLED=0`: after). Same bits. On: a refinement
    /// step's down projection has four 128-column stages, half of them then in flight before
    /// gate/up ends (H100: INT4 refinement median 2.25 -> 2.17 ms, INT8 2.76 -> 2.57 ms; batched
    /// steps and prefill unchanged; docs/performance.md, session thirty-four).
    pub codes_settled: bool,
    /// A shared expert that runs on its own (not inside the grouped expert GEMM) is queued on
    /// the side stream (`Gpu::beside`), beside the router and the routed experts, and joined
    /// before the combine: its three small launches overlap theirs. Batch-invariant mode only
    /// (plain cuBLAS is bound to the main stream). `MINNOW_SHARED_BESIDE=0`: in line. Same bits.
    pub shared_beside: bool,
    /// Beside quantized routed experts, whether the BF16 shared expert joins their grouped launch
    /// as one more expert (its tiles in the codes' fragment order; `MINNOW_SHARED_IN_CODES=1`)
    /// or stays a separate MLP on the side stream (`shared_beside`), running while the router
    /// and the codes launch run (the default). Its CTAs in the codes launch stream 4x (INT4) the
    /// bytes of a codes CTA; beside it, batched INT4 steps run 2-5 % faster on the H100 and the
    /// refinement step no slower (docs/performance.md, session thirty-two). Read when the
    /// weights load. The two give other bits (beside, the shared expert's sums come from the
    /// dense GEMMs), each the same in every forward.
    pub shared_in_codes: bool,
    /// Every row's arithmetic is independent of the batch around it (on by default; see
    /// docs/performance.md for its cost): the dense GEMMs, the router and the lm_head run
    /// minnow's fixed-order kernels, the experts always take the grouped GEMM, and attention
    /// splits keys at fixed positions.
    pub invariant: bool,
    /// The batch-invariant dense GEMM's tile by row count (speed only: every tile gives the same
    /// bits): 16-row tiles up to `dense16_rows` rows (`MINNOW_DENSE16_ROWS`), 128 x 128 tiles from
    /// `dense128_rows` (`MINNOW_DENSE128_ROWS`), 64-row tiles between.
    pub dense16_rows: usize,
    pub dense128_rows: usize,
    /// Router logits of at least this many rows run the wide kernel (4 experts per warp; the
    /// same bits as the narrow one, see kernels/router.cu): `MINNOW_ROUTER_WIDE_ROWS`.
    pub router_wide_rows: usize,
    /// Router logits of at most this many rows run the narrow kernel with 4 rows per warp
    /// instead of 16 (same bits): `MINNOW_ROUTER_FEW_ROWS`.
    pub router_few_rows: usize,
    /// Batch-invariant attention walks each tile's key chunks in one CTA (same bits as a CTA per
    /// chunk plus the combine) when the forward's tiles x KV heads reach this percentage of the
    /// SMs: `MINNOW_ATTN_ONE_CTA_PERCENT` (0: always, a large value: never). 75: on the H200
    /// eight 32-token requests (64) were faster with a CTA per chunk, sixteen (128) in one CTA.
    pub attn_one_cta_percent: usize,
    /// Keys per fixed-position attention chunk (`ops::attention_chunk_keys`), 256 by default;
    /// `MINNOW_ATTN_CHUNK_KEYS=128|512`. Other bits (the chunks fold in other places), the same in
    /// every forward of the process, so batch invariance holds under any setting. 128 gives a
    /// short forward twice the split CTAs (each half the keys), and halves the longest context
    /// (256 splits: 32K keys); 512 the reverse.
    pub attn_chunk_keys: usize,
    /// That one-CTA-per-tile attention runs on the wgmma kernel on compute capability 9.0
    /// (head dim 128; same bits as the mma.sync kernel): `MINNOW_ATTN_WGMMA`.
    pub attention_wgmma: bool,
    /// BF16 router weights multiply on tensor cores (`MINNOW_ROUTER_MMA=0`: the F32 CUDA-core
    /// kernels, whose sums round differently, so the two settings give different bits).
    pub router_mma: bool,
    /// BF16 router logits of at least this many rows run the shared-memory tiled tensor-core
    /// kernel (same bits as the untiled one, see kernels/router.cu): `MINNOW_ROUTER_TILED_ROWS`
    /// (a value above any forward's rows keeps the untiled kernel).
    pub router_tiled_rows: usize,
    /// BF16 router logits of at least `router_cluster_rows` and fewer than
    /// `router_cluster_below` rows run on Hopper and newer as clusters of eight CTAs per tile,
    /// one per summation range (same bits as the tiled kernel): `MINNOW_ROUTER_CLUSTER_ROWS`,
    /// `MINNOW_ROUTER_CLUSTER_BELOW`. Below 4,096 rows the tiled kernel's CTAs leave SMs idle;
    /// from there it was faster (docs/performance.md, session thirty-seven).
    pub router_cluster_rows: usize,
    pub router_cluster_below: usize,
    /// A denoising step's `route_block` CTAs run on 1,024 threads, each expert's admission loops
    /// shared by several threads (exact maxima and counts: the same choices either way):
    /// `MINNOW_ROUTE_SHARED=0` launches one thread per expert.
    pub route_shared: bool,
    /// A 2.2 routing with few assignments dispatches them in the same launch (its last CTA runs
    /// the one-CTA dispatch; the same outputs): `MINNOW_ROUTE_DISPATCH=0` keeps two launches.
    /// On by default: on the H100 it took 0.9 % (BF16) and 1.1 % (INT4) off a 16-request step
    /// and left the refinement step as it was (docs/performance.md, session forty-one).
    pub route_dispatch: bool,
    /// A denoising step's router logits stage their operands in shared memory with 16-byte
    /// copies (same fragments and products: the same bits): `MINNOW_ROUTER_STAGED=0` reads the
    /// mma fragments straight from global memory.
    pub router_staged: bool,
    /// Planned cuBLASLt algorithms run dense GEMMs of at least this many rows; fewer rows take
    /// minnow's kernel (same bits either way): `MINNOW_DENSE_LT_MIN_ROWS`.
    pub dense_lt_min_rows: usize,
    /// cuBLASLt algorithms the dense GEMM planner times per row bucket, of those its heuristic
    /// offers, fastest first (`MINNOW_LT_CANDIDATES`, 1 to 32): more finds a faster algorithm
    /// that sums in minnow's order where the first few tile the output badly, at a longer load.
    pub lt_candidates: usize,
    /// FP8 (`fp8_e4m3_b128`) experts multiply E4M3 activations on FP8 tensor cores
    /// (`MINNOW_FP8_ACTIVATIONS=1`, Hopper): every row's expert inputs are quantized per group
    /// of columns first, which changes the bits (for every row alike, so invariance holds).
    pub fp8_activations: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            moe16_stages: 3,
            attn_max_splits: 16,
            moe64_rows: 12,
            moe_pooled: true,
            pool_gemm: true,
            grouped_tma: true,
            grouped_pair: true,
            grouped_wgmma: true,
            codes_wgmma: false,
            codes_ss: 0,
            codes_gated: true,
            codes32_below: 64,
            codes_settled: true,
            shared_beside: true,
            shared_in_codes: false,
            invariant: true,
            dense16_rows: 32,
            dense128_rows: 256,
            router_wide_rows: 256,
            router_few_rows: 64,
            attn_one_cta_percent: 75,
            attn_chunk_keys: 256,
            attention_wgmma: true,
            router_mma: true,
            router_tiled_rows: 1024,
            router_cluster_rows: 256,
            router_cluster_below: 4096,
            route_shared: true,
            route_dispatch: true,
            router_staged: true,
            dense_lt_min_rows: 0,
            lt_candidates: 4,
            fp8_activations: false,
        }
    }
}

fn env_usize(name: &str, allowed: impl Fn(usize) -> bool) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    match value.parse::<usize>() {
        Ok(v) if allowed(v) => Some(v),
        _ => {
            tracing::warn!("ignoring {name}={value}: not an allowed value");
            None
        }
    }
}

/// The knobs in force (defaults unless overridden by the environment).
pub fn tuning() -> &'static Tuning {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    TUNING.get_or_init(|| {
        let d = Tuning::default();
        Tuning {
            moe16_stages: env_usize("MINNOW_MOE16_STAGES", |v| v == 3 || v == 4)
                .unwrap_or(d.moe16_stages),
            attn_max_splits: env_usize("MINNOW_ATTN_MAX_SPLITS", |v| (1..=64).contains(&v))
                .unwrap_or(d.attn_max_splits),
            moe64_rows: env_usize("MINNOW_MOE64_ROWS", |v| (1..=1024).contains(&v))
                .unwrap_or(d.moe64_rows),
            moe_pooled: env_usize("MINNOW_MOE_POOLED", |v| v <= 1).map_or(d.moe_pooled, |v| v == 1),
            pool_gemm: env_usize("MINNOW_POOL_GEMM", |v| v <= 1).map_or(d.pool_gemm, |v| v == 1),
            grouped_tma: env_usize("MINNOW_GROUPED_TMA", |v| v <= 1)
                .map_or(d.grouped_tma, |v| v == 1),
            grouped_pair: env_usize("MINNOW_GROUPED_PAIR", |v| v <= 1)
                .map_or(d.grouped_pair, |v| v == 1),
            grouped_wgmma: env_usize("MINNOW_GROUPED_WGMMA", |v| v <= 1)
                .map_or(d.grouped_wgmma, |v| v == 1),
            codes_wgmma: env_usize("MINNOW_CODES_WGMMA", |v| v <= 1)
                .map_or(d.codes_wgmma, |v| v == 1),
            codes_ss: env_usize("MINNOW_CODES_SS", |v| v <= 2).unwrap_or(d.codes_ss),
            codes_gated: env_usize("MINNOW_CODES_GATED", |v| v <= 1)
                .map_or(d.codes_gated, |v| v == 1),
            codes32_below: env_usize("MINNOW_CODES32_BELOW", |v| v <= 1024)
                .unwrap_or(d.codes32_below),
            codes_settled: env_usize("MINNOW_CODES_SETTLED", |v| v <= 1)
                .map_or(d.codes_settled, |v| v == 1),
            shared_beside: env_usize("MINNOW_SHARED_BESIDE", |v| v <= 1)
                .map_or(d.shared_beside, |v| v == 1),
            shared_in_codes: env_usize("MINNOW_SHARED_IN_CODES", |v| v <= 1)
                .map_or(d.shared_in_codes, |v| v == 1),
            invariant: env_usize("MINNOW_BATCH_INVARIANT", |v| v <= 1)
                .map_or(d.invariant, |v| v == 1),
            dense16_rows: env_usize("MINNOW_DENSE16_ROWS", |_| true).unwrap_or(d.dense16_rows),
            dense128_rows: env_usize("MINNOW_DENSE128_ROWS", |_| true).unwrap_or(d.dense128_rows),
            router_wide_rows: env_usize("MINNOW_ROUTER_WIDE_ROWS", |_| true)
                .unwrap_or(d.router_wide_rows),
            router_few_rows: env_usize("MINNOW_ROUTER_FEW_ROWS", |_| true)
                .unwrap_or(d.router_few_rows),
            attn_one_cta_percent: env_usize("MINNOW_ATTN_ONE_CTA_PERCENT", |_| true)
                .unwrap_or(d.attn_one_cta_percent),
            attn_chunk_keys: env_usize("MINNOW_ATTN_CHUNK_KEYS", |v| {
                v == 128 || v == 256 || v == 512
            })
            .unwrap_or(d.attn_chunk_keys),
            attention_wgmma: env_usize("MINNOW_ATTN_WGMMA", |v| v <= 1)
                .map_or(d.attention_wgmma, |v| v == 1),
            router_mma: env_usize("MINNOW_ROUTER_MMA", |v| v <= 1).map_or(d.router_mma, |v| v == 1),
            router_tiled_rows: env_usize("MINNOW_ROUTER_TILED_ROWS", |_| true)
                .unwrap_or(d.router_tiled_rows),
            router_cluster_rows: env_usize("MINNOW_ROUTER_CLUSTER_ROWS", |_| true)
                .unwrap_or(d.router_cluster_rows),
            router_cluster_below: env_usize("MINNOW_ROUTER_CLUSTER_BELOW", |_| true)
                .unwrap_or(d.router_cluster_below),
            route_shared: env_usize("MINNOW_ROUTE_SHARED", |v| v <= 1)
                .map_or(d.route_shared, |v| v == 1),
            route_dispatch: env_usize("MINNOW_ROUTE_DISPATCH", |v| v <= 1)
                .map_or(d.route_dispatch, |v| v == 1),
            router_staged: env_usize("MINNOW_ROUTER_STAGED", |v| v <= 1)
                .map_or(d.router_staged, |v| v == 1),
            dense_lt_min_rows: env_usize("MINNOW_DENSE_LT_MIN_ROWS", |_| true)
                .unwrap_or(d.dense_lt_min_rows),
            lt_candidates: env_usize("MINNOW_LT_CANDIDATES", |v| (1..=32).contains(&v))
                .unwrap_or(d.lt_candidates),
            fp8_activations: env_usize("MINNOW_FP8_ACTIVATIONS", |v| v <= 1)
                .map_or(d.fp8_activations, |v| v == 1),
        }
    })
}
