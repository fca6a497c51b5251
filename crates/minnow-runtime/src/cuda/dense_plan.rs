//! The launch of a pinned cuBLASLt GEMM on a device's stream, and the planning of a model's
//! dense GEMMs: which of minnow's kernel and cuBLASLt's one-pass algorithms runs each row bucket
//! (`blaslt.rs` holds the handle and the plans; this module needs the device and the kernels,
//! which the handle must not, as the device owns it).

use std::ffi::c_void;

use cudarc::cublaslt::{result, sys};

use super::blaslt::{BlasLt, LtAlgo, ROW_BUCKETS, WORKSPACE_BYTES};
use super::error::{Context, CudaResult};
use super::gpu::Gpu;
use super::ops;

impl BlasLt {
    /// `Y[m, n] = X[m, k] · W[n, k]ᵀ` (BF16, row pitches k, k and n) with exactly `algo`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        gpu: &Gpu,
        algo: &LtAlgo,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
    ) -> CudaResult<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let problem = self.problem(m, n, k)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's buffers hold the stated shapes; host scalars; a workspace of
        // WORKSPACE_BYTES on the device.
        unsafe {
            result::matmul(
                self.handle,
                problem.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                problem.w,
                x as *const c_void,
                problem.x,
                y as *const c_void,
                problem.y,
                y as *mut c_void,
                problem.y,
                &algo.raw,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE_BYTES,
                gpu.stream() as sys::cudaStream_t,
            )
        }
        .ctx(|| format!("cuBLASLt GEMM {m}x{n}x{k} with {:?}", algo.config))
    }
}

/// One dense GEMM shape of a model: `n` outputs over `k` inputs, with its weights at `w`.
#[derive(Clone, Copy, Debug)]
pub struct DenseShape {
    pub name: &'static str,
    pub n: usize,
    pub k: usize,
    pub w: u64,
}

/// Largest output a planning probe may allocate; buckets past it keep minnow's own kernel.
const PROBE_BYTES: usize = 1 << 30;
/// Bytes written between timed runs to evict the weights from L2 (H100/H200: 50 MB).
const L2_FLUSH_BYTES: usize = 256 << 20;
/// Rows compared at each end of a probe's output.
const COMPARED_ROWS: usize = 64;

/// Plans the dense GEMMs of `shapes` for every row bucket up to `max_rows`: for each bucket the
/// fastest of minnow's own kernel and the first few cuBLASLt algorithms (`Tuning::lt_candidates`)
/// that sum K in one pass, keeping a cuBLASLt algorithm only when its output on a random probe
/// of the bucket's height is bit-identical to minnow's kernel (so a row's bits never depend on
/// which one ran). Returns one line per shape for the load log, naming each bucket's tile. Must
/// run outside graph capture (it synchronizes).
pub fn plan_dense_gemms(
    gpu: &Gpu,
    shapes: &[DenseShape],
    max_rows: usize,
) -> CudaResult<Vec<String>> {
    let Some(lt) = gpu.blas_lt() else {
        return Ok(vec![
            "cuBLASLt unavailable: dense GEMMs use minnow's kernels".into(),
        ]);
    };
    let buckets: Vec<usize> = ROW_BUCKETS
        .iter()
        .copied()
        .take_while(|&b| b < max_rows.max(1) * 2)
        .collect();
    let candidates = super::tuning::tuning().lt_candidates;
    let mut report = Vec::new();
    let l2_flush = gpu.alloc::<half::bf16>(L2_FLUSH_BYTES / 2)?;
    for shape in shapes {
        let (n, k) = (shape.n, shape.k);
        let max_bucket = buckets
            .iter()
            .copied()
            .filter(|&b| b * n * 2 <= PROBE_BYTES)
            .max()
            .unwrap_or(0);
        if max_bucket == 0 {
            continue;
        }
        let x = gpu.alloc::<half::bf16>(max_bucket * k)?;
        ops::fill_random_bf16(gpu, x.ptr(), max_bucket * k, 0x5eed, 1.0)?;
        let y = gpu.alloc::<half::bf16>(max_bucket * n)?;
        let timer = gpu.timer()?;
        // Each timed call starts with the weights out of L2, as in a forward, where every
        // layer's weights were evicted by the layers since. Timed warm, a small GEMM's weights
        // (QKV 12.6 MB, O 8.4 MB at mini's shapes) sit in L2, which favours a kernel that keeps
        // too few reads in flight to stream them from memory: that kernel won the plan of a
        // denoising step's 32 rows and then took twice cuBLASLt's time in the forward.
        let time = |f: &dyn Fn() -> CudaResult<()>| -> CudaResult<f32> {
            f()?;
            let mut total = 0.0;
            for rep in 0..3 {
                ops::fill_random_bf16(gpu, l2_flush.ptr(), l2_flush.len(), rep, 1.0)?;
                timer.start()?;
                f()?;
                total += timer.stop_ms()?;
            }
            Ok(total / 3.0)
        };
        let ends = |m: usize| -> CudaResult<Vec<u16>> {
            let rows = m.min(COMPARED_ROWS);
            let mut out = vec![0u16; 2 * rows * n];
            let (head, tail) = out.split_at_mut(rows * n);
            gpu.read_raw(y.ptr(), true, head)?;
            gpu.read_raw(y.ptr() + ((m - rows) * n * 2) as u64, true, tail)?;
            Ok(out)
        };
        let mut plans = Vec::new();
        let mut summary = Vec::new();
        for &m in &buckets {
            if m > max_bucket {
                break;
            }
            let own_ms = time(&|| ops::own_dense_gemm(gpu, x.ptr(), shape.w, y.ptr(), m, n, k))?;
            let want = ends(m)?;
            let mut best: (f32, Option<LtAlgo>) = (own_ms, None);
            for algo in lt.candidates(m, n, k, candidates)? {
                if !algo.config.sums_k_in_one_pass() {
                    continue;
                }
                ops::fill_random_bf16(gpu, y.ptr(), m * n, m as u64, 1.0)?;
                lt.gemm_bf16(gpu, &algo, x.ptr(), shape.w, y.ptr(), m, n, k)?;
                if ends(m)? != want {
                    tracing::warn!(
                        "cuBLASLt {:?} sums {} ({n}x{k}) in another order at {m} rows; not used",
                        algo.config,
                        shape.name
                    );
                    continue;
                }
                let ms = time(&|| lt.gemm_bf16(gpu, &algo, x.ptr(), shape.w, y.ptr(), m, n, k))?;
                if ms < best.0 * 0.97 {
                    best = (ms, Some(algo));
                }
            }
            summary.push(match &best.1 {
                Some(algo) => format!("{m}:lt(tile {})", algo.config.tile),
                None => format!("{m}:own"),
            });
            plans.push(best.1);
        }
        lt.set_plans(n, k, plans);
        report.push(format!("{} {n}x{k}: {}", shape.name, summary.join(" ")));
    }
    Ok(report)
}
