//! minnow-format reads checkpoints from disk: Hugging Face safetensors directories (one file or
//! sharded through `model.safetensors.index.json`), memory-mapped, with tensors looked up by name
//! and converted to the compute dtype on demand. The single-file `.mnw` container with quantized
//! expert encodings (INT8/INT4/FP8/NVFP4) will live here too; callers see both through the same
//! tensor-source interface ([`TensorSource`]).

mod error;
mod progress;
mod safetensors_dir;
mod source;

pub use error::{FormatError, Result};
pub use progress::{total_bytes, LoadProgress, ProgressSource};
pub use safetensors_dir::SafetensorsDir;
pub use source::{TensorRef, TensorSource};
