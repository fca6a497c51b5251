//! The engine's loop as three plain steps, which the worker runs over and over:
//!
//! 1. [`Core::schedule`] decides the next batch and returns it as plain data ([`StepPlan`]): it
//!    ends cancelled requests, gives every running request the pages of its current block, and
//!    asks each for its next forward;
//! 2. the worker runs the plan as one `ModelRunner::forward_batch` ([`StepPlan::segments`]);
//! 3. [`Core::apply`] hands each request its output.
//!
//! What happens to each request comes out as [`SequenceUpdate`]s ([`Core::take_updates`]),
//! which the worker hands to the output thread (`engine/output_thread.rs`) to turn into events;
//! the core knows nothing of text or clients. The one word that comes back is a request's
//! [`StopSignal`]: a stop string ended its answer, and the core ends it at its next schedule.
//!
//! **Memory on demand.** A request holds the pages of its prompt and of the block it is decoding
//! (the K/V it has written or is writing), plus a reserve of [`RESERVE_PAGES`] for the next
//! block when the pool has one; it takes the next block's page when it gets there. When the pool
//! is out of pages, the request that needs one gets it from, in order: free pages, cached pages
//! nobody holds (evicted), other requests' unused reserves, and finally the most recently
//! admitted request, which is preempted: its pages go back to the pool (its committed blocks stay
//! cached), its decoding state and block hashes stay, and it waits to be resumed before any new
//! request is admitted. Resumed, it recomputes the K/V of its committed ids (the prefix cache
//! mostly serves them) and goes on exactly where it stopped. The oldest request is never
//! preempted and its canvas fits the pool (`Engine::submit` refuses one that could never fit),
//! so it always progresses: no deadlock.
//!
//! **A step's batch.** Every running request's next denoising or commit forward comes first,
//! oldest first; prefill chunks (and the recompute of resumed requests) fill the rest of the
//! token budget, starting from a different prefilling request each step, at least one block of
//! prefill per step. When no request has a denoising forward waiting, prefill takes up to
//! [`LONE_PREFILL_TOKENS`] in one forward; under load each chunk is at most
//! [`PREFILL_CHUNK_TOKENS`], so a long prompt neither stalls everyone's steps nor starves itself.

use std::collections::VecDeque;
use std::time::Duration;

use minnow_model::batch::pages_for;
use minnow_model::{ModelRunner, PageId, RowDraw, Segment, SegmentOutput};

use super::handle::{CancelToken, StopSignal};
use crate::api::{FinishReason, GenerationStats};
use crate::decode::constrained::Constrained;
use crate::decode::layout::Layout;
use crate::decode::params::ResolvedParams;
use crate::decode::request::{
    DecodeError, DecoderContext, FinishedBlock, Next, PlannedForward, RequestDecoder, Update,
    PREFILL_CHUNK_TOKENS,
};
use crate::error::EngineError;
use crate::kv_cache::{BlockHash, BlockPool, CacheStats, RequestPages};

impl From<DecodeError> for EngineError {
    fn from(error: DecodeError) -> Self {
        match error {
            DecodeError::Unsupported(message) => EngineError::InvalidRequest(message),
            DecodeError::BadOutput(message)
            | DecodeError::Runner(message)
            | DecodeError::Grammar(message) => EngineError::Internal(message),
            DecodeError::OutOfTurn(message) => EngineError::Internal(message.into()),
        }
    }
}

/// Pages a request keeps beyond its current block when the pool has them, so that it enters its
/// next block without waiting for memory.
pub(crate) const RESERVE_PAGES: usize = 1;

/// Prefill tokens one forward may hold when no request has a denoising forward waiting.
pub(crate) const LONE_PREFILL_TOKENS: usize = 8192;

/// Sequences per forward, bucketed for the `/metrics` histogram.
pub const BATCH_SIZE_BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Fixed scheduling settings of one engine.
#[derive(Clone, Debug)]
pub(crate) struct CoreSettings {
    /// Prefill tokens one step's batch may hold beside its denoising rows, under load.
    pub token_budget: usize,
    /// Identity of the loaded model in block hashes.
    pub model_identity: String,
}

