//! Parsing and validating OpenAI (and llama-server) request bodies into engine types. Every field
//! of the OpenAI and llama-server request schemas is either honoured, accepted at a value that
//! changes nothing, accepted because it cannot change the answer here, or refused with a 400
//! naming it; a field of neither schema is left to the request's `FieldPolicy` (ignored and
//! listed, or a 400 under `--strict-fields`).

use minnow_engine::constraint::tools::strict_tools;
use minnow_engine::constraint::OutputConstraint;
use minnow_engine::{
    param_spec, Algorithm, ChatMessage, ChatPrompt, DecodeParams, ToolCall, ToolChoice,
};
use serde_json::{Map, Value};

use super::errors::ApiError;
use super::fields::{FieldPolicy, Fields};

/// How many new tokens a request may produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxTokens {
    /// Not given: the server's `--max-tokens`, else the rest of the context.
    ServerDefault,
    /// `-1` (llama-server convention): the rest of the context.
    Unlimited,
    Limit(usize),
}

/// Options shared by chat and text completions.
#[derive(Clone, Debug)]
pub struct CommonOptions {
    pub model: Option<String>,
    pub max_tokens: MaxTokens,
    pub stop: Vec<String>,
    pub params: DecodeParams,
    pub stream: bool,
    pub include_usage: bool,
    /// llama-server `return_progress`: prompt-processing progress chunks while streaming.
    pub return_progress: bool,
    /// llama-server `timings_per_token`: `timings` on every streamed chunk, not only the last.
    pub timings_per_token: bool,
    /// llama-server `cache_prompt` (default true): whether the prompt may use and feed the
    /// prefix cache.
    pub cache_prompt: Option<bool>,
    /// vLLM `cache_salt`: cached blocks are shared only between requests with the same salt.
    pub cache_salt: Option<String>,
    /// llama-server `sse_ping_interval`: `None` keeps `--keep-alive`; `Some(None)` (-1) sends no
    /// keep-alive comments; `Some(Some(d))` sends one after `d` of silence.
    pub sse_ping_interval: Option<Option<std::time::Duration>>,
    /// Structured output: llama-server's `json_schema` / `grammar`, chat `response_format`,
    /// Responses `text.format`, or strict tools (docs/api.md).
    pub constraint: Option<OutputConstraint>,
}

#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub common: CommonOptions,
    pub prompt: ChatPrompt,
    /// Names whose calls are parsed out of the output (empty: no tool-call parsing).
    pub tool_names: Vec<String>,
    pub parallel_tool_calls: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub common: CommonOptions,
    pub prompt: PromptInput,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TokenizeRequest {
    pub content: String,
    pub with_pieces: bool,
    /// llama-server `parse_special` (default true): special-token strings become their ids.
    pub parse_special: bool,
}

/// Instruction added for `response_format: {"type": "json_object"}` (the grammar makes the answer
/// a JSON object; the instruction tells the model why, so the object has something in it).
pub const JSON_OBJECT_INSTRUCTION: &str =
    "Respond with a single valid JSON object and nothing else.";

/// Parses a whole request body into JSON, refusing bodies that are not an object (bounded work
/// and memory, no repeated keys: `json_body`).
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    super::json_body::parse(body)
}

pub fn parse_chat(body: &Value, policy: &FieldPolicy) -> Result<ChatRequest, ApiError> {
    let mut fields = Fields::new(body, "request body", policy)?;
    let common = parse_common(&mut fields)?;

    let messages_value = fields
        .value("messages")
        .ok_or_else(|| ApiError::invalid("messages", "'messages' is required"))?;
    let mut messages = parse_messages(messages_value, policy)?;

    let tools = match fields.value("tools") {
        None => Vec::new(),
        Some(value) => parse_tools(value, policy)?,
    };
    let declared: Vec<String> = tools.iter().map(tool_name).collect();
    let tool_choice = match fields.value("tool_choice") {
        None => ToolChoice::Auto,
        Some(value) => parse_tool_choice(value, &declared, policy)?,
    };
    let parallel_tool_calls = fields.bool("parallel_tool_calls")?.unwrap_or(true);
    // llama-server's switch for parsing tool calls out of the output; without tools it is inert,
    // and with tools this server always parses them.
    fields.bool("parse_tool_calls")?;
    let add_generation_prompt = fields.bool("add_generation_prompt")?.unwrap_or(true);
    // Continuing the last assistant message needs the template to leave that turn open, which
    // the LLaDA2 templates cannot do: refused rather than answered as a new turn.
    fields.must_be_false("continue_final_message")?;

    let mut common = common;
    if let Some(format) = fields.value("response_format") {
        let (constraint, instruct) = parse_response_format(format, policy)?;
        if instruct {
            add_json_instruction(&mut messages);
        }
        set_constraint(&mut common, constraint, "response_format")?;
    }
    set_tool_constraint(&mut common, &tools, &tool_choice)?;
    let template_kwargs = match fields.value("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(fields.type_error("chat_template_kwargs", "an object")),
    };
    // The web UI sends `reasoning_format`; LLaDA2 templates hard-code "thinking off" and no
    // reasoning is parsed out, so every value behaves like "none". For the same reason a thinking
    // budget, a reasoning effort and llama-server's live reasoning control have nothing to act on.
    fields.string("reasoning_format")?;
    fields.string("reasoning_effort")?;
    fields.integer("thinking_budget_tokens", -1, i64::MAX)?;
    fields.bool("reasoning_control")?;
    fields.finish()?;

    let tool_names = match &tool_choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Function(name) => vec![name.clone()],
        ToolChoice::Auto | ToolChoice::Required => declared,
    };
    Ok(ChatRequest {
        common,
        prompt: ChatPrompt {
            messages,
            tools,
            tool_choice,
            add_generation_prompt,
            template_kwargs,
        },
        tool_names,
        parallel_tool_calls,
    })
}

