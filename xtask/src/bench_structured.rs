//! `cargo xtask bench-structured --model DIR [--device cpu|cuda:N]` (or `--random-mini` for
//! random LLaDA2.2-mini weights on GPU 0, or `--fake-runner` for a forward that computes nothing
//! but answers like those weights: the engine's own host cost): structured outputs' cost.
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
//!    (default: the bundled fixture; prompt ids stay below its vocabulary). Each row also gives
//!    the wall milliseconds per answer token (with `--fake-runner`, the part spent outside the
//!    runner: the engine's own cost), the requests' forwards per answer token (each request's
//!    denoising and commit forwards, which a batched step shares among the requests in it), the
//!    grammar masks per answer token (those computed beside the forward in parentheses) and the
//!    full logits rows the grammar read. A measurement
//!    still running after `--deadline-secs` is cancelled and its row says so.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

mod fake_runner;
use minnow_engine::constraint::{GrammarCompiler, OutputConstraint};
use minnow_engine::text::tool_format::ToolCallFormat;
use minnow_engine::{
    Algorithm, DecodeParams, Engine, EngineOptions, Event, FinishReason, GenerateRequest,
};
use minnow_runtime::device::DeviceRequest;

#[derive(Parser, Debug)]
#[command(name = "bench-structured")]
struct Args {
    /// Checkpoint directory.
    #[arg(long, required_unless_present_any = ["random_mini", "fake_runner"])]
    model: Option<PathBuf>,
    /// Instead of a checkpoint: random weights at LLaDA2.2-mini shapes on GPU 0.
    #[arg(long, conflicts_with = "model")]
    random_mini: bool,
    /// Instead of a checkpoint: a runner that computes nothing and returns random logits of
    /// LLaDA2.2-mini's vocabulary (the engine's host cost per answer token).
    #[arg(long, conflicts_with_all = ["model", "random_mini"])]
    fake_runner: bool,
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
    /// Longest wait for one measurement's requests, in seconds: past it they are cancelled and
    /// the row says so (the bench ends in bounded time on any device).
    #[arg(long, default_value_t = 20.0)]
    deadline_secs: f64,
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

