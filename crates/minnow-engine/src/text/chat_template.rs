//! Renders a conversation with the checkpoint's own Jinja chat template, configured like Hugging
//! Face transformers' `apply_chat_template` (chat-format doc §1):
//!
//! - `trim_blocks` and `lstrip_blocks`, loop controls, no auto-escaping, lenient undefined values
//!   (a missing attribute such as `message.tool_calls` is falsy and prints as "");
//! - Python string/dict methods (`startswith`, `split`, `rstrip('\n')`, `items`, `get`, ...)
//!   through minijinja-contrib's pycompat callback; `namespace`, slicing and `loop` come with
//!   minijinja;
//! - a `tojson` filter with Python `json.dumps` semantics (see [`python_json`]) replacing
//!   minijinja's compact, HTML-escaping one;
//! - `raise_exception(msg)` and `strftime_now(fmt)`.
//!
//! Template lookup ([`ChatTemplate::from_dir`]): `chat_template.jinja`, else
//! `tokenizer_config.json` `chat_template` (a string, or a list of `{name, template}` where
//! `default` is used, or `tool_use` when the request has tools).
//!
//! Render variables: `messages`, `tools` (none when the request has none, as transformers
//! passes `None`), `add_generation_prompt`, the special-token strings of `tokenizer_config.json`
//! (`bos_token`, `eos_token`, `pad_token`, ...) and the request's `chat_template_kwargs`.
//!
//! `tool_choice` (chat-format doc §3.3) is applied here: `none` renders without tools,
//! `required` / a named function append a steering prefix after the generation prompt and report
//! it in [`RenderedPrompt::forced_prefix`].

use std::collections::HashSet;
use std::path::Path;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde_json::{json, Map, Value as Json};

use crate::api::{ChatMessage, ChatPrompt, RenderedPrompt, ToolChoice};
use crate::error::{EngineError, EngineResult};
use crate::text::tool_format::ToolCallFormat;

const DEFAULT_TEMPLATE: &str = "default";
const TOOL_USE_TEMPLATE: &str = "tool_use";

/// Longest template source accepted (all of a checkpoint's templates together). Real chat
/// templates are a few kilobytes; a template is code that every request runs.
pub const MAX_TEMPLATE_BYTES: usize = 1024 * 1024;

/// Instructions one render may execute (minijinja fuel). A long conversation through the Ling
/// template costs a few hundred instructions per message (`render_fuel_is_ample_for_long_chats`
/// measures it), so this leaves room for conversations far longer than any context, while a
/// template that loops without end stops within about a second.
pub const RENDER_FUEL: u64 = 5_000_000;

/// Most bytes one render may write. Callers bound the prompt by the model's context before
/// tokenizing it (the server does); this cap keeps a looping or exploding template from filling
/// memory first.
pub const MAX_RENDERED_BYTES: usize = 16 * 1024 * 1024;

/// A compiled chat template plus the special-token variables it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Names of the templates in `env`; `default` always exists.
    names: Vec<String>,
    /// Source of the `default` template (for `/props` and format detection).
    default_source: String,
    /// Special-token strings from `tokenizer_config.json` (`bos_token`, `eos_token`, ...).
    special_vars: Map<String, Json>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("names", &self.names)
            .field("special_vars", &self.special_vars)
            .finish()
    }
}

impl ChatTemplate {
    /// Loads the template of a checkpoint directory (lookup order in the module docs) and the
    /// special-token strings of its `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> EngineResult<ChatTemplate> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<Json> = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(serde_json::from_str(&text).map_err(|e| {
                EngineError::Load(format!("cannot parse {}: {e}", config_path.display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(EngineError::Load(format!(
                    "cannot read {}: {e}",
                    config_path.display()
                )))
            }
        };
        let special_vars = config.as_ref().map(special_token_vars).unwrap_or_default();

