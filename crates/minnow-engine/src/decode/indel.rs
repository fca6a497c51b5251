//! Algorithm C, LLaDA2.2 Levenshtein editing (decoding doc §7): joint M2T/T2T plus DELETE and
//! SPLIT edits, original-mask bookkeeping, a mask-count step schedule, a final cleanup round and a
//! randomized anti-loop guard. Reference semantics of §7.3–§7.6 (the coder543/minnow port) with
//! the three liveness fixes of §7.9:
//! 1. the cleanup round bans MASK as well as DELETE and SPLIT;
//! 2. an original-mask slot never accepts MASK as its M2T candidate (best non-MASK token instead);
//! 3. at the forward limit the block runs one forced cleanup round instead of failing.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::Rng;

use super::{
    generated_masks, select_transfers, BlockAlgorithm, ControlTokens, ScoreKind, StepOutcome,
    StepScores,
};
use crate::sampling::{Candidate, PortSampler, RowSampler, SamplerSettings};

/// Upper bound of the forward limit (the reference port's `max_steps_per_block`).
pub const MAX_FORWARDS_PER_BLOCK: usize = 1000;
/// Anti-loop re-samples per step (reference port).
const ANTI_LOOP_TRIES: usize = 5;

#[derive(Clone, Copy, Debug)]
pub struct IndelSettings {
    pub threshold: f32,
    pub editing_threshold: f32,
    pub max_post_steps: usize,
    pub steps: usize,
    pub sampler: SamplerSettings,
}

/// The edit ids this algorithm needs: MASK, DELETE and SPLIT all present.
#[derive(Clone, Copy, Debug)]
struct EditIds {
    mask: u32,
    delete: u32,
    split: u32,
}

pub struct Indel {
    prompt_in_block: usize,
    settings: IndelSettings,
    sampler: PortSampler,
    ids: EditIds,
    /// Per slot: descends from one of the block's original MASKs (travels with shifts).
    original: Vec<bool>,
    schedule: Vec<usize>,
    post: usize,
    step: usize,
    /// Written blocks seen so far (before structural edits), for the anti-loop guard.
    seen: HashSet<Vec<u32>>,
    /// Original masks at block start; 0 means there is nothing to decode.
    initial: usize,
}

/// Per-step mask census of a block (§7.4).
struct MaskCount {
    masks: Vec<usize>,
    original: usize,
}

impl Indel {
    /// `block` is the block's initial content (prompt tail + MASKs). Fails when the checkpoint
    /// has no DELETE/SPLIT ids.
    pub fn new(
        block: &[u32],
        prompt_in_block: usize,
        settings: IndelSettings,
        control: ControlTokens,
    ) -> Result<Self, String> {
        let (Some(delete), Some(split)) = (control.delete, control.split) else {
            return Err(
                "the indel algorithm needs a LLaDA2.2 checkpoint (DELETE and SPLIT token ids)"
                    .into(),
            );
        };
        let ids = EditIds {
            mask: control.mask,
            delete,
            split,
        };
        let original: Vec<bool> = (0..block.len()).map(|p| p >= prompt_in_block).collect();
        let initial = (prompt_in_block..block.len())
            .filter(|&p| block[p] == ids.mask)
            .count();
        // (port) The schedule splits the block's mask count, unlike 2.0's block length.
        let schedule = (0..settings.steps)
            .map(|i| initial / settings.steps + usize::from(i < initial % settings.steps))
            .collect();
        Ok(Self {
            prompt_in_block,
            sampler: PortSampler(settings.sampler),
            settings,
            ids,
            original,
            schedule,
            post: 0,
            step: 0,
            seen: HashSet::new(),
            initial,
        })
    }

    fn count_masks(&self, block: &[u32]) -> MaskCount {
        let masks = generated_masks(block, self.prompt_in_block, self.ids.mask);
        let original = masks.iter().filter(|&&p| self.original[p]).count();
        MaskCount { masks, original }
    }

    fn cleanup_bans(&self) -> [u32; 3] {
        [self.ids.mask, self.ids.delete, self.ids.split]
    }

