//! The shared per-block loop (decoding doc §3) and the K/V commit rule (§8), split into a plan (what
//! the next forward is) and an apply (the step on its scores), so the engine can batch the
//! forwards of many requests.
//!
//! Every forward of the block writes its K/V into the block's page, so the K/V there always
//! describe `last_input`, the ids of the latest forward. Committing a final block keeps that K/V when
//! `last_input` equals the final ids, and otherwise truncates and runs one forward of the final
//! ids without logits. Never is K/V of different ids committed.

use std::time::{Duration, Instant};

use minnow_model::{LogitsRows, ModelRunner, RowDraw, SegmentOutput, SeqId, SingleSequence, Want};
use rand::rngs::StdRng;

use super::constrained::Constrained;
use super::{
    has_control_tokens, BestIds, BlockAlgorithm, BlockLogits, ControlTokens, DrawPlan, DrawnScores,
    ReadRow, RowReader, RunnerRows, ScoreKind, StepOutcome, StepScores, Top1Rows,
};
use crate::sampling::Candidate;

/// Where a block run stands after [`BlockRun::advance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Refining,
    Final,
}

/// How a final block's K/V reached the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// The last denoising forward saw exactly the final ids: kept as is.
    Reused,
    /// One extra forward of the final ids (no logits).
    Refreshed,
}

/// One block being denoised.
pub struct BlockRun {
    start: usize,
    prompt_in_block: usize,
    block: Vec<u32>,
    algorithm: Box<dyn BlockAlgorithm>,
    control: ControlTokens,
    /// Ids of the latest forward of this block, whose K/V sit in the cache at `start..`.
    last_input: Option<Vec<u32>>,
    forwards: usize,
    /// The next forward is the forced final cleanup (forward limit reached, or the algorithm
    /// stopped with control ids left).
    cleanup_pending: bool,
    forced_cleanup_ran: bool,
    state: BlockState,
    /// When the block was first planned, and the time from then until it became final (and
    /// committed, once that ran).
    first_planned: Option<Instant>,
    elapsed: Duration,
    /// The request's grammar, while this block is decoded (docs/decoding.md §13).
    constraint: Option<Constrained>,
    /// Why the grammar layer failed (the request fails with it).
    failure: Option<String>,
    /// This step's device draws, their uniforms already taken ([`BlockRun::take_device_draws`]).
    drawn_ahead: Option<(DrawPlan, Vec<RowDraw>)>,
}

impl BlockRun {
    /// `block` holds the prompt tail (its first `prompt_in_block` ids) followed by MASKs.
    pub fn new(
        start: usize,
        block: Vec<u32>,
        prompt_in_block: usize,
        algorithm: Box<dyn BlockAlgorithm>,
        control: ControlTokens,
    ) -> Self {
        Self {
            start,
            prompt_in_block,
            block,
            algorithm,
            control,
            last_input: None,
            forwards: 0,
            cleanup_pending: false,
            forced_cleanup_ran: false,
            state: BlockState::Refining,
            first_planned: None,
            elapsed: Duration::ZERO,
            constraint: None,
            failure: None,
            drawn_ahead: None,
        }
    }

    /// Decodes the block under `constraint` (whose block range is set): every step's result is
    /// re-read by [`Constrained::enforce`].
    pub fn with_constraint(mut self, constraint: Constrained) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Hands the grammar state back (for the next block).
    pub fn take_constraint(&mut self) -> Option<Constrained> {
        self.constraint.take()
    }

    /// The grammar state, while this block holds it.
    pub fn constraint_mut(&mut self) -> Option<&mut Constrained> {
        self.constraint.as_mut()
    }