pub fn parse_completion(body: &Value, policy: &FieldPolicy) -> Result<CompletionRequest, ApiError> {
    let mut fields = Fields::new(body, "request body", policy)?;
    let common = parse_common(&mut fields)?;
    let prompt = match fields.value("prompt") {
        None => return Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(value) => parse_prompt(value)?,
    };
    fields.must_be_false("echo")?;
    if let Some(best_of) = fields.integer("best_of", 1, i64::MAX)? {
        if best_of != 1 {
            return Err(ApiError::invalid(
                "best_of",
                "only 'best_of': 1 is supported",
            ));
        }
    }
    fields.unsupported("suffix")?;
    fields.finish()?;
    Ok(CompletionRequest { common, prompt })
}

/// llama-server `/tokenize`: `{"content": "...", "add_special": bool, "with_pieces": bool}`.
pub fn parse_tokenize(body: &Value, policy: &FieldPolicy) -> Result<TokenizeRequest, ApiError> {
    let mut fields = Fields::new(body, "request body", policy)?;
    let content = fields
        .string("content")?
        .ok_or_else(|| ApiError::invalid("content", "'content' is required"))?;
    // LLaDA2 tokenizers add no special tokens (no BOS), so `add_special` changes nothing.
    fields.bool("add_special")?;
    let parse_special = fields.bool("parse_special")?.unwrap_or(true);
    let with_pieces = fields.bool("with_pieces")?.unwrap_or(false);
    fields.finish()?;
    Ok(TokenizeRequest {
        content,
        with_pieces,
        parse_special,
    })
}

/// llama-server `/detokenize`: `{"tokens": [ids]}`.
pub fn parse_detokenize(body: &Value, policy: &FieldPolicy) -> Result<Vec<u32>, ApiError> {
    let mut fields = Fields::new(body, "request body", policy)?;
    let tokens = match fields.value("tokens") {
        None => Vec::new(),
        Some(value) => parse_ids(value, "tokens")?,
    };
    fields.finish()?;
    Ok(tokens)
}

