//! The embeddable engine: load a checkpoint, render prompts, submit requests, stream events,
//! cancel. One worker thread owns the model runner; up to `parallel` requests are decoded at once
//! (interleaved step by step), the rest wait in a bounded FIFO queue.
//!
//! CONTRACT: the signatures in this file are what minnow-server and the CLI are written against.
//! [decode] implements the bodies.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use minnow_runtime::device::DeviceRequest;

use crate::api::{ChatPrompt, DecodeParams, Event, GenerateRequest, RenderedPrompt};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint could not be loaded (bad config, missing tensor, ...).
    #[error("{0}")]
    Load(String),
    /// The request is invalid (maps to HTTP 400 invalid_request_error).
    #[error("{0}")]
    InvalidRequest(String),
    /// The prompt plus the requested output does not fit (HTTP 400 exceed_context_size_error).
    #[error("the request needs {n_prompt_tokens} prompt tokens plus output, but the context holds {n_ctx}")]
    ContextExceeded { n_prompt_tokens: usize, n_ctx: usize },
    /// The wait queue is full (HTTP 429).
    #[error("the request queue is full")]
    QueueFull,
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Internal(String),
}

pub type EngineResult<T> = std::result::Result<T, EngineError>;

/// How to load an engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub device: DeviceRequest,
    /// CPU worker threads; `None` = all cores.
    pub threads: Option<usize>,
    /// Requests decoded at once.
    pub parallel: usize,
    /// Requests that may wait for a free slot; more are refused with `QueueFull`.
    pub queue_capacity: usize,
    /// Context limit in tokens; `None` = the checkpoint's `max_position_embeddings`.
    pub max_context: Option<usize>,
    /// Server/CLI-wide decode defaults; per-request values override them.
    pub defaults: DecodeParams,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: DeviceRequest::Auto,
            threads: None,
            parallel: 1,
            queue_capacity: 64,
            max_context: None,
            defaults: DecodeParams::default(),
        }
    }
}

/// Static facts about the loaded model, for `inspect`, `/props` and `/v1/models`.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub path: PathBuf,
    /// "LLaDA2.0", "LLaDA2.1" or "LLaDA2.2".
    pub family: String,
    pub block_size: usize,
    pub vocab_size: usize,
    pub n_ctx: usize,
    pub device: String,
    /// The template source that `render_chat` uses.
    pub chat_template: String,
    /// The checkpoint family's defaults merged with `EngineOptions::defaults`, all fields set.
    pub default_params: DecodeParams,
    pub mask_token_id: u32,
    pub eos_token_id: u32,
    pub role_end_token_id: Option<u32>,
}

/// A loaded model, cheap to clone and shareable across threads.
#[derive(Clone)]
pub struct Engine {
    #[allow(dead_code)]
    inner: Arc<()>,
}

impl Engine {
    /// Loads a checkpoint directory (config, weights, tokenizer, chat template).
    pub fn load(path: &Path, options: EngineOptions) -> EngineResult<Engine> {
        let _ = (path, options);
        Err(EngineError::Internal("Engine::load is not implemented yet".into()))
    }

    pub fn info(&self) -> &ModelInfo {
        unimplemented!("[decode]")
    }

    /// Tokenizes text without adding special tokens; special-token strings map to their ids.
    pub fn tokenize(&self, text: &str) -> EngineResult<Vec<u32>> {
        let _ = text;
        unimplemented!("[decode]")
    }

    /// Decodes ids to text; `keep_special` keeps special-token strings.
    pub fn detokenize(&self, ids: &[u32], keep_special: bool) -> EngineResult<String> {
        let _ = (ids, keep_special);
        unimplemented!("[decode]")
    }

    /// Renders a conversation with the checkpoint's own chat template.
    pub fn render_chat(&self, prompt: &ChatPrompt) -> EngineResult<RenderedPrompt> {
        let _ = prompt;
        unimplemented!("[decode]")
    }

    /// Validates and queues a request. Errors here are the request's fault (or `QueueFull`);
    /// errors during generation arrive as `Event::Error`.
    pub fn submit(&self, request: GenerateRequest) -> EngineResult<RequestHandle> {
        let _ = request;
        unimplemented!("[decode]")
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        unimplemented!("[decode]")
    }

    /// Requests being decoded now.
    pub fn busy_slots(&self) -> usize {
        unimplemented!("[decode]")
    }
}

/// Cancels a request from any thread; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The caller's end of a submitted request. Dropping it cancels the request, so a server that
/// loses its client frees the slot at once.
pub struct RequestHandle {
    pub id: u64,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cancel: CancelToken,
}

impl RequestHandle {
    /// Next event, for async callers. `None` after `Done`/`Error`.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Next event, for synchronous callers (not from inside a tokio runtime).
    pub fn blocking_next_event(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }

    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
