//! Symmetric INT8 / INT4 with one FP16 scale per group of K-consecutive weights of a row.
//!
//! Quantization (docs/model-format.md): scale = FP16 rounding of `max_abs / 127` (INT8) or
//! `max_abs / 7` (INT4), an all-zero group using 1 and a nonzero scale clamped up to the
//! smallest positive FP16 before rounding; code = value / stored scale, rounded to nearest even,
//! clamped to ±127 / ±7. Decoders accept -128 / -8 as well.
//!
//! Layouts: `*_sym` are row-major (INT4 two codes per byte, low nibble first); `*_mma` put each
//! 8 × 16 tile in the lane order of the `mma.m16n8k16` B fragment: lane `l` holds row `l / 4`,
//! columns `2 (l % 4) + {0, 1, 8, 9}`.

use half::f16;

use super::encoding::{QuantEncoding, QuantMat, Quantized};

/// The largest code magnitude an encoder writes.
fn qmax(encoding: QuantEncoding) -> f32 {
    match encoding {
        QuantEncoding::I8Sym | QuantEncoding::I8Mma => 127.0,
        _ => 7.0,
    }
}

fn is_int4(encoding: QuantEncoding) -> bool {
    matches!(encoding, QuantEncoding::I4Sym | QuantEncoding::I4Mma)
}

fn is_mma(encoding: QuantEncoding) -> bool {
    matches!(encoding, QuantEncoding::I4Mma | QuantEncoding::I8Mma)
}

/// The stored FP16 scale of a group whose largest magnitude is `max_abs`.
pub fn group_scale(max_abs: f32, qmax: f32) -> f16 {
    if max_abs == 0.0 {
        return f16::ONE;
    }
    // Clamped up so that a tiny group never gets a zero scale; clamped down so that a huge one
    // (only possible from F32/BF16 sources beyond FP16's range) stays finite, as the format
    // requires; its codes then saturate.
    let s = (max_abs / qmax).max(f16::from_bits(1).to_f32());
    let h = f16::from_f32(s);
    if h.is_infinite() {
        f16::MAX
    } else {
        h
    }
}

/// Row-major codes `[rows][cols]` and row-major scales `[rows][cols / group]`.
pub fn quantize_row_major(
    rows: usize,
    cols: usize,
    group: usize,
    qmax: f32,
    values: &[f32],
) -> (Vec<i8>, Vec<f16>) {
    let groups = cols / group;
    let mut codes = vec![0i8; rows * cols];
    let mut scales = Vec::with_capacity(rows * groups);
    for (row, out) in values.chunks_exact(cols).zip(codes.chunks_exact_mut(cols)) {
        for (vals, out) in row.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
            let max_abs = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = group_scale(max_abs, qmax);
            let s = scale.to_f32();
            for (c, v) in out.iter_mut().zip(vals) {
                *c = round_to_code(v / s, qmax);
            }
            scales.push(scale);
        }
    }
    (codes, scales)
}

/// `x` rounded to the nearest integer (ties to even) and clamped to `±qmax`: the code of a
/// value already divided by its scale. Clamping first (`qmax` is an integer, so the result is
/// the same) keeps `|x| < 2^22`, where adding and subtracting 1.5 × 2^23 rounds to an integer
/// in the FPU's nearest-even mode: plain adds that the compiler vectorizes, where
/// `round_ties_even` is a library call on x86-64 without SSE4.1.
#[inline(always)]
fn round_to_code(x: f32, qmax: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 × 2^23
    let clamped = x.max(-qmax).min(qmax);
    ((clamped + MAGIC) - MAGIC) as i8
}

pub(super) fn quantize(
    encoding: QuantEncoding,
    rows: usize,
    cols: usize,
    group: usize,
    values: &[f32],
) -> Quantized {
    let (codes, scales) = quantize_row_major(rows, cols, group, qmax(encoding), values);
    Quantized {
        codes: pack_codes(encoding, rows, cols, &codes),
        scales: pack_scales(encoding, rows, cols / group, &scales),
        global_scale: 1.0,
    }
}

/// For each position of an `*_mma` code region in storage order, the (row, column) it holds.
/// Tiles `[N/8][K/16]`, then lanes 0..32, then the lane's four columns.
fn mma_positions(rows: usize, cols: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles_k = cols / 16;
    (0..rows / 8).flat_map(move |nb| {
        (0..tiles_k).flat_map(move |kb| {
            (0..32usize).flat_map(move |lane| {
                let r = nb * 8 + lane / 4;
                let c0 = kb * 16 + 2 * (lane % 4);
                [c0, c0 + 1, c0 + 8, c0 + 9].map(|c| (r, c))
            })
        })
    })
}

