// QK-norm + partial rotate-half RoPE on the fused QKV projection, writing Q for attention and
// K (normed, rotated) / V (raw) into the layer's K/V pool (docs/model.md §7.4 steps 2-5).
#include "common.cuh"

// qkv: [T, (H + 2G) * d] in the order [Q heads | K heads | V heads]. grid = (T, ceil((H + 2G) /
// ROPE_WARPS)), block = 32 * ROPE_WARPS: warp w of CTA (t, y) takes head y * ROPE_WARPS + w of
// token t; d <= 32 * PER. Row t of a batched forward is at absolute position tok_pos[t] and its K/V go
// to row tok_slot[t] = page * page_size + (position % page_size) of the layer's pool (both in
// device memory, so a captured graph can be replayed at other positions and pages).
// q_out: [T, H, d]; k_pool, v_pool: [pages * page_size, G, d] of this layer.
// Lane l owns the ceil(d / 32) adjacent elements from l * ceil(d / 32): all of a lane's loads are
// issued together (a strided loop waited one memory round trip per element). PER, the most a
// lane owns, sizes its arrays: 4 (head dim <= 128, `qk_norm_rope_d128`) keeps a thread at 32
// registers, so 8 CTAs fit an SM; 8 (head dim <= 256) takes 40, and 6 fit. The kernel is a short
// chain of dependent steps per CTA, so resident CTAs are its speed: on an H100 the 4-element
// kernel took the stage from 1.30 to 1.06 ms in a 4,096-token prefill (the same bits).
// The token's rot / 2 cosines and sines are computed once per CTA, not once per head: with a warp
// per CTA and the trigonometry per element, a 4,096-token prefill spent 124 us per layer here.
#define ROPE_WARPS 8
template <int PER>
__device__ __forceinline__ void qk_norm_rope_body(const bf16* __restrict__ qkv, const bf16* __restrict__ q_weight,
                                                  const bf16* __restrict__ k_weight, bf16* __restrict__ q_out,
                                                  bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                                  const int* __restrict__ tok_pos, const int* __restrict__ tok_slot,
                                                  int n_heads, int n_kv_heads, int d, int rot, float theta,
                                                  float eps) {
    __shared__ float normed_all[ROPE_WARPS][256];
    __shared__ float cos_j[128], sin_j[128];  // BF16 values (the reference rounds them), j < rot / 2
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * ROPE_WARPS + warp;
    const bool active = head < n_heads + 2 * n_kv_heads;
    float* normed = normed_all[warp];
    const int per = (d + 31) >> 5, i0 = lane * per;
    const bool is_v = head >= n_heads + n_kv_heads, is_q = head < n_heads;
    // The norm weights are never written by a kernel: loaded before the wait.
    const bf16* w = is_q ? q_weight : k_weight;
    float wv[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u)
        wv[u] = active && !is_v && u < per && i0 + u < d ? to_f32(w[i0 + u]) : 0.f;
    pdl_enter();
    // Every global read this CTA needs is issued here, before the token's trigonometry, so the
    // loads of the head and of the slot are in flight while warp 0 computes the cosines (the
    // kernel is a short chain of dependent steps; each one waited for the previous before).
    const int pos = tok_pos[t];
    const size_t slot = active ? (size_t)tok_slot[t] : 0;
    const bf16* src = qkv + ((size_t)t * (n_heads + 2 * n_kv_heads) + head) * d;
    bf16 raw[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u)
        raw[u] = active && u < per && i0 + u < d ? src[i0 + u] : to_bf16(0.f);
    const int half = rot / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        // inv_freq[j] = 1 / theta^(2j / rot) and angle = F32(pos) * inv_freq, both in F32; the
        // reference casts cos and sin to BF16 before use.
        const float inv_freq = 1.f / powf(theta, (float)(2 * j) / (float)rot);
        const float angle = (float)pos * inv_freq;
        cos_j[j] = to_f32(to_bf16(cosf(angle)));
        sin_j[j] = to_f32(to_bf16(sinf(angle)));
    }
    __syncthreads();
    if (!active) return;
    if (is_v) {  // V head: cached as is
        bf16* dst = v_cache + (slot * n_kv_heads + (head - n_heads - n_kv_heads)) * d;
#pragma unroll
        for (int u = 0; u < PER; ++u)
            if (u < per && i0 + u < d) dst[i0 + u] = raw[u];
        return;
    }
    bf16* dst = is_q ? q_out + ((size_t)t * n_heads + head) * d
                     : k_cache + (slot * n_kv_heads + (head - n_heads)) * d;
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const float x = to_f32(raw[u]);
        ss += x * x;
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)d + eps);
    float nv[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        nv[u] = to_f32(mul_bf16(to_bf16(wv[u]), to_bf16(to_f32(raw[u]) * inv)));
        if (u < per && i0 + u < d) normed[i0 + u] = nv[u];
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int i = i0 + u;
        if (u >= per || i >= d) break;
        if (i >= rot) {
            dst[i] = to_bf16(normed[i]);
            continue;
        }
        const int j = i < half ? i : i - half;
        const bf16 c = to_bf16(cos_j[j]), s = to_bf16(sin_j[j]);
        const bf16 x = to_bf16(normed[i]);
        const bf16 partner = to_bf16(normed[i < half ? i + half : i - half]);
        // y[j] = x[j] c - x[j+h] s ; y[j+h] = x[j+h] c + x[j] s  (three BF16 roundings each)
        const float xc = to_f32(mul_bf16(x, c)), ps = to_f32(mul_bf16(partner, s));
        dst[i] = to_bf16(i < half ? xc - ps : xc + ps);
    }
}

#define ROPE_ENTRY(NAME, PER)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS)                                              \
        NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ q_weight, const bf16* __restrict__ k_weight, \
             bf16* __restrict__ q_out, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,                 \
             const int* __restrict__ tok_pos, const int* __restrict__ tok_slot, int n_heads, int n_kv_heads,   \
             int d, int rot, float theta, float eps) {                                                         \
        qk_norm_rope_body<PER>(qkv, q_weight, k_weight, q_out, k_cache, v_cache, tok_pos, tok_slot, n_heads,   \
                               n_kv_heads, d, rot, theta, eps);                                                \
    }
ROPE_ENTRY(qk_norm_rope, 8)       // head dim <= 256
ROPE_ENTRY(qk_norm_rope_d128, 4)  // head dim <= 128
