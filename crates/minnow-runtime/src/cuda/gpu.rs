//! One CUDA device: its primary context, the stream on which all work is queued in order (and a
//! side stream for work that may run beside it, [`Gpu::beside`]), the loaded kernel modules,
//! cuBLAS, copies and events.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::blas::Blas;
use super::blaslt::BlasLt;
use super::buffer::DeviceBuffer;
use super::context::GpuContext;
use super::driver::device_count;
use super::error::{Context, CudaError, CudaResult};
use super::kernels::{PtxModule, MODULES};
use super::launch::{Launch, LaunchConfig};
use super::ptx;

/// A CUDA device ready to run minnow's kernels.
pub struct Gpu {
    ctx: Arc<GpuContext>,
    stream: sys::CUstream,
    /// Work queued inside [`Gpu::beside`] goes here: after the main stream's work queued before
    /// it, and before the main stream's work queued after it.
    side: sys::CUstream,
    /// Whether launches go to `side` now.
    on_side: AtomicBool,
    /// Whether a [`Beside`] region is open (not yet joined).
    side_open: AtomicBool,
    /// Recorded on the main stream when `beside` starts (the side stream waits for it) and on
    /// the side stream when it ends (the main stream waits for it).
    fork: sys::CUevent,
    join: sys::CUevent,
    functions: HashMap<&'static str, sys::CUfunction>,
    modules: Vec<sys::CUmodule>,
    blas: Option<Blas>,
    /// Created on first use: only the batch-invariant dense GEMMs need it.
    blas_lt: std::sync::OnceLock<Option<BlasLt>>,
    name: String,
    ordinal: usize,
    sm_count: u32,
    /// Compute capability (major, minor).
    capability: (i32, i32),
    /// Kernels are launched with programmatic stream serialization (see `pdl_enter` in
    /// kernels/common.cuh): sm_90+ and not turned off with `MINNOW_PDL=0`.
    pdl: bool,
    /// `MINNOW_PTX=sm80`: the portable PTX even on sm_90+.
    force_sm80: bool,
    /// Most shared memory one CTA may opt in to (227 KiB on Hopper, ~99 KiB on consumer GPUs).
    max_shared_optin: u32,
}

