//! Parsing and validating a `POST /v1/responses` body. The sampling and diffusion fields the
//! Responses API shares with chat completions (`model`, `temperature`, `top_p`, `stop`, `seed`,
//! `threshold`, ...) are handed to the chat parser's own option parsing, so both APIs accept and
//! refuse them alike; the rest is the Responses API's: `input`, `instructions`, `tools`,
//! `tool_choice`, `max_output_tokens`, `store`, `previous_response_id`, `text`, `metadata`, ...
//! Every field is honoured, accepted at a value that changes nothing, or refused with a 400
//! naming it.

use minnow_engine::constraint::OutputConstraint;
use minnow_engine::ToolChoice;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::super::errors::ApiError;
use super::super::fields::{
    field_path, in_range, inner, must_be_off, parse_object, refuse_present, required, FieldPolicy,
    Flag, Int, List, Object, Present, Text, Unknown,
};
use super::super::openai::{self, CommonOptions, MaxTokens};
use super::items::{self, Item, Role};

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

/// A `POST /v1/responses` body: the Responses API's own fields; of the rest, those of
/// [`SHARED_OPTIONS`] go to the chat parser's shared options.
#[derive(Deserialize)]
struct ResponsesBody {
    max_output_tokens: Option<Int>,
    stream: Option<Flag>,
    stream_options: Option<Value>,
    return_progress: Option<Flag>,
    input: Option<Value>,
    instructions: Option<Value>,
    tools: Option<List>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Flag>,
    text: Option<Value>,
    store: Option<Flag>,
    previous_response_id: Option<Text>,
    metadata: Option<Object>,
    include: Option<Value>,
    /// No reasoning is produced or parsed out (LLaDA2 templates render "thinking off"), so a
    /// reasoning effort or summary request has nothing to act on.
    #[serde(rename = "reasoning")]
    _reasoning: Present,
    truncation: Option<Text>,
    background: Option<Flag>,
    conversation: Present,
    prompt: Present,
    max_tool_calls: Present,
    context_management: Present,
    #[serde(flatten)]
    rest: Unknown,
}

/// `stream_options` of a Responses request.
#[derive(Deserialize)]
struct StreamOptionsBody {
    /// Obfuscation padding is never added here.
    #[serde(rename = "include_obfuscation")]
    _include_obfuscation: Option<Flag>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// A flat function tool: `{"type": "function", "name", "description", "parameters", "strict"}`.
#[derive(Deserialize)]
struct ToolBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    name: Option<Value>,
    description: Option<Value>,
    parameters: Option<Value>,
    strict: Option<Flag>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// `tool_choice` as an object: `{"type": "function", "name"}`.
#[derive(Deserialize)]
struct ToolChoiceBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    name: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// `text`: `{"format": {...}, "verbosity": "medium"}`.
#[derive(Deserialize)]
struct TextBody {
    format: Option<Value>,
    verbosity: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// `text.format`: `{"type"}`, and for `json_schema` the keys of chat's `json_schema` object
/// flattened next to it (`name`, `description`, `schema`, `strict`).
#[derive(Deserialize)]
struct TextFormatBody {
    #[serde(rename = "type")]
    kind: Option<Text>,
    #[serde(flatten)]
    rest: Unknown,
}

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
    let body: ResponsesBody = parse_object(body, "request body")?;
    let (shared, mut unknown): (Unknown, Unknown) = body
        .rest
        .into_iter()
        .partition(|(key, _)| SHARED_OPTIONS.contains(&key.as_str()));
    // Every shared option is declared or inert, so nothing is left over here.
    let (mut common, shared_unknown) = openai::parse_common(openai::parse_shared(shared)?, policy)?;
    unknown.extend(shared_unknown);
    common.max_tokens = match in_range(
        "max_output_tokens",
        inner(body.max_output_tokens),
        1,
        i64::MAX,
    )? {
        None => MaxTokens::ServerDefault,
        Some(n) => MaxTokens::Limit(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    common.stream = inner(body.stream).unwrap_or(false);
    if let Some(options) = &body.stream_options {
        let options: StreamOptionsBody = parse_object(options, "stream_options")?;
        policy.finish("stream_options", &options.unknown)?;
    }
    let return_progress = inner(body.return_progress).unwrap_or(false);

    let input = match body.input {
        None => Vec::new(),
        Some(value) => items::parse_input(value, "input", policy)?,
    };
    let instructions = match &body.instructions {
        None => Vec::new(),
        Some(Value::String(text)) => vec![Item::Message {
            id: None,
            role: Role::System,
            text: text.clone(),
        }],
        // The response object echoes `instructions`, so they are parsed from a copy.
        Some(value) => items::parse_input(value.clone(), "instructions", policy)?,
    };

    let tools_echo = body.tools.as_ref().map(|list| Value::Array(list.0.clone()));
    let tools = match body.tools {
        None => Vec::new(),
        Some(List(list)) => parse_tools(list, policy)?,
    };
    let (tools, strict): (Vec<Value>, Vec<bool>) = tools.into_iter().unzip();
    let declared: Vec<String> = tools.iter().map(openai::tool_name).collect();
    let tool_choice = match &body.tool_choice {
        None => ToolChoice::Auto,
        Some(value) => parse_tool_choice(value, &declared, policy)?,
    };
    let parallel_tool_calls = inner(body.parallel_tool_calls).unwrap_or(true);
    let tool_names = match &tool_choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Function(name) => vec![name.clone()],
        ToolChoice::Auto | ToolChoice::Required => declared,
    };

    let text_format = match &body.text {
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
    let store = inner(body.store).unwrap_or(true);
    let previous_response_id = inner(body.previous_response_id);
    let metadata = match body.metadata {
        None => Map::new(),
        Some(Object(map)) => check_metadata(map)?,
    };

    if let Some(include) = &body.include {
        parse_include(include)?;
    }
    match inner(body.truncation).as_deref() {
        None | Some("disabled") => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "truncation",
                "only 'truncation': \"disabled\" is supported (a conversation longer than the \
                 context is refused, never cut)",
            ))
        }
    }
    must_be_off("background", inner(body.background))?;
    refuse_present("conversation", body.conversation)?;
    refuse_present("prompt", body.prompt)?;
    refuse_present("max_tool_calls", body.max_tool_calls)?;
    refuse_present("context_management", body.context_management)?;
    policy.finish("request body", &unknown)?;

