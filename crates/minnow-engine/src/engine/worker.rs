//! The engine's worker thread: it owns the model runner, admits queued requests into at most
//! `parallel` slots, and advances every active request by one unit of work (one prefill chunk or
//! one denoising forward) per round, so requests interleave step by step. Cancellation is checked
//! before every step; events go out over each request's unbounded channel.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use minnow_model::ModelRunner;
use tokio::sync::mpsc::UnboundedSender;

use super::{CancelToken, EngineError, EngineResult, TraceLog};
use crate::api::{Event, FinishReason, GenerateRequest, ToolCallDelta};
use crate::decode::layout::Layout;
use crate::decode::params::ResolvedParams;
use crate::decode::request::{DecoderContext, RequestDecoder, Update};
use crate::text_stream::OutputStream;
use crate::tokenizer::Tokenizer;
use crate::tool_calls::{StreamParser, ToolCallFormat};

/// A validated request waiting for a slot.
pub(crate) struct Job {
    pub id: u64,
    pub request: GenerateRequest,
    pub layout: Layout,
    pub params: ResolvedParams,
    pub decoder: DecoderContext,
    pub tool_format: ToolCallFormat,
    pub events: UnboundedSender<Event>,
    pub cancel: CancelToken,
    pub trace: Option<TraceLog>,
}

struct QueueState {
    waiting: VecDeque<Job>,
    busy: usize,
    shutdown: bool,
}

impl QueueState {
    /// Forgets waiting jobs whose handle was dropped (the client went away while queued), so
    /// they neither hold queue capacity nor count in the queue depth until a slot frees up.
    fn drop_abandoned(&mut self) {
        self.waiting.retain(|job| !job.events.is_closed());
    }
}

/// The bounded FIFO between `Engine::submit` and the worker.
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
    parallel: usize,
    capacity: usize,
}

impl Queue {
    pub fn new(parallel: usize, capacity: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                waiting: VecDeque::new(),
                busy: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            parallel,
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves consistent data (plain pushes/pops).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a job. Requests that would get a free slot at once never count against the wait
    /// capacity; beyond that at most `capacity` may wait.
    pub fn push(&self, job: Job) -> EngineResult<()> {
        let mut state = self.lock();
        if state.shutdown {
            return Err(EngineError::Internal("the engine is shutting down".into()));
        }
        state.drop_abandoned();
        let free_slots = self.parallel.saturating_sub(state.busy);
        if state.waiting.len() >= self.capacity + free_slots {
            return Err(EngineError::QueueFull);
        }
        state.waiting.push_back(job);
        self.wake.notify_all();
        Ok(())
    }

    pub fn depth(&self) -> usize {
        let mut state = self.lock();
        state.drop_abandoned();
        state
            .waiting
            .len()
            .saturating_sub(self.parallel.saturating_sub(state.busy))
    }

    pub fn busy(&self) -> usize {
        self.lock().busy
    }

    pub fn shut_down(&self) {
        self.lock().shutdown = true;
        self.wake.notify_all();
    }
}

/// Starts the worker thread.
pub(crate) fn spawn(
    runner: Box<dyn ModelRunner>,
    queue: Arc<Queue>,
    tokenizer: Arc<Tokenizer>,
) -> EngineResult<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("minnow-engine".into())
        .spawn(move || run(runner, &queue, &tokenizer))
        .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))
}

fn run(mut runner: Box<dyn ModelRunner>, queue: &Queue, tokenizer: &Tokenizer) {
    let mut active: Vec<Active> = Vec::new();
    loop {
        {
            let mut state = queue.lock();
            loop {
                if state.shutdown {
                    drop(state);
                    for mut request in active.drain(..) {
                        request.fail(runner.as_mut(), "the engine was shut down".into());
                    }
                    return;
                }
                state.drop_abandoned();
                while active.len() < queue.parallel {
                    let Some(job) = state.waiting.pop_front() else {
                        break;
                    };
                    active.push(Active::start(job));
                }
                state.busy = active.len();
                if !active.is_empty() {
                    break;
                }
                state = queue.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
        for request in active.iter_mut() {
            // A bug in a runner or decoder must fail its request, not the engine thread (which
            // would leave every queued request waiting forever).
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                request.step(runner.as_mut(), tokenizer)
            }));
            if let Err(panic) = stepped {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(request = request.id, "internal error: {message}");
                request.fail(runner.as_mut(), format!("internal error: {message}"));
            }
        }
        active.retain(|request| !request.done);
        queue.lock().busy = active.len();
    }
}

/// One request in a decoding slot.
struct Active {
    id: u64,
    decoder: Option<RequestDecoder>,
    output: OutputStream,
    events: UnboundedSender<Event>,
    cancel: CancelToken,
    trace: Option<TraceLog>,
    started: Instant,
    done: bool,
}

