// The grouped expert GEMM on Hopper's warpgroup tensor-core instructions (wgmma), for forwards
// whose experts get many rows each (batched denoising steps, prefill):
//   Y[p, n] = sum_k X[src(p), k] * W[e, n, k]      (src(p) = row_token[p], or p when null)
// over the tiles moe_dispatch cut at 128 rows, with BF16 in and out and F32 accumulation.
//
// Why: the 4-warp mma.sync tiles (moe.cu) hold 64 rows, so an expert with 65-128 rows streamed
// its weights twice, and their issue rate, not the tensor cores, bounded prefill. Here one
// persistent CTA per multiprocessor walks (tile, 128-weight-row slice) items with the pipeline
// running straight across them:
//   - the producer warpgroup streams the slice's weights as two 64-row TMA boxes per 64-deep K
//     stage, and its 128 threads gather the tile's activation rows with cp.async into the same
//     128-byte-swizzled layout (a TMA box needs contiguous rows); each thread's copies arrive on
//     the stage's barrier when they land;
//   - two consumer warpgroups each multiply 64 of the tile's rows by the 128 weight rows with
//     m64n128k16 wgmma straight from shared memory (the tokens the M side, the weights the N
//     side), one group of four in flight while the next stage's are issued.
//
// Batch invariance: every output is one F32 accumulator over K in ascending 16-deep tensor-core
// steps, as in the mma.sync kernels (the same products in the same order), so an output's bits do
// not depend on the tile it falls in, on the rest of the batch, or on which of minnow's grouped
// kernels ran it (checked bit for bit against them by cuda_kernels).
//
// `gated` (gate/up, W[e] = [gate; up] with N = 2I rows): a slice takes 64 gate rows and the 64 up
// rows of the same intermediate columns, so a thread holds the gate and the up value of each of
// its columns, and the epilogue writes silu_mul's result (row pitch I) with no exchange.
//
// wgmma is an sm_90a instruction: this module's Hopper build targets sm_90a and is loaded only on
// compute capability 9.0 (ptx.rs SM90A_MODULES); every other GPU gets the trapping build and runs
// the mma.sync kernels.
//
// Measured and left out (docs/performance.md): 256-row tiles (each warpgroup two 64-row blocks,
// 4 stages) were slower for a 4K prefill (gate/up 10.1 against 9.0 ms), and this kernel over
// the 16-row tiles of a lone request's refinement step slower than the mma.sync ones.
#include "codes.cuh"
#include "wgmma.cuh"

namespace minnow_wgmma {
constexpr int ROWS = 128;      // weight rows per item: two 64-row TMA boxes
constexpr int BOX_ROWS = 64;
constexpr int TOKENS = 128;    // most activation rows per tile: 64 per consumer warpgroup
constexpr int BK = 64;         // K per stage: one 128-byte box width
constexpr int STAGES = 6;
constexpr int W_BOX = BOX_ROWS * BK * 2;  // 8 KB
constexpr int W_BYTES = 2 * W_BOX;
constexpr int X_BYTES = TOKENS * BK * 2;  // 16 KB
constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
constexpr int CONSUMERS = 2;                    // warpgroups
constexpr int THREADS = 128 * (CONSUMERS + 1);  // + the producer warpgroup
// + 1 KB to align the stages to the 1,024-byte swizzle atom, the stage barriers
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
static_assert(SMEM_BYTES == 6 * 32768 + 1024 + 96, "host mirror: grouped_wgmma_smem_bytes in ops");
// A producer thread's 16-byte row copies per stage: chunk tid % 8 of rows tid / 8 + 16 j.
constexpr int COPIES = TOKENS * (BK / 8) / 128;
}  // namespace minnow_wgmma

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace minnow_wgmma {
using namespace minnow_tma;

// A consumer warpgroup with no rows in an item (the tile has at most 64 wg): it only releases
// the item's k_steps stages, outside any product loop (a branch around wgmmas serialises them,
// C7518). All four warps have seen each stage full before thread 0 releases it. Without that,
// thread 0's warp could run stages ahead of its siblings: once a stage is filled again after the
// fill a sibling waits for, before that sibling looks, the barrier shows it its parity as
// pending, so it waits for a later fill (one that may never come), and the warpgroup's next
// wgmma waits for it: the launch hung (docs/performance.md, session thirty-one). In the product
// loop the warpgroup-wide wgmma keeps the warps together instead.
template <int STAGES>
__device__ __forceinline__ void release_without_rows(unsigned full0, unsigned empty0, int& it, int k_steps, int wg,
                                                     int tid) {
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
        const int s = it % STAGES;
        minnow_tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
        named_barrier_sync(1 + wg, 128);
        if (tid == 0) minnow_tma::mbar_arrive(empty0 + 8 * s);
    }
}

// The epilogue of a consumer warpgroup's m64n128 block: acc[4j + q] is tile row 64 wg + 16 warp
// + g + 8 (q >> 1), slice row 8j + 2 t4 + (q & 1) (weight rows n0 ..). Gated: slice rows 0-63 are
// the gate columns n0 / 2 + c, rows 64-127 the up rows of the same c, and Y gets silu_mul of the
// two BF16-rounded sums (row pitch N / 2); else the sums rounded to BF16 (row pitch N).
__device__ __forceinline__ void store_rows(const float (&acc)[64], bf16* __restrict__ Y, int p0, int rows, int wg,
                                           int tid, int n0, int N, int gated) {
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = 64 * wg + 16 * warp + g + 8 * h;
        if (row >= rows) continue;
        if (gated) {
            bf16* y = Y + (size_t)(p0 + row) * (N / 2) + n0 / 2 + 2 * t4;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                __nv_bfloat162 v;
                v.x = silu_mul_bf16(to_f32(to_bf16(acc[4 * j + 2 * h])), to_f32(to_bf16(acc[4 * (j + 8) + 2 * h])));
                v.y = silu_mul_bf16(to_f32(to_bf16(acc[4 * j + 2 * h + 1])),
                                    to_f32(to_bf16(acc[4 * (j + 8) + 2 * h + 1])));
                *reinterpret_cast<__nv_bfloat162*>(y + 8 * j) = v;
            }
        } else {
            bf16* y = Y + (size_t)(p0 + row) * N + n0 + 2 * t4;
#pragma unroll
            for (int j = 0; j < 16; ++j)
                *reinterpret_cast<__nv_bfloat162*>(y + 8 * j) =
                    __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    }
}