// SAFETY: all handles are used with the context bound; the stream orders the work.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens device `ordinal`, loads every kernel module and creates the cuBLAS handle.
    pub fn new(ordinal: usize) -> CudaResult<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::Unavailable(format!(
                "device cuda:{ordinal} requested but {count} device(s) found"
            )));
        }
        let device =
            result::device::get(ordinal as i32).ctx(|| format!("opening device {ordinal}"))?;
        // SAFETY: device is valid; the context is released when GpuContext drops.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .ctx(|| "retaining the primary context".into())?;
        let ctx = Arc::new(GpuContext::new(ctx, device));
        ctx.bind()?;
        let name = result::device::get_name(device).ctx(|| "reading the device name".into())?;
        let attribute = |a, what: &str| {
            // SAFETY: valid device and attribute.
            unsafe { result::device::get_attribute(device, a) }
                .ctx(|| format!("reading the {what}"))
        };
        use sys::CUdevice_attribute as A;
        let sm_count = attribute(
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "multiprocessor count",
        )? as u32;
        let capability = (
            attribute(
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "compute capability",
            )?,
            attribute(
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "compute capability",
            )?,
        );
        let max_shared_optin = attribute(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "shared-memory opt-in limit",
        )? as u32;
        // MINNOW_PTX=sm80 loads the portable build everywhere (for A/B runs); it has no
        // `pdl_enter`, so it must not be launched with programmatic serialization.
        let force_sm80 = std::env::var("MINNOW_PTX").is_ok_and(|v| v == "sm80");
        let pdl = capability.0 >= 9
            && !force_sm80
            && std::env::var("MINNOW_PDL").map_or(true, |v| v != "0");
        let create_stream = || {
            result::stream::create(result::stream::StreamKind::NonBlocking)
                .ctx(|| "creating a stream".into())
        };
        let (stream, side) = (create_stream()?, create_stream()?);
        let create_event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .ctx(|| "creating an event".into())
        };
        let (fork, join) = (create_event()?, create_event()?);
        let mut gpu = Self {
            ctx,
            stream,
            side,
            on_side: AtomicBool::new(false),
            side_open: AtomicBool::new(false),
            fork,
            join,
            functions: HashMap::new(),
            modules: Vec::new(),
            blas: None,
            blas_lt: std::sync::OnceLock::new(),
            name,
            ordinal,
            sm_count,
            capability,
            pdl,
            force_sm80,
            max_shared_optin,
        };
        for module in MODULES {
            gpu.load_module(module)?;
        }
        gpu.blas = Some(Blas::new(&gpu.ctx, gpu.stream)?);
        Ok(gpu)
    }

    /// Whether the sm_90 builds of the kernels are loaded (Hopper or newer, not forced to the
    /// portable build): kernels that use Hopper-only instructions run only then.
    pub fn uses_sm90_ptx(&self) -> bool {
        self.capability.0 >= 9 && !self.force_sm80
    }

    /// Whether the sm_90a builds (`ptx::SM90A_MODULES`: wgmma) are loaded: compute capability
    /// exactly 9.0, not forced to the portable build.
    pub fn uses_sm90a_ptx(&self) -> bool {
        self.capability == (9, 0) && !self.force_sm80
    }

    fn load_module(&mut self, module: &PtxModule) -> CudaResult<()> {
        let sm90 = if ptx::SM90A_MODULES.contains(&module.name) {
            self.uses_sm90a_ptx()
        } else {
            self.uses_sm90_ptx()
        };
        let embedded = if sm90 { module.ptx_sm90 } else { module.ptx };
        let text = match ptx::override_text(module.name, sm90)? {
            Some(text) => std::borrow::Cow::Owned(text),
            None => std::borrow::Cow::Borrowed(embedded),
        };
        let image = CString::new(text.as_bytes()).map_err(|_| {
            CudaError::Unsupported(format!("PTX of {} contains a NUL byte", module.name))
        })?;
        // SAFETY: image is a NUL-terminated PTX text.
        let handle = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .ctx(|| format!("loading the PTX of kernels/{}.cu", module.name))?;
        self.modules.push(handle);
        for &func in module.functions {
            // SAFETY: the module is loaded.
            let f = unsafe { result::module::get_function(handle, CString::new(func).unwrap()) }
                .ctx(|| format!("finding kernel {func} in kernels/{}.cu", module.name))?;
            // Kernels that take more than 48 KiB of dynamic shared memory must opt in, as far as
            // the device allows beside the kernel's static shared memory (launchers check
            // `max_shared_optin` for the shapes that need more).
            if module.max_dynamic_shared > 0 {
                // SAFETY: f is a valid function.
                let static_bytes = unsafe {
                    result::function::get_function_attribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    )
                }
                .ctx(|| format!("reading the static shared memory of {func}"))?;
                let room = self
                    .max_shared_optin
                    .saturating_sub(static_bytes.max(0) as u32);
                let limit = module.max_dynamic_shared.min(room);
                // SAFETY: f is a valid function.
                unsafe {
                    result::function::set_function_attribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        limit as i32,
                    )
                }
                .ctx(|| format!("raising the shared-memory limit of {func}"))?;
            }
            self.functions.insert(func, f);
        }
        Ok(())
    }

    pub fn bind(&self) -> CudaResult<()> {
        self.ctx.bind()
    }

    /// The stream work is queued on now: the side stream inside [`Gpu::beside`], else the main
    /// one.
    pub fn stream(&self) -> sys::CUstream {
        if self.on_side.load(Ordering::Relaxed) {
            self.side
        } else {
            self.stream
        }
    }

    /// The main stream: the one graphs are captured on and replayed on, copies and
    /// synchronisation go through, and [`Gpu::beside`] joins back into.
    pub fn main_stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Queues what `body` launches on the side stream, after everything queued on the main
    /// stream so far, and returns while it may still run: the main stream's next launches run
    /// beside it (a graph captured across it gets two branches) until [`Beside::join`], after
    /// which the main stream's work waits for it. `body` must only launch kernels and cuBLASLt
    /// GEMMs (which follow [`Gpu::stream`]) and write no buffer that the main stream's work
    /// before the join touches. One side region at a time.
    pub fn beside(&self, body: impl FnOnce() -> CudaResult<()>) -> CudaResult<Beside<'_>> {
        assert!(
            !self.side_open.swap(true, Ordering::Relaxed),
            "one Gpu::beside region at a time"
        );
        // From here on the region is joined when `beside` is dropped, whatever fails.
        let beside = Beside { gpu: self };
        self.bind()?;
        // SAFETY: valid events and streams, created in new().
        unsafe {
            result::event::record(self.fork, self.stream)
                .ctx(|| "recording the side stream's fork".into())?;
            result::stream::wait_event(
                self.side,
                self.fork,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .ctx(|| "ordering the side stream after the main one".into())?;
        }
        self.on_side.store(true, Ordering::Relaxed);
        let queued = body();
        self.on_side.store(false, Ordering::Relaxed);
        queued?;
        Ok(beside)
    }

    pub fn blas(&self) -> &Blas {
        self.blas.as_ref().expect("cuBLAS is created in Gpu::new")
    }

    /// The cuBLASLt handle, created on first use; `None` when libcublasLt cannot be loaded or
    /// initialised (callers then keep their own kernels).
    pub fn blas_lt(&self) -> Option<&BlasLt> {
        self.blas_lt
            .get_or_init(|| BlasLt::new(&self.ctx).ok())
            .as_ref()
    }

    /// The cuBLASLt handle if [`Gpu::blas_lt`] created one (never creates it: safe inside a
    /// graph capture).
    pub fn blas_lt_if_created(&self) -> Option<&BlasLt> {
        self.blas_lt.get().and_then(|lt| lt.as_ref())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Most dynamic shared memory a kernel of this device may use (what it can opt in to; the
    /// kernels' static shared memory comes on top).
    pub fn max_shared_optin(&self) -> u32 {
        self.max_shared_optin
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> CudaResult<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().ctx(|| "reading free memory".into())
    }

    /// An uninitialised device buffer of `len` elements.
    pub fn alloc<T: Copy>(&self, len: usize) -> CudaResult<DeviceBuffer<T>> {
        DeviceBuffer::alloc(&self.ctx, len)
    }

    /// A device buffer holding a copy of `data` (synchronous).
    pub fn upload<T: Copy>(&self, data: &[T]) -> CudaResult<DeviceBuffer<T>> {
        let buf = self.alloc(data.len())?;
        self.write(&buf, 0, data)?;
        Ok(buf)
    }

    /// Copies `data` into `buf` at element `offset`, in stream order (the call returns once the
    /// host data has been consumed, so `data` may be reused at once).
    pub fn write<T: Copy>(
        &self,
        buf: &DeviceBuffer<T>,
        offset: usize,
        data: &[T],
    ) -> CudaResult<()> {
        if offset + data.len() > buf.len() {
            return Err(CudaError::Unsupported(format!(
                "write of {} elements at {offset} into a buffer of {}",
                data.len(),
                buf.len()
            )));
        }
        self.bind()?;
        // SAFETY: bounds checked; pageable host memory makes the async copy synchronous with
        // respect to `data` (staged before return).
        unsafe { result::memcpy_htod_async(buf.ptr_at(offset), data, self.stream) }.ctx(|| {
            format!(
                "copying {} bytes to the device",
                std::mem::size_of_val(data)
            )
        })
    }

    /// Copies `out.len()` elements from `buf` at `offset` to the host and waits for them.
    pub fn read<T: Copy>(
        &self,
        buf: &DeviceBuffer<T>,
        offset: usize,
        out: &mut [T],
    ) -> CudaResult<()> {
        self.read_raw(buf.ptr_at(offset), offset + out.len() <= buf.len(), out)
    }

    pub(crate) fn read_raw<T: Copy>(
        &self,
        src: u64,
        in_bounds: bool,
        out: &mut [T],
    ) -> CudaResult<()> {
        if !in_bounds {
            return Err(CudaError::Unsupported(
                "read past the end of a device buffer".into(),
            ));
        }
        self.bind()?;
        // SAFETY: in bounds; we synchronise before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, src, self.stream) }
            .ctx(|| format!("copying {} bytes to the host", std::mem::size_of_val(out)))?;
        self.synchronize()
    }

    /// Device-to-device copy of `bytes` bytes, in stream order.
    pub fn copy_bytes(&self, dst: u64, src: u64, bytes: usize) -> CudaResult<()> {
        self.bind()?;
        // SAFETY: callers pass ranges inside live buffers.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .ctx(|| format!("copying {bytes} bytes on the device"))
    }

    /// Waits for everything queued so far; reports asynchronous kernel faults.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.bind()?;
        // SAFETY: valid stream.
        unsafe { result::stream::synchronize(self.stream) }
            .ctx(|| "waiting for the GPU stream".into())
    }

    /// Starts a per-stage profile of the work queued from now on.
    pub fn profile(&self) -> CudaResult<Profile> {
        self.bind()?;
        let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .ctx(|| "creating an event".into())?;
        // SAFETY: valid event and stream.
        unsafe { result::event::record(start, self.stream) }.ctx(|| "recording an event".into())?;
        Ok(Profile {
            start,
            marks: Vec::new(),
            stream: self.stream,
        })
    }

    /// A pair of events around a region of the stream, for timing.
    pub fn timer(&self) -> CudaResult<Timer> {
        self.bind()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).ctx(|| "creating an event".into())?;
        let stop = result::event::create(flags).ctx(|| "creating an event".into())?;
        Ok(Timer {
            start,
            stop,
            stream: self.stream,
        })
    }
}