pub(super) fn parse_common(fields: &mut Fields<'_>) -> Result<CommonOptions, ApiError> {
    let model = fields.string("model")?;

    let mut max_tokens = MaxTokens::ServerDefault;
    // Later names win only if the earlier were absent: OpenAI's preferred name comes first.
    for key in ["max_completion_tokens", "max_tokens", "n_predict"] {
        if let Some(n) = fields.integer(key, -1, i64::MAX)? {
            if max_tokens != MaxTokens::ServerDefault {
                continue;
            }
            max_tokens = match n {
                -1 => MaxTokens::Unlimited,
                0 => {
                    return Err(ApiError::invalid(
                        key,
                        format!("'{key}' must be at least 1 (or -1 for no limit)"),
                    ))
                }
                n => MaxTokens::Limit(usize::try_from(n).unwrap_or(usize::MAX)),
            };
        }
    }

    let stop = match fields.value("stop") {
        None => Vec::new(),
        Some(value) => parse_stop(value)?,
    };

    let mut params = DecodeParams {
        temperature: number_in(fields, "temperature")?.map(|x| x as f32),
        top_p: number_in(fields, "top_p")?.map(|x| x as f32),
        top_k: integer_in(fields, "top_k")?.map(|k| k as usize),
        ..DecodeParams::default()
    };
    // llama-server uses -1 for "a random seed".
    params.seed = match fields.integer("seed", -1, i64::MAX)? {
        None | Some(-1) => None,
        Some(seed) => Some(seed as u64),
    };
    params.threshold = number_in(fields, "threshold")?.map(|x| x as f32);
    params.editing_threshold = number_in(fields, "editing_threshold")?.map(|x| x as f32);
    params.max_post_steps = integer_in(fields, "max_post_steps")?.map(|n| n as usize);
    params.steps = integer_in(fields, "steps")?.map(|n| n as usize);
    params.num_to_transfer = integer_in(fields, "num_to_transfer")?.map(|n| n as usize);
    params.algorithm = match fields.string("algorithm")? {
        None => None,
        Some(name) => Some(parse_algorithm(&name).map_err(|m| ApiError::invalid("algorithm", m))?),
    };

    let stream = fields.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(options) = fields.value("stream_options") {
        let mut sub = Fields::new(options, "stream_options", fields.policy())?;
        include_usage = sub.bool("include_usage")?.unwrap_or(false);
        // OpenAI's newer flag; obfuscation padding is never added here.
        sub.bool("include_obfuscation")?;
        sub.finish()?;
    }
    let return_progress = fields.bool("return_progress")?.unwrap_or(false);
    let timings_per_token = fields.bool("timings_per_token")?.unwrap_or(false);
    // -1: no pings; otherwise at least 0.1 s (0 would be a busy loop).
    let sse_ping_interval = match fields.number("sse_ping_interval", -1.0, 3600.0)? {
        None => None,
        Some(x) if x >= 0.1 => Some(Some(std::time::Duration::from_secs_f64(x))),
        Some(x) if (x + 1.0).abs() < f64::EPSILON => Some(None),
        Some(_) => {
            return Err(ApiError::invalid(
                "sse_ping_interval",
                "'sse_ping_interval' must be -1 (no pings) or between 0.1 and 3600 seconds",
            ))
        }
    };

    // OpenAI's `n` and llama-server's `n_cmpl`: one answer per request.
    for key in ["n", "n_cmpl"] {
        if let Some(n) = fields.integer(key, 1, i64::MAX)? {
            if n != 1 {
                return Err(ApiError::invalid(
                    key,
                    format!("only '{key}': 1 is supported"),
                ));
            }
        }
    }
    // llama-server output options this server cannot produce: accepted only when off.
    for key in ["ignore_eos", "return_tokens", "post_sampling_probs"] {
        fields.must_be_false(key)?;
    }
    fields.unsupported("response_fields")?;
    // LoRA adapters and images do not exist here; an empty list asks for none.
    for key in ["lora", "image_data"] {
        if let Some(value) = fields.value(key) {
            if value.as_array().is_none_or(|list| !list.is_empty()) {
                return Err(ApiError::invalid(
                    key,
                    format!("'{key}' is not supported by this server (only an empty list)"),
                ));
            }
        }
    }
    fields.must_be_false("logprobs")?;
    fields.unsupported("top_logprobs")?;
    fields.unsupported("n_probs")?;
    if let Some(bias) = fields.value("logit_bias") {
        let empty = match bias {
            Value::Object(map) => map.is_empty(),
            Value::Array(list) => list.is_empty(),
            _ => false,
        };
        if !empty {
            return Err(ApiError::invalid(
                "logit_bias",
                "'logit_bias' is not supported by this server",
            ));
        }
    }
    let mut constraint = None;
    if let Some(schema) = fields.value("json_schema") {
        if !schema.is_object() {
            return Err(fields.type_error("json_schema", "a JSON Schema object"));
        }
        constraint = Some(OutputConstraint::JsonSchema(schema.clone()));
    }
    if let Some(grammar) = fields.string("grammar")? {
        if !grammar.trim().is_empty() {
            if constraint.is_some() {
                return Err(ApiError::invalid(
                    "grammar",
                    "send either 'grammar' or 'json_schema', not both",
                ));
            }
            constraint = Some(parse_grammar(&grammar)?);
        }
    }
    fields.unsupported("tools_ts_str")?;

    // Samplers and penalties this engine does not implement: accepted only at the value that
    // disables them (the llama.cpp web UI sends all of them, at the values /props advertises).
    for (key, neutral) in [
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repeat_penalty", 1.0),
        ("min_p", 0.0),
        ("typical_p", 1.0),
        ("typ_p", 1.0),
        ("dynatemp_range", 0.0),
        ("xtc_probability", 0.0),
        ("dry_multiplier", 0.0),
        ("top_n_sigma", -1.0),
        ("mirostat", 0.0),
        // llama-server's minimum indentation and time limit change the answer when set.
        ("n_indent", 0.0),
        ("t_max_predict_ms", 0.0),
    ] {
        fields.neutral_number(key, neutral)?;
    }
    // OpenAI request metadata that cannot change the output: stored completions are not kept
    // (so `store` must be false and `metadata` is inert), and there is one service tier.
    fields.must_be_false("store")?;
    for key in [
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    ] {
        fields.accept_any(key);
    }
    if let Some(modalities) = fields.value("modalities") {
        if modalities != &Value::Array(vec![Value::String("text".into())]) {
            return Err(ApiError::invalid(
                "modalities",
                "only 'modalities': [\"text\"] is supported",
            ));
        }
    }
    // Settings of the disabled samplers above (inert while their switch is neutral), the sampler
    // order (this engine's order is fixed), llama-server's slot pinning, and OpenAI's end-user
    // tag: none of them can change the output here.
    for key in [
        "dynatemp_exponent",
        "xtc_threshold",
        "repeat_last_n",
        "penalty_last_n",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "mirostat_tau",
        "mirostat_eta",
        "samplers",
        "min_keep",
        "n_cache_reuse",
        "id_slot",
        "user",
        // Context shifting never happens here (a prompt that does not fit is refused), so the
        // tokens it would keep or discard are moot.
        "n_keep",
        "n_discard",
        // Where llama-server runs its samplers, and its speculative-decoding knobs: speed only.
        "backend_sampling",
        "speculative.n_max",
        "speculative.n_min",
        "speculative.p_min",
        // OpenAI's predicted outputs only speed a response up.
        "prediction",
    ] {
        fields.accept_any(key);
    }

    let cache_prompt = fields.bool("cache_prompt")?;
    let cache_salt = fields.string("cache_salt")?;

    Ok(CommonOptions {
        model,
        max_tokens,
        stop,
        params,
        stream,
        include_usage,
        return_progress,
        timings_per_token,
        cache_prompt,
        cache_salt,
        sse_ping_interval,
        constraint,
    })
}

