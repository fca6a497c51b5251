//! `cargo xtask bench-structured --model DIR [--device cpu|cuda:N]` (or `--random-mini` for
//! random LLaDA2.2-mini weights on GPU 0): structured outputs' cost.
//!
//! 1. Compile + first mask of a typical JSON Schema (`SCHEMA`) over a vocabulary of the real
//!    checkpoints' size: a synthetic byte-level vocabulary of `--vocab` tokens (the 256 bytes,
//!    then words and word pieces with and without a leading space, digits and punctuation runs),
//!    since no real LLaDA2 tokenizer ships with the repository. The vocabulary trie is built
//!    once per engine and reported apart.
//! 2. Decode throughput with and without the schema at each `--concurrency` level: that many
//!    greedy requests of `--tokens` new tokens submitted at once (2.1 joint algorithm), answer
//!    tokens per second of wall time. Constrained answers end when their document does, so the
//!    table also gives the tokens produced. The engine's tokenizer comes from `--tokenizer-dir`
//!    (default: the bundled fixture; prompt ids stay below its vocabulary).

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use minnow_engine::constraint::{GrammarCompiler, OutputConstraint};
use minnow_engine::text::tool_format::ToolCallFormat;
use minnow_engine::{Algorithm, DecodeParams, Engine, EngineOptions, Event, GenerateRequest};
use minnow_runtime::device::DeviceRequest;

#[derive(Parser, Debug)]
#[command(name = "bench-structured")]
struct Args {
    /// Checkpoint directory.
    #[arg(long, required_unless_present = "random_mini")]
    model: Option<PathBuf>,
    /// Instead of a checkpoint: random weights at LLaDA2.2-mini shapes on GPU 0.
    #[arg(long)]
    random_mini: bool,
    #[arg(long, default_value = "cpu")]
    device: DeviceRequest,
    #[arg(long, default_value = FIXTURE)]
    tokenizer_dir: PathBuf,
    /// Concurrent requests per measurement, comma-separated.
    #[arg(long, default_value = "1,16", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// New tokens per request.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Size of the synthetic vocabulary of the compile + first-mask measurement.
    #[arg(long, default_value_t = 157_184)]
    vocab: usize,
}

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/llada2-tiny-v21"
);

/// A typical extraction schema: nested object, enum, bounded strings and numbers, an array.
fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "developer", "viewer"]},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                },
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "address", "tags"],
        "additionalProperties": false
    })
}