impl Launch for Gpu {
    /// Launches kernel `name` on the stream, with programmatic stream serialization where the
    /// device has it.
    fn launch_bits(&self, name: &str, cfg: LaunchConfig, bits: &mut [u64]) -> CudaResult<()> {
        let f = *self
            .functions
            .get(name)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel named {name}")))?;
        let mut params: Vec<*mut c_void> = bits
            .iter_mut()
            .map(|b| b as *mut u64 as *mut c_void)
            .collect();
        if !self.pdl {
            // SAFETY: the argument list matches the kernel's signature (the kernel table declares
            // it once, tested against the PTX); all pointers are live device buffers.
            return unsafe {
                result::launch_kernel(
                    f,
                    cfg.grid,
                    cfg.block,
                    cfg.shared_bytes,
                    self.stream(),
                    &mut params,
                )
            }
            .ctx(|| format!("launching {name} with {cfg:?}"));
        }
        // Programmatic stream serialization: the kernel may begin launching before the previous
        // one ends; its `pdl_enter` waits for it (kernels/common.cuh).
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid.0,
            gridDimY: cfg.grid.1,
            gridDimZ: cfg.grid.2,
            blockDimX: cfg.block.0,
            blockDimY: cfg.block.1,
            blockDimZ: cfg.block.2,
            sharedMemBytes: cfg.shared_bytes,
            hStream: self.stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as above; `config` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
        }
        .ctx(|| format!("launching {name} with {cfg:?} (programmatic dependent launch)"))
    }
}