/// llama-server's `grammar`: a Lark grammar for llguidance when it starts with `%llguidance`
/// (as llama.cpp's llguidance build reads it); GBNF otherwise, which this server cannot convert.
fn parse_grammar(text: &str) -> Result<OutputConstraint, ApiError> {
    if text.trim_start().starts_with("%llguidance") {
        return Ok(OutputConstraint::Lark(text.to_string()));
    }
    Err(ApiError::invalid(
        "grammar",
        "GBNF grammars are not supported: send a Lark grammar that starts with '%llguidance {}', \
         a 'json_schema', or 'response_format'",
    ))
}

/// Constrains tool calls when `strict: true` tools are declared. A call forced by `tool_choice`
/// (`required` or a named function) replaces a text format (the answer is the call); with `auto`
/// the two cannot be combined yet (a 400 naming `tools`).
pub(super) fn set_tool_constraint(
    common: &mut CommonOptions,
    tools: &[Value],
    choice: &ToolChoice,
) -> Result<(), ApiError> {
    if *choice == ToolChoice::None {
        return Ok(());
    }
    let Some(strict) = strict_tools(tools) else {
        return Ok(());
    };
    let constraint = OutputConstraint::ToolCalls {
        tools: strict,
        choice: choice.clone(),
    };
    if *choice != ToolChoice::Auto {
        common.constraint = Some(constraint);
        return Ok(());
    }
    set_constraint(common, Some(constraint), "tools")
}

/// Sets the request's one output constraint; two sources of one (say `response_format` and
/// `grammar`) are refused rather than one silently winning.
pub(super) fn set_constraint(
    common: &mut CommonOptions,
    constraint: Option<OutputConstraint>,
    param: &str,
) -> Result<(), ApiError> {
    let Some(constraint) = constraint else {
        return Ok(());
    };
    if common.constraint.is_some() {
        return Err(ApiError::invalid(
            param,
            format!("'{param}' constrains the answer, and so does another field; send one"),
        ));
    }
    common.constraint = Some(constraint);
    Ok(())
}
/// A decoding parameter, within the engine's range for it (`minnow_engine::DECODE_PARAMS`, the
/// table docs/api.md states): the same bounds and message the engine applies, refused here before
/// any tokenizing.
fn number_in<'a>(fields: &mut Fields<'a>, key: &'a str) -> Result<Option<f64>, ApiError> {
    let spec = param_spec(key);
    fields.number(key, spec.min, spec.max)
}

/// [`number_in`] for the whole-number parameters.
fn integer_in<'a>(fields: &mut Fields<'a>, key: &'a str) -> Result<Option<i64>, ApiError> {
    let spec = param_spec(key);
    fields.integer(key, spec.min as i64, spec.max as i64)
}

fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    match name.replace('_', "-").to_ascii_lowercase().as_str() {
        "low-confidence" => Ok(Algorithm::LowConfidence),
        "joint" => Ok(Algorithm::Joint),
        "indel" => Ok(Algorithm::Indel),
        _ => Err(format!(
            "unknown algorithm '{name}': expected low-confidence, joint or indel"
        )),
    }
}

fn parse_stop(value: &Value) -> Result<Vec<String>, ApiError> {
    let list = match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => {
            if items.len() > 16 {
                return Err(ApiError::invalid("stop", "'stop' holds at most 16 strings"));
            }
            items
                .iter()
                .map(|item| {
                    item.as_str().map(str::to_string).ok_or_else(|| {
                        ApiError::invalid("stop", "'stop' must be a string or a list of strings")
                    })
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            return Err(ApiError::invalid(
                "stop",
                "'stop' must be a string or a list of strings",
            ))
        }
    };
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(list)
}

fn parse_ids(value: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    let items = value.as_array().ok_or_else(|| {
        ApiError::invalid(param, format!("'{param}' must be a list of token ids"))
    })?;
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("'{param}' must hold non-negative integer token ids"),
                    )
                })
        })
        .collect()
}

/// `prompt`: a string, a list of ids, or a one-element list of either (n = 1).
fn parse_prompt(value: &Value) -> Result<PromptInput, ApiError> {
    match value {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            Ok(PromptInput::Ids(parse_ids(value, "prompt")?))
        }
        Value::Array(items) if items.len() == 1 => match &items[0] {
            Value::String(s) => Ok(PromptInput::Text(s.clone())),
            inner @ Value::Array(_) => Ok(PromptInput::Ids(parse_ids(inner, "prompt")?)),
            _ => Err(ApiError::invalid(
                "prompt",
                "'prompt' must be a string or a list of token ids",
            )),
        },
        Value::Array(items) if items.len() > 1 && !items.iter().all(Value::is_number) => Err(
            ApiError::invalid("prompt", "only one prompt per request is supported (n = 1)"),
        ),
        _ => Err(ApiError::invalid(
            "prompt",
            "'prompt' must be a string or a list of token ids",
        )),
    }
}

