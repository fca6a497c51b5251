// The experts of a 2.2 denoising step over the block's admitted pool, streamed with the Hopper
// Tensor Memory Accelerator (docs/performance.md, attempt 20):
//   Y_q[t, n] = sum_k X_q[t, k] * W_q[n, k]     for pool entries q < B, tokens t < T <= 32
// with X_q, W_q, Y_q given as device address arrays (written by route_block on the device, so the
// step stays one CUDA graph), BF16 in and out, F32 accumulation on tensor cores.
//
// Why not cuBLAS's batched GEMM: at 32 tokens the whole cost is streaming the weights (205 MB for
// gate/up of 49 entries), and cuBLAS reached 3.3-3.5 TB/s of the 4.2 TB/s the GPU reads at. A
// cp.async version (attempt 18) was slower: per-thread 16-byte copies from one or two CTAs per SM
// cannot keep enough bytes in flight. Plain `cp.async.bulk` row copies cost a fixed ~60 cycles
// each (1.1 TB/s with 256-byte rows, measured); one TMA box of 128 rows x 64 columns per copy
// streamed at 4.0 TB/s with one CTA per SM in the same micro-benchmark.
//
// Shape: one persistent CTA per SM walks tiles of 128 weight rows (entry q, rows n0..n0+127) over
// the whole K in 128-deep stages, the pipeline running straight across tiles. 8 consumer warps
// own 16 weight rows each and compute their 16 x 32 block with mma.sync (m16n8k16; the weight
// rows are the M side, the tokens the N side); one thread of warp 8 issues the copies. The tensor
// maps (2D views [rows, K] of the packed weights and of the activations, 128-byte swizzle) sit in
// global memory; an entry's first row is (address - map base) / (2K). Requires N % 128 == 0,
// K % 128 == 0, T <= 32.
//
// `gated` (the gate/up projection, W_q = [gate; up] with N = 2I rows): a tile takes 64 gate rows
// and the 64 up rows of the same intermediate columns, and the epilogue writes
//   Y_q[t, c] = BF16( BF16(silu(BF16 gate)) * BF16 up )      (row pitch I)
// exactly as silu_mul does on the BF16 gate/up outputs, so the SiLU launch and the round trip of
// the gate/up rows through memory go away.
#include "common.cuh"

namespace minnow_pool {
constexpr int ROWS = 128;    // weight rows per tile
constexpr int BK = 128;      // K per stage: two 64-column (128-byte) boxes
constexpr int BOX_K = 64;
constexpr int HALVES = BK / BOX_K;  // 64-column boxes per operand and stage
static_assert(BK % BOX_K == 0, "a stage is whole boxes");
constexpr int TOKENS = 32;   // most tokens (the mma N side: 4 blocks of 8)
constexpr int STAGES = 5;  // 4 measured 0.06 ms slower per refinement step: bytes in flight matter
constexpr int CONSUMERS = ROWS / 16;           // 8 warps
constexpr int THREADS = (CONSUMERS + 1) * 32;  // + the producer warp
constexpr int W_BOX_ROWS = 64;                 // a weight box: 64 rows x 64 columns (8 KB)
constexpr int W_BOX = W_BOX_ROWS * BOX_K * 2;
constexpr int W_HALF = ROWS * BOX_K * 2;       // the tile's 128 rows of one 64-column half: 16 KB
static_assert(W_HALF == 2 * W_BOX, "a tile's half is two weight boxes");
constexpr int X_BOX = TOKENS * BOX_K * 2;      // 4 KB
constexpr int STAGE_BYTES = HALVES * (W_HALF + X_BOX);
constexpr int UP_BYTES = TOKENS * 64 * 4;      // gated epilogue: the up half of a tile in F32
// + 1 KB to align the stages to the 1,024-byte swizzle atom, the up exchange, the barriers
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + UP_BYTES + 2 * STAGES * 8;
static_assert(SMEM_BYTES == 5 * 40960 + 1024 + 8192 + 80, "host mirror: pool_gemm_smem_bytes in ops.rs");
}  // namespace minnow_pool

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace minnow_pool {
using namespace minnow_tma;  // mbarriers, TMA boxes, the 128-byte swizzle (common.cuh)
}  // namespace minnow_pool
#endif

