//! NVFP4: 4-bit E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4,
//! 6}), one E4M3 scale per 16 K-consecutive values, one F32 global scale per matrix
//! (docs/model-format.md). Stored value = E2M1(code) × E4M3(block scale) × global scale.
//!
//! Codes are little-endian u32 words in the order `[N/8][K/64][register 0..2][lane 0..32]`;
//! lane `l` of register 0 holds row `l / 4`, columns `8 (l % 4) + 0..8` of the 64-column chunk,
//! register 1 the same columns + 32; within a word column `j` of the eight sits in bits
//! `4j..4j+4` (the first value in the lowest nibble). Scales are bytes in the order
//! `[N/8][K/64][row 0..8][block 0..4]`.

use super::fp8::{e4m3_positive_code, e4m3_to_f32, E4M3_MAX};
use super::{QuantMat, Quantized, NVFP4_GROUP};

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

/// The E2M1 code nearest to `x` (ties to the even code, saturating at ±6; zero has no sign).
pub fn f32_to_e2m1(x: f32) -> u8 {
    let a = x.abs();
    let mut idx = 7;
    for i in 0..7 {
        let mid = (E2M1[i] + E2M1[i + 1]) / 2.0;
        if a < mid || (a == mid && i.is_multiple_of(2)) {
            idx = i;
            break;
        }
    }
    if x < 0.0 && idx != 0 {
        idx as u8 | 8
    } else {
        idx as u8
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

/// The E4M3 block scale code of a block whose largest magnitude is `block_max`.
pub fn block_scale_code(block_max: f32, global: f32) -> u8 {
    if block_max == 0.0 {
        return 1;
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
    let mut codes = vec![0u8; rows * cols];
    let mut scales = Vec::with_capacity(rows * cols / NVFP4_GROUP);
    for (vals, out) in values
        .chunks_exact(NVFP4_GROUP)
        .zip(codes.chunks_exact_mut(NVFP4_GROUP))
    {
        let block_max = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let code = block_scale_code(block_max, global);
        let denom = e4m3_to_f32(code) * global;
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

pub fn pack_codes(rows: usize, cols: usize, codes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * cols / 2);
    for (r, c0) in word_positions(rows, cols) {
        let base = r * cols + c0;
        let word = (0..8).fold(0u32, |w, j| w | ((codes[base + j] as u32 & 0xF) << (4 * j)));
        out.extend_from_slice(&word.to_le_bytes());
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

pub fn pack_scales(rows: usize, cols: usize, scales: &[u8]) -> Vec<u8> {
    let blocks = cols / NVFP4_GROUP;
    scale_positions(rows, cols)
        .map(|(r, g)| scales[r * blocks + g])
        .collect()
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

pub(super) fn dequantize(q: &QuantMat<'_>, dst: &mut [f32]) {
    let (rows, cols) = (q.rows, q.cols);
    let mut codes = vec![0u8; rows * cols];
    unpack_codes(rows, cols, q.codes, &mut codes);
    let scales = unpack_scales(rows, cols, q.scales);
    for ((out, codes), &s) in dst
        .chunks_exact_mut(NVFP4_GROUP)
        .zip(codes.chunks_exact(NVFP4_GROUP))
        .zip(&scales)
    {
        let s = e4m3_to_f32(s);
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = e2m1_to_f32(c) * s * q.global_scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_round_trip_and_ties() {
        for c in 0..16u8 {
            if c != 8 {
                assert_eq!(f32_to_e2m1(e2m1_to_f32(c)), c);
            }
        }
        assert_eq!(f32_to_e2m1(0.25), 0);
        assert_eq!(f32_to_e2m1(0.75), 2);
        assert_eq!(f32_to_e2m1(1.25), 2);
        assert_eq!(f32_to_e2m1(2.5), 4);
        assert_eq!(f32_to_e2m1(5.0), 6);
        assert_eq!(f32_to_e2m1(5.01), 7);
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(-3.0), 13);
        assert_eq!(f32_to_e2m1(-0.1), 0);
    }

    #[test]
    fn scales_follow_the_rules() {
        assert_eq!(global_scale(0.0), 1.0);
        assert_eq!(global_scale(2688.0), 1.0);
        assert_eq!(global_scale(1e-40), f32::MIN_POSITIVE);
        assert_eq!(block_scale_code(0.0, 1.0), 1);
        assert_eq!(block_scale_code(1e-30, 1.0), 1);
        assert_eq!(block_scale_code(6.0 * 448.0, 1.0), 126);
    }
}
