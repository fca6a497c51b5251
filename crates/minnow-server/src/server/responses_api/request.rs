//! Parsing and validating a `POST /v1/responses` body. The sampling and diffusion fields the
//! Responses API shares with chat completions (`model`, `temperature`, `top_p`, `stop`, `seed`,
//! `threshold`, ...) are handed to the chat parser's own option parsing, so both APIs accept and
//! refuse them alike; the rest is the Responses API's: `input`, `instructions`, `tools`,
//! `tool_choice`, `max_output_tokens`, `store`, `previous_response_id`, `text`, `metadata`, ...
//! Every field is honoured, accepted at a value that changes nothing, or refused with a 400
//! naming it.

use minnow_engine::ToolChoice;
use serde_json::{json, Map, Value};

use super::super::errors::ApiError;
use super::super::fields::{FieldPolicy, Fields};
use super::super::openai::{self, CommonOptions, MaxTokens};
use super::items::{self, Item, Role};
use minnow_engine::constraint::OutputConstraint;

/// Fields passed through to the chat parser's shared options (`openai::parse_common`).
const SHARED_OPTIONS: [&str; 19] = [
    "model",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "threshold",
    "editing_threshold",
    "max_post_steps",
    "steps",
    "num_to_transfer",
    "algorithm",
    "top_logprobs",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    // Prefix-cache tenancy, as on the chat and completions routes.
    "cache_salt",
    "cache_prompt",
];

/// `include` values that ask for data of item types this server never produces (reasoning,
/// hosted tools), so including it changes nothing.
const VACUOUS_INCLUDES: [&str; 7] = [
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
];

#[derive(Clone, Debug)]
pub struct ResponsesRequest {
    /// Shared options; `max_tokens` comes from `max_output_tokens`, `stream` from `stream`.
    pub common: CommonOptions,
    /// System messages rendered before the conversation (not carried to later turns).
    pub instructions: Vec<Item>,
    /// This turn's new items.
    pub input: Vec<Item>,
    /// Chat-form tool definitions, as the template receives them.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    pub tool_names: Vec<String>,
    pub parallel_tool_calls: bool,
    /// `text.format.type == "json_object"`.
    pub json_object: bool,
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// `return_progress`: `minnow.prompt_progress` events while streaming.
    pub return_progress: bool,
    /// Request settings the response object reports back (OpenAI echoes them).
    pub echo: Map<String, Value>,
}

