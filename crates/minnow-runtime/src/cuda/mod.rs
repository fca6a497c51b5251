//! The CUDA backend: a device context with one stream, plain device allocations, the kernels of
//! `kernels/*.cu` (embedded as PTX, launched through the typed kernel table of `kernels.rs`),
//! cuBLAS BF16/F32 GEMMs and CUDA graphs.
//!
//! Everything goes through cudarc's thin `result`/`sys` layers with the driver and cuBLAS loaded
//! at run time, so a binary built without CUDA still runs (on the CPU) where there is no GPU:
//! call [`is_available`] first. No managed memory is ever used.

mod blas;
mod blaslt;
mod buffer;
mod context;
mod dense_plan;
mod driver;
mod error;
mod gpu;
mod graph;
mod kernels;
mod launch;
pub mod ops;
pub mod ptx;
pub mod tma;
pub mod tuning;

pub use blas::Blas;
pub use blaslt::{AlgoConfig, BlasLt, LtAlgo, ROW_BUCKETS};
pub use buffer::DeviceBuffer;
pub use dense_plan::{plan_dense_gemms, DenseShape};
pub use driver::{device_count, is_available, profiler};
pub use error::{CudaError, CudaResult};
pub use gpu::{Beside, Gpu, Profile, Timer};
pub use graph::Graph;
pub use launch::{KernelArg, LaunchConfig};

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
