//! The kernel table: every kernel of `kernels/*.cu` that the backend launches, with its module
//! and its parameters, declared once. From each module's entry `kernel_table!` makes
//!
//! - its [`PtxModule`] in [`MODULES`] (the embedded PTX `ptx/<module>.ptx` and
//!   `ptx/<module>.sm90.ptx`, the kernels the device looks up, the shared-memory opt-in);
//! - a typed launcher per kernel, `kernels::<module>::<kernel>(gpu, cfg, args...)`, that hands
//!   the arguments to the driver in the declared order (the launchers of `ops` call these; a
//!   kernel is never launched by a name written anywhere else);
//! - for the tests, each kernel's parameter types, which must be the ones its PTX entry declares
//!   (`ptx.rs`: a pointer or a 64-bit integer is `.u64`, an `int` `.u32`, a `float` `.f32`).
//!
//! Kernels that share one signature are declared together (`a, b (params);`) and may name the
//! function-pointer type of their launchers (`a, b as Alias (params);`), for launchers that pick
//! one of them by shape.

/// One compiled kernel file.
pub struct PtxModule {
    /// File stem under `kernels/` and `ptx/`.
    pub name: &'static str,
    /// sm_80 PTX: runs on every supported GPU.
    pub ptx: &'static str,
    /// sm_90 PTX of the same source: what Hopper and newer GPUs load (it holds the
    /// programmatic-dependent-launch instructions the sm_80 build leaves out).
    pub ptx_sm90: &'static str,
    /// The `extern "C"` entry points the backend looks up.
    pub functions: &'static [&'static str],
    /// Dynamic shared memory the module's kernels may ask for beyond the 48 KiB default
    /// (0: none do).
    pub max_dynamic_shared: u32,
}

/// Dynamic shared memory the router kernels may use: `route_block` holds the F32 scores of 2 x its
/// tokens x the experts (a routing block of 32 tokens over 256 experts; fewer tokens per CTA
/// when there are more experts); its static part is 24 KiB more.
pub const ROUTER_MAX_SHARED: u32 = 64 * 1024;

/// Dynamic shared memory of `router_logits_mma_bf16w_e8s`: 8 warps x 24 rows (16 of X, 8 of the
/// weights) x 264 BF16 columns (ROUTER_STAGED_SHARED in kernels/router.cu).
pub const ROUTER_STAGED_SHARED: u32 = 8 * 24 * 264 * 2;

/// The router module's dynamic shared-memory opt-in: the larger of its kernels' needs.
pub const ROUTER_MODULE_SHARED: u32 = if ROUTER_STAGED_SHARED > ROUTER_MAX_SHARED {
    ROUTER_STAGED_SHARED
} else {
    ROUTER_MAX_SHARED
};

