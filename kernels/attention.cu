// Block-causal flash attention over the cached prefix plus the current forward's own keys
// (docs/model.md §6, §7.4 step 6). Tiled with an online softmax: no [n, n] score matrix.
//
// A batched forward holds several segments (one per sequence); each attends only to its own
// sequence, whose K/V live in pages of the layer's pool named by the segment's block table.
// One CTA owns up to 64 query rows of one segment: the `group = H / G` query heads that share KV
// head g, times floor(64 / group) consecutive tokens (the last 64 mod group rows stay idle when
// the group does not divide 64), so K/V tiles are loaded once for all heads of the group (GQA).
// The key range can be split over gridDim.z CTAs ("split-K", for short forwards over long
// prefixes); each split writes an unnormalised partial (O, m, l) and attention_combine merges them.
// In batch-invariant mode the splits are fixed 256-key chunks and the merge is a left-to-right
// fold over them (fold_scale, fold): the tensor-core kernel can also walk all of a row's chunks
// in one CTA and fold them in registers (attention_fa_seq_d*), which gives the same bits as the
// split kernel plus the combine, so the launcher picks either by the forward's size.
//
// Numerics: scores in F32 (tensor cores, BF16 inputs), softmax in F32 (the tensor-core kernels
// take each probability's exponential as an exp2, minnow_attention::probs_bf16x2), probabilities
// rounded to BF16 before P.V (as the reference does), F32 accumulation. The reference's eager path rounds
// the scaled scores to BF16 first; that differs at BF16 noise level (the fixture README accepts
// SDPA-style kernels).
#include "attention.cuh"
#include <mma.h>
using namespace nvcuda;

namespace minnow_attention {
constexpr int ROWS = 64;  // query rows per CTA
constexpr int KT = 64;    // keys per tile
constexpr int THREADS = 128;

template <int D>
struct Smem {
    static constexpr int LDQ = D + 8;   // bf16 rows of Q, K, V
    static constexpr int LDS = KT + 4;  // f32 scores
    static constexpr int LDP = KT + 8;  // bf16 probabilities
    static constexpr int LDO = D + 4;   // f32 output accumulator
    static constexpr size_t q = 0;
    static constexpr size_t k = q + sizeof(bf16) * ROWS * LDQ;
    static constexpr size_t v = k + sizeof(bf16) * KT * LDQ;
    static constexpr size_t s = v + sizeof(bf16) * KT * LDQ;
    static constexpr size_t p = s + sizeof(float) * ROWS * LDS;
    static constexpr size_t o = p + sizeof(bf16) * ROWS * LDP;
    static constexpr size_t stats = o + sizeof(float) * ROWS * LDO;  // m, l, alpha, limit
    static constexpr size_t total = stats + sizeof(float) * ROWS * 4;
};
// The host raises the kernels' dynamic shared-memory limit to 200 KiB (ptx.rs).
static_assert(Smem<256>::total <= 200 * 1024, "attention tile does not fit the shared-memory limit");

// Which key tiles split blockIdx.z takes. With chunk_tiles > 0 (batch-invariant mode) split z is
// the fixed absolute key range [z * chunk_tiles * KT, (z + 1) * chunk_tiles * KT): a query row's
// partials, and so its merged output, depend only on its own keys, never on how many CTAs or
// rows the forward has. With chunk_tiles == 0 the tile's keys are cut into gridDim.z equal
// parts (fewer launches for short forwards, but the cut moves with the batch).
__device__ __forceinline__ int split_tiles(int tile_lim, int chunk_tiles) {
    if (chunk_tiles > 0) return chunk_tiles;
    const int n_tiles = (tile_lim + KT - 1) / KT;
    return (n_tiles + gridDim.z - 1) / gridDim.z;
}
__device__ __forceinline__ int split_begin(int tile_lim, int chunk_tiles) {
    return blockIdx.z * split_tiles(tile_lim, chunk_tiles);
}

}  // namespace minnow_attention

