//! Parsing and validating OpenAI (and llama-server) request bodies into engine types. Each body,
//! and each object inside it, is a typed struct (`ChatBody`, `CompletionBody`, `SharedOptions`,
//! `MessageBody`, ...) read by `fields::parse_object`; then the values are checked (decoding
//! parameters against the engine's `DECODE_PARAMS`) and the request is built. Every field of the
//! OpenAI and llama-server request schemas is either honoured, accepted at a value that changes
//! nothing, accepted because it cannot change the answer here, or refused with a 400 naming it;
//! a field of neither schema lands in the struct's flattened map and is left to the request's
//! `FieldPolicy` (ignored and listed, or a 400 under `--strict-fields`).

use minnow_engine::constraint::tools::strict_tools;
use minnow_engine::constraint::OutputConstraint;
use minnow_engine::decode::params::check_ranges;
use minnow_engine::{Algorithm, ChatMessage, ChatPrompt, DecodeParams, ToolCall, ToolChoice};
use serde::Deserialize;
use serde_json::Value;

use super::errors::ApiError;
use super::fields::{
    accept_inert, field_path, in_range, inner, must_be_neutral, must_be_off, parse_object,
    refuse_present, required, with_unknown, FieldPolicy, Flag, Int, List, Num, Object, Present,
    Schema, Text, Unknown, Wide,
};

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

/// `POST /v1/chat/completions` (and `/apply-template`): the chat-specific fields; the rest are
/// the options shared with the other generation routes ([`SharedOptions`]).
#[derive(Deserialize)]
struct ChatBody {
    messages: Option<List>,
    tools: Option<List>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Flag>,
    /// llama-server's switch for parsing tool calls out of the output; without tools it is
    /// inert, and with tools this server always parses them.
    #[serde(rename = "parse_tool_calls")]
    _parse_tool_calls: Option<Flag>,
    add_generation_prompt: Option<Flag>,
    /// Continuing the last assistant message needs the template to leave that turn open, which
    /// the LLaDA2 templates cannot do: refused rather than answered as a new turn.
    continue_final_message: Option<Flag>,
    response_format: Option<Value>,
    chat_template_kwargs: Option<Object>,
    // The web UI sends `reasoning_format`; LLaDA2 templates hard-code "thinking off" and no
    // reasoning is parsed out, so every value behaves like "none". For the same reason a
    // thinking budget, a reasoning effort and llama-server's live reasoning control have nothing
    // to act on.
    #[serde(rename = "reasoning_format")]
    _reasoning_format: Option<Text>,
    #[serde(rename = "reasoning_effort")]
    _reasoning_effort: Option<Text>,
    thinking_budget_tokens: Option<Int>,
    #[serde(rename = "reasoning_control")]
    _reasoning_control: Option<Flag>,
    #[serde(flatten)]
    shared: Unknown,
}

/// `POST /v1/completions` (and llama-server's `/completion`).
#[derive(Deserialize)]
struct CompletionBody {
    prompt: Option<Value>,
    echo: Option<Flag>,
    best_of: Option<Int>,
    suffix: Present,
    #[serde(flatten)]
    shared: Unknown,
}