pub fn run(args: &[String]) -> Result<(), String> {
    let args = Args::try_parse_from(
        std::iter::once("bench-structured".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    compile_and_first_mask(args.vocab)?;

    let runner: Box<dyn minnow_model::ModelRunner> = match &args.model {
        Some(model) => {
            let options = EngineOptions {
                device: args.device,
                ..Default::default()
            };
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
    let parallel = args.concurrency.iter().copied().max().unwrap_or(1);
    let engine = Engine::with_runner(
        &args.tokenizer_dir,
        runner,
        EngineOptions {
            parallel,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    println!(
        "| {device}, {} new tokens | requests | answer tokens | tokens/s | constrained / plain |",
        args.tokens
    );
    println!("|---|---|---|---|---|");
    for &n in &args.concurrency {
        let (plain_tokens, plain_s) = batch(&engine, n, args.tokens, None)?;
        let constraint = OutputConstraint::JsonSchema(schema());
        let (json_tokens, json_s) = batch(&engine, n, args.tokens, Some(constraint))?;
        let plain_rate = plain_tokens as f64 / plain_s;
        let json_rate = json_tokens as f64 / json_s;
        println!("| plain | {n} | {plain_tokens} | {plain_rate:.0} | |");
        println!(
            "| JSON Schema | {n} | {json_tokens} | {json_rate:.0} | {:.0}% |",
            100.0 * json_rate / plain_rate
        );
    }
    Ok(())
}

/// Trie build, then compile + first mask of `SCHEMA`, on a synthetic vocabulary of `size`.
fn compile_and_first_mask(size: usize) -> Result<(), String> {
    let tokenizer_json = synthetic_tokenizer(size);
    let compiler = GrammarCompiler::new(
        tokenizer_json.into(),
        size,
        vec![size as u32 - 1],
        ToolCallFormat::TaggedJson,
    );
    let began = Instant::now();
    compiler
        .matcher(&OutputConstraint::Regex("x".into()))
        .map_err(|e| e.to_string())?;
    let trie = began.elapsed();
    let began = Instant::now();
    let mut matcher = compiler
        .matcher(&OutputConstraint::JsonSchema(schema()))
        .map_err(|e| e.to_string())?;
    let compiled = began.elapsed();
    let mask = matcher.mask()?;
    let first_mask = began.elapsed();
    let began = Instant::now();
    let mut again = compiler
        .matcher(&OutputConstraint::JsonSchema(schema()))
        .map_err(|e| e.to_string())?;
    again.mask()?;
    let cached = began.elapsed();
    println!(
        "vocabulary of {size} tokens: trie {:.1} ms (once per engine); typical schema: compile {:.2} ms, compile + first mask {:.2} ms ({} ids allowed); again from the cache {:.2} ms",
        trie.as_secs_f64() * 1e3,
        compiled.as_secs_f64() * 1e3,
        first_mask.as_secs_f64() * 1e3,
        mask.num_set(),
        cached.as_secs_f64() * 1e3,
    );
    Ok(())
}

/// A byte-level BPE `tokenizer.json` of `size` ids (the last one `<|endoftext|>`): the 256 byte
/// symbols, then pseudo-words of 2 to 9 letters with and without a leading space, digit runs and
/// punctuation pairs, in GPT-2's byte alphabet.
fn synthetic_tokenizer(size: usize) -> Vec<u8> {
    let alphabet = byte_alphabet();
    let mut seen = std::collections::HashSet::new();
    let mut vocab = serde_json::Map::new();
    let mut push = |bytes: &[u8], vocab: &mut serde_json::Map<String, serde_json::Value>| {
        let name: String = bytes.iter().map(|&b| alphabet[b as usize]).collect();
        if seen.insert(name.clone()) {
            let id = vocab.len();
            vocab.insert(name, id.into());
        }
    };
    for b in 0..=255u8 {
        push(&[b], &mut vocab);
    }
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let punctuation = b"{}[]\":,.;!?()-_'/";
    while vocab.len() + 1 < size {
        let r = next();
        let bytes: Vec<u8> = match r % 8 {
            0 => (0..1 + r % 4)
                .map(|i| b'0' + ((r >> (8 + 4 * i)) % 10) as u8)
                .collect(),
            1 => vec![
                punctuation[(r >> 8) as usize % punctuation.len()],
                punctuation[(r >> 16) as usize % punctuation.len()],
            ],
            k => {
                let len = 2 + (r >> 8) % 8;
                let mut word: Vec<u8> = if k % 2 == 0 { vec![b' '] } else { Vec::new() };
                word.extend((0..len).map(|i| b'a' + ((r >> (12 + 3 * i)) % 26) as u8));
                word
            }
        };
        push(&bytes, &mut vocab);
    }
    let eos = vocab.len();
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "special": true}],
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    }))
    .unwrap_or_default()
}

/// GPT-2's printable stand-in for each byte.
fn byte_alphabet() -> Vec<char> {
    let mut map = vec!['\0'; 256];
    let mut k = 0x100u32;
    for b in 0..=255u32 {
        let c = char::from_u32(b).unwrap_or('?');
        let printable = matches!(c, '!'..='~' | '\u{00A1}'..='\u{00AC}' | '\u{00AE}'..='\u{00FF}');
        map[b as usize] = if printable {
            c
        } else {
            let c = char::from_u32(k).unwrap_or('?');
            k += 1;
            c
        };
    }
    map
}

/// Submits `n` greedy requests at once; returns the answer tokens and the wall seconds.
fn batch(
    engine: &Engine,
    n: usize,
    tokens: usize,
    constraint: Option<OutputConstraint>,
) -> Result<(usize, f64), String> {
    let began = Instant::now();
    let mut handles = Vec::new();
    for i in 0..n {
        let prompt: Vec<u32> = (0..40).map(|j| ((i * 131 + j * 17) % 400) as u32).collect();
        handles.push(
            engine
                .submit(GenerateRequest {
                    prompt_ids: prompt,
                    max_tokens: Some(tokens),
                    params: DecodeParams {
                        algorithm: Some(Algorithm::Joint),
                        temperature: Some(0.0),
                        ..Default::default()
                    },
                    constraint: constraint.clone(),
                    cache_prompt: Some(false),
                    ..Default::default()
                })
                .map_err(|e| e.to_string())?,
        );
    }
    let mut total = 0;
    for handle in &mut handles {
        loop {
            match handle.blocking_next_event() {
                Some(Event::Done { output_ids, .. }) => {
                    total += output_ids.len();
                    break;
                }
                Some(Event::Error(e)) => return Err(e.to_string()),
                Some(_) => {}
                None => return Err("a request ended without Done".into()),
            }
        }
    }
    Ok((total, began.elapsed().as_secs_f64()))
}
