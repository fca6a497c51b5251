//! Embedding minnow-engine: load a checkpoint, render a chat prompt with its own template,
//! submit it, and print each finished block as it arrives.
//!
//! ```text
//! cargo run -p minnow-engine --example generate -- [CHECKPOINT_DIR] [PROMPT]
//! ```
//!
//! Without arguments it runs on the bundled tiny LLaDA2.1 fixture (random weights: the text is
//! noise, but every step of the pipeline is real).

use std::io::Write;
use std::path::PathBuf;

use minnow_engine::{
    ChatMessage, ChatPrompt, DecodeParams, Engine, EngineOptions, Event, GenerateRequest,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/llada2-tiny-v21"
        ))
    });
    let prompt = args
        .next()
        .unwrap_or_else(|| "Write a haiku about rivers.".to_string());

    let engine = Engine::load(&dir, EngineOptions::default())?;
    let info = engine.info();
    eprintln!(
        "loaded {} ({}, block {}, context {}) on {}",
        info.path.display(),
        info.family,
        info.block_size,
        info.n_ctx,
        info.device
    );

    // The checkpoint's chat template turns the conversation into prompt ids (what the user
    // typed stays text, even if it spells a control token; the template ends with the
    // assistant's turn by default).
    let (prompt_ids, rendered) = engine.chat_prompt_ids(&ChatPrompt {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: prompt,
            ..Default::default()
        }],
        ..Default::default()
    })?;

    let mut handle = engine.submit(GenerateRequest {
        prompt_ids,
        forced_prefix: rendered.forced_prefix,
        max_tokens: Some(96),
        // Every decoding parameter can be overridden per request; `None` keeps the family's
        // default (LLaDA2.1: joint threshold 0.5, editing threshold 0.0, 16 post steps).
        params: DecodeParams {
            seed: Some(7),
            ..Default::default()
        },
        ..Default::default()
    })?;

    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::PrefillProgress {
                processed, total, ..
            } => eprintln!("prefill {processed}/{total}"),
            Event::Block {
                text_delta, stats, ..
            } => {
                print!("{text_delta}");
                std::io::stdout().flush()?;
                eprintln!(
                    "\n[block {}: {} tokens after {} forwards]",
                    stats.block_index, stats.tokens, stats.forwards
                );
            }
            Event::Done {
                finish_reason,
                stats,
                ..
            } => {
                println!();
                eprintln!(
                    "finished ({finish_reason:?}): {} tokens, {} denoise + {} commit forwards ({} commits merged), {:.1} tokens/s",
                    stats.completion_tokens,
                    stats.denoise_forwards,
                    stats.commit_forwards,
                    stats.merged_commits,
                    stats.tokens_per_second
                );
            }
            Event::Error(error) => return Err(error.into()),
        }
    }
    Ok(())
}