/// llama-server `/tokenize`.
#[derive(Deserialize)]
struct TokenizeBody {
    content: Option<Text>,
    /// LLaDA2 tokenizers add no special tokens (no BOS), so `add_special` changes nothing.
    #[serde(rename = "add_special")]
    _add_special: Option<Flag>,
    parse_special: Option<Flag>,
    with_pieces: Option<Flag>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// llama-server `/detokenize`.
#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// The options every generation route shares (`parse_common`); what none of them declares is
/// left in `unknown`.
#[derive(Deserialize)]
pub(super) struct SharedOptions {
    model: Option<Text>,
    // Later names win only if the earlier were absent: OpenAI's preferred name comes first.
    max_completion_tokens: Option<Int>,
    max_tokens: Option<Int>,
    n_predict: Option<Int>,
    stop: Option<Value>,
    temperature: Option<Num>,
    top_p: Option<Num>,
    top_k: Option<Int>,
    seed: Option<Wide>,
    threshold: Option<Num>,
    editing_threshold: Option<Num>,
    max_post_steps: Option<Int>,
    steps: Option<Int>,
    num_to_transfer: Option<Int>,
    algorithm: Option<Text>,
    stream: Option<Flag>,
    stream_options: Option<Value>,
    return_progress: Option<Flag>,
    timings_per_token: Option<Flag>,
    sse_ping_interval: Option<Num>,
    // OpenAI's `n` and llama-server's `n_cmpl`: one answer per request.
    n: Option<Int>,
    n_cmpl: Option<Int>,
    // llama-server output options this server cannot produce: accepted only when off.
    ignore_eos: Option<Flag>,
    return_tokens: Option<Flag>,
    post_sampling_probs: Option<Flag>,
    response_fields: Present,
    // LoRA adapters and images do not exist here; an empty list asks for none.
    lora: Option<Value>,
    image_data: Option<Value>,
    logprobs: Option<Flag>,
    top_logprobs: Present,
    n_probs: Present,
    logit_bias: Option<Value>,
    json_schema: Option<Schema>,
    grammar: Option<Text>,
    tools_ts_str: Present,
    // Samplers and penalties this engine does not implement: accepted only at the value that
    // disables them (the llama.cpp web UI sends all of them, at the values /props advertises).
    presence_penalty: Option<Num>,
    frequency_penalty: Option<Num>,
    repeat_penalty: Option<Num>,
    min_p: Option<Num>,
    typical_p: Option<Num>,
    typ_p: Option<Num>,
    dynatemp_range: Option<Num>,
    xtc_probability: Option<Num>,
    dry_multiplier: Option<Num>,
    top_n_sigma: Option<Num>,
    mirostat: Option<Num>,
    // llama-server's minimum indentation and time limit change the answer when set.
    n_indent: Option<Num>,
    t_max_predict_ms: Option<Num>,
    /// Stored completions are not kept, so `store` must be false.
    store: Option<Flag>,
    modalities: Option<Value>,
    cache_prompt: Option<Flag>,
    cache_salt: Option<Text>,
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

/// `stream_options`.
#[derive(Deserialize)]
pub(super) struct StreamOptionsBody {
    pub(super) include_usage: Option<Flag>,
    /// OpenAI's newer flag; obfuscation padding is never added here.
    #[serde(rename = "include_obfuscation")]
    _include_obfuscation: Option<Flag>,
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

/// Shared options whose values cannot change the output, accepted at any value: OpenAI request
/// metadata (stored completions are not kept, so `metadata` is inert, and there is one service
/// tier); settings of the disabled samplers (inert while their switch is neutral), the sampler
/// order (this engine's order is fixed), llama-server's slot pinning, and OpenAI's end-user tag.
const INERT_OPTIONS: &[&str] = &[
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
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
];

pub fn parse_chat(body: &Value, policy: &FieldPolicy) -> Result<ChatRequest, ApiError> {
    let chat: ChatBody = parse_object(body, "request body")?;
    let (mut common, unknown) = parse_common(parse_shared(chat.shared)?, policy)?;

    let messages = required(inner(chat.messages), "messages")?;
    let mut messages = parse_messages(messages, policy)?;

    let tools = match chat.tools {
        None => Vec::new(),
        Some(list) => parse_tools(list.0, policy)?,
    };
    let declared: Vec<String> = tools.iter().map(tool_name).collect();
    let tool_choice = match &chat.tool_choice {
        None => ToolChoice::Auto,
        Some(value) => parse_tool_choice(value, &declared, policy)?,
    };
    let parallel_tool_calls = inner(chat.parallel_tool_calls).unwrap_or(true);
    let add_generation_prompt = inner(chat.add_generation_prompt).unwrap_or(true);
    must_be_off("continue_final_message", inner(chat.continue_final_message))?;

    if let Some(format) = &chat.response_format {
        let (constraint, instruct) = parse_response_format(format, policy)?;
        if instruct {
            add_json_instruction(&mut messages);
        }
        set_constraint(&mut common, constraint, "response_format")?;
    }
    set_tool_constraint(&mut common, &tools, &tool_choice)?;
    let template_kwargs = inner(chat.chat_template_kwargs).unwrap_or_default();
    in_range(
        "thinking_budget_tokens",
        inner(chat.thinking_budget_tokens),
        -1,
        i64::MAX,
    )?;
    policy.finish("request body", &unknown)?;

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
    let completion: CompletionBody = parse_object(body, "request body")?;
    let (common, unknown) = parse_common(parse_shared(completion.shared)?, policy)?;
    let prompt = parse_prompt(&required(completion.prompt, "prompt")?)?;
    must_be_off("echo", inner(completion.echo))?;
    if let Some(best_of) = in_range("best_of", inner(completion.best_of), 1, i64::MAX)? {
        if best_of != 1 {
            return Err(ApiError::invalid(
                "best_of",
                "only 'best_of': 1 is supported",
            ));
        }
    }
    refuse_present("suffix", completion.suffix)?;
    policy.finish("request body", &unknown)?;
    Ok(CompletionRequest { common, prompt })
}

/// llama-server `/tokenize`: `{"content": "...", "add_special": bool, "with_pieces": bool}`.
pub fn parse_tokenize(body: &Value, policy: &FieldPolicy) -> Result<TokenizeRequest, ApiError> {
    let tokenize: TokenizeBody = parse_object(body, "request body")?;
    let content = required(inner(tokenize.content), "content")?;
    policy.finish("request body", &tokenize.unknown)?;
    Ok(TokenizeRequest {
        content,
        with_pieces: inner(tokenize.with_pieces).unwrap_or(false),
        parse_special: inner(tokenize.parse_special).unwrap_or(true),
    })
}

/// llama-server `/detokenize`: `{"tokens": [ids]}`.
pub fn parse_detokenize(body: &Value, policy: &FieldPolicy) -> Result<Vec<u32>, ApiError> {
    let detokenize: DetokenizeBody = parse_object(body, "request body")?;
    let tokens = match &detokenize.tokens {
        None => Vec::new(),
        Some(value) => parse_ids(value, "tokens")?,
    };
    policy.finish("request body", &detokenize.unknown)?;
    Ok(tokens)
}

/// The shared options out of the fields a route's own struct left over (top-level names: the
/// field named in an error is the body's).
pub(super) fn parse_shared(rest: Unknown) -> Result<SharedOptions, ApiError> {
    let mut shared: SharedOptions = parse_object(Value::Object(rest), "request body")?;
    accept_inert(&mut shared.unknown, INERT_OPTIONS);
    Ok(shared)
}

/// The shared options as the engine and the server use them: decoding parameters checked
/// against the engine's one table (`DECODE_PARAMS`), refusals of what cannot be honoured; and
/// the fields none of the options declares, which the caller reports under the field policy
/// once its own fields are checked.
pub(super) fn parse_common(
    shared: SharedOptions,
    policy: &FieldPolicy,
) -> Result<(CommonOptions, Unknown), ApiError> {
    let mut max_tokens = MaxTokens::ServerDefault;
    for (key, value) in [
        ("max_completion_tokens", &shared.max_completion_tokens),
        ("max_tokens", &shared.max_tokens),
        ("n_predict", &shared.n_predict),
    ] {
        let Some(n) = in_range(key, value.as_ref().map(|n| n.0), -1, i64::MAX)? else {
            continue;
        };
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

    let stop = match &shared.stop {
        None => Vec::new(),
        Some(value) => parse_stop(value)?,
    };

    // Whole numbers outside `usize` (negative ones) stay out of range for the table's check.
    let count = |n: &Option<Int>| {
        n.as_ref()
            .map(|n| usize::try_from(n.0).unwrap_or(usize::MAX))
    };
    let mut params = DecodeParams {
        temperature: shared.temperature.as_ref().map(|x| x.0 as f32),
        top_p: shared.top_p.as_ref().map(|x| x.0 as f32),
        top_k: count(&shared.top_k),
        threshold: shared.threshold.as_ref().map(|x| x.0 as f32),
        editing_threshold: shared.editing_threshold.as_ref().map(|x| x.0 as f32),
        max_post_steps: count(&shared.max_post_steps),
        steps: count(&shared.steps),
        num_to_transfer: count(&shared.num_to_transfer),
        ..DecodeParams::default()
    };
    check_ranges(&params)?;
    // llama-server uses -1 for "a random seed".
    // Any other value is the seed's 64 bits: 0 to u64's maximum.
    let seed = shared.seed.as_ref().map(|n| n.0);
    params.seed = match in_range("seed", seed, -1, i128::from(u64::MAX))? {
        None | Some(-1) => None,
        Some(seed) => Some(seed as u64),
    };
    params.algorithm = match &shared.algorithm {
        None => None,
        Some(Text(name)) => {
            Some(parse_algorithm(name).map_err(|m| ApiError::invalid("algorithm", m))?)
        }
    };

    let mut include_usage = false;
    if let Some(options) = &shared.stream_options {
        let options: StreamOptionsBody = parse_object(options, "stream_options")?;
        include_usage = inner(options.include_usage).unwrap_or(false);
        policy.finish("stream_options", &options.unknown)?;
    }
    // -1: no pings; otherwise at least 0.1 s (0 would be a busy loop).
    let sse_ping_interval = match in_range(
        "sse_ping_interval",
        shared.sse_ping_interval.as_ref().map(|x| x.0),
        -1.0,
        3600.0,
    )? {
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

    for (key, n) in [("n", &shared.n), ("n_cmpl", &shared.n_cmpl)] {
        if let Some(n) = in_range(key, n.as_ref().map(|n| n.0), 1, i64::MAX)? {
            if n != 1 {
                return Err(ApiError::invalid(
                    key,
                    format!("only '{key}': 1 is supported"),
                ));
            }
        }
    }
    must_be_off("ignore_eos", inner(shared.ignore_eos))?;
    must_be_off("return_tokens", inner(shared.return_tokens))?;
    must_be_off("post_sampling_probs", inner(shared.post_sampling_probs))?;
    refuse_present("response_fields", shared.response_fields)?;
    for (key, value) in [("lora", &shared.lora), ("image_data", &shared.image_data)] {
        if let Some(value) = value {
            if value.as_array().is_none_or(|list| !list.is_empty()) {
                return Err(ApiError::invalid(
                    key,
                    format!("'{key}' is not supported by this server (only an empty list)"),
                ));
            }
        }
    }
    must_be_off("logprobs", inner(shared.logprobs))?;
    refuse_present("top_logprobs", shared.top_logprobs)?;
    refuse_present("n_probs", shared.n_probs)?;
    if let Some(bias) = &shared.logit_bias {
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
    let mut constraint = shared
        .json_schema
        .map(|schema| OutputConstraint::JsonSchema(schema.0));
    if let Some(Text(grammar)) = &shared.grammar {
        if !grammar.trim().is_empty() {
            if constraint.is_some() {
                return Err(ApiError::invalid(
                    "grammar",
                    "send either 'grammar' or 'json_schema', not both",
                ));
            }
            constraint = Some(parse_grammar(grammar)?);
        }
    }
    refuse_present("tools_ts_str", shared.tools_ts_str)?;

    for (key, value, neutral) in [
        ("presence_penalty", &shared.presence_penalty, 0.0),
        ("frequency_penalty", &shared.frequency_penalty, 0.0),
        ("repeat_penalty", &shared.repeat_penalty, 1.0),
        ("min_p", &shared.min_p, 0.0),
        ("typical_p", &shared.typical_p, 1.0),
        ("typ_p", &shared.typ_p, 1.0),
        ("dynatemp_range", &shared.dynatemp_range, 0.0),
        ("xtc_probability", &shared.xtc_probability, 0.0),
        ("dry_multiplier", &shared.dry_multiplier, 0.0),
        ("top_n_sigma", &shared.top_n_sigma, -1.0),
        ("mirostat", &shared.mirostat, 0.0),
        ("n_indent", &shared.n_indent, 0.0),
        ("t_max_predict_ms", &shared.t_max_predict_ms, 0.0),
    ] {
        must_be_neutral(key, value.as_ref().map(|x| x.0), neutral)?;
    }
    must_be_off("store", inner(shared.store))?;
    if let Some(modalities) = &shared.modalities {
        if modalities != &Value::Array(vec![Value::String("text".into())]) {
            return Err(ApiError::invalid(
                "modalities",
                "only 'modalities': [\"text\"] is supported",
            ));
        }
    }

    let common = CommonOptions {
        model: inner(shared.model),
        max_tokens,
        stop,
        params,
        stream: inner(shared.stream).unwrap_or(false),
        include_usage,
        return_progress: inner(shared.return_progress).unwrap_or(false),
        timings_per_token: inner(shared.timings_per_token).unwrap_or(false),
        cache_prompt: inner(shared.cache_prompt),
        cache_salt: inner(shared.cache_salt),
        sse_ping_interval,
        constraint,
    };
    Ok((common, shared.unknown))
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

/// One chat message: the fields every role has; the rest are read by role.
#[derive(Deserialize)]
struct MessageBody {
    role: Option<Text>,
    content: Option<Value>,
    name: Option<Text>,
    #[serde(flatten)]
    by_role: Unknown,
}

/// The fields only an assistant message has.
#[derive(Deserialize)]
struct AssistantFields {
    reasoning_content: Option<Text>,
    /// OpenAI's `refusal` is output-only; a client echoing it back as null is harmless.
    refusal: Present,
    tool_calls: Option<List>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// The field only a tool message has.
#[derive(Deserialize)]
struct ToolFields {
    tool_call_id: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// A part of a message's `content` list.
#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: Option<Text>,
    text: Option<Text>,
    /// Anthropic-style prompt-caching hints: this server caches prefixes by itself.
    #[serde(rename = "cache_control")]
    _cache_control: Present,
    #[serde(flatten)]
    unknown: Unknown,
}

/// An assistant's earlier tool call: `{id, type, function: {name, arguments}}`.
#[derive(Deserialize)]
struct HistoryCall {
    id: Option<Text>,
    #[serde(rename = "type")]
    kind: Option<Text>,
    function: Option<Value>,
    /// Stream deltas' position, echoed back by some clients.
    #[serde(rename = "index")]
    _index: Present,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct HistoryFunction {
    name: Option<Text>,
    arguments: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// A tool definition: `{"type": "function", "function": {...}}`.
#[derive(Deserialize)]
struct ToolBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    function: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct ToolFunction {
    name: Option<Text>,
    #[serde(rename = "description")]
    _description: Option<Text>,
    #[serde(rename = "parameters")]
    _parameters: Option<Schema>,
    /// `strict: true` constrains a call's arguments to `parameters` (constraint::tools).
    #[serde(rename = "strict")]
    _strict: Option<Flag>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// `tool_choice` as an object: `{"type": "function", "function": {"name"}}`.
#[derive(Deserialize)]
struct ToolChoiceBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    function: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct ToolChoiceFunction {
    name: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// `response_format`.
#[derive(Deserialize)]
struct ResponseFormatBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    /// llama-server's inline form.
    schema: Option<Schema>,
    json_schema: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// OpenAI's `{"name", "description", "schema", "strict"}` object of a JSON Schema format.
#[derive(Deserialize)]
pub(super) struct JsonSchemaSpec {
    #[serde(rename = "name")]
    _name: Option<Text>,
    #[serde(rename = "description")]
    _description: Option<Text>,
    /// `strict: false` is honoured as strictly as `true`: every answer follows the schema.
    #[serde(rename = "strict")]
    _strict: Option<Flag>,
    schema: Option<Schema>,
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

/// Normalizes OpenAI messages (chat-format doc §1.3).
fn parse_messages(items: Vec<Value>, policy: &FieldPolicy) -> Result<Vec<ChatMessage>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(items.len());
    // A set: a history of many calls is checked in linear time.
    let mut call_ids: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("messages[{i}]");
        let body: MessageBody = parse_object(item, &path)?;
        let role_path = field_path(&path, "role");
        let role = required(inner(body.role), &role_path)?;
        let role = match role.as_str() {
            "developer" => "system".to_string(),
            "system" | "user" | "assistant" | "tool" => role,
            other => {
                return Err(ApiError::invalid(
                    role_path,
                    format!(
                    "unknown role '{other}': expected system, developer, user, assistant or tool"
                ),
                ))
            }
        };
        let content = match body.content {
            None => String::new(),
            Some(value) => parse_content(value, &field_path(&path, "content"), policy)?,
        };
        let mut message = ChatMessage {
            role: role.clone(),
            content,
            name: inner(body.name),
            ..ChatMessage::default()
        };
        let rest = Value::Object(body.by_role);
        let unknown = match role.as_str() {
            "assistant" => {
                let fields: AssistantFields = parse_object(rest, &path)?;
                message.reasoning_content = inner(fields.reasoning_content);
                if fields.refusal.is_some() {
                    return Err(ApiError::invalid(
                        field_path(&path, "refusal"),
                        "'refusal' is not supported in request messages",
                    ));
                }
                if let Some(List(calls)) = fields.tool_calls {
                    message.tool_calls =
                        parse_history_calls(calls, &field_path(&path, "tool_calls"), policy)?;
                    call_ids.extend(message.tool_calls.iter().map(|call| call.id.clone()));
                }
                fields.unknown
            }
            "tool" => {
                let fields: ToolFields = parse_object(rest, &path)?;
                let id_path = field_path(&path, "tool_call_id");
                let Some(Text(id)) = fields.tool_call_id else {
                    return Err(ApiError::invalid(
                        id_path,
                        format!("'{path}.tool_call_id' is required for tool messages"),
                    ));
                };
                if !call_ids.contains(&id) {
                    return Err(ApiError::invalid(
                        id_path,
                        format!(
                            "tool_call_id '{id}' does not answer any earlier assistant tool call"
                        ),
                    ));
                }
                message.tool_call_id = Some(id);
                fields.unknown
            }
            _ => match rest {
                Value::Object(unknown) => unknown,
                _ => Unknown::new(),
            },
        };
        policy.finish(&path, &unknown)?;
        messages.push(message);
    }
    Ok(messages)
}

/// A string, or a list of text parts joined with "\n" (OpenAI does not define a separator; a
/// newline keeps separate parts from running into each other).
fn parse_content(value: Value, path: &str, policy: &FieldPolicy) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                let part_path = format!("{path}[{j}]");
                let part: ContentPart = parse_object(part, &part_path)?;
                let type_path = field_path(&part_path, "type");
                let kind = required(inner(part.kind), &type_path)?;
                if kind != "text" {
                    return Err(ApiError::invalid(
                        type_path,
                        format!("content part type '{kind}' is not supported (text only)"),
                    ));
                }
                let text = required(inner(part.text), &field_path(&part_path, "text"))?;
                policy.finish(&part_path, &part.unknown)?;
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

/// Assistant `tool_calls` in the history.
fn parse_history_calls(
    items: Vec<Value>,
    path: &str,
    policy: &FieldPolicy,
) -> Result<Vec<ToolCall>, ApiError> {
    let mut calls = Vec::with_capacity(items.len());
    for (k, item) in items.into_iter().enumerate() {
        let call_path = format!("{path}[{k}]");
        let call: HistoryCall = parse_object(item, &call_path)?;
        let id = required(inner(call.id), &field_path(&call_path, "id"))?;
        if call.kind.is_some_and(|Text(kind)| kind != "function") {
            return Err(ApiError::invalid(
                field_path(&call_path, "type"),
                "only 'function' tool calls are supported",
            ));
        }
        let function_path = field_path(&call_path, "function");
        let function = required(call.function, &function_path)?;
        policy.finish(&call_path, &call.unknown)?;
        let function: HistoryFunction = parse_object(function, &function_path)?;
        let name = required(inner(function.name), &field_path(&function_path, "name"))?;
        // Arguments go to the template as a JSON string (OpenAI form); an object is serialized.
        let arguments = match function.arguments {
            None => "{}".to_string(),
            Some(Value::String(s)) => s,
            Some(object @ Value::Object(_)) => object.to_string(),
            Some(_) => {
                let path = field_path(&function_path, "arguments");
                return Err(ApiError::invalid(
                    path.clone(),
                    format!("'{path}' must be a JSON string or an object"),
                ));
            }
        };
        policy.finish(&function_path, &function.unknown)?;
        calls.push(ToolCall {
            id,
            name,
            arguments,
        });
    }
    Ok(calls)
}

/// Tool definitions, validated and passed to the template unchanged.
pub(super) fn parse_tools(items: Vec<Value>, policy: &FieldPolicy) -> Result<Vec<Value>, ApiError> {
    // A set: many declared tools are checked in linear time.
    let mut names: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("tools[{i}]");
        let tool: ToolBody = parse_object(item, &path)?;
        if tool.kind.is_none_or(|Text(kind)| kind != "function") {
            return Err(ApiError::invalid(
                field_path(&path, "type"),
                format!("'{path}.type' must be \"function\""),
            ));
        }
        let function_path = field_path(&path, "function");
        let function = required(tool.function, &function_path)?;
        policy.finish(&path, &tool.unknown)?;
        let function: ToolFunction = parse_object(&function, &function_path)?;
        let name = inner(function.name).unwrap_or_default();
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        let name_path = field_path(&function_path, "name");
        if !valid_name {
            return Err(ApiError::invalid(
                name_path,
                "a function name must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'",
            ));
        }
        if names.contains(&name) {
            return Err(ApiError::invalid(
                name_path,
                format!("function '{name}' is declared twice"),
            ));
        }
        policy.finish(&function_path, &function.unknown)?;
        names.insert(name);
    }
    Ok(items)
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
            let choice: ToolChoiceBody = parse_object(value, "tool_choice")?;
            if choice.kind.is_none_or(|Text(kind)| kind != "function") {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "'tool_choice.type' must be \"function\"",
                ));
            }
            let function = required(choice.function, "tool_choice.function")?;
            policy.finish("tool_choice", &choice.unknown)?;
            let function: ToolChoiceFunction = parse_object(function, "tool_choice.function")?;
            let name = required(inner(function.name), "tool_choice.function.name")?;
            policy.finish("tool_choice.function", &function.unknown)?;
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
    let format: ResponseFormatBody = parse_object(value, "response_format")?;
    let inline = inner(format.schema);
    let kind = inner(format.kind);
    // Only a `json_schema` format reads the `json_schema` object; elsewhere it is unknown.
    let unknown = match kind.as_deref() {
        Some("json_schema") => format.unknown,
        _ => with_unknown(value, format.unknown, &["json_schema"]),
    };
    let result = match kind.as_deref() {
        Some("text") => (None, false),
        Some("json_object") => match inline {
            Some(schema) => (Some(OutputConstraint::JsonSchema(schema)), false),
            None => (Some(OutputConstraint::JsonObject), true),
        },
        Some("json_schema") => {
            let schema = match (&format.json_schema, inline) {
                (Some(spec), _) => {
                    let spec: JsonSchemaSpec = parse_object(spec, "response_format.json_schema")?;
                    let schema = json_schema_spec(&spec, "response_format.json_schema")?;
                    policy.finish("response_format.json_schema", &spec.unknown)?;
                    schema
                }
                (None, Some(schema)) => schema,
                (None, None) => required(None, "response_format.json_schema")?,
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
    policy.finish("response_format", &unknown)?;
    Ok(result)
}

/// The schema of a JSON Schema format's object at `path`; the caller reports `spec.unknown`.
pub(super) fn json_schema_spec(spec: &JsonSchemaSpec, path: &str) -> Result<Value, ApiError> {
    required(spec.schema.clone(), &field_path(path, "schema")).map(|schema| schema.0)
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
        // A seed of 64 random bits, above i64's range, is a seed like any other.
        let seeded = |seed: Value| {
            chat(json!({"messages": [{"role": "user", "content": "x"}], "seed": seed}))
                .map(|r| r.common.params.seed)
        };
        assert_eq!(seeded(json!(u64::MAX)).unwrap(), Some(u64::MAX));
        assert_eq!(seeded(json!(7)).unwrap(), Some(7));
        let below = seeded(json!(-2)).unwrap_err();
        assert!(
            below.message.contains("between -1 and"),
            "{}",
            below.message
        );
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

    /// Type errors name the field and the expected type as the hand-written walker before the
    /// typed structs did (clients match these texts).
    #[test]
    fn type_errors_keep_their_messages() {
        let message = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            chat(body).unwrap_err().message
        };
        assert_eq!(
            message(json!({"temperature": "hot"})),
            "'temperature' must be a number"
        );
        assert_eq!(
            message(json!({"max_tokens": 1.5})),
            "'max_tokens' must be an integer"
        );
        assert_eq!(
            message(json!({"stream_options": {"include_usage": "yes"}})),
            "'stream_options.include_usage' must be a boolean"
        );
        assert_eq!(
            message(json!({"stream_options": 3})),
            "'stream_options' must be a JSON object"
        );
        assert_eq!(
            message(json!({"messages": [{"role": "user", "content": "x", "name": 5}]})),
            "'messages[0].name' must be a string"
        );
        assert_eq!(
            message(json!({"messages": "x"})),
            "'messages' must be a list"
        );
        assert_eq!(
            message(json!({"tools": [{"type": "function",
                "function": {"name": "f", "parameters": 3}}]})),
            "'tools[0].function.parameters' must be a JSON Schema object"
        );
        assert_eq!(
            message(json!({"stream_options": {"wat": 1}})),
            "unknown field 'stream_options.wat' (the server runs with --strict-fields)"
        );
    }

    /// `json_schema` is read only by a `json_schema` format; in another it is an unknown field,
    /// listed where the body has it.
    #[test]
    fn an_unread_json_schema_is_unknown_in_body_order() {
        let lenient = FieldPolicy::new(false);
        parse_chat(
            &json!({"messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_object", "json_schema": null, "q": 1}}),
            &lenient,
        )
        .unwrap();
        assert_eq!(
            lenient.ignored(),
            vec![
                "response_format.json_schema".to_string(),
                "response_format.q".into()
            ]
        );
    }

    #[test]
    fn malformed_json() {
        assert!(parse_json(b"{not json").is_err());
        assert!(parse_json(b"[1]").is_err());
        assert!(parse_json(b"{}").is_ok());
    }
}
