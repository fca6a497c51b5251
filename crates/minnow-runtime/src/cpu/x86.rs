//! x86-64 kernels: the dot-product tiles of [`super::linear::linear`] (AVX-512 and AVX2 with
//! FMA), BF16/F16 widening, attention's `P · V`, softmax.
//!
//! The `linear` tiles keep one vector accumulator per output element (lane `l` sums the indices
//! `q ≡ l` mod the lane count, in order) and reduce it with a fixed tree at the end, so an
//! output's bits do not depend on the tile it was computed in: the edge tiles (`1 × T`, `R × 1`,
//! `1 × 1`) give the same bits as a full `R × T` tile.

use std::arch::x86_64::*;

use super::dot_block::DotBlock;
use crate::dtype::DType;

/// Whether the AVX-512 kernels may run: the CPU has AVX-512F and `MINNOW_CPU_PORTABLE` is not
/// set. The variable forces the portable path that CPUs without SIMD kernels take, so that path
/// can be tested, and compared, on any machine.
pub fn has_avx512() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| !forced_portable() && is_x86_feature_detected!("avx512f"))
}

/// Whether the AVX2 + FMA kernels may run (and `MINNOW_CPU_PORTABLE` is not set).
pub fn has_avx2_fma() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        !forced_portable() && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    })
}

fn forced_portable() -> bool {
    std::env::var_os("MINNOW_CPU_PORTABLE").is_some()
}

/// Runs `$tile::<R, T>` over a [`DotBlock`]: groups of `R` weight rows (outer, L1-resident)
/// times tiles of `T` input rows (inner), with `R × 1`, `1 × T` and `1 × 1` tiles at the edges.
macro_rules! tile_loops {
    ($b:expr, $tile:ident, $r:literal, $t:literal) => {{
        let b: &DotBlock = $b;
        let (k, n) = (b.k, b.out_stride);
        let mut r = 0;
        while r < b.w_rows {
            let rr = ($r as usize).min(b.w_rows - r);
            let wp = b.w.add(r * k);
            let mut t = 0;
            while t < b.x_rows {
                let tt = ($t as usize).min(b.x_rows - t);
                let xp = b.x.add(t * k);
                let op = b.out.add(t * n + r);
                if rr == $r && tt == $t {
                    $tile::<$r, $t>(wp, xp, k, op, n);
                } else if rr == $r {
                    for j in 0..tt {
                        $tile::<$r, 1>(wp, xp.add(j * k), k, op.add(j * n), n);
                    }
                } else if tt == $t {
                    for i in 0..rr {
                        $tile::<1, $t>(wp.add(i * k), xp, k, op.add(i), n);
                    }
                } else {
                    for i in 0..rr {
                        for j in 0..tt {
                            $tile::<1, 1>(wp.add(i * k), xp.add(j * k), k, op.add(j * n + i), n);
                        }
                    }
                }
                t += tt;
            }
            r += rr;
        }
    }};
}

/// [`DotBlock`] with AVX-512: 16 lanes, 4 × 4 register tiles (16 accumulators, 8 loads per 16
/// FMAs).
///
/// # Safety
/// AVX-512F required; the block's pointers as documented on [`DotBlock`].
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dot_block_avx512(b: &DotBlock) {
    tile_loops!(b, tile512, 4, 4)
}

/// [`DotBlock`] with AVX2 + FMA: 8 lanes, 4 × 3 register tiles (12 accumulators, 3 input
/// vectors and one weight vector: all 16 vector registers; 7 loads per 12 FMAs, where 3 × 3
/// needed 6 per 9; docs/performance.md has the Zen 2 comparison).
///
/// # Safety
/// AVX2 and FMA required; the block's pointers as documented on [`DotBlock`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_block_avx2(b: &DotBlock) {
    tile_loops!(b, tile256, 4, 3)
}

