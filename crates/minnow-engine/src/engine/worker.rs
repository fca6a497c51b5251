//! The engine's worker thread: it owns the model runner and the [`Core`], and loops: admit queued
//! requests (at most `parallel` admitted at once; preempted ones resume first), then one step of
//! the core (schedule, one batched forward, apply). It turns what the core reports about each
//! request into that request's events: detokenized text, stop strings, tool calls
//! (`OutputStream`). Events go out over each request's unbounded channel.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use minnow_model::ModelRunner;
use tokio::sync::mpsc::UnboundedSender;

use super::core::{Core, CoreSettings, NewSequence, Refusal, SequenceUpdate, StepPlan};
use super::handle::TraceLog;
use crate::api::{BlockStats, Event, FinishReason, ToolCallDelta};
use crate::decode::request::{FinishedBlock, RequestDecoder};
use crate::error::{EngineError, EngineResult};
use crate::kv_cache::BlockPool;
use crate::kv_cache::CacheStats;
use crate::output::text_stream::OutputStream;
use crate::output::tool_calls::StreamParser;
use crate::text::tokenizer::Tokenizer;
use crate::text::tool_format::ToolCallFormat;

/// A validated request waiting for a slot: what the core decodes, and what its client's text
/// stream needs.
pub(crate) struct Job {
    pub sequence: NewSequence,
    pub stop: Vec<String>,
    pub tool_names: Vec<String>,
    pub forced_prefix: Option<String>,
    pub tool_format: ToolCallFormat,
    pub events: UnboundedSender<Event>,
    pub trace: Option<TraceLog>,
}

/// What the worker reports about its K/V cache and batches (for `/metrics`, `/slots`, `/props`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub cache: CacheStats,
    /// Batched forwards per batch size bucket: `batch_size_counts[i]` counts forwards of at
    /// most [`crate::BATCH_SIZE_BUCKETS`]`[i]` sequences (and more than the bucket before); the last
    /// entry counts larger ones.
    pub batch_size_counts: Vec<u64>,
    /// Sum of the batch sizes of every forward.
    pub batch_size_sum: u64,
    /// Requests preempted (their pages taken back, to be recomputed) when the K/V cache was
    /// full, since start.
    pub preemptions: u64,
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
    /// What the worker last reported about its cache and batches.
    stats: Mutex<EngineStats>,
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
            stats: Mutex::new(EngineStats::default()),
        }
    }

    /// The worker's latest report.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn publish_stats(&self, core: &Core) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.cache = core.cache_stats();
        stats.batch_size_counts = core.counters.batch_sizes.to_vec();
        stats.batch_size_sum = core.counters.batch_size_sum;
        stats.preemptions = core.counters.preemptions;
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
    settings: CoreSettings,
) -> EngineResult<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("minnow-engine".into())
        .spawn(move || {
            let block = runner.config().block_size;
            let core = Core::new(BlockPool::new(runner.kv_pages(), block), settings);
            Worker {
                runner,
                core,
                clients: HashMap::new(),
                tokenizer,
            }
            .run(&queue)
        })
        .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))
}

struct Worker {
    runner: Box<dyn ModelRunner>,
    core: Core,
    /// The text side of every admitted request, by id.
    clients: HashMap<u64, Client>,
    tokenizer: Arc<Tokenizer>,
}

