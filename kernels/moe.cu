// Grouped expert GEMM: every admitted expert's rows in one launch (docs/llada2-model.md §7.6).
//   Y[p, :] = X[src(p), :] . W[e]^T      for the rows p of each tile (e, p0, p1)
// X is [*, K] BF16 (src(p) = row_token[p] when a gather index is given, else p), W is [E, N, K]
// BF16 (PyTorch [out, in] per expert), Y is [rows, N] BF16 with F32 accumulation on tensor cores.
// The tile list comes from moe_dispatch on the device; CTAs past num_tiles exit at once.
//
// Two tile shapes: 16 rows (decode: a few rows per expert, the kernel streams weights and must
// keep many bytes in flight: 64-deep K steps, 4 stages) and 64 rows (prefill: weights are reused
// by many rows).
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

namespace minnow_moe {
constexpr int BN = 64, BK = 64, THREADS = 128;
constexpr int LDT = BK + 8;  // bf16 row pitch of the A and B tiles
constexpr int LDC = BN + 4;  // f32 row pitch of the epilogue tile

template <int BM, int STAGES>
struct Tile {
    static constexpr int stage_elems = (BM + BN) * LDT;
    static constexpr int smem_bytes = STAGES * stage_elems * 2;
    static_assert(BM * LDC * 4 <= smem_bytes, "epilogue tile must fit in the pipeline buffers");
    // Warp layout: BM = 16: 4 warps side by side (16 x 16 each); BM = 64: 2 x 2 warps (32 x 32).
    static constexpr int WM = BM == 16 ? 1 : 2;  // 16-row fragments per warp
    static constexpr int WN = BM == 16 ? 1 : 2;  // 16-col fragments per warp
    static constexpr int A_CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread
    static constexpr int B_CHUNKS = BN * BK / 8 / THREADS;
};

template <int BM, int STAGES>
__device__ void grouped_gemm_tile(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                  const bf16* __restrict__ W, bf16* __restrict__ Y, const int4* __restrict__ tiles,
                                  const int* __restrict__ num_tiles, int N, int K) {
    using L = Tile<BM, STAGES>;
    if ((int)blockIdx.y >= num_tiles[0]) return;
    const int4 tile = tiles[blockIdx.y];
    const int e = tile.x, p0 = tile.y, rows = tile.z - tile.y;
    const int n0 = blockIdx.x * BN;
    const bf16* We = W + ((size_t)e * N + n0) * K;

    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sbuf = reinterpret_cast<bf16*>(smem);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = BM == 16 ? 0 : (warp >> 1) * 32;
    const int wn = BM == 16 ? warp * 16 : (warp & 1) * 32;

    const bf16* a_src[L::A_CHUNKS < 1 ? 1 : L::A_CHUNKS];
    bool a_ok[L::A_CHUNKS < 1 ? 1 : L::A_CHUNKS];
#pragma unroll
    for (int i = 0; i < L::A_CHUNKS; ++i) {
        const int c = tid + i * THREADS, r = c / (BK / 8);
        a_ok[i] = r < rows;
        const int src_row = a_ok[i] ? (row_token ? row_token[p0 + r] : p0 + r) : 0;
        a_src[i] = X + (size_t)src_row * K + (c % (BK / 8)) * 8;
    }
    // K need only be a multiple of 32 (tiny models): columns past K are zero-filled.
    auto load_stage = [&](int stage, int k0) {
        bf16* sA = sbuf + stage * L::stage_elems;
        bf16* sB = sA + BM * LDT;
#pragma unroll
        for (int i = 0; i < L::A_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
            cp_async16(sA + r * LDT + col, a_src[i] + k0, a_ok[i] && k0 + col < K);
        }
#pragma unroll
        for (int i = 0; i < L::B_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
            cp_async16(sB + r * LDT + col, We + (size_t)r * K + k0 + col, k0 + col < K);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[L::WM][L::WN];
#pragma unroll
    for (int i = 0; i < L::WM; ++i)
#pragma unroll
        for (int j = 0; j < L::WN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    const int nk = (K + BK - 1) / BK;
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
        const bf16* a = sbuf + (kt % STAGES) * L::stage_elems;
        const bf16* b = a + BM * LDT;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[L::WM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[L::WN];
#pragma unroll
            for (int i = 0; i < L::WM; ++i) wmma::load_matrix_sync(fa[i], a + (wm + i * 16) * LDT + kk, LDT);
#pragma unroll
            for (int j = 0; j < L::WN; ++j) wmma::load_matrix_sync(fb[j], b + (wn + j * 16) * LDT + kk, LDT);
#pragma unroll
            for (int i = 0; i < L::WM; ++i)
#pragma unroll
                for (int j = 0; j < L::WN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    float* sC = reinterpret_cast<float*>(smem);  // reuses the pipeline buffers
#pragma unroll
    for (int i = 0; i < L::WM; ++i)
#pragma unroll
        for (int j = 0; j < L::WN; ++j)
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
}  // namespace minnow_moe
using namespace minnow_moe;

// grid = (N / 64, max_tiles), block = 128, dynamic shared memory = Tile<BM, STAGES>::smem_bytes
// (mirrored by grouped_gemm_smem_bytes in crates/minnow-runtime/src/cuda/ops.rs).
// Requires N % 64 == 0 and K % 32 == 0; the tiles must have been cut at BM rows.
extern "C" __global__ void __launch_bounds__(THREADS)
    grouped_gemm_m16(const bf16* X, const int* row_token, const bf16* W, bf16* Y, const int4* tiles,
                     const int* num_tiles, int N, int K) {
    pdl_enter();
    grouped_gemm_tile<16, 4>(X, row_token, W, Y, tiles, num_tiles, N, K);
}
// The 16-row tile with 3 stages: 34.5 KB of shared memory instead of 46 KB, so 6 CTAs fit on a
// multiprocessor instead of 4 (one wave of 792 CTAs covers a decode step's 48 x 16 gate/up tiles).
extern "C" __global__ void __launch_bounds__(THREADS)
    grouped_gemm_m16s3(const bf16* X, const int* row_token, const bf16* W, bf16* Y, const int4* tiles,
                       const int* num_tiles, int N, int K) {
    pdl_enter();
    grouped_gemm_tile<16, 3>(X, row_token, W, Y, tiles, num_tiles, N, K);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    grouped_gemm_m64(const bf16* X, const int* row_token, const bf16* W, bf16* Y, const int4* tiles,
                     const int* num_tiles, int N, int K) {
    pdl_enter();
    grouped_gemm_tile<64, 3>(X, row_token, W, Y, tiles, num_tiles, N, K);
}
static_assert(Tile<16, 4>::smem_bytes == 4 * 80 * 72 * 2, "host mirror");
static_assert(Tile<64, 3>::smem_bytes == 3 * 128 * 72 * 2, "host mirror");

// The grouped GEMM for shapes the tiled kernels refuse (N not a multiple of 64 or K not a multiple
// of 32, e.g. 24-wide experts): one thread per output column of a tile, each walking the tile's
// rows with an F32 dot product over K. Slow but general; same tiles, gather and rounding (one BF16
// rounding of the F32 sum) as grouped_gemm_m*. grid = (ceil(N / 64), max_tiles), block = 64.
extern "C" __global__ void grouped_gemm_any(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                            const bf16* __restrict__ W, bf16* __restrict__ Y,
                                            const int4* __restrict__ tiles, const int* __restrict__ num_tiles,
                                            int N, int K) {
    pdl_enter();
    if ((int)blockIdx.y >= num_tiles[0]) return;
    const int4 tile = tiles[blockIdx.y];
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const bf16* w = W + ((size_t)tile.x * N + n) * K;
    for (int p = tile.y; p < tile.z; ++p) {
        const bf16* x = X + (size_t)(row_token ? row_token[p] : p) * K;
        float acc = 0.f;
        for (int k = 0; k < K; ++k) acc += to_f32(x[k]) * to_f32(w[k]);
        Y[(size_t)p * N + n] = to_bf16(acc);
    }
}