pub fn parse(body: &Value, policy: &FieldPolicy) -> Result<ResponsesRequest, ApiError> {
    let mut fields = Fields::new(body, "request body", policy)?;

    let mut shared = Map::new();
    for key in SHARED_OPTIONS {
        if let Some(value) = fields.value(key) {
            shared.insert(key.to_string(), value.clone());
        }
    }
    let mut common = openai::parse_common(&mut Fields::new(
        &Value::Object(shared),
        "request body",
        policy,
    )?)?;
    common.max_tokens = match fields.integer("max_output_tokens", 1, i64::MAX)? {
        None => MaxTokens::ServerDefault,
        Some(n) => MaxTokens::Limit(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    common.stream = fields.bool("stream")?.unwrap_or(false);
    if let Some(options) = fields.value("stream_options") {
        let mut sub = Fields::new(options, "stream_options", policy)?;
        // Obfuscation padding is never added here.
        sub.bool("include_obfuscation")?;
        sub.finish()?;
    }
    let return_progress = fields.bool("return_progress")?.unwrap_or(false);

    let input = match fields.value("input") {
        None => Vec::new(),
        Some(value) => items::parse_input(value, "input", policy)?,
    };
    let instructions_value = fields.value("instructions");
    let instructions = match instructions_value {
        None => Vec::new(),
        Some(Value::String(text)) => vec![Item::Message {
            id: None,
            role: Role::System,
            text: text.clone(),
        }],
        Some(value) => items::parse_input(value, "instructions", policy)?,
    };

    let tools_value = fields.value("tools");
    let tools = match tools_value {
        None => Vec::new(),
        Some(value) => parse_tools(value, policy)?,
    };
    let (tools, strict): (Vec<Value>, Vec<bool>) = tools.into_iter().unzip();
    let declared: Vec<String> = tools.iter().map(openai::tool_name).collect();
    let tool_choice = match fields.value("tool_choice") {
        None => ToolChoice::Auto,
        Some(value) => parse_tool_choice(value, &declared, policy)?,
    };
    let parallel_tool_calls = fields.bool("parallel_tool_calls")?.unwrap_or(true);
    let tool_names = match &tool_choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Function(name) => vec![name.clone()],
        ToolChoice::Auto | ToolChoice::Required => declared,
    };

    let text_format = match fields.value("text") {
        None => TextFormat::default(),
        Some(text) => parse_text(text, policy)?,
    };
    let json_object = text_format.instruct;
    openai::set_constraint(&mut common, text_format.constraint, "text.format")?;
    // The template sees the tools without `strict` (as chat's tools without it); the grammar
    // reads it from a marked copy.
    let marked: Vec<Value> = tools
        .iter()
        .zip(&strict)
        .map(|(tool, &strict)| {
            let mut tool = tool.clone();
            if strict {
                tool["function"]["strict"] = Value::Bool(true);
            }
            tool
        })
        .collect();
    openai::set_tool_constraint(&mut common, &marked, &tool_choice)?;
    let store = fields.bool("store")?.unwrap_or(true);
    let previous_response_id = fields.string("previous_response_id")?;
    let metadata = match fields.value("metadata") {
        None => Map::new(),
        Some(value) => parse_metadata(value)?,
    };

    if let Some(include) = fields.value("include") {
        parse_include(include)?;
    }
    // No reasoning is produced or parsed out (LLaDA2 templates render "thinking off"), so a
    // reasoning effort or summary request has nothing to act on.
    fields.accept_any("reasoning");
    match fields.string("truncation")?.as_deref() {
        None | Some("disabled") => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "truncation",
                "only 'truncation': \"disabled\" is supported (a conversation longer than the \
                 context is refused, never cut)",
            ))
        }
    }
    fields.must_be_false("background")?;
    for key in [
        "conversation",
        "prompt",
        "max_tool_calls",
        "context_management",
    ] {
        fields.unsupported(key)?;
    }
    fields.finish()?;

    if input.is_empty() && previous_response_id.is_none() && instructions.is_empty() {
        return Err(ApiError::invalid("input", "'input' is required"));
    }

    let mut echo = Map::new();
    echo.insert(
        "instructions".into(),
        instructions_value.cloned().unwrap_or(Value::Null),
    );
    echo.insert(
        "max_output_tokens".into(),
        match common.max_tokens {
            MaxTokens::Limit(n) => json!(n),
            _ => Value::Null,
        },
    );
    echo.insert("metadata".into(), Value::Object(metadata));
    echo.insert("parallel_tool_calls".into(), json!(parallel_tool_calls));
    echo.insert("previous_response_id".into(), json!(previous_response_id));
    echo.insert("store".into(), json!(store));
    echo.insert("temperature".into(), json!(common.params.temperature));
    echo.insert("top_p".into(), json!(common.params.top_p));
    echo.insert("text".into(), json!({"format": text_format.echo}));
    echo.insert("tool_choice".into(), tool_choice_json(&tool_choice));
    echo.insert(
        "tools".into(),
        tools_value.cloned().unwrap_or_else(|| json!([])),
    );
    echo.insert("truncation".into(), json!("disabled"));

    Ok(ResponsesRequest {
        common,
        instructions,
        input,
        tools,
        tool_choice,
        tool_names,
        parallel_tool_calls,
        json_object,
        store,
        previous_response_id,
        return_progress,
        echo,
    })
}

/// Responses function tools are flat (`{"type": "function", "name", "description",
/// "parameters", "strict"}`); they are checked here for their type and keys, then validated by
/// the chat parser in chat form (`{"type": "function", "function": {...}}`), which is also the
/// form the template receives.
///
/// `strict` is accepted at either value: the Responses API defaults it to true and agent SDKs
/// send it on every tool, but arguments are not schema-constrained here (docs/api.md).
fn parse_tools(value: &Value, policy: &FieldPolicy) -> Result<Vec<(Value, bool)>, ApiError> {
    let list = value
        .as_array()
        .ok_or_else(|| ApiError::invalid("tools", "'tools' must be a list"))?;
    let mut chat_tools = Vec::with_capacity(list.len());
    let mut strict = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let mut fields = Fields::new(tool, &path, policy)?;
        match fields.string("type")?.as_deref() {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    fields.path("type"),
                    format!("tool type '{other}' is not supported (only 'function' tools are)"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    fields.path("type"),
                    format!("'{path}.type' is required"),
                ))
            }
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters"] {
            if let Some(value) = fields.value(key) {
                function.insert(key.to_string(), value.clone());
            }
        }
        // Explicit `strict: true` constrains the call's arguments (constraint::tools); the
        // Responses API's default of true is not applied, so tools sent without it keep free
        // arguments as before.
        strict.push(fields.bool("strict")? == Some(true));
        fields.finish()?;
        chat_tools.push(json!({"type": "function", "function": function}));
    }
    let chat_tools =
        openai::parse_tools(&Value::Array(chat_tools), policy).map_err(flat_tool_paths)?;
    Ok(chat_tools.into_iter().zip(strict).collect())
}