/// A validated request, ready to be admitted.
pub(crate) struct NewSequence {
    pub id: u64,
    pub prompt_ids: Vec<u32>,
    pub layout: Layout,
    pub params: ResolvedParams,
    pub decoder: DecoderContext,
    /// Record the per-forward trace.
    pub trace: bool,
    /// Whether the prompt may use and fill the prefix cache.
    pub cache_prompt: bool,
    pub cache_salt: Option<String>,
    pub cancel: CancelToken,
    /// Raised by the output thread when a stop string ended the answer.
    pub stop_signal: StopSignal,
    /// The compiled grammar of a structured-output request.
    pub constraint: Option<Constrained>,
}

/// Why [`Core::admit`] did not take a request.
pub(crate) enum Refusal {
    /// Not enough pages now: offer it again once running requests free some.
    Wait(Box<NewSequence>),
    /// It can never run here.
    Never(EngineError),
}

/// What happened to one request; every request ends with exactly one `Ended` or `Failed`.
pub(crate) enum SequenceUpdate {
    /// A cache hit at admission: the first `cached` of the `total` prefill positions are done.
    Admitted {
        id: u64,
        cached: usize,
        total: usize,
    },
    Prefill {
        id: u64,
        processed: usize,
        total: usize,
        cached: usize,
    },
    /// A block became final and another follows. `totals` and `trace_len` are the request's
    /// statistics and trace length as of this block: what its `Done` reports when a stop string
    /// in this block ends it (the core may decode further blocks before it hears so).
    Block {
        id: u64,
        block: FinishedBlock,
        totals: GenerationStats,
        trace_len: usize,
    },
    /// The request is over and its pages are released; `last_block` is the block that ended it,
    /// if one did.
    Ended {
        id: u64,
        reason: FinishReason,
        last_block: Option<FinishedBlock>,
        decoder: Box<RequestDecoder>,
    },
    Failed {
        id: u64,
        error: EngineError,
    },
}

/// One forward of the plan: request `id`'s `forward` over its block table `pages`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlannedSegment {
    pub id: u64,
    pub pages: Vec<PageId>,
    pub forward: PlannedForward,
}

/// One step's batch, as plain data.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StepPlan {
    pub segments: Vec<PlannedSegment>,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The batch as the runner takes it.
    pub fn segments(&self) -> Vec<Segment<'_>> {
        self.segments
            .iter()
            .map(|s| Segment {
                pages: &s.pages,
                start: s.forward.start,
                ids: &s.forward.ids,
                want: s.forward.want.clone(),
            })
            .collect()
    }

    /// Drops request `id`'s forward (it ended before the batch ran).
    pub fn remove(&mut self, id: u64) {
        self.segments.retain(|s| s.id != id);
    }
}

/// How a sequence ended, noted during a pass and reported when it is retired.
enum Outcome {
    Ended(FinishReason, Option<FinishedBlock>),
    Failed(EngineError),
}

/// One admitted request.
struct Sequence {
    id: u64,
    /// Admission order (kept across preemptions): the newest is preempted first.
    admitted: u64,
    decoder: RequestDecoder,
    pages: RequestPages,
    cancel: CancelToken,
    stop_signal: StopSignal,
    /// Set once it is over (its pages are released then); it leaves at the next retire.
    outcome: Option<Outcome>,
}

impl Sequence {
    /// Why it must end now from outside: its client cancelled it, or a stop string ended it.
    fn interrupted(&self) -> Option<FinishReason> {
        if self.cancel.is_cancelled() {
            Some(FinishReason::Cancelled)
        } else if self.stop_signal.is_stopped() {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }

    /// Pages its current block needs, and that plus the reserve (within its canvas).
    fn pages_wanted(&self, block: usize) -> (usize, usize) {
        let needed = self.decoder.current_block_end().div_ceil(block);
        let canvas = pages_for(self.decoder.layout().total_len, block);
        (needed, (needed + RESERVE_PAGES).min(canvas).max(needed))
    }
}

/// Counters the worker reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CoreCounters {
    /// Forwards run per batch size bucket (index into [`BATCH_SIZE_BUCKETS`], then +Inf).
    pub batch_sizes: [u64; BATCH_SIZE_BUCKETS.len() + 1],
    pub batch_size_sum: u64,
    /// Requests preempted to make room, since start.
    pub preemptions: u64,
}

pub(crate) struct Core {
    pool: BlockPool,
    settings: CoreSettings,
    /// Requests that hold pages, in admission order.
    running: Vec<Sequence>,
    /// Preempted requests waiting to resume, in admission order.
    preempted: VecDeque<Sequence>,
    next_admission: u64,
    /// Rotates which prefilling request gets the step's budget first.
    prefill_turn: usize,
    updates: Vec<SequenceUpdate>,
    pub counters: CoreCounters,
}

