//! AVX2 decoders of the quantized encodings. Each writes exactly the values of the scalar
//! decoder it stands in for (the same exact integer-to-float conversion and the same
//! multiplications in the same order), 8 or 16 values at a time: the CPU products read weight
//! rows through these, and a product's bits must not depend on which decoder ran.

use std::arch::x86_64::*;

use half::f16;

use super::encoding::QuantMat;

/// Whether the AVX2 decoders may run (the CPU has AVX2 and `MINNOW_CPU_PORTABLE` is unset).
pub(super) fn usable() -> bool {
    crate::cpu::x86::has_avx2_fma()
}

/// Byte shuffles that put one row's codes of a 16-column unit in column order.
/// INT8 row-major: already in order.
const I8_SYM: [i8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
/// INT8 fragment order: slot `s` of a row's 16 holds column `2 (s / 4) + s % 2 + 8 (s / 2 % 2)`
/// (lane `s / 4` holds columns `2 (l % 4) + {0, 1, 8, 9}`); this gathers columns 0..16.
const I8_MMA: [i8; 16] = [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15];
/// INT4 row-major: byte `i` holds columns `2i` (low nibble) and `2i + 1`; each byte is
/// duplicated so that lane `c` of the result holds the byte of column `c`.
const I4_SYM: [i8; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];
/// INT4 fragment order: byte `i` holds slots `2i`, `2i + 1`, i.e. the column pair
/// `2 (i / 2) + 8 (i % 2)` (see [`I8_MMA`]).
const I4_MMA: [i8; 16] = [0, 0, 2, 2, 4, 4, 6, 6, 1, 1, 3, 3, 5, 5, 7, 7];

/// Rows `r0..r1` of an INT8/INT4 matrix (either layout) as F32: `code × scale`, as
/// `super::int::dequantize_rows` computes it.
///
/// # Safety
/// AVX2 required ([`usable`]); `q` well-formed (checked by `QuantMat::new`) and
/// `dst.len() == (r1 - r0) · cols`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn int_rows(
    q: &QuantMat<'_>,
    r0: usize,
    r1: usize,
    dst: &mut [f32],
    int4: bool,
    mma: bool,
) {
    let (cols, group) = (q.cols, q.group_size);
    let groups = cols / group;
    let units_per_group = group / 16;
    let tiles_k = cols / 16;
    // Bytes of one row's codes in a 16-column unit.
    let unit = if int4 { 8 } else { 16 };
    let shuffle = _mm_loadu_si128(
        match (int4, mma) {
            (false, false) => &I8_SYM,
            (false, true) => &I8_MMA,
            (true, false) => &I4_SYM,
            (true, true) => &I4_MMA,
        }
        .as_ptr() as *const __m128i,
    );
    let codes = q.codes.as_ptr();
    let scale = |i: usize| f16::from_le_bytes([q.scales[2 * i], q.scales[2 * i + 1]]).to_f32();
    for (r, row) in (r0..r1).zip(dst.chunks_exact_mut(cols)) {
        let out = row.as_mut_ptr();
        let (band, within) = (r / 8, r % 8);
        for g in 0..groups {
            let s = _mm256_set1_ps(if mma {
                scale((band * groups + g) * 8 + within)
            } else {
                scale(r * groups + g)
            });
            for u in g * units_per_group..(g + 1) * units_per_group {
                let at = if mma {
                    (band * tiles_k + u) * 8 * unit + within * unit
                } else {
                    (r * tiles_k + u) * unit
                };
                debug_assert!(at + unit <= q.codes.len());
                if int4 {
                    unit_i4(codes.add(at), shuffle, s, out.add(16 * u));
                } else {
                    unit_i8(codes.add(at), shuffle, s, out.add(16 * u));
                }
            }
        }
    }
}

