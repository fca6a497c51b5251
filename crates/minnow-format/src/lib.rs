//! minnow-format reads and writes checkpoints: Hugging Face safetensors directories (one file
//! or sharded through `model.safetensors.index.json`) and the single-file `.mnw` container
//! (`mnw/`, docs/model-format.md) whose routed experts may be quantized (INT8/INT4/NVFP4, and
//! our own FP8). Both are memory-mapped and seen through one tensor-source interface
//! ([`TensorSource`]); [`Checkpoint`] opens either from a path.

mod checkpoint;
mod error;
#[cfg(test)]
mod import_graph;
pub mod mnw;
mod progress;
mod safetensors_dir;
mod source;

pub use checkpoint::Checkpoint;
pub use error::{FormatError, Result};
pub use mnw::MnwFile;
pub use progress::{bytes_by_encoding, total_bytes, LoadProgress, ProgressSource};
pub use safetensors_dir::SafetensorsDir;
pub use source::{QuantParts, TensorRef, TensorSource};
