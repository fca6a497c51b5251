//! Server-sent events for `stream: true`, framed like OpenAI: a role chunk (chat), one chunk per
//! finished block with its text/tool-call deltas and a `minnow` field of block statistics, a final
//! chunk with `finish_reason`, llama-server `timings` and the request totals, an optional usage
//! chunk with empty `choices`, then `data: [DONE]`. While nothing else is sent (queued, long
//! prefill) the stream carries keep-alive comments and, with `return_progress`, llama-server
//! `prompt_progress` chunks. llama-server's native `/completion` streams its own objects instead:
//! one `{"content": ..., "stop": false}` per block, then the final `stop: true` object, and no
//! `[DONE]` (as llama-server does). A client that disconnects closes the body channel; the task
//! notices at once, drops the engine handle, and the engine frees the slot.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use minnow_engine::{BlockStats, Event, FinishReason, GenerationStats, RequestHandle};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::errors::ApiError;
use super::generation::{self, Finished, Job};
use super::http::{Body, ChannelBody};
use super::responses::{self, ChunkContent, Endpoint};
use super::state::{AppState, RequestLog};

/// Submits the job and answers with an event stream. Submission errors (queue full, context
/// exceeded) are still ordinary JSON errors, because no header has been sent yet.
pub fn start(
    state: &Arc<AppState>,
    mut job: Job,
    log: Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let prompt_tokens = job.request.prompt_ids.len();
    let handle = engine.submit(std::mem::take(&mut job.request))?;
    let (tx, body) = ChannelBody::channel();
    let stream = Stream {
        state: state.clone(),
        job,
        tx,
        log,
        prompt_tokens,
    };
    tokio::spawn(stream.run(handle));
    Ok(event_stream(body))
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

/// The client is gone; stop work.
struct Disconnected;

struct Stream {
    state: Arc<AppState>,
    job: Job,
    tx: mpsc::Sender<Bytes>,
    log: Arc<RequestLog>,
    /// The prompt's length in tokens: llama-server's `prompt_progress.total`.
    prompt_tokens: usize,
}

impl Stream {
    async fn run(self, mut handle: RequestHandle) {
        match self.pump(&mut handle).await {
            Ok(()) => {}
            Err(Disconnected) => {
                // Dropping the handle (end of this function) cancels the request in the engine.
                handle.cancel();
                self.state.metrics.record_cancelled();
                self.log.set_outcome("client disconnected");
            }
        }
    }

    async fn send_raw(&self, frame: Bytes) -> Result<(), Disconnected> {
        self.tx.send(frame).await.map_err(|_| Disconnected)
    }

    async fn send(&self, value: &Value) -> Result<(), Disconnected> {
        self.send_raw(Bytes::from(format!("data: {value}\n\n")))
            .await
    }

    /// A llama-server `prompt_progress` chunk: `processed` of the prompt's tokens are done.
    async fn send_progress(&self, processed: usize, elapsed_ms: u64) -> Result<(), Disconnected> {
        let mut chunk = if self.job.meta.endpoint == Endpoint::Native {
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
        self.send(&chunk).await
    }

    async fn pump(&self, handle: &mut RequestHandle) -> Result<(), Disconnected> {
        let meta = &self.job.meta;
        if meta.endpoint == Endpoint::Chat {
            self.send(&responses::chunk(meta, ChunkContent::Role))
                .await?;
        }
        // A request's `sse_ping_interval` overrides `--keep-alive`; -1 turns the pings off.
        let period = match self.job.common.sse_ping_interval {
            None => Some(self.state.config.keep_alive),
            Some(requested) => requested,
        };
        let mut keep_alive = period.map(|period| {
            let mut ticks = interval_at(Instant::now() + period, period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks
        });
        let mut running = RunningTimings::default();
        // llama-server's progress counts the whole prompt: the first event says 0 of its tokens
        // are processed; the engine's prefill events (whole blocks) follow; the first block
        // completes the count (the prompt's last partial block is processed with it).
        let mut progress_done = 0;
        // A native stream's text so far (which stop string ended it) and whether it broke a
        // line: its final object reports both.
        let mut spelled = String::new();
        let mut has_new_line = false;
        if self.job.common.return_progress {
            self.send_progress(0, 0).await?;
        }

        let grace_over = self.state.lifecycle.grace_over();
        tokio::pin!(grace_over);
        loop {
            let event = tokio::select! {
                // Checked first so a vanished client is noticed even while the engine is busy.
                biased;
                _ = self.tx.closed() => return Err(Disconnected),
                // The server is going away with this stream unfinished: say so, then stop (the
                // handle dropped with the task cancels the work).
                () = &mut grace_over => {
                    let error = ApiError::shutdown_grace_over();
                    self.log.set_outcome(format!("error: {}", error.message));
                    self.send(&error.to_json()).await?;
                    if meta.endpoint == Endpoint::Native {
                        return Ok(());
                    }
                    return self.send_raw(Bytes::from_static(b"data: [DONE]\n\n")).await;
                }
                event = handle.next_event() => event,
                _ = next_tick(&mut keep_alive) => {
                    self.send_raw(Bytes::from_static(b": keep-alive\n\n")).await?;
                    continue;
                }
            };
            if let Some(ticks) = &mut keep_alive {
                ticks.reset();
            }
            match event {
                Some(Event::PrefillProgress {
                    total,
                    cached,
                    processed,
                    elapsed_ms,
                }) => {
                    let _ = total; // whole prefill blocks only; the prompt's length is reported
                    running.prompt(self.prompt_tokens, cached, elapsed_ms);
                    if self.job.common.return_progress {
                        progress_done = processed.min(self.prompt_tokens);
                        self.send_progress(progress_done, elapsed_ms).await?;
                    }
                }
                Some(Event::Block {
                    text_delta,
                    tool_call_deltas,
                    stats,
                    ..
                }) => {
                    if self.job.common.return_progress && progress_done < self.prompt_tokens {
                        progress_done = self.prompt_tokens;
                        let elapsed_ms = (running.stats.prefill_seconds * 1000.0) as u64;
                        self.send_progress(progress_done, elapsed_ms).await?;
                    }
                    running.block(&stats);
                    if meta.endpoint == Endpoint::Native {
                        if text_delta.contains('\n') {
                            has_new_line = true;
                        }
                        spelled.push_str(&text_delta);
                        let mut piece = responses::native_partial(
                            &text_delta,
                            running.stats.completion_tokens,
                            self.prompt_tokens,
                        );
                        if self.job.common.timings_per_token || self.job.common.return_progress {
                            piece["timings"] = responses::timings(&running.stats);
                        }
                        self.send(&piece).await?;
                        continue;
                    }
                    let deltas = self.job.filter_deltas(&tool_call_deltas);
                    let mut chunk = responses::chunk(
                        meta,
                        ChunkContent::Delta {
                            text: &text_delta,
                            tool_calls: &deltas,
                        },
                    );
                    chunk["minnow"] = responses::block_stats(&stats);
                    // The llama.cpp web UI leaves its "preparing" state only when it sees
                    // timings, so progress-following clients get them with every block too.
                    if self.job.common.timings_per_token || self.job.common.return_progress {
                        chunk["timings"] = responses::timings(&running.stats);
                    }
                    self.send(&chunk).await?;
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
                    // The generation is complete: a client leaving during these last frames
                    // cancelled nothing, so send errors are ignored.
                    if meta.endpoint == Endpoint::Native {
                        let finished = Finished {
                            finish_reason,
                            output_ids,
                            text,
                            tool_calls,
                            stats,
                        };
                        let _ = self.send_native_tail(&finished, has_new_line).await;
                        return Ok(());
                    }
                    let _ = self.send_tail(finish_reason, &stats).await;
                    return Ok(());
                }
                Some(Event::Error(error)) => {
                    return self.fail(&error.to_string()).await;
                }
                None => {
                    return self
                        .fail("the engine ended the request without a result")
                        .await;
                }
            }
        }
    }

    /// The finish chunk, the optional usage chunk and `[DONE]`.
    async fn send_tail(
        &self,
        finish_reason: FinishReason,
        stats: &GenerationStats,
    ) -> Result<(), Disconnected> {
        let meta = &self.job.meta;
        let mut last = responses::chunk(meta, ChunkContent::Finish(finish_reason));
        last["timings"] = responses::timings(stats);
        last["minnow"] = responses::generation_stats(stats);
        self.send(&last).await?;
        if self.job.common.include_usage {
            let mut usage = responses::empty_chunk(meta);
            usage["usage"] = responses::usage(stats);
            self.send(&usage).await?;
        }
        self.send_raw(Bytes::from_static(b"data: [DONE]\n\n")).await
    }

    /// A native stream's final object (its text already went out in the pieces).
    async fn send_native_tail(
        &self,
        finished: &Finished,
        has_new_line: bool,
    ) -> Result<(), Disconnected> {
        let stop = match self.state.engine() {
            Ok(engine) => generation::native_stop(engine, finished, &self.job.common.stop),
            Err(_) => responses::NativeStop::Eos,
        };
        let last =
            responses::native_final(&self.job.meta, "", has_new_line, &stop, &finished.stats);
        self.send(&last).await
    }

    /// Headers are gone already, so an error becomes an error event followed by `[DONE]` (a
    /// native stream: the error event alone, as llama-server sends it).
    async fn fail(&self, message: &str) -> Result<(), Disconnected> {
        self.log.set_outcome(format!("error: {message}"));
        self.send(&ApiError::internal(message).to_json()).await?;
        if self.job.meta.endpoint == Endpoint::Native {
            return Ok(());
        }
        self.send_raw(Bytes::from_static(b"data: [DONE]\n\n")).await
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