// grid = min(tiles, SMs) with tiles = B * N / 128, block = minnow_pool::THREADS (288), dynamic
// shared memory = minnow_pool::SMEM_BYTES (mirrored by pool_gemm_smem_bytes in ops.rs).
// x_map / w_map: 2D BF16 tensor maps [rows, K] (boxes of 32 / 64 rows x 64 columns, 128-byte
// swizzle) whose first element is at x_base / w_base; x_ptrs[q] / w_ptrs[q] lie inside them.
// Y_q has row pitch N, or N / 2 when `gated`. `weights_ready`: w_ptrs was written before the
// kernel preceding this one started, so the producer may read it and stream the first stages'
// weights before waiting for that kernel (an exception to the rule of common.cuh that the caller
// vouches for: the down projection after route_block -> gate/up).
extern "C" __global__ void __launch_bounds__(minnow_pool::THREADS, 1)
    pool_gemm_tma(const void* __restrict__ x_map, unsigned long long x_base, const void* __restrict__ w_map,
                  unsigned long long w_base, const unsigned long long* __restrict__ x_ptrs,
                  const unsigned long long* __restrict__ w_ptrs, const unsigned long long* __restrict__ y_ptrs, int T,
                  int N, int K, int B, int gated, int weights_ready) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace minnow_pool;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages = (raw + 1023) & ~1023u;
    float* up = reinterpret_cast<float*>(smem_raw + (stages - raw) + STAGES * STAGE_BYTES);  // [64][TOKENS]
    const unsigned full0 = stages + STAGES * STAGE_BYTES + UP_BYTES, empty0 = full0 + 8 * STAGES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    init_stage_barriers(full0, empty0, STAGES, 1, CONSUMERS);  // full: the expect_tx; empty: each consumer warp
    const int tiles_per_entry = N / ROWS, tiles = B * tiles_per_entry, k_steps = K / BK;
    const unsigned long long row_bytes = 2ull * K;

    if (warp == CONSUMERS) {  // producer: one thread issues every copy
        if (lane != 0) return;
        tensormap_acquire(w_map);
        tensormap_acquire(x_map);
        // A tile's two 64-row weight boxes (consecutive rows, or the gate and up rows of the same
        // intermediate columns) and its first token row. x_ptrs is never written by a kernel.
        int row_a = 0, row_b = 0, x_row = 0;
        auto locate = [&](int tile, unsigned long long w_addr) {
            const int q = tile / tiles_per_entry, n0 = (tile % tiles_per_entry) * ROWS;
            const int w_row = (int)((w_addr - w_base) / row_bytes);
            row_a = w_row + (gated ? n0 / 2 : n0);
            row_b = gated ? w_row + N / 2 + n0 / 2 : row_a + W_BOX_ROWS;
            x_row = (int)((x_ptrs[q] - x_base) / row_bytes);
        };
        auto load_weights = [&](int ks, unsigned bar, unsigned dst) {
#pragma unroll
            for (int h = 0; h < HALVES; ++h) {
                tma_load_2d(dst + h * W_HALF, w_map, ks * BK + h * BOX_K, row_a, bar);
                tma_load_2d(dst + h * W_HALF + W_BOX, w_map, ks * BK + h * BOX_K, row_b, bar);
            }
        };
        const int first = blockIdx.x;
        // With `weights_ready` the weight addresses were final before the previous kernel started
        // (written two launches back), so the first stages' weights stream while it finishes.
        int pre = 0;
        if (weights_ready && first < tiles) {
            locate(first, w_ptrs[first / tiles_per_entry]);
            pre = min(STAGES, k_steps);
            for (int ks = 0; ks < pre; ++ks) {
                mbar_expect_tx(full0 + 8 * ks, STAGE_BYTES);
                load_weights(ks, full0 + 8 * ks, stages + ks * STAGE_BYTES);
            }
            pdl_enter();
        } else {
            pdl_enter();  // the address arrays and X come from the kernels before
            if (first < tiles) locate(first, w_ptrs[first / tiles_per_entry]);
        }
        int it = 0;
        for (int tile = first; tile < tiles; tile += gridDim.x) {
            // The next tile's weight address, loaded now and used after this tile's stages.
            const int next = tile + gridDim.x;
            const unsigned long long w_next = next < tiles ? w_ptrs[next / tiles_per_entry] : 0;
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % STAGES;
                const unsigned bar = full0 + 8 * s, dst = stages + s * STAGE_BYTES;
                if (it >= pre) {
                    mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                    mbar_expect_tx(bar, STAGE_BYTES);
                    load_weights(ks, bar, dst);
                }
#pragma unroll
                for (int h = 0; h < HALVES; ++h)
                    tma_load_2d(dst + HALVES * W_HALF + h * X_BOX, x_map, ks * BK + h * BOX_K, x_row, bar);
            }
            if (next < tiles) locate(next, w_next);
        }
        return;
    }
    pdl_enter();  // consumers write Y

    // Consumers: warp w owns weight rows 16w..16w+15 of each tile. ldmatrix rows: the A fragment
    // (16 weight rows x 16 k) and the B fragments of 16 tokens x 16 k.
    const int g = lane >> 2, t4 = lane & 3;
    const int a_row = warp * 16 + (lane & 15), a_half = lane >> 4;
    const int b_row = ((lane >> 4) << 3) + (lane & 7), b_half = (lane >> 3) & 1;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int q = tile / tiles_per_entry, n0 = (tile % tiles_per_entry) * ROWS;
        float acc[TOKENS / 8][4];
