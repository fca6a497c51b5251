//! `minnow generate`: one prompt through the engine, each finished block streamed to stdout as it
//! completes, statistics on stderr at the end.
//!
//! The prompt is rendered with the checkpoint's chat template as a single user message (after an
//! optional `--system` message); `--raw` tokenizes it as is; `--input-ids FILE.json`
//! (`{"input_ids": [...]}`) feeds token ids directly. `--json` prints one object
//! `{output_ids, text, finish_reason, stats}` instead of streaming (plus `trace` with `--trace`).
//! Without `--model` the bundled tiny fixture is used (random weights: the text is noise).

use std::io::Write;
use std::path::{Path, PathBuf};

use minnow_engine::{
    ChatMessage, ChatPrompt, Engine, EngineOptions, Event, FinishReason, GenerateRequest,
    GenerationStats,
};
use serde_json::json;

use super::decode_flags::DecodeFlags;
use super::global::Global;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The prompt: a single user message rendered with the chat template (unless --raw).
    pub prompt: Option<String>,
    /// A system message before the user message.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokenize the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Feed token ids from a JSON file {"input_ids": [...]} (no template, no PROMPT).
    #[arg(long, value_name = "FILE.json")]
    pub input_ids: Option<PathBuf>,
    /// Print one JSON object {output_ids, text, finish_reason, stats} at the end.
    #[arg(long)]
    pub json: bool,
    /// Record the block tokens after every denoising forward ("trace" in --json, else stderr).
    #[arg(long)]
    pub trace: bool,
    /// New tokens at most.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub decode: DecodeFlags,
    /// Stop string (repeatable); the answer ends before it.
    #[arg(long)]
    pub stop: Vec<String>,
}

fn model_path(cli: &Global) -> PathBuf {
    super::global::model_or_fixture(cli)
}

fn read_input_ids(path: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    #[derive(serde::Deserialize)]
    struct InputIds {
        input_ids: Vec<u32>,
    }
    serde_json::from_str::<InputIds>(&text)
        .map(|f| f.input_ids)
        .map_err(|e| {
            format!(
                "{}: expected {{\"input_ids\": [non-negative integers]}}: {e}",
                path.display()
            )
        })
}

/// What the prompt is, settled (and the `--input-ids` file read) before the model loads, so that
/// a mistake on the command line fails at once rather than after a long load.
enum PromptSource {
    Ids(Vec<u32>),
    Raw(String),
    Chat {
        system: Option<String>,
        user: String,
    },
}

impl PromptSource {
    fn from_args(args: &Args) -> Result<PromptSource, String> {
        if let Some(path) = &args.input_ids {
            if args.prompt.is_some() || args.system.is_some() {
                return Err(
                    "--input-ids replaces PROMPT and --system; give one or the other".into(),
                );
            }
            return read_input_ids(path).map(PromptSource::Ids);
        }
        let prompt = args
            .prompt
            .clone()
            .ok_or("give a PROMPT (or --input-ids FILE.json)")?;
        if args.raw {
            if args.system.is_some() {
                return Err("--system needs the chat template; drop --raw".into());
            }
            return Ok(PromptSource::Raw(prompt));
        }
        Ok(PromptSource::Chat {
            system: args.system.clone(),
            user: prompt,
        })
    }

    fn into_ids(self, engine: &Engine) -> Result<Vec<u32>, String> {
        match self {
            PromptSource::Ids(ids) => Ok(ids),
            PromptSource::Raw(text) => engine.tokenize(&text).map_err(|e| e.to_string()),
            PromptSource::Chat { system, user } => {
                let system = system.map(|content| ChatMessage {
                    role: "system".into(),
                    content,
                    ..Default::default()
                });
                let user = ChatMessage {
                    role: "user".into(),
                    content: user,
                    ..Default::default()
                };
                // The engine's one way from a chat to ids: special-token strings in the typed
                // text stay text (`--raw` is the way to write control tokens).
                let chat = ChatPrompt {
                    messages: system.into_iter().chain([user]).collect(),
                    ..Default::default()
                };
                engine
                    .chat_prompt_ids(&chat)
                    .map(|(ids, _)| ids)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

fn finish_reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Cancelled => "cancelled",
    }
}

/// "1 token", "2 tokens".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn print_stats(stats: &GenerationStats, reason: FinishReason) {
    eprintln!(
        "[{}] prompt {}, completion {} in {}; forwards: {} denoise + {} commit \
         ({} commits merged into the next block's first forward); \
         prefill {:.3} s, decode {:.3} s ({:.1} tokens/s); steps per block {:?}",
        finish_reason_name(reason),
        count(stats.prompt_tokens, "token", "tokens"),
        count(stats.completion_tokens, "token", "tokens"),
        count(stats.blocks, "block", "blocks"),
        stats.denoise_forwards,
        stats.commit_forwards,
        stats.merged_commits,
        stats.prefill_seconds,
        stats.decode_seconds,
        stats.tokens_per_second,
        stats.steps_per_block,
    );
}

/// Engine warnings (forced cleanups, device fallback) and the engine's device choice go to
/// stderr; `RUST_LOG` overrides the filter.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,minnow_engine=info"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    init_logging();
    let prompt = PromptSource::from_args(args)?;
    let params = args.decode.params()?;
    let path = model_path(cli);
    let options = EngineOptions {
        device: cli.device,
        threads: cli.threads,
        parallel: 1,
        queue_capacity: 1,
        ..Default::default()
    };
    let engine = Engine::load(&path, options).map_err(|e| e.to_string())?;
    let prompt_ids = prompt.into_ids(&engine)?;
    let request = GenerateRequest {
        prompt_ids,
        max_tokens: Some(args.max_tokens),
        stop: args.stop.clone(),
        params,
        ..Default::default()
    };
    let (mut handle, trace) = if args.trace {
        let (handle, trace) = engine.submit_traced(request).map_err(|e| e.to_string())?;
        (handle, Some(trace))
    } else {
        (engine.submit(request).map_err(|e| e.to_string())?, None)
    };

    let mut stdout = std::io::stdout().lock();
    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::PrefillProgress { .. } => {}
            Event::Block { text_delta, .. } => {
                if !args.json {
                    let _ = stdout.write_all(text_delta.as_bytes());
                    let _ = stdout.flush();
                }
            }
            Event::Done {
                finish_reason,
                output_ids,
                text,
                stats,
                ..
            } => {
                let steps = trace.as_ref().map(|t| t.steps());
                if args.json {
                    let mut object = json!({
                        "output_ids": output_ids,
                        "text": text,
                        "finish_reason": finish_reason_name(finish_reason),
                        "stats": stats,
                    });
                    if let Some(steps) = &steps {
                        object["trace"] = json!(steps);
                    }
                    let _ = writeln!(stdout, "{object}");
                } else {
                    let _ = writeln!(stdout);
                    if let Some(steps) = &steps {
                        for step in steps {
                            eprintln!("trace block {}: {:?}", step.block, step.block_tokens);
                        }
                    }
                }
                print_stats(&stats, finish_reason);
                return Ok(());
            }
            Event::Error(error) => return Err(error.to_string()),
        }
    }
    Err("the engine stopped without finishing the request".into())
}
