//! `cargo xtask bench-sampling [--vocab N] [--rows N] [--reps N] [--device]`: what the host samplers cost
//! per denoising step of a request that samples (temperature > 0): one block's rows of F32
//! logits (32 rows of mini's 157,184 ids by default) turned into candidates, for each sampler
//! rule and filter setting: one row after another on this thread, and all rows at once as a
//! decoding step takes them (`sampling::candidates`: the rows on the thread pool, the draws in
//! order).
//!
//! Two kinds of rows: "peaked" (a trained model's shape: a few dozen plausible ids well above a
//! long tail, most of the mass in the first few) and "flat" (random weights: every id within a
//! few units of the best, the worst case for top-p).
//!
//! With `--device`, the same rows (rounded to BF16, as a forward leaves them) are also drawn
//! from on the GPU (`ModelRunner::draw_rows`' kernel, one launch for the block's rows, the
//! parameters' upload and the pairs' read-back included), the column a GPU runner's sampling
//! step pays instead of copying the block's logits to the host and sampling there.

use std::time::Instant;

use clap::Parser;
use minnow_engine::sampling::{candidates, OfficialSampler, PortSampler, SamplerSettings};
use minnow_runtime::cuda::ops;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug)]
#[command(name = "bench-sampling")]
struct Args {
    /// Ids per row.
    #[arg(long, default_value_t = 157_184)]
    vocab: usize,
    /// Rows per block (one candidate each).
    #[arg(long, default_value_t = 32)]
    rows: usize,
    /// Timed repetitions (the median is printed).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also draw the rows on GPU 0.
    #[arg(long)]
    device: bool,
}

/// The block's rows on the GPU, for `--device`.
struct OnDevice {
    gpu: minnow_runtime::cuda::Gpu,
    rows: minnow_runtime::cuda::ops::LogitRows,
}

impl OnDevice {
    fn new(block: &[Vec<f32>]) -> Result<Self, String> {
        let err = |e: minnow_runtime::cuda::CudaError| e.to_string();
        let gpu = minnow_runtime::cuda::Gpu::new(0).map_err(err)?;
        let bits: Vec<u16> = block
            .iter()
            .flatten()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let rows =
            minnow_runtime::cuda::ops::LogitRows::new(&gpu, &bits, block[0].len(), block.len())
                .map_err(err)?;
        Ok(OnDevice { gpu, rows })
    }

    /// Milliseconds per launch drawing one candidate from each row under `rule`.
    fn time(&self, reps: usize, s: SamplerSettings, rule: ops::DrawRuleCode, rows: usize) -> f64 {
        let mut rng = StdRng::seed_from_u64(5);
        let params: Vec<_> = (0..rows)
            .map(|row| {
                ops::draw_params(
                    row as u32,
                    rule,
                    s.top_k as u32,
                    s.temperature,
                    s.top_p,
                    rng.gen(),
                )
            })
            .collect();
        time(reps, || {
            std::hint::black_box(self.rows.draw(&self.gpu, &params).expect("device draws"));
        })
    }
}

/// Rows of standard-normal logits times `spread`, plus (peaked) 40 ids per row raised 10 to 18
/// above them.
fn rows(vocab: usize, count: usize, spread: f32, peaked: bool) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(11);
    (0..count)
        .map(|_| {
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| {
                    // Box-Muller: one normal per pair of uniforms is enough here.
                    let (a, b): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
                    spread * (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
                })
                .collect();
            if peaked {
                for _ in 0..40 {
                    let id = rng.gen_range(0..vocab);
                    row[id] += rng.gen_range(10.0..18.0);
                }
            }
            row
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median milliseconds of `run` over `reps` timed calls after one warm-up.
fn time(reps: usize, mut run: impl FnMut()) -> f64 {
    run();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                run();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

pub fn run(args: &[String]) -> Result<(), String> {
    let args = Args::try_parse_from(
        std::iter::once("bench-sampling".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    let settings = |temperature, top_k, top_p| SamplerSettings {
        temperature,
        top_k,
        top_p,
    };
    let cases = [
        ("temperature 0.8", settings(0.8, 0, 1.0)),
        ("temperature 0.8, top-k 40", settings(0.8, 40, 1.0)),
        ("temperature 0.8, top-p 0.95", settings(0.8, 0, 0.95)),
        (
            "temperature 0.8, top-k 40, top-p 0.95",
            settings(0.8, 40, 0.95),
        ),
    ];
    println!(
        "| rows | sampler | settings | {} rows one by one (ms) | together, {} threads (ms) | on the GPU (ms) |",
        args.rows,
        rayon::current_num_threads()
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (shape, spread, peaked) in [("peaked", 2.0, true), ("flat", 1.0, false)] {
        let block = rows(args.vocab, args.rows, spread, peaked);
        let device = if args.device {
            Some(OnDevice::new(&block)?)
        } else {
            None
        };
        let on_device = |s, rule| match &device {
            Some(d) => format!("{:.3}", d.time(args.reps, s, rule, args.rows)),
            None => "-".to_string(),
        };
        for (name, s) in cases {
            let mut rng = StdRng::seed_from_u64(3);
            let official = time(args.reps, || {
                for row in &block {
                    std::hint::black_box(OfficialSampler(s).candidate(row, &mut rng));
                }
            });
            let port = time(args.reps, || {
                for row in &block {
                    std::hint::black_box(PortSampler(s).candidate(row, &[], &mut rng));
                }
            });
            let views: Vec<&[f32]> = block.iter().map(|r| r.as_slice()).collect();
            let official_together = time(args.reps, || {
                std::hint::black_box(candidates(&OfficialSampler(s), &views, &mut rng));
            });
            let port_together = time(args.reps, || {
                std::hint::black_box(candidates(&PortSampler(s), &views, &mut rng));
            });
            let official_device = on_device(s, ops::DrawRuleCode::Official);
            let port_device = on_device(s, ops::DrawRuleCode::Port);
            println!(
                "| {shape} | official (2.0/2.1) | {name} | {official:.2} | {official_together:.2} | {official_device} |"
            );
            println!(
                "| {shape} | port (2.2) | {name} | {port:.2} | {port_together:.2} | {port_device} |"
            );
        }
    }
    Ok(())
}
