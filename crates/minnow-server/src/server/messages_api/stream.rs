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
//! client that disconnects cancels the generation.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use minnow_engine::{Event, RequestHandle, ToolCallDelta};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::super::errors::ApiError;
use super::super::generation::{self, Finished, Job};
use super::super::http::{Body, ChannelBody};
use super::super::responses;
use super::super::sse;
use super::super::state::{AppState, RequestLog};
use super::object;

/// Submits the job and answers with the event stream; submission errors (queue full, context
/// exceeded) are still plain JSON errors, as no header has been sent.
pub fn start(
    state: &Arc<AppState>,
    mut job: Job,
    id: String,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let prompt_tokens = job.request.prompt_ids.len();
    let handle = engine.submit(std::mem::take(&mut job.request))?;
    let (tx, body) = ChannelBody::channel();
    let stream = EventStream {
        state: state.clone(),
        job,
        id,
        tx,
        log,
        prompt_tokens,
        blocks: 0,
        open: None,
        calls: Vec::new(),
    };
    tokio::spawn(stream.run(handle));
    Ok(sse::event_stream(body))
}

/// The client is gone; stop work.
struct Disconnected;

/// The content block being streamed.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text(usize),
    Call(usize),
}

struct EventStream {
    state: Arc<AppState>,
    job: Job,
    /// The message's id.
    id: String,
    tx: mpsc::Sender<Bytes>,
    log: Arc<RequestLog>,
    prompt_tokens: usize,
    /// Content blocks started so far (the next block's index).
    blocks: usize,
    open: Option<Open>,
    /// The block index of each streamed call, by the engine's call index.
    calls: Vec<(usize, usize)>,
}

impl EventStream {
    async fn run(mut self, mut handle: RequestHandle) {
        if self.pump(&mut handle).await.is_err() {
            handle.cancel();
            self.state.metrics.record_cancelled();
            self.log.set_outcome("client disconnected");
        }
    }

    async fn emit(&self, kind: &str, mut payload: Value) -> Result<(), Disconnected> {
        payload["type"] = json!(kind);
        let frame = Bytes::from(format!("event: {kind}\ndata: {payload}\n\n"));
        self.tx.send(frame).await.map_err(|_| Disconnected)
    }

    async fn fail(&self, error: &ApiError) -> Result<(), Disconnected> {
        self.log.set_outcome(format!("error: {}", error.message));
        self.emit("error", object::error(error)).await
    }

    async fn pump(&mut self, handle: &mut RequestHandle) -> Result<(), Disconnected> {
        let usage = json!({"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": 0});
        let start = object::message(
            &self.id,
            &self.job.meta.model,
            json!([]),
            ("", Value::Null),
            usage,
        );
        self.emit("message_start", json!({ "message": start }))
            .await?;
        self.emit("ping", json!({})).await?;

        let period = self.state.config.keep_alive;
        let mut keep_alive = interval_at(Instant::now() + period, period);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let lifecycle = self.state.lifecycle.clone();
        let grace_over = lifecycle.grace_over();
        tokio::pin!(grace_over);
        loop {
            let event = tokio::select! {
                biased;
                _ = self.tx.closed() => return Err(Disconnected),
                // The server is going away with this message unfinished (`lifecycle.rs`).
                () = &mut grace_over => return self.fail(&ApiError::shutdown_grace_over()).await,
                event = handle.next_event() => event,
                _ = keep_alive.tick() => {
                    self.emit("ping", json!({})).await?;
                    continue;
                }
            };
            keep_alive.reset();
            match event {
                Some(Event::PrefillProgress { .. }) => {}
                Some(Event::Block {
                    text_delta,
                    tool_call_deltas,
                    ..
                }) => {
                    if !text_delta.is_empty() {
                        self.text(&text_delta).await?;
                    }
                    for delta in self.job.filter_deltas(&tool_call_deltas) {
                        self.call(&delta).await?;
                    }
                }
                Some(Event::Done {
                    finish_reason,
                    output_ids,
                    text,
                    tool_calls,
                    stats,
                }) => {
                    self.state.metrics.record_generation(&stats);
                    self.log.set_generation(&stats);
                    self.log
                        .set_outcome(responses::finish_reason(finish_reason));
                    let finished = Finished {
                        finish_reason,
                        output_ids,
                        text,
                        tool_calls,
                        stats,
                    };
                    // The generation is complete: a client leaving during the last events
                    // cancels nothing.
                    let _ = self.finish(&finished).await;
                    return Ok(());
                }
                Some(Event::Error(error)) => return self.fail(&ApiError::from(error)).await,
                None => {
                    let error = ApiError::internal("the engine ended the request without a result");
                    return self.fail(&error).await;
                }
            }
        }
    }

    /// Closes the open block, if any.
    async fn close(&mut self) -> Result<(), Disconnected> {
        if let Some(Open::Text(index) | Open::Call(index)) = self.open.take() {
            self.emit("content_block_stop", json!({ "index": index }))
                .await?;
        }
        Ok(())
    }

    async fn text(&mut self, text: &str) -> Result<(), Disconnected> {
        let index = match self.open {
            Some(Open::Text(index)) => index,
            _ => {
                self.close().await?;
                let index = self.blocks;
                self.blocks += 1;
                self.open = Some(Open::Text(index));
                let block = json!({"type": "text", "text": ""});
                self.emit(
                    "content_block_start",
                    json!({"index": index, "content_block": block}),
                )
                .await?;
                index
            }
        };
        let delta = json!({"type": "text_delta", "text": text});
        self.emit(
            "content_block_delta",
            json!({"index": index, "delta": delta}),
        )
        .await
    }

    async fn call(&mut self, delta: &ToolCallDelta) -> Result<(), Disconnected> {
        let known = self
            .calls
            .iter()
            .find(|(call, _)| *call == delta.index)
            .map(|(_, block)| *block);
        let index = match known {
            Some(index) => index,
            None => {
                self.close().await?;
                let index = self.blocks;
                self.blocks += 1;
                self.calls.push((delta.index, index));
                self.open = Some(Open::Call(index));
                let block = json!({
                    "type": "tool_use",
                    "id": delta.id.clone().unwrap_or_default(),
                    "name": delta.name.clone().unwrap_or_default(),
                    "input": {},
                });
                self.emit(
                    "content_block_start",
                    json!({"index": index, "content_block": block}),
                )
                .await?;
                index
            }
        };
        if delta.arguments.is_empty() {
            return Ok(());
        }
        let fragment = json!({"type": "input_json_delta", "partial_json": delta.arguments});
        self.emit(
            "content_block_delta",
            json!({"index": index, "delta": fragment}),
        )
        .await
    }

    /// The last events: an empty text block for an answer with no content (as the plain answer
    /// holds one), the open block's end, `message_delta` and `message_stop`.
    async fn finish(&mut self, finished: &Finished) -> Result<(), Disconnected> {
        if self.blocks == 0 {
            let block = json!({"type": "text", "text": ""});
            self.emit(
                "content_block_start",
                json!({"index": 0, "content_block": block}),
            )
            .await?;
            self.blocks = 1;
            self.open = Some(Open::Text(0));
        }
        self.close().await?;
        let stop = match self.state.engine() {
            Ok(engine) => generation::native_stop(engine, finished, &self.job.common.stop),
            Err(_) => responses::NativeStop::Eos,
        };
        let (reason, sequence) = object::stop_reason(finished.finish_reason, &stop);
        self.emit(
            "message_delta",
            json!({
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": object::usage(&finished.stats),
            }),
        )
        .await?;
        self.emit("message_stop", json!({})).await
    }
}
