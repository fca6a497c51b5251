//! Sampled candidates drawn on the GPU (`ModelRunner::draw_rows`, `kernels/sample.cu`) on BF16
//! rows at the real vocabulary: peaked rows (a trained model's shape) and flat ones, both rules,
//! with and without top-k and top-p. Ignored in CI (no GPU); on a CUDA machine:
//!
//! ```sh
//! cargo test --release -p minnow-engine --test gpu_draws -- --ignored --nocapture
//! ```
//!
//! The reference is the rule computed exactly (F64 weights, sums in the rule's order, the same
//! uniform): the device's integer sums are exact over F32 weights, so it must pick the exact
//! rule's id but where a uniform falls within rounding of a boundary (one draw in a thousand
//! allowed), and its confidence must be the exact one. The host samplers
//! (`sampling::draw_on_host`) are compared too and their differences printed: on flat rows their
//! F32 running sums over ~100k ids move top-p's crossing by a few ids, as the reference code's
//! F32 arithmetic does.

use minnow_engine::sampling::draw_on_host;
use minnow_model::{DrawRule, RowDraw};
use minnow_runtime::cuda::{ops, Gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 157_184;

fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn widen(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rows of BF16 logits: even rows peaked (40 ids 8-18 above a normal tail), odd rows flat.
fn rows(rng: &mut StdRng, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n * VOCAB);
    for r in 0..n {
        let mut row: Vec<f32> = (0..VOCAB)
            .map(|_| {
                let (a, b): (f32, f32) = (rng.gen(), rng.gen());
                (-2.0 * a.max(1e-12).ln()).sqrt() * (std::f32::consts::TAU * b).cos() * 1.5
            })
            .collect();
        if r % 2 == 0 {
            for _ in 0..40 {
                let id = rng.gen_range(0..VOCAB);
                row[id] += rng.gen_range(8.0..18.0);
            }
        }
        // Ties: a few ids share the best value, a few more share another.
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row[rng.gen_range(0..VOCAB)] = best;
        out.extend(row.iter().map(|&x| bf16_bits(x)));
    }
    out
}

/// A row's distribution under a draw's rule, exactly: F64 weights, the filters on the order
/// "larger logit first, lower id first", the kept ids ascending with their running sums.
struct ExactRow {
    kept: Vec<u32>,
    cumulative: Vec<f64>,
    /// The argmax (lowest id), the candidate at temperature 0.
    argmax: u32,
    /// The untempered softmax normalizer over the whole row, `sum exp(x - max)` (2.2's
    /// confidence).
    full_sum: f64,
    max: f64,
}

impl ExactRow {
    /// `order`: the row's ids in the order above (NaN left out).
    fn new(d: &RowDraw, row: &[f32], order: &[u32]) -> Self {
        let max = row[order[0] as usize] as f64;
        let t = if d.temperature > 0.0 {
            d.temperature as f64
        } else {
            1.0
        };
        let weight = |id: u32| {
            let x = row[id as usize] as f64;
            match d.rule {
                DrawRule::Official => (x / t - max / t).exp(),
                DrawRule::Port => ((x - max) / t).exp(),
            }
        };
        let mut len = order.len();
        if d.top_k > 0 && d.top_k < len {
            let kth = row[order[d.top_k - 1] as usize];
            len = order
                .iter()
                .take_while(|&&id| row[id as usize] >= kth)
                .count();
        }
        if (0.0..1.0).contains(&d.top_p) {
            let total: f64 = order[..len].iter().map(|&id| weight(id)).sum();
            let mut run = 0.0;
            for (i, &id) in order[..len].iter().enumerate() {
                run += weight(id);
                if run > d.top_p as f64 * total {
                    len = i + 1;
                    break;
                }
            }
        }
        let mut kept = order[..len].to_vec();
        kept.sort_unstable();
        let mut run = 0.0;
        let cumulative = kept
            .iter()
            .map(|&id| {
                run += weight(id);
                run
            })
            .collect();
        ExactRow {
            kept,
            cumulative,
            argmax: order[0],
            full_sum: row.iter().map(|&x| (x as f64 - max).exp()).sum(),
            max,
        }
    }

    fn total(&self) -> f64 {
        *self.cumulative.last().unwrap()
    }

    fn token(&self, d: &RowDraw) -> u32 {
        if d.temperature <= 0.0 {
            return self.argmax;
        }
        let target = d.uniform * self.total();
        let at = self.cumulative.partition_point(|&c| c <= target);
        self.kept[at.min(self.kept.len() - 1)]
    }

    fn confidence(&self, d: &RowDraw, row: &[f32], token: u32) -> f64 {
        let x = row[token as usize] as f64;
        match d.rule {
            DrawRule::Port => (x - self.max).exp() / self.full_sum,
            DrawRule::Official => {
                let at = self.kept.binary_search(&token).expect("a kept token");
                let before = if at == 0 {
                    0.0
                } else {
                    self.cumulative[at - 1]
                };
                (self.cumulative[at] - before) / self.total()
            }
        }
    }
}

/// The rows on the GPU, and their draws.
struct Device {
    gpu: Gpu,
    rows: ops::LogitRows,
}

impl Device {
    fn new(logits: &[u16], max_draws: usize) -> Self {
        let gpu = Gpu::new(0).expect("this test needs a CUDA GPU");
        let rows = ops::LogitRows::new(&gpu, logits, VOCAB, max_draws).unwrap();
        Device { gpu, rows }
    }

    fn draw(&self, draws: &[RowDraw]) -> Vec<(u32, f32)> {
        let params: Vec<_> = draws
            .iter()
            .map(|d| {
                let rule = match d.rule {
                    DrawRule::Official => ops::DrawRuleCode::Official,
                    DrawRule::Port => ops::DrawRuleCode::Port,
                };
                ops::draw_params(
                    d.row as u32,
                    rule,
                    d.top_k as u32,
                    d.temperature,
                    d.top_p,
                    d.uniform,
                )
            })
            .collect();
        self.rows.draw(&self.gpu, &params).unwrap()
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_draws_pick_what_the_exact_rule_picks() {
    let seed: u64 = std::env::var("MINNOW_DRAW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed} (replay with MINNOW_DRAW_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 8;
    let logits = rows(&mut rng, n);
    let host_rows: Vec<Vec<f32>> = logits
        .chunks_exact(VOCAB)
        .map(|r| r.iter().map(|&b| widen(b)).collect())
        .collect();
    let orders: Vec<Vec<u32>> = host_rows
        .iter()
        .map(|row| {
            let mut ids: Vec<u32> = (0..VOCAB as u32)
                .filter(|&id| !row[id as usize].is_nan())
                .collect();
            ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            ids
        })
        .collect();
    let uniforms = 16;
    let device = Device::new(&logits, n * uniforms);
    let settings: &[(f32, usize, f32)] = &[
        (0.8, 0, 1.0),
        (1.0, 0, 1.0),
        (1.3, 0, 0.9),
        (0.7, 40, 1.0),
        (0.9, 200, 0.95),
        (1.0, 1000, 1.0),
        (0.6, 0, 0.5),
        (0.8, 0, 0.95),
        (1.0, 3, 0.0),
        // The official rule's filters at temperature 0: the argmax among the survivors.
        (0.0, 0, 0.7),
        (0.0, 500, 1.0),
    ];
    // Per row kind (even rows peaked, odd ones flat): draws, device draws off the exact rule's
    // id, host draws off it.
    let (mut total, mut device_off, mut host_off) = ([0usize; 2], [0usize; 2], [0usize; 2]);
    // Worst relative confidence error per rule (official, port), the device's and the host's.
    let (mut worst, mut worst_host) = ([0f64; 2], [0f64; 2]);
    let mut failures = Vec::new();
    for rule in [DrawRule::Official, DrawRule::Port] {
        let r = usize::from(rule == DrawRule::Port);
        for &(temperature, top_k, top_p) in settings {
            if rule == DrawRule::Port && temperature <= 0.0 {
                continue; // the port rule is greedy there and draws nothing
            }
            let draws: Vec<RowDraw> = (0..n * uniforms)
                .map(|i| RowDraw {
                    segment: 0,
                    row: i % n,
                    rule,
                    temperature,
                    top_k,
                    top_p,
                    uniform: rng.gen(),
                })
                .collect();
            let exact: Vec<ExactRow> = (0..n)
                .map(|row| ExactRow::new(&draws[row], &host_rows[row], &orders[row]))
                .collect();
            let got = device.draw(&draws);
            for (d, &(token, confidence)) in draws.iter().zip(&got) {
                let kind = d.row % 2;
                let (row, want) = (&host_rows[d.row], &exact[d.row]);
                total[kind] += 1;
                let host = draw_on_host(d, row);
                let exact_token = want.token(d);
                if host.token != exact_token {
                    host_off[kind] += 1;
                } else {
                    let c = want.confidence(d, row, exact_token);
                    worst_host[r] = worst_host[r].max((host.confidence as f64 - c).abs() / c);
                }
                if token != exact_token {
                    device_off[kind] += 1;
                    println!(
                        "{rule:?} t={temperature} k={top_k} p={top_p} row {} u={}: device {token}, exact {exact_token}",
                        d.row, d.uniform
                    );
                    continue;
                }
                let c = want.confidence(d, row, token);
                let error = (confidence as f64 - c).abs() / c;
                worst[r] = worst[r].max(error);
                // 2.0/2.1: the device's weights over their exact integer total (F32 exponentials:
                // a few ulps). 2.2: exp(x - max) times the top-1 pair's probability, an F32 sum
                // over the whole row (the same number a greedy step's confidence is).
                let bound = if rule == DrawRule::Official {
                    1e-5
                } else {
                    1e-3
                };
                if error > bound {
                    failures.push(format!(
                        "{rule:?} t={temperature} k={top_k} p={top_p} row {}: confidence {confidence}, exact {c}",
                        d.row
                    ));
                }
            }
        }
    }
    println!(
        "device draws off the exact rule's id: peaked rows {} of {}, flat rows {} of {}; the host \
         samplers': peaked {}, flat {}",
        device_off[0], total[0], device_off[1], total[1], host_off[0], host_off[1]
    );
    println!(
        "worst relative confidence error, official / port: device {:.2e} / {:.2e}, host {:.2e} / {:.2e}",
        worst[0], worst[1], worst_host[0], worst_host[1]
    );

    assert!(failures.is_empty(), "confidences off: {failures:#?}");
    for kind in 0..2 {
        assert!(
            device_off[kind] * 1000 <= total[kind],
            "{} of {} draws from {} rows differ from the exact rule's",
            device_off[kind],
            total[kind],
            ["peaked", "flat"][kind]
        );
    }
}
