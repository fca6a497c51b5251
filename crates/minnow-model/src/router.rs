//! Expert selection of the MoE layers (model doc §7.6–7.8), device-independent and in F32.
//!
//! Inputs are the sigmoid scores `s` and the biased scores `b = s + expert_bias` of every row;
//! outputs are, per row, `k` expert ids ordered by biased score (descending, ties to the lower
//! id) and their mixing weights `s[id] / (Σ s + 1e-20) · routed_scaling_factor`.

/// The experts and weights chosen for a set of rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// `[rows, k]` expert ids.
    pub ids: Vec<u32>,
    /// `[rows, k]` mixing weights aligned with `ids`.
    pub weights: Vec<f32>,
    /// 2.2 only: `[blocks, E]`, whether each block admitted each expert.
    pub admitted: Option<Vec<bool>>,
}

/// Indices of the `k` largest `values[j]` over `candidates`, largest first; equal values keep
/// the lower index first (PyTorch-compatible choice, model doc §7.7).
fn top_k(values: &[f32], candidates: impl Iterator<Item = usize>, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = candidates.collect();
    // Stable sort on value descending keeps index order among equal values.
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    idx.truncate(k);
    idx
}

/// Weights from the unbiased scores of the chosen experts (the bias never enters them).
fn weights_for(scores: &[f32], ids: &[usize], scale: f32) -> Vec<f32> {
    let g: Vec<f32> = ids.iter().map(|&j| scores[j]).collect();
    if ids.len() > 1 {
        let sum: f32 = g.iter().sum();
        g.iter().map(|v| v / (sum + 1e-20) * scale).collect()
    } else {
        g.iter().map(|v| v * scale).collect()
    }
}

/// 2.0/2.1 token-level group-limited routing over `scores`/`biased` of `[rows, E]`.
pub fn route_grouped(
    scores: &[f32],
    biased: &[f32],
    num_experts: usize,
    k: usize,
    n_group: usize,
    topk_group: usize,
    scale: f32,
) -> Routing {
    let group = num_experts / n_group;
    let mut out = Routing::default();
    for (s, b) in scores
        .chunks_exact(num_experts)
        .zip(biased.chunks_exact(num_experts))
    {
        // Group score: sum of the two best biased scores of the group.
        let group_scores: Vec<f32> = b
            .chunks_exact(group)
            .map(|g| {
                let best = top_k(g, 0..g.len(), 2);
                best.iter().map(|&i| g[i]).sum()
            })
            .collect();
        let groups = top_k(&group_scores, 0..n_group, topk_group);
        let mut allowed: Vec<usize> = groups
            .iter()
            .flat_map(|&g| g * group..(g + 1) * group)
            .collect();
        allowed.sort_unstable();
        let ids = top_k(b, allowed.into_iter(), k);
        out.weights.extend(weights_for(s, &ids, scale));
        out.ids.extend(ids.iter().map(|&j| j as u32));
    }
    out
}

