//! Block-diffusion decoding (decoding doc §1–§9), independent of text and of the engine's threads.
//!
//! Map of the module:
//! - [`params`]: per-request parameters resolved against the checkpoint family's defaults.
//! - [`layout`]: request layout (§1): prefill length, decode blocks, the token budget.
//! - [`low_confidence`], [`joint`], [`indel`]: the three algorithms (§5, §6, §7), each a
//!   [`BlockAlgorithm`] that only sees one block's ids and the scores of its forwards: full
//!   logits, or only each slot's greedy candidate when that is all a step needs ([`ScoreKind`]).
//! - [`block`]: the shared per-block loop (§3) and the K/V commit rule (§8).
//! - [`constrained`]: the grammar layer of the block loop (structured outputs, §13).
//! - [`stop_tokens`]: end-of-answer token ids and output assembly (§9).
//! - [`request`]: one request as a step-by-step state machine (prefill chunks, blocks, commit),
//!   so the engine can interleave several requests one forward at a time.

pub mod block;
pub mod constrained;
pub mod indel;
pub mod joint;
pub mod layout;
pub mod low_confidence;
pub mod params;
pub mod request;
pub mod stop_tokens;

/// The generated (non-prompt) slots of a block that hold MASK, in order. The prompt tail is a
/// prefix of `prompt_in_block` slots and is never a candidate, whatever ids it holds.
pub(crate) fn generated_masks(block: &[u32], prompt_in_block: usize, mask: u32) -> Vec<usize> {
    (prompt_in_block..block.len())
        .filter(|&p| block[p] == mask)
        .collect()
}

#[cfg(test)]
pub(crate) mod testing;

use std::borrow::Cow;
use std::cell::RefCell;

use minnow_model::batch::TOP_K;
use minnow_model::{DrawRule, ModelRunner, RowDraw, TopK, Want};
use rand::rngs::StdRng;

use crate::sampling::{
    greedy_excluding, Candidate, OfficialRow, OfficialSampler, RowSampler, SamplerSettings,
};

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
    /// The block slot of `data`'s first row: a forward may return only the rows from the first
    /// slot the step reads ([`BlockAlgorithm::rows_needed`]).
    pub first: usize,
}

impl<'a> BlockLogits<'a> {
    /// Every slot's rows, from slot 0.
    pub fn new(data: &'a [f32], vocab: usize) -> Self {
        Self::from_slot(data, vocab, 0)
    }

    /// Rows of the slots from `first` on.
    pub fn from_slot(data: &'a [f32], vocab: usize, first: usize) -> Self {
        debug_assert!(vocab > 0 && data.len().is_multiple_of(vocab));
        Self { data, vocab, first }
    }

    /// Logits of block slot `p` (predicting the token at that slot); panics, naming the slot,
    /// outside the rows returned.
    pub fn row(&self, p: usize) -> &'a [f32] {
        let r = returned_row(p, self.first, self.data.len() / self.vocab);
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
}

/// Which of a forward's `rows` returned rows, the first of them block slot `first`, holds slot
/// `p`; a slot outside them is a bug of the step that read it (it did not declare it in
/// [`BlockAlgorithm::rows_needed`]): panics, naming the slot.
fn returned_row(p: usize, first: usize, rows: usize) -> usize {
    p.checked_sub(first)
        .filter(|&r| r < rows)
        .unwrap_or_else(|| panic!("slot {p} is outside the rows the forward returned"))
}

/// Top-1 pairs of the slots from `first` on (see [`BlockLogits::first`]).
#[derive(Clone, Copy, Debug)]
pub struct Top1Rows<'a> {
    pub pairs: &'a [(u32, f32)],
    pub first: usize,
}

impl<'a> Top1Rows<'a> {
    /// Every slot's pair, from slot 0.
    pub fn new(pairs: &'a [(u32, f32)]) -> Self {
        Self { pairs, first: 0 }
    }

    /// Slot `p`'s (argmax, probability); panics, naming the slot, outside the rows returned.
    pub fn get(&self, p: usize) -> (u32, f32) {
        self.pairs[returned_row(p, self.first, self.pairs.len())]
    }
}

/// A forward's best ids ([`Want::TopK`]: each row's top-1 pair and its best ids with their
/// logits) for the block slots from `first` on (see [`BlockLogits::first`]).
#[derive(Clone, Copy, Debug)]
pub struct BestIds<'a> {
    pub top: &'a TopK,
    pub first: usize,
}

impl<'a> BestIds<'a> {
    /// Every slot's best ids, from slot 0.
    pub fn new(top: &'a TopK) -> Self {
        Self::from_slot(top, 0)
    }

