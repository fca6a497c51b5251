//! The grammar layer of the block loop (docs/decoding.md §13): after an algorithm's step, the
//! block's answer slots are re-read left to right with the request's [`TokenMatcher`], so that
//! the decided slots are always a prefix of the block that the grammar accepts and everything
//! right of it is MASK again.
//!
//! - Decided slots the step edited (2.1/2.2 token-to-token edits, 2.2 deletions and splits) are
//!   re-validated from the first edited slot on, the matcher rolled back to it; an edit the
//!   grammar refuses keeps the slot's previous token when the grammar still allows that one.
//! - The leftmost undecided slot is decided every step: the algorithm's proposal when the grammar
//!   allows it, else the sampler's candidate over the logits restricted to the grammar's mask
//!   (`compute_mask`). Every step therefore makes progress. A greedy step reads only each row's
//!   best ids (`Want::TopK`): the first one the mask allows is the masked argmax; a row whose
//!   best ids the grammar all refuses is read in full from the runner.
//! - Proposals right of it are accepted while each is allowed after the ones before; the first
//!   refused one and everything right of it go back to MASK, to be proposed again next step.
//! - A stop id is allowed only where the grammar accepts; once one is decided the rest of the
//!   answer slots take it too (the answer ends there).
//! - The forced final round decides every remaining slot the same way, so a final block is
//!   always a sentence prefix of the grammar with no MASK.
//!
//! The leftmost undecided slot's mask depends only on the matcher's state before the step, so
//! the engine computes it while the step's forward runs ([`Constrained::prepare_mask`], on a CPU
//! thread); the step uses it when the matcher has accepted the same tokens when it needs the
//! mask (no edit of a decided slot was kept), and computes its own otherwise.

use llguidance::toktrie::SimpleVob;
use rand::rngs::StdRng;

use super::{ControlTokens, ReadRow, StepScores};
use crate::constraint::TokenMatcher;
use crate::sampling::{OfficialSampler, SamplerSettings};

/// One request's grammar state across its blocks.
#[derive(Clone, Debug)]
pub struct Constrained {
    matcher: TokenMatcher,
    sampler: SamplerSettings,
    control: ControlTokens,
    stop_ids: Vec<u32>,
    /// The current block's answer slots `lo..hi`; slots past `hi` are not part of the answer.
    lo: usize,
    hi: usize,
    /// Answer slots of this block the matcher has accepted (`lo..lo + decided`).
    decided: usize,
    /// Set once a stop id was decided in this block: the answer is complete.
    stopped: bool,
    /// Masks that chose a candidate (for tests and statistics).
    masks: usize,
    /// The mask computed by [`Constrained::prepare_mask`], with the accepted tokens it holds
    /// for.
    prepared: Option<(Vec<u32>, SimpleVob)>,
    /// Masks that came from [`Constrained::prepare_mask`].
    prepared_used: usize,
    /// Full logits rows read because none of a row's best ids was allowed.
    rows_read: usize,
}

impl Constrained {
    pub fn new(
        matcher: TokenMatcher,
        sampler: SamplerSettings,
        control: ControlTokens,
        stop_ids: Vec<u32>,
    ) -> Self {
        Self {
            matcher,
            sampler,
            control,
            stop_ids,
            lo: 0,
            hi: 0,
            decided: 0,
            stopped: false,
            masks: 0,
            prepared: None,
            prepared_used: 0,
            rows_read: 0,
        }
    }

    /// Starts a block whose answer slots are `lo..hi` (the prompt tail before, slots past the
    /// token budget after). The matcher has accepted every earlier block's answer.
    pub fn start_block(&mut self, lo: usize, hi: usize) {
        self.lo = lo;
        self.hi = hi.max(lo);
        self.decided = 0;
        self.prepared = None;
    }

    /// Grammar masks that chose a candidate so far.
    pub fn masks_computed(&self) -> usize {
        self.masks
    }

