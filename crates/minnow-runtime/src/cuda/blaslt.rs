//! cuBLASLt BF16 GEMMs run with an algorithm the caller pins, in the model's row-major
//! convention `Y[M, N] = X[M, K] · W[N, K]ᵀ` (F32 accumulation, BF16 output).
//!
//! Plain cuBLAS picks its algorithm, and with it the order in which an output's products are
//! summed, from the row count, so a row's bits would change with the batch around it. cuBLASLt
//! lets the caller list the candidate algorithms of a shape, read each one's configuration
//! (tile, split-K, reduction scheme) and run exactly one of them, which is what a batch-invariant
//! dense GEMM needs: an algorithm that never splits K sums every output in one fixed order
//! whatever M is (`tests/cuda_blaslt.rs` checks the bits on the GPU).

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, RwLock};

use cudarc::cublaslt::{result, sys};

use super::buffer::DeviceBuffer;
use super::context::GpuContext;
use super::error::{Context, CudaError, CudaResult};

/// Workspace given to cuBLASLt up front so it never allocates during graph capture; algorithms
/// that want more are not offered.
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

pub struct BlasLt {
    pub(super) handle: sys::cublasLtHandle_t,
    pub(super) workspace: DeviceBuffer<u8>,
    /// Dense GEMM plans by (n, k): for each of [`ROW_BUCKETS`], the cuBLASLt algorithm to run,
    /// or `None` for minnow's own kernel (see `ops::plan_dense_gemms`).
    plans: RwLock<HashMap<(usize, usize), BucketPlans>>,
    /// Descriptors by (m, n, k), kept so a forward does not create and free three per GEMM
    /// (cleared when it grows past [`MAX_CACHED_PROBLEMS`]).
    problems: Mutex<HashMap<(usize, usize, usize), Arc<Problem>>>,
}

const MAX_CACHED_PROBLEMS: usize = 4096;

/// One plan per row bucket, from the first: a cuBLASLt algorithm or `None` (minnow's kernel).
type BucketPlans = Vec<Option<LtAlgo>>;

/// Row counts a dense GEMM is planned for: a call of `m` rows runs the plan of the smallest
/// bucket that holds `m` (and minnow's own kernel past the last planned one).
pub const ROW_BUCKETS: [usize; 10] = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

// SAFETY: used only with the owning Gpu's context bound and on its stream.
unsafe impl Send for BlasLt {}
unsafe impl Sync for BlasLt {}

/// The configuration of one cuBLASLt algorithm, as cuBLASLt reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AlgoConfig {
    pub id: i32,
    pub tile: u32,
    pub split_k: u32,
    pub reduction: u32,
    pub swizzle: u32,
    pub custom: u32,
    pub stages: u32,
    pub inner_shape: u16,
    pub cluster_shape: u16,
}

impl AlgoConfig {
    /// True when every output is summed by one CTA over the whole of K (no split-K and no
    /// reduction between partial sums), so its summation order cannot depend on M.
    pub fn sums_k_in_one_pass(&self) -> bool {
        self.split_k <= 1 && self.reduction == 0
    }
}

/// One algorithm of a GEMM shape, ready to run.
#[derive(Clone, Copy)]
pub struct LtAlgo {
    pub(super) raw: sys::cublasLtMatmulAlgo_t,
    pub config: AlgoConfig,
    /// Workspace bytes this algorithm needs.
    pub workspace: usize,
}

impl std::fmt::Debug for LtAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} (workspace {} B)", self.config, self.workspace)
    }
}

/// The descriptors of one problem `Y[m, n] = X[m, k] · W[n, k]ᵀ`, freed on drop.
pub(super) struct Problem {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) w: sys::cublasLtMatrixLayout_t,
    pub(super) x: sys::cublasLtMatrixLayout_t,
    pub(super) y: sys::cublasLtMatrixLayout_t,
}

impl Problem {
    /// cuBLASLt is column-major: the row-major product is `Yᵀ[n, m] = W[k, n]ᵀ · Xᵀ[k, m]`
    /// with W transposed.
    fn new(m: usize, n: usize, k: usize) -> CudaResult<Self> {
        let bf = sys::cudaDataType::CUDA_R_16BF;
        let ctx = || format!("describing a {m}x{n}x{k} cuBLASLt GEMM");
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .ctx(ctx)?;
        let mut problem = Problem {
            desc,
            w: std::ptr::null_mut(),
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
        };
        let transpose = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: a fresh descriptor and a value of the attribute's type.
        unsafe {
            result::set_matmul_desc_attribute(
                problem.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const _ as *const c_void,
                std::mem::size_of_val(&transpose),
            )
            .ctx(ctx)?;
        }
        problem.w = result::create_matrix_layout(bf, k as u64, n as u64, k as i64).ctx(ctx)?;
        problem.x = result::create_matrix_layout(bf, k as u64, m as u64, k as i64).ctx(ctx)?;
        problem.y = result::create_matrix_layout(bf, n as u64, m as u64, n as i64).ctx(ctx)?;
        Ok(problem)
    }
}

// SAFETY: descriptors are plain host objects, read-only once built.
unsafe impl Send for Problem {}
unsafe impl Sync for Problem {}