/// Normalizes OpenAI messages (chat-format doc §1.3).
fn parse_messages(value: &Value, policy: &FieldPolicy) -> Result<Vec<ChatMessage>, ApiError> {
    let items = value
        .as_array()
        .ok_or_else(|| ApiError::invalid("messages", "'messages' must be a list"))?;
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(items.len());
    // A set: a history of many calls is checked in linear time.
    let mut call_ids: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("messages[{i}]");
        let mut fields = Fields::new(item, &path, policy)?;
        let role = fields.string("role")?.ok_or_else(|| {
            ApiError::invalid(fields.path("role"), format!("'{path}.role' is required"))
        })?;
        let role = match role.as_str() {
            "developer" => "system".to_string(),
            "system" | "user" | "assistant" | "tool" => role,
            other => {
                return Err(ApiError::invalid(
                    fields.path("role"),
                    format!(
                    "unknown role '{other}': expected system, developer, user, assistant or tool"
                ),
                ))
            }
        };
        let content = match fields.value("content") {
            None => String::new(),
            Some(value) => parse_content(value, &fields.path("content"), policy)?,
        };
        let name = fields.string("name")?;
        let mut message = ChatMessage {
            role: role.clone(),
            content,
            name,
            ..ChatMessage::default()
        };
        if role == "assistant" {
            message.reasoning_content = fields.string("reasoning_content")?;
            // OpenAI's `refusal` is output-only; a client echoing it back as null is harmless.
            if fields.value("refusal").is_some() {
                return Err(ApiError::invalid(
                    fields.path("refusal"),
                    "'refusal' is not supported in request messages",
                ));
            }
            if let Some(calls) = fields.value("tool_calls") {
                message.tool_calls =
                    parse_history_calls(calls, &fields.path("tool_calls"), policy)?;
                call_ids.extend(message.tool_calls.iter().map(|call| call.id.clone()));
            }
        }
        if role == "tool" {
            let id = fields.string("tool_call_id")?.ok_or_else(|| {
                ApiError::invalid(
                    fields.path("tool_call_id"),
                    format!("'{path}.tool_call_id' is required for tool messages"),
                )
            })?;
            if !call_ids.contains(&id) {
                return Err(ApiError::invalid(
                    fields.path("tool_call_id"),
                    format!("tool_call_id '{id}' does not answer any earlier assistant tool call"),
                ));
            }
            message.tool_call_id = Some(id);
        }
        fields.finish()?;
        messages.push(message);
    }
    Ok(messages)
}

/// A string, or a list of text parts joined with "\n" (OpenAI does not define a separator; a
/// newline keeps separate parts from running into each other).
fn parse_content(value: &Value, path: &str, policy: &FieldPolicy) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let part_path = format!("{path}[{j}]");
                let mut fields = Fields::new(part, &part_path, policy)?;
                match fields.string("type")?.as_deref() {
                    Some("text") => {}
                    Some(other) => {
                        return Err(ApiError::invalid(
                            fields.path("type"),
                            format!("content part type '{other}' is not supported (text only)"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            fields.path("type"),
                            format!("'{part_path}.type' is required"),
                        ))
                    }
                }
                let text = fields.string("text")?.ok_or_else(|| {
                    ApiError::invalid(
                        fields.path("text"),
                        format!("'{part_path}.text' is required"),
                    )
                })?;
                fields.accept_any("cache_control");
                fields.finish()?;
                texts.push(text);
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid(
            path,
            format!("'{path}' must be a string or a list of text parts"),
        )),
    }
}

/// Assistant `tool_calls` in the history: `[{id, type, function: {name, arguments}}]`.
fn parse_history_calls(
    value: &Value,
    path: &str,
    policy: &FieldPolicy,
) -> Result<Vec<ToolCall>, ApiError> {
    let items = value
        .as_array()
        .ok_or_else(|| ApiError::invalid(path, format!("'{path}' must be a list")))?;
    let mut calls = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        let call_path = format!("{path}[{k}]");
        let mut fields = Fields::new(item, &call_path, policy)?;
        let id = fields.string("id")?.ok_or_else(|| {
            ApiError::invalid(fields.path("id"), format!("'{call_path}.id' is required"))
        })?;
        if let Some(kind) = fields.string("type")? {
            if kind != "function" {
                return Err(ApiError::invalid(
                    fields.path("type"),
                    "only 'function' tool calls are supported",
                ));
            }
        }
        let function = fields.value("function").ok_or_else(|| {
            ApiError::invalid(
                fields.path("function"),
                format!("'{call_path}.function' is required"),
            )
        })?;
        fields.accept_any("index");
        fields.finish()?;
        let function_path = format!("{call_path}.function");
        let mut function_fields = Fields::new(function, &function_path, policy)?;
        let name = function_fields.string("name")?.ok_or_else(|| {
            ApiError::invalid(
                function_fields.path("name"),
                format!("'{function_path}.name' is required"),
            )
        })?;
        // Arguments go to the template as a JSON string (OpenAI form); an object is serialized.
        let arguments = match function_fields.value("arguments") {
            None => "{}".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(object @ Value::Object(_)) => object.to_string(),
            Some(_) => {
                return Err(function_fields.type_error("arguments", "a JSON string or an object"))
            }
        };
        function_fields.finish()?;
        calls.push(ToolCall {
            id,
            name,
            arguments,
        });
    }
    Ok(calls)
}

