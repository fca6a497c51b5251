// Grouped expert GEMM: every admitted expert's rows in one launch (docs/model.md §7.6).
//   Y[p, :] = X[src(p), :] . W[e]^T      for the rows p of each tile (e, p0, p1)
// X is [*, K] BF16 (src(p) = row_token[p] when a gather index is given, else p), W is [E, N, K]
// BF16 (PyTorch [out, in] per expert), Y is [rows, N] BF16 with F32 accumulation on tensor cores.
// The tile list comes from moe_dispatch on the device; CTAs past num_tiles exit at once.
//
// Two tile shapes: 16 rows (decode: a few rows per expert, the kernel streams weights and must
// keep many bytes in flight: 64-deep K steps, 4 stages) and 64 rows (prefill: weights are reused
// by many rows).
//
// The weight encoding is a template parameter (BITS): 16 reads BF16 rows; 8 and 4 read the
// `i8_mma` / `i4_mma` codes of a quantized checkpoint as stored, with their FP16 group scales
// (docs/model-format.md): a stage's codes are copied to shared memory as they are (a quarter or
// half of the BF16 bytes), then each weight becomes BF16(code x scale) in a BF16 tile that the
// same tensor-core loop multiplies. The order of the sum over K is the same for every encoding
// and every tile height, so quantized experts are batch-invariant too.
#include "common.cuh"
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;

namespace minnow_moe {
constexpr int BK = 64, THREADS = 128;  // THREADS and BN: the grouped kernels' tiles
constexpr int BN = 64;
constexpr int LDT = BK + 8;  // bf16 row pitch of the A and B tiles

// A BM x TBN output tile computed by WARPS_M x WARPS_N warps, STAGES deep, over weights of BITS
// bits (16: BF16 rows; 8 / 4: *_mma codes).
template <int BM, int TBN, int WARPS_M, int WARPS_N, int STAGES_, int BITS_ = 16>
struct Tile {
    static constexpr int BITS = BITS_;
    static constexpr int STAGES = STAGES_;
    static constexpr int N_COLS = TBN;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int LDC = TBN + 4;  // f32 row pitch of the epilogue tile
    static constexpr int a_bytes = BM * LDT * 2;
    // A stage's weights: the BF16 tile, or the codes as stored and their scales (8 rows of FP16
    // per band and group: at most BK / 16 groups of a stage, 16 bytes each).
    static constexpr int code_bytes = TBN * BK * BITS / 8;
    static constexpr int scale_bytes = TBN / 8 * (BK / 16) * 16;
    static constexpr int b_stage_bytes = BITS == 16 ? TBN * LDT * 2 : code_bytes + scale_bytes;
    static constexpr int stage_bytes = a_bytes + b_stage_bytes;
    // Quantized weights: the BF16 tile the codes of the current stage are decoded into.
    static constexpr int decoded_bytes = BITS == 16 ? 0 : TBN * LDT * 2;
    static constexpr int smem_bytes = STAGES * stage_bytes + decoded_bytes;
    static_assert(BM * LDC * 4 <= smem_bytes, "epilogue tile must fit in the pipeline buffers");
    static constexpr int WM = BM / WARPS_M / 16;   // 16-row fragments per warp
    static constexpr int WN = TBN / WARPS_N / 16;  // 16-col fragments per warp
    static constexpr int A_CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread
    static constexpr int B_CHUNKS = (BITS == 16 ? TBN * BK * 2 : code_bytes) / 16 / THREADS;
    static_assert(BITS != 16 || B_CHUNKS * 16 * THREADS == TBN * BK * 2, "BF16 weights: whole copies");
    static_assert(BITS == 16 || B_CHUNKS * 16 * THREADS == code_bytes, "codes: whole copies");
    static_assert(BITS == 16 || scale_bytes / 16 <= THREADS, "scales: one copy per thread at most");
};
// The grouped kernels' tiles: BM = 16: 4 warps side by side (16 x 16 each); BM = 64: 2 x 2 warps
// (32 x 32 each). The dense GEMM adds 128 x 128 tiles of 2 x 4 warps (64 x 32 each) for long
// forwards.
template <int BM, int STAGES, int BITS = 16>
using GroupedTile = Tile<BM, BN, BM == 16 ? 1 : 2, BM == 16 ? 4 : 2, STAGES, BITS>;
using WideTile = Tile<128, 128, 2, 4, 3>;

// A weight matrix as the kernels read it: BF16 rows `[E, N, K]` (`scales` null), or `*_mma`
// codes (tiles of 8 rows x 16 columns, `[E N / 8][K / 16][lane 0..32]`, 4 bytes per lane for
// INT8, 2 for INT4) with FP16 scales `[E N / 8][K / group][8]`.
struct WeightsRef {
    const void* w;
    const __half* scales;
    int group;
};
// Bytes of one 8 x 16 code tile.
template <int BITS>
__host__ __device__ constexpr int code_tile_bytes() { return 8 * 16 * BITS / 8; }

// The four weights lane `lane` of code tile (band, column tile) holds: row band * 8 + lane / 4,
// columns c0, c0 + 1, c0 + 8, c0 + 9 with c0 = 16 * tile + 2 (lane % 4); `raw` points at the
// lane's bytes. Decoded as BF16(code x scale), one rounding of the exact F32 product.
template <int BITS>
__device__ __forceinline__ void decode_lane(unsigned v, float scale, __nv_bfloat162& lo, __nv_bfloat162& hi) {
    int c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (BITS == 8)
            c[j] = (int)(signed char)(v >> (8 * j));
        else
            c[j] = (int)(v << (28 - 4 * j)) >> 28;  // sign-extended nibble j
    }
    lo = __floats2bfloat162_rn((float)c[0] * scale, (float)c[1] * scale);
    hi = __floats2bfloat162_rn((float)c[2] * scale, (float)c[3] * scale);
}
// The lane's code bytes at `raw` (4 for INT8, 2 for INT4) as one value.
template <int BITS>
__device__ __forceinline__ unsigned lane_codes(const unsigned char* raw) {
    if constexpr (BITS == 8)
        return *reinterpret_cast<const unsigned*>(raw);
    else
        return *reinterpret_cast<const unsigned short*>(raw);
}