    /// The best ids of the slots from `first` on.
    pub fn from_slot(top: &'a TopK, first: usize) -> Self {
        Self { top, first }
    }

    /// The block slots whose rows the forward returned.
    pub fn slots(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.top.rows()
    }

    /// Whether each row holds fewer ids than the whole vocabulary's `TOP_K` (so a sampler's
    /// filters may keep ids it does not hold).
    pub fn cut_short(&self) -> bool {
        self.top.k < TOP_K
    }

    /// Slot `p`'s best ids, largest logit first; panics, naming the slot, outside the rows
    /// returned.
    pub fn row(&self, p: usize) -> &'a [(u32, f32)] {
        self.top.row(returned_row(p, self.first, self.top.rows()))
    }

    /// Slot `p`'s (argmax, probability); panics, naming the slot, outside the rows returned.
    pub fn top1(&self, p: usize) -> (u32, f32) {
        self.top.top1[returned_row(p, self.first, self.top.rows())]
    }
}

/// What a denoising forward must return for the algorithm's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreKind {
    /// Every row's F32 logits (`ModelRunner::forward`): sampling, banned-token re-picks.
    Logits,
    /// Every row's greedy candidate only (`ModelRunner::forward_top1`): enough for a step whose
    /// candidates are all [`crate::sampling::greedy`], and far less to read back from a GPU.
    Top1,
    /// Every row's greedy candidate and its best ids with their logits (`Want::TopK`): what a
    /// greedy step under a grammar reads (docs/decoding.md §13.6); a row's full logits are read
    /// afterwards only where the grammar allows none of its best ids.
    TopK,
    /// What a sampling step reads: each row's best ids and the candidates the runner draws on
    /// its device ([`BlockAlgorithm::device_draws`]) where it can, full logits elsewhere.
    Sampled,
}

impl ScoreKind {
    /// The scores to ask the runner for, to answer a step that needs `self`. Full logits answer
    /// every kind, and they replace the best ids on a runner whose full logits are cheap
    /// (`ModelRunner::full_logits_cheap`, the CPU): its logits are already in host memory, so the
    /// best ids would cost a sort of every row on top of them, and a second read of each row
    /// whose best ids the grammar all refuses. Both decide the same tokens (docs/decoding.md
    /// §13.6).
    ///
    /// A sampling step ([`ScoreKind::Sampled`]) asks for best ids where the runner draws on its
    /// device (`ModelRunner::draws_rows`) and its full logits are not cheap, full logits
    /// otherwise.
    pub fn to_ask(self, full_logits_cheap: bool, draws_rows: bool) -> ScoreKind {
        match self {
            ScoreKind::TopK if full_logits_cheap => ScoreKind::Logits,
            ScoreKind::Sampled if draws_rows && !full_logits_cheap => ScoreKind::TopK,
            ScoreKind::Sampled => ScoreKind::Logits,
            kind => kind,
        }
    }

    /// What a forward of a block's `rows` wants back for this kind.
    pub fn want(self, rows: std::ops::Range<usize>) -> Want {
        match self {
            ScoreKind::Logits | ScoreKind::Sampled => Want::Logits(rows),
            ScoreKind::Top1 => Want::Top1(rows),
            ScoreKind::TopK => Want::TopK(rows),
        }
    }
}

/// The scores one denoising forward produced for the block, in the form [`ScoreKind`] asked for.
#[derive(Clone, Copy, Debug)]
pub enum StepScores<'a> {
    Logits(BlockLogits<'a>),
    /// Per slot `(argmax token, its full-vocabulary softmax probability)`.
    Top1(Top1Rows<'a>),
    /// Per slot the top-1 pair and the best ids.
    TopK(BestIds<'a>),
    /// Best ids and the candidates the runner drew on its device.
    Drawn(DrawnScores<'a>),
}

/// A sampling step's scores where the runner drew its candidates ([`ModelRunner::draw_rows`]):
/// each row's best ids and top-1 pair, the drawn candidate of each slot that drew one, and the
/// rows in full on demand (a 2.2 re-pick with banned ids reads its row).
#[derive(Clone, Copy)]
pub struct DrawnScores<'a> {
    pub top: BestIds<'a>,
    /// Per block slot.
    pub candidates: &'a [Option<Candidate>],
    pub rows: &'a dyn LazyRows,
}

impl std::fmt::Debug for DrawnScores<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrawnScores")
            .field("top", &self.top)
            .field("candidates", &self.candidates)
            .finish_non_exhaustive()
    }
}

