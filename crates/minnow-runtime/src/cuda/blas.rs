//! cuBLAS GEMMs in the row-major convention of the model: `Y[M, N] = X[M, K] . W[N, K]^T`
//! (PyTorch `[out, in]` weights). cuBLAS is column-major, so this is the column-major product
//! `Y^T = W . X^T`, i.e. `gemm(op_A = T on W, op_B = N on X)`.

use std::ffi::c_void;

use cudarc::cublas::{result, sys};

use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::context::GpuContext;
use super::error::{Context, CudaResult};

/// Workspace given to cuBLAS up front so it never allocates during graph capture.
const WORKSPACE_BYTES: usize = 32 << 20;

pub struct Blas {
    handle: sys::cublasHandle_t,
    _workspace: DeviceBuffer<u8>,
}

// SAFETY: used only with the owning Gpu's context bound and on its stream.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Blas {
    /// A handle on `stream` of the device whose context is `ctx`.
    pub(crate) fn new(
        ctx: &Arc<GpuContext>,
        stream: cudarc::driver::sys::CUstream,
    ) -> CudaResult<Self> {
        ctx.bind()?;
        let handle = result::create_handle().ctx(|| "creating the cuBLAS handle".into())?;
        let workspace = DeviceBuffer::<u8>::alloc(ctx, WORKSPACE_BYTES)?;
        // SAFETY: valid handle, stream and workspace.
        unsafe {
            result::set_stream(handle, stream as _).ctx(|| "setting the cuBLAS stream".into())?;
            sys::cublasSetWorkspace_v2(handle, workspace.ptr() as *mut c_void, WORKSPACE_BYTES)
                .result()
                .ctx(|| "setting the cuBLAS workspace".into())?;
            // Plain F32 math for the F32 router GEMM (no TF32 shortcut).
            sys::cublasSetMathMode(handle, sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .ctx(|| "setting the cuBLAS math mode".into())?;
        }
        Ok(Self {
            handle,
            _workspace: workspace,
        })
    }

    /// BF16 `Y[M, N] = X[M, K] . W[N, K]^T` with F32 accumulation, BF16 output. Pointers are
    /// device addresses of row-major matrices with row pitches K (X, W) and `ldy` (Y).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        ldy: usize,
    ) -> CudaResult<()> {
        let bf = sys::cudaDataType::CUDA_R_16BF;
        self.gemm_ex(
            x,
            w,
            y,
            m,
            n,
            k,
            ldy,
            bf,
            bf,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    }

    /// BF16 inputs, F32 output: `Y[M, N] = X[M, K] . W[N, K]^T` with F32 accumulation. Used for
    /// the router when its weights are BF16-exact: the products of two BF16 values are exact in
    /// F32, so this equals the F32 GEMM of the promoted operands up to summation order.
    pub fn gemm_bf16_f32out(
        &self,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
    ) -> CudaResult<()> {
        let (bf, f) = (
            sys::cudaDataType::CUDA_R_16BF,
            sys::cudaDataType::CUDA_R_32F,
        );
        self.gemm_ex(
            x,
            w,
            y,
            m,
            n,
            k,
            n,
            bf,
            f,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    }

    /// F32 `Y[M, N] = X[M, K] . W[N, K]^T` in full F32 (the router's logits).
    pub fn gemm_f32(&self, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize) -> CudaResult<()> {
        let f = sys::cudaDataType::CUDA_R_32F;
        self.gemm_ex(
            x,
            w,
            y,
            m,
            n,
            k,
            n,
            f,
            f,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        )
    }

    /// Batched BF16 `Y_b[M, N] = X_b[M, K] . W_b[N, K]^T` (F32 accumulation, BF16 output) for
    /// `batch` entries whose matrix addresses are read from the device arrays `x_ptrs`, `w_ptrs`
    /// and `y_ptrs` (u64 each): a kernel may choose the operands on the device, so the call can
    /// sit in a captured graph. Row pitches: K for X and W, N for Y.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16_batched(
        &self,
        x_ptrs: u64,
        w_ptrs: u64,
        y_ptrs: u64,
        m: usize,
        n: usize,
        k: usize,
        batch: usize,
    ) -> CudaResult<()> {
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        let bf = sys::cudaDataType::CUDA_R_16BF;
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: the pointer arrays hold `batch` addresses of matrices of the stated shapes.
        unsafe {
            sys::cublasGemmBatchedEx(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w_ptrs as *const *const c_void,
                bf,
                k as i32,
                x_ptrs as *const *const c_void,
                bf,
                k as i32,
                &beta as *const f32 as *const c_void,
                y_ptrs as *const *mut c_void,
                bf,
                n as i32,
                batch as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .result()
        }
        .ctx(|| format!("batched GEMM {batch} x {m}x{n}x{k} (bf16)"))
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_ex(
        &self,
        x: u64,
        w: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        ldy: usize,
        in_type: sys::cudaDataType,
        out_type: sys::cudaDataType,
        compute: sys::cublasComputeType_t,
    ) -> CudaResult<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: the caller's buffers hold the stated shapes; alpha/beta are host scalars.
        unsafe {
            result::gemm_ex(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                in_type,
                k as i32,
                x as *const c_void,
                in_type,
                k as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                out_type,
                ldy as i32,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .ctx(|| format!("GEMM {m}x{n}x{k} ({in_type:?} -> {out_type:?})"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created once in new().
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}