impl Drop for Problem {
    fn drop(&mut self) {
        // SAFETY: created in Problem::new (null layouts are skipped).
        unsafe {
            for layout in [self.w, self.x, self.y] {
                if !layout.is_null() {
                    let _ = result::destroy_matrix_layout(layout);
                }
            }
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

impl<T> Context<T> for std::result::Result<T, result::CublasError> {
    fn ctx(self, context: impl FnOnce() -> String) -> CudaResult<T> {
        self.map_err(|source| CudaError::CublasLt {
            context: context(),
            source,
        })
    }
}

impl BlasLt {
    /// A handle for the device whose context is `ctx` (its GEMMs run on the stream their
    /// caller names: `dense_plan.rs`).
    pub(crate) fn new(ctx: &Arc<GpuContext>) -> CudaResult<Self> {
        ctx.bind()?;
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "libcublasLt could not be loaded".into(),
            ));
        }
        let handle = result::create_handle().ctx(|| "creating the cuBLASLt handle".into())?;
        let workspace = DeviceBuffer::<u8>::alloc(ctx, WORKSPACE_BYTES)?;
        Ok(Self {
            handle,
            workspace,
            plans: RwLock::new(HashMap::new()),
            problems: Mutex::new(HashMap::new()),
        })
    }

    pub(super) fn problem(&self, m: usize, n: usize, k: usize) -> CudaResult<Arc<Problem>> {
        let mut cache = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&(m, n, k)) {
            return Ok(p.clone());
        }
        if cache.len() >= MAX_CACHED_PROBLEMS {
            cache.clear();
        }
        let p = Arc::new(Problem::new(m, n, k)?);
        cache.insert((m, n, k), p.clone());
        Ok(p)
    }

    /// The planned algorithm for `m` rows of the shape (n, k), if one was planned.
    pub fn planned(&self, m: usize, n: usize, k: usize) -> Option<LtAlgo> {
        let bucket = ROW_BUCKETS.iter().position(|&b| m <= b)?;
        let plans = self.plans.read().unwrap_or_else(|e| e.into_inner());
        plans.get(&(n, k))?.get(bucket).copied().flatten()
    }

    /// Records the plans of the shape (n, k), one per bucket from the first.
    pub fn set_plans(&self, n: usize, k: usize, by_bucket: BucketPlans) {
        let mut plans = self.plans.write().unwrap_or_else(|e| e.into_inner());
        plans.insert((n, k), by_bucket);
    }

    /// Up to `max` algorithms cuBLASLt's heuristic offers for the shape, fastest first.
    pub fn candidates(&self, m: usize, n: usize, k: usize, max: usize) -> CudaResult<Vec<LtAlgo>> {
        let problem = Problem::new(m, n, k)?;
        let ctx = || format!("listing cuBLASLt algorithms for {m}x{n}x{k}");
        let pref = result::create_matmul_pref().ctx(ctx)?;
        let mut found = vec![MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed(); max];
        let mut count = 0i32;
        // SAFETY: live descriptors; `found` holds `max` results.
        let status = unsafe {
            let bytes = WORKSPACE_BYTES;
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    problem.desc,
                    problem.w,
                    problem.x,
                    problem.y,
                    problem.y,
                    pref,
                    max as i32,
                    found.as_mut_ptr() as *mut sys::cublasLtMatmulHeuristicResult_t,
                    &mut count,
                )
                .result()
            })
        };
        // SAFETY: created above.
        unsafe {
            let _ = result::destroy_matmul_pref(pref);
        }
        status.ctx(ctx)?;
        let mut algos = Vec::new();
        for entry in &found[..count.max(0) as usize] {
            // SAFETY: cuBLASLt wrote the first `count` entries.
            let entry = unsafe { entry.assume_init() };
            if entry.state != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                continue;
            }
            algos.push(LtAlgo {
                raw: entry.algo,
                config: read_config(&entry.algo),
                workspace: entry.workspaceSize,
            });
        }
        Ok(algos)
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: created in BlasLt::new.
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}

fn read_config(algo: &sys::cublasLtMatmulAlgo_t) -> AlgoConfig {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
    // cuBLASLt checks the buffer size against the attribute's type: 4 bytes for every
    // attribute here but the two shape ids, which are 2.
    let get = |attr: A, size: usize| -> u32 {
        let mut value = 0u32;
        let mut written = 0usize;
        // SAFETY: `size` <= 4 bytes of `value`.
        let _ = unsafe {
            sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                attr,
                &mut value as *mut u32 as *mut c_void,
                size,
                &mut written,
            )
        };
        // Little-endian: a 2-byte attribute sits in the low bytes.
        value
    };
    AlgoConfig {
        id: get(A::CUBLASLT_ALGO_CONFIG_ID, 4) as i32,
        tile: get(A::CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
        split_k: get(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
        reduction: get(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
        swizzle: get(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4),
        custom: get(A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4),
        stages: get(A::CUBLASLT_ALGO_CONFIG_STAGES_ID, 4),
        inner_shape: get(A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2) as u16,
        cluster_shape: get(A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2) as u16,
    }
}
