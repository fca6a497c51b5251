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
// Quantized experts (`i8_mma` / `i4_mma` codes with FP16 group scales, docs/model-format.md)
// have their own tiles below (minnow_codes).
#include "codes.cuh"
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;

namespace minnow_moe {
constexpr int BK = 64, THREADS = 128;  // THREADS and BN: the grouped kernels' tiles
constexpr int BN = 64;
constexpr int LDT = BK + 8;  // bf16 row pitch of the A and B tiles

// A BM x TBN output tile computed by WARPS_M x WARPS_N warps, STAGES deep.
template <int BM, int TBN, int WARPS_M, int WARPS_N, int STAGES_>
struct Tile {
    static constexpr int STAGES = STAGES_;
    static constexpr int N_COLS = TBN;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int LDC = TBN + 4;  // f32 row pitch of the epilogue tile
    static constexpr int a_bytes = BM * LDT * 2;
    static constexpr int stage_bytes = a_bytes + TBN * LDT * 2;
    static constexpr int smem_bytes = STAGES * stage_bytes;
    static_assert(BM * LDC * 4 <= smem_bytes, "epilogue tile must fit in the pipeline buffers");
    static constexpr int WM = BM / WARPS_M / 16;   // 16-row fragments per warp
    static constexpr int WN = TBN / WARPS_N / 16;  // 16-col fragments per warp
    static constexpr int A_CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread
    static constexpr int B_CHUNKS = TBN * BK * 2 / 16 / THREADS;
    static_assert(B_CHUNKS * 16 * THREADS == TBN * BK * 2, "weights: whole copies");
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
    constexpr int STAGES = L::STAGES;
    constexpr int THREADS = L::THREADS, BN = L::N_COLS, LDC = L::LDC;
    const bf16* We = W + ((size_t)e * N + n0) * K;

    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* sbuf = smem;
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
#pragma unroll
        for (int i = 0; i < L::B_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
            cp_async16(reinterpret_cast<bf16*>(sB) + r * LDT + col, We + (size_t)r * K + k0 + col, k0 + col < K);
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
// grouped_tile for a launch whose tile list was written before the kernel queued just before it
// (a down projection: the dispatch, then gate/up): read before pdl_enter, from L2 (ld.global.cg),
// where the dispatch's writes are, since that kernel started only once every CTA of the one
// before it had waited for the dispatch to finish.
__device__ __forceinline__ bool grouped_tile_settled(const int4* __restrict__ tiles, const int* __restrict__ num_tiles,
                                                     int4& tile) {
    if ((int)blockIdx.y >= __ldcg(num_tiles)) return false;
    tile = __ldcg(tiles + blockIdx.y);
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
            gemm_tile<BM, GroupedTile<BM, STAGES>>(X, row_token, W, Y, t.x, t.y,  \
                                                   t.z - t.y, blockIdx.x * BN, N, K);                    \
    }
GROUPED_ENTRY(grouped_gemm_m16, 16, 4)
// The 16-row tile with 3 stages: 34.5 KB of shared memory instead of 46 KB, so 6 CTAs fit on a
// multiprocessor instead of 4 (one wave of 792 CTAs covers a decode step's 48 x 16 gate/up tiles).
GROUPED_ENTRY(grouped_gemm_m16s3, 16, 3)
GROUPED_ENTRY(grouped_gemm_m64, 64, 3)

// The grouped GEMM over `*_mma` codes (BITS 8 or 4) with FP16 scales of `group` columns, for
// 16-row tiles (decoding and batched denoising steps, where the experts' bytes are the whole
// cost) and 64-row tiles (prefill and large batches).
//
// The weights are the A operand of mma.m16n8k16 and the tile's tokens the B operand: the `*_mma`
// layout stores each lane's part of an n8 x k16 fragment of one 8-row band, and two bands side
// by side are exactly a lane's part of an m16 x k16 A fragment, so one product covers 16 output
// columns and 8 tokens, and token groups of 8 with no row are skipped. Codes, scales and
// activation rows stream through shared memory in STAGES stages of 128 columns (cp.async), so
// many bytes are in flight whatever the rows per expert (a packed shared expert's BF16 tiles:
// stages of 32 or 64 columns, see Stage); each lane reads its codes from shared
// memory and turns them into exact BF16 integers (INT4: two logic operations and one BF16
// subtraction per pair; INT8: through F32's exact 2^23 + integer). The scale is applied to the
// F32 partial sum of each group: part = codes . x over the group's 16-column steps (tensor cores,
// F32), then acc = fma(part, scale, acc). So every output is one fixed chain over K, whatever the
// tile height or the other rows of the tile: quantized experts are batch-invariant, and no weight
// is rounded to BF16 on the way (the product of code and scale is never formed).
//
// E2M1 (NVFP4 repacked at load, ENC = E2M1): 4-bit sign-magnitude E2M1 codes in the INT4
// positions, one BF16 scale (an E4M3 value, exact in BF16) per 16 columns in the FP16 scales'
// place, and one F32 factor per 8-row band (the matrix's global scale). Each code becomes its
// exact BF16 value through a byte lookup, times its block scale in BF16, which is exact (E2M1 x
// E4M3 has at most 5 significant bits): the tensor cores see the stored weights over the global
// scale, unrounded, and the band's factor multiplies the F32 sum once, at the end.
//
// E4M3 (our `fp8_e4m3_b128`, repacked at load): one E4M3 byte per weight at the INT8 positions,
// groups of up to 128 columns (each inside one 128 x 128 block), and in the FP16 scales' 16
// bytes per (band, group) the group's block's F32 scale (four copies; a block covers 16 bands).
// Each code becomes its exact BF16 value (every E4M3 value is one) and the block scale multiplies
// each group's F32 sum, as for integers. The codes' layout and decoders live in codes.cuh.
namespace minnow_codes {
constexpr int THREADS = 256;       // 8 warps, 16 output columns (two bands of 8) each
constexpr int FEATURES = 128;      // output columns per CTA (a tile's activations serve them all)
constexpr int BANDS = FEATURES / 8;

// One stage's shared memory: [band][step][tile] codes, [band][group of the stage][8] FP16
// scales (at most SK groups: group >= 16; none for BF16), then [row][LDX] activations.
template <int BITS, int ROWS>
struct Stage {
    // 16-column steps per stage. A packed shared expert's BF16 tiles (4x the bytes of INT4)
    // take 32 columns in 16-row tiles and 64 in 64-row tiles: what fits the smaller encoding's
    // allocation, and long stages keep the 64-row ones (the last slot, so they start last) from
    // trailing behind the codes.
    static constexpr int SK = BITS == 16 ? (ROWS == 64 ? 4 : 2) : 8;
    static constexpr int LDX = SK * 16 + 8;  // bf16 pitch of the activation rows (ldmatrix on distinct banks)
    static constexpr int code_bytes = BANDS * SK * tile_bytes<BITS>();
    static constexpr int scale_bytes = BITS == 16 ? 0 : BANDS * SK * 16;
    static constexpr int x_bytes = ROWS * LDX * 2;
    static constexpr int bytes = code_bytes + scale_bytes + x_bytes;
};

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* p) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// One tile: rows p0..p0 + rows (gathered through row_token when given) times output columns
// n0..n0 + 128 of expert e, or, `gated`, silu_mul of the gate and up columns n0 / 2 .. n0 / 2 +
// 64 (band_of_slot; Y's row pitch N / 2). NT: token groups of 8 in the tile (2: 16-row tiles, 8:
// 64-row tiles); ACTIVE: the groups computed (at least those with a row; the others' products
// are never stored, so computing them changes no output); GS: the group's 16-column steps when
// known at compile time (where each group's sum is scaled is then fixed in the unrolled steps,
// no test and branch per step), 0 when read from `group`.
template <int BITS, int ENC, int NT, int STAGES, int ACTIVE, int GS>
__device__ void codes_tile(const bf16* __restrict__ X, const int* __restrict__ row_token,
                           const unsigned char* __restrict__ codes, const __half* __restrict__ scales, int group,
                           const float* __restrict__ band_scale, bf16* __restrict__ Y, int e, int p0, int rows,
                           int n0, int N, int K, int gated, bool settled) {
    static_assert(ENC != E2M1 || BITS == 4, "E2M1 codes are 4 bits");
    static_assert(ENC != E4M3 || BITS == 8, "E4M3 codes are 8 bits");
    // Integer and E4M3 codes scale each group's F32 sum; BF16 weights have no scales; E2M1 codes
    // take their block scale before the product.
    constexpr bool SCALED_SUMS = BITS != 16 && ENC != E2M1;
    constexpr int ROWS = 8 * NT, TB = tile_bytes<BITS>();
    using S = Stage<BITS, ROWS>;
    constexpr int SK = S::SK, LDX = S::LDX;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // group and gsteps are powers of two: their quotients are shifts.
    const int gshift = __ffs(group) - 1 - 4, k_tiles = K / 16, groups = K >> (gshift + 4);
    const int gsteps = 1 << gshift;
    const size_t expert_band0 = (size_t)e * (N / 8);
    const int stages_k = (k_tiles + SK - 1) / SK;
    const bool warp_live = n0 + warp * 16 < N;

    // Every copy this thread makes per stage, addressed once for the whole tile: the stages only
    // add their own offset (the 64-bit products and the band arithmetic are not redone per stage).
    // Codes: per band, the stage's SK tiles lie side by side in memory; tiles past K are zeros.
    // Copy i takes band band0 + i * COPY_BANDS at the same place within it (COPY_BANDS: bands per
    // THREADS copies); band_of_slot steps those by a fixed number of the expert's bands (half as
    // many when gated), and slot_live holds for a prefix of them.
    constexpr int CODE_COPIES = S::code_bytes / 16 / THREADS, COPY_BANDS = THREADS * 16 / (SK * TB);
    static_assert(CODE_COPIES * 16 * THREADS == S::code_bytes, "codes: whole copies");
    static_assert(COPY_BANDS % 2 == 0 || CODE_COPIES == 1, "gated copies step whole gate/up pairs");
    const int band0 = tid * 16 / (SK * TB), within = tid * 16 % (SK * TB), code_step = within / TB;
    const unsigned char* code_src = codes + (expert_band0 + band_of_slot(band0, n0, N, gated)) * k_tiles * TB + within;
    const int code_stride = (gated ? COPY_BANDS / 2 : COPY_BANDS) * k_tiles * TB;
    int code_live = 0;  // copies 0 .. code_live - 1 read inside the matrix
#pragma unroll
    for (int i = 0; i < CODE_COPIES; ++i) code_live += slot_live(band0 + i * COPY_BANDS, n0, N, gated);
    // Scales of the groups a stage's columns fall in: thread tid < BANDS * SK copies [band][j] =
    // group kt0 / gsteps + j of band tid / SK, j = tid % SK.
    const int scale_j = tid % SK;
    const bool scale_live = BITS != 16 && tid < BANDS * SK && slot_live(tid / SK, n0, N, gated);
    const __half* scale_src =
        scales + ((expert_band0 + (scale_live ? band_of_slot(tid / SK, n0, N, gated) : 0)) * groups + scale_j) * 8;

    // A stage's copies: the weights (codes and scales), then the activation rows.
    auto load_weights = [&](int buf, int st) {
        unsigned char* base = smem + buf * S::bytes;
        const int kt0 = st * SK;
#pragma unroll
        for (int i = 0; i < CODE_COPIES; ++i)
            cp_async16(base + (tid + i * THREADS) * 16, code_src + i * code_stride + kt0 * TB,
                       i < code_live && kt0 + code_step < k_tiles);
        if (BITS != 16 && tid < BANDS * SK) {
            const int g_first = kt0 >> gshift, g_last = ((min(kt0 + SK, k_tiles) * 16 - 1) >> (gshift + 4));
            cp_async16(base + S::code_bytes + tid * 16, scale_src + g_first * 8,
                       scale_live && g_first + scale_j <= g_last);
        }
    };
    // `settled`: the tile came before pdl_enter (grouped_tile_settled), so the first stages'
    // weights, which no kernel writes, start streaming while the kernel before (gate/up, whose
    // output is this launch's rows) finishes; the rows wait for it. Same copies, same products.
    if (settled) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s)
            if (s < stages_k) load_weights(s, s);
        pdl_enter();
    }

