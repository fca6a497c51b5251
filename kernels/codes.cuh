// The weight codes of quantized experts (`*_mma` tiles, docs in moe.cu) and how a lane turns
// its part of a tile into the BF16 operands of a tensor-core product: what both the mma.sync
// kernels (moe.cu) and the wgmma kernels (expert_wgmma.cu) read. Every kernel source hash covers
// this header (ptx.rs).
#pragma once
#include "common.cuh"
#include <cuda_fp16.h>

namespace minnow_codes {
// How codes are read: integers with FP16 scales of each group's sum, E2M1 with BF16 block scales
// before the product and an F32 factor per band, E4M3 with an F32 scale of each group's sum.
enum Codes : int { INT = 0, E2M1 = 1, E4M3 = 2 };

// A tile of 8 rows x 16 columns: codes of BITS bits (16: BF16 weights in the same fragment
// order, for a packed shared expert).
template <int BITS>
__host__ __device__ constexpr int tile_bytes() { return 8 * 16 * BITS / 8; }

__device__ __forceinline__ unsigned lop3_and_xor(unsigned a, unsigned b, unsigned c) {
    unsigned d;  // (a & b) ^ c
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ unsigned bits_of(__nv_bfloat162 v) { return *reinterpret_cast<unsigned*>(&v); }
__device__ __forceinline__ __nv_bfloat162 bf162_of(unsigned v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// The E2M1 magnitudes 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6) as BF16, split into the high and the low
// bytes of codes 0-3 and 4-7: tables for one byte permutation each.
constexpr unsigned E2M1_HI_0 = 0x3F3F3F00u, E2M1_HI_1 = 0x40404040u;
constexpr unsigned E2M1_LO_0 = 0xC0800000u, E2M1_LO_1 = 0xC0804000u;

// 4-bit codes on the device (INT4 and E2M1 alike) are in the word order: the `*_mma` tiles of a
// band taken two 16-column steps at a time, lane-major, so that a lane reads its codes of two
// steps as one 32-bit word. For steps 2p and 2p + 1 of band b, lane l's word is at byte
// ((b * K / 32 + p) * 32 + l) * 4, and its nibbles are, from bit 0: (c0, c0 + 8) of step 2p,
// (c0, c0 + 8) of step 2p + 1, (c0 + 1, c0 + 9) of step 2p, (c0 + 1, c0 + 9) of step 2p + 1, where
// the lane's columns of a step are c0 = 2 (l % 4), c0 + 1, c0 + 8 and c0 + 9 (row l / 4). So
// each BF16 pair a lane feeds the tensor cores, (c0, c0 + 1) or (c0 + 8, c0 + 9) of one step,
// is two nibbles 16 bits apart, at the word shifted right by 0, 4, 8 or 12 bits. The loader
// turns the files' `*_mma` order into it in place (codes4_word_order in moe.cu); it needs K %
// 32 == 0.
constexpr int WORD_STEPS = 2;  // 16-column steps per word
constexpr int WORD_BYTES = 32 * 4;  // one word per lane: the bytes of a band's two steps

// A lane's word of two steps (s, t = s + 1) of E2M1 codes times their block scales (`scale_s`,
// `scale_t`: a BF16 scale in both halves) as BF16 pairs: `lo` = (c0, c0 + 1), `hi` = (c0 + 8,
// c0 + 9) of each step. A code's top bit is its sign.
__device__ __forceinline__ void decode_e2m1_word(unsigned w, unsigned scale_s, unsigned scale_t, unsigned& lo_s,
                                                 unsigned& hi_s, unsigned& lo_t, unsigned& hi_t) {
    // A selector's top bit would replicate a sign: cleared. Bytes 0 and 2 hold step s's
    // magnitudes (c0, c0 + 8, c0 + 1, c0 + 9), bytes 1 and 3 step t's.
    const unsigned mag = w & 0x77777777u;
    const unsigned sel_s = __byte_perm(mag, 0, 0x0020), sel_t = __byte_perm(mag, 0, 0x0031);
    const unsigned hs = __byte_perm(E2M1_HI_0, E2M1_HI_1, sel_s), ls = __byte_perm(E2M1_LO_0, E2M1_LO_1, sel_s);
    const unsigned ht = __byte_perm(E2M1_HI_0, E2M1_HI_1, sel_t), lt = __byte_perm(E2M1_LO_0, E2M1_LO_1, sel_t);
    // Values (low byte, high byte) of c0 and c0 + 1 are bytes 0 and 2 of l and h, those of c0 + 8
    // and c0 + 9 bytes 1 and 3. Signs (bit 3 of each nibble) to bits 15 and 31 of their pair:
    // (c0, c0 + 1) of step s sit at bits 3 and 19 (w << 12), of c0 + 8, c0 + 9 at 7 and 23 (w << 8);
    // step t's at 11 and 27 (w << 4), 15 and 31 (w).
    lo_s = bits_of(__hmul2(bf162_of(lop3_and_xor(w << 12, 0x80008000u, __byte_perm(ls, hs, 0x6240))), bf162_of(scale_s)));
    hi_s = bits_of(__hmul2(bf162_of(lop3_and_xor(w << 8, 0x80008000u, __byte_perm(ls, hs, 0x7351))), bf162_of(scale_s)));
    lo_t = bits_of(__hmul2(bf162_of(lop3_and_xor(w << 4, 0x80008000u, __byte_perm(lt, ht, 0x6240))), bf162_of(scale_t)));
    hi_t = bits_of(__hmul2(bf162_of(lop3_and_xor(w, 0x80008000u, __byte_perm(lt, ht, 0x7351))), bf162_of(scale_t)));
}

// A lane's word of two steps of INT4 codes (two's complement) as BF16 pairs of the exact
// integers, `lo` = (c0, c0 + 1), `hi` = (c0 + 8, c0 + 9) of each step. With a pair's nibbles at
// bits 0-3 and 16-19, (u & 0x000F000F) ^ 0x43084308 is the BF16 pair 128 + (code + 8), since
// flipping a nibble's top bit adds 8 to its signed value and 0x4300 is 128.0; subtracting 136.0
// (0x4308) leaves the code, exactly.
__device__ __forceinline__ void decode_int4_word(unsigned w, unsigned& lo_s, unsigned& hi_s, unsigned& lo_t,
                                                 unsigned& hi_t) {
    const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16(0x4308), __ushort_as_bfloat16(0x4308));
    lo_s = bits_of(__hsub2(bf162_of(lop3_and_xor(w, 0x000F000Fu, 0x43084308u)), bias));
    hi_s = bits_of(__hsub2(bf162_of(lop3_and_xor(w >> 4, 0x000F000Fu, 0x43084308u)), bias));
    lo_t = bits_of(__hsub2(bf162_of(lop3_and_xor(w >> 8, 0x000F000Fu, 0x43084308u)), bias));
    hi_t = bits_of(__hsub2(bf162_of(lop3_and_xor(w >> 12, 0x000F000Fu, 0x43084308u)), bias));
}

// The warp's two bands' words of steps s and s + 1 (w0: its first band, w1: its second) as the
// A fragments of both steps (`f`: step s, `f_next`: s + 1), in mma.m16n8k16's register order.
// E2M1 multiplies each step by its block scale: `scales0` / `scales1` point at the lane's BF16
// scale of step s in each band, step s + 1's 8 entries later. INT4's group scales apply to the
// products' sums, so it reads none.
template <int ENC>
__device__ __forceinline__ void decode_words(unsigned w0, unsigned w1, const unsigned short* scales0,
                                             const unsigned short* scales1, unsigned (&f)[4], unsigned (&f_next)[4]) {
    if constexpr (ENC == E2M1) {
        decode_e2m1_word(w0, scales0[0] * 0x10001u, scales0[8] * 0x10001u, f[0], f[2], f_next[0], f_next[2]);
        decode_e2m1_word(w1, scales1[0] * 0x10001u, scales1[8] * 0x10001u, f[1], f[3], f_next[1], f_next[3]);
    } else {
        decode_int4_word(w0, f[0], f[2], f_next[0], f_next[2]);
        decode_int4_word(w1, f[1], f[3], f_next[1], f_next[3]);
    }
}

// A lane's four codes of one band and step (columns c0, c0 + 1, c0 + 8, c0 + 9; 8-bit codes, or
// BF16 weights in the same fragment order) as two BF16 pairs of the exact values: `lo` = (c0,
// c0 + 1), `hi` = (c0 + 8, c0 + 9). (4-bit codes decode two steps at a time, from a word.)
template <int BITS>
__device__ __forceinline__ void decode_pairs(const unsigned char* p, unsigned& lo, unsigned& hi) {
    static_assert(BITS == 8 || BITS == 16, "4-bit codes decode from words");
    if constexpr (BITS == 16) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        lo = v.x;
        hi = v.y;
    } else {
        // Bytes 0..3. Each byte + 128 placed in the low mantissa of 2^23 is the F32 value
        // 2^23 + 128 + code; subtracting 2^23 + 128 leaves the code, exact in BF16.
        const unsigned u = *reinterpret_cast<const unsigned*>(p) ^ 0x80808080u;
        float c[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) c[j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440 + j)) - 8388736.f;
        lo = bits_of(__floats2bfloat162_rn(c[0], c[1]));
        hi = bits_of(__floats2bfloat162_rn(c[2], c[3]));
    }
}

