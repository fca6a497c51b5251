//! A CUDA failure as the model crate's error (its own module: the loaders and the runner all
//! map errors with it, and none of them may import another just for that).

use crate::error::ModelError;

pub(crate) fn device_err(e: minnow_runtime::cuda::CudaError) -> ModelError {
    ModelError::Device(e.to_string())
}