    // The activation copies of this thread: ROWS x 16 copies of 16 bytes per stage; rows past
    // `rows` are never copied (their columns of the products are never stored).
    constexpr int X_COPIES = (ROWS * SK * 2 + THREADS - 1) / THREADS;
    static_assert(X_COPIES * THREADS == ROWS * SK * 2 || X_COPIES == 1, "activations: whole copies");
    const bf16* x_src[X_COPIES];
    bool x_ok[X_COPIES];
#pragma unroll
    for (int i = 0; i < X_COPIES; ++i) {
        const int r = (tid + i * THREADS) / (SK * 2);
        x_ok[i] = r < rows && r < ROWS;
        x_src[i] = X + (size_t)(x_ok[i] ? (row_token ? row_token[p0 + r] : p0 + r) : 0) * K +
                   ((tid + i * THREADS) % (SK * 2)) * 8;
    }
    auto load_rows = [&](int buf, int st) {
        bf16* sx = reinterpret_cast<bf16*>(smem + buf * S::bytes + S::code_bytes + S::scale_bytes);
        const int kt0 = st * SK;
#pragma unroll
        for (int i = 0; i < X_COPIES; ++i) {
            const int c = tid + i * THREADS, r = c / (SK * 2), col = (c % (SK * 2)) * 8;
            if (x_ok[i]) cp_async16(sx + r * LDX + col, x_src[i] + kt0 * 16, kt0 * 16 + col < K);
        }
    };

