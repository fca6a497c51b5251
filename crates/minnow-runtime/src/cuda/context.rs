//! A device's primary context, shared by the device handle and every allocation on it.

use cudarc::driver::{result, sys};

use super::error::{Context, CudaResult};

/// The device's primary context. Bound to the calling thread before every driver call, so a
/// runner may move between threads.
pub struct GpuContext {
    ctx: sys::CUcontext,
    device: sys::CUdevice,
}

// SAFETY: a CUcontext may be made current on any thread.
unsafe impl Send for GpuContext {}
unsafe impl Sync for GpuContext {}

impl GpuContext {
    /// Takes ownership of `ctx`, the retained primary context of `device` (released on drop).
    pub(crate) fn new(ctx: sys::CUcontext, device: sys::CUdevice) -> Self {
        Self { ctx, device }
    }

    pub(crate) fn bind(&self) -> CudaResult<()> {
        // SAFETY: ctx is a retained primary context.
        unsafe { result::ctx::set_current(self.ctx) }.ctx(|| "binding the CUDA context".into())
    }
}

impl Drop for GpuContext {
    fn drop(&mut self) {
        // SAFETY: retained once in Gpu::new.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}