/// Packs row-major codes into the encoding's code bytes.
pub fn pack_codes(encoding: QuantEncoding, rows: usize, cols: usize, codes: &[i8]) -> Vec<u8> {
    let ordered: Vec<i8> = if is_mma(encoding) {
        // The order of `mma_positions`, written as loops over whole tiles (this runs for every
        // weight a converter quantizes).
        let mut out = Vec::with_capacity(rows * cols);
        for band in codes.chunks_exact(8 * cols) {
            for kb in 0..cols / 16 {
                for r in 0..8 {
                    let row = &band[r * cols + kb * 16..r * cols + kb * 16 + 16];
                    for &p in &MMA_PAIR_SLOT_INV {
                        out.extend_from_slice(&row[2 * p..2 * p + 2]);
                    }
                }
            }
        }
        out
    } else {
        codes.to_vec()
    };
    if is_int4(encoding) {
        // Consecutive codes (in storage order) share a byte, the first in the low nibble (an
        // odd last code with a zero high nibble).
        let pairs = ordered.chunks_exact(2);
        let last = pairs.remainder().first().map(|&c| c as u8 & 0xF);
        let mut out = Vec::with_capacity(ordered.len().div_ceil(2));
        out.extend(pairs.map(|p| (p[0] as u8 & 0xF) | ((p[1] as u8 & 0xF) << 4)));
        out.extend(last);
        out
    } else {
        // Same size and alignment: the collect reuses the allocation.
        ordered.into_iter().map(|c| c as u8).collect()
    }
}

/// Unpacks code bytes into row-major codes (`out.len() == rows * cols`).
pub fn unpack_codes(
    encoding: QuantEncoding,
    rows: usize,
    cols: usize,
    bytes: &[u8],
    out: &mut [i8],
) {
    let sext4 = |nibble: u8| ((nibble << 4) as i8) >> 4;
    let at = |i: usize| -> i8 {
        if is_int4(encoding) {
            let b = bytes[i / 2];
            sext4(if i.is_multiple_of(2) { b & 0xF } else { b >> 4 })
        } else {
            bytes[i] as i8
        }
    };
    if is_mma(encoding) {
        for (i, (r, c)) in mma_positions(rows, cols).enumerate() {
            out[r * cols + c] = at(i);
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = at(i);
        }
    }
}

