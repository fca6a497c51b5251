//! The device-independent interface every forward implementation offers to the engine.
//!
//! A runner owns the weights and a K/V pool of fixed-size pages (one page per block), and runs
//! whatever batch it is given ([`ModelRunner::forward_batch`]): who owns which page is decided by
//! the caller. For programs that drive one sequence at a time (the CLI's `forward`, golden tests,
//! benchmarks) the provided single-sequence methods wrap the batched forward over a
//! [`SequenceTable`] of the runner's own; they are the same code path with a batch of one. Do not
//! mix the two on one runner: the table assumes it owns every page.

use std::collections::HashMap;
use std::ops::Range;

use crate::batch::{pages_for, PageId, Segment, SegmentOutput, Want};
use crate::error::{ModelError, Result};

/// Handle of one sequence of a runner's [`SequenceTable`].
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
}

/// Sequences of the single-sequence convenience API: each a growing block table over pages taken
/// from the pool's free list, and the number of positions whose K/V are in it.
#[derive(Debug, Default)]
pub struct SequenceTable {
    free: Vec<PageId>,
    sequences: HashMap<SeqId, (Vec<PageId>, usize)>,
    next_id: u64,
}

impl SequenceTable {
    /// A table over pages `0..pages` (lower pages handed out first).
    pub fn new(pages: usize) -> Self {
        SequenceTable {
            free: (0..pages as PageId).rev().collect(),
            sequences: HashMap::new(),
            next_id: 0,
        }
    }

    pub(crate) fn get(&self, seq: SeqId) -> Result<&(Vec<PageId>, usize)> {
        self.sequences
            .get(&seq)
            .ok_or_else(|| ModelError::InvalidInput(format!("unknown sequence {}", seq.0)))
    }

    /// Grows `seq`'s block table to cover positions `0..len`.
    pub(crate) fn reserve(&mut self, seq: SeqId, len: usize, page_size: usize) -> Result<()> {
        let (pages, _) = self
            .sequences
            .get_mut(&seq)
            .ok_or_else(|| ModelError::InvalidInput(format!("unknown sequence {}", seq.0)))?;
        while pages.len() < pages_for(len, page_size) {
            let page = self.free.pop().ok_or_else(|| {
                ModelError::InvalidInput(format!(
                    "the K/V pool is full: {len} positions do not fit (raise the K/V cache budget)"
                ))
            })?;
            pages.push(page);
        }
        Ok(())
    }
}

impl SequenceTable {
    /// Records that `seq` now holds `len` positions (after a forward filled them).
    pub(crate) fn set_len(&mut self, seq: SeqId, len: usize) {
        if let Some((_, held)) = self.sequences.get_mut(&seq) {
            *held = len;
        }
    }

    /// A new empty sequence.
    pub fn create(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sequences.insert(id, (Vec::new(), 0));
        id
    }

    /// Frees the sequence's pages. Unknown ids are ignored.
    pub fn release(&mut self, seq: SeqId) {
        if let Some((pages, _)) = self.sequences.remove(&seq) {
            self.free.extend(pages.into_iter().rev());
        }
    }

    /// Positions whose K/V the sequence holds (0 for unknown ids).
    pub fn len(&self, seq: SeqId) -> usize {
        self.sequences.get(&seq).map_or(0, |(_, len)| *len)
    }

    /// Keeps positions `0..len` (freeing whole pages beyond them).
    pub fn truncate(&mut self, seq: SeqId, len: usize, page_size: usize) -> Result<()> {
        let current = self.get(seq)?.1;
        if len > current {
            return Err(ModelError::InvalidInput(format!(
                "cannot truncate sequence {} to {len}: it holds {current} positions",
                seq.0
            )));
        }
        let (pages, held) = self.sequences.get_mut(&seq).expect("checked above");
        *held = len;
        let keep = pages_for(len, page_size);
        let freed: Vec<PageId> = pages.drain(keep..).rev().collect();
        self.free.extend(freed);
        Ok(())
    }
}

