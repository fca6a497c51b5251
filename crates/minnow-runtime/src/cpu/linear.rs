//! `y = x · Wᵀ` with `W` in its stored type, and plain strided F32 products.
//!
//! Two regimes, chosen by the number of input rows `m`:
//! - few rows (denoising a 32-token block, routed experts with a handful of tokens): the product
//!   is bound by reading `W` from memory, so register-tiled kernels read BF16/F16/F32 rows
//!   directly and widen them on the fly (x86-64 with AVX-512; elsewhere the second regime):
//!   outer products when `m` is a multiple of 16, dot products otherwise;
//! - many rows (prefill, full forwards): compute-bound, so `W` is widened in row panels of
//!   [`PANEL_ROWS`] into a scratch buffer and multiplied with the `gemm` crate, whose packing
//!   and micro-kernels run near peak. The widening cost is amortized over `m` rows.
//!
//! Every output element is computed by exactly one thread in a fixed order, so results do not
//! depend on the thread count.

use rayon::prelude::*;

use crate::dtype::{widen_into, MatRef};

/// Widens stored weights to F32 with the fastest conversion the CPU has.
pub fn widen(dtype: crate::DType, src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx512() {
        // SAFETY: AVX-512F presence checked.
        unsafe { super::x86::widen_fast(dtype, src, dst) };
        return;
    }
    widen_into(dtype, src, dst)
}

/// Whether an operator may split its work across the rayon pool. Work that is already running
/// inside a parallel loop (one routed expert among many) uses `Seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Par {
    Seq,
    Rayon,
}

/// Weight rows per panel in the many-rows regime: 1024 × 2048 F32 = 8 MiB, which stays in L3
/// while `gemm` sweeps all input rows over it.
const PANEL_ROWS: usize = 1024;
/// Weight rows per parallel task in the few-rows regime.
const SMALL_TASK_ROWS: usize = 64;
/// Same for the outer-product kernel (a multiple of its 16/12/8/6-row register tiles).
const BCAST_TASK_ROWS: usize = 48;
/// Largest `m` handled by the direct kernel; above it `gemm` wins. Measured on Zen 5 with
/// `[512, 2048]` BF16 weights: direct ≈ 95–115 GFLOP/s for m = 32..256, `gemm` (panel widening
/// included) 25 / 46 / 66 / 101 GFLOP/s for m = 32 / 64 / 128 / 256.
const SMALL_M_MAX: usize = 192;