/// A forward's rows read in full when a step asks (`None` when the read failed; the reader keeps
/// the reason).
pub trait LazyRows {
    fn row(&self, p: usize) -> Option<Vec<f32>>;
    /// One logit of slot `p`'s row.
    fn logit(&self, p: usize, token: u32) -> Option<f32> {
        self.row(p).and_then(|row| row.get(token as usize).copied())
    }
}

/// What a step may read from its forward beyond the scores it got: a row in full
/// (`ModelRunner::logits_row`; the runner keeps a forward's rows until its next one), and
/// sampled candidates drawn on the runner's device (`ModelRunner::draw_rows`).
pub trait ForwardRows {
    fn row(&mut self, p: usize) -> Result<Vec<f32>, String>;
    /// Whether [`ForwardRows::draw`] answers.
    fn draws(&self) -> bool {
        false
    }
    fn draw(&mut self, _draws: &[RowDraw]) -> Result<Vec<(u32, f32)>, String> {
        Err("no device draws after this forward".into())
    }
}

/// A closure reading rows (tests, and forwards whose rows are all that can be read).
impl<F: FnMut(usize) -> Result<Vec<f32>, String>> ForwardRows for F {
    fn row(&mut self, p: usize) -> Result<Vec<f32>, String> {
        self(p)
    }
}

/// Reads the full F32 logits of a block slot, and draws on the device, from the forward whose
/// [`StepScores::TopK`] a step reads.
pub type ReadRow<'a> = dyn ForwardRows + 'a;

/// Segment `segment` of a runner's latest forward.
pub struct RunnerRows<'a> {
    pub runner: &'a mut dyn ModelRunner,
    pub segment: usize,
    /// The segment's device draws when the engine drew every segment's in one call
    /// ([`block::BlockRun::take_device_draws`]); `None`: a step's draws go to the runner.
    pub drawn: Option<Result<&'a [(u32, f32)], &'a str>>,
}

impl<'a> RunnerRows<'a> {
    pub fn new(runner: &'a mut dyn ModelRunner, segment: usize) -> Self {
        Self {
            runner,
            segment,
            drawn: None,
        }
    }
}

impl ForwardRows for RunnerRows<'_> {
    fn row(&mut self, p: usize) -> Result<Vec<f32>, String> {
        self.runner
            .logits_row(self.segment, p)
            .map_err(|e| e.to_string())
    }

    fn draws(&self) -> bool {
        self.runner.draws_rows()
    }

    fn draw(&mut self, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>, String> {
        match self.drawn {
            Some(Ok(pairs)) if pairs.len() == draws.len() => Ok(pairs.to_vec()),
            Some(Ok(pairs)) => Err(format!(
                "{} candidates drawn ahead for {} rows",
                pairs.len(),
                draws.len()
            )),
            Some(Err(e)) => Err(e.to_string()),
            None => {
                let draws: Vec<RowDraw> = draws
                    .iter()
                    .map(|d| RowDraw {
                        segment: self.segment,
                        ..*d
                    })
                    .collect();
                self.runner.draw_rows(&draws).map_err(|e| e.to_string())
            }
        }
    }
}

/// The rows of a block that starts `offset` rows into its forward's segment (a commit merged
/// into the next block's first forward: the final ids of the block before come first): slot
/// `p` is the segment's row `offset + p`, for reads and for draws.
pub struct OffsetRows<'a, 'r> {
    pub inner: &'a mut ReadRow<'r>,
    pub offset: usize,
}

impl ForwardRows for OffsetRows<'_, '_> {
    fn row(&mut self, p: usize) -> Result<Vec<f32>, String> {
        self.inner.row(self.offset + p)
    }

    fn draws(&self) -> bool {
        self.inner.draws()
    }

    fn draw(&mut self, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>, String> {
        let shifted: Vec<RowDraw> = draws
            .iter()
            .map(|d| RowDraw {
                row: d.row + self.offset,
                ..*d
            })
            .collect();
        self.inner.draw(&shifted)
    }
}

/// [`LazyRows`] over a [`ForwardRows`], remembering the first failed read and the last row read:
/// a 2.2 re-pick draws from its slot's row and then asks one logit of it for the confidence,
/// which the kept row answers without a second read from the forward.
pub struct RowReader<'r> {
    reader: RefCell<&'r mut ReadRow<'r>>,
    failure: RefCell<Option<String>>,
    last: RefCell<Option<(usize, Vec<f32>)>>,
}

