//! The Messages API's answer objects: the `message`, its content blocks, why it stopped, its
//! usage, and the error shape.

use minnow_engine::{FinishReason, GenerationStats, ToolCall};
use serde_json::{json, Value};

use super::super::errors::ApiError;
use super::super::responses::StopCause;

/// Why an answer stopped, as `stop_reason` and `stop_sequence` say it.
pub fn stop_reason(finish: FinishReason, stop: &StopCause) -> (&'static str, Value) {
    match (finish, stop) {
        (FinishReason::ToolCalls, _) => ("tool_use", Value::Null),
        (FinishReason::Length, _) | (_, StopCause::Limit) => ("max_tokens", Value::Null),
        (_, StopCause::Word(word)) => ("stop_sequence", json!(word)),
        _ => ("end_turn", Value::Null),
    }
}

/// Anthropic's usage: `input_tokens` counts the prompt tokens not read from the prefix cache
/// (`cache_read_input_tokens`).
pub fn usage(stats: &GenerationStats) -> Value {
    json!({
        "input_tokens": stats.prompt_tokens.saturating_sub(stats.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": stats.cached_tokens,
        "output_tokens": stats.completion_tokens,
    })
}

/// A tool call's `input`: its arguments as JSON (a call the model left malformed keeps its text
/// under `_raw`, so nothing is lost).
pub fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) if value.is_object() => value,
        _ => json!({"_raw": arguments}),
    }
}

/// The content blocks of an answer: its text (when there is any, or when there is nothing else),
/// then one `tool_use` block per call.
pub fn content(text: &str, calls: &[ToolCall]) -> Value {
    let mut blocks = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for call in calls {
        blocks.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": tool_input(&call.arguments),
        }));
    }
    Value::Array(blocks)
}

/// The `message` object, with `content`, the stop reason and `usage` as known so far.
pub fn message(id: &str, model: &str, content: Value, stop: (&str, Value), usage: Value) -> Value {
    let (reason, sequence) = stop;
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": if reason.is_empty() { Value::Null } else { json!(reason) },
        "stop_sequence": sequence,
        "usage": usage,
    })
}

/// The Messages API's error object: `{"type": "error", "error": {"type", "message"}}`, its type
/// one of Anthropic's (the OpenAI-style kinds of minnow's errors mapped by status).
pub fn error(error: &ApiError) -> Value {
    let kind = match (error.kind, error.status.as_u16()) {
        (
            kind @ ("invalid_request_error"
            | "authentication_error"
            | "permission_error"
            | "not_found_error"
            | "rate_limit_error"),
            _,
        ) => kind,
        (_, 413) => "request_too_large",
        (_, 429) => "rate_limit_error",
        (_, 503 | 529) => "overloaded_error",
        (_, status) if status >= 500 => "api_error",
        _ => "invalid_request_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": error.message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_an_answer_ends_has_its_stop_reason() {
        assert_eq!(
            stop_reason(FinishReason::ToolCalls, &StopCause::Eos).0,
            "tool_use"
        );
        assert_eq!(
            stop_reason(FinishReason::Length, &StopCause::Limit).0,
            "max_tokens"
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, &StopCause::Eos),
            ("end_turn", Value::Null)
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, &StopCause::Word("END".into())),
            ("stop_sequence", json!("END"))
        );
    }

    #[test]
    fn calls_become_tool_use_blocks_with_parsed_input() {
        let calls = [ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        }];
        let blocks = content("", &calls);
        assert_eq!(
            blocks,
            json!([{"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}])
        );
        assert_eq!(content("", &[]), json!([{"type": "text", "text": ""}]));
        assert_eq!(tool_input("not json"), json!({"_raw": "not json"}));
    }

    #[test]
    fn errors_take_anthropic_types() {
        let context = ApiError::prompt_too_long("messages", 9000, 3000, 512);
        assert_eq!(context.kind, "exceed_context_size_error");
        assert_eq!(error(&context)["error"]["type"], "invalid_request_error");
        assert_eq!(
            error(&ApiError::queue_full())["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            error(&ApiError::loading())["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(
            error(&ApiError::internal("x"))["error"]["type"],
            "api_error"
        );
        assert_eq!(
            error(&ApiError::unauthorized())["error"]["type"],
            "authentication_error"
        );
        assert_eq!(error(&ApiError::unauthorized())["type"], "error");
    }
}