    // part: the current group's F32 sums (tensor cores); acc: the scaled sum of whole groups.
    float acc[ACTIVE][4], part[ACTIVE][4];
#pragma unroll
    for (int t = 0; t < ACTIVE; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = part[t][i] = 0.f;

    // (Settled: the weights of the first stages joined the first commit group, so each stage is
    // still whole when its own group completes.)
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < stages_k) {
            if (!settled) load_weights(s, s);
            load_rows(s, s);
        }
        cp_async_commit();
    }
    for (int st = 0; st < stages_k; ++st) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = st + STAGES - 1;
        if (next < stages_k) {
            load_weights(next % STAGES, next);
            load_rows(next % STAGES, next);
        }
        cp_async_commit();

        const unsigned char* base = smem + (st % STAGES) * S::bytes;
        // (4-bit codes: the lane's word of steps s, s + 1 at s * TB, s even; codes.cuh.)
        const unsigned char* code0 = base + (2 * warp) * SK * TB + lane * (BITS == 4 ? 4 : BITS / 2);
        const unsigned char* code1 = code0 + SK * TB;
        const __half* scale0 = reinterpret_cast<const __half*>(base + S::code_bytes) + (2 * warp) * SK * 8 + lane / 4;
        const __half* scale1 = scale0 + SK * 8;
        // ldmatrix rows: lanes 0-7 / 8-15 / 16-23 / 24-31 give tokens 0-7 of columns 0-7 / 8-15,
        // then tokens 8-15 of the same: the B fragments of two token groups.
        const bf16* xrow = reinterpret_cast<const bf16*>(base + S::code_bytes + S::scale_bytes) +
                           ((lane & 7) + ((lane >> 4) << 3)) * LDX + ((lane >> 3) & 1) * 8;
        // Every step of the stage, also past K in the last one: there codes, scales and the
        // activations of the tile's rows are zeros, which leave acc unchanged. A warp past N
        // (the CTA's last 128 columns cut short) only helps copy.
        if (!warp_live) continue;
        static_assert(BITS != 4 || SK % WORD_STEPS == 0, "4-bit stages hold whole words");
        unsigned a[4], a_next[4];  // 4-bit codes: step s + 1's fragment, decoded with step s's
#pragma unroll
        for (int s = 0; s < SK; ++s) {
            if constexpr (BITS == 4) {
                if (s % 2 == 0) {
                    const unsigned w0 = *reinterpret_cast<const unsigned*>(code0 + s * TB);
                    const unsigned w1 = *reinterpret_cast<const unsigned*>(code1 + s * TB);
                    // E2M1's groups of 16: each step's block scale (BF16 bits) per band.
                    decode_words<ENC>(w0, w1, reinterpret_cast<const unsigned short*>(scale0) + s * 8,
                                      reinterpret_cast<const unsigned short*>(scale1) + s * 8, a, a_next);
                } else {
#pragma unroll
                    for (int i = 0; i < 4; ++i) a[i] = a_next[i];
                }
            } else if constexpr (ENC == E4M3) {
                decode_e4m3(code0 + s * TB, a[0], a[2]);
                decode_e4m3(code1 + s * TB, a[1], a[3]);
            } else {
                decode_pairs<BITS>(code0 + s * TB, a[0], a[2]);
                decode_pairs<BITS>(code1 + s * TB, a[1], a[3]);
            }
#pragma unroll
            for (int t = 0; t < ACTIVE; t += 2) {
                unsigned b[4];
                ldmatrix_x4(b, xrow + t * 8 * LDX + s * 16);
                mma16816(part[t], a, b[0], b[1]);
                if (t + 1 < ACTIVE) mma16816(part[t + 1], a, b[2], b[3]);
            }
            // BF16 weights and E2M1 codes: their sum is part alone. A stage starts a group (SK
            // is a multiple of every scaled group's steps), so step s ends one when s + 1 is a
            // multiple of the group's steps, and g, the stage's s / gsteps, is its scale slot.
            const bool group_end = GS ? (s + 1) % GS == 0 : ((s + 1) & (gsteps - 1)) == 0;
            if (SCALED_SUMS && group_end) {
                const int g = GS ? s / GS : s >> gshift;
                float s0, s1;
                if constexpr (ENC == E4M3) {  // the 128 x 128 block's F32 scale, first of four
                    const float* f0 = reinterpret_cast<const float*>(base + S::code_bytes) + (2 * warp) * SK * 4;
                    s0 = f0[g * 4];
                    s1 = f0[SK * 4 + g * 4];
                } else {
                    s0 = __half2float(scale0[g * 8]);
                    s1 = __half2float(scale1[g * 8]);
                }
#pragma unroll
                for (int t = 0; t < ACTIVE; ++t) {
                    acc[t][0] = fmaf(part[t][0], s0, acc[t][0]);
                    acc[t][1] = fmaf(part[t][1], s0, acc[t][1]);
                    acc[t][2] = fmaf(part[t][2], s1, acc[t][2]);
                    acc[t][3] = fmaf(part[t][3], s1, acc[t][3]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) part[t][i] = 0.f;
                }
            }
        }
    }
    cp_async_wait<0>();
    if constexpr (!SCALED_SUMS) {
#pragma unroll
        for (int t = 0; t < ACTIVE; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] = part[t][i];
    }
    if constexpr (ENC == E2M1) {  // the global scales of the warp's two bands
        if (warp_live) {
            const float g0 = band_scale[expert_band0 + band_of_slot(2 * warp, n0, N, gated)];
            const float g1 = band_scale[expert_band0 + band_of_slot(2 * warp + 1, n0, N, gated)];
#pragma unroll
            for (int t = 0; t < ACTIVE; ++t) {
                acc[t][0] *= g0;
                acc[t][1] *= g0;
                acc[t][2] *= g1;
                acc[t][3] *= g1;
            }
        }
    }
    // D fragment: [0], [1] output column lane / 4 of the warp's first band, tokens 2 (lane % 4)
    // and + 1 of the group; [2], [3] the same tokens, 8 columns on. Gated: [0], [1] the gate and
    // [2], [3] the up sums of intermediate column lane / 4 of the warp's 8, each rounded to BF16
    // as the gate/up output is before silu_mul (so the bits of the two launches).
    if (!warp_live) return;
    if (gated) {
        const int col = n0 / 2 + warp * 8 + lane / 4, I = N / 2;
#pragma unroll
        for (int t = 0; t < ACTIVE; ++t) {
            const int r = t * 8 + 2 * (lane % 4);
            if (r < rows)
                Y[(size_t)(p0 + r) * I + col] = silu_mul_bf16(to_f32(to_bf16(acc[t][0])), to_f32(to_bf16(acc[t][2])));
            if (r + 1 < rows)
                Y[(size_t)(p0 + r + 1) * I + col] =
                    silu_mul_bf16(to_f32(to_bf16(acc[t][1])), to_f32(to_bf16(acc[t][3])));
        }
        return;
    }
    const int col = n0 + warp * 16 + lane / 4;