impl Worker {
    fn run(mut self, queue: &Queue) {
        queue.publish_stats(&self.core);
        loop {
            {
                let mut state = queue.lock();
                loop {
                    if state.shutdown {
                        drop(state);
                        self.core
                            .fail_all(|| EngineError::Internal("the engine was shut down".into()));
                        self.deliver(None);
                        return;
                    }
                    state.drop_abandoned();
                    self.admit(&mut state, queue.parallel);
                    state.busy = self.core.active();
                    if self.core.active() > 0 {
                        break;
                    }
                    state = queue.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
            // A bug in a runner or decoder must fail the requests of the step, not the engine
            // thread (which would leave every queued request waiting forever).
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
            if let Err(panic) = stepped {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("internal error: {message}");
                self.core
                    .fail_all(|| EngineError::Internal(format!("internal error: {message}")));
                self.deliver(None);
            }
            queue.publish_stats(&self.core);
            queue.lock().busy = self.core.active();
        }
    }

    /// Fills free slots: preempted requests resume first (oldest first), then queued ones in
    /// order; a request that does not fit now keeps its place at the head.
    fn admit(&mut self, state: &mut QueueState, parallel: usize) {
        while self.core.running() < parallel {
            if self.core.has_preempted() {
                if !self.core.resume_oldest() {
                    break;
                }
                continue;
            }
            if self.core.active() >= parallel {
                break;
            }
            let Some(job) = state.waiting.pop_front() else {
                break;
            };
            let Job {
                sequence,
                stop,
                tool_names,
                forced_prefix,
                tool_format,
                events,
                trace,
            } = job;
            let id = sequence.id;
            match self.core.admit(sequence) {
                Ok(()) => {
                    let parser = StreamParser::new(
                        tool_format,
                        tool_names,
                        forced_prefix,
                        format!("call_{id}"),
                    );
                    self.clients.insert(
                        id,
                        Client {
                            output: OutputStream::new(stop, parser),
                            ids: Vec::new(),
                            events,
                            trace,
                            started: Instant::now(),
                        },
                    );
                    self.deliver(None);
                }
                Err(Refusal::Never(error)) => {
                    let _ = events.send(Event::Error(error));
                }
                Err(Refusal::Wait(sequence)) => {
                    state.waiting.push_front(Job {
                        sequence: *sequence,
                        stop,
                        tool_names,
                        forced_prefix,
                        tool_format,
                        events,
                        trace,
                    });
                    break;
                }
            }
        }
    }

    /// One step: schedule, run the batch, apply its outputs; events go out after each part.
    fn step(&mut self) {
        let mut plan = self.core.schedule();
        self.deliver(Some(&mut plan));
        if plan.is_empty() {
            return;
        }
        let began = Instant::now();
        let outputs = self
            .runner
            .forward_batch(&plan.segments())
            .map_err(|e| e.to_string());
        self.core.apply(plan, outputs, began.elapsed());
        self.deliver(None);
    }

    /// Turns the core's updates into events. A request a stop string ends is ended in the core
    /// too, and its forward taken out of `plan`.
    fn deliver(&mut self, mut plan: Option<&mut StepPlan>) {
        for update in self.core.take_updates() {
            match update {
                SequenceUpdate::Admitted { id, cached, total } => {
                    if let Some(client) = self.clients.get_mut(&id) {
                        // The cache hit is the first progress a client sees (a fully cached
                        // prompt has no prefill forward to report after).
                        client.send(Event::PrefillProgress {
                            total,
                            cached,
                            processed: cached,
                            elapsed_ms: 0,
                        });
                    }
                }
                SequenceUpdate::Prefill {
                    id,
                    processed,
                    total,
                    cached,
                } => {
                    if let Some(client) = self.clients.get_mut(&id) {
                        let elapsed_ms = client.started.elapsed().as_millis() as u64;
                        client.send(Event::PrefillProgress {
                            total,
                            cached,
                            processed,
                            elapsed_ms,
                        });
                    }
                }
                SequenceUpdate::Block { id, block } => {
                    let Some(client) = self.clients.get_mut(&id) else {
                        continue;
                    };
                    match client.on_block(&self.tokenizer, block) {
                        Ok(None) => {}
                        Ok(Some(stopped)) => {
                            let client = self.clients.remove(&id).expect("looked up above");
                            if let Some(plan) = plan.as_deref_mut() {
                                plan.remove(id);
                            }
                            match self.core.end(id) {
                                Some(decoder) => client.finish(
                                    &self.tokenizer,
                                    FinishReason::Stop,
                                    vec![stopped.0],
                                    Some(stopped.1),
                                    &decoder,
                                ),
                                None => client.fail(EngineError::Internal(
                                    "the request ended unexpectedly".into(),
                                )),
                            }
                        }
                        Err(error) => {
                            let client = self.clients.remove(&id).expect("looked up above");
                            if let Some(plan) = plan.as_deref_mut() {
                                plan.remove(id);
                            }
                            self.core.end(id);
                            client.fail(error);
                        }
                    }
                }
                SequenceUpdate::Ended {
                    id,
                    reason,
                    last_block,
                    decoder,
                } => {
                    let Some(mut client) = self.clients.remove(&id) else {
                        continue;
                    };
                    match last_block {
                        None => client.finish(&self.tokenizer, reason, Vec::new(), None, &decoder),
                        Some(block) => match client.last_block(&self.tokenizer, block) {
                            Ok((pending, last)) => client.finish(
                                &self.tokenizer,
                                reason,
                                vec![pending],
                                Some(last),
                                &decoder,
                            ),
                            Err(error) => client.fail(error),
                        },
                    }
                }
                SequenceUpdate::Failed { id, error } => {
                    if let Some(client) = self.clients.remove(&id) {
                        client.fail(error);
                    }
                }
            }
        }
    }
}

/// Text and tool-call deltas not sent yet, and the last block's ids and statistics.
type Pending = (String, Vec<ToolCallDelta>);
type LastBlock = (Vec<u32>, BlockStats);

/// The text side of one admitted request.
struct Client {
    output: OutputStream,
    /// Output ids of the blocks so far.
    ids: Vec<u32>,
    events: UnboundedSender<Event>,
    trace: Option<TraceLog>,
    started: Instant,
}

impl Client {
    fn send(&mut self, event: Event) {
        // A send fails only when the handle is gone; its Drop also set the cancel flag, which
        // the core sees at its next step.
        let _ = self.events.send(event);
    }

    /// A block that did not end the request: its text goes out, unless it completed a stop
    /// string, which ends the request (then its text and ids come back for the last `Block`).
    fn on_block(
        &mut self,
        tokenizer: &Tokenizer,
        block: FinishedBlock,
    ) -> EngineResult<Option<(Pending, LastBlock)>> {
        let (pending, last, stopped) = self.push(tokenizer, block)?;
        if stopped {
            return Ok(Some((pending, last)));
        }
        let (text_delta, tool_call_deltas) = pending;
        let (tokens, stats) = last;
        self.send(Event::Block {
            text_delta,
            tokens,
            tool_call_deltas,
            stats,
        });
        Ok(None)
    }

    /// The block that ended the request.
    fn last_block(
        &mut self,
        tokenizer: &Tokenizer,
        block: FinishedBlock,
    ) -> EngineResult<(Pending, LastBlock)> {
        let (pending, last, _) = self.push(tokenizer, block)?;
        Ok((pending, last))
    }

    /// Detokenizes a block through the stop strings and tool-call parser; its ids are cut after
    /// a stop string's last token.
    fn push(
        &mut self,
        tokenizer: &Tokenizer,
        block: FinishedBlock,
    ) -> EngineResult<(Pending, LastBlock, bool)> {
        let mut tokens = block.tokens;
        self.ids.extend_from_slice(&tokens);
        let text = self.output.push_block(tokenizer, &self.ids)?;
        let stopped = match &text.stop {
            Some(hit) => {
                // Keep only this block's ids up to the token that completed the stop.
                let before = self.ids.len() - tokens.len();
                tokens.truncate(hit.keep_tokens.saturating_sub(before));
                true
            }
            None => false,
        };
        Ok((
            (text.text_delta, text.tool_call_deltas),
            (tokens, block.stats),
            stopped,
        ))
    }

    /// Ends the request: final text and tool calls, the last `Block` (when a block ended it),
    /// then `Done`.
    fn finish(
        mut self,
        tokenizer: &Tokenizer,
        reason: FinishReason,
        mut pending: Vec<Pending>,
        last_block: Option<LastBlock>,
        decoder: &RequestDecoder,
    ) {
        let ids = decoder.output().to_vec();
        let final_text = match self.output.finish(tokenizer, &ids, reason) {
            Ok(f) => f,
            Err(error) => return self.fail(error),
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
        self.send(Event::Done {
            finish_reason: final_text.finish_reason,
            output_ids,
            text: final_text.content,
            tool_calls: final_text.tool_calls,
            stats,
        });
    }

    fn fail(mut self, error: EngineError) {
        tracing::warn!("generation failed: {error}");
        self.send(Event::Error(error));
    }
}
