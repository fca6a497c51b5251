// Sampled candidates drawn on the GPU from a forward's BF16 logits rows (docs/decoding.md §4.7):
// the tempered, top-k / top-p filtered distribution of a row and one draw from it, for the two
// sampling rules (2.0/2.1 "official", 2.2 "port"), without copying the rows to the host.
//
// Every sum is an integer sum. Each kept id's weight w (at most 1: the row's largest logit has
// weight exactly 1) becomes the fixed-point q = floor(w * 2^44), so sums are exact and their order
// does not matter: the result depends on the row, the settings and the uniform only, not on the
// thread layout, the atomics' order or what else the launch holds. Weights below 2^-44 of the
// best one's become 0 and are never drawn (at most 157k of them: a chance below 1e-8 in all).
#include "common.cuh"

#define DRAW_THREADS 1024
#define DRAW_WARPS (DRAW_THREADS / 32)
// Ids per block of the block sums and the walk: 32 lanes x 8 ids.
#define DRAW_BLOCK 256
// Most blocks a row may have (vocabularies up to 262,144 ids).
#define DRAW_MAX_BLOCKS 1024
#define DRAW_ONE 17592186044416.0f  // 2^44: fixed-point weight 1

typedef unsigned long long u64;

// One row's draw, as the host lays it out (32 bytes).
struct DrawParams {
    unsigned row;        // the row's index among the forward's wanted rows
    unsigned rule;       // 0: official (2.0/2.1), 1: port (2.2)
    unsigned top_k;      // 0 or >= vocab: off
    float temperature;   // <= 0: no draw; the argmax (the official rule with filters)
    float top_p;         // outside [0, 1): off
    unsigned pad;
    double uniform;      // in [0, 1)
};

// The row and the rule's weights.
struct DrawRow {
    const unsigned short* x;  // BF16 bits
    int vocab, blocks;
    unsigned rule;
    float t, xmax, zmax;
    // Kept ids: key >= key_lo, and (top-p) key > key_p or key == key_p with id <= cut.
    unsigned key_lo, key_p;
    int cut;
};

__device__ __forceinline__ float bits_f32(unsigned bits) { return __uint_as_float(bits << 16); }

// The BF16 bits whose order key is `key` (key > 0).
__device__ __forceinline__ unsigned key_bits(unsigned key) {
    return (key & 0x8000u) ? (key & 0x7fffu) : (~key & 0xffffu);
}

// The rule's weight of logit x, in (0, 1]: official exp(x/t - xmax/t) (the tempered logits, t
// applied as the host's sampler does: not at all when t is 1), port exp((x - xmax) / t).
__device__ __forceinline__ float draw_weight(const DrawRow& r, float x) {
    if (r.rule == 0) return expf((r.t != 1.f ? x / r.t : x) - r.zmax);
    return expf((x - r.xmax) / r.t);
}

__device__ __forceinline__ u64 fixed_weight(float w) { return (u64)(w * DRAW_ONE); }

__device__ __forceinline__ bool draw_kept(const DrawRow& r, int id, unsigned key) {
    return key >= r.key_lo && (key > r.key_p || (key == r.key_p && id <= r.cut));
}

// The 8 logits (bits) of lane `lane` in block `b`: ids b * 256 + lane * 8 + e; ids past the row
// read as NaN (key 0: never counted, never kept).
__device__ __forceinline__ void lane_bits(const DrawRow& r, int b, int lane, unsigned (&bits)[8]) {
    bf16_bits8(r.x, r.vocab, b * (DRAW_BLOCK / 8) + lane, bits);
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Lane l gets v summed over lanes 0..=l (all 32 lanes call it).
__device__ __forceinline__ u64 warp_inclusive_sum_u64(u64 v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

// hist[bin] += q for every lane of the warp with a nonzero q (all 32 lanes call it): the lanes of
// one bin add their weights in the warp (q < 2^45: its low 22 and high 23 bits each sum over 32
// lanes within 32 bits), and one of them adds the sum to the shared bin.
__device__ __forceinline__ void hist_mass(u64* hist, unsigned bin, u64 q, int lane) {
    const unsigned peers = __match_any_sync(0xffffffffu, q ? bin : 0x100u);
    const unsigned lo = __reduce_add_sync(peers, (unsigned)(q & 0x3fffffull));
    const unsigned hi = __reduce_add_sync(peers, (unsigned)(q >> 22));
    if (q && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], ((u64)hi << 22) + lo);
}

// The first bin, from 255 down, at which the running sum of hist passes `target` (sum > target);
// `*before` gets the sum of the bins above it. Warp 0 calls it; every lane gets the answer. 256
// when the whole histogram does not pass the target.
__device__ __forceinline__ int first_bin_past(const u64* hist, u64 target, u64* before, int lane) {
    // Lane l holds bins 255 - 8l .. 248 - 8l, highest first.
    u64 mine = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) mine += hist[255 - 8 * lane - e];
    const u64 inclusive = warp_inclusive_sum_u64(mine, lane);
    const unsigned past = __ballot_sync(0xffffffffu, inclusive > target);
    if (!past) {
        *before = __shfl_sync(0xffffffffu, inclusive, 31);
        return 256;
    }
    const int at = __ffs(past) - 1;
    u64 run = __shfl_sync(0xffffffffu, inclusive - mine, at);
    int bin = 255 - 8 * at;
    for (int e = 0; e < 8; ++e, --bin) {
        const u64 h = hist[bin];
        if (run + h > target) break;
        run += h;
    }
    *before = run;
    return bin;
}

