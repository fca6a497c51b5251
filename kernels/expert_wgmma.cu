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
#include "common.cuh"

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

// The shared-memory matrix descriptor of wgmma for rows of 128 bytes (64 BF16 of K) in 8-row,
// 1,024-byte atoms written with the 128-byte swizzle: a TMA box, or the producer's swizzled
// copies. `addr` is the atom-aligned start plus 32 bytes per 16-deep K step (the swizzle is a
// function of the address bits, so stepping inside the atom needs no other change).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)  // start address, 16-byte units
           | (1ull << 16)                                // leading offset (unused with this swizzle)
           | ((unsigned long long)(1024 >> 4) << 32)     // stride offset: one 8-row atom
           | (1ull << 62);                               // the 128-byte swizzle
}

// D[64 x 128] += A[64 x 16] . B[128 x 16]^T: one warpgroup's m64n128k16 BF16 product with F32
// accumulation, A and B read from shared memory through their descriptors (both K-major). d[4j + q]
// of a thread (warp w of the warpgroup, lane = 4g + t4) is row 16w + g + 8 (q >> 1), column
// 8j + 2 t4 + (q & 1).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of the accumulators across the asynchronous
// products (their registers change behind its back until a wait).
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
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
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1 + 128);  // the TMA's expect_tx + each producer thread's copies
            mbar_init(empty0 + 8 * s, CONSUMERS);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pdl_enter();  // the tile list and X come from the kernels before
    const int slices = N / ROWS, k_steps = K / BK;
    const int items = num_tiles[0] * slices;
    // The first weight row of expert 0 in the map (the matrix may start inside a larger tensor).
    const int w_row0 = (int)((w_ptr - w_base) / (2ull * K));

    if (wg == CONSUMERS) {  // producer: thread 0 the weights, every thread its share of the rows
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
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int4 t = tiles[item / slices];
        const int n0 = (item % slices) * ROWS, rows = t.z - t.y, p0 = t.y;
        const bool active = rows > 64 * wg;  // a warpgroup with no rows only releases stages
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.f;
        int pending = -1;  // the stage whose products are still in flight
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
            const int s = it % STAGES;
            mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
            if (!active) {
                if (tid == 0) mbar_arrive(empty0 + 8 * s);
                continue;
            }
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
        if (!active) continue;
        wgmma_wait<0>();
        fence_operands(acc);
        if (tid == 0) mbar_arrive(empty0 + 8 * pending);
        // acc[4j + q]: tile row 64 wg + 16 warp + g + 8 (q >> 1), slice row 8j + 2 t4 + (q & 1).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 64 * wg + 16 * warp + g + 8 * h;
            if (row >= rows) continue;
            if (gated) {
                // Slice rows 0-63 are gate columns n0/2 + c, rows 64-127 the up rows of the same c.
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
