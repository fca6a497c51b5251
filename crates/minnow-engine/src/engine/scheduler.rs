//! The scheduler: which requests run, and what each step's batch holds.
//!
//! - **Admission** ([`Scheduler::admit`]): a request enters the batch with every page its canvas
//!   can need: the longest run of its prompt's complete blocks found in the prefix cache, plus
//!   fresh pages (free ones first, then evicted cached ones). Reserving the whole canvas up front
//!   means a running request never waits for memory, so the engine cannot deadlock; a request
//!   that does not fit now waits at the head of the queue, and one that could never fit is
//!   refused.
//! - **A step** ([`Scheduler::step`]): every running request's next denoising or commit forward
//!   goes into the batch first; prefill chunks fill the rest of the token budget, starting from a
//!   different prefilling request each step, and at least one block of prefill runs per step, so
//!   a long prompt neither stalls everyone's steps nor starves itself. The batch runs as one
//!   forward; each request applies its own output ([`RequestDecoder::apply`]).

use std::time::Instant;

use minnow_model::batch::pages_for;
use minnow_model::{ModelRunner, Segment};

use super::worker::{Active, Job};
use super::EngineError;
use crate::decode::request::{Next, PlannedForward};
use crate::prefix_cache::{BlockHash, PrefixCache};
use crate::tokenizer::Tokenizer;

/// Fixed scheduling settings of one engine.
#[derive(Clone, Debug)]
pub(crate) struct SchedulerSettings {
    /// Tokens one step's batch may hold beyond its denoising rows.
    pub token_budget: usize,
    /// Identity of the loaded model in block hashes.
    pub model_identity: String,
}

/// Sequences per forward, bucketed for the `/metrics` histogram.
pub const BATCH_SIZE_BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// What happened to a job offered for admission.
pub(crate) enum Admission {
    Running,
    /// Not enough pages now; try again after running requests release theirs.
    Wait(Job),
    /// It can never run (its canvas needs more pages than the pool has).
    Refused(Job, EngineError),
}

pub(crate) struct Scheduler {
    pub running: Vec<Active>,
    pub cache: PrefixCache,
    settings: SchedulerSettings,
    /// Rotates which prefilling request gets the step's budget first.
    prefill_turn: usize,
    /// Forwards run per batch size bucket (index into [`BATCH_SIZE_BUCKETS`], then +Inf).
    pub batch_sizes: [u64; BATCH_SIZE_BUCKETS.len() + 1],
    pub batch_size_sum: u64,
}

impl Scheduler {
    pub fn new(cache: PrefixCache, settings: SchedulerSettings) -> Self {
        Scheduler {
            running: Vec::new(),
            cache,
            settings,
            prefill_turn: 0,
            batch_sizes: [0; BATCH_SIZE_BUCKETS.len() + 1],
            batch_size_sum: 0,
        }
    }

    /// Takes a job into the batch if its pages can be had (see the module docs).
    pub fn admit(&mut self, job: Job) -> Admission {
        let block = self.cache.block();
        let needed = pages_for(job.layout.total_len, block);
        let total = self.cache.stats().pages_total;
        if needed > total {
            let error = EngineError::Overloaded(format!(
                "the request needs {needed} K/V pages ({} tokens) but the K/V cache holds {total}; raise --kv-cache-mib",
                job.layout.total_len
            ));
            return Admission::Refused(job, error);
        }
        let root = (job.request.cache_prompt != Some(false)).then(|| {
            BlockHash::root(
                &self.settings.model_identity,
                job.request.cache_salt.as_deref(),
            )
        });
        let hit = match root {
            Some(root) => {
                let prefill = &job.request.prompt_ids[..job.layout.prefill_len];
                self.cache.lookup(&BlockHash::chain(root, prefill, block))
            }
            None => Vec::new(),
        };
        let Some(fresh) = self.cache.allocate(needed - hit.len()) else {
            self.cache.release(&hit);
            return Admission::Wait(job);
        };
        let cached = hit.len() * block;
        self.cache.record_hit(cached);
        let mut pages = hit;
        pages.extend(fresh);
        self.running.push(Active::start(job, pages, cached, root));
        Admission::Running
    }

