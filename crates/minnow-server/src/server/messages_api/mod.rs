//! Anthropic's Messages API: `POST /v1/messages` (plain or streamed) and `POST
//! /v1/messages/count_tokens`, for clients written against it (the Anthropic SDKs, agents that
//! take a base URL).
//!
//! A body is checked and turned into a chat-completion request (`request`), so it renders and
//! runs exactly as the same conversation sent to `/v1/chat/completions`; the answer is a
//! `message` object (`object`) or its event sequence (`stream`). Errors on these routes take the
//! Messages API's shape (`error_response`). Keys may come as `x-api-key` (`auth.rs`).
//!
//! Map: `request` (body → chat request) → `generation` (the shared path to the engine) →
//! `object` / `stream` (answers).

mod object;
mod request;
mod stream;

use std::sync::Arc;

use hyper::{Response, StatusCode};
use rand::Rng;
use serde_json::json;

use super::errors::ApiError;
use super::generation;
use super::http::{json_response, Body};
use super::state::{AppState, RequestLog};
pub use request::{parse, parse_count, MessagesRequest};

/// `POST /v1/messages`, its body already parsed ([`parse`]).
pub async fn create(
    state: &Arc<AppState>,
    request: MessagesRequest,
    log: &Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let mut job = generation::prepare_chat(state, request.chat).await?;
    let suffix: u128 = rand::thread_rng().gen();
    let id = format!("msg_{:024x}", suffix >> 32);
    if request.stream {
        return stream::start(state, job, id, log.clone());
    }
    let finished = generation::run_to_end(state, &mut job, log).await?;
    let calls = job.filter_calls(&finished.tool_calls);
    let stop = generation::stop_cause(state.engine()?, &finished, &job.common.stop);
    let message = object::message(
        &id,
        &job.meta.model,
        object::content(&finished.text, &calls),
        object::stop_reason(finished.finish_reason, &stop),
        object::usage(&finished.stats),
    );
    Ok(json_response(StatusCode::OK, &message))
}

/// `POST /v1/messages/count_tokens`: the prompt a create request with this body would submit,
/// counted.
pub async fn count_tokens(
    state: &Arc<AppState>,
    request: MessagesRequest,
) -> Result<Response<Body>, ApiError> {
    let job = generation::prepare_chat(state, request.chat).await?;
    let count = json!({"input_tokens": job.request.prompt_ids.len()});
    Ok(json_response(StatusCode::OK, &count))
}

/// An error in the Messages API's shape, with the error's status.
pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.status, &object::error(error))
}
