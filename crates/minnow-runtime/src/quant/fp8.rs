//! The E4M3 8-bit float (the "FN" variant: 4 exponent bits with bias 7, 3 mantissa bits, no
//! infinities, largest finite 448, `0x7F`/`0xFF` NaN), used by NVFP4's block scales and by our
//! own block-scaled FP8 encoding `fp8_e4m3_b128` (docs/model-format.md):
//! codes row-major `[N][K]`, one F32 scale per 128 × 128 block in row-major
//! `[ceil(N/128)][ceil(K/128)]`, scale = `max_abs / 448` (1 for an all-zero block, clamped up to
//! the smallest positive normal F32), code = E4M3 nearest-even of value / scale.

use super::encoding::{QuantMat, Quantized, FP8_BLOCK};

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The value of an E4M3 byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = (b >> 3) & 0xF;
    let m = (b & 7) as f32;
    if e == 0xF && b & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m / 8.0 * (-6f32).exp2()
    } else {
        (1.0 + m / 8.0) * (e as f32 - 7.0).exp2()
    };
    sign * mag
}

/// The value of every E4M3 byte (NaN for `0x7F`/`0xFF`).
pub fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)))
}

/// The positive E4M3 code nearest to `x >= 0` (ties to the even code), saturating at 448.
/// Read off `x`'s bits: a code's low bit is its mantissa's, so nearest-even on the mantissa is
/// ties-to-even on the code (the nearest-code search in the tests is the reference).
pub fn e4m3_positive_code(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    if x >= E4M3_MAX {
        return 126;
    }
    const SMALLEST_NORMAL: f32 = 1.0 / 64.0; // 2^-6, code 0x08
    if x < SMALLEST_NORMAL {
        // Subnormal codes are multiples of 2^-9: round x · 2^9 (exact, < 8) to an integer,
        // ties to even, by adding and subtracting 1.5 × 2^23.
        const MAGIC: f32 = 12_582_912.0;
        return ((x * 512.0 + MAGIC) - MAGIC) as u8;
    }
    // Normal: keep 3 mantissa bits, rounding the 20 dropped ones to nearest even (a carry
    // moves to the next binade, which is the next code); then rebias the exponent 127 → 7.
    let bits = x.to_bits();
    let rounded = (bits + 0x7_FFFF + ((bits >> 20) & 1)) >> 20;
    (rounded - ((127 - 7) << 3)) as u8
}

/// The E4M3 byte nearest to `x` (ties to even, saturating at ±448; zero keeps no sign).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let code = e4m3_positive_code(x.abs());
    if x < 0.0 && code != 0 {
        code | 0x80
    } else {
        code
    }
}

fn block_scale(max_abs: f32) -> f32 {
    if max_abs == 0.0 {
        1.0
    } else {
        (max_abs / E4M3_MAX).max(f32::MIN_POSITIVE)
    }
}

/// Activation rows as the W8A8 expert GEMM quantizes them on the GPU: per row and group of
/// `group` columns one F32 scale (the block rule: `max_abs / 448`, 1 for an all-zero group) and
/// each value's E4M3 code of value / scale. Returns the codes (row-major, natural column order)
/// and the scales `[rows, cols / group]`. Needs `cols % group == 0`.
pub fn quantize_rows(
    rows: usize,
    cols: usize,
    group: usize,
    values: &[f32],
) -> (Vec<u8>, Vec<f32>) {
    assert!(group > 0 && cols.is_multiple_of(group) && values.len() == rows * cols);
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(rows * cols / group);
    for run in values.chunks_exact(group) {
        let s = block_scale(run.iter().fold(0.0f32, |m, v| m.max(v.abs())));
        scales.push(s);
        codes.extend(run.iter().map(|v| f32_to_e4m3(v / s)));
    }
    (codes, scales)
}

