// MoE router on the GPU (docs/llada2-model.md §7.6-7.8), all in F32, plus the dispatch that groups
// the (token, slot) assignments by expert for the grouped expert GEMM. Ties always go to the lower
// expert (or group) index; selection uses exact comparisons (no perturbation).
#include "common.cuh"

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// "a ranks before b": larger value first, lower index on ties.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
    return va > vb || (va == vb && a < b);
}

// 2.2 block admission. grid = number of routing blocks (rows [b*block, b*block + block) of the
// forward, clipped to T), blockDim = E (<= 1024). admitted[b, j] = 1 for the `capacity` experts
// with the largest g_j = max over the block's rows of sigmoid(logit) + bias.
extern "C" __global__ void route_block_admit(const float* __restrict__ logits, const float* __restrict__ bias,
                                             unsigned char* __restrict__ admitted, int T, int E, int block,
                                             int capacity) {
    pdl_enter();
    extern __shared__ float g[];
    const int j = threadIdx.x, b = blockIdx.x;
    if (j < E) {
        float best = -INFINITY;
        const int r1 = min(T, (b + 1) * block);
        for (int r = b * block; r < r1; ++r) best = fmaxf(best, sigmoidf(logits[(size_t)r * E + j]) + bias[j]);
        g[j] = best;
    }
    __syncthreads();
    if (j < E) {
        int rank = 0;
        for (int i = 0; i < E; ++i) rank += ranks_before(g[i], i, g[j], j);
        admitted[(size_t)b * E + j] = rank < capacity;
    }
}

// Token top-k (one CTA per token, blockDim = E <= 1024). The candidates are either the experts
// admitted to the token's block (`admitted` != null, 2.2) or those of the `topk_group` best groups
// (2.0/2.1: group score = sum of the two largest biased scores of its E / n_group experts).
// Writes the k chosen experts in rank order (biased score descending) and their weights
// w = s / (sum s + 1e-20) * scale computed from the unbiased sigmoid scores s.
extern "C" __global__ void route_topk(const float* __restrict__ logits, const float* __restrict__ bias,
                                      const unsigned char* __restrict__ admitted, int block, int E, int k,
                                      int n_group, int topk_group, float scale, int* __restrict__ topk_idx,
                                      float* __restrict__ topk_w) {
    pdl_enter();
    extern __shared__ float sh[];
    float* score = sh;             // E unbiased sigmoid scores
    float* cand = sh + E;          // E candidate (biased or -inf) scores
    float* group_score = sh + 2 * E;  // n_group
    float* chosen = group_score + 64;  // k unbiased scores of the chosen experts, in rank order
    __shared__ int group_keep[64];
    const int t = blockIdx.x, j = threadIdx.x;
    float biased = -INFINITY;
    if (j < E) {
        const float s = sigmoidf(logits[(size_t)t * E + j]);
        score[j] = s;
        biased = s + bias[j];
        cand[j] = biased;
    }
    __syncthreads();
    if (admitted) {
        if (j < E && !admitted[(size_t)(t / block) * E + j]) cand[j] = -INFINITY;
    } else {
        const int gsize = E / n_group;
        if (j < n_group) {
            float a = -INFINITY, b = -INFINITY;  // two largest of the group
            for (int i = j * gsize; i < (j + 1) * gsize; ++i) {
                const float v = cand[i];
                if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
            }
            group_score[j] = gsize >= 2 ? a + b : a;
        }
        __syncthreads();
        if (j < n_group) {
            int rank = 0;
            for (int i = 0; i < n_group; ++i) rank += ranks_before(group_score[i], i, group_score[j], j);
            group_keep[j] = rank < topk_group;
        }
        __syncthreads();
        if (j < E && !group_keep[j / gsize]) cand[j] = -INFINITY;
    }
    __syncthreads();
    if (j < E && cand[j] != -INFINITY) {  // excluded experts never rank among the first k
        const float v = cand[j];
        int rank = 0;
        for (int i = 0; i < E; ++i) rank += ranks_before(cand[i], i, v, j);
        if (rank < k) {
            topk_idx[t * k + rank] = j;
            chosen[rank] = score[j];
        }
    }
    __syncthreads();
    if (j == 0) {
        float sum = 0.f;
        for (int r = 0; r < k; ++r) sum += chosen[r];
        for (int r = 0; r < k; ++r) topk_w[t * k + r] = k > 1 ? chosen[r] / (sum + 1e-20f) * scale : chosen[r] * scale;
    }
}

