//! A Messages API body, checked and turned into the chat-completion body the OpenAI parser reads
//! (`openai::parse_chat`), so both APIs share one path to the engine:
//!
//! - `system` (a string or text blocks) becomes a leading system message;
//! - a user turn's `tool_result` blocks become tool messages (answering their `tool_use_id`; with
//!   `is_error`, their text after `Error: `), in place, and its text blocks the user message; an assistant turn's `tool_use` blocks become
//!   its `tool_calls` (input as JSON text) and `thinking` blocks are dropped (the model does not
//!   read them back);
//! - `tools` become functions (`input_schema` the parameters, `strict` kept), `tool_choice` `auto` / `any` /
//!   `tool` / `none` the OpenAI choices, `disable_parallel_tool_use` `parallel_tool_calls:
//!   false`;
//! - `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream` and the
//!   diffusion fields carry over.
//!
//! Every other field goes to the chat parser as it is (the options all routes share, under the
//! field policy). Errors name the Messages API's own field paths. Images, documents and
//! Anthropic's server tools are refused; `metadata`, `thinking` and `cache_control` are accepted
//! and have no effect.

use serde_json::{json, Map, Value};

use super::super::errors::ApiError;
use super::super::fields::{field_path, FieldPolicy, Unknown};
use super::super::openai::{self, ChatRequest};

/// Accepted, no effect: `thinking` (the model writes no thinking blocks). Other fields that are
/// not the Messages API's own go to the chat parser as they are, which honours the options it
/// shares with the other routes (decoding and diffusion parameters, `seed`, the prefix cache's,
/// `metadata`) and applies the field policy to the rest.
const INERT: [&str; 1] = ["thinking"];

/// A checked request: the chat request it becomes, and whether to stream.
pub struct MessagesRequest {
    pub chat: ChatRequest,
    pub stream: bool,
}

/// Reads a `POST /v1/messages` body.
pub fn parse(body: &Value, policy: &FieldPolicy) -> Result<MessagesRequest, ApiError> {
    from_chat_body(to_chat_body(body, policy, true)?, policy)
}

/// Reads a `POST /v1/messages/count_tokens` body: a create body without `max_tokens`.
pub fn parse_count(body: &Value, policy: &FieldPolicy) -> Result<MessagesRequest, ApiError> {
    from_chat_body(to_chat_body(body, policy, false)?, policy)
}

fn from_chat_body(chat_body: Value, policy: &FieldPolicy) -> Result<MessagesRequest, ApiError> {
    let stream = chat_body["stream"].as_bool().unwrap_or(false);
    let chat = openai::parse_chat(&chat_body, policy)?;
    Ok(MessagesRequest { chat, stream })
}

/// The chat-completion body of a Messages API body (the module documentation says how);
/// `max_tokens` is required when `needs_max_tokens` (creating, not counting).
fn to_chat_body(
    body: &Value,
    policy: &FieldPolicy,
    needs_max_tokens: bool,
) -> Result<Value, ApiError> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let mut chat = Map::new();
    let mut shared = Map::new();
    let mut messages = Vec::new();
    for (key, value) in object {
        match key.as_str() {
            "messages" | "system" => {}
            "max_tokens" => {
                let n = value.as_i64().filter(|n| *n >= 1).ok_or_else(|| {
                    ApiError::invalid(
                        "max_tokens",
                        "'max_tokens' must be an integer of at least 1",
                    )
                })?;
                chat.insert("max_tokens".into(), json!(n));
            }
            "stop_sequences" => {
                let ok = value
                    .as_array()
                    .is_some_and(|stops| stops.iter().all(Value::is_string));
                if !ok {
                    return Err(ApiError::invalid(
                        "stop_sequences",
                        "'stop_sequences' must be a list of strings",
                    ));
                }
                chat.insert("stop".into(), value.clone());
            }
            "stream" => {
                let stream = value
                    .as_bool()
                    .ok_or_else(|| ApiError::invalid("stream", "'stream' must be a boolean"))?;
                chat.insert("stream".into(), json!(stream));
            }
            "tools" => {
                chat.insert("tools".into(), tools(value)?);
            }
            "tool_choice" => {
                let (choice, parallel) = tool_choice(value)?;
                chat.insert("tool_choice".into(), choice);
                if let Some(parallel) = parallel {
                    chat.insert("parallel_tool_calls".into(), json!(parallel));
                }
            }
            key if INERT.contains(&key) => {}
            _ => {
                shared.insert(key.clone(), value.clone());
            }
        }
    }
    if needs_max_tokens && !object.contains_key("max_tokens") {
        return Err(ApiError::invalid("max_tokens", "'max_tokens' is required"));
    }
    if let Some(system) = object.get("system") {
        let text = text_of(system, "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let turns = object
        .get("messages")
        .ok_or_else(|| ApiError::invalid("messages", "'messages' is required"))?
        .as_array()
        .ok_or_else(|| ApiError::invalid("messages", "'messages' must be a list"))?;
    if turns.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    for (i, turn) in turns.iter().enumerate() {
        turn_messages(turn, &format!("messages[{i}]"), policy, &mut messages)?;
    }
    chat.insert("messages".into(), Value::Array(messages));
    // What the Messages API's own fields became wins over a same-named chat option.
    for (key, value) in shared {
        chat.entry(key).or_insert(value);
    }
    Ok(Value::Object(chat))
}

/// The text of a string or of a list of text blocks (joined with blank lines, as the chat path
/// joins content parts).
fn text_of(value: &Value, path: &str) -> Result<String, ApiError> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, block) in blocks.iter().enumerate() {
                let path = format!("{path}[{i}]");
                match block_type(block, &path)? {
                    "text" => parts.push(block_text(block, &path)?),
                    other => return Err(unsupported_block(other, &path)),
                }
            }
            Ok(parts.join("\n\n"))
        }
        _ => Err(ApiError::invalid(
            path,
            format!("'{path}' must be a string or a list of text blocks"),
        )),
    }
}

