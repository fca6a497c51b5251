//! One request as a state machine over a [`ModelRunner`]: prefill the complete prompt blocks in
//! whole-block chunks, then decode blocks in order (§1–§3), commit each block's K/V when another
//! block follows (§8), stop at a stop token or the token budget (§9). Every call of
//! [`RequestDecoder::advance`] runs at most one denoising or prefill forward (plus a commit
//! refresh when a block finishes), so the engine can interleave requests step by step and check
//! cancellation between forwards.

use std::time::{Duration, Instant};

use minnow_model::{LogitsRows, ModelRunner, SeqId};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

use super::block::{BlockRun, BlockState, Commit};
use super::indel::{Indel, IndelSettings};
use super::joint::{Joint, JointSettings};
use super::layout::Layout;
use super::low_confidence::{schedule, LowConfidence};
use super::params::ResolvedParams;
use super::stop_tokens::StopTokens;
use super::{BlockAlgorithm, ControlTokens};
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
}

/// Fixed per-checkpoint facts the decoder needs.
#[derive(Clone, Debug)]
pub struct DecoderContext {
    pub control: ControlTokens,
    pub stops: StopTokens,
}

enum Phase {
    Prefill { done: usize },
    Block { index: usize, run: BlockRun },
    Finished,
}

/// Builds the algorithm of one block.
fn make_algorithm(
    params: &ResolvedParams,
    layout: &Layout,
    block: &[u32],
    prompt_in_block: usize,
    control: ControlTokens,
) -> Result<Box<dyn BlockAlgorithm>, String> {
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
        Algorithm::Indel => Box::new(Indel::new(
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
        )?),
    })
}

/// Checks that `params` can run with these control ids (indel needs DELETE and SPLIT).
pub fn check_algorithm(params: &ResolvedParams, control: ControlTokens) -> Result<(), String> {
    if params.algorithm == Algorithm::Indel && (control.delete.is_none() || control.split.is_none())
    {
        return Err(
            "the indel algorithm needs a LLaDA2.2 checkpoint (it has no DELETE/SPLIT tokens)"
                .into(),
        );
    }
    Ok(())
}