// One BM x BN output tile: rows p0..p0 + rows of Y (X rows gathered through row_token when given)
// times columns n0..n0 + BN of expert e's weights. Every output is one F32 accumulator over K in
// BK-deep steps of m16n16k16 tensor-core products, in ascending K order, whatever BM, STAGES or
// the number of rows: the tile shape never changes an output's bits (the batch-invariant dense
// GEMM below runs the same tiles).
template <int BM, typename L>
__device__ void gemm_tile(const bf16* __restrict__ X, const int* __restrict__ row_token, WeightsRef W,
                          bf16* __restrict__ Y, int e, int p0, int rows, int n0, int N, int K) {
    constexpr int STAGES = L::STAGES, BITS = L::BITS;
    constexpr int THREADS = L::THREADS, BN = L::N_COLS, LDC = L::LDC;
    const bf16* We = reinterpret_cast<const bf16*>(W.w) + ((size_t)e * N + n0) * K;
    // Quantized: the first code band of this tile and the column tiles per band.
    const int band0 = (int)(((size_t)e * N + n0) / 8), k_tiles = K / 16;
    const unsigned char* codes = reinterpret_cast<const unsigned char*>(W.w);

    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* sbuf = smem;
    bf16* decoded = reinterpret_cast<bf16*>(smem + STAGES * L::stage_bytes);
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
        bf16* sA = reinterpret_cast<bf16*>(sbuf + stage * L::stage_bytes);
        unsigned char* sB = sbuf + stage * L::stage_bytes + L::a_bytes;
#pragma unroll
        for (int i = 0; i < L::A_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
            cp_async16(sA + r * LDT + col, a_src[i] + k0, a_ok[i] && k0 + col < K);
        }
        if constexpr (BITS == 16) {
#pragma unroll
            for (int i = 0; i < L::B_CHUNKS; ++i) {
                const int c = tid + i * THREADS, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
                cp_async16(reinterpret_cast<bf16*>(sB) + r * LDT + col, We + (size_t)r * K + k0 + col, k0 + col < K);
            }
        } else {
            // Per band of 8 rows, the stage's BK / 16 code tiles lie side by side in memory:
            // copied as they are to [band][column tile][tile bytes]. Tiles past K are zeros.
            constexpr int band_bytes = BK / 16 * code_tile_bytes<BITS>();
#pragma unroll
            for (int i = 0; i < L::B_CHUNKS; ++i) {
                const int c = tid + i * THREADS, byte = c * 16;
                const int band = byte / band_bytes, within = byte % band_bytes;
                const int kt = k0 / 16 + within / code_tile_bytes<BITS>();
                cp_async16(sB + byte,
                           codes + ((size_t)(band0 + band) * k_tiles + k0 / 16) * code_tile_bytes<BITS>() + within,
                           kt < k_tiles);
            }
            // The scales of the groups the stage's columns fall in, [band][group of the stage]
            // (16 bytes each: the band's 8 rows), fetched with the codes so the decode never
            // waits on memory.
            const int g0 = k0 / W.group, stage_groups = (BK + W.group - 1) / W.group;
            const int groups = K / W.group;
            if (tid < BN / 8 * stage_groups) {
                const int band = tid / stage_groups, g = g0 + tid % stage_groups;
                cp_async16(sB + L::code_bytes + tid * 16,
                           W.scales + ((size_t)(band0 + band) * groups + g) * 8, g < groups);
            }
        }
    };
    // Quantized weights: the codes of stage `stage` (columns k0..k0 + BK) as BF16(code x scale)
    // in `decoded` ([row][column], pitch LDT), zeros past K.
    auto decode_stage = [&](int stage, int k0) {
        const unsigned char* sB = sbuf + stage * L::stage_bytes + L::a_bytes;
        constexpr int lanes = BN / 8 * (BK / 16) * 32;
        for (int i = tid; i < lanes; i += THREADS) {
            const int band = i / (BK / 16 * 32), kt = (i / 32) % (BK / 16), lane = i % 32;
            const int row = band * 8 + lane / 4, c0 = kt * 16 + 2 * (lane % 4);
            __nv_bfloat162 lo, hi;
            if (k0 + kt * 16 < K) {
                const int stage_groups = (BK + W.group - 1) / W.group;
                const int g = (k0 + c0) / W.group - k0 / W.group;
                const __half* scales = reinterpret_cast<const __half*>(sB + L::code_bytes);
                const float scale = __half2float(scales[(band * stage_groups + g) * 8 + lane / 4]);
                decode_lane<BITS>(lane_codes<BITS>(sB + i * (BITS / 2)), scale, lo, hi);
            } else {
                lo = hi = __floats2bfloat162_rn(0.f, 0.f);
            }
            *reinterpret_cast<__nv_bfloat162*>(decoded + row * LDT + c0) = lo;
            *reinterpret_cast<__nv_bfloat162*>(decoded + row * LDT + c0 + 8) = hi;
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
        const bf16* a = reinterpret_cast<const bf16*>(sbuf + (kt % STAGES) * L::stage_bytes);
        const bf16* b = a + BM * LDT;
        if constexpr (BITS != 16) {
            decode_stage(kt % STAGES, kt * BK);
            __syncthreads();
            b = decoded;
        }
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
            gemm_tile<BM, GroupedTile<BM, STAGES>>(X, row_token, WeightsRef{W, nullptr, 0}, Y, t.x, t.y,  \
                                                   t.z - t.y, blockIdx.x * BN, N, K);                    \
    }
GROUPED_ENTRY(grouped_gemm_m16, 16, 4)
// The 16-row tile with 3 stages: 34.5 KB of shared memory instead of 46 KB, so 6 CTAs fit on a
// multiprocessor instead of 4 (one wave of 792 CTAs covers a decode step's 48 x 16 gate/up tiles).
GROUPED_ENTRY(grouped_gemm_m16s3, 16, 3)
GROUPED_ENTRY(grouped_gemm_m64, 64, 3)

// The 64-row grouped GEMM over `*_mma` codes (BITS 8 or 4) with FP16 scales of `group` columns
// (MINNOW_CODES_SMEM_DECODE=1 only: codes_tile below is the default for every tile height).
// grid, block and requirements as the BF16 kernels; dynamic shared memory =
// GroupedTile<BM, STAGES, BITS>::smem_bytes (grouped_gemm_quant_smem_bytes in ops.rs).
#define GROUPED_QUANT_ENTRY(NAME, BM, STAGES, BITS)                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                \
        NAME(const bf16* X, const int* row_token, const unsigned char* codes, const __half* scales,       \
             int group, bf16* Y, const int4* tiles, const int* num_tiles, int N, int K) {                \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (grouped_tile(tiles, num_tiles, t))                                                           \
            gemm_tile<BM, GroupedTile<BM, STAGES, BITS>>(X, row_token, WeightsRef{codes, scales, group}, \
                                                         Y, t.x, t.y, t.z - t.y, blockIdx.x * BN, N, K); \
    }
GROUPED_QUANT_ENTRY(grouped_gemm_i8_m64, 64, 3, 8)
GROUPED_QUANT_ENTRY(grouped_gemm_i4_m64, 64, 3, 4)
// The tiles over codes without a shared-memory round trip for the weights (16 rows for decoding
// and batched denoising steps, where the experts' bytes are the whole cost; 64 for prefill and
// large batches, each fragment then serving 4 16-row MMAs): the `*_mma` layout
// stores each lane's part of an mma.m16n8k16 B fragment contiguously, so every warp loads its
// fragments straight from global memory (128 or 64 contiguous bytes per tile and warp), decodes
// them in registers as BF16(code x scale) and multiplies. The tile's activation rows are staged
// in shared memory in chunks of CODES_KC columns (double-buffered), read with ldmatrix.
// 4 warps x 16 output columns (two n8 fragments each) = the BF16 kernels' 64-column tile. Each
// output is one F32 accumulator over K in ascending 16-column steps whatever the tile height
// (and the same chain as the shared-memory kernel above), so a row's bits do not depend on it.
namespace minnow_moe {
constexpr int CODES_KC = 256;            // activation columns per shared-memory chunk
constexpr int CODES_LDA = CODES_KC + 8;  // bf16 row pitch (ldmatrix rows on distinct banks)
constexpr int CODES_UNROLL = 8;          // 16-column steps whose fragments are loaded ahead

__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_a(unsigned (&r)[4], const bf16* p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ unsigned bf162_bits(__nv_bfloat162 v) { return *reinterpret_cast<unsigned*>(&v); }

template <int BITS, int MT>
__device__ void codes_tile(const bf16* __restrict__ X, const int* __restrict__ row_token,
                           const unsigned char* __restrict__ codes, const __half* __restrict__ scales, int group,
                           bf16* __restrict__ Y, int e, int p0, int rows, int n0, int N, int K) {
    constexpr int ROWS = 16 * MT, A_BUF = ROWS * CODES_LDA;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sA = reinterpret_cast<bf16*>(smem);  // [2][ROWS][CODES_LDA]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int k_tiles = K / 16, groups = K / group;
    const int group_shift = __ffs(group / 16) - 1;  // group / 16 is a power of two
    // This warp's two 8-row weight bands and the byte offset of this lane in their tiles.
    const size_t band = ((size_t)e * N + n0 + warp * 16) / 8;
    const unsigned char* tile0 = codes + band * k_tiles * code_tile_bytes<BITS>() + lane * (BITS / 2);
    const unsigned char* tile1 = tile0 + (size_t)k_tiles * code_tile_bytes<BITS>();
    const __half* scale0 = scales + band * groups * 8 + lane / 4;
    const __half* scale1 = scale0 + (size_t)groups * 8;

    // Activation rows: ROWS x CODES_KC columns per chunk in 16-byte copies, zeros past rows / K.
    constexpr int A_COPIES = ROWS * CODES_KC / 8 / THREADS;
    auto load_a = [&](int buf, int k0) {
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            const int c = tid + i * THREADS, r = c / (CODES_KC / 8), col = (c % (CODES_KC / 8)) * 8;
            const int src = r < rows ? (row_token ? row_token[p0 + r] : p0 + r) : 0;
            cp_async16(sA + buf * A_BUF + r * CODES_LDA + col, X + (size_t)src * K + k0 + col,
                       r < rows && k0 + col < K);
        }
        cp_async_commit();
    };
    float acc[MT][2][4] = {};
    const int chunks = (K + CODES_KC - 1) / CODES_KC;
    load_a(0, 0);
    for (int ch = 0; ch < chunks; ++ch) {
        if (ch + 1 < chunks) {
            load_a((ch + 1) & 1, (ch + 1) * CODES_KC);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* a_base = sA + (ch & 1) * A_BUF + (lane % 16) * CODES_LDA + (lane / 16) * 8;
        const int kt0 = ch * CODES_KC / 16, steps = min(CODES_KC / 16, k_tiles - kt0);
        for (int s0 = 0; s0 < steps; s0 += CODES_UNROLL) {
            // The fragments and scales of CODES_UNROLL steps, loaded before any is used.
            unsigned raw[CODES_UNROLL][2];
            float sc[CODES_UNROLL][2];
#pragma unroll
            for (int u = 0; u < CODES_UNROLL; ++u) {
                const int kt = min(kt0 + s0 + u, k_tiles - 1);  // in range; unused past `steps`
                const size_t off = (size_t)kt * code_tile_bytes<BITS>();
                raw[u][0] = lane_codes<BITS>(tile0 + off);
                raw[u][1] = lane_codes<BITS>(tile1 + off);
                const int g = kt >> group_shift;
                sc[u][0] = __half2float(scale0[g * 8]);
                sc[u][1] = __half2float(scale1[g * 8]);
            }
#pragma unroll
            for (int u = 0; u < CODES_UNROLL; ++u) {
                if (s0 + u < steps) {
                    unsigned b[2][2];
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        __nv_bfloat162 lo, hi;
                        decode_lane<BITS>(raw[u][j], sc[u][j], lo, hi);
                        b[j][0] = bf162_bits(lo);
                        b[j][1] = bf162_bits(hi);
                    }
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        unsigned a[4];
                        ldmatrix_a(a, a_base + m * 16 * CODES_LDA + (s0 + u) * 16);
#pragma unroll
                        for (int j = 0; j < 2; ++j) mma_16816(acc[m][j], a, b[j][0], b[j][1]);
                    }
                }
            }
        }
        __syncthreads();  // the buffer just read is the next chunk's target
    }
    // C fragment: acc[.][j][0..1] row lane / 4, [2..3] row lane / 4 + 8; columns 2 (lane % 4).
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int col = n0 + warp * 16 + j * 8 + 2 * (lane % 4);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m * 16 + lane / 4 + 8 * h;
                if (row < rows)
                    *reinterpret_cast<__nv_bfloat162*>(Y + (size_t)(p0 + row) * N + col) =
                        __floats2bfloat162_rn(acc[m][j][2 * h], acc[m][j][2 * h + 1]);
            }
        }
}
}  // namespace minnow_moe

