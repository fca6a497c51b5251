//! A batched forward's shape (the key of a captured graph) and the per-forward metadata buffer
//! laid out from it: ids, positions, pool rows, segments, attention tiles, routing blocks and
//! block tables, uploaded once per forward.

use minnow_runtime::cuda::ops;

use super::shapes::attention_shape;
use crate::batch::{pages_for, Segment, Want};
use crate::config::Config;

/// What one segment of a batch asks for, as far as the queued work depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WantKind {
    Nothing,
    Logits,
    Top1,
    TopK,
}

/// The shape of a batched forward: every segment's length and wanted rows. Everything the queued
/// launches depend on (grids, offsets into the metadata buffer) follows from it, so it is the key
/// of a captured graph; positions, block tables and ids travel in the metadata buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BatchShape {
    /// (tokens, wanted rows, what they want) per segment.
    pub segments: Vec<(usize, std::ops::Range<usize>, WantKind)>,
    /// Fixed-position attention splits the longest key range needs (batch-invariant mode; the
    /// launch grid depends on it, so it is part of a captured graph's key).
    pub key_chunks: usize,
}

impl BatchShape {
    pub fn of(segments: &[Segment<'_>]) -> Self {
        Self {
            segments: segments
                .iter()
                .map(|s| {
                    let kind = match s.want {
                        Want::Nothing => WantKind::Nothing,
                        Want::Logits(_) => WantKind::Logits,
                        Want::Top1(_) => WantKind::Top1,
                        Want::TopK(_) => WantKind::TopK,
                    };
                    (s.ids.len(), s.want.rows(), kind)
                })
                .collect(),
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
    /// Batch rows that need the lm_head, in batch order (segment by segment).
    pub head_rows: Vec<u32>,
    /// The same rows when they are one contiguous run (no gather needed).
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
        let mut head_rows = Vec::new();
        let (mut logits, mut top1, mut topk) = (false, false, false);
        let mut row0 = 0;
        let mut blocks = Vec::new();
        for (n, rows, kind) in &shape.segments {
            match kind {
                WantKind::Nothing => {}
                WantKind::Logits => logits |= !rows.is_empty(),
                WantKind::Top1 => top1 |= !rows.is_empty(),
                WantKind::TopK => topk |= !rows.is_empty(),
            }
            if *kind != WantKind::Nothing {
                head_rows.extend(rows.clone().map(|r| (row0 + r) as u32));
            }
            for b0 in (0..*n).step_by(c.block_size.max(1)) {
                blocks.push([(row0 + b0) as i32, (c.block_size.min(n - b0)) as i32]);
            }
            row0 += n;
        }
        let head_range = match (head_rows.first(), head_rows.last()) {
            (Some(&a), Some(&b)) if (b - a) as usize + 1 == head_rows.len() => {
                Some(a as usize..b as usize + 1)
            }
            _ => None,
        };
        let tiles = ops::attention_tiles(&attention_shape(c), &lens);
        let wide_tiles = ops::attention_wide_tiles(&attention_shape(c), &lens);
        let off_pos = align4(tokens);
        let off_slot = off_pos + align4(tokens);
        let off_head = off_slot + align4(tokens);
        let off_segs = off_head + align4(head_rows.len());
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
        m[self.off_head..self.off_head + self.head_rows.len()].copy_from_slice(&self.head_rows);
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