        let jinja_path = dir.join("chat_template.jinja");
        if jinja_path.exists() {
            let source = std::fs::read_to_string(&jinja_path).map_err(|e| {
                EngineError::Load(format!("cannot read {}: {e}", jinja_path.display()))
            })?;
            return Self::from_sources(vec![(DEFAULT_TEMPLATE.to_string(), source)], special_vars);
        }
        let templates = match config.as_ref().and_then(|c| c.get("chat_template")) {
            Some(Json::String(source)) => vec![(DEFAULT_TEMPLATE.to_string(), source.clone())],
            Some(Json::Array(entries)) => entries
                .iter()
                .map(|entry| {
                    let name = entry.get("name").and_then(Json::as_str);
                    let source = entry.get("template").and_then(Json::as_str);
                    match (name, source) {
                        (Some(n), Some(s)) => Ok((n.to_string(), s.to_string())),
                        _ => Err(EngineError::Load(
                            "tokenizer_config.json chat_template list entries need string \
                             `name` and `template`"
                                .into(),
                        )),
                    }
                })
                .collect::<EngineResult<Vec<_>>>()?,
            Some(_) => {
                return Err(EngineError::Load(
                    "tokenizer_config.json chat_template must be a string or a list".into(),
                ))
            }
            None => {
                return Err(EngineError::Load(format!(
                    "{} has no chat template (no chat_template.jinja and no chat_template in \
                     tokenizer_config.json)",
                    dir.display()
                )))
            }
        };
        Self::from_sources(templates, special_vars)
    }

    /// Compiles a single template source with the given special-token variables.
    pub fn from_source(source: &str, special_vars: Map<String, Json>) -> EngineResult<Self> {
        Self::from_sources(
            vec![(DEFAULT_TEMPLATE.to_string(), source.to_string())],
            special_vars,
        )
    }

    fn from_sources(
        templates: Vec<(String, String)>,
        special_vars: Map<String, Json>,
    ) -> EngineResult<Self> {
        let default_source = templates
            .iter()
            .find(|(name, _)| name == DEFAULT_TEMPLATE)
            .map(|(_, source)| source.clone())
            .ok_or_else(|| {
                EngineError::Load("the chat template list has no entry named `default`".into())
            })?;
        let total: usize = templates.iter().map(|(_, source)| source.len()).sum();
        if total > MAX_TEMPLATE_BYTES {
            return Err(EngineError::Load(format!(
                "the chat template is {total} bytes; at most {MAX_TEMPLATE_BYTES} are accepted"
            )));
        }
        let mut env = transformers_environment();
        let mut names = Vec::new();
        for (name, source) in templates {
            env.add_template_owned(name.clone(), source)
                .map_err(|e| EngineError::Load(format!("chat template `{name}`: {e}")))?;
            names.push(name);
        }
        Ok(ChatTemplate {
            env,
            names,
            default_source,
            special_vars,
        })
    }

    /// The source of the default template.
    pub fn source(&self) -> &str {
        &self.default_source
    }

    /// Renders a chat request: normalizes and validates the messages, applies `tool_choice` and
    /// appends the steering prefix for `format` when a tool call is required.
    pub fn render(
        &self,
        prompt: &ChatPrompt,
        format: ToolCallFormat,
    ) -> EngineResult<RenderedPrompt> {
        if prompt.messages.is_empty() {
            return Err(EngineError::InvalidRequest(
                "a chat request needs at least one message".into(),
            ));
        }
        validate_tool_results(&prompt.messages)?;
        let messages: Vec<Json> = prompt
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| message_to_template(i, m))
            .collect::<EngineResult<_>>()?;

        let (tools, forced_prefix) = match &prompt.tool_choice {
            ToolChoice::Auto => (prompt.tools.clone(), None),
            ToolChoice::None => (Vec::new(), None),
            ToolChoice::Required => {
                if prompt.tools.is_empty() {
                    return Err(EngineError::InvalidRequest(
                        "tool_choice \"required\" needs at least one tool in `tools`".into(),
                    ));
                }
                (prompt.tools.clone(), Some(format.required_prefix()))
            }
            ToolChoice::Function(name) => {
                let kept: Vec<Json> = prompt
                    .tools
                    .iter()
                    .filter(|tool| tool_name(tool) == Some(name.as_str()))
                    .cloned()
                    .collect();
                if kept.is_empty() {
                    return Err(EngineError::InvalidRequest(format!(
                        "tool_choice names the function `{name}`, which is not in `tools`"
                    )));
                }
                (kept, Some(format.named_prefix(name)))
            }
        };

        let mut text = self.render_json(
            &messages,
            &tools,
            prompt.add_generation_prompt,
            &prompt.template_kwargs,
        )?;
        if let Some(prefix) = &forced_prefix {
            text.push_str(prefix);
        }
        Ok(RenderedPrompt {
            text,
            forced_prefix,
        })
    }

    /// Renders template-ready JSON messages as given (no normalization or validation):
    /// transformers' `apply_chat_template(messages, tools=tools or None, add_generation_prompt,
    /// **kwargs)`.
    pub fn render_json(
        &self,
        messages: &[Json],
        tools: &[Json],
        add_generation_prompt: bool,
        kwargs: &Map<String, Json>,
    ) -> EngineResult<String> {
        let mut vars = self.special_vars.clone();
        for (key, value) in kwargs {
            if matches!(key.as_str(), "messages" | "tools" | "add_generation_prompt") {
                return Err(EngineError::InvalidRequest(format!(
                    "chat_template_kwargs may not set `{key}`"
                )));
            }
            vars.insert(key.clone(), value.clone());
        }
        vars.insert("messages".into(), Json::Array(messages.to_vec()));
        vars.insert(
            "tools".into(),
            if tools.is_empty() {
                Json::Null
            } else {
                Json::Array(tools.to_vec())
            },
        );
        vars.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );

        let name = if !tools.is_empty() && self.names.iter().any(|n| n == TOOL_USE_TEMPLATE) {
            TOOL_USE_TEMPLATE
        } else {
            DEFAULT_TEMPLATE
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|e| EngineError::Template(e.to_string()))?;
        let mut out = BoundedOutput {
            bytes: Vec::new(),
            limit: MAX_RENDERED_BYTES,
            overflowed: false,
        };
        template
            .render_captured_to(Value::from_serialize(&vars), &mut out)
            .map_err(|e| {
                if out.overflowed {
                    EngineError::Template(format!(
                        "the rendered prompt exceeds {MAX_RENDERED_BYTES} bytes"
                    ))
                } else {
                    EngineError::Template(describe_error(&e))
                }
            })?;
        String::from_utf8(out.bytes)
            .map_err(|_| EngineError::Template("the template wrote invalid UTF-8".into()))
    }
}

