//! Block-diffusion decoding (decoding doc §1–§9), independent of text and of the engine's threads.
//!
//! Map of the module:
//! - [`params`]: per-request parameters resolved against the checkpoint family's defaults.
//! - [`layout`]: request layout (§1): prefill length, decode blocks, the token budget.
//! - [`low_confidence`], [`joint`], [`indel`]: the three algorithms (§5, §6, §7), each a
//!   [`BlockAlgorithm`] that only sees one block's ids and the logits of its forwards.
//! - [`block`]: the shared per-block loop (§3) and the K/V commit rule (§8).
//! - [`stop_tokens`]: end-of-answer token ids and output assembly (§9).
//! - [`request`]: one request as a step-by-step state machine (prefill chunks, blocks, commit),
//!   so the engine can interleave several requests one forward at a time.

pub mod block;
pub mod indel;
pub mod joint;
pub mod layout;
pub mod low_confidence;
pub mod params;
pub mod request;
pub mod stop_tokens;

#[cfg(test)]
pub(crate) mod testing;

use rand::rngs::StdRng;

use crate::sampling::greedy_excluding;

/// The diffusion control ids of a checkpoint. DELETE/SPLIT exist only in LLaDA2.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlTokens {
    pub mask: u32,
    pub delete: Option<u32>,
    pub split: Option<u32>,
}

impl ControlTokens {
    /// Whether `id` is MASK, DELETE or SPLIT: never allowed in committed output.
    pub fn is_control(&self, id: u32) -> bool {
        id == self.mask || Some(id) == self.delete || Some(id) == self.split
    }

    /// The ids a final cleanup bans (decoding doc §7.9 fix 1: MASK as well as DELETE and SPLIT).
    pub fn all(&self) -> Vec<u32> {
        let mut ids = vec![self.mask];
        ids.extend(self.delete);
        ids.extend(self.split);
        ids
    }
}

/// Row-major F32 logits `[B, V]` of one denoising forward.
#[derive(Clone, Copy, Debug)]
pub struct BlockLogits<'a> {
    pub data: &'a [f32],
    pub vocab: usize,
}

impl<'a> BlockLogits<'a> {
    pub fn new(data: &'a [f32], vocab: usize) -> Self {
        debug_assert!(vocab > 0 && data.len().is_multiple_of(vocab));
        Self { data, vocab }
    }

    /// Logits of block slot `p` (predicting the token at that slot).
    pub fn row(&self, p: usize) -> &'a [f32] {
        &self.data[p * self.vocab..(p + 1) * self.vocab]
    }
}

/// What a step made of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// Keep refining (the next pre-forward check may still end the block).
    Continue,
    /// The step changed nothing and no mask is left: the block is final and the last forward's
    /// input equals it, so its K/V can be committed as is.
    Converged,
}

/// One denoising algorithm's view of one block. The shared loop ([`block::BlockRun`]) calls
/// `exit_before_forward` exactly once per iteration, then runs the forward and calls `step`.
pub trait BlockAlgorithm: Send {
    /// The pre-forward check (2.0: no mask left or schedule exhausted; 2.1/2.2: post-step budget).
    /// `true` ends the block without another forward.
    fn exit_before_forward(&mut self, block: &[u32]) -> bool;

    /// Applies one forward's logits to `block` (which is the forward's input). With `forced` the
    /// step is the forced final cleanup (hard limit or leftover masks): it must leave no MASK,
    /// DELETE or SPLIT at generated positions.
    fn step(
        &mut self,
        block: &mut Vec<u32>,
        logits: BlockLogits<'_>,
        rng: &mut StdRng,
        forced: bool,
    ) -> StepOutcome;

    /// Forwards after which the block loop forces a final cleanup round.
    fn forward_limit(&self) -> usize;
}

/// Whether a generated slot of the block still holds a control id (MASK, DELETE, SPLIT).
pub fn has_control_tokens(block: &[u32], prompt_in_block: usize, control: &ControlTokens) -> bool {
    block[prompt_in_block..]
        .iter()
        .any(|&t| control.is_control(t))
}

/// The forced cleanup shared by 2.0 and 2.1 (they have no cleanup round of their own): every
/// generated slot that holds a control id gets its best non-control token.
pub fn fill_control_slots(
    block: &mut [u32],
    prompt_in_block: usize,
    logits: BlockLogits<'_>,
    control: &ControlTokens,
) {
    let banned = control.all();
    for (p, token) in block.iter_mut().enumerate().skip(prompt_in_block) {
        if control.is_control(*token) {
            *token = greedy_excluding(logits.row(p), &banned).token;
        }
    }
}

/// Slots of `candidates` ordered by confidence, highest first (ties → lower slot).
pub fn by_confidence_desc(mut slots: Vec<(usize, f32)>) -> Vec<usize> {
    slots.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    slots.into_iter().map(|(p, _)| p).collect()
}

/// Threshold selection with a quota (2.0 §5, 2.1 §6.1, 2.2 §7.4): every slot whose confidence
/// is strictly above `threshold` if there are at least `quota` of them, else the `quota` most
/// confident slots (at most all of them).
pub fn select_transfers(slots: &[(usize, f32)], threshold: f32, quota: usize) -> Vec<usize> {
    let above: Vec<usize> = slots
        .iter()
        .filter(|(_, c)| *c > threshold)
        .map(|(p, _)| *p)
        .collect();
    if above.len() >= quota {
        return above;
    }
    let mut ranked = by_confidence_desc(slots.to_vec());
    ranked.truncate(quota.min(slots.len()));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_is_strict_and_quota_falls_back_to_top_confidence() {
        let slots = [(3, 0.5), (5, 0.9), (6, 0.95), (7, 0.2)];
        // Exactly at the threshold is not above it: nobody qualifies, the best one is taken.
        assert_eq!(select_transfers(&slots, 0.95, 1), vec![6]);
        assert_eq!(select_transfers(&slots, 0.94, 2), vec![6, 5]);
        assert_eq!(select_transfers(&slots, 0.4, 1), vec![3, 5, 6]);
        assert_eq!(select_transfers(&slots, 0.4, 4), vec![6, 5, 3, 7]);
        assert_eq!(select_transfers(&slots, 0.4, 9).len(), 4);
        assert_eq!(select_transfers(&slots, 0.99, 0), Vec::<usize>::new());
    }

    #[test]
    fn ties_in_confidence_prefer_the_lower_slot() {
        assert_eq!(
            by_confidence_desc(vec![(4, 0.5), (2, 0.5), (9, 0.7)]),
            vec![9, 2, 4]
        );
    }
}
