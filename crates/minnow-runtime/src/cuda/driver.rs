//! The driver library itself: whether it loads, how many devices it sees, the profiler range.

use std::sync::OnceLock;

use super::error::{Context, CudaError, CudaResult};

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
    r.result()
        .ctx(|| "starting or stopping the profiler range".into())
}
