//! Algorithm A, LLaDA2.0 low-confidence threshold decoding (decoding doc §5), as the official
//! `generate` does it: a step schedule over the block length, strict `>` threshold, and a top-k
//! fallback that always transfers at least the step's quota.

use rand::rngs::StdRng;

use super::{
    fill_control_slots, generated_masks, official_scores_needed, select_transfers, BlockAlgorithm,
    ControlTokens, ScoreKind, StepOutcome, StepScores,
};
use crate::sampling::{OfficialSampler, SamplerSettings};

/// The official step schedule: `S' = min(steps, floor(N / minimal_topk))` steps, step `i`
/// transferring `floor(B / S') + (i < B mod S')` tokens. Computed over the block length, not the
/// number of masks. `minimal_topk` is fixed at its official default 1.
pub fn schedule(block: usize, steps: usize, max_new: usize) -> Vec<usize> {
    const MINIMAL_TOPK: usize = 1;
    let s = steps.min(max_new / MINIMAL_TOPK).max(1);
    (0..s)
        .map(|i| block / s + usize::from(i < block % s))
        .collect()
}

pub struct LowConfidence {
    prompt_in_block: usize,
    threshold: f32,
    schedule: Vec<usize>,
    step: usize,
    sampler: OfficialSampler,
    control: ControlTokens,
}

impl LowConfidence {
    pub fn new(
        prompt_in_block: usize,
        threshold: f32,
        schedule: Vec<usize>,
        sampler: SamplerSettings,
        control: ControlTokens,
    ) -> Self {
        Self {
            prompt_in_block,
            threshold,
            schedule,
            step: 0,
            sampler: OfficialSampler(sampler),
            control,
        }
    }

    fn masked_slots(&self, block: &[u32]) -> Vec<usize> {
        generated_masks(block, self.prompt_in_block, self.control.mask)
    }
}

impl BlockAlgorithm for LowConfidence {
    fn exit_before_forward(&mut self, block: &[u32]) -> bool {
        // `for i in 0..S'` with `if Mset empty: break` at the top of each iteration.
        self.step >= self.schedule.len() || self.masked_slots(block).is_empty()
    }

    fn scores_needed(&self, forced: bool) -> ScoreKind {
        official_scores_needed(&self.sampler, forced)
    }

    /// From the first to the last masked slot: `step` reads candidates of masked slots only
    /// (committed and prompt slots never change).
    fn rows_needed(&self, block: &[u32]) -> std::ops::Range<usize> {
        let masked = self.masked_slots(block);
        match (masked.first(), masked.last()) {
            (Some(&a), Some(&b)) => a..b + 1,
            _ => 0..block.len(),
        }
    }

    fn step(
        &mut self,
        block: &mut Vec<u32>,
        scores: StepScores<'_>,
        rng: &mut StdRng,
        forced: bool,
    ) -> StepOutcome {
        if forced {
            fill_control_slots(block, self.prompt_in_block, scores, &self.control);
            return StepOutcome::Continue;
        }
        let masked = self.masked_slots(block);
        let candidates: Vec<(usize, crate::sampling::Candidate)> = masked
            .iter()
            .copied()
            .zip(scores.official_candidates(&masked, &self.sampler, rng))
            .collect();
        let confidences: Vec<(usize, f32)> =
            candidates.iter().map(|(p, c)| (*p, c.confidence)).collect();
        let quota = self.schedule[self.step];
        for p in select_transfers(&confidences, self.threshold, quota) {
            let (_, c) = candidates
                .iter()
                .find(|(q, _)| *q == p)
                .expect("selected a masked slot");
            block[p] = c.token;
        }
        self.step += 1;
        StepOutcome::Continue
    }

    fn forward_limit(&self) -> usize {
        // Σ schedule = B, so the schedule alone ends the block; the limit is only a backstop.
        self.schedule.len() + 1
    }

    fn samples(&self) -> bool {
        !self.sampler.0.is_greedy()
    }

    fn best_ids_answer(&self, top: super::BestIds<'_>) -> bool {
        super::official_best_ids_answer(&self.sampler, top)
    }

