//! One request as a plan/apply state machine: prefill the complete prompt blocks in whole-block
//! chunks (skipping those a prefix-cache hit provides), then decode blocks in order (§1–§3),
//! commit each block's K/V when another block follows (§8), stop at a stop token or the token
//! budget (§9). Each step is at most one forward (a prefill chunk, a denoising forward or a commit
//! refresh), which the engine batches with other requests' and checks cancellation between.

use std::time::{Duration, Instant};

use minnow_model::{ModelRunner, SegmentOutput, SeqId, SingleSequence, Want};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

use super::block::{check_scores, BlockRun, BlockState};
use super::constrained::Constrained;
use super::indel::{Indel, IndelSettings};
use super::joint::{Joint, JointSettings};
use super::layout::Layout;
use super::low_confidence::{schedule, LowConfidence};
use super::params::ResolvedParams;
use super::stop_tokens::StopTokens;
use super::{
    BestIds, BlockAlgorithm, BlockLogits, ControlTokens, OffsetRows, ReadRow, StepScores, Top1Rows,
};
use crate::api::{Algorithm, BlockStats, FinishReason, GenerationStats};

/// Prefill chunk size in tokens (rounded down to whole blocks). Bounds the time one request holds
/// the worker before others get a step, and the spacing of progress events.
pub const PREFILL_CHUNK_TOKENS: usize = 512;

/// One denoising forward's result, for debugging against reference trajectories (the fixtures'
/// golden `steps`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceStep {
    /// Canvas block index (`start / B`).
    pub block: usize,
    /// The block's ids after the step.
    pub block_tokens: Vec<u32>,
}

/// A block that became final.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedBlock {
    /// Output ids of this block (answer positions only, cut after a stop token).
    pub tokens: Vec<u32>,
    pub stats: BlockStats,
    /// Set when this block ended the request (stop token or token budget).
    pub finish: Option<FinishReason>,
}

/// What one [`RequestDecoder::advance`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    Prefill {
        processed: usize,
        total: usize,
    },
    /// A denoising forward; the block is not final yet.
    Refining,
    Block(FinishedBlock),
    /// A chunk of committed ids recomputed after a preemption ([`RequestDecoder::preempt`]); no
    /// visible progress.
    Restoring,
}

/// Fixed per-checkpoint facts the decoder needs.
#[derive(Clone, Debug)]
pub struct DecoderContext {
    pub control: ControlTokens,
    pub stops: StopTokens,
    pub vocab_size: usize,
    /// The runner's `ModelRunner::full_logits_cheap`: which scores a step asks for
    /// ([`super::ScoreKind::to_ask`]).
    pub full_logits_cheap: bool,
    /// The runner's `ModelRunner::narrow_rows_pay`: whether a step asks only for the rows it
    /// reads ([`DecoderContext::rows_to_ask`]).
    pub narrow_rows: bool,
    /// The runner's `ModelRunner::draws_rows`: whether a sampling step's candidates are drawn
    /// on its device.
    pub draws_rows: bool,
    /// A final block's K/V refresh rides on the next block's first forward (`Phase::Commit`);
    /// off, it runs as a forward of its own.
    pub merge_commits: bool,
}

enum Phase {
    Prefill {
        done: usize,
    },
    Block {
        index: usize,
        run: BlockRun,
    },
    /// The block is final but its page holds K/V of other ids, and block `index + 1` (`next`)
    /// follows. The refresh rides on `next`'s first denoising forward: one forward over the
    /// final ids and `next`'s tokens, whose rows of `next` are its first step. Attention is
    /// block-causal and every row's arithmetic is the same in any forward (batch invariance), so
    /// the committed K/V and `next`'s scores have the bits of a refresh forward followed by a
    /// step, one forward fewer. Then `finished` goes out. A `next` that ends without a forward
    /// gets the refresh alone, as does every block with `DecoderContext::merge_commits` off.
    Commit {
        index: usize,
        run: BlockRun,
        finished: FinishedBlock,
        next: Box<BlockRun>,
    },
    Finished,
}

/// The forward a request needs next: `ids` at positions `start..` of its canvas.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedForward {
    pub start: usize,
    pub ids: Vec<u32>,
    pub want: Want,
}

impl PlannedForward {
    /// Whether the forward is a denoising step (it wants scores back): not a prefill chunk or a
    /// refresh alone.
    fn steps(&self) -> bool {
        self.want != Want::Nothing
    }
}