/// Tool definitions, validated and passed to the template unchanged.
pub(super) fn parse_tools(value: &Value, policy: &FieldPolicy) -> Result<Vec<Value>, ApiError> {
    let items = value
        .as_array()
        .ok_or_else(|| ApiError::invalid("tools", "'tools' must be a list"))?;
    // A set: many declared tools are checked in linear time.
    let mut names: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("tools[{i}]");
        let mut fields = Fields::new(item, &path, policy)?;
        match fields.string("type")?.as_deref() {
            Some("function") => {}
            _ => {
                return Err(ApiError::invalid(
                    fields.path("type"),
                    format!("'{path}.type' must be \"function\""),
                ))
            }
        }
        let function = fields.value("function").ok_or_else(|| {
            ApiError::invalid(
                fields.path("function"),
                format!("'{path}.function' is required"),
            )
        })?;
        fields.finish()?;
        let function_path = format!("{path}.function");
        let mut function_fields = Fields::new(function, &function_path, policy)?;
        let name = function_fields.string("name")?.unwrap_or_default();
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !valid_name {
            return Err(ApiError::invalid(
                function_fields.path("name"),
                "a function name must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'",
            ));
        }
        if names.contains(&name) {
            return Err(ApiError::invalid(
                function_fields.path("name"),
                format!("function '{name}' is declared twice"),
            ));
        }
        function_fields.string("description")?;
        if let Some(parameters) = function_fields.value("parameters") {
            if !parameters.is_object() {
                return Err(function_fields.type_error("parameters", "a JSON Schema object"));
            }
        }
        // `strict: true` constrains a call's arguments to `parameters` (constraint::tools).
        function_fields.bool("strict")?;
        function_fields.finish()?;
        names.insert(name);
    }
    Ok(items.clone())
}

pub(super) fn tool_name(tool: &Value) -> String {
    tool["function"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub(super) fn parse_tool_choice(
    value: &Value,
    declared: &[String],
    policy: &FieldPolicy,
) -> Result<ToolChoice, ApiError> {
    let choice = match value {
        Value::String(s) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("unknown tool_choice '{other}': expected auto, none, required or a named function"),
                ))
            }
        },
        Value::Object(_) => {
            let mut fields = Fields::new(value, "tool_choice", policy)?;
            if fields.string("type")?.as_deref() != Some("function") {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "'tool_choice.type' must be \"function\"",
                ));
            }
            let function = fields.value("function").ok_or_else(|| {
                ApiError::invalid("tool_choice.function", "'tool_choice.function' is required")
            })?;
            fields.finish()?;
            let mut function_fields = Fields::new(function, "tool_choice.function", policy)?;
            let name = function_fields.string("name")?.ok_or_else(|| {
                ApiError::invalid(
                    "tool_choice.function.name",
                    "'tool_choice.function.name' is required",
                )
            })?;
            function_fields.finish()?;
            ToolChoice::Function(name)
        }
        _ => {
            return Err(ApiError::invalid(
                "tool_choice",
                "'tool_choice' must be a string or an object",
            ))
        }
    };
    match &choice {
        ToolChoice::Required if declared.is_empty() => Err(ApiError::invalid(
            "tool_choice",
            "tool_choice 'required' needs at least one tool in 'tools'",
        )),
        ToolChoice::Function(name) if !declared.contains(name) => Err(ApiError::invalid(
            "tool_choice",
            format!("tool_choice names '{name}', which is not declared in 'tools'"),
        )),
        _ => Ok(choice),
    }
}

/// `response_format`: the constraint it asks for, and whether the JSON instruction goes into the
/// prompt (`json_object`, OpenAI's "JSON mode", where the client's prompt is expected to ask for
/// JSON). llama-server's `{"type": "json_object", "schema": {...}}` and `{"type":
/// "json_schema", "schema": {...}}` forms are read too.
fn parse_response_format(
    value: &Value,
    policy: &FieldPolicy,
) -> Result<(Option<OutputConstraint>, bool), ApiError> {
    let mut fields = Fields::new(value, "response_format", policy)?;
    let kind = fields.string("type")?;
    let inline = match fields.value("schema") {
        None => None,
        Some(schema) if schema.is_object() => Some(schema.clone()),
        Some(_) => return Err(fields.type_error("schema", "a JSON Schema object")),
    };
    let result = match kind.as_deref() {
        Some("text") => (None, false),
        Some("json_object") => match inline {
            Some(schema) => (Some(OutputConstraint::JsonSchema(schema)), false),
            None => (Some(OutputConstraint::JsonObject), true),
        },
        Some("json_schema") => {
            let schema = match (fields.value("json_schema"), inline) {
                (Some(spec), _) => json_schema_spec(spec, "response_format.json_schema", policy)?,
                (None, Some(schema)) => schema,
                (None, None) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema",
                        "'response_format.json_schema' is required",
                    ))
                }
            };
            (Some(OutputConstraint::JsonSchema(schema)), false)
        }
        _ => {
            return Err(ApiError::invalid(
                "response_format.type",
                "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
            ))
        }
    };
    fields.finish()?;
    Ok(result)
}