/// Work queued on the side stream by [`Gpu::beside`], not yet joined. The main stream waits for
/// it at [`Beside::join`], or when it is dropped (so an error between the two still leaves the
/// streams, and a capture, whole).
pub struct Beside<'a> {
    gpu: &'a Gpu,
}

impl Beside<'_> {
    /// Orders the main stream's work queued from now on after the side stream's work.
    pub fn join(self) -> CudaResult<()> {
        let joined = self.queue_join();
        std::mem::forget(self);
        joined
    }

    fn queue_join(&self) -> CudaResult<()> {
        let gpu = self.gpu;
        gpu.side_open.store(false, Ordering::Relaxed);
        gpu.bind()?;
        // SAFETY: valid events and streams, created in Gpu::new.
        unsafe {
            result::event::record(gpu.join, gpu.side).and_then(|()| {
                result::stream::wait_event(
                    gpu.stream,
                    gpu.join,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            })
        }
        .ctx(|| "joining the side stream into the main one".into())
    }
}

impl Drop for Beside<'_> {
    fn drop(&mut self) {
        let _ = self.queue_join();
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            self.blas = None;
            self.blas_lt = std::sync::OnceLock::new();
            // SAFETY: handles created in new(), destroyed once.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                for m in self.modules.drain(..) {
                    let _ = result::module::unload(m);
                }
                let _ = result::stream::synchronize(self.side);
                let _ = result::stream::destroy(self.stream);
                let _ = result::stream::destroy(self.side);
                let _ = result::event::destroy(self.fork);
                let _ = result::event::destroy(self.join);
            }
        }
    }
}

