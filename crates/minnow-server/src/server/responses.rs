//! OpenAI response objects (and llama-server's additions: `timings`, `prompt_progress`), and
//! llama-server's native `/completion` objects, built from engine results. Streaming and
//! non-streaming responses share these builders so they carry the same usage, timings and
//! statistics.

use minnow_engine::{BlockStats, FinishReason, GenerationStats, ToolCall, ToolCallDelta};
use serde_json::{json, Value};

/// Which API a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// OpenAI chat completions.
    Chat,
    /// OpenAI text completions.
    Completion,
    /// llama-server's native `/completion`: `content` and `stop` instead of choices.
    Native,
}

/// Identity shared by every object of one response (all chunks carry the same id).
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.endpoint, streaming) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion | Endpoint::Native, _) => "text_completion",
        }
    }

    fn envelope(&self, streaming: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(streaming),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": concat!("minnow-", env!("CARGO_PKG_VERSION")),
            "choices": choices,
        })
    }
}

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        // Only reached if a stream outlives its client; nobody reads it then.
        FinishReason::Cancelled => "stop",
    }
}

pub fn usage(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    })
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// llama-server `timings`: `prompt_n` counts prompt tokens actually processed (cache hits are
/// `cache_n`), `predicted_n` the generated tokens.
pub fn timings(stats: &GenerationStats) -> Value {
    let prompt_n = stats.prompt_tokens.saturating_sub(stats.cached_tokens);
    let prompt_ms = stats.prefill_seconds * 1000.0;
    let predicted_ms = stats.decode_seconds * 1000.0;
    json!({
        "cache_n": stats.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": if prompt_n > 0 { prompt_ms / prompt_n as f64 } else { 0.0 },
        "prompt_per_second": per_second(prompt_n, prompt_ms),
        "predicted_n": stats.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": if stats.completion_tokens > 0 { predicted_ms / stats.completion_tokens as f64 } else { 0.0 },
        "predicted_per_second": per_second(stats.completion_tokens, predicted_ms),
    })
}

/// The `minnow` field of a block chunk: that block's refinement statistics.
pub fn block_stats(stats: &BlockStats) -> Value {
    json!({
        "block": stats.block_index,
        "steps": stats.steps,
        "forwards": stats.forwards,
        "tokens": stats.tokens,
        "seconds": stats.seconds,
        "tokens_per_second": per_second(stats.tokens, stats.seconds * 1000.0),
    })
}

/// The `minnow` field of a finished response: the request's totals.
pub fn generation_stats(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "completion_tokens": stats.completion_tokens,
        "blocks": stats.blocks,
        "denoise_forwards": stats.denoise_forwards,
        "commit_forwards": stats.commit_forwards,
        "merged_commits": stats.merged_commits,
        "steps_per_block": stats.steps_per_block,
        "prefill_seconds": stats.prefill_seconds,
        "decode_seconds": stats.decode_seconds,
        "tokens_per_second": stats.tokens_per_second,
    })
}

pub fn tool_call(call: &ToolCall) -> Value {
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

/// A streamed tool-call fragment: the first carries id, type and name, later ones only
/// argument text.
pub fn tool_call_delta(delta: &ToolCallDelta) -> Value {
    let mut value = json!({"index": delta.index});
    if let Some(id) = &delta.id {
        value["id"] = json!(id);
        value["type"] = json!("function");
    }
    let mut function = json!({"arguments": delta.arguments});
    if let Some(name) = &delta.name {
        function["name"] = json!(name);
    }
    value["function"] = function;
    value
}

/// The finished result of one request, as the non-streaming response reports it.
pub struct Outcome<'a> {
    pub text: &'a str,
    pub tool_calls: &'a [ToolCall],
    pub finish: FinishReason,
    pub stats: &'a GenerationStats,
}

pub fn completion_response(meta: &ResponseMeta, outcome: &Outcome<'_>) -> Value {
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let mut message = json!({
                "role": "assistant",
                // OpenAI: content is null when the answer is only tool calls.
                "content": if outcome.text.is_empty() && !outcome.tool_calls.is_empty() {
                    Value::Null
                } else {
                    json!(outcome.text)
                },
            });
            if !outcome.tool_calls.is_empty() {
                message["tool_calls"] = outcome.tool_calls.iter().map(tool_call).collect();
            }
            json!({
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(outcome.finish),
            })
        }
        Endpoint::Completion | Endpoint::Native => json!({
            "index": 0,
            "text": outcome.text,
            "logprobs": null,
            "finish_reason": finish_reason(outcome.finish),
        }),
    };
    let mut value = meta.envelope(false, json!([choice]));
    value["usage"] = usage(outcome.stats);
    value["timings"] = timings(outcome.stats);
    value["minnow"] = generation_stats(outcome.stats);
    value
}

/// What one streamed chunk says.
pub enum ChunkContent<'a> {
    /// Chat only: the first chunk, `delta: {"role": "assistant", "content": ""}`.
    Role,
    /// New text and/or tool-call fragments of one block.
    Delta {
        text: &'a str,
        tool_calls: &'a [ToolCallDelta],
    },
    /// The last choice chunk: empty delta and the finish reason.
    Finish(FinishReason),
}

