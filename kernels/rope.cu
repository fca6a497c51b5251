// QK-norm + partial rotate-half RoPE on the fused QKV projection, writing Q for attention and
// K (normed, rotated) / V (raw) into the layer's K/V pool (docs/model.md §7.4 steps 2-5).
#include "common.cuh"

// rope_cos_sin, once per forward: every row's BF16 cosines and sines of its rotary angles,
//   cs[t * rot / 2 + j] = BF16(cos a) | BF16(sin a) << 16,  a = F32(tok_pos[t]) * (1 / theta^(2j / rot))
// in F32, rounded to BF16 as the reference rounds them before use. Every layer's qk_norm_rope
// reads its token's row: the trigonometry was a dependent chain at the start of each of its CTAs
// (one warp computing while seven waited at a barrier), once per layer, and it set the kernel's
// speed on batched steps (x64: ~31 us a layer for ~25 MB of traffic).
//
// qk_norm_rope: qkv [T, (H + 2G) * d] in the order [Q heads | K heads | V heads].
// grid = (T, ceil((H + 2G) / ROPE_WARPS)), block = 32 * ROPE_WARPS: warp w of CTA (t, y) takes
// head y * ROPE_WARPS + w of token t; d <= 32 * PER. Row t of a batched forward is at absolute
// position tok_pos[t] (its angles in row t of cs) and its K/V go to row tok_slot[t] = page *
// page_size + (position % page_size) of the layer's pool (all in device memory, so a captured
// graph can be replayed at other positions and pages).
// q_out: [T, H, d]; k_pool, v_pool: [pages * page_size, G, d] of this layer.
// Lane l owns the ceil(d / 32) adjacent elements from l * ceil(d / 32): all of a lane's loads are
// issued together (a strided loop waited one memory round trip per element). PER, the most a
// lane owns, sizes its arrays: 4 (head dim <= 128, `qk_norm_rope_d128`) is held to 32 registers a
// thread, so 8 CTAs fit an SM; 8 (head dim <= 256) takes more. The kernel is a short chain of
// dependent steps per warp (loads, the norm's warp sum, the rotation's exchange through shared
// memory, stores) with no CTA-wide barrier, so resident warps are its speed.
#define ROPE_WARPS 8

extern "C" __global__ void __launch_bounds__(256)
    rope_cos_sin(const int* __restrict__ tok_pos, unsigned* __restrict__ cs, int tokens, int rot, float theta) {
    pdl_enter();  // the previous forward's layers may still read cs
    const int half = rot / 2, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens * half) return;
    const int t = i / half, j = i - t * half;
    const float inv_freq = 1.f / powf(theta, (float)(2 * j) / (float)rot);
    const float angle = (float)tok_pos[t] * inv_freq;
    const unsigned c = __bfloat16_as_ushort(to_bf16(cosf(angle)));
    const unsigned s = __bfloat16_as_ushort(to_bf16(sinf(angle)));
    cs[i] = c | s << 16;
}

// PER BF16 values as one vector access (8 or 16 bytes).
template <int PER>
struct __align__(2 * PER) RopePack {
    bf16 v[PER];
};

