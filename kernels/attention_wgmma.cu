// Prefill attention on Hopper's warpgroup tensor-core instructions (wgmma): the batch-invariant
// attention of attention_fa_seq_d128 (kernels/attention.cu) with the same bits, for forwards whose
// tiles fill the GPU (prefill, large batched steps).
//
// One CTA takes 128 query rows: two consumer warpgroups of 64 rows each (a 64-row tile of
// attention_fa_seq each: the GQA group's heads times 64 / group consecutive tokens), so a
// 32-token block of a 4-KV-head model shares one stream of K/V tiles. The producer warpgroup
// copies each 64-key tile of K and V (paged: one table lookup per key) with cp.async into the
// 128-byte-swizzled layout, two 64-dimension panels per matrix; the consumers compute
//   S = Q K^T   (m64n64k16, Q from registers, K K-major from shared memory, 8 steps over D)
//   O += P V    (m64n128k16, P from registers, V MN-major from shared memory, 4 steps over keys)
// Each warpgroup runs its tile's products to completion before its softmax reads them, so
// ptxas keeps them asynchronous; the other warpgroup's products fill the gaps.
//
// Same bits as attention_fa_seq_d128: the accumulator layout of wgmma is that of mma.m16n8k16
// (each warp's 16 rows, a thread's rows g and g + 8), every product is a 16-deep tensor-core
// step in the same order (D for the scores, keys for P.V), and the online softmax over each
// 64-key tile, the fixed 256-key chunks and their fold are the same instructions in the same
// order (minnow_attention's functions). Key tiles past a row's own limit (the CTA streams the
// keys of its last row) are masked to -inf for that row: they leave its max, sum and output as
// they were (a factor of exactly 1, probabilities of exactly 0), so a row's result does not
// depend on the rows it shares a CTA with. A chunk's running fold lives in shared memory (a
// thread's 64 F32 outputs), since registers hold Q, the scores and the output already.
#include "attention.cuh"
#include "wgmma.cuh"

