//! Turning one row of F32 logits into a candidate token and its confidence (decoding doc §4).
//!
//! Three rules exist, and each algorithm uses the one its reference uses:
//! - [`greedy`]: argmax (ties → lowest id) and its softmax probability over the full vocabulary,
//!   in F32. Every implementation agrees on it; it is the default (temperature 0).
//! - [`OfficialSampler`] (§4.2): the 2.0/2.1 `generate` sampler: temperature, top-k, top-p
//!   (shifted drop mask), then the confidence is the probability under the tempered, filtered
//!   distribution. Used by `low-confidence` and `joint`.
//! - [`PortSampler`] (§4.4): the 2.2 reference port: the drawn token's confidence is its
//!   *untempered* softmax probability; banned ids are removed from the candidates and the
//!   normalizer. Used by `indel` for mask-to-token; its token-to-token edits stay greedy.
//!
//! Randomness comes from a seeded per-request [`rand::rngs::StdRng`], so a fixed seed reproduces
//! a run (not PyTorch's random stream).

use rand::rngs::StdRng;
use rand::Rng;

/// A position's proposed token and the confidence used to rank and threshold it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub token: u32,
    pub confidence: f32,
}

/// Index of the largest logit, ties → lowest id, skipping `banned` ids. `None` when every id is
/// banned (or the row is empty).
pub fn argmax_excluding(logits: &[f32], banned: &[u32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &z) in logits.iter().enumerate() {
        if banned.contains(&(i as u32)) {
            continue;
        }
        // Strict `>` keeps the lowest id on ties; NaN never wins.
        if best.is_none_or(|(_, b)| z > b) {
            best = Some((i, z));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// `Σ exp(z − max)` over the non-banned ids, with the max over the same ids.
fn partition(logits: &[f32], banned: &[u32]) -> (f32, f32) {
    let max = logits
        .iter()
        .enumerate()
        .filter(|(i, _)| !banned.contains(&(*i as u32)))
        .map(|(_, &z)| z)
        .fold(f32::NEG_INFINITY, f32::max);
    let sum = logits
        .iter()
        .enumerate()
        .filter(|(i, _)| !banned.contains(&(*i as u32)))
        .map(|(_, &z)| (z - max).exp())
        .sum();
    (max, sum)
}

/// Softmax probability of `token` over the non-banned ids of the row, in F32.
pub fn probability_excluding(logits: &[f32], token: u32, banned: &[u32]) -> f32 {
    let (max, sum) = partition(logits, banned);
    (logits[token as usize] - max).exp() / sum
}

/// Greedy candidate (§4.1): argmax, ties → lowest id; confidence = softmax over the full
/// vocabulary in F32.
///
/// This is [`minnow_model::runner::top1`], the rule `ModelRunner::forward_top1` answers with, so
/// a step fed top-1 pairs and a step fed full logits see the same candidates (bit for bit on the
/// CPU, where `forward_top1` computes them from the same logits).
pub fn greedy(logits: &[f32]) -> Candidate {
    let (token, confidence) = minnow_model::runner::top1(logits);
    Candidate { token, confidence }
}

/// Greedy candidate among the non-banned ids; the banned ids are also left out of the softmax
/// normalizer (the 2.2 port's "resample with banned tokens", §4.4). With nothing banned it is
/// [`greedy`].
pub fn greedy_excluding(logits: &[f32], banned: &[u32]) -> Candidate {
    if banned.is_empty() {
        return greedy(logits);
    }
    let token = argmax_excluding(logits, banned).unwrap_or(0);
    Candidate {
        token,
        confidence: probability_excluding(logits, token, banned),
    }
}

/// The best non-`banned` token with its probability under the *full* softmax (SGLang's
/// replacement of a MASK argmax, decoding doc §7.8/§7.9 fix 2).
pub fn best_allowed_full_softmax(logits: &[f32], banned: &[u32]) -> Candidate {
    let token = argmax_excluding(logits, banned).unwrap_or(0);
    Candidate {
        token,
        confidence: probability_excluding(logits, token, &[]),
    }
}

/// Draws an index from unnormalized non-negative `weights` (their sum must be > 0).
fn draw_index(weights: &[(u32, f64)], rng: &mut StdRng) -> u32 {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    let mut u = rng.gen::<f64>() * total;
    for &(id, w) in weights {
        if u < w {
            return id;
        }
        u -= w;
    }
    // Rounding left `u` at the very end: take the last id with weight.
    weights
        .iter()
        .rev()
        .find(|(_, w)| *w > 0.0)
        .map(|(id, _)| *id)
        .unwrap_or(0)
}

/// Sampler settings shared by both sampling rules. `top_k == 0` and `top_p >= 1` are "off";
/// `top_p == 0` keeps only the most likely token (both top-p rules always keep it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerSettings {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

impl SamplerSettings {
    pub const GREEDY: SamplerSettings = SamplerSettings {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    fn top_p_active(&self) -> bool {
        self.top_p >= 0.0 && self.top_p < 1.0
    }

    fn filters_off(&self) -> bool {
        self.top_k == 0 && !self.top_p_active()
    }

    /// Whether the official sampler reduces to [`greedy`] (temperature 0, no top-k/top-p): its
    /// candidates are then exactly the top-1 pairs a runner can return without full logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 && self.filters_off()
    }
}

/// The official 2.0/2.1 sampler (decoding doc §4.2).
///
/// With temperature 0 the filters still shape the confidence (the official code filters, takes
/// the softmax, then the argmax); without filters that is exactly [`greedy`].
#[derive(Clone, Copy, Debug)]
pub struct OfficialSampler(pub SamplerSettings);

impl OfficialSampler {
    pub fn candidate(&self, logits: &[f32], rng: &mut StdRng) -> Candidate {
        let s = self.0;
        if s.is_greedy() {
            return greedy(logits);
        }
        let mut z: Vec<f32> = if s.temperature > 0.0 && s.temperature != 1.0 {
            logits.iter().map(|&x| x / s.temperature).collect()
        } else {
            logits.to_vec()
        };
        if s.top_k > 0 {
            let k = s.top_k.min(z.len());
            let mut values = z.clone();
            let (_, kth, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            let kth = *kth;
            // Entries equal to the k-th value survive.
            z.iter_mut()
                .filter(|x| **x < kth)
                .for_each(|x| *x = f32::NEG_INFINITY);
        }
        if s.top_p_active() {
            apply_official_top_p(&mut z, s.top_p);
        }
        let (max, sum) = partition(&z, &[]);
        let token = if s.temperature > 0.0 {
            let weights: Vec<(u32, f64)> = z
                .iter()
                .enumerate()
                .map(|(i, &x)| (i as u32, ((x - max).exp()) as f64))
                .filter(|(_, w)| *w > 0.0)
                .collect();
            draw_index(&weights, rng)
        } else {
            argmax_excluding(&z, &[]).unwrap_or(0)
        };
        Candidate {
            token,
            confidence: (z[token as usize] - max).exp() / sum,
        }
    }
}

/// Official top-p: sort descending, cumulative softmax, drop entries whose cumulative mass is
/// `> p` after shifting the drop mask one place right (the crossing token and the top token are
/// always kept).
fn apply_official_top_p(z: &mut [f32], p: f32) {
    let mut order: Vec<usize> = (0..z.len()).collect();
    // Stable sort keeps lower ids first among equal values, like a descending torch.sort would
    // need some rule; ours is documented and deterministic.
    order.sort_by(|&a, &b| z[b].total_cmp(&z[a]));
    let max = z[order[0]];
    let weights: Vec<f32> = order.iter().map(|&i| (z[i] - max).exp()).collect();
    let total: f32 = weights.iter().sum();
    let mut cumulative = 0.0f32;
    let mut drop = vec![false; order.len()];
    for (rank, w) in weights.iter().enumerate() {
        cumulative += w / total;
        if cumulative > p && rank + 1 < order.len() {
            drop[rank + 1] = true;
        }
    }
    for (rank, &i) in order.iter().enumerate() {
        if drop[rank] {
            z[i] = f32::NEG_INFINITY;
        }
    }
}

/// The 2.2 port's mask-to-token sampler (decoding doc §4.4).
#[derive(Clone, Copy, Debug)]
pub struct PortSampler(pub SamplerSettings);

impl PortSampler {
    /// Whether every candidate is the greedy one among the allowed ids (temperature 0; the
    /// filters do not change an argmax).
    pub fn is_greedy(&self) -> bool {
        self.0.temperature <= 0.0
    }

    /// Candidate for a masked slot, never one of `banned`. Temperature 0: greedy among the allowed
    /// ids. Otherwise draw from the tempered, top-k/top-p filtered allowed ids; the confidence is
    /// the drawn token's untempered softmax probability over the allowed ids.
    pub fn candidate(&self, logits: &[f32], banned: &[u32], rng: &mut StdRng) -> Candidate {
        let s = self.0;
        if self.is_greedy() {
            return greedy_excluding(logits, banned);
        }
        let mut ids: Vec<u32> = (0..logits.len() as u32)
            .filter(|id| !banned.contains(id))
            .collect();
        if ids.is_empty() {
            return greedy(logits);
        }
        if s.top_k > 0 && s.top_k < ids.len() {
            // Keep every id whose logit is >= the k-th largest (ties at the k-th survive).
            let mut values: Vec<f32> = ids.iter().map(|&id| logits[id as usize]).collect();
            let (_, kth, _) = values.select_nth_unstable_by(s.top_k - 1, |a, b| b.total_cmp(a));
            let kth = *kth;
            ids.retain(|&id| logits[id as usize] >= kth);
        }
        let z_max = ids
            .iter()
            .map(|&id| logits[id as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut weights: Vec<(u32, f64)> = ids
            .iter()
            .map(|&id| {
                let w = (((logits[id as usize] - z_max) / s.temperature) as f64).exp();
                (id, w)
            })
            .collect();
        if s.top_p_active() {
            weights = nucleus(weights, s.top_p as f64);
        }
        let token = draw_index(&weights, rng);
        Candidate {
            token,
            confidence: probability_excluding(logits, token, banned),
        }
    }
}

/// The port's top-p: the shortest prefix of the ids sorted by weight (= logit) descending, ties
/// → lower id, whose normalized cumulative weight exceeds `p` (the crossing id included).
///
/// Only ids with a non-negligible weight (≥ 1e-12 of the total) are sorted: the others cannot
/// reach the crossing unless `p > 1 − V·1e-12`, in which case every id is kept anyway. This keeps
/// a full-vocabulary sort (150k ids per masked slot) out of every sampling step.
fn nucleus(weights: Vec<(u32, f64)>, p: f64) -> Vec<(u32, f64)> {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    let (mut heavy, light): (Vec<_>, Vec<_>) =
        weights.into_iter().partition(|(_, w)| *w >= total * 1e-12);
    heavy.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut cumulative = 0.0;
    for rank in 0..heavy.len() {
        cumulative += heavy[rank].1 / total;
        if cumulative > p {
            heavy.truncate(rank + 1);
            return heavy;
        }
    }
    heavy.extend(light);
    heavy
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn greedy_takes_lowest_id_on_ties_and_full_softmax() {
        let c = greedy(&[1.0, 3.0, 3.0, 0.0]);
        assert_eq!(c.token, 1);
        let e = |x: f32| x.exp();
        let expected = e(3.0) / (e(1.0) + 2.0 * e(3.0) + e(0.0));
        assert!((c.confidence - expected).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_bit_identical_to_argmax_and_full_softmax_probability() {
        // The definition greedy had before it became runner::top1, which golden decodes pin:
        // argmax (ties → lowest id), then exp(z_t − max) / Σ exp(z − max).
        let rows: [&[f32]; 5] = [
            &[0.1, 2.5, -1.0, 2.5, 0.3],
            &[-3.0, -3.0, -3.0],
            &[17.25, -4.5, 3.0, 16.0, 0.0, 12.5],
            &[f32::NEG_INFINITY, 1.0, 1.0e-7, -2.0],
            &[0.7],
        ];
        for row in rows {
            let token = argmax_excluding(row, &[]).unwrap();
            let c = greedy(row);
            assert_eq!(c.token, token, "{row:?}");
            let expected = probability_excluding(row, token, &[]);
            assert_eq!(c.confidence.to_bits(), expected.to_bits(), "{row:?}");
            assert_eq!(greedy_excluding(row, &[]), c);
        }
    }

    #[test]
    fn official_sampler_is_greedy_only_without_temperature_and_filters() {
        assert!(SamplerSettings::GREEDY.is_greedy());
        let with = |temperature, top_k, top_p| SamplerSettings {
            temperature,
            top_k,
            top_p,
        };
        assert!(!with(0.5, 0, 1.0).is_greedy());
        assert!(!with(0.0, 1, 1.0).is_greedy());
        assert!(!with(0.0, 0, 0.9).is_greedy());
        assert!(with(0.0, 0, 1.5).is_greedy(), "top_p >= 1 is off");
    }

    #[test]
    fn greedy_excluding_renormalizes_over_allowed_ids() {
        let logits = [5.0, 1.0, 1.0];
        let c = greedy_excluding(&logits, &[0]);
        assert_eq!(c.token, 1);
        assert!((c.confidence - 0.5).abs() < 1e-6);
        let full = best_allowed_full_softmax(&logits, &[0]);
        assert_eq!(full.token, 1);
        assert!(full.confidence < 0.05);
    }

    #[test]
    fn official_sampler_is_greedy_at_temperature_zero() {
        let logits = [0.5, 2.0, -1.0];
        let c = OfficialSampler(SamplerSettings::GREEDY).candidate(&logits, &mut rng());
        assert_eq!(c, greedy(&logits));
    }

    #[test]
    fn official_top_k_renormalizes_confidence_even_when_greedy() {
        let logits = [0.0, 2.0, 1.0, 1.0];
        let s = SamplerSettings {
            temperature: 0.0,
            top_k: 2,
            top_p: 1.0,
        };
        // k-th (2nd) largest is 1.0; both entries equal to it survive.
        let c = OfficialSampler(s).candidate(&logits, &mut rng());
        assert_eq!(c.token, 1);
        let e = |x: f32| x.exp();
        assert!((c.confidence - e(2.0) / (e(2.0) + 2.0 * e(1.0))).abs() < 1e-6);
    }

    #[test]
    fn official_top_p_keeps_the_crossing_token() {
        // probabilities ≈ [0.6652, 0.2447, 0.0900]; p = 0.7 keeps ids 0 and 1.
        let mut z = vec![2.0, 1.0, 0.0];
        apply_official_top_p(&mut z, 0.7);
        assert_eq!(z[..2], [2.0, 1.0]);
        assert_eq!(z[2], f32::NEG_INFINITY);
        // p smaller than the top mass (even 0) still keeps the top token.
        for p in [0.1, 0.0] {
            let mut z = vec![2.0, 1.0, 0.0];
            apply_official_top_p(&mut z, p);
            assert_eq!(z[0], 2.0);
            assert!(z[1..].iter().all(|x| *x == f32::NEG_INFINITY));
        }
    }

    #[test]
    fn official_sampling_is_seeded_and_confidence_is_filtered_probability() {
        let logits = [1.0, 1.2, 0.9, -3.0];
        let s = SamplerSettings {
            temperature: 0.8,
            top_k: 3,
            top_p: 1.0,
        };
        let a: Vec<Candidate> = {
            let mut r = rng();
            (0..20)
                .map(|_| OfficialSampler(s).candidate(&logits, &mut r))
                .collect()
        };
        let b: Vec<Candidate> = {
            let mut r = rng();
            (0..20)
                .map(|_| OfficialSampler(s).candidate(&logits, &mut r))
                .collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|c| c.token != 3), "top-k removed id 3");
        let tokens: std::collections::BTreeSet<u32> = a.iter().map(|c| c.token).collect();
        assert!(
            tokens.len() > 1,
            "sampling should not be constant: {tokens:?}"
        );
        for c in &a {
            let z: Vec<f32> = logits[..3].iter().map(|x| x / 0.8).collect();
            let expected = probability_excluding(&z, c.token, &[]);
            assert!((c.confidence - expected).abs() < 1e-6);
        }
    }

    #[test]
    fn port_sampler_uses_untempered_confidence_and_bans() {
        let logits = [3.0, 2.0, 1.0, 0.0];
        let s = SamplerSettings {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
        };
        let mut r = rng();
        for _ in 0..50 {
            let c = PortSampler(s).candidate(&logits, &[0], &mut r);
            assert_ne!(c.token, 0);
            let expected = probability_excluding(&logits, c.token, &[0]);
            assert!((c.confidence - expected).abs() < 1e-6);
        }
        let greedy_port = PortSampler(SamplerSettings::GREEDY).candidate(&logits, &[0, 1], &mut r);
        assert_eq!(greedy_port.token, 2);
    }

    #[test]
    fn port_top_p_keeps_shortest_prefix_exceeding_p() {
        let logits = [2.0, 1.0, 0.0, -5.0];
        let s = SamplerSettings {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
        };
        let mut r = rng();
        // Top token alone holds ≈0.66 > 0.5: it is the only survivor.
        for _ in 0..20 {
            assert_eq!(PortSampler(s).candidate(&logits, &[], &mut r).token, 0);
        }
    }

    #[test]
    fn port_top_k_keeps_ties_and_nucleus_orders_by_weight() {
        let logits = [0.0, 2.0, 1.0, 1.0, -1.0];
        let s = SamplerSettings {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        };
        let mut r = rng();
        let seen: std::collections::BTreeSet<u32> = (0..200)
            .map(|_| PortSampler(s).candidate(&logits, &[], &mut r).token)
            .collect();
        assert_eq!(seen, [1, 2, 3].into_iter().collect());
        let kept = nucleus(vec![(0, 1.0), (1, 4.0), (2, 2.0), (3, 2.0)], 0.5);
        // 4/9 ≈ 0.44 ≤ 0.5, then 6/9 > 0.5: ids 1 and 2 (tie 2 vs 3 → lower id first).
        assert_eq!(
            kept.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(nucleus(vec![(0, 1.0), (1, 1.0)], 1.0).len(), 2);
    }
}
