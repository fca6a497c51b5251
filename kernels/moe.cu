// Grouped expert GEMM: every admitted expert's rows in one launch (docs/llada2-model.md §7.6).
//   Y[p, :] = X[src(p), :] . W[e]^T      for the rows p of each tile (e, p0, p1)
// X is [*, K] BF16 (src(p) = row_token[p] when a gather index is given, else p), W is [E, N, K]
// BF16 (PyTorch [out, in] per expert), Y is [rows, N] BF16 with F32 accumulation on tensor cores.
// The tile list comes from moe_dispatch on the device; CTAs past num_tiles exit at once.
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

namespace {
constexpr int BM = 64, BN = 64, BK = 32, THREADS = 128;
constexpr int LDT = BK + 8;   // bf16 row pitch of the A and B tiles
constexpr int LDC = BN + 4;   // f32 row pitch of the epilogue tile
constexpr int STAGES = 3;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
}  // namespace

// grid = (N / 64, max_tiles), block = 128. Requires N % 64 == 0 and K % 32 == 0.
extern "C" __global__ void __launch_bounds__(THREADS)
    grouped_gemm(const bf16* __restrict__ X, const int* __restrict__ row_token, const bf16* __restrict__ W,
                 bf16* __restrict__ Y, const int4* __restrict__ tiles, const int* __restrict__ num_tiles, int N,
                 int K) {
    if ((int)blockIdx.y >= num_tiles[0]) return;
    const int4 tile = tiles[blockIdx.y];
    const int e = tile.x, p0 = tile.y, rows = tile.z - tile.y;
    const int n0 = blockIdx.x * BN;
    const bf16* We = W + ((size_t)e * N + n0) * K;

    __shared__ __align__(128) unsigned char smem[STAGES * 2 * BM * LDT * sizeof(bf16)];
    bf16* sA = reinterpret_cast<bf16*>(smem);
    bf16* sB = sA + STAGES * BM * LDT;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    // Each thread copies 2 16-byte chunks of A and 2 of B per stage (64 rows x 4 chunks each).
    const bf16* a_src[2];
    bool a_ok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = (tid + i * THREADS) / 4;
        a_ok[i] = r < rows;
        const int src_row = a_ok[i] ? (row_token ? row_token[p0 + r] : p0 + r) : 0;
        a_src[i] = X + (size_t)src_row * K + ((tid + i * THREADS) % 4) * 8;
    }
    auto load_stage = [&](int stage, int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + i * THREADS, r = c / 4, col = (c % 4) * 8;
            cp_async16(sA + (stage * BM + r) * LDT + col, a_src[i] + k0, a_ok[i]);
            cp_async16(sB + (stage * BN + r) * LDT + col, We + (size_t)r * K + k0 + col, true);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    const int nk = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < nk) load_stage(next % STAGES, next * BK);
        cp_async_commit();
        const bf16* a = sA + (kt % STAGES) * BM * LDT;
        const bf16* b = sB + (kt % STAGES) * BN * LDT;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], a + (wm + i * 16) * LDT + kk, LDT);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], b + (wn + j * 16) * LDT + kk, LDT);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    float* sC = reinterpret_cast<float*>(smem);  // reuses the pipeline buffers
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(sC + (wm + i * 16) * LDC + wn + j * 16, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < BM * BN / 2; i += THREADS) {
        const int r = i / (BN / 2), c = (i % (BN / 2)) * 2;
        if (r < rows) {
            __nv_bfloat162 v = __floats2bfloat162_rn(sC[r * LDC + c], sC[r * LDC + c + 1]);
            *reinterpret_cast<__nv_bfloat162*>(Y + (size_t)(p0 + r) * N + n0 + c) = v;
        }
    }
}
