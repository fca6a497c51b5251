//! A batched forward's shape (the key of a captured graph) and the per-forward metadata buffer
//! laid out from it: ids, positions, pool rows, segments, attention tiles, routing blocks and
//! block tables, uploaded once per forward.

use minnow_runtime::cuda::ops;

use super::shapes::attention_shape;
use crate::batch::{pages_for, Segment, Want};
use crate::config::Config;

/// What one segment of a batch asks for, as far as the queued work depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum WantKind {
    Nothing,
    Logits,
    Top1,
    TopK,
}

impl WantKind {
    /// What `s` asks for: [`WantKind::Nothing`] when it asks for no rows.
    fn of(s: &Segment<'_>) -> Self {
        match s.want {
            _ if s.want.rows().is_empty() => WantKind::Nothing,
            Want::Nothing => WantKind::Nothing,
            Want::Logits(_) => WantKind::Logits,
            Want::Top1(_) => WantKind::Top1,
            Want::TopK(_) => WantKind::TopK,
        }
    }
}

/// The shape of a batched forward: every segment's length and what it wants, and how many rows
/// the lm_head runs on. Everything the queued launches depend on (grids, offsets into the
/// metadata buffer) follows from it, so it is the key of a captured graph; positions, block
/// tables, ids and which rows the lm_head reads travel in the metadata buffer. So a denoising
/// step that asks for a span of its block (the slots still masked) shares its graph with every
/// step whose spans add up to the same [`head_bucket`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BatchShape {
    /// (tokens, what its wanted rows want) per segment.
    pub segments: Vec<(usize, WantKind)>,
    /// The batch rows the lm_head reads when they are whole segments one after another (no
    /// gather).
    pub head_run: Option<std::ops::Range<usize>>,
    /// Rows the lm_head runs on: the run's, else the wanted rows of every segment rounded up
    /// by [`head_bucket`] (the extra rows repeat row 0 and are never read).
    pub head_rows: usize,
    /// Fixed-position attention splits the longest key range needs (batch-invariant mode; the
    /// launch grid depends on it, so it is part of a captured graph's key).
    pub key_chunks: usize,
}

/// Rows the lm_head runs on for `wanted` gathered rows: 32 up to 32, 64 up to 64, else the next
/// multiple of 64. A batch of denoising steps at different points of their blocks asks for a
/// different number of rows at nearly every step; without the rounding each count would capture
/// a graph of its own. Below 64 rows the lm_head streams its weights in the same time whatever the
/// count, so one request's shrinking span keeps one graph. A row's logits do not depend on the
/// rows beside it (the planned lm_head sums each row in one order), so the padding changes no
/// bits.
pub(crate) fn head_bucket(wanted: usize) -> usize {
    wanted.next_multiple_of(if wanted <= 32 { 32 } else { 64 })
}

/// The order a forward runs a batch's segments in, as indices into `segments`: the ones that
/// want rows first, then those that want only their K/V; within each, longest first, then by
/// what they want, whole segments before spans; ties keep the caller's order.
///
/// A captured graph is keyed by the batch's shape, which lists its segments in order. A server's
/// requests are at different points of their blocks, so which of them commit a block (a longer
/// segment) or prefill changes from step to step, and in the caller's order nearly every step
/// would be a shape of its own, captured and never replayed. In this order the shape depends on
/// how many segments of each length and kind there are. No row's bits depend on the segments
/// beside it or on its place in the batch (batch invariance), so the order changes no output.
pub(crate) fn canonical_order(segments: &[Segment<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&i| {
        let s = &segments[i];
        let kind = WantKind::of(s);
        (
            kind == WantKind::Nothing,
            std::cmp::Reverse(s.ids.len()),
            kind,
            s.want.rows().len() != s.ids.len(),
        )
    });
    order
}