#pragma unroll
        for (int nb = 0; nb < TOKENS / 8; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
            const int s = it % STAGES;
            mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
            const unsigned base = stages + s * STAGE_BYTES;
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const int box = kk >> 2, chunk = (kk & 3) << 1;
                unsigned a[4];
                ldmatrix_x4(a, base + box * W_HALF + swizzled(a_row, chunk | a_half));
#pragma unroll
                for (int nb2 = 0; nb2 < TOKENS / 16; ++nb2) {
                    unsigned b[4];
                    ldmatrix_x4(b, base + HALVES * W_HALF + box * X_BOX + swizzled(nb2 * 16 + b_row, chunk | b_half));
                    mma16816(acc[2 * nb2], a, b[0], b[1]);
                    mma16816(acc[2 * nb2 + 1], a, b[2], b[3]);
                }
            }
            fence_async_proxy_shared();  // as in grouped_tma, below
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * s);
        }
        // acc[nb][0..1]: row g, tokens nb*8 + 2*t4 (+1); acc[nb][2..3]: row g + 8.
        if (!gated) {
            bf16* y = reinterpret_cast<bf16*>(y_ptrs[q]) + n0 + warp * 16 + g;
#pragma unroll
            for (int nb = 0; nb < TOKENS / 8; ++nb) {
                const int t0 = nb * 8 + 2 * t4;
                if (t0 < T) {
                    y[(size_t)t0 * N] = to_bf16(acc[nb][0]);
                    y[(size_t)t0 * N + 8] = to_bf16(acc[nb][2]);
                }
                if (t0 + 1 < T) {
                    y[(size_t)(t0 + 1) * N] = to_bf16(acc[nb][1]);
                    y[(size_t)(t0 + 1) * N + 8] = to_bf16(acc[nb][3]);
                }
            }
            continue;
        }
        // Gated: warps 4-7 (up rows) hand their BF16-rounded values to warps 0-3 (the gate rows
        // of the same columns) through shared memory; named barrier 1 spans the 8 consumers.
        const int col = (warp & 3) * 16 + g;  // intermediate column within the tile's 64
        if (warp >= 4) {
#pragma unroll
            for (int nb = 0; nb < TOKENS / 8; ++nb) {
                const int t0 = nb * 8 + 2 * t4;
                up[col * TOKENS + t0] = to_f32(to_bf16(acc[nb][0]));
                up[col * TOKENS + t0 + 1] = to_f32(to_bf16(acc[nb][1]));
                up[(col + 8) * TOKENS + t0] = to_f32(to_bf16(acc[nb][2]));
                up[(col + 8) * TOKENS + t0 + 1] = to_f32(to_bf16(acc[nb][3]));
            }
        }
        named_barrier_sync(1, CONSUMERS * 32);
        if (warp < 4) {
            const int I = N / 2;
            bf16* y = reinterpret_cast<bf16*>(y_ptrs[q]) + n0 / 2 + col;
            auto gate_up = [&](float gate, int c, int t) {
                return silu_mul_bf16(to_f32(to_bf16(gate)), up[c * TOKENS + t]);
            };
#pragma unroll
            for (int nb = 0; nb < TOKENS / 8; ++nb) {
                const int t0 = nb * 8 + 2 * t4;
                if (t0 < T) {
                    y[(size_t)t0 * I] = gate_up(acc[nb][0], col, t0);
                    y[(size_t)t0 * I + 8] = gate_up(acc[nb][2], col + 8, t0);
                }
                if (t0 + 1 < T) {
                    y[(size_t)(t0 + 1) * I] = gate_up(acc[nb][1], col, t0 + 1);
                    y[(size_t)(t0 + 1) * I + 8] = gate_up(acc[nb][3], col + 8, t0 + 1);
                }
            }
        }
        named_barrier_sync(1, CONSUMERS * 32);  // `up` is free for the next tile
    }