fn block_type<'a>(block: &'a Value, path: &str) -> Result<&'a str, ApiError> {
    block["type"].as_str().ok_or_else(|| {
        let path = field_path(path, "type");
        ApiError::invalid(path.clone(), format!("'{path}' must be a string"))
    })
}

fn block_text(block: &Value, path: &str) -> Result<String, ApiError> {
    block["text"].as_str().map(str::to_string).ok_or_else(|| {
        let path = field_path(path, "text");
        ApiError::invalid(path.clone(), format!("'{path}' must be a string"))
    })
}

fn unsupported_block(kind: &str, path: &str) -> ApiError {
    ApiError::invalid(
        field_path(path, "type"),
        format!("content block type '{kind}' is not supported here (text, tool_use and tool_result only)"),
    )
}

/// The chat messages of one turn, appended to `out`.
fn turn_messages(
    turn: &Value,
    path: &str,
    policy: &FieldPolicy,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let Some(object) = turn.as_object() else {
        return Err(ApiError::invalid(
            path,
            format!("'{path}' must be an object"),
        ));
    };
    let role = object
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if role != "user" && role != "assistant" {
        let at = field_path(path, "role");
        return Err(ApiError::invalid(
            at,
            format!(
                "'role' must be 'user' or 'assistant' (got {:?})",
                object.get("role").unwrap_or(&Value::Null)
            ),
        ));
    }
    let unknown: Unknown = object
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "role" | "content"))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    policy.finish(path, &unknown)?;
    let content_path = field_path(path, "content");
    let blocks = match object.get("content") {
        Some(Value::String(text)) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::invalid(
                content_path.clone(),
                format!("'{content_path}' must be a string or a list of content blocks"),
            ))
        }
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("{content_path}[{i}]");
        match (role, block_type(block, &at)?) {
            (_, "text") => texts.push(block_text(block, &at)?),
            ("assistant", "tool_use") => calls.push(tool_use(block, &at)?),
            ("assistant", "thinking" | "redacted_thinking") => {}
            ("user", "tool_result") => {
                // A user turn's text after its results reads as one message after them.
                let id = block["tool_use_id"].as_str().ok_or_else(|| {
                    let p = field_path(&at, "tool_use_id");
                    ApiError::invalid(p.clone(), format!("'{p}' must be a string"))
                })?;
                let mut content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(content) => text_of(content, &field_path(&at, "content"))?,
                };
                // The chat format has no error flag: the model reads that the call failed.
                if block["is_error"].as_bool() == Some(true) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (_, kind) => return Err(unsupported_block(kind, &at)),
        }
    }
    if role == "assistant" {
        let mut message = json!({"role": "assistant", "content": texts.join("\n\n")});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        out.push(message);
    } else if !texts.is_empty() || !out.last().is_some_and(|m| m["role"] == "tool") {
        out.push(json!({"role": "user", "content": texts.join("\n\n")}));
    }
    Ok(())
}

/// An assistant's `tool_use` block as an OpenAI tool call.
fn tool_use(block: &Value, path: &str) -> Result<Value, ApiError> {
    let field = |key: &str| {
        block[key].as_str().ok_or_else(|| {
            let p = field_path(path, key);
            ApiError::invalid(p.clone(), format!("'{p}' must be a string"))
        })
    };
    let (id, name) = (field("id")?, field("name")?);
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    if !input.is_object() {
        let p = field_path(path, "input");
        return Err(ApiError::invalid(
            p.clone(),
            format!("'{p}' must be an object"),
        ));
    }
    Ok(json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": input.to_string()},
    }))
}