impl BatchShape {
    pub fn of(segments: &[Segment<'_>]) -> Self {
        // Each wanting segment's rows in the batch, and whether they are the whole segment.
        let mut wanted_rows = Vec::new();
        let mut row0 = 0;
        let kinds = segments
            .iter()
            .map(|s| {
                let rows = s.want.rows();
                let at = row0 + rows.start..row0 + rows.end;
                row0 += s.ids.len();
                let kind = WantKind::of(s);
                if kind != WantKind::Nothing {
                    wanted_rows.push((at, rows.len() == s.ids.len()));
                }
                (s.ids.len(), kind)
            })
            .collect();
        let wanted: usize = wanted_rows.iter().map(|(r, _)| r.len()).sum();
        // Only whole segments one after another make a run: a span of a segment is gathered, so
        // that its graph depends on its row count alone (a run's range is part of the key).
        let is_run = wanted_rows.iter().all(|(_, whole)| *whole)
            && wanted_rows.windows(2).all(|w| w[0].0.end == w[1].0.start);
        let head_run = match (wanted_rows.first(), wanted_rows.last()) {
            (Some((a, _)), Some((b, _))) if is_run => Some(a.start..b.end),
            _ => None,
        };
        Self {
            segments: kinds,
            head_rows: head_run.as_ref().map_or(head_bucket(wanted), |r| r.len()),
            head_run,
            key_chunks: segments
                .iter()
                .map(|s| (s.start + s.ids.len()).div_ceil(ops::attention_chunk_keys()))
                .max()
                .unwrap_or(0)
                .max(1),
        }
    }

    /// Longest segment.
    pub fn longest(&self) -> usize {
        self.segments.iter().map(|s| s.0).max().unwrap_or(0)
    }
}

/// Sections of the per-forward metadata buffer (u32 words, each section 16-byte aligned), in
/// the order they are laid out. Block tables come last: their length grows with the prefixes
/// without moving any other section.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub tokens: usize,
    /// Rows the lm_head runs on ([`BatchShape::head_rows`]); which batch rows they are is in the
    /// metadata ([`Layout::fill`]).
    pub head_rows: usize,
    /// Those rows when they are one contiguous run of the batch (no gather needed).
    pub head_range: Option<std::ops::Range<usize>>,
    pub logits: bool,
    pub top1: bool,
    /// Some rows want their best ids (`Want::TopK`: the top-1 pairs too).
    pub topk: bool,
    /// Attention CTAs: (segment, first token).
    pub tiles: Vec<[i32; 2]>,
    /// The same for the wgmma attention kernel's CTAs of twice the tokens.
    pub wide_tiles: Vec<[i32; 2]>,
    /// Fixed-position attention splits (see [`BatchShape::key_chunks`]).
    pub key_chunks: usize,
    /// 2.2 routing blocks: (first row, rows).
    pub blocks: Vec<[i32; 2]>,
    off_pos: usize,
    off_slot: usize,
    off_head: usize,
    off_segs: usize,
    off_tiles: usize,
    off_wide_tiles: usize,
    off_blocks: usize,
    off_tables: usize,
}

fn align4(x: usize) -> usize {
    x.div_ceil(4) * 4
}

impl Layout {
    pub fn new(c: &Config, shape: &BatchShape) -> Self {
        let lens: Vec<usize> = shape.segments.iter().map(|s| s.0).collect();
        let tokens: usize = lens.iter().sum();
        let (mut logits, mut top1, mut topk) = (false, false, false);
        let mut row0 = 0;
        let mut blocks = Vec::new();
        for &(n, kind) in &shape.segments {
            match kind {
                WantKind::Nothing => {}
                WantKind::Logits => logits = true,
                WantKind::Top1 => top1 = true,
                WantKind::TopK => topk = true,
            }
            for b0 in (0..n).step_by(c.block_size.max(1)) {
                blocks.push([(row0 + b0) as i32, (c.block_size.min(n - b0)) as i32]);
            }
            row0 += n;
        }
        let head_rows = shape.head_rows;
        let head_range = shape.head_run.clone();
        let tiles = ops::attention_tiles(&attention_shape(c), &lens);
        let wide_tiles = ops::attention_wide_tiles(&attention_shape(c), &lens);
        let off_pos = align4(tokens);
        let off_slot = off_pos + align4(tokens);
        let off_head = off_slot + align4(tokens);
        let off_segs = off_head + align4(head_rows);
        let off_tiles = off_segs + 4 * lens.len();
        let off_wide_tiles = off_tiles + align4(2 * tiles.len());
        let off_blocks = off_wide_tiles + align4(2 * wide_tiles.len());
        let off_tables = off_blocks + align4(2 * blocks.len());
        Self {
            tokens,
            head_rows,
            head_range,
            logits,
            top1,
            topk,
            tiles,
            wide_tiles,
            key_chunks: shape.key_chunks,
            blocks,
            off_pos,
            off_slot,
            off_head,
            off_segs,
            off_tiles,
            off_wide_tiles,
            off_blocks,
            off_tables,
        }
    }