/// `out[j, i] = Σ_q w[i, q] · x[j, q]` for an `RR × TT` tile (row strides `k`, output stride `n`).
/// The loops index rows through pointers computed once, so the hot loop has no index arithmetic
/// (in test and dev builds that arithmetic carries overflow checks that halve the speed).
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn tile512<const RR: usize, const TT: usize>(
    wp: *const f32,
    xp: *const f32,
    k: usize,
    out: *mut f32,
    n: usize,
) {
    let w: [*const f32; RR] = std::array::from_fn(|i| wp.add(i * k));
    let x: [*const f32; TT] = std::array::from_fn(|j| xp.add(j * k));
    let mut acc = [[_mm512_setzero_ps(); TT]; RR];
    let full = k & !15;
    let mut q = 0;
    while q < full {
        let mut xv = [_mm512_setzero_ps(); TT];
        for j in 0..TT {
            xv[j] = _mm512_loadu_ps(x[j].add(q));
        }
        for i in 0..RR {
            let wv = _mm512_loadu_ps(w[i].add(q));
            for j in 0..TT {
                acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
            }
        }
        q = q.wrapping_add(16);
    }
    if q < k {
        let mask: __mmask16 = (1u32 << (k - q)) as u16 - 1;
        let mut xv = [_mm512_setzero_ps(); TT];
        for j in 0..TT {
            xv[j] = _mm512_maskz_loadu_ps(mask, x[j].add(q));
        }
        for i in 0..RR {
            let wv = _mm512_maskz_loadu_ps(mask, w[i].add(q));
            for j in 0..TT {
                acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, a) in row.iter().enumerate() {
            *out.add(j * n + i) = _mm512_reduce_add_ps(*a);
        }
    }
}

/// [`tile512`] with 8-lane AVX2 vectors.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn tile256<const RR: usize, const TT: usize>(
    wp: *const f32,
    xp: *const f32,
    k: usize,
    out: *mut f32,
    n: usize,
) {
    let w: [*const f32; RR] = std::array::from_fn(|i| wp.add(i * k));
    let x: [*const f32; TT] = std::array::from_fn(|j| xp.add(j * k));
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    let full = k & !7;
    let mut q = 0;
    while q < full {
        let mut xv = [_mm256_setzero_ps(); TT];
        for j in 0..TT {
            xv[j] = _mm256_loadu_ps(x[j].add(q));
        }
        for i in 0..RR {
            let wv = _mm256_loadu_ps(w[i].add(q));
            for j in 0..TT {
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
            }
        }
        q = q.wrapping_add(8);
    }
    if q < k {
        let rest = (k - q) as i32;
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(rest),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut xv = [_mm256_setzero_ps(); TT];
        for j in 0..TT {
            xv[j] = _mm256_maskload_ps(x[j].add(q), mask);
        }
        for i in 0..RR {
            let wv = _mm256_maskload_ps(w[i].add(q), mask);
            for j in 0..TT {
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, a) in row.iter().enumerate() {
            *out.add(j * n + i) = hsum256(*a);
        }
    }
}

/// The sum of 8 lanes in a fixed order: halves, then pairs, then the last two.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
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

/// [`crate::dtype::widen_into`] with 8-lane conversions (BF16; F16 and F32 as there).
///
/// # Safety
/// AVX2 required.
#[target_feature(enable = "avx2")]
pub unsafe fn widen_avx2(dtype: DType, src: &[u8], dst: &mut [f32]) {
    if dtype != DType::BF16 {
        return crate::dtype::widen_into(dtype, src, dst);
    }
    let n = dst.len().min(src.len() / 2);
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(sp.add(2 * i) as *const __m128i);
        let f = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
        _mm256_storeu_ps(dp.add(i), f);
        i += 8;
    }
    crate::dtype::widen_into(dtype, &src[2 * i..], &mut dst[i..]);
}

/// Rows per register tile of [`matmul_nn`]; with 4 column vectors that is 24 accumulators.
const NN_ROWS: usize = 6;
/// Column vectors (of 16) per register tile of [`matmul_nn`].
const NN_COLS: usize = 4;