/// Declares the kernel modules (see the module documentation for what it makes).
macro_rules! kernel_table {
    ($(
        $(#[doc = $module_doc:literal])*
        $module:ident (max_dynamic_shared: $shared:expr) {
            $(
                $(#[doc = $doc:literal])*
                $($kernel:ident),+ $(as $alias:ident)? ( $($params:tt)* );
            )*
        }
    )*) => {
        /// Every kernel module, in the order the device loads them.
        pub const MODULES: &[PtxModule] = &[$(
            PtxModule {
                name: stringify!($module),
                ptx: include_str!(concat!("ptx/", stringify!($module), ".ptx")),
                ptx_sm90: include_str!(concat!("ptx/", stringify!($module), ".sm90.ptx")),
                functions: $module::NAMES,
                max_dynamic_shared: $shared,
            },
        )*];

        $(
            $(#[doc = $module_doc])*
            pub mod $module {
                use crate::cuda::error::CudaResult;
                use crate::cuda::launch::{KernelArg, Launch, LaunchConfig};

                /// The module's kernels.
                pub const NAMES: &[&str] = &[$($(stringify!($kernel)),+),*];

                /// Each family's kernels and their parameter types as the PTX spells them.
                #[cfg(test)]
                pub(crate) const PARAMS: &[(&[&str], &[&str])] = &[$(
                    kernel_params!([$($kernel),+] ($($params)*)),
                )*];

                $(
                    kernel_family!(
                        {$(#[doc = $doc])*} [$($kernel),+] [$($alias)?] ($($params)*)
                    );
                )*
            }
        )*
    };
}

/// A family's kernel names and the PTX parameter types of its parameter list (for the tests).
#[cfg_attr(not(test), allow(unused_macros))]
macro_rules! kernel_params {
    ([$($kernel:ident),+] ($($arg:ident: $ty:ty),* $(,)?)) => {
        (&[$(stringify!($kernel)),+], &[$(<$ty as KernelArg>::PTX_TYPE),*])
    };
}

/// The launchers of kernels that share one parameter list, and their type's alias if named.
macro_rules! kernel_family {
    ($docs:tt [$($kernel:ident),+] [$($alias:ident)?] $params:tt) => {
        $( kernel_launcher!($docs $kernel $params); )+
        $( kernel_alias!($alias $params); )?
    };
}

macro_rules! kernel_launcher {
    ({$(#[doc = $doc:literal])*} $kernel:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[doc = $doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $kernel(gpu: &dyn Launch, cfg: LaunchConfig, $($arg: $ty),*) -> CudaResult<()> {
            gpu.launch_bits(stringify!($kernel), cfg, &mut [$(KernelArg::to_bits($arg)),*])
        }
    };
}

macro_rules! kernel_alias {
    ($alias:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        /// The launcher type these kernels share.
        pub type $alias = fn(&dyn Launch, LaunchConfig, $($ty),*) -> CudaResult<()>;
    };
}

kernel_table! {
    /// `kernels/elementwise.cu`.
    elementwise (max_dynamic_shared: 0) {
        /// One CTA per id.
        embed_rows(ids: u64, table: u64, out: u64, d: i32);
        /// One CTA per id; `out` is F32.
        embed_rows_f32(ids: u64, table: u64, out: u64, d: i32);
        /// One CTA per row; `h` is F32; `delta` 0 skips the add.
        add_rmsnorm(h: u64, delta: u64, weight: u64, out: u64, d: i32, eps: f32);
        silu_mul(gu: u64, out: u64, width: i32, rows_per_group: i32, group_stride: i32);
        moe_combine(
            y: u64,
            slot_pos: u64,
            w: u64,
            shared: u64,
            shared_rows: u64,
            out: u64,
            k: i32,
            d: i32,
        );
        /// Must use `add_rmsnorm`'s launch shape to give its bits.
        moe_combine_add_rmsnorm(
            y: u64,
            slot_pos: u64,
            w: u64,
            shared: u64,
            shared_rows: u64,
            h: u64,
            weight: u64,
            out: u64,
            k: i32,
            d: i32,
            eps: f32,
        );
        bf16_to_f32(x: u64, y: u64, n: i64);
        top1_partial(logits: u64, scratch: u64, vocab: i32);
        top1_finish(scratch: u64, token: u64, confidence: u64, slices: i32);
        topk_rows(logits: u64, ids: u64, values: u64, vocab: i32, k: i32);
        fill_random_bf16(x: u64, n: i64, seed: u64, scale: f32);
    }
    /// `kernels/rope.cu`.
    rope (max_dynamic_shared: 0) {
        /// Every row's BF16 cosines and sines, once per forward.
        rope_cos_sin(tok_pos: u64, cos_sin: u64, tokens: i32, rot: i32, theta: f32);
        /// Head dim <= 256, and <= 128 (fewer registers, more CTAs per SM; the same bits).
        qk_norm_rope,
        qk_norm_rope_d128 as QkNormRope (
            qkv: u64,
            q_weight: u64,
            k_weight: u64,
            q_out: u64,
            k_cache: u64,
            v_cache: u64,
            cos_sin: u64,
            tok_slot: u64,
            n_heads: i32,
            n_kv_heads: i32,
            d: i32,
            rot: i32,
            eps: f32,
        );
    }
    /// `kernels/attention.cu`.
    attention (max_dynamic_shared: 200 * 1024) {
        /// The general WMMA kernels and the register-resident tensor-core ones (`fa`), one per
        /// head dim.
        attention_d16,
        attention_d32,
        attention_d64,
        attention_d128,
        attention_d256,
        attention_fa_d64,
        attention_fa_d128 as Attention (
            q: u64,
            k_cache: u64,
            v_cache: u64,
            part_o: u64,
            part_ml: u64,
            segs: u64,
            tiles: u64,
            tables: u64,
            tokens: i32,
            n_heads: i32,
            n_kv: i32,
            block: i32,
            scale: f32,
            chunk_tiles: i32,
        );
        /// The tensor-core kernels walking all of a tile's fixed key chunks in one CTA and
        /// writing the output (no partials, no combine).
        attention_fa_seq_d64,
        attention_fa_seq_d128 as AttentionOneCta (
            q: u64,
            k_cache: u64,
            v_cache: u64,
            out: u64,
            segs: u64,
            tiles: u64,
            tables: u64,
            tokens: i32,
            n_heads: i32,
            n_kv: i32,
            block: i32,
            scale: f32,
            chunk_tiles: i32,
        );
        attention_combine(
            part_o: u64,
            part_ml: u64,
            out: u64,
            tokens: i32,
            n_heads: i32,
            d: i32,
            splits: i32,
        );
    }
    /// `kernels/attention_wgmma.cu` (Hopper sm_90a only: elsewhere a trap).
    attention_wgmma (max_dynamic_shared: 200 * 1024) {
        /// `attention_fa_seq_d128`'s bits on wgmma, one CTA per tile of 128 query rows.
        attention_wgmma_seq_d128(
            q: u64,
            k_cache: u64,
            v_cache: u64,
            out: u64,
            segs: u64,
            tiles: u64,
            tables: u64,
            tokens: i32,
            n_heads: i32,
            n_kv: i32,
            block: i32,
            scale: f32,
            chunk_tiles: i32,
        );
    }
    /// `kernels/router.cu`.
    router (max_dynamic_shared: ROUTER_MODULE_SHARED) {
        route_topk(
            logits: u64,
            bias: u64,
            experts: i32,
            k: i32,
            n_group: i32,
            topk_group: i32,
            scale: f32,
            topk_idx: u64,
            topk_w: u64,
        );
        /// With null pool addresses it skips the pool outputs.
        route_block(
            logits: u64,
            bias: u64,
            blocks: u64,
            tokens: i32,
            experts: i32,
            block: i32,
            capacity: i32,
            k: i32,
            scale: f32,
            tokens_per_cta: i32,
            topk_idx: u64,
            topk_w: u64,
            pool_gate_up: u64,
            pool_gate_up_stride: i64,
            pool_down: u64,
            pool_down_stride: i64,
            pool_gate_up_ptrs: u64,
            pool_down_ptrs: u64,
            pool_slot_pos: u64,
            pool_row_stride: i32,
        );
        /// `route_block`, then (the launch's last CTA) `moe_dispatch` over its choices;
        /// `arrivals` is a counter that is 0 between launches.
        route_block_dispatch(
            logits: u64,
            bias: u64,
            blocks: u64,
            tokens: i32,
            experts: i32,
            block: i32,
            capacity: i32,
            k: i32,
            scale: f32,
            tokens_per_cta: i32,
            topk_idx: u64,
            topk_w: u64,
            pool_gate_up: u64,
            pool_gate_up_stride: i64,
            pool_down: u64,
            pool_down_stride: i64,
            pool_gate_up_ptrs: u64,
            pool_down_ptrs: u64,
            pool_slot_pos: u64,
            pool_row_stride: i32,
            slots: i32,
            tile_rows: i32,
            shared_expert: i32,
            slot_pos: u64,
            row_token: u64,
            tiles: u64,
            num_tiles: u64,
            arrivals: u64,
        );
        moe_dispatch(
            topk_idx: u64,
            assignments: i32,
            k: i32,
            experts: i32,
            tile_rows: i32,
            shared_expert: i32,
            slot_pos: u64,
            row_token: u64,
            tiles: u64,
            num_tiles: u64,
        );
        moe_dispatch_count(topk_idx: u64, assignments: i32, experts: i32, hist: u64);
        moe_dispatch_plan(
            hist: u64,
            ctas: i32,
            tokens: i32,
            experts: i32,
            tile_rows: i32,
            shared_expert: i32,
            tiles: u64,
            num_tiles: u64,
        );
        moe_dispatch_scatter(
            topk_idx: u64,
            assignments: i32,
            k: i32,
            experts: i32,
            shared_expert: i32,
            hist: u64,
            slot_pos: u64,
            row_token: u64,
        );
        /// F32 or BF16 router weights; the wide kernels share each loaded row among 4 experts
        /// per warp; `mma`: BF16 weights on tensor cores (`_e8`: 8 experts per CTA, not 32;
        /// `_e8s`: the same, its operands staged in `ROUTER_STAGED_SHARED` bytes of shared memory;
        /// `_tiled`: 64 x 64 tiles through shared memory; `_cluster`: those tiles' eight
        /// summation ranges on a cluster of eight CTAs, sm_90 and newer).
        router_logits_mma_bf16w,
        router_logits_mma_bf16w_e8,
        router_logits_mma_bf16w_e8s,
        router_logits_mma_tiled_bf16w,
        router_logits_mma_cluster_bf16w,
        router_logits_f32w,
        router_logits_bf16w,
        router_logits_f32w_r4,
        router_logits_bf16w_r4,
        router_logits_wide_f32w,
        router_logits_wide_bf16w as RouterLogits (
            x: u64,
            w: u64,
            logits: u64,
            t: i32,
            e: i32,
            k: i32,
        );
    }
    /// `kernels/pool_gemm.cu` (Hopper only: the sm_80 build is a trap).
    pool_gemm (max_dynamic_shared: 216 * 1024) {
        pool_gemm_tma(
            x_map: u64,
            x_base: u64,
            w_map: u64,
            w_base: u64,
            x_ptrs: u64,
            w_ptrs: u64,
            y_ptrs: u64,
            tokens: i32,
            n: i32,
            k: i32,
            entries: i32,
            gated: i32,
            weights_ready: i32,
        );
        /// The grouped expert GEMM over the dispatched tiles, weights through TMA; with a
        /// `down_map`, the gate/up GEMM and then the down projection over its output in one
        /// launch (`ready`: the zeroed counters its down items wait on).
        grouped_gemm_tma_r16,
        grouped_gemm_tma_r64 as GroupedTma (
            w_map: u64,
            w_base: u64,
            w_ptr: u64,
            x: u64,
            row_token: u64,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
            gated: i32,
            down_map: u64,
            down_base: u64,
            down_ptr: u64,
            down_y: u64,
            down_n: i32,
            ready: u64,
        );
    }
    /// `kernels/expert_wgmma.cu` (Hopper sm_90a only: elsewhere a trap).
    expert_wgmma (max_dynamic_shared: 200 * 1024) {
        /// The grouped expert GEMM on wgmma over tiles of up to 128 rows.
        grouped_gemm_wgmma(
            w_map: u64,
            w_base: u64,
            w_ptr: u64,
            x: u64,
            row_token: u64,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
            gated: i32,
        );
        /// The same over quantized experts (the parameters of `moe`'s codes kernels, so their
        /// launchers are `moe::CodesGemm`s too); `_ss`: the codes decoded into shared memory.
        grouped_gemm_i8_wgmma,
        grouped_gemm_i4_wgmma,
        grouped_gemm_f4_wgmma,
        grouped_gemm_i4_wgmma_ss,
        grouped_gemm_i8_wgmma_ss,
        grouped_gemm_f8_wgmma_ss,
        grouped_gemm_f8_wgmma (
            x: u64,
            row_token: u64,
            codes: u64,
            scales: u64,
            band_scale: u64,
            group: i32,
            shared: u64,
            shared_slot: i32,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
            gated: i32,
        );
    }
    /// `kernels/moe.cu`.
    moe (max_dynamic_shared: 112 * 1024) {
        /// BF16 experts over the dispatched tiles.
        grouped_gemm_m16,
        grouped_gemm_m16s3,
        grouped_gemm_m64,
        grouped_gemm_any as GroupedGemm (
            x: u64,
            row_token: u64,
            w: u64,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
        );
        /// Experts stored as INT8/INT4 `*_mma` codes with FP16 group scales, as E2M1 codes
        /// (NVFP4 repacked at load) with BF16 block scales and a factor per 8-row band, or as
        /// E4M3 codes (our FP8, repacked at load) with F32 block scales. `flags`: bit 0 gated,
        /// bit 1 (the tiled kernels only) a settled tile list (`ops::launch_codes`).
        grouped_gemm_i8_r16,
        grouped_gemm_i8_r32,
        grouped_gemm_i8_r64,
        grouped_gemm_i4_r16,
        grouped_gemm_i4_r32,
        grouped_gemm_i4_r64,
        grouped_gemm_f4_r16,
        grouped_gemm_f4_r32,
        grouped_gemm_f4_r64,
        grouped_gemm_f8_r16,
        grouped_gemm_f8_r32,
        grouped_gemm_f8_r64,
        grouped_gemm_i8_any,
        grouped_gemm_i4_any as CodesGemm (
            x: u64,
            row_token: u64,
            codes: u64,
            scales: u64,
            band_scale: u64,
            group: i32,
            shared: u64,
            shared_slot: i32,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
            flags: i32,
        );
        /// E4M3 experts times E4M3 activation rows (W8A8; the sm_90 PTX only: the sm_80 build
        /// traps).
        grouped_gemm_f8f8_r16,
        grouped_gemm_f8f8_r64 as W8a8Gemm (
            x: u64,
            q: u64,
            s: u64,
            row_token: u64,
            codes: u64,
            scales: u64,
            group: i32,
            shared: u64,
            shared_slot: i32,
            y: u64,
            tiles: u64,
            num_tiles: u64,
            n: i32,
            k: i32,
        );
        /// BF16 rows to E4M3 codes and an F32 scale per group of columns.
        quantize_rows_e4m3(x: u64, rows: i32, k: i32, group: i32, q: u64, s: u64);
        /// 4-bit codes from the files' `*_mma` order to the kernels' word order, in place.
        codes4_word_order(codes: u64, chunks: i64);
        /// The batch-invariant dense GEMM over one weight matrix.
        dense_gemm_m16,
        dense_gemm_m64,
        dense_gemm_m128,
        dense_gemm_any as DenseGemm (x: u64, w: u64, y: u64, m: i32, n: i32, k: i32);
    }
    /// `kernels/sample.cu`.
    sample (max_dynamic_shared: 0) {
        /// One CTA per draw.
        draw_rows(
            logits: u64,
            best_ids: u64,
            best_values: u64,
            best_k: i32,
            top_token: u64,
            top_conf: u64,
            params: u64,
            out: u64,
            vocab: i32,
        );
    }
}