/// `out[m, n] = x[m, k] · W[n, k]ᵀ` (row-major, `out` overwritten).
pub fn linear(x: &[f32], m: usize, w: MatRef<'_>, out: &mut [f32], par: Par) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), m * k, "linear: input is not [m, k]");
    assert_eq!(out.len(), m * n, "linear: output is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if m <= SMALL_M_MAX && m.is_multiple_of(16) && super::x86::has_avx512() {
        let packed = super::x86::PackedRows::new(x, m, k);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let task = |r0: usize| {
            let r1 = (r0 + BCAST_TASK_ROWS).min(n);
            // SAFETY: AVX-512 presence was checked; each task writes columns r0..r1 only.
            unsafe { super::x86::linear_bcast(&packed, w, r0, r1, out_ptr.get(), n) }
        };
        match par {
            Par::Seq => (0..n).step_by(BCAST_TASK_ROWS).for_each(task),
            Par::Rayon => (0..n.div_ceil(BCAST_TASK_ROWS))
                .into_par_iter()
                .for_each(|t| task(t * BCAST_TASK_ROWS)),
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if m <= SMALL_M_MAX && super::x86::has_avx512() {
        let out_ptr = SendPtr(out.as_mut_ptr());
        let task = |r0: usize| {
            let r1 = (r0 + SMALL_TASK_ROWS).min(n);
            // SAFETY: AVX-512 presence was checked; each task writes columns r0..r1 only.
            unsafe { super::x86::linear_small_m(x, m, w, r0, r1, out_ptr.get(), n) }
        };
        match par {
            Par::Seq => (0..n).step_by(SMALL_TASK_ROWS).for_each(task),
            Par::Rayon => (0..n.div_ceil(SMALL_TASK_ROWS))
                .into_par_iter()
                .for_each(|t| task(t * SMALL_TASK_ROWS)),
        }
        return;
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    let panel = |p0: usize| {
        let p1 = (p0 + PANEL_ROWS).min(n);
        let rows = w.rows_range(p0, p1);
        let mut scratch = Vec::new();
        let wf: &[f32] = match rows.as_f32() {
            Some(f) => f,
            None => {
                scratch.resize(rows.rows * k, 0.0);
                widen(rows.dtype, rows.data, &mut scratch);
                &scratch
            }
        };
        // SAFETY: the panel writes columns p0..p1 of `out`, disjoint between panels; all
        // strides describe buffers whose sizes were checked above.
        unsafe {
            // Computed as outᵀ = W · xᵀ: the panel is the left operand, which `gemm` packs
            // once per panel (measured ~3% faster than x · Wᵀ on the lm_head).
            gemm_raw(
                p1 - p0,
                m,
                k,
                out_ptr.get().add(p0),
                1,
                n as isize,
                wf.as_ptr(),
                k as isize,
                1,
                x.as_ptr(),
                1,
                k as isize,
                gemm::Parallelism::None,
            )
        }
    };
    let panels = n.div_ceil(PANEL_ROWS);
    match par {
        Par::Seq => (0..panels).for_each(|p| panel(p * PANEL_ROWS)),
        // With a single panel, let gemm split the rows itself.
        Par::Rayon if panels == 1 => {
            let wf_owned;
            let wf: &[f32] = match w.as_f32() {
                Some(f) => f,
                None => {
                    let mut v = vec![0.0; n * k];
                    widen(w.dtype, w.data, &mut v);
                    wf_owned = v;
                    &wf_owned
                }
            };
            // SAFETY: shapes checked above.
            unsafe {
                gemm_raw(
                    m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                    x.as_ptr(),
                    k as isize,
                    1,
                    wf.as_ptr(),
                    1,
                    k as isize,
                    gemm::Parallelism::Rayon(rayon::current_num_threads()),
                )
            }
        }
        Par::Rayon => (0..panels)
            .into_par_iter()
            .for_each(|p| panel(p * PANEL_ROWS)),
    }
}

/// `c[m, n] = a[m, k] · b[k, n]` for F32 operands given by row and column strides (in elements).
/// Used by attention, where K and V are read in place from the cache.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    c_rs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(
        k == 0 || last(m, k, a_rs, a_cs) < a.len(),
        "matmul: a too short"
    );
    assert!(
        k == 0 || last(k, n, b_rs, b_cs) < b.len(),
        "matmul: b too short"
    );
    assert!(last(m, n, c_rs, 1) < c.len(), "matmul: c too short");
    if k == 0 {
        for r in 0..m {
            c[r * c_rs..r * c_rs + n].fill(0.0);
        }
        return;
    }
    // SAFETY: every index touched was bounds-checked by the asserts above.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            c.as_mut_ptr(),
            c_rs as isize,
            1,
            a.as_ptr(),
            a_rs as isize,
            a_cs as isize,
            b.as_ptr(),
            b_rs as isize,
            b_cs as isize,
            gemm::Parallelism::None,
        )
    }
}

/// `out[m, n] = a[m, k] · b[k, n]` with `b` contiguous row-major and `a`/`out` rows at strides
/// `a_rs`/`out_rs`: attention's `P · V`. A register-tiled AVX-512 kernel when `n % 16 == 0`,
/// else `gemm`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_nn(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    b: &[f32],
    out: &mut [f32],
    out_rs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        k == 0 || (m - 1) * a_rs + k <= a.len(),
        "matmul_nn: a too short"
    );
    assert!(k * n <= b.len(), "matmul_nn: b too short");
    assert!(
        (m - 1) * out_rs + n <= out.len(),
        "matmul_nn: out too short"
    );
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(16) && super::x86::has_avx512() {
        // SAFETY: AVX-512F checked; bounds asserted above.
        unsafe { super::x86::matmul_nn(a, a_rs, m, k, b, n, out, out_rs) };
        return;
    }
    matmul(m, n, k, a, a_rs, 1, b, n, 1, out, out_rs)
}

