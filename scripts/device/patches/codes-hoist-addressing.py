#!/usr/bin/env python3
"""The codes tiles' copy addressing of codes-hoist.patch against main's, for every thread, copy
and stage of every CTA over a set of shapes: each cp.async's source offset and predicate (codes
and scales) must be the same. Mirrors `load_stage` in kernels/moe.cu on both sides; exits 1 on
the first shape with a difference. Runs in a few seconds on the CPU: python3 THIS_FILE."""
import sys

THREADS, BANDS = 256, 16


def band_of_slot(b, n0, n, gated):
    return (b & 1) * (n // 16) + n0 // 16 + (b >> 1) if gated else n0 // 8 + b


def slot_live(b, n0, n, gated):
    return n0 // 2 + (b >> 1) * 8 < n // 2 if gated else n0 + b * 8 < n


def copies_main(bits, sk, tb, n, k, group, gated, e, n0, tid, st):
    """Main's load_stage: every source worked out in the stage."""
    k_tiles, groups, gsteps = k // 16, k // group, group // 16
    band0, kt0, out = e * (n // 8), st * sk, []
    for i in range(BANDS * sk * tb // 16 // THREADS):
        byte = (tid + i * THREADS) * 16
        band, within = byte // (sk * tb), byte % (sk * tb)
        ok = slot_live(band, n0, n, gated) and kt0 + within // tb < k_tiles
        out.append(("code", ok, ((band0 + band_of_slot(band, n0, n, gated)) * k_tiles + kt0) * tb + within if ok else None))
    if bits != 16 and tid < BANDS * sk:
        g_first, g_last = kt0 // gsteps, (min(kt0 + sk, k_tiles) * 16 - 1) // group
        band, g = tid // sk, kt0 // gsteps + tid % sk
        ok = slot_live(band, n0, n, gated) and g <= g_last
        out.append(("scale", ok, ((band0 + band_of_slot(band, n0, n, gated)) * groups + g) * 8 if ok else None))
    return out


def copies_branch(bits, sk, tb, n, k, group, gated, e, n0, tid, st):
    """The branch's: a pointer, a stride and a live count per thread, then offsets per stage."""
    k_tiles, gshift = k // 16, group.bit_length() - 1 - 4
    groups, band0e, kt0 = k >> (gshift + 4), e * (n // 8), st * sk
    copies, copy_bands = BANDS * sk * tb // 16 // THREADS, THREADS * 16 // (sk * tb)
    assert copy_bands % 2 == 0 or copies == 1
    band0, within = tid * 16 // (sk * tb), tid * 16 % (sk * tb)
    src = (band0e + band_of_slot(band0, n0, n, gated)) * k_tiles * tb + within
    stride = (copy_bands // 2 if gated else copy_bands) * k_tiles * tb
    live = sum(slot_live(band0 + i * copy_bands, n0, n, gated) for i in range(copies))
    out = []
    for i in range(copies):
        ok = i < live and kt0 + within // tb < k_tiles
        out.append(("code", ok, src + i * stride + kt0 * tb if ok else None))
    if bits != 16 and tid < BANDS * sk:
        j = tid % sk
        scale_live = slot_live(tid // sk, n0, n, gated)
        scale_src = ((band0e + (band_of_slot(tid // sk, n0, n, gated) if scale_live else 0)) * groups + j) * 8
        g_first, g_last = kt0 >> gshift, (min(kt0 + sk, k_tiles) * 16 - 1) >> (gshift + 4)
        ok = scale_live and g_first + j <= g_last
        out.append(("scale", ok, scale_src + g_first * 8 if ok else None))
    return out


# (bits, 16-column steps per stage): INT4 and INT8 codes, a packed shared expert's BF16 tiles in
# 16- and 64-row tiles.
TILES = [(4, 8), (8, 8), (16, 2), (16, 4)]
# (N, K, group, gated): N cut short inside a CTA, K not a multiple of 128, groups 16 to 128.
SHAPES = [(1024, 2048, 32, 1), (1040, 2048, 64, 0), (1056, 1024, 128, 1), (512, 4096, 16, 0),
          (1040, 2064, 16, 0), (96, 512, 32, 1)]
for bits, sk in TILES:
    tb = 8 * 16 * bits // 8
    for n, k, group, gated in SHAPES:
        group = 16 if bits == 16 else group  # BF16 tiles have no scales (the launch passes 16)
        for e in (0, 3):
            for n0 in range(0, n, 128):
                for tid in range(THREADS):
                    for st in range((k // 16 + sk - 1) // sk):
                        args = (bits, sk, tb, n, k, group, gated, e, n0, tid, st)
                        if copies_main(*args) != copies_branch(*args):
                            print(f"differ: bits {bits} N {n} K {k} group {group} gated {gated} expert {e} n0 {n0} thread {tid} stage {st}")
                            sys.exit(1)
print(f"the same copies for {len(TILES)} tile kinds x {len(SHAPES)} shapes")
