// Row-wise kernels of the LLaDA2 forward: embedding gather, RMSNorm (with the fused residual add),
// SiLU-multiply, the F32 MoE mix, conversions, the argmax/softmax confidence of logits rows and
// their top-k ids.
// Numerics follow the reference order of docs/model.md §7 (RMSNorm rounds to BF16 before
// the weight; SiLU in F32 rounded to BF16, then a BF16 product). The residual stream `h` is F32:
// every layer's output joins it without a rounding (the F32 reference's stream), and only the
// normed rows that feed the GEMMs are BF16.
#include "common.cuh"

// out[t, :] = table[ids[t], :]. One CTA per row; `d` is a multiple of 8 (16-byte copies).
extern "C" __global__ void embed_rows(const unsigned* __restrict__ ids, const bf16* __restrict__ table,
                                      bf16* __restrict__ out, int d) {
    pdl_enter();
    const int t = blockIdx.x;
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)ids[t] * d);
    uint4* dst = reinterpret_cast<uint4*>(out + (size_t)t * d);
    for (int i = threadIdx.x; i < d / 8; i += blockDim.x) dst[i] = src[i];
}

// out[t, :] = F32(table[ids[t], :]): the residual stream's first value (exact). One CTA per row;
// `d` is a multiple of 8.
extern "C" __global__ void embed_rows_f32(const unsigned* __restrict__ ids, const bf16* __restrict__ table,
                                          float* __restrict__ out, int d) {
    pdl_enter();
    const int t = blockIdx.x;
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)ids[t] * d);
    float4* dst = reinterpret_cast<float4*>(out + (size_t)t * d);
    for (int i = threadIdx.x; i < d / 8; i += blockDim.x) {
        const uint4 v = src[i];
        const bf16* b = reinterpret_cast<const bf16*>(&v);
        dst[2 * i] = make_float4(to_f32(b[0]), to_f32(b[1]), to_f32(b[2]), to_f32(b[3]));
        dst[2 * i + 1] = make_float4(to_f32(b[4]), to_f32(b[5]), to_f32(b[6]), to_f32(b[7]));
    }
}

