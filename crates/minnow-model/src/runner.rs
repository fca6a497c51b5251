//! The device-independent interface every forward implementation offers to the engine.
//!
//! A runner owns the weights and a K/V pool of fixed-size pages (one page per block), and runs
//! whatever batch it is given ([`ModelRunner::forward_batch`]): who owns which page is decided by
//! the caller (the engine's page pool, or [`crate::SingleSequence`] for programs that drive one
//! sequence at a time).

use crate::batch::{Segment, SegmentOutput, TopK, TOP_K};
use crate::error::Result;

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
    /// The F32 logits of row `row` (counted in the segment's ids) of segment `segment` of the
    /// latest [`ModelRunner::forward_batch`], which asked for that row with [`Want::TopK`];
    /// readable until the next forward. A constrained step reads one only where the grammar
    /// allows none of the row's best ids.
    ///
    /// [`Want::TopK`]: crate::batch::Want::TopK
    fn logits_row(&mut self, segment: usize, row: usize) -> Result<Vec<f32>>;
    /// Whether handing back full logits ([`Want::Logits`]) costs no more than a row's best ids
    /// ([`Want::TopK`]): true for a runner that computes its logits in host memory, where the
    /// best ids would be a sort of every row on top of the same logits. A constrained greedy
    /// step then asks for full logits and never reads a row twice.
    ///
    /// [`Want::Logits`]: crate::batch::Want::Logits
    /// [`Want::TopK`]: crate::batch::Want::TopK
    fn full_logits_cheap(&self) -> bool {
        false
    }
    /// Whether asking a segment for fewer of its rows saves the work of the rows left out (the
    /// final norm, the lm_head and the scores): true for the CPU, which computes only the rows
    /// asked for, and for the GPU, whose captured graphs depend on how many rows a forward
    /// wants, not which. A denoising step then asks only for the slots it reads.
    fn narrow_rows_pay(&self) -> bool {
        false
    }
    /// Whether [`ModelRunner::draw_rows`] draws on the runner's device. When it does not, a
    /// sampling step reads its rows and samples on the host.
    fn draws_rows(&self) -> bool {
        false
    }
    /// One sampled candidate `(token, confidence)` per entry of `draws`, each from a row of the
    /// latest [`ModelRunner::forward_batch`] that asked for it with [`Want::TopK`], computed
    /// where the logits are (docs/decoding.md §4.7): the rows of every segment of a step in one
    /// call. Only for a runner whose [`ModelRunner::draws_rows`] says so.
    ///
    /// [`Want::TopK`]: crate::batch::Want::TopK
    fn draw_rows(&mut self, _draws: &[RowDraw]) -> Result<Vec<(u32, f32)>> {
        Err(crate::error::ModelError::InvalidInput(
            "this runner draws no rows on a device".into(),
        ))
    }
}

/// The sampling rule of a draw on the device (docs/decoding.md §4.2 and §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawRule {
    /// LLaDA2.0/2.1: the logits divided by the temperature, filtered; the confidence is the
    /// drawn id's probability in the filtered distribution.
    Official,
    /// LLaDA2.2: weights `exp((x - max) / temperature)`, filtered; the confidence is the drawn
    /// id's probability under the row's untempered softmax.
    Port,
}

/// One row to draw a sampled candidate from ([`ModelRunner::draw_rows`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowDraw {
    /// The segment of the latest forward, and the row counted in its ids.
    pub segment: usize,
    pub row: usize,
    pub rule: DrawRule,
    /// Above 0: draw. At most 0 (the official rule with filters): the argmax, with its
    /// probability among the filters' survivors.
    pub temperature: f32,
    /// 0: off.
    pub top_k: usize,
    /// Outside `[0, 1)`: off.
    pub top_p: f32,
    /// The draw's uniform in `[0, 1)`.
    pub uniform: f64,
}

