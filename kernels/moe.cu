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
constexpr int BK = 64, THREADS = 128;  // THREADS and BN: the grouped kernels' tiles
constexpr int BN = 64;
constexpr int LDT = BK + 8;  // bf16 row pitch of the A and B tiles

// A BM x TBN output tile computed by WARPS_M x WARPS_N warps, STAGES deep.
template <int BM, int TBN, int WARPS_M, int WARPS_N, int STAGES>
struct Tile {
    static constexpr int N_COLS = TBN;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int LDC = TBN + 4;  // f32 row pitch of the epilogue tile
    static constexpr int stage_elems = (BM + TBN) * LDT;
    static constexpr int smem_bytes = STAGES * stage_elems * 2;
    static_assert(BM * LDC * 4 <= smem_bytes, "epilogue tile must fit in the pipeline buffers");
    static constexpr int WM = BM / WARPS_M / 16;   // 16-row fragments per warp
    static constexpr int WN = TBN / WARPS_N / 16;  // 16-col fragments per warp
    static constexpr int A_CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread
    static constexpr int B_CHUNKS = TBN * BK / 8 / THREADS;
};
// The grouped kernels' tiles: BM = 16: 4 warps side by side (16 x 16 each); BM = 64: 2 x 2 warps
// (32 x 32 each). The dense GEMM adds 128 x 128 tiles of 2 x 4 warps (64 x 32 each) for long
// forwards.
template <int BM, int STAGES>
using GroupedTile = Tile<BM, BN, BM == 16 ? 1 : 2, BM == 16 ? 4 : 2, STAGES>;
using WideTile = Tile<128, 128, 2, 4, 3>;