/// 2.2 block routing: rows are split into consecutive blocks of `block_size` (the caller aligns
/// the first row to a block start); each block admits the `capacity` experts with the largest
/// max-over-the-block biased score, then each row takes its top-k among the admitted experts.
/// A trailing partial block simply has fewer rows: the missing rows are −∞ and nominate nothing.
pub fn route_blocks(
    scores: &[f32],
    biased: &[f32],
    num_experts: usize,
    k: usize,
    capacity: usize,
    block_size: usize,
    scale: f32,
) -> Routing {
    let mut out = Routing {
        admitted: Some(Vec::new()),
        ..Routing::default()
    };
    let rows = scores.len() / num_experts;
    for start in (0..rows).step_by(block_size) {
        let end = (start + block_size).min(rows);
        let block_b = &biased[start * num_experts..end * num_experts];
        let mut g = vec![f32::NEG_INFINITY; num_experts];
        for row in block_b.chunks_exact(num_experts) {
            for (gj, &v) in g.iter_mut().zip(row) {
                *gj = gj.max(v);
            }
        }
        let mut pool = top_k(&g, 0..num_experts, capacity);
        pool.sort_unstable();
        let mut admitted = vec![false; num_experts];
        for &j in &pool {
            admitted[j] = true;
        }
        out.admitted.as_mut().unwrap().extend(admitted);
        for r in start..end {
            let s = &scores[r * num_experts..(r + 1) * num_experts];
            let b = &biased[r * num_experts..(r + 1) * num_experts];
            let ids = top_k(b, pool.iter().copied(), k);
            out.weights.extend(weights_for(s, &ids, scale));
            out.ids.extend(ids.iter().map(|&j| j as u32));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_the_scaling_factor_and_ignore_the_bias() {
        let s = [0.1f32, 0.9, 0.5, 0.3, 0.2, 0.8, 0.4, 0.6];
        // A huge bias on expert 0 selects it, but its weight still comes from s[0] = 0.1.
        let mut b = s;
        b[0] += 10.0;
        let r = route_grouped(&s, &b, 8, 2, 1, 1, 2.5);
        assert_eq!(r.ids, vec![0, 1]);
        assert!((r.weights.iter().sum::<f32>() - 2.5).abs() < 1e-6);
        assert!((r.weights[0] - 0.1 / 1.0 * 2.5).abs() < 1e-6);
    }

    #[test]
    fn group_score_is_the_sum_of_the_two_best() {
        // Group 0 = [0.9, 0.0, 0.0, 0.0]: best single expert, group score 0.9.
        // Group 1 = [0.5, 0.5, 0.0, 0.0]: group score 1.0, so it wins with topk_group = 1.
        let b = [0.9f32, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0];
        let r = route_grouped(&b, &b, 8, 2, 2, 1, 1.0);
        assert_eq!(r.ids, vec![4, 5]);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let b = [0.5f32; 8];
        let r = route_grouped(&b, &b, 8, 3, 4, 2, 1.0);
        assert_eq!(r.ids, vec![0, 1, 2]);
        let r = route_blocks(&b, &b, 8, 2, 3, 32, 1.0);
        assert_eq!(r.ids, vec![0, 1]);
        assert_eq!(r.admitted.unwrap()[..4], [true, true, true, false]);
    }

    #[test]
    fn block_admission_uses_the_block_max_and_blocks_never_mix() {
        // 2 blocks of 2 rows, 4 experts, capacity 2, k 1.
        #[rustfmt::skip]
        let b = [
            0.9f32, 0.1, 0.0, 0.0, // block 0: max per expert = [0.9, 0.8, 0.0, 0.0]
            0.0, 0.8, 0.7, 0.0,
            0.0, 0.0, 0.1, 0.95, // block 1: max = [0.0, 0.0, 0.6, 0.95]
            0.0, 0.0, 0.6, 0.0,
        ];
        let r = route_blocks(&b, &b, 4, 1, 2, 2, 1.0);
        // Row 1 prefers expert 1 (0.8) since expert 2 (0.7) was not admitted in block 0.
        assert_eq!(r.ids, vec![0, 1, 3, 2]);
        assert_eq!(
            r.admitted.unwrap(),
            vec![true, true, false, false, false, false, true, true]
        );
        // A trailing partial block routes with the rows it has.
        let r = route_blocks(&b[..12], &b[..12], 4, 1, 2, 2, 1.0);
        assert_eq!(r.ids, vec![0, 1, 3]);
    }

    #[test]
    fn full_capacity_is_plain_top_k() {
        let b = [0.3f32, 0.1, 0.7, 0.2, 0.9, 0.0, 0.5, 0.4];
        let r = route_blocks(&b, &b, 8, 3, 8, 32, 1.0);
        assert_eq!(r.ids, vec![4, 2, 6]);
    }
}