// A lane's four E4M3 codes of one band (the INT8 positions: columns c0, c0 + 1, c0 + 8, c0 + 9)
// as two BF16 pairs of their exact values, `lo` = (c0, c0 + 1), `hi` = (c0 + 8, c0 + 9). Both
// ways give the same bits. (Code 0x7F, NaN in E4M3, is never written: the quantizer saturates
// at 448. The hardware conversion keeps it NaN; the bit placement reads it as 480.)
__device__ __forceinline__ void decode_e4m3(const unsigned char* p, unsigned& lo, unsigned& hi) {
    const unsigned u = *reinterpret_cast<const unsigned*>(p);
    float c[4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // The FP8 conversion (sm_89 on): two codes to an exact F16 pair, whose halves widen exactly.
    unsigned h01, h23;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h01) : "h"((unsigned short)(u & 0xFFFFu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h23) : "h"((unsigned short)(u >> 16)));
    const __half2 a = *reinterpret_cast<const __half2*>(&h01), b = *reinterpret_cast<const __half2*>(&h23);
    c[0] = __low2float(a);
    c[1] = __high2float(a);
    c[2] = __low2float(b);
    c[3] = __high2float(b);
#else
    // Exponent and mantissa placed in F32's low exponent bits and top mantissa bits read the code
    // as a value 2^-120 times its own (E4M3 subnormals as F32 subnormals); times 2^120 is exact.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const unsigned b = (u >> (8 * j)) & 0xFFu;
        c[j] = __uint_as_float(((b & 0x7Fu) << 20) | ((b & 0x80u) << 24)) * 0x1p120f;
    }