#else
    __trap();  // launched only where the sm_90 build is loaded (ops::pool_gemm_supported)
#endif
}

// The grouped expert GEMM on the same pipeline: every dispatched tile (expert e, rows p0..p1 of at
// most TOKENS) times every 128-row slice of expert e's weights,
//   Y[p, n] = sum_k X[src(p), k] * W[e, n, k]      (src(p) = row_token[p], or p when null)
// for batched denoising steps and prefill alike. The weights stream through TMA as in
// pool_gemm_tma; the activation rows are gathered by the producer warp's 32 lanes with cp.async
// (a TMA box needs contiguous rows) into the same 128-byte-swizzled layout, and each lane's copies
// arrive on the stage's barrier when they land (cp.async.mbarrier.arrive.noinc), so the consumers
// wait on one barrier for both operands. The tile list and its length come from moe_dispatch on
// the device: no host round trip, one persistent CTA per multiprocessor walking (tile, slice)
// items with the pipeline running straight across them.
//
// The arithmetic is the grouped kernels' (moe.cu gemm_tile): the tokens are the M side of
// m16n8k16 tensor-core products, the weights the N side, and every output is one F32 accumulator
// over K in ascending 16-column steps. So an output's bits do not depend on TOKENS, on the tile
// it falls in or on the rest of the batch, and equal those of grouped_gemm_m16/m64.
//
// `gated` (gate/up, W[e] = [gate; up] with N = 2I rows): a slice takes 64 gate rows and the 64 up
// rows of the same intermediate columns, and the epilogue writes silu_mul's result (row pitch I),
// as pool_gemm_tma does.
//
// The pair (a down projection given with the gated GEMM): one launch walks every gate/up item,
// then every down item over the gate/up output. Why: a denoising step's ~50 tiles make 400
// gate/up and 800 down items for 132 CTAs, so each kernel alone ends with a partial round that
// leaves most multiprocessors idle; one walk has one such round and one kernel start. Items are
// taken in index order by every CTA and each gate/up item precedes every down item, so a down
// item's wait (for the gate/up slices of its own tile) only ever waits on work that no waiting
// CTA holds up. Each item computes as in two launches: the same bits.
namespace minnow_grouped {
using minnow_pool::BK;
using minnow_pool::BOX_K;
using minnow_pool::CONSUMERS;
using minnow_pool::HALVES;
using minnow_pool::ROWS;
using minnow_pool::W_BOX;
using minnow_pool::W_BOX_ROWS;
using minnow_pool::W_HALF;
constexpr int THREADS = minnow_pool::THREADS;
constexpr int UP_LD = 72;  // f32 row pitch of the gated epilogue's up values
template <int TOKENS>
struct Shape {
    static_assert(TOKENS % 16 == 0 && TOKENS <= 64, "16-row MMA fragments, at most 64 rows");
    static constexpr int STAGES = TOKENS > 32 ? 4 : 5;
    static constexpr int X_HALF = TOKENS * BOX_K * 2;  // one 64-column half of the rows: 128 B a row
    static constexpr int STAGE_BYTES = HALVES * (W_HALF + X_HALF);
    static constexpr int UP_BYTES = TOKENS * UP_LD * 4;
    static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + UP_BYTES + 2 * STAGES * 8;
    // The producer lanes' copies of a stage: TOKENS rows x 16 chunks of 16 bytes, TOKENS / 2 per lane.
    static constexpr int COPIES = TOKENS / 2;
    static constexpr int LANE_ROWS = COPIES >= 16 ? COPIES / 16 : 1;
};
static_assert(Shape<16>::SMEM_BYTES == 5 * 36864 + 1024 + 4608 + 80, "host mirror: grouped_tma_smem_bytes");
static_assert(Shape<64>::SMEM_BYTES == 4 * 49152 + 1024 + 18432 + 64, "host mirror: grouped_tma_smem_bytes");
}  // namespace minnow_grouped

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace minnow_grouped {

// One expert GEMM of a launch: the weights' tensor map and their first row in it, the input rows
// (gathered through row_token, or in place when null), the output and its shape.
struct ExpertGemm {
    const void* w_map;
    int w_row0;
    const bf16* X;
    const int* row_token;
    bf16* Y;
    int N, K, gated;
};

// A (tile, 128-row weight slice) item of one of the launch's GEMMs.
struct Item {
    int gemm, tile, n0;
};

// The pair's counters: ready[tile] counts the tile's published gate/up slices, passed[tile] (at
// ready + the launch's tile count) the down items that saw them all; the last of those zeroes
// both, so every launch finds them zero (the workspace allocates them zeroed). A down item reads
// ready[tile] with acquire semantics: its rows were written before the matching release.
__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The launch's GEMMs come by value and each item picks its own with a select per field, so they
// stay in registers (an array indexed by the item's GEMM would live in local memory).
template <int TOKENS>
__device__ void grouped_tma(const ExpertGemm g0, const ExpertGemm g1, int fused, const int4* __restrict__ tiles,
                            const int* __restrict__ num_tiles, int* __restrict__ ready) {
    using namespace minnow_pool;
    using S = Shape<TOKENS>;
    constexpr int STAGES = S::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages = (raw + 1023) & ~1023u;
    float* up = reinterpret_cast<float*>(smem_raw + (stages - raw) + STAGES * S::STAGE_BYTES);  // [TOKENS][UP_LD]
    const unsigned full0 = stages + STAGES * S::STAGE_BYTES + S::UP_BYTES, empty0 = full0 + 8 * STAGES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // Full: the TMA's expect_tx + each producer lane's copies; empty: each consumer warp.
    init_stage_barriers(full0, empty0, STAGES, 1 + 32, CONSUMERS);
    pdl_enter();  // the tile list and X come from the kernels before
    const int n_tiles = num_tiles[0];
    const int slices0 = g0.N / ROWS, slices1 = fused ? g1.N / ROWS : 0;
    const int items0 = n_tiles * slices0, items = items0 + n_tiles * slices1;
    // Items of GEMM 0 first, tile by tile; then, when fused, those of GEMM 1 (the down projection
    // over GEMM 0's gated output).
    auto item_at = [&](int item) {
        return item < items0 ? Item{0, item / slices0, (item % slices0) * ROWS}
                             : Item{1, (item - items0) / slices1, ((item - items0) % slices1) * ROWS};
    };
    int* passed = ready + (fused ? n_tiles : 0);

    if (warp == CONSUMERS) {  // producer: lane 0 the weights, every lane its share of the rows
        if (lane == 0) {
            tensormap_acquire(g0.w_map);
            if (fused) tensormap_acquire(g1.w_map);
        }
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const Item m = item_at(item);
            const ExpertGemm G = m.gemm ? g1 : g0;
            const int4 t = tiles[m.tile];
            const int rows = t.z - t.y, k_steps = G.K / BK;
            const int row_a = G.w_row0 + t.x * G.N + (G.gated ? m.n0 / 2 : m.n0);
            const int row_b = G.gated ? G.w_row0 + t.x * G.N + G.N / 2 + m.n0 / 2 : row_a + W_BOX_ROWS;
            // This lane's rows: copies c = lane * COPIES + j, row c / 16, chunk c % 16.
            const bf16* src[S::LANE_ROWS];
            bool ok[S::LANE_ROWS];
#pragma unroll
            for (int i = 0; i < S::LANE_ROWS; ++i) {
                const int r = lane * S::COPIES / 16 + i;
                ok[i] = r < rows;
                const int p = t.y + (ok[i] ? r : 0);
                src[i] = G.X + (size_t)(G.row_token ? G.row_token[p] : p) * G.K;
            }
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % STAGES;
                const unsigned bar = full0 + 8 * s, dst = stages + s * S::STAGE_BYTES;
                mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                if (lane == 0) {
                    mbar_expect_tx(bar, HALVES * W_HALF);
#pragma unroll
                    for (int h = 0; h < HALVES; ++h) {
                        tma_load_2d(dst + h * W_HALF, G.w_map, ks * BK + h * BOX_K, row_a, bar);
                        tma_load_2d(dst + h * W_HALF + W_BOX, G.w_map, ks * BK + h * BOX_K, row_b, bar);
                    }
                }
                if (m.gemm == 1 && ks == 0) {
                    // The down item's rows are its tile's gate/up outputs: wait until every gate/up
                    // slice of the tile has published them (its weights are already on the way).
                    while (load_acquire(ready + m.tile) < slices0) __nanosleep(64);
                    __syncwarp();
                    if (lane == 0 && atomicAdd(passed + m.tile, 1) == slices1 - 1) {
                        ready[m.tile] = 0;
                        passed[m.tile] = 0;
                    }
                }
#pragma unroll
                for (int j = 0; j < S::COPIES; ++j) {
                    const int c = lane * S::COPIES + j, r = c / 16, chunk = c % 16;
                    const int i = r - lane * S::COPIES / 16;
                    const int h = chunk / 8;
                    const unsigned to = dst + HALVES * W_HALF + h * S::X_HALF + swizzled(r, chunk % 8);
                    const bf16* from = src[i] + ks * BK + chunk * 8;
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                                 "r"(ok[i] ? 16 : 0)
                                 : "memory");
                }
                cp_async_arrive_noinc(bar);
            }
        }
        // A thread must not exit with copies in flight: the last stages' rows would land (and
        // arrive) after it is gone.
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // Consumers: warp w owns weight rows 16w..16w+15 of each slice (16 output columns, two n8
    // fragments) for all TOKENS rows. ldmatrix rows: the A fragments (16 rows x 16 k of the
    // activations) and the B fragments (16 weight rows x 16 k: two n8 x k16 fragments).
    const int g = lane >> 2, t4 = lane & 3;
    const int b_row = warp * 16 + ((lane >> 4) << 3) + (lane & 7), b_half = (lane >> 3) & 1;
    const int a_row = lane & 15, a_half = lane >> 4;
    int it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const Item m = item_at(item);
        const ExpertGemm G = m.gemm ? g1 : g0;
        const int4 t = tiles[m.tile];
        const int n0 = m.n0, rows = t.z - t.y, p0 = t.y, k_steps = G.K / BK;
        float acc[TOKENS / 16][2][4];