namespace minnow_attention {

template <int D>
__device__ void attention_tile(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                               const bf16* __restrict__ v_cache, float* __restrict__ part_o,
                               float* __restrict__ part_ml, const int4* __restrict__ segs,
                               const int2* __restrict__ tiles, const int* __restrict__ tables, int T,
                               int n_heads, int n_kv, int block, float scale, int chunk_tiles) {
    using L = Smem<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sQ = reinterpret_cast<bf16*>(smem + L::q);
    bf16* sK = reinterpret_cast<bf16*>(smem + L::k);
    bf16* sV = reinterpret_cast<bf16*>(smem + L::v);
    float* sS = reinterpret_cast<float*>(smem + L::s);
    bf16* sP = reinterpret_cast<bf16*>(smem + L::p);
    float* sO = reinterpret_cast<float*>(smem + L::o);
    float* sM = reinterpret_cast<float*>(smem + L::stats);
    float* sL = sM + ROWS;
    int* sLim = reinterpret_cast<int*>(sL + 2 * ROWS);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int group = n_heads / n_kv, tq = ROWS / group, used = tq * group;
    const int g = blockIdx.y;
    const AttnTile tile = attn_tile(segs, tiles, tables, blockIdx.x);
    const int tok0 = tile.tok0, len = tile.len, row0 = tile.row0;
    const int pos0 = tile.pos0, end = pos0 + len;
    constexpr int CH = D / 8;  // 16-byte chunks per row

    for (int i = tid; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const int tok = tok0 + r % tq, head = g * group + r / tq;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < used && tok < len)
            val = *reinterpret_cast<const uint4*>(q + ((size_t)(row0 + tok) * n_heads + head) * D + c * 8);
        *reinterpret_cast<uint4*>(sQ + r * L::LDQ + c * 8) = val;
    }
    for (int i = tid; i < ROWS * L::LDO; i += THREADS) sO[i] = 0.f;
    if (tid < ROWS) {
        const int tok = tok0 + tid % tq;
        sM[tid] = -INFINITY;
        sL[tid] = 0.f;
        sLim[tid] = tid < used && tok < len ? key_limit(pos0 + tok, block, end) : 0;
    }
    const int last_tok = min(len - 1, tok0 + tq - 1);
    const int tile_lim = key_limit(pos0 + last_tok, block, end);
    // This split's key range, in whole key tiles.
    const int kbeg = split_begin(tile_lim, chunk_tiles) * KT;
    const int per_split = split_tiles(tile_lim, chunk_tiles);
    const int kend = min(tile_lim, kbeg + per_split * KT);
    __syncthreads();