// One BM x BN output tile: rows p0..p0 + rows of Y (X rows gathered through row_token when given)
// times columns n0..n0 + BN of expert e's weights. Every output is one F32 accumulator over K in
// BK-deep steps of m16n16k16 tensor-core products, in ascending K order, whatever BM, STAGES or
// the number of rows: the tile shape never changes an output's bits (the batch-invariant dense
// GEMM below runs the same tiles).
template <int BM, typename L>
__device__ void gemm_tile(const bf16* __restrict__ X, const int* __restrict__ row_token, const bf16* __restrict__ W,
                          bf16* __restrict__ Y, int e, int p0, int rows, int n0, int N, int K) {
    constexpr int STAGES = L::smem_bytes / (L::stage_elems * 2);
    constexpr int THREADS = L::THREADS, BN = L::N_COLS, LDC = L::LDC;
    const bf16* We = W + ((size_t)e * N + n0) * K;

    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sbuf = reinterpret_cast<bf16*>(smem);
    const int tid = threadIdx.x, warp = tid >> 5;
    constexpr int WARPS_N = BN / 16 / L::WN;
    const int wm = (warp / WARPS_N) * L::WM * 16;
    const int wn = (warp % WARPS_N) * L::WN * 16;

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

// The tile of grouped GEMM CTA blockIdx.y (from the device-side dispatch); false when the CTA
// has none.
__device__ __forceinline__ bool grouped_tile(const int4* __restrict__ tiles, const int* __restrict__ num_tiles,
                                             int4& tile) {
    if ((int)blockIdx.y >= num_tiles[0]) return false;
    tile = tiles[blockIdx.y];
    return true;
}

// grid = (N / 64, max_tiles), block = 128, dynamic shared memory = GroupedTile<BM, STAGES>::smem_bytes
// (mirrored by grouped_gemm_smem_bytes in crates/minnow-runtime/src/cuda/ops.rs).
// Requires N % 64 == 0 and K % 32 == 0; the tiles must have been cut at BM rows.
#define GROUPED_ENTRY(NAME, BM, STAGES)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                \
        NAME(const bf16* X, const int* row_token, const bf16* W, bf16* Y, const int4* tiles,             \
             const int* num_tiles, int N, int K) {                                                       \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (grouped_tile(tiles, num_tiles, t))                                                           \
            gemm_tile<BM, GroupedTile<BM, STAGES>>(X, row_token, W, Y, t.x, t.y, t.z - t.y, blockIdx.x * BN, \
                                                   N, K);                                                \
    }
GROUPED_ENTRY(grouped_gemm_m16, 16, 4)
// The 16-row tile with 3 stages: 34.5 KB of shared memory instead of 46 KB, so 6 CTAs fit on a
// multiprocessor instead of 4 (one wave of 792 CTAs covers a decode step's 48 x 16 gate/up tiles).
GROUPED_ENTRY(grouped_gemm_m16s3, 16, 3)
GROUPED_ENTRY(grouped_gemm_m64, 64, 3)

// The batch-invariant dense GEMM Y[M, N] = X[M, K] . W[N, K]^T (BF16 in and out, F32
// accumulation): the grouped GEMM's tiles over one "expert", so a dense projection, a packed
// shared expert and a routed expert all compute an output with the same arithmetic, and no row's
// result depends on M. grid = (ceil(M / BM), N / 64): the row tiles of one weight panel are
// neighbours in launch order, so the panel is read from memory once and from L2 by the others.
#define DENSE_ENTRY(NAME, BM, TILE)                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE::THREADS)                                          \
        NAME(const bf16* X, const bf16* W, bf16* Y, int M, int N, int K) {                                \
        pdl_enter();                                                                                     \
        const int p0 = blockIdx.x * BM;                                                                  \
        gemm_tile<BM, TILE>(X, nullptr, W, Y, 0, p0, min(BM, M - p0), blockIdx.y * TILE::N_COLS, N, K);  \
    }
using DenseTile16 = GroupedTile<16, 3>;
using DenseTile64 = GroupedTile<64, 3>;
DENSE_ENTRY(dense_gemm_m16, 16, DenseTile16)
DENSE_ENTRY(dense_gemm_m64, 64, DenseTile64)
// 128 x 128 tiles (256 threads, 110.6 KB of shared memory): N % 128 == 0.
DENSE_ENTRY(dense_gemm_m128, 128, WideTile)
static_assert(GroupedTile<16, 4>::smem_bytes == 4 * 80 * 72 * 2, "host mirror");
static_assert(GroupedTile<64, 3>::smem_bytes == 3 * 128 * 72 * 2, "host mirror");
static_assert(WideTile::smem_bytes == 3 * 256 * 72 * 2, "host mirror");

// The grouped GEMM for shapes the tiled kernels refuse (N not a multiple of 64 or K not a multiple
// of 32, e.g. 24-wide experts): one thread per output column of a tile, each walking the tile's
// rows with an F32 dot product over K. Slow but general; same tiles, gather and rounding (one BF16
// rounding of the F32 sum) as grouped_gemm_m*. grid = (ceil(N / 64), max_tiles), block = 64.
__device__ __forceinline__ void gemm_any_tile(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                              const bf16* __restrict__ W, bf16* __restrict__ Y, int e, int p_begin,
                                              int p_end, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const bf16* w = W + ((size_t)e * N + n) * K;
    for (int p = p_begin; p < p_end; ++p) {
        const bf16* x = X + (size_t)(row_token ? row_token[p] : p) * K;
        float acc = 0.f;
        for (int k = 0; k < K; ++k) acc += to_f32(x[k]) * to_f32(w[k]);
        Y[(size_t)p * N + n] = to_bf16(acc);
    }
}
extern "C" __global__ void grouped_gemm_any(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                            const bf16* __restrict__ W, bf16* __restrict__ Y,
                                            const int4* __restrict__ tiles, const int* __restrict__ num_tiles,
                                            int N, int K) {
    pdl_enter();
    int4 t;
    if (grouped_tile(tiles, num_tiles, t)) gemm_any_tile(X, row_token, W, Y, t.x, t.y, t.z, N, K);
}
// The dense GEMM for the same shapes: rows in 16-row tiles. grid = (ceil(N / 64), ceil(M / 16)),
// block = 64.
extern "C" __global__ void dense_gemm_any(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                          bf16* __restrict__ Y, int M, int N, int K) {
    pdl_enter();
    const int p0 = blockIdx.y * 16;
    gemm_any_tile(X, nullptr, W, Y, 0, p0, min(p0 + 16, M), N, K);
}
