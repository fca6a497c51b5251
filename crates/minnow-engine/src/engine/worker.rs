//! The engine's worker thread: it owns the model runner and loops over scheduler steps. Each step
//! admits queued requests into the batch (at most `parallel`, each with every page its canvas
//! needs: cached prompt blocks from the prefix cache plus fresh ones), asks the scheduler for one
//! batch holding every running request's next forward, runs it as one batched forward, and hands
//! each request its output. Cancellation is checked before every step; events go out over each
//! request's unbounded channel.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use minnow_model::{ModelRunner, PageId};
use tokio::sync::mpsc::UnboundedSender;

use super::scheduler::{Admission, Scheduler, SchedulerSettings};
use crate::prefix_cache::{BlockHash, PrefixCache};

use super::{CancelToken, EngineError, EngineResult, TraceLog};
use crate::api::{Event, FinishReason, GenerateRequest, ToolCallDelta};
use crate::decode::constrained::Constrained;
use crate::decode::layout::Layout;
use crate::decode::params::ResolvedParams;
use crate::decode::request::{DecoderContext, RequestDecoder, Update};
use crate::text_stream::OutputStream;
use crate::tokenizer::Tokenizer;
use crate::tool_calls::{StreamParser, ToolCallFormat};
use crate::EngineStats;

/// A validated request waiting for a slot.
pub(crate) struct Job {
    pub id: u64,
    pub request: GenerateRequest,
    pub layout: Layout,
    pub params: ResolvedParams,
    /// The compiled grammar of a structured-output request.
    pub constraint: Option<Constrained>,
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

    fn publish_stats(&self, scheduler: &Scheduler) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.cache = scheduler.cache.stats();
        stats.batch_size_counts = scheduler.batch_sizes.to_vec();
        stats.batch_size_sum = scheduler.batch_size_sum;
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
    settings: SchedulerSettings,
) -> EngineResult<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("minnow-engine".into())
        .spawn(move || run(runner, &queue, &tokenizer, settings))
        .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))
}

fn run(
    mut runner: Box<dyn ModelRunner>,
    queue: &Queue,
    tokenizer: &Tokenizer,
    settings: SchedulerSettings,
) {
    let block = runner.config().block_size;
    let mut scheduler = Scheduler::new(PrefixCache::new(runner.kv_pages(), block), settings);
    queue.publish_stats(&scheduler);
    loop {
        {
            let mut state = queue.lock();
            loop {
                if state.shutdown {
                    drop(state);
                    for request in scheduler.running.drain(..) {
                        let mut request = request;
                        request.fail(&mut scheduler.cache, "the engine was shut down".into());
                    }
                    return;
                }
                state.drop_abandoned();
                while scheduler.running.len() < queue.parallel {
                    let Some(job) = state.waiting.pop_front() else {
                        break;
                    };
                    match scheduler.admit(job) {
                        Admission::Running => {}
                        Admission::Refused(job, error) => {
                            let _ = job.events.send(Event::Error(error.to_string()));
                        }
                        Admission::Wait(job) => {
                            // Not enough pages now: it keeps its place at the head of the queue
                            // until running requests free theirs.
                            state.waiting.push_front(job);
                            break;
                        }
                    }
                }
                state.busy = scheduler.running.len();
                if !scheduler.running.is_empty() {
                    break;
                }
                state = queue.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
        // A bug in a runner or decoder must fail the requests of the step, not the engine thread
        // (which would leave every queued request waiting forever).
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scheduler.step(runner.as_mut(), tokenizer)
        }));
        if let Err(panic) = stepped {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!("internal error: {message}");
            for request in scheduler.running.iter_mut() {
                request.fail(&mut scheduler.cache, format!("internal error: {message}"));
            }
        }
        scheduler.retire_finished();
        queue.publish_stats(&scheduler);
        queue.lock().busy = scheduler.running.len();
    }
}

/// One request in the batch.
pub(crate) struct Active {
    pub id: u64,
    pub decoder: Option<RequestDecoder>,
    output: OutputStream,
    events: UnboundedSender<Event>,
    pub cancel: CancelToken,
    trace: Option<TraceLog>,
    started: Instant,
    pub done: bool,
    /// The request's block table: one page per block of its canvas.
    pub pages: Vec<PageId>,
    /// Where the request's chain of block hashes starts; `None` when it opted out of the cache.
    pub cache_root: Option<BlockHash>,
    /// Hash of the last published block, and how many blocks are published.
    pub chain: (Option<BlockHash>, usize),
}