    /// The grammar layer's failure, if it had one (the block is then final and unusable).
    pub fn take_failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.block
    }
    pub fn start(&self) -> usize {
        self.start
    }
    /// Denoising forwards so far.
    pub fn forwards(&self) -> usize {
        self.forwards
    }
    pub fn state(&self) -> BlockState {
        self.state
    }
    /// Whether the block needed the forced cleanup round (logged; tests check it).
    pub fn forced_cleanup_ran(&self) -> bool {
        self.forced_cleanup_ran
    }
    /// Wall time from the block's first step until it was final (commit included once it ran).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Decides the block's next step: `Some(kind)` when it needs a denoising forward of
    /// [`BlockRun::tokens`] returning `kind` scores, `None` when it became final without one.
    pub fn plan(&mut self) -> Option<ScoreKind> {
        if self.state == BlockState::Final {
            return None;
        }
        self.first_planned.get_or_insert_with(Instant::now);
        if !self.cleanup_pending {
            if self.algorithm.exit_before_forward(&self.block) {
                if self.is_clean() {
                    self.finalize();
                    return None;
                }
                self.cleanup_pending = true;
            } else if self.forwards >= self.algorithm.forward_limit() {
                tracing::warn!(
                    block_start = self.start,
                    forwards = self.forwards,
                    "block did not converge within its forward limit; running a forced cleanup round"
                );
                self.cleanup_pending = true;
            }
        }
        if self.constraint.is_some() {
            // Refused proposals are replaced by the best token the grammar allows: among each
            // row's best ids for a greedy algorithm (a full row read only where none is
            // allowed), from the full logits for any other.
            return Some(match self.algorithm.scores_needed(false) {
                ScoreKind::Top1 => ScoreKind::TopK,
                ScoreKind::TopK if !self.algorithm.samples() => ScoreKind::TopK,
                ScoreKind::TopK | ScoreKind::Logits | ScoreKind::Sampled => ScoreKind::Logits,
            });
        }
        Some(self.algorithm.scores_needed(self.cleanup_pending))
    }

    /// The block slots the next step reads ([`BlockAlgorithm::rows_needed`]): what a forward
    /// must return at least. Every slot for the forced cleanup and under a grammar (whose layer
    /// may read any slot the step touched).
    pub fn score_rows(&self) -> std::ops::Range<usize> {
        let all = 0..self.block.len();
        if self.cleanup_pending || self.constraint.is_some() {
            return all;
        }
        let rows = self.algorithm.rows_needed(&self.block);
        if rows.is_empty() || rows.end > all.end {
            all
        } else {
            rows
        }
    }

    /// Applies the scores of the forward [`BlockRun::plan`] asked for (a forward of the ids
    /// `tokens()` had then): the algorithm's step. `read_row` reads a slot's full logits from
    /// that forward (the grammar layer's need with [`StepScores::TopK`]) and draws sampled
    /// candidates on the runner's device. Returns the state afterwards; once `Final`, the
    /// block's tokens are final and contain no MASK/DELETE/SPLIT at generated slots.
    pub fn apply(
        &mut self,
        scores: StepScores<'_>,
        read_row: &mut ReadRow<'_>,
        rng: &mut StdRng,
    ) -> BlockState {
        let ahead = self.drawn_ahead.take();
        // Best ids that do not answer a sampling step: the candidates drawn on the runner's
        // device, or the rows in full from the same forward.
        let full_rows;
        let scores = match scores {
            StepScores::TopK(top) if !self.algorithm.best_ids_answer(top) => {
                if read_row.draws() && self.constraint.is_none() {
                    if let Some((plan, draws)) = ahead.or_else(|| self.draws_now(rng)) {
                        return self.apply_drawn(top, &plan, &draws, read_row, rng);
                    }
                }
                // The rows the forward returned: a step's masked span, or the whole block.
                match top
                    .slots()
                    .map(|p| read_row.row(p))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(rows) => {
                        let vocab = rows.first().map_or(0, Vec::len);
                        full_rows = rows.concat();
                        StepScores::Logits(BlockLogits::from_slot(&full_rows, vocab, top.first))
                    }
                    Err(e) => return self.fail(format!("reading a row's full logits: {e}")),
                }
            }
            other => other,
        };
        let forced = self.cleanup_pending;
        self.record_forward();
        let before = self.constraint.is_some().then(|| self.block.clone());
        let mut outcome = self.algorithm.step(&mut self.block, scores, rng, forced);
        if let (Some(constraint), Some(old)) = (self.constraint.as_mut(), before) {
            if let Err(e) = constraint.enforce(&old, &mut self.block, scores, read_row, rng, forced)
            {
                return self.fail(e);
            }
            // The grammar may have undone the step's changes (or made some of its own).
            outcome = if self.block == old && self.is_clean() {
                StepOutcome::Converged
            } else {
                StepOutcome::Continue
            };
        }
        self.after_step(outcome, forced)
    }

    /// Takes the uniforms of this step's device draws before [`BlockRun::apply`], for a step
    /// whose scores are `top`, so the engine can draw the rows of every request of a forward in
    /// one call (the step then reads them through [`super::RunnerRows::drawn`]). The same
    /// uniforms, in the same order, as `apply` would take. `None`: the step draws nothing on the
    /// device (the block is final, constrained, greedy, or its best ids answer it).
    pub fn take_device_draws(
        &mut self,
        top: BestIds<'_>,
        rng: &mut StdRng,
    ) -> Option<Vec<RowDraw>> {
        if self.state == BlockState::Final
            || self.constraint.is_some()
            || self.algorithm.best_ids_answer(top)
        {
            return None;
        }
        let (plan, draws) = self.draws_now(rng)?;
        self.drawn_ahead = Some((plan, draws.clone()));
        Some(draws)
    }

    /// The step's device draws with their uniforms taken from `rng` now, if it samples.
    fn draws_now(&self, rng: &mut StdRng) -> Option<(DrawPlan, Vec<RowDraw>)> {
        let plan = self.algorithm.device_draws(&self.block)?;
        let draws = plan.draws(rng);
        Some((plan, draws))
    }

    /// The step of a sampling forward whose candidates the runner draws on its device (`draws`,
    /// their uniforms taken from the request's generator in the plan's slot order, as the host
    /// samplers would take them): the step runs on the drawn candidates and the best ids,
    /// reading a row in full only for a re-pick.
    fn apply_drawn(
        &mut self,
        top: BestIds<'_>,
        plan: &DrawPlan,
        draws: &[RowDraw],
        read_row: &mut ReadRow<'_>,
        rng: &mut StdRng,
    ) -> BlockState {
        let pairs = match read_row.draw(draws) {
            Ok(pairs) if pairs.len() == draws.len() => pairs,
            Ok(pairs) => {
                return self.fail(format!(
                    "the device drew {} candidates for {} rows",
                    pairs.len(),
                    draws.len()
                ))
            }
            Err(e) => return self.fail(format!("drawing sampled candidates on the device: {e}")),
        };
        let mut candidates: Vec<Option<Candidate>> = vec![None; self.block.len()];
        for (&slot, (token, confidence)) in plan.slots.iter().zip(pairs) {
            candidates[slot] = Some(Candidate { token, confidence });
        }
        let reader = RowReader::new(read_row);
        let scores = StepScores::Drawn(DrawnScores {
            top,
            candidates: &candidates,
            rows: &reader,
        });
        let forced = self.cleanup_pending;
        self.record_forward();
        let outcome = self.algorithm.step(&mut self.block, scores, rng, forced);
        if let Some(e) = reader.failure() {
            return self.fail(format!("reading a row's full logits: {e}"));
        }
        self.after_step(outcome, forced)
    }

    /// Ends the block on a failure of the grammar layer or of the runner (the request fails
    /// with it).
    fn fail(&mut self, failure: String) -> BlockState {
        self.failure = Some(failure);
        self.cleanup_pending = false;
        self.finalize();
        self.state
    }

    /// The block's state after a step with `outcome` (`forced`: it was the forced cleanup).
    fn after_step(&mut self, outcome: StepOutcome, forced: bool) -> BlockState {
        if forced {
            self.forced_cleanup_ran = true;
            self.cleanup_pending = false;
            self.finalize();
            debug_assert!(self.is_clean(), "forced cleanup left control ids");
        } else if outcome == StepOutcome::Converged {
            if self.is_clean() {
                self.finalize();
            } else {
                self.cleanup_pending = true;
            }
        }
        self.state
    }

    fn finalize(&mut self) {
        self.state = BlockState::Final;
        if let Some(t) = self.first_planned {
            self.elapsed = t.elapsed();
        }
    }

    /// Whether committing the final block needs one more forward of its final ids (no logits):
    /// the K/V in its page came from a forward of other ids (or from none).
    pub fn needs_refresh(&self) -> bool {
        self.last_input.as_deref() != Some(self.block.as_slice())
    }

    /// Records that the refresh forward of the final ids ran.
    pub fn refreshed(&mut self) {
        self.last_input = Some(self.block.clone());
        if let Some(t) = self.first_planned {
            self.elapsed = t.elapsed();
        }
    }

    /// Runs at most one denoising forward on a single-sequence runner ([`BlockRun::plan`], the
    /// forward, [`BlockRun::apply`]). The batched engine runs the same two halves around its
    /// batched forward instead.
    pub fn advance(
        &mut self,
        runner: &mut SingleSequence<dyn ModelRunner>,
        seq: SeqId,
        rng: &mut StdRng,
    ) -> minnow_model::Result<BlockState> {
        let Some(kind) = self.plan() else {
            return Ok(self.state);
        };
        let kind = {
            let runner = runner.runner_mut();
            kind.to_ask(runner.full_logits_cheap(), runner.draws_rows())
        };
        if runner.sequence_len(seq) > self.start {
            runner.truncate_sequence(seq, self.start)?;
        }
        let mut no_rows = |_| Err("no full rows after this forward".to_string());
        Ok(match kind {
            ScoreKind::Logits | ScoreKind::Sampled => {
                let data = runner.forward(seq, &self.block, LogitsRows::All)?;
                let vocab = runner.config().vocab_size;
                check_scores(data.len(), self.block.len() * vocab)?;
                self.apply(
                    StepScores::Logits(BlockLogits::new(&data, vocab)),
                    &mut no_rows,
                    rng,
                )
            }
            ScoreKind::Top1 => {
                let pairs = runner.forward_top1(seq, &self.block, LogitsRows::All)?;
                check_scores(pairs.len(), self.block.len())?;
                self.apply(StepScores::Top1(Top1Rows::new(&pairs)), &mut no_rows, rng)
            }
            ScoreKind::TopK => {
                let n = self.block.len();
                let SegmentOutput::TopK(top) =
                    runner.forward_one(seq, &self.block, Want::TopK(0..n))?
                else {
                    return Err(minnow_model::ModelError::InvalidInput(
                        "a top-k forward returned something else".into(),
                    ));
                };
                check_scores(top.rows(), n)?;
                let mut rows = RunnerRows::new(runner.runner_mut(), 0);
                self.apply(StepScores::TopK(BestIds::new(&top)), &mut rows, rng)
            }
        })
    }

    /// Bookkeeping after a denoising forward of `self.block`, before the step edits it.
    fn record_forward(&mut self) {
        self.last_input = Some(self.block.clone());
        self.forwards += 1;
    }

    fn is_clean(&self) -> bool {
        !has_control_tokens(&self.block, self.prompt_in_block, &self.control)
    }

    /// Commits the final block's K/V (§8) on a single-sequence runner: reuse the last forward
    /// if it saw exactly the final ids, else truncate and forward the final ids once without
    /// logits.
    pub fn commit(
        &mut self,
        runner: &mut SingleSequence<dyn ModelRunner>,
        seq: SeqId,
    ) -> minnow_model::Result<Commit> {
        debug_assert_eq!(self.state, BlockState::Final);
        let end = self.start + self.block.len();
        if !self.needs_refresh() && runner.sequence_len(seq) == end {
            return Ok(Commit::Reused);
        }
        if runner.sequence_len(seq) > self.start {
            runner.truncate_sequence(seq, self.start)?;
        }
        runner.forward(seq, &self.block, LogitsRows::None)?;
        self.refreshed();
        Ok(Commit::Refreshed)
    }
}