    /// Whether the request's sampler is greedy: every pick is then an argmax over a row with at
    /// most three ids banned, which each row's best ids answer.
    fn greedy(&self) -> bool {
        self.sampler.is_greedy()
    }

    /// The sampler's token for slot `p` with `banned` ids left out: the best allowed id when
    /// greedy, else a draw from the row's full logits (after device draws, the row read from the
    /// forward; if that read fails, the best allowed id, and the block loop fails the request).
    /// Only the token: no caller of this reads the confidence of a re-pick.
    fn pick(&self, scores: &StepScores<'_>, p: usize, banned: &[u32], rng: &mut StdRng) -> u32 {
        if self.greedy() {
            return scores.best_excluding(p, banned);
        }
        match scores.full_row(p) {
            Some(row) => self.sampler.candidate(&row, banned, rng).token,
            None => scores.best_excluding(p, banned),
        }
    }

    /// M2T candidates at the masked `slots`, in order. A sampling step draws every slot's
    /// candidate first, one uniform per slot in slot order (on the runner's device, or here with
    /// the rows' distributions prepared on the thread pool); the re-picks of original-mask
    /// slots that drew MASK then take theirs, slot after slot.
    fn mask_candidates(
        &self,
        scores: &StepScores<'_>,
        slots: &[usize],
        rng: &mut StdRng,
    ) -> Vec<Candidate> {
        let drawn: Vec<Candidate> = if self.greedy() {
            slots.iter().map(|&slot| scores.greedy(slot)).collect()
        } else if let StepScores::Logits(logits) = scores {
            use rayon::prelude::*;
            let prepared: Vec<_> = slots
                .par_iter()
                .map(|&slot| self.sampler.prepare(logits.row(slot)))
                .collect();
            slots
                .iter()
                .zip(&prepared)
                .map(|(&slot, row)| self.sampler.draw(row, logits.row(slot), rng))
                .collect()
        } else {
            slots
                .iter()
                .map(|&slot| {
                    scores
                        .drawn(slot)
                        .expect("a sampling indel step reads full logits or device draws")
                })
                .collect()
        };
        slots
            .iter()
            .zip(drawn)
            .map(|(&slot, c)| self.mask_candidate(scores, slot, c, rng))
            .collect()
    }

    /// M2T candidate at a masked slot whose sampled (or greedy) candidate is `c`. Fix 2: outside
    /// the cleanup round an original-mask slot never takes MASK; it takes the best non-MASK
    /// token, ranked by its probability under the full softmax (as SGLang does), so the
    /// threshold sees the same scale as any other slot.
    fn mask_candidate(
        &self,
        scores: &StepScores<'_>,
        slot: usize,
        c: Candidate,
        rng: &mut StdRng,
    ) -> Candidate {
        if c.token == self.ids.mask && self.original[slot] {
            let token = self.pick(scores, slot, &[self.ids.mask], rng);
            return Candidate {
                token,
                confidence: scores.full_probability(slot, token),
            };
        }
        c
    }
}

impl BlockAlgorithm for Indel {
    /// A greedy request reads each row's best ids (`Want::TopK`, a few KB from a GPU instead of
    /// the block's full logits): its step only ever needs an argmax with at most three ids
    /// banned, the argmax's probability, and the full-softmax probability of a best id. A
    /// sampling request reads best ids and device draws where the runner draws, full logits
    /// elsewhere.
    fn scores_needed(&self, _forced: bool) -> ScoreKind {
        if self.greedy() {
            ScoreKind::TopK
        } else {
            ScoreKind::Sampled
        }
    }

    /// Best ids answer a greedy step only: a sampling one draws from whole rows.
    fn best_ids_answer(&self, _top: super::BestIds<'_>) -> bool {
        self.greedy()
    }

    /// The masked slots, in order, under the port's rule (re-picks are drawn afterwards, from
    /// the rows read in full).
    fn device_draws(&self, block: &[u32]) -> Option<super::DrawPlan> {
        (!self.greedy()).then(|| super::DrawPlan {
            rule: minnow_model::DrawRule::Port,
            settings: self.sampler.0,
            slots: self.count_masks(block).masks,
        })
    }