/// 16 INT8 codes (16 bytes at `src`, reordered by `shuffle`) times `s` into `out[0..16]`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn unit_i8(src: *const u8, shuffle: __m128i, s: __m256, out: *mut f32) {
    let b = _mm_shuffle_epi8(_mm_loadu_si128(src as *const __m128i), shuffle);
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b)));
    _mm256_storeu_ps(out, _mm256_mul_ps(lo, s));
    _mm256_storeu_ps(out.add(8), _mm256_mul_ps(hi, s));
}

/// 16 INT4 codes (8 bytes at `src`; `shuffle` gives lane `c` the byte of column `c`) times `s`
/// into `out[0..16]`. Even columns are low nibbles, odd ones high nibbles: shifted to the top of
/// a 32-bit lane, then arithmetic-shifted back down (sign extension).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn unit_i4(src: *const u8, shuffle: __m128i, s: __m256, out: *mut f32) {
    let b = _mm_shuffle_epi8(_mm_loadl_epi64(src as *const __m128i), shuffle);
    let to_top = _mm256_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24);
    let nibbles = |bytes: __m128i| {
        _mm256_cvtepi32_ps(_mm256_srai_epi32::<28>(_mm256_sllv_epi32(
            _mm256_cvtepu8_epi32(bytes),
            to_top,
        )))
    };
    _mm256_storeu_ps(out, _mm256_mul_ps(nibbles(b), s));
    _mm256_storeu_ps(
        out.add(8),
        _mm256_mul_ps(nibbles(_mm_srli_si128::<8>(b)), s),
    );
}

/// Eight NVFP4 values of one code word: `(E2M1(code) × scale) × global`, as
/// `super::nvfp4::dequantize_rows` computes them. `magnitudes` holds the eight E2M1 magnitudes.
///
/// # Safety
/// AVX2 required; `out` holds 8 values.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn nvfp4_word(
    word: u32,
    magnitudes: __m256,
    scale: f32,
    global: f32,
    out: *mut f32,
) {
    let codes = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(word as i32),
            _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        ),
        _mm256_set1_epi32(0xF),
    );
    // The permutation reads the low three bits (the magnitude); bit 3 is the sign.
    let mag = _mm256_permutevar8x32_ps(magnitudes, codes);
    let sign = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(_mm256_and_si256(
        codes,
        _mm256_set1_epi32(8),
    )));
    let v = _mm256_xor_ps(mag, sign);
    let v = _mm256_mul_ps(
        _mm256_mul_ps(v, _mm256_set1_ps(scale)),
        _mm256_set1_ps(global),
    );
    _mm256_storeu_ps(out, v);
}

/// The eight E2M1 magnitudes (`nvfp4`'s table) as one vector, for [`nvfp4_word`].
///
/// # Safety
/// AVX2 required.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn e2m1_magnitudes(table: &[f32; 8]) -> __m256 {
    _mm256_loadu_ps(table.as_ptr())
}

