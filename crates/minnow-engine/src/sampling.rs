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
//!
//! A sampled candidate is two steps ([`RowSampler`]): preparing the row's filtered distribution
//! (passes over its whole vocabulary) and the draw (one uniform from the request's generator).
//! A decoding step prepares its rows on the thread pool and draws in slot order ([`candidates`]),
//! which gives what a slot-by-slot loop gives, draws included. The samplers' exponentials are
//! `exp_fast` (within 2 ulps of `f32::exp`, and vectorizable) and their sums go in fixed lanes;
//! greedy keeps the library's `exp` and a plain sum, the arithmetic the GPU's top-1 and the
//! golden decodes pin.

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

/// Ids per block of [`walk`] and [`sum_exp`].
const BLOCK: usize = 256;

/// The index where `u · total` falls when `weights` (non-negative, in walk order) are laid end
/// to end, `total` being their sum: the draw of both sampling rules, with `u` uniform in [0, 1).
/// The sums go by blocks of [`BLOCK`] (each in four lanes, in F64), then the walk enters the
/// one block where the point falls; rounding can leave the point past a block's last positive
/// weight, which is taken then. `None` when no weight is positive.
fn walk(weights: &[f32], u: f64) -> Option<usize> {
    let block_sum = |block: &[f32]| {
        let mut lanes = [0.0f64; 4];
        let quads = block.chunks_exact(4);
        let rest = quads.remainder();
        for quad in quads {
            for (lane, &w) in lanes.iter_mut().zip(quad) {
                *lane += w as f64;
            }
        }
        lanes.iter().sum::<f64>() + rest.iter().map(|&w| w as f64).sum::<f64>()
    };
    let sums: Vec<f64> = weights.chunks(BLOCK).map(block_sum).collect();
    let mut rest = u * sums.iter().sum::<f64>();
    let last_positive = |block: usize| {
        let start = block * BLOCK;
        weights[start..(start + BLOCK).min(weights.len())]
            .iter()
            .rposition(|&w| w > 0.0)
            .map(|i| start + i)
    };
    for (b, &sum) in sums.iter().enumerate() {
        if rest < sum {
            let start = b * BLOCK;
            for (i, &w) in weights[start..].iter().take(BLOCK).enumerate() {
                let w = w as f64;
                if w > 0.0 && rest < w {
                    return Some(start + i);
                }
                rest -= w;
            }
            return last_positive(b);
        }
        rest -= sum;
    }
    (0..sums.len()).rev().find_map(last_positive)
}

/// `e^x` for the samplers' weights, within 2 F32 ulps of `f32::exp` (`e^0` exactly 1, 0 below
/// -87.3 where the F32 result would be subnormal): a rounding to the nearest power of two and a
/// degree-7 polynomial on the remainder, with no calls or branches, so the loops over a row's
/// 150k ids vectorize. A draw over a row costs a pass or two of these; with the library's `exp`
/// per id that was most of a sampling step's host time.
#[inline(always)]
fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that k * LN2_HI is exact for the k that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to an integer (round half to even).
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.clamp(-87.3, 88.7);
    let shifted = clamped * LOG2E + ROUND;
    let k = shifted - ROUND;
    let r = clamped - k * LN2_HI - k * LN2_LO;
    // Cephes' expf polynomial on [-ln 2 / 2, ln 2 / 2].
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^k as two factors, so that k = 128 (x near 88.7) does not overflow the exponent field.
    let k = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let half = k >> 1;
    let power = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    if x < -87.3 {
        0.0
    } else {
        e * power(half) * power(k - half)
    }
}

