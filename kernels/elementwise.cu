// Row-wise kernels of the LLaDA2 forward: embedding gather, RMSNorm (with the fused residual add),
// SiLU-multiply, the F32 MoE mix, conversions, and the argmax/softmax confidence of logits rows.
// Numerics follow the reference order of docs/llada2-model.md §7 (RMSNorm rounds to BF16 before
// the weight; SiLU in F32 rounded to BF16, then a BF16 product).
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

// Fused residual add and RMSNorm over rows of length d (one CTA per row):
//   if delta != null: h = BF16(h + delta)        (the residual stream, updated in place)
//   out = BF16(weight * BF16(F32(h) * rsqrt(mean(F32(h)^2) + eps)))
// Columns per thread and pass of add_rmsnorm and moe_combine_add_rmsnorm (d <= 8 * blockDim in
// one pass). Thread `tid` owns columns tid + n * blockDim; all loads of a pass are issued before
// any is used (one column at a time waited for a memory round trip per column).
#define NORM_COLS 8

extern "C" __global__ void add_rmsnorm(bf16* __restrict__ h, const bf16* __restrict__ delta,
                                       const bf16* __restrict__ weight, bf16* __restrict__ out, int d,
                                       float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    const int nt = blockDim.x;
    bf16* row = h + (size_t)blockIdx.x * d;
    bf16* orow = out + (size_t)blockIdx.x * d;
    const bf16* drow = delta ? delta + (size_t)blockIdx.x * d : nullptr;
    float ss = 0.f;
    for (int base = threadIdx.x; base < d; base += NORM_COLS * nt) {
        bool ok[NORM_COLS];
        float hv[NORM_COLS], dv[NORM_COLS];
#pragma unroll
        for (int c = 0; c < NORM_COLS; ++c) {
            const int i = base + c * nt;
            ok[c] = i < d;
            hv[c] = ok[c] ? to_f32(row[i]) : 0.f;
            dv[c] = ok[c] && drow ? to_f32(drow[i]) : 0.f;
        }
#pragma unroll
        for (int c = 0; c < NORM_COLS; ++c) {
            if (!ok[c]) continue;
            bf16 v = to_bf16(hv[c]);
            if (drow) {
                v = to_bf16(hv[c] + dv[c]);
                row[base + c * nt] = v;
            }
            const float u = to_f32(v);
            ss += u * u;
        }
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    // Same columns as above, so each thread reads back only what it wrote itself.
    for (int base = threadIdx.x; base < d; base += NORM_COLS * nt) {
        float hv[NORM_COLS];
        bf16 wv[NORM_COLS];
#pragma unroll
        for (int c = 0; c < NORM_COLS; ++c) {
            const int i = base + c * nt;
            hv[c] = i < d ? to_f32(row[i]) : 0.f;
            wv[c] = i < d ? weight[i] : to_bf16(0.f);
        }
#pragma unroll
        for (int c = 0; c < NORM_COLS; ++c) {
            const int i = base + c * nt;
            if (i < d) orow[i] = mul_bf16(wv[c], to_bf16(hv[c] * inv));
        }
    }
}

// gu is [rows, 2*width] with the gate projection in columns [0, width) and up in [width, 2*width);
// out[r, j] = BF16( BF16(silu(F32(gate))) * up ). grid = (rows, ceil(width / blockDim)).
extern "C" __global__ void silu_mul(const bf16* __restrict__ gu, bf16* __restrict__ out, int width) {
    pdl_enter();
    const int r = blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= width) return;
    const float g = to_f32(gu[(size_t)r * 2 * width + j]);
    const bf16 act = to_bf16(g / (1.f + expf(-g)));
    out[(size_t)r * width + j] = mul_bf16(act, gu[(size_t)r * 2 * width + width + j]);
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

#define COMBINE_NORM_COLS NORM_COLS
// Most routed experts per token moe_combine_add_rmsnorm takes (their rows sit in shared memory).
#define COMBINE_NORM_MAX_K 32

// The end of an MoE layer fused with the next RMSNorm (the next layer's input norm, or the final
// norm): moe_combine into a delta that is never stored, then add_rmsnorm's arithmetic
//   h = BF16(h + mix)    out = BF16(weight * BF16(F32(h) * rsqrt(mean(F32(h)^2) + eps)))
// One CTA per token, k <= COMBINE_NORM_MAX_K. Bit-identical to moe_combine then add_rmsnorm when
// launched with add_rmsnorm's blockDim: each thread owns the same columns (i = tid + n * blockDim),
// mixes them in the same order (expert by expert, F32) and feeds block_sum the same partial sums. The
// difference is the load order: a thread issues the loads of its COMBINE_NORM_COLS columns of
// several expert rows together, so a pass waits for a few rounds of loads instead of one round per
// (column, expert) (a first version mixing column by column was slower than the two launches).
extern "C" __global__ void moe_combine_add_rmsnorm(const bf16* __restrict__ y, const int* __restrict__ slot_pos,
                                                   const float* __restrict__ w, const bf16* __restrict__ shared,
                                                   const int* __restrict__ shared_rows, bf16* __restrict__ h,
                                                   const bf16* __restrict__ weight, bf16* __restrict__ out, int k,
                                                   int d, float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    __shared__ int rows[COMBINE_NORM_MAX_K];
    __shared__ float wts[COMBINE_NORM_MAX_K];
    const int t = blockIdx.x, nt = blockDim.x;
    for (int j = threadIdx.x; j < k; j += nt) {
        rows[j] = slot_pos[t * k + j];
        wts[j] = w[t * k + j];
    }
    __syncthreads();
    const bf16* srow = shared_rows ? y + (size_t)shared_rows[t] * d : shared ? shared + (size_t)t * d : nullptr;
    bf16* row = h + (size_t)t * d;
    float ss = 0.f;
    for (int base = threadIdx.x; base < d; base += COMBINE_NORM_COLS * nt) {
        // The residual and shared-expert columns are loaded before the mix, with its first rows.
        float acc[COMBINE_NORM_COLS], hv[COMBINE_NORM_COLS], sv[COMBINE_NORM_COLS];
#pragma unroll
        for (int c = 0; c < COMBINE_NORM_COLS; ++c) {
            const int i = base + c * nt;
            acc[c] = 0.f;
            hv[c] = i < d ? to_f32(row[i]) : 0.f;
            sv[c] = i < d && srow ? to_f32(srow[i]) : 0.f;
        }
#pragma unroll 4
        for (int j = 0; j < k; ++j) {
            const bf16* yr = y + (size_t)rows[j] * d;
            const float wj = wts[j];
#pragma unroll
            for (int c = 0; c < COMBINE_NORM_COLS; ++c) {
                const int i = base + c * nt;
                if (i < d) acc[c] += wj * to_f32(yr[i]);
            }
        }
#pragma unroll
        for (int c = 0; c < COMBINE_NORM_COLS; ++c) {
            const int i = base + c * nt;
            if (i < d) {
                bf16 delta = to_bf16(acc[c]);
                if (srow) delta = to_bf16(to_f32(delta) + sv[c]);
                const bf16 v = to_bf16(hv[c] + to_f32(delta));
                row[i] = v;
                const float u = to_f32(v);
                ss += u * u;
            }
        }
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    bf16* orow = out + (size_t)t * d;
    // Same columns as above, so each thread reads back only what it wrote itself.
    for (int base = threadIdx.x; base < d; base += COMBINE_NORM_COLS * nt) {
#pragma unroll
        for (int c = 0; c < COMBINE_NORM_COLS; ++c) {
            const int i = base + c * nt;
            if (i < d) orow[i] = mul_bf16(weight[i], to_bf16(to_f32(row[i]) * inv));
        }
    }
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

// Pass 1 of the argmax/softmax confidence of logits rows: CTA (row, slice) reduces its slice of
// the row to (max, argmax, sum of exp) in scratch[row, slice, 0..3]. grid = (rows, slices).
extern "C" __global__ void top1_partial(const bf16* __restrict__ logits, float* __restrict__ scratch, int vocab) {
    pdl_enter();
    __shared__ Top1 warps[32];
    const int slices = gridDim.y;
    const int per = (vocab + slices - 1) / slices;
    const int c0 = blockIdx.y * per, c1 = min(vocab, c0 + per);
    const bf16* row = logits + (size_t)blockIdx.x * vocab;
    Top1 acc = {-INFINITY, 0x7fffffff, 0.f};
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const float x = to_f32(row[c]);
        if (x > acc.m) {  // c grows per thread: equal values keep the lower index
            acc.s = acc.m == -INFINITY ? 1.f : acc.s * expf(acc.m - x) + 1.f;
            acc.m = x;
            acc.i = c;
        } else {
            acc.s += expf(x - acc.m);
        }
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