/// `out[i] = table[codes[i]] × scale` (FP8 codes through the E4M3 table), as
/// `super::fp8::dequantize_block_rows` computes it.
///
/// # Safety
/// AVX2 required; `out.len() == codes.len()`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn table_times(table: &[f32; 256], codes: &[u8], scale: f32, out: &mut [f32]) {
    let n = codes.len().min(out.len());
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i));
        let v = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(v, s));
        i += 8;
    }
    for (o, &c) in out[i..n].iter_mut().zip(&codes[i..n]) {
        *o = table[c as usize] * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{fp8, int, nvfp4, QuantEncoding, QuantMat};

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    /// Scales of the encoding: random positive finite values in its scale type.
    fn scales(e: QuantEncoding, n: usize, seed: u64) -> Vec<u8> {
        let raw = bytes(n, seed);
        match e {
            // E4M3 codes 1..=126: positive and finite.
            QuantEncoding::Nvfp4 => raw.iter().map(|b| 1 + b % 126).collect(),
            QuantEncoding::Fp8Block => raw
                .chunks_exact(4)
                .flat_map(|c| (0.001 + c[0] as f32 / 7.0).to_le_bytes())
                .collect(),
            _ => raw
                .chunks_exact(2)
                .flat_map(|c| half::f16::from_f32(0.001 + c[0] as f32 / 300.0).to_le_bytes())
                .collect(),
        }
    }

    /// Row-major values of the whole matrix from the layout-unpacking functions (independent
    /// of the decoders under test).
    fn reference(q: &QuantMat<'_>) -> Vec<f32> {
        let (rows, cols) = (q.rows, q.cols);
        match q.encoding {
            QuantEncoding::Nvfp4 => {
                let mut codes = vec![0u8; rows * cols];
                nvfp4::unpack_codes(rows, cols, q.codes, &mut codes);
                let scales = nvfp4::unpack_scales(rows, cols, q.scales);
                (0..rows * cols)
                    .map(|i| {
                        let s = fp8::e4m3_to_f32(scales[i / 16]);
                        (nvfp4::e2m1_to_f32(codes[i]) * s) * q.global_scale
                    })
                    .collect()
            }
            QuantEncoding::Fp8Block => {
                let bk = cols.div_ceil(128);
                (0..rows * cols)
                    .map(|i| {
                        let b = ((i / cols) / 128) * bk + (i % cols) / 128;
                        let s = f32::from_le_bytes(q.scales[4 * b..4 * b + 4].try_into().unwrap());
                        fp8::e4m3_to_f32(q.codes[i]) * s
                    })
                    .collect()
            }
            e => {
                let mut codes = vec![0i8; rows * cols];
                int::unpack_codes(e, rows, cols, q.codes, &mut codes);
                let groups = cols / q.group_size;
                let scales = int::unpack_scales(e, rows, groups, q.scales);
                (0..rows * cols)
                    .map(|i| {
                        codes[i] as f32 * scales[(i / cols) * groups + (i % cols) / q.group_size]
                    })
                    .collect()
            }
        }
    }

    /// Every encoding's decoder (AVX2 where the CPU has it) gives, bit for bit, the values the
    /// unpacked codes and scales define, for any range of rows; every byte value is a code.
    #[test]
    fn decoders_match_the_unpacked_values_bit_for_bit() {
        if is_x86_feature_detected!("avx2") && std::env::var_os("MINNOW_CPU_PORTABLE").is_none() {
            assert!(super::usable());
        }
        for e in QuantEncoding::ALL {
            for &(rows, cols, group) in
                &[(8, 64, 16), (24, 256, 32), (16, 384, 128), (136, 128, 64)]
            {
                let group = e.manifest_group(group);
                if e.check_shape(rows, cols, group).is_err() {
                    continue;
                }
                let codes = bytes(e.codes_bytes(rows, cols).unwrap(), rows as u64);
                let sc = scales(e, e.scales_bytes(rows, cols, group).unwrap(), cols as u64);
                let global = if e == QuantEncoding::Nvfp4 { 0.37 } else { 1.0 };
                let q = QuantMat::new(e, rows, cols, group, &codes, &sc, global).unwrap();
                let want = reference(&q);
                for (r0, r1) in [(0, rows), (3, rows - 1), (rows - 1, rows)] {
                    let mut got = vec![f32::NAN; (r1 - r0) * cols];
                    q.dequantize_rows(r0, r1, &mut got);
                    for (i, (g, w)) in got.iter().zip(&want[r0 * cols..r1 * cols]).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "{e} [{rows}, {cols}] group {group} rows {r0}..{r1} value {i}: {g} vs {w}"
                        );
                    }
                }
                if !matches!(e, QuantEncoding::Nvfp4 | QuantEncoding::Fp8Block) {
                    let mut scalar = vec![f32::NAN; rows * cols];
                    int::dequantize_rows_scalar(&q, 0, rows, &mut scalar);
                    let same = scalar
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{e} [{rows}, {cols}]: the scalar decoder differs");
                }
            }
        }
    }
}