#pragma unroll
    for (int t = 0; t < ACTIVE; ++t) {
        const int r = t * 8 + 2 * (lane % 4);
        if (r < rows) {
            bf16* y = Y + (size_t)(p0 + r) * N + col;
            y[0] = to_bf16(acc[t][0]);
            y[8] = to_bf16(acc[t][2]);
        }
        if (r + 1 < rows) {
            bf16* y = Y + (size_t)(p0 + r + 1) * N + col;
            y[0] = to_bf16(acc[t][1]);
            y[8] = to_bf16(acc[t][3]);
        }
    }
}

// The tile with the group's steps known at compile time for groups of 128 columns (the usual INT4
// and INT8 group, and every E4M3 group of a 128-wide block).
template <int BITS, int ENC, int NT, int STAGES, int ACTIVE>
__device__ __forceinline__ void codes_tile_group(const bf16* X, const int* row_token, const unsigned char* codes,
                                                 const __half* scales, int group, const float* band_scale, bf16* Y,
                                                 int e, int p0, int rows, int n0, int N, int K, int gated,
                                                 bool settled) {
    if constexpr (BITS != 16 && ENC != E2M1) {
        if (group == 8 * 16) {
            codes_tile<BITS, ENC, NT, STAGES, ACTIVE, 8>(X, row_token, codes, scales, group, band_scale, Y, e, p0,
                                                         rows, n0, N, K, gated, settled);
            return;
        }
    }
    codes_tile<BITS, ENC, NT, STAGES, ACTIVE, 0>(X, row_token, codes, scales, group, band_scale, Y, e, p0, rows, n0,
                                                 N, K, gated, settled);
}

// The tile with as many token groups computed as it has rows for.
template <int BITS, int ENC, int NT, int STAGES>
__device__ void codes_tile_rows(const bf16* X, const int* row_token, const unsigned char* codes, const __half* scales,
                                int group, const float* band_scale, bf16* Y, int e, int p0, int rows, int n0, int N,
                                int K, int gated, bool settled) {
#define MINNOW_CODES_TILE(A) \
    codes_tile_group<BITS, ENC, NT, STAGES, A>(X, row_token, codes, scales, group, band_scale, Y, e, p0, rows, n0, N, K, \
                                               gated, settled)
    if constexpr (NT == 2) {
        if (rows <= 8)
            MINNOW_CODES_TILE(1);
        else
            MINNOW_CODES_TILE(2);
    } else if constexpr (NT == 4) {
        switch ((rows + 7) / 8) {
            case 1: MINNOW_CODES_TILE(1); break;
            case 2: MINNOW_CODES_TILE(2); break;
            case 3: MINNOW_CODES_TILE(3); break;
            default: MINNOW_CODES_TILE(4); break;
        }
    } else {
        static_assert(NT == 8, "16-, 32- or 64-row tiles");
        switch ((rows + 7) / 8) {
            case 1: MINNOW_CODES_TILE(1); break;
            case 2: MINNOW_CODES_TILE(2); break;
            case 3: MINNOW_CODES_TILE(3); break;
            case 4: MINNOW_CODES_TILE(4); break;
            case 5: MINNOW_CODES_TILE(5); break;
            case 6: MINNOW_CODES_TILE(6); break;
            case 7: MINNOW_CODES_TILE(7); break;
            default: MINNOW_CODES_TILE(8); break;
        }
    }
#undef MINNOW_CODES_TILE
}

// Stages of a packed shared expert's BF16 tiles: as many as the codes' allocation holds (at most
// 8). Its CTAs stream 4x (INT4) or 2x (INT8) the bytes of a codes CTA over as many stages, so
// with the codes' stage count they are the launch's tail; more stages in flight keep more of
// their bytes coming. The stage count changes no product (each output is the same chain over K).
template <int BITS, int NT, int STAGES>
__host__ __device__ constexpr int bf16_slot_stages() {
    constexpr int fit = STAGES * Stage<BITS, 8 * NT>::bytes / Stage<16, 8 * NT>::bytes;
    return fit > 8 ? 8 : fit;
}

// ---------------------------------------------------------------------------------------------
// FP8 x FP8 (W8A8): E4M3 weights (the E4M3 codes above) times E4M3 activations on the FP8
// tensor cores (mma.m16n8k32, sm_89 on). The activations are quantized first, per row and group
// of columns (`quantize_rows_e4m3`: the group's largest magnitude over 448 is its F32 scale, each
// value / scale its nearest-even E4M3 code), into bytes permuted inside each 16-column chunk so
// that the i8_mma positions of the weights and a k32 product's fragments meet (see
// `e4m3_rows_order` in ops/expert_gemm.rs). Each group's F32 sum (two 16-column steps per
// product) takes both scales: acc = fma(part, weight scale x row scale, acc), in ascending K,
// so every output is one fixed chain whatever the tile or its other rows, as above.

