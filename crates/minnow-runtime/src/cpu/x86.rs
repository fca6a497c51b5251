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

/// Whether the AVX-512 kernels may run: the CPU has AVX-512F and `MINNOW_CPU_PORTABLE` is not
/// set. The variable forces the portable path (the `gemm` crate and plain loops) that CPUs
/// without AVX-512 take, so that path can be tested, and compared, on any machine.
pub fn has_avx512() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        std::env::var_os("MINNOW_CPU_PORTABLE").is_none() && is_x86_feature_detected!("avx512f")
    })
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

/// Input rows packed for [`linear_bcast`]: `x` transposed in groups of 16 rows,
/// `packed[(v · k + q) · 16 + l] = x[16v + l, q]` (zero past `m`).
pub struct PackedRows {
    pub m: usize,
    pub k: usize,
    data: Vec<f32>,
}

impl PackedRows {
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        let groups = m.div_ceil(16);
        let mut data = vec![0.0f32; groups * k * 16];
        for t in 0..m {
            let (v, l) = (t / 16, t % 16);
            let base = v * k * 16 + l;
            for (q, &val) in x[t * k..(t + 1) * k].iter().enumerate() {
                data[base + q * 16] = val;
            }
        }
        PackedRows { m, k, data }
    }
}

/// Columns `r0..r1` of `out[m, n] = x · Wᵀ` as outer products: each weight value is broadcast
/// and multiplied with 16 input rows at once, so there are no horizontal reductions. Used when
/// `m` is a multiple of 16 (no idle lanes): ~10–15% faster than [`linear_small_m`] for the
/// 32-row lm_head of a denoising step and the 128-row attention score products.
///
/// # Safety
/// AVX-512F required; `out` is `[m, n]` row-major and no other thread writes its columns
/// `r0..r1`; `x` was packed from `m` rows of `w.cols` values; `r1 <= w.rows == n`.
#[target_feature(enable = "avx512f")]
pub unsafe fn linear_bcast(
    x: &PackedRows,
    w: MatRef<'_>,
    r0: usize,
    r1: usize,
    out: *mut f32,
    n: usize,
) {
    let k = w.cols;
    assert_eq!(
        x.k, k,
        "linear_bcast: packed rows do not match the weight width"
    );
    let groups = x.m.div_ceil(16);
    // At most 4 row groups (64 rows) per pass keeps ≤ 24 accumulators.
    let mut v0 = 0;
    let mut wbuf = vec![0.0f32; 16 * k];
    while v0 < groups {
        let mv = (groups - v0).min(4);
        let rr = match mv {
            1 => 16,
            2 => 12,
            3 => 8,
            _ => 6,
        };
        let xp = x.data.as_ptr().add(v0 * k * 16);
        let mut r = r0;
        while r < r1 {
            let rows = rr.min(r1 - r);
            let wp: *const f32 = match w.dtype {
                DType::F32 => w.row_bytes(r, r + rows).as_ptr() as *const f32,
                dt => {
                    widen_rows(dt, w.row_bytes(r, r + rows), &mut wbuf[..rows * k]);
                    wbuf.as_ptr()
                }
            };
            let mut acc = [[0.0f32; 64]; 16];
            match (mv, rows) {
                (1, 16) => bcast_tile::<16, 1>(xp, wp, k, &mut acc),
                (2, 12) => bcast_tile::<12, 2>(xp, wp, k, &mut acc),
                (3, 8) => bcast_tile::<8, 3>(xp, wp, k, &mut acc),
                (4, 6) => bcast_tile::<6, 4>(xp, wp, k, &mut acc),
                (1, _) => {
                    (0..rows).for_each(|j| bcast_tile::<1, 1>(xp, wp.add(j * k), k, &mut acc[j..]))
                }
                (2, _) => {
                    (0..rows).for_each(|j| bcast_tile::<1, 2>(xp, wp.add(j * k), k, &mut acc[j..]))
                }
                (3, _) => {
                    (0..rows).for_each(|j| bcast_tile::<1, 3>(xp, wp.add(j * k), k, &mut acc[j..]))
                }
                _ => {
                    (0..rows).for_each(|j| bcast_tile::<1, 4>(xp, wp.add(j * k), k, &mut acc[j..]))
                }
            }
            let t_end = (x.m - v0 * 16).min(mv * 16);
            for (j, row) in acc.iter().enumerate().take(rows) {
                for (t, &val) in row.iter().enumerate().take(t_end) {
                    *out.add((v0 * 16 + t) * n + r + j) = val;
                }
            }
            r += rows;
        }
        v0 += mv;
    }
}

/// `acc[j][16v + l] = Σ_q w[j, q] · packed[v][q][l]` for an `RR × (16·MV)` tile.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn bcast_tile<const RR: usize, const MV: usize>(
    xp: *const f32,
    wp: *const f32,
    k: usize,
    acc_out: &mut [[f32; 64]],
) {
    let mut acc = [[_mm512_setzero_ps(); MV]; RR];
    for q in 0..k {
        let mut xv = [_mm512_setzero_ps(); MV];
        for (v, slot) in xv.iter_mut().enumerate() {
            *slot = _mm512_loadu_ps(xp.add((v * k + q) * 16));
        }
        for (j, row) in acc.iter_mut().enumerate() {
            // Unaligned read: F32 weights are read in place from the file, at any byte offset.
            let b = _mm512_set1_ps(std::ptr::read_unaligned(wp.add(j * k + q)));
            for (a, xs) in row.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(b, *xs, *a);
            }
        }
    }
    for (j, row) in acc.iter().enumerate() {
        for (v, a) in row.iter().enumerate() {
            _mm512_storeu_ps(acc_out[j].as_mut_ptr().add(16 * v), *a);
        }
    }
}
