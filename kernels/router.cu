// MoE router on the GPU (docs/model.md §7.6-7.8), all in F32, plus the dispatch that groups
// the (token, slot) assignments by expert for the grouped expert GEMM. Ties always go to the lower
// expert (or group) index; selection uses exact comparisons (no perturbation).
#include "common.cuh"

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// "a ranks before b": larger value first, lower index on ties.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
    return va > vb || (va == vb && a < b);
}

// 2.0/2.1 token top-k (one CTA per token, blockDim = E <= 1024). The candidates are the experts of
// the `topk_group` best groups (group score = sum of the two largest biased scores of its
// E / n_group experts).
// Writes the k chosen experts in rank order (biased score descending) and their weights
// w = s / (sum s + 1e-20) * scale computed from the unbiased sigmoid scores s.
extern "C" __global__ void route_topk(const float* __restrict__ logits, const float* __restrict__ bias, int E,
                                      int k, int n_group, int topk_group, float scale, int* __restrict__ topk_idx,
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

// The parts of the dispatch below (one CTA, or three launches over many CTAs). Each thread reads
// DISPATCH_UNROLL assignments before it updates their counters, so their loads are in flight
// together.
#define DISPATCH_UNROLL 8
// Calls f(a, expert) for the assignments a in [a_begin, a_end), this thread's share.
template <typename F>
__device__ __forceinline__ void for_assignments(const int* __restrict__ topk_idx, int a_begin, int a_end, F f) {
    for (int b = a_begin + threadIdx.x; b < a_end; b += DISPATCH_UNROLL * blockDim.x) {
        int ex[DISPATCH_UNROLL];
#pragma unroll
        for (int u = 0; u < DISPATCH_UNROLL; ++u) {
            const int a = b + u * blockDim.x;
            // Through L2 (ld.global.cg): route_block_dispatch's last CTA reads what other CTAs of
            // its own launch wrote, which this SM's L1 cannot be trusted to hold.
            ex[u] = a < a_end ? __ldcg(topk_idx + a) : -1;
        }
#pragma unroll
        for (int u = 0; u < DISPATCH_UNROLL; ++u)
            if (ex[u] >= 0) f(b + u * blockDim.x, ex[u]);
    }
}
// Counts the routed experts of assignments [a_begin, a_end) into `cnt` (shared memory).
__device__ __forceinline__ void count_assignments(const int* __restrict__ topk_idx, int a_begin, int a_end,
                                                  int* cnt) {
    for_assignments(topk_idx, a_begin, a_end, [&](int, int e) { atomicAdd(&cnt[e], 1); });
}
// Places assignments [a_begin, a_end) at their expert's next row (`cursor`, shared memory).
__device__ __forceinline__ void place_assignments(const int* __restrict__ topk_idx, int a_begin, int a_end, int k,
                                                  int* cursor, int* __restrict__ slot_pos,
                                                  int* __restrict__ row_token) {
    for_assignments(topk_idx, a_begin, a_end, [&](int a, int e) {
        const int p = atomicAdd(&cursor[e], 1);
        slot_pos[a] = p;
        row_token[p] = a / k;
    });
}
// The packed shared expert's rows, its tokens in order from row `first`: tokens t0, t0 + step, ...
__device__ __forceinline__ void place_shared(int first, int A, int T, int t0, int step, int* __restrict__ slot_pos,
                                             int* __restrict__ row_token) {
    for (int t = t0; t < T; t += step) {
        slot_pos[A + t] = first + t;
        row_token[first + t] = t;
    }
}
// Thread e (< E, of a CTA of blockDim >= E threads) holding expert e's row count c: every
// expert's first row (returned) and its tiles of at most `tile_rows` rows, in expert order, and
// the number of tiles.
__device__ __forceinline__ int plan_tiles(int c, int E, int tile_rows, int* scratch, int4* __restrict__ tiles,
                                          int* __restrict__ num_tiles) {
    const int e = threadIdx.x;
    const int nt = (c + tile_rows - 1) / tile_rows;
    int total;
    const int off = block_exclusive_scan(c, scratch, &total);
    const int toff = block_exclusive_scan(nt, scratch, &total);
    if (e < E)
        for (int r = 0; r < nt; ++r)
            tiles[toff + r] = make_int4(e, off + r * tile_rows, off + min(c, (r + 1) * tile_rows), 0);
    if (threadIdx.x == 0) num_tiles[0] = total;
    return off;
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
// Rows of a routed expert are in no particular order (atomics); each row's result does not depend
// on it. The shared expert's rows are its tokens in order, counted and placed without atomics (all
// T of them on one counter would serialise).
__device__ __forceinline__ void dispatch_one_cta(const int* __restrict__ topk_idx, int A, int k, int E, int tile_rows,
                                                 int shared_expert, int* __restrict__ slot_pos,
                                                 int* __restrict__ row_token, int4* __restrict__ tiles,
                                                 int* __restrict__ num_tiles) {
    extern __shared__ int cnt[];  // E counts, then E cursors
    int* cursor = cnt + E;
    __shared__ int scratch[32];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int T = A / k;
    if (shared_expert >= 0 && threadIdx.x == 0) cnt[shared_expert] = T;
    count_assignments(topk_idx, 0, A, cnt);
    __syncthreads();
    const int e = threadIdx.x;
    const int off = plan_tiles(e < E ? cnt[e] : 0, E, tile_rows, scratch, tiles, num_tiles);
    if (e < E) cursor[e] = off;
    __syncthreads();
    place_assignments(topk_idx, 0, A, k, cursor, slot_pos, row_token);
    // No routed assignment moves the shared expert's cursor.
    if (shared_expert >= 0) place_shared(cursor[shared_expert], A, T, threadIdx.x, blockDim.x, slot_pos, row_token);
}
extern "C" __global__ void moe_dispatch(const int* __restrict__ topk_idx, int A, int k, int E, int tile_rows,
                                        int shared_expert, int* __restrict__ slot_pos, int* __restrict__ row_token,
                                        int4* __restrict__ tiles, int* __restrict__ num_tiles) {
    pdl_enter();
    dispatch_one_cta(topk_idx, A, k, E, tile_rows, shared_expert, slot_pos, row_token, tiles, num_tiles);
}

// The same dispatch over several CTAs, for forwards with many assignments (a single CTA's
// scattered writes bound it at ~40 us per layer for a 4,096-token prefill). Three launches:
//   moe_dispatch_count    CTA c counts the routed experts of its contiguous range of assignments
//                         into hist[c * E + e] (E ints per CTA of `scratch`)
//   moe_dispatch_plan     one CTA of 1024 threads: each expert's total (the shared expert's is T),
//                         the same scan and tiles as moe_dispatch, then hist[c * E + e] becomes the
//                         first row CTA c places for expert e (the expert's offset plus the counts
//                         of the CTAs before c)
//   moe_dispatch_scatter  CTA c places its range's assignments from those cursors (shared-memory
//                         atomics), and its share of the shared expert's rows (token order)
// The outputs mean what moe_dispatch's do; rows of a routed expert are again in no particular
// order. grid of count and scatter = the same `ctas` (ops::moe_dispatch picks it; dispatch_range
// cuts A into their contiguous ranges), dynamic shared memory E ints.
__device__ __forceinline__ void dispatch_range(int A, int* a0, int* a1) {
    const int per = (A + gridDim.x - 1) / gridDim.x;
    *a0 = min(A, blockIdx.x * per);
    *a1 = min(A, *a0 + per);
}
extern "C" __global__ void moe_dispatch_count(const int* __restrict__ topk_idx, int A, int E,
                                              int* __restrict__ hist) {
    pdl_enter();
    extern __shared__ int cnt[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    int a0, a1;
    dispatch_range(A, &a0, &a1);
    count_assignments(topk_idx, a0, a1, cnt);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[(size_t)blockIdx.x * E + e] = cnt[e];
}
extern "C" __global__ void moe_dispatch_plan(int* __restrict__ hist, int ctas, int T, int E, int tile_rows,
                                             int shared_expert, int4* __restrict__ tiles,
                                             int* __restrict__ num_tiles) {
    pdl_enter();
    __shared__ int scratch[32];
    const int e = threadIdx.x;
    int c = 0;
    if (e < E) {
        for (int i = 0; i < ctas; ++i) c += hist[(size_t)i * E + e];
        if (e == shared_expert) c += T;
    }
    int next = plan_tiles(c, E, tile_rows, scratch, tiles, num_tiles);
    if (e < E)
        for (int i = 0; i < ctas; ++i) {
            const int h = hist[(size_t)i * E + e];
            hist[(size_t)i * E + e] = next;
            next += h;
        }
}
extern "C" __global__ void moe_dispatch_scatter(const int* __restrict__ topk_idx, int A, int k, int E,
                                                int shared_expert, const int* __restrict__ hist,
                                                int* __restrict__ slot_pos, int* __restrict__ row_token) {
    pdl_enter();
    extern __shared__ int cursor[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = hist[(size_t)blockIdx.x * E + e];
    __syncthreads();
    int a0, a1;
    dispatch_range(A, &a0, &a1);
    place_assignments(topk_idx, a0, a1, k, cursor, slot_pos, row_token);
    // No routed assignment moves the shared expert's cursor: every CTA's is its first row.
    if (shared_expert >= 0)
        place_shared(cursor[shared_expert], A, A / k, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x,
                     slot_pos, row_token);
}

// Most tokens one route_block CTA routes, and the largest top-k it supports (mirrored in ops.rs).
#define ROUTE_MAX_TOKENS 32
#define ROUTE_MAX_K 32

// 2.2 block routing (docs/model.md §7.8): block admission and the top-k of `tpc` consecutive
// tokens of one routing block per CTA; grid = routing blocks * ceil(block / tpc), dynamic shared
// memory 2 * tpc * E floats. Routing block b is the rows blocks[b] = (first row, rows) of the batch
// (each segment of a batched forward cut at its own block boundaries), or with `blocks` null rows
// b * block .. of a single sequence.
// Every CTA recomputes its block's admission from the block's logits (32 x 256 floats from L2 for a
// denoising step), so no CTA waits for another. Expert j is owned by the threads j + p * E32
// (E32 = E rounded up to whole warps, p < ways = blockDim / E32; blockDim >= E32, <= 1024): share
// p takes its slice of the block's rows (their sigmoids and maximum) and its slice of the
// admission rank loop; the maxima and the counts are then combined, which is exact in any grouping,
// so the choices cannot depend on blockDim (one thread per expert spent 13.5 us on a denoising
// step's serial chain, docs/performance.md, session thirty). Ties go to the lower expert index, as
// in the reference.
//   admission: g_j = max over the block's rows of sigmoid(logit) + bias; the `capacity` largest g
//              are admitted, pool entry q = the expert of admission rank q.
//   top-k:     each token's k largest biased scores among the admitted experts, in rank order, with
//              weights w = s / (sum s + 1e-20) * scale from the unbiased scores s. One thread per
//              (token, pool entry) pair, or, when the threads are at least twice the pairs, `lanes`
//              threads per pair sharing its rank loop.
// With `pool_wgu_ptrs` non-null (a forward of one routing block whose experts run as a batched GEMM
// over the admitted pool, ops::route_pooled) it also writes, for pool entry q < capacity and
// q = capacity (the packed shared expert E), the addresses of its gate/up and down weights, and
// for every assignment its row q * pool_row_stride + token in the pooled outputs
// (pool_slot_pos[T * k + t]: token t's shared-expert row).
__device__ __forceinline__ void route_block_body(const float* __restrict__ logits, const float* __restrict__ bias,
                                                 const int2* __restrict__ blocks, int T, int E, int block,
                                                 int capacity, int k, float scale, int tpc,
                                                 int* __restrict__ topk_idx, float* __restrict__ topk_w,
                                                 const bf16* __restrict__ pool_wgu, long long pool_wgu_stride,
                                                 const bf16* __restrict__ pool_wd, long long pool_wd_stride,
                                                 unsigned long long* __restrict__ pool_wgu_ptrs,
                                                 unsigned long long* __restrict__ pool_wd_ptrs,
                                                 int* __restrict__ pool_slot_pos, int pool_row_stride) {
    extern __shared__ float route_scores[];
    float* tok_biased = route_scores;             // tpc x E biased scores of this CTA's tokens
    float* tok_score = route_scores + tpc * E;  // tpc x E unbiased scores
    __shared__ float g[1024];
    __shared__ int pool[1024];
    __shared__ float share_max[1024];  // [p * E32 + j]: share p's maximum for expert j
    __shared__ int share_count[1024];  // [p * E32 + j]: share p's part of expert j's rank
    __shared__ int pair_rank[1024];    // the top-k ranks of the (token, pool entry) pairs
    __shared__ float chosen[ROUTE_MAX_TOKENS * ROUTE_MAX_K];  // unbiased scores in rank order
    const int tid = threadIdx.x;
    const int E32 = (E + 31) & ~31, ways = blockDim.x / E32;
    const int j = tid % E32, p = tid / E32;
    const bool owner = j < E && p < ways;  // one of expert j's shares
    const int ctas_per_block = (block + tpc - 1) / tpc, b = blockIdx.x / ctas_per_block;
    const float bias_j = owner ? bias[j] : 0.f;  // weights: readable before the wait
    pdl_enter();
    const int2 rb = blocks ? blocks[b] : make_int2(b * block, min(block, T - b * block));
    const int r0 = rb.x, rows = rb.y;
    const int u0 = (blockIdx.x % ctas_per_block) * tpc, nu = min(tpc, rows - u0);
    if (nu <= 0) return;  // past the end of a partial last block (the whole CTA)
    if (owner) {
        // Share p's rows, 8 loads in flight at once (one L2 round trip per 8 rows, not per row).
        const int lo = p * rows / ways, hi = (p + 1) * rows / ways;
        float best = -INFINITY;
        for (int r = lo; r < hi; r += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = r + u < hi ? logits[(size_t)(r0 + r + u) * E + j] : 0.f;
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (r + u >= hi) break;
                const float s = sigmoidf(v[u]), biased = s + bias_j;
                best = fmaxf(best, biased);
                const int lu = r + u - u0;
                if (lu >= 0 && lu < nu) {
                    tok_score[lu * E + j] = s;
                    tok_biased[lu * E + j] = biased;
                }
            }
        }
        share_max[p * E32 + j] = best;
    }
    // The top-k's pairs (token lu, pool entry qi), and threads per pair (see below).
    const int pairs = nu * capacity;
    const int lanes = 2 * pairs <= (int)blockDim.x ? min(capacity, (int)blockDim.x / pairs) : 1;
    if (lanes >= 2)
        for (int i = tid; i < pairs; i += blockDim.x) pair_rank[i] = 0;
    __syncthreads();
    float best = -INFINITY;  // g_j, known to each of expert j's shares
    if (owner) {
        for (int s = 0; s < ways; ++s) best = fmaxf(best, share_max[s * E32 + j]);
        if (p == 0) g[j] = best;
    }
    __syncthreads();
    if (owner) {
        const int lo = p * E / ways, hi = (p + 1) * E / ways;
        int count = 0;
#pragma unroll 8
        for (int i = lo; i < hi; ++i) count += ranks_before(g[i], i, best, j);
        share_count[p * E32 + j] = count;
    }
    __syncthreads();
    int q = -1;  // admission rank of expert j = its pool entry, when admitted (shares p == 0)
    if (owner && p == 0) {
        int rank = 0;
        for (int s = 0; s < ways; ++s) rank += share_count[s * E32 + j];
        if (rank < capacity) {
            q = rank;
            pool[rank] = j;
        }
    }
    if (pool_wgu_ptrs) {
        if (u0 == 0) {  // one CTA per block writes the pool's weight addresses
            if (q >= 0) {
                pool_wgu_ptrs[q] = (unsigned long long)(pool_wgu + j * pool_wgu_stride);
                pool_wd_ptrs[q] = (unsigned long long)(pool_wd + j * pool_wd_stride);
            }
            if (tid == 0) {  // the shared expert, packed after the routed ones
                pool_wgu_ptrs[capacity] = (unsigned long long)(pool_wgu + E * pool_wgu_stride);
                pool_wd_ptrs[capacity] = (unsigned long long)(pool_wd + E * pool_wd_stride);
            }
        }
        if (tid < nu) pool_slot_pos[T * k + r0 + u0 + tid] = capacity * pool_row_stride + u0 + tid;
    }
    __syncthreads();
    // Each token's top-k among the admitted: the rank of pair (token lu, pool entry qi) among its
    // token's pairs.
    if (lanes >= 2) {
        // `lanes` threads per pair, each counting a slice of the pool; the counts are added.
        const int item = tid / lanes, lane = tid % lanes;
        if (item < pairs) {
            const int lu = item / capacity, qi = item % capacity, e = pool[qi];
            const float* row = tok_biased + lu * E;
            const float v = row[e];
            const int lo = lane * capacity / lanes, hi = (lane + 1) * capacity / lanes;
            int count = 0;
            for (int i = lo; i < hi; ++i) {
                const int jj = pool[i];
                count += ranks_before(row[jj], jj, v, e);
            }
            if (count) atomicAdd(&pair_rank[item], count);
        }
        __syncthreads();
    }
    for (int item = tid; item < pairs; item += blockDim.x) {
        const int lu = item / capacity, qi = item % capacity, e = pool[qi];
        int rank = 0;
        if (lanes >= 2) {
            rank = pair_rank[item];
        } else {
            const float* row = tok_biased + lu * E;
            const float v = row[e];
#pragma unroll 8
            for (int i = 0; i < capacity; ++i) {
                const int jj = pool[i];
                rank += ranks_before(row[jj], jj, v, e);
            }
        }
        if (rank < k) {
            const int t = r0 + u0 + lu;
            topk_idx[t * k + rank] = e;
            chosen[lu * k + rank] = tok_score[lu * E + e];
            if (pool_wgu_ptrs) pool_slot_pos[t * k + rank] = qi * pool_row_stride + u0 + lu;
        }
    }
    __syncthreads();
    if (tid < nu) {
        const float* c = chosen + tid * k;
        float sum = 0.f;
        for (int i = 0; i < k; ++i) sum += c[i];
        const int t = r0 + u0 + tid;
        for (int i = 0; i < k; ++i) topk_w[t * k + i] = k > 1 ? c[i] / (sum + 1e-20f) * scale : c[i] * scale;
    }
}

#define ROUTE_BLOCK_PARAMS                                                                                          \
    const float *__restrict__ logits, const float *__restrict__ bias, const int2 *__restrict__ blocks, int T, int E, \
        int block, int capacity, int k, float scale, int tpc, int *__restrict__ topk_idx, float *__restrict__ topk_w, \
        const bf16 *__restrict__ pool_wgu, long long pool_wgu_stride, const bf16 *__restrict__ pool_wd,             \
        long long pool_wd_stride, unsigned long long *__restrict__ pool_wgu_ptrs,                                   \
        unsigned long long *__restrict__ pool_wd_ptrs, int *__restrict__ pool_slot_pos, int pool_row_stride
#define ROUTE_BLOCK_ARGS                                                                                       \
    logits, bias, blocks, T, E, block, capacity, k, scale, tpc, topk_idx, topk_w, pool_wgu, pool_wgu_stride, \
        pool_wd, pool_wd_stride, pool_wgu_ptrs, pool_wd_ptrs, pool_slot_pos, pool_row_stride

extern "C" __global__ void __launch_bounds__(1024) route_block(ROUTE_BLOCK_PARAMS) {
    route_block_body(ROUTE_BLOCK_ARGS);
}

// route_block, then moe_dispatch (one CTA) over its choices in the same launch: the last of the
// launch's CTAs to finish its tokens runs the dispatch over every token's, so a forward with few
// assignments does not wait for a second kernel to start (a denoising step's routing is a chain of
// short launches). Which CTA is last does not matter: the dispatch reads only the finished
// `topk_idx`, so its outputs mean what moe_dispatch's do. `arrivals` is a counter that is 0
// between launches: every CTA adds 1 once its choices are written and fenced; the CTA that
// brings it to gridDim.x dispatches and puts it back to 0. `slots` counts the experts with the
// packed shared one (`shared_expert` >= 0). blockDim >= slots; dynamic shared memory at least
// route_block's and 2 * slots ints.
extern "C" __global__ void __launch_bounds__(1024)
    route_block_dispatch(ROUTE_BLOCK_PARAMS, int slots, int tile_rows, int shared_expert, int* __restrict__ slot_pos,
                         int* __restrict__ row_token, int4* __restrict__ tiles, int* __restrict__ num_tiles,
                         int* __restrict__ arrivals) {
    route_block_body(ROUTE_BLOCK_ARGS);
    __shared__ int is_last;
    __threadfence();  // this thread's choices reach L2 before the CTA is counted
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(arrivals, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();  // the other CTAs' choices, fenced before their arrivals, are read after ours
    dispatch_one_cta(topk_idx, T * k, k, slots, tile_rows, shared_expert, slot_pos, row_token, tiles, num_tiles);
    if (threadIdx.x == 0) *arrivals = 0;
}

// Router logits in F32, batch-invariant: logits[t, e] = sum_k F32(X[t, k]) * F32(W[e, k]), each a
// fixed-order sum whatever the number of rows (cuBLAS picks its algorithm, and with it the
// summation order, by the row count). Lane l of a warp takes the 8-column groups k0 = 8 l,
// 8 l + 256, ... (fused multiply-adds in column order), then the columns past the last whole
// group (k = 8 (K / 8) + l, + 32, ...), then a fixed butterfly over the 32 lanes.
// X is [T, K] BF16, W is [E, K] (F32 or BF16), logits [T, E] F32.
// grid = (ceil(T / ROWS), ceil(E / 8)), block = 256: warp w of a CTA takes expert
// blockIdx.y * 8 + w for ROWS rows (the expert's weights are read once for all of them; 16-byte
// loads of both operands). ROWS only decides how the work is cut into warps: 16 for the entries
// without a suffix, 4 for `_r4` (four times the warps for a denoising step's 32 rows, whose 64
// CTAs of 16 rows left half the GPU idle); every output's arithmetic is the same.
#define ROUTER_ROWS 16
__device__ __forceinline__ void load_w8(const float* w, float (&f)[8]) {
    const float4 a = *reinterpret_cast<const float4*>(w), b = *reinterpret_cast<const float4*>(w + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load_w8(const bf16* w, float (&f)[8]) {
    const uint4 v = *reinterpret_cast<const uint4*>(w);
    const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
    for (int c = 0; c < 8; ++c) f[c] = to_f32(b[c]);
}
__device__ __forceinline__ float weight_f32(float w) { return w; }
__device__ __forceinline__ float weight_f32(bf16 w) { return to_f32(w); }

template <typename TW, int ROWS>
__device__ void router_logits_tile(const bf16* __restrict__ X, const TW* __restrict__ W, float* __restrict__ logits,
                                   int T, int E, int K) {
    const int lane = threadIdx.x & 31;
    const int e = blockIdx.y * 8 + (threadIdx.x >> 5);
    const int t0 = blockIdx.x * ROWS;
    if (e >= E) return;
    const int rows = min(ROWS, T - t0);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    const TW* w = W + (size_t)e * K;
    const bf16* x = X + (size_t)t0 * K;
    // 16-byte loads need every row 16-byte aligned (K % 8 == 0); otherwise all columns go the
    // scalar way.
    const int whole = K % 8 == 0 ? K : 0;
    // Few rows: unrolled so that the next steps' loads are issued before this step's arithmetic
    // (the order of the multiply-adds into each output does not change).
#pragma unroll(ROWS <= 4 ? 4 : 1)
    for (int k0 = lane * 8; k0 < whole; k0 += 256) {
        float wv[8];
        load_w8(w + k0, wv);
        // All rows' loads first (rows past the end re-read the last row and are never stored), so
        // they are in flight together instead of one round trip per row.
        uint4 xv[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            xv[r] = *reinterpret_cast<const uint4*>(x + (size_t)min(r, rows - 1) * K + k0);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const bf16* xb = reinterpret_cast<const bf16*>(&xv[r]);
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[r] = fmaf(to_f32(xb[c]), wv[c], acc[r]);
        }
    }
    for (int k = whole + lane; k < K; k += 32) {
        const float wk = weight_f32(w[k]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            if (r < rows) acc[r] = fmaf(to_f32(x[(size_t)r * K + k]), wk, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r < rows) logits[(size_t)(t0 + r) * E + e] = v;
    }
}

// The same sums for many rows: warp w takes ROUTER_WIDE_EXPERTS consecutive experts from
// (blockIdx.y * 8 + w) * ROUTER_WIDE_EXPERTS for ROUTER_ROWS rows, so each loaded and converted
// X element feeds that many experts instead of one. Every output is still lane l's fused
// multiply-adds over the same columns in the same order, then the same butterfly: bits equal to
// router_logits_tile's, so the launcher picks either by the number of rows (speed only).
#define ROUTER_WIDE_EXPERTS 4
template <typename TW>
__device__ void router_logits_wide_tile(const bf16* __restrict__ X, const TW* __restrict__ W,
                                        float* __restrict__ logits, int T, int E, int K) {
    const int lane = threadIdx.x & 31;
    const int e0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * ROUTER_WIDE_EXPERTS;
    const int t0 = blockIdx.x * ROUTER_ROWS;
    if (e0 >= E) return;
    const int rows = min(ROUTER_ROWS, T - t0);
    float acc[ROUTER_ROWS][ROUTER_WIDE_EXPERTS];
#pragma unroll
    for (int r = 0; r < ROUTER_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) acc[r][j] = 0.f;
    // Experts past E re-read the last one and are never stored.
    const TW* w[ROUTER_WIDE_EXPERTS];
#pragma unroll
    for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) w[j] = W + (size_t)min(e0 + j, E - 1) * K;
    const bf16* x = X + (size_t)t0 * K;
    const int whole = K % 8 == 0 ? K : 0;
    for (int k0 = lane * 8; k0 < whole; k0 += 256) {
        float wv[ROUTER_WIDE_EXPERTS][8];
#pragma unroll
        for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) load_w8(w[j] + k0, wv[j]);
        uint4 xv[ROUTER_ROWS];
#pragma unroll
        for (int r = 0; r < ROUTER_ROWS; ++r)
            xv[r] = *reinterpret_cast<const uint4*>(x + (size_t)min(r, rows - 1) * K + k0);
#pragma unroll
        for (int r = 0; r < ROUTER_ROWS; ++r) {
            const bf16* xb = reinterpret_cast<const bf16*>(&xv[r]);
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const float xf = to_f32(xb[c]);
#pragma unroll
                for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) acc[r][j] = fmaf(xf, wv[j][c], acc[r][j]);
            }
        }
    }
    for (int k = whole + lane; k < K; k += 32) {
        float wk[ROUTER_WIDE_EXPERTS];
#pragma unroll
        for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) wk[j] = weight_f32(w[j][k]);
#pragma unroll
        for (int r = 0; r < ROUTER_ROWS; ++r)
            if (r < rows) {
                const float xf = to_f32(x[(size_t)r * K + k]);
#pragma unroll
                for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) acc[r][j] = fmaf(xf, wk[j], acc[r][j]);
            }
    }
#pragma unroll
    for (int r = 0; r < ROUTER_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < ROUTER_WIDE_EXPERTS; ++j) {
            const float v = warp_sum(acc[r][j]);
            if (lane == 0 && r < rows && e0 + j < E) logits[(size_t)(t0 + r) * E + e0 + j] = v;
        }
}

extern "C" __global__ void __launch_bounds__(256)
    router_logits_wide_f32w(const bf16* X, const float* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_wide_tile<float>(X, W, logits, T, E, K);
}
extern "C" __global__ void __launch_bounds__(256)
    router_logits_wide_bf16w(const bf16* X, const bf16* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_wide_tile<bf16>(X, W, logits, T, E, K);
}

extern "C" __global__ void __launch_bounds__(256)
    router_logits_f32w(const bf16* X, const float* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_tile<float, ROUTER_ROWS>(X, W, logits, T, E, K);
}
extern "C" __global__ void __launch_bounds__(256)
    router_logits_bf16w(const bf16* X, const bf16* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_tile<bf16, ROUTER_ROWS>(X, W, logits, T, E, K);
}
extern "C" __global__ void __launch_bounds__(256)
    router_logits_f32w_r4(const bf16* X, const float* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_tile<float, 4>(X, W, logits, T, E, K);
}
extern "C" __global__ void __launch_bounds__(256)
    router_logits_bf16w_r4(const bf16* X, const bf16* W, float* logits, int T, int E, int K) {
    pdl_enter();
    router_logits_tile<bf16, 4>(X, W, logits, T, E, K);
}

// Router logits on tensor cores for BF16 router weights (every released checkpoint stores them in
// BF16): a product of two BF16 values is exact in F32, so logits[t, e] = sum_k X[t, k] W[e, k]
// differs from the F32 kernels above only in how the sum rounds (tensor-core F32 accumulation).
// CTA = ROUTER_MMA_WARPS warps over 16 rows x 8 NB experts. The K / 16 column steps are cut into
// ROUTER_MMA_WARPS fixed ranges (by K alone); warp w sums its range with mma.m16n8k16 in column
// order, and the warps' partial tiles are added in warp order through shared memory. A row's sums
// never see another row (each output row of an mma depends only on its own A row), and an
// output's chain never depends on NB (each 8-expert block is its own mma), so its bits are the
// same in any batch and with either NB: 4 (32 experts per CTA, the weights' rows shared by more
// work) where the grid fills the GPU, 1 (4x the CTAs) for a denoising step's few rows.
// grid = (ceil(T / 16), ceil(E / (8 NB))), block = 32 * ROUTER_MMA_WARPS; K % 16 == 0 (the
// launcher checks).
#define ROUTER_MMA_WARPS 8
#define ROUTER_MMA_HELD 16
template <int NB>
__device__ __forceinline__ void router_logits_mma_tile(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                                       float* __restrict__ logits, int T, int E, int K) {
    constexpr int COLS = 8 * NB;
    __shared__ float part[ROUTER_MMA_WARPS][16][COLS + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int t0 = blockIdx.x * 16, e0 = blockIdx.y * COLS;
    const int steps = K / 16;
    const int s_begin = warp * steps / ROUTER_MMA_WARPS;
    const int s_end = (warp + 1) * steps / ROUTER_MMA_WARPS;
    // Rows past T and experts past E re-read the last ones and are never stored.
    const bf16* w[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) w[nb] = W + (size_t)min(e0 + nb * 8 + g, E - 1) * K + 2 * t4;
    const bf16* xa = X + (size_t)min(t0 + g, T - 1) * K + 2 * t4;
    const bf16* xb = X + (size_t)min(t0 + g + 8, T - 1) * K + 2 * t4;
    float c[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) c[nb][0] = c[nb][1] = c[nb][2] = c[nb][3] = 0.f;
    // A denoising step's variant (8 experts per CTA) with at most ROUTER_MMA_HELD steps per warp
    // (K <= 2,048): the warp's weight fragments are loaded before the wait for the previous
    // kernel (the weights are not its output), then all of its X fragments at once, so the step
    // waits for one memory round trip instead of a round trip per eight steps. The same products
    // in the same order.
    constexpr int HELD = ROUTER_MMA_HELD;
    if (NB == 1 && s_end - s_begin <= HELD) {
        unsigned bw[HELD][2], ax[HELD][4];
#pragma unroll
        for (int i = 0; i < HELD; ++i)
            if (s_begin + i < s_end) {
                const int k = (s_begin + i) * 16;
                bw[i][0] = *reinterpret_cast<const unsigned*>(w[0] + k);
                bw[i][1] = *reinterpret_cast<const unsigned*>(w[0] + k + 8);
            }
        pdl_enter();
#pragma unroll
        for (int i = 0; i < HELD; ++i)
            if (s_begin + i < s_end) {
                const int k = (s_begin + i) * 16;
                ax[i][0] = *reinterpret_cast<const unsigned*>(xa + k);
                ax[i][1] = *reinterpret_cast<const unsigned*>(xb + k);
                ax[i][2] = *reinterpret_cast<const unsigned*>(xa + k + 8);
                ax[i][3] = *reinterpret_cast<const unsigned*>(xb + k + 8);
            }
#pragma unroll
        for (int i = 0; i < HELD; ++i)
            if (s_begin + i < s_end) mma16816(c[0], ax[i], bw[i][0], bw[i][1]);
    } else {
        pdl_enter();
#pragma unroll 8
        for (int s = s_begin; s < s_end; ++s) {
            const int k = s * 16;
            unsigned a[4];
            a[0] = *reinterpret_cast<const unsigned*>(xa + k);
            a[1] = *reinterpret_cast<const unsigned*>(xb + k);
            a[2] = *reinterpret_cast<const unsigned*>(xa + k + 8);
            a[3] = *reinterpret_cast<const unsigned*>(xb + k + 8);
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const unsigned b0 = *reinterpret_cast<const unsigned*>(w[nb] + k);
                const unsigned b1 = *reinterpret_cast<const unsigned*>(w[nb] + k + 8);
                mma16816(c[nb], a, b0, b1);
            }
        }
    }
    // c[nb][0..1]: row g, experts nb * 8 + 2 t4 + {0, 1}; c[nb][2..3]: row g + 8.
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        part[warp][g][nb * 8 + 2 * t4] = c[nb][0];
        part[warp][g][nb * 8 + 2 * t4 + 1] = c[nb][1];
        part[warp][g + 8][nb * 8 + 2 * t4] = c[nb][2];
        part[warp][g + 8][nb * 8 + 2 * t4 + 1] = c[nb][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * COLS; i += blockDim.x) {
        const int r = i / COLS, col = i % COLS;
        float v = part[0][r][col];
#pragma unroll
        for (int p = 1; p < ROUTER_MMA_WARPS; ++p) v += part[p][r][col];
        if (t0 + r < T && e0 + col < E) logits[(size_t)(t0 + r) * E + e0 + col] = v;
    }
}

extern "C" __global__ void __launch_bounds__(32 * ROUTER_MMA_WARPS)
    router_logits_mma_bf16w(const bf16* __restrict__ X, const bf16* __restrict__ W, float* __restrict__ logits,
                            int T, int E, int K) {
    router_logits_mma_tile<4>(X, W, logits, T, E, K);
}
extern "C" __global__ void __launch_bounds__(32 * ROUTER_MMA_WARPS)
    router_logits_mma_bf16w_e8(const bf16* __restrict__ X, const bf16* __restrict__ W, float* __restrict__ logits,
                               int T, int E, int K) {
    router_logits_mma_tile<1>(X, W, logits, T, E, K);
}

// router_logits_mma_bf16w_e8 with the operands staged through shared memory: the direct kernel's
// 4-byte fragment loads kept L1 78 % busy on a denoising step (docs/performance.md, session
// thirty). Warp w copies its own K range (at most ROUTER_MMA_HELD steps of 16 columns, K <=
// 2,048) of the CTA's 16 X rows and 8 W rows into its region of dynamic shared memory with 16-byte
// cp.async (W before the wait for the previous kernel: the weights are not its output), then reads
// the same mma fragments with ldmatrix and multiplies them in the same order, so every output has
// router_logits_mma_tile<1>'s bits. Rows are ROUTER_STAGED_PITCH bf16 apart (16 bytes of padding:
// the 8 rows of an ldmatrix fall in distinct banks). Rows past T and experts past E copy the last
// ones, as there.
// grid = (ceil(T / 16), ceil(E / 8)), block = 32 * ROUTER_MMA_WARPS, dynamic shared memory
// ROUTER_STAGED_SHARED bytes; K % 16 == 0, K <= 16 * ROUTER_MMA_HELD * ROUTER_MMA_WARPS.
#define ROUTER_STAGED_PITCH (16 * ROUTER_MMA_HELD + 8)
#define ROUTER_STAGED_ROWS 24  // 16 X rows, then 8 W rows
#define ROUTER_STAGED_SHARED (ROUTER_MMA_WARPS * ROUTER_STAGED_ROWS * ROUTER_STAGED_PITCH * 2)
static_assert(ROUTER_STAGED_SHARED == 101376, "ops::router_logits's ROUTER_STAGED_SHARED");
extern "C" __global__ void __launch_bounds__(32 * ROUTER_MMA_WARPS)
    router_logits_mma_bf16w_e8s(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                float* __restrict__ logits, int T, int E, int K) {
    extern __shared__ __align__(16) unsigned char staged[];
    __shared__ float part[ROUTER_MMA_WARPS][16][9];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int t0 = blockIdx.x * 16, e0 = blockIdx.y * 8;
    const int steps = K / 16;
    const int s_begin = warp * steps / ROUTER_MMA_WARPS;
    const int n = (warp + 1) * steps / ROUTER_MMA_WARPS - s_begin;  // <= ROUTER_MMA_HELD
    const int k0 = s_begin * 16, chunks = 2 * n;                     // 16-byte chunks per row
    bf16* region = reinterpret_cast<bf16*>(staged) + warp * ROUTER_STAGED_ROWS * ROUTER_STAGED_PITCH;
    // Region rows 16..23: the 8 experts' weights.
    for (int c = lane; c < 8 * chunks; c += 32) {
        const int r = c / chunks, ch = c % chunks;
        cp_async16(region + (16 + r) * ROUTER_STAGED_PITCH + ch * 8,
                   W + (size_t)min(e0 + r, E - 1) * K + k0 + ch * 8, true);
    }
    pdl_enter();
    // Region rows 0..15: the 16 rows of X.
    for (int c = lane; c < 16 * chunks; c += 32) {
        const int r = c / chunks, ch = c % chunks;
        cp_async16(region + r * ROUTER_STAGED_PITCH + ch * 8, X + (size_t)min(t0 + r, T - 1) * K + k0 + ch * 8,
                   true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    using minnow_smem::ldmatrix_x4, minnow_smem::smem_addr;
    // ldmatrix addresses: A's four 8x8 matrices are (rows 0-7 | 8-15) x (columns 0-7 | 8-15) of
    // the step, lane l giving row l % 16 of column half l / 16; B's two are the 8 experts' rows x
    // (columns 0-7 | 8-15), lanes 0-15 giving row l % 8 of column half (l / 8) % 2.
    const unsigned a_addr = smem_addr(region + (lane & 15) * ROUTER_STAGED_PITCH + (lane >> 4) * 8);
    const unsigned b_addr = smem_addr(region + (16 + (lane & 7)) * ROUTER_STAGED_PITCH + ((lane >> 3) & 1) * 8);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < ROUTER_MMA_HELD; ++i)
        if (i < n) {
            unsigned a[4], b0, b1;
            ldmatrix_x4(a, a_addr + i * 32);
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(b0), "=r"(b1)
                         : "r"(b_addr + i * 32));
            mma16816(c, a, b0, b1);
        }
    // c[0..1]: row g, experts 2 t4 + {0, 1}; c[2..3]: row g + 8. The warps' partial tiles are
    // added in warp order, as in router_logits_mma_tile.
    part[warp][g][2 * t4] = c[0];
    part[warp][g][2 * t4 + 1] = c[1];
    part[warp][g + 8][2 * t4] = c[2];
    part[warp][g + 8][2 * t4 + 1] = c[3];
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * 8; i += blockDim.x) {
        const int r = i / 8, col = i % 8;
        float v = part[0][r][col];
#pragma unroll
        for (int p = 1; p < ROUTER_MMA_WARPS; ++p) v += part[p][r][col];
        if (t0 + r < T && e0 + col < E) logits[(size_t)(t0 + r) * E + e0 + col] = v;
    }
}