impl DecoderContext {
    /// The rows a block's next step asks its forward for: the slots the step reads
    /// ([`BlockRun::score_rows`]) on a runner where fewer rows cost less (`narrow_rows`), every
    /// slot elsewhere. Whatever the scores (full logits, top-1, best ids with device draws), the
    /// step reads them by block slot from the first row returned ([`super::BestIds::first`]).
    fn rows_to_ask(&self, run: &BlockRun) -> std::ops::Range<usize> {
        if self.narrow_rows {
            run.score_rows()
        } else {
            0..run.tokens().len()
        }
    }
}

/// What [`RequestDecoder::plan`] decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Run this forward, then [`RequestDecoder::apply`] its output.
    Forward(PlannedForward),
    /// Progress made without a forward (a block that was final before its next step).
    Update(Update),
    /// Nothing to do this step (a prefill chunk that the step's token budget cannot hold, or a
    /// finished request).
    Idle,
}

/// Why a request's decoding failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The request asks for what this checkpoint cannot do (the request's fault).
    #[error("{0}")]
    Unsupported(String),
    /// A forward's output does not match what was planned (the runner's fault).
    #[error("{0}")]
    BadOutput(String),
    /// `plan` and `apply` called out of turn (the caller's bug).
    #[error("{0}")]
    OutOfTurn(&'static str),
    /// The single-sequence runner of [`RequestDecoder::advance`] failed.
    #[error("{0}")]
    Runner(String),
    /// The grammar layer of a constrained request could not continue.
    #[error("{0}")]
    Grammar(String),
}

/// Builds the algorithm of one block.
fn make_algorithm(
    params: &ResolvedParams,
    layout: &Layout,
    block: &[u32],
    prompt_in_block: usize,
    control: ControlTokens,
) -> Result<Box<dyn BlockAlgorithm>, DecodeError> {
    Ok(match params.algorithm {
        Algorithm::LowConfidence => Box::new(LowConfidence::new(
            prompt_in_block,
            params.threshold,
            schedule(layout.block, params.steps, layout.max_new),
            params.sampler,
            control,
        )),
        Algorithm::Joint => Box::new(Joint::new(
            prompt_in_block,
            layout.block,
            JointSettings {
                threshold: params.threshold,
                editing_threshold: params.editing_threshold,
                max_post_steps: params.max_post_steps,
                num_to_transfer: params.num_to_transfer,
                sampler: params.sampler,
            },
            control,
        )),
        Algorithm::Indel => Box::new(
            Indel::new(
                block,
                prompt_in_block,
                IndelSettings {
                    threshold: params.threshold,
                    editing_threshold: params.editing_threshold,
                    max_post_steps: params.max_post_steps,
                    steps: params.steps,
                    sampler: params.sampler,
                },
                control,
            )
            .map_err(DecodeError::Unsupported)?,
        ),
    })
}

/// Checks that `params` can run with these control ids (indel needs DELETE and SPLIT).
pub fn check_algorithm(params: &ResolvedParams, control: ControlTokens) -> Result<(), DecodeError> {
    if params.algorithm == Algorithm::Indel && (control.delete.is_none() || control.split.is_none())
    {
        return Err(DecodeError::Unsupported(
            "the indel algorithm needs a LLaDA2.2 checkpoint (it has no DELETE/SPLIT tokens)"
                .into(),
        ));
    }
    Ok(())
}

/// One request's decoding state, as a plan/apply state machine: [`RequestDecoder::plan`] says
/// which forward comes next, the engine runs it (batched with other requests'), and
/// [`RequestDecoder::apply`] takes its output.
pub struct RequestDecoder {
    layout: Layout,
    prompt: Vec<u32>,
    params: ResolvedParams,
    ctx: DecoderContext,
    rng: StdRng,
    /// The single-sequence runner's sequence ([`RequestDecoder::advance`] only).
    seq: Option<SeqId>,
    phase: Phase,
    /// The forward planned and not yet applied (its end, for a prefill chunk).
    pending: Option<PlannedForward>,
    /// Set after a preemption, while the K/V of `committed` are recomputed into fresh pages: how
    /// many positions are back.
    restored: Option<usize>,
    /// The forward planned before a preemption and never run: it runs once the K/V are back
    /// (planning it again would repeat the algorithm's pre-forward check, which counts).
    deferred: Option<PlannedForward>,
    /// Canvas ids whose K/V are final in the request's pages (prompt blocks and committed
    /// blocks): what the prefix cache may publish.
    committed: Vec<u32>,
    output: Vec<u32>,
    finish: Option<FinishReason>,
    stats: GenerationStats,
    trace: Option<Vec<TraceStep>>,
    prefill_time: Duration,
    decode_time: Duration,
    /// The request's grammar between blocks (the running block holds it meanwhile).
    constraint: Option<Constrained>,
}

