//! `stream: true` for the Responses API: server-sent events named by their type (`event: TYPE`
//! then `data: JSON` carrying the same `type` and a `sequence_number` counting from 0):
//!
//! 1. `response.created`, `response.in_progress` (the response object, no output yet);
//! 2. per finished block: for text, the message item's `response.output_item.added` and
//!    `response.content_part.added` the first time, then `response.output_text.delta`; for a
//!    tool call, its function_call item's `response.output_item.added`, then
//!    `response.function_call_arguments.delta`;
//! 3. at the end, every item closes in output order (`response.output_text.done`,
//!    `response.content_part.done` / `response.function_call_arguments.done`, then
//!    `response.output_item.done`), and `response.completed` (or `response.incomplete` when the
//!    token limit cut the answer) carries the final object with usage.
//!
//! The message item stays open until the end because the engine may still add text after a tool
//! call (it belongs to the same answer). With `return_progress`, `minnow.prompt_progress`
//! events report a long prefill. A generation error ends the stream with `response.failed`. A
//! client that disconnects cancels the generation, and nothing is stored.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use minnow_engine::{Event, FinishReason, GenerationStats, RequestHandle, ToolCall, ToolCallDelta};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::super::errors::ApiError;
use super::super::http::{Body, ChannelBody};
use super::super::responses;
use super::super::sse;
use super::super::state::{AppState, RequestLog};
use super::items::Item;
use super::object::{self, Status};
use super::Prepared;

/// Submits the request and answers with the event stream; submission errors (queue full,
/// context exceeded) are still plain JSON errors, as no header has been sent.
pub fn start(
    state: &Arc<AppState>,
    mut prepared: Prepared,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let handle = engine.submit(std::mem::take(&mut prepared.job.request))?;
    let (tx, body) = ChannelBody::channel();
    let stream = EventStream {
        state: state.clone(),
        prepared,
        tx,
        log,
        sequence: 0,
        items: Vec::new(),
        message: None,
        calls: Vec::new(),
    };
    tokio::spawn(stream.run(handle));
    Ok(sse::event_stream(body))
}

/// The client is gone; stop work.
struct Disconnected;

struct EventStream {
    state: Arc<AppState>,
    prepared: Prepared,
    tx: mpsc::Sender<Bytes>,
    log: Arc<RequestLog>,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// Output items in output order, as streamed so far.
    items: Vec<Item>,
    /// Output index of the message item, once text has arrived.
    message: Option<usize>,
    /// Output index of each streamed call, by the engine's call index.
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

    async fn send_raw(&self, frame: Bytes) -> Result<(), Disconnected> {
        self.tx.send(frame).await.map_err(|_| Disconnected)
    }

    async fn emit(&mut self, kind: &str, mut payload: Value) -> Result<(), Disconnected> {
        payload["type"] = json!(kind);
        payload["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.send_raw(Bytes::from(format!("event: {kind}\ndata: {payload}\n\n")))
            .await
    }

    fn object(&self, status: &Status, stats: Option<&GenerationStats>) -> Value {
        object::build(&self.prepared.header, status, &self.items, stats)
    }

    async fn pump(&mut self, handle: &mut RequestHandle) -> Result<(), Disconnected> {
        let initial = self.object(&Status::InProgress, None);
        self.emit("response.created", json!({ "response": initial }))
            .await?;
        self.emit("response.in_progress", json!({ "response": initial }))
            .await?;

        let period = self.state.config.keep_alive;
        let mut keep_alive = interval_at(Instant::now() + period, period);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let event = tokio::select! {
                biased;
                _ = self.tx.closed() => return Err(Disconnected),
                event = handle.next_event() => event,
                _ = keep_alive.tick() => {
                    self.send_raw(Bytes::from_static(b": keep-alive\n\n")).await?;
                    continue;
                }
            };
            keep_alive.reset();
            match event {
                Some(Event::PrefillProgress {
                    total,
                    cached,
                    processed,
                    elapsed_ms,
                }) => {
                    if self.prepared.return_progress {
                        let progress = json!({
                            "total": total,
                            "cache": cached,
                            "processed": processed,
                            "time_ms": elapsed_ms,
                        });
                        self.emit("minnow.prompt_progress", progress).await?;
                    }
                }
                Some(Event::Block {
                    text_delta,
                    tool_call_deltas,
                    ..
                }) => {
                    if !text_delta.is_empty() {
                        self.text_delta(&text_delta).await?;
                    }
                    let deltas = self.prepared.job.filter_deltas(&tool_call_deltas);
                    for delta in &deltas {
                        self.call_delta(delta).await?;
                    }
                }
                Some(Event::Done {
                    finish_reason,
                    text,
                    tool_calls,
                    stats,
                    ..
                }) => {
                    self.state.metrics.record_generation(&stats);
                    self.log.set_generation(&stats);
                    self.log
                        .set_outcome(responses::finish_reason(finish_reason));
                    let calls = self.prepared.job.filter_calls(&tool_calls);
                    // The generation is complete: a client leaving during the last events
                    // cancels nothing, and the response is stored all the same.
                    let _ = self.finish(finish_reason, &text, &calls, &stats).await;
                    return Ok(());
                }
                Some(Event::Error(message)) => {
                    self.log.set_outcome(format!("error: {message}"));
                    let failed = self.object(&Status::Failed(message), None);
                    return self
                        .emit("response.failed", json!({ "response": failed }))
                        .await;
                }
                None => {
                    let message = "the engine ended the request without a result";
                    self.log.set_outcome(format!("error: {message}"));
                    let failed = self.object(&Status::Failed(message.into()), None);
                    return self
                        .emit("response.failed", json!({ "response": failed }))
                        .await;
                }
            }
        }
    }