    /// The masked slots, in order: the ones `step` draws candidates for.
    fn device_draws(&self, block: &[u32]) -> Option<super::DrawPlan> {
        super::official_device_draws(&self.sampler, self.masked_slots(block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{full_scores, logits_for, run_block, M};
    use crate::decode::StepOutcome;

    const CONTROL: ControlTokens = ControlTokens {
        mask: M,
        delete: None,
        split: None,
    };

    fn algo(prompt: usize, threshold: f32, schedule: Vec<usize>) -> LowConfidence {
        LowConfidence::new(
            prompt,
            threshold,
            schedule,
            SamplerSettings::GREEDY,
            CONTROL,
        )
    }

    #[test]
    fn schedule_matches_the_official_formula() {
        assert_eq!(schedule(32, 32, 64), vec![1; 32]);
        assert_eq!(schedule(4, 2, 64), vec![2, 2]);
        // Few new tokens shorten the schedule (S' = min(S, N)), not the per-block total.
        assert_eq!(schedule(32, 32, 5), vec![7, 7, 6, 6, 6]);
        assert_eq!(schedule(32, 32, 5).iter().sum::<usize>(), 32);
    }

    #[test]
    fn commits_everything_above_threshold_in_one_step() {
        let mut a = algo(1, 0.9, schedule(4, 4, 64));
        let mut block = vec![3, M, M, M];
        // slots 1 and 2 confident, slot 3 not.
        let l = logits_for(&[(0, 0.99), (1, 0.95), (2, 0.96), (4, 0.5)]);
        assert!(!a.exit_before_forward(&block));
        run_block_step(&mut a, &mut block, &l);
        assert_eq!(block, vec![3, 1, 2, M]);
    }

    #[test]
    fn threshold_is_strict_and_falls_back_to_the_most_confident() {
        let mut a = algo(0, 0.95, schedule(4, 4, 64));
        let mut block = vec![M, M, M, M];
        // Nobody strictly above 0.95: only the best (slot 2, tie-free) is committed.
        let l = logits_for(&[(1, 0.9), (2, 0.8), (3, 0.95), (4, 0.7)]);
        run_block_step(&mut a, &mut block, &l);
        assert_eq!(block, vec![M, M, 3, M]);
    }

    #[test]
    fn schedule_quota_forces_progress() {
        // threshold 1.0 can never be exceeded: each step takes exactly its quota of 2.
        let mut a = algo(0, 1.0, schedule(4, 2, 64));
        let (block, forwards) = run_block(
            &mut a,
            vec![M, M, M, M],
            &[
                logits_for(&[(1, 0.6), (2, 0.7), (3, 0.5), (4, 0.4)]),
                logits_for(&[(1, 0.6), (2, 0.7), (3, 0.5), (4, 0.4)]),
            ],
        );
        assert_eq!(block, vec![1, 2, 3, 4]);
        assert_eq!(forwards, 2);
    }

    #[test]
    fn a_step_needs_the_rows_from_its_first_to_its_last_mask() {
        let a = algo(2, 0.9, schedule(6, 6, 64));
        // Prompt ids in slots 0-1, a committed token between the masks, one after the last.
        assert_eq!(a.rows_needed(&[5, 6, M, 1, M, 2]), 2..5);
        assert_eq!(a.rows_needed(&[5, 6, M, M, M, M]), 2..6);
        // A mask id inside the prompt is not the step's to fill.
        assert_eq!(a.rows_needed(&[M, 6, 1, M, 2, 3]), 3..4);
    }

    #[test]
    fn prompt_tail_is_never_touched() {
        let mut a = algo(2, 0.5, schedule(4, 4, 64));
        let (block, _) = run_block(
            &mut a,
            vec![5, 6, M, M],
            &[logits_for(&[(9, 0.99), (9, 0.99), (1, 0.99), (2, 0.99)])],
        );
        assert_eq!(block, vec![5, 6, 1, 2]);
    }

    fn run_block_step(a: &mut LowConfidence, block: &mut Vec<u32>, l: &[f32]) {
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        assert_eq!(
            a.step(block, full_scores(l), &mut rng, false),
            StepOutcome::Continue
        );
    }
}