/// `dst = lhs · rhs` through `gemm`, strides as (row stride, column stride).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: isize,
    dst_cs: isize,
    lhs: *const f32,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs: *const f32,
    rhs_rs: isize,
    rhs_cs: isize,
    par: gemm::Parallelism,
) {
    gemm::gemm(
        m, n, k, dst, dst_cs, dst_rs, false, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 0.0, 1.0,
        false, false, false, par,
    );
}

/// A raw output pointer shared by tasks that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used for disjoint writes, see the call sites.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Both regimes, all stored types, odd shapes (tails in every dimension), both
    /// parallelism modes.
    #[test]
    fn linear_matches_f64_reference() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 70, 37),
            (5, 1100, 48),
            (60, 130, 33),
            (49, 5, 64),
        ] {
            let x = pseudo(m * k, 1);
            let wv: Vec<f32> = pseudo(n * k, 2)
                .into_iter()
                .map(|v| half::bf16::from_f32(v).to_f32())
                .collect();
            let want = reference(&x, m, &wv, n, k);
            let bf: Vec<u8> = wv
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
            let f16: Vec<u8> = wv
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect();
            for (dt, bytes) in [(DType::BF16, bf), (DType::F16, f16)] {
                let w = MatRef::new(dt, n, k, &bytes).unwrap();
                for par in [Par::Seq, Par::Rayon] {
                    let mut out = vec![f32::NAN; m * n];
                    linear(&x, m, w, &mut out, par);
                    let tol = if dt == DType::F16 { 5e-3 } else { 1e-4 };
                    for (g, e) in out.iter().zip(&want) {
                        assert!((g - e).abs() <= tol, "{dt} m{m} n{n} k{k}: {g} vs {e}");
                    }
                }
            }
            let mut out = vec![0.0; m * n];
            linear(&x, m, MatRef::from_f32(n, k, &wv), &mut out, Par::Rayon);
            for (g, e) in out.iter().zip(&want) {
                assert!((g - e).abs() <= 1e-4);
            }
            // F32 weights at an odd byte offset, as in a file whose header is not padded.
            let mut shifted = vec![0u8];
            shifted.extend(wv.iter().flat_map(|v| v.to_le_bytes()));
            let w = MatRef::new(DType::F32, n, k, &shifted[1..]).unwrap();
            let mut out = vec![0.0; m * n];
            linear(&x, m, w, &mut out, Par::Seq);
            for (g, e) in out.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4,
                    "unaligned F32 m{m} n{n} k{k}: {g} vs {e}"
                );
            }
        }
    }

    #[test]
    fn matmul_nn_matches_reference() {
        for &(m, n, k) in &[
            (1, 16, 1),
            (7, 48, 33),
            (13, 128, 70),
            (6, 80, 5),
            (3, 20, 9),
        ] {
            let a = pseudo(m * (k + 3), 5);
            let b = pseudo(k * n, 6);
            // Reference with b given as [n, k] (transposed copy).
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let a_dense: Vec<f32> = (0..m * k).map(|i| a[(i / k) * (k + 3) + i % k]).collect();
            let want = reference(&a_dense, m, &bt, n, k);
            let mut out = vec![f32::NAN; m * (n + 1)];
            matmul_nn(m, n, k, &a, k + 3, &b, &mut out, n + 1);
            for r in 0..m {
                for c in 0..n {
                    let (g, e) = (out[r * (n + 1) + c], want[r * n + c]);
                    assert!((g - e).abs() < 1e-4, "m{m} n{n} k{k} [{r},{c}]: {g} vs {e}");
                }
            }
        }
    }

    #[test]
    fn matmul_with_transposed_operand() {
        // c = a · bᵀ where b is stored [n, k] row-major.
        let (m, n, k) = (4, 6, 5);
        let a = pseudo(m * k, 3);
        let b = pseudo(n * k, 4);
        let mut c = vec![0.0; m * n];
        matmul(m, n, k, &a, k, 1, &b, 1, k, &mut c, n);
        for (g, e) in c.iter().zip(reference(&a, m, &b, n, k)) {
            assert!((g - e).abs() < 1e-5);
        }
    }
}