/// A forward that returned the wrong number of scores is a runner bug, reported as an error.
pub fn check_scores(got: usize, expected: usize) -> minnow_model::Result<()> {
    if got != expected {
        return Err(minnow_model::ModelError::InvalidInput(format!(
            "the forward returned {got} scores where the block needs {expected}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::indel::{Indel, IndelSettings};
    use crate::decode::joint::{Joint, JointSettings};
    use crate::decode::low_confidence::{schedule, LowConfidence};
    use crate::decode::testing::{
        logits_for, row, row_with_runner_up, toy_config, ScriptedRunner, D, M, S,
    };
    use crate::sampling::SamplerSettings;
    use minnow_model::Family;
    use rand::SeedableRng;

    const CONTROL: ControlTokens = ControlTokens {
        mask: M,
        delete: Some(D),
        split: Some(S),
    };

    fn joint(max_post_steps: usize) -> Box<dyn BlockAlgorithm> {
        Box::new(Joint::new(
            0,
            4,
            JointSettings {
                threshold: 0.5,
                editing_threshold: 0.0,
                max_post_steps,
                num_to_transfer: 1,
                sampler: SamplerSettings::GREEDY,
            },
            CONTROL,
        ))
    }

    fn joint_with(sampler: SamplerSettings) -> Box<dyn BlockAlgorithm> {
        Box::new(Joint::new(
            0,
            4,
            JointSettings {
                threshold: 0.6,
                editing_threshold: 0.5,
                max_post_steps: 4,
                num_to_transfer: 1,
                sampler,
            },
            CONTROL,
        ))
    }

    fn low_confidence_greedy() -> Box<dyn BlockAlgorithm> {
        Box::new(LowConfidence::new(
            0,
            0.6,
            schedule(4, 4, 64),
            SamplerSettings::GREEDY,
            CONTROL,
        ))
    }

    /// The same algorithm, made to read full logits every step (the path before top-1 existed).
    struct FullLogitsOnly(Box<dyn BlockAlgorithm>);

    impl BlockAlgorithm for FullLogitsOnly {
        fn exit_before_forward(&mut self, block: &[u32]) -> bool {
            self.0.exit_before_forward(block)
        }
        fn step(
            &mut self,
            block: &mut Vec<u32>,
            scores: StepScores<'_>,
            rng: &mut StdRng,
            forced: bool,
        ) -> StepOutcome {
            self.0.step(block, scores, rng, forced)
        }
        fn forward_limit(&self) -> usize {
            self.0.forward_limit()
        }
        fn samples(&self) -> bool {
            self.0.samples()
        }
        fn best_ids_answer(&self, top: BestIds<'_>) -> bool {
            self.0.best_ids_answer(top)
        }
    }

    /// A 4-slot model whose prediction depends on the whole input: a different token and a
    /// confidence between 0.3 and 0.95 per slot and input, so blocks take several threshold
    /// steps and 2.1 edits earlier choices. Any difference in a step's candidates changes the
    /// later inputs and with them the result.
    fn input_dependent_runner() -> ScriptedRunner {
        ScriptedRunner::new(toy_config(Family::V21, 4), |start, ids| {
            let seed = ids
                .iter()
                .fold(start as u32, |h, &t| h.wrapping_mul(31).wrapping_add(t));
            let slots: Vec<(u32, f32)> = (0..ids.len() as u32)
                .map(|i| {
                    let h = seed.wrapping_mul(2654435761).wrapping_add(i * 40503) >> 7;
                    ((h % 7), 0.3 + (h % 14) as f32 * 0.05)
                })
                .collect();
            logits_for(&slots)
        })
    }

    /// Runs `algorithm` on a 4-MASK block after a 4-id prefix. Returns the final block, the
    /// denoising forwards, and how many of them were top-1 forwards.
    fn decode_block(algorithm: Box<dyn BlockAlgorithm>) -> (Vec<u32>, usize, usize) {
        let mut runner = SingleSequence::new(input_dependent_runner());
        let seq = runner.create_sequence();
        runner
            .forward(seq, &[1, 2, 3, 4], LogitsRows::None)
            .unwrap();
        let mut run = BlockRun::new(4, vec![M; 4], 0, algorithm, CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        run.commit(&mut runner, seq).unwrap();
        (run.tokens().to_vec(), run.forwards(), runner.top1_calls())
    }

    #[test]
    fn greedy_joint_reads_top1_and_decodes_like_full_logits() {
        let (block, forwards, top1) = decode_block(joint_with(SamplerSettings::GREEDY));
        assert!(forwards > 2, "the script should need several steps");
        assert_eq!(top1, forwards, "every greedy step is a top-1 forward");
        let full = decode_block(Box::new(FullLogitsOnly(joint_with(
            SamplerSettings::GREEDY,
        ))));
        assert_eq!(full, (block, forwards, 0));
    }

    #[test]
    fn greedy_low_confidence_reads_top1_and_decodes_like_full_logits() {
        let (block, forwards, top1) = decode_block(low_confidence_greedy());
        assert!(forwards > 1, "the script should need several steps");
        assert_eq!(top1, forwards);
        let full = decode_block(Box::new(FullLogitsOnly(low_confidence_greedy())));
        assert_eq!(full, (block, forwards, 0));
    }

    /// A 4-slot 2.2 model like [`input_dependent_runner`] whose predictions include MASK,
    /// DELETE and SPLIT (the toy vocabulary's ids 7-9) about as often as any other id, so blocks
    /// take the indel step's re-picks: MASK at an original slot, the cleanup's bans, deletions and
    /// splits.
    fn indel_runner(salt: u32) -> ScriptedRunner {
        ScriptedRunner::new(toy_config(Family::V22, 4), move |start, ids| {
            let seed = ids.iter().fold(start as u32 ^ salt, |h, &t| {
                h.wrapping_mul(31).wrapping_add(t)
            });
            (0..ids.len() as u32)
                .flat_map(|i| {
                    let h = seed.wrapping_mul(2654435761).wrapping_add(i * 40503) >> 7;
                    let (token, p) = (h % 10, 0.3 + (h % 14) as f32 * 0.05);
                    // A clear runner-up among the ordinary ids: a MASK argmax's replacement can
                    // pass the threshold on its full-softmax probability.
                    let runner_up = ((h >> 5) % 7 + u32::from((h >> 5) % 7 == token)) % 7;
                    row_with_runner_up(token, p, runner_up)
                })
                .collect()
        })
    }

    /// Decodes a 4-MASK block with greedy indel on [`indel_runner`]; `full` makes every step
    /// read full logits. Returns the final block and the forwards, and how many asked for best
    /// ids.
    fn decode_indel_block(salt: u32, full: bool) -> (Vec<u32>, usize, usize) {
        let mut runner = SingleSequence::new(indel_runner(salt));
        let seq = runner.create_sequence();
        let settings = IndelSettings {
            threshold: 0.6,
            editing_threshold: 0.5,
            max_post_steps: 3,
            steps: 4,
            sampler: SamplerSettings::GREEDY,
        };
        let indel = Box::new(Indel::new(&[M; 4], 0, settings, CONTROL).unwrap());
        let algorithm: Box<dyn BlockAlgorithm> = if full {
            Box::new(FullLogitsOnly(indel))
        } else {
            indel
        };
        let mut run = BlockRun::new(0, vec![M; 4], 0, algorithm, CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        let best_ids = runner.calls.iter().filter(|c| c.top_k).count();
        (run.tokens().to_vec(), run.forwards(), best_ids)
    }

    #[test]
    fn greedy_indel_reads_best_ids_and_decodes_like_full_logits() {
        let mut forwards_total = 0;
        for salt in 0..40 {
            let (block, forwards, best_ids) = decode_indel_block(salt, false);
            assert_eq!(best_ids, forwards, "salt {salt}: every step reads best ids");
            assert_eq!(
                decode_indel_block(salt, true),
                (block, forwards, 0),
                "salt {salt}"
            );
            forwards_total += forwards;
        }
        assert!(forwards_total > 80, "the script should need several steps");
    }

    #[test]
    fn sampling_reads_full_logits_without_a_top_k_and_best_ids_with_one() {
        let sampling = SamplerSettings {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
        };
        let (_, forwards, top1) = decode_block(joint_with(sampling));
        assert!(forwards > 0);
        assert_eq!(top1, 0);
        // With a top-k under the best ids' 64 (temperature 0 with top-k too: its confidence is
        // the filtered probability, not top-1's), every step reads best ids, and decodes what
        // full logits decode.
        for sampler in [
            SamplerSettings {
                top_k: 3,
                ..sampling
            },
            SamplerSettings {
                top_k: 2,
                top_p: 0.8,
                ..sampling
            },
            SamplerSettings {
                top_k: 3,
                ..SamplerSettings::GREEDY
            },
        ] {
            let best = decode_block(joint_with(sampler));
            let full = decode_block(Box::new(FullLogitsOnly(joint_with(sampler))));
            assert_eq!(best.0, full.0, "{sampler:?}");
            assert_eq!(best.1, full.1, "{sampler:?}");
            assert_eq!(best.2, 0, "{sampler:?}: no top-1 forwards");
        }
    }

    #[test]
    fn best_ids_that_cannot_answer_a_sampling_step_give_way_to_the_full_rows() {
        // 100 ids, 70 of them tied at the top: a top-3 sampler's survivors run past the 64 best
        // ids, so the step must read the rows in full, and then decodes what full logits decode.
        let row: Vec<f32> = (0..100).map(|i| if i < 70 { 1.0 } else { -1.0 }).collect();
        let rows = vec![row; 4];
        let flat = rows.concat();
        let top = minnow_model::TopK {
            k: 64,
            entries: rows
                .iter()
                .flat_map(|r| minnow_model::runner::top_k(r, 64))
                .collect(),
            top1: rows.iter().map(|r| minnow_model::runner::top1(r)).collect(),
        };
        let sampler = SamplerSettings {
            temperature: 0.7,
            top_k: 3,
            top_p: 1.0,
        };
        let decode = |best: bool| {
            let mut run = BlockRun::new(0, vec![M; 4], 0, joint_with(sampler), CONTROL);
            assert_eq!(run.plan(), Some(ScoreKind::TopK));
            let mut rng = StdRng::seed_from_u64(5);
            let mut reads = 0;
            let mut read_row = |r: usize| {
                reads += 1;
                Ok(rows[r].clone())
            };
            let scores = if best {
                StepScores::TopK(BestIds::new(&top))
            } else {
                StepScores::Logits(BlockLogits::new(&flat, 100))
            };
            run.apply(scores, &mut read_row, &mut rng);
            (run.tokens().to_vec(), reads)
        };
        let (from_best, reads) = decode(true);
        assert_eq!(reads, 4, "each row read in full");
        assert_eq!(from_best, decode(false).0);
        assert_ne!(from_best, vec![M; 4], "the step wrote tokens");
    }

    #[test]
    fn forced_cleanup_of_a_greedy_block_reads_full_logits() {
        // A model that only ever predicts MASK (runner-up 3): the block never loses its masks,
        // so only the forward limit ends it, and the forced round must pick the best non-control
        // token, which top-1 (MASK) cannot give.
        let mut runner =
            SingleSequence::new(ScriptedRunner::new(toy_config(Family::V21, 4), |_, ids| {
                ids.iter()
                    .flat_map(|_| row_with_runner_up(M, 0.9, 3))
                    .collect()
            }));
        let seq = runner.create_sequence();
        let algorithm = joint_with(SamplerSettings::GREEDY);
        let limit = algorithm.forward_limit();
        let mut run = BlockRun::new(0, vec![M; 4], 0, algorithm, CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        assert!(run.forced_cleanup_ran());
        assert_eq!(run.forwards(), limit + 1);
        let denoise = runner.denoise_calls();
        assert!(denoise[..limit].iter().all(|c| c.top1));
        assert!(!denoise[limit].top1, "the forced round reads full logits");
        assert_eq!(run.tokens(), &[3, 3, 3, 3], "MASK slots take the runner-up");
    }

    fn run_to_final(run: &mut BlockRun, runner: &mut SingleSequence<ScriptedRunner>, seq: SeqId) {
        let mut rng = StdRng::seed_from_u64(0);
        for _ in 0..100 {
            if run.advance(runner, seq, &mut rng).unwrap() == BlockState::Final {
                return;
            }
        }
        panic!("block never became final");
    }

    /// A 4-slot model: the same fixed prediction for every input.
    fn constant_runner(slots: Vec<(u32, f32)>) -> ScriptedRunner {
        ScriptedRunner::new(toy_config(Family::V21, 4), move |_, ids| {
            assert_eq!(ids.len(), 4);
            logits_for(&slots)
        })
    }

    #[test]
    fn converged_block_reuses_the_last_forward() {
        let mut runner = SingleSequence::new(constant_runner(vec![
            (1, 0.9),
            (2, 0.9),
            (3, 0.9),
            (4, 0.9),
        ]));
        let seq = runner.create_sequence();
        runner.forward(seq, &[0; 4], LogitsRows::None).unwrap(); // committed prefix [0, 4)
        let mut run = BlockRun::new(4, vec![M; 4], 0, joint(16), CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        assert_eq!(run.tokens(), &[1, 2, 3, 4]);
        assert_eq!(run.forwards(), 2, "fill, then a converged no-edit step");
        let before = runner.calls.len();
        assert_eq!(run.commit(&mut runner, seq).unwrap(), Commit::Reused);
        assert_eq!(runner.calls.len(), before, "no refresh forward");
        assert_eq!(runner.sequence_len(seq), 8);
        // Every denoising forward started at the block start (the previous one was discarded).
        assert!(runner.denoise_calls().iter().all(|c| c.start == 4));
    }

    #[test]
    fn budget_exit_triggers_exactly_one_refresh() {
        // Slot 0 flips 1 ↔ 5 forever; max_post_steps 2 ends the block with un-forwarded edits.
        let mut flip = false;
        let mut runner = SingleSequence::new(ScriptedRunner::new(
            toy_config(Family::V21, 4),
            move |_, _| {
                flip = !flip;
                let first = if flip { 1 } else { 5 };
                logits_for(&[(first, 0.9), (2, 0.9), (3, 0.9), (4, 0.9)])
            },
        ));
        let seq = runner.create_sequence();
        let mut run = BlockRun::new(0, vec![M; 4], 0, joint(2), CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        assert_eq!(run.forwards(), 3);
        let final_ids = run.tokens().to_vec();
        assert_eq!(run.commit(&mut runner, seq).unwrap(), Commit::Refreshed);
        let refresh = runner.calls.last().unwrap();
        assert_eq!(
            (refresh.start, &refresh.ids, &refresh.rows),
            (0, &final_ids, &LogitsRows::None)
        );
        assert_eq!(
            runner
                .calls
                .iter()
                .filter(|c| c.rows == LogitsRows::None)
                .count(),
            1
        );
        assert_eq!(runner.sequence_len(seq), 4);
    }

    #[test]
    fn non_convergence_ends_in_a_forced_cleanup_round() {
        // A model that fills every mask with 1 but wants every filled slot masked again: the
        // T2T writes of MASK make original masks reappear, so the post counter keeps resetting
        // (decoding doc §7.7 point 2) and only the forward limit ends the block.
        let mut runner =
            SingleSequence::new(ScriptedRunner::new(toy_config(Family::V22, 4), |_, ids| {
                ids.iter()
                    .flat_map(|&t| if t == M { row(1, 0.99) } else { row(M, 0.99) })
                    .collect()
            }));
        let seq = runner.create_sequence();
        let settings = IndelSettings {
            threshold: 0.5,
            editing_threshold: 0.0,
            max_post_steps: 16,
            steps: 32,
            sampler: SamplerSettings::GREEDY,
        };
        let algorithm = Indel::new(&[M; 4], 0, settings, CONTROL).unwrap();
        let limit = algorithm.forward_limit();
        assert_eq!(limit, 4 + 16 + 32);
        let mut run = BlockRun::new(0, vec![M; 4], 0, Box::new(algorithm), CONTROL);
        run_to_final(&mut run, &mut runner, seq);
        assert!(run.forced_cleanup_ran());
        assert_eq!(run.forwards(), limit + 1);
        assert!(run.tokens().iter().all(|t| ![M, D, S].contains(t)));
        assert_eq!(runner.top1_calls(), 0, "2.2 steps always read full logits");
        assert_eq!(run.commit(&mut runner, seq).unwrap(), Commit::Refreshed);
    }
}