impl Active {
    fn start(job: Job) -> Active {
        let parser = StreamParser::new(
            job.tool_format,
            job.request.tool_names.clone(),
            job.request.forced_prefix.clone(),
            format!("call_{}", job.id),
        );
        let output = OutputStream::new(job.request.stop.clone(), parser);
        let decoder = RequestDecoder::new(
            job.request.prompt_ids,
            job.layout,
            job.params,
            job.decoder,
            job.trace.is_some(),
        );
        let mut active = Active {
            id: job.id,
            decoder: None,
            output,
            events: job.events,
            cancel: job.cancel,
            trace: job.trace,
            started: Instant::now(),
            done: false,
        };
        match decoder {
            Ok(decoder) => active.decoder = Some(decoder),
            Err(message) => {
                let _ = active.events.send(Event::Error(message));
                active.done = true;
            }
        }
        active
    }

    fn send(&mut self, event: Event) {
        if self.events.send(event).is_err() {
            // The handle is gone; its Drop also set the cancel flag.
            self.cancel.cancel();
        }
    }

    /// One unit of work (or the end of the request).
    fn step(&mut self, runner: &mut dyn ModelRunner, tokenizer: &Tokenizer) {
        if self.done {
            return;
        }
        let Some(decoder) = self.decoder.as_mut() else {
            self.done = true;
            return;
        };
        if self.cancel.is_cancelled() {
            self.finish(runner, tokenizer, FinishReason::Cancelled, Vec::new(), None);
            return;
        }
        if decoder.is_finished() {
            // Nothing to decode (max_tokens 0).
            let reason = decoder.finish_reason().unwrap_or(FinishReason::Length);
            self.finish(runner, tokenizer, reason, Vec::new(), None);
            return;
        }
        let update = match decoder.advance(runner) {
            Ok(update) => update,
            Err(message) => {
                tracing::warn!(request = self.id, "generation failed: {message}");
                self.fail(runner, message);
                return;
            }
        };
        match update {
            Update::Refining => {}
            Update::Prefill { processed, total } => {
                let elapsed_ms = self.started.elapsed().as_millis() as u64;
                self.send(Event::PrefillProgress {
                    total,
                    cached: 0,
                    processed,
                    elapsed_ms,
                });
            }
            Update::Block(block) => {
                let all_ids = decoder.output().to_vec();
                let text = match self.output.push_block(tokenizer, &all_ids) {
                    Ok(text) => text,
                    Err(e) => return self.fail(runner, e.to_string()),
                };
                let mut tokens = block.tokens;
                let finish = match &text.stop {
                    Some(hit) => {
                        // Keep only this block's ids up to the token that completed the stop.
                        let before = all_ids.len() - tokens.len();
                        tokens.truncate(hit.keep_tokens.saturating_sub(before));
                        Some(FinishReason::Stop)
                    }
                    None => block.finish,
                };
                match finish {
                    None => self.send(Event::Block {
                        text_delta: text.text_delta,
                        tokens,
                        tool_call_deltas: text.tool_call_deltas,
                        stats: block.stats,
                    }),
                    // The last block also carries whatever the end of the stream releases.
                    Some(reason) => self.finish(
                        runner,
                        tokenizer,
                        reason,
                        vec![(text.text_delta, text.tool_call_deltas)],
                        Some((tokens, block.stats)),
                    ),
                }
            }
        }
    }

    /// Ends the request: final text and tool calls, the last `Block` (when a block ended it),
    /// `Done`, and the runner's sequence released.
    fn finish(
        &mut self,
        runner: &mut dyn ModelRunner,
        tokenizer: &Tokenizer,
        reason: FinishReason,
        mut pending: Vec<(String, Vec<ToolCallDelta>)>,
        last_block: Option<(Vec<u32>, crate::api::BlockStats)>,
    ) {
        let Some(mut decoder) = self.decoder.take() else {
            self.done = true;
            return;
        };
        decoder.release(runner);
        let ids = decoder.output().to_vec();
        let final_text = match self.output.finish(tokenizer, &ids, reason) {
            Ok(f) => f,
            Err(e) => {
                let _ = self.events.send(Event::Error(e.to_string()));
                self.done = true;
                return;
            }
        };
        pending.push((final_text.text_delta, final_text.tool_call_deltas));
        if let Some((tokens, stats)) = last_block {
            let text_delta = pending.iter().map(|(t, _)| t.as_str()).collect();
            let tool_call_deltas = pending.into_iter().flat_map(|(_, d)| d).collect();
            self.send(Event::Block {
                text_delta,
                tokens,
                tool_call_deltas,
                stats,
            });
        }
        let output_ids = ids[..final_text.kept_tokens.min(ids.len())].to_vec();
        let mut stats = decoder.stats();
        stats.completion_tokens = output_ids.len();
        if let (Some(log), Some(steps)) = (&self.trace, decoder.trace()) {
            log.store(steps);
        }
        let _ = self.events.send(Event::Done {
            finish_reason: final_text.finish_reason,
            output_ids,
            text: final_text.content,
            tool_calls: final_text.tool_calls,
            stats,
        });
        self.done = true;
    }

    fn fail(&mut self, runner: &mut dyn ModelRunner, message: String) {
        if let Some(mut decoder) = self.decoder.take() {
            decoder.release(runner);
        }
        let _ = self.events.send(Event::Error(message));
        self.done = true;
    }
}