template <int PER>
__device__ __forceinline__ void qk_norm_rope_body(const bf16* __restrict__ qkv, const bf16* __restrict__ q_weight,
                                                  const bf16* __restrict__ k_weight, bf16* __restrict__ q_out,
                                                  bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                                  const unsigned* __restrict__ cs, const int* __restrict__ tok_slot,
                                                  int n_heads, int n_kv_heads, int d, int rot, float eps) {
    __shared__ float normed_all[ROPE_WARPS][256];
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * ROPE_WARPS + warp;
    if (head >= n_heads + 2 * n_kv_heads) return;
    float* normed = normed_all[warp];
    const int per = (d + 31) >> 5, i0 = lane * per, half = rot / 2;
    // A head of exactly 32 x PER elements (d 128 for PER 4, 256 for 8) is read and written with
    // one vector access per lane (four 2-byte accesses each took a load or store instruction
    // and a partial sector), and its cosines and sines with PER-word loads where the rotary
    // half is a multiple of PER (then a lane's elements are all rotated or all not, and their
    // angles are PER consecutive words); other shapes take the element loops.
    const bool full = d == 32 * PER, full_angles = full && half % PER == 0;
    const bool is_v = head >= n_heads + n_kv_heads, is_q = head < n_heads;
    // The norm weights are never written by a kernel: loaded before the wait.
    const bf16* w = is_q ? q_weight : k_weight;
    float wv[PER];
    if (full && !is_v) {
        const RopePack<PER> p = *reinterpret_cast<const RopePack<PER>*>(w + i0);
#pragma unroll
        for (int u = 0; u < PER; ++u) wv[u] = to_f32(p.v[u]);
    } else {
#pragma unroll
        for (int u = 0; u < PER; ++u) wv[u] = !is_v && u < per && i0 + u < d ? to_f32(w[i0 + u]) : 0.f;
    }
    pdl_enter();
    // Every global read this warp needs is issued here, together: the slot, the head's elements
    // and the cosines and sines of the lane's elements (j of element i: i, or i - rot / 2).
    const size_t slot = tok_slot[t];
    const bf16* src = qkv + ((size_t)t * (n_heads + 2 * n_kv_heads) + head) * d;
    bf16 raw[PER];
    if (full) {
        const RopePack<PER> p = *reinterpret_cast<const RopePack<PER>*>(src + i0);
#pragma unroll
        for (int u = 0; u < PER; ++u) raw[u] = p.v[u];
    } else {
#pragma unroll
        for (int u = 0; u < PER; ++u) raw[u] = u < per && i0 + u < d ? src[i0 + u] : to_bf16(0.f);
    }
    unsigned cos_sin[PER];
    if (full_angles) {
        const int j0 = i0 < half ? i0 : i0 - half;
        const uint4* row = reinterpret_cast<const uint4*>(cs + (size_t)t * half + j0);
#pragma unroll
        for (int q = 0; q < PER / 4; ++q) {
            const uint4 c4 = !is_v && i0 < rot ? row[q] : make_uint4(0, 0, 0, 0);
            cos_sin[4 * q] = c4.x;
            cos_sin[4 * q + 1] = c4.y;
            cos_sin[4 * q + 2] = c4.z;
            cos_sin[4 * q + 3] = c4.w;
        }
    } else {
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int i = i0 + u;
            cos_sin[u] = !is_v && u < per && i < rot ? cs[(size_t)t * half + (i < half ? i : i - half)] : 0u;
        }
    }
    bf16 y[PER];
    bf16* dst;
    if (is_v) {  // V head: cached as is
        dst = v_cache + (slot * n_kv_heads + (head - n_heads - n_kv_heads)) * d;
#pragma unroll
        for (int u = 0; u < PER; ++u) y[u] = raw[u];
    } else {
        dst = is_q ? q_out + ((size_t)t * n_heads + head) * d : k_cache + (slot * n_kv_heads + (head - n_heads)) * d;
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const float x = to_f32(raw[u]);
            ss += x * x;
        }
        ss = warp_sum(ss);
        const float inv = rsqrtf(ss / (float)d + eps);
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const float nv = to_f32(mul_bf16(to_bf16(wv[u]), to_bf16(to_f32(raw[u]) * inv)));
            if (u < per && i0 + u < d) normed[i0 + u] = nv;
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int i = i0 + u;
            if (u >= per || i >= d) break;
            if (i >= rot) {
                y[u] = to_bf16(normed[i]);
                continue;
            }
            const bf16 c = __ushort_as_bfloat16((unsigned short)(cos_sin[u] & 0xffffu));
            const bf16 s = __ushort_as_bfloat16((unsigned short)(cos_sin[u] >> 16));
            const bf16 x = to_bf16(normed[i]);
            const bf16 partner = to_bf16(normed[i < half ? i + half : i - half]);
            // y[j] = x[j] c - x[j+h] s ; y[j+h] = x[j+h] c + x[j] s  (three BF16 roundings each)
            const float xc = to_f32(mul_bf16(x, c)), ps = to_f32(mul_bf16(partner, s));
            y[u] = to_bf16(i < half ? xc - ps : xc + ps);
        }
    }
    if (full) {
        RopePack<PER> p;
#pragma unroll
        for (int u = 0; u < PER; ++u) p.v[u] = y[u];
        *reinterpret_cast<RopePack<PER>*>(dst + i0) = p;
    } else {
#pragma unroll
        for (int u = 0; u < PER; ++u)
            if (u < per && i0 + u < d) dst[i0 + u] = y[u];
    }
}

#define ROPE_ENTRY(NAME, PER, MIN_CTAS)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS, MIN_CTAS)                                    \
        NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ q_weight, const bf16* __restrict__ k_weight, \
             bf16* __restrict__ q_out, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,                 \
             const unsigned* __restrict__ cs, const int* __restrict__ tok_slot, int n_heads, int n_kv_heads,   \
             int d, int rot, float eps) {                                                                      \
        qk_norm_rope_body<PER>(qkv, q_weight, k_weight, q_out, k_cache, v_cache, cs, tok_slot, n_heads,        \
                               n_kv_heads, d, rot, eps);                                                       \
    }
ROPE_ENTRY(qk_norm_rope, 8, 1)       // head dim <= 256
ROPE_ENTRY(qk_norm_rope_d128, 4, 8)  // head dim <= 128: at most 32 registers, 8 CTAs an SM