__device__ void grouped_wgmma(const void* __restrict__ w_map, unsigned long long w_base, unsigned long long w_ptr,
                              const bf16* __restrict__ X, const int* __restrict__ row_token, bf16* __restrict__ Y,
                              const int4* __restrict__ tiles, const int* __restrict__ num_tiles, int N, int K,
                              int gated) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages = (raw + 1023) & ~1023u;
    const unsigned full0 = stages + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    // Full: the TMA's expect_tx + each producer thread's copies; empty: each consumer warpgroup.
    init_stage_barriers(full0, empty0, STAGES, 1 + 128, CONSUMERS);
    pdl_enter();  // the tile list and X come from the kernels before
    const int slices = N / ROWS, k_steps = K / BK;
    const int items = num_tiles[0] * slices;
    // The first weight row of expert 0 in the map (the matrix may start inside a larger tensor).
    const int w_row0 = (int)((w_ptr - w_base) / (2ull * K));

    if (wg == CONSUMERS) {  // producer: thread 0 the weights, every thread its share of the rows
        if (tid == 0) tensormap_acquire(w_map);
        const int chunk = tid & 7, row0 = tid >> 3;
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const int4 t = tiles[item / slices];
            const int n0 = (item % slices) * ROWS, rows = t.z - t.y;
            const int row_a = w_row0 + t.x * N + (gated ? n0 / 2 : n0);
            const int row_b = gated ? w_row0 + t.x * N + N / 2 + n0 / 2 : row_a + BOX_ROWS;
            const bf16* src[COPIES];
#pragma unroll
            for (int j = 0; j < COPIES; ++j) {
                const int r = row0 + 16 * j, p = t.y + (r < rows ? r : 0);
                src[j] = X + (size_t)(row_token ? row_token[p] : p) * K + chunk * 8;
            }
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % STAGES;
                const unsigned bar = full0 + 8 * s, dst = stages + s * STAGE_BYTES;
                mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                if (tid == 0) {
                    mbar_expect_tx(bar, W_BYTES);
                    tma_load_2d(dst, w_map, ks * BK, row_a, bar);
                    tma_load_2d(dst + W_BOX, w_map, ks * BK, row_b, bar);
                }
                // Rows past the tile are not copied: their products land in outputs never written.
#pragma unroll
                for (int j = 0; j < COPIES; ++j) {
                    const int r = row0 + 16 * j;
                    if (r < rows) {
                        const unsigned to = dst + W_BYTES + swizzled(r, chunk);
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src[j] + ks * BK)
                                     : "memory");
                    }
                }
                cp_async_arrive_noinc(bar);
            }
        }
        // A thread must not exit with copies in flight: they would land (and arrive) after it.
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // Consumer warpgroup wg: rows 64 wg .. 64 wg + 63 of each tile. Thread 0 of the warpgroup
    // releases a stage once the products reading it are complete.
    int it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int4 t = tiles[item / slices];
        const int n0 = (item % slices) * ROWS, rows = t.z - t.y, p0 = t.y;
        if (rows <= 64 * wg) {
            release_without_rows<STAGES>(full0, empty0, it, k_steps, wg, tid);
            continue;
        }
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.f;
        int pending = -1;  // the stage whose products are still in flight
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
            const int s = it % STAGES;
            mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
            fence_async_proxy_shared();  // the rows cp.async wrote, for wgmma's reads
            const unsigned w = stages + s * STAGE_BYTES, x = w + W_BYTES + wg * (64 * 128);
            fence_operands(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) wgmma_m64n128k16(acc, sw128_desc(x + 32 * kk), sw128_desc(w + 32 * kk));
            wgmma_commit();
            wgmma_wait<1>();
            fence_operands(acc);
            if (pending >= 0 && tid == 0) mbar_arrive(empty0 + 8 * pending);
            pending = s;
        }
        wgmma_wait<0>();
        fence_operands(acc);
        if (tid == 0) mbar_arrive(empty0 + 8 * pending);
        store_rows(acc, Y, p0, rows, wg, tid, n0, N, gated);
    }
}
}  // namespace minnow_wgmma
#endif

// grid = min(items, SMs) with items = max_tiles * N / 128, block = minnow_wgmma::THREADS (384),
// dynamic shared memory = minnow_wgmma::SMEM_BYTES (grouped_wgmma_smem_bytes in ops). w_map: the
// 2D tensor map (boxes of 64 rows x 64 columns, 128-byte swizzle) of a tensor holding the experts'
// weights [E, N, K] at w_ptr. Requires N % 128 == 0, K % 64 == 0 and tiles cut at <= 128 rows.
extern "C" __global__ void __launch_bounds__(minnow_wgmma::THREADS, 1)
    grouped_gemm_wgmma(const void* __restrict__ w_map, unsigned long long w_base, unsigned long long w_ptr,
                       const bf16* __restrict__ X, const int* __restrict__ row_token, bf16* __restrict__ Y,
                       const int4* __restrict__ tiles, const int* __restrict__ num_tiles, int N, int K, int gated) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    minnow_wgmma::grouped_wgmma(w_map, w_base, w_ptr, X, row_token, Y, tiles, num_tiles, N, K, gated);
#else
    __trap();  // launched only where the sm_90a build is loaded (ops::grouped_wgmma_supported)
#endif
}

