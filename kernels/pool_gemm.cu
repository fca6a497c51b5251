// The experts of a 2.2 denoising step over the block's admitted pool, streamed with the Hopper
// bulk-copy engine (docs/performance.md, attempt 20):
//   Y_q[t, n] = sum_k X_q[t, k] * W_q[n, k]     for pool entries q < B, tokens t < T <= 32
// with X_q, W_q, Y_q given as device address arrays (written by route_block on the device, so the
// step stays one CUDA graph), BF16 in and out, F32 accumulation on tensor cores.
//
// Why not cuBLAS's batched GEMM: at 32 tokens the whole cost is streaming the weights (205 MB for
// gate/up of 49 entries), and cuBLAS reached 3.3-3.5 TB/s of the 4.2 TB/s the GPU copies at. A
// cp.async version (attempt 18) was slower still: per-thread 16-byte copies from one or two CTAs
// per SM could not keep enough bytes in flight. Here one producer warp per SM issues whole
// 256-byte row segments with `cp.async.bulk` (the copy engine tracks completion on an mbarrier),
// so each SM keeps three 43 KB stages in flight with a few instructions.
//
// Shape: one persistent CTA per SM walks tiles of 128 weight rows (entry q, rows n0..n0+127) over
// the whole K in 128-deep stages, the pipeline running straight across tiles. 8 consumer warps
// own 16 weight rows each and compute their 16 x 32 block with mma.sync (m16n8k16; the weight
// rows are the M side, the tokens the N side); warp 8 produces. Requires N % 128 == 0,
// K % 128 == 0, T <= 32, 16-byte aligned rows.
#include "common.cuh"

namespace minnow_pool {
constexpr int ROWS = 128;          // weight rows per tile
constexpr int BK = 128;            // K per stage
constexpr int TOKENS = 32;         // most tokens (the mma N side: 4 blocks of 8)
constexpr int LD = BK + 8;         // bf16 row pitch in shared memory: 272 bytes, conflict-free ldmatrix
constexpr int STAGES = 4;
constexpr int CONSUMERS = ROWS / 16;           // 8 warps
constexpr int THREADS = (CONSUMERS + 1) * 32;  // + the producer warp
constexpr int STAGE_ELEMS = (ROWS + TOKENS) * LD;
constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2 + 2 * STAGES * 8;  // + full/empty barriers
static_assert(SMEM_BYTES == 4 * 160 * 136 * 2 + 64, "host mirror: pool_gemm_smem_bytes in ops.rs");
}  // namespace minnow_pool

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace minnow_pool {
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}
// `bytes` (a multiple of 16) from global to this CTA's shared memory; completion counts on `bar`.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}  // namespace minnow_pool
#endif

// grid = min(tiles, SMs) with tiles = B * N / 128, block = minnow_pool::THREADS (288), dynamic
// shared memory = minnow_pool::SMEM_BYTES (mirrored by pool_gemm_smem_bytes in ops.rs).
// Row pitches: X_q and W_q K, Y_q N.
extern "C" __global__ void __launch_bounds__(minnow_pool::THREADS, 1)
    pool_gemm_bulk(const unsigned long long* __restrict__ x_ptrs, const unsigned long long* __restrict__ w_ptrs,
                   const unsigned long long* __restrict__ y_ptrs, int T, int N, int K, int B) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace minnow_pool;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* stages = reinterpret_cast<bf16*>(smem);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + STAGES * STAGE_ELEMS * 2);
    const unsigned full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, CONSUMERS);
        }
    }
    __syncthreads();
    pdl_enter();  // the address arrays and X come from the kernels before
    const int tiles_per_entry = N / ROWS, tiles = B * tiles_per_entry, k_steps = K / BK;

    if (warp == CONSUMERS) {  // producer: one 256-byte bulk copy per weight or token row segment
        const unsigned bytes = (unsigned)(ROWS + T) * BK * 2;
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int q = tile / tiles_per_entry, n0 = (tile % tiles_per_entry) * ROWS;
            const bf16* w = reinterpret_cast<const bf16*>(w_ptrs[q]) + (size_t)n0 * K;
            const bf16* x = reinterpret_cast<const bf16*>(x_ptrs[q]);
            for (int ks = 0; ks < k_steps; ++ks, ++it) {
                const int s = it % STAGES;
                mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                if (lane == 0) mbar_expect_tx(full0 + 8 * s, bytes);
                __syncwarp();
                const unsigned dst = smem_addr(stages + s * STAGE_ELEMS);
                for (int r = lane; r < ROWS + T; r += 32) {
                    const bf16* src = r < ROWS ? w + (size_t)r * K : x + (size_t)(r - ROWS) * K;
                    bulk_copy(dst + r * LD * 2, src + ks * BK, BK * 2, full0 + 8 * s);
                }
            }
        }
        return;
    }

    // Consumers: warp w owns weight rows 16w..16w+15 of each tile.
    const int g = lane >> 2, t4 = lane & 3;
    // ldmatrix row addresses (bytes from a stage's start): the A fragment (16 weight rows x 16 k)
    // and the B fragments of 16 tokens x 16 k.
    const unsigned a_off = ((warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8) * 2;
    const unsigned b_off = ((ROWS + (lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int q = tile / tiles_per_entry, n0 = (tile % tiles_per_entry) * ROWS;
        float acc[TOKENS / 8][4];
#pragma unroll
        for (int nb = 0; nb < TOKENS / 8; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
            const int s = it % STAGES;
            mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
            const unsigned base = smem_addr(stages + s * STAGE_ELEMS);
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                unsigned a[4];
                ldmatrix_x4(a, base + a_off + kk * 32);
#pragma unroll
                for (int nb2 = 0; nb2 < TOKENS / 16; ++nb2) {
                    unsigned b[4];
                    ldmatrix_x4(b, base + b_off + nb2 * 16 * LD * 2 + kk * 32);
                    mma16816(acc[2 * nb2], a, b[0], b[1]);
                    mma16816(acc[2 * nb2 + 1], a, b[2], b[3]);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * s);
        }
        // acc[nb][0..1]: row g, tokens nb*8 + 2*t4 (+1); acc[nb][2..3]: row g + 8.
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
    }
#else
    __trap();  // launched only where the sm_90 build is loaded (ops::pool_gemm_supported)
#endif
}