/// A LLaDA2 forward implementation (CPU reference or CUDA) with the K/V pool it owns.
pub trait ModelRunner: Send {
    /// The parsed checkpoint configuration.
    fn config(&self) -> &crate::config::Config;
    /// A short human-readable description of the device, e.g. "cpu (2 threads, f32)".
    fn device_name(&self) -> String;
    /// Pages in the K/V pool (page size = the checkpoint's block size).
    fn kv_pages(&self) -> usize;
    /// Bytes of one page in the pool's storage type.
    fn kv_page_bytes(&self) -> usize;
    /// Runs every segment of the batch in one forward (validated by [`crate::batch::validate`]
    /// first): the weights are read once for all rows; positions, attention and 2.2 block
    /// routing stay per segment. Returns one output per segment, in order.
    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>>;

    /// The table behind the single-sequence methods.
    fn sequence_table(&mut self) -> &mut SequenceTable;
    /// Read-only view of the same table.
    fn sequence_table_ref(&self) -> &SequenceTable;

    /// Starts an empty sequence (no cached positions).
    fn create_sequence(&mut self) -> Result<SeqId> {
        Ok(self.sequence_table().create())
    }

    /// Frees everything the sequence holds. Unknown ids are ignored.
    fn release_sequence(&mut self, seq: SeqId) {
        self.sequence_table().release(seq);
    }

    /// Number of positions whose K/V are cached.
    fn sequence_len(&self, seq: SeqId) -> usize {
        self.sequence_table_ref().len(seq)
    }

    /// Drops cached positions `len..`. `len` greater than the current length is an error.
    fn truncate_sequence(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let page_size = self.config().block_size;
        self.sequence_table().truncate(seq, len, page_size)
    }

    /// Runs `ids` at absolute positions `sequence_len(seq)..` as a batch of one, attending
    /// block-causally to the cached prefix and to themselves, keeps their K/V, and returns
    /// row-major F32 logits `[rows.len(), vocab]` for the requested rows.
    fn forward(&mut self, seq: SeqId, ids: &[u32], rows: LogitsRows) -> Result<Vec<f32>> {
        let rows = rows.resolve(ids.len());
        let want = if rows.is_empty() {
            Want::Nothing
        } else {
            Want::Logits(rows)
        };
        let out = self.forward_one(seq, ids, want)?;
        Ok(out.into_logits().unwrap_or_default())
    }

    /// Like [`ModelRunner::forward`], but returns for each requested row only its argmax token
    /// (lowest id on ties) and that token's softmax probability.
    fn forward_top1(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        rows: LogitsRows,
    ) -> Result<Vec<(u32, f32)>> {
        let rows = rows.resolve(ids.len());
        if rows.is_empty() {
            self.forward_one(seq, ids, Want::Nothing)?;
            return Ok(Vec::new());
        }
        let out = self.forward_one(seq, ids, Want::Top1(rows))?;
        Ok(out.into_top1().unwrap_or_default())
    }

    /// One segment of a sequence of the table: grows its block table, runs the batch of one,
    /// and advances its length.
    fn forward_one(&mut self, seq: SeqId, ids: &[u32], want: Want) -> Result<SegmentOutput> {
        let page_size = self.config().block_size;
        let start = self.sequence_len(seq);
        self.sequence_table_ref().get(seq)?;
        if ids.is_empty() {
            return Ok(SegmentOutput::Nothing);
        }
        self.sequence_table()
            .reserve(seq, start + ids.len(), page_size)?;
        let pages = self.sequence_table_ref().get(seq)?.0.clone();
        let segment = Segment {
            pages: &pages,
            start,
            ids,
            want,
        };
        let out = self.forward_batch(std::slice::from_ref(&segment))?;
        self.sequence_table().set_len(seq, start + ids.len());
        Ok(out.into_iter().next().unwrap_or(SegmentOutput::Nothing))
    }
}

/// Argmax (lowest index on ties) of a logits row and its softmax probability
/// `1 / sum_j exp(x_j - max)`, in F32 like the reference's softmax.
pub fn top1(row: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    let max = row[best];
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    (best as u32, 1.0 / sum)
}

#[cfg(test)]
mod top1_tests {
    use super::top1;

    #[test]
    fn top1_takes_the_lowest_index_on_ties_and_the_softmax_probability() {
        let (tok, p) = top1(&[1.0, 3.0, 3.0, -2.0]);
        assert_eq!(tok, 1);
        let z = (1.0f32 - 3.0).exp() + 2.0 + (-5.0f32).exp();
        assert!((p - 1.0 / z).abs() < 1e-7);
        assert_eq!(top1(&[0.5]), (0, 1.0));
    }
}