// ---------------------------------------------------------------------------------------------
// Quantized experts on wgmma: the grouped GEMM over `*_mma` codes (codes.cuh) of moe.cu's codes
// tiles, for tiles of up to 128 rows, with exactly their bits.
//
// The codes' fragment order is the A-fragment layout of mma.m16n8k16, which is also how a wgmma
// with A in registers takes each warp's 16 rows. So here the weights are the M side: each warp
// decodes its two bands (16 output columns) of a stage straight into registers, as the mma.sync
// tiles do, and the tile's activation rows are the N side, from shared memory. An item is 128
// output columns (16 bands) of one tile; consumer warpgroup w takes bands 8w .. 8w + 7 times all
// the tile's rows (m64n128k16), so the rows stream once per 128 columns. The producer warpgroup
// copies each 64-deep K stage with cp.async: the rows into the 128-byte-swizzled layout wgmma
// reads, the 16 bands' code tiles, and their scale rows.
//
// Batch invariance: integer and E4M3 codes sum each group of columns on the tensor cores into a
// fresh F32 partial (16-deep steps in ascending K), then acc = fma(part, scale, acc) in ascending
// groups, as codes_tile does; E2M1 codes and a packed shared expert's BF16 tiles accumulate one
// F32 sum over K (E2M1: times the band's factor at the end).
//
// Measured (H200, docs/performance.md): faster than the mma.sync codes tiles for FP8 and INT8
// experts in prefill and large batches, slower for INT4 and for 16-block batches, so moe.rs
// takes it for those two encodings from 32 rows per expert (Tuning::codes_wgmma). Each stage's
// products complete (wait_group 0) before the next stage is decoded into the same A registers,
// so ptxas keeps them asynchronous; the FP8 instance is still short of registers (C7512).
// Earlier versions, measured and replaced: partial sums and commit groups chosen at run time
// (serialised, and short of registers), 64-column items (the rows streamed twice as often), and
// two A register sets decoded while the other stage's products ran (serialised, C7513).
namespace minnow_codes_wgmma {
constexpr int ROWS = 128;  // output columns per item: 16 bands, 8 per consumer warpgroup, two per warp
constexpr int BANDS = ROWS / 8;
constexpr int TOKENS = 128;  // most activation rows per tile
constexpr int BK = 64;       // K per stage: one 128-byte swizzled activation row
constexpr int STEPS = BK / 16;
constexpr int STAGES = 6;
constexpr int X_BYTES = TOKENS * BK * 2;                                    // 16 KB, first (swizzle atoms)
constexpr int CODE_BYTES = BANDS * STEPS * minnow_codes::tile_bytes<16>();  // 16 KB: room for BF16 tiles
constexpr int SCALE_BYTES = BANDS * STEPS * 16;  // a 16-byte scale row per (band, group): <= STEPS groups
constexpr int STAGE_BYTES = 33 * 1024;
static_assert(X_BYTES + CODE_BYTES + SCALE_BYTES <= STAGE_BYTES && STAGE_BYTES % 1024 == 0, "stage layout");
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
static_assert(SMEM_BYTES == 6 * 33792 + 1024 + 96, "host mirror: codes_wgmma_smem_bytes in ops");
constexpr int COPIES = TOKENS * (BK / 8) / 128;  // a producer thread's 16-byte row copies per stage
}  // namespace minnow_codes_wgmma

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace minnow_codes_wgmma {
using namespace minnow_tma;
using namespace minnow_codes;
using minnow_wgmma::fence_floats;
using minnow_wgmma::fence_words;
using minnow_wgmma::sw128_desc;
using minnow_wgmma::wgmma_commit;
using minnow_wgmma::wgmma_fence;
using minnow_wgmma::wgmma_m64n128k16_rs;
using minnow_wgmma::wgmma_wait;

__device__ __forceinline__ void cp_async16_to(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// acc = fma(part, scale, acc) for the rows of the warp's two bands (f0: band 2w, f1: band 2w + 1),
// then part = 0 for the group after next.
__device__ __forceinline__ void fold(float (&acc)[64], float (&part)[64], float f0, float f1) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        acc[i] = fmaf(part[i], (i & 2) ? f1 : f0, acc[i]);
        part[i] = 0.f;
    }
}

// The consumer side of the stage ring: where the stages are, and how many this warpgroup has read.
struct Ring {
    const unsigned char* ptr;  // the stages, as a generic pointer
    unsigned stages, full0, empty0;
    int it;
    int wg, tid;
};