impl<'r> RowReader<'r> {
    pub fn new(reader: &'r mut ReadRow<'r>) -> Self {
        Self {
            reader: RefCell::new(reader),
            failure: RefCell::new(None),
            last: RefCell::new(None),
        }
    }

    /// Slot `p`'s row, kept as the last one read, then `f` of it.
    fn with_row<T>(&self, p: usize, f: impl FnOnce(&[f32]) -> T) -> Option<T> {
        let mut last = self.last.borrow_mut();
        if last.as_ref().is_none_or(|(q, _)| *q != p) {
            match self.reader.borrow_mut().row(p) {
                Ok(row) => *last = Some((p, row)),
                Err(e) => {
                    self.failure.borrow_mut().get_or_insert(e);
                    return None;
                }
            }
        }
        last.as_ref().map(|(_, row)| f(row))
    }

    /// Why a read failed, if one did.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }
}

impl LazyRows for RowReader<'_> {
    fn row(&self, p: usize) -> Option<Vec<f32>> {
        self.with_row(p, <[f32]>::to_vec)
    }

    fn logit(&self, p: usize, token: u32) -> Option<f32> {
        self.with_row(p, |row| row.get(token as usize).copied())
            .flatten()
    }
}

/// The rows a sampling step draws from and how ([`BlockAlgorithm::device_draws`]): the slots in
/// the order the step draws them, each taking one uniform from the request's generator when the
/// temperature is above 0 (as the host samplers take theirs).
#[derive(Clone, Debug, PartialEq)]
pub struct DrawPlan {
    pub rule: DrawRule,
    pub settings: SamplerSettings,
    pub slots: Vec<usize>,
}

impl DrawPlan {
    /// The runner's draws, taking their uniforms from `rng` in slot order (segment 0: whoever
    /// hands them to the runner sets the segment).
    pub fn draws(&self, rng: &mut StdRng) -> Vec<RowDraw> {
        use rand::Rng;
        let s = self.settings;
        self.slots
            .iter()
            .map(|&row| RowDraw {
                segment: 0,
                row,
                rule: self.rule,
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
                uniform: if s.temperature > 0.0 { rng.gen() } else { 0.0 },
            })
            .collect()
    }
}

impl<'a> StepScores<'a> {
    /// The official 2.0/2.1 sampler's candidate at slot `p`. Top-1 scores only answer a greedy
    /// sampler, which is why an algorithm asks for [`ScoreKind::Top1`] only when its sampler
    /// [`is_greedy`](crate::sampling::SamplerSettings::is_greedy).
    pub fn official_candidate(
        &self,
        p: usize,
        sampler: &OfficialSampler,
        rng: &mut StdRng,
    ) -> Candidate {
        match self {
            StepScores::Logits(logits) => sampler.candidate(logits.row(p), rng),
            StepScores::Top1(pairs) => {
                assert!(
                    sampler.0.is_greedy(),
                    "top-1 scores cannot answer a sampling step"
                );
                let (token, confidence) = pairs.get(p);
                Candidate { token, confidence }
            }
            StepScores::TopK(top) if sampler.0.is_greedy() => {
                let (token, confidence) = top.top1(p);
                Candidate { token, confidence }
            }
            StepScores::Drawn(drawn) => drawn.candidates[p]
                .expect("the step drew a candidate at every slot it reads one from"),
            StepScores::TopK(_) => {
                let row = self
                    .official_from_best(p, sampler)
                    .expect("the step's best ids were checked to answer its sampler");
                sampler.draw(&row, &[], rng)
            }
        }
    }

    /// Slot `p`'s distribution under a sampling official sampler from the row's best ids, if
    /// they hold every id its filters keep ([`OfficialSampler::prepare_best`]); `None` from
    /// other scores.
    pub fn official_from_best(&self, p: usize, sampler: &OfficialSampler) -> Option<OfficialRow> {
        match self {
            StepScores::TopK(top) => sampler.prepare_best(top.row(p), top.cut_short()),
            _ => None,
        }
    }

    /// The official sampler's candidates at slots `positions`, in that order: the same
    /// candidates and draws as [`StepScores::official_candidate`] slot after slot, with the rows'
    /// filtering and weighting (a pass or more over each row's vocabulary) on the thread pool.
    pub fn official_candidates(
        &self,
        positions: &[usize],
        sampler: &OfficialSampler,
        rng: &mut StdRng,
    ) -> Vec<Candidate> {
        match self {
            StepScores::Logits(logits) if !sampler.0.is_greedy() => {
                let rows: Vec<&[f32]> = positions.iter().map(|&p| logits.row(p)).collect();
                crate::sampling::candidates(sampler, &rows, rng)
            }
            _ => positions
                .iter()
                .map(|&p| self.official_candidate(p, sampler, rng))
                .collect(),
        }
    }