#endif
    lo = bits_of(__floats2bfloat162_rn(c[0], c[1]));
    hi = bits_of(__floats2bfloat162_rn(c[2], c[3]));
}

// Gated gate/up GEMMs (`gated` != 0: an expert's N rows are [gate; up], N / 2 of each) write
// silu_mul's result instead of the N products: a CTA's 16 bands (128 columns from n0) then hold
// the gate bands of the 64 intermediate columns from n0 / 2 in its even band slots and the up
// bands of the same columns in the odd ones. Each warp takes two neighbouring slots, so a lane
// holds the gate and the up sum of the same (row, column) in the same fragment positions, and
// the epilogue needs no exchange. The expert's band (8 rows) that band slot `b` reads:
__host__ __device__ __forceinline__ int band_of_slot(int b, int n0, int N, int gated) {
    return gated ? (b & 1) * (N / 16) + n0 / 16 + (b >> 1) : n0 / 8 + b;
}
// Whether slot `b` lies inside the matrix (a CTA's last 128 columns may be cut short; N % 16 == 0
// when gated, so both slots of a warp are inside or outside together).
__host__ __device__ __forceinline__ bool slot_live(int b, int n0, int N, int gated) {
    return gated ? n0 / 2 + (b >> 1) * 8 < N / 2 : n0 + b * 8 < N;
}

}  // namespace minnow_codes