// grid = (N / 64, max_tiles), block = 128, dynamic shared memory = 2 x 16 MT x CODES_LDA x 2
// bytes (codes_tile_smem_bytes in ops.rs); tiles cut at 16 MT rows.
#define GROUPED_CODES_ENTRY(NAME, BITS, MT)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                \
        NAME(const bf16* X, const int* row_token, const unsigned char* codes, const __half* scales,       \
             int group, bf16* Y, const int4* tiles, const int* num_tiles, int N, int K) {                \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (grouped_tile(tiles, num_tiles, t))                                                           \
            codes_tile<BITS, MT>(X, row_token, codes, scales, group, Y, t.x, t.y, t.z - t.y,             \
                                 blockIdx.x * BN, N, K);                                                 \
    }
GROUPED_CODES_ENTRY(grouped_gemm_i8_r16, 8, 1)
GROUPED_CODES_ENTRY(grouped_gemm_i4_r16, 4, 1)
GROUPED_CODES_ENTRY(grouped_gemm_i8_r64, 8, 4)
GROUPED_CODES_ENTRY(grouped_gemm_i4_r64, 4, 4)
static_assert(2 * 64 * CODES_LDA * 2 == 67584, "host mirror");

static_assert(GroupedTile<16, 4, 8>::smem_bytes == 4 * (16 * 72 * 2 + 64 * 64 + 512) + 64 * 72 * 2, "host mirror");
static_assert(GroupedTile<64, 3, 4>::smem_bytes == 3 * (64 * 72 * 2 + 64 * 32 + 512) + 64 * 72 * 2, "host mirror");

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
        gemm_tile<BM, TILE>(X, nullptr, WeightsRef{W, nullptr, 0}, Y, 0, p0, min(BM, M - p0),            \
                            blockIdx.y * TILE::N_COLS, N, K);                                            \
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

