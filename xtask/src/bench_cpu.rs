//! `cargo xtask bench-cpu --model DIR [--reps N]`: the CPU numbers of docs/performance.md, on a
//! checkpoint from `cargo xtask make-checkpoint` (or a real one):
//!
//! 1. one full forward with logits for every row over 1,056 tokens (33 blocks), from an empty
//!    cache;
//! 2. one 32-token refinement forward with logits over a cached 1,024-token prefix (the forward
//!    a denoising step runs), discarded after each run by truncating back to 1,024.
//!
//! Token ids are a fixed pseudo-random sequence; the timings include everything the runner does
//! (embedding to logits), nothing else.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use minnow_model::{CpuRunner, LogitsRows, SingleSequence};

#[derive(Parser, Debug)]
#[command(name = "bench-cpu")]
struct Args {
    /// Checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// Repetitions of the full forward (the refinement runs 4× as many).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Tokens of the full forward.
    #[arg(long, default_value_t = 1056)]
    full: usize,
    /// Cached prefix of the refinement forward.
    #[arg(long, default_value_t = 1024)]
    prefix: usize,
}

pub fn run(args: &[String]) -> Result<(), String> {
    let args =
        Args::try_parse_from(std::iter::once("bench-cpu".to_string()).chain(args.iter().cloned()))
            .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut runner = SingleSequence::new(CpuRunner::load(&args.model).map_err(|e| e.to_string())?);
    let load_s = t.elapsed().as_secs_f64();
    let c = runner.config().clone();
    let block = c.block_size;
    let ids = pseudo_ids(args.full.max(args.prefix + block), c.vocab_size);

    eprintln!("warm-up ...");
    let seq = runner.create_sequence();
    runner
        .forward(seq, &ids[..block], LogitsRows::All)
        .map_err(|e| e.to_string())?;
    runner.release_sequence(seq);

    let mut full = Vec::new();
    for r in 0..args.reps {
        let seq = runner.create_sequence();
        let t = Instant::now();
        let logits = runner
            .forward(seq, &ids[..args.full], LogitsRows::All)
            .map_err(|e| e.to_string())?;
        full.push(t.elapsed().as_secs_f64());
        assert_eq!(logits.len(), args.full * c.vocab_size);
        runner.release_sequence(seq);
        eprintln!("full forward {}/{}: {:.3} s", r + 1, args.reps, full[r]);
    }

    let seq = runner.create_sequence();
    let t = Instant::now();
    runner
        .forward(seq, &ids[..args.prefix], LogitsRows::None)
        .map_err(|e| e.to_string())?;
    let prefill_s = t.elapsed().as_secs_f64();
    let refine_ids = &ids[args.prefix..args.prefix + block];
    let mut refine = Vec::new();
    for _ in 0..args.reps * 4 {
        let t = Instant::now();
        runner
            .forward(seq, refine_ids, LogitsRows::All)
            .map_err(|e| e.to_string())?;
        refine.push(t.elapsed().as_secs_f64());
        runner
            .truncate_sequence(seq, args.prefix)
            .map_err(|e| e.to_string())?;
    }

    println!("| | |");
    println!("|---|---|");
    println!("| machine | {} ({} threads) |", cpu_name(), rayon_threads());
    println!(
        "| model | {} (LLaDA{}, {} layers, hidden {}, vocab {}, {} experts top-{}) |",
        args.model.display(),
        c.family.version(),
        c.num_hidden_layers,
        c.hidden_size,
        c.vocab_size,
        c.num_experts,
        c.num_experts_per_tok
    );
    println!("| load (mmap + validation) | {load_s:.2} s |");
    println!(
        "| full forward, {} tokens, logits for all rows | median {:.3} s, min {:.3} s ({} runs) |",
        args.full,
        median(&full),
        min(&full),
        full.len()
    );
    println!(
        "| prefill {} tokens, no logits | {prefill_s:.3} s |",
        args.prefix
    );
    println!(
        "| refinement forward, {block} tokens over {} cached, logits | median {:.1} ms, min {:.1} ms ({} runs) |",
        args.prefix,
        median(&refine) * 1e3,
        min(&refine) * 1e3,
        refine.len()
    );
    Ok(())
}

/// A fixed pseudo-random id sequence (xorshift), so runs are comparable.
fn pseudo_ids(n: usize, vocab: usize) -> Vec<u32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
