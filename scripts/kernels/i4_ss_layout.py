#!/usr/bin/env python3
"""The weight side of grouped_gemm_i4_wgmma_ss (kernels/expert_wgmma.cu), replayed on the CPU.

INT4 codes are packed as the converter packs `i4_mma` (crates/minnow-runtime/src/quant/int.rs,
`mma_positions`), put in the word order as `codes4_word_order` does at load (kernels/moe.cu), then
each stage goes through the kernel's producer: its raw copies (band_of, 256 bytes per band and
stage), decode_int4_word (codes.cuh) and the four swizzled stores per word. The stage image, read
back through the 128-byte swizzle a TMA box has, must be the expert's weight rows of the item's
slice (gate rows then up rows when gated) over the stage's 64 columns. A mirror of the kernel's
indexing, written to check it before any GPU ran it: change both together.

  python3 scripts/kernels/i4_ss_layout.py
"""
import numpy as np
rng = np.random.default_rng(1)

def mma_pack(codes):  # codes [rows, cols] int8 -> bytes (mma_positions order, low nibble first)
    rows, cols = codes.shape
    seq = []
    for nb in range(rows // 8):
        for kb in range(cols // 16):
            for lane in range(32):
                r = nb * 8 + lane // 4; c0 = kb * 16 + 2 * (lane % 4)
                seq += [codes[r, c] for c in (c0, c0 + 1, c0 + 8, c0 + 9)]
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

def check(N, K, gated, experts=3):
    W = rng.integers(-8, 8, size=(experts, N, K)).astype(np.int8)
    codes = bytearray()
    for e in range(experts):
        codes += mma_pack(W[e])
    codes = word_order(codes)
    for e in range(experts):
        eb = e * (N // 8)
        for n0 in range(0, N, 128):
            for ks in range(K // 64):
                raw = bytearray(4096)
                for tid in range(128):
                    for j in range(2):
                        c = tid + 128 * j
                        src = (eb + band_of(c // 16, n0, N, gated)) * K * 4 + (c % 16) * 16 + ks * 256
                        raw[c * 16:c * 16 + 16] = codes[src:src + 16]
                img = np.zeros(16384 // 2, dtype=np.int32)  # BF16 slots as ints, by element index
                for tid in range(128):
                    lane, pair = tid & 31, (tid >> 5) & 1
                    for j in range(8):
                        slot = (tid >> 6) + 2 * j; row = 8 * slot + (lane >> 2); brow = row & 63
                        wi = tid + 128 * j
                        w = int.from_bytes(raw[wi * 4:wi * 4 + 4], 'little')
                        v = decode_int4_word(w)
                        base = (row >> 6) * 8192 + brow * 128 + 4 * (lane & 3)
                        for cc in range(4):
                            addr = base + (((4 * pair + cc) ^ (brow & 7)) << 4)
                            img[addr // 2], img[addr // 2 + 1] = v[cc]
                # un-swizzle: element (row, k) of box row>>6 at brow*128 + ((k//8) ^ (brow&7))*16 + (k%8)*2
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
                assert (got == want).all(), (N, K, gated, e, n0, ks)
    print("ok", N, K, "gated" if gated else "plain")

check(256, 128, True)
check(256, 192, False)
check(128, 128, True)