/// `tools` as OpenAI functions. Anthropic's server tools (a `type` other than `custom`) run on
/// Anthropic's side and cannot run here.
fn tools(value: &Value) -> Result<Value, ApiError> {
    let Some(list) = value.as_array() else {
        return Err(ApiError::invalid("tools", "'tools' must be a list"));
    };
    let mut functions = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        if let Some(kind) = tool["type"].as_str().filter(|kind| *kind != "custom") {
            return Err(ApiError::invalid(
                field_path(&path, "type"),
                format!("server tool '{kind}' is not supported (only tools the client runs)"),
            ));
        }
        let name = tool["name"].as_str().ok_or_else(|| {
            let p = field_path(&path, "name");
            ApiError::invalid(p.clone(), format!("'{p}' must be a string"))
        })?;
        let schema = tool
            .get("input_schema")
            .filter(|schema| schema.is_object())
            .ok_or_else(|| {
                let p = field_path(&path, "input_schema");
                ApiError::invalid(p.clone(), format!("'{p}' must be a JSON Schema object"))
            })?;
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(description) = tool.get("description") {
            function["description"] = description.clone();
        }
        // `strict: true`: calls always match the schema (decoding under its grammar).
        if let Some(strict) = tool.get("strict") {
            function["strict"] = strict.clone();
        }
        functions.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(functions))
}

/// `tool_choice` as OpenAI's, and `parallel_tool_calls` when `disable_parallel_tool_use` is set.
fn tool_choice(value: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let kind = value["type"].as_str().ok_or_else(|| {
        ApiError::invalid("tool_choice.type", "'tool_choice.type' must be a string")
    })?;
    let choice = match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = value["name"].as_str().ok_or_else(|| {
                ApiError::invalid("tool_choice.name", "'tool_choice.name' must be a string")
            })?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("'tool_choice.type' must be auto, any, tool or none (got '{other}')"),
            ))
        }
    };
    let parallel = value["disable_parallel_tool_use"]
        .as_bool()
        .map(|disable| !disable);
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_body(body: Value) -> Result<Value, ApiError> {
        to_chat_body(&body, &FieldPolicy::new(false), true)
    }

    #[test]
    fn a_tool_round_trip_becomes_the_chat_messages_of_the_same_conversation() {
        let body = chat_body(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0,
            "tools": [{"name": "get_weather", "description": "d",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "..."},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": true},
                    {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]}
            ]
        }))
        .unwrap();
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "toolu_1",
                    "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
                {"role": "user", "content": "Thanks"}
            ])
        );
        assert_eq!(body["stop"], json!(["END"]));
        assert_eq!(body["tool_choice"], "required");
        assert_eq!(body["parallel_tool_calls"], false);
        assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
        assert_eq!(body["max_tokens"], 64);
    }

    #[test]
    fn a_user_turn_of_only_tool_results_adds_no_empty_user_message() {
        let body = chat_body(json!({"max_tokens": 8, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]}))
        .unwrap();
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "tool"]);
    }

    #[test]
    fn what_cannot_be_honoured_is_a_400_naming_the_field() {
        for (body, param) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                json!({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"max_tokens": 8, "messages": []}), "messages"),
            (
                json!({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "sometimes"}}),
                "tool_choice.type",
            ),
        ] {
            let error = chat_body(body).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
        }
    }

    #[test]
    fn unknown_fields_follow_the_field_policy_and_inert_ones_are_quiet() {
        let policy = FieldPolicy::new(false);
        parse(
            &json!({"max_tokens": 8, "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
                "future": 1, "messages": [{"role": "user", "content": "x", "extra": 2}]}),
            &policy,
        )
        .unwrap();
        assert_eq!(policy.ignored(), ["messages[0].extra", "future"]);
        let strict = FieldPolicy::new(true);
        let error = parse(
            &json!({"max_tokens": 8, "future": 1, "messages": [{"role": "user", "content": "x"}]}),
            &strict,
        )
        .err()
        .unwrap();
        assert_eq!(error.param.as_deref(), Some("future"));
    }

    #[test]
    fn options_shared_with_the_chat_route_pass_through() {
        let body = chat_body(
            json!({"max_tokens": 8, "cache_salt": "tenant", "threshold": 0.9,
            "messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap();
        assert_eq!(body["cache_salt"], "tenant");
        assert_eq!(body["threshold"], 0.9);
        let request = parse(
            &json!({"max_tokens": 8, "cache_salt": "tenant", "messages": [{"role": "user", "content": "x"}]}),
            &FieldPolicy::new(true),
        )
        .ok()
        .unwrap();
        assert_eq!(request.chat.common.cache_salt.as_deref(), Some("tenant"));
    }
}