/// OpenAI's `{"name", "description", "schema", "strict"}` object of a JSON Schema format; returns
/// the schema. `strict: false` is honoured as strictly as `true`: every answer follows it.
pub(super) fn json_schema_spec(
    value: &Value,
    path: &str,
    policy: &FieldPolicy,
) -> Result<Value, ApiError> {
    let mut fields = Fields::new(value, path, policy)?;
    fields.string("name")?;
    fields.string("description")?;
    fields.bool("strict")?;
    let schema = match fields.value("schema") {
        Some(schema) if schema.is_object() => schema.clone(),
        Some(_) => return Err(fields.type_error("schema", "a JSON Schema object")),
        None => {
            return Err(ApiError::invalid(
                fields.path("schema"),
                format!("'{path}.schema' is required"),
            ))
        }
    };
    fields.finish()?;
    Ok(schema)
}

/// Appends the JSON instruction to a leading system message, or adds one.
pub(super) fn add_json_instruction(messages: &mut Vec<ChatMessage>) {
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            if !first.content.is_empty() {
                first.content.push_str("\n\n");
            }
            first.content.push_str(JSON_OBJECT_INSTRUCTION);
        }
        _ => messages.insert(
            0,
            ChatMessage {
                role: "system".into(),
                content: JSON_OBJECT_INSTRUCTION.into(),
                ..ChatMessage::default()
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<ChatRequest, ApiError> {
        parse_chat(&body, &FieldPolicy::new(true))
    }

    fn parse_completion_strict(body: &Value) -> Result<CompletionRequest, ApiError> {
        parse_completion(body, &FieldPolicy::new(true))
    }

    fn tokenize_strict(body: &Value) -> Result<TokenizeRequest, ApiError> {
        parse_tokenize(body, &FieldPolicy::new(true))
    }

    fn detokenize_strict(body: &Value) -> Result<Vec<u32>, ApiError> {
        parse_detokenize(body, &FieldPolicy::new(true))
    }

    fn param_of(result: Result<ChatRequest, ApiError>) -> String {
        result.unwrap_err().param.unwrap_or_default()
    }

    #[test]
    fn minimal_chat_request() {
        let request = chat(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(request.prompt.messages.len(), 1);
        assert_eq!(request.common.max_tokens, MaxTokens::ServerDefault);
        assert!(!request.common.stream);
        assert!(request.prompt.add_generation_prompt);
        assert_eq!(request.prompt.tool_choice, ToolChoice::Auto);
    }

    #[test]
    fn normalizes_messages() {
        let request = chat(json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": null},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}
        ]}))
        .unwrap();
        let messages = &request.prompt.messages;
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[0].content, "a\nb");
        assert_eq!(messages[1].content, "");
        assert_eq!(messages[2].tool_calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_1"));
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let base = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        assert_eq!(param_of(chat(base(json!({"n": 2})))), "n");
        assert_eq!(param_of(chat(base(json!({"logprobs": true})))), "logprobs");
        assert_eq!(
            param_of(chat(base(json!({"logit_bias": {"5": 1}})))),
            "logit_bias"
        );
        assert_eq!(
            param_of(chat(base(json!({"presence_penalty": 0.5})))),
            "presence_penalty"
        );
        assert_eq!(
            param_of(chat(base(json!({"frequency_penalty": 1})))),
            "frequency_penalty"
        );
        assert_eq!(param_of(chat(base(json!({"wat": 1})))), "wat");
        assert_eq!(
            param_of(chat(base(json!({"temperature": 5})))),
            "temperature"
        );
        assert_eq!(
            param_of(chat(base(json!({"temperature": "hot"})))),
            "temperature"
        );
        assert_eq!(param_of(chat(base(json!({"max_tokens": 0})))), "max_tokens");
        assert_eq!(
            param_of(chat(base(json!({"stream_options": {"x": 1}})))),
            "stream_options.x"
        );
        assert_eq!(
            param_of(chat(base(
                json!({"response_format": {"type": "json_schema"}})
            ))),
            "response_format.json_schema"
        );
        assert_eq!(param_of(chat(base(json!({"store": true})))), "store");
        assert_eq!(
            param_of(chat(base(json!({"modalities": ["text", "audio"]})))),
            "modalities"
        );
        assert!(chat(base(json!({"store": false, "metadata": {"a": "b"},
            "modalities": ["text"], "service_tier": "auto", "user": "u1"})))
        .is_ok());
        // Neutral values are fine.
        assert!(chat(base(
            json!({"n": 1, "logprobs": false, "presence_penalty": 0,
            "repeat_penalty": 1.0, "min_p": 0, "logit_bias": {}, "samplers": ["top_k"]})
        ))
        .is_ok());
    }

    #[test]
    fn llama_server_fields_are_accepted_and_others_listed() {
        let lenient = FieldPolicy::new(false);
        let request = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi", "id": 7}],
                "sse_ping_interval": 1, "reasoning_control": true, "backend_sampling": false,
                "reasoning_format": "auto", "thinking_budget_tokens": -1, "n_keep": 0,
                "cache_prompt": true, "samplers": ["top_k"], "dry_base": 1.75,
                "add_generation_prompt": true, "future_field": {"a": 1}}),
            &lenient,
        )
        .unwrap();
        assert_eq!(
            request.common.sse_ping_interval,
            Some(Some(std::time::Duration::from_secs(1)))
        );
        assert_eq!(
            lenient.ignored(),
            vec!["messages[0].id".to_string(), "future_field".into()]
        );
        // The same body under --strict-fields names the first unknown field.
        let error = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "future_field": 1}),
            &FieldPolicy::new(true),
        )
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("future_field"));
        // What would change the answer stays a 400 under either policy.
        for (key, value) in [
            ("n", json!(2)),
            ("logprobs", json!(true)),
            ("logit_bias", json!({"5": 1})),
            ("presence_penalty", json!(0.5)),
            ("json_schema", json!([])),
            ("grammar", json!("root ::= \"a\"")),
            ("ignore_eos", json!(true)),
            ("continue_final_message", json!(true)),
            ("lora", json!([{"id": 0, "scale": 1.0}])),
            ("sse_ping_interval", json!(0)),
        ] {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            body[key] = value;
            let error = parse_chat(&body, &FieldPolicy::new(false)).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(key), "{key}");
        }
    }

    #[test]
    fn message_errors_name_the_path() {
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "robot", "content": "x"}]})
            )),
            "messages[0].role"
        );
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
            )),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]})
            )),
            "messages[0].tool_call_id"
        );
        assert_eq!(param_of(chat(json!({"messages": []}))), "messages");
        assert_eq!(param_of(chat(json!({}))), "messages");
    }

    #[test]
    fn tool_choice_and_names() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        let named = chat(
            json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        )
        .unwrap();
        assert_eq!(
            named.prompt.tool_choice,
            ToolChoice::Function("get_weather".into())
        );
        assert_eq!(named.tool_names, vec!["get_weather".to_string()]);
        let none = chat(json!({"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "none"})).unwrap();
        assert!(none.tool_names.is_empty());
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "other"}}})
            )),
            "tool_choice"
        );
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})
            )),
            "tool_choice"
        );
        assert_eq!(
            param_of(chat(json!({"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "bad name"}}]}))),
            "tools[0].function.name"
        );
    }

    #[test]
    fn json_object_adds_instruction() {
        let request = chat(json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}}))
        .unwrap();
        assert_eq!(request.prompt.messages[0].role, "system");
        assert_eq!(request.prompt.messages[0].content, JSON_OBJECT_INSTRUCTION);
    }

    #[test]
    fn common_options() {
        let request = chat(json!({"messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 7, "max_tokens": 99, "stop": "END", "seed": -1,
            "threshold": 0.9, "algorithm": "low_confidence", "stream": true,
            "stream_options": {"include_usage": true}, "return_progress": true}))
        .unwrap();
        let common = request.common;
        assert_eq!(common.max_tokens, MaxTokens::Limit(7));
        assert_eq!(common.stop, vec!["END".to_string()]);
        assert_eq!(common.params.seed, None);
        assert_eq!(common.params.threshold, Some(0.9));
        assert_eq!(common.params.algorithm, Some(Algorithm::LowConfidence));
        assert!(common.stream && common.include_usage && common.return_progress);
        let unlimited =
            chat(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}))
                .unwrap();
        assert_eq!(unlimited.common.max_tokens, MaxTokens::Unlimited);
    }

    #[test]
    fn completion_prompts() {
        let text = parse_completion_strict(&json!({"prompt": "hello"})).unwrap();
        assert_eq!(text.prompt, PromptInput::Text("hello".into()));
        let ids = parse_completion_strict(&json!({"prompt": [1, 2, 3]})).unwrap();
        assert_eq!(ids.prompt, PromptInput::Ids(vec![1, 2, 3]));
        let nested = parse_completion_strict(&json!({"prompt": [[4, 5]]})).unwrap();
        assert_eq!(nested.prompt, PromptInput::Ids(vec![4, 5]));
        assert_eq!(
            parse_completion_strict(&json!({"prompt": ["a", "b"]}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("prompt")
        );
        assert_eq!(
            parse_completion_strict(&json!({"prompt": [-1]}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("prompt")
        );
        assert_eq!(
            parse_completion_strict(&json!({"prompt": "x", "echo": true}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("echo")
        );
        assert!(parse_completion_strict(&json!({})).is_err());
    }

    #[test]
    fn tokenize_bodies() {
        let request = tokenize_strict(&json!({"content": "hi", "with_pieces": true})).unwrap();
        assert!(request.with_pieces);
        assert!(tokenize_strict(&json!({})).is_err());
        assert_eq!(
            detokenize_strict(&json!({"tokens": [1, 2]})).unwrap(),
            vec![1, 2]
        );
        assert!(detokenize_strict(&json!({"tokens": "x"})).is_err());
    }

    /// The parser refuses what the engine's table refuses, naming the field, and accepts the
    /// ends (docs/api.md's table is checked against the same table in minnow-engine).
    #[test]
    fn the_parser_enforces_the_engine_ranges() {
        for spec in minnow_engine::DECODE_PARAMS {
            let key = spec.name;
            for (value, ok) in [
                (spec.min, true),
                (spec.max, true),
                (spec.min - 1.0, false),
                (spec.max + 1.0, false),
            ] {
                let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
                body[key] = json!(value);
                let result = chat(body);
                if ok {
                    assert!(result.is_ok(), "{key}={value}");
                } else {
                    assert_eq!(param_of(result), key, "{key}={value}");
                }
            }
        }
    }

    #[test]
    fn malformed_json() {
        assert!(parse_json(b"{not json").is_err());
        assert!(parse_json(b"[1]").is_err());
        assert!(parse_json(b"{}").is_ok());
    }
}