    let mini = || {
        minnow_model::Config::from_json_str(
            crate::bench::MINI_22,
            std::path::Path::new("<LLaDA2.2-mini shapes>"),
        )
        .map_err(|e| e.to_string())
    };
    let mut runner_time = None;
    let runner: Box<dyn minnow_model::ModelRunner> = match &args.model {
        Some(model) => {
            let options = EngineOptions {
                device: args.device,
                ..Default::default()
            };
            minnow_engine::engine::select_runner(model, &options).map_err(|e| e.to_string())?
        }
        None if args.fake_runner => {
            let runner = fake_runner::FakeRunner::new(mini()?);
            runner_time = Some(runner.runner_time());
            Box::new(runner)
        }
        None => Box::new(
            minnow_model::cuda::CudaRunner::random(mini()?, 0, 2201).map_err(|e| e.to_string())?,
        ),
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
        "| {device}, {} new tokens | requests | answer tokens | tokens/s | constrained / plain | ms per answer token (host) | forwards per token | grammar masks per token (prepared) | full rows read |",
        args.tokens
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let deadline = std::time::Duration::from_secs_f64(args.deadline_secs.max(0.0));
    // One short request of each kind first: the engine builds its vocabulary's trie at its first
    // grammar (and a GPU runner captures its first graphs), which no row below should pay.
    for constraint in [None, Some(OutputConstraint::JsonSchema(schema()))] {
        batch(&engine, 1, 8, constraint, runner_time.as_ref(), deadline)?;
    }
    for &n in &args.concurrency {
        let plain = batch(
            &engine,
            n,
            args.tokens,
            None,
            runner_time.as_ref(),
            deadline,
        )?;
        println!(
            "| plain | {n}{} | {} | {:.0} | | {} | {:.2} | | |",
            plain.unfinished(n),
            plain.tokens,
            plain.rate(),
            plain.per_token(),
            plain.forwards_per_token(),
        );
        let constraint = Some(OutputConstraint::JsonSchema(schema()));
        let json = batch(
            &engine,
            n,
            args.tokens,
            constraint,
            runner_time.as_ref(),
            deadline,
        )?;
        let ratio = if plain.finished == n && json.finished == n {
            format!("{:.0}%", 100.0 * json.rate() / plain.rate())
        } else {
            "not measured".into()
        };
        println!(
            "| JSON Schema | {n}{} | {} | {:.0} | {ratio} | {} | {:.2} | {:.2} ({:.2}) | {} |",
            json.unfinished(n),
            json.tokens,
            json.rate(),
            json.per_token(),
            json.forwards_per_token(),
            json.masks as f64 / json.tokens.max(1) as f64,
            json.masks_prepared as f64 / json.tokens.max(1) as f64,
            json.rows_read,
        );
        std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
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

/// One measurement: `n` requests submitted at once.
struct Measured {
    /// Requests that finished before the deadline.
    finished: usize,
    /// Answer tokens of the finished requests.
    tokens: usize,
    seconds: f64,
    /// Seconds spent inside a `--fake-runner` runner (its forwards and row reads).
    runner_seconds: Option<f64>,
    /// The finished requests' denoising and commit forwards.
    forwards: usize,
    /// Grammar masks the requests computed, and how many of them beside the forward.
    masks: usize,
    masks_prepared: usize,
    /// Full logits rows read because a top-K held no allowed token.
    rows_read: usize,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }

    fn forwards_per_token(&self) -> f64 {
        self.forwards as f64 / self.tokens.max(1) as f64
    }

    /// What the requests column adds when some of the `n` requests missed the deadline.
    fn unfinished(&self, n: usize) -> String {
        if self.finished == n {
            String::new()
        } else {
            format!(" ({} finished before the deadline)", self.finished)
        }
    }

    /// Wall milliseconds per answer token, and the part outside the runner when known.
    fn per_token(&self) -> String {
        let per = |s: f64| 1e3 * s / self.tokens.max(1) as f64;
        match self.runner_seconds {
            Some(inside) => format!(
                "{:.3} ({:.3} outside the runner)",
                per(self.seconds),
                per(self.seconds - inside)
            ),
            None => format!("{:.3}", per(self.seconds)),
        }
    }
}

/// Submits `n` greedy requests at once and waits for them all, or cancels those still running
/// at `deadline`.
fn batch(
    engine: &Engine,
    n: usize,
    tokens: usize,
    constraint: Option<OutputConstraint>,
    runner_time: Option<&fake_runner::RunnerTime>,
    deadline: std::time::Duration,
) -> Result<Measured, String> {
    let began = Instant::now();
    let inside_before = runner_time.map(|t| t.get());
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
    let cancels: Vec<_> = handles.iter().map(|h| h.cancel_token()).collect();
    let (finished_tx, finished_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = finished_rx.recv_timeout(deadline).is_err();
        if late {
            cancels.iter().for_each(|c| c.cancel());
        }
        late
    });
    let mut measured = Measured {
        finished: 0,
        tokens: 0,
        seconds: 0.0,
        runner_seconds: None,
        forwards: 0,
        masks: 0,
        masks_prepared: 0,
        rows_read: 0,
    };
    for handle in &mut handles {
        loop {
            match handle.blocking_next_event() {
                Some(Event::Done {
                    finish_reason: FinishReason::Cancelled,
                    ..
                }) => break,
                Some(Event::Done {
                    output_ids, stats, ..
                }) => {
                    measured.finished += 1;
                    measured.tokens += output_ids.len();
                    measured.forwards += stats.denoise_forwards + stats.commit_forwards;
                    measured.masks += stats.grammar_masks;
                    measured.masks_prepared += stats.grammar_masks_prepared;
                    measured.rows_read += stats.grammar_rows_read;
                    break;
                }
                // Cancelled at the deadline (the watchdog says so below), or a real error.
                Some(Event::Error(e)) if began.elapsed() < deadline => return Err(e.to_string()),
                Some(Event::Error(_)) | None => break,
                Some(_) => {}
            }
        }
    }
    measured.seconds = began.elapsed().as_secs_f64();
    let _ = finished_tx.send(());
    let late = watchdog
        .join()
        .map_err(|_| "the deadline thread panicked".to_string())?;
    if !late && measured.finished < n {
        return Err("a request ended without Done".into());
    }
    if let (Some(time), Some(before)) = (runner_time, inside_before) {
        measured.runner_seconds = Some((time.get() - before).as_secs_f64());
    }
    Ok(measured)
}
