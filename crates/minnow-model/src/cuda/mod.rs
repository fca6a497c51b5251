//! The LLaDA2 forward on a CUDA GPU in BF16 ([`CudaRunner`]), built from the kernels and cuBLAS
//! calls of `minnow_runtime::cuda`. Same contract as the CPU runner ([`crate::ModelRunner`]);
//! numerics follow docs/model.md §7 in BF16 with the router and the MoE mix in F32.

mod batch_layout;
mod dense;
mod dense_plan;
mod device_error;
mod experts;
mod forward;
mod kv_pool;
mod moe;
mod runner;
mod shapes;
mod weights;
mod workspace;

pub use runner::CudaRunner;

/// True when a CUDA GPU can be used (the driver loads and reports a device). Cheap; cached.
pub fn is_available() -> bool {
    minnow_runtime::cuda::is_available()
}
