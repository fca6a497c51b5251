//! Strict tool calls: a Lark grammar for the answer that follows the prompt when `strict: true`
//! tools are declared, so a call's arguments always validate against its parameter schema
//! (chat-format doc §2–§3 for the markup). The grammar describes the text generated after the
//! steering prefix of `tool_choice` (which is part of the prompt).
//!
//! - `required` / a named function: exactly one call, completing the prefix.
//! - `auto`: free text, or text followed by one call. In the 2.0/2.1 tagged format the free text
//!   cannot contain `<` (a lexer cannot tell where plain text ends and `<tool_call>` begins
//!   without looking back); in 2.2 the markers are special tokens and text is unrestricted.
//!
//! Tools declared without `strict` keep any JSON object as arguments.

use serde_json::Value;

use super::json_style::json_options;
use crate::api::{OutputConstraint, StrictTool, ToolChoice};
use crate::text::tokenizer::markers::{
    ARGUMENT_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END,
};
use crate::text::tool_format::{ToolCallFormat, TAG_CLOSE, TAG_OPEN};

/// Reads OpenAI tool objects; `None` when none is `strict: true` (nothing to constrain).
pub fn strict_tools(tools: &[Value]) -> Option<Vec<StrictTool>> {
    let parsed: Vec<StrictTool> = tools
        .iter()
        .map(|tool| {
            let function = &tool["function"];
            let strict = function["strict"].as_bool() == Some(true);
            StrictTool {
                name: function["name"].as_str().unwrap_or_default().to_string(),
                parameters: strict.then(|| {
                    function
                        .get("parameters")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({"type": "object"}))
                }),
            }
        })
        .collect();
    parsed
        .iter()
        .any(|t| t.parameters.is_some())
        .then_some(parsed)
}

/// A Lark string literal.
fn literal(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// The arguments' `%json` rule: compact JSON, as for `json_schema` (compiler).
fn arguments(tool: &StrictTool) -> String {
    let mut schema = tool
        .parameters
        .clone()
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    if let Some(map) = schema.as_object_mut() {
        map.insert("x-guidance".into(), json_options());
    }
    format!(
        "%json {}",
        serde_json::to_string(&schema).unwrap_or_default()
    )
}

/// The grammar of the answer after the prompt for `tools` under `choice`, in `format`.
pub fn tool_call_constraint(
    format: ToolCallFormat,
    tools: &[StrictTool],
    choice: &ToolChoice,
) -> OutputConstraint {
    let mut rules = Vec::new();
    // `call_i`: the rest of a call of tool i after the text that names it.
    let named_rest = |tool: &StrictTool| match format {
        ToolCallFormat::TaggedJson => format!(
            "{} {}",
            arguments(tool),
            literal(&format!("}}\n{TAG_CLOSE}"))
        ),
        ToolCallFormat::NativeMarkers => format!("{} {CALL_END} {SECTION_END}", arguments(tool)),
    };
    // From the tool's name on.
    let from_name = |tool: &StrictTool| match format {
        ToolCallFormat::TaggedJson => format!(
            "{} {}",
            literal(&format!("{}\", \"arguments\": ", tool.name)),
            named_rest(tool)
        ),
        ToolCallFormat::NativeMarkers => format!(
            "{} {ARGUMENT_BEGIN} {}",
            literal(&format!("{}:0", tool.name)),
            named_rest(tool)
        ),
    };
    let calls: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            rules.push(format!("call_{i}: {}", from_name(tool)));
            format!("call_{i}")
        })
        .collect();
    let any_call = calls.join(" | ");
    let start = match choice {
        ToolChoice::Function(name) => match tools.iter().find(|t| &t.name == name) {
            Some(tool) => named_rest(tool),
            None => any_call,
        },
        ToolChoice::Required => any_call,
        ToolChoice::Auto | ToolChoice::None => match format {
            ToolCallFormat::TaggedJson => {
                rules.push(r"TEXT: /[^<]+/".to_string());
                let open = literal(&format!("{TAG_OPEN}\n{{\"name\": \""));
                format!("TEXT? | TEXT? {open} ({any_call})")
            }
            ToolCallFormat::NativeMarkers => {
                rules.push(r"TEXT: /(?s:.+)/".to_string());
                format!("TEXT? | TEXT? {SECTION_BEGIN} {CALL_BEGIN} \"functions.\" ({any_call})")
            }
        },
    };
    let mut lark = format!("start: {start}\n");
    for rule in rules {
        lark.push_str(&rule);
        lark.push('\n');
    }
    OutputConstraint::Lark(lark)
}