    /// The greedy token of slot `p` among the ids not `banned` (lowest id on ties): what
    /// [`greedy_excluding`] picks from the row. From the best ids it is the first one not
    /// banned, the same id (`Want::TopK` orders ties by id, and returns more ids than there are
    /// control ids, or the whole row).
    pub fn best_excluding(&self, p: usize, banned: &[u32]) -> u32 {
        match self {
            StepScores::Logits(logits) => greedy_excluding(logits.row(p), banned).token,
            StepScores::TopK(top) | StepScores::Drawn(DrawnScores { top, .. }) => top
                .row(p)
                .iter()
                .find(|(id, _)| !banned.contains(id))
                .map_or(0, |&(id, _)| id),
            StepScores::Top1(_) => panic!("this step needs more than top-1 scores"),
        }
    }

    /// Slot `p`'s greedy candidate ([`crate::sampling::greedy`]): the argmax and its probability
    /// over the full vocabulary, from any kind of scores.
    pub fn greedy(&self, p: usize) -> Candidate {
        let (token, confidence) = match self {
            StepScores::Logits(logits) => minnow_model::runner::top1(logits.row(p)),
            StepScores::Top1(pairs) => pairs.get(p),
            StepScores::TopK(top) | StepScores::Drawn(DrawnScores { top, .. }) => top.top1(p),
        };
        Candidate { token, confidence }
    }

    /// The probability of `token` at slot `p` under the full softmax, computed as
    /// `exp(z_token - z_max)` times the argmax's probability ([`StepScores::greedy`]): the same
    /// bits from full logits and from the best ids (where `token` must be one of them; a token
    /// that is not, which no caller asks for, gets 0), and after device draws (a token outside
    /// the best ids reads its row). Not from top-1 pairs.
    pub fn full_probability(&self, p: usize, token: u32) -> f32 {
        let (logit, max, top1) = match self {
            StepScores::Logits(logits) => {
                let row = logits.row(p);
                let (best, top1) = minnow_model::runner::top1(row);
                (row.get(token as usize).copied(), row[best as usize], top1)
            }
            StepScores::TopK(top) => {
                let row = top.row(p);
                let logit = row.iter().find(|(id, _)| *id == token).map(|&(_, z)| z);
                // The best ids come largest first: the first is the argmax.
                (logit, row.first().map_or(0.0, |&(_, z)| z), top.top1(p).1)
            }
            StepScores::Drawn(DrawnScores { top, rows, .. }) => {
                // A drawn token need not be a best id: its logit then comes from the row.
                let best = top.row(p);
                let logit = best
                    .iter()
                    .find(|(id, _)| *id == token)
                    .map(|&(_, z)| z)
                    .or_else(|| rows.logit(p, token));
                (logit, best.first().map_or(0.0, |&(_, z)| z), top.top1(p).1)
            }
            StepScores::Top1(_) => panic!("top-1 pairs hold no other token's probability"),
        };
        logit.map_or(0.0, |z| (z - max).exp() * top1)
    }