// sums[b] = the sum of value(id, bits) over block b, for every block (all threads call it;
// synchronizes before and after).
template <class Value>
__device__ __forceinline__ void block_sums(const DrawRow& r, u64* sums, Value value) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    // Two blocks per warp and round, both loads issued before either is summed.
    for (int b = warp; b < r.blocks; b += 2 * DRAW_WARPS) {
        const int b2 = b + DRAW_WARPS;
        unsigned bits[2][8];
        lane_bits(r, b, lane, bits[0]);
        lane_bits(r, b2 < r.blocks ? b2 : r.blocks, lane, bits[1]);  // past the row: NaN
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int block = h ? b2 : b;
            u64 s = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) s += value(block * DRAW_BLOCK + lane * 8 + e, bits[h][e]);
            s = warp_sum_u64(s);
            if (lane == 0 && block < r.blocks) sums[block] = s;
        }
    }
    __syncthreads();
}

// The first id, in ascending order, at which the running sum of value(id, bits) passes `target`
// (sum > target), given the block sums of the same values. Warp 0 calls it; every lane gets the
// answer. -1 when the whole row does not pass it.
template <class Value>
__device__ __forceinline__ int walk_past(const DrawRow& r, const u64* sums, u64 target, Value value, int lane) {
    u64 run = 0;
    int block = -1;
    for (int base = 0; base < r.blocks && block < 0; base += 32) {
        const u64 s = base + lane < r.blocks ? sums[base + lane] : 0ull;
        const u64 inclusive = warp_inclusive_sum_u64(s, lane);
        const unsigned past = __ballot_sync(0xffffffffu, run + inclusive > target);
        if (past) {
            const int at = __ffs(past) - 1;
            run += __shfl_sync(0xffffffffu, inclusive - s, at);
            block = base + at;
        } else {
            run += __shfl_sync(0xffffffffu, inclusive, 31);
        }
    }
    if (block < 0) return -1;
    unsigned bits[8];
    lane_bits(r, block, lane, bits);
    u64 v[8], mine = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        v[e] = value(block * DRAW_BLOCK + lane * 8 + e, bits[e]);
        mine += v[e];
    }
    const u64 inclusive = warp_inclusive_sum_u64(mine, lane);
    const unsigned past = __ballot_sync(0xffffffffu, run + inclusive > target);
    if (!past) return -1;  // the block sums said otherwise: cannot happen
    const int at = __ffs(past) - 1;
    int id = -1;
    if (lane == at) {
        u64 acc = run + inclusive - mine;
        for (int e = 0; e < 8; ++e) {
            acc += v[e];
            if (acc > target) {
                id = block * DRAW_BLOCK + lane * 8 + e;
                break;
            }
        }
    }
    return __shfl_sync(0xffffffffu, id, at);
}