// The grouped GEMM over `*_mma` codes for shapes the tiled kernels refuse: as grouped_gemm_any,
// each weight decoded as BF16(code x scale) where it is read. grid = (ceil(N / 64), max_tiles),
// block = 64.
template <int BITS>
__device__ __forceinline__ float code_weight(const unsigned char* __restrict__ codes, const __half* __restrict__ scales,
                                             int group, size_t row, int k, int K) {
    const size_t band = row / 8;
    const int r = (int)(row % 8), kt = k / 16, c = k % 16;
    const int lane = r * 4 + (c % 8) / 2, slot = (c % 2) + (c >= 8 ? 2 : 0);
    const size_t index = ((band * (K / 16) + kt) * 32 + lane) * 4 + slot;  // in codes
    int code;
    if constexpr (BITS == 8) {
        code = (int)(signed char)codes[index];
    } else {
        const unsigned b = codes[index / 2];
        code = (int)((b >> (index % 2 ? 4 : 0)) << 28) >> 28;
    }
    const float scale = __half2float(scales[(band * (K / group) + k / group) * 8 + r]);
    return to_f32(to_bf16((float)code * scale));
}
template <int BITS>
__device__ __forceinline__ void gemm_any_tile_codes(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                                    const unsigned char* __restrict__ codes,
                                                    const __half* __restrict__ scales, int group, bf16* __restrict__ Y,
                                                    int e, int p_begin, int p_end, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t row = (size_t)e * N + n;
    for (int p = p_begin; p < p_end; ++p) {
        const bf16* x = X + (size_t)(row_token ? row_token[p] : p) * K;
        float acc = 0.f;
        for (int k = 0; k < K; ++k) acc += to_f32(x[k]) * code_weight<BITS>(codes, scales, group, row, k, K);
        Y[(size_t)p * N + n] = to_bf16(acc);
    }
}
#define GROUPED_QUANT_ANY_ENTRY(NAME, BITS)                                                              \
    extern "C" __global__ void NAME(const bf16* __restrict__ X, const int* __restrict__ row_token,       \
                                    const unsigned char* __restrict__ codes, const __half* __restrict__ scales, \
                                    int group, bf16* __restrict__ Y, const int4* __restrict__ tiles,     \
                                    const int* __restrict__ num_tiles, int N, int K) {                   \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (grouped_tile(tiles, num_tiles, t))                                                           \
            gemm_any_tile_codes<BITS>(X, row_token, codes, scales, group, Y, t.x, t.y, t.z, N, K);      \
    }
GROUPED_QUANT_ANY_ENTRY(grouped_gemm_i8_any, 8)
GROUPED_QUANT_ANY_ENTRY(grouped_gemm_i4_any, 4)
