//! Sampled candidates drawn on the GPU (`ModelRunner::draw_rows`, `kernels/sample.cu`) against
//! the host samplers (`sampling::draw_on_host`) on the same BF16 rows with the same uniforms, at
//! the real vocabulary: peaked rows (a trained model's shape) and flat ones, both rules, with and
//! without top-k and top-p. Ignored in CI (no GPU); on a CUDA machine:
//!
//! ```sh
//! cargo test --release -p minnow-engine --test gpu_draws -- --ignored --nocapture
//! ```
//!
//! The device sums fixed-point weights and the host F32 ones, so a uniform that falls within
//! rounding of a boundary between two ids may pick the neighbour: the test allows one draw in a
//! thousand to differ, and prints how many did.

use minnow_engine::sampling::draw_on_host;
use minnow_model::{DrawRule, RowDraw};
use minnow_runtime::cuda::{ops, DeviceBuffer, Gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 157_184;
const K: usize = 64;

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

struct Device {
    gpu: Gpu,
    logits: DeviceBuffer<u16>,
    top: DeviceBuffer<u32>,
    scratch: DeviceBuffer<f32>,
    best: DeviceBuffer<u32>,
    params: DeviceBuffer<u32>,
    out: DeviceBuffer<u32>,
    rows: usize,
}

impl Device {
    fn new(logits: &[u16], rows: usize, max_draws: usize) -> Self {
        let gpu = Gpu::new(0).expect("this test needs a CUDA GPU");
        let d = Device {
            logits: gpu.upload(logits).unwrap(),
            top: gpu.alloc(2 * rows).unwrap(),
            scratch: gpu.alloc(rows * ops::TOP1_SLICES * 3).unwrap(),
            best: gpu.alloc(2 * rows * K).unwrap(),
            params: gpu.alloc(max_draws * ops::DRAW_PARAM_WORDS).unwrap(),
            out: gpu.alloc(2 * max_draws).unwrap(),
            rows,
            gpu,
        };
        // What a forward's top-k step leaves beside its logits.
        let g = &d.gpu;
        ops::top1_softmax(
            g,
            d.logits.ptr(),
            d.scratch.ptr(),
            d.top.ptr(),
            d.top.ptr_at(rows),
            rows,
            VOCAB,
        )
        .unwrap();
        ops::topk_rows(
            g,
            d.logits.ptr(),
            d.best.ptr(),
            d.best.ptr_at(rows * K),
            rows,
            VOCAB,
            K,
        )
        .unwrap();
        g.synchronize().unwrap();
        d
    }

    fn draw(&self, draws: &[RowDraw]) -> Vec<(u32, f32)> {
        let mut params = Vec::new();
        for d in draws {
            let rule = match d.rule {
                DrawRule::Official => ops::DrawRuleCode::Official,
                DrawRule::Port => ops::DrawRuleCode::Port,
            };
            params.extend(ops::draw_params(
                d.row as u32,
                rule,
                d.top_k as u32,
                d.temperature,
                d.top_p,
                d.uniform,
            ));
        }
        let g = &self.gpu;
        g.write(&self.params, 0, &params).unwrap();
        ops::draw_rows(
            g,
            self.logits.ptr(),
            self.best.ptr_at(self.rows * K),
            K,
            self.top.ptr(),
            self.top.ptr_at(self.rows),
            self.params.ptr(),
            self.out.ptr(),
            draws.len(),
            VOCAB,
        )
        .unwrap();
        let mut out = vec![0u32; 2 * draws.len()];
        g.read(&self.out, 0, &mut out).unwrap();
        out.chunks_exact(2)
            .map(|p| (p[0], f32::from_bits(p[1])))
            .collect()
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_draws_pick_what_the_host_samplers_pick() {
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
    let uniforms = 16;
    let device = Device::new(&logits, n, n * uniforms);
    let settings: &[(f32, usize, f32)] = &[
        (0.8, 0, 1.0),
        (1.0, 0, 1.0),
        (1.3, 0, 0.9),
        (0.7, 40, 1.0),
        (0.9, 200, 0.95),
        (1.0, 1000, 1.0),
        (0.6, 0, 0.5),
        (1.0, 3, 0.0),
        // The official rule's filters at temperature 0: the argmax among the survivors.
        (0.0, 0, 0.7),
        (0.0, 500, 1.0),
    ];
    let (mut draws_total, mut differ) = (0usize, 0usize);
    let mut worst_confidence = 0f64;
    for rule in [DrawRule::Official, DrawRule::Port] {
        for &(temperature, top_k, top_p) in settings {
            if rule == DrawRule::Port && temperature <= 0.0 {
                continue; // the port rule is greedy there and draws nothing
            }
            let draws: Vec<RowDraw> = (0..n * uniforms)
                .map(|i| RowDraw {
                    row: i % n,
                    rule,
                    temperature,
                    top_k,
                    top_p,
                    uniform: rng.gen(),
                })
                .collect();
            let got = device.draw(&draws);
            for (d, &(token, confidence)) in draws.iter().zip(&got) {
                let want = draw_on_host(d, &host_rows[d.row]);
                draws_total += 1;
                if want.token != token {
                    differ += 1;
                    println!(
                        "{rule:?} t={temperature} k={top_k} p={top_p} row {} u={}: device {token}, host {}",
                        d.row, d.uniform, want.token
                    );
                    continue;
                }
                let rel = ((confidence as f64 - want.confidence as f64)
                    / (want.confidence as f64).max(1e-30))
                .abs();
                worst_confidence = worst_confidence.max(rel);
                assert!(
                    rel <= 1e-4,
                    "{rule:?} t={temperature} k={top_k} p={top_p} row {}: confidence {confidence} \
                     against the host's {}",
                    d.row,
                    want.confidence
                );
            }
        }
    }
    println!(
        "{differ} of {draws_total} draws picked another id than the host; worst confidence \
         difference {worst_confidence:.2e} (relative)"
    );
    assert!(
        differ * 1000 <= draws_total,
        "{differ} of {draws_total} draws differ"
    );

    // What a step's draws cost: one request's 32 rows, and sixteen requests' 512.
    for count in [32usize, 128] {
        let draws: Vec<RowDraw> = (0..count)
            .map(|i| RowDraw {
                row: i % n,
                rule: DrawRule::Official,
                temperature: 0.8,
                top_k: 0,
                top_p: 0.95,
                uniform: rng.gen(),
            })
            .collect();
        let device = Device::new(&logits, n, count);
        device.draw(&draws);
        let start = std::time::Instant::now();
        for _ in 0..20 {
            device.draw(&draws);
        }
        println!(
            "{count} draws (temperature 0.8, top-p 0.95): {:.1} us per call, upload and read back included",
            start.elapsed().as_secs_f64() * 1e6 / 20.0
        );
    }
}