    fn exit_before_forward(&mut self, block: &[u32]) -> bool {
        if self.initial == 0 {
            return true;
        }
        let count = self.count_masks(block);
        // The post counter resets whenever an original mask reappears (reference semantics).
        self.post = if count.original == 0 {
            self.post + 1
        } else {
            0
        };
        count.masks.is_empty() && self.post > self.settings.max_post_steps
    }

    fn step(
        &mut self,
        block: &mut Vec<u32>,
        scores: StepScores<'_>,
        rng: &mut StdRng,
        forced: bool,
    ) -> StepOutcome {
        let old = block.clone();
        let count = self.count_masks(&old);
        let new_cnt = count.masks.len() - count.original;

        // Candidates: sampled for masked slots, greedy for everything else (T2T is greedy).
        let mut sampled: Vec<Option<Candidate>> = vec![None; old.len()];
        for (&p, c) in count
            .masks
            .iter()
            .zip(self.mask_candidates(&scores, &count.masks, rng))
        {
            sampled[p] = Some(c);
        }
        let mut greedy_c: Vec<Option<Candidate>> = vec![None; old.len()];
        for p in self.prompt_in_block..old.len() {
            if old[p] != self.ids.mask {
                greedy_c[p] = Some(scores.greedy(p));
            }
        }

        // M2T selection.
        let mut m2t: Vec<usize> = Vec::new();
        if !count.masks.is_empty() {
            if self.step < self.schedule.len() {
                let need = self.schedule[self.step] + new_cnt;
                let confidences: Vec<(usize, f32)> = count
                    .masks
                    .iter()
                    .map(|&p| (p, sampled[p].map_or(0.0, |c| c.confidence)))
                    .collect();
                m2t = select_transfers(&confidences, self.settings.threshold, need);
            } else {
                m2t = count.masks.clone();
            }
        }

        // T2T (greedy).
        let mut t2t: Vec<usize> = (self.prompt_in_block..old.len())
            .filter(|&p| {
                greedy_c[p].is_some_and(|c| {
                    c.confidence > self.settings.editing_threshold && c.token != old[p]
                })
            })
            .collect();

        // The final (cleanup) round.
        let is_final = forced
            || if self.settings.max_post_steps > 0 {
                self.post >= self.settings.max_post_steps
            } else {
                count.original > 0
                    && count
                        .masks
                        .iter()
                        .filter(|&&p| self.original[p])
                        .all(|p| m2t.contains(p))
            };
        if is_final {
            let bans = self.cleanup_bans();
            m2t = count.masks.clone();
            // Re-picks write their token only (every mask is written, every edit kept so far
            // is applied): no confidence of theirs is read again.
            for &p in &m2t {
                if sampled[p].is_some_and(|c| bans.contains(&c.token)) {
                    let token = self.pick(&scores, p, &bans, rng);
                    sampled[p] = sampled[p].map(|c| Candidate { token, ..c });
                }
            }
            for &p in &t2t {
                if greedy_c[p].is_some_and(|c| bans.contains(&c.token)) {
                    let token = scores.best_excluding(p, &bans);
                    greedy_c[p] = greedy_c[p].map(|c| Candidate { token, ..c });
                }
            }
            // A re-picked edit that lands on the current token is no edit.
            t2t.retain(|&p| greedy_c[p].is_some_and(|c| c.token != old[p]));
        }

        // Write (m2t and t2t are disjoint: masked vs non-masked slots).
        for &p in &m2t {
            if let Some(c) = sampled[p] {
                block[p] = c.token;
            }
        }
        for &p in &t2t {
            if let Some(c) = greedy_c[p] {
                block[p] = c.token;
            }
        }

        // Anti-loop guard: a written block seen before gets up to 5 random re-samples.
        let wrote = !m2t.is_empty() || !t2t.is_empty();
        if !is_final && wrote && self.seen.contains(block.as_slice()) {
            for _ in 0..ANTI_LOOP_TRIES {
                let changed: Vec<usize> =
                    (0..block.len()).filter(|&p| block[p] != old[p]).collect();
                if changed.is_empty() {
                    break;
                }
                let p = changed[rng.gen_range(0..changed.len())];
                block[p] = if old[p] == self.ids.mask {
                    // M2T slot: request sampler, current token banned (and MASK at original
                    // slots, fix 2).
                    let mut banned = vec![block[p]];
                    if self.original[p] {
                        banned.push(self.ids.mask);
                    }
                    self.pick(&scores, p, &banned, rng)
                } else {
                    scores.best_excluding(p, &[block[p]])
                };
                if !self.seen.contains(block.as_slice()) {
                    break;
                }
            }
        }
        self.seen.insert(block.clone());

        let (edited, flags) = apply_edits(block, &old, &self.original, self.ids);
        *block = edited;
        self.original = flags;
        self.step += 1;

        if *block == old && !block.contains(&self.ids.mask) {
            StepOutcome::Converged
        } else {
            StepOutcome::Continue
        }
    }