// The same sums for prefill-sized row counts, tiled through shared memory: a CTA of 4 warps takes
// 64 rows x 64 experts (warp w: rows 32 (w % 2).., experts 32 (w / 2)..), streams 64-column
// slices of X and W through ROUTER_TILED_STAGES cp.async stages (128-byte rows, 16-byte chunks
// swizzled by row so that ldmatrix reads are conflict-free) and multiplies them with
// mma.m16n8k16. The bits are router_logits_mma_tile's: each output's K / 16 column steps keep
// the same ROUTER_MMA_WARPS ranges; every range is summed from zero in column order into its own
// accumulator (the chain that warp p of the mma kernel computes), and the ranges are folded in
// order as they end (part 0, + part 1, ..., that kernel's sum over its warps' partial tiles).
// Rows past T and experts past E are zero-filled and never stored.
// grid = (ceil(T / 64), ceil(E / 64)), block = 128; K % 16 == 0 (the launcher checks).
#define ROUTER_TILED_ROWS 64
#define ROUTER_TILED_COLS 64
#define ROUTER_TILED_STAGES 3

// One 16-column step of a warp's 32-row x 32-expert part of a 64 x 64 router tile staged in shared
// memory (X rows at `xb`, W rows at `wb`, 128-byte swizzled rows of a 64-column slice; column
// step kk of the slice): c[i][j] += rows wm + 16 i.. times experts wn + 8 j.. with mma.m16n8k16.
// The tiled and the cluster kernels take the same steps with it.
__device__ __forceinline__ void router_tile_step(float (&c)[2][4][4], unsigned xb, unsigned wb, int kk, int wm,
                                                 int wn, int lane) {
    using minnow_smem::ldmatrix_x4, minnow_smem::swizzled;
    unsigned a[2][4], b[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) ldmatrix_x4(a[i], xb + swizzled(wm + i * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
    for (int j = 0; j < 2; ++j)
        ldmatrix_x4(b[j], wb + swizzled(wn + j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma16816(c[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
}

extern "C" __global__ void __launch_bounds__(128)
    router_logits_mma_tiled_bf16w(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                  float* __restrict__ logits, int T, int E, int K) {
    constexpr int BM = ROUTER_TILED_ROWS, BN = ROUTER_TILED_COLS, STAGES = ROUTER_TILED_STAGES;
    __shared__ __align__(128) unsigned char xs[STAGES][BM * 128];
    __shared__ __align__(128) unsigned char ws[STAGES][BN * 128];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int t0 = blockIdx.x * BM, e0 = blockIdx.y * BN;
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    const int steps = K / 16, slices = (K + 63) / 64;
    using minnow_smem::ldmatrix_x4, minnow_smem::smem_addr, minnow_smem::swizzled;
    pdl_enter();
    // One 64-column slice into a stage: 64 rows x 8 chunks of X and of W, 4 of each per thread.
    auto load = [&](int slice, int stage) {
        const int k = slice * 64;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = tid + i * 128, row = c >> 3, chunk = c & 7;
            const bool col_ok = k + chunk * 8 < K;
            const bool xok = col_ok && t0 + row < T, wok = col_ok && e0 + row < E;
            cp_async16(xs[stage] + swizzled(row, chunk), xok ? X + (size_t)(t0 + row) * K + k + chunk * 8 : X,
                       xok);
            cp_async16(ws[stage] + swizzled(row, chunk), wok ? W + (size_t)(e0 + row) * K + k + chunk * 8 : W,
                       wok);
        }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices) load(s, s);
        cp_async_commit();
    }
    float c[2][4][4], total[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) c[i][j][v] = 0.f;  // total starts at the first fold
    int range = 0;  // the mma kernel's warp whose column range is being summed
    // Ends range `range`: its sum joins the total (the first one is the total), c restarts.
    auto fold = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    total[i][j][v] = range == 0 ? c[i][j][v] : total[i][j][v] + c[i][j][v];
                    c[i][j][v] = 0.f;
                }
        ++range;
    };
    for (int slice = 0; slice < slices; ++slice) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (slice + STAGES - 1 < slices) load(slice + STAGES - 1, (slice + STAGES - 1) % STAGES);
        cp_async_commit();
        const unsigned xb = smem_addr(xs[slice % STAGES]), wb = smem_addr(ws[slice % STAGES]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int s = slice * 4 + kk;
            if (s >= steps) break;
            while (range < ROUTER_MMA_WARPS && s >= (range + 1) * steps / ROUTER_MMA_WARPS) fold();
            router_tile_step(c, xb, wb, kk, wm, wn, lane);
        }
    }
    cp_async_wait<0>();
    while (range < ROUTER_MMA_WARPS) fold();
    // total[i][j][0..1]: row wm + 16 i + g, experts wn + 8 j + 2 t4 + {0, 1}; [2..3]: row + 8.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int t = t0 + wm + i * 16 + g + h * 8, e = e0 + wn + j * 8 + 2 * t4;
                if (t >= T) continue;
                if (e < E) logits[(size_t)t * E + e] = total[i][j][2 * h];
                if (e + 1 < E) logits[(size_t)t * E + e + 1] = total[i][j][2 * h + 1];
            }
}