/// The render's output, refusing to grow past `limit` bytes.
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + data.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.bytes.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A one-line description of a render error, including its cause chain.
fn describe_error(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A minijinja environment configured like transformers' chat-template sandbox.
fn transformers_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Lenient = Jinja2's default `Undefined`: missing attributes are falsy and print as "",
    // while attribute access on an undefined value is an error (as in Python).
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_fuel(Some(RENDER_FUEL));
    env.add_filter("tojson", tojson_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// `raise_exception(message)`: aborts rendering with the template's own message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time formatted with a C strftime pattern. The time is
/// UTC: transformers uses the local time, but reading the local zone portably needs a timezone
/// database; servers usually run in UTC, and templates use this for the date only.
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs() as i64;
    strftime_utc(&format, secs)
}

/// Formats a Unix time (seconds, UTC) with the common C strftime directives in the C locale.
fn strftime_utc(format: &str, unix_secs: i64) -> Result<String, Error> {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let piece = match directive {
            'Y' => year.to_string(),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'm' => format!("{month:02}"),
            'd' => format!("{day:02}"),
            'e' => format!("{day:>2}"),
            'H' => format!("{hour:02}"),
            'I' => format!("{hour12:02}"),
            'M' => format!("{minute:02}"),
            'S' => format!("{second:02}"),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_string(),
            'j' => format!("{day_of_year:03}"),
            'a' => DAYS[weekday][..3].to_string(),
            'A' => DAYS[weekday].to_string(),
            'w' => weekday.to_string(),
            'u' => (if weekday == 0 { 7 } else { weekday }).to_string(),
            'b' | 'h' => MONTHS[month as usize - 1][..3].to_string(),
            'B' => MONTHS[month as usize - 1].to_string(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            'D' => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'R' => format!("{hour:02}:{minute:02}"),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            's' => unix_secs.to_string(),
            'n' => "\n".to_string(),
            't' => "\t".to_string(),
            '%' => "%".to_string(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// accepting the arguments positionally or by keyword.
fn tojson_filter(value: Value, args: Rest<Value>) -> Result<String, Error> {
    type Args = (
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Kwargs,
    );
    let (ensure_ascii, indent, separators, sort_keys, kwargs): Args = from_args(&args)?;
    let pick = |positional: Option<Value>, key: &str| -> Result<Option<Value>, Error> {
        let keyword: Option<Value> = kwargs.get(key)?;
        Ok(keyword
            .or(positional)
            .filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => {
            let n = i64::try_from(v.clone()).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or string",
                )
            })?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let (item_separator, key_separator) = match pick(separators, "separators")? {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(pair) => {
            let parts: Vec<Value> = pair.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = python_json::Style {
        ensure_ascii,
        indent,
        item_separator,
        key_separator,
        sort_keys,
    };
    python_json::dumps(&value, &style)
}

/// Python `json.dumps` over minijinja values.
pub mod python_json {
    use minijinja::value::{Value, ValueKind};
    use minijinja::{Error, ErrorKind};
    use std::fmt::Write;

    /// `json.dumps` keyword arguments.
    #[derive(Clone, Debug)]
    pub struct Style {
        pub ensure_ascii: bool,
        /// Indentation unit; `None` writes everything on one line.
        pub indent: Option<String>,
        pub item_separator: String,
        pub key_separator: String,
        pub sort_keys: bool,
    }

    impl Default for Style {
        /// transformers' defaults: `ensure_ascii=False`, separators `", "` / `": "`.
        fn default() -> Self {
            Style {
                ensure_ascii: false,
                indent: None,
                item_separator: ", ".into(),
                key_separator: ": ".into(),
                sort_keys: false,
            }
        }
    }

    pub fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
        let mut out = String::new();
        write_value(&mut out, value, style, 0)?;
        Ok(out)
    }

    fn unsupported(what: &str) -> Error {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: a {what} value is not JSON serializable"),
        )
    }

    fn newline(out: &mut String, style: &Style, depth: usize) {
        if let Some(unit) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(unit);
            }
        }
    }

    fn write_value(
        out: &mut String,
        value: &Value,
        style: &Style,
        depth: usize,
    ) -> Result<(), Error> {
        match value.kind() {
            // Python's json.dumps fails on Jinja's Undefined; writing null is the lenient choice.
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number_repr(value)?),
            ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&style.item_separator);
                    }
                    newline(out, style, depth + 1);
                    write_value(out, item, style, depth + 1)?;
                }
                newline(out, style, depth);
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_string(&key)?, item));
                }
                if style.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&style.item_separator);
                    }
                    newline(out, style, depth + 1);
                    write_string(out, key, style);
                    out.push_str(&style.key_separator);
                    write_value(out, item, style, depth + 1)?;
                }
                newline(out, style, depth);
                out.push('}');
            }
            ValueKind::Bytes => return Err(unsupported("bytes")),
            ValueKind::Plain => return Err(unsupported("plain object")),
            ValueKind::Invalid => return Err(unsupported("invalid")),
            _ => return Err(unsupported("unknown")),
        }
        Ok(())
    }

    /// Python converts str, int, float, bool and None keys to strings.
    fn key_string(key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::Number => number_repr(key)?,
            ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
            ValueKind::None => "null".to_string(),
            _ => return Err(unsupported("non-string key")),
        })
    }

    fn number_repr(value: &Value) -> Result<String, Error> {
        if value.is_integer() {
            return Ok(value.to_string());
        }
        let f = f64::try_from(value.clone())?;
        Ok(float_repr(f))
    }

    /// Python's `float.__repr__` (shortest round-trip digits; scientific notation when the
    /// decimal exponent is < -4 or >= 16), with json's `NaN` / `Infinity` spellings.
    pub fn float_repr(f: f64) -> String {
        if f.is_nan() {
            return "NaN".into();
        }
        if f.is_infinite() {
            return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
        }
        if f == 0.0 {
            return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
        }
        // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
        let sci = format!("{f:e}");
        let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
        let exponent: i32 = exponent.parse().unwrap_or(0);
        let (sign, mantissa) = match mantissa.strip_prefix('-') {
            Some(m) => ("-", m),
            None => ("", mantissa),
        };
        let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        let n = digits.len() as i32;
        let mut out = sign.to_string();
        if (-4..16).contains(&exponent) {
            let point = exponent + 1; // digits before the decimal point
            if point <= 0 {
                out.push_str("0.");
                out.push_str(&"0".repeat((-point) as usize));
                out.push_str(&digits);
            } else if point >= n {
                out.push_str(&digits);
                out.push_str(&"0".repeat((point - n) as usize));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point as usize]);
                out.push('.');
                out.push_str(&digits[point as usize..]);
            }
        } else {
            out.push_str(&digits[..1]);
            if n > 1 {
                out.push('.');
                out.push_str(&digits[1..]);
            }
            let _ = write!(
                out,
                "e{}{:02}",
                if exponent < 0 { '-' } else { '+' },
                exponent.abs()
            );
        }
        out
    }

    fn write_string(out: &mut String, s: &str, style: &Style) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if style.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Special-token strings of `tokenizer_config.json` as template variables: every `*_token`
