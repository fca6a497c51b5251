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

use hyper::Response;
use minnow_engine::{BlockStats, FinishReason, GenerationStats, ToolCall, ToolCallDelta};
use serde_json::{json, Value};

use super::super::errors::ApiError;
use super::super::generation::Finished;
use super::super::http::Body;
use super::super::sse::{self, Disconnected, Frames, Out};
use super::super::state::{AppState, RequestLog};
use super::items::Item;
use super::object::{self, Status};
use super::prepared::Prepared;

/// Submits the request and answers with the event stream.
pub fn start(
    state: &Arc<AppState>,
    mut prepared: Prepared,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let request = std::mem::take(&mut prepared.job.request);
    let frames = ResponsesFrames {
        state: state.clone(),
        prepared,
        sequence: 0,
        items: Vec::new(),
        message: None,
        calls: Vec::new(),
    };
    let keep_alive = Some(state.config.keep_alive);
    sse::submit(state, log, request, frames, keep_alive)
}

/// The Responses API's events for one request (`sse::drive` runs the stream).
struct ResponsesFrames {
    state: Arc<AppState>,
    prepared: Prepared,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// Output items in output order, as streamed so far.
    items: Vec<Item>,
    /// Output index of the message item, once text has arrived.
    message: Option<usize>,
    /// Output index of each streamed call, by the engine's call index.
    calls: Vec<(usize, usize)>,
}

impl Frames for ResponsesFrames {
    async fn start(&mut self, out: &Out) -> Result<(), Disconnected> {
        let initial = self.object(&Status::InProgress, None);
        self.emit(out, "response.created", json!({ "response": initial }))
            .await?;
        self.emit(out, "response.in_progress", json!({ "response": initial }))
            .await
    }

    async fn progress(
        &mut self,
        out: &Out,
        total: usize,
        cached: usize,
        processed: usize,
        elapsed_ms: u64,
    ) -> Result<(), Disconnected> {
        if !self.prepared.return_progress {
            return Ok(());
        }
        let progress = json!({
            "total": total,
            "cache": cached,
            "processed": processed,
            "time_ms": elapsed_ms,
        });
        self.emit(out, "minnow.prompt_progress", progress).await
    }

    async fn block(
        &mut self,
        out: &Out,
        text_delta: String,
        tool_call_deltas: Vec<ToolCallDelta>,
        _stats: BlockStats,
    ) -> Result<(), Disconnected> {
        if !text_delta.is_empty() {
            self.text_delta(out, &text_delta).await?;
        }
        for delta in &self.prepared.job.filter_deltas(&tool_call_deltas) {
            self.call_delta(out, delta).await?;
        }
        Ok(())
    }

    async fn done(&mut self, out: &Out, finished: Finished) -> Result<(), Disconnected> {
        // The response is stored even if the client leaves during the last events.
        let calls = self.prepared.job.filter_calls(&finished.tool_calls);
        self.finish(
            out,
            finished.finish_reason,
            &finished.text,
            &calls,
            &finished.stats,
        )
        .await
    }

    async fn fail(&mut self, out: &Out, error: &ApiError) -> Result<(), Disconnected> {
        let failed = self.object(&Status::Failed(error.message.clone()), None);
        self.emit(out, "response.failed", json!({ "response": failed }))
            .await
    }
}

