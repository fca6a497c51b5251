//! `stream: true` for the Messages API: server-sent events named by their type (`event: TYPE`,
//! then `data: JSON` carrying the same `type`):
//!
//! 1. `message_start` (the message, empty, with the prompt's token count), then `ping`;
//! 2. per finished block: text opens a `text` content block (`content_block_start`) the first
//!    time after anything else and continues it with `text_delta`s; a tool call opens a
//!    `tool_use` block (id, name, empty input) and sends its arguments as `input_json_delta`s;
//!    a block closes (`content_block_stop`) when the next one opens;
//! 3. at the end the open block closes, `message_delta` carries `stop_reason`, `stop_sequence`
//!    and the usage, and `message_stop` ends the stream.
//!
//! Keep-alives are `ping` events. A generation error ends the stream with an `error` event. A
//! client that disconnects cancels the generation (`sse::drive` runs the stream).

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use minnow_engine::{BlockStats, ToolCallDelta};
use serde_json::{json, Value};

use super::super::errors::ApiError;
use super::super::generation::{self, Finished, Job};
use super::super::http::Body;
use super::super::responses::StopCause;
use super::super::sse::{self, Disconnected, Frames, Out};
use super::super::state::{AppState, RequestLog};
use super::object;

/// Submits the job and answers with the event stream.
pub fn start(
    state: &Arc<AppState>,
    mut job: Job,
    id: String,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let request = std::mem::take(&mut job.request);
    let prompt_tokens = request.prompt_ids.len();
    let frames = MessagesFrames {
        state: state.clone(),
        job,
        id,
        prompt_tokens,
        blocks: 0,
        open: None,
        calls: Vec::new(),
    };
    let keep_alive = Some(state.config.keep_alive);
    sse::submit(state, log, request, frames, keep_alive)
}

/// The content block being streamed.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text(usize),
    Call(usize),
}

/// The Messages API's events for one request.
struct MessagesFrames {
    state: Arc<AppState>,
    job: Job,
    /// The message's id.
    id: String,
    prompt_tokens: usize,
    /// Content blocks started so far (the next block's index).
    blocks: usize,
    open: Option<Open>,
    /// The block index of each streamed call, by the engine's call index.
    calls: Vec<(usize, usize)>,
}

impl Frames for MessagesFrames {
    fn keep_alive(&self) -> Bytes {
        Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n")
    }

    async fn start(&mut self, out: &Out) -> Result<(), Disconnected> {
        let usage = json!({"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": 0});
        let start = object::message(
            &self.id,
            &self.job.meta.model,
            json!([]),
            ("", Value::Null),
            usage,
        );
        out.named("message_start", json!({ "message": start }))
            .await?;
        out.named("ping", json!({})).await
    }

    async fn block(
        &mut self,
        out: &Out,
        text_delta: String,
        tool_call_deltas: Vec<ToolCallDelta>,
        _stats: BlockStats,
    ) -> Result<(), Disconnected> {
        if !text_delta.is_empty() {
            self.text(out, &text_delta).await?;
        }
        for delta in self.job.filter_deltas(&tool_call_deltas) {
            self.call(out, &delta).await?;
        }
        Ok(())
    }

    /// An empty text block for an answer with no content (as the plain answer holds one), the
    /// open block's end, `message_delta` and `message_stop`.
    async fn done(&mut self, out: &Out, finished: Finished) -> Result<(), Disconnected> {
        if self.blocks == 0 {
            let block = json!({"type": "text", "text": ""});
            out.named(
                "content_block_start",
                json!({"index": 0, "content_block": block}),
            )
            .await?;
            self.blocks = 1;
            self.open = Some(Open::Text(0));
        }
        self.close(out).await?;
        let stop = match self.state.engine() {
            Ok(engine) => generation::stop_cause(engine, &finished, &self.job.common.stop),
            Err(_) => StopCause::Eos,
        };
        let (reason, sequence) = object::stop_reason(finished.finish_reason, &stop);
        out.named(
            "message_delta",
            json!({
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": object::usage(&finished.stats),
            }),
        )
        .await?;
        out.named("message_stop", json!({})).await
    }

    async fn fail(&mut self, out: &Out, error: &ApiError) -> Result<(), Disconnected> {
        out.named("error", object::error(error)).await
    }
}

impl MessagesFrames {
    /// Closes the open block, if any.
    async fn close(&mut self, out: &Out) -> Result<(), Disconnected> {
        if let Some(Open::Text(index) | Open::Call(index)) = self.open.take() {
            out.named("content_block_stop", json!({ "index": index }))
                .await?;
        }
        Ok(())
    }

    /// Starts the next content block.
    async fn open_block(&mut self, out: &Out, block: Value) -> Result<usize, Disconnected> {
        self.close(out).await?;
        let index = self.blocks;
        self.blocks += 1;
        out.named(
            "content_block_start",
            json!({"index": index, "content_block": block}),
        )
        .await?;
        Ok(index)
    }

    async fn text(&mut self, out: &Out, text: &str) -> Result<(), Disconnected> {
        let index = match self.open {
            Some(Open::Text(index)) => index,
            _ => {
                let index = self
                    .open_block(out, json!({"type": "text", "text": ""}))
                    .await?;
                self.open = Some(Open::Text(index));
                index
            }
        };
        let delta = json!({"type": "text_delta", "text": text});
        out.named(
            "content_block_delta",
            json!({"index": index, "delta": delta}),
        )
        .await
    }

    async fn call(&mut self, out: &Out, delta: &ToolCallDelta) -> Result<(), Disconnected> {
        let known = self
            .calls
            .iter()
            .find(|(call, _)| *call == delta.index)
            .map(|(_, block)| *block);
        let index = match known {
            Some(index) => index,
            None => {
                let block = json!({
                    "type": "tool_use",
                    "id": delta.id.clone().unwrap_or_default(),
                    "name": delta.name.clone().unwrap_or_default(),
                    "input": {},
                });
                let index = self.open_block(out, block).await?;
                self.calls.push((delta.index, index));
                self.open = Some(Open::Call(index));
                index
            }
        };
        if delta.arguments.is_empty() {
            return Ok(());
        }
        let fragment = json!({"type": "input_json_delta", "partial_json": delta.arguments});
        out.named(
            "content_block_delta",
            json!({"index": index, "delta": fragment}),
        )
        .await
    }
}