// Fused residual add and RMSNorm over rows of length d (one CTA per row):
//   if delta != null: h = h + F32(delta)        (the F32 residual stream, updated in place)
//   out = BF16(weight * BF16(h * rsqrt(mean(h^2) + eps)))
// add_rmsnorm and moe_combine_add_rmsnorm move 8 columns per load (16 bytes of BF16, 32 of F32):
// thread `tid` owns the column groups 8 * (tid + n * blockDim) .. + 8 (d % 8 == 0), sums its
// squares in that order and feeds block_sum the same partial sums in both kernels, so the fused
// combine + norm stays bit-identical to moe_combine followed by add_rmsnorm.
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
    const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
    for (int c = 0; c < 8; ++c) f[c] = to_f32(b[c]);
}
__device__ __forceinline__ uint4 pack8(const bf16 (&b)[8]) {
    uint4 v;
    bf16* o = reinterpret_cast<bf16*>(&v);
#pragma unroll
    for (int c = 0; c < 8; ++c) o[c] = b[c];
    return v;
}
// The 8 F32 columns of group `v` of a residual row, and their store.
__device__ __forceinline__ void load8(const float* row, int v, float (&f)[8]) {
    const float4 a = reinterpret_cast<const float4*>(row)[2 * v], b = reinterpret_cast<const float4*>(row)[2 * v + 1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(float* row, int v, const float (&f)[8]) {
    reinterpret_cast<float4*>(row)[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(row)[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
}

// The second half of both kernels: out = BF16(weight * BF16(h * inv)) over the row `row` that
// this thread wrote itself (same column groups).
__device__ __forceinline__ void write_normed(const float* row, const uint4* weight, uint4* out, int nvec, float inv) {
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
        float hv[8], wv[8];
        load8(row, v, hv);
        unpack8(weight[v], wv);
        bf16 o[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) o[c] = mul_bf16(to_bf16(wv[c]), to_bf16(hv[c] * inv));
        out[v] = pack8(o);
    }
}

extern "C" __global__ void add_rmsnorm(float* __restrict__ h, const bf16* __restrict__ delta,
                                       const bf16* __restrict__ weight, bf16* __restrict__ out, int d,
                                       float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    const int nvec = d / 8;
    float* row = h + (size_t)blockIdx.x * d;
    const uint4* drow = delta ? reinterpret_cast<const uint4*>(delta + (size_t)blockIdx.x * d) : nullptr;
    float ss = 0.f;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
        float hv[8];
        load8(row, v, hv);
        if (drow) {
            float dv[8];
            unpack8(drow[v], dv);
#pragma unroll
            for (int c = 0; c < 8; ++c) hv[c] += dv[c];
            store8(row, v, hv);
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) ss += hv[c] * hv[c];
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    write_normed(row, reinterpret_cast<const uint4*>(weight), reinterpret_cast<uint4*>(out + (size_t)blockIdx.x * d),
                 nvec, inv);
}

// gu is [rows, 2*width] with the gate projection in columns [0, width) and up in [width, 2*width);
// out[r, j] = BF16( BF16(silu(F32(gate))) * up ). grid = (groups * rows_per_group, ceil(width /
// (8 * blockDim))), 8 columns per thread: CTA row x is row (x / rows_per_group) * group_stride + x % rows_per_group (the
// pooled experts' outputs are groups of `t` rows at a stride of a routing block; a plain launch
// has one group).
extern "C" __global__ void silu_mul(const bf16* __restrict__ gu, bf16* __restrict__ out, int width,
                                    int rows_per_group, int group_stride) {
    pdl_enter();
    const int r = (blockIdx.x / rows_per_group) * group_stride + blockIdx.x % rows_per_group;
    const int v = blockIdx.y * blockDim.x + threadIdx.x;  // 8 columns per thread (width % 8 == 0)
    if (v >= width / 8) return;
    float g[8], u[8];
    unpack8(reinterpret_cast<const uint4*>(gu + (size_t)r * 2 * width)[v], g);
    unpack8(reinterpret_cast<const uint4*>(gu + (size_t)r * 2 * width + width)[v], u);
    bf16 o[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) o[c] = silu_mul_bf16(g[c], u[c]);
    reinterpret_cast<uint4*>(out + (size_t)r * width)[v] = pack8(o);
}

// The MoE output of token t (one CTA per token):
//   routed = BF16( sum_j w[t, j] * F32(y[slot_pos[t, j], :]) )    (F32 mix, one rounding)
//   out[t] = BF16(routed + shared[t])                             (no shared expert: routed)
// The shared expert's output row is y[shared_rows[t]] when it ran inside the grouped GEMM, else
// shared[t] (both may be null). grid = (T, ceil(d / blockDim)).
extern "C" __global__ void moe_combine(const bf16* __restrict__ y, const int* __restrict__ slot_pos,
                                       const float* __restrict__ w, const bf16* __restrict__ shared,
                                       const int* __restrict__ shared_rows, bf16* __restrict__ out, int k, int d) {
    pdl_enter();
    const int t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < d) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
            acc += w[t * k + j] * to_f32(y[(size_t)slot_pos[t * k + j] * d + i]);
        }
        bf16 routed = to_bf16(acc);
        if (shared_rows) {
            routed = to_bf16(to_f32(routed) + to_f32(y[(size_t)shared_rows[t] * d + i]));
        } else if (shared) {
            routed = to_bf16(to_f32(routed) + to_f32(shared[(size_t)t * d + i]));
        }
        out[(size_t)t * d + i] = routed;
    }
}

// Most routed experts per token moe_combine_add_rmsnorm takes (their rows sit in shared memory).
#define COMBINE_NORM_MAX_K 32
// Expert rows whose 16-byte loads a thread of moe_combine_add_rmsnorm keeps in flight per pass:
// four registers each, most of the kernel's 84 (3 CTAs of 256 threads per SM). Capping the
// registers with launch bounds spilled and lost (docs/performance.md, session 29).
#define COMBINE_ROWS_IN_FLIGHT 8