    if input.is_empty() && previous_response_id.is_none() && instructions.is_empty() {
        return Err(ApiError::invalid("input", "'input' is required"));
    }

    let mut echo = Map::new();
    echo.insert(
        "instructions".into(),
        body.instructions.unwrap_or(Value::Null),
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
    echo.insert("tools".into(), tools_echo.unwrap_or_else(|| json!([])));
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
fn parse_tools(list: Vec<Value>, policy: &FieldPolicy) -> Result<Vec<(Value, bool)>, ApiError> {
    let mut chat_tools = Vec::with_capacity(list.len());
    let mut strict = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let tool: ToolBody = parse_object(tool, &path)?;
        let type_path = field_path(&path, "type");
        let kind = required(inner(tool.kind), &type_path)?;
        if kind != "function" {
            return Err(ApiError::invalid(
                type_path,
                format!("tool type '{kind}' is not supported (only 'function' tools are)"),
            ));
        }
        let mut function = Map::new();
        for (key, value) in [
            ("name", tool.name),
            ("description", tool.description),
            ("parameters", tool.parameters),
        ] {
            if let Some(value) = value {
                function.insert(key.to_string(), value);
            }
        }
        // Explicit `strict: true` constrains the call's arguments (constraint::tools); the
        // Responses API's default of true is not applied, so tools sent without it keep free
        // arguments as before.
        strict.push(inner(tool.strict) == Some(true));
        policy.finish(&path, &tool.unknown)?;
        chat_tools.push(json!({"type": "function", "function": function}));
    }
    let chat_tools = openai::parse_tools(chat_tools, policy).map_err(flat_tool_paths)?;
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
            let choice: ToolChoiceBody = parse_object(value, "tool_choice")?;
            let kind = required(inner(choice.kind), "tool_choice.type")?;
            if kind != "function" {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!("tool_choice type '{kind}' is not supported (only 'function' is)"),
                ));
            }
            let name = required(inner(choice.name), "tool_choice.name")?;
            policy.finish("tool_choice", &choice.unknown)?;
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
    let text: TextBody = parse_object(value, "text")?;
    let format = match &text.format {
        None => TextFormat::default(),
        Some(format) => {
            let body: TextFormatBody = parse_object(format, "text.format")?;
            let (parsed, unknown) =
                match inner(body.kind).as_deref() {
                    Some("text") => (TextFormat::default(), body.rest),
                    Some("json_object") => (
                        TextFormat {
                            constraint: Some(OutputConstraint::JsonObject),
                            instruct: true,
                            echo: json!({"type": "json_object"}),
                        },
                        body.rest,
                    ),
                    Some("json_schema") => {
                        // The same keys as chat's `json_schema` object, flattened next to `type`.
                        let spec: openai::JsonSchemaSpec =
                            parse_object(Value::Object(body.rest), "text.format")?;
                        let schema = openai::json_schema_spec(&spec, "text.format")?;
                        (
                            TextFormat {
                                constraint: Some(OutputConstraint::JsonSchema(schema)),
                                instruct: false,
                                echo: format.clone(),
                            },
                            spec.unknown,
                        )
                    }
                    _ => return Err(ApiError::invalid(
                        "text.format.type",
                        "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                    )),
                };
            policy.finish("text.format", &unknown)?;
            parsed
        }
    };
    match inner(text.verbosity).as_deref() {
        None | Some("medium") => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "text.verbosity",
                "only 'text.verbosity': \"medium\" is supported",
            ))
        }
    }
    policy.finish("text", &text.unknown)?;
    Ok(format)
}

/// OpenAI's limits: at most 16 pairs, keys up to 64 and values up to 512 characters.
fn check_metadata(map: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    if map.len() > 16 {
        return Err(ApiError::invalid(
            "metadata",
            "'metadata' holds at most 16 pairs",
        ));
    }
    for (key, value) in &map {
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
    Ok(map)
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