impl RequestDecoder {
    /// A decoder for `prompt` laid out by `layout`. With `max_new == 0` it is finished at once
    /// (finish reason "length", no forward).
    pub fn new(
        prompt: Vec<u32>,
        layout: Layout,
        params: ResolvedParams,
        ctx: DecoderContext,
        trace: bool,
    ) -> Result<Self, DecodeError> {
        check_algorithm(&params, ctx.control)?;
        let finished = layout.decode_blocks() == 0;
        Ok(Self {
            rng: StdRng::seed_from_u64(params.rng_seed()),
            stats: GenerationStats {
                prompt_tokens: prompt.len(),
                ..Default::default()
            },
            prompt,
            layout,
            params,
            ctx,
            seq: None,
            phase: if finished {
                Phase::Finished
            } else {
                Phase::Prefill { done: 0 }
            },
            pending: None,
            restored: None,
            deferred: None,
            committed: Vec::new(),
            output: Vec::new(),
            finish: finished.then_some(FinishReason::Length),
            trace: trace.then(Vec::new),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            constraint: None,
        })
    }

    /// Decodes the answer under a grammar (docs/decoding.md §13). Call before the first step.
    pub fn with_constraint(mut self, constraint: Constrained) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Starts after `cached` prompt positions whose K/V the request's pages already hold (a
    /// prefix-cache hit; whole blocks of the prefill part only).
    pub fn with_cached_prefix(mut self, cached: usize) -> Self {
        let b = self.layout.block;
        let cached = (cached.min(self.layout.prefill_len) / b) * b;
        if let Phase::Prefill { done } = &mut self.phase {
            *done = cached;
        }
        self.committed = self.prompt[..cached].to_vec();
        self.stats.cached_tokens = cached;
        self
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// `Stop` (a stop token) or `Length`, once finished.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The grammar of a constrained request whose planned forward is a denoising step of its
    /// block: that step may want the mask of its leftmost undecided slot, which the engine
    /// computes while the forward runs ([`Constrained::prepare_mask`]).
    pub fn constraint_of_planned_step(&mut self) -> Option<&mut Constrained> {
        if self.pending.is_none() || self.restored.is_some() {
            return None;
        }
        match &mut self.phase {
            Phase::Block { run, .. } => run.constraint_mut(),
            Phase::Commit { next, .. } if self.pending.as_ref().is_some_and(|f| f.steps()) => {
                next.constraint_mut()
            }
            _ => None,
        }
    }

    /// The device draws of the planned denoising step whose forward returned `output`, their
    /// uniforms taken now ([`BlockRun::take_device_draws`]): the engine draws every request's
    /// rows of a forward in one call, then [`RequestDecoder::apply`]s each. `None` when the
    /// step draws nothing on the device.
    pub fn take_device_draws(
        &mut self,
        output: &SegmentOutput,
    ) -> Option<Vec<minnow_model::RowDraw>> {
        if self.pending.is_none() || self.restored.is_some() {
            return None;
        }
        let SegmentOutput::TopK(top) = output else {
            return None;
        };
        let rows = self.pending.as_ref().map_or(0..0, |f| f.want.rows());
        // Rows are counted in the forward's segment: a merged commit's block follows the final
        // ids of the block before, `offset` rows in.
        let (draws, offset) = match &mut self.phase {
            Phase::Block { run, .. } => {
                let best = BestIds::from_slot(top, rows.start);
                (run.take_device_draws(best, &mut self.rng), 0)
            }
            Phase::Commit { run, next, .. } => {
                let offset = run.tokens().len();
                let best = BestIds::from_slot(top, rows.start - offset);
                (next.take_device_draws(best, &mut self.rng), offset)
            }
            _ => (None, 0),
        };
        let draws = draws?;
        Some(
            draws
                .into_iter()
                .map(|d| minnow_model::RowDraw {
                    row: d.row + offset,
                    ..d
                })
                .collect(),
        )
    }

    /// Output ids so far (committed blocks only).
    pub fn output(&self) -> &[u32] {
        &self.output
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Canvas ids whose K/V are final in the request's pages, from position 0.
    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    /// Whether the request's next forward is a prefill chunk: it is prefilling its prompt, or
    /// recomputing its committed ids after a preemption.
    pub fn is_prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefill { .. })
            || self
                .restored
                .is_some_and(|done| done < self.committed.len())
    }

