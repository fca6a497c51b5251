//! Server-sent events for `stream: true`.
//!
//! `drive` is the loop every streaming API shares: it forwards the engine's events to the API's
//! `Frames`, sends keep-alives while nothing else is sent (queued, long prefill), ends an
//! unfinished stream when the shutdown grace is over, records the finished generation, and when
//! the client disconnects (the body channel closes) drops the engine handle at once, so the
//! engine frees the slot.
//!
//! This module's own frames are OpenAI's (`OpenAiFrames`): a role chunk (chat), one chunk per
//! finished block with its text/tool-call deltas and a `minnow` field of block statistics, a final
//! chunk with `finish_reason`, llama-server `timings` and the request totals, an optional usage
//! chunk with empty `choices`, then `data: [DONE]`; keep-alives are comments and, with
//! `return_progress`, llama-server `prompt_progress` chunks report the prefill. llama-server's
//! native `/completion` streams its own objects instead: one `{"content": ..., "stop": false}`
//! per block, then the final `stop: true` object, and no `[DONE]` (as llama-server does). The
//! Responses and Messages APIs bring their own frames (`responses_api/stream.rs`,
//! `messages_api/stream.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use minnow_engine::{
    BlockStats, Event, GenerateRequest, GenerationStats, RequestHandle, ToolCallDelta,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::errors::ApiError;
use super::generation::{self, Finished, Job};
use super::http::{Body, ChannelBody};
use super::responses::{self, ChunkContent, Endpoint};
use super::state::{AppState, RequestLog};

/// The client is gone; stop work.
pub struct Disconnected;

/// The sending end of an event stream's body.
pub struct Out {
    tx: mpsc::Sender<Bytes>,
}

impl Out {
    /// A new stream: its sender and the response around its body.
    pub fn open() -> (Out, Response<Body>) {
        let (tx, body) = ChannelBody::channel();
        (Out { tx }, event_stream(body))
    }

    /// A sender whose frames the returned receiver reads (for tests of frames).
    #[cfg(test)]
    pub fn test_pair() -> (Out, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(256);
        (Out { tx }, rx)
    }

    pub async fn raw(&self, frame: Bytes) -> Result<(), Disconnected> {
        self.tx.send(frame).await.map_err(|_| Disconnected)
    }

    /// `data: JSON`.
    pub async fn data(&self, value: &Value) -> Result<(), Disconnected> {
        self.raw(Bytes::from(format!("data: {value}\n\n"))).await
    }

    /// `event: NAME` + `data: JSON`, the data's `type` set to the name.
    pub async fn named(&self, name: &str, mut value: Value) -> Result<(), Disconnected> {
        value["type"] = json!(name);
        self.raw(Bytes::from(format!("event: {name}\ndata: {value}\n\n")))
            .await
    }
}

/// How one streaming API writes a request's events; [`drive`] calls these in order: `start`,
/// then `progress` / `block` as they come, then `done` or `fail` once. The driver has recorded
/// the generation (metrics, log) before `done` and the error's log line before `fail`.
pub trait Frames: Send {
    /// The keep-alive frame: by default an SSE comment.
    fn keep_alive(&self) -> Bytes {
        Bytes::from_static(b": keep-alive\n\n")
    }
    /// What a stream opens with (before any engine event).
    fn start(&mut self, out: &Out) -> impl Future<Output = Result<(), Disconnected>> + Send;
    /// The prefill's progress: `processed` of `total` prompt tokens (`cached` from the cache).
    /// By default not reported.
    fn progress(
        &mut self,
        out: &Out,
        total: usize,
        cached: usize,
        processed: usize,
        elapsed_ms: u64,
    ) -> impl Future<Output = Result<(), Disconnected>> + Send {
        let _ = (out, total, cached, processed, elapsed_ms);
        async { Ok(()) }
    }
    /// One finished block: its new visible text and tool-call fragments.
    fn block(
        &mut self,
        out: &Out,
        text_delta: String,
        tool_call_deltas: Vec<ToolCallDelta>,
        stats: BlockStats,
    ) -> impl Future<Output = Result<(), Disconnected>> + Send;
    /// The finished answer.
    fn done(
        &mut self,
        out: &Out,
        finished: Finished,
    ) -> impl Future<Output = Result<(), Disconnected>> + Send;
    /// A generation error, or the shutdown grace ending the stream unfinished.
    fn fail(
        &mut self,
        out: &Out,
        error: &ApiError,
    ) -> impl Future<Output = Result<(), Disconnected>> + Send;
}

/// Submits `request` to the engine and answers with its event stream, which [`drive`] runs on a
/// task of its own through `frames`. Submission errors (queue full, context exceeded) are still
/// ordinary JSON errors, because no header has been sent yet.
pub fn submit<F: Frames + 'static>(
    state: &Arc<AppState>,
    log: Arc<RequestLog>,
    request: GenerateRequest,
    frames: F,
    keep_alive: Option<Duration>,
) -> Result<Response<Body>, ApiError> {
    let handle = state.engine()?.submit(request)?;
    let (out, response) = Out::open();
    tokio::spawn(drive(state.clone(), log, out, handle, frames, keep_alive));
    Ok(response)
}

