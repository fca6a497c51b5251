//! minnow-engine turns a LLaDA2 checkpoint into a text generator: it renders the checkpoint's own
//! chat template, tokenizes, lays the request out in 32-token blocks, runs one of the three
//! block-diffusion algorithms (2.0 low-confidence, 2.1 joint, 2.2 indel) over a
//! [`minnow_model::ModelRunner`], and streams each finished block as text, tool-call deltas and
//! statistics.
//!
//! The API is the items of this page: load an [`Engine`] with [`EngineOptions`], turn a
//! [`ChatPrompt`] into prompt ids with [`Engine::chat_prompt_ids`], [`Engine::submit`] a
//! [`GenerateRequest`] (checked by [`Engine::validate`]; [`DECODE_PARAMS`] lists the decoding
//! parameters' ranges), and read its [`Event`]s from the [`RequestHandle`]; every failure is an
//! [`EngineError`]. The modules hidden from these docs are the engine's insides, public only for
//! minnow's own server, benches and tests.

mod api;
#[doc(hidden)]
pub mod constraint;
#[doc(hidden)]
pub mod decode;
#[doc(hidden)]
pub mod engine;
mod error;
#[cfg(test)]
mod import_graph;
mod kv_cache;
mod model_files;
#[doc(hidden)]
pub mod output;
#[doc(hidden)]
pub mod sampling;
#[doc(hidden)]
pub mod text;

pub use api::*;
pub use decode::params::{param_spec, ParamKind, ParamSpec, DECODE_PARAMS};
pub use decode::request::TraceStep;
pub use engine::{
    select_runner, CancelToken, ChatIdsOptions, Engine, EngineOptions, EngineStats, LoadProgress,
    ModelInfo, RenderedCheck, RequestHandle, TraceLog, ValidatedRequest, BATCH_SIZE_BUCKETS,
};
pub use error::{EngineError, EngineResult};
pub use kv_cache::CacheStats;
pub use minnow_runtime::device::DeviceRequest;
pub use text::tokenizer::{SpecialTokens, Tokenizer};