    /// One step: plan every running request, run the batch, apply the outputs.
    pub fn step(&mut self, runner: &mut dyn ModelRunner, tokenizer: &Tokenizer) {
        let block = self.cache.block();
        let mut planned: Vec<(usize, PlannedForward)> = Vec::new();
        // Denoising and commit forwards first (a prefilling request answers Idle to a budget of 0).
        for (i, request) in self.running.iter_mut().enumerate() {
            if let Some(forward) = plan(request, 0, &mut self.cache, tokenizer) {
                planned.push((i, forward));
            }
        }
        // Prefill chunks fill the rest of the budget, from a rotating first request.
        let mut budget = self.settings.token_budget;
        let n = self.running.len();
        let mut prefilled = false;
        for k in 0..n {
            let i = (self.prefill_turn + k) % n;
            let request = &mut self.running[i];
            let prefilling = request.decoder.as_ref().is_some_and(|d| d.is_prefilling());
            if !prefilling || request.done {
                continue;
            }
            let allowance = if prefilled { budget } else { budget.max(block) };
            if allowance < block {
                break;
            }
            if let Some(forward) = plan(request, allowance, &mut self.cache, tokenizer) {
                budget = budget.saturating_sub(forward.ids.len());
                prefilled = true;
                planned.push((i, forward));
            }
        }
        self.prefill_turn = self.prefill_turn.wrapping_add(1);
        if planned.is_empty() {
            return;
        }
        self.record_batch_size(planned.len());

        let segments: Vec<Segment<'_>> = planned
            .iter()
            .map(|(i, f)| Segment {
                pages: &self.running[*i].pages,
                start: f.start,
                ids: &f.ids,
                want: f.want.clone(),
            })
            .collect();
        let began = Instant::now();
        let result = runner.forward_batch(&segments);
        let elapsed = began.elapsed();
        drop(segments);
        match result {
            Ok(outputs) => {
                for ((i, _), output) in planned.into_iter().zip(outputs) {
                    let request = &mut self.running[i];
                    let Some(decoder) = request.decoder.as_mut() else {
                        continue;
                    };
                    match decoder.apply(output, elapsed) {
                        Ok(update) => {
                            request.publish_committed(&mut self.cache);
                            request.on_update(update, &mut self.cache, tokenizer);
                        }
                        Err(message) => request.fail(&mut self.cache, message),
                    }
                }
            }
            Err(e) => {
                // A forward failure cannot be pinned on one request (the batch ran as one):
                // every request in it fails with the message.
                tracing::warn!("batched forward failed: {e}");
                for (i, _) in planned {
                    self.running[i].fail(&mut self.cache, format!("the forward failed: {e}"));
                }
            }
        }
    }

    fn record_batch_size(&mut self, n: usize) {
        let bucket = BATCH_SIZE_BUCKETS
            .iter()
            .position(|&b| n <= b)
            .unwrap_or(BATCH_SIZE_BUCKETS.len());
        self.batch_sizes[bucket] += 1;
        self.batch_size_sum += n as u64;
    }

    /// Drops requests that ended.
    pub fn retire_finished(&mut self) {
        self.running.retain(|r| !r.done);
    }
}

/// The request's next forward, after any forward-less progress it makes first (a block that was
/// final before its next step sends its events here). `None` when it has nothing to run now.
fn plan(
    request: &mut Active,
    prefill_budget: usize,
    cache: &mut PrefixCache,
    tokenizer: &Tokenizer,
) -> Option<PlannedForward> {
    loop {
        if request.check_finished(cache, tokenizer) {
            return None;
        }
        let decoder = request.decoder.as_mut()?;
        match decoder.plan(prefill_budget) {
            Ok(Next::Forward(forward)) => return Some(forward),
            Ok(Next::Idle) => return None,
            Ok(Next::Update(update)) => {
                request.publish_committed(cache);
                request.on_update(update, cache, tokenizer);
            }
            Err(message) => {
                request.fail(cache, message);
                return None;
            }
        }
    }
}
