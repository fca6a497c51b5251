//! minnow-runtime owns everything below the model: element types (BF16/F16/F32 conversion),
//! the CPU operators the model is built from (matrix products through `gemm`, RMSNorm, RoPE,
//! softmax, SiLU; parallel with rayon), and the CUDA backend (raw `cudarc`, loaded dynamically
//! so that one binary runs with or without a GPU). Nothing here knows what a LLaDA2 layer is.

pub mod cpu;
pub mod device;
pub mod dtype;
#[cfg(test)]
mod import_graph;
pub mod quant;

pub use dtype::{DType, MatRef};
pub use quant::{Encoding, QuantEncoding, QuantMat};
pub mod cuda;