/// A boxed runner (what the engine's device selection returns) is a runner.
impl<R: ModelRunner + ?Sized> ModelRunner for Box<R> {
    fn config(&self) -> &crate::config::Config {
        (**self).config()
    }
    fn device_name(&self) -> String {
        (**self).device_name()
    }
    fn kv_pages(&self) -> usize {
        (**self).kv_pages()
    }
    fn kv_page_bytes(&self) -> usize {
        (**self).kv_page_bytes()
    }
    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>> {
        (**self).forward_batch(segments)
    }
    fn logits_row(&mut self, segment: usize, row: usize) -> Result<Vec<f32>> {
        (**self).logits_row(segment, row)
    }
    fn full_logits_cheap(&self) -> bool {
        (**self).full_logits_cheap()
    }
    fn narrow_rows_pay(&self) -> bool {
        (**self).narrow_rows_pay()
    }
    fn draws_rows(&self) -> bool {
        (**self).draws_rows()
    }
    fn draw_rows(&mut self, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>> {
        (**self).draw_rows(draws)
    }
}

/// Where a forward's [`Want::TopK`] rows sit among its wanted rows (batch order), for
/// [`ModelRunner::logits_row`]: per segment that asked for them, its wanted rows and the index of
/// the first.
///
/// [`Want::TopK`]: crate::batch::Want::TopK
#[derive(Debug, Default)]
pub struct TopKRows {
    segments: Vec<Option<(std::ops::Range<usize>, usize)>>,
}

impl TopKRows {
    pub fn new(segments: &[Segment<'_>]) -> Self {
        let mut at = 0;
        let segments = segments
            .iter()
            .map(|seg| {
                let rows = seg.want.rows();
                let first = at;
                at += rows.len();
                matches!(seg.want, crate::batch::Want::TopK(_)).then_some((rows, first))
            })
            .collect();
        TopKRows { segments }
    }

    /// The index among the forward's wanted rows of row `row` of segment `segment`; an error
    /// names a row the forward did not ask for with `Want::TopK`.
    pub fn index(&self, segment: usize, row: usize) -> Result<usize> {
        match self.segments.get(segment) {
            Some(Some((rows, first))) if rows.contains(&row) => Ok(first + row - rows.start),
            _ => Err(crate::error::ModelError::InvalidInput(format!(
                "row {row} of segment {segment} was not asked for with Want::TopK by the latest forward"
            ))),
        }
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

/// What [`crate::batch::Want::TopK`] returns for rows of F32 logits `[rows, vocab]` (runners
/// that hold them on the host).
pub fn top_k_of_rows(logits: &[f32], vocab: usize) -> TopK {
    let k = TOP_K.min(vocab);
    let rows = logits.chunks_exact(vocab.max(1));
    TopK {
        k,
        entries: rows.clone().flat_map(|row| top_k(row, k)).collect(),
        top1: rows.map(top1).collect(),
    }
}

/// The first `k` ids of a logits row (all of them when `k` is larger) in the order of
/// [`crate::batch::Want::TopK`]: larger logit first, NaN below every number (so -0 and +0 are
/// equal), lower id first among equal logits; each with its logit.
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let first = k.min(row.len());
    if first == 0 {
        return Vec::new();
    }
    let mut best: Vec<(u32, f32)> = row[..first]
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    best.sort_unstable_by(|&a, &b| order(a, b));
    // Ids that beat the current k-th wait here and are merged k at a time, so a row whose logits
    // rise with the id costs O(n log k), not O(n k).
    let mut waiting = Vec::with_capacity(first);
    let merge = |best: &mut Vec<(u32, f32)>, waiting: &mut Vec<(u32, f32)>| {
        best.append(waiting);
        best.sort_unstable_by(|&a, &b| order(a, b));
        best.truncate(first);
    };
    for (i, &v) in row.iter().enumerate().skip(first) {
        let last = best[first - 1];
        // Most ids fall below the k-th logit: one comparison rejects them. Ids grow, so an id
        // equal to the k-th logit never displaces it.
        if v.is_nan() || v < last.1 || !comes_before((i as u32, v), last) {
            continue;
        }
        waiting.push((i as u32, v));
        if waiting.len() == first {
            merge(&mut best, &mut waiting);
        }
    }
    merge(&mut best, &mut waiting);
    best
}

/// [`top_k`]'s order as an [`std::cmp::Ordering`] (`Less`: `a` comes first).
fn order(a: (u32, f32), b: (u32, f32)) -> std::cmp::Ordering {
    if comes_before(a, b) {
        std::cmp::Ordering::Less
    } else if comes_before(b, a) {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// Whether `a` precedes `b` in [`top_k`]'s order.
#[inline]
fn comes_before(a: (u32, f32), b: (u32, f32)) -> bool {
    match (a.1.is_nan(), b.1.is_nan()) {
        (false, false) => a.1 > b.1 || (a.1 == b.1 && a.0 < b.0),
        (false, true) => true,
        (true, false) => false,
        (true, true) => a.0 < b.0,
    }
}

#[cfg(test)]
mod top1_tests {
    use super::{top1, top_k};

    #[test]
    fn top_k_orders_by_value_then_id_with_nan_last() {
        let row = [
            1.0,
            f32::NAN,
            3.0,
            -0.0,
            3.0,
            0.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            1.0,
        ];
        let ids = |k| top_k(&row, k).iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(ids(9), vec![7, 2, 4, 0, 8, 3, 5, 6, 1]);
        assert_eq!(ids(4), vec![7, 2, 4, 0]);
        assert_eq!(ids(20).len(), 9);
        assert!(ids(0).is_empty());
        // Its values are the row's.
        assert!(top_k(&row, 9)
            .iter()
            .all(|&(i, v)| v.to_bits() == row[i as usize].to_bits()));
        // Against a full sort of many tied values.
        let row: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 13) as f32).collect();
        let mut sorted: Vec<u32> = (0..1000).collect();
        sorted.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        assert_eq!(
            top_k(&row, 64).iter().map(|e| e.0).collect::<Vec<_>>(),
            sorted[..64]
        );
    }

    #[test]
    fn top1_takes_the_lowest_index_on_ties_and_the_softmax_probability() {
        let (tok, p) = top1(&[1.0, 3.0, 3.0, -2.0]);
        assert_eq!(tok, 1);
        let z = (1.0f32 - 3.0).exp() + 2.0 + (-5.0f32).exp();
        assert!((p - 1.0 / z).abs() < 1e-7);
        assert_eq!(top1(&[0.5]), (0, 1.0));
    }
}