/// Per-stage device timing of queued work: an event after each stage, read once at the end.
/// Events between kernels cost a few microseconds each, so use it to find where time goes, not
/// for the headline numbers.
pub struct Profile {
    start: sys::CUevent,
    marks: Vec<(&'static str, sys::CUevent)>,
    stream: sys::CUstream,
}

impl Profile {
    /// Records the end of a stage called `label` (stages of the same label add up).
    pub fn mark(&mut self, label: &'static str) -> CudaResult<()> {
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .ctx(|| "creating an event".into())?;
        // SAFETY: valid event and stream.
        unsafe { result::event::record(e, self.stream) }.ctx(|| "recording an event".into())?;
        self.marks.push((label, e));
        Ok(())
    }

    /// Waits for the last stage and returns (label, total milliseconds) in first-seen order.
    pub fn report(&self) -> CudaResult<Vec<(&'static str, f32)>> {
        let mut out: Vec<(&'static str, f32)> = Vec::new();
        let mut prev = self.start;
        for &(label, e) in &self.marks {
            // SAFETY: events recorded on our stream.
            let ms = unsafe {
                result::event::synchronize(e).ctx(|| "waiting for an event".into())?;
                result::event::elapsed(prev, e).ctx(|| "reading an event timer".into())?
            };
            match out.iter_mut().find(|(l, _)| *l == label) {
                Some(entry) => entry.1 += ms,
                None => out.push((label, ms)),
            }
            prev = e;
        }
        Ok(out)
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        // SAFETY: created by Gpu::profile / Profile::mark.
        unsafe {
            let _ = result::event::destroy(self.start);
            for (_, e) in self.marks.drain(..) {
                let _ = result::event::destroy(e);
            }
        }
    }
}

/// Device-side timing of a stream region.
pub struct Timer {
    start: sys::CUevent,
    stop: sys::CUevent,
    stream: sys::CUstream,
}

impl Timer {
    pub fn start(&self) -> CudaResult<()> {
        // SAFETY: valid event and stream.
        unsafe { result::event::record(self.start, self.stream) }
            .ctx(|| "recording an event".into())
    }

    /// Records the stop event, waits for it and returns the elapsed milliseconds.
    pub fn stop_ms(&self) -> CudaResult<f32> {
        // SAFETY: valid events and stream.
        unsafe {
            result::event::record(self.stop, self.stream).ctx(|| "recording an event".into())?;
            result::event::synchronize(self.stop).ctx(|| "waiting for an event".into())?;
            result::event::elapsed(self.start, self.stop).ctx(|| "reading an event timer".into())
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: created in Gpu::timer.
        unsafe {
            let _ = result::event::destroy(self.start);
            let _ = result::event::destroy(self.stop);
        }
    }
}
