//! One sequence at a time over a runner's batch API: the CLI's `forward`, golden tests and
//! benchmarks drive a model this way. [`SingleSequence`] owns a runner and a table of sequences,
//! each a growing block table over pages of the runner's pool, and runs every forward as a batch
//! of one ([`ModelRunner::forward_batch`]): the same code path the engine batches. It owns every
//! page of its runner's pool, which is why a runner inside it cannot also be driven by a caller
//! that allocates pages of its own.

use std::collections::HashMap;
use std::ops::Range;

use crate::batch::{pages_for, PageId, Segment, SegmentOutput, Want};
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::runner::ModelRunner;

/// Handle of one sequence of a [`SingleSequence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Which rows of a single-sequence forward need logits. Prefill and commit-refresh forwards need
/// none, so they never pay for the lm_head; a denoising forward needs every row of its block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    None,
    All,
    /// Rows relative to the start of the forward's input.
    Range(Range<usize>),
}

impl LogitsRows {
    /// The concrete row range for an input of `n` tokens (an inverted range is empty).
    pub fn resolve(&self, n: usize) -> Range<usize> {
        match self {
            LogitsRows::None => 0..0,
            LogitsRows::All => 0..n,
            LogitsRows::Range(r) => {
                let end = r.end.min(n);
                r.start.min(end)..end
            }
        }
    }

    /// What a segment of `n` ids wants back: logits of these rows, or nothing.
    fn want(&self, n: usize) -> Want {
        let rows = self.resolve(n);
        if rows.is_empty() {
            Want::Nothing
        } else {
            Want::Logits(rows)
        }
    }
}

/// Sequences over the pages of one pool: each a block table and the number of positions whose
/// K/V are in it.
#[derive(Debug)]
struct SequenceTable {
    page_size: usize,
    free: Vec<PageId>,
    sequences: HashMap<SeqId, (Vec<PageId>, usize)>,
    next_id: u64,
}

impl SequenceTable {
    /// A table over pages `0..pages` (lower pages handed out first).
    fn new(pages: usize, page_size: usize) -> Self {
        SequenceTable {
            page_size,
            free: (0..pages as PageId).rev().collect(),
            sequences: HashMap::new(),
            next_id: 0,
        }
    }

    fn unknown(seq: SeqId) -> ModelError {
        ModelError::InvalidInput(format!("unknown sequence {}", seq.0))
    }

    fn get(&self, seq: SeqId) -> Result<&(Vec<PageId>, usize)> {
        self.sequences.get(&seq).ok_or_else(|| Self::unknown(seq))
    }

    /// Grows `seq`'s block table to cover positions `0..len`.
    fn reserve(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let (pages, _) = self
            .sequences
            .get_mut(&seq)
            .ok_or_else(|| Self::unknown(seq))?;
        while pages.len() < pages_for(len, self.page_size) {
            let page = self.free.pop().ok_or_else(|| {
                ModelError::InvalidInput(format!(
                    "the K/V pool is full: {len} positions do not fit (raise the K/V cache budget)"
                ))
            })?;
            pages.push(page);
        }
        Ok(())
    }

    fn create(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sequences.insert(id, (Vec::new(), 0));
        id
    }

    fn release(&mut self, seq: SeqId) {
        if let Some((pages, _)) = self.sequences.remove(&seq) {
            self.free.extend(pages.into_iter().rev());
        }
    }

    fn len(&self, seq: SeqId) -> usize {
        self.sequences.get(&seq).map_or(0, |(_, len)| *len)
    }

    fn set_len(&mut self, seq: SeqId, len: usize) {
        if let Some((_, held)) = self.sequences.get_mut(&seq) {
            *held = len;
        }
    }

    /// Keeps positions `0..len` (freeing whole pages beyond them).
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let current = self.get(seq)?.1;
        if len > current {
            return Err(ModelError::InvalidInput(format!(
                "cannot truncate sequence {} to {len}: it holds {current} positions",
                seq.0
            )));
        }
        let keep = pages_for(len, self.page_size);
        let (pages, held) = self.sequences.get_mut(&seq).expect("checked above");
        *held = len;
        let freed: Vec<PageId> = pages.drain(keep..).rev().collect();
        self.free.extend(freed);
        Ok(())
    }
}

/// A runner driven one sequence at a time (see the module docs). `R` may be `dyn ModelRunner`:
/// `&mut SingleSequence<CpuRunner>` coerces to `&mut SingleSequence<dyn ModelRunner>`.
pub struct SingleSequence<R: ModelRunner + ?Sized> {
    table: SequenceTable,
    runner: R,
}

impl<R: ModelRunner> SingleSequence<R> {
    /// Takes every page of `runner`'s pool.
    pub fn new(runner: R) -> Self {
        let table = SequenceTable::new(runner.kv_pages(), runner.config().block_size);
        SingleSequence { table, runner }
    }

    /// The runner back, its pages no longer owned by anyone.
    pub fn into_inner(self) -> R {
        self.runner
    }
}

/// The runner, for what it offers besides forwards (device name, pool size, ...); read-only, so
/// no forward can bypass the table.
impl<R: ModelRunner + ?Sized> std::ops::Deref for SingleSequence<R> {
    type Target = R;

