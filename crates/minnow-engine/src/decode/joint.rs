//! Algorithm B, LLaDA2.1 joint threshold decoding (decoding doc §6.1, the official loop):
//! mask-to-token with threshold τm and a `num_to_transfer` quota, token-to-token edits with
//! threshold τe at generated slots of the current block, post steps checked *before* the forward,
//! and a convergence exit when a mask-free block is left unchanged.

use rand::rngs::StdRng;

use super::{
    fill_control_slots, generated_masks, official_scores_needed, select_transfers, BlockAlgorithm,
    ControlTokens, ScoreKind, StepOutcome, StepScores,
};
use crate::sampling::{Candidate, OfficialSampler, SamplerSettings};

#[derive(Clone, Copy, Debug)]
pub struct JointSettings {
    pub threshold: f32,
    pub editing_threshold: f32,
    pub max_post_steps: usize,
    pub num_to_transfer: usize,
    pub sampler: SamplerSettings,
}

pub struct Joint {
    prompt_in_block: usize,
    settings: JointSettings,
    sampler: OfficialSampler,
    control: ControlTokens,
    /// Iterations that started with no MASK in the block (not edits).
    post: usize,
    block_len: usize,
}

impl Joint {
    pub fn new(
        prompt_in_block: usize,
        block_len: usize,
        settings: JointSettings,
        control: ControlTokens,
    ) -> Self {
        Self {
            prompt_in_block,
            sampler: OfficialSampler(settings.sampler),
            settings,
            control,
            post: 0,
            block_len,
        }
    }

    fn masked_slots(&self, block: &[u32]) -> Vec<usize> {
        generated_masks(block, self.prompt_in_block, self.control.mask)
    }
}

impl BlockAlgorithm for Joint {
    fn exit_before_forward(&mut self, block: &[u32]) -> bool {
        if self.masked_slots(block).is_empty() {
            self.post += 1;
        }
        self.post > self.settings.max_post_steps
    }

    fn scores_needed(&self, forced: bool) -> ScoreKind {
        official_scores_needed(&self.sampler, forced)
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
        let old = block.clone();
        // One (token, confidence) pair per generated slot, shared by M2T and T2T (§4.2).
        let slots: Vec<usize> = (self.prompt_in_block..block.len()).collect();
        let candidates: Vec<Candidate> = scores.official_candidates(&slots, &self.sampler, rng);
        let cand = |p: usize| candidates[p - self.prompt_in_block];

        let masked = self.masked_slots(&old);
        if !masked.is_empty() {
            let confidences: Vec<(usize, f32)> =
                masked.iter().map(|&p| (p, cand(p).confidence)).collect();
            for p in select_transfers(
                &confidences,
                self.settings.threshold,
                self.settings.num_to_transfer,
            ) {
                block[p] = cand(p).token;
            }
        }
        // T2T: only generated, non-mask slots of this block; earlier blocks are final.
        let mut edited = false;
        for p in self.prompt_in_block..old.len() {
            let c = cand(p);
            if old[p] != self.control.mask
                && c.confidence > self.settings.editing_threshold
                && c.token != old[p]
            {
                block[p] = c.token;
                edited = true;
            }
        }
        if masked.is_empty() && !edited {
            StepOutcome::Converged
        } else {
            StepOutcome::Continue
        }
    }

    fn forward_limit(&self) -> usize {
        // Each step with masks fills at least one, then at most `max_post_steps` post forwards;
        // more only if edits write MASK back, which the forced cleanup then resolves.
        self.block_len + self.settings.max_post_steps + 1
    }

    fn samples(&self) -> bool {
        !self.sampler.0.is_greedy()
    }

    fn best_ids_answer(&self, top: super::BestIds<'_>) -> bool {
        super::official_best_ids_answer(&self.sampler, top)
    }

    /// Every generated slot, in order: `step` draws one candidate for each (M2T and T2T share
    /// it).
    fn device_draws(&self, block: &[u32]) -> Option<super::DrawPlan> {
        super::official_device_draws(&self.sampler, (self.prompt_in_block..block.len()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{full_scores, logits_for, run_block, M};

    const CONTROL: ControlTokens = ControlTokens {
        mask: M,
        delete: None,
        split: None,
    };

    fn joint(prompt: usize, tm: f32, te: f32, post: usize, ntt: usize) -> Joint {
        Joint::new(
            prompt,
            4,
            JointSettings {
                threshold: tm,
                editing_threshold: te,
                max_post_steps: post,
                num_to_transfer: ntt,
                sampler: SamplerSettings::GREEDY,
            },
            CONTROL,
        )
    }

    #[test]
    fn masks_then_convergence_exit() {
        let mut a = joint(1, 0.5, 0.0, 16, 1);
        let l = logits_for(&[(9, 0.9), (1, 0.9), (2, 0.9), (3, 0.9)]);
        // Step 1 fills all masks; step 2 sees no mask and no edit: converged after 2 forwards.
        let (block, forwards) = run_block(&mut a, vec![5, M, M, M], &[l.clone(), l]);
        assert_eq!(block, vec![5, 1, 2, 3]);
        assert_eq!(forwards, 2);
    }

    #[test]
    fn at_least_num_to_transfer_masks_per_step() {
        let mut a = joint(0, 0.99, 0.0, 16, 2);
        let l = logits_for(&[(1, 0.6), (2, 0.8), (3, 0.7), (4, 0.5)]);
        let mut block = vec![M, M, M, M];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        a.step(&mut block, full_scores(&l), &mut rng, false);
        assert_eq!(block, vec![M, 2, 3, M]);
    }

    #[test]
    fn edits_only_generated_slots_above_editing_threshold() {
        let mut a = joint(1, 0.5, 0.6, 16, 1);
        // Slot 0 is prompt (never edited even at p=0.99); slot 1 edited (0.9 > 0.6); slot 2 kept
        // (0.55 is not above 0.6); slot 3 is a mask and gets filled.
        let l = logits_for(&[(9, 0.99), (4, 0.9), (4, 0.55), (3, 0.9)]);
        let mut block = vec![5, 1, 2, M];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        assert_eq!(
            a.step(&mut block, full_scores(&l), &mut rng, false),
            StepOutcome::Continue
        );
        assert_eq!(block, vec![5, 4, 2, 3]);
    }

    #[test]
    fn post_step_budget_is_checked_before_the_forward() {
        // Edits oscillate forever (1 ↔ 2 at slot 0): the block ends after exactly
        // 1 (mask) + max_post_steps forwards, the last edits never forwarded.
        let mut a = joint(0, 0.5, 0.0, 3, 1);
        let to2 = logits_for(&[(2, 0.9), (3, 0.9), (4, 0.9), (5, 0.9)]);
        let to1 = logits_for(&[(1, 0.9), (3, 0.9), (4, 0.9), (5, 0.9)]);
        let script = vec![to1.clone(), to2.clone(), to1.clone(), to2.clone(), to1];
        let (block, forwards) = run_block(&mut a, vec![M, M, M, M], &script);
        assert_eq!(forwards, 4);
        assert_eq!(block, vec![2, 3, 4, 5]);
    }

    #[test]
    fn zero_post_steps_stop_when_the_block_is_full() {
        let mut a = joint(0, 0.5, 0.0, 0, 1);
        let l = logits_for(&[(1, 0.9), (2, 0.9), (3, 0.9), (4, 0.9)]);
        let (block, forwards) = run_block(&mut a, vec![M, M, M, M], &[l]);
        assert_eq!((block, forwards), (vec![1, 2, 3, 4], 1));
    }
}
