//! NVFP4: 4-bit E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4,
//! 6}), one E4M3 scale per 16 K-consecutive values, one F32 global scale per matrix
//! (docs/model-format.md). Stored value = E2M1(code) × E4M3(block scale) × global scale.
//!
//! Codes are little-endian u32 words in the order `[N/8][K/64][register 0..2][lane 0..32]`;
//! lane `l` of register 0 holds row `l / 4`, columns `8 (l % 4) + 0..8` of the 64-column chunk,
//! register 1 the same columns + 32; within a word column `j` of the eight sits in bits
//! `4j..4j+4` (the first value in the lowest nibble). Scales are bytes in the order
//! `[N/8][K/64][row 0..8][block 0..4]`.

use super::encoding::{QuantMat, Quantized, NVFP4_GROUP};
use super::fp8::{e4m3_positive_code, e4m3_table, E4M3_MAX};

/// Magnitudes of the E2M1 codes 0..8.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The value of a 4-bit E2M1 code.
pub fn e2m1_to_f32(code: u8) -> f32 {
    let mag = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -mag
    } else {
        mag
    }
}

/// The E2M1 code nearest to `x` (ties to the even code, saturating at ±6). The sign bit is
/// `x`'s: a negative value that rounds to zero is stored as -0 (nibble 8), as the published
/// format requires for byte-identical files. An input of -0.0 (an all-zero block holding
/// negative zeros) is stored as -0 as well: the format doc speaks of "a negative value"
/// without naming -0.0, and taking the IEEE sign bit is the one rule under which the sign is
/// kept for every input.
pub fn f32_to_e2m1(x: f32) -> u8 {
    let a = x.abs();
    // The nearest code's index is the count of midpoints between codes that `a` lies above,
    // a tie counting as above when it goes to the upper code, the even one (odd `i`). A count
    // rather than a search: no branch, so a block's sixteen values vectorize.
    const MIDPOINTS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let mut idx = 0u8;
    for (i, mid) in MIDPOINTS.iter().enumerate() {
        idx += (a > *mid || (a == *mid && i % 2 == 1)) as u8;
    }
    // NaN compares false everywhere; a search would have ended at the largest code.
    let idx = if a.is_nan() { 7 } else { idx };
    if x.is_sign_negative() {
        idx | 8
    } else {
        idx
    }
}

/// The global scale of a matrix whose largest magnitude is `max_abs`.
pub fn global_scale(max_abs: f32) -> f32 {
    if max_abs == 0.0 {
        1.0
    } else {
        (max_abs / (6.0 * E4M3_MAX)).max(f32::MIN_POSITIVE)
    }
}

/// The E4M3 code of 1.0, an all-zero block's scale.
pub const E4M3_ONE: u8 = 0x38;

/// The E4M3 block scale code of a block whose largest magnitude is `block_max`: nearest-even
/// of `(block_max / 6) / global`, at least the smallest nonzero code for a nonzero block, and
/// 1.0 (code 56) for an all-zero block.
pub fn block_scale_code(block_max: f32, global: f32) -> u8 {
    if block_max == 0.0 {
        return E4M3_ONE;
    }
    e4m3_positive_code((block_max / 6.0) / global).max(1)
}

/// Row-major E2M1 codes `[rows][cols]` (one per byte), row-major scale codes
/// `[rows][cols / 16]`, and the global scale.
/// `global` is the matrix's global scale when `values` is a band of its rows.
pub fn quantize_row_major(
    rows: usize,
    cols: usize,
    values: &[f32],
    global: Option<f32>,
) -> (Vec<u8>, Vec<u8>, f32) {
    let global =
        global.unwrap_or_else(|| global_scale(values.iter().fold(0.0f32, |m, v| m.max(v.abs()))));
    let e4m3 = e4m3_table();
    let mut codes = vec![0u8; rows * cols];
    let mut scales = Vec::with_capacity(rows * cols / NVFP4_GROUP);
    for (vals, out) in values
        .chunks_exact(NVFP4_GROUP)
        .zip(codes.chunks_exact_mut(NVFP4_GROUP))
    {
        let block_max = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let code = block_scale_code(block_max, global);
        let denom = e4m3[code as usize] * global;
        for (c, v) in out.iter_mut().zip(vals) {
            *c = f32_to_e2m1(v / denom);
        }
        scales.push(code);
    }
    (codes, scales, global)
}