// One item for one consumer warpgroup: the tile's rows (`rows` of them, from `y`'s row 0) times
// the warpgroup's 8 bands of the item (output columns from n0, or, `gated`, silu_mul of the gate
// and up bands of intermediate columns from n0 / 2: minnow_codes::band_of_slot), over k_steps
// stages of the ring. BITS/ENC: how the stage's
// code tiles decode (16: a packed shared expert's BF16 tiles); GSTEPS: 16-column steps per scale
// group, 0 for one F32 sum over K (BF16 tiles, E2M1 codes; E2M1 then multiplies each band by its
// factor from `band_factor`).
//
// The A fragments alternate between two register sets by stage (a period of two stages,
// unrolled), so a stage decodes while the one before is in flight. A scale group's sum is folded
// once its products are complete (wait_group 0): with the default groups of 128 columns, every
// second stage.
template <int BITS, int ENC, int GSTEPS>
__device__ __forceinline__ void consume_item(Ring& ring, int k_steps, int rows, bf16* __restrict__ y, int n0, int N,
                                             int gated, const float* __restrict__ band_factor) {
    constexpr bool SCALED = GSTEPS > 0;
    constexpr int TB = tile_bytes<BITS>();
    constexpr int CSTEPS = SCALED && GSTEPS < STEPS ? GSTEPS : STEPS;  // steps per commit group
    const int warp = ring.tid >> 5, lane = ring.tid & 31, g = lane >> 2, t4 = lane & 3;
    const int band = 8 * ring.wg + 2 * warp;  // the warp's first band in the item
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.f;
    unsigned a[STEPS][4];
    // Every stage ends with all its products complete (wait_group 0) before the next stage's
    // decoding writes the A registers: no wgmma is in flight while a register it reads is
    // written, which ptxas can see (so it does not serialise the products, C7513). The other
    // consumer warpgroup's products run while this one decodes.
    for (int ks = 0; ks < k_steps; ++ks) {
        const int s = ring.it % STAGES;
        mbar_wait(ring.full0 + 8 * s, (ring.it / STAGES) & 1);
        fence_async_proxy_shared();  // the rows cp.async wrote, for wgmma's reads
        ++ring.it;
        const unsigned char* base = ring.ptr + s * STAGE_BYTES;
        // (4-bit codes: the lane's word of steps kk, kk + 1 at kk * TB, kk even; codes.cuh.)
        const unsigned char* code0 = base + X_BYTES + band * STEPS * TB + lane * (BITS == 4 ? 4 : BITS / 2);
        const unsigned char* code1 = code0 + STEPS * TB;
        const unsigned char* scale0 = base + X_BYTES + CODE_BYTES + band * STEPS * 16;
        const unsigned char* scale1 = scale0 + STEPS * 16;
        static_assert(STEPS % WORD_STEPS == 0, "4-bit stages hold whole words");
#pragma unroll
        for (int kk = 0; kk < STEPS; ++kk) {
            unsigned(&f)[4] = a[kk];
            if constexpr (BITS == 4) {
                if (kk % 2 == 0) {
                    unsigned(&f_next)[4] = a[kk + 1];
                    const unsigned w0 = *reinterpret_cast<const unsigned*>(code0 + kk * TB);
                    const unsigned w1 = *reinterpret_cast<const unsigned*>(code1 + kk * TB);
                    // E2M1: a 16-byte row of block scales per band and step.
                    decode_words<ENC>(w0, w1, reinterpret_cast<const unsigned short*>(scale0 + kk * 16) + g,
                                      reinterpret_cast<const unsigned short*>(scale1 + kk * 16) + g, f, f_next);
                }
            } else if constexpr (BITS == 16 || ENC == INT) {
                decode_pairs<BITS>(code0 + kk * TB, f[0], f[2]);
                decode_pairs<BITS>(code1 + kk * TB, f[1], f[3]);
            } else {
                decode_e4m3(code0 + kk * TB, f[0], f[2]);
                decode_e4m3(code1 + kk * TB, f[1], f[3]);
            }
        }
        const unsigned x = ring.stages + s * STAGE_BYTES;
#pragma unroll
        for (int kk = 0; kk < STEPS; ++kk) {
            if (kk % CSTEPS == 0) {
                fence_floats(acc);
                fence_floats(part);
                fence_words(a);
                wgmma_fence();
            }
            wgmma_m64n128k16_rs(part, a[kk], sw128_desc(x + 32 * kk));
            if ((kk + 1) % CSTEPS == 0) {
                wgmma_commit();
                wgmma_wait<0>();
                fence_floats(acc);
                fence_floats(part);
                fence_words(a);
                if (SCALED && ((ks * STEPS + kk + 1) % (SCALED ? GSTEPS : 1)) == 0) {
                    const int j = GSTEPS < STEPS ? kk / (SCALED ? GSTEPS : 1) : 0;
                    float f0, f1;
                    if constexpr (ENC == E4M3) {
                        f0 = *reinterpret_cast<const float*>(scale0 + j * 16);
                        f1 = *reinterpret_cast<const float*>(scale1 + j * 16);
                    } else {
                        f0 = __half2float(reinterpret_cast<const __half*>(scale0 + j * 16)[g]);
                        f1 = __half2float(reinterpret_cast<const __half*>(scale1 + j * 16)[g]);
                    }
                    fold(acc, part, f0, f1);
                }
            }
        }
        if (ring.tid == 0) mbar_arrive(ring.empty0 + 8 * s);  // its products are complete
    }
    if constexpr (!SCALED) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = part[i];
    }
    if constexpr (ENC == E2M1 && BITS == 4) {  // the global scales of the warp's two bands
        const float g0 = band_factor[band_of_slot(band, n0, N, gated)];
        const float g1 = band_factor[band_of_slot(band + 1, n0, N, gated)];
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] *= (i & 2) ? g1 : g0;
    }
    // acc[4j + q]: output column 8 band + g + 8 (q >> 1) of the item, tile row 8j + 2 t4 + (q & 1).
    // Gated: q < 2 the gate and q + 2 the up sum of intermediate column n0 / 2 + 4 band + g, each
    // rounded to BF16 as the gate/up output is before silu_mul (the bits of the two launches).
    if (gated) {
        const int I = N / 2, col = n0 / 2 + 4 * band + g;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int row = 8 * j + 2 * t4 + q;
                if (row < rows)
                    y[(size_t)row * I + col] =
                        silu_mul_bf16(to_f32(to_bf16(acc[4 * j + q])), to_f32(to_bf16(acc[4 * j + q + 2])));
            }
        return;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int row = 8 * j + 2 * t4 + (q & 1);
            if (row < rows) y[(size_t)row * N + n0 + 8 * band + g + 8 * (q >> 1)] = to_bf16(acc[4 * j + q]);
        }
}

