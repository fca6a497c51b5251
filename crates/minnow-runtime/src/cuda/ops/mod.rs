//! The operations the model queues, over the kernel table's typed launchers (`kernels.rs`): they
//! check the shapes each kernel supports (returning `CudaError::Unsupported` instead of launching
//! something wrong), pick the kernel and its grid. Buffers are passed as device addresses so that
//! callers can address sub-ranges. One module per job: `elementwise` (norms, activations,
//! combine, top-1), `attention` (RoPE and attention), `routing` (router logits and expert
//! choice), `expert_gemm` (dispatch and the grouped expert GEMMs), `expert_wgmma` (the
//! grouped expert GEMM on Hopper's wgmma), `pool_gemm` (a denoising
//! step's pooled experts), `dense_gemm` and `sample` (sampled candidates drawn from logits rows).

mod attention;
mod dense_gemm;
mod elementwise;
mod expert_gemm;
mod expert_wgmma;
mod pool_gemm;
mod routing;
mod sample;
mod unsupported;

pub use attention::*;
pub use dense_gemm::*;
pub use elementwise::*;
pub use expert_gemm::*;
pub use expert_wgmma::*;
pub use pool_gemm::*;
pub use routing::*;
pub use sample::*;