impl Active {
    pub fn start(job: Job, pages: Vec<PageId>, cached: usize, root: Option<BlockHash>) -> Active {
        let parser = StreamParser::new(
            job.tool_format,
            job.request.tool_names.clone(),
            job.request.forced_prefix.clone(),
            format!("call_{}", job.id),
        );
        let output = OutputStream::new(job.request.stop.clone(), parser);
        let block = job.layout.block;
        let decoder = RequestDecoder::new(
            job.request.prompt_ids,
            job.layout,
            job.params,
            job.decoder,
            job.trace.is_some(),
        )
        .map(|d| d.with_cached_prefix(cached))
        .map(|d| match job.constraint {
            Some(constraint) => d.with_constraint(constraint),
            None => d,
        });
        let mut active = Active {
            id: job.id,
            decoder: None,
            output,
            events: job.events,
            cancel: job.cancel,
            trace: job.trace,
            started: Instant::now(),
            done: false,
            pages,
            cache_root: root,
            // The cached blocks are published already (that is how they were found).
            chain: (None, 0),
        };
        if let (Some(root), Ok(decoder)) = (root, &decoder) {
            let hashes = BlockHash::chain(root, decoder.committed(), block);
            active.chain = (hashes.last().copied(), hashes.len());
        }
        match decoder {
            Ok(decoder) => {
                if cached > 0 {
                    // The cache hit is the first progress a client sees (a fully cached prompt
                    // has no prefill forward to report after).
                    active.send(Event::PrefillProgress {
                        total: decoder.layout().prefill_len,
                        cached,
                        processed: cached,
                        elapsed_ms: 0,
                    });
                }
                active.decoder = Some(decoder);
            }
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

    /// Ends the request early when it was cancelled or has nothing to decode; true when it is
    /// over (and its pages released).
    pub fn check_finished(&mut self, cache: &mut PrefixCache, tokenizer: &Tokenizer) -> bool {
        if self.done {
            return true;
        }
        let Some(decoder) = self.decoder.as_ref() else {
            self.done = true;
            return true;
        };
        if self.cancel.is_cancelled() {
            self.finish(cache, tokenizer, FinishReason::Cancelled, Vec::new(), None);
            return true;
        }
        if decoder.is_finished() {
            // Nothing to decode (max_tokens 0).
            let reason = decoder.finish_reason().unwrap_or(FinishReason::Length);
            self.finish(cache, tokenizer, reason, Vec::new(), None);
            return true;
        }
        false
    }

    /// Publishes the blocks whose K/V became final since the last call to the prefix cache.
    pub fn publish_committed(&mut self, cache: &mut PrefixCache) {
        let (Some(root), Some(decoder)) = (self.cache_root, self.decoder.as_ref()) else {
            return;
        };
        let block = cache.block();
        let committed = decoder.committed();
        let (mut parent, mut published) = self.chain;
        while (published + 1) * block <= committed.len() {
            let hash = parent
                .unwrap_or(root)
                .child(&committed[published * block..(published + 1) * block]);
            cache.publish(self.pages[published], hash);
            parent = Some(hash);
            published += 1;
        }
        self.chain = (parent, published);
    }

    /// Turns one step's result into events (and the end of the request when it finished).
    pub fn on_update(&mut self, update: Update, cache: &mut PrefixCache, tokenizer: &Tokenizer) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        match update {
            Update::Refining => {}
            Update::Prefill { processed, total } => {
                let elapsed_ms = self.started.elapsed().as_millis() as u64;
                let cached = decoder.stats().cached_tokens;
                self.send(Event::PrefillProgress {
                    total,
                    cached,
                    processed,
                    elapsed_ms,
                });
            }
            Update::Block(block) => {
                let all_ids = decoder.output().to_vec();
                let text = match self.output.push_block(tokenizer, &all_ids) {
                    Ok(text) => text,
                    Err(e) => return self.fail(cache, e.to_string()),
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
                        cache,
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
        cache: &mut PrefixCache,
        tokenizer: &Tokenizer,
        reason: FinishReason,
        mut pending: Vec<(String, Vec<ToolCallDelta>)>,
        last_block: Option<(Vec<u32>, crate::api::BlockStats)>,
    ) {
        let Some(decoder) = self.decoder.take() else {
            self.done = true;
            return;
        };
        self.release_pages(cache);
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

    pub fn fail(&mut self, cache: &mut PrefixCache, message: String) {
        if self.done {
            return;
        }
        tracing::warn!(request = self.id, "generation failed: {message}");
        self.decoder = None;
        self.release_pages(cache);
        let _ = self.events.send(Event::Error(message));
        self.done = true;
    }

    fn release_pages(&mut self, cache: &mut PrefixCache) {
        cache.release(&std::mem::take(&mut self.pages));
    }
}
