//! The plain-data batch a runner executes: several segments (one per request), each a run of ids
//! at consecutive positions of one sequence whose K/V live in pages of the runner's pool.
//!
//! A sequence is a block table: page `i` of `pages` holds the K/V of positions
//! `i·P .. (i+1)·P`, where the page size `P` is the checkpoint's block size (32), so every block
//! of a canvas is exactly one page. A forward writes the K/V of its own positions into the pages
//! that cover them (overwriting what a previous forward of the same block left there) and
//! attends block-causally to everything before them plus its own block. Who owns a page, and
//! whether it is shared between sequences, is the caller's business (the engine's prefix cache);
//! the runner only reads and writes the pages it is given.
//!
//! [`validate`] is the one place that checks a batch against the model before any compute.

use std::ops::Range;

use crate::config::Config;
use crate::error::{ModelError, Result};

/// Index of one page in a runner's K/V pool.
pub type PageId = u32;

/// What a segment wants back from its forward.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Want {
    /// Only the K/V (prefill chunks, commit refreshes).
    Nothing,
    /// Row-major F32 logits `[rows.len(), vocab]` of these rows (relative to the segment's ids).
    Logits(Range<usize>),
    /// Each row's argmax token (lowest id on ties) and its softmax probability: all a greedy
    /// denoising step needs, and far less to read back than logits.
    Top1(Range<usize>),
    /// Each row's [`Want::Top1`] pair and its best [`TOP_K`] ids with their logits ([`TopK`]);
    /// each row's full logits stay readable with [`crate::ModelRunner::logits_row`] until the
    /// next forward. What a greedy step under a grammar reads: the best token the grammar allows
    /// is among the best ids unless it refuses them all, and only then is a full row read.
    TopK(Range<usize>),
}

impl Want {
    /// The rows asked for (empty for [`Want::Nothing`]).
    pub fn rows(&self) -> Range<usize> {
        match self {
            Want::Nothing => 0..0,
            Want::Logits(r) | Want::Top1(r) | Want::TopK(r) => r.clone(),
        }
    }
}

/// Ids per row of [`Want::TopK`] (all of them when the vocabulary is smaller).
pub const TOP_K: usize = 64;

/// What [`Want::TopK`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct TopK {
    /// Ids per row: `min(TOP_K, vocab)`.
    pub k: usize,
    /// `[rows, k]` (id, logit), in the order of [`crate::runner::top_k`]: larger logit first
    /// (NaN below every number), lower id first among equal logits.
    pub entries: Vec<(u32, f32)>,
    /// Per row what [`Want::Top1`] returns: the argmax and its softmax probability over the
    /// whole row.
    pub top1: Vec<(u32, f32)>,
}

impl TopK {
    /// Rows answered.
    pub fn rows(&self) -> usize {
        self.top1.len()
    }

    /// Row `r`'s best ids, best first.
    pub fn row(&self, r: usize) -> &[(u32, f32)] {
        &self.entries[r * self.k..(r + 1) * self.k]
    }
}

/// One sequence's part of a batched forward.
#[derive(Clone, Debug)]
pub struct Segment<'a> {
    /// The sequence's block table; it must cover positions `0 .. start + ids.len()`.
    pub pages: &'a [PageId],
    /// Absolute position of `ids[0]`. The K/V of `0..start` are already in `pages`.
    pub start: usize,
    pub ids: &'a [u32],
    pub want: Want,
}

/// What one segment got back.
#[derive(Clone, Debug, PartialEq)]
pub enum SegmentOutput {
    Nothing,
    Logits(Vec<f32>),
    Top1(Vec<(u32, f32)>),
    TopK(TopK),
}

impl SegmentOutput {
    pub fn into_logits(self) -> Option<Vec<f32>> {
        match self {
            SegmentOutput::Logits(l) => Some(l),
            _ => None,
        }
    }

    pub fn into_top1(self) -> Option<Vec<(u32, f32)>> {
        match self {
            SegmentOutput::Top1(t) => Some(t),
            _ => None,
        }
    }
}

/// Pages needed to hold positions `0..len`.
pub fn pages_for(len: usize, page_size: usize) -> usize {
    len.div_ceil(page_size)
}