// The end of an MoE layer fused with the next RMSNorm (the next layer's input norm, or the final
// norm): moe_combine into a BF16 delta that is never stored, then add_rmsnorm's arithmetic
//   h = h + F32(delta)    out = BF16(weight * BF16(h * rsqrt(mean(h^2) + eps)))
// One CTA per token, k <= COMBINE_NORM_MAX_K, launched with add_rmsnorm's blockDim. Bit-identical
// to moe_combine then add_rmsnorm: the mix of each column is expert by expert in F32 and the
// squares are summed over the same column groups in the same order. A thread issues the 16-byte
// loads of its column group in every expert row together (one memory round trip per pass).
extern "C" __global__ void moe_combine_add_rmsnorm(const bf16* __restrict__ y, const int* __restrict__ slot_pos,
                                                   const float* __restrict__ w, const bf16* __restrict__ shared,
                                                   const int* __restrict__ shared_rows, float* __restrict__ h,
                                                   const bf16* __restrict__ weight, bf16* __restrict__ out, int k,
                                                   int d, float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    __shared__ int rows[COMBINE_NORM_MAX_K];
    __shared__ float wts[COMBINE_NORM_MAX_K];
    const int t = blockIdx.x, nvec = d / 8;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        rows[j] = slot_pos[t * k + j];
        wts[j] = w[t * k + j];
    }
    __syncthreads();
    const bf16* srow = shared_rows ? y + (size_t)shared_rows[t] * d : shared ? shared + (size_t)t * d : nullptr;
    float* row = h + (size_t)t * d;
    float ss = 0.f;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
        float hv[8], sv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        load8(row, v, hv);
        if (srow) unpack8(reinterpret_cast<const uint4*>(srow)[v], sv);
        for (int j0 = 0; j0 < k; j0 += COMBINE_ROWS_IN_FLIGHT) {
            uint4 yv[COMBINE_ROWS_IN_FLIGHT];
#pragma unroll
            for (int u = 0; u < COMBINE_ROWS_IN_FLIGHT; ++u)
                if (j0 + u < k) yv[u] = reinterpret_cast<const uint4*>(y + (size_t)rows[j0 + u] * d)[v];
#pragma unroll
            for (int u = 0; u < COMBINE_ROWS_IN_FLIGHT; ++u) {
                if (j0 + u >= k) break;
                float f[8];
                unpack8(yv[u], f);
                const float wj = wts[j0 + u];
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[c] += wj * f[c];
            }
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            bf16 delta = to_bf16(acc[c]);
            if (srow) delta = to_bf16(to_f32(delta) + sv[c]);
            hv[c] += to_f32(delta);
            ss += hv[c] * hv[c];
        }
        store8(row, v, hv);
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    write_normed(row, reinterpret_cast<const uint4*>(weight), reinterpret_cast<uint4*>(out + (size_t)t * d), nvec,
                 inv);
}

extern "C" __global__ void bf16_to_f32(const bf16* __restrict__ x, float* __restrict__ y, long long n) {
    pdl_enter();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = to_f32(x[i]);
    }
}

// Running (max, index of the max, sum of exp(x - max)) of a stream of logits. Merging keeps the
// larger max (the lower index on equal maxima, like PyTorch's argmax) and rescales the sums.
struct Top1 {
    float m;
    int i;
    float s;
};

__device__ __forceinline__ Top1 top1_merge(Top1 a, Top1 b) {
    if (b.m > a.m || (b.m == a.m && b.i < a.i)) {
        const Top1 t = a;
        a = b;
        b = t;
    }
    // a has the larger max (or the same max and the lower index).
    if (b.m != -INFINITY) a.s += b.s * expf(b.m - a.m);
    return a;
}

__device__ __forceinline__ Top1 top1_shfl(Top1 v, int o) {
    Top1 r;
    r.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    r.i = __shfl_xor_sync(0xffffffffu, v.i, o);
    r.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    return r;
}

// Takes one logit at index c into a thread's running Top1 (indices arrive in increasing order, so
// an equal value keeps the lower index).
__device__ __forceinline__ void top1_take(Top1& acc, float x, int c) {
    if (x > acc.m) {
        acc.s = acc.m == -INFINITY ? 1.f : acc.s * expf(acc.m - x) + 1.f;
        acc.m = x;
        acc.i = c;
    } else if (x != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN)
        acc.s += expf(x - acc.m);
    }
}

