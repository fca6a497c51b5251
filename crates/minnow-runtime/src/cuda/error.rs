//! Every failure of the CUDA backend as one typed error that says what was being done.

use cudarc::cublas::result::CublasError;
use cudarc::driver::result::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable driver or device: the caller should fall back to the CPU.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("CUDA driver error while {context}: {source:?}")]
    Driver {
        context: String,
        #[source]
        source: DriverError,
    },
    #[error("cuBLAS error while {context}: {source:?}")]
    Cublas {
        context: String,
        #[source]
        source: CublasError,
    },
    #[error("cuBLASLt error while {context}: {source:?}")]
    CublasLt {
        context: String,
        #[source]
        source: cudarc::cublaslt::result::CublasError,
    },
    /// A shape or argument the kernels do not support (checked before any launch).
    #[error("unsupported by the CUDA kernels: {0}")]
    Unsupported(String),
}

pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// Adds "while <context>" to raw driver and cuBLAS results.
pub(crate) trait Context<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> CudaResult<T>;
}

impl<T> Context<T> for std::result::Result<T, DriverError> {
    fn ctx(self, context: impl FnOnce() -> String) -> CudaResult<T> {
        self.map_err(|source| CudaError::Driver {
            context: context(),
            source,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, CublasError> {
    fn ctx(self, context: impl FnOnce() -> String) -> CudaResult<T> {
        self.map_err(|source| CudaError::Cublas {
            context: context(),
            source,
        })
    }
}