/// key whose value is a string or an AddedToken object `{content: ...}`, plus
/// `additional_special_tokens`.
fn special_token_vars(config: &Json) -> Map<String, Json> {
    let mut vars = Map::new();
    let Some(object) = config.as_object() else {
        return vars;
    };
    let content = |v: &Json| -> Option<String> {
        match v {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
            _ => None,
        }
    };
    for (key, value) in object {
        if key.ends_with("_token") {
            if let Some(text) = content(value) {
                vars.insert(key.clone(), Json::String(text));
            }
        } else if key == "additional_special_tokens" {
            if let Json::Array(items) = value {
                let list: Vec<Json> = items.iter().filter_map(content).map(Json::String).collect();
                vars.insert(key.clone(), Json::Array(list));
            }
        }
    }
    vars
}

fn tool_name(tool: &Json) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Json::as_str)
}

/// An OpenAI-normalized message as the template expects it: only the keys that are set, tool
/// calls as `[{id, type: "function", function: {name, arguments}}]` with `arguments` a JSON
/// string (printed verbatim by the 2.0/2.1 template).
fn message_to_template(index: usize, message: &ChatMessage) -> EngineResult<Json> {
    let role = match message.role.as_str() {
        "developer" => "system",
        role @ ("system" | "user" | "assistant" | "tool") => role,
        other => {
            return Err(EngineError::InvalidRequest(format!(
                "message {index} has the unknown role `{other}` (expected system, developer, \
                 user, assistant or tool)"
            )))
        }
    };
    let mut object = Map::new();
    object.insert("role".into(), json!(role));
    object.insert("content".into(), json!(message.content));
    if !message.tool_calls.is_empty() {
        if role != "assistant" {
            return Err(EngineError::InvalidRequest(format!(
                "message {index}: only assistant messages may carry tool_calls"
            )));
        }
        let calls: Vec<Json> = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        object.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        object.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = &message.name {
        object.insert("name".into(), json!(name));
    }
    if let Some(reasoning) = &message.reasoning_content {
        object.insert("reasoning_content".into(), json!(reasoning));
    }
    Ok(Json::Object(object))
}

/// Every tool message must answer a call made by an earlier assistant message.
fn validate_tool_results(messages: &[ChatMessage]) -> EngineResult<()> {
    let mut known: HashSet<&str> = HashSet::new();
    for (index, message) in messages.iter().enumerate() {
        if message.role == "assistant" {
            known.extend(message.tool_calls.iter().map(|c| c.id.as_str()));
        } else if message.role == "tool" {
            let id = message.tool_call_id.as_deref().ok_or_else(|| {
                EngineError::InvalidRequest(format!(
                    "message {index} (role tool) has no tool_call_id"
                ))
            })?;
            if !known.contains(id) {
                return Err(EngineError::InvalidRequest(format!(
                    "message {index} (role tool) answers tool_call_id `{id}`, but no earlier \
                     assistant message made a tool call with that id"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::python_json::{dumps, float_repr, Style};
    use super::*;
    use crate::api::ToolCall;

    fn render_expr(expr: &str, ctx: Json) -> Result<String, Error> {
        let env = transformers_environment();
        env.render_str(expr, Value::from_serialize(&ctx))
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let ctx = json!({"v": {"b": 1, "a": [1.5, "é<&>'\"\n", null, true, {}], "z": []}});
        assert_eq!(
            render_expr("{{ v | tojson }}", ctx.clone()).unwrap(),
            r#"{"b": 1, "a": [1.5, "é<&>'\"\n", null, true, {}], "z": []}"#
        );
        assert_eq!(
            render_expr(
                "{{ v | tojson(ensure_ascii=True, sort_keys=True) }}",
                ctx.clone()
            )
            .unwrap(),
            r#"{"a": [1.5, "\u00e9<&>'\"\n", null, true, {}], "b": 1, "z": []}"#
        );
        assert_eq!(
            render_expr("{{ v | tojson(separators=(',', ':')) }}", ctx.clone()).unwrap(),
            r#"{"b":1,"a":[1.5,"é<&>'\"\n",null,true,{}],"z":[]}"#
        );
        assert_eq!(
            render_expr("{{ v.a[:2] | tojson(indent=2) }}", ctx.clone()).unwrap(),
            "[\n  1.5,\n  \"é<&>'\\\"\\n\"\n]"
        );
        assert_eq!(
            render_expr("{{ {'k': [1, {'x': 2}]} | tojson(indent=2) }}", json!({})).unwrap(),
            "{\n  \"k\": [\n    1,\n    {\n      \"x\": 2\n    }\n  ]\n}"
        );
        assert!(render_expr("{{ v | tojson(bogus=1) }}", ctx).is_err());
    }

    #[test]
    fn ensure_ascii_writes_surrogate_pairs() {
        let value = Value::from("a😀\u{1}");
        let style = Style {
            ensure_ascii: true,
            ..Style::default()
        };
        assert_eq!(dumps(&value, &style).unwrap(), r#""a\ud83d\ude00\u0001""#);
    }

    #[test]
    fn floats_print_like_python_repr() {
        for (f, expected) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (1e-7, "1e-07"),
            (5e300, "5e+300"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(float_repr(f), expected, "{f}");
        }
        // Integers stay integers, floats keep their point, through the template.
        let out = render_expr("{{ v | tojson }}", json!({"v": [3, 3.0, -7, 1e100]})).unwrap();
        assert_eq!(out, "[3, 3.0, -7, 1e+100]");
    }

    #[test]
    fn python_methods_namespace_slicing_and_loop_controls() {
        let tpl = "{% set ns = namespace(n=0) %}{% for m in msgs[::-1] %}{% if loop.index0 == 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.split(':')[-1].rstrip('!') }}{% endfor %}|{{ ns.n }}|{{ 'abc'.startswith('ab') }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('x', 'none') }}|{{ msgs[-1] }}|[{{ d.missing }}]|{{ 'yes' if not d.missing else 'no' }}";
        let out = render_expr(
            tpl,
            json!({"msgs": ["a:x!!", "b:y", "c:z!"], "d": {"p": 1, "q": 2}}),
        )
        .unwrap();
        assert_eq!(
            out, "zy|2|True|p=1;q=2;|none|c:z!|[]|yes",
            "booleans print like Python"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_are_on() {
        let out = render_expr("  {% if true %}\nA\n  {% endif %}\nB\n", json!({})).unwrap();
        assert_eq!(out, "A\nB");
    }

    #[test]
    fn raise_exception_aborts_with_message() {
        let err =
            render_expr("{{ raise_exception('roles must alternate') }}", json!({})).unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday.
        let t = 1_722_000_309;
        assert_eq!(
            strftime_utc("%d %b %Y %H:%M:%S %A %j %I%p %%", t).unwrap(),
            "26 Jul 2024 13:25:09 Friday 208 01PM %"
        );
        assert_eq!(strftime_utc("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(
            strftime_utc("%F %T %a", 951_782_400).unwrap(),
            "2000-02-29 00:00:00 Tue"
        );
        assert_eq!(
            strftime_utc("%d %B %Y", 1_722_000_309).unwrap(),
            "26 July 2024"
        );
        assert_eq!(strftime_utc("%A %j", 1_722_000_309).unwrap(), "Friday 208");
        assert!(strftime_utc("%Q", 0).is_err());
        let out = render_expr("{{ strftime_now('%Y') }}", json!({})).unwrap();
        assert_eq!(out.len(), 4);
    }

    fn ling_template() -> ChatTemplate {
        ChatTemplate::from_dir(&crate::text::tokenizer::tests_support::fixture(
            "llada2-tiny-v21",
        ))
        .unwrap()
    }

    fn golden_renders() -> Vec<Json> {
        let path =
            crate::text::tokenizer::tests_support::fixture("templates/ling-v2-sft.renders.json");
        let text = std::fs::read_to_string(path).unwrap();
        serde_json::from_str::<Json>(&text)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    #[test]
    fn fixture_template_is_the_ling_template() {
        let template = ling_template();
        let file = std::fs::read_to_string(crate::text::tokenizer::tests_support::fixture(
            "templates/ling-v2-sft.jinja",
        ))
        .unwrap();
        assert_eq!(template.source().trim_end(), file.trim_end());
        assert_eq!(template.special_vars["eos_token"], json!("<|endoftext|>"));
        assert_eq!(template.special_vars["mask_token"], json!("<|mask|>"));
    }

    #[test]
    fn ling_golden_renders_byte_for_byte_from_raw_messages() {
        let template = ling_template();
        let renders = golden_renders();
        assert_eq!(renders.len(), 7);
        for entry in renders {
            let name = entry["name"].as_str().unwrap();
            let messages = entry["messages"].as_array().unwrap();
            let tools = entry["tools"].as_array().cloned().unwrap_or_default();
            let add = entry["add_generation_prompt"].as_bool().unwrap();
            let rendered = template
                .render_json(messages, &tools, add, &Map::new())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                rendered,
                entry["rendered"].as_str().unwrap(),
                "entry {name}"
            );
        }
    }

    /// The golden messages converted to the engine's `ChatMessage` type. Object arguments
    /// become the JSON string `json.dumps` would print, which the template prints verbatim.
    fn to_chat_messages(messages: &[Json]) -> Vec<ChatMessage> {
        messages
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().unwrap().to_string(),
                content: m["content"].as_str().unwrap_or_default().to_string(),
                tool_calls: m
                    .get("tool_calls")
                    .and_then(Json::as_array)
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| {
                                let args = &c["function"]["arguments"];
                                ToolCall {
                                    id: c["id"].as_str().unwrap().to_string(),
                                    name: c["function"]["name"].as_str().unwrap().to_string(),
                                    arguments: match args {
                                        Json::String(s) => s.clone(),
                                        other => {
                                            dumps(&Value::from_serialize(other), &Style::default())
                                                .unwrap()
                                        }
                                    },
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                tool_call_id: m
                    .get("tool_call_id")
                    .and_then(Json::as_str)
                    .map(str::to_string),
                name: None,
                reasoning_content: m
                    .get("reasoning_content")
                    .and_then(Json::as_str)
                    .map(str::to_string),
            })
            .collect()
    }

    #[test]
    fn ling_golden_renders_byte_for_byte_through_chat_prompt() {
        let template = ling_template();
        for entry in golden_renders() {
            let name = entry["name"].as_str().unwrap();
            let prompt = ChatPrompt {
                messages: to_chat_messages(entry["messages"].as_array().unwrap()),
                tools: entry["tools"].as_array().cloned().unwrap_or_default(),
                tool_choice: ToolChoice::Auto,
                add_generation_prompt: entry["add_generation_prompt"].as_bool().unwrap(),
                template_kwargs: Map::new(),
            };
            let rendered = template
                .render(&prompt, ToolCallFormat::TaggedJson)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                rendered.text,
                entry["rendered"].as_str().unwrap(),
                "entry {name}"
            );
            assert_eq!(rendered.forced_prefix, None);
        }
    }

    fn weather_prompt(choice: ToolChoice) -> ChatPrompt {
        ChatPrompt {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: "Weather?".into(),
                ..Default::default()
            }],
            tools: vec![
                json!({"type": "function", "function": {"name": "get_weather", "parameters": {}}}),
                json!({"type": "function", "function": {"name": "get_time", "parameters": {}}}),
            ],
            tool_choice: choice,
            add_generation_prompt: true,
            template_kwargs: Map::new(),
        }
    }

    #[test]
    fn tool_choice_steers_the_tagged_format() {
        let template = ling_template();
        let none = template
            .render(
                &weather_prompt(ToolChoice::None),
                ToolCallFormat::TaggedJson,
            )
            .unwrap();
        assert!(!none.text.contains("# Tools"));
        assert_eq!(none.forced_prefix, None);

        let auto = template
            .render(
                &weather_prompt(ToolChoice::Auto),
                ToolCallFormat::TaggedJson,
            )
            .unwrap();
        assert!(auto.text.contains("get_time"));
        assert!(auto.text.ends_with("<role>ASSISTANT</role>"));

        let named = template
            .render(
                &weather_prompt(ToolChoice::Function("get_weather".into())),
                ToolCallFormat::TaggedJson,
            )
            .unwrap();
        let prefix = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
        assert_eq!(named.forced_prefix.as_deref(), Some(prefix));
        assert!(named
            .text
            .ends_with(&format!("<role>ASSISTANT</role>{prefix}")));
        assert!(
            !named.text.contains("get_time"),
            "named choice keeps only that tool"
        );

        let required = template
            .render(
                &weather_prompt(ToolChoice::Required),
                ToolCallFormat::TaggedJson,
            )
            .unwrap();
        assert_eq!(
            required.forced_prefix.as_deref(),
            Some("<tool_call>\n{\"name\": \"")
        );
        assert!(required.text.contains("get_time"));

        let err = template
            .render(
                &weather_prompt(ToolChoice::Function("nope".into())),
                ToolCallFormat::TaggedJson,
            )
            .unwrap_err();
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
        let mut no_tools = weather_prompt(ToolChoice::Required);
        no_tools.tools.clear();
        assert!(template
            .render(&no_tools, ToolCallFormat::TaggedJson)
            .is_err());
    }

    #[test]
    fn tool_results_must_answer_earlier_calls() {
        let template = ling_template();
        let call = ToolCall {
            id: "call_a".into(),
            name: "get_weather".into(),
            arguments: "{}".into(),
        };
        let mut prompt = weather_prompt(ToolChoice::Auto);
        prompt.messages.push(ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call],
            ..Default::default()
        });
        prompt.messages.push(ChatMessage {
            role: "tool".into(),
            content: "sunny".into(),
            tool_call_id: Some("call_a".into()),
            ..Default::default()
        });
        let ok = template
            .render(&prompt, ToolCallFormat::TaggedJson)
            .unwrap();
        assert!(ok
            .text
            .contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}"));
        assert!(ok.text.contains(
            "<role>OBSERVATION</role>\n<tool_response>\nsunny\n</tool_response><|role_end|>"
        ));

        prompt.messages[2].tool_call_id = Some("call_b".into());
        let err = template
            .render(&prompt, ToolCallFormat::TaggedJson)
            .unwrap_err();
        assert!(err.to_string().contains("call_b"), "{err}");
        prompt.messages[2].tool_call_id = None;
        assert!(template
            .render(&prompt, ToolCallFormat::TaggedJson)
            .is_err());

        let mut empty = weather_prompt(ToolChoice::Auto);
        empty.messages.clear();
        let err = template
            .render(&empty, ToolCallFormat::TaggedJson)
            .unwrap_err();
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");

        let mut bad_role = weather_prompt(ToolChoice::Auto);
        bad_role.messages[0].role = "wizard".into();
        let err = template
            .render(&bad_role, ToolCallFormat::TaggedJson)
            .unwrap_err();
        assert!(err.to_string().contains("wizard"), "{err}");
    }

    #[test]
    fn developer_role_and_kwargs() {
        let template = ChatTemplate::from_source(
            "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ bos_token }}{{ flavour }}",
            Map::from_iter([("bos_token".to_string(), json!("<s>"))]),
        )
        .unwrap();
        let mut prompt = weather_prompt(ToolChoice::Auto);
        prompt.messages.insert(
            0,
            ChatMessage {
                role: "developer".into(),
                content: "be brief".into(),
                ..Default::default()
            },
        );
        prompt
            .template_kwargs
            .insert("flavour".into(), json!("mint"));
        let out = template
            .render(&prompt, ToolCallFormat::TaggedJson)
            .unwrap();
        assert_eq!(out.text, "system:be brief;user:Weather?;<s>mint");
        prompt.template_kwargs.insert("messages".into(), json!([]));
        assert!(template
            .render(&prompt, ToolCallFormat::TaggedJson)
            .is_err());
    }

    #[test]
    fn template_lists_pick_tool_use_when_tools_are_given() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            serde_json::to_string(&json!({
                "eos_token": {"content": "</s>", "special": true},
                "chat_template": [
                    {"name": "default", "template": "plain{{ eos_token }}"},
                    {"name": "tool_use", "template": "tools={{ tools | length }}"},
                ]
            }))
            .unwrap(),
        )
        .unwrap();
        let template = ChatTemplate::from_dir(dir.path()).unwrap();
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        assert_eq!(
            template.render_json(&[], &[], true, &Map::new()).unwrap(),
            "plain</s>"
        );
        assert_eq!(
            template
                .render_json(&[], &tools, true, &Map::new())
                .unwrap(),
            "tools=1"
        );

        // chat_template.jinja wins over tokenizer_config.json.
        std::fs::write(dir.path().join("chat_template.jinja"), "from file").unwrap();
        let template = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(
            template
                .render_json(&[], &tools, true, &Map::new())
                .unwrap(),
            "from file"
        );
    }

    #[test]
    fn missing_template_is_a_load_error() {
        let err = ChatTemplate::from_dir(&crate::text::tokenizer::tests_support::fixture(
            "llada2-tiny-v22",
        ))
        .unwrap_err();
        assert!(err.to_string().contains("no chat template"), "{err}");
    }

    #[test]
    fn a_looping_template_runs_out_of_fuel() {
        let looping =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let template = ChatTemplate::from_source(looping, Map::new()).unwrap();
        let started = std::time::Instant::now();
        let error = template
            .render_json(
                &[json!({"role": "user", "content": "hi"})],
                &[],
                true,
                &Map::new(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("fuel"), "{error}");
        assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    }

    #[test]
    fn a_render_stops_at_the_output_cap() {
        // 2,000 iterations of a 10 kB string: 20 MB of output, under the fuel limit.
        let exploding = "{% set s = 'x' * 10000 %}{% for i in range(2000) %}{{ s }}{% endfor %}";
        let template = ChatTemplate::from_source(exploding, Map::new()).unwrap();
        let error = template
            .render_json(
                &[json!({"role": "user", "content": "hi"})],
                &[],
                true,
                &Map::new(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("exceeds"), "{error}");
        let huge = "x".repeat(MAX_TEMPLATE_BYTES + 1);
        let error = ChatTemplate::from_source(&huge, Map::new()).unwrap_err();
        assert!(error.to_string().contains("at most"), "{error}");
    }

    #[test]
    fn render_fuel_is_ample_for_long_chats() {
        // 20,000 messages (more than a 64k context holds at three tokens each) with the Ling
        // template render within the fuel.
        let template = ling_template();
        let messages: Vec<Json> = (0..20_000)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": "a"})
            })
            .collect();
        let rendered = template
            .render_json(&messages, &[], true, &Map::new())
            .unwrap();
        assert!(rendered.len() > 20_000);
    }
}