template <int BITS, int ENC>
__device__ void grouped_codes(const bf16* __restrict__ X, const int* __restrict__ row_token,
                              const unsigned char* __restrict__ codes, const __half* __restrict__ scales,
                              const float* __restrict__ band_scale, int group, const bf16* __restrict__ shared,
                              int shared_slot, bf16* __restrict__ Y, const int4* __restrict__ tiles,
                              const int* __restrict__ num_tiles, int N, int K, int gated) {
    constexpr int TB = tile_bytes<BITS>(), TB16 = tile_bytes<16>();
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages = (raw + 1023) & ~1023u;
    const unsigned char* stage_ptr = smem_raw + (stages - raw);
    const unsigned full0 = stages + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    // Full: each producer thread's copies; empty: each consumer warpgroup.
    init_stage_barriers(full0, empty0, STAGES, 128, CONSUMERS);
    pdl_enter();  // the tile list and X come from the kernels before
    const int slices = N / ROWS, k_steps = K / BK, k_tiles = K / 16;
    const int groups = K / group, gsteps = group / 16;  // gsteps: 1, 2, 4 or 8
    const int stage_groups = gsteps < STEPS ? STEPS / gsteps : 1;  // scale rows of a band per stage
    const int items = num_tiles[0] * slices;

    // A consumer thread holds 128 F32 sums (its share of two 64 x 128 blocks) and two sets of A
    // fragments; a producer thread needs few registers: move them over.
    if (wg == CONSUMERS) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        const int chunk = tid & 7, row0 = tid >> 3;
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const int4 t = tiles[item / slices];
            const int n0 = (item % slices) * ROWS, rows = t.z - t.y;
            const bool bf16_slot = t.x == shared_slot;
            const int tb = bf16_slot ? TB16 : TB, band_bytes = STEPS * tb;
            // The item's 16 bands (band_of_slot), each k_tiles tiles of tb bytes (a packed shared
            // expert: its own matrix, the slot's only expert).
            const size_t expert_band0 = bf16_slot ? 0 : (size_t)t.x * (N / 8);
            const unsigned char* w = bf16_slot ? reinterpret_cast<const unsigned char*>(shared) : codes;
            const bf16* src[COPIES];
#pragma unroll
            for (int j = 0; j < COPIES; ++j) {
                const int r = row0 + 16 * j, p = t.y + (r < rows ? r : 0);
                src[j] = X + (size_t)(row_token ? row_token[p] : p) * K + chunk * 8;
            }
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % STAGES;
                const unsigned dst = stages + s * STAGE_BYTES;
                mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                // Rows past the tile are not copied: their products land in outputs never written.
#pragma unroll
                for (int j = 0; j < COPIES; ++j) {
                    const int r = row0 + 16 * j;
                    if (r < rows) cp_async16_to(dst + swizzled(r, chunk), src[j] + ks * BK);
                }
                for (int c = tid; c < BANDS * band_bytes / 16; c += 128) {
                    const int band = c * 16 / band_bytes, within = c * 16 % band_bytes;
                    cp_async16_to(dst + X_BYTES + c * 16,
                                  w + ((expert_band0 + band_of_slot(band, n0, N, gated)) * k_tiles + ks * STEPS) * tb +
                                      within);
                }
                if (!bf16_slot && tid < BANDS * stage_groups) {
                    const int band = tid / stage_groups, j = tid % stage_groups;
                    const int g = ks * STEPS / gsteps + j;
                    cp_async16_to(dst + X_BYTES + CODE_BYTES + (band * STEPS + j) * 16,
                                  scales + ((expert_band0 + band_of_slot(band, n0, N, gated)) * groups + g) * 8);
                }
                cp_async_arrive_noinc(full0 + 8 * s);
            }
        }
        // A thread must not exit with copies in flight: they would land (and arrive) after it.
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // Consumer warpgroup wg: bands 8 wg .. 8 wg + 7 of each item, times all the tile's rows.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    Ring ring{stage_ptr, stages, full0, empty0, 0, wg, tid};
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int4 t = tiles[item / slices];
        const int n0 = (item % slices) * ROWS, rows = t.z - t.y;
        bf16* y = Y + (size_t)t.y * (gated ? N / 2 : N);
        if (t.x == shared_slot) {
            consume_item<16, INT, 0>(ring, k_steps, rows, y, n0, N, gated, nullptr);
        } else if constexpr (ENC == E2M1) {
            consume_item<4, E2M1, 0>(ring, k_steps, rows, y, n0, N, gated, band_scale + (size_t)t.x * (N / 8));
        } else {
            switch (gsteps) {
                case 1: consume_item<BITS, ENC, 1>(ring, k_steps, rows, y, n0, N, gated, nullptr); break;
                case 2: consume_item<BITS, ENC, 2>(ring, k_steps, rows, y, n0, N, gated, nullptr); break;
                case 4: consume_item<BITS, ENC, 4>(ring, k_steps, rows, y, n0, N, gated, nullptr); break;
                default: consume_item<BITS, ENC, 8>(ring, k_steps, rows, y, n0, N, gated, nullptr); break;
            }
        }
    }
}
}  // namespace minnow_codes_wgmma
#endif

// grid = min(items, SMs) with items = max_tiles * N / 64, block = minnow_codes_wgmma::THREADS
// (384), dynamic shared memory = minnow_codes_wgmma::SMEM_BYTES (codes_wgmma_smem_bytes in ops).
// The parameters of moe.cu's codes kernels (GROUPED_CODES_ENTRY, `gated` included); requires
// N % 128 == 0, K % 64 == 0, a group of 16, 32, 64 or 128 columns dividing K, and tiles cut at
// <= 128 rows.
// Every wgmma codes kernel's entry (this family's and the shared-memory one's below): `BODY`, a
// macro of (BITS, ENC), is the call on the sm_90a build and a trap elsewhere.
#define GROUPED_CODES_WGMMA_ENTRY(NAME, THREADS, BODY, BITS, ENC)                                              \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                    \
        NAME(const bf16* X, const int* row_token, const unsigned char* codes, const __half* scales,              \
             const float* band_scale, int group, const bf16* shared, int shared_slot, bf16* Y, const int4* tiles, \
             const int* num_tiles, int N, int K, int gated) {                                                   \
        BODY(BITS, ENC)                                                                                         \
    }
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MINNOW_CODES_WGMMA_BODY(BITS, ENC)                                                                \
    minnow_codes_wgmma::grouped_codes<BITS, ENC>(X, row_token, codes, scales, band_scale, group, shared, \
                                                 shared_slot, Y, tiles, num_tiles, N, K, gated);
#else
#define MINNOW_CODES_WGMMA_BODY(BITS, ENC) __trap();  // launched only where the sm_90a build is loaded
#endif
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_i8_wgmma, minnow_codes_wgmma::THREADS, MINNOW_CODES_WGMMA_BODY, 8,
                          minnow_codes::INT)
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_i4_wgmma, minnow_codes_wgmma::THREADS, MINNOW_CODES_WGMMA_BODY, 4,
                          minnow_codes::INT)
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_f4_wgmma, minnow_codes_wgmma::THREADS, MINNOW_CODES_WGMMA_BODY, 4,
                          minnow_codes::E2M1)
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_f8_wgmma, minnow_codes_wgmma::THREADS, MINNOW_CODES_WGMMA_BODY, 8,
                          minnow_codes::E4M3)