    fn deref(&self) -> &R {
        &self.runner
    }
}

impl<R: ModelRunner + ?Sized> SingleSequence<R> {
    pub fn config(&self) -> &Config {
        self.runner.config()
    }

    /// The runner, mutably: for device settings (e.g. CUDA graphs). Forwards go through
    /// [`SingleSequence::forward_segment`], which keeps the pages consistent.
    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Starts an empty sequence (no cached positions).
    pub fn create_sequence(&mut self) -> SeqId {
        self.table.create()
    }

    /// Frees everything the sequence holds. Unknown ids are ignored.
    pub fn release_sequence(&mut self, seq: SeqId) {
        self.table.release(seq);
    }

    /// Number of positions whose K/V are cached (0 for unknown ids).
    pub fn sequence_len(&self, seq: SeqId) -> usize {
        self.table.len(seq)
    }

    /// Drops cached positions `len..`. `len` greater than the current length is an error.
    pub fn truncate_sequence(&mut self, seq: SeqId, len: usize) -> Result<()> {
        self.table.truncate(seq, len)
    }

    /// Runs `ids` at absolute positions `sequence_len(seq)..`, attending block-causally to the
    /// cached prefix and to themselves, keeps their K/V, and returns row-major F32 logits
    /// `[rows.len(), vocab]` for the requested rows.
    pub fn forward(&mut self, seq: SeqId, ids: &[u32], rows: LogitsRows) -> Result<Vec<f32>> {
        let want = rows.want(ids.len());
        let out = self.forward_one(seq, ids, want)?;
        Ok(out.into_logits().unwrap_or_default())
    }

    /// Like [`SingleSequence::forward`], but returns for each requested row only its argmax
    /// token (lowest id on ties) and that token's softmax probability.
    pub fn forward_top1(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        rows: LogitsRows,
    ) -> Result<Vec<(u32, f32)>> {
        let rows = rows.resolve(ids.len());
        let want = if rows.is_empty() {
            Want::Nothing
        } else {
            Want::Top1(rows)
        };
        let out = self.forward_one(seq, ids, want)?;
        Ok(out.into_top1().unwrap_or_default())
    }

    /// One segment of `seq` as a batch of one through [`ModelRunner::forward_batch`].
    pub fn forward_one(&mut self, seq: SeqId, ids: &[u32], want: Want) -> Result<SegmentOutput> {
        if ids.is_empty() {
            self.table.get(seq)?;
            return Ok(SegmentOutput::Nothing);
        }
        self.forward_segment(seq, ids, want, |runner, segment| {
            let out = runner.forward_batch(std::slice::from_ref(segment))?;
            Ok(out.into_iter().next().unwrap_or(SegmentOutput::Nothing))
        })
    }

    /// Grows `seq`'s block table to cover `ids`, hands `run` the segment of `ids` at positions
    /// `sequence_len(seq)..`, and on success advances the sequence past them. For forwards
    /// other than [`ModelRunner::forward_batch`] that a runner offers (traced, profiled).
    pub fn forward_segment<T>(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        want: Want,
        run: impl FnOnce(&mut R, &Segment<'_>) -> Result<T>,
    ) -> Result<T> {
        let start = self.table.len(seq);
        self.table.reserve(seq, start + ids.len())?;
        let segment = Segment {
            pages: &self.table.get(seq)?.0,
            start,
            ids,
            want,
        };
        let out = run(&mut self.runner, &segment)?;
        self.table.set_len(seq, start + ids.len());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_hands_out_low_pages_first_and_takes_freed_ones_back() {
        let mut t = SequenceTable::new(4, 2);
        let a = t.create();
        t.reserve(a, 3).unwrap();
        assert_eq!(t.get(a).unwrap().0, vec![0, 1]);
        t.set_len(a, 3);
        t.truncate(a, 2).unwrap();
        assert_eq!(t.get(a).unwrap(), &(vec![0], 2));
        assert!(t.truncate(a, 3).is_err(), "cannot grow by truncating");
        let b = t.create();
        t.reserve(b, 6).unwrap();
        assert_eq!(t.get(b).unwrap().0, vec![1, 2, 3]);
        assert!(t.reserve(a, 4).is_err(), "the pool is full");
        t.release(b);
        t.reserve(a, 4).unwrap();
        assert_eq!(t.get(a).unwrap().0, vec![0, 1]);
        assert_eq!(t.len(SeqId(99)), 0);
        assert!(t.get(SeqId(99)).is_err());
    }

    #[test]
    fn logits_rows_resolve_within_the_input() {
        assert_eq!(LogitsRows::All.resolve(3), 0..3);
        assert_eq!(LogitsRows::None.resolve(3), 0..0);
        assert_eq!(LogitsRows::Range(2..9).resolve(4), 2..4);
        assert_eq!(LogitsRows::Range(5..9).resolve(4), 4..4);
        assert_eq!(LogitsRows::None.want(3), Want::Nothing);
        assert_eq!(LogitsRows::Range(1..2).want(3), Want::Logits(1..2));
    }
}