namespace minnow_attn_wgmma {
constexpr int D = 128;
constexpr int KT = 64;                       // keys per tile
constexpr int CONSUMERS = 2;                 // warpgroups of 64 query rows
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int STAGES = 2;
constexpr int PANEL = KT * 128;              // 64 keys x 64 dimensions of BF16: 8 KB
constexpr int MATRIX = 2 * PANEL;            // K or V of one key tile
constexpr int STAGE_BYTES = 2 * MATRIX;      // K then V
constexpr int FOLD_BYTES = CONSUMERS * 128 * 64 * 4;
// The stages (aligned to the 1,024-byte swizzle atom), the folds, then the stage barriers.
constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + FOLD_BYTES + 2 * STAGES * 8;
static_assert(SMEM_BYTES == 1024 + 2 * 32768 + 65536 + 32, "host mirror: attention_wgmma_smem_bytes in ops");
}  // namespace minnow_attn_wgmma

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace minnow_attn_wgmma {
using namespace minnow_tma;
using namespace minnow_wgmma;
using namespace minnow_attention;

// 16 bytes global -> shared (a shared-space address), or 16 zero bytes when !valid.
__device__ __forceinline__ void copy16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ void attention_seq(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                              const bf16* __restrict__ v_cache, bf16* __restrict__ out, const int4* __restrict__ segs,
                              const int2* __restrict__ tiles, const int* __restrict__ tables, int n_heads, int n_kv,
                              int block, float scale, int chunk_tiles) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_addr(smem_raw);
    const unsigned stages = (raw + 1023) & ~1023u;
    float* folds = reinterpret_cast<float*>(smem_raw + (stages - raw) + STAGES * STAGE_BYTES);
    const unsigned full0 = stages + STAGES * STAGE_BYTES + FOLD_BYTES, empty0 = full0 + 8 * STAGES;
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    // Full: each producer thread's copies; empty: each consumer warpgroup.
    init_stage_barriers(full0, empty0, STAGES, 128, CONSUMERS);

    const int group = n_heads / n_kv, tq = 64 / group, used = tq * group;
    const int kvh = blockIdx.y;
    // Tiles are taken last first, so a prefill's longest rows start first.
    const AttnTile tile = attn_tile(segs, tiles, tables, gridDim.x - 1 - blockIdx.x);
    const int len = tile.len, pos0 = tile.pos0, end = pos0 + len;
    // The CTA streams the keys of its last row: 2 tq tokens from tile.tok0.
    const int last_tok = min(len - 1, tile.tok0 + 2 * tq - 1);
    const int kend = key_limit(pos0 + last_tok, block, end);
    pdl_enter();  // Q and this forward's K/V come from the kernel before

    if (wg == CONSUMERS) {  // producer: thread tid copies chunk tid % 16 of keys tid / 16 + 8 i
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const int chunk = tid & 15, r0 = tid >> 4;
        const unsigned within = (chunk >> 3) * PANEL;  // the 64-dimension panel of this chunk
        int it = 0;
        for (int kb = 0; kb < kend; kb += KT, ++it) {
            const int s = it % STAGES;
            const unsigned dst = stages + s * STAGE_BYTES + within;
            mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
#pragma unroll
            for (int i = 0; i < KT / 8; ++i) {
                const int r = r0 + 8 * i, key = kb + r;
                const bool ok = key < kend;
                const size_t off = ((ok ? kv_row(tile.table, key, block) : 0) * n_kv + kvh) * D + chunk * 8;
                const unsigned at = dst + swizzled(r, chunk & 7);
                copy16(at, k_cache + off, ok);
                copy16(at + MATRIX, v_cache + off, ok);
            }
            cp_async_arrive_noinc(full0 + 8 * s);
        }
        // A thread must not exit with copies in flight: they would land (and arrive) after it.
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int tok0 = tile.tok0 + wg * tq;  // this warpgroup's 64-row tile
    const int ra = warp * 16 + g, rb = ra + 8;
    const int toka = tok0 + ra % tq, tokb = tok0 + rb % tq;
    const bool va = ra < used && toka < len, vb = rb < used && tokb < len;
    const int lima = va ? key_limit(pos0 + toka, block, end) : 0;
    const int limb = vb ? key_limit(pos0 + tokb, block, end) : 0;
    const int heada = kvh * group + ra / tq, headb = kvh * group + rb / tq;

    // Q fragments (the A layout of mma.m16n8k16 over D), straight from memory.
    unsigned qa[D / 16][4];
    {
        const bf16* qra = q + ((size_t)(tile.row0 + toka) * n_heads + heada) * D + 2 * t4;
        const bf16* qrb = q + ((size_t)(tile.row0 + tokb) * n_heads + headb) * D + 2 * t4;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qa[kk][0] = va ? *reinterpret_cast<const unsigned*>(qra + kk * 16) : 0u;
            qa[kk][1] = vb ? *reinterpret_cast<const unsigned*>(qrb + kk * 16) : 0u;
            qa[kk][2] = va ? *reinterpret_cast<const unsigned*>(qra + kk * 16 + 8) : 0u;
            qa[kk][3] = vb ? *reinterpret_cast<const unsigned*>(qrb + kk * 16 + 8) : 0u;
        }
    }
    float* fold_acc = folds + (size_t)wg * 64 * 128 + tid;  // element i at fold_acc[128 i]
#pragma unroll
    for (int i = 0; i < 64; ++i) fold_acc[128 * i] = 0.f;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
    float fold_ma = -INFINITY, fold_mb = -INFINITY, fold_la = 0.f, fold_lb = 0.f;
    const int chunk_keys = chunk_tiles * KT;

    int it = 0;
    for (int kb = 0; kb < kend; kb += KT, ++it) {
        if (kb != 0 && kb % chunk_keys == 0) {  // a new chunk starts from a fresh state
#pragma unroll
            for (int i = 0; i < 64; ++i) o[i] = 0.f;
            ma = mb = -INFINITY;
            la = lb = 0.f;
        }
        const int s = it % STAGES;
        mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
        fence_async_proxy_shared();  // the K/V rows cp.async wrote, for wgmma's reads
        const unsigned kt = stages + s * STAGE_BYTES, vt = kt + MATRIX;

        // Scores of the warpgroup's 64 rows against the tile's 64 keys.
        float sc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) sc[i] = 0.f;
        fence_floats(sc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_m64n64k16_rs(sc, qa[kk], sw128_desc(kt + (kk >> 2) * PANEL + 32 * (kk & 3)));
        wgmma_commit();
        wgmma_wait<0>();
        fence_floats(sc);

        // Online softmax over rows ra (elements 4 nb + 0, 1) and rb (4 nb + 2, 3): the
        // instructions of attention_fa_seq.
        // A tile below both rows' limits (all but the diagonal ones of a prefill) needs no mask:
        // the same values, without a comparison per score.
        float mxa = -INFINITY, mxb = -INFINITY;
        if (kb + KT <= lima && kb + KT <= limb) {
#pragma unroll
            for (int nb = 0; nb < KT / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    sc[4 * nb + e] *= scale;
                    sc[4 * nb + 2 + e] *= scale;
                    mxa = fmaxf(mxa, sc[4 * nb + e]);
                    mxb = fmaxf(mxb, sc[4 * nb + 2 + e]);
                }
        } else {
#pragma unroll
            for (int nb = 0; nb < KT / 8; ++nb) {
                const int key = kb + nb * 8 + 2 * t4;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    sc[4 * nb + e] = key + e < lima ? sc[4 * nb + e] * scale : -INFINITY;
                    sc[4 * nb + 2 + e] = key + e < limb ? sc[4 * nb + 2 + e] * scale : -INFINITY;
                    mxa = fmaxf(mxa, sc[4 * nb + e]);
                    mxb = fmaxf(mxb, sc[4 * nb + 2 + e]);
                }
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
            pa[nb / 2][(nb & 1) * 2 + 0] = probs_bf16x2(sc[4 * nb + 0], sc[4 * nb + 1], na, suma);
            pa[nb / 2][(nb & 1) * 2 + 1] = probs_bf16x2(sc[4 * nb + 2], sc[4 * nb + 3], nbm, sumb);
        }
        la = la * alpha_a + suma;
        lb = lb * alpha_b + sumb;
        // Rescaling by exactly 1 (neither row's max moved, most tiles once a row has seen some
        // keys) changes nothing: skipped.
        if (alpha_a != 1.f || alpha_b != 1.f) {
#pragma unroll
            for (int n = 0; n < 16; ++n) {
                o[4 * n + 0] *= alpha_a;
                o[4 * n + 1] *= alpha_a;
                o[4 * n + 2] *= alpha_b;
                o[4 * n + 3] *= alpha_b;
            }
        }

        // O += P V over the tile's keys in four 16-key steps.
        fence_floats(o);
        fence_words(pa);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < KT / 16; ++j) wgmma_m64n128k16_rs<1>(o, pa[j], sw128_desc_mn(vt + j * 2048, PANEL));
        wgmma_commit();
        wgmma_wait<0>();
        fence_floats(o);
        fence_words(pa);
        if (tid == 0) mbar_arrive(empty0 + 8 * s);  // the products reading the stage are complete

        if ((kb + KT) % chunk_keys == 0 || kb + KT >= kend) {
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
                for (int n = 0; n < 16; ++n) {
                    fold_acc[128 * (4 * n + 0)] = fold(fold_acc[128 * (4 * n + 0)], o[4 * n + 0], f);
                    fold_acc[128 * (4 * n + 1)] = fold(fold_acc[128 * (4 * n + 1)], o[4 * n + 1], f);
                }
            }
            if (mb != -INFINITY) {
                const FoldScale f = fold_scale(fold_mb, mb);
                fold_lb = fold(fold_lb, sb, f);
#pragma unroll
                for (int n = 0; n < 16; ++n) {
                    fold_acc[128 * (4 * n + 2)] = fold(fold_acc[128 * (4 * n + 2)], o[4 * n + 2], f);
                    fold_acc[128 * (4 * n + 3)] = fold(fold_acc[128 * (4 * n + 3)], o[4 * n + 3], f);
                }
            }
        }
    }
    bf16* outa = out + ((size_t)(tile.row0 + toka) * n_heads + heada) * D;
    bf16* outb = out + ((size_t)(tile.row0 + tokb) * n_heads + headb) * D;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        if (va)
            *reinterpret_cast<unsigned*>(outa + n * 8 + 2 * t4) =
                pack_bf16(fold_result(fold_acc[128 * (4 * n + 0)], fold_la),
                          fold_result(fold_acc[128 * (4 * n + 1)], fold_la));
        if (vb)
            *reinterpret_cast<unsigned*>(outb + n * 8 + 2 * t4) =
                pack_bf16(fold_result(fold_acc[128 * (4 * n + 2)], fold_lb),
                          fold_result(fold_acc[128 * (4 * n + 3)], fold_lb));
    }
}
}  // namespace minnow_attn_wgmma
#endif

// grid = (wide tiles, G), block = minnow_attn_wgmma::THREADS (384), dynamic shared memory =
// minnow_attn_wgmma::SMEM_BYTES (attention_wgmma_smem_bytes in ops). `tiles` lists tiles of
// 2 x (64 / group) tokens (attention_tiles with twice the tokens); the other arguments as
// attention_fa_seq_d128, whose bits it gives. Head dim 128 only.
extern "C" __global__ void __launch_bounds__(minnow_attn_wgmma::THREADS, 1)
    attention_wgmma_seq_d128(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, const int4* segs,
                             const int2* tiles, const int* tables, int T, int n_heads, int n_kv, int block,
                             float scale, int chunk_tiles) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    (void)T;
    minnow_attn_wgmma::attention_seq(q, k_cache, v_cache, out, segs, tiles, tables, n_heads, n_kv, block, scale,
                                     chunk_tiles);
#else
    __trap();  // launched only where the sm_90a build is loaded
#endif
}