    /// End of the block the request is working on (the prompt's blocks and the first decoded
    /// block while it prefills): the K/V positions its pages must cover now. 0 once finished.
    pub fn current_block_end(&self) -> usize {
        let b = self.layout.block;
        match &self.phase {
            Phase::Prefill { .. } => (self.layout.prefill_len + b).min(self.layout.total_len),
            Phase::Block { index, .. } => self.layout.block_start(*index) + b,
            Phase::Commit { next, .. } => next.start() + b,
            Phase::Finished => 0,
        }
    }

    /// Positions of [`RequestDecoder::committed`] whose K/V are in the request's pages now (all
    /// of them, except while they are recomputed after a preemption).
    pub fn committed_in_pages(&self) -> usize {
        self.restored.unwrap_or(self.committed.len())
    }

    /// The request lost its pages: its committed ids will be recomputed (from position 0, or
    /// from where [`RequestDecoder::resume`] says the cache has them) before it goes on exactly
    /// where it stopped. A forward planned and not run is kept for then.
    pub fn preempt(&mut self) {
        let pending = self.pending.take();
        if self.restored.is_none() {
            // (A restore chunk is simply recomputed again.)
            self.deferred = self.deferred.take().or(pending);
        }
        self.restored = Some(0);
    }

    /// After [`RequestDecoder::preempt`]: the pages hold the K/V of the first `cached`
    /// committed positions again (a prefix-cache hit; whole blocks).
    pub fn resume(&mut self, cached: usize) {
        let b = self.layout.block;
        if self.restored.is_some() {
            self.restored = Some(cached.min(self.committed.len()) / b * b);
        }
    }

    /// Statistics so far (timing totals are up to date after every call).
    pub fn stats(&self) -> GenerationStats {
        let mut stats = self.stats.clone();
        stats.completion_tokens = self.output.len();
        stats.prefill_seconds = self.prefill_time.as_secs_f64();
        stats.decode_seconds = self.decode_time.as_secs_f64();
        stats.tokens_per_second = if stats.decode_seconds > 0.0 {
            stats.completion_tokens as f64 / stats.decode_seconds
        } else {
            0.0
        };
        if let Some(c) = &self.constraint {
            stats.grammar_masks = c.masks_computed();
            stats.grammar_masks_prepared = c.prepared_masks_used();
            stats.grammar_rows_read = c.rows_read();
        }
        stats
    }

    /// The per-forward trace, when enabled.
    pub fn trace(&self) -> Option<&[TraceStep]> {
        self.trace.as_deref()
    }

    fn start_block(&mut self, index: usize) -> Result<Phase, DecodeError> {
        let run = self.block_run(index)?;
        Ok(Phase::Block { index, run })
    }

    /// Block `index`'s run, from its prompt ids and masks (it takes the grammar, if any).
    fn block_run(&mut self, index: usize) -> Result<BlockRun, DecodeError> {
        let b = self.layout.block;
        let start = self.layout.block_start(index);
        let prompt_in_block = self.layout.prompt_in_block(index);
        let mut block: Vec<u32> = self
            .prompt
            .iter()
            .skip(start)
            .take(prompt_in_block)
            .copied()
            .collect();
        block.resize(b, self.ctx.control.mask);
        let algorithm = make_algorithm(
            &self.params,
            &self.layout,
            &block,
            prompt_in_block,
            self.ctx.control,
        )?;
        let mut run = BlockRun::new(start, block, prompt_in_block, algorithm, self.ctx.control);
        if let Some(mut constraint) = self.constraint.take() {
            let answer = self.layout.output_slots(index);
            constraint.start_block(answer.start, answer.end);
            run = run.with_constraint(constraint);
        }
        Ok(run)
    }