/// One request's decoding state.
pub struct RequestDecoder {
    layout: Layout,
    prompt: Vec<u32>,
    params: ResolvedParams,
    ctx: DecoderContext,
    rng: StdRng,
    seq: Option<SeqId>,
    phase: Phase,
    output: Vec<u32>,
    finish: Option<FinishReason>,
    stats: GenerationStats,
    trace: Option<Vec<TraceStep>>,
    prefill_time: Duration,
    decode_time: Duration,
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
    ) -> Result<Self, String> {
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
            output: Vec::new(),
            finish: finished.then_some(FinishReason::Length),
            trace: trace.then(Vec::new),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
        })
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// `Stop` (a stop token) or `Length`, once finished.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Output ids so far (committed blocks only).
    pub fn output(&self) -> &[u32] {
        &self.output
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
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
        stats
    }

    /// The per-forward trace, when enabled.
    pub fn trace(&self) -> Option<&[TraceStep]> {
        self.trace.as_deref()
    }

    /// Frees the runner's sequence. Call once the request is over (finished, cancelled, failed).
    pub fn release(&mut self, runner: &mut dyn ModelRunner) {
        if let Some(seq) = self.seq.take() {
            runner.release_sequence(seq);
        }
        self.phase = Phase::Finished;
    }

    fn sequence(&mut self, runner: &mut dyn ModelRunner) -> Result<SeqId, String> {
        if let Some(seq) = self.seq {
            return Ok(seq);
        }
        let seq = runner.create_sequence().map_err(|e| e.to_string())?;
        self.seq = Some(seq);
        Ok(seq)
    }

    fn start_block(&mut self, index: usize) -> Result<Phase, String> {
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
        let run = BlockRun::new(start, block, prompt_in_block, algorithm, self.ctx.control);
        Ok(Phase::Block { index, run })
    }

    /// Runs the next unit of work: one prefill chunk, or one denoising forward (plus the commit
    /// refresh when the block finishes and another follows). Errors are one line.
    pub fn advance(&mut self, runner: &mut dyn ModelRunner) -> Result<Update, String> {
        let seq = self.sequence(runner)?;
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Finished => Err("the request is already finished".into()),
            Phase::Prefill { done } => {
                let total = self.layout.prefill_len;
                if total == 0 {
                    // No complete prompt block: nothing to prefill, start decoding at once.
                    self.phase = self.start_block(0)?;
                    return self.advance(runner);
                }
                let began = Instant::now();
                let chunk = (PREFILL_CHUNK_TOKENS / self.layout.block).max(1) * self.layout.block;
                let end = (done + chunk).min(total);
                if end > done {
                    runner
                        .forward(seq, &self.prompt[done..end], LogitsRows::None)
                        .map_err(|e| e.to_string())?;
                }
                self.prefill_time += began.elapsed();
                self.phase = if end >= total {
                    self.start_block(0)?
                } else {
                    Phase::Prefill { done: end }
                };
                Ok(Update::Prefill {
                    processed: end,
                    total,
                })
            }
            Phase::Block { index, mut run } => {
                let began = Instant::now();
                let forwards_before = run.forwards();
                let state = run
                    .advance(runner, seq, &mut self.rng)
                    .map_err(|e| e.to_string())?;
                if run.forwards() > forwards_before {
                    self.stats.denoise_forwards += 1;
                    if let Some(trace) = &mut self.trace {
                        trace.push(TraceStep {
                            block: run.start() / self.layout.block,
                            block_tokens: run.tokens().to_vec(),
                        });
                    }
                }
                if state == BlockState::Refining {
                    self.decode_time += began.elapsed();
                    self.phase = Phase::Block { index, run };
                    return Ok(Update::Refining);
                }
                let finished = self.finish_block(index, &mut run, runner, seq)?;
                self.decode_time += began.elapsed();
                Ok(Update::Block(finished))
            }
        }
    }

    /// Stop-token scan, output assembly, and the commit of a final block.
    fn finish_block(
        &mut self,
        index: usize,
        run: &mut BlockRun,
        runner: &mut dyn ModelRunner,
        seq: SeqId,
    ) -> Result<FinishedBlock, String> {
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
        let mut forwards = run.forwards();
        if finish.is_none() {
            // Another block follows: its forwards attend to this block's committed K/V.
            if run.commit(runner, seq).map_err(|e| e.to_string())? == Commit::Refreshed {
                self.stats.commit_forwards += 1;
                forwards += 1;
            }
        }
        self.stats.blocks += 1;
        self.stats.steps_per_block.push(run.forwards());
        let stats = BlockStats {
            block_index: run.start() / self.layout.block,
            steps: run.forwards(),
            forwards,
            tokens: tokens.len(),
            seconds: run.elapsed().as_secs_f64(),
        };
        match finish {
            Some(reason) => {
                self.finish = Some(reason);
                self.phase = Phase::Finished;
            }
            None => self.phase = self.start_block(index + 1)?,
        }
        Ok(FinishedBlock {
            tokens,
            stats,
            finish,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DecodeParams;
    use crate::decode::params::resolve;
    use crate::decode::testing::{logits_for, toy_config, ScriptedRunner, M};
    use minnow_model::Family;

    const EOS: u32 = 6;

    fn ctx() -> DecoderContext {
        DecoderContext {
            control: ControlTokens {
                mask: M,
                delete: None,
                split: None,
            },
            stops: StopTokens::new(EOS, Some(5)),
        }
    }

    fn params(family: Family) -> ResolvedParams {
        resolve(&DecodeParams::default(), &DecodeParams::default(), family).unwrap()
    }

    /// Every slot predicts `token_at(position)` with probability 0.99.
    fn positional_runner(token_at: fn(usize) -> u32) -> ScriptedRunner {
        ScriptedRunner::new(toy_config(Family::V21, 4), move |start, ids| {
            let slots: Vec<(u32, f32)> = (0..ids.len())
                .map(|i| (token_at(start + i), 0.99))
                .collect();
            logits_for(&slots)
        })
    }

    fn run(decoder: &mut RequestDecoder, runner: &mut ScriptedRunner) -> Vec<Update> {
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
        // 2.0 always refreshes after its last transfer step: one refresh for block 0 only.
        assert_eq!(d.stats().commit_forwards, 1);
        assert_eq!(runner.calls.last().unwrap().rows, LogitsRows::All);
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
        assert!(err.contains("indel"));
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