    /// The metadata of `segments` (whose shape this layout was made from): ids, positions, pool
    /// rows, wanted rows, segments, attention tiles (both widths), routing blocks, then the block tables.
    pub fn fill(&self, c: &Config, segments: &[Segment<'_>]) -> Vec<u32> {
        let p = c.block_size;
        let table_len: usize = segments
            .iter()
            .map(|s| pages_for(s.start + s.ids.len(), p))
            .sum();
        let mut m = vec![0u32; self.off_tables + table_len];
        let mut row = 0;
        let mut table_off = 0;
        for (si, s) in segments.iter().enumerate() {
            let pages = &s.pages[..pages_for(s.start + s.ids.len(), p)];
            for (i, &id) in s.ids.iter().enumerate() {
                let pos = s.start + i;
                m[row + i] = id;
                m[self.off_pos + row + i] = pos as u32;
                m[self.off_slot + row + i] = pages[pos / p] * p as u32 + (pos % p) as u32;
            }
            let seg = [row, s.ids.len(), s.start, table_off];
            for (k, v) in seg.iter().enumerate() {
                m[self.off_segs + 4 * si + k] = *v as u32;
            }
            m[self.off_tables + table_off..self.off_tables + table_off + pages.len()]
                .copy_from_slice(pages);
            table_off += pages.len();
            row += s.ids.len();
        }
        // The wanted rows, segment by segment; the rows the bucket adds repeat row 0.
        let mut at = self.off_head;
        let mut row0 = 0;
        for s in segments {
            for r in s.want.rows() {
                m[at] = (row0 + r) as u32;
                at += 1;
            }
            row0 += s.ids.len();
        }
        debug_assert!(
            at <= self.off_head + self.head_rows,
            "the bucket holds the wanted rows"
        );
        for (off, tiles) in [
            (self.off_tiles, &self.tiles),
            (self.off_wide_tiles, &self.wide_tiles),
        ] {
            for (i, t) in tiles.iter().enumerate() {
                m[off + 2 * i] = t[0] as u32;
                m[off + 2 * i + 1] = t[1] as u32;
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            m[self.off_blocks + 2 * i] = b[0] as u32;
            m[self.off_blocks + 2 * i + 1] = b[1] as u32;
        }
        m
    }
}

/// Device addresses of a [`Layout`]'s sections inside the metadata buffer at `base`.
pub(super) struct Meta {
    pub(super) ids: u64,
    pub(super) pos: u64,
    pub(super) slot: u64,
    pub(super) head: u64,
    pub(super) attention: ops::AttentionBatch,
    pub(super) blocks: ops::RoutingBlocks,
}

impl Meta {
    pub(super) fn new(base: u64, l: &Layout) -> Self {
        let at = |off: usize| base + 4 * off as u64;
        Self {
            ids: at(0),
            pos: at(l.off_pos),
            slot: at(l.off_slot),
            head: at(l.off_head),
            attention: ops::AttentionBatch {
                segs: at(l.off_segs),
                tiles: at(l.off_tiles),
                tables: at(l.off_tables),
                tiles_count: l.tiles.len(),
                wide_tiles: at(l.off_wide_tiles),
                wide_tiles_count: l.wide_tiles.len(),
            },
            blocks: ops::RoutingBlocks::Listed {
                ptr: at(l.off_blocks),
                count: l.blocks.len(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let text = include_str!("../../../../tests/fixtures/llada2-tiny-v20/config.json");
        Config::from_json_str(text, std::path::Path::new("config.json")).unwrap()
    }

    const PAGES: [u32; 4] = [3, 1, 2, 0];
    const IDS: [u32; 64] = [7; 64];

    /// A segment of `n` ids after a 32-token prefix, wanting `want`.
    fn segment(n: usize, want: Want) -> Segment<'static> {
        Segment {
            pages: &PAGES,
            start: 32,
            ids: &IDS[..n],
            want,
        }
    }

    #[test]
    fn batches_of_the_same_segments_in_any_order_run_as_one_shape() {
        let a = [
            segment(32, Want::Top1(4..32)),
            segment(64, Want::Nothing),
            segment(64, Want::Top1(32..64)),
            segment(32, Want::TopK(0..32)),
            segment(32, Want::Top1(9..32)),
        ];
        let b = [
            a[4].clone(),
            a[3].clone(),
            a[2].clone(),
            a[0].clone(),
            a[1].clone(),
        ];
        let run = |batch: &[Segment<'static>]| -> BatchShape {
            let order = canonical_order(batch);
            let ordered: Vec<Segment<'static>> = order.iter().map(|&i| batch[i].clone()).collect();
            BatchShape::of(&ordered)
        };
        assert_eq!(run(&a), run(&b));
        // Wanting rows first, longest first, best ids after top-1, the K/V-only segment last;
        // equal segments keep the caller's order.
        assert_eq!(canonical_order(&a), [2, 0, 4, 3, 1]);
        assert_eq!(canonical_order(&b), [2, 0, 3, 1, 4]);
    }

    #[test]
    fn gathered_rows_round_up_to_32_then_64_then_multiples_of_64() {
        let buckets: Vec<usize> = [0, 1, 27, 32, 33, 64, 65, 128, 129]
            .into_iter()
            .map(head_bucket)
            .collect();
        assert_eq!(buckets, [0, 32, 32, 32, 64, 64, 128, 128, 192]);
    }

    #[test]
    fn denoising_steps_whose_spans_fill_the_same_bucket_share_a_graph() {
        // 28 + 22 + 32 = 82 and 32 + 32 + 12 = 76 wanted rows: both 128 lm_head rows.
        let a = BatchShape::of(&[
            segment(32, Want::Top1(4..32)),
            segment(32, Want::Top1(10..32)),
            segment(32, Want::Top1(0..32)),
        ]);
        let b = BatchShape::of(&[
            segment(32, Want::Top1(0..32)),
            segment(32, Want::Top1(0..32)),
            segment(32, Want::Top1(20..32)),
        ]);
        assert_eq!(a, b);
        assert_eq!(a.head_rows, 128);
        assert_eq!(a.head_run, None);
        // One segment's span is gathered too, into 32 rows whatever its count.
        let alone = BatchShape::of(&[segment(32, Want::Top1(5..32))]);
        assert_eq!((alone.head_run.clone(), alone.head_rows), (None, 32));
        assert_eq!(alone, BatchShape::of(&[segment(32, Want::Top1(30..32))]));
        // Spans of one count share a graph wherever they start.
        assert_eq!(
            BatchShape::of(&[segment(32, Want::Top1(5..28))]),
            BatchShape::of(&[segment(32, Want::Top1(9..32))])
        );
    }

    #[test]
    fn wanted_rows_next_to_each_other_are_one_run_without_padding() {
        let shape = BatchShape::of(&[
            segment(32, Want::Nothing),
            segment(32, Want::Top1(0..32)),
            segment(32, Want::Top1(0..32)),
            segment(32, Want::Top1(0..32)),
        ]);
        assert_eq!(shape.head_run, Some(32..128));
        assert_eq!(shape.head_rows, 96);
        let layout = Layout::new(&config(), &shape);
        assert_eq!(layout.head_range, Some(32..128));
        // A segment asking for nothing between two whole ones breaks the run.
        let broken = BatchShape::of(&[
            segment(32, Want::Top1(0..32)),
            segment(32, Want::Nothing),
            segment(32, Want::Top1(0..32)),
        ]);
        assert_eq!(broken.head_run, None);
        assert_eq!(broken.head_rows, head_bucket(64));
    }

    #[test]
    fn a_segment_asking_for_no_rows_asks_the_forward_for_nothing() {
        let shape = BatchShape::of(&[
            segment(32, Want::Logits(5..5)),
            segment(32, Want::Top1(0..32)),
        ]);
        assert_eq!(shape.segments[0].1, WantKind::Nothing);
        let layout = Layout::new(&config(), &shape);
        assert!(!layout.logits && layout.top1);
        assert_eq!(layout.head_range, Some(32..64));
    }

    #[test]
    fn the_metadata_lists_the_wanted_rows_in_batch_order_and_pads_with_row_zero() {
        let c = config();
        let segments = [
            segment(64, Want::Top1(36..64)),
            segment(32, Want::Top1(4..32)),
            segment(32, Want::Top1(30..32)),
            segment(32, Want::Top1(20..32)),
        ];
        let shape = BatchShape::of(&segments);
        // 28 + 28 + 2 + 12 = 70 wanted rows: 128 lm_head rows.
        assert_eq!(shape.head_rows, 128);
        let layout = Layout::new(&c, &shape);
        let meta = layout.fill(&c, &segments);
        let head = &meta[layout.off_head..layout.off_head + layout.head_rows];
        let want: Vec<u32> = (36..64)
            .chain(64 + 4..64 + 32)
            .chain(96 + 30..96 + 32)
            .chain(128 + 20..128 + 32)
            .collect();
        assert_eq!(&head[..70], &want[..]);
        assert!(head[70..].iter().all(|&r| r == 0));
    }
}