// The E4M3 code nearest to x (ties to even, saturating at +-448, a zero or a value that rounds to
// zero keeps no sign): the CPU quantizer's rule (quant::fp8::f32_to_e4m3), read off x's bits.
__device__ __forceinline__ unsigned e4m3_code(float x) {
    const float a = fabsf(x);
    unsigned code;
    if (!(a > 0.f)) {
        code = 0u;  // zero and NaN
    } else if (a >= 448.f) {
        code = 126u;
    } else if (a < 0.015625f) {  // subnormal codes: multiples of 2^-9, rounded by 1.5 x 2^23
        code = (unsigned)__fsub_rn(__fadd_rn(__fmul_rn(a, 512.f), 12582912.f), 12582912.f);
    } else {
        const unsigned bits = __float_as_uint(a);
        code = ((bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20) - (120u << 3);
    }
    return (x < 0.f && code != 0u) ? (code | 0x80u) : code;
}

// grid = ceil(rows x K / 16 / 256), block = 256: one thread per 16-column chunk of a row.
// Q: [rows, K] bytes, chunk bytes 4j..4j + 3 holding columns 2j, 2j + 1, 2j + 8, 2j + 9;
// S: [rows, K / group] F32 (1 for an all-zero group). group: 16..128, a power of two dividing K.
__device__ __forceinline__ void quantize_rows_e4m3_body(const bf16* __restrict__ X, int rows, int K, int group,
                                                        unsigned char* __restrict__ Q, float* __restrict__ S) {
    const int chunks = K / 16, gsteps = group / 16;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = idx < (long)rows * chunks;
    float v[16];
    if (live) {
        const uint4* src = reinterpret_cast<const uint4*>(X + idx * 16);
        const uint4 u0 = src[0], u1 = src[1];
        const unsigned pairs[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // BF16 pairs, low half first
            v[2 * i] = __uint_as_float(pairs[i] << 16);
            v[2 * i + 1] = __uint_as_float(pairs[i] & 0xFFFF0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = 0.f;
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
    // A group's chunks are neighbouring threads of one warp (a row starts at a multiple of gsteps).
    for (int o = 1; o < gsteps; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax == 0.f ? 1.f : fmaxf(__fdiv_rn(amax, 448.f), 1.17549435e-38f);
    if (!live) return;
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c[4] = {2 * j, 2 * j + 1, 2 * j + 8, 2 * j + 9};
        unsigned word = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) word |= e4m3_code(__fdiv_rn(v[c[b]], scale)) << (8 * b);
        w[j] = word;
    }
    reinterpret_cast<uint4*>(Q)[idx] = make_uint4(w[0], w[1], w[2], w[3]);
    if (idx % gsteps == 0) S[idx / gsteps] = scale;
}

// D += A . B: one m16n8k32 E4M3 product with F32 accumulation (sm_89 on; the sm_80 PTX traps,
// and the host launches these kernels only with the sm_90 PTX).
__device__ __forceinline__ void mma16832_e4m3(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

// One stage of the W8A8 tile: the E4M3 stage's codes and scales, then the rows' activation
// bytes at a pitch of LDQ, then their F32 scales of the (at most GPS) groups the stage covers.
template <int ROWS>
struct StageQ {
    static constexpr int SK = 8;
    static constexpr int LDQ = SK * 16 + 16;  // ldmatrix rows of 16 bytes on distinct banks
    static constexpr int GPS = SK / 2;        // groups of at least 32 columns
    static constexpr int code_bytes = Stage<8, ROWS>::code_bytes;
    static constexpr int scale_bytes = Stage<8, ROWS>::scale_bytes;
    static constexpr int q_bytes = ROWS * LDQ;
    static constexpr int xs_bytes = ROWS * GPS * 4;
    static constexpr int bytes = code_bytes + scale_bytes + q_bytes + xs_bytes;
};

// The W8A8 tile: as codes_tile<8, E4M3> but over the quantized rows Q (gathered through
// row_token when given) and their scales S; groups of 32..128 columns.
template <int NT, int STAGES, int ACTIVE>
__device__ void w8a8_tile(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                          const int* __restrict__ row_token, const unsigned char* __restrict__ codes,
                          const __half* __restrict__ scales, int group, bf16* __restrict__ Y, int e, int p0,
                          int rows, int n0, int N, int K) {
    constexpr int ROWS = 8 * NT, TB = tile_bytes<8>();
    using S_ = StageQ<ROWS>;
    constexpr int SK = S_::SK, LDQ = S_::LDQ, GPS = S_::GPS;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int k_tiles = K / 16, groups = K / group, gsteps = group / 16;  // gsteps: 2, 4 or 8
    const size_t band0 = ((size_t)e * N + n0) / 8;
    const int stages_k = (k_tiles + SK - 1) / SK;
    const bool warp_live = n0 + warp * 16 < N;

    // Activation bytes: ROWS x 8 copies of 16 bytes per stage; scales: ROWS x GPS copies of 4.
    constexpr int Q_COPIES = (ROWS * SK + THREADS - 1) / THREADS;
    static_assert(Q_COPIES * THREADS == ROWS * SK || Q_COPIES == 1, "activations: whole copies");
    static_assert(ROWS * GPS <= THREADS, "row scales: one copy per thread");
    const unsigned char* q_src[Q_COPIES];
    bool q_ok[Q_COPIES];
#pragma unroll
    for (int i = 0; i < Q_COPIES; ++i) {
        const int r = (tid + i * THREADS) / SK;
        q_ok[i] = r < rows && r < ROWS;
        q_src[i] = Q + (size_t)(q_ok[i] ? (row_token ? row_token[p0 + r] : p0 + r) : 0) * K +
                   ((tid + i * THREADS) % SK) * 16;
    }
    const int s_row = tid / GPS, s_slot = tid % GPS;
    const bool s_ok = tid < ROWS * GPS && s_row < rows;
    const float* s_src = S + (size_t)(s_ok ? (row_token ? row_token[p0 + s_row] : p0 + s_row) : 0) * groups;
    auto load_stage = [&](int buf, int st) {
        unsigned char* base = smem + buf * S_::bytes;
        const int kt0 = st * SK;
        constexpr int CODE_COPIES = S_::code_bytes / 16 / THREADS;
        static_assert(CODE_COPIES * 16 * THREADS == S_::code_bytes, "codes: whole copies");
#pragma unroll
        for (int i = 0; i < CODE_COPIES; ++i) {
            const int byte = (tid + i * THREADS) * 16;
            const int band = byte / (SK * TB), within = byte % (SK * TB);
            cp_async16(base + byte, codes + ((band0 + band) * k_tiles + kt0) * TB + within,
                       n0 + band * 8 < N && kt0 + within / TB < k_tiles);
        }
        const int g_first = kt0 / gsteps, g_last = (min(kt0 + SK, k_tiles) * 16 - 1) / group;
        if (tid < BANDS * SK) {
            const int band = tid / SK, g = g_first + tid % SK;
            cp_async16(base + S_::code_bytes + tid * 16, scales + ((band0 + band) * groups + g) * 8,
                       n0 + band * 8 < N && g <= g_last);
        }
        unsigned char* sq = base + S_::code_bytes + S_::scale_bytes;
#pragma unroll
        for (int i = 0; i < Q_COPIES; ++i) {
            const int c = tid + i * THREADS, r = c / SK, col = (c % SK) * 16;
            if (q_ok[i]) cp_async16(sq + r * LDQ + col, q_src[i] + kt0 * 16, kt0 * 16 + col < K);
        }
        if (s_ok) {
            const int g = g_first + s_slot;
            cp_async4(sq + S_::q_bytes + (s_row * GPS + s_slot) * 4, s_src + min(g, groups - 1), g <= g_last);
        }
    };

    float acc[ACTIVE][4], part[ACTIVE][4];
#pragma unroll
    for (int t = 0; t < ACTIVE; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = part[t][i] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < stages_k) load_stage(s, s);
        cp_async_commit();
    }
    for (int st = 0; st < stages_k; ++st) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = st + STAGES - 1;
        if (next < stages_k) load_stage(next % STAGES, next);
        cp_async_commit();

        const unsigned char* base = smem + (st % STAGES) * S_::bytes;
        const unsigned char* code0 = base + (2 * warp) * SK * TB + lane * 4;
        const unsigned char* code1 = code0 + SK * TB;
        const float* wscale = reinterpret_cast<const float*>(base + S_::code_bytes) + (2 * warp) * SK * 4;
        const unsigned char* sq = base + S_::code_bytes + S_::scale_bytes;
        const float* sxs = reinterpret_cast<const float*>(sq + S_::q_bytes);
        // ldmatrix rows: lanes 0-7 / 8-15 give tokens 0-7 of the step pair's first / second
        // chunk, lanes 16-31 tokens 8-15 of the same: b0, b1 of two token groups.
        const unsigned char* qrow = sq + ((lane & 7) + ((lane >> 4) << 3)) * LDQ + ((lane >> 3) & 1) * 16;
        const int kt0 = st * SK, g_first = kt0 / gsteps;
        if (!warp_live) continue;
#pragma unroll
        for (int s = 0; s < SK; s += 2) {
            // Steps s and s + 1 of one band: a lane's bytes of a k32 A fragment.
            unsigned a[4];
            a[0] = *reinterpret_cast<const unsigned*>(code0 + s * TB);
            a[1] = *reinterpret_cast<const unsigned*>(code1 + s * TB);
            a[2] = *reinterpret_cast<const unsigned*>(code0 + (s + 1) * TB);
            a[3] = *reinterpret_cast<const unsigned*>(code1 + (s + 1) * TB);
#pragma unroll
            for (int t = 0; t < ACTIVE; t += 2) {
                unsigned b[4];
                ldmatrix_x4(b, reinterpret_cast<const bf16*>(qrow + t * 8 * LDQ + s * 16));
                mma16832_e4m3(part[t], a, b[0], b[1]);
                if (t + 1 < ACTIVE) mma16832_e4m3(part[t + 1], a, b[2], b[3]);
            }
            const int kt = kt0 + s + 1;
            if (((kt + 1) & (gsteps - 1)) == 0) {  // the group's last step
                const int g = kt / gsteps - g_first;
                const float s0 = wscale[g * 4], s1 = wscale[SK * 4 + g * 4];
#pragma unroll
                for (int t = 0; t < ACTIVE; ++t) {
                    const int r = t * 8 + 2 * (lane % 4);
                    const float x0 = sxs[r * GPS + g], x1 = sxs[(r + 1) * GPS + g];
                    acc[t][0] = fmaf(part[t][0], s0 * x0, acc[t][0]);
                    acc[t][1] = fmaf(part[t][1], s0 * x1, acc[t][1]);
                    acc[t][2] = fmaf(part[t][2], s1 * x0, acc[t][2]);
                    acc[t][3] = fmaf(part[t][3], s1 * x1, acc[t][3]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) part[t][i] = 0.f;
                }
            }
        }
    }
    cp_async_wait<0>();
    const int col = n0 + warp * 16 + lane / 4;
    if (!warp_live) return;
#pragma unroll
    for (int t = 0; t < ACTIVE; ++t) {
        const int r = t * 8 + 2 * (lane % 4);
        if (r < rows) {
            bf16* y = Y + (size_t)(p0 + r) * N + col;
            y[0] = to_bf16(acc[t][0]);
            y[8] = to_bf16(acc[t][2]);
        }
        if (r + 1 < rows) {
            bf16* y = Y + (size_t)(p0 + r + 1) * N + col;
            y[0] = to_bf16(acc[t][1]);
            y[8] = to_bf16(acc[t][3]);
        }
    }
}

template <int NT, int STAGES>
__device__ void w8a8_tile_rows(const unsigned char* Q, const float* S, const int* row_token,
                               const unsigned char* codes, const __half* scales, int group, bf16* Y, int e, int p0,
                               int rows, int n0, int N, int K) {
#define MINNOW_W8A8_TILE(A) w8a8_tile<NT, STAGES, A>(Q, S, row_token, codes, scales, group, Y, e, p0, rows, n0, N, K)
    if constexpr (NT == 2) {
        if (rows <= 8)
            MINNOW_W8A8_TILE(1);
        else
            MINNOW_W8A8_TILE(2);
    } else {
        static_assert(NT == 8, "16- or 64-row tiles");
        switch ((rows + 7) / 8) {
            case 1: MINNOW_W8A8_TILE(1); break;
            case 2: MINNOW_W8A8_TILE(2); break;
            case 3: MINNOW_W8A8_TILE(3); break;
            case 4: MINNOW_W8A8_TILE(4); break;
            case 5: MINNOW_W8A8_TILE(5); break;
            case 6: MINNOW_W8A8_TILE(6); break;
            case 7: MINNOW_W8A8_TILE(7); break;
            default: MINNOW_W8A8_TILE(8); break;
        }
    }
#undef MINNOW_W8A8_TILE
}
// The BF16 slot's stages in an allocation of `bytes` (at most 8).
template <int NT>
__host__ __device__ constexpr int slot_stages_in(int bytes) {
    return bytes / Stage<16, 8 * NT>::bytes > 8 ? 8 : bytes / Stage<16, 8 * NT>::bytes;
}
}  // namespace minnow_codes

// grid = (ceil(N / 128), max_tiles), block = 256, dynamic shared memory = STAGES x
// Stage<BITS, 8 NT>::bytes (codes_tile_smem_bytes in ops/expert_gemm.rs); tiles cut at 8 NT rows;
// N % 16 == 0, K % 16 == 0, group 16, 32, 64 or 128 (E2M1: 16). Tiles of expert `shared_slot`
// (-1: none) read `shared`, one BF16 matrix in the codes' fragment order (a packed shared
// expert). `band_scale`: E2M1's F32 factor per 8-row band of the codes (unused otherwise).
// `flags`: CODES_GATED, W[e] = [gate; up] (N % 16 == 0), and Y gets silu_mul's N / 2 columns
// (band_of_slot); CODES_SETTLED, the tile list was written before the kernel queued just before
// this one (grouped_tile_settled), so the first stages' weights are copied before pdl_enter.
#define CODES_GATED 1
#define CODES_SETTLED 2
#define GROUPED_CODES_ENTRY(NAME, BITS, ENC, NT, STAGES) GROUPED_CODES_ENTRY_BOUNDS(NAME, BITS, ENC, NT, STAGES, (minnow_codes::THREADS))
// BOUNDS: the kernel's __launch_bounds__ arguments (a minimum of CTAs per SM caps its registers).
#define GROUPED_CODES_ENTRY_BOUNDS(NAME, BITS, ENC, NT, STAGES, BOUNDS)                                  \
    extern "C" __global__ void __launch_bounds__ BOUNDS                                                  \
        NAME(const bf16* X, const int* row_token, const unsigned char* codes, const __half* scales,       \
             const float* band_scale, int group, const bf16* shared, int shared_slot, bf16* Y,           \
             const int4* tiles, const int* num_tiles, int N, int K, int flags) {                         \
        const int gated = flags & CODES_GATED;                                                           \
        const bool settled = flags & CODES_SETTLED;                                                      \
        if (!settled) pdl_enter();                                                                       \
        int4 t;                                                                                          \
        if (!(settled ? grouped_tile_settled(tiles, num_tiles, t) : grouped_tile(tiles, num_tiles, t)))  \
            return;                                                                                      \
        const int n0 = blockIdx.x * minnow_codes::FEATURES;                                              \
        if (t.x == shared_slot)                                                                          \
            minnow_codes::codes_tile_rows<16, minnow_codes::INT, NT, minnow_codes::bf16_slot_stages<BITS, NT, STAGES>()>( \
                X, row_token, reinterpret_cast<const unsigned char*>(shared), nullptr, 16, nullptr, Y, 0,  \
                t.y, t.z - t.y, n0, N, K, gated, settled);                                               \
        else                                                                                             \
            minnow_codes::codes_tile_rows<BITS, ENC, NT, STAGES>(X, row_token, codes, scales, group,     \
                                                                  band_scale, Y, t.x, t.y, t.z - t.y, n0, \
                                                                  N, K, gated, settled);                 \
    }
// The 16-row tiles held to 64 registers: four CTAs per SM instead of three (registers and shared
// memory both allowed three), so a refinement's gate/up launch (~400 CTAs) runs in one wave
// (H100, INT4: refinement 2.64 -> 2.57 ms). INT8 and E4M3 fit 64 without a spill once the copies
// are addressed per tile rather than per stage. Not the larger tiles: a minimum of one CTA let
// them take one CTA per SM (batched steps ~24 % slower).
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i8_r16, 8, minnow_codes::INT, 2, 3, (minnow_codes::THREADS, 4))
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i4_r16, 4, minnow_codes::INT, 2, 3, (minnow_codes::THREADS, 4))
GROUPED_CODES_ENTRY(grouped_gemm_f4_r16, 4, minnow_codes::E2M1, 2, 3)
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_f8_r16, 8, minnow_codes::E4M3, 2, 3, (minnow_codes::THREADS, 4))
// 32-row tiles for batches whose experts get fewer rows than a 64-row tile holds: a third of the
// 64-row stage's activation room, so three stages fit where the 64-row tiles keep two. The scaled
// encodings' 32- and 64-row tiles are held to three and two CTAs per SM (80 and 128 registers):
// what they take without a bound for groups read at run time, which the compile-time groups of
// 128 columns would otherwise raise (95 and 155).
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i8_r32, 8, minnow_codes::INT, 4, 3, (minnow_codes::THREADS, 3))
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i4_r32, 4, minnow_codes::INT, 4, 3, (minnow_codes::THREADS, 3))
GROUPED_CODES_ENTRY(grouped_gemm_f4_r32, 4, minnow_codes::E2M1, 4, 3)
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_f8_r32, 8, minnow_codes::E4M3, 4, 3, (minnow_codes::THREADS, 3))
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i8_r64, 8, minnow_codes::INT, 8, 2, (minnow_codes::THREADS, 2))
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_i4_r64, 4, minnow_codes::INT, 8, 2, (minnow_codes::THREADS, 2))
GROUPED_CODES_ENTRY(grouped_gemm_f4_r64, 4, minnow_codes::E2M1, 8, 2)
GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_f8_r64, 8, minnow_codes::E4M3, 8, 2, (minnow_codes::THREADS, 2))

