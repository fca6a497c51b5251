//! Plain device allocations (cuMemAlloc), freed on drop. Never managed memory.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::GpuContext;
use super::error::{Context, CudaResult};

/// `len` elements of `T` in device memory of one context.
pub struct DeviceBuffer<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<GpuContext>,
    _t: PhantomData<T>,
}

// SAFETY: the buffer is a handle to device memory; the context it belongs to is bound to the
// calling thread before every use (GpuContext::bind).
unsafe impl<T> Send for DeviceBuffer<T> {}
unsafe impl<T> Sync for DeviceBuffer<T> {}

impl<T: Copy> DeviceBuffer<T> {
    pub(crate) fn alloc(ctx: &Arc<GpuContext>, len: usize) -> CudaResult<Self> {
        ctx.bind()?;
        let bytes = (len.max(1)) * std::mem::size_of::<T>();
        // SAFETY: a plain allocation in the bound context.
        let ptr =
            unsafe { result::malloc_sync(bytes) }.ctx(|| format!("allocating {bytes} bytes"))?;
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Device address of the first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Device address of element `i` (no bounds check beyond a debug assertion: callers pass
    /// offsets they computed from the buffer's shape).
    pub fn ptr_at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len);
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: ptr came from malloc_sync in this context and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