#pragma unroll
        for (int mm = 0; mm < TOKENS / 16; ++mm)
#pragma unroll
            for (int j = 0; j < 2; ++j) acc[mm][j][0] = acc[mm][j][1] = acc[mm][j][2] = acc[mm][j][3] = 0.f;
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
            const int s = it % STAGES;
            mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
            const unsigned base = stages + s * S::STAGE_BYTES, xbase = base + HALVES * W_HALF;
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const int box = kk >> 2, chunk = (kk & 3) << 1;
                unsigned b[4];
                ldmatrix_x4(b, base + box * W_HALF + swizzled(b_row, chunk | b_half));
#pragma unroll
                for (int mm = 0; mm < TOKENS / 16; ++mm) {
                    unsigned a[4];
                    ldmatrix_x4(a, xbase + box * S::X_HALF + swizzled(mm * 16 + a_row, chunk | a_half));
                    mma16816(acc[mm][0], a, b[0], b[1]);
                    mma16816(acc[mm][1], a, b[2], b[3]);
                }
            }
            // The stage's next fill is written by the copy engine (the async proxy), and these
            // reads were ldmatrix (the generic proxy): without this fence the fill can overwrite
            // a slow warp's rows before its reads are done (seen: warp 0's columns wrong in about
            // one launch of three of a 2,048-token gate/up).
            fence_async_proxy_shared();
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * s);
        }
        // acc[m][j][0..1]: row m*16 + g, columns 16w + 8j + 2 t4 (+1); [2..3]: row + 8.
        if (!G.gated) {
#pragma unroll
            for (int mm = 0; mm < TOKENS / 16; ++mm)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = mm * 16 + g + 8 * h, col = n0 + warp * 16 + j * 8 + 2 * t4;
                        if (row < rows)
                            *reinterpret_cast<__nv_bfloat162*>(G.Y + (size_t)(p0 + row) * G.N + col) =
                                __floats2bfloat162_rn(acc[mm][j][2 * h], acc[mm][j][2 * h + 1]);
                    }
            continue;
        }
        // Gated: warps 4-7 (up rows) hand their BF16-rounded values to warps 0-3 (the gate rows of
        // the same intermediate columns) through shared memory; named barrier 1 spans the consumers.
        if (warp >= 4) {
#pragma unroll
            for (int mm = 0; mm < TOKENS / 16; ++mm)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = mm * 16 + g + 8 * h, c = (warp - 4) * 16 + j * 8 + 2 * t4;
                        up[row * UP_LD + c] = to_f32(to_bf16(acc[mm][j][2 * h]));
                        up[row * UP_LD + c + 1] = to_f32(to_bf16(acc[mm][j][2 * h + 1]));
                    }
        }
        named_barrier_sync(1, CONSUMERS * 32);
        if (warp < 4) {
            const int I = G.N / 2;
#pragma unroll
            for (int mm = 0; mm < TOKENS / 16; ++mm)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = mm * 16 + g + 8 * h, c = warp * 16 + j * 8 + 2 * t4;
                        if (row < rows) {
                            __nv_bfloat162 v;
                            v.x = silu_mul_bf16(to_f32(to_bf16(acc[mm][j][2 * h])), up[row * UP_LD + c]);
                            v.y = silu_mul_bf16(to_f32(to_bf16(acc[mm][j][2 * h + 1])), up[row * UP_LD + c + 1]);
                            *reinterpret_cast<__nv_bfloat162*>(G.Y + (size_t)(p0 + row) * I + n0 / 2 + c) = v;
                        }
                    }
            // Fused: this thread's outputs are visible device-wide before the slice is counted.
            if (fused) __threadfence();
        }
        named_barrier_sync(1, CONSUMERS * 32);  // `up` is free for the next item
        if (fused && warp == 0 && lane == 0) {
            __threadfence();
            atomicAdd(ready + m.tile, 1);
        }
    }
}
}  // namespace minnow_grouped
#endif