    /// The full logits, for steps that asked for [`ScoreKind::Logits`] (samplers, re-picks with
    /// banned ids). Getting top-1 scores here means the block loop ignored
    /// [`BlockAlgorithm::scores_needed`], a bug.
    pub fn logits(&self) -> BlockLogits<'a> {
        match self {
            StepScores::Logits(logits) => *logits,
            StepScores::Top1(_) | StepScores::TopK(_) | StepScores::Drawn(_) => {
                panic!("this step needs full logits but got top-1 or top-k scores")
            }
        }
    }

    /// Slot `p`'s full logits: from full logits, or read from the forward after device draws;
    /// `None` when that read failed (the block loop fails the request) or from other scores.
    pub fn full_row(&self, p: usize) -> Option<Cow<'a, [f32]>> {
        match self {
            StepScores::Logits(logits) => Some(Cow::Borrowed(logits.row(p))),
            StepScores::Drawn(drawn) => drawn.rows.row(p).map(Cow::Owned),
            StepScores::Top1(_) | StepScores::TopK(_) => None,
        }
    }

    /// The candidate drawn on the device at slot `p`, if the step's scores hold one.
    pub fn drawn(&self, p: usize) -> Option<Candidate> {
        match self {
            StepScores::Drawn(drawn) => drawn.candidates.get(p).copied().flatten(),
            _ => None,
        }
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

    /// What the next forward must return for `step` (asked right before each forward; `forced`
    /// as in `step`). Full logits unless the algorithm overrides it.
    fn scores_needed(&self, _forced: bool) -> ScoreKind {
        ScoreKind::Logits
    }

    /// The slots of `block` whose scores the next (unforced) `step` reads, as one range: a
    /// forward may return only these rows, which saves the lm_head of the others where it runs
    /// per row (the CPU). Every slot unless the algorithm overrides it.
    fn rows_needed(&self, block: &[u32]) -> std::ops::Range<usize> {
        0..block.len()
    }

    /// Applies one forward's scores (of the kind `scores_needed` asked for) to `block` (which is
    /// the forward's input). With `forced` the step is the forced final cleanup (hard limit or
    /// leftover masks): it must leave no MASK, DELETE or SPLIT at generated positions.
    fn step(
        &mut self,
        block: &mut Vec<u32>,
        scores: StepScores<'_>,
        rng: &mut StdRng,
        forced: bool,
    ) -> StepOutcome;

    /// Forwards after which the block loop forces a final cleanup round.
    fn forward_limit(&self) -> usize;

    /// Whether the step draws from its rows (temperature above 0 or filters): a grammar then
    /// needs full logits to draw among the ids it allows.
    fn samples(&self) -> bool;

    /// Whether best ids the step asked for ([`ScoreKind::TopK`]) answer it; if not, the block
    /// loop reads the rows in full and hands the step full logits instead.
    fn best_ids_answer(&self, _top: BestIds<'_>) -> bool {
        true
    }

    /// The rows a sampling step of `block` draws its candidates from, where the runner draws
    /// them on its device instead of the step drawing from full logits ([`ScoreKind::Sampled`]).
    /// `None`: the step does not sample.
    fn device_draws(&self, _block: &[u32]) -> Option<DrawPlan> {
        None
    }
}

/// Whether a generated slot of the block still holds a control id (MASK, DELETE, SPLIT).
pub fn has_control_tokens(block: &[u32], prompt_in_block: usize, control: &ControlTokens) -> bool {
    block[prompt_in_block..]
        .iter()
        .any(|&t| control.is_control(t))
}

/// What 2.0 and 2.1 read from a forward: top-1 pairs when every candidate of the step is greedy,
/// each row's best ids when the sampler's top-k keeps fewer ids than they hold (the filters'
/// survivors are then almost always among them; a step whose rows they do not answer reads the
/// rows in full, [`BlockAlgorithm::best_ids_answer`]), full logits otherwise.
///
/// The forced cleanup ([`fill_control_slots`]) always reads full logits: its rule, the best
/// non-control token, needs more than the argmax exactly when the argmax is a control id, and
/// a block reaches that round mostly because the model keeps predicting a control id somewhere.
/// Reading top-1 first would then cost a second forward of the same ids (the runner cannot
/// re-read a finished forward's logits); the round runs at most once per block, so one
/// full-logits forward is both the simpler and the cheaper rule.
pub fn official_scores_needed(sampler: &OfficialSampler, forced: bool) -> ScoreKind {
    if forced {
        ScoreKind::Logits
    } else if sampler.0.is_greedy() {
        ScoreKind::Top1
    } else if sampler.reads_best_ids(TOP_K) {
        ScoreKind::TopK
    } else {
        ScoreKind::Sampled
    }
}

/// The device draws of a sampling 2.0/2.1 step at `slots` (`None` for a greedy sampler).
pub fn official_device_draws(sampler: &OfficialSampler, slots: Vec<usize>) -> Option<DrawPlan> {
    (!sampler.0.is_greedy()).then_some(DrawPlan {
        rule: DrawRule::Official,
        settings: sampler.0,
        slots,
    })
}

/// Whether a step's best ids answer the official sampler at every row returned (2.0 and 2.1's
/// [`BlockAlgorithm::best_ids_answer`]): always when it is greedy (it reads the top-1 pairs),
/// else when each row's best ids hold its filters' survivors.
pub fn official_best_ids_answer(sampler: &OfficialSampler, top: BestIds<'_>) -> bool {
    sampler.0.is_greedy()
        || top
            .slots()
            .all(|p| sampler.best_ids_answer(top.row(p), top.cut_short()))
}