// ---------------------------------------------------------------------------------------------
// Integer and E4M3 experts on wgmma with the weights decoded into shared memory
// (`grouped_gemm_{i4,i8,f8}_wgmma_ss`, opt-in: `MINNOW_CODES_SS=1`; not yet run on a GPU, see
// docs/performance.md, session forty-three).
//
// Why: at x64 an INT4 expert gets ~67 rows, and the mma.sync codes tiles spend most of their
// issue slots on decoding, addressing and small products (the batched step ran at ~2.9x its
// floor while BF16's wgmma kernel streams its 4x larger weights near the copy rate). The kernel
// above with A decoded into registers serialised decoding and products in the same warps. Here
// the step is split as in the BF16 kernel: the producer warpgroup copies each stage's codes,
// scales and activation rows with cp.async, and LOOKAHEAD fills later turns the codes into BF16
// weights in the 128-byte-swizzled layout a TMA box would have written, so the two consumer
// warpgroups run exactly the BF16 kernel's m64n128k16 products (tokens the M side, weights the
// N side) on them.
//
// Batch invariance, the codes tiles' bits: each group of columns is summed into a fresh F32
// partial in ascending 16-deep steps, then acc = fma(part, scale, acc) in ascending groups (the
// same products in the same order as codes_tile, as the BF16 kernels match their mma.sync
// tiles); gated gate/up writes silu_mul of the BF16-rounded sums. A packed shared expert's BF16
// tiles are not read here, nor NVFP4's block-scaled codes: the launcher keeps such launches on
// the kernels above.
namespace minnow_codes_ss {
constexpr int ROWS = 128;   // weight rows (output columns) per item: 16 bands of 8
constexpr int TOKENS = 128;
constexpr int BK = 64;      // K per stage: one 128-byte swizzled row of BF16
constexpr int STEPS = BK / 16;
constexpr int LOOKAHEAD = 2;  // fills whose copies are in flight while the producer decodes one
constexpr int W_BYTES = ROWS * BK * 2;      // 16 KB: the decoded weights, two 64-row boxes
constexpr int X_BYTES = TOKENS * BK * 2;    // 16 KB: the activation rows
constexpr int SCALE_BYTES = 16 * STEPS * 16;  // [slot][group of the stage, <= STEPS][16 bytes]
// The codes of a stage as stored ([slot][64 BITS / 8 bytes of its band]): 4 KB of INT4 words,
// 8 KB of 8-bit tiles.
template <int BITS>
__host__ __device__ constexpr int code_bytes() { return ROWS * BK * BITS / 8; }
template <int BITS>
__host__ __device__ constexpr int stage_bytes() { return W_BYTES + X_BYTES + code_bytes<BITS>() + SCALE_BYTES; }
// As many stages as the module's 200 KB hold: 5 of 37 KB (INT4), 4 of 41 KB (8-bit).
template <int BITS>
__host__ __device__ constexpr int stages() { return BITS == 4 ? 5 : 4; }
template <int BITS>
__host__ __device__ constexpr int smem_bytes() { return stages<BITS>() * stage_bytes<BITS>() + 1024 + 2 * stages<BITS>() * 8; }
static_assert(stage_bytes<4>() % 1024 == 0 && stage_bytes<8>() % 1024 == 0, "stages stay aligned to the swizzle atom");
static_assert(stages<4>() >= LOOKAHEAD + 2 && stages<8>() >= LOOKAHEAD + 2,
              "a stage is released one fill after the next is read");
static_assert(smem_bytes<4>() == 5 * 37888 + 1024 + 80, "host mirror: codes_ss_smem_bytes in ops");
static_assert(smem_bytes<8>() == 4 * 41984 + 1024 + 64, "host mirror: codes_ss_smem_bytes in ops");
constexpr int CONSUMERS = 2;
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int COPIES = TOKENS * (BK / 8) / 128;  // a producer thread's 16-byte row copies per stage
}  // namespace minnow_codes_ss

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace minnow_codes_ss {
using namespace minnow_tma;
using minnow_codes::decode_e4m3;
using minnow_codes::decode_int4_word;
using minnow_codes::decode_pairs;
using minnow_codes::E4M3;
using minnow_wgmma::fence_floats;
using minnow_wgmma::store_rows;
using minnow_wgmma::sw128_desc;
using minnow_wgmma::wgmma_commit;
using minnow_wgmma::wgmma_fence;
using minnow_wgmma::wgmma_m64n128k16;
using minnow_wgmma::wgmma_wait;

__device__ __forceinline__ void st_shared_u32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_shared_u32(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// The expert's band (8 weight rows) that slot `slot` (0..15) of an item at column n0 holds. Gated
// (N = [gate; up], N / 2 rows each): slots 0-7 the gate bands of intermediate columns n0 / 2 ..
// n0 / 2 + 63, slots 8-15 the up bands of the same columns, so slice rows 0-63 are gate and 64-127
// up, as in the BF16 kernel's epilogue.
__device__ __forceinline__ int band_of(int slot, int n0, int N, int gated) {
    return gated ? (slot < 8 ? n0 / 16 + slot : N / 16 + n0 / 16 + slot - 8) : n0 / 8 + slot;
}

// Stores BF16 pair `v` at column c (even) of slice row `row` in the stage's weight boxes (rows
// 0-63 the first box, 64-127 the second; 128 bytes a row, 16-byte chunks XORed with row % 8).
__device__ __forceinline__ void store_pair(unsigned stage, int row, int c, unsigned v) {
    const int brow = row & 63;
    st_shared_u32(stage + (row >> 6) * (W_BYTES / 2) + brow * 128 + ((((c >> 3) ^ (brow & 7))) << 4) + (c & 7) * 2, v);
}

// The producer's decode of one filled stage into the BF16 weight boxes, each thread its share.
// A warp's stores cover 8 rows x 4 words of one chunk column, on 32 distinct banks through the
// swizzle. Lane l of a code word holds row l / 4 of its band, columns c0 = 2 (l % 4), c0 + 1,
// c0 + 8, c0 + 9 of a 16-column step (codes.cuh):
//   4-bit: word i = slot * 64 + pair * 32 + lane covers the pair's two steps (8 words a thread);
//   8-bit: word i = slot * 128 + step * 32 + lane, one step (16 words a thread).
template <int BITS, int ENC>
__device__ __forceinline__ void decode_stage(unsigned stage, const unsigned char* stage_ptr, int tid) {
    const unsigned char* words = stage_ptr + W_BYTES + X_BYTES;
    const int lane = tid & 31, c0 = 2 * (lane & 3);
    if constexpr (BITS == 4) {
        const int pair = (tid >> 5) & 1;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int slot = (tid >> 6) + 2 * j, row = 8 * slot + (lane >> 2);
            unsigned v[4];  // (c0, c0 + 1) and (c0 + 8, c0 + 9) of step 2 pair, then of 2 pair + 1
            decode_int4_word(reinterpret_cast<const unsigned*>(words)[tid + 128 * j], v[0], v[1], v[2], v[3]);
#pragma unroll
            for (int c = 0; c < 4; ++c) store_pair(stage, row, 32 * pair + 8 * c + c0, v[c]);
        }
    } else {
        const int step = tid >> 5;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int row = 8 * j + (lane >> 2);
            unsigned lo, hi;  // (c0, c0 + 1), (c0 + 8, c0 + 9)
            const unsigned char* p = words + (j * 128 + tid) * 4;
            if constexpr (ENC == E4M3) {
                decode_e4m3(p, lo, hi);
            } else {
                decode_pairs<8>(p, lo, hi);
            }
            store_pair(stage, row, 16 * step + c0, lo);
            store_pair(stage, row, 16 * step + c0 + 8, hi);
        }
    }
}