// Exclusive prefix sum over the CTA (blockDim.x a multiple of 32); `total` gets the sum.
__device__ int block_exclusive_scan(int v, int* scratch, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? scratch[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        scratch[lane] = w;  // inclusive sums of the warps
    }
    __syncthreads();
    const int before = warp == 0 ? 0 : scratch[warp - 1];
    *total = scratch[nwarps - 1];
    return before + incl - v;
}

// Groups the A = T * k assignments by expert (one CTA of 1024 threads, E <= 1024). With
// `shared_expert` >= 0 every token also gets an assignment to that expert (the shared expert packed
// after the routed ones, so the grouped GEMM computes it too): assignment A + t is token t's.
// Outputs:
//   slot_pos[a]      row of assignment a in the expert-sorted order
//   row_token[p]     token whose activation row p reads
//   tiles[i]         (expert, first row, end row) of the i-th tile of at most `tile_rows` rows
//   num_tiles[0]     number of tiles (the grouped GEMM's grid has an upper bound of tiles and the
//                    CTAs past num_tiles exit, so no host round trip is needed)
// Rows of one expert are in no particular order (atomics); each row's result does not depend on it.
// The dispatch, run by a whole CTA (blockDim >= E, a multiple of 32); `cnt` is 2 * E ints of
// shared memory.
__device__ void dispatch_cta(const int* __restrict__ topk_idx, int A, int k, int E, int tile_rows, int shared_expert,
                             int* __restrict__ slot_pos, int* __restrict__ row_token, int4* __restrict__ tiles,
                             int* __restrict__ num_tiles, int* cnt) {
    int* cursor = cnt + E;
    __shared__ int scratch[32];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int total_a = shared_expert >= 0 ? A + A / k : A;
    for (int a = threadIdx.x; a < total_a; a += blockDim.x) atomicAdd(&cnt[a < A ? topk_idx[a] : shared_expert], 1);
    __syncthreads();
    const int e = threadIdx.x;
    const int c = e < E ? cnt[e] : 0;
    const int nt = (c + tile_rows - 1) / tile_rows;
    int total;
    const int off = block_exclusive_scan(c, scratch, &total);
    const int toff = block_exclusive_scan(nt, scratch, &total);
    if (e < E) {
        cursor[e] = off;
        for (int r = 0; r < nt; ++r)
            tiles[toff + r] = make_int4(e, off + r * tile_rows, off + min(c, (r + 1) * tile_rows), 0);
    }
    if (threadIdx.x == 0) num_tiles[0] = total;
    __syncthreads();
    for (int a = threadIdx.x; a < total_a; a += blockDim.x) {
        const int p = atomicAdd(&cursor[a < A ? topk_idx[a] : shared_expert], 1);
        slot_pos[a] = p;
        row_token[p] = a < A ? a / k : a - A;
    }
}

extern "C" __global__ void moe_dispatch(const int* __restrict__ topk_idx, int A, int k, int E, int tile_rows,
                                        int shared_expert, int* __restrict__ slot_pos, int* __restrict__ row_token,
                                        int4* __restrict__ tiles, int* __restrict__ num_tiles) {
    pdl_enter();
    extern __shared__ int cnt[];  // E counts, then E cursors
    dispatch_cta(topk_idx, A, k, E, tile_rows, shared_expert, slot_pos, row_token, tiles, num_tiles, cnt);
}