impl ResponsesFrames {
    async fn emit(
        &mut self,
        out: &Out,
        kind: &str,
        mut payload: Value,
    ) -> Result<(), Disconnected> {
        payload["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.named(kind, payload).await
    }

    fn object(&self, status: &Status, stats: Option<&GenerationStats>) -> Value {
        object::build(&self.prepared.header, status, &self.items, stats)
    }

    async fn open_message(&mut self, out: &Out) -> Result<usize, Disconnected> {
        let index = self.items.len();
        let item = object::message_item("");
        let id = item.id().unwrap_or_default().to_string();
        let mut added = item.to_json("in_progress");
        added["content"] = json!([]);
        self.items.push(item);
        self.message = Some(index);
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        )
        .await?;
        self.emit(
            out,
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

    async fn text_delta(&mut self, out: &Out, delta: &str) -> Result<(), Disconnected> {
        let index = match self.message {
            Some(index) => index,
            None => self.open_message(out).await?,
        };
        let Item::Message { id, text, .. } = &mut self.items[index] else {
            return Ok(());
        };
        text.push_str(delta);
        let id = id.clone();
        self.emit(
            out,
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
    async fn call_delta(&mut self, out: &Out, delta: &ToolCallDelta) -> Result<(), Disconnected> {
        if let (Some(call_id), Some(name)) = (&delta.id, &delta.name) {
            self.open_call(
                out,
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
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": delta.arguments}),
        )
        .await
    }

    async fn open_call(
        &mut self,
        out: &Out,
        engine_index: usize,
        call: &ToolCall,
    ) -> Result<(), Disconnected> {
        let index = self.items.len();
        let item = object::call_item(call);
        let added = item.to_json("in_progress");
        self.items.push(item);
        self.calls.push((engine_index, index));
        self.emit(
            out,
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
        out: &Out,
        finish_reason: FinishReason,
        text: &str,
        calls: &[ToolCall],
        stats: &GenerationStats,
    ) -> Result<(), Disconnected> {
        for (engine_index, call) in calls.iter().enumerate() {
            if self.call_index(engine_index).is_none() {
                self.open_call(out, engine_index, call).await?;
            }
            if let Some(index) = self.call_index(engine_index) {
                if let Item::FunctionCall { arguments, .. } = &mut self.items[index] {
                    *arguments = call.arguments.clone();
                }
            }
        }
        if self.message.is_none() && (!text.is_empty() || self.items.is_empty()) {
            self.open_message(out).await?;
        }
        if let Some(index) = self.message {
            if let Item::Message { text: streamed, .. } = &mut self.items[index] {
                *streamed = text.to_string();
            }
        }
        let status = Status::from_finish(finish_reason);
        for index in 0..self.items.len() {
            self.close_item(out, index, status.item_status()).await?;
        }
        let last = self.object(&status, Some(stats));
        self.prepared
            .remember(&self.state, &last, self.items.clone());
        self.emit(out, status.final_event(), json!({ "response": last }))
            .await
    }

    async fn close_item(
        &mut self,
        out: &Out,
        index: usize,
        status: &str,
    ) -> Result<(), Disconnected> {
        let item = self.items[index].clone();
        let id = item.id().unwrap_or_default().to_string();
        match &item {
            Item::Message { text, .. } => {
                self.emit(
                    out,
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
                    out,
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
                    out,
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
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item.to_json(status)}),
        )
        .await
    }
}

#[cfg(test)]
mod tests {

    use minnow_engine::{DecodeParams, GenerateRequest};
    use serde_json::Map;

    use bytes::Bytes;
    use tokio::sync::mpsc;

    use super::*;
    use crate::server::config::ServerConfig;
    use crate::server::generation::Job;
    use crate::server::openai::{CommonOptions, MaxTokens};
    use crate::server::responses::{Endpoint, ResponseMeta};
    use crate::server::responses_api::items::Role;
    use crate::server::responses_api::object::Header;

    fn user() -> Item {
        Item::Message {
            id: None,
            role: Role::User,
            text: "q".into(),
        }
    }

    /// A stream over a bare state (no engine: the event methods never touch it).
    fn stream() -> (ResponsesFrames, Out, mpsc::Receiver<Bytes>) {
        let config = ServerConfig {
            body_limit: 1 << 20,
            responses_max: 4,
            responses_max_bytes: usize::MAX,
            ..crate::server::config::test_config("m".into())
        };
        let state = Arc::new(AppState::new(config));
        let job = Job {
            meta: ResponseMeta {
                endpoint: Endpoint::Chat,
                id: "unused".into(),
                created: 0,
                model: "m".into(),
            },
            common: CommonOptions {
                model: None,
                max_tokens: MaxTokens::ServerDefault,
                stop: Vec::new(),
                params: DecodeParams::default(),
                stream: true,
                include_usage: false,
                return_progress: false,
                timings_per_token: false,
                cache_prompt: None,
                cache_salt: None,
                sse_ping_interval: None,
                constraint: None,
            },
            request: GenerateRequest::default(),
            single_tool_call: false,
        };
        let prepared = Prepared {
            job,
            header: Header {
                id: "resp_test".into(),
                created_at: 1,
                model: "m".into(),
                echo: Map::new(),
            },
            input: vec![user()],
            parent: None,
            store: true,
            return_progress: false,
        };
        let (out, rx) = Out::test_pair();
        let stream = ResponsesFrames {
            state,
            prepared,
            sequence: 0,
            items: Vec::new(),
            message: None,
            calls: Vec::new(),
        };
        (stream, out, rx)
    }

    fn events(mut rx: mpsc::Receiver<Bytes>) -> Vec<Value> {
        let mut events = Vec::new();
        while let Ok(frame) = rx.try_recv() {
            let frame = std::str::from_utf8(&frame).unwrap().to_string();
            let (name, data) = frame.trim_end().split_once('\n').unwrap();
            let value: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(
                Some(value["type"].as_str().unwrap()),
                name.strip_prefix("event: ")
            );
            events.push(value);
        }
        events
    }

    /// Text, then a call, then more text: the message stays open (output index 0), the call is
    /// item 1, and everything closes in output order at the end.
    #[tokio::test]
    async fn text_and_calls_stream_in_output_order() {
        let (mut stream, out, rx) = stream();
        let header = ToolCallDelta {
            index: 0,
            id: Some("call_0".into()),
            name: Some("f".into()),
            arguments: String::new(),
        };
        let arguments = ToolCallDelta {
            index: 0,
            id: None,
            name: None,
            arguments: "{\"a\":1}".into(),
        };
        assert!(stream.text_delta(&out, "Checking.").await.is_ok());
        assert!(stream.call_delta(&out, &header).await.is_ok());
        assert!(stream.call_delta(&out, &arguments).await.is_ok());
        assert!(stream.text_delta(&out, " Done.").await.is_ok());
        let calls = [ToolCall {
            id: "call_0".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        }];
        let stats = GenerationStats::default();
        let finished = stream
            .finish(
                &out,
                FinishReason::ToolCalls,
                "Checking. Done.",
                &calls,
                &stats,
            )
            .await;
        assert!(finished.is_ok());
        let state = stream.state.clone();
        drop((stream, out));

        let events = events(rx);
        let kinds: Vec<(&str, u64)> = events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap(),
                    e["output_index"].as_u64().unwrap_or(99),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("response.output_item.added", 0),
                ("response.content_part.added", 0),
                ("response.output_text.delta", 0),
                ("response.output_item.added", 1),
                ("response.function_call_arguments.delta", 1),
                ("response.output_text.delta", 0),
                ("response.output_text.done", 0),
                ("response.content_part.done", 0),
                ("response.output_item.done", 0),
                ("response.function_call_arguments.done", 1),
                ("response.output_item.done", 1),
                ("response.completed", 99),
            ]
        );
        for (n, event) in events.iter().enumerate() {
            assert_eq!(event["sequence_number"], n);
        }
        assert_eq!(events[3]["item"]["type"], "function_call");
        assert_eq!(events[3]["item"]["call_id"], "call_0");
        assert_eq!(events[3]["item"]["arguments"], "");
        assert_eq!(events[9]["arguments"], "{\"a\":1}");
        assert_eq!(events[9]["name"], "f");
        assert_eq!(events[6]["text"], "Checking. Done.");
        let output = &events[11]["response"]["output"];
        assert_eq!(output[0]["content"][0]["text"], "Checking. Done.");
        assert_eq!(output[1]["status"], "completed");

        // Stored: this turn's input, then the output in stream order.
        let stored = state.responses.get("resp_test").unwrap();
        let conversation = stored.turn.conversation();
        assert_eq!(conversation.len(), 3);
        assert_eq!(conversation[0], user());
        assert!(
            matches!(&conversation[1], Item::Message { text, .. } if text == "Checking. Done.")
        );
        assert!(
            matches!(&conversation[2], Item::FunctionCall { call_id, .. } if call_id == "call_0")
        );
        let object: serde_json::Value = serde_json::from_str(&stored.object).unwrap();
        assert_eq!(object, events[11]["response"]);
    }

    /// A call cut by the token limit never streamed; an empty answer still gets its message.
    #[tokio::test]
    async fn an_empty_incomplete_answer_is_one_empty_message() {
        let (mut stream, out, rx) = stream();
        let stats = GenerationStats::default();
        assert!(stream
            .finish(&out, FinishReason::Length, "", &[], &stats)
            .await
            .is_ok());
        drop((stream, out));
        let events = events(rx);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            vec![
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.incomplete",
            ]
        );
        let last = &events[5]["response"];
        assert_eq!(last["status"], "incomplete");
        assert_eq!(last["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(last["output"][0]["status"], "incomplete");
    }
}