/// The chat parser names `tools[i].function.name`; in a Responses body that is `tools[i].name`.
fn flat_tool_paths(mut error: ApiError) -> ApiError {
    let flatten = |text: &str| {
        text.replace("].function.", "].")
            .replace("].function'", "]'")
    };
    error.param = error.param.as_deref().map(flatten);
    error.message = flatten(&error.message);
    error
}

/// `"auto" | "none" | "required" | {"type": "function", "name"}`; hosted-tool choices and
/// `allowed_tools` are refused.
fn parse_tool_choice(
    value: &Value,
    declared: &[String],
    policy: &FieldPolicy,
) -> Result<ToolChoice, ApiError> {
    let chat_form = match value {
        Value::Object(_) => {
            let mut fields = Fields::new(value, "tool_choice", policy)?;
            match fields.string("type")?.as_deref() {
                Some("function") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        format!("tool_choice type '{other}' is not supported (only 'function' is)"),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        "'tool_choice.type' is required",
                    ))
                }
            }
            let name = fields.string("name")?.ok_or_else(|| {
                ApiError::invalid("tool_choice.name", "'tool_choice.name' is required")
            })?;
            fields.finish()?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => other.clone(),
    };
    openai::parse_tool_choice(&chat_form, declared, policy)
}

fn tool_choice_json(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "name": name}),
    }
}

/// What `text.format` asks for.
struct TextFormat {
    constraint: Option<OutputConstraint>,
    /// `json_object`: the JSON instruction is added to the prompt, as in chat completions.
    instruct: bool,
    /// The format as the response object reports it.
    echo: Value,
}

impl Default for TextFormat {
    fn default() -> Self {
        Self {
            constraint: None,
            instruct: false,
            echo: json!({"type": "text"}),
        }
    }
}

/// `text`: `{"format": {"type": "text" | "json_object" | "json_schema", ...}, "verbosity":
/// "medium"}`; a `json_schema` format is `{"type", "name", "schema", "description", "strict"}`.
fn parse_text(value: &Value, policy: &FieldPolicy) -> Result<TextFormat, ApiError> {
    let mut fields = Fields::new(value, "text", policy)?;
    let format = match fields.value("format") {
        None => TextFormat::default(),
        Some(format) => {
            let mut format_fields = Fields::new(format, "text.format", policy)?;
            let parsed =
                match format_fields.string("type")?.as_deref() {
                    Some("text") => TextFormat::default(),
                    Some("json_object") => TextFormat {
                        constraint: Some(OutputConstraint::JsonObject),
                        instruct: true,
                        echo: json!({"type": "json_object"}),
                    },
                    Some("json_schema") => {
                        // The same keys as chat's `json_schema` object, flattened next to `type`.
                        let mut spec = format.as_object().cloned().unwrap_or_default();
                        spec.remove("type");
                        for key in ["name", "description", "schema", "strict"] {
                            format_fields.value(key);
                        }
                        let schema =
                            openai::json_schema_spec(&Value::Object(spec), "text.format", policy)?;
                        TextFormat {
                            constraint: Some(OutputConstraint::JsonSchema(schema)),
                            instruct: false,
                            echo: format.clone(),
                        }
                    }
                    _ => return Err(ApiError::invalid(
                        "text.format.type",
                        "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                    )),
                };
            format_fields.finish()?;
            parsed
        }
    };
    match fields.string("verbosity")?.as_deref() {
        None | Some("medium") => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "text.verbosity",
                "only 'text.verbosity': \"medium\" is supported",
            ))
        }
    }
    fields.finish()?;
    Ok(format)
}

/// OpenAI's limits: at most 16 pairs, keys up to 64 and values up to 512 characters.
fn parse_metadata(value: &Value) -> Result<Map<String, Value>, ApiError> {
    let map = value
        .as_object()
        .ok_or_else(|| ApiError::invalid("metadata", "'metadata' must be an object"))?;
    if map.len() > 16 {
        return Err(ApiError::invalid(
            "metadata",
            "'metadata' holds at most 16 pairs",
        ));
    }
    for (key, value) in map {
        let fits = value
            .as_str()
            .is_some_and(|v| v.chars().count() <= 512 && key.chars().count() <= 64);
        if !fits {
            return Err(ApiError::invalid(
                format!("metadata.{key}"),
                "metadata keys are strings of up to 64 characters and values strings of up to 512",
            ));
        }
    }
    Ok(map.clone())
}

