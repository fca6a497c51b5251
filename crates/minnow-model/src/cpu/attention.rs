//! Self-attention of one layer (model doc §7.4): fused QKV, per-head QK-norm, partial
//! rotate-half RoPE, then GQA attention under the block-causal mask over the cached prefix and
//! the forward's own keys.

use rayon::prelude::*;

use minnow_runtime::cpu::{linear, matmul_nn, rms_norm, rope_rotate_half, scaled_softmax, Par};
use minnow_runtime::MatRef;

use super::kv_pool::{Half, KvPool};
use crate::batch::PageId;
use crate::config::Config;
use crate::weights::Attention;

/// `cos`/`sin` of the `r/2` RoPE angles for a run of absolute positions, computed exactly as
/// the reference does in F32: `inv_freq[j] = 1 / θ^(2j/r)`, `angle = F32(p) · inv_freq[j]`.
pub struct RopeTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// The table for a run of positions, one row each (a batch's segments concatenated).
    pub fn for_positions(c: &Config, positions: impl Iterator<Item = usize>) -> Self {
        let r = c.rotary_dim;
        let half = r / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / c.rope_theta.powf((2 * j) as f32 / r as f32))
            .collect();
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for p in positions {
            for &f in &inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        RopeTable { half, cos, sin }
    }

    fn at(&self, i: usize) -> (&[f32], &[f32]) {
        let s = i * self.half;
        (&self.cos[s..s + self.half], &self.sin[s..s + self.half])
    }
}

/// One segment's rows inside a batched forward.
pub struct SegmentRows<'a> {
    /// Rows of the concatenated batch that belong to this segment.
    pub rows: std::ops::Range<usize>,
    /// Absolute position of the segment's first row.
    pub start: usize,
    /// The segment's block table.
    pub pages: &'a [PageId],
}

/// Runs attention of `layer` for the rows `a` (already input-normed) of every segment, writes
/// their K/V into the segments' pages, and returns the output projection `[rows, D]`. Each row
/// attends block-causally within its own segment only.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    c: &Config,
    w: &Attention,
    a: &[f32],
    segments: &[SegmentRows<'_>],
    rope: &RopeTable,
    pool: &mut KvPool,
    layer: usize,
) -> Vec<f32> {
    let (h, g, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let n = a.len() / c.hidden_size;
    let qkv_w = (h + 2 * g) * d;
    let mut qkv = vec![0.0f32; n * qkv_w];
    linear(a, n, w.qkv.view(), &mut qkv, Par::Rayon);

    // QK-norm before RoPE, over the full head; V untouched.
    qkv.par_chunks_mut(qkv_w).enumerate().for_each(|(i, row)| {
        let (cos, sin) = rope.at(i);
        let mut tmp = vec![0.0f32; d];
        for (head, slot) in row[..(h + g) * d].chunks_exact_mut(d).enumerate() {
            let norm = if head < h { &w.q_norm } else { &w.k_norm };
            if let Some(weight) = norm {
                rms_norm(slot, weight, c.rms_norm_eps, &mut tmp);
                slot.copy_from_slice(&tmp);
            }
            rope_rotate_half(&mut slot[..2 * rope.half], cos, sin);
        }
    });

    for seg in segments {
        for (pos, r) in (seg.start..).zip(seg.rows.clone()) {
            let row = &qkv[r * qkv_w..(r + 1) * qkv_w];
            for kvh in 0..g {
                let k = &row[(h + kvh) * d..(h + kvh + 1) * d];
                let v = &row[(h + g + kvh) * d..(h + g + kvh + 1) * d];
                pool.write(seg.pages, pos, layer, Half::K, kvh, k);
                pool.write(seg.pages, pos, layer, Half::V, kvh, v);
            }
        }
    }

    // Query rows grouped by (segment, absolute block): every row of a block sees the same keys,
    // `0 .. min(end of its block, end of the segment)`.
    let b = c.block_size;
    let mut groups = Vec::new();
    for (si, seg) in segments.iter().enumerate() {
        let n_seg = seg.rows.len();
        let total = seg.start + n_seg;
        let mut i0 = 0;
        while i0 < n_seg {
            let block_end = ((seg.start + i0) / b + 1) * b;
            let i1 = (block_end - seg.start).min(n_seg);
            groups.push((
                si,
                seg.rows.start + i0,
                seg.rows.start + i1,
                block_end.min(total),
            ));
            i0 = i1;
        }
    }
    let scale = 1.0 / (d as f32).sqrt();
    let per_kv = h / g;
    let pool = &*pool;
    // One task per (row group, KV head): the `per_kv` query heads sharing a KV head are stacked
    // into one matrix so each key row is read once for all of them.
    let tasks: Vec<(usize, usize)> = (0..groups.len())
        .flat_map(|gi| (0..g).map(move |kvh| (gi, kvh)))
        .collect();
    let outputs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(gi, kvh)| {
            let (si, i0, i1, keys_len) = groups[gi];
            let pages = segments[si].pages;
            let keys = pool.gather(pages, keys_len, layer, Half::K, kvh);
            let values = pool.gather(pages, keys_len, layer, Half::V, kvh);
            let rows = i1 - i0;
            let mq = per_kv * rows;
            // Q rows ordered (query head, row).
            let mut q = Vec::with_capacity(mq * d);
            for head in kvh * per_kv..(kvh + 1) * per_kv {
                for r in i0..i1 {
                    q.extend_from_slice(&qkv[r * qkv_w + head * d..][..d]);
                }
            }
            // Scores [mq, keys_len] = Q · Kᵀ, scaled, softmaxed per row.
            let mut scores = vec![0.0f32; mq * keys_len];
            let k_mat = MatRef::from_f32(keys_len, d, &keys);
            linear(&q, mq, k_mat, &mut scores, Par::Seq);
            for row in scores.chunks_exact_mut(keys_len) {
                scaled_softmax(row, scale);
            }
            // Output [mq, d] = P · V.
            let mut out = vec![0.0f32; mq * d];
            matmul_nn(mq, d, keys_len, &scores, keys_len, &values, &mut out, d);
            out
        })
        .collect();
    let mut attn = vec![0.0f32; n * h * d];
    for (&(gi, kvh), out) in tasks.iter().zip(&outputs) {
        let (_, i0, i1, _) = groups[gi];
        let rows = i1 - i0;
        for (qi, src) in out.chunks_exact(d).enumerate() {
            let head = kvh * per_kv + qi / rows;
            let r = i0 + qi % rows;
            attn[r * h * d + head * d..][..d].copy_from_slice(src);
        }
    }

    let mut o = vec![0.0f32; n * c.hidden_size];
    linear(&attn, n, w.dense.view(), &mut o, Par::Rayon);
    o
}