/// The forced cleanup shared by 2.0 and 2.1 (they have no cleanup round of their own): every
/// generated slot that holds a control id gets its best non-control token (from full logits, or
/// from the best ids a constrained greedy step reads).
pub fn fill_control_slots(
    block: &mut [u32],
    prompt_in_block: usize,
    scores: StepScores<'_>,
    control: &ControlTokens,
) {
    let banned = control.all();
    for (p, token) in block.iter_mut().enumerate().skip(prompt_in_block) {
        if control.is_control(*token) {
            *token = scores.best_excluding(p, &banned);
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
    fn scores_from_a_later_slot_answer_their_slots_and_refuse_the_others() {
        let data = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let logits = BlockLogits::from_slot(&data, 2, 3);
        assert_eq!(logits.row(3), &[0.0, 1.0]);
        assert_eq!(logits.row(5), &[4.0, 5.0]);
        let pairs = [(7, 0.5), (8, 0.25)];
        let top1 = Top1Rows {
            pairs: &pairs,
            first: 1,
        };
        assert_eq!(top1.get(2), (8, 0.25));
        for p in [0, 6] {
            let read = std::panic::catch_unwind(|| logits.row(p));
            assert!(read.is_err(), "slot {p} read a row it was not given");
        }
        assert!(std::panic::catch_unwind(|| top1.get(0)).is_err());
        assert!(std::panic::catch_unwind(|| top1.get(3)).is_err());
        // Best ids of slots 2 and 3 (two ids a row).
        let top = TopK {
            k: 2,
            entries: vec![(4, 3.0), (1, 2.0), (6, 1.5), (0, 1.0)],
            top1: vec![(4, 0.6), (6, 0.4)],
        };
        let best = BestIds::from_slot(&top, 2);
        assert_eq!(best.slots(), 2..4);
        assert_eq!(best.row(3), &[(6, 1.5), (0, 1.0)]);
        assert_eq!(best.top1(2), (4, 0.6));
        for p in [1, 4] {
            assert!(std::panic::catch_unwind(|| best.row(p)).is_err());
            assert!(std::panic::catch_unwind(|| best.top1(p)).is_err());
        }
    }

    #[test]
    fn a_row_read_once_answers_its_logits_and_another_slot_reads_again() {
        let mut reads = 0usize;
        let mut forward = |p: usize| -> Result<Vec<f32>, String> {
            reads += 1;
            if p == 9 {
                return Err("slot 9 cannot be read".into());
            }
            Ok((0..5).map(|i| (10 * p + i) as f32).collect())
        };
        {
            let reader = RowReader::new(&mut forward);
            assert_eq!(reader.row(3), Some(vec![30.0, 31.0, 32.0, 33.0, 34.0]));
            assert_eq!(reader.logit(3, 4), Some(34.0));
            assert_eq!(reader.logit(3, 7), None, "an id past the row has no logit");
            assert_eq!(reader.logit(2, 1), Some(21.0));
            assert_eq!(reader.row(2).map(|r| r[0]), Some(20.0));
            assert_eq!(reader.logit(9, 0), None);
            assert_eq!(reader.failure().as_deref(), Some("slot 9 cannot be read"));
        }
        assert_eq!(reads, 3, "slots 3, 2 and 9, each read once");
    }

    use crate::decode::testing::{full_scores, logits_for, top1_pairs, M};
    use crate::sampling::SamplerSettings;

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
    fn official_algorithms_read_top1_only_for_unforced_greedy_steps() {
        let greedy = OfficialSampler(SamplerSettings::GREEDY);
        let sampling = OfficialSampler(SamplerSettings {
            temperature: 0.8,
            ..SamplerSettings::GREEDY
        });
        assert_eq!(official_scores_needed(&greedy, false), ScoreKind::Top1);
        assert_eq!(official_scores_needed(&greedy, true), ScoreKind::Logits);
        assert_eq!(official_scores_needed(&sampling, false), ScoreKind::Sampled);
    }

    #[test]
    fn sampling_steps_ask_for_best_ids_only_where_the_runner_draws_and_logits_are_not_cheap() {
        use ScoreKind::*;
        // (kind, full logits cheap, runner draws) -> asked
        for (kind, cheap, draws, asked) in [
            (Sampled, false, true, TopK),
            (Sampled, false, false, Logits),
            (Sampled, true, true, Logits),
            (Sampled, true, false, Logits),
            (TopK, true, true, Logits),
            (TopK, false, false, TopK),
            (Top1, true, true, Top1),
            (Logits, false, true, Logits),
        ] {
            assert_eq!(kind.to_ask(cheap, draws), asked, "{kind:?} {cheap} {draws}");
        }
        assert_eq!(Sampled.want(0..3), Want::Logits(0..3));
    }

    #[test]
    fn a_draw_plan_takes_one_uniform_per_slot_in_order_and_none_at_temperature_zero() {
        use rand::{Rng, SeedableRng};
        let plan = |temperature| DrawPlan {
            rule: DrawRule::Official,
            settings: SamplerSettings {
                temperature,
                top_k: 0,
                top_p: 0.9,
            },
            slots: vec![4, 9, 2],
        };
        let mut rng = StdRng::seed_from_u64(8);
        let mut twin = rng.clone();
        let draws = plan(0.7).draws(&mut rng);
        assert_eq!(draws.iter().map(|d| d.row).collect::<Vec<_>>(), [4, 9, 2]);
        for d in &draws {
            assert_eq!(d.uniform, twin.gen::<f64>());
            assert_eq!((d.temperature, d.top_k, d.top_p), (0.7, 0, 0.9));
        }
        // At temperature 0 the rule draws nothing, so the generator is left as it was.
        let draws = plan(0.0).draws(&mut rng);
        assert!(draws.iter().all(|d| d.uniform == 0.0));
        assert_eq!(rng.gen::<u64>(), twin.gen::<u64>());
    }

    #[test]
    fn top1_scores_give_the_greedy_candidate_of_the_logits() {
        let logits = logits_for(&[(3, 0.9), (M, 0.6), (0, 0.2)]);
        let pairs = top1_pairs(&logits);
        let greedy = OfficialSampler(SamplerSettings::GREEDY);
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(0);
        for p in 0..3 {
            let from_logits = full_scores(&logits).official_candidate(p, &greedy, &mut rng);
            let from_top1 =
                StepScores::Top1(Top1Rows::new(&pairs)).official_candidate(p, &greedy, &mut rng);
            assert_eq!(from_top1, from_logits);
        }
        assert_eq!(pairs[1].0, M);
    }

    /// The forced cleanup's pick from a row's best ids is the one from its full logits.
    #[test]
    fn best_non_control_ids_from_the_best_ids_match_the_full_rows() {
        use rand::Rng;
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(3);
        let banned = [M, 8, 9];
        for _ in 0..200 {
            // Ten ids, three of them banned, many ties: the best-id lists hold the whole row.
            let logits: Vec<f32> = (0..3 * crate::decode::testing::VOCAB)
                .map(|_| rng.gen_range(-3i32..3) as f32)
                .collect();
            let top = minnow_model::runner::top_k_of_rows(&logits, crate::decode::testing::VOCAB);
            let full = full_scores(&logits);
            for p in 0..3 {
                assert_eq!(
                    StepScores::TopK(BestIds::new(&top)).best_excluding(p, &banned),
                    full.best_excluding(p, &banned)
                );
                let greedy = OfficialSampler(SamplerSettings::GREEDY);
                assert_eq!(
                    StepScores::TopK(BestIds::new(&top)).official_candidate(p, &greedy, &mut rng),
                    full.official_candidate(p, &greedy, &mut rng)
                );
            }
        }
    }

    /// The indel step's replacement of a MASK argmax reads the full-softmax probability of a
    /// best id: the same bits from the best ids as from the full row, and the probability the
    /// row gives it.
    #[test]
    fn full_probabilities_of_best_ids_are_the_same_bits_from_full_rows() {
        use rand::Rng;
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(5);
        for vocab in [crate::decode::testing::VOCAB, 300] {
            for _ in 0..50 {
                let logits: Vec<f32> = (0..4 * vocab).map(|_| rng.gen_range(-6.0..6.0)).collect();
                let top = minnow_model::runner::top_k_of_rows(&logits, vocab);
                let full = StepScores::Logits(BlockLogits::new(&logits, vocab));
                for p in 0..4 {
                    assert_eq!(
                        StepScores::TopK(BestIds::new(&top)).greedy(p),
                        full.greedy(p)
                    );
                    for &(id, _) in &top.row(p)[..top.k.min(8)] {
                        let from_best =
                            StepScores::TopK(BestIds::new(&top)).full_probability(p, id);
                        assert_eq!(from_best.to_bits(), full.full_probability(p, id).to_bits());
                        let row = &logits[p * vocab..(p + 1) * vocab];
                        let exact = crate::sampling::probability_excluding(row, id, &[]);
                        assert!(
                            (from_best - exact).abs() <= exact * 1e-6,
                            "{from_best} {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ties_in_confidence_prefer_the_lower_slot() {
        assert_eq!(
            by_confidence_desc(vec![(4, 0.5), (2, 0.5), (9, 0.7)]),
            vec![9, 2, 4]
        );
    }
}