impl Core {
    pub fn new(pool: BlockPool, settings: CoreSettings) -> Self {
        Core {
            pool,
            settings,
            running: Vec::new(),
            preempted: VecDeque::new(),
            next_admission: 0,
            prefill_turn: 0,
            updates: Vec::new(),
            counters: CoreCounters::default(),
        }
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.pool.stats()
    }

    /// Requests holding pages.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests admitted and not over: running or preempted.
    pub fn active(&self) -> usize {
        self.running.len() + self.preempted.len()
    }

    pub fn has_preempted(&self) -> bool {
        !self.preempted.is_empty()
    }

    /// What happened since the last call, in order.
    pub fn take_updates(&mut self) -> Vec<SequenceUpdate> {
        std::mem::take(&mut self.updates)
    }

    /// Admits a request when the pages of its prompt and first block (and the reserve) can be
    /// had now, taking its prompt's longest cached run of blocks from the prefix cache.
    pub fn admit(&mut self, new: NewSequence) -> Result<(), Refusal> {
        let block = self.pool.block();
        let canvas = pages_for(new.layout.total_len, block);
        let total = self.pool.total();
        if canvas > total {
            let error = EngineError::Overloaded(format!(
                "the request needs {canvas} K/V pages ({} tokens) but the K/V cache holds {total}; raise --kv-cache-mib",
                new.layout.total_len
            ));
            return Err(Refusal::Never(error));
        }
        let root = new
            .cache_prompt
            .then(|| BlockHash::root(&self.settings.model_identity, new.cache_salt.as_deref()));
        let mut pages = RequestPages::new(root);
        pages.hash_committed(&new.prompt_ids[..new.layout.prefill_len], block);
        let hit = pages.take_cached(&mut self.pool);
        let first_block_end = (new.layout.prefill_len + block).min(new.layout.total_len);
        let needed = first_block_end.div_ceil(block);
        let wanted = (needed + RESERVE_PAGES).min(canvas).max(needed);
        if !pages.grow_to(&mut self.pool, wanted) {
            pages.release(&mut self.pool);
            return Err(Refusal::Wait(Box::new(new)));
        }
        let cached = hit * block;
        self.pool.record_hit(cached);
        let decoder = match RequestDecoder::new(
            new.prompt_ids,
            new.layout,
            new.params,
            new.decoder,
            new.trace,
        ) {
            Ok(decoder) => {
                let decoder = decoder.with_cached_prefix(cached);
                match new.constraint {
                    Some(constraint) => decoder.with_constraint(constraint),
                    None => decoder,
                }
            }
            Err(error) => {
                pages.release(&mut self.pool);
                self.updates.push(SequenceUpdate::Failed {
                    id: new.id,
                    error: error.into(),
                });
                return Ok(());
            }
        };
        if cached > 0 {
            self.updates.push(SequenceUpdate::Admitted {
                id: new.id,
                cached,
                total: decoder.layout().prefill_len,
            });
        }
        let admitted = self.next_admission;
        self.next_admission += 1;
        self.running.push(Sequence {
            id: new.id,
            admitted,
            decoder,
            pages,
            cancel: new.cancel,
            stop_signal: new.stop_signal,
            outcome: None,
        });
        Ok(())
    }

    /// Resumes the oldest preempted request when the pages of its current block (and the
    /// reserve) can be had now, minus what the prefix cache still holds of its committed blocks.
    pub fn resume_oldest(&mut self) -> bool {
        let block = self.pool.block();
        let Some(mut seq) = self.preempted.pop_front() else {
            return false;
        };
        let hit = seq.pages.take_cached(&mut self.pool);
        let (_, wanted) = seq.pages_wanted(block);
        if !seq.pages.grow_to(&mut self.pool, wanted) {
            seq.pages.release(&mut self.pool);
            self.preempted.push_front(seq);
            return false;
        }
        seq.decoder.resume(hit * block);
        let at = self
            .running
            .iter()
            .position(|r| r.admitted > seq.admitted)
            .unwrap_or(self.running.len());
        self.running.insert(at, seq);
        true
    }