    fn forward_limit(&self) -> usize {
        (self.original.len() + self.settings.max_post_steps + self.settings.steps)
            .min(MAX_FORWARDS_PER_BLOCK)
    }

    fn samples(&self) -> bool {
        !self.greedy()
    }
}

/// Structural edits (§7.5): DELETE removes its slot, SPLIT becomes `[MASK, pre-step token]`; the
/// `original` flags travel with their slots; the result is truncated/padded with fresh MASKs
/// (flag false) to the block length.
fn apply_edits(
    written: &[u32],
    old: &[u32],
    original: &[bool],
    ids: EditIds,
) -> (Vec<u32>, Vec<bool>) {
    let len = written.len();
    let mut out = Vec::with_capacity(len + 1);
    let mut flags = Vec::with_capacity(len + 1);
    for p in 0..len {
        let t = written[p];
        if t == ids.delete {
            continue;
        } else if t == ids.split {
            out.extend([ids.mask, old[p]]);
            flags.extend([false, original[p]]);
        } else {
            out.push(t);
            flags.push(original[p]);
        }
    }
    out.truncate(len);
    flags.truncate(len);
    out.resize(len, ids.mask);
    flags.resize(len, false);
    (out, flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{full_scores, logits_for, row_with_runner_up, run_block, D, M, S};

    const CONTROL: ControlTokens = ControlTokens {
        mask: M,
        delete: Some(D),
        split: Some(S),
    };
    const IDS: EditIds = EditIds {
        mask: M,
        delete: D,
        split: S,
    };

    fn settings(threshold: f32, max_post_steps: usize, steps: usize) -> IndelSettings {
        IndelSettings {
            threshold,
            editing_threshold: 0.0,
            max_post_steps,
            steps,
            sampler: SamplerSettings::GREEDY,
        }
    }

    fn indel(block: &[u32], prompt: usize, s: IndelSettings) -> Indel {
        Indel::new(block, prompt, s, CONTROL).unwrap()
    }

    #[test]
    fn apply_edits_matches_the_spec_examples() {
        let (a, b, c, d) = (1, 2, 3, 4);
        let (out, flags) = apply_edits(
            &[a, D, S, d],
            &[a, b, c, d],
            &[false, true, true, false],
            IDS,
        );
        assert_eq!(out, vec![a, M, c, d]);
        assert_eq!(flags, vec![false, false, true, false]);
        let (out, flags) = apply_edits(
            &[a, D, D, d],
            &[a, b, c, d],
            &[false, true, true, false],
            IDS,
        );
        assert_eq!(out, vec![a, d, M, M]);
        assert_eq!(flags, vec![false; 4]);
    }

    #[test]
    fn split_inserts_before_the_old_token_and_truncates() {
        // SPLIT at slot 1 pushes the last slot off the end.
        let (out, flags) = apply_edits(&[1, S, 3, 4], &[1, 2, 3, 4], &[true; 4], IDS);
        assert_eq!(out, vec![1, M, 2, 3]);
        assert_eq!(flags, vec![true, false, true, true]);
        // SPLIT of a slot that was a mask yields two masks.
        let (out, _) = apply_edits(&[S, 5, 6, 7], &[M, 5, 6, 7], &[true; 4], IDS);
        assert_eq!(out, vec![M, M, 5, 6]);
    }

    #[test]
    fn spec_edge_1_cleanup_with_partial_prompt() {
        // §12.1: block [3, M, M, M], max_post_steps 0, threshold 0.5, argmax DELETE, DELETE,
        // SPLIT, 1 (p ≈ 0.73), runner-up 2 everywhere → one step, [3, 2, 2, 1].
        let l: Vec<f32> = [D, D, S, 1]
            .iter()
            .flat_map(|&t| row_with_runner_up(t, 0.73, 2))
            .collect();
        let mut a = indel(&[3, M, M, M], 1, settings(0.5, 0, 32));
        let (block, forwards) = run_block(&mut a, vec![3, M, M, M], &[l]);
        assert_eq!(block, vec![3, 2, 2, 1]);
        assert_eq!(forwards, 1);
    }

    #[test]
    fn spec_edge_2_delete_shift_pad_then_cleanup() {
        // §12.2: max_post_steps 1; step 1 predicts [1, D, 1, 1] → [3, 1, 1, M] (shift + padded
        // mask); step 2 (cleanup) resolves the mask.
        let first = logits_for(&[(1, 0.9), (D, 0.9), (1, 0.9), (1, 0.9)]);
        let second = logits_for(&[(3, 0.9), (1, 0.9), (1, 0.9), (4, 0.9)]);
        let mut a = indel(&[3, M, M, M], 1, settings(0.5, 1, 32));
        let mut block = vec![3, M, M, M];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        assert!(!a.exit_before_forward(&block));
        a.step(&mut block, full_scores(&first), &mut rng, false);
        assert_eq!(block, vec![3, 1, 1, M]);
        assert_eq!(a.original, vec![false, true, true, false]);
        let (block, forwards) = run_block(&mut a, block, &[second]);
        assert_eq!(block, vec![3, 1, 1, 4]);
        assert_eq!(forwards, 1);
    }

    #[test]
    fn spec_edge_3_schedule_forces_progress() {
        // threshold 1.0, steps 2, four masks → two masks per step, two steps.
        let l = logits_for(&[(1, 0.6), (2, 0.7), (3, 0.5), (4, 0.8)]);
        let mut a = indel(&[M; 4], 0, settings(1.0, 0, 2));
        let mut block = vec![M; 4];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        a.exit_before_forward(&block);
        a.step(&mut block, full_scores(&l), &mut rng, false);
        assert_eq!(block, vec![M, 2, M, 4]);
        let (block, forwards) = run_block(&mut a, block, &[l]);
        assert_eq!((block, forwards), (vec![1, 2, 3, 4], 1));
    }

    #[test]
    fn spec_edge_4_zero_steps_fill_everything_at_once() {
        let l = logits_for(&[(1, 0.3), (2, 0.3), (3, 0.3), (4, 0.4)]);
        let mut a = indel(&[M; 4], 0, settings(0.99, 0, 0));
        let (block, forwards) = run_block(&mut a, vec![M; 4], &[l]);
        assert_eq!((block, forwards), (vec![1, 2, 3, 4], 1));
    }

    #[test]
    fn original_mask_never_takes_mask_outside_cleanup() {
        // Fix 2: slot 0's argmax is MASK; it takes its best non-MASK token (5) instead.
        let l: Vec<f32> = [(M, 0.9, 5), (2, 0.9, 0), (3, 0.9, 0), (4, 0.9, 0)]
            .iter()
            .flat_map(|&(t, p, r)| row_with_runner_up(t, p, r))
            .collect();
        let mut a = indel(&[M; 4], 0, settings(0.5, 16, 32));
        let mut block = vec![M; 4];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        a.exit_before_forward(&block);
        a.step(&mut block, full_scores(&l), &mut rng, false);
        // Slot 0's replacement has p ≈ 0.1 under the full softmax: below the threshold, so the
        // three confident slots are committed and slot 0 stays masked for now.
        assert_eq!(block, vec![M, 2, 3, 4]);
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        let only_mask: Vec<f32> = [(M, 0.9, 5), (2, 0.9, 0), (3, 0.9, 0), (4, 0.9, 0)]
            .iter()
            .flat_map(|&(t, p, r)| row_with_runner_up(t, p, r))
            .collect();
        a.exit_before_forward(&block);
        a.step(&mut block, full_scores(&only_mask), &mut rng, false);
        assert_eq!(
            block,
            vec![5, 2, 3, 4],
            "quota 1 transfers the lone original mask"
        );
    }

    #[test]
    fn post_counter_cleanup_round_and_budget_exit() {
        // Every post step edits slot 0 back and forth; with max_post_steps 2 the second post
        // round is the cleanup round and the next check exits (exit B).
        let to1 = logits_for(&[(1, 0.9), (2, 0.9), (3, 0.9), (4, 0.9)]);
        let to5 = logits_for(&[(5, 0.9), (2, 0.9), (3, 0.9), (4, 0.9)]);
        let mut a = indel(&[M; 4], 0, settings(0.5, 2, 32));
        let (block, forwards) = run_block(&mut a, vec![M; 4], &[to1.clone(), to5, to1]);
        assert_eq!(forwards, 3);
        assert_eq!(block, vec![1, 2, 3, 4]);
    }

    #[test]
    fn cleanup_bans_edit_tokens_and_mask_in_t2t() {
        // Post round = cleanup (max_post_steps 1): T2T predictions DELETE/SPLIT/MASK are
        // re-picked greedily among the rest (runner-up 6).
        let l: Vec<f32> = [(D, 0.9, 6), (S, 0.9, 6), (M, 0.9, 6), (4, 0.9, 0)]
            .iter()
            .flat_map(|&(t, p, r)| row_with_runner_up(t, p, r))
            .collect();
        let mut a = indel(&[M; 4], 0, settings(0.5, 1, 32));
        // Start from a filled block as if the masks were resolved in an earlier step.
        let filled = vec![1, 2, 3, 4];
        a.exit_before_forward(&filled); // post = 1: this round is the cleanup round
        let mut block = filled.clone();
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        a.step(&mut block, full_scores(&l), &mut rng, false);
        assert_eq!(block, vec![6, 6, 6, 4]);
        assert!(a.exit_before_forward(&block), "cleanup ends the block");
    }

    #[test]
    fn cycle_guard_resamples_a_changed_slot_of_a_repeated_block() {
        // Block [1,2,3,4] edits slot 0 to 5 and back; the third write repeats a seen block, so
        // the guard re-picks slot 0 with the repeated token banned (its runner-up is 6).
        let to5: Vec<f32> = [(5, 0.9, 6), (2, 0.9, 0), (3, 0.9, 0), (4, 0.9, 0)]
            .iter()
            .flat_map(|&(t, p, r)| row_with_runner_up(t, p, r))
            .collect();
        let to1: Vec<f32> = [(1, 0.9, 6), (2, 0.9, 0), (3, 0.9, 0), (4, 0.9, 0)]
            .iter()
            .flat_map(|&(t, p, r)| row_with_runner_up(t, p, r))
            .collect();
        let mut a = indel(&[M; 4], 0, settings(0.5, 16, 32));
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        let mut block = vec![M; 4];
        for (l, expected) in [
            (&to1, vec![1, 2, 3, 4]), // fills the masks
            (&to5, vec![5, 2, 3, 4]), // edit
            (&to1, vec![6, 2, 3, 4]), // [1,2,3,4] was seen: slot 0 re-picked without 1
        ] {
            a.exit_before_forward(&block);
            a.step(&mut block, full_scores(l), &mut rng, false);
            assert_eq!(block, expected);
        }
    }

    #[test]
    fn forced_cleanup_always_leaves_a_clean_block() {
        // A model that only ever predicts MASK (fix 3 path): one forced round fills every slot
        // with a real token.
        let l: Vec<f32> = (0..4).flat_map(|_| row_with_runner_up(M, 0.9, 3)).collect();
        let mut a = indel(&[M; 4], 0, settings(0.5, 16, 32));
        let mut block = vec![M; 4];
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        a.exit_before_forward(&block);
        a.step(&mut block, full_scores(&l), &mut rng, true);
        assert_eq!(block, vec![3; 4]);
    }

    #[test]
    fn requires_delete_and_split_ids() {
        let control = ControlTokens {
            mask: M,
            delete: None,
            split: None,
        };
        assert!(Indel::new(&[M; 4], 0, settings(0.5, 16, 32), control).is_err());
    }
}
