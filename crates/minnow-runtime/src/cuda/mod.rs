//! The CUDA backend: a device context with one stream, plain device allocations, the kernels of
//! `kernels/*.cu` (embedded as PTX, see [`ptx`]), cuBLAS BF16/F32 GEMMs and CUDA graphs.
//!
//! Everything goes through cudarc's thin `result`/`sys` layers with the driver and cuBLAS loaded
//! at run time, so a binary built without CUDA still runs (on the CPU) where there is no GPU:
//! call [`is_available`] first. No managed memory is ever used.

mod blas;
mod blaslt;
mod buffer;
mod error;
mod gpu;
mod graph;
pub mod ops;
pub mod ptx;
pub mod tma;
pub mod tuning;

pub use blas::Blas;
pub use blaslt::{plan_dense_gemms, AlgoConfig, BlasLt, DenseShape, LtAlgo, ROW_BUCKETS};
pub use buffer::DeviceBuffer;
pub use error::{CudaError, CudaResult};
pub use gpu::{Gpu, KernelArg, LaunchConfig, Profile, Timer};
pub use graph::Graph;

use std::sync::OnceLock;

/// True when the CUDA driver library loads and reports at least one device. Cheap after the first
/// call (the answer is cached); never panics.
pub fn is_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| device_count().map(|n| n > 0).unwrap_or(false))
}

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> CudaResult<usize> {
    use cudarc::driver::{result, sys};
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable("libcuda could not be loaded".into()));
    }
    result::init().map_err(|e| CudaError::Unavailable(format!("cuInit failed: {e:?}")))?;
    let n = result::device::get_count()
        .map_err(|e| CudaError::Unavailable(format!("cuDeviceGetCount failed: {e:?}")))?;
    Ok(n.max(0) as usize)
}

/// Starts (`true`) or stops the range an external profiler records (`ncu --profile-from-start
/// off`); harmless without one.
pub fn profiler(start: bool) -> CudaResult<()> {
    use cudarc::driver::sys;
    // SAFETY: no arguments; needs an initialised driver, which callers have (they hold a Gpu).
    let r = unsafe {
        if start {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    use error::Context;
    r.result()
        .ctx(|| "starting or stopping the profiler range".into())
}

#[cfg(test)]
mod tests {
    /// Runs everywhere: without a driver the probe must answer false (or an error), never panic,
    /// and opening a device must fail with a typed error.
    #[test]
    fn probing_never_panics() {
        let available = super::is_available();
        assert_eq!(available, super::is_available(), "the answer is cached");
        if !available {
            assert!(matches!(
                super::Gpu::new(0),
                Err(super::CudaError::Unavailable(_))
            ));
        }
    }
}