// W8A8: E4M3 codes times the rows quantized by quantize_rows_e4m3 (Q, S); the grid as the f8
// kernels', dynamic shared memory = W8A8_STAGES x StageQ<8 NT>::bytes (w8a8_stage_bytes in
// ops/expert_gemm.rs), which a packed shared expert's BF16 tiles (over X) fill with as many
// stages as fit. Groups of 32, 64 or 128 columns.
#define GROUPED_W8A8_ENTRY(NAME, NT, W8A8_STAGES)                                                        \
    extern "C" __global__ void __launch_bounds__(minnow_codes::THREADS)                                  \
        NAME(const bf16* X, const unsigned char* Q, const float* S, const int* row_token,                 \
             const unsigned char* codes, const __half* scales, int group, const bf16* shared,            \
             int shared_slot, bf16* Y, const int4* tiles, const int* num_tiles, int N, int K) {          \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (!grouped_tile(tiles, num_tiles, t)) return;                                                  \
        const int n0 = blockIdx.x * minnow_codes::FEATURES;                                              \
        constexpr int SLOT = minnow_codes::slot_stages_in<NT>(W8A8_STAGES * minnow_codes::StageQ<8 * NT>::bytes); \
        if (t.x == shared_slot)                                                                          \
            minnow_codes::codes_tile_rows<16, minnow_codes::INT, NT, SLOT>(                              \
                X, row_token, reinterpret_cast<const unsigned char*>(shared), nullptr, 16, nullptr, Y, 0,  \
                t.y, t.z - t.y, n0, N, K, 0, false);                                                     \
        else                                                                                             \
            minnow_codes::w8a8_tile_rows<NT, W8A8_STAGES>(Q, S, row_token, codes, scales, group, Y, t.x,  \
                                                          t.y, t.z - t.y, n0, N, K);                     \
    }