/// `Σ exp(x - max)` over `xs` in eight interleaved partial sums, the exponentials taken a block
/// at a time into a buffer (a loop the compiler vectorizes, where one that also adds does not).
fn sum_exp(xs: &[f32], max: f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut buffer = [0.0f32; BLOCK];
    let whole = xs.len() / 8 * 8;
    for block in xs[..whole].chunks(BLOCK) {
        let exps = &mut buffer[..block.len()];
        for (e, &x) in exps.iter_mut().zip(block) {
            *e = exp_fast(x - max);
        }
        for eight in exps.chunks_exact(8) {
            for (lane, &e) in lanes.iter_mut().zip(eight) {
                *lane += e;
            }
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for &x in &xs[whole..] {
        sum += exp_fast(x - max);
    }
    sum
}

/// `Σ xs` in eight interleaved partial sums (the same order as [`sum_exp`]'s).
fn sum_lanes(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let eights = xs.chunks_exact(8);
    let rest = eights.remainder();
    for eight in eights {
        for (lane, &x) in lanes.iter_mut().zip(eight) {
            *lane += x;
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// The largest value of `xs` (NaN ignored; -inf for an empty slice).
fn max_of(xs: &[f32]) -> f32 {
    xs.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// The k-th largest value of `values` (1-based k <= len) in `f32::total_cmp`'s order. For the
/// small k of sampling requests one pass keeps the k largest seen so far; larger k select on a
/// copy.
fn kth_largest(values: impl Iterator<Item = f32> + Clone, k: usize) -> f32 {
    if k > 256 {
        let mut copy: Vec<f32> = values.collect();
        let (_, kth, _) = copy.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        return *kth;
    }
    // Ascending: best[0] is the k-th largest once k values are in.
    let mut best: Vec<f32> = Vec::with_capacity(k + 1);
    for x in values {
        if best.len() == k {
            if x.total_cmp(&best[0]).is_le() {
                continue;
            }
            best.remove(0);
        }
        let at = best.partition_point(|b| b.total_cmp(&x).is_lt());
        best.insert(at, x);
    }
    best[0]
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

/// A candidate's work split in two: what depends only on the row (filters, weights; the
/// expensive part, which rows can do in parallel) and the draw (one uniform from the request's
/// generator, taken in slot order so that the stream is the one a slot-by-slot loop consumes).
pub trait RowSampler: Sync {
    /// The row's filtered distribution.
    type Prepared: Send;

    fn prepare(&self, logits: &[f32]) -> Self::Prepared;

    /// Whether [`RowSampler::draw`] takes a uniform for this row (exactly one when it does).
    fn draws(&self, prepared: &Self::Prepared) -> bool;

    /// The candidate, with `u` uniform in [0, 1) (ignored when the row draws nothing).
    fn draw_at(&self, prepared: &Self::Prepared, logits: &[f32], u: f64) -> Candidate;

    /// The candidate, with the uniform (if the row draws) taken from `rng`.
    fn draw(&self, prepared: &Self::Prepared, logits: &[f32], rng: &mut StdRng) -> Candidate {
        let u = if self.draws(prepared) {
            rng.gen::<f64>()
        } else {
            0.0
        };
        self.draw_at(prepared, logits, u)
    }

    /// One row's candidate, drawing from `rng` when it samples.
    fn candidate_of(&self, logits: &[f32], rng: &mut StdRng) -> Candidate {
        self.draw(&self.prepare(logits), logits, rng)
    }
}

/// The candidates of several rows: each row prepared on the thread pool, then the draws taken
/// from `rng` in row order. The same candidates, and the same generator state afterwards, as
/// [`RowSampler::candidate_of`] called row after row.
pub fn candidates<S: RowSampler>(sampler: &S, rows: &[&[f32]], rng: &mut StdRng) -> Vec<Candidate> {
    use rayon::prelude::*;
    let prepared: Vec<S::Prepared> = rows.par_iter().map(|row| sampler.prepare(row)).collect();
    prepared
        .iter()
        .zip(rows)
        .map(|(p, row)| sampler.draw(p, row, rng))
        .collect()
}

/// The candidate a device draw ([`minnow_model::RowDraw`]) asks for, drawn here from the row's
/// F32 `logits` by the host samplers with the draw's uniform: what a runner without a device of
/// its own can answer `ModelRunner::draw_rows` with (the engine's tests do), and the reference a
/// device's draws are compared with.
pub fn draw_on_host(draw: &minnow_model::RowDraw, logits: &[f32]) -> Candidate {
    let settings = SamplerSettings {
        temperature: draw.temperature,
        top_k: draw.top_k,
        top_p: draw.top_p,
    };
    match draw.rule {
        minnow_model::DrawRule::Official => {
            let sampler = OfficialSampler(settings);
            sampler.draw_at(&sampler.prepare(logits), logits, draw.uniform)
        }
        minnow_model::DrawRule::Port => {
            let sampler = PortSampler(settings);
            sampler.draw_at(&sampler.prepare(logits), logits, draw.uniform)
        }
    }
}

/// The official 2.0/2.1 sampler (decoding doc §4.2).
///
/// With temperature 0 the filters still shape the confidence (the official code filters, takes
/// the softmax, then the argmax); without filters that is exactly [`greedy`].
#[derive(Clone, Copy, Debug)]
pub struct OfficialSampler(pub SamplerSettings);

/// One row's filtered, tempered distribution under the official sampler.
#[derive(Debug)]
pub enum OfficialRow {
    /// Temperature 0 without filters: the greedy candidate.
    Greedy(Candidate),
    Filtered {
        /// The ids the filters keep, ascending (`None`: every id).
        kept: Option<Vec<u32>>,
        /// `exp(z - max)` of each kept id (z the tempered logit, max the largest kept z),
        /// in the order of `kept`.
        weights: Vec<f32>,
        /// Their sum (`sum_lanes`): the softmax's normalizer over the kept ids.
        sum: f32,
        /// The lowest kept id with the largest z (the candidate at temperature 0).
        argmax: usize,
    },
}

impl OfficialSampler {
    pub fn candidate(&self, logits: &[f32], rng: &mut StdRng) -> Candidate {
        self.candidate_of(logits, rng)
    }

    /// Whether a sampling step can read each row's `listed` best ids instead of its full
    /// logits: it samples, and its top-k keeps fewer ids than the list holds, so the list
    /// usually holds every id the filters keep ([`OfficialSampler::prepare_best`] says when it
    /// does not).
    pub fn reads_best_ids(&self, listed: usize) -> bool {
        !self.0.is_greedy() && self.0.top_k >= 1 && self.0.top_k < listed
    }

    /// [`RowSampler::prepare`] from a row's best ids (`(id, logit)`, larger logit first, lower
    /// id first among equal ones; `whole_row` when they are every id of the row): the same
    /// distribution, bit for bit, when the list holds every id the filters keep. `None` when it
    /// may not: ties at the k-th value reaching the list's end, or a top-k beyond it. The
    /// greedy sampler (no filters) reads top-1 pairs instead, and gets `None` here too.
    pub fn prepare_best(&self, best: &[(u32, f32)], whole_row: bool) -> Option<OfficialRow> {
        if !self.best_ids_answer(best, whole_row) {
            return None;
        }
        let kth = self.tempered(best[self.0.top_k - 1].1);
        let mut kept: Vec<(u32, f32)> = best
            .iter()
            .map(|&(id, x)| (id, self.tempered(x)))
            .filter(|&(_, z)| z >= kth || z.is_nan())
            .collect();
        kept.sort_unstable_by_key(|&(id, _)| id);
        Some(self.filtered(kept))
    }

    /// Whether a row's best ids hold every id the filters keep, the condition of
    /// [`OfficialSampler::prepare_best`] (without building the distribution).
    pub fn best_ids_answer(&self, best: &[(u32, f32)], whole_row: bool) -> bool {
        let k = self.0.top_k;
        if self.0.is_greedy() || k == 0 || k > best.len() {
            return false;
        }
        // The list is in descending order, which tempering keeps: its k-th is the row's. It
        // answers when its last value falls below the k-th. A NaN there (the list puts NaN
        // last, and the filters keep NaN) compares false: the full row is read.
        whole_row || self.tempered(best[best.len() - 1].1) < self.tempered(best[k - 1].1)
    }

    /// A logit divided by the temperature (unchanged at temperature 0 or 1).
    fn tempered(&self, x: f32) -> f32 {
        let t = self.0.temperature;
        if t > 0.0 && t != 1.0 {
            x / t
        } else {
            x
        }
    }

    /// The official filters and weights over the top-k survivors `kept` (`(id, tempered
    /// logit)`, ascending ids): what [`RowSampler::prepare`] computes once its top-k has run.
    fn filtered(&self, kept: Vec<(u32, f32)>) -> OfficialRow {
        let s = self.0;
        let mut ids: Vec<u32> = kept.iter().map(|&(id, _)| id).collect();
        let value = |at: usize| kept[at].1;
        let mut max = (0..kept.len()).map(value).fold(f32::NEG_INFINITY, f32::max);
        if s.top_p_active() {
            // official_top_p over the survivors, indexed by their place in `kept`.
            let places: Vec<f32> = kept.iter().map(|&(_, z)| z).collect();
            let local: Vec<u32> = (0..kept.len() as u32).collect();
            let keep = official_top_p(&places, Some(local), max, s.top_p);
            ids = keep.iter().map(|&at| kept[at as usize].0).collect();
            let values: Vec<f32> = keep.iter().map(|&at| value(at as usize)).collect();
            max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            return self.weighted(Some(ids), values, max);
        }
        let values: Vec<f32> = kept.iter().map(|&(_, z)| z).collect();
        self.weighted(Some(ids), values, max)
    }

    /// The row's weights `exp(z - max)` over `values` (the kept ids' tempered logits, in the
    /// order of `kept`, ascending ids; every id when `None`), their sum and the argmax.
    fn weighted(&self, kept: Option<Vec<u32>>, values: Vec<f32>, max: f32) -> OfficialRow {
        let weights: Vec<f32> = values.iter().map(|&z| exp_fast(z - max)).collect();
        let sum = sum_lanes(&weights);
        // At temperature 0 the candidate is the lowest kept id with the largest value (strict
        // `>` keeps the lowest on ties; NaN never wins).
        let mut argmax = 0;
        if self.0.temperature <= 0.0 {
            for at in 0..values.len() {
                if values[at] > values[argmax] {
                    argmax = at;
                }
            }
        }
        OfficialRow::Filtered {
            kept,
            weights,
            sum,
            argmax,
        }
    }
}

impl RowSampler for OfficialSampler {
    type Prepared = OfficialRow;

    fn prepare(&self, logits: &[f32]) -> OfficialRow {
        let s = self.0;
        if s.is_greedy() {
            return OfficialRow::Greedy(greedy(logits));
        }
        let z: Vec<f32> = logits.iter().map(|&x| self.tempered(x)).collect();
        if s.top_k > 0 {
            let kth = kth_largest(z.iter().copied(), s.top_k.min(z.len()));
            // Entries equal to the k-th value survive (and NaN, which the reference's `x < kth`
            // test does not drop either).
            let kept: Vec<(u32, f32)> = (0..z.len() as u32)
                .map(|i| (i, z[i as usize]))
                .filter(|&(_, x)| x >= kth || x.is_nan())
                .collect();
            return self.filtered(kept);
        }
        let max = max_of(&z);
        if s.top_p_active() {
            let kept = official_top_p(&z, None, max, s.top_p);
            let values: Vec<f32> = kept.iter().map(|&i| z[i as usize]).collect();
            let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            return self.weighted(Some(kept), values, max);
        }
        self.weighted(None, z, max)
    }

    fn draws(&self, prepared: &OfficialRow) -> bool {
        matches!(prepared, OfficialRow::Filtered { .. }) && self.0.temperature > 0.0
    }

    fn draw_at(&self, prepared: &OfficialRow, _logits: &[f32], u: f64) -> Candidate {
        match prepared {
            OfficialRow::Greedy(c) => *c,
            OfficialRow::Filtered {
                kept,
                weights,
                sum,
                argmax,
            } => {
                let at = if self.0.temperature > 0.0 {
                    walk(weights, u).unwrap_or(0)
                } else {
                    *argmax
                };
                let token = match kept {
                    None => at as u32,
                    Some(ids) => ids.get(at).copied().unwrap_or(0),
                };
                Candidate {
                    token,
                    confidence: weights.get(at).map_or(0.0, |w| w / sum),
                }
            }
        }
    }
}

/// Official top-p over the ids `kept` (every id when `None`) of the tempered row `z`, whose
/// largest kept value is `max`: order the ids by value (descending, ties → lower id), add up
/// their softmax probabilities, and keep the shortest prefix whose sum exceeds `p` (the crossing
/// id and the top id always kept). Returns the kept ids ascending.
///
/// Only a prefix of the order is ever needed, so the whole row is not sorted: the ids within a
/// distance of `max` are, growing the distance until their mass crosses `p` (every id outside
/// has a smaller value, so the order's prefix is theirs). The normalizer is summed in sorted
/// order where the filters left few ids, over a whole row in eight interleaved sums (the
/// reference sums in sorted order; the two differ in the last bits of an F32).
fn official_top_p(z: &[f32], kept: Option<Vec<u32>>, max: f32, p: f32) -> Vec<u32> {
    let by_value = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));
    let weight = |i: u32| exp_fast(z[i as usize] - max);
    // The length of the kept prefix of `sorted`, if its mass crosses `p` inside it.
    let prefix = |sorted: &[u32], total: f32| -> Option<usize> {
        let mut cumulative = 0.0f32;
        for (rank, &i) in sorted.iter().enumerate() {
            cumulative += weight(i) / total;
            if cumulative > p {
                return Some(rank + 1);
            }
        }
        None
    };
    let keep = |mut sorted: Vec<u32>, len: Option<usize>| {
        if let Some(len) = len {
            sorted.truncate(len);
        }
        sorted.sort_unstable();
        sorted
    };
    if let Some(mut ids) = kept {
        ids.sort_by(by_value);
        let total: f32 = ids.iter().map(|&i| weight(i)).sum();
        let len = prefix(&ids, total);
        return keep(ids, len);
    }
    let total = sum_exp(z, max);
    for distance in [8.0f32, 16.0, 32.0, 64.0] {
        let floor = max - distance;
        let mut ids: Vec<u32> = (0..z.len() as u32)
            .filter(|&i| z[i as usize] >= floor)
            .collect();
        ids.sort_by(by_value);
        if let Some(len) = prefix(&ids, total) {
            return keep(ids, Some(len));
        }
    }
    let mut ids: Vec<u32> = (0..z.len() as u32).collect();
    ids.sort_by(by_value);
    let len = prefix(&ids, total);
    keep(ids, len)
}

/// The 2.2 port's mask-to-token sampler (decoding doc §4.4).
#[derive(Clone, Copy, Debug)]
pub struct PortSampler(pub SamplerSettings);

/// One row's drawable ids under the port sampler.
#[derive(Debug)]
pub enum PortRow {
    /// Greedy (temperature 0) or nothing allowed: the candidate as it is.
    Fixed(Candidate),
    Drawn {
        /// The drawable ids, ascending: the order a draw walks them (`None`: every id).
        ids: Option<Vec<u32>>,
        /// Their tempered weights `exp((z - max) / temperature)`, in the same order.
        weights: Vec<f32>,
        /// The largest allowed logit and `Σ exp(z - max)` over the allowed ids: the untempered
        /// softmax the confidence is taken under.
        max: f32,
        sum: f32,
    },
}

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
        self.draw(&self.prepare_excluding(logits, banned), logits, rng)
    }

    /// [`RowSampler::prepare`] with `banned` ids left out of the candidates and the normalizer.
    pub fn prepare_excluding(&self, logits: &[f32], banned: &[u32]) -> PortRow {
        let s = self.0;
        if self.is_greedy() {
            return PortRow::Fixed(greedy_excluding(logits, banned));
        }
        let allowed = |id: u32| banned.is_empty() || !banned.contains(&id);
        let n = logits.len() as u32;
        let (max, sum, count) = if banned.is_empty() {
            let max = max_of(logits);
            (max, sum_exp(logits, max), logits.len())
        } else {
            let allowed_logits = || {
                (0..n)
                    .filter(|&id| allowed(id))
                    .map(|id| logits[id as usize])
            };
            let max = allowed_logits().fold(f32::NEG_INFINITY, f32::max);
            let sum = allowed_logits().map(|z| exp_fast(z - max)).sum();
            (max, sum, allowed_logits().count())
        };
        if count == 0 {
            return PortRow::Fixed(greedy(logits));
        }
        let weight = |z: f32| exp_fast((z - max) / s.temperature);
        let top_k = s.top_k > 0 && s.top_k < count;
        if !top_k && !s.top_p_active() && banned.is_empty() {
            let t = s.temperature;
            let weights = logits.iter().map(|&z| exp_fast((z - max) / t)).collect();
            return PortRow::Drawn {
                ids: None,
                weights,
                max,
                sum,
            };
        }
        // Keep every id whose logit is >= the k-th largest (ties at the k-th survive). The
        // largest allowed logit always stays, so `max` is also the kept ids' largest.
        let floor = if top_k {
            kth_largest(
                (0..n)
                    .filter(|&id| allowed(id))
                    .map(|id| logits[id as usize]),
                s.top_k,
            )
        } else {
            f32::NEG_INFINITY
        };
        let mut pairs: Vec<(u32, f64)> = (0..n)
            .filter(|&id| allowed(id) && logits[id as usize] >= floor)
            .map(|id| (id, weight(logits[id as usize]) as f64))
            .collect();
        if s.top_p_active() {
            // The draw walks the kept ids in ascending order, as every draw here and on the
            // device does (the nucleus comes heaviest first).
            pairs = nucleus(pairs, s.top_p as f64);
            pairs.sort_unstable_by_key(|&(id, _)| id);
        }
        PortRow::Drawn {
            ids: Some(pairs.iter().map(|&(id, _)| id).collect()),
            weights: pairs.iter().map(|&(_, w)| w as f32).collect(),
            max,
            sum,
        }
    }
}

impl RowSampler for PortSampler {
    type Prepared = PortRow;

    /// The row with nothing banned.
    fn prepare(&self, logits: &[f32]) -> PortRow {
        self.prepare_excluding(logits, &[])
    }

    fn draws(&self, prepared: &PortRow) -> bool {
        matches!(prepared, PortRow::Drawn { .. })
    }

    fn draw_at(&self, prepared: &PortRow, logits: &[f32], u: f64) -> Candidate {
        match prepared {
            PortRow::Fixed(c) => *c,
            PortRow::Drawn {
                ids,
                weights,
                max,
                sum,
            } => {
                // No positive weight happens only for rows of NaN: their first id.
                let at = walk(weights, u).unwrap_or(0);
                let token = match ids {
                    None => at as u32,
                    Some(ids) => ids.get(at).copied().unwrap_or(0),
                };
                Candidate {
                    token,
                    confidence: exp_fast(logits[token as usize] - max) / sum,
                }
            }
        }
    }
}

/// The port's top-p: the shortest prefix of the ids sorted by weight (= logit) descending, ties
/// → lower id, whose normalized cumulative weight exceeds `p` (the crossing id included).
///
/// Only a prefix of that order is needed, so not every id is sorted: first those within a
/// factor of the heaviest (e^-8, e^-16, e^-32 of it), as long as their mass does not cross `p`
/// (every other id is lighter, so the order's prefix is theirs); then those with a weight of at
/// least 1e-12 of the total, which can miss the crossing only when `p > 1 − V·1e-12`, where
/// every id is kept anyway. This keeps a full-vocabulary sort (150k ids per masked slot) out of
/// every sampling step.
fn nucleus(weights: Vec<(u32, f64)>, p: f64) -> Vec<(u32, f64)> {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    let heaviest = weights.iter().map(|&(_, w)| w).fold(0.0, f64::max);
    let by_weight = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    // The length of the kept prefix of `sorted`, if its mass crosses `p` inside it.
    let crossing = |sorted: &[(u32, f64)]| {
        let mut cumulative = 0.0;
        sorted.iter().position(|&(_, w)| {
            cumulative += w / total;
            cumulative > p
        })
    };
    for factor in [(-8.0f64).exp(), (-16.0f64).exp(), (-32.0f64).exp()] {
        let mut near: Vec<(u32, f64)> = weights
            .iter()
            .copied()
            .filter(|&(_, w)| w >= heaviest * factor)
            .collect();
        near.sort_by(by_weight);
        if let Some(rank) = crossing(&near) {
            near.truncate(rank + 1);
            return near;
        }
    }
    let (mut heavy, light): (Vec<_>, Vec<_>) =
        weights.into_iter().partition(|(_, w)| *w >= total * 1e-12);
    heavy.sort_by(by_weight);
    if let Some(rank) = crossing(&heavy) {
        heavy.truncate(rank + 1);
        return heavy;
    }
    heavy.extend(light);
    heavy
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

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
        let z = [2.0, 1.0, 0.0];
        assert_eq!(official_top_p(&z, None, 2.0, 0.7), vec![0, 1]);
        assert_eq!(
            official_top_p(&z, Some(vec![0, 1, 2]), 2.0, 0.7),
            vec![0, 1]
        );
        // p smaller than the top mass (even 0) still keeps the top token.
        for p in [0.1, 0.0] {
            assert_eq!(official_top_p(&z, None, 2.0, p), vec![0]);
        }
        // A mass that never crosses p keeps everything.
        assert_eq!(official_top_p(&z, None, 2.0, 0.999_999_9), vec![0, 1, 2]);
    }

    #[test]
    fn official_top_p_orders_ties_by_id_and_finds_crossings_far_below_the_top() {
        // Ids 3 and 1 tie at the top: the lower id comes first, so p = 0.3 keeps only id 1.
        let z = [0.0, 5.0, -1.0, 5.0];
        assert_eq!(official_top_p(&z, None, 5.0, 0.3), vec![1]);
        assert_eq!(official_top_p(&z, None, 5.0, 0.6), vec![1, 3]);
        // 10,000 ids 9 below a top id that holds 45 % of the mass: the crossing lies past the
        // first distance the search tries, among ties that go by id.
        let mut z = vec![-9.0f32; 10_000];
        z[7] = 0.0;
        let kept = official_top_p(&z, None, 0.0, 0.5);
        let others: Vec<u32> = (0..10_000)
            .filter(|&i| i != 7)
            .take(kept.len() - 1)
            .collect();
        assert!(kept.len() > 800 && kept.len() < 1_000, "{}", kept.len());
        assert!(kept.contains(&7));
        assert!(
            others.iter().all(|i| kept.contains(i)),
            "the lowest ids of the tie"
        );
    }

    #[test]
    fn kth_largest_is_the_selection_of_a_sorted_copy() {
        let mut r = rng();
        for len in [1usize, 7, 300, 2_000] {
            // Few distinct values, so ties at the k-th are common; signed zeros and infinities.
            let mut values: Vec<f32> = (0..len).map(|_| r.gen_range(-4..4) as f32 / 2.0).collect();
            values[0] = -0.0;
            if len > 3 {
                values[1] = 0.0;
                values[2] = f32::NEG_INFINITY;
                values[3] = f32::INFINITY;
            }
            let mut sorted = values.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for k in [1, 2.min(len), len / 2 + 1, len.min(256), len.min(257), len] {
                let got = kth_largest(values.iter().copied(), k);
                assert_eq!(got.to_bits(), sorted[k - 1].to_bits(), "len {len} k {k}");
            }
        }
    }

    /// The samplers as they were written first (a full-vocabulary pass per filter, a full sort
    /// for the official top-p): the fast ones must pick what these pick.
    mod reference {
        use super::super::*;

        fn draw_index(weights: &[(u32, f64)], rng: &mut StdRng) -> u32 {
            let total: f64 = weights.iter().map(|(_, w)| w).sum();
            let mut u = rng.gen::<f64>() * total;
            for &(id, w) in weights {
                if u < w {
                    return id;
                }
                u -= w;
            }
            weights
                .iter()
                .rev()
                .find(|(_, w)| *w > 0.0)
                .map(|(id, _)| *id)
                .unwrap_or(0)
        }

        fn apply_official_top_p(z: &mut [f32], p: f32) {
            let mut order: Vec<usize> = (0..z.len()).collect();
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

        pub fn official(s: SamplerSettings, logits: &[f32], rng: &mut StdRng) -> Candidate {
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

        pub fn port(
            s: SamplerSettings,
            logits: &[f32],
            banned: &[u32],
            rng: &mut StdRng,
        ) -> Candidate {
            if s.temperature <= 0.0 {
                return greedy_excluding(logits, banned);
            }
            let mut ids: Vec<u32> = (0..logits.len() as u32)
                .filter(|id| !banned.contains(id))
                .collect();
            if ids.is_empty() {
                return greedy(logits);
            }
            if s.top_k > 0 && s.top_k < ids.len() {
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
                // Drawn in ascending id order (the first sampler walked the nucleus heaviest
                // first; the rule is now the same walk as every other draw's).
                weights = nucleus(weights, s.top_p as f64);
                weights.sort_by_key(|&(id, _)| id);
            }
            let token = draw_index(&weights, rng);
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
            Candidate {
                token,
                confidence: probability_excluding(logits, token, banned),
            }
        }
    }

    /// Rows of 3,000 ids: peaked (a few ids far above the rest) and flat, with ties.
    fn test_rows() -> Vec<Vec<f32>> {
        let mut r = rng();
        (0..12)
            .map(|i| {
                let mut row: Vec<f32> = (0..3_000).map(|_| r.gen_range(-3.0f32..3.0)).collect();
                if i % 2 == 0 {
                    for _ in 0..20 {
                        let id = r.gen_range(0..row.len());
                        row[id] += r.gen_range(4.0..12.0);
                    }
                }
                if i % 3 == 0 {
                    row[5] = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                }
                row
            })
            .collect()
    }

    fn all_settings() -> Vec<SamplerSettings> {
        let mut out = Vec::new();
        for temperature in [0.0, 0.7, 1.0, 1.5] {
            for top_k in [0, 1, 5, 40, 300] {
                for top_p in [1.0, 0.0, 0.5, 0.95] {
                    out.push(SamplerSettings {
                        temperature,
                        top_k,
                        top_p,
                    });
                }
            }
        }
        out
    }

    #[test]
    fn exp_fast_is_within_two_ulps_of_exp() {
        let mut r = rng();
        let grid = (0..200_000).map(|i| -87.29 + i as f32 * (175.9 / 200_000.0));
        let random: Vec<f32> = (0..100_000).map(|_| r.gen_range(-87.29f32..88.7)).collect();
        for x in grid
            .chain(random)
            .chain([-1e-30, 1e-30, -0.3466, 0.3466, 88.7])
        {
            let (got, want) = (exp_fast(x), x.exp());
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}) = {want}, fast {got} ({ulps} ulps)");
        }
        assert_eq!(exp_fast(0.0), 1.0, "the top id weighs exactly 1");
        assert_eq!(exp_fast(-0.0), 1.0);
        for x in [-87.31, -100.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp_fast(x), 0.0, "{x}");
        }
    }

    #[test]
    fn fast_samplers_pick_what_the_first_samplers_picked() {
        // The same draws, and the same ids except where top-p's crossing moved by a rounding
        // (an id whose cumulative mass lies within rounding of p). The confidences differ by the
        // exponential's rounding (2 ulps) and the order of the normalizer's sum: at most n·eps
        // relative for n ids.
        let rows = test_rows();
        let bound = rows[0].len() as f32 * f32::EPSILON;
        let close = |a: f32, b: f32| (a - b).abs() <= bound * b.abs();
        let (mut draws, mut moved) = (0, 0);
        for s in all_settings() {
            let (mut a, mut b) = (rng(), rng());
            let mut check = |got: Candidate, want: Candidate, what: &str| {
                draws += 1;
                if got.token != want.token {
                    assert!(s.top_p_active(), "{what} {s:?}: {got:?} against {want:?}");
                    moved += 1;
                } else {
                    assert!(
                        close(got.confidence, want.confidence),
                        "{what} {s:?}: {got:?} {want:?}"
                    );
                }
            };
            for row in &rows {
                for _ in 0..3 {
                    let want = reference::official(s, row, &mut a);
                    check(OfficialSampler(s).candidate(row, &mut b), want, "official");
                    for banned in [&[][..], &[7, 5]] {
                        let want = reference::port(s, row, banned, &mut a);
                        check(PortSampler(s).candidate(row, banned, &mut b), want, "port");
                    }
                }
            }
            assert_eq!(a.gen::<u64>(), b.gen::<u64>(), "the same draws were taken");
        }
        assert!(
            moved * 100 <= draws,
            "{moved} of {draws} draws picked another id"
        );
    }

    /// What a draw would see of a prepared row: ids and weights in walk order, sum, argmax.
    fn drawable(row: &OfficialRow, vocab: usize) -> (Vec<u32>, Vec<u32>, u32, usize) {
        match row {
            OfficialRow::Greedy(c) => (vec![c.token], vec![], c.confidence.to_bits(), 0),
            OfficialRow::Filtered {
                kept,
                weights,
                sum,
                argmax,
            } => (
                kept.clone().unwrap_or_else(|| (0..vocab as u32).collect()),
                weights.iter().map(|w| w.to_bits()).collect(),
                sum.to_bits(),
                *argmax,
            ),
        }
    }

    #[test]
    fn best_ids_give_the_full_rows_distribution_or_say_they_cannot() {
        let mut rows = test_rows();
        // A row whose values repeat (as BF16 logits do): ties at the k-th run past 64 ids.
        rows.push((0..3_000).map(|i| (i % 7) as f32).collect());
        let (mut answered, mut declined) = (0, 0);
        for s in all_settings() {
            let sampler = OfficialSampler(s);
            for row in &rows {
                let best = minnow_model::runner::top_k(row, 64);
                match sampler.prepare_best(&best, false) {
                    Some(from_best) => {
                        assert!(sampler.reads_best_ids(64), "{s:?}");
                        let from_row = sampler.prepare(row);
                        assert_eq!(
                            drawable(&from_best, row.len()),
                            drawable(&from_row, row.len()),
                            "{s:?}"
                        );
                        answered += 1;
                    }
                    None => {
                        // Declined only where it must: no sampling top-k within the list, or a
                        // tie at the k-th value that reaches the list's end.
                        let k = s.top_k;
                        let tie = (1..=64).contains(&k) && {
                            let t = |x: f32| {
                                if s.temperature > 0.0 && s.temperature != 1.0 {
                                    x / s.temperature
                                } else {
                                    x
                                }
                            };
                            t(best[63].1) >= t(best[k - 1].1)
                        };
                        assert!(!sampler.reads_best_ids(64) || tie, "{s:?} declined");
                        declined += usize::from(sampler.reads_best_ids(64));
                    }
                }
            }
        }
        assert!(
            answered > 100 && declined > 0,
            "{answered} answered, {declined} declined"
        );
        // The whole row as its own list always answers.
        let row = &rows[0];
        let s = SamplerSettings {
            temperature: 0.7,
            top_k: 5,
            top_p: 0.9,
        };
        let whole = minnow_model::runner::top_k(row, row.len());
        let sampler = OfficialSampler(s);
        assert_eq!(
            drawable(&sampler.prepare_best(&whole, true).unwrap(), row.len()),
            drawable(&sampler.prepare(row), row.len())
        );
    }

    #[test]
    fn several_rows_at_once_give_the_row_by_row_candidates_and_draws() {
        let rows = test_rows();
        let views: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        for s in all_settings() {
            let (mut a, mut b) = (rng(), rng());
            let one_by_one: Vec<Candidate> = views
                .iter()
                .map(|row| OfficialSampler(s).candidate(row, &mut a))
                .collect();
            assert_eq!(candidates(&OfficialSampler(s), &views, &mut b), one_by_one);
            let one_by_one: Vec<Candidate> = views
                .iter()
                .map(|row| PortSampler(s).candidate(row, &[], &mut a))
                .collect();
            assert_eq!(candidates(&PortSampler(s), &views, &mut b), one_by_one);
            assert_eq!(
                a.gen::<u64>(),
                b.gen::<u64>(),
                "{s:?}: the same draws were taken"
            );
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