    /// How many of those were computed ahead by [`Constrained::prepare_mask`].
    pub fn prepared_masks_used(&self) -> usize {
        self.prepared_used
    }

    /// Full logits rows read because a step's top-K held no allowed token.
    pub fn rows_read(&self) -> usize {
        self.rows_read
    }

    /// Computes the mask of the leftmost undecided slot now, for the next [`Constrained::enforce`]
    /// (the engine calls it while the step's forward runs). Nothing when the answer is complete
    /// or the block has no undecided slot; a matcher error is left for `enforce` to report.
    pub fn prepare_mask(&mut self) {
        self.prepared = None;
        if self.stopped || self.lo + self.decided >= self.hi {
            return;
        }
        if let Ok(mask) = self.matcher.mask() {
            self.prepared = Some((self.matcher.tokens().to_vec(), mask));
        }
    }

    /// Whether a stop id ended the answer.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    fn is_stop(&self, token: u32) -> bool {
        self.stop_ids.contains(&token)
    }

    /// Re-reads the block after a step (module doc). `old` is the block before the step (the
    /// forward's input), `block` the step's result, rewritten in place; `scores` are the
    /// forward's full logits or its best ids ([`StepScores::TopK`], greedy only), `read_row` reads
    /// a slot's full row of that forward. With `forced` every answer slot is decided.
    pub fn enforce(
        &mut self,
        old: &[u32],
        block: &mut [u32],
        scores: StepScores<'_>,
        read_row: &mut ReadRow<'_>,
        rng: &mut StdRng,
        forced: bool,
    ) -> Result<(), String> {
        let (lo, hi) = (self.lo, self.hi);
        if self.stopped {
            // The answer ended in an earlier step; nothing in it may change.
            block[lo..hi].copy_from_slice(&old[lo..hi]);
            return Ok(());
        }
        let decided_end = lo + self.decided;
        // Roll back to the first decided slot the step changed.
        let first_edit = (lo..decided_end)
            .find(|&p| block[p] != old[p])
            .unwrap_or(decided_end);
        self.matcher.rollback(decided_end - first_edit)?;
        self.decided = first_edit - lo;
        let mut p = first_edit;
        // Re-validate the previously decided slots: the edit if allowed, else the old token.
        while p < decided_end {
            let edited = block[p];
            if !self.control.is_control(edited) && self.accept(edited)? {
                p += 1;
                if self.stopped {
                    break;
                }
                continue;
            }
            if edited != old[p] && self.accept(old[p])? {
                block[p] = old[p];
                p += 1;
                if self.stopped {
                    break;
                }
                continue;
            }
            break;
        }
        // The leftmost undecided slot is always decided; later ones while proposals are allowed.
        let mut leftmost = true;
        while p < hi && !self.stopped {
            let proposal = block[p];
            let proposed = !self.control.is_control(proposal);
            if proposed && self.accept(proposal)? {
                // Proposal taken.
            } else if leftmost || forced {
                block[p] = self.masked_candidate(p, scores, read_row, rng)?;
            } else {
                break;
            }
            leftmost = false;
            p += 1;
        }
        if self.stopped {
            // Everything after the stop id is cut from the answer; fill it with that id.
            let stop = block[p - 1];
            block[p..hi].fill(stop);
        } else {
            block[p..hi].fill(self.control.mask);
        }
        self.prepared = None;
        Ok(())
    }

    /// Feeds `token` to the matcher if allowed; records a decided slot and a stop.
    fn accept(&mut self, token: u32) -> Result<bool, String> {
        if !self.matcher.try_consume(token)? {
            return Ok(false);
        }
        self.decided += 1;
        if self.is_stop(token) {
            self.stopped = true;
        }
        Ok(true)
    }

    /// The sampler's candidate for slot `p` among the ids the grammar allows here, accepted into
    /// the matcher.
    fn masked_candidate(
        &mut self,
        p: usize,
        scores: StepScores<'_>,
        read_row: &mut ReadRow<'_>,
        rng: &mut StdRng,
    ) -> Result<u32, String> {
        let mask = match self.prepared.take() {
            Some((tokens, mask)) if tokens == self.matcher.tokens() => {
                self.prepared_used += 1;
                mask
            }
            _ => self.matcher.mask()?,
        };
        self.masks += 1;
        let greedy = self.sampler.is_greedy();
        let token = match scores {
            StepScores::TopK(top) if greedy => {
                match best_allowed(top.row(p), &mask, &self.control) {
                    Some(token) => Some(token),
                    None => {
                        self.rows_read += 1;
                        masked_argmax(&read_row.row(p)?, &mask, &self.control)
                    }
                }
            }
            StepScores::Logits(logits) if greedy => {
                masked_argmax(logits.row(p), &mask, &self.control)
            }
            StepScores::Logits(logits) => self.masked_sample(logits.row(p), &mask, rng),
            StepScores::TopK(_) | StepScores::Top1(_) | StepScores::Drawn(_) => {
                return Err("grammar matcher: a sampling step got no full logits".into())
            }
        };
        let Some(token) = token else {
            return Err("grammar matcher: no token of the model's vocabulary can continue".into());
        };
        if !self.accept(token)? {
            return Err(format!(
                "grammar matcher: the masked candidate {token} was refused"
            ));
        }
        Ok(token)
    }

    /// The sampler's draw over `row` restricted to the allowed ids (`None` when none is).
    fn masked_sample(&self, row: &[f32], mask: &SimpleVob, rng: &mut StdRng) -> Option<u32> {
        let mut masked = vec![f32::NEG_INFINITY; row.len()];
        let mut any = false;
        mask.iter_set_entries(|id| {
            if id < row.len() && !self.control.is_control(id as u32) {
                masked[id] = masked_value(row[id]);
                any = true;
            }
        });
        any.then(|| OfficialSampler(self.sampler).candidate(&masked, rng).token)
    }
}

