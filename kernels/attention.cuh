// What minnow's attention kernels share (kernels/attention.cu, kernels/attention_wgmma.cu): the
// block-causal key limit, the work list of a batched forward, paged K/V rows, and the fold that
// merges a row's fixed key chunks. Kernels that use the same functions give the same bits.
#pragma once
#include "common.cuh"

namespace minnow_attention {
__device__ __forceinline__ int key_limit(int pos, int block, int end) {
    const int lim = (pos / block + 1) * block;  // floor(p_k / B) <= floor(p_q / B)
    return lim < end ? lim : end;
}

// One step of the fold that merges a row's key chunks in key order: the running state (M, L,
// acc) takes chunk (m_s, l_s, O_s) as
//   M' = max(M, m_s), a = e^(M - M') (0 while nothing is folded), b = e^(m_s - M'),
//   L' = l_s b + L a, acc' = O_s b + acc a (each one rounding of a product, then one fused
//   multiply-add), and the row's output is BF16(acc / L) after the last chunk.
// Chunks with m_s = -inf (no key of the row) are skipped by the caller. attention_combine (chunks
// from memory) and attention_fa_seq (chunks in registers) both fold with these functions, in the
// same order, so they give the same bits.
struct FoldScale {
    float a, b;
};
__device__ __forceinline__ FoldScale fold_scale(float& M, float m_s) {
    const float next = fmaxf(M, m_s);
    const FoldScale f{M == -INFINITY ? 0.f : expf(M - next), expf(m_s - next)};
    M = next;
    return f;
}
__device__ __forceinline__ float fold(float acc, float chunk, FoldScale f) {
    return __fmaf_rn(chunk, f.b, __fmul_rn(acc, f.a));
}
__device__ __forceinline__ float fold_result(float acc, float L) { return __fdiv_rn(acc, L); }

// Two probabilities e^(x - m) of one row rounded to BF16 (as the reference rounds P before P.V),
// packed as the P.V product's A-fragment word (x0 in the low half), with their sum added to
// `sum` from the rounded values (so the normalisation matches what P.V accumulates). All zero
// while the row's max is -inf (no key yet). e^(x - m) is computed as 2^(x log2(e) - m log2(e)):
// one fused multiply-add and the SFU's exp2 per score (m log2(e) is the same product for every
// score of the row), where expf spent ten instructions; the result differs from expf's by a few
// F32 ulps, far below the BF16 rounding that follows. One conversion packs both values; the sum
// unpacks them with integer operations instead of converting each to BF16 and back. Every
// kernel of the head-dim-64/128 family (attention_fa_*, attention_wgmma_*) computes P here, so
// they keep giving each other's bits.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// Two F32 values rounded to BF16 and packed low, high: an A fragment register of P, or two
// output columns.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}
__device__ __forceinline__ unsigned probs_bf16x2(float x0, float x1, float m, float& sum) {
    constexpr float LOG2E = 1.4426950408889634f;
    const float ml = m * LOG2E;
    const float e0 = m == -INFINITY ? 0.f : exp2_approx(__fmaf_rn(x0, LOG2E, -ml));
    const float e1 = m == -INFINITY ? 0.f : exp2_approx(__fmaf_rn(x1, LOG2E, -ml));
    const unsigned u = pack_bf16(e0, e1);
    sum += __uint_as_float(u << 16) + __uint_as_float(u & 0xffff0000u);
    return u;
}
}  // namespace minnow_attention

// The work of one attention CTA in a batched forward. segs[s] = (first row of segment s in the
// batch, its length, the absolute position of its first row, the start of its block table in
// `tables`); tiles[blockIdx.x] = (segment, first token of the segment this CTA takes).
struct AttnTile {
    int row0, len, pos0, tok0;
    const int* table;
};
__device__ __forceinline__ AttnTile attn_tile(const int4* __restrict__ segs, const int2* __restrict__ tiles,
                                              const int* __restrict__ tables, int index) {
    const int2 t = tiles[index];
    const int4 s = segs[t.x];
    return AttnTile{s.x, s.y, s.z, t.y, tables + s.w};
}
// Row of key position `key` in the layer's pool [pages * page, G, D]: page table[key / page]
// (a shift and a mask for the power-of-two page sizes every checkpoint uses).
__device__ __forceinline__ size_t kv_row(const int* table, int key, int page) {
    if ((page & (page - 1)) == 0) {
        const int shift = __ffs(page) - 1;
        return (size_t)table[key >> shift] * page + (key & (page - 1));
    }
    return (size_t)table[key / page] * page + key % page;
}

