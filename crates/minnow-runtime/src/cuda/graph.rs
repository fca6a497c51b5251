//! CUDA graphs: capture the launches queued on the gpu's stream once, replay them with one call.
//! Kernels read anything that changes between replays (the start position, the token ids) from
//! device memory, so one captured graph serves every step with the same shapes.

use cudarc::driver::{result, sys};

use super::error::{Context, CudaResult};
use super::gpu::Gpu;

pub struct Graph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
}

// SAFETY: replayed only on its Gpu's stream with the context bound.
unsafe impl Send for Graph {}

impl Graph {
    /// Runs `body` (which only queues work on `gpu`'s stream) under stream capture and
    /// instantiates the result. Nothing runs during capture.
    pub fn capture(gpu: &Gpu, body: impl FnOnce() -> CudaResult<()>) -> CudaResult<Self> {
        gpu.bind()?;
        // SAFETY: valid stream; relaxed mode lets cuBLAS query its state during capture.
        unsafe {
            result::stream::begin_capture(
                gpu.main_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .ctx(|| "beginning graph capture".into())?;
        let queued = body();
        // Always end the capture, even when the body failed, so the stream is usable again.
        // SAFETY: capture was begun on this stream.
        let graph = unsafe { result::stream::end_capture(gpu.main_stream()) }
            .ctx(|| "ending graph capture".into());
        queued?;
        let graph = graph?;
        // SAFETY: graph is a valid captured graph.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .ctx(|| "instantiating a captured graph".into())?;
        Ok(Self { exec, graph })
    }

    /// Queues one replay on `gpu`'s stream.
    pub fn launch(&self, gpu: &Gpu) -> CudaResult<()> {
        gpu.bind()?;
        // SAFETY: exec is instantiated and the buffers it uses are owned by the caller.
        unsafe { result::graph::launch(self.exec, gpu.main_stream()) }
            .ctx(|| "replaying a CUDA graph".into())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created once in capture().
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}