// 2.2 block routing in one kernel: admission and every token's top-k for one routing block per
// CTA (blockDim = 1024). The block's sigmoid scores sit in shared memory (2 * rows * E floats),
// so the logits are read once and the whole router is one launch. Same rules as
// route_block_admit + route_topk (ties to the lower expert index).
extern "C" __global__ void __launch_bounds__(1024)
    route_block_fused(const float* __restrict__ logits, const float* __restrict__ bias, int T, int E, int block,
                      int capacity, int k, float scale, int* __restrict__ topk_idx, float* __restrict__ topk_w) {
    pdl_enter();
    extern __shared__ float sh[];
    float* biased = sh;                // rows x E
    float* score = sh + block * E;     // rows x E
    __shared__ float g[1024];
    __shared__ int pool[1024];
    __shared__ float chosen[1024];     // rows x k unbiased scores in rank order
    const int tid = threadIdx.x, nt = blockDim.x;
    const int r0 = blockIdx.x * block, rows = min(block, T - r0);
    for (int i = tid; i < rows * E; i += nt) {
        const float s = sigmoidf(logits[(size_t)r0 * E + i]);
        score[i] = s;
        biased[i] = s + bias[i % E];
    }
    __syncthreads();
    if (tid < E) {
        float best = -INFINITY;
        for (int r = 0; r < rows; ++r) best = fmaxf(best, biased[r * E + tid]);
        g[tid] = best;
    }
    __syncthreads();
    if (tid < E) {
        const float v = g[tid];
        int rank = 0;
        for (int i = 0; i < E; ++i) rank += ranks_before(g[i], i, v, tid);
        if (rank < capacity) pool[rank] = tid;
    }
    __syncthreads();
    for (int p = tid; p < rows * capacity; p += nt) {
        const int r = p / capacity, j = pool[p % capacity];
        const float* row = biased + r * E;
        const float v = row[j];
        int rank = 0;
        for (int q = 0; q < capacity; ++q) {
            const int jj = pool[q];
            rank += ranks_before(row[jj], jj, v, j);
        }
        if (rank < k) {
            topk_idx[(r0 + r) * k + rank] = j;
            chosen[r * k + rank] = score[r * E + j];
        }
    }
    __syncthreads();
    if (tid < rows) {
        float sum = 0.f;
        for (int i = 0; i < k; ++i) sum += chosen[tid * k + i];
        for (int i = 0; i < k; ++i) {
            const float c = chosen[tid * k + i];
            topk_w[(r0 + tid) * k + i] = k > 1 ? c / (sum + 1e-20f) * scale : c * scale;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The whole router of a short forward in one launch (decoding: T <= ROUTE_FUSED_MAX_T tokens):
//   1. every CTA computes the logits of ROUTE_FUSED_EXPERTS_PER_CTA experts for all T rows
//      (F32 sums of exact BF16 products, like the BF16 GEMM with F32 output it replaces);
//   2. the last CTA to finish (a ticket counter, reset by that CTA for the next launch) routes
//      every token (2.2 block admission or 2.0/2.1 group-limited top-k, one warp per token,
//      the k winners picked by k rounds of a warp argmax: the same order as the rank rule of
//      route_topk, larger biased score first, lower index on ties) and runs the dispatch.
// Replaces the router GEMM, the route kernel(s) and moe_dispatch: three launches of a few
// microseconds each, latency-bound at decode shapes, become one.
// grid = ceil(E / ROUTE_FUSED_EXPERTS_PER_CTA), block = ROUTE_FUSED_THREADS.
// Limits (checked by the host): E <= 256 routed experts (+1 packed shared <= 512 slots),
// k <= 32, n_group <= 32, ceil(T / block) <= ROUTE_FUSED_MAX_BLOCKS for 2.2, d % 8 == 0,
// d <= 4096. Dynamic shared memory: T * E floats.
#define ROUTE_FUSED_THREADS 1024
#define ROUTE_FUSED_EXPERTS_PER_CTA 1
#define ROUTE_FUSED_MAX_T 128
#define ROUTE_FUSED_MAX_BLOCKS 4
#define ROUTE_FUSED_MAX_E 256
#define ROUTE_FUSED_MAX_CHUNKS 16

template <typename WT>
__device__ __forceinline__ float dot8(uint4 xv, const WT* w);
template <>
__device__ __forceinline__ float dot8<bf16>(uint4 xv, const bf16* w) {
    const uint4 wv = *reinterpret_cast<const uint4*>(w);
    const bf16* xb = reinterpret_cast<const bf16*>(&xv);
    const bf16* wb = reinterpret_cast<const bf16*>(&wv);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(xb[i]), to_f32(wb[i]), acc);
    return acc;
}
template <>
__device__ __forceinline__ float dot8<float>(uint4 xv, const float* w) {
    const float4 w0 = *reinterpret_cast<const float4*>(w);
    const float4 w1 = *reinterpret_cast<const float4*>(w + 4);
    const bf16* xb = reinterpret_cast<const bf16*>(&xv);
    float acc = 0.f;
    acc = fmaf(to_f32(xb[0]), w0.x, acc);
    acc = fmaf(to_f32(xb[1]), w0.y, acc);
    acc = fmaf(to_f32(xb[2]), w0.z, acc);
    acc = fmaf(to_f32(xb[3]), w0.w, acc);
    acc = fmaf(to_f32(xb[4]), w1.x, acc);
    acc = fmaf(to_f32(xb[5]), w1.y, acc);
    acc = fmaf(to_f32(xb[6]), w1.z, acc);
    acc = fmaf(to_f32(xb[7]), w1.w, acc);
    return acc;
}

// (biased score, expert, unbiased score) of a warp argmax: larger score first, lower index on ties.
struct Pick {
    float v;
    int j;
    float s;
};
__device__ __forceinline__ Pick pick_better(Pick a, Pick b) { return ranks_before(b.v, b.j, a.v, a.j) ? b : a; }

template <typename WT>
__device__ void route_fused_body(const bf16* __restrict__ x, const WT* __restrict__ router_w,
                                 const float* __restrict__ bias, float* __restrict__ logits,
                                 unsigned* __restrict__ counter, int T, int D, int E, int k, int block, int capacity,
                                 int n_group, int topk_group, float scale, int* __restrict__ topk_idx,
                                 float* __restrict__ topk_w, int tile_rows, int shared_expert,
                                 int* __restrict__ slot_pos, int* __restrict__ row_token, int4* __restrict__ tiles,
                                 int* __restrict__ num_tiles) {
    extern __shared__ float sig[];  // T x E sigmoid scores (last CTA only)
    __shared__ float sbias[ROUTE_FUSED_MAX_E];
    __shared__ float g[ROUTE_FUSED_MAX_E];
    __shared__ short pool[ROUTE_FUSED_MAX_BLOCKS][ROUTE_FUSED_MAX_E];
    __shared__ float cand[ROUTE_FUSED_THREADS / 32][ROUTE_FUSED_MAX_E];
    __shared__ int cnt[2 * 2 * ROUTE_FUSED_MAX_E];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;

    // The CTA's router rows into L2 while the previous kernel finishes (they are never written).
    {
        const int bytes = ROUTE_FUSED_EXPERTS_PER_CTA * D * (int)sizeof(WT);
        const char* rows = reinterpret_cast<const char*>(router_w + (size_t)blockIdx.x * ROUTE_FUSED_EXPERTS_PER_CTA * D);
        const int e_end = min(E, (int)(blockIdx.x + 1) * ROUTE_FUSED_EXPERTS_PER_CTA);
        const int valid = (e_end - (int)blockIdx.x * ROUTE_FUSED_EXPERTS_PER_CTA) * D * (int)sizeof(WT);
        for (int off = tid * 128; off < min(bytes, valid); off += blockDim.x * 128) prefetch_l2(rows + off);
    }
    pdl_enter();

    // 1. Logits of this CTA's experts: warp w takes expert e0 + w % EPC and rows w / EPC, + step.
    // A lane's 16-byte chunks of a row are loaded together (D <= 32 * 8 * ROUTE_FUSED_MAX_CHUNKS).
    {
        const int e = blockIdx.x * ROUTE_FUSED_EXPERTS_PER_CTA + warp % ROUTE_FUSED_EXPERTS_PER_CTA;
        const int step = nwarps / ROUTE_FUSED_EXPERTS_PER_CTA;
        const int chunks = D / 8;
        if (e < E) {
            const WT* wrow = router_w + (size_t)e * D;
            for (int r = warp / ROUTE_FUSED_EXPERTS_PER_CTA; r < T; r += step) {
                const uint4* xrow = reinterpret_cast<const uint4*>(x + (size_t)r * D);
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < ROUTE_FUSED_MAX_CHUNKS; ++i) {
                    const int c = lane + 32 * i;
                    if (c < chunks) acc += dot8<WT>(xrow[c], wrow + c * 8);
                }
                acc = warp_sum(acc);
                if (lane == 0) logits[(size_t)r * E + e] = acc;
            }
        }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned ticket = atomicAdd(counter, 1u);
        last = ticket == gridDim.x - 1;
        if (last) *counter = 0;  // ready for the next launch (which starts after this one ends)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();

    // 2. The last CTA: every sigmoid score into shared memory in one pass of independent loads
    // (a loop of dependent L2 round trips here cost more than the whole logits phase).
    for (int j = tid; j < E; j += blockDim.x) sbias[j] = bias[j];
    for (int base = 0; base < T * E; base += 8 * ROUTE_FUSED_THREADS) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = base + u * ROUTE_FUSED_THREADS + tid;
            v[u] = i < T * E ? __ldcg(logits + i) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = base + u * ROUTE_FUSED_THREADS + tid;
            if (i < T * E) sig[i] = sigmoidf(v[u]);
        }
    }
    __syncthreads();

    // 2a. 2.2 block admission: the `capacity` experts with the largest max-over-rows biased score.
    if (capacity > 0) {
        for (int b = 0; b * block < T; ++b) {
            const int r1 = min(T, (b + 1) * block);
            if (tid < E) {
                float best = -INFINITY;
                for (int r = b * block; r < r1; ++r) best = fmaxf(best, sig[r * E + tid] + sbias[tid]);
                g[tid] = best;
            }
            __syncthreads();
            if (tid < E) {
                const float v = g[tid];
                int rank = 0;
#pragma unroll 8
                for (int i = 0; i < E; ++i) rank += ranks_before(g[i], i, v, tid);
                // The block's admitted experts in rank order: a token's candidates.
                if (rank < capacity) pool[b][rank] = tid;
            }
            __syncthreads();
        }
    }
    // 2b. Each token's top-k, one warp per token; lane l holds experts l, l + 32, ...
    for (int t = warp; t < T; t += nwarps) {
        // Lane l holds candidates l, l + 32, ...: the admitted pool (2.2) or every expert.
        float sv[ROUTE_FUSED_MAX_E / 32], bv[ROUTE_FUSED_MAX_E / 32];
        int jv[ROUTE_FUSED_MAX_E / 32];
        const int ncand = capacity > 0 ? capacity : E;
#pragma unroll
        for (int i = 0; i < ROUTE_FUSED_MAX_E / 32; ++i) {
            const int p = lane + 32 * i;
            const int j = p < ncand ? (capacity > 0 ? pool[t / block][p] : p) : 0;
            jv[i] = j;
            sv[i] = 0.f;
            bv[i] = -INFINITY;
            if (p < ncand) {
                sv[i] = sig[t * E + j];
                bv[i] = sv[i] + sbias[j];
            }
        }
        if (capacity == 0) {
            // Group score: the sum of the two largest biased scores of the group's E / n_group
            // experts; keep the topk_group best groups.
            float* c = cand[warp];
#pragma unroll
            for (int i = 0; i < ROUTE_FUSED_MAX_E / 32; ++i)
                if (lane + 32 * i < E) c[lane + 32 * i] = bv[i];
            __syncwarp();
            const int gsize = E / n_group;
            float gs = -INFINITY;
            if (lane < n_group) {
                float a = -INFINITY, b2 = -INFINITY;
                for (int i = lane * gsize; i < (lane + 1) * gsize; ++i) {
                    const float v = c[i];
                    if (v > a) { b2 = a; a = v; } else if (v > b2) { b2 = v; }
                }
                gs = gsize >= 2 ? a + b2 : a;
            }
            int rank = 0;
            for (int i = 0; i < n_group; ++i) rank += ranks_before(__shfl_sync(0xffffffffu, gs, i), i, gs, lane);
            const unsigned keep = __ballot_sync(0xffffffffu, lane < n_group && rank < topk_group);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < ROUTE_FUSED_MAX_E / 32; ++i)
                if (lane + 32 * i < E && !((keep >> (jv[i] / gsize)) & 1u)) bv[i] = -INFINITY;
        }
        float mine = 0.f;  // lane r keeps the unbiased score of the r-th pick
        for (int r = 0; r < k; ++r) {
            Pick best = {-INFINITY, 0x7fffffff, 0.f};
#pragma unroll
            for (int i = 0; i < ROUTE_FUSED_MAX_E / 32; ++i)
                if (bv[i] != -INFINITY) best = pick_better(best, Pick{bv[i], jv[i], sv[i]});
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const Pick other = {__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.j, o),
                                    __shfl_xor_sync(0xffffffffu, best.s, o)};
                best = pick_better(best, other);
            }
