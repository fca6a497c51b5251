//! The error every launcher returns for a shape its kernel does not take, instead of launching
//! something wrong.

use super::super::error::{CudaError, CudaResult};

pub(super) fn unsupported<T>(msg: String) -> CudaResult<T> {
    Err(CudaError::Unsupported(msg))
}