// One item for one consumer warpgroup (the tile's rows 64 wg ..; the caller checked it has some):
// k_steps stages of products into `part`, folded into `acc` with the group's scales at the end of
// each group of GSTEPS 16-column steps, then the epilogue. `it` counts the stages read.
template <int BITS, int ENC, int GSTEPS>
__device__ __forceinline__ void consume_item(unsigned stages_at, unsigned full0, unsigned empty0, int& it, int wg,
                                             int tid, int k_steps, int rows, bf16* __restrict__ Y, int p0, int n0,
                                             int N, int gated) {
    constexpr int S = stages<BITS>(), SB = stage_bytes<BITS>();
    const int t4 = tid & 3;  // the accumulators' column pair (store_rows: the D fragment's layout)
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.f;
    // A group longer than a stage spans SPAN stages, unrolled, so where it ends is known at
    // compile time (a wait in a branch would serialise the products: ptxas C7520).
    constexpr int SPAN = GSTEPS > STEPS ? GSTEPS / STEPS : 1;
    int pending = -1;  // the stage whose products are still in flight
    for (int ks0 = 0; ks0 < k_steps; ks0 += SPAN) {
#pragma unroll
        for (int sp = 0; sp < SPAN; ++sp, ++it) {
            const int s = it % S;
            mbar_wait(full0 + 8 * s, (it / S) & 1);
            fence_async_proxy_shared();  // the rows cp.async and the decoded weights, for wgmma's reads
            const unsigned w = stages_at + s * SB, x = w + W_BYTES + wg * (64 * 128);
            const unsigned sc = w + W_BYTES + X_BYTES + code_bytes<BITS>();
            fence_floats(part);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < STEPS; ++kk) {
                wgmma_m64n128k16(part, sw128_desc(x + 32 * kk), sw128_desc(w + 32 * kk));
                const bool group_end = GSTEPS <= STEPS ? (kk + 1) % GSTEPS == 0 : sp == SPAN - 1 && kk == STEPS - 1;
                if (group_end) {
                    wgmma_commit();
                    wgmma_wait<0>();
                    fence_floats(part);
                    // d[4j + q] is slice row 8j + 2 t4 + (q & 1), in slot j's band. Integer codes:
                    // the FP16 scales of its rows 2 t4 and 2 t4 + 1, one word; E4M3: the group's
                    // block scale (F32, first of four copies), one for the band.
                    const int gi = GSTEPS <= STEPS ? kk / GSTEPS : 0;
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        float s0, s1;
                        if constexpr (ENC == E4M3) {
                            s0 = s1 = __uint_as_float(ld_shared_u32(sc + (j * STEPS + gi) * 16));
                        } else {
                            const unsigned h = ld_shared_u32(sc + (j * STEPS + gi) * 16 + 4 * t4);
                            s0 = __half2float(__ushort_as_half((unsigned short)(h & 0xFFFFu)));
                            s1 = __half2float(__ushort_as_half((unsigned short)(h >> 16)));
                        }
                        acc[4 * j] = fmaf(part[4 * j], s0, acc[4 * j]);
                        acc[4 * j + 1] = fmaf(part[4 * j + 1], s1, acc[4 * j + 1]);
                        acc[4 * j + 2] = fmaf(part[4 * j + 2], s0, acc[4 * j + 2]);
                        acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
                    }
#pragma unroll
                    for (int i = 0; i < 64; ++i) part[i] = 0.f;
                    fence_floats(part);
                    if (kk < STEPS - 1) wgmma_fence();
                }
            }
            // A stage whose last step ended a group has every product done: it and the one
            // before are released; otherwise the one before is, once its products are.
            constexpr bool ends_group_last = GSTEPS <= STEPS;
            if (ends_group_last || sp == SPAN - 1) {
                if (tid == 0) {
                    if (pending >= 0) mbar_arrive(empty0 + 8 * pending);
                    mbar_arrive(empty0 + 8 * s);
                }
                pending = -1;
            } else {
                wgmma_commit();
                wgmma_wait<1>();
                fence_floats(part);
                if (pending >= 0 && tid == 0) mbar_arrive(empty0 + 8 * pending);
                pending = s;
            }
        }
    }
    if (pending >= 0) {  // (K ends inside a group only for groups longer than K: not launched)
        wgmma_wait<0>();
        fence_floats(part);
        if (tid == 0) mbar_arrive(empty0 + 8 * pending);
    }
    store_rows(acc, Y, p0, rows, wg, tid, n0, N, gated);
}