/// For each word of the code region in storage order, its row and first column (the word holds
/// that column and the seven after it).
fn word_positions(rows: usize, cols: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunks = cols / 64;
    (0..rows / 8).flat_map(move |nb| {
        (0..chunks).flat_map(move |kb| {
            (0..2usize).flat_map(move |reg| {
                (0..32usize)
                    .map(move |lane| (nb * 8 + lane / 4, kb * 64 + 8 * (lane % 4) + 32 * reg))
            })
        })
    })
}

/// For each scale byte in storage order, its row and block index (of `cols / 16`).
fn scale_positions(rows: usize, cols: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunks = cols / 64;
    (0..rows / 8).flat_map(move |nb| {
        (0..chunks).flat_map(move |kb| {
            (0..8usize).flat_map(move |r| (0..4usize).map(move |g| (nb * 8 + r, kb * 4 + g)))
        })
    })
}

/// The order of `word_positions`, written as loops over whole 8-row bands (this runs for every
/// weight a converter quantizes).
pub fn pack_codes(rows: usize, cols: usize, codes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * cols / 2);
    for band in codes.chunks_exact(8 * cols).take(rows / 8) {
        for kb in 0..cols / 64 {
            for reg in 0..2 {
                for lane in 0..32 {
                    let base = (lane / 4) * cols + kb * 64 + 8 * (lane % 4) + 32 * reg;
                    let word = band[base..base + 8]
                        .iter()
                        .enumerate()
                        .fold(0u32, |w, (j, &c)| w | ((c as u32 & 0xF) << (4 * j)));
                    out.extend_from_slice(&word.to_le_bytes());
                }
            }
        }
    }
    out
}

pub fn unpack_codes(rows: usize, cols: usize, bytes: &[u8], out: &mut [u8]) {
    for ((r, c0), w) in word_positions(rows, cols).zip(bytes.chunks_exact(4)) {
        let word = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        for j in 0..8 {
            out[r * cols + c0 + j] = ((word >> (4 * j)) & 0xF) as u8;
        }
    }
}

/// The order of `scale_positions`, as loops.
pub fn pack_scales(rows: usize, cols: usize, scales: &[u8]) -> Vec<u8> {
    let blocks = cols / NVFP4_GROUP;
    let mut out = Vec::with_capacity(rows * blocks);
    for nb in 0..rows / 8 {
        for kb in 0..cols / 64 {
            for r in 0..8 {
                let at = (nb * 8 + r) * blocks + kb * 4;
                out.extend_from_slice(&scales[at..at + 4]);
            }
        }
    }
    out
}

pub fn unpack_scales(rows: usize, cols: usize, bytes: &[u8]) -> Vec<u8> {
    let blocks = cols / NVFP4_GROUP;
    let mut out = vec![0u8; rows * blocks];
    for ((r, g), &b) in scale_positions(rows, cols).zip(bytes) {
        out[r * blocks + g] = b;
    }
    out
}

pub(super) fn quantize(rows: usize, cols: usize, values: &[f32], global: Option<f32>) -> Quantized {
    let (codes, scales, global) = quantize_row_major(rows, cols, values, global);
    Quantized {
        codes: pack_codes(rows, cols, &codes),
        scales: pack_scales(rows, cols, &scales),
        global_scale: global,
    }
}