    /// Fails every admitted request (an engine shutdown or a bug in a step).
    pub fn fail_all(&mut self, error: impl Fn() -> EngineError) {
        for mut seq in self.running.drain(..).chain(self.preempted.drain(..)) {
            seq.pages.release(&mut self.pool);
            self.updates.push(SequenceUpdate::Failed {
                id: seq.id,
                error: error(),
            });
        }
    }

    /// Plans the next step (see the module docs).
    pub fn schedule(&mut self) -> StepPlan {
        self.end_interrupted();
        let block = self.pool.block();
        let mut plan = StepPlan::default();
        // Denoising and commit forwards, oldest first (a prefilling request answers Idle to a
        // budget of 0).
        let mut i = 0;
        while i < self.running.len() {
            if let Some(forward) = self.plan_one(i, 0, &mut plan) {
                self.push_segment(&mut plan, i, forward);
            }
            i += 1;
        }
        // Prefill chunks fill the rest of the budget, from a rotating first request.
        let lone = plan.is_empty();
        let (mut budget, chunk_cap) = if lone {
            let budget = self.settings.token_budget.max(LONE_PREFILL_TOKENS);
            (budget, budget)
        } else {
            (self.settings.token_budget, PREFILL_CHUNK_TOKENS)
        };
        let prefilling: Vec<u64> = self
            .running
            .iter()
            .filter(|s| s.outcome.is_none() && s.decoder.is_prefilling())
            .map(|s| s.id)
            .collect();
        let n = prefilling.len();
        let mut prefilled = false;
        for k in 0..n {
            let id = prefilling[(self.prefill_turn + k) % n];
            // (A request preempted by an earlier one's pages is gone from `running`.)
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            if self.running[i].outcome.is_some() {
                continue;
            }
            let allowance = if prefilled { budget } else { budget.max(block) };
            let allowance = allowance.min(chunk_cap);
            if allowance < block {
                break;
            }
            if let Some(forward) = self.plan_one(i, allowance, &mut plan) {
                budget = budget.saturating_sub(forward.ids.len());
                prefilled = true;
                self.push_segment(&mut plan, i, forward);
            }
        }
        self.prefill_turn = self.prefill_turn.wrapping_add(1);
        self.retire();
        plan
    }

    /// The grammars of the step's constrained denoising forwards, whose next masks the worker
    /// has computed while the forward runs (empty when no request of the step is constrained).
    pub fn step_constraints(&mut self) -> Vec<&mut Constrained> {
        self.running
            .iter_mut()
            .filter_map(|s| s.decoder.constraint_of_planned_step())
            .collect()
    }

    /// Hands each request of `plan` its output (`outputs` in the plan's order), or fails them
    /// all when the forward failed (a batch runs as one: its failure is no single request's).
    /// `runner` ran the forward: a constrained request may read a row of it in full.
    pub fn apply(
        &mut self,
        plan: StepPlan,
        outputs: Result<Vec<SegmentOutput>, String>,
        elapsed: Duration,
        runner: &mut dyn ModelRunner,
    ) {
        if !plan.is_empty() {
            self.record_batch_size(plan.segments.len());
        }
        match outputs {
            Ok(outputs) if outputs.len() == plan.segments.len() => {
                let ahead = self.draw_ahead(&plan, &outputs, runner);
                for (index, (segment, output)) in plan.segments.into_iter().zip(outputs).enumerate()
                {
                    let Some(i) = self.running.iter().position(|s| s.id == segment.id) else {
                        continue;
                    };
                    let mut rows = crate::decode::RunnerRows::new(&mut *runner, index);
                    rows.drawn = ahead.of(index);
                    match self.running[i].decoder.apply(output, &mut rows, elapsed) {
                        Ok(update) => self.on_update(i, update),
                        Err(error) => self.fail(i, error.into()),
                    }
                }
            }
            result => {
                let message = match result {
                    Err(message) => format!("the forward failed: {message}"),
                    Ok(outputs) => format!(
                        "the forward returned {} outputs for {} segments",
                        outputs.len(),
                        plan.segments.len()
                    ),
                };
                tracing::warn!("batched forward failed: {message}");
                for segment in &plan.segments {
                    if let Some(i) = self.running.iter().position(|s| s.id == segment.id) {
                        self.fail(i, EngineError::Internal(message.clone()));
                    }
                }
            }
        }
        self.retire();
    }