#pragma unroll
            for (int i = 0; i < ROUTE_FUSED_MAX_E / 32; ++i)
                if (jv[i] == best.j) bv[i] = -INFINITY;
            // Only a NaN score can leave no pick: expert 0 keeps the dispatch in bounds.
            if (lane == 0) topk_idx[t * k + r] = best.j < E ? best.j : 0;
            if (lane == r) mine = best.s;
        }
        float sum = 0.f;
        for (int r = 0; r < k; ++r) sum += __shfl_sync(0xffffffffu, mine, r);
        if (lane < k) topk_w[t * k + lane] = k > 1 ? mine / (sum + 1e-20f) * scale : mine * scale;
    }
    __syncthreads();
    // 3. The dispatch over the packed slots.
    dispatch_cta(topk_idx, T * k, k, shared_expert >= 0 ? E + 1 : E, tile_rows, shared_expert, slot_pos, row_token,
                 tiles, num_tiles, cnt);
}

#define ROUTE_FUSED_ARGS                                                                                           \
    const bf16 *x, const float *bias, float *logits, unsigned *counter, int T, int D, int E, int k, int block,     \
        int capacity, int n_group, int topk_group, float scale, int *topk_idx, float *topk_w, int tile_rows,       \
        int shared_expert, int *slot_pos, int *row_token, int4 *tiles, int *num_tiles
#define ROUTE_FUSED_PASS                                                                                           \
    x, w, bias, logits, counter, T, D, E, k, block, capacity, n_group, topk_group, scale, topk_idx, topk_w,       \
        tile_rows, shared_expert, slot_pos, row_token, tiles, num_tiles
// capacity > 0: 2.2 block admission; else group-limited routing over n_group groups.
extern "C" __global__ void __launch_bounds__(ROUTE_FUSED_THREADS) route_fused_bf16(const bf16* w, ROUTE_FUSED_ARGS) {
    route_fused_body<bf16>(ROUTE_FUSED_PASS);
}
extern "C" __global__ void __launch_bounds__(ROUTE_FUSED_THREADS) route_fused_f32(const float* w, ROUTE_FUSED_ARGS) {
    route_fused_body<float>(ROUTE_FUSED_PASS);
}
