//! minnow-engine turns a LLaDA2 checkpoint into a text generator: it renders the checkpoint's own
//! chat template, tokenizes, lays the request out in 32-token blocks, runs one of the three
//! block-diffusion algorithms (2.0 low-confidence, 2.1 joint, 2.2 indel) over a
//! [`minnow_model::ModelRunner`], and streams each finished block as text, tool-call deltas and
//! statistics. Its public API ([`api`], [`engine`]) is what the server, the CLI and embedding
//! programs use.

pub mod api;
pub mod chat_template;
pub mod constraint;
pub mod decode;
pub mod engine;
mod model_files;
pub mod prefix_cache;
pub mod sampling;
pub mod text_stream;
pub mod tokenizer;
pub mod tool_calls;

pub use api::*;
pub use engine::{
    CancelToken, Engine, EngineError, EngineOptions, EngineResult, EngineStats, LoadProgress,
    ModelInfo, RequestHandle, BATCH_SIZE_BUCKETS,
};
