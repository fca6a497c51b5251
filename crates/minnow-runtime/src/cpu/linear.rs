//! `y = x · Wᵀ` with `W` in its stored type, and plain strided F32 products.
//!
//! [`linear`] is batch-invariant by construction: every output element `y[t, j]` is one dot
//! product of row `t` of `x` with row `j` of `W`, computed in an order that depends only on `k`
//! and the host's instruction set: `L` lane-partial sums (lane `l` takes the indices `q ≡ l
//! (mod L)` in ascending order, one multiply-add each), then a fixed reduction tree over the
//! lanes. How many rows `x` has, how the work is tiled and how many threads run it never change
//! that order, so a row's result is bit-identical alone or among any other rows (a token's expert
//! product does not depend on how many other tokens chose the expert, a segment's projections do
//! not depend on the batch around it). One kernel family serves every `m`; the register tile and
//! the lane width are chosen per host once (AVX-512, AVX2 with FMA, or portable Rust).
//!
//! Work is split into tasks of [`W_BLOCK_ROWS`] weight rows × [`X_BLOCK_ROWS`] input rows: a
//! task widens its weight rows once into a per-thread buffer (BF16/F16 → F32; aligned F32
//! weights are read in place) and sweeps its input rows over them in register tiles, so the
//! weights stay in L1/L2 while the input block streams from L2.

use std::cell::RefCell;

use rayon::prelude::*;

use super::dot_block::DotBlock;
use crate::dtype::{widen_into, MatRef};

/// Widens stored weights to F32 with the fastest conversion the CPU has.
pub fn widen(dtype: crate::dtype::DType, src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx512() {
        // SAFETY: AVX-512F presence checked.
        unsafe { super::x86::widen_fast(dtype, src, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: AVX2 presence checked.
        unsafe { super::x86::widen_avx2(dtype, src, dst) };
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

/// Weight rows per task: 64 × 2048 F32 = 512 KiB of widened weights, L2-resident.
const W_BLOCK_ROWS: usize = 64;
/// Input rows per task: 64 × 2048 F32 = 512 KiB, swept over the task's weight rows.
const X_BLOCK_ROWS: usize = 64;

/// The dot-product kernel this host runs: one per process, so every product on the host uses
/// the same arithmetic (the lane width and reduction tree are part of the result's bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Portable,
}

fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if super::x86::has_avx512() {
            return Kernel::Avx512;
        }
        if super::x86::has_avx2_fma() {
            return Kernel::Avx2Fma;
        }
    }
    Kernel::Portable
}

/// The name of the kernels this process runs (`avx512`, `avx2`, `portable`), for logs and the
/// runner's device name.
pub fn kernel_name() -> &'static str {
    match kernel() {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2Fma => "avx2",
        Kernel::Portable => "portable",
    }
}

thread_local! {
    /// Widened weight rows of the task a thread is running (reused between tasks).
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A weight matrix `[n, k]` that [`linear_rows`] reads one block of rows at a time, as F32.
/// Stored floats ([`MatRef`]) widen their rows; quantized matrices dequantize them. Rows
/// must come out exactly the same whatever block they are read in, which keeps the product
/// batch-invariant.
pub trait WeightRows: Sync {
    /// `(n, k)`: rows (outputs) and columns (the reduced dimension).
    fn shape(&self) -> (usize, usize);
    /// Rows `r0..r1` in place, when they are stored as aligned F32.
    fn f32_rows(&self, _r0: usize, _r1: usize) -> Option<&[f32]> {
        None
    }
    /// Rows `r0..r1` as F32 into `dst` (`(r1 - r0) · k` values).
    fn widen_rows(&self, r0: usize, r1: usize, dst: &mut [f32]);
}

impl WeightRows for MatRef<'_> {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    fn f32_rows(&self, r0: usize, r1: usize) -> Option<&[f32]> {
        self.rows_range(r0, r1).as_f32()
    }
    fn widen_rows(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        widen(self.dtype, self.row_bytes(r0, r1), dst)
    }
}

/// `out[m, n] = x[m, k] · W[n, k]ᵀ` (row-major, `out` overwritten). Batch-invariant: row `t` of
/// `out` depends only on row `t` of `x` and `W` (see the module docs).
pub fn linear(x: &[f32], m: usize, w: MatRef<'_>, out: &mut [f32], par: Par) {
    linear_rows(x, m, &w, out, par)
}

/// [`linear`] for any [`WeightRows`].
pub fn linear_rows<W: WeightRows + ?Sized>(x: &[f32], m: usize, w: &W, out: &mut [f32], par: Par) {
    let (n, k) = w.shape();
    assert_eq!(x.len(), m * k, "linear: input is not [m, k]");
    assert_eq!(out.len(), m * n, "linear: output is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let kernel = kernel();
    let out_ptr = SendPtr(out.as_mut_ptr());
    let w_blocks = n.div_ceil(W_BLOCK_ROWS);
    let x_blocks = m.div_ceil(X_BLOCK_ROWS);
    let task = |i: usize| {
        let (wb, xb) = (i / x_blocks, i % x_blocks);
        let (r0, r1) = (wb * W_BLOCK_ROWS, ((wb + 1) * W_BLOCK_ROWS).min(n));
        let (t0, t1) = (xb * X_BLOCK_ROWS, ((xb + 1) * X_BLOCK_ROWS).min(m));
        WIDENED.with_borrow_mut(|buf| {
            let len = (r1 - r0) * k;
            let wf: &[f32] = match w.f32_rows(r0, r1) {
                Some(f) => f,
                None => {
                    buf.resize(len, 0.0);
                    w.widen_rows(r0, r1, &mut buf[..len]);
                    &buf[..len]
                }
            };
            let block = DotBlock {
                w: wf.as_ptr(),
                w_rows: r1 - r0,
                x: x[t0 * k..t1 * k].as_ptr(),
                x_rows: t1 - t0,
                k,
                // SAFETY: (t0, r0) is inside the [m, n] output.
                out: unsafe { out_ptr.get().add(t0 * n + r0) },
                out_stride: n,
            };
            // SAFETY: the block's pointers cover the slices above; each task writes the
            // disjoint output rectangle rows t0..t1 × columns r0..r1.
            unsafe { block.run(kernel) }
        })
    };
    let tasks = w_blocks * x_blocks;
    match par {
        Par::Seq => (0..tasks).for_each(task),
        Par::Rayon => (0..tasks).into_par_iter().for_each(task),
    }
}

impl DotBlock {
    /// # Safety
    /// The pointers must cover the shapes described on [`DotBlock`], and no other thread may
    /// touch the output rectangle.
    unsafe fn run(&self, kernel: Kernel) {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => super::x86::dot_block_avx512(self),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Fma => super::x86::dot_block_avx2(self),
            Kernel::Portable => dot_block_portable(self),
        }
    }
}