GROUPED_W8A8_ENTRY(grouped_gemm_f8f8_r16, 2, 3)
GROUPED_W8A8_ENTRY(grouped_gemm_f8f8_r64, 8, 2)
static_assert(3 * minnow_codes::StageQ<16>::bytes == 62976, "host mirror");
static_assert(2 * minnow_codes::StageQ<64>::bytes == 57344, "host mirror");

extern "C" __global__ void quantize_rows_e4m3(const bf16* X, int rows, int K, int group, unsigned char* Q, float* S) {
    pdl_enter();
    minnow_codes::quantize_rows_e4m3_body(X, rows, K, group, Q, S);
}

// 4-bit codes from the files' `*_mma` order (per band, each step's 32 lanes of 16 bits, nibbles
// c0, c0 + 1, c0 + 8, c0 + 9) to the word order the kernels read (codes.cuh), in place, run once
// at load: one warp per 128 bytes (a band's two steps), which it reads whole before writing.
// `chunks` = bytes / 128 (K % 32 == 0, so no band ends inside one). grid-stride, block = 256.
extern "C" __global__ void codes4_word_order(unsigned char* codes, long long chunks) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    for (long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; c < chunks; c += warps) {
        unsigned short* steps = reinterpret_cast<unsigned short*>(codes + c * minnow_codes::WORD_BYTES);
        const unsigned s = steps[lane], t = steps[32 + lane];
        __syncwarp();
        auto nib = [](unsigned v, int j) { return (v >> (4 * j)) & 0xFu; };
        // From bit 0: (c0, c0 + 8) of s, the same of t, (c0 + 1, c0 + 9) of s, the same of t.
        const unsigned w = nib(s, 0) | nib(s, 2) << 4 | nib(t, 0) << 8 | nib(t, 2) << 12 | nib(s, 1) << 16 |
                           nib(s, 3) << 20 | nib(t, 1) << 24 | nib(t, 3) << 28;
        reinterpret_cast<unsigned*>(steps)[lane] = w;
        __syncwarp();
    }
}

