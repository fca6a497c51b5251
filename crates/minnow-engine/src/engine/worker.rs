//! The engine's worker thread, the model thread: it owns the model runner and the [`Core`], and
//! loops: admit queued requests (at most `parallel` admitted at once; preempted ones resume
//! first), then one step of the core (schedule, one batched forward, apply). What the core
//! reports about each request goes to the output thread (`output_thread.rs`), which turns it
//! into events (text, stop strings, tool calls) while the next forward runs.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use minnow_model::ModelRunner;

use super::core::{Core, CoreSettings, NewSequence, Refusal};
use super::output_thread::{OutputRequest, OutputThread};
use crate::api::Event;
use crate::error::{EngineError, EngineResult};
use crate::kv_cache::BlockPool;
use crate::kv_cache::CacheStats;
use crate::text::tokenizer::Tokenizer;

/// A validated request waiting for a slot: what the core decodes, and what its client's text
/// stream needs.
pub(crate) struct Job {
    pub sequence: NewSequence,
    pub output: OutputRequest,
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
        self.waiting.retain(|job| !job.output.events.is_closed());
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
    /// When the step now running began (None between steps).
    step_began: Mutex<Option<Instant>>,
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
            step_began: Mutex::new(None),
        }
    }

    /// How long the step now running has run; None between steps.
    pub fn step_running(&self) -> Option<Duration> {
        self.step_began
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|began| began.elapsed())
    }

    fn set_step_began(&self, began: Option<Instant>) {
        *self.step_began.lock().unwrap_or_else(|e| e.into_inner()) = began;
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
    let output = OutputThread::spawn(tokenizer)?;
    std::thread::Builder::new()
        .name("minnow-engine".into())
        .spawn(move || {
            let block = runner.config().block_size;
            let core = Core::new(BlockPool::new(runner.kv_pages(), block), settings);
            Worker {
                runner,
                core,
                output,
            }
            .run(&queue)
        })
        .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))
}

struct Worker {
    runner: Box<dyn ModelRunner>,
    core: Core,
    /// Where the core's updates become events (dropped last: it waits for them all).
    output: OutputThread,
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
                        self.deliver();
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
            queue.set_step_began(Some(Instant::now()));
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
            queue.set_step_began(None);
            if let Err(panic) = stepped {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("internal error: {message}");
                self.core
                    .fail_all(|| EngineError::Internal(format!("internal error: {message}")));
                self.deliver();
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
            let Job { sequence, output } = job;
            let id = sequence.id;
            match self.core.admit(sequence) {
                Ok(()) => {
                    self.output.open(id, output);
                    self.deliver();
                }
                Err(Refusal::Never(error)) => {
                    let _ = output.events.send(Event::Error(error));
                }
                Err(Refusal::Wait(sequence)) => {
                    state.waiting.push_front(Job {
                        sequence: *sequence,
                        output,
                    });
                    break;
                }
            }
        }
    }

    /// One step: schedule, run the batch, apply its outputs; the updates of each part go to the
    /// output thread at once. The grammar masks the step's constrained requests will want are
    /// computed on rayon's threads while the forward runs on this one (docs/decoding.md §13).
    fn step(&mut self) {
        let plan = self.core.schedule();
        self.deliver();
        if plan.is_empty() {
            return;
        }
        let segments = plan.segments();
        let began = Instant::now();
        let constraints = self.core.step_constraints();
        let runner = &mut self.runner;
        let outputs = if constraints.is_empty() {
            runner.forward_batch(&segments)
        } else {
            // The forward stays on this thread (a GPU runner's context is current here).
            rayon::in_place_scope(|scope| {
                for constraint in constraints {
                    scope.spawn(move |_| constraint.prepare_mask());
                }
                runner.forward_batch(&segments)
            })
        }
        .map_err(|e| e.to_string());
        let elapsed = began.elapsed();
        drop(segments);
        self.core.apply(plan, outputs, elapsed, &mut *self.runner);
        self.deliver();
    }

    fn deliver(&mut self) {
        self.output.updates(self.core.take_updates());
    }
}