// grid = min(items, SMs) with items = max_tiles * (N + down_N) / 128, block = 288, dynamic shared
// memory = minnow_grouped::Shape<TOKENS>::SMEM_BYTES (grouped_tma_smem_bytes in ops.rs). w_map:
// the 2D tensor map (boxes of 64 rows x 64 columns, 128-byte swizzle) of a tensor holding the
// experts' weights [E, N, K] at w_ptr. Requires N % 128 == 0, K % 128 == 0 and tiles cut at
// TOKENS rows. With a non-null down_map (gated only): the down weights [E, down_N, N / 2] at
// down_ptr, run over Y into down_Y in the same launch, and `ready` 2 x max_tiles zeroed counters
// (left zeroed); with a null one the down_* and ready arguments are unused.
#define GROUPED_TMA_ENTRY(NAME, TOKENS)                                                                  \
    extern "C" __global__ void __launch_bounds__(minnow_grouped::THREADS, 1)                             \
        NAME(const void* __restrict__ w_map, unsigned long long w_base, unsigned long long w_ptr,        \
             const bf16* __restrict__ X, const int* __restrict__ row_token, bf16* __restrict__ Y,         \
             const int4* __restrict__ tiles, const int* __restrict__ num_tiles, int N, int K, int gated,  \
             const void* __restrict__ down_map, unsigned long long down_base, unsigned long long down_ptr, \
             bf16* __restrict__ down_Y, int down_N, int* __restrict__ ready) {                           \
        GROUPED_TMA_BODY(TOKENS)                                                                         \
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GROUPED_TMA_BODY(TOKENS)                                                                              \
    const int fused = down_map != nullptr;                                                                    \
    const minnow_grouped::ExpertGemm gate_up{w_map, (int)((w_ptr - w_base) / (2ull * K)), X, row_token, Y, N, K, \
                                             gated};                                                          \
    const minnow_grouped::ExpertGemm down{down_map, fused ? (int)((down_ptr - down_base) / (2ull * (N / 2))) : 0, \
                                          Y, nullptr, down_Y, down_N, N / 2, 0};                              \
    minnow_grouped::grouped_tma<TOKENS>(gate_up, down, fused, tiles, num_tiles, ready);
#else
#define GROUPED_TMA_BODY(TOKENS) __trap();  // launched only where the sm_90 build is loaded
#endif
GROUPED_TMA_ENTRY(grouped_gemm_tma_r16, 16)
GROUPED_TMA_ENTRY(grouped_gemm_tma_r64, 64)