    /// The device draws of every sampling step of the forward, in one runner call: each request's
    /// uniforms are taken in plan order (each from its own generator), then drawn together.
    fn draw_ahead(
        &mut self,
        plan: &StepPlan,
        outputs: &[SegmentOutput],
        runner: &mut dyn ModelRunner,
    ) -> DrawnAhead {
        let mut ahead = DrawnAhead {
            spans: vec![None; plan.segments.len()],
            pairs: Ok(Vec::new()),
        };
        if !runner.draws_rows() {
            return ahead;
        }
        let mut draws = Vec::new();
        for (index, (segment, output)) in plan.segments.iter().zip(outputs).enumerate() {
            let Some(i) = self.running.iter().position(|s| s.id == segment.id) else {
                continue;
            };
            if let Some(mine) = self.running[i].decoder.take_device_draws(output) {
                ahead.spans[index] = Some(draws.len()..draws.len() + mine.len());
                draws.extend(mine.into_iter().map(|d| RowDraw {
                    segment: index,
                    ..d
                }));
            }
        }
        if !draws.is_empty() {
            ahead.pairs = runner.draw_rows(&draws).map_err(|e| e.to_string());
        }
        ahead
    }

    /// Request `i`'s next forward under `prefill_budget`, after any forward-less progress it
    /// makes first; its current block's pages are secured before each plan. `None` when it has
    /// nothing to run now (or was preempted for lack of pages).
    fn plan_one(
        &mut self,
        i: usize,
        prefill_budget: usize,
        plan: &mut StepPlan,
    ) -> Option<PlannedForward> {
        loop {
            let seq = &self.running[i];
            if seq.outcome.is_some() {
                return None;
            }
            if seq.decoder.is_finished() {
                let reason = seq.decoder.finish_reason().unwrap_or(FinishReason::Length);
                self.end_at(i, reason, None);
                return None;
            }
            if !self.secure_pages(i, plan) {
                return None;
            }
            match self.running[i].decoder.plan(prefill_budget) {
                // Planning can move the request on to a forward that ends past the pages
                // secured above (a final block's commit merged into the next block's first
                // forward): secure those too. Preempted now, it keeps the forward for later.
                Ok(Next::Forward(forward)) => {
                    return self.secure_pages(i, plan).then_some(forward);
                }
                Ok(Next::Idle) => return None,
                Ok(Next::Update(update)) => self.on_update(i, update),
                Err(error) => {
                    self.fail(i, error.into());
                    return None;
                }
            }
        }
    }

    fn push_segment(&self, plan: &mut StepPlan, i: usize, forward: PlannedForward) {
        let seq = &self.running[i];
        let end = forward.start + forward.ids.len();
        // The forward's block table: the pages up to its end (not the reserve).
        let pages = seq.pages.pages()[..end.div_ceil(self.pool.block())].to_vec();
        plan.segments.push(PlannedSegment {
            id: seq.id,
            pages,
            forward,
        });
    }

    /// Gives request `i` the pages of its current block (and tops up its reserve when the pool
    /// can). Out of pages: unused reserves of the others, then the newest request is preempted;
    /// `false` when that is request `i` itself.
    fn secure_pages(&mut self, i: usize, plan: &mut StepPlan) -> bool {
        let block = self.pool.block();
        let (needed, wanted) = self.running[i].pages_wanted(block);
        loop {
            let seq = &mut self.running[i];
            if seq.pages.grow_to(&mut self.pool, needed) {
                // The reserve only when the pool has it to spare now.
                seq.pages.grow_to(&mut self.pool, wanted);
                return true;
            }
            if self.reclaim_reserves(i) > 0 {
                continue;
            }
            let newest = self
                .running
                .iter()
                .rposition(|s| s.outcome.is_none())
                .expect("request i is running");
            self.preempt(newest, plan);
            if newest == i {
                return false;
            }
        }
    }

    /// Takes back the reserves of every running request but `i`; returns the pages freed.
    fn reclaim_reserves(&mut self, i: usize) -> usize {
        let block = self.pool.block();
        let mut freed = 0;
        for (j, seq) in self.running.iter_mut().enumerate() {
            if j != i && seq.outcome.is_none() {
                let (needed, _) = seq.pages_wanted(block);
                freed += seq.pages.shrink_to(&mut self.pool, needed);
            }
        }
        freed
    }