/// Packs row-major scales `[rows][groups]`: as they are for `*_sym`, `[N/8][groups][8]` for
/// `*_mma`.
pub fn pack_scales(encoding: QuantEncoding, rows: usize, groups: usize, scales: &[f16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(scales.len() * 2);
    if is_mma(encoding) {
        for nb in 0..rows / 8 {
            for g in 0..groups {
                for r in 0..8 {
                    out.extend_from_slice(&scales[(nb * 8 + r) * groups + g].to_le_bytes());
                }
            }
        }
    } else {
        for s in scales {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    out
}

/// Row-major F32 scales `[rows][groups]` from the scale bytes.
pub fn unpack_scales(
    encoding: QuantEncoding,
    rows: usize,
    groups: usize,
    bytes: &[u8],
) -> Vec<f32> {
    let read = |i: usize| f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32();
    let mut out = vec![0.0f32; rows * groups];
    if is_mma(encoding) {
        for nb in 0..rows / 8 {
            for g in 0..groups {
                for r in 0..8 {
                    out[(nb * 8 + r) * groups + g] = read((nb * groups + g) * 8 + r);
                }
            }
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = read(i);
        }
    }
    out
}

/// A row's 16 codes in an `*_mma` tile come in lane order: its four lanes (`l % 4` = 0..3) hold
/// columns `2 (l % 4) + {0, 1, 8, 9}` each. Columns `2p` and `2p + 1` are always neighbours in
/// storage: this is the slot of column `2p` (`2p + 1` follows it), for the column pairs
/// p = 0..8. Reading the codes in column order (a gather with constant indices) lets the
/// compiler turn the permutation into shuffles.
const MMA_PAIR_SLOT: [usize; 8] = [0, 4, 8, 12, 2, 6, 10, 14];

/// The inverse of [`MMA_PAIR_SLOT`]: the column pair held by slots `2i`, `2i + 1`.
const MMA_PAIR_SLOT_INV: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Rows `r0..r1` of `q` in F32, row-major, read straight from the stored codes and scales
/// (`value = code × scale`, one rounding).
pub(super) fn dequantize_rows(q: &QuantMat<'_>, r0: usize, r1: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        // SAFETY: AVX2 checked; `q` was checked by `QuantMat::new`, `dst` by the caller.
        unsafe { super::x86::int_rows(q, r0, r1, dst, is_int4(q.encoding), is_mma(q.encoding)) };
        return;
    }
    dequantize_rows_scalar(q, r0, r1, dst)
}

/// [`dequantize_rows`] one value at a time (CPUs without AVX2, and the reference the AVX2
/// decoder is tested against).
pub(super) fn dequantize_rows_scalar(q: &QuantMat<'_>, r0: usize, r1: usize, dst: &mut [f32]) {
    let (cols, group) = (q.cols, q.group_size);
    let groups = cols / group;
    let scale = |i: usize| f16::from_le_bytes([q.scales[2 * i], q.scales[2 * i + 1]]).to_f32();
    let int4 = is_int4(q.encoding);
    // Bytes of one row's codes in a row-major layout, or of one row's part of an mma tile.
    let unit = if int4 { 8 } else { 16 };
    for (r, row) in (r0..r1).zip(dst.chunks_exact_mut(cols)) {
        if !is_mma(q.encoding) {
            let codes = &q.codes[r * cols * unit / 16..(r + 1) * cols * unit / 16];
            for (g, out) in row.chunks_exact_mut(group).enumerate() {
                let s = scale(r * groups + g);
                let codes = &codes[g * group * unit / 16..(g + 1) * group * unit / 16];
                if int4 {
                    for (o, &b) in out.chunks_exact_mut(2).zip(codes) {
                        o[0] = low_nibble(b) * s;
                        o[1] = high_nibble(b) * s;
                    }
                } else {
                    for (o, &c) in out.iter_mut().zip(codes) {
                        *o = c as i8 as f32 * s;
                    }
                }
            }
            continue;
        }
        // Fragment order: tiles `[N/8][K/16]`; row r % 8 of a band owns `unit` consecutive
        // bytes of each tile. A group (>= 16 columns) spans whole tiles.
        let (band, within) = (r / 8, r % 8);
        let tiles_k = cols / 16;
        for g in 0..groups {
            let s = scale((band * groups + g) * 8 + within);
            for kb in g * group / 16..(g + 1) * group / 16 {
                let at = (band * tiles_k + kb) * 8 * unit + within * unit;
                let codes = &q.codes[at..at + unit];
                let out: &mut [f32; 16] = (&mut row[kb * 16..kb * 16 + 16])
                    .try_into()
                    .expect("16 columns");
                if int4 {
                    // Slots 2i and 2i + 1 share byte i (low nibble first).
                    for (p, &slot) in MMA_PAIR_SLOT.iter().enumerate() {
                        let b = codes[slot / 2];
                        out[2 * p] = low_nibble(b) * s;
                        out[2 * p + 1] = high_nibble(b) * s;
                    }
                } else {
                    for (p, &slot) in MMA_PAIR_SLOT.iter().enumerate() {
                        out[2 * p] = codes[slot] as i8 as f32 * s;
                        out[2 * p + 1] = codes[slot + 1] as i8 as f32 * s;
                    }
                }
            }
        }
    }
}

/// The signed INT4 code in a byte's low nibble.
fn low_nibble(b: u8) -> f32 {
    (((b << 4) as i8) >> 4) as f32
}

/// The signed INT4 code in a byte's high nibble.
fn high_nibble(b: u8) -> f32 {
    ((b as i8) >> 4) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_rules() {
        assert_eq!(group_scale(0.0, 127.0), f16::ONE);
        assert_eq!(group_scale(127.0, 127.0), f16::ONE);
        // Tiny groups get the smallest positive FP16, never zero.
        assert_eq!(group_scale(1e-12, 127.0), f16::from_bits(1));
        assert_eq!(group_scale(1e30, 7.0), f16::MAX);
    }

    #[test]
    fn codes_round_to_nearest_even_and_clamp() {
        // max 127 gives scale 1: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2.
        let mut v = vec![0.0f32; 16];
        v[0] = 127.0;
        v[1] = 2.5;
        v[2] = 3.5;
        v[3] = -2.5;
        let (codes, scales) = quantize_row_major(1, 16, 16, 127.0, &v);
        assert_eq!(scales, vec![f16::ONE]);
        assert_eq!(&codes[..4], &[127, 2, 4, -2]);
    }

    /// The rounding shortcut equals `round_ties_even` then clamp, on every half-integer and
    /// its neighbours in range, and far outside it.
    #[test]
    fn round_to_code_is_nearest_even_then_clamp() {
        for qmax in [7.0f32, 127.0] {
            let mut probes = vec![0.0f32, -0.0, 1e-30, -1e-30, 1e30, -1e30, f32::INFINITY];
            for i in -600..=600 {
                let v = i as f32 * 0.25;
                probes.extend([
                    v,
                    f32::from_bits(v.to_bits() + 1),
                    f32::from_bits(v.to_bits().max(1) - 1),
                ]);
            }
            for x in probes {
                let want = x.round_ties_even().clamp(-qmax, qmax) as i8;
                assert_eq!(round_to_code(x, qmax), want, "{x:e} (qmax {qmax})");
            }
        }
    }

    /// Packing into fragment order puts each code where [`mma_positions`] says it goes.
    #[test]
    fn fragment_packing_follows_the_positions() {
        let (rows, cols) = (16, 48);
        let codes: Vec<i8> = (0..rows * cols)
            .map(|i| ((i * 37 + 5) % 15) as i8 - 7)
            .collect();
        for e in [QuantEncoding::I8Mma, QuantEncoding::I4Mma] {
            let packed = pack_codes(e, rows, cols, &codes);
            let mut back = vec![0i8; rows * cols];
            unpack_codes(e, rows, cols, &packed, &mut back);
            assert_eq!(back, codes, "{e}");
        }
    }

    #[test]
    fn decoders_accept_the_most_negative_code() {
        let mut out = [0i8; 2];
        unpack_codes(QuantEncoding::I4Sym, 1, 2, &[0x78], &mut out);
        assert_eq!(out, [-8, 7]);
        unpack_codes(QuantEncoding::I8Sym, 1, 2, &[0x80, 0x7F], &mut out);
        assert_eq!(out, [-128, 127]);
    }
}