    /// Decides the next step. A prefill chunk (or, after a preemption, a chunk of committed ids
    /// recomputed) holds at most `prefill_budget` tokens in whole blocks; with less than a block
    /// of budget a prefilling request waits ([`Next::Idle`]). Errors are one line.
    pub fn plan(&mut self, prefill_budget: usize) -> Result<Next, DecodeError> {
        if self.pending.is_some() {
            return Err(DecodeError::OutOfTurn("a forward is already planned"));
        }
        if let Some(done) = self.restored {
            let total = self.committed.len();
            if done < total {
                let b = self.layout.block;
                let chunk = prefill_budget / b * b;
                if chunk == 0 {
                    return Ok(Next::Idle);
                }
                let end = (done + chunk).min(total);
                return Ok(Next::Forward(self.planned(PlannedForward {
                    start: done,
                    ids: self.committed[done..end].to_vec(),
                    want: Want::Nothing,
                })));
            }
            self.restored = None;
        }
        if let Some(forward) = self.deferred.take() {
            return Ok(Next::Forward(self.planned(forward)));
        }
        loop {
            match std::mem::replace(&mut self.phase, Phase::Finished) {
                Phase::Finished => return Ok(Next::Idle),
                Phase::Prefill { done } => {
                    let total = self.layout.prefill_len;
                    if done >= total {
                        // Prefill complete (or nothing to prefill): start decoding.
                        self.phase = self.start_block(0)?;
                        continue;
                    }
                    self.phase = Phase::Prefill { done };
                    let b = self.layout.block;
                    let chunk = (prefill_budget / b) * b;
                    if chunk == 0 {
                        return Ok(Next::Idle);
                    }
                    let end = (done + chunk).min(total);
                    return Ok(Next::Forward(self.planned(PlannedForward {
                        start: done,
                        ids: self.prompt[done..end].to_vec(),
                        want: Want::Nothing,
                    })));
                }
                Phase::Block { index, mut run } => match run.plan() {
                    Some(kind) => {
                        let asked = kind.to_ask(self.ctx.full_logits_cheap, self.ctx.draws_rows);
                        let rows = self.ctx.rows_to_ask(&run);
                        let forward = PlannedForward {
                            start: run.start(),
                            ids: run.tokens().to_vec(),
                            want: asked.want(rows),
                        };
                        self.phase = Phase::Block { index, run };
                        return Ok(Next::Forward(self.planned(forward)));
                    }
                    None => {
                        if let Some(finished) = self.finish_block(index, run)? {
                            return Ok(Next::Update(Update::Block(finished)));
                        }
                    }
                },
                Phase::Commit {
                    index,
                    run,
                    finished,
                    mut next,
                } => {
                    let mut ids = run.tokens().to_vec();
                    let want = match self.ctx.merge_commits.then(|| next.plan()).flatten() {
                        Some(kind) => {
                            let asked =
                                kind.to_ask(self.ctx.full_logits_cheap, self.ctx.draws_rows);
                            let slots = self.ctx.rows_to_ask(&next);
                            let rows = ids.len() + slots.start..ids.len() + slots.end;
                            ids.extend_from_slice(next.tokens());
                            asked.want(rows)
                        }
                        None => Want::Nothing,
                    };
                    let forward = PlannedForward {
                        start: run.start(),
                        ids,
                        want,
                    };
                    self.phase = Phase::Commit {
                        index,
                        run,
                        finished,
                        next,
                    };
                    return Ok(Next::Forward(self.planned(forward)));
                }
            }
        }
    }

    fn planned(&mut self, forward: PlannedForward) -> PlannedForward {
        self.pending = Some(forward.clone());
        forward
    }

