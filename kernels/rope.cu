// QK-norm + partial rotate-half RoPE on the fused QKV projection, writing Q for attention and
// K (normed, rotated) / V (raw) into the layer's K/V cache (docs/llada2-model.md §7.4 steps 2-5).
#include "common.cuh"

// qkv: [T, (H + 2G) * d] in the order [Q heads | K heads | V heads]. grid = (T, H + 2G), one warp
// per (token, head); d <= 256. The token's absolute position is pos0[0] + t (pos0 lives in device
// memory so that a captured graph can be replayed at another position).
// q_out: [T, H, d]; k_cache, v_cache: [capacity, G, d] of this layer.
extern "C" __global__ void qk_norm_rope(const bf16* __restrict__ qkv, const bf16* __restrict__ q_weight,
                                        const bf16* __restrict__ k_weight, bf16* __restrict__ q_out,
                                        bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                        const int* __restrict__ pos0, int n_heads, int n_kv_heads, int d,
                                        int rot, float theta, float eps) {
    pdl_enter();
    __shared__ float raw[256];  // the head's projected values, BF16-exact
    __shared__ float normed[256];
    const int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    const int pos = pos0[0] + t;
    const size_t src0 = ((size_t)t * (n_heads + 2 * n_kv_heads) + head) * d;
    for (int i = lane; i < d; i += 32) raw[i] = to_f32(qkv[src0 + i]);
    __syncwarp();
    if (head >= n_heads + n_kv_heads) {  // V head: cached as is
        bf16* dst = v_cache + ((size_t)pos * n_kv_heads + (head - n_heads - n_kv_heads)) * d;
        for (int i = lane; i < d; i += 32) dst[i] = to_bf16(raw[i]);
        return;
    }
    const bool is_q = head < n_heads;
    const bf16* w = is_q ? q_weight : k_weight;
    bf16* dst = is_q ? q_out + ((size_t)t * n_heads + head) * d
                     : k_cache + ((size_t)pos * n_kv_heads + (head - n_heads)) * d;
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) {
        const float u = raw[i];
        ss += u * u;
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32) normed[i] = to_f32(mul_bf16(w[i], to_bf16(raw[i] * inv)));
    __syncwarp();
    const int half = rot / 2;
    for (int i = lane; i < d; i += 32) {
        if (i >= rot) {
            dst[i] = to_bf16(normed[i]);
            continue;
        }
        const int j = i < half ? i : i - half;
        // inv_freq[j] = 1 / theta^(2j / rot) and angle = F32(pos) * inv_freq, both in F32; the
        // reference casts cos and sin to BF16 before use.
        const float inv_freq = 1.f / powf(theta, (float)(2 * j) / (float)rot);
        const float angle = (float)pos * inv_freq;
        const bf16 c = to_bf16(cosf(angle)), s = to_bf16(sinf(angle));
        const bf16 x = to_bf16(normed[i]);
        const bf16 partner = to_bf16(normed[i < half ? i + half : i - half]);
        // y[j] = x[j] c - x[j+h] s ; y[j+h] = x[j+h] c + x[j] s  (three BF16 roundings each)
        const float xc = to_f32(mul_bf16(x, c)), ps = to_f32(mul_bf16(partner, s));
        dst[i] = to_bf16(i < half ? xc - ps : xc + ps);
    }
}