pub fn chunk(meta: &ResponseMeta, content: ChunkContent<'_>) -> Value {
    let finish = match &content {
        ChunkContent::Finish(reason) => Some(finish_reason(*reason)),
        _ => None,
    };
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let delta = match content {
                ChunkContent::Role => json!({"role": "assistant", "content": ""}),
                ChunkContent::Delta { text, tool_calls } => {
                    let mut delta = json!({});
                    if !text.is_empty() {
                        delta["content"] = json!(text);
                    }
                    if !tool_calls.is_empty() {
                        delta["tool_calls"] = tool_calls.iter().map(tool_call_delta).collect();
                    }
                    delta
                }
                ChunkContent::Finish(_) => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        }
        Endpoint::Completion | Endpoint::Native => {
            let text = match content {
                ChunkContent::Delta { text, .. } => text,
                _ => "",
            };
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        }
    };
    meta.envelope(true, json!([choice]))
}

/// Why an answer stopped, as llama-server's native `/completion` (`stop_type`, `stopping_word`)
/// and the Messages API (`stop_reason`, `stop_sequence`) report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// The model ended its answer.
    Eos,
    /// A stop string of the request: the one that matched.
    Word(String),
    /// The token limit (or the context) was reached.
    Limit,
}

impl StopCause {
    fn kind(&self) -> &'static str {
        match self {
            StopCause::Eos => "eos",
            StopCause::Word(_) => "word",
            StopCause::Limit => "limit",
        }
    }

    fn word(&self) -> &str {
        match self {
            StopCause::Word(word) => word,
            _ => "",
        }
    }
}

/// A streamed piece of a native `/completion`: new text (`stop: false`), the tokens generated
/// so far and the prompt's.
pub fn native_partial(text: &str, predicted: usize, evaluated: usize) -> Value {
    json!({
        "index": 0,
        "content": text,
        "tokens": [],
        "stop": false,
        "tokens_predicted": predicted,
        "tokens_evaluated": evaluated,
    })
}

/// The last object of a native `/completion` (`stop: true`): the whole text when not streamed,
/// "" when it was (the pieces carried it); `has_new_line` says whether the answer holds a line
/// break.
pub fn native_final(
    meta: &ResponseMeta,
    content: &str,
    has_new_line: bool,
    stop: &StopCause,
    stats: &GenerationStats,
) -> Value {
    json!({
        "index": 0,
        "content": content,
        "tokens": [],
        "stop": true,
        "model": meta.model,
        "tokens_predicted": stats.completion_tokens,
        "tokens_evaluated": stats.prompt_tokens,
        "has_new_line": has_new_line,
        "truncated": false,
        "stop_type": stop.kind(),
        "stopping_word": stop.word(),
        "tokens_cached": stats.prompt_tokens + stats.completion_tokens,
        "timings": timings(stats),
        "minnow": generation_stats(stats),
    })
}

/// A chunk without choices (usage, prompt progress).
pub fn empty_chunk(meta: &ResponseMeta) -> Value {
    meta.envelope(true, json!([]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: Endpoint) -> ResponseMeta {
        ResponseMeta {
            endpoint,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    fn stats() -> GenerationStats {
        GenerationStats {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 32,
            prefill_seconds: 0.5,
            decode_seconds: 2.0,
            ..GenerationStats::default()
        }
    }

    #[test]
    fn timings_are_consistent() {
        let t = timings(&stats());
        assert_eq!(t["prompt_n"], 6);
        assert_eq!(t["cache_n"], 4);
        assert_eq!(t["prompt_ms"], 500.0);
        assert_eq!(t["prompt_per_second"], 12.0);
        assert_eq!(t["predicted_n"], 32);
        assert_eq!(t["predicted_per_second"], 16.0);
        let u = usage(&stats());
        assert_eq!(u["total_tokens"], 42);
    }

    #[test]
    fn tool_only_message_has_null_content() {
        let calls = [ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        }];
        let value = completion_response(
            &meta(Endpoint::Chat),
            &Outcome {
                text: "",
                tool_calls: &calls,
                finish: FinishReason::ToolCalls,
                stats: &stats(),
            },
        );
        let message = &value["choices"][0]["message"];
        assert!(message["content"].is_null());
        assert_eq!(message["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(message["tool_calls"][0]["type"], "function");
        assert_eq!(value["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(value["object"], "chat.completion");
    }

    #[test]
    fn chunks() {
        let m = meta(Endpoint::Chat);
        let role = chunk(&m, ChunkContent::Role);
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        let deltas = [ToolCallDelta {
            index: 0,
            id: Some("call_1".into()),
            name: Some("f".into()),
            arguments: String::new(),
        }];
        let delta = chunk(
            &m,
            ChunkContent::Delta {
                text: "hi",
                tool_calls: &deltas,
            },
        );
        assert_eq!(delta["choices"][0]["delta"]["content"], "hi");
        assert!(delta["choices"][0]["delta"].get("role").is_none());
        assert_eq!(
            delta["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_1"
        );
        assert_eq!(
            delta["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
            "f"
        );
        let finish = chunk(&m, ChunkContent::Finish(FinishReason::Length));
        assert_eq!(finish["choices"][0]["finish_reason"], "length");
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        let text = chunk(
            &meta(Endpoint::Completion),
            ChunkContent::Delta {
                text: "x",
                tool_calls: &[],
            },
        );
        assert_eq!(text["choices"][0]["text"], "x");
        assert_eq!(text["object"], "text_completion");
    }

    #[test]
    fn argument_fragments_carry_no_id() {
        let value = tool_call_delta(&ToolCallDelta {
            index: 1,
            id: None,
            name: None,
            arguments: "{\"a\"".into(),
        });
        assert_eq!(
            value,
            json!({"index": 1, "function": {"arguments": "{\"a\""}})
        );
    }
}
