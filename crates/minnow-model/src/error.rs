//! The one error type of the model crate: every variant names the file, key or tensor at fault,
//! so the CLI can print it as a single line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{0}")]
    Weights(String),
    #[error("{0}")]
    InvalidInput(String),
    #[error("{0}")]
    Device(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, ModelError>;
