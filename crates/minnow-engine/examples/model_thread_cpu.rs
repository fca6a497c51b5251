//! How much CPU time the engine's model thread (`minnow-engine`) spends per forward, and the output
//! thread (`minnow-output`) beside it, on a checkpoint run on the CPU (Linux only: the times are
//! read from `/proc/self/task/*/schedstat`).
//!
//! ```text
//! cargo run -p minnow-engine --example model_thread_cpu -- CHECKPOINT_DIR [REQUESTS] [PARALLEL]
//! ```
//!
//! The workload: `REQUESTS` (default 32) greedy requests of 400 new tokens at most, `PARALLEL`
//! (default 8) decoded at once, each with a stop string that never appears (so every block goes
//! through detokenization and the stop-string check). On the CPU runner the forward's arithmetic
//! runs on rayon's threads; what the model thread spends is the engine's own work per step plus
//! the forward's serial parts.

use std::path::PathBuf;
use std::time::Instant;

use minnow_engine::DeviceRequest;
use minnow_engine::{DecodeParams, Engine, EngineOptions, Event, GenerateRequest};

/// CPU seconds of this process's threads whose name is `name` (the scheduler's run time, in
/// nanoseconds: the first field of `/proc/self/task/TID/schedstat`).
fn thread_cpu_seconds(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut total = 0.0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let run_ns: f64 = schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        total += run_ns * 1e-9;
    }
    total
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .ok_or("usage: model_thread_cpu DIR [REQUESTS] [PARALLEL]")?,
    );
    let requests: usize = args.next().map_or(Ok(32), |v| v.parse())?;
    let parallel: usize = args.next().map_or(Ok(8), |v| v.parse())?;
    let engine = Engine::load(
        &dir,
        EngineOptions {
            device: DeviceRequest::Cpu,
            parallel,
            queue_capacity: requests,
            ..Default::default()
        },
    )?;
    let vocab = engine.tokenizer().vocab_size().min(400) as u32;
    let model_before = thread_cpu_seconds("minnow-engine");
    let output_before = thread_cpu_seconds("minnow-output");
    let began = Instant::now();
    let mut handles = Vec::new();
    for i in 0..requests {
        let prompt_ids = (0..40).map(|j| ((i * 31 + j * 7) as u32) % vocab).collect();
        handles.push(engine.submit(GenerateRequest {
            prompt_ids,
            max_tokens: Some(400),
            stop: vec!["a stop string that never appears".into()],
            params: DecodeParams {
                temperature: Some(0.0),
                ..Default::default()
            },
            ..Default::default()
        })?);
    }
    let mut tokens = 0;
    for handle in &mut handles {
        while let Some(event) = handle.blocking_next_event() {
            match event {
                Event::Done { output_ids, .. } => tokens += output_ids.len(),
                Event::Error(error) => return Err(error.into()),
                _ => {}
            }
        }
    }
    let wall = began.elapsed().as_secs_f64();
    // The model thread reports its statistics after each step; let the last report land.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let model = thread_cpu_seconds("minnow-engine") - model_before;
    let output = thread_cpu_seconds("minnow-output") - output_before;
    let forwards: u64 = engine.stats().batch_size_counts.iter().sum();
    println!(
        "{requests} requests, {parallel} at once: {tokens} tokens in {wall:.2} s ({:.0} tokens/s), {forwards} forwards",
        tokens as f64 / wall
    );
    println!(
        "model thread: {:.3} s CPU, {:.3} ms per forward; output thread: {:.3} s CPU, {:.3} ms per forward",
        model,
        1e3 * model / forwards as f64,
        output,
        1e3 * output / forwards as f64
    );
    Ok(())
}