    for (int kb = kbeg; kb < kend; kb += KT) {
        for (int i = tid; i < KT * CH; i += THREADS) {
            const int r = i / CH, c = i % CH, key = kb + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (key < kend) {
                const size_t off = (kv_row(tile.table, key, block) * n_kv + g) * D + c * 8;
                kv = *reinterpret_cast<const uint4*>(k_cache + off);
                vv = *reinterpret_cast<const uint4*>(v_cache + off);
            }
            *reinterpret_cast<uint4*>(sK + r * L::LDQ + c * 8) = kv;
            *reinterpret_cast<uint4*>(sV + r * L::LDQ + c * 8) = vv;
        }
        __syncthreads();

        // S = Q K^T for this warp's 16 rows.
        {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[KT / 16];
#pragma unroll
            for (int n = 0; n < KT / 16; ++n) wmma::fill_fragment(acc[n], 0.f);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::load_matrix_sync(a, sQ + warp * 16 * L::LDQ + kk * 16, L::LDQ);
#pragma unroll
                for (int n = 0; n < KT / 16; ++n) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                    wmma::load_matrix_sync(b, sK + n * 16 * L::LDQ + kk * 16, L::LDQ);
                    wmma::mma_sync(acc[n], a, b, acc[n]);
                }
            }
#pragma unroll
            for (int n = 0; n < KT / 16; ++n)
                wmma::store_matrix_sync(sS + warp * 16 * L::LDS + n * 16, acc[n], L::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax: two lanes per row, each over half of the tile's keys.
        {
            const int row = warp * 16 + lane / 2, half = lane & 1;
            const int lim = min(sLim[row], kend);  // keys past kend belong to the next split
            float mx = -INFINITY;
            for (int c = half * (KT / 2); c < (half + 1) * (KT / 2); ++c) {
                if (kb + c < lim) mx = fmaxf(mx, sS[row * L::LDS + c] * scale);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_old = sM[row];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int c = half * (KT / 2); c < (half + 1) * (KT / 2); ++c) {
                bf16 p = to_bf16(0.f);
                if (kb + c < lim && m_new != -INFINITY) p = to_bf16(expf(sS[row * L::LDS + c] * scale - m_new));
                sP[row * L::LDP + c] = p;
                sum += to_f32(p);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            const float alpha = m_new == -INFINITY ? 1.f : expf(m_old - m_new);
            for (int i = half * (D / 2); i < (half + 1) * (D / 2); ++i) sO[row * L::LDO + i] *= alpha;
            __syncwarp();
            if (half == 0) {
                sM[row] = m_new;
                sL[row] = sL[row] * alpha + sum;
            }
        }
        __syncwarp();

        // O += P V for this warp's 16 rows.
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, sO + warp * 16 * L::LDO + n * 16, L::LDO, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < KT / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(a, sP + warp * 16 * L::LDP + kk * 16, L::LDP);
                wmma::load_matrix_sync(b, sV + kk * 16 * L::LDQ + n * 16, L::LDQ);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(sO + warp * 16 * L::LDO + n * 16, acc, L::LDO, wmma::mem_row_major);
        }
        __syncthreads();
    }

    // Unnormalised partial results of this split: part_o [split, T, H, D], part_ml [split, T, H, 2].
    for (int i = tid; i < ROWS * D; i += THREADS) {
        const int r = i / D, c = i % D;
        const int tok = tok0 + r % tq, head = g * group + r / tq;
        // A row with no key in this split (max -inf) writes only its (m, l): the combine never
        // reads its output.
        if (r < used && tok < len && sM[r] != -INFINITY)
            part_o[(((size_t)blockIdx.z * T + row0 + tok) * n_heads + head) * D + c] = sO[r * L::LDO + c];
    }
    if (tid < ROWS) {
        const int tok = tok0 + tid % tq, head = g * group + tid / tq;
        if (tid < used && tok < len) {
            float* ml = part_ml + (((size_t)blockIdx.z * T + row0 + tok) * n_heads + head) * 2;
            ml[0] = sM[tid];
            ml[1] = sL[tid];
        }
    }
}
}  // namespace minnow_attention
using namespace minnow_attention;

// grid = (tiles, G, splits), block = 128; dynamic shared memory = Smem<D>::total (the host
// computes the same layout: attention_smem_bytes in crates/minnow-runtime/src/cuda/ops.rs). T is
// the batch's row count; `block` is both the block-causal mask's block and the page size.
#define ATTENTION_ENTRY(D)                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS) attention_d##D(                                \
        const bf16* q, const bf16* k_cache, const bf16* v_cache, float* part_o, float* part_ml,          \
        const int4* segs, const int2* tiles, const int* tables, int T, int n_heads, int n_kv, int block, \
        float scale, int chunk_tiles) {                                                                  \
        pdl_enter();                                                                                     \
        attention_tile<D>(q, k_cache, v_cache, part_o, part_ml, segs, tiles, tables, T, n_heads, n_kv,   \
                          block, scale, chunk_tiles);                                                    \
    }

ATTENTION_ENTRY(16)
ATTENTION_ENTRY(32)
ATTENTION_ENTRY(64)
ATTENTION_ENTRY(128)
ATTENTION_ENTRY(256)