/// Runs a submitted request's event stream to its end through `frames` (see the module
/// documentation). `keep_alive`: the pause after which a keep-alive frame goes out (`None`: never).
pub async fn drive<F: Frames>(
    state: Arc<AppState>,
    log: Arc<RequestLog>,
    out: Out,
    mut handle: RequestHandle,
    mut frames: F,
    keep_alive: Option<Duration>,
) {
    if pump(&state, &log, &out, &mut handle, &mut frames, keep_alive)
        .await
        .is_err()
    {
        // Dropping the handle (end of this function) cancels the request in the engine.
        handle.cancel();
        state.metrics.record_cancelled();
        log.set_outcome("client disconnected");
    }
}

async fn pump<F: Frames>(
    state: &AppState,
    log: &RequestLog,
    out: &Out,
    handle: &mut RequestHandle,
    frames: &mut F,
    keep_alive: Option<Duration>,
) -> Result<(), Disconnected> {
    frames.start(out).await?;
    let mut ticks = keep_alive.map(|period| {
        let mut ticks = interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks
    });
    let grace_over = state.lifecycle.grace_over();
    tokio::pin!(grace_over);
    loop {
        let event = tokio::select! {
            // Checked first so a vanished client is noticed even while the engine is busy.
            biased;
            _ = out.tx.closed() => return Err(Disconnected),
            // The server is going away with this stream unfinished: say so, then stop (the
            // handle dropped with the task cancels the work).
            () = &mut grace_over => {
                let error = ApiError::shutdown_grace_over();
                log.set_outcome(format!("error: {}", error.message));
                return frames.fail(out, &error).await;
            }
            event = handle.next_event() => event,
            _ = next_tick(&mut ticks) => {
                out.raw(frames.keep_alive()).await?;
                continue;
            }
        };
        if let Some(ticks) = &mut ticks {
            ticks.reset();
        }
        let error = match event {
            Some(Event::PrefillProgress {
                total,
                cached,
                processed,
                elapsed_ms,
            }) => {
                frames
                    .progress(out, total, cached, processed, elapsed_ms)
                    .await?;
                continue;
            }
            Some(Event::Block {
                text_delta,
                tool_call_deltas,
                stats,
                ..
            }) => {
                frames
                    .block(out, text_delta, tool_call_deltas, stats)
                    .await?;
                continue;
            }
            Some(Event::Error(error)) => ApiError::internal(error.to_string()),
            None => ApiError::internal("the engine ended the request without a result"),
            Some(done) => match Finished::recorded(state, log, done) {
                Some(finished) => {
                    // The generation is complete: a client leaving during these last frames
                    // cancelled nothing, so send errors are ignored.
                    let _ = frames.done(out, finished).await;
                    return Ok(());
                }
                None => continue, // every other kind of event has its arm above
            },
        };
        log.set_outcome(format!("error: {}", error.message));
        return frames.fail(out, &error).await;
    }
}