// router_logits_mma_tiled_bf16w with its eight summation ranges on eight CTAs at once: a cluster
// of ROUTER_MMA_WARPS CTAs per 64-row x 64-expert tile, CTA r (its rank in the cluster) summing
// range r alone. One CTA walking all eight ranges in turn left 128 CTAs of 4 warps for a batched
// step's 2,048 rows (a quarter of a wave of latency-bound slices, docs/performance.md, session
// thirty-six); here each CTA streams an eighth of K. The ranges meet in distributed shared memory:
// every CTA leaves its range's partial tile in its own shared memory, and CTA r then folds rows
// 8r .. 8r + 7 of the tile over the eight partials in range order (part 0, + part 1, ...). Each
// range's sum is the same chain of mma.m16n8k16 steps from zero in column order, and the fold the
// same additions in the same order, so every output has the tiled kernel's bits.
// grid = (8 ceil(T / 64), ceil(E / 64)), clusters of (8, 1, 1), block = 128; K % 16 == 0. sm_90+.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ROUTER_CLUSTER_DIMS __cluster_dims__(ROUTER_MMA_WARPS, 1, 1)
#else
#define ROUTER_CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(128) ROUTER_CLUSTER_DIMS
    router_logits_mma_cluster_bf16w(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                    float* __restrict__ logits, int T, int E, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int BM = ROUTER_TILED_ROWS, BN = ROUTER_TILED_COLS, STAGES = ROUTER_TILED_STAGES;
    constexpr int PITCH = BN + 4;  // floats per row of the partial tile (rows 16-byte aligned)
    // The stages, then (once the range is summed) the partial tile in the same bytes.
    __shared__ __align__(128) unsigned char stage_bytes[STAGES][(BM + BN) * 128];
    static_assert(BM * PITCH * 4 <= sizeof(stage_bytes), "the partial tile fits in the stages");
    float* part = reinterpret_cast<float*>(stage_bytes);
    unsigned range;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(range));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int t0 = (blockIdx.x / ROUTER_MMA_WARPS) * BM, e0 = blockIdx.y * BN;
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    const int steps = K / 16;
    const int s_begin = range * steps / ROUTER_MMA_WARPS, s_end = (range + 1) * steps / ROUTER_MMA_WARPS;
    const int k_begin = s_begin * 16, k_end = s_end * 16, n_steps = s_end - s_begin;
    const int slices = (k_end - k_begin + 63) / 64;
    using minnow_smem::ldmatrix_x4, minnow_smem::smem_addr, minnow_smem::swizzled;
    // One 64-column slice of the range: 64 rows x 8 chunks of W (rows BM.. of the stage) or of X
    // (rows 0..), 4 per thread; columns past the range are zero-filled (and never multiplied).
    auto load = [&](int slice, int stage, bool weights) {
        const int k = k_begin + slice * 64;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = tid + i * 128, row = c >> 3, chunk = c & 7;
            const bool col_ok = k + chunk * 8 < k_end;
            if (weights) {
                const bool ok = col_ok && e0 + row < E;
                cp_async16(stage_bytes[stage] + BM * 128 + swizzled(row, chunk),
                           ok ? W + (size_t)(e0 + row) * K + k + chunk * 8 : W, ok);
            } else {
                const bool ok = col_ok && t0 + row < T;
                cp_async16(stage_bytes[stage] + swizzled(row, chunk), ok ? X + (size_t)(t0 + row) * K + k + chunk * 8 : X,
                           ok);
            }
        }
    };
    // The weights of the first stages before the wait for the previous kernel (they are not its
    // output); each stage's commit group then holds its X slice (and, for the first, those weights).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < slices) load(s, s, true);
    pdl_enter();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices) load(s, s, false);
        cp_async_commit();
    }
    float c[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) c[i][j][v] = 0.f;
    for (int slice = 0; slice < slices; ++slice) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (slice + STAGES - 1 < slices) {
            load(slice + STAGES - 1, (slice + STAGES - 1) % STAGES, true);
            load(slice + STAGES - 1, (slice + STAGES - 1) % STAGES, false);
        }
        cp_async_commit();
        const unsigned xb = smem_addr(stage_bytes[slice % STAGES]), wb = xb + BM * 128;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (slice * 4 + kk >= n_steps) break;
            router_tile_step(c, xb, wb, kk, wm, wn, lane);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: the partial tile takes their place
    // c[i][j][0..1]: row wm + 16 i + g, experts wn + 8 j + 2 t4 + {0, 1}; [2..3]: row + 8.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(part + (wm + i * 16 + g + h * 8) * PITCH + wn + j * 8 + 2 * t4) =
                    make_float2(c[i][j][2 * h], c[i][j][2 * h + 1]);
    // Every CTA's partial tile is written (release) and visible to the cluster (acquire).
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    // Thread tid folds 4 adjacent outputs of row 8 range + tid / 16: the eight partials' values
    // are all requested before the first addition (a remote load is a round trip to another SM;
    // one at a time, they were most of the kernel's time).
    static_assert(BM == 8 * ROUTER_MMA_WARPS && BN == 64, "one float4 of the fold per thread");
    const int r = range * (BM / ROUTER_MMA_WARPS) + tid / 16, col = (tid % 16) * 4;
    const unsigned local = smem_addr(part + r * PITCH + col);
    float4 x[ROUTER_MMA_WARPS];
#pragma unroll
    for (int p = 0; p < ROUTER_MMA_WARPS; ++p) {
        unsigned remote;
        asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(p));
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(x[p].x), "=f"(x[p].y), "=f"(x[p].z), "=f"(x[p].w)
                     : "r"(remote)
                     : "memory");
    }
    float4 v = x[0];
#pragma unroll
    for (int p = 1; p < ROUTER_MMA_WARPS; ++p) {
        v.x += x[p].x;
        v.y += x[p].y;
        v.z += x[p].z;
        v.w += x[p].w;
    }
    if (t0 + r < T) {
        float* out = logits + (size_t)(t0 + r) * E + e0 + col;
        if (E % 4 == 0 && e0 + col + 4 <= E) {
            *reinterpret_cast<float4*>(out) = v;  // rows of E % 4 == 0 floats are 16-byte aligned
        } else {
            const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (e0 + col + u < E) out[u] = vals[u];
        }
    }
    // No CTA leaves while another may still read its partial tile.
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();  // launched only where the sm_90 build is loaded
#endif
}