    /// Takes the output of the planned forward, which took `elapsed` (the whole batch's time);
    /// `read_row` reads a row of that forward in full (`ModelRunner::logits_row`), which a
    /// constrained step does where the grammar allows none of a row's best ids.
    pub fn apply(
        &mut self,
        output: SegmentOutput,
        read_row: &mut ReadRow<'_>,
        elapsed: Duration,
    ) -> Result<Update, DecodeError> {
        let planned = self
            .pending
            .take()
            .ok_or(DecodeError::OutOfTurn("apply without a planned forward"))?;
        if let Some(done) = self.restored.as_mut() {
            // While restoring, every planned forward is a chunk of committed ids.
            *done = planned.start + planned.ids.len();
            self.prefill_time += elapsed;
            return Ok(Update::Restoring);
        }
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Finished => Err(DecodeError::OutOfTurn("the request is already finished")),
            Phase::Prefill { .. } => {
                self.prefill_time += elapsed;
                let end = planned.start + planned.ids.len();
                self.committed.extend_from_slice(&planned.ids);
                self.phase = Phase::Prefill { done: end };
                Ok(Update::Prefill {
                    processed: end,
                    total: self.layout.prefill_len,
                })
            }
            Phase::Block { index, mut run } => {
                self.decode_time += elapsed;
                let state = self.apply_step(&mut run, output, planned.want.rows(), read_row)?;
                if state == BlockState::Refining {
                    self.phase = Phase::Block { index, run };
                    return Ok(Update::Refining);
                }
                Ok(match self.finish_block(index, run)? {
                    Some(finished) => Update::Block(finished),
                    None => Update::Refining,
                })
            }
            Phase::Commit {
                index,
                mut run,
                mut finished,
                mut next,
            } => {
                self.decode_time += elapsed;
                run.refreshed();
                if !planned.steps() {
                    self.stats.commit_forwards += 1;
                } else {
                    // The next block's slots follow the final ids in the forward's segment.
                    let offset = run.tokens().len();
                    let rows = planned.want.rows();
                    let slots = rows.start - offset..rows.end - offset;
                    let mut shifted = OffsetRows {
                        inner: read_row,
                        offset,
                    };
                    self.apply_step(&mut next, output, slots, &mut shifted)?;
                    self.stats.merged_commits += 1;
                }
                finished.stats.forwards += 1;
                finished.stats.seconds = run.elapsed().as_secs_f64();
                self.committed.extend_from_slice(run.tokens());
                // A next block that its first step finished is finished by the next plan.
                self.phase = Phase::Block {
                    index: index + 1,
                    run: *next,
                };
                Ok(Update::Block(finished))
            }
        }
    }

    /// Hands a denoising forward's scores of `run`'s `slots` (the rows it asked for, as block
    /// slots) to it; returns its state after.
    fn apply_step(
        &mut self,
        run: &mut BlockRun,
        output: SegmentOutput,
        slots: std::ops::Range<usize>,
        read_row: &mut ReadRow<'_>,
    ) -> Result<BlockState, DecodeError> {
        let (n, first) = (slots.len(), slots.start);
        let state = match output {
            SegmentOutput::Logits(data) => {
                let vocab = self.ctx.vocab_size;
                check_scores(data.len(), n * vocab)
                    .map_err(|e| DecodeError::BadOutput(e.to_string()))?;
                run.apply(
                    StepScores::Logits(BlockLogits::from_slot(&data, vocab, first)),
                    read_row,
                    &mut self.rng,
                )
            }
            SegmentOutput::Top1(pairs) => {
                check_scores(pairs.len(), n).map_err(|e| DecodeError::BadOutput(e.to_string()))?;
                let pairs = Top1Rows {
                    pairs: &pairs,
                    first,
                };
                run.apply(StepScores::Top1(pairs), read_row, &mut self.rng)
            }
            SegmentOutput::TopK(top) => {
                check_scores(top.rows(), n).map_err(|e| DecodeError::BadOutput(e.to_string()))?;
                let best = BestIds::from_slot(&top, first);
                run.apply(StepScores::TopK(best), read_row, &mut self.rng)
            }
            SegmentOutput::Nothing => {
                return Err(DecodeError::BadOutput(
                    "a denoising forward returned no scores".into(),
                ))
            }
        };
        if let Some(failure) = run.take_failure() {
            return Err(DecodeError::Grammar(failure));
        }
        self.stats.denoise_forwards += 1;
        if let Some(trace) = &mut self.trace {
            trace.push(TraceStep {
                block: run.start() / self.layout.block,
                block_tokens: run.tokens().to_vec(),
            });
        }
        Ok(state)
    }

    /// Stop-token scan and output assembly of a final block. Returns the finished block, or
    /// `None` when it first needs its commit refresh (the phase is then `Commit`).
    fn finish_block(
        &mut self,
        index: usize,
        mut run: BlockRun,
    ) -> Result<Option<FinishedBlock>, DecodeError> {
        if let Some(constraint) = run.take_constraint() {
            self.constraint = Some(constraint);
        }
        let slots = self.layout.output_slots(index);
        let (tokens, stopped) = self.ctx.stops.cut(&run.tokens()[slots]);
        let tokens = tokens.to_vec();
        debug_assert!(!tokens.iter().any(|&t| self.ctx.control.is_control(t)));
        self.output.extend_from_slice(&tokens);
        let last = index + 1 == self.layout.decode_blocks();
        let finish = if stopped {
            Some(FinishReason::Stop)
        } else if last {
            Some(FinishReason::Length)
        } else {
            None
        };
        self.stats.blocks += 1;
        self.stats.steps_per_block.push(run.forwards());
        let finished = FinishedBlock {
            stats: BlockStats {
                block_index: run.start() / self.layout.block,
                steps: run.forwards(),
                forwards: run.forwards(),
                tokens: tokens.len(),
                seconds: run.elapsed().as_secs_f64(),
            },
            tokens,
            finish,
        };
        match finish {
            Some(reason) => {
                self.finish = Some(reason);
                self.phase = Phase::Finished;
                Ok(Some(finished))
            }
            // Another block follows: its forwards attend to this block's committed K/V.
            None if run.needs_refresh() => {
                let next = Box::new(self.block_run(index + 1)?);
                self.phase = Phase::Commit {
                    index,
                    run,
                    finished,
                    next,
                };
                Ok(None)
            }
            None => {
                self.committed.extend_from_slice(run.tokens());
                self.phase = self.start_block(index + 1)?;
                Ok(Some(finished))
            }
        }
    }

    /// Runs the next step on a single-sequence runner: plan, forward, apply (one prefill chunk,
    /// one denoising forward, or one commit refresh). The engine batches the same steps.
    pub fn advance(
        &mut self,
        runner: &mut SingleSequence<dyn ModelRunner>,
    ) -> Result<Update, DecodeError> {
        let forward = match self.plan(PREFILL_CHUNK_TOKENS)? {
            Next::Forward(forward) => forward,
            Next::Update(update) => return Ok(update),
            Next::Idle => return Err(DecodeError::OutOfTurn("the request is already finished")),
        };
        let seq = *self.seq.get_or_insert_with(|| runner.create_sequence());
        let began = Instant::now();
        let run =
            |runner: &mut SingleSequence<dyn ModelRunner>| -> minnow_model::Result<SegmentOutput> {
                if runner.sequence_len(seq) > forward.start {
                    runner.truncate_sequence(seq, forward.start)?;
                }
                runner.forward_one(seq, &forward.ids, forward.want.clone())
            };
        let output = run(runner).map_err(|e| DecodeError::Runner(e.to_string()))?;
        let mut rows = super::RunnerRows::new(runner.runner_mut(), 0);
        self.apply(output, &mut rows, began.elapsed())
    }

    /// Frees the single-sequence runner's sequence ([`RequestDecoder::advance`] only).
    pub fn release(&mut self, runner: &mut SingleSequence<dyn ModelRunner>) {
        if let Some(seq) = self.seq.take() {
            runner.release_sequence(seq);
        }
        self.phase = Phase::Finished;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DecodeParams;
    use crate::decode::params::resolve;
    use crate::decode::testing::{logits_for, toy_config, ScriptedRunner, M};
    use minnow_model::{Family, LogitsRows};

    const EOS: u32 = 6;

    fn ctx() -> DecoderContext {
        DecoderContext {
            control: ControlTokens {
                mask: M,
                delete: None,
                split: None,
            },
            stops: StopTokens::new(EOS, Some(5)),
            vocab_size: crate::decode::testing::VOCAB,
            full_logits_cheap: false,
            narrow_rows: false,
            draws_rows: false,
            merge_commits: true,
        }
    }

    fn params(family: Family) -> ResolvedParams {
        resolve(&DecodeParams::default(), &DecodeParams::default(), family).unwrap()
    }

    /// Every slot predicts `token_at(position)` with probability 0.99.
    fn positional_runner(token_at: fn(usize) -> u32) -> SingleSequence<ScriptedRunner> {
        SingleSequence::new(ScriptedRunner::new(
            toy_config(Family::V21, 4),
            move |start, ids| {
                let slots: Vec<(u32, f32)> = (0..ids.len())
                    .map(|i| (token_at(start + i), 0.99))
                    .collect();
                logits_for(&slots)
            },
        ))
    }

    fn run(
        decoder: &mut RequestDecoder,
        runner: &mut SingleSequence<ScriptedRunner>,
    ) -> Vec<Update> {
        let mut updates = Vec::new();
        while !decoder.is_finished() {
            updates.push(decoder.advance(runner).unwrap());
        }
        updates
    }

    #[test]
    fn prefill_whole_blocks_then_partial_block_then_truncate() {
        // P = 10, B = 4: prefill [0, 8) in whole blocks, decode [8, 12) with 2 prompt slots,
        // then [12, 16); N = 5 keeps canvas[10, 15).
        let prompt: Vec<u32> = vec![1; 10];
        let layout = Layout::new(10, 5, 4, 64).unwrap();
        let mut d = RequestDecoder::new(prompt, layout, params(Family::V21), ctx(), true).unwrap();
        let mut runner = positional_runner(|p| (p % 4) as u32);
        let updates = run(&mut d, &mut runner);
        assert_eq!(
            updates[0],
            Update::Prefill {
                processed: 8,
                total: 8
            }
        );
        assert_eq!(runner.calls[0].ids, vec![1; 8]);
        assert_eq!(runner.calls[0].rows, LogitsRows::None);
        // First decode forward: prompt tail [1, 1] + 2 masks at position 8.
        assert_eq!(runner.calls[1].start, 8);
        assert_eq!(runner.calls[1].ids, vec![1, 1, M, M]);
        assert_eq!(d.output(), &[2, 3, 0, 1, 2]);
        assert_eq!(d.finish_reason(), Some(FinishReason::Length));
        let stats = d.stats();
        assert_eq!(
            (stats.prompt_tokens, stats.completion_tokens, stats.blocks),
            (10, 5, 2)
        );
        // Converged blocks (fill, then no-edit step) reuse their K/V: no refresh forward.
        assert_eq!(stats.commit_forwards, 0);
        assert_eq!(stats.denoise_forwards, 4);
        assert_eq!(d.trace().unwrap().len(), 4);
        assert_eq!(d.trace().unwrap()[0].block, 2);
    }

    #[test]
    fn stop_token_ends_generation_without_committing() {
        // EOS predicted at position 13: the second block stops there.
        let prompt = vec![1; 8];
        let layout = Layout::new(8, 16, 4, 64).unwrap();
        let mut d = RequestDecoder::new(prompt, layout, params(Family::V20), ctx(), false).unwrap();
        let mut runner = positional_runner(|p| if p == 13 { EOS } else { 2 });
        let updates = run(&mut d, &mut runner);
        assert_eq!(d.output(), &[2, 2, 2, 2, 2, EOS]);
        assert_eq!(d.finish_reason(), Some(FinishReason::Stop));
        let last = match updates.last().unwrap() {
            Update::Block(b) => b.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(last.tokens, vec![2, EOS]);
        assert_eq!(last.finish, Some(FinishReason::Stop));
        // 2.0 always refreshes after its last transfer step: one refresh for block 0 only, and
        // it rides on block 1's first (and here only) forward, which covers both blocks and asks
        // for block 1's rows.
        assert_eq!(d.stats().commit_forwards, 0);
        assert_eq!(d.stats().merged_commits, 1);
        let last = runner.calls.last().unwrap();
        assert_eq!((last.start, last.ids.len()), (8, 8));
        assert_eq!(last.rows, LogitsRows::Range(4..8));
    }

    #[test]
    fn role_end_also_stops() {
        let layout = Layout::new(4, 4, 4, 64).unwrap();
        let mut d =
            RequestDecoder::new(vec![1; 4], layout, params(Family::V21), ctx(), false).unwrap();
        let mut runner = positional_runner(|p| if p == 5 { 5 } else { 3 });
        run(&mut d, &mut runner);
        assert_eq!(d.output(), &[3, 5]);
        assert_eq!(d.finish_reason(), Some(FinishReason::Stop));
    }

    #[test]
    fn zero_tokens_finish_without_forwards() {
        let layout = Layout::new(4, 0, 4, 64).unwrap();
        let d = RequestDecoder::new(vec![1; 4], layout, params(Family::V21), ctx(), false).unwrap();
        assert!(d.is_finished());
        assert_eq!(d.finish_reason(), Some(FinishReason::Length));
    }

    #[test]
    fn indel_needs_edit_tokens() {
        let layout = Layout::new(4, 4, 4, 64).unwrap();
        let err = RequestDecoder::new(vec![1; 4], layout, params(Family::V22), ctx(), false)
            .err()
            .unwrap();
        assert!(matches!(&err, DecodeError::Unsupported(m) if m.contains("indel")));
    }

    #[test]
    fn short_prompt_skips_prefill() {
        let layout = Layout::new(3, 4, 4, 64).unwrap();
        let mut d =
            RequestDecoder::new(vec![1; 3], layout, params(Family::V21), ctx(), false).unwrap();
        let mut runner = positional_runner(|_| 2);
        let updates = run(&mut d, &mut runner);
        assert!(!updates.iter().any(|u| matches!(u, Update::Prefill { .. })));
        assert_eq!(runner.calls[0].ids, vec![1, 1, 1, M]);
        assert_eq!(d.output(), &[2, 2, 2, 2]);
    }

    #[test]
    fn long_prefill_is_chunked_in_whole_blocks() {
        let n = PREFILL_CHUNK_TOKENS * 2 + 8;
        let layout = Layout::new(n, 4, 4, 4096).unwrap();
        let mut d =
            RequestDecoder::new(vec![1; n], layout, params(Family::V21), ctx(), false).unwrap();
        let mut runner = positional_runner(|_| 2);
        let updates = run(&mut d, &mut runner);
        let prefills: Vec<&Update> = updates
            .iter()
            .filter(|u| matches!(u, Update::Prefill { .. }))
            .collect();
        assert_eq!(prefills.len(), 3);
        assert!(runner.calls[..3].iter().all(|c| c.ids.len() % 4 == 0));
        assert_eq!(runner.calls[3].start, n);
    }
}