// ---------------------------------------------------------------------------------------------
// The same attention for head_dim 64 / 128 written for the tensor cores' register layouts
// (mma.sync m16n8k16, FlashAttention-2 style): Q fragments, scores, probabilities and the
// output accumulator stay in registers; K/V tiles stream through shared memory with cp.async,
// double-buffered. Same grid, rows, masking and partial outputs as attention_d{D}.
namespace minnow_fa {
constexpr int THREADS = 128, ROWS = 64, KT = 64;

template <int D>
struct FaSmem {
    static constexpr int LD = D + 8;  // bf16 row pitch: 16 bytes of padding spreads the banks
    static constexpr int q = 0;
    static constexpr int k = q + ROWS * LD * 2;
    static constexpr int v = k + 2 * KT * LD * 2;
    static constexpr int total = v + 2 * KT * LD * 2;
};

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// SEQ = false: the CTA takes key split blockIdx.z (one fixed chunk, or an even share) and writes
// its unnormalised partial (O, m, l) for attention_combine. SEQ = true (chunk_tiles > 0, gridDim.z
// = 1): the CTA walks every chunk of its rows' keys in order, computing each chunk exactly as a
// split CTA would (fresh online-softmax state, the same instructions), folds it into a running
// state with the combine's functions, and writes the BF16 output itself: no partials in memory,
// no combine launch, the same bits. Tiles are taken last first, so a prefill's longest rows start
// first.
template <int D, bool SEQ>
__device__ void fa_tile(const bf16* __restrict__ q, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                        float* __restrict__ part_o, float* __restrict__ part_ml, bf16* __restrict__ out,
                        const int4* __restrict__ segs, const int2* __restrict__ tiles, const int* __restrict__ tables,
                        int T, int n_heads, int n_kv, int block, float scale, int chunk_tiles) {
    using L = FaSmem<D>;
    constexpr int LD = L::LD, CH = D / 8, KS = D / 16, ND = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sQ = reinterpret_cast<bf16*>(smem + L::q);
    bf16* sK = reinterpret_cast<bf16*>(smem + L::k);
    bf16* sV = reinterpret_cast<bf16*>(smem + L::v);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int group = n_heads / n_kv, tq = ROWS / group, used = tq * group;
    const int kvh = blockIdx.y;
    const AttnTile tile = attn_tile(segs, tiles, tables, SEQ ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
    const int tok0 = tile.tok0, len = tile.len, row0 = tile.row0;
    const int pos0 = tile.pos0, end = pos0 + len;

    // This thread's two rows (g and g + 8 of the warp's 16) and their key limits.
    const int ra = warp * 16 + g, rb = ra + 8;
    const int toka = tok0 + ra % tq, tokb = tok0 + rb % tq;
    const bool va = ra < used && toka < len, vb = rb < used && tokb < len;
    const int lima = va ? key_limit(pos0 + toka, block, end) : 0;
    const int limb = vb ? key_limit(pos0 + tokb, block, end) : 0;
    const int last_tok = min(len - 1, tok0 + tq - 1);
    const int tile_lim = key_limit(pos0 + last_tok, block, end);
    const int kbeg = SEQ ? 0 : split_begin(tile_lim, chunk_tiles) * KT;
    const int per_split = split_tiles(tile_lim, chunk_tiles);
    const int kend = SEQ ? tile_lim : min(tile_lim, kbeg + per_split * KT);

    auto load_tile = [&](int stage, int kb) {
        bf16* dk = sK + stage * KT * LD;
        bf16* dv = sV + stage * KT * LD;
#pragma unroll
        for (int i = 0; i < KT * CH / THREADS; ++i) {
            const int c = tid + i * THREADS, r = c / CH, col = (c % CH) * 8, key = kb + r;
            const bool ok = key < kend;
            const size_t off = ((ok ? kv_row(tile.table, key, block) : 0) * n_kv + kvh) * D + col;
            cp_async16(dk + r * LD + col, k_cache + off, ok);
            cp_async16(dv + r * LD + col, v_cache + off, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };


    // The segment's cached prefix (keys below pos0) is written by no kernel of this forward, and
    // the tile list, segments and block tables come from the host before the forward: a first
    // key tile that lies wholly in the prefix streams in before waiting for the previous kernel
    // (kernels/common.cuh, pdl_enter), overlapping QK-norm + RoPE's tail.
    const bool early = kbeg < kend && kbeg + KT <= pos0;
    if (early) load_tile(0, kbeg);
    pdl_enter();
    for (int i = tid; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const int tok = tok0 + r % tq, head = kvh * group + r / tq;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < used && tok < len)
            val = *reinterpret_cast<const uint4*>(q + ((size_t)(row0 + tok) * n_heads + head) * D + c * 8);
        *reinterpret_cast<uint4*>(sQ + r * LD + c * 8) = val;
    }
    __syncthreads();

    unsigned qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        const bf16* base = sQ + kk * 16 + 2 * t4;
        qa[kk][0] = *reinterpret_cast<const unsigned*>(base + ra * LD);
        qa[kk][1] = *reinterpret_cast<const unsigned*>(base + rb * LD);
        qa[kk][2] = *reinterpret_cast<const unsigned*>(base + ra * LD + 8);
        qa[kk][3] = *reinterpret_cast<const unsigned*>(base + rb * LD + 8);
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
    // SEQ: the fold of the chunks done so far (rows ra: elements 0, 1; rb: 2, 3).
    float acc[SEQ ? ND : 1][4];
    float fold_ma = -INFINITY, fold_mb = -INFINITY, fold_la = 0.f, fold_lb = 0.f;
    if (SEQ) {
#pragma unroll
        for (int n = 0; n < (SEQ ? ND : 1); ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    }
    const int chunk_keys = chunk_tiles * KT;

    if (kbeg < kend && !early) load_tile(0, kbeg);
    int stage = 0;
    for (int kb = kbeg; kb < kend; kb += KT, stage ^= 1) {
        if (SEQ && kb != kbeg && kb % chunk_keys == 0) {  // a new chunk starts from a fresh state
#pragma unroll
            for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
            ma = mb = -INFINITY;
            la = lb = 0.f;
        }
        if (kb + KT < kend) {
            load_tile(stage ^ 1, kb + KT);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const bf16* tk = sK + stage * KT * LD;
        const bf16* tv = sV + stage * KT * LD;

        // Scores of this warp's 16 rows against the tile's 64 keys: 8 blocks of 8 keys.
        float s[KT / 8][4];
#pragma unroll
        for (int nb = 0; nb < KT / 8; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
            const bf16* krow = tk + (nb * 8 + g) * LD + 2 * t4;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                const unsigned b0 = *reinterpret_cast<const unsigned*>(krow + kk * 16);
                const unsigned b1 = *reinterpret_cast<const unsigned*>(krow + kk * 16 + 8);
                mma16816(s[nb], qa[kk], b0, b1);
            }
        }
        // Online softmax over rows ra (elements 0, 1) and rb (elements 2, 3).
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < KT / 8; ++nb) {
            const int key = kb + nb * 8 + 2 * t4;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                s[nb][e] = key + e < lima ? s[nb][e] * scale : -INFINITY;
                s[nb][2 + e] = key + e < limb ? s[nb][2 + e] * scale : -INFINITY;
                mxa = fmaxf(mxa, s[nb][e]);
                mxb = fmaxf(mxb, s[nb][2 + e]);
            }
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, off));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, off));
        }
        const float na = fmaxf(ma, mxa), nbm = fmaxf(mb, mxb);
        const float alpha_a = na == -INFINITY ? 1.f : expf(ma - na);
        const float alpha_b = nbm == -INFINITY ? 1.f : expf(mb - nbm);
        ma = na;
        mb = nbm;
        unsigned pa[KT / 16][4];
        float suma = 0.f, sumb = 0.f;