fn parse_include(value: &Value) -> Result<(), ApiError> {
    let list = value
        .as_array()
        .ok_or_else(|| ApiError::invalid("include", "'include' must be a list of strings"))?;
    for entry in list {
        match entry.as_str() {
            Some(name) if VACUOUS_INCLUDES.contains(&name) => {}
            Some(name) => {
                return Err(ApiError::invalid(
                    "include",
                    format!("'include' value '{name}' is not supported"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    "include",
                    "'include' must be a list of strings",
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: Value) -> String {
        parse(&body, &FieldPolicy::new(true))
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn minimal_request() {
        let request = parse(&json!({"input": "hi"}), &FieldPolicy::new(true)).unwrap();
        assert!(request.store, "store defaults to true");
        assert!(!request.common.stream);
        assert_eq!(request.common.max_tokens, MaxTokens::ServerDefault);
        assert_eq!(request.input.len(), 1);
        assert_eq!(request.tool_choice, ToolChoice::Auto);
        assert_eq!(request.echo["tools"], json!([]));
    }

    #[test]
    fn options_are_honoured() {
        let request = parse(&json!({
            "model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 9,
            "temperature": 0, "top_p": 0.5, "stop": ["END"], "threshold": 0.9, "store": false,
            "stream": true, "previous_response_id": "resp_1", "metadata": {"k": "v"},
            "text": {"format": {"type": "json_object"}}, "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "low"}, "truncation": "disabled", "parallel_tool_calls": false,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
        }), &FieldPolicy::new(true))
        .unwrap();
        assert_eq!(request.common.model.as_deref(), Some("m"));
        assert_eq!(request.common.max_tokens, MaxTokens::Limit(9));
        assert_eq!(request.common.stop, vec!["END".to_string()]);
        assert_eq!(request.common.params.threshold, Some(0.9));
        assert!(request.common.stream && !request.store && request.json_object);
        assert!(!request.parallel_tool_calls);
        assert_eq!(request.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(request.tool_choice, ToolChoice::Function("f".into()));
        assert_eq!(request.tool_names, vec!["f".to_string()]);
        assert_eq!(request.tools[0]["function"]["name"], "f");
        assert!(request.tools[0]["function"].get("strict").is_none());
        // The forced call's grammar takes the place of the json_object format.
        assert!(matches!(
            request.common.constraint,
            Some(OutputConstraint::ToolCalls { .. })
        ));
        assert_eq!(request.instructions.len(), 1);
        assert_eq!(request.echo["metadata"], json!({"k": "v"}));
        assert_eq!(request.echo["max_output_tokens"], 9);
        assert_eq!(
            request.echo["tool_choice"],
            json!({"type": "function", "name": "f"})
        );
    }

    #[test]
    fn refusals_name_the_field() {
        assert_eq!(
            param(json!({"input": "x", "tools": [{"type": "web_search"}]})),
            "tools[0].type"
        );
        let unknown_tool = parse(
            &json!({"input": "x", "tools": [{"type": "file_search"}]}),
            &FieldPolicy::new(true),
        )
        .unwrap_err();
        assert!(
            unknown_tool.message.contains("'file_search'"),
            "{}",
            unknown_tool.message
        );
        assert_eq!(
            param(json!({"input": "x", "tools": [{"type": "function", "name": "bad name"}]})),
            "tools[0].name"
        );
        assert_eq!(
            param(
                json!({"input": "x", "tools": [{"type": "function", "name": "f", "function": {}}]})
            ),
            "tools[0].function"
        );
        assert_eq!(
            param(json!({"input": "x", "tool_choice": {"type": "web_search_preview"}})),
            "tool_choice.type"
        );
        assert_eq!(
            param(json!({"input": "x", "tool_choice": "required"})),
            "tool_choice"
        );
        assert_eq!(
            param(json!({"input": "x", "max_output_tokens": 0})),
            "max_output_tokens"
        );
        assert_eq!(
            param(json!({"input": "x", "temperature": 3})),
            "temperature"
        );
        assert_eq!(param(json!({"input": "x", "max_tokens": 3})), "max_tokens");
        assert_eq!(
            param(json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}})),
            "text.format.schema"
        );
        assert_eq!(
            param(json!({"input": "x", "truncation": "auto"})),
            "truncation"
        );
        assert_eq!(
            param(json!({"input": "x", "background": true})),
            "background"
        );
        assert_eq!(
            param(json!({"input": "x", "include": ["message.output_text.logprobs"]})),
            "include"
        );
        assert_eq!(
            param(json!({"input": "x", "metadata": {"k": 1}})),
            "metadata.k"
        );
        assert_eq!(param(json!({"input": "x", "bogus": 1})), "bogus");
        assert_eq!(param(json!({})), "input");
        assert!(parse(
            &json!({"previous_response_id": "resp_1"}),
            &FieldPolicy::new(true)
        )
        .is_ok());
    }
}
