//! The engine's errors, typed so that callers map each kind to its own answer (the server: 400,
//! 429, 503 or 500) instead of parsing messages. A bad request fails only that request; a device
//! failure fails the batch it happened in, with the device's message.

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint could not be loaded (bad config, missing tensor, ...).
    #[error("{0}")]
    Load(String),
    /// The request is invalid (maps to HTTP 400 invalid_request_error).
    #[error("{0}")]
    InvalidRequest(String),
    /// One field of the request is invalid: `param` names it as the OpenAI-style APIs do (HTTP
    /// 400 invalid_request_error with `param` set).
    #[error("{message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    /// The prompt plus the requested output does not fit (HTTP 400 exceed_context_size_error).
    #[error("the request needs {n_prompt_tokens} prompt tokens plus output, but the context holds {n_ctx}")]
    ContextExceeded {
        n_prompt_tokens: usize,
        n_ctx: usize,
    },
    /// The wait queue is full (HTTP 429).
    #[error("the request queue is full")]
    QueueFull,
    /// The server cannot take the request with the memory it has (HTTP 503).
    #[error("{0}")]
    Overloaded(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Internal(String),
}

pub type EngineResult<T> = std::result::Result<T, EngineError>;