#pragma unroll
        for (int nb = 0; nb < KT / 8; ++nb) {
            pa[nb / 2][(nb & 1) * 2 + 0] = probs_bf16x2(s[nb][0], s[nb][1], na, suma);
            pa[nb / 2][(nb & 1) * 2 + 1] = probs_bf16x2(s[nb][2], s[nb][3], nbm, sumb);
        }
        la = la * alpha_a + suma;
        lb = lb * alpha_b + sumb;
        // Rescaling by exactly 1 (neither row's max moved) changes nothing: skipped.
        if (alpha_a != 1.f || alpha_b != 1.f) {
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                o[n][0] *= alpha_a;
                o[n][1] *= alpha_a;
                o[n][2] *= alpha_b;
                o[n][3] *= alpha_b;
            }
        }
        // O += P V: V fragments through ldmatrix.trans, two 8-wide dim blocks per load.
        const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
        for (int j = 0; j < KT / 16; ++j) {
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                unsigned vb[4];
                ldmatrix_x4_trans(vb, tv + (j * 16 + (mi & 1) * 8 + ri) * LD + (n + (mi >> 1)) * 8);
                mma16816(o[n], pa[j], vb[0], vb[1]);
                mma16816(o[n + 1], pa[j], vb[2], vb[3]);
            }
        }
        if (SEQ && ((kb + KT) % chunk_keys == 0 || kb + KT >= kend)) {
            // The chunk ends: its (m, l) as a split CTA would write them, then one fold step.
            float sa = la, sb = lb;
#pragma unroll
            for (int off = 1; off <= 2; off <<= 1) {
                sa += __shfl_xor_sync(0xffffffffu, sa, off);
                sb += __shfl_xor_sync(0xffffffffu, sb, off);
            }
            if (ma != -INFINITY) {
                const FoldScale f = fold_scale(fold_ma, ma);
                fold_la = fold(fold_la, sa, f);
#pragma unroll
                for (int n = 0; n < (SEQ ? ND : 1); ++n) {
                    acc[n][0] = fold(acc[n][0], o[n][0], f);
                    acc[n][1] = fold(acc[n][1], o[n][1], f);
                }
            }
            if (mb != -INFINITY) {
                const FoldScale f = fold_scale(fold_mb, mb);
                fold_lb = fold(fold_lb, sb, f);
#pragma unroll
                for (int n = 0; n < (SEQ ? ND : 1); ++n) {
                    acc[n][2] = fold(acc[n][2], o[n][2], f);
                    acc[n][3] = fold(acc[n][3], o[n][3], f);
                }
            }
        }
        __syncthreads();  // the next iteration's copy overwrites the other stage
    }
    const int heada = kvh * group + ra / tq, headb = kvh * group + rb / tq;
    if (SEQ) {
        bf16* outa = out + ((size_t)(row0 + toka) * n_heads + heada) * D;
        bf16* outb = out + ((size_t)(row0 + tokb) * n_heads + headb) * D;
#pragma unroll
        for (int n = 0; n < (SEQ ? ND : 1); ++n) {
            if (va)
                *reinterpret_cast<unsigned*>(outa + n * 8 + 2 * t4) =
                    pack_bf16(fold_result(acc[n][0], fold_la), fold_result(acc[n][1], fold_la));
            if (vb)
                *reinterpret_cast<unsigned*>(outb + n * 8 + 2 * t4) =
                    pack_bf16(fold_result(acc[n][2], fold_lb), fold_result(acc[n][3], fold_lb));
        }
        return;
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, off);
        lb += __shfl_xor_sync(0xffffffffu, lb, off);
    }
    float* oa = part_o + (((size_t)blockIdx.z * T + row0 + toka) * n_heads + heada) * D;
    float* ob = part_o + (((size_t)blockIdx.z * T + row0 + tokb) * n_heads + headb) * D;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
        // Rows with no key in this split write only (m, l) below: the combine skips their output.
        if (va && ma != -INFINITY) *reinterpret_cast<float2*>(oa + n * 8 + 2 * t4) = make_float2(o[n][0], o[n][1]);
        if (vb && mb != -INFINITY) *reinterpret_cast<float2*>(ob + n * 8 + 2 * t4) = make_float2(o[n][2], o[n][3]);
    }
    if (t4 == 0) {
        if (va) {
            float* ml = part_ml + (((size_t)blockIdx.z * T + row0 + toka) * n_heads + heada) * 2;
            ml[0] = ma;
            ml[1] = la;
        }
        if (vb) {
            float* ml = part_ml + (((size_t)blockIdx.z * T + row0 + tokb) * n_heads + headb) * 2;
            ml[0] = mb;
            ml[1] = lb;
        }
    }
}
}  // namespace minnow_fa