/// Rows `r0..r1` of `q` in F32, row-major, read straight from the fragment-ordered codes and
/// scales. A value is `(E2M1(code) × E4M3(scale)) × global`, in that order (the product of the
/// first two is exact; only the last multiplication rounds).
pub(super) fn dequantize_rows(q: &QuantMat<'_>, r0: usize, r1: usize, dst: &mut [f32]) {
    let cols = q.cols;
    let chunks = cols / 64;
    let e4m3 = e4m3_table();
    let e2m1: [f32; 16] = std::array::from_fn(|c| e2m1_to_f32(c as u8));
    #[cfg(target_arch = "x86_64")]
    let simd = super::x86::usable();
    for band in r0 / 8..r1.div_ceil(8) {
        for kb in 0..chunks {
            let chunk = band * chunks + kb;
            for reg in 0..2 {
                for lane in 0..32 {
                    let r = band * 8 + lane / 4;
                    if r < r0 || r >= r1 {
                        continue;
                    }
                    let at = ((chunk * 2 + reg) * 32 + lane) * 4;
                    let word = u32::from_le_bytes(q.codes[at..at + 4].try_into().expect("4"));
                    // Eight columns of one 16-value block: one scale.
                    let c0 = kb * 64 + 32 * reg + 8 * (lane % 4);
                    let s = e4m3[q.scales[chunk * 32 + (r % 8) * 4 + (c0 % 64) / 16] as usize];
                    let out = &mut dst[(r - r0) * cols + c0..(r - r0) * cols + c0 + 8];
                    #[cfg(target_arch = "x86_64")]
                    if simd {
                        // SAFETY: AVX2 checked; `out` holds the word's 8 values.
                        unsafe {
                            super::x86::nvfp4_word(
                                word,
                                super::x86::e2m1_magnitudes(&E2M1),
                                s,
                                q.global_scale,
                                out.as_mut_ptr(),
                            )
                        };
                        continue;
                    }
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = (e2m1[((word >> (4 * j)) & 0xF) as usize] * s) * q.global_scale;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fp8::e4m3_to_f32;
    use super::*;

    /// The nearest-code search `f32_to_e2m1` replaced (the reference for the count).
    fn e2m1_by_search(x: f32) -> u8 {
        let a = x.abs();
        let mut idx = 7;
        for i in 0..7 {
            let mid = (E2M1[i] + E2M1[i + 1]) / 2.0;
            if a < mid || (a == mid && i.is_multiple_of(2)) {
                idx = i;
                break;
            }
        }
        if x.is_sign_negative() {
            idx as u8 | 8
        } else {
            idx as u8
        }
    }

    #[test]
    fn e2m1_count_matches_the_search() {
        let mut xs: Vec<f32> = vec![0.0, -0.0, f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-30];
        for mid in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] {
            xs.extend([
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ]);
        }
        xs.extend((0..2000).map(|i| i as f32 * 0.0041 - 4.1));
        for x in xs.iter().flat_map(|&x| [x, -x]) {
            assert_eq!(f32_to_e2m1(x), e2m1_by_search(x), "{x}");
        }
    }

    /// The loops of `pack_codes` / `pack_scales` put every value where the position lists say.
    #[test]
    fn packing_loops_follow_the_position_lists() {
        let (rows, cols) = (16, 128);
        let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 16) as u8).collect();
        let mut want = Vec::new();
        for (r, c0) in word_positions(rows, cols) {
            let word = (0..8).fold(0u32, |w, j| {
                w | ((codes[r * cols + c0 + j] as u32 & 0xF) << (4 * j))
            });
            want.extend_from_slice(&word.to_le_bytes());
        }
        assert_eq!(pack_codes(rows, cols, &codes), want);
        let scales: Vec<u8> = (0..rows * cols / 16)
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        let want: Vec<u8> = scale_positions(rows, cols)
            .map(|(r, g)| scales[r * cols / 16 + g])
            .collect();
        assert_eq!(pack_scales(rows, cols, &scales), want);
        assert_eq!(unpack_scales(rows, cols, &want), scales);
    }

    #[test]
    fn e2m1_round_trip_and_ties() {
        for c in 0..16u8 {
            assert_eq!(f32_to_e2m1(e2m1_to_f32(c)), c);
        }
        assert_eq!(f32_to_e2m1(0.25), 0);
        assert_eq!(f32_to_e2m1(0.75), 2);
        assert_eq!(f32_to_e2m1(1.25), 2);
        assert_eq!(f32_to_e2m1(2.5), 4);
        assert_eq!(f32_to_e2m1(5.0), 6);
        assert_eq!(f32_to_e2m1(5.01), 7);
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(-3.0), 13);
        // Negative values that round to zero keep the sign: nibble 8.
        assert_eq!(f32_to_e2m1(-0.1), 8);
        assert_eq!(f32_to_e2m1(-0.25), 8);
        assert_eq!(f32_to_e2m1(-0.0), 8);
        assert_eq!(f32_to_e2m1(0.0), 0);
        assert_eq!(e2m1_to_f32(8), 0.0);
    }

    #[test]
    fn scales_follow_the_rules() {
        assert_eq!(global_scale(0.0), 1.0);
        assert_eq!(global_scale(2688.0), 1.0);
        assert_eq!(global_scale(1e-40), f32::MIN_POSITIVE);
        assert_eq!(block_scale_code(0.0, 1.0), 56);
        assert_eq!(e4m3_to_f32(E4M3_ONE), 1.0);
        assert_eq!(block_scale_code(1e-30, 1.0), 1);
        assert_eq!(block_scale_code(6.0 * 448.0, 1.0), 126);
    }
}