    /// Preempts request `i` (see the module docs); a forward of it already in `plan` is taken out
    /// and kept by its decoder for when it resumes.
    fn preempt(&mut self, i: usize, plan: &mut StepPlan) {
        let mut seq = self.running.remove(i);
        plan.remove(seq.id);
        seq.decoder.preempt();
        seq.pages.release(&mut self.pool);
        self.counters.preemptions += 1;
        tracing::debug!(request = seq.id, "preempted: the K/V cache is full");
        let at = self
            .preempted
            .iter()
            .position(|p| p.admitted > seq.admitted)
            .unwrap_or(self.preempted.len());
        self.preempted.insert(at, seq);
    }

    fn on_update(&mut self, i: usize, update: Update) {
        let block = self.pool.block();
        let seq = &mut self.running[i];
        // Blocks whose K/V became final are published for other requests.
        seq.pages.hash_committed(seq.decoder.committed(), block);
        let ready = seq.decoder.committed_in_pages() / block;
        seq.pages.publish(&mut self.pool, ready);
        let id = seq.id;
        match update {
            Update::Refining | Update::Restoring => {}
            Update::Prefill { processed, total } => {
                let cached = seq.decoder.stats().cached_tokens;
                self.updates.push(SequenceUpdate::Prefill {
                    id,
                    processed,
                    total,
                    cached,
                });
            }
            Update::Block(block) => match block.finish {
                Some(reason) => self.end_at(i, reason, Some(block)),
                None => {
                    let totals = seq.decoder.stats();
                    let trace_len = seq.decoder.trace().map_or(0, <[_]>::len);
                    self.updates.push(SequenceUpdate::Block {
                        id,
                        block,
                        totals,
                        trace_len,
                    })
                }
            },
        }
    }

    fn end_at(&mut self, i: usize, reason: FinishReason, last_block: Option<FinishedBlock>) {
        let seq = &mut self.running[i];
        seq.pages.release(&mut self.pool);
        seq.outcome = Some(Outcome::Ended(reason, last_block));
    }

    fn fail(&mut self, i: usize, error: EngineError) {
        let seq = &mut self.running[i];
        seq.pages.release(&mut self.pool);
        seq.outcome = Some(Outcome::Failed(error));
    }

    /// Ends the requests that their client cancelled or that a stop string ended.
    fn end_interrupted(&mut self) {
        for i in 0..self.running.len() {
            if self.running[i].outcome.is_none() {
                if let Some(reason) = self.running[i].interrupted() {
                    self.end_at(i, reason, None);
                }
            }
        }
        let (interrupted, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.preempted)
            .into_iter()
            .partition(|s| s.interrupted().is_some());
        self.preempted = waiting.into();
        for seq in interrupted {
            let reason = seq.interrupted().expect("partitioned on it");
            self.report(seq, Outcome::Ended(reason, None));
        }
    }

    /// Reports and drops the requests that are over.
    fn retire(&mut self) {
        let (over, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| s.outcome.is_some());
        self.running = running;
        for mut seq in over {
            let outcome = seq.outcome.take().expect("partitioned on it");
            self.report(seq, outcome);
        }
    }

    fn report(&mut self, seq: Sequence, outcome: Outcome) {
        self.updates.push(match outcome {
            Outcome::Ended(reason, last_block) => SequenceUpdate::Ended {
                id: seq.id,
                reason,
                last_block,
                decoder: Box::new(seq.decoder),
            },
            Outcome::Failed(error) => SequenceUpdate::Failed { id: seq.id, error },
        });
    }

    fn record_batch_size(&mut self, n: usize) {
        let bucket = BATCH_SIZE_BUCKETS
            .iter()
            .position(|&b| n <= b)
            .unwrap_or(BATCH_SIZE_BUCKETS.len());
        self.counters.batch_sizes[bucket] += 1;
        self.counters.batch_size_sum += n as u64;
    }
}

/// A forward's device draws, drawn in one call ([`Core::draw_ahead`]): where each segment's
/// pairs are (`None`: it draws nothing), and the pairs or why the call failed (each drawing
/// request then fails with it).
struct DrawnAhead {
    spans: Vec<Option<std::ops::Range<usize>>>,
    pairs: Result<Vec<(u32, f32)>, String>,
}

impl DrawnAhead {
    /// Segment `index`'s pairs, or the failure, if it drew.
    fn of(&self, index: usize) -> Option<Result<&[(u32, f32)], &str>> {
        let span = self.spans[index].clone()?;
        Some(match &self.pairs {
            Ok(pairs) => Ok(&pairs[span]),
            Err(e) => Err(e.as_str()),
        })
    }
}

#[cfg(test)]
mod tests;