/// Checks that every id is inside the model's vocabulary (the check of a forward's ids, also used
/// by the engine to refuse a prompt before queuing it).
pub fn check_ids(config: &Config, ids: &[u32]) -> Result<()> {
    match ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= config.vocab_size)
    {
        Some((i, &id)) => Err(ModelError::InvalidInput(format!(
            "token id {id} at input index {i} is outside the vocabulary (size {})",
            config.vocab_size
        ))),
        None => Ok(()),
    }
}

/// Checks every segment of a batch against the model and the pool: ids inside the vocabulary,
/// positions inside the context, forwards starting at a block boundary when 2.2 block routing is
/// on, a block table that covers the segment and names only pages of the pool, wanted rows inside
/// the segment, and no page written by two segments of one batch. Errors name the segment.
pub fn validate(config: &Config, pool_pages: usize, segments: &[Segment<'_>]) -> Result<()> {
    let page = config.block_size;
    let mut written = std::collections::HashSet::new();
    for (s, seg) in segments.iter().enumerate() {
        let bad = |msg: String| Err(ModelError::InvalidInput(format!("segment {s}: {msg}")));
        let n = seg.ids.len();
        if n == 0 {
            return bad("a forward of zero tokens".into());
        }
        if let Err(e) = check_ids(config, seg.ids) {
            return bad(e.to_string());
        }
        let end = seg.start + n;
        if end > config.max_position_embeddings {
            return bad(format!(
                "positions up to {} exceed max_position_embeddings = {}",
                end - 1,
                config.max_position_embeddings
            ));
        }
        if config.block_routing() && !seg.start.is_multiple_of(page) {
            return bad(format!(
                "a forward must start at a multiple of the block size {page} with 2.2 block routing (start {})",
                seg.start
            ));
        }
        if seg.pages.len() < pages_for(end, page) {
            return bad(format!(
                "its block table has {} pages but positions up to {} need {}",
                seg.pages.len(),
                end - 1,
                pages_for(end, page)
            ));
        }
        if let Some(&p) = seg.pages.iter().find(|&&p| p as usize >= pool_pages) {
            return bad(format!(
                "page {p} is outside the pool of {pool_pages} pages"
            ));
        }
        let rows = seg.want.rows();
        if rows.start > rows.end || rows.end > n {
            return bad(format!("wanted rows {rows:?} are outside its {n} ids"));
        }
        for &p in &seg.pages[seg.start / page..pages_for(end, page)] {
            if !written.insert(p) {
                return bad(format!("page {p} is written by two segments of one batch"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let text = include_str!("../../../tests/fixtures/llada2-tiny-v22/config.json");
        Config::from_json_str(text, std::path::Path::new("config.json")).unwrap()
    }

    fn seg<'a>(pages: &'a [PageId], start: usize, ids: &'a [u32], want: Want) -> Segment<'a> {
        Segment {
            pages,
            start,
            ids,
            want,
        }
    }

    #[test]
    fn accepts_a_well_formed_batch() {
        let c = config();
        let ids = vec![1u32; 32];
        let a = [0, 1];
        let b = [2];
        let batch = [
            seg(&a, 32, &ids, Want::Top1(0..32)),
            seg(&b, 0, &ids, Want::Nothing),
        ];
        validate(&c, 4, &batch).unwrap();
    }

    #[test]
    fn names_the_segment_and_the_problem() {
        let c = config();
        let ids = vec![1u32; 32];
        let oov = vec![c.vocab_size as u32; 1];
        let p = [0, 1];
        let cases: Vec<(Vec<Segment<'_>>, &str)> = vec![
            (
                vec![seg(&p, 0, &oov, Want::Nothing)],
                "outside the vocabulary",
            ),
            (
                vec![seg(&p, 3, &ids[..4], Want::Nothing)],
                "multiple of the block size",
            ),
            (vec![seg(&p[..1], 32, &ids, Want::Nothing)], "need 2"),
            (
                vec![seg(&[0, 9], 32, &ids, Want::Nothing)],
                "outside the pool",
            ),
            (
                vec![seg(&p, 0, &ids, Want::Logits(0..33))],
                "outside its 32 ids",
            ),
            (
                vec![
                    seg(&p, 32, &ids, Want::Nothing),
                    seg(&[3, 1], 32, &ids, Want::Nothing),
                ],
                "written by two segments",
            ),
            (vec![seg(&p, 0, &[], Want::Nothing)], "zero tokens"),
        ];
        for (batch, expected) in cases {
            let err = validate(&c, 4, &batch).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} lacks {expected}");
            assert!(err.contains("segment"), "{err}");
        }
    }
}