// grid = (tiles, G, splits), block = 128; dynamic shared memory = FaSmem<D>::total (mirrored by
// attention_smem_bytes in ops.rs). Arguments as attention_d{D}; fa_tile waits for the previous
// kernel itself (after starting the first key tile's copy when it can).
// attention_fa_seq_d{D}: grid = (tiles, G, 1), chunk_tiles > 0, output straight into `out`
// [T, H, D] BF16 (no partials, no combine).
#define FA_ENTRY(D)                                                                                      \
    extern "C" __global__ void __launch_bounds__(minnow_fa::THREADS) attention_fa_d##D(                 \
        const bf16* q, const bf16* k_cache, const bf16* v_cache, float* part_o, float* part_ml,          \
        const int4* segs, const int2* tiles, const int* tables, int T, int n_heads, int n_kv, int block, \
        float scale, int chunk_tiles) {                                                                  \
        minnow_fa::fa_tile<D, false>(q, k_cache, v_cache, part_o, part_ml, nullptr, segs, tiles, tables, \
                                     T, n_heads, n_kv, block, scale, chunk_tiles);                       \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(minnow_fa::THREADS) attention_fa_seq_d##D(             \
        const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, const int4* segs,           \
        const int2* tiles, const int* tables, int T, int n_heads, int n_kv, int block, float scale,      \
        int chunk_tiles) {                                                                               \
        minnow_fa::fa_tile<D, true>(q, k_cache, v_cache, nullptr, nullptr, out, segs, tiles, tables, T,  \
                                    n_heads, n_kv, block, scale, chunk_tiles);                           \
    }