// One CTA of DRAW_THREADS per draw. `logits` are the forward's BF16 rows [rows, vocab]; each
// row's best ids (`best_k` per row: ids and logits, in the order "larger logit first, lower id
// first") and its argmax token and probability are what the forward's top-k kernels wrote beside
// them (`best_ids`, `best_values`, `top_token`, `top_conf`). Writes out[2 i] = the token,
// out[2 i + 1] = its confidence (F32 bits): under the official rule the drawn id's probability in
// the filtered distribution, under the port rule its probability under the whole row's
// untempered softmax, exp(x - xmax) times the argmax's probability (as a greedy 2.2 step computes
// a replacement's).
//
// Passes over the row: one for the draw's block sums; with top-p one more for the kept mass,
// whose crossing is usually among the best ids (a trained model's nucleus is short) and is found
// by mass histograms (two more passes) only where it is not; with a top-k beyond the best ids,
// two counting passes.
extern "C" __global__ void __launch_bounds__(DRAW_THREADS) draw_rows(
    const bf16* __restrict__ logits, const unsigned* __restrict__ best_ids, const float* __restrict__ best_values,
    int best_k, const unsigned* __restrict__ top_token, const float* __restrict__ top_conf,
    const DrawParams* __restrict__ params, unsigned* __restrict__ out, int vocab) {
    pdl_enter();
    __shared__ u64 sums[DRAW_MAX_BLOCKS];
    __shared__ u64 hist[256];
    __shared__ unsigned counts[256];
    __shared__ unsigned shared_key;
    __shared__ int shared_cut;
    __shared__ u64 shared_total, shared_threshold;
    __shared__ bool shared_found;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const DrawParams p = params[blockIdx.x];
    const unsigned* best_id = best_ids + (size_t)p.row * best_k;
    const float* best_x = best_values + (size_t)p.row * best_k;

    DrawRow r;
    r.x = reinterpret_cast<const unsigned short*>(logits) + (size_t)p.row * vocab;
    r.vocab = vocab;
    r.blocks = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    r.rule = p.rule;
    r.t = p.temperature > 0.f ? p.temperature : 1.f;
    r.xmax = best_x[0];
    r.zmax = r.t != 1.f ? r.xmax / r.t : r.xmax;
    r.key_lo = 1u;  // every number; NaN (key 0) is never kept
    r.key_p = 0u;
    r.cut = vocab;
    // The order key of a best id's logit (an exact BF16 value in F32).
    auto best_key = [&](int i) { return bf16_order_key(__float_as_uint(best_x[i]) >> 16); };

    // Top-k: the k-th largest key (ties at it survive). The same for both rules: tempering keeps
    // the order of BF16 values. Read off the best ids when they reach that far, else a two-level
    // radix select over the 16-bit keys.
    if (p.top_k > 0 && p.top_k < (unsigned)vocab && p.top_k <= (unsigned)best_k) {
        r.key_lo = max(best_key((int)p.top_k - 1), 1u);
    } else if (p.top_k > 0 && p.top_k < (unsigned)vocab) {
        unsigned need = p.top_k, high = 0u;
        for (int level = 0; level < 2; ++level) {
            for (int i = tid; i < 256; i += DRAW_THREADS) counts[i] = 0u;
            __syncthreads();
            for (int b = warp; b < r.blocks; b += DRAW_WARPS) {
                unsigned bits[8];
                lane_bits(r, b, lane, bits);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const unsigned key = bf16_order_key(bits[e]);
                    const bool in = key != 0u && (level == 0 || (key & 0xff00u) == high);
                    // The second level counts one high byte's ids: most warps have none.
                    if (__any_sync(0xffffffffu, in)) hist_count(counts, level == 0 ? key >> 8 : key & 0xffu, in, lane);
                }
            }
            __syncthreads();
            if (tid == 0) {
                int b = 255;
                while (b > 0 && counts[b] < need) need -= counts[b--];
                shared_key = level == 0 ? (unsigned)b << 8 : high | (unsigned)b;
            }
            __syncthreads();
            if (level == 0) {
                high = shared_key;
                if (tid == 0) shared_cut = (int)need;
                __syncthreads();
                need = (unsigned)shared_cut;
            }
        }
        r.key_lo = max(shared_key, 1u);
    }

    // Top-p: the shortest prefix of the kept ids in the order "larger logit first, lower id first"
    // whose mass passes top_p of theirs (the crossing id kept): every id above the crossing key,
    // and the ids of that key up to the crossing's.
    if (p.top_p >= 0.f && p.top_p < 1.f) {
        auto kept_k = [&](int, unsigned bits) -> u64 {
            const unsigned key = bf16_order_key(bits);
            return key >= r.key_lo ? fixed_weight(draw_weight(r, bits_f32(bits))) : 0ull;
        };
        block_sums(r, sums, kept_k);
        if (warp == 0) {
            u64 total = 0;
            for (int b = lane; b < r.blocks; b += 32) total += sums[b];
            total = warp_sum_u64(total);
            const u64 threshold = (u64)((double)p.top_p * (double)total);
            // The best ids are a prefix of the order: the crossing is the first of them whose
            // running mass passes the threshold, if one does (lane l holds entries 2l, 2l + 1).
            u64 q[2], mine = 0;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 2 * lane + h;
                const unsigned key = i < best_k ? best_key(i) : 0u;
                q[h] = key >= r.key_lo ? fixed_weight(draw_weight(r, best_x[i])) : 0ull;
                mine += q[h];
            }
            const u64 inclusive = warp_inclusive_sum_u64(mine, lane);
            const unsigned past = __ballot_sync(0xffffffffu, inclusive > threshold);
            if (lane == 0) {
                shared_threshold = threshold;
                shared_found = past != 0u;
            }
            if (past) {
                const int at = __ffs(past) - 1;
                if (lane == at) {
                    const int i = inclusive - q[1] > threshold ? 2 * lane : 2 * lane + 1;
                    shared_key = best_key(i);
                    shared_cut = (int)best_id[i];
                }
            }
        }
        __syncthreads();
        if (shared_found) {
            r.key_p = shared_key;
            r.cut = shared_cut;
        } else {
            // A long nucleus: the crossing key by two levels of mass histograms, then the id of
            // the last kept one of its ids.
            const u64 threshold = shared_threshold;
            unsigned high = 0u;
            bool found = true;
            if (tid == 0) shared_total = 0ull;
            for (int level = 0; level < 2 && found; ++level) {
                for (int i = tid; i < 256; i += DRAW_THREADS) {
                    hist[i] = 0ull;
                    counts[i] = 0u;
                }
                __syncthreads();
                for (int b = warp; b < r.blocks; b += DRAW_WARPS) {
                    unsigned bits[8];
                    lane_bits(r, b, lane, bits);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const unsigned key = bf16_order_key(bits[e]);
                        const bool in = key >= r.key_lo && (level == 0 || (key & 0xff00u) == high);
                        const unsigned bin = level == 0 ? key >> 8 : key & 0xffu;
                        if (!__any_sync(0xffffffffu, in)) continue;  // the warp has none here
                        hist_mass(hist, bin, in ? fixed_weight(draw_weight(r, bits_f32(bits[e]))) : 0ull, lane);
                        if (level == 1) hist_count(counts, bin, in, lane);
                    }
                }
                __syncthreads();
                if (warp == 0) {
                    const u64 above = shared_total;
                    u64 before = 0;
                    const int bin = first_bin_past(hist, threshold - above, &before, lane);
                    if (lane == 0) {
                        // No bin passes only where rounding left the threshold at the total:
                        // all the ids stay.
                        shared_found = bin <= 255;
                        shared_key = level == 0 ? (unsigned)bin << 8 : high | (unsigned)bin;
                        shared_total = above + before;
                        if (level == 1 && bin <= 255) {
                            // The crossing is among the ids of this key (all of one weight q):
                            // the first j of them in id order are kept.
                            const u64 w = fixed_weight(draw_weight(r, bits_f32(key_bits(shared_key))));
                            const u64 j = w ? (threshold - shared_total) / w + 1 : (u64)counts[bin];
                            shared_cut = j < (u64)counts[bin] ? (int)j : -1;
                        }
                    }
                }
                __syncthreads();
                found = shared_found;
                high = shared_key;
            }
            if (found) {
                const unsigned key_p = shared_key;
                const int j = shared_cut;
                if (j > 0) {
                    // The id of the j-th id whose key is key_p, in id order.
                    auto tie = [&](int, unsigned bits) -> u64 { return bf16_order_key(bits) == key_p ? 1ull : 0ull; };
                    block_sums(r, sums, tie);
                    if (warp == 0) {
                        const int id = walk_past(r, sums, (u64)(j - 1), tie, lane);
                        if (lane == 0) shared_cut = id < 0 ? vocab : id;
                    }
                    __syncthreads();
                    r.cut = shared_cut;
                }
                r.key_p = key_p;
            }
        }
    }

    // The kept ids' weights, their block sums, and the draw.
    auto weight = [&](int id, unsigned bits) -> u64 {
        const unsigned key = bf16_order_key(bits);
        return draw_kept(r, id, key) ? fixed_weight(draw_weight(r, bits_f32(bits))) : 0ull;
    };
    block_sums(r, sums, weight);
    if (warp == 0) {
        u64 total = 0;
        for (int b = lane; b < r.blocks; b += 32) total += sums[b];
        total = warp_sum_u64(total);
        int token = (int)top_token[p.row];
        if (p.temperature > 0.f && total > 0) {
            u64 target = (u64)(p.uniform * (double)total);
            if (target >= total) target = total - 1;
            const int id = walk_past(r, sums, target, weight, lane);
            if (id >= 0) token = id;
        }
        if (lane == 0) {
            const float x = bits_f32(r.x[token]);
            float confidence;
            if (p.rule == 0) {
                const u64 q = fixed_weight(draw_weight(r, x));
                confidence = total ? (float)((double)q / (double)total) : 0.f;
            } else {
                confidence = expf(x - r.xmax) * top_conf[p.row];
            }
            out[2 * blockIdx.x] = (unsigned)token;
            out[2 * blockIdx.x + 1] = __float_as_uint(confidence);
        }
    }
}