/// Lanes of the portable kernel's partial sums.
const PORTABLE_LANES: usize = 8;

/// The portable kernel: [`PORTABLE_LANES`] partial sums per output, one output at a time (the
/// compiler vectorizes the lane loop). Multiply and add are separate operations unless the
/// target has FMA at compile time, so the result does not depend on a libm `fmaf`.
unsafe fn dot_block_portable(b: &DotBlock) {
    let k = b.k;
    for t in 0..b.x_rows {
        let x = std::slice::from_raw_parts(b.x.add(t * k), k);
        for j in 0..b.w_rows {
            let w = std::slice::from_raw_parts(b.w.add(j * k), k);
            *b.out.add(t * b.out_stride + j) = dot_portable(x, w);
        }
    }
}

#[inline]
fn dot_portable(x: &[f32], w: &[f32]) -> f32 {
    const L: usize = PORTABLE_LANES;
    let mut acc = [0.0f32; L];
    let full = x.len() / L * L;
    for (xc, wc) in x[..full].chunks_exact(L).zip(w[..full].chunks_exact(L)) {
        for l in 0..L {
            acc[l] = madd(xc[l], wc[l], acc[l]);
        }
    }
    for (l, (a, b)) in x[full..].iter().zip(&w[full..]).enumerate() {
        acc[l] = madd(*a, *b, acc[l]);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(target_feature = "fma") {
        a.mul_add(b, c)
    } else {
        a * b + c
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
/// else one output row at a time (`matmul_nn_rows`); either way each output is a sequential
/// sum over `k`, whatever `m` (batch-invariant).
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
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: AVX2 and FMA checked; bounds asserted above.
        unsafe { matmul_nn_fma(m, n, k, a, a_rs, b, out, out_rs) };
        return;
    }
    matmul_nn_rows::<false>(m, n, k, a, a_rs, b, out, out_rs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_nn_fma(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    b: &[f32],
    out: &mut [f32],
    out_rs: usize,
) {
    matmul_nn_rows::<true>(m, n, k, a, a_rs, b, out, out_rs)
}

/// [`matmul_nn`] one output row at a time: each output is a sequential sum over `j` (as in the
/// AVX-512 kernel), so a row's result does not depend on how many rows or keys are around it
/// (masked keys add exact zeros). The compiler vectorizes the column loop; `FUSED` uses
/// multiply-add where the caller enabled FMA.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn matmul_nn_rows<const FUSED: bool>(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    b: &[f32],
    out: &mut [f32],
    out_rs: usize,
) {
    for r in 0..m {
        let row = &mut out[r * out_rs..r * out_rs + n];
        row.fill(0.0);
        for (j, brow) in b.chunks_exact(n).take(k).enumerate() {
            let av = a[r * a_rs + j];
            for (o, bv) in row.iter_mut().zip(brow) {
                *o = if FUSED {
                    av.mul_add(*bv, *o)
                } else {
                    madd(av, *bv, *o)
                };
            }
        }
    }
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

    /// The property the forward's batch invariance rests on: row `t`'s output is bit-identical
    /// whatever rows surround it, for every `m` (tile edges, several input blocks), stored type
    /// and parallelism mode.
    #[test]
    fn a_rows_output_is_bit_identical_whatever_rows_surround_it() {
        let (n, k) = (70, 37);
        let probe = pseudo(k, 11);
        for dt in [DType::F32, DType::BF16] {
            let wv = pseudo(n * k, 12);
            let bytes: Vec<u8> = match dt {
                DType::F32 => wv.iter().flat_map(|v| v.to_le_bytes()).collect(),
                _ => wv
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            };
            let w = MatRef::new(dt, n, k, &bytes).unwrap();
            let mut alone = vec![0.0; n];
            linear(&probe, 1, w, &mut alone, Par::Seq);
            for m in [2, 3, 4, 5, 9, 16, 17, 63, 64, 65, 130] {
                for pos in [0, m / 2, m - 1] {
                    let mut x = pseudo(m * k, m as u32);
                    x[pos * k..(pos + 1) * k].copy_from_slice(&probe);
                    for par in [Par::Seq, Par::Rayon] {
                        let mut out = vec![f32::NAN; m * n];
                        linear(&x, m, w, &mut out, par);
                        let got = &out[pos * n..(pos + 1) * n];
                        let differ = got
                            .iter()
                            .zip(&alone)
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                        assert_eq!(
                            differ, 0,
                            "{dt} m={m} row {pos} {par:?}: {differ} of {n} differ"
                        );
                    }
                }
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