FA_ENTRY(64)
FA_ENTRY(128)
static_assert(minnow_fa::FaSmem<128>::total == 64 * 136 * 2 * 5, "host mirror");

// Merges the splits: out[t, h, :] = BF16 of the fold (minnow_attention::fold) of the splits' partial
// (O, m, l) in split order. grid = (T, H), block = min(D, 256) threads; splits <= 256. Splits whose
// max is -inf (no key of the row in their range) are skipped, so a row's result does not depend
// on how many splits the forward launched. The (m, l) pairs of all splits are loaded at once and
// each split's fold scales computed once by one thread (a loop of dependent loads per split cost
// an L2 round trip each); each output element then folds its splits' O values.
extern "C" __global__ void attention_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                             bf16* __restrict__ out, int T, int n_heads, int d, int splits) {
    pdl_enter();
    __shared__ float sm[256], sl[256], sa[256], sb[256];
    __shared__ float total_l;
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    for (int s = tid; s < splits; s += blockDim.x) {
        const float* ml = part_ml + (((size_t)s * T + t) * n_heads + h) * 2;
        sm[s] = ml[0];
        sl[s] = ml[1];
    }
    __syncthreads();
    if (tid == 0) {
        float m = -INFINITY, l = 0.f;
        for (int s = 0; s < splits; ++s) {
            if (sm[s] == -INFINITY) continue;
            const FoldScale f = fold_scale(m, sm[s]);
            l = fold(l, sl[s], f);
            sa[s] = f.a;
            sb[s] = f.b;
        }
        total_l = l;
    }
    __syncthreads();
    const float l = total_l;
    for (int i = tid; i < d; i += blockDim.x) {
        float acc = 0.f;
        for (int s0 = 0; s0 < splits; s0 += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                v[u] = s0 + u < splits && sm[s0 + u] != -INFINITY
                           ? part_o[(((size_t)(s0 + u) * T + t) * n_heads + h) * d + i]
                           : 0.f;
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (s0 + u < splits && sm[s0 + u] != -INFINITY) acc = fold(acc, v[u], FoldScale{sa[s0 + u], sb[s0 + u]});
        }
        out[((size_t)t * n_heads + h) * d + i] = to_bf16(fold_result(acc, l));
    }
}