pub(super) fn quantize_block(rows: usize, cols: usize, values: &[f32]) -> Quantized {
    let (bn, bk) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
    let mut scales = vec![0.0f32; bn * bk];
    for (i, s) in scales.iter_mut().enumerate() {
        let (r0, c0) = ((i / bk) * FP8_BLOCK, (i % bk) * FP8_BLOCK);
        let mut max_abs = 0.0f32;
        for r in r0..(r0 + FP8_BLOCK).min(rows) {
            for v in &values[r * cols + c0..r * cols + (c0 + FP8_BLOCK).min(cols)] {
                max_abs = max_abs.max(v.abs());
            }
        }
        *s = block_scale(max_abs);
    }
    // Row by row, block by block: one scale per run of up to 128 values.
    let mut codes = Vec::with_capacity(values.len());
    for (r, row) in values.chunks_exact(cols.max(1)).take(rows).enumerate() {
        let row_scales = &scales[(r / FP8_BLOCK) * bk..];
        for (run, s) in row.chunks(FP8_BLOCK).zip(row_scales) {
            codes.extend(run.iter().map(|v| f32_to_e4m3(v / s)));
        }
    }
    Quantized {
        codes,
        scales: scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
        global_scale: 1.0,
    }
}

/// Rows `r0..r1` of a `fp8_e4m3_b128` matrix in F32, row-major.
pub(super) fn dequantize_block_rows(q: &QuantMat<'_>, r0: usize, r1: usize, dst: &mut [f32]) {
    let cols = q.cols;
    let bk = cols.div_ceil(FP8_BLOCK);
    let table = e4m3_table();
    #[cfg(target_arch = "x86_64")]
    let simd = super::x86::usable();
    let scale = |i: usize| {
        let b = &q.scales[4 * i..4 * i + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    for (r, row) in (r0..r1).zip(dst.chunks_exact_mut(cols)) {
        let codes = &q.codes[r * cols..(r + 1) * cols];
        for (b, (out, codes)) in row
            .chunks_mut(FP8_BLOCK)
            .zip(codes.chunks(FP8_BLOCK))
            .enumerate()
        {
            let s = scale((r / FP8_BLOCK) * bk + b);
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX2 checked; `out` and `codes` have the same length.
                unsafe { super::x86::table_times(table, codes, s, out) };
                continue;
            }
            for (o, &c) in out.iter_mut().zip(codes) {
                *o = table[c as usize] * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference rounding: the nearest of the positive codes' values (ties to the even
    /// code), found by search.
    fn nearest_positive_code(x: f32) -> u8 {
        let table: [f32; 127] = std::array::from_fn(|i| e4m3_to_f32(i as u8));
        if x.is_nan() || x <= 0.0 {
            return 0;
        }
        if x >= E4M3_MAX {
            return 126;
        }
        let below = table.partition_point(|&v| v <= x) - 1;
        let (lo, hi) = (table[below], table[below + 1]);
        let (d_lo, d_hi) = (x - lo, hi - x);
        if d_lo < d_hi || (d_lo == d_hi && below.is_multiple_of(2)) {
            below as u8
        } else {
            below as u8 + 1
        }
    }

    /// The bit-level rounding equals the search at every code, every midpoint between two
    /// codes and the floats next to them, and at a sweep of a million floats up to past 448.
    #[test]
    fn e4m3_rounding_matches_the_nearest_code_search() {
        let mut probes = Vec::new();
        for c in 0..126u8 {
            let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
            for v in [lo, (lo + hi) / 2.0, hi] {
                probes.extend([
                    v,
                    f32::from_bits(v.to_bits() + 1),
                    f32::from_bits(v.to_bits().max(1) - 1),
                ]);
            }
        }
        let top = 500f32.to_bits();
        probes.extend(
            (0..top)
                .step_by(top as usize / 1_000_000)
                .map(f32::from_bits),
        );
        probes.extend([
            f32::MIN_POSITIVE,
            1e-30,
            447.99,
            448.0,
            464.0,
            1e30,
            f32::INFINITY,
            f32::NAN,
            -0.0,
        ]);
        for x in probes {
            assert_eq!(
                e4m3_positive_code(x),
                nearest_positive_code(x),
                "{x:e} ({:#x})",
                x.to_bits()
            );
        }
    }

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x01), (-9f32).exp2());
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert!(e4m3_to_f32(0x7F).is_nan());
        // Every finite code encodes back to itself.
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_finite() && b != 0x80 {
                assert_eq!(f32_to_e4m3(v), b, "{b:#x} = {v}");
            }
        }
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.125 and 1.25 (0x3A): midpoint 1.1875 goes to 0x3A.
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        assert_eq!(f32_to_e4m3(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3(1e-9), 0);
        assert_eq!(f32_to_e4m3(-1e-9), 0);
    }
}