// Pass 1 of the argmax/softmax confidence of logits rows: CTA (row, slice) reduces its slice of
// the row to (max, argmax, sum of exp) in scratch[row, slice, 0..3]. grid = (rows, slices).
// Slices are whole 8-logit vectors: with vocab % 8 == 0 (16-byte aligned rows) each thread reads
// TOP1_BATCH vectors per round, all in flight at once, takes their max first and then adds their
// exponentials against the running max (one rescale per round at most, not per new maximum);
// other vocabularies take the logits one by one.
#define TOP1_BATCH 4
extern "C" __global__ void top1_partial(const bf16* __restrict__ logits, float* __restrict__ scratch, int vocab) {
    pdl_enter();
    __shared__ Top1 warps[32];
    const int slices = gridDim.y;
    const int per = ((vocab + slices - 1) / slices + 7) & ~7;
    const int c0 = min(vocab, blockIdx.y * per), c1 = min(vocab, c0 + per);
    const bf16* row = logits + (size_t)blockIdx.x * vocab;
    Top1 acc = {-INFINITY, 0x7fffffff, 0.f};
    if (vocab % 8 == 0) {
        const uint4* vec = reinterpret_cast<const uint4*>(row);
        const int v0 = c0 / 8, v1 = c1 / 8, step = blockDim.x;
        for (int v = v0 + threadIdx.x; v < v1; v += step * TOP1_BATCH) {
            uint4 raw[TOP1_BATCH];
#pragma unroll
            for (int u = 0; u < TOP1_BATCH; ++u)
                raw[u] = v + u * step < v1 ? vec[v + u * step] : make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u);
            // The round's max and its first index (vectors and lanes in increasing index order).
            float bm = -INFINITY;
            int bi = 0x7fffffff;
#pragma unroll
            for (int u = 0; u < TOP1_BATCH; ++u) {
                const bf16* x = reinterpret_cast<const bf16*>(&raw[u]);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (to_f32(x[e]) > bm) {
                        bm = to_f32(x[e]);
                        bi = (v + u * step) * 8 + e;
                    }
            }
            if (bm > acc.m) {
                acc.s = acc.m == -INFINITY ? 0.f : acc.s * expf(acc.m - bm);
                acc.m = bm;
                acc.i = bi;
            }
            if (acc.m == -INFINITY) continue;  // every value so far is -inf (or padding)
#pragma unroll
            for (int u = 0; u < TOP1_BATCH; ++u) {
                if (v + u * step >= v1) break;
                const bf16* x = reinterpret_cast<const bf16*>(&raw[u]);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc.s += expf(to_f32(x[e]) - acc.m);
            }
        }
    } else {
        for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) top1_take(acc, to_f32(row[c]), c);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = top1_merge(acc, top1_shfl(acc, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warps[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x >> 5) ? warps[lane] : Top1{-INFINITY, 0x7fffffff, 0.f};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc = top1_merge(acc, top1_shfl(acc, o));
        if (lane == 0) {
            float* out = scratch + ((size_t)blockIdx.x * slices + blockIdx.y) * 3;
            out[0] = acc.m;
            out[1] = __int_as_float(acc.i);
            out[2] = acc.s;
        }
    }
}

