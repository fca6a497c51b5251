#!/usr/bin/env python3
"""The weight side of grouped_gemm_{i4,i8,f8}_wgmma_ss (kernels/expert_wgmma.cu), replayed on the CPU.

Integer codes are packed as the converter packs `i4_mma` / `i8_mma` (crates/minnow-runtime/src/
quant/int.rs, `mma_positions`; E4M3 bytes sit at the INT8 positions, `ops::fp8_fragment_order`),
4-bit ones put in the word order as `codes4_word_order` does at load (kernels/moe.cu), then each
stage goes through the kernel's producer: its raw copies (band_of, 64 x BITS bytes per band and
stage), the decode (decode_int4_word, or the signed bytes decode_pairs<8> gives) and the
swizzled stores of each BF16 pair. The stage image, read
back through the 128-byte swizzle a TMA box has, must be the expert's weight rows of the item's
slice (gate rows then up rows when gated) over the stage's 64 columns. A mirror of the kernel's
indexing, written to check it before any GPU ran it: change both together.

  python3 scripts/kernels/codes_ss_layout.py
"""
import numpy as np
rng = np.random.default_rng(1)

def mma_pack(codes, bits=4):  # codes [rows, cols] -> bytes (mma_positions order; 4-bit: low nibble first)
    rows, cols = codes.shape
    seq = []
    for nb in range(rows // 8):
        for kb in range(cols // 16):
            for lane in range(32):
                r = nb * 8 + lane // 4; c0 = kb * 16 + 2 * (lane % 4)
                seq += [codes[r, c] for c in (c0, c0 + 1, c0 + 8, c0 + 9)]
    if bits == 8:
        return bytearray(int(v) & 0xFF for v in seq)
    seq = [int(v) & 0xF for v in seq]
    return bytearray(seq[i] | (seq[i + 1] << 4) for i in range(0, len(seq), 2))

def word_order(buf):
    out = bytearray(buf)
    for c in range(len(buf) // 128):
        steps = np.frombuffer(bytes(buf[c * 128:(c + 1) * 128]), dtype='<u2')
        nib = lambda v, j: (int(v) >> (4 * j)) & 0xF
        for lane in range(32):
            s, t = steps[lane], steps[32 + lane]
            w = nib(s, 0) | nib(s, 2) << 4 | nib(t, 0) << 8 | nib(t, 2) << 12 | nib(s, 1) << 16 | \
                nib(s, 3) << 20 | nib(t, 1) << 24 | nib(t, 3) << 28
            out[c * 128 + lane * 4:c * 128 + lane * 4 + 4] = w.to_bytes(4, 'little')
    return out

def decode_int4_word(w):  # -> 4 pairs (lo, hi) of ints: (lo_s, hi_s, lo_t, hi_t)
    def pair(u):
        u = (u & 0x000F000F) ^ 0x43084308
        lo = u & 0xFFFF; hi = u >> 16
        # BF16 0x43xx is 128 + its 7 mantissa bits; minus 136.0 (0x4308) leaves the code.
        f = lambda b: (128 + (b & 0x7F)) - 136
        return (f(lo), f(hi))
    return [pair(w), pair(w >> 4), pair(w >> 8), pair(w >> 12)]

def band_of(slot, n0, N, gated):
    return (n0 // 16 + slot if slot < 8 else N // 16 + n0 // 16 + slot - 8) if gated else n0 // 8 + slot

def store_pair(img, row, c, pair):
    brow = row & 63
    addr = (row >> 6) * 8192 + brow * 128 + (((c >> 3) ^ (brow & 7)) << 4) + (c & 7) * 2
    img[addr // 2], img[addr // 2 + 1] = pair


def check(N, K, gated, bits, experts=3):
    lo_code, hi_code = (-8, 8) if bits == 4 else (-128, 128)
    W = rng.integers(lo_code, hi_code, size=(experts, N, K)).astype(np.int16)
    codes = bytearray()
    for e in range(experts):
        codes += mma_pack(W[e], bits)
    if bits == 4:
        codes = word_order(codes)
    band_stage = 64 * bits  # a band's bytes of one stage
    per_band = band_stage // 16
    for e in range(experts):
        eb = e * (N // 8)
        for n0 in range(0, N, 128):
            for ks in range(K // 64):
                raw = bytearray(128 * 64 * bits // 8)
                for tid in range(128):
                    for j in range(len(raw) // 16 // 128):
                        c = tid + 128 * j
                        src = (eb + band_of(c // per_band, n0, N, gated)) * K * bits + (c % per_band) * 16 + ks * band_stage
                        raw[c * 16:c * 16 + 16] = codes[src:src + 16]
                img = np.zeros(16384 // 2, dtype=np.int32)  # BF16 slots as ints, by element index
                for tid in range(128):
                    lane = tid & 31
                    c0 = 2 * (lane & 3)
                    if bits == 4:
                        pair = (tid >> 5) & 1
                        for j in range(8):
                            slot = (tid >> 6) + 2 * j; row = 8 * slot + (lane >> 2)
                            wi = tid + 128 * j
                            v = decode_int4_word(int.from_bytes(raw[wi * 4:wi * 4 + 4], 'little'))
                            for cc in range(4):
                                store_pair(img, row, 32 * pair + 8 * cc + c0, v[cc])
                    else:
                        step = tid >> 5
                        for j in range(16):
                            row = 8 * j + (lane >> 2)
                            b = raw[(j * 128 + tid) * 4:(j * 128 + tid) * 4 + 4]
                            sb = [x - 256 if x >= 128 else x for x in b]  # decode_pairs<8>: the signed bytes
                            store_pair(img, row, 16 * step + c0, (sb[0], sb[1]))
                            store_pair(img, row, 16 * step + c0 + 8, (sb[2], sb[3]))
                # Read back through the swizzle: element (row, k) of box row >> 6.
                got = np.zeros((128, 64), dtype=np.int32)
                for row in range(128):
                    brow = row & 63
                    for k in range(64):
                        addr = (row >> 6) * 8192 + brow * 128 + (((k // 8) ^ (brow & 7)) << 4) + (k % 8) * 2
                        got[row, k] = img[addr // 2]
                want = np.zeros((128, 64), dtype=np.int32)
                for row in range(128):
                    wrow = band_of(row // 8, n0, N, gated) * 8 + row % 8
                    want[row] = W[e, wrow, ks * 64:(ks + 1) * 64]
                assert (got == want).all(), (N, K, gated, bits, e, n0, ks)
    print("ok", bits, "bits", N, K, "gated" if gated else "plain")


for bits in (4, 8):
    check(256, 128, True, bits)
    check(256, 192, False, bits)
    check(128, 128, True, bits)
