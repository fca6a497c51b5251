//! AVX-512 kernel for `y = x · Wᵀ` with few input rows, reading `W` in its stored type.
//!
//! Memory-bound regime: each weight row is widened once per 4-row tile into an L1-resident
//! buffer, then multiplied with every input row in 4×4 register tiles (16 accumulators, 8 loads
//! per 16 FMAs). Input rows (≤ 48 × k floats) stay in L2.

use std::arch::x86_64::*;

use crate::dtype::{DType, MatRef};

/// Weight rows per register tile.
const R: usize = 4;
/// Input rows per register tile.
const T: usize = 4;

pub fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Columns `r0..r1` of `out[m, n] = x[m, k] · Wᵀ`.
///
/// # Safety
/// The CPU must support AVX-512F; `out` must point to an `[m, n]` row-major buffer that no
/// other thread writes in columns `r0..r1`; `x.len() == m * w.cols`; `r1 <= w.rows == n`.
#[target_feature(enable = "avx512f")]
pub unsafe fn linear_small_m(
    x: &[f32],
    m: usize,
    w: MatRef<'_>,
    r0: usize,
    r1: usize,
    out: *mut f32,
    n: usize,
) {
    let k = w.cols;
    let mut wbuf = vec![0.0f32; R * k];
    let mut r = r0;
    while r < r1 {
        let rr = R.min(r1 - r);
        let wp: *const f32 = match w.dtype {
            // Unaligned vector loads read F32 weights in place.
            DType::F32 => w.row_bytes(r, r + rr).as_ptr() as *const f32,
            dt => {
                widen_rows(dt, w.row_bytes(r, r + rr), &mut wbuf[..rr * k]);
                wbuf.as_ptr()
            }
        };
        let mut t = 0;
        while t < m {
            let tt = T.min(m - t);
            let xp = x.as_ptr().add(t * k);
            let op = out.add(t * n + r);
            match (rr, tt) {
                (R, T) => tile::<R, T>(wp, xp, k, op, n),
                (R, _) => {
                    for j in 0..tt {
                        tile::<R, 1>(wp, xp.add(j * k), k, op.add(j * n), n);
                    }
                }
                (_, T) => {
                    for i in 0..rr {
                        tile::<1, T>(wp.add(i * k), xp, k, op.add(i), n);
                    }
                }
                _ => {
                    for i in 0..rr {
                        for j in 0..tt {
                            tile::<1, 1>(wp.add(i * k), xp.add(j * k), k, op.add(j * n + i), n);
                        }
                    }
                }
            }
            t += tt;
        }
        r += rr;
    }
}

/// `out[j, i] = Σ_q w[i, q] · x[j, q]` for an `RR × TT` tile (row strides `k`, output stride `n`).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const RR: usize, const TT: usize>(
    wp: *const f32,
    xp: *const f32,
    k: usize,
    out: *mut f32,
    n: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); TT]; RR];
    let mut q = 0;
    while q + 16 <= k {
        let mut xv = [_mm512_setzero_ps(); TT];
        for (j, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(xp.add(j * k + q));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let wv = _mm512_loadu_ps(wp.add(i * k + q));
            for (a, xj) in row.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(wv, *xj, *a);
            }
        }
        q += 16;
    }
    if q < k {
        let mask: __mmask16 = (1u32 << (k - q)) as u16 - 1;
        let mut xv = [_mm512_setzero_ps(); TT];
        for (j, v) in xv.iter_mut().enumerate() {
            *v = _mm512_maskz_loadu_ps(mask, xp.add(j * k + q));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let wv = _mm512_maskz_loadu_ps(mask, wp.add(i * k + q));
            for (a, xj) in row.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(wv, *xj, *a);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, a) in row.iter().enumerate() {
            *out.add(j * n + i) = _mm512_reduce_add_ps(*a);
        }
    }
}

/// Widens BF16/F16 bytes into `dst` with 16-lane conversions.
#[target_feature(enable = "avx512f")]
unsafe fn widen_rows(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let sp = src.as_ptr();
    let dp = dst.as_mut_ptr();
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm256_loadu_si256(sp.add(2 * i) as *const __m256i);
        let f = match dtype {
            DType::BF16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))),
            DType::F16 => _mm512_cvtph_ps(h),
            DType::F32 => unreachable!("F32 weights are read in place"),
        };
        _mm512_storeu_ps(dp.add(i), f);
        i += 16;
    }
    crate::dtype::widen_into(dtype, &src[2 * i..], &mut dst[i..]);
}