// Pass 2: merges the slices of each row (one warp per row, slices <= 32): the argmax token and
// its softmax probability 1 / sum(exp(x - max)).
extern "C" __global__ void top1_finish(const float* __restrict__ scratch, unsigned* __restrict__ token,
                                       float* __restrict__ confidence, int slices) {
    pdl_enter();
    const int lane = threadIdx.x;
    Top1 acc = {-INFINITY, 0x7fffffff, 0.f};
    if (lane < slices) {
        const float* in = scratch + ((size_t)blockIdx.x * slices + lane) * 3;
        acc = Top1{in[0], __float_as_int(in[1]), in[2]};
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = top1_merge(acc, top1_shfl(acc, o));
    if (lane == 0) {
        token[blockIdx.x] = (unsigned)acc.i;
        confidence[blockIdx.x] = 1.f / acc.s;
    }
}

// The best k (<= TOPK_MAX) ids of each row of BF16 logits in one order: larger value first (NaN
// below every number, -0 equal to +0), then lower id first; ids[row, 0..k) gets the first k ids of
// that order and values[row, 0..k) their logits (F32). A constrained decoder picks the best id its
// grammar allows among them and reads a row in full only when none is allowed.
// One CTA of TOPK_THREADS threads per row (grid = rows): a two-level radix select over 16-bit
// order keys finds the k-th key, then the ids above it and the lowest ids equal to it are
// collected and ranked. Deterministic: the result depends on the row only.
#define TOPK_MAX 64
#define TOPK_THREADS 512

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_rows(const bf16* __restrict__ logits, unsigned* __restrict__ ids,
                                                                      float* __restrict__ values, int vocab, int k) {
    pdl_enter();
    __shared__ unsigned hist[256];
    __shared__ unsigned sel_key, sel_need, above_n;
    __shared__ unsigned cand_id[TOPK_MAX], cand_key[TOPK_MAX];
    __shared__ unsigned warp_n[TOPK_THREADS / 32];
    const unsigned short* row = reinterpret_cast<const unsigned short*>(logits) + (size_t)blockIdx.x * vocab;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    // Thread tid reads ids 8v .. 8v + 7 for v = tid, tid + blockDim, ...: one 16-byte load each.
    const int vecs = (vocab + 7) / 8;

    // Two levels of radix select over the 16-bit keys. Level 0 counts the keys' high bytes and
    // finds the k-th key's, and how many ids of that high byte it still needs; level 1 counts the
    // low bytes of the keys with that high byte and finds the k-th key itself.
#pragma unroll
    for (int level = 0; level < 2; ++level) {
        const unsigned high = level ? sel_key : 0u;
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
        __syncthreads();
        for (int v0 = 0; v0 < vecs; v0 += blockDim.x) {
            unsigned bits[8];
            bf16_bits8(row, vocab, v0 + tid, bits);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const bool in = 8 * (v0 + tid) + e < vocab;
                const unsigned key = in ? bf16_order_key(bits[e]) : 0u;
                const bool counts = in && (level == 0 || (key & 0xff00u) == high);
                hist_count(hist, level ? key & 0xffu : key >> 8, counts, lane);
            }
        }
        __syncthreads();
        if (tid == 0) {
            unsigned need = level ? sel_need : (unsigned)k;
            int b = 255;
            while (hist[b] < need) need -= hist[b--];  // vocab >= k: stops at a bin
            sel_key = high | (level ? (unsigned)b : (unsigned)b << 8);
            sel_need = need;  // after level 1: the ids of the k-th key to take, lowest first
            above_n = 0u;
        }
        __syncthreads();
    }
    const unsigned kth = sel_key, ties = sel_need, above = (unsigned)k - ties;

    // The ids above the k-th key (exactly `above` of them), in any order: ranked below.
    for (int v = tid; v < vecs; v += blockDim.x) {
        unsigned bits[8];
        bf16_bits8(row, vocab, v, bits);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const unsigned key = bf16_order_key(bits[e]);
            if (8 * v + e < vocab && key > kth) {
                const unsigned at = atomicAdd(&above_n, 1u);
                cand_id[at] = (unsigned)(8 * v + e);
                cand_key[at] = key;
            }
        }
    }
    // The `ties` lowest ids of the k-th key: the row in id order, one CTA-wide chunk of
    // 8 x blockDim ids at a time (thread tid holds ids 8 (v0 + tid) ..).
    unsigned taken = 0u;  // the same in every thread
    for (int v0 = 0; v0 < vecs && taken < ties; v0 += blockDim.x) {
        const int v = v0 + tid;
        unsigned bits[8], hits = 0u;
        bf16_bits8(row, vocab, v, bits);
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (8 * v + e < vocab && bf16_order_key(bits[e]) == kth) hits |= 1u << e;
        const unsigned n = (unsigned)__popc(hits);
        unsigned inclusive = n;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned t = __shfl_up_sync(0xffffffffu, inclusive, o);
            if (lane >= o) inclusive += t;
        }
        if (lane == 31) warp_n[warp] = inclusive;
        __syncthreads();
        unsigned at = taken + inclusive - n, chunk = 0u;
        for (int w = 0; w < warps; ++w) {
            if (w < warp) at += warp_n[w];
            chunk += warp_n[w];
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if ((hits >> e) & 1u) {
                if (at < ties) {
                    cand_id[above + at] = (unsigned)(8 * v + e);
                    cand_key[above + at] = kth;
                }
                ++at;
            }
        }
        __syncthreads();  // warp_n is rewritten by the next chunk
        taken += chunk;
    }
    __syncthreads();
    // Rank the k candidates in the order and write them.
    if (tid < k) {
        const unsigned key = cand_key[tid], id = cand_id[tid];
        int rank = 0;
        for (int j = 0; j < k; ++j) rank += cand_key[j] > key || (cand_key[j] == key && cand_id[j] < id);
        const size_t out = (size_t)blockIdx.x * k + rank;
        ids[out] = id;
        values[out] = to_f32(logits[(size_t)blockIdx.x * vocab + id]);
    }
}

// Fills x[0..n) with BF16(scale * u), u uniform in [-1, 1) from a counter-based hash of
// (seed, index): reproducible random weights for benchmarks, made on the device.
extern "C" __global__ void fill_random_bf16(bf16* __restrict__ x, long long n, unsigned long long seed, float scale) {
    pdl_enter();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned long long z = seed + 0x9E3779B97F4A7C15ull * (unsigned long long)(i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
        x[i] = to_bf16(scale * u);
    }
}
