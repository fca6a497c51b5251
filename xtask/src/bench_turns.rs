//! `cargo xtask bench-turns --model DIR [--device cpu|cuda:N] [--prompt N]` (or `--random-mini`
//! for random LLaDA2.2-mini weights on GPU 0): how much sooner a
//! conversation's second turn reaches its first denoising forward when the prefix cache holds the
//! first turn (warm) than when it must prefill everything (cold).
//!
//! Turn 1 is `--prompt` pseudo-random ids plus a 32-token answer; turn 2 is turn 1's prompt and
//! answer plus 24 new ids, run once with the cache (warm) and once with `cache_prompt` off
//! (cold), each as the only request. "Until the first denoising forward" is the engine's prefill
//! time (`GenerationStats::prefill_seconds`: the forwards of the uncached prompt blocks); the
//! wall time from submit to the first finished block is printed beside it. Both runs must
//! generate the same answer (the cache may change how fast, never what): the table says whether
//! they did, and the command fails after printing it when they did not. The engine's
//! tokenizer comes from the bundled fixture (the ids are below its vocabulary), so any random
//! checkpoint from `make-checkpoint` works.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use minnow_engine::{DecodeParams, Engine, EngineOptions, Event, GenerateRequest, GenerationStats};
use minnow_runtime::device::DeviceRequest;

#[derive(Parser, Debug)]
#[command(name = "bench-turns")]
struct Args {
    /// Checkpoint directory.
    #[arg(long, required_unless_present = "random_mini")]
    model: Option<PathBuf>,
    /// Instead of a checkpoint: random weights at LLaDA2.2-mini shapes on GPU 0.
    #[arg(long)]
    random_mini: bool,
    #[arg(long, default_value = "cpu")]
    device: DeviceRequest,
    /// Where the engine's tokenizer and template come from (the ids stay below its vocabulary).
    #[arg(long, default_value = FIXTURE)]
    tokenizer_dir: PathBuf,
    /// Tokens of the first turn's prompt.
    #[arg(long, default_value_t = 1000)]
    prompt: usize,
}

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/llada2-tiny-v21"
);

pub fn run(args: &[String]) -> Result<(), String> {
    let args = Args::try_parse_from(
        std::iter::once("bench-turns".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    let options = EngineOptions {
        device: args.device,
        parallel: 1,
        ..Default::default()
    };
    let runner: Box<dyn minnow_model::ModelRunner> = match &args.model {
        Some(model) => {
            minnow_engine::engine::select_runner(model, &options).map_err(|e| e.to_string())?
        }
        None => {
            let config = minnow_model::Config::from_json_str(
                crate::bench::MINI_22,
                std::path::Path::new("<LLaDA2.2-mini shapes>"),
            )
            .map_err(|e| e.to_string())?;
            Box::new(
                minnow_model::cuda::CudaRunner::random(config, 0, 2201)
                    .map_err(|e| e.to_string())?,
            )
        }
    };
    let device = runner.device_name();
    let engine =
        Engine::with_runner(&args.tokenizer_dir, runner, options).map_err(|e| e.to_string())?;

    let turn1 = pseudo_ids(args.prompt, 0x9E37_79B9);
    let (answer, _, _) = generate(&engine, turn1.clone(), true)?;
    let turn2: Vec<u32> = [turn1, answer, pseudo_ids(24, 7)].concat();
    // Cold first, so the warm run cannot profit from anything the cold one left behind but the
    // first turn's blocks (cache_prompt off neither reads nor writes the cache).
    let (cold_answer, cold, cold_first_block) = generate(&engine, turn2.clone(), false)?;
    let (warm_answer, warm, warm_first_block) = generate(&engine, turn2.clone(), true)?;
    let same_answer = match cold_answer
        .iter()
        .zip(&warm_answer)
        .position(|(c, w)| c != w)
    {
        None if cold_answer.len() == warm_answer.len() => "equal".to_string(),
        None => format!(
            "DIFFERENT: {} vs {} tokens",
            cold_answer.len(),
            warm_answer.len()
        ),
        Some(i) => format!("DIFFERENT from token {i}"),
    };

    println!(
        "| second turn of {} tokens ({device}) | cold | warm | cold / warm |",
        turn2.len()
    );
    println!("|---|---|---|---|");
    println!(
        "| cached prompt tokens | {} | {} | |",
        cold.cached_tokens, warm.cached_tokens
    );
    println!(
        "| until the first denoising forward (prefill) | {:.1} ms | {:.1} ms | {:.1}x |",
        cold.prefill_seconds * 1e3,
        warm.prefill_seconds * 1e3,
        cold.prefill_seconds / warm.prefill_seconds.max(1e-9)
    );
    println!(
        "| submit to first finished block | {:.1} ms | {:.1} ms | {:.1}x |",
        cold_first_block * 1e3,
        warm_first_block * 1e3,
        cold_first_block / warm_first_block.max(1e-9)
    );
    println!(
        "| answer ({} tokens) | cold = warm: {same_answer} | | |",
        cold_answer.len()
    );
    if cold_answer != warm_answer {
        return Err(format!(
            "the warm second turn generated another answer than the cold one ({same_answer}): the cache changed what was generated, so the speed-up above compares different work"
        ));
    }
    Ok(())
}

/// Runs one greedy request of 32 new tokens; returns its output ids, statistics and the seconds
/// from submit to its first finished block.
fn generate(
    engine: &Engine,
    prompt: Vec<u32>,
    cache: bool,
) -> Result<(Vec<u32>, GenerationStats, f64), String> {
    let began = Instant::now();
    let mut handle = engine
        .submit(GenerateRequest {
            prompt_ids: prompt,
            max_tokens: Some(32),
            params: DecodeParams {
                temperature: Some(0.0),
                ..Default::default()
            },
            cache_prompt: Some(cache),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let mut first_block = None;
    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::Block { .. } => {
                first_block.get_or_insert(began.elapsed().as_secs_f64());
            }
            Event::Done {
                output_ids, stats, ..
            } => {
                let first = first_block.unwrap_or(began.elapsed().as_secs_f64());
                return Ok((output_ids, stats, first));
            }
            Event::Error(e) => return Err(e.to_string()),
            Event::PrefillProgress { .. } => {}
        }
    }
    Err("the request ended without Done".into())
}

/// Fixed pseudo-random ids below the fixture tokenizer's ordinary vocabulary.
fn pseudo_ids(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 400) as u32
        })
        .collect()
}
