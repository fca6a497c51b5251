// Split-K GEMM for short forwards: Y = X . W^T with X [T, K] BF16 (T <= 32) and W [N, K] BF16
// (PyTorch [out, in]). A denoising step's attention projections have 32 rows: reading the
// weights once is the whole cost, and cuBLAS moves them at about a quarter of the copy bandwidth
// there. Here every CTA streams one 64-column x (K / splits) slab of W through a cp.async
// pipeline (the grouped expert GEMM's main loop) and writes an F32 partial product; the kernel
// that consumes Y sums the `splits` partials in a fixed order and rounds to BF16 once, so no
// reduction launch is needed and results do not depend on timing.
//
// part: [splits, 32, N] F32 (rows past T hold zeros). grid = (N / 64, splits), block = 128,
// dynamic shared memory = LINEAR_SMEM_BYTES (mirrored in crates/minnow-runtime/src/cuda/ops.rs).
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

namespace minnow_linear {
constexpr int BM = 32, BN = 64, BK = 64, THREADS = 128, STAGES = 4;
constexpr int LDT = BK + 8;  // bf16 row pitch of the X and W tiles
constexpr int STAGE_ELEMS = (BM + BN) * LDT;
constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2;
}  // namespace minnow_linear
using namespace minnow_linear;
static_assert(SMEM_BYTES == 4 * 96 * 72 * 2, "host mirror");

// Split `blockIdx.y` covers the 64-deep K steps [y * steps_per_split, (y + 1) * steps_per_split)
// (the host makes every split non-empty). K need only be a multiple of 8: columns past K are
// zero-filled.
extern "C" __global__ void __launch_bounds__(THREADS)
    linear_splitk_m32(const bf16* __restrict__ X, const bf16* __restrict__ W, float* __restrict__ part, int T,
                      int N, int K, int steps_per_split) {
    const int n0 = blockIdx.x * BN, split = blockIdx.y;
    const int nk = (K + BK - 1) / BK;
    const int kt0 = split * steps_per_split, kt1 = min(nk, kt0 + steps_per_split);
    const int steps = kt1 - kt0;

    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sbuf = reinterpret_cast<bf16*>(smem);
    const int tid = threadIdx.x, warp = tid >> 5;

    // While the previous kernel finishes (programmatic dependent launch), pull this CTA's slab of
    // weights into L2: 64 rows x `steps` lines of 128 bytes. Weights are never written.
    for (int i = tid; i < BN * steps; i += THREADS) {
        const int r = i / steps, kt = kt0 + i % steps;
        if (kt * BK < K) prefetch_l2(W + (size_t)(n0 + r) * K + kt * BK);
    }
    pdl_enter();

    // Weights: 64 rows x 8 chunks of 16 bytes = 4 chunks per thread; X: 32 rows x 8 = 2.
    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
        bf16* sA = sbuf + stage * STAGE_ELEMS;
        bf16* sB = sA + BM * LDT;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = tid + i * THREADS, r = c >> 3, col = (c & 7) * 8;
            cp_async16(sB + r * LDT + col, W + (size_t)(n0 + r) * K + k0 + col, k0 + col < K);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + i * THREADS, r = c >> 3, col = (c & 7) * 8;
            const bool ok = r < T && k0 + col < K;
            cp_async16(sA + r * LDT + col, X + (size_t)(ok ? r : 0) * K + k0 + col, ok);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.f);
    wmma::fill_fragment(acc[1], 0.f);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load_stage(s, kt0 + s);
        cp_async_commit();
    }
    for (int i = 0; i < steps; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = i + STAGES - 1;
        if (next < steps) load_stage(next % STAGES, kt0 + next);
        cp_async_commit();
        const bf16* a = sbuf + (i % STAGES) * STAGE_ELEMS;
        const bf16* b = a + BM * LDT + warp * 16 * LDT;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa0, fa1;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
            wmma::load_matrix_sync(fb, b + kk, LDT);
            wmma::load_matrix_sync(fa0, a + kk, LDT);
            wmma::load_matrix_sync(fa1, a + 16 * LDT + kk, LDT);
            wmma::mma_sync(acc[0], fa0, fb, acc[0]);
            wmma::mma_sync(acc[1], fa1, fb, acc[1]);
        }
    }
    cp_async_wait<0>();
    float* out = part + (size_t)split * BM * N + n0 + warp * 16;
    wmma::store_matrix_sync(out, acc[0], N, wmma::mem_row_major);
    wmma::store_matrix_sync(out + (size_t)16 * N, acc[1], N, wmma::mem_row_major);
}