/// `out[m, n] = a[m, k] · b[k, n]` with `b` row-major (each of its rows a contiguous run of `n`
/// values), `n` a multiple of 16. Attention's `P · V` has this shape (V rows per position).
///
/// # Safety
/// AVX-512F required; `a` holds `m` rows of `k` at stride `a_rs`, `b` holds `k · n` values,
/// `out` holds `m` rows of `n` at stride `out_rs`, and `n % 16 == 0`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_nn(
    a: &[f32],
    a_rs: usize,
    m: usize,
    k: usize,
    b: &[f32],
    n: usize,
    out: &mut [f32],
    out_rs: usize,
) {
    debug_assert_eq!(n % 16, 0);
    let (ap, bp, op) = (a.as_ptr(), b.as_ptr(), out.as_mut_ptr());
    let mut c0 = 0;
    while c0 < n {
        let cols = ((n - c0) / 16).min(NN_COLS);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(NN_ROWS);
            let (a0, b0, o0) = (ap.add(r0 * a_rs), bp.add(c0), op.add(r0 * out_rs + c0));
            match (rows, cols) {
                (NN_ROWS, NN_COLS) => nn_tile::<NN_ROWS, NN_COLS>(a0, a_rs, k, b0, n, o0, out_rs),
                (_, NN_COLS) => {
                    for r in 0..rows {
                        nn_tile::<1, NN_COLS>(
                            a0.add(r * a_rs),
                            a_rs,
                            k,
                            b0,
                            n,
                            o0.add(r * out_rs),
                            out_rs,
                        )
                    }
                }
                _ => {
                    for r in 0..rows {
                        for c in 0..cols {
                            nn_tile::<1, 1>(
                                a0.add(r * a_rs),
                                a_rs,
                                k,
                                b0.add(16 * c),
                                n,
                                o0.add(r * out_rs + 16 * c),
                                out_rs,
                            )
                        }
                    }
                }
            }
            r0 += rows;
        }
        c0 += 16 * cols;
    }
}

/// One `RR × (16·CC)` tile of [`matmul_nn`]: broadcast `a[r, j]`, multiply by row `j` of `b`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn nn_tile<const RR: usize, const CC: usize>(
    a: *const f32,
    a_rs: usize,
    k: usize,
    b: *const f32,
    b_rs: usize,
    out: *mut f32,
    out_rs: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); CC]; RR];
    for j in 0..k {
        let mut bv = [_mm512_setzero_ps(); CC];
        for (c, v) in bv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(b.add(j * b_rs + 16 * c));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(r * a_rs + j));
            for (x, bc) in row.iter_mut().zip(&bv) {
                *x = _mm512_fmadd_ps(av, *bc, *x);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, x) in row.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * out_rs + 16 * c), *x);
        }
    }
}

/// [`crate::dtype::widen_into`] with 16-lane conversions (BF16/F16; F32 is a copy).
///
/// # Safety
/// AVX-512F required.
#[target_feature(enable = "avx512f")]
pub unsafe fn widen_fast(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => crate::dtype::widen_into(dtype, src, dst),
        dt => widen_rows(dt, src, dst),
    }
}

/// `e^x` for 16 lanes, Cephes `expf` (range reduction by ln 2, degree-6 polynomial, exponent
/// rebuilt with `scalef`): within ~1 ulp of libm for x in [-87, 88]; smaller inputs give
/// ≈ 1e-38 instead of 0, which is below F32 noise for probabilities that get summed.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.336_54)),
        _mm512_set1_ps(88.376_26),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_scalef_ps(p, n)
}

/// Softmax of one row in place (scaled by `scale` first): max, exp and sum, normalize.
///
/// # Safety
/// AVX-512F required; `row` must hold no NaN and at least one finite value.
#[target_feature(enable = "avx512f")]
pub unsafe fn scaled_softmax(row: &mut [f32], scale: f32) {
    let n = row.len();
    let p = row.as_mut_ptr();
    let tail_mask = |i: usize| -> __mmask16 { ((1u32 << (n - i).min(16)) - 1) as u16 };
    let vscale = _mm512_set1_ps(scale);
    let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < n {
        let m = tail_mask(i);
        let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.add(i)), vscale);
        _mm512_mask_storeu_ps(p.add(i), m, v);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
        i += 16;
    }
    let max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    let mut vsum = _mm512_setzero_ps();
    i = 0;
    while i < n {
        let m = tail_mask(i);
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), max));
        _mm512_mask_storeu_ps(p.add(i), m, e);
        vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
        i += 16;
    }
    let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(vsum));
    i = 0;
    while i < n {
        let m = tail_mask(i);
        let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.add(i)), inv);
        _mm512_mask_storeu_ps(p.add(i), m, v);
        i += 16;
    }
}