template <int BITS, int ENC>
__device__ void grouped_ss(const bf16* __restrict__ X, const int* __restrict__ row_token,
                           const unsigned char* __restrict__ codes, const __half* __restrict__ scales, int group,
                           bf16* __restrict__ Y, const int4* __restrict__ tiles, const int* __restrict__ num_tiles,
                           int N, int K, int gated) {
    constexpr int S = stages<BITS>(), SB = stage_bytes<BITS>(), CB = code_bytes<BITS>();
    // A band's codes of one stage: 64 columns of 8 rows, contiguous (4-bit words of two steps
    // after each other, 8-bit tiles of one step after each other); a band takes K BITS bytes.
    constexpr int BAND_STAGE_BYTES = 64 * BITS, CODE_COPIES = CB / 16 / 128;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages_at = (raw + 1023) & ~1023u;
    const unsigned char* stage_ptr = smem_raw + (stages_at - raw);
    const unsigned full0 = stages_at + S * SB, empty0 = full0 + 8 * S;
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    // Full: each producer thread once its share of the stage is decoded; empty: each consumer
    // warpgroup.
    init_stage_barriers(full0, empty0, S, 128, CONSUMERS);
    pdl_enter();  // the tile list and X come from the kernels before
    const int slices = N / ROWS, k_steps = K / BK;
    const int groups = K / group, gsteps = group / 16;  // gsteps: 1, 2, 4 or 8
    const int stage_groups = gsteps < STEPS ? STEPS / gsteps : 1;
    const int items = num_tiles[0] * slices;

    if (wg == CONSUMERS) {  // producer
        // 128 x 104 + 256 x 200 registers: the launch's 384 x 168, so the consumers' raise
        // never waits; with fewer the producer spills.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 104;\n" ::: "memory");
        const int chunk = tid & 7, row0 = tid >> 3;
        int it = 0;
        // Decodes fill `f` once this thread's copies of it have landed and every producer
        // thread has seen its own land (so all of the fill's codes are there), then releases
        // it to the consumers.
        auto finish = [&](int f) {
            named_barrier_sync(3, 128);
            decode_stage<BITS, ENC>(stages_at + (f % S) * SB, stage_ptr + (f % S) * SB, tid);
            fence_async_proxy_shared();  // the stores above, for wgmma's reads
            mbar_arrive(full0 + 8 * (f % S));
        };
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const int4 t = tiles[item / slices];
            const int n0 = (item % slices) * ROWS, rows = t.z - t.y;
            const size_t expert_band0 = (size_t)t.x * (N / 8);
            const bf16* src[COPIES];
#pragma unroll
            for (int j = 0; j < COPIES; ++j) {
                const int r = row0 + 16 * j, p = t.y + (r < rows ? r : 0);
                src[j] = X + (size_t)(row_token ? row_token[p] : p) * K + chunk * 8;
            }
            // This thread's 16-byte copies of the codes: copy c takes bytes 16 (c % per_band) of
            // slot c / per_band's band in the stage.
            const unsigned char* code_src[CODE_COPIES];
#pragma unroll
            for (int j = 0; j < CODE_COPIES; ++j) {
                constexpr int per_band = BAND_STAGE_BYTES / 16;
                const int c = tid + 128 * j;
                code_src[j] = codes + (expert_band0 + band_of(c / per_band, n0, N, gated)) * (size_t)K * BITS +
                              (c % per_band) * 16;
            }
            const bool scale_copier = tid < 16 * stage_groups;
            const int scale_slot = tid / stage_groups, scale_j = tid % stage_groups;
            const __half* scale_src =
                scales + ((expert_band0 + band_of(scale_copier ? scale_slot : 0, n0, N, gated)) * groups + scale_j) * 8;
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % S;
                const unsigned dst = stages_at + s * SB;
                unsigned char* dst_ptr = const_cast<unsigned char*>(stage_ptr) + s * SB;
                mbar_wait(empty0 + 8 * s, ((it / S) & 1) ^ 1);
                // Rows past the tile are not copied: their products land in outputs never written.
#pragma unroll
                for (int j = 0; j < COPIES; ++j) {
                    const int r = row0 + 16 * j;
                    if (r < rows)
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + W_BYTES + swizzled(r, chunk)),
                                     "l"(src[j] + ks * BK)
                                     : "memory");
                }
#pragma unroll
                for (int j = 0; j < CODE_COPIES; ++j)
                    cp_async16(dst_ptr + W_BYTES + X_BYTES + (tid + 128 * j) * 16, code_src[j] + ks * BAND_STAGE_BYTES,
                               true);
                if (scale_copier)
                    cp_async16(dst_ptr + W_BYTES + X_BYTES + CB + (scale_slot * STEPS + scale_j) * 16,
                               scale_src + (size_t)(ks * STEPS / gsteps) * 8, true);
                cp_async_commit();
                if (it >= LOOKAHEAD) {
                    cp_async_wait<LOOKAHEAD>();
                    finish(it - LOOKAHEAD);
                }
            }
        }
        // The last fills' copies, then their decoding.
        cp_async_wait<0>();
        for (int f = it - LOOKAHEAD > 0 ? it - LOOKAHEAD : 0; f < it; ++f) finish(f);
        return;
    }

    // Consumer warpgroup wg: rows 64 wg .. 64 wg + 63 of each tile.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n" ::: "memory");
    int it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int4 t = tiles[item / slices];
        const int n0 = (item % slices) * ROWS, rows = t.z - t.y;
        if (rows <= 64 * wg) {
            minnow_wgmma::release_without_rows<S>(full0, empty0, it, k_steps, wg, tid);
            continue;
        }
        switch (gsteps) {
            case 1:
                consume_item<BITS, ENC, 1>(stages_at, full0, empty0, it, wg, tid, k_steps, rows, Y, t.y, n0, N, gated);
                break;
            case 2:
                consume_item<BITS, ENC, 2>(stages_at, full0, empty0, it, wg, tid, k_steps, rows, Y, t.y, n0, N, gated);
                break;
            case 4:
                consume_item<BITS, ENC, 4>(stages_at, full0, empty0, it, wg, tid, k_steps, rows, Y, t.y, n0, N, gated);
                break;
            default:
                consume_item<BITS, ENC, 8>(stages_at, full0, empty0, it, wg, tid, k_steps, rows, Y, t.y, n0, N, gated);
                break;
        }
    }
}
}  // namespace minnow_codes_ss
#endif

// grid = min(items, SMs) with items = max_tiles * N / 128, block = minnow_codes_ss::THREADS (384),
// dynamic shared memory = minnow_codes_ss::smem_bytes<BITS>() (codes_ss_smem_bytes in ops). The
// parameters of the codes kernels (`band_scale`, `shared` and `shared_slot` unused: launched
// without a packed shared expert); requires N % 128 == 0, K % 64 == 0 (4-bit codes in the word
// order), a group of 16, 32, 64 or 128 columns dividing K, and tiles cut at <= 128 rows.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MINNOW_CODES_SS_BODY(BITS, ENC) \
    minnow_codes_ss::grouped_ss<BITS, ENC>(X, row_token, codes, scales, group, Y, tiles, num_tiles, N, K, gated & 1);
#else
#define MINNOW_CODES_SS_BODY(BITS, ENC) __trap();  // launched only where the sm_90a build is loaded
#endif
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_i4_wgmma_ss, minnow_codes_ss::THREADS, MINNOW_CODES_SS_BODY, 4,
                          minnow_codes::INT)
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_i8_wgmma_ss, minnow_codes_ss::THREADS, MINNOW_CODES_SS_BODY, 8,
                          minnow_codes::INT)
GROUPED_CODES_WGMMA_ENTRY(grouped_gemm_f8_wgmma_ss, minnow_codes_ss::THREADS, MINNOW_CODES_SS_BODY, 8,
                          minnow_codes::E4M3)