/// An allowed id's logit as the masked row holds it: a non-finite logit (never the model's)
/// becomes -1e30, below every finite one and above the refused ids' -inf.
fn masked_value(logit: f32) -> f32 {
    if logit.is_finite() {
        logit
    } else {
        -1e30
    }
}

fn allowed(id: u32, mask: &SimpleVob, control: &ControlTokens) -> bool {
    (id as usize) < mask.len() && mask.is_allowed(id) && !control.is_control(id)
}

/// The greedy candidate of the masked row: the allowed id with the largest
/// [`masked_value`], the lowest on ties (what the greedy sampler picks from the masked row).
fn masked_argmax(row: &[f32], mask: &SimpleVob, control: &ControlTokens) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    // Allowed ids come in increasing order, so strict `>` keeps the lowest on ties.
    mask.iter_set_entries(|id| {
        if id < row.len() && !control.is_control(id as u32) {
            let value = masked_value(row[id]);
            if best.is_none_or(|(_, b)| value > b) {
                best = Some((id as u32, value));
            }
        }
    });
    best.map(|(id, _)| id)
}

/// [`masked_argmax`] from a row's best ids (larger logit first, lower id first among equal
/// ones): the first allowed id with a finite logit above -1e30 is it, since every id after it
/// in that order, listed or not, has a smaller or equal logit and a higher id, and every allowed
/// id before it has a non-finite logit (-1e30 in the masked row). `None`: the row must be read.
fn best_allowed(best: &[(u32, f32)], mask: &SimpleVob, control: &ControlTokens) -> Option<u32> {
    for &(id, logit) in best {
        if !allowed(id, mask, control) || !logit.is_finite() {
            continue;
        }
        return (logit > -1e30).then_some(id);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use rand::SeedableRng;

    use super::*;
    use crate::constraint::{GrammarCompiler, OutputConstraint};
    use crate::decode::BlockLogits;
    use crate::text::tokenizer::tests_support::fixture;
    use minnow_model::runner::top_k_of_rows;

    /// The tiny fixtures' vocabulary: 512 model rows, MASK 482, EOS 481; bytes 'a' = 64,
    /// 'b' = 65, 'c' = 66, 'x' = 87.
    const V: usize = 512;
    const MASK: u32 = 482;
    const EOS: u32 = 481;
    const A: u32 = 64;
    const B: u32 = 65;
    const C: u32 = 66;
    const X: u32 = 87;

    fn compiler() -> &'static GrammarCompiler {
        static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
        COMPILER.get_or_init(|| {
            let json = std::fs::read(fixture("llada2-tiny-v21/tokenizer.json")).unwrap();
            GrammarCompiler::new(
                json.into(),
                V,
                vec![EOS],
                crate::text::tool_format::ToolCallFormat::TaggedJson,
            )
        })
    }

    fn regex(rx: &str) -> Constrained {
        let matcher = compiler()
            .matcher(&OutputConstraint::Regex(rx.into()))
            .unwrap();
        let control = ControlTokens {
            mask: MASK,
            delete: None,
            split: None,
        };
        let mut c = Constrained::new(matcher, SamplerSettings::GREEDY, control, vec![EOS]);
        c.start_block(0, 4);
        c
    }

    /// Logits `[4, V]` whose argmax at slot `i` is `best[i]` and runner-up `second[i]`.
    fn logits(best: [u32; 4], second: [u32; 4]) -> Vec<f32> {
        let mut data = vec![0.0; 4 * V];
        for i in 0..4 {
            data[i * V + best[i] as usize] = 9.0;
            data[i * V + second[i] as usize] = 8.0;
        }
        data
    }

    /// Enforces on the full logits `l`, and on a copy of `c` from the best ids of `l` (reading
    /// rows of `l` when asked): both must decide the same block and reach the same state.
    fn enforce(c: &mut Constrained, old: &[u32], new: &[u32], l: &[f32], forced: bool) -> Vec<u32> {
        let mut twin = c.clone();
        let mut block = new.to_vec();
        let mut rng = StdRng::seed_from_u64(0);
        let mut no_rows = |_| -> Result<Vec<f32>, String> { panic!("full logits were given") };
        let scores = StepScores::Logits(BlockLogits::new(l, V));
        c.enforce(old, &mut block, scores, &mut no_rows, &mut rng, forced)
            .unwrap();

        let top = top_k_of_rows(l, V);
        let mut from_top = new.to_vec();
        let mut read_row = |p: usize| Ok(l[p * V..(p + 1) * V].to_vec());
        let scores = StepScores::TopK(crate::decode::BestIds::new(&top));
        twin.enforce(old, &mut from_top, scores, &mut read_row, &mut rng, forced)
            .unwrap();
        assert_eq!(
            from_top, block,
            "the best ids decide what the full logits do"
        );
        assert_eq!(
            (
                twin.masks_computed(),
                twin.prepared_masks_used(),
                twin.decided
            ),
            (c.masks_computed(), c.prepared_masks_used(), c.decided)
        );
        ROWS_READ.with(|r| r.set(r.get() + twin.rows_read()));
        block
    }

    thread_local! {
        /// Full rows the twins of [`enforce`] read on this test's thread.
        static ROWS_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// On random rows with many ties and some non-finite logits, under random masks: the masked
    /// argmax is what the greedy sampler picked from the masked row before (a row of -inf with
    /// the allowed ids' logits), and the best ids give it whenever they hold it.
    #[test]
    fn masked_argmax_is_the_greedy_sampler_over_the_masked_row() {
        use rand::Rng;
        let control = ControlTokens {
            mask: MASK,
            delete: None,
            split: None,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let (mut from_best, mut read) = (0, 0);
        for _ in 0..300 {
            let mut row: Vec<f32> = (0..V)
                .map(|_| rng.gen_range(-6i32..6) as f32 * 0.5)
                .collect();
            for _ in 0..rng.gen_range(0..4) {
                let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
                row[rng.gen_range(0..V)] = special[rng.gen_range(0..4)];
            }
            let mut mask = SimpleVob::alloc(V);
            // Few allowed ids (the best ids rarely hold one) or many.
            let allowed = if rng.gen_bool(0.5) {
                rng.gen_range(1..8)
            } else {
                rng.gen_range(1..V)
            };
            for _ in 0..allowed {
                mask.allow_token(rng.gen_range(0..V as u32));
            }
            mask.allow_token(A);
            let mut masked = vec![f32::NEG_INFINITY; V];
            mask.iter_set_entries(|id| {
                if !control.is_control(id as u32) {
                    masked[id] = if row[id].is_finite() { row[id] } else { -1e30 };
                }
            });
            let greedy = OfficialSampler(SamplerSettings::GREEDY);
            let before = greedy.candidate(&masked, &mut rng).token;
            assert_eq!(masked_argmax(&row, &mask, &control), Some(before));
            let best = minnow_model::runner::top_k(&row, minnow_model::TOP_K);
            match best_allowed(&best, &mask, &control) {
                Some(token) => {
                    assert_eq!(token, before);
                    from_best += 1;
                }
                None => read += 1,
            }
        }
        assert!(
            from_best > 50 && read > 10,
            "both paths ran ({from_best}, {read})"
        );
    }

    /// The best ids hold the masked argmax unless the grammar refuses them all, then the row is
    /// read; non-finite logits and ties are ranked as in the full row.
    #[test]
    fn the_best_ids_pick_the_masked_argmax_or_ask_for_the_row() {
        let control = ControlTokens {
            mask: MASK,
            delete: None,
            split: None,
        };
        let mut mask = SimpleVob::alloc(V);
        for id in [A, B, C] {
            mask.allow_token(id);
        }
        let mut row = vec![0.0f32; V];
        row[X as usize] = 5.0;
        row[C as usize] = 3.0;
        row[B as usize] = 3.0;
        row[MASK as usize] = 9.0;
        let best = minnow_model::runner::top_k(&row, 4);
        // MASK, x, b, c: b wins the tie with c (lower id), as in the full row.
        assert_eq!(best_allowed(&best, &mask, &control), Some(B));
        assert_eq!(masked_argmax(&row, &mask, &control), Some(B));
        // The grammar refuses every listed id: the row is needed.
        assert_eq!(best_allowed(&best[..2], &mask, &control), None);
        // Non-finite logits of allowed ids rank below every finite one.
        row[A as usize] = f32::INFINITY;
        row[B as usize] = f32::NAN;
        let best = minnow_model::runner::top_k(&row, 5);
        assert_eq!(best_allowed(&best, &mask, &control), Some(C));
        assert_eq!(masked_argmax(&row, &mask, &control), Some(C));
        // ... and an allowed logit at or below -1e30 leaves the choice to the full row.
        row[C as usize] = -2e30;
        row[B as usize] = -2e30;
        let best = minnow_model::runner::top_k(&row, V);
        assert_eq!(best_allowed(&best, &mask, &control), None);
        assert_eq!(masked_argmax(&row, &mask, &control), Some(A));
        // The greedy row read is counted; the masks are those of the full-logits path.
        ROWS_READ.with(|r| r.set(0));
        let mut c = regex("ab+c");
        // Only zeros and x, c at the top: a (64) is not among the best 64 ids of slot 0.
        let l = logits([X, C, C, C], [C, X, X, X]);
        let block = enforce(&mut c, &M4, &[X, C, MASK, MASK], &l, false);
        assert_eq!(block, vec![A, MASK, MASK, MASK]);
        assert_eq!(ROWS_READ.with(|r| r.get()), 1, "slot 0's row was read");
    }

    const M4: [u32; 4] = [MASK; 4];

    #[test]
    fn accepts_the_allowed_run_and_remasks_right_of_the_first_refusal() {
        let mut c = regex("ab+c");
        let l = logits([A, B, X, B], [X; 4]);
        let block = enforce(&mut c, &M4, &[A, B, X, B], &l, false);
        assert_eq!(block, vec![A, B, MASK, MASK]);
        assert_eq!(c.masks_computed(), 0, "valid proposals need no mask");
        // A proposal right of a gap is not decided either.
        let mut c = regex("ab+c");
        let block = enforce(&mut c, &M4, &[A, MASK, B, B], &l, false);
        assert_eq!(block[2..], [MASK, MASK]);
    }

    #[test]
    fn the_leftmost_slot_is_decided_from_the_masked_logits() {
        let mut c = regex("ab+c");
        // The model wants x, then c; the grammar allows only a first, then b.
        let l = logits([X, C, C, C], [C, X, X, X]);
        let block = enforce(&mut c, &M4, &[X, C, MASK, MASK], &l, false);
        assert_eq!(block, vec![A, MASK, MASK, MASK]);
        assert_eq!(c.masks_computed(), 1);
        // Unproposed leftmost slot: decided all the same (b is the only allowed id).
        let block = enforce(&mut c, &block.clone(), &block, &l, false);
        assert_eq!(block, vec![A, B, MASK, MASK]);
    }

    #[test]
    fn refused_edits_keep_the_decided_token_and_accepted_ones_roll_back() {
        let mut c = regex("ab+c|ac+b");
        let l = logits([A, B, B, B], [X; 4]);
        let old = enforce(&mut c, &M4, &[A, B, B, MASK], &l, false);
        assert_eq!(old, vec![A, B, B, MASK]);
        // Editing slot 1 to x is refused: b stays; slot 3 then takes its proposal c.
        let block = enforce(&mut c, &old, &[A, X, B, C], &l, false);
        assert_eq!(block, vec![A, B, B, C]);
        // Editing slot 1 to c is allowed ("ac" starts the second branch) and the old b still
        // fits after it; "acb" is complete, so the leftmost undecided slot can only take EOS.
        let mut c = regex("ab+c|ac+b");
        let old = enforce(&mut c, &M4, &[A, B, B, MASK], &l, false);
        let block = enforce(&mut c, &old, &[A, C, B, MASK], &l, false);
        assert_eq!(block, vec![A, C, B, EOS]);
        assert!(c.is_stopped());
    }

    #[test]
    fn stop_ids_only_where_the_grammar_accepts_and_the_rest_follows_them() {
        let mut c = regex("ab");
        let l = logits([A, EOS, EOS, EOS], [B; 4]);
        // EOS after "a" is refused (not the leftmost slot, so it is re-masked).
        let block = enforce(&mut c, &M4, &[A, EOS, MASK, MASK], &l, false);
        assert_eq!(block, vec![A, MASK, MASK, MASK]);
        // As the leftmost slot it takes the best allowed id instead: b.
        let block = enforce(&mut c, &block.clone(), &[A, EOS, MASK, MASK], &l, false);
        assert_eq!(block, vec![A, B, MASK, MASK]);
        // Now EOS is allowed; the slots after it take EOS too.
        let block = enforce(&mut c, &block.clone(), &[A, B, EOS, X], &l, false);
        assert_eq!(block, vec![A, B, EOS, EOS]);
        // Later edits of a finished answer are undone.
        let again = enforce(&mut c, &block, &[X, X, X, X], &l, false);
        assert_eq!(again, block);
    }

    #[test]
    fn the_forced_round_decides_every_slot() {
        let mut c = regex("a[bc]*");
        let l = logits([X, X, X, X], [C, C, C, C]);
        let block = enforce(&mut c, &M4, &M4, &l, true);
        assert_eq!(block, vec![A, C, C, C]);
        assert_eq!(c.masks_computed(), 4);
    }

    /// A mask computed before the step (while the forward ran) is used only when the matcher is
    /// still in the state it was computed for, and the block is the same either way.
    #[test]
    fn a_mask_prepared_before_the_step_is_used_only_for_the_same_state() {
        let l = logits([X, C, C, C], [C, X, X, X]);
        // Nothing decided: the leftmost slot needs a mask of the state before the step.
        let (mut fresh, mut prepared) = (regex("ab+c"), regex("ab+c"));
        prepared.prepare_mask();
        let expected = enforce(&mut fresh, &M4, &[X, C, MASK, MASK], &l, false);
        let block = enforce(&mut prepared, &M4, &[X, C, MASK, MASK], &l, false);
        assert_eq!(block, expected);
        assert_eq!(block, vec![A, MASK, MASK, MASK]);
        assert_eq!(
            (fresh.prepared_masks_used(), prepared.prepared_masks_used()),
            (0, 1)
        );
        // Next step, again prepared from the state after "a": b is the only allowed id.
        prepared.prepare_mask();
        let block = enforce(&mut prepared, &block.clone(), &block, &l, false);
        assert_eq!(block, vec![A, B, MASK, MASK]);
        assert_eq!(prepared.prepared_masks_used(), 2);

        // An edit of a decided slot rolls the matcher back: the prepared mask (of the state
        // after "ab") is stale and the step computes its own.
        let l = logits([A, B, B, B], [X; 4]);
        let (mut fresh, mut prepared) = (regex("ab+c|ac+b"), regex("ab+c|ac+b"));
        let old = enforce(&mut fresh, &M4, &[A, B, MASK, MASK], &l, false);
        enforce(&mut prepared, &M4, &[A, B, MASK, MASK], &l, false);
        prepared.prepare_mask();
        let expected = enforce(&mut fresh, &old, &[A, C, MASK, MASK], &l, false);
        let block = enforce(&mut prepared, &old, &[A, C, MASK, MASK], &l, false);
        assert_eq!(block, expected);
        assert_eq!(prepared.prepared_masks_used(), 0);
        assert_eq!(prepared.masks_computed(), fresh.masks_computed());
        assert!(
            prepared.masks_computed() > 0,
            "the leftmost slot needed a mask"
        );

        // An edit the grammar refuses is undone (the old token accepted again): the matcher has
        // the same tokens as when the mask was prepared, so the mask is used.
        let l = logits([A, B, B, B], [X; 4]);
        let mut prepared = regex("ab+c");
        let old = enforce(&mut prepared, &M4, &[A, B, MASK, MASK], &l, false);
        assert_eq!(old, vec![A, B, MASK, MASK]);
        prepared.prepare_mask();
        let block = enforce(&mut prepared, &old, &[A, X, MASK, MASK], &l, false);
        assert_eq!(block, vec![A, B, B, MASK]);
        assert_eq!(prepared.prepared_masks_used(), 1);

        // Nothing to prepare once the answer is complete.
        let mut done = regex("a");
        let l = logits([A, EOS, EOS, EOS], [X; 4]);
        enforce(&mut done, &M4, &[A, EOS, EOS, EOS], &l, false);
        assert!(done.is_stopped());
        done.prepare_mask();
        assert!(done.prepared.is_none());
    }

    #[test]
    fn slots_past_the_answer_are_left_to_the_algorithm() {
        let mut c = regex("a+");
        c.start_block(1, 3);
        let l = logits([X, X, X, X], [A; 4]);
        // Slot 0 is the prompt tail, slot 3 past the token budget.
        let block = enforce(&mut c, &[7, MASK, MASK, MASK], &[7, X, X, X], &l, false);
        assert_eq!(block, vec![7, A, MASK, X]);
    }
}