// Host mirrors (codes_tile_smem_bytes).
static_assert(3 * minnow_codes::Stage<4, 16>::bytes == 43776, "host mirror");
static_assert(3 * minnow_codes::Stage<8, 16>::bytes == 68352, "host mirror");
static_assert(3 * minnow_codes::Stage<4, 32>::bytes == 56832, "host mirror");
static_assert(3 * minnow_codes::Stage<8, 32>::bytes == 81408, "host mirror");
static_assert(2 * minnow_codes::Stage<4, 64>::bytes == 55296, "host mirror");
static_assert(2 * minnow_codes::Stage<8, 64>::bytes == 71680, "host mirror");
// A packed shared expert's BF16 tiles fit the smaller encoding's allocation.
static_assert(minnow_codes::bf16_slot_stages<4, 2, 3>() * minnow_codes::Stage<16, 16>::bytes <= 43776,
              "BF16 slot, 16-row tiles");
static_assert(minnow_codes::bf16_slot_stages<8, 2, 3>() * minnow_codes::Stage<16, 16>::bytes <= 68352,
              "BF16 slot beside INT8, 16-row tiles");
static_assert(minnow_codes::bf16_slot_stages<4, 8, 2>() * minnow_codes::Stage<16, 64>::bytes <= 55296,
              "BF16 slot, 64-row tiles");
static_assert(minnow_codes::bf16_slot_stages<4, 4, 3>() * minnow_codes::Stage<16, 32>::bytes <= 56832,
              "BF16 slot, 32-row tiles");
static_assert(minnow_codes::bf16_slot_stages<4, 2, 3>() == 4, "BF16 slot beside INT4: 4 stages");


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
        gemm_tile<BM, TILE>(X, nullptr, W, Y, 0, p0, min(BM, M - p0),            \
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

// The grouped GEMM over `*_mma` codes for shapes the tiled kernels refuse, with their arithmetic
// order per group: the F32 sum of code x activation over the group's columns, then
// acc = fma(sum, scale, acc). grid = (ceil(N / 64), max_tiles), block = 64.
template <int BITS>
__device__ __forceinline__ int code_at(const unsigned char* __restrict__ codes, size_t row, int k, int K) {
    const size_t band = row / 8;
    const int r = (int)(row % 8), kt = k / 16, c = k % 16;
    const int lane = r * 4 + (c % 8) / 2;
    if constexpr (BITS == 8) {
        const int slot = (c % 2) + (c >= 8 ? 2 : 0);
        return (int)(signed char)codes[((band * (K / 16) + kt) * 32 + lane) * 4 + slot];
    } else {
        // The word order (codes.cuh): the nibble of column c of step kt in the lane's word.
        const int nibble = (c % 2) * 4 + (c >= 8 ? 1 : 0) + (kt % 2) * 2;
        const unsigned w =
            *reinterpret_cast<const unsigned*>(codes + ((band * (K / 32) + kt / 2) * 32 + lane) * 4);
        return (int)((w >> (4 * nibble)) << 28) >> 28;
    }
}
template <int BITS>
__device__ __forceinline__ void gemm_any_tile_codes(const bf16* __restrict__ X, const int* __restrict__ row_token,
                                                    const unsigned char* __restrict__ codes,
                                                    const __half* __restrict__ scales, int group, bf16* __restrict__ Y,
                                                    int e, int p_begin, int p_end, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const size_t row = (size_t)e * N + n;
    const __half* row_scales = scales + (row / 8) * (K / group) * 8 + row % 8;
    for (int p = p_begin; p < p_end; ++p) {
        const bf16* x = X + (size_t)(row_token ? row_token[p] : p) * K;
        float acc = 0.f;
        for (int k0 = 0; k0 < K; k0 += group) {
            float part = 0.f;
            for (int k = k0; k < k0 + group; ++k) part += to_f32(x[k]) * (float)code_at<BITS>(codes, row, k, K);
            acc = fmaf(part, __half2float(row_scales[(k0 / group) * 8]), acc);
        }
        Y[(size_t)p * N + n] = to_bf16(acc);
    }
}
#define GROUPED_QUANT_ANY_ENTRY(NAME, BITS)                                                              \
    extern "C" __global__ void NAME(const bf16* __restrict__ X, const int* __restrict__ row_token,       \
                                    const unsigned char* __restrict__ codes, const __half* __restrict__ scales, \
                                    const float* /* band_scale: integer codes have none */,             \
                                    int group, const bf16* /* shared: never packed here */,              \
                                    int /* shared_slot */, bf16* __restrict__ Y, const int4* __restrict__ tiles, \
                                    const int* __restrict__ num_tiles, int N, int K,                     \
                                    int /* gated: only the tiled kernels gate (ops' grouped_gemm_codes) */) { \
        pdl_enter();                                                                                     \
        int4 t;                                                                                          \
        if (grouped_tile(tiles, num_tiles, t))                                                           \
            gemm_any_tile_codes<BITS>(X, row_token, codes, scales, group, Y, t.x, t.y, t.z, N, K);      \
    }
GROUPED_QUANT_ANY_ENTRY(grouped_gemm_i8_any, 8)
GROUPED_QUANT_ANY_ENTRY(grouped_gemm_i4_any, 4)