/// The next keep-alive tick; never, when pings are off.
async fn next_tick(ticks: &mut Option<tokio::time::Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Submits the job and answers with an OpenAI (or native `/completion`) event stream.
pub fn start(
    state: &Arc<AppState>,
    mut job: Job,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let request = std::mem::take(&mut job.request);
    let prompt_tokens = request.prompt_ids.len();
    // A request's `sse_ping_interval` overrides `--keep-alive`; -1 turns the pings off.
    let keep_alive = match job.common.sse_ping_interval {
        None => Some(state.config.keep_alive),
        Some(requested) => requested,
    };
    let frames = OpenAiFrames {
        state: state.clone(),
        job,
        prompt_tokens,
        running: RunningTimings::default(),
        progress_done: 0,
        has_new_line: false,
    };
    submit(state, log, request, frames, keep_alive)
}

/// The response head of an event stream around `body`.
pub fn event_stream(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Reverse proxies (nginx) must not buffer the stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Timings so far, for `timings_per_token` (the engine's totals arrive only with `Done`).
#[derive(Default)]
struct RunningTimings {
    stats: GenerationStats,
}

impl RunningTimings {
    fn prompt(&mut self, total: usize, cached: usize, elapsed_ms: u64) {
        self.stats.prompt_tokens = total;
        self.stats.cached_tokens = cached;
        self.stats.prefill_seconds = elapsed_ms as f64 / 1000.0;
    }

    fn block(&mut self, block: &BlockStats) {
        self.stats.completion_tokens += block.tokens;
        self.stats.decode_seconds += block.seconds;
        self.stats.blocks += 1;
    }
}

/// OpenAI's chunks (chat and text completions) and llama-server's native `/completion` objects.
struct OpenAiFrames {
    state: Arc<AppState>,
    job: Job,
    /// The prompt's length in tokens: llama-server's `prompt_progress.total`.
    prompt_tokens: usize,
    running: RunningTimings,
    /// llama-server's progress counts the whole prompt: the first event says 0 of its tokens are
    /// processed; the engine's prefill events (whole blocks) follow; the first block completes
    /// the count (the prompt's last partial block is processed with it).
    progress_done: usize,
    /// A native stream's answer broke a line (its final object says so).
    has_new_line: bool,
}

impl OpenAiFrames {
    fn native(&self) -> bool {
        self.job.meta.endpoint == Endpoint::Native
    }

    /// A llama-server `prompt_progress` chunk: `processed` of the prompt's tokens are done.
    async fn send_progress(
        &self,
        out: &Out,
        processed: usize,
        elapsed_ms: u64,
    ) -> Result<(), Disconnected> {
        let mut chunk = if self.native() {
            responses::native_partial("", 0, self.prompt_tokens)
        } else {
            responses::empty_chunk(&self.job.meta)
        };
        chunk["prompt_progress"] = json!({
            "total": self.prompt_tokens,
            "cache": 0,
            "processed": processed,
            "time_ms": elapsed_ms,
        });
        out.data(&chunk).await
    }
}

impl Frames for OpenAiFrames {
    async fn start(&mut self, out: &Out) -> Result<(), Disconnected> {
        if self.job.meta.endpoint == Endpoint::Chat {
            out.data(&responses::chunk(&self.job.meta, ChunkContent::Role))
                .await?;
        }
        if self.job.common.return_progress {
            self.send_progress(out, 0, 0).await?;
        }
        Ok(())
    }

    async fn progress(
        &mut self,
        out: &Out,
        _total: usize, // whole prefill blocks only; the prompt's length is reported
        cached: usize,
        processed: usize,
        elapsed_ms: u64,
    ) -> Result<(), Disconnected> {
        self.running.prompt(self.prompt_tokens, cached, elapsed_ms);
        if self.job.common.return_progress {
            self.progress_done = processed.min(self.prompt_tokens);
            self.send_progress(out, self.progress_done, elapsed_ms)
                .await?;
        }
        Ok(())
    }

    async fn block(
        &mut self,
        out: &Out,
        text_delta: String,
        tool_call_deltas: Vec<ToolCallDelta>,
        stats: BlockStats,
    ) -> Result<(), Disconnected> {
        if self.job.common.return_progress && self.progress_done < self.prompt_tokens {
            self.progress_done = self.prompt_tokens;
            let elapsed_ms = (self.running.stats.prefill_seconds * 1000.0) as u64;
            self.send_progress(out, self.progress_done, elapsed_ms)
                .await?;
        }
        self.running.block(&stats);
        // The llama.cpp web UI leaves its "preparing" state only when it sees timings, so
        // progress-following clients get them with every block too.
        let timings = self.job.common.timings_per_token || self.job.common.return_progress;
        if self.native() {
            self.has_new_line |= text_delta.contains('\n');
            let mut piece = responses::native_partial(
                &text_delta,
                self.running.stats.completion_tokens,
                self.prompt_tokens,
            );
            if timings {
                piece["timings"] = responses::timings(&self.running.stats);
            }
            return out.data(&piece).await;
        }
        let deltas = self.job.filter_deltas(&tool_call_deltas);
        let mut chunk = responses::chunk(
            &self.job.meta,
            ChunkContent::Delta {
                text: &text_delta,
                tool_calls: &deltas,
            },
        );
        chunk["minnow"] = responses::block_stats(&stats);
        if timings {
            chunk["timings"] = responses::timings(&self.running.stats);
        }
        out.data(&chunk).await
    }

    /// The finish chunk, the optional usage chunk and `[DONE]`; natively, the final object.
    async fn done(&mut self, out: &Out, finished: Finished) -> Result<(), Disconnected> {
        let meta = &self.job.meta;
        let stats = &finished.stats;
        if self.native() {
            let stop = match self.state.engine() {
                Ok(engine) => generation::stop_cause(engine, &finished, &self.job.common.stop),
                Err(_) => responses::StopCause::Eos,
            };
            let last = responses::native_final(meta, "", self.has_new_line, &stop, stats);
            return out.data(&last).await;
        }
        let mut last = responses::chunk(meta, ChunkContent::Finish(finished.finish_reason));
        last["timings"] = responses::timings(stats);
        last["minnow"] = responses::generation_stats(stats);
        out.data(&last).await?;
        if self.job.common.include_usage {
            let mut usage = responses::empty_chunk(meta);
            usage["usage"] = responses::usage(stats);
            out.data(&usage).await?;
        }
        out.raw(Bytes::from_static(b"data: [DONE]\n\n")).await
    }

    /// Headers are gone already, so an error becomes an error event followed by `[DONE]` (a
    /// native stream: the error event alone, as llama-server sends it).
    async fn fail(&mut self, out: &Out, error: &ApiError) -> Result<(), Disconnected> {
        out.data(&error.to_json()).await?;
        if self.native() {
            return Ok(());
        }
        out.raw(Bytes::from_static(b"data: [DONE]\n\n")).await
    }
}