    async fn open_message(&mut self) -> Result<usize, Disconnected> {
        let index = self.items.len();
        let item = object::message_item("");
        let id = item.id().unwrap_or_default().to_string();
        let mut added = item.to_json("in_progress");
        added["content"] = json!([]);
        self.items.push(item);
        self.message = Some(index);
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        )
        .await?;
        self.emit(
            "response.content_part.added",
            json!({
                "item_id": id,
                "output_index": index,
                "content_index": 0,
                "part": super::items::output_text(""),
            }),
        )
        .await?;
        Ok(index)
    }

    async fn text_delta(&mut self, delta: &str) -> Result<(), Disconnected> {
        let index = match self.message {
            Some(index) => index,
            None => self.open_message().await?,
        };
        let Item::Message { id, text, .. } = &mut self.items[index] else {
            return Ok(());
        };
        text.push_str(delta);
        let id = id.clone();
        self.emit(
            "response.output_text.delta",
            json!({
                "item_id": id,
                "output_index": index,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            }),
        )
        .await
    }

    /// The first fragment of a call (id and name) opens its item; later ones add arguments.
    async fn call_delta(&mut self, delta: &ToolCallDelta) -> Result<(), Disconnected> {
        if let (Some(call_id), Some(name)) = (&delta.id, &delta.name) {
            self.open_call(
                delta.index,
                &ToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                },
            )
            .await?;
        }
        if delta.arguments.is_empty() {
            return Ok(());
        }
        let Some(index) = self.call_index(delta.index) else {
            return Ok(());
        };
        let Item::FunctionCall { id, arguments, .. } = &mut self.items[index] else {
            return Ok(());
        };
        arguments.push_str(&delta.arguments);
        let id = id.clone();
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": delta.arguments}),
        )
        .await
    }

    async fn open_call(
        &mut self,
        engine_index: usize,
        call: &ToolCall,
    ) -> Result<(), Disconnected> {
        let index = self.items.len();
        let item = object::call_item(call);
        let added = item.to_json("in_progress");
        self.items.push(item);
        self.calls.push((engine_index, index));
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        )
        .await
    }

    fn call_index(&self, engine_index: usize) -> Option<usize> {
        self.calls
            .iter()
            .find(|(call, _)| *call == engine_index)
            .map(|&(_, index)| index)
    }

    /// Settles every item on the engine's final text and calls (which the streamed fragments
    /// add up to), closes them in output order, sends the final object and stores the response.
    async fn finish(
        &mut self,
        finish_reason: FinishReason,
        text: &str,
        calls: &[ToolCall],
        stats: &GenerationStats,
    ) -> Result<(), Disconnected> {
        for (engine_index, call) in calls.iter().enumerate() {
            if self.call_index(engine_index).is_none() {
                self.open_call(engine_index, call).await?;
            }
            if let Some(index) = self.call_index(engine_index) {
                if let Item::FunctionCall { arguments, .. } = &mut self.items[index] {
                    *arguments = call.arguments.clone();
                }
            }
        }
        if self.message.is_none() && (!text.is_empty() || self.items.is_empty()) {
            self.open_message().await?;
        }
        if let Some(index) = self.message {
            if let Item::Message { text: streamed, .. } = &mut self.items[index] {
                *streamed = text.to_string();
            }
        }
        let status = Status::from_finish(finish_reason);
        for index in 0..self.items.len() {
            self.close_item(index, status.item_status()).await?;
        }
        let last = self.object(&status, Some(stats));
        self.prepared
            .remember(&self.state, &last, self.items.clone());
        self.emit(status.final_event(), json!({ "response": last }))
            .await
    }

    async fn close_item(&mut self, index: usize, status: &str) -> Result<(), Disconnected> {
        let item = self.items[index].clone();
        let id = item.id().unwrap_or_default().to_string();
        match &item {
            Item::Message { text, .. } => {
                self.emit(
                    "response.output_text.done",
                    json!({
                        "item_id": id,
                        "output_index": index,
                        "content_index": 0,
                        "text": text,
                        "logprobs": [],
                    }),
                )
                .await?;
                self.emit(
                    "response.content_part.done",
                    json!({
                        "item_id": id,
                        "output_index": index,
                        "content_index": 0,
                        "part": super::items::output_text(text),
                    }),
                )
                .await?;
            }
            Item::FunctionCall {
                name, arguments, ..
            } => {
                self.emit(
                    "response.function_call_arguments.done",
                    json!({
                        "item_id": id,
                        "output_index": index,
                        "name": name,
                        "arguments": arguments,
                    }),
                )
                .await?;
            }
            Item::FunctionCallOutput { .. } => {}
        }
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item.to_json(status)}),
        )
        .await
    }
}
