// 2.2 block routing (docs/llada2-model.md §7.8) as device functions shared by `route_block`
// (kernels/router.cu) and the fused route + gate/up kernel of kernels/pool_gemm.cu. All in F32;
// ties go to the lower expert index, as in the reference; selection uses exact comparisons.
//   admission: g_j = max over the block's rows of sigmoid(logit) + bias; the `capacity` largest g
//              are admitted, pool entry q = the expert of admission rank q.
//   top-k:     each token's k largest biased scores among the admitted experts, in rank order,
//              with weights w = s / (sum s + 1e-20) * scale from the unbiased scores s.
// The functions run on the CTA's threads [0, n) (n a multiple of 32) and synchronise them with
// named barrier 1, so other warps of the CTA may be doing something else meanwhile.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// "a ranks before b": larger value first, lower index on ties.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
    return va > vb || (va == vb && a < b);
}

// Barrier over threads [0, n) of the CTA.
__device__ __forceinline__ void route_sync(int n) { asm volatile("bar.sync 1, %0;\n" ::"r"(n) : "memory"); }

// Shared-memory scratch of one CTA's routing.
struct BlockRouteScratch {
    float* g;           // [E] admission scores
    int* pool;          // [capacity] the admitted experts in rank order
    float* tok_biased;  // [tokens x E] biased scores of the CTA's tokens
    float* tok_score;   // [tokens x E] unbiased scores
    float* chosen;      // [tokens x k] unbiased scores of the chosen experts, in rank order
};

// Admission of the routing block of logits rows [r0, r0 + rows); also keeps the scores of the
// CTA's tokens r0 + u0 .. r0 + u0 + nu - 1. Leaves s.pool complete for every participating thread.
__device__ void block_admit(const float* __restrict__ logits, const float* __restrict__ bias, int r0, int rows,
                            int E, int capacity, int u0, int nu, const BlockRouteScratch& s, int tid, int n) {
    for (int j = tid; j < E; j += n) {
        const float bias_j = bias[j];
        float best = -INFINITY;
        // 32 rows' loads in flight at once (one L2 round trip per 32 rows, not per row).
        for (int r = 0; r < rows; r += 32) {
            float v[32];
#pragma unroll
            for (int u = 0; u < 32; ++u) v[u] = r + u < rows ? logits[(size_t)(r0 + r + u) * E + j] : 0.f;
#pragma unroll
            for (int u = 0; u < 32; ++u) {
                if (r + u >= rows) break;
                const float sc = sigmoidf(v[u]), biased = sc + bias_j;
                best = fmaxf(best, biased);
                const int lu = r + u - u0;
                if (lu >= 0 && lu < nu) {
                    s.tok_score[lu * E + j] = sc;
                    s.tok_biased[lu * E + j] = biased;
                }
            }
        }
        s.g[j] = best;
    }
    route_sync(n);
    for (int j = tid; j < E; j += n) {
        const float v = s.g[j];
        int rank = 0;
#pragma unroll 8
        for (int i = 0; i < E; ++i) rank += ranks_before(s.g[i], i, v, j);
        if (rank < capacity) s.pool[rank] = j;
    }
    route_sync(n);
}

// The top-k of the CTA's tokens among the pool (after block_admit): writes topk_idx / topk_w of
// tokens r0 + u0 + lu and, with `slot_pos`, each assignment's row qi * row_stride + u0 + lu in the
// pooled outputs (qi: the chosen expert's pool entry).
__device__ void block_topk(const BlockRouteScratch& s, int r0, int u0, int nu, int E, int capacity, int k,
                           float scale, int* __restrict__ topk_idx, float* __restrict__ topk_w,
                           int* __restrict__ slot_pos, int row_stride, int tid, int n) {
    // One thread per (token, pool entry) pair.
    for (int item = tid; item < nu * capacity; item += n) {
        const int lu = item / capacity, qi = item % capacity, e = s.pool[qi];
        const float* row = s.tok_biased + lu * E;
        const float v = row[e];
        int rank = 0;
#pragma unroll 8
        for (int p = 0; p < capacity; ++p) {
            const int jj = s.pool[p];
            rank += ranks_before(row[jj], jj, v, e);
        }
        if (rank < k) {
            const int t = r0 + u0 + lu;
            topk_idx[t * k + rank] = e;
            s.chosen[lu * k + rank] = s.tok_score[lu * E + e];
            if (slot_pos) slot_pos[t * k + rank] = qi * row_stride + u0 + lu;
        }
    }
    route_sync(n);
    if (tid < nu) {
        const float* c = s.chosen + tid * k;
        float sum = 0.f;
        for (int i = 0; i < k; ++i) sum += c[i];
        const int t = r0 + u0 + tid;
        for (int i = 0; i < k; ++i) topk_w[t * k + i] = k > 1 ? c[i] / (sum + 1e-20f) * scale : c[i] * scale;
    }
}
