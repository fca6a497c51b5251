//! Conversation items of the Responses API (messages, function calls, function call outputs):
//! parsing them from `input`, writing them as `output`, and turning a conversation into the chat
//! messages the checkpoint's template renders.
//!
//! The one rule that matters for multi-turn state: the output items of a response, fed back as
//! input (by a client resending them or by `previous_response_id`), become exactly the assistant
//! message a Chat Completions client would send for the same answer (`content` = the text,
//! `tool_calls` = the calls, in order), so the next turn renders the same prompt either way.

use minnow_engine::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::errors::ApiError;
use super::super::fields::{
    accept_inert, field_path, inner, parse_object, required, FieldPolicy, Present, Text, Unknown,
};

/// Who wrote a message item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

impl Role {
    fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    /// The chat role the template knows (`developer` is a system message there).
    fn chat_role(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One conversation item. `id` is the item's own id (set on output items, optional on input).
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Message {
        id: Option<String>,
        role: Role,
        text: String,
    },
    FunctionCall {
        id: Option<String>,
        call_id: String,
        name: String,
        arguments: String,
    },
    FunctionCallOutput {
        id: Option<String>,
        call_id: String,
        output: String,
    },
}

impl Item {
    pub fn id(&self) -> Option<&str> {
        match self {
            Item::Message { id, .. }
            | Item::FunctionCall { id, .. }
            | Item::FunctionCallOutput { id, .. } => id.as_deref(),
        }
    }

    /// The same item apart from its id (what the model sees is equal).
    pub fn same_content(&self, other: &Item) -> bool {
        match (self, other) {
            (
                Item::Message { role, text, .. },
                Item::Message {
                    role: r, text: t, ..
                },
            ) => role.chat_role() == r.chat_role() && text == t,
            (
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                    ..
                },
                Item::FunctionCall {
                    call_id: c,
                    name: n,
                    arguments: a,
                    ..
                },
            ) => call_id == c && name == n && arguments == a,
            (
                Item::FunctionCallOutput {
                    call_id, output, ..
                },
                Item::FunctionCallOutput {
                    call_id: c,
                    output: o,
                    ..
                },
            ) => call_id == c && output == o,
            _ => false,
        }
    }

    /// The item as it appears in a response's `output` (and in stream events); `status` is
    /// "in_progress" while it streams, then "completed" (or "incomplete" when cut by the token
    /// limit).
    pub fn to_json(&self, status: &str) -> Value {
        match self {
            Item::Message { id, role, text } => json!({
                "type": "message",
                "id": id,
                "status": status,
                "role": role.name(),
                "content": [output_text(text)],
            }),
            Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "type": "function_call",
                "id": id,
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": status,
            }),
            Item::FunctionCallOutput {
                id,
                call_id,
                output,
            } => json!({
                "type": "function_call_output",
                "id": id,
                "call_id": call_id,
                "output": output,
                "status": status,
            }),
        }
    }
}

/// An `output_text` content part.
pub fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `input` (or `instructions` given as a list): a string is one user message; a list holds
/// items. `path` is the request field, for error messages.
pub fn parse_input(value: Value, path: &str, policy: &FieldPolicy) -> Result<Vec<Item>, ApiError> {
    match value {
        Value::String(text) => Ok(vec![Item::Message {
            id: None,
            role: Role::User,
            text,
        }]),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| parse_item(item, &format!("{path}[{i}]"), policy))
            .collect(),
        _ => Err(ApiError::invalid(
            path,
            format!("'{path}' must be a string or a list of input items"),
        )),
    }
}

/// The fields every input item has; the rest are read by its type.
#[derive(Deserialize)]
struct ItemBody {
    /// Easy input messages (`{"role", "content"}`) carry no type.
    #[serde(rename = "type")]
    kind: Option<Text>,
    id: Option<Text>,
    /// Output items echoed back as input carry their status; it says nothing to the model.
    #[serde(rename = "status")]
    _status: Option<Text>,
    #[serde(flatten)]
    by_type: Unknown,
}

#[derive(Deserialize)]
struct MessageItem {
    role: Option<Text>,
    content: Option<Value>,
    /// `phase` (commentary / final answer) is output metadata of reasoning models.
    #[serde(rename = "phase")]
    _phase: Present,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct FunctionCallItem {
    call_id: Option<Text>,
    name: Option<Text>,
    arguments: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct FunctionCallOutputItem {
    call_id: Option<Text>,
    output: Option<Value>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// A part of a message item's content list.
#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: Option<Text>,
    text: Option<Text>,
    #[serde(flatten)]
    unknown: Unknown,
}

fn parse_item(value: Value, path: &str, policy: &FieldPolicy) -> Result<Item, ApiError> {
    let body: ItemBody = parse_object(value, path)?;
    let kind = inner(body.kind).unwrap_or_else(|| "message".into());
    let id = inner(body.id);
    let rest = Value::Object(body.by_type);
    let field = |key: &str| field_path(path, key);
    let (item, unknown) = match kind.as_str() {
        "message" => {
            let message: MessageItem = parse_object(rest, path)?;
            let role_name = required(inner(message.role), &field("role"))?;
            let role = Role::parse(&role_name).ok_or_else(|| {
                ApiError::invalid(
                    field_path(path, "role"),
                    format!(
                        "unknown role '{role_name}': expected user, assistant, system or developer"
                    ),
                )
            })?;
            let content = required(message.content, &field("content"))?;
            let text = parse_content(content, &field_path(path, "content"), role, policy)?;
            (Item::Message { id, role, text }, message.unknown)
        }
        "function_call" => {
            let call: FunctionCallItem = parse_object(rest, path)?;
            let call_id = required(inner(call.call_id), &field("call_id"))?;
            let name = required(inner(call.name), &field("name"))?;
            let arguments = required(inner(call.arguments), &field("arguments"))?;
            let item = Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            };
            (item, call.unknown)
        }
        "function_call_output" => {
            let output_item: FunctionCallOutputItem = parse_object(rest, path)?;
            let call_id = required(inner(output_item.call_id), &field("call_id"))?;
            let output_path = field("output");
            let output = match required(output_item.output, &output_path)? {
                Value::String(s) => s,
                parts @ Value::Array(_) => parse_content(parts, &output_path, Role::User, policy)?,
                _ => {
                    return Err(ApiError::invalid(
                        output_path.clone(),
                        format!("'{output_path}' must be a string or a list of input_text parts"),
                    ))
                }
            };
            let item = Item::FunctionCallOutput {
                id,
                call_id,
                output,
            };
            (item, output_item.unknown)
        }
        other => {
            return Err(ApiError::invalid(
                field_path(path, "type"),
                format!(
                    "input item type '{other}' is not supported (message, function_call and \
                     function_call_output are)"
                ),
            ))
        }
    };
    policy.finish(path, &unknown)?;
    Ok(item)
}

/// Message content: a string, or text parts joined with "\n" (the Chat Completions path joins
/// parts the same way, so both APIs render one conversation identically). User, system and
/// developer messages hold `input_text` parts; assistant messages `output_text` parts (their own
/// earlier output) or `input_text`.
fn parse_content(
    value: Value,
    path: &str,
    role: Role,
    policy: &FieldPolicy,
) -> Result<String, ApiError> {
    let parts = match value {
        Value::String(s) => return Ok(s),
        Value::Array(parts) => parts,
        _ => {
            return Err(ApiError::invalid(
                path,
                format!("'{path}' must be a string or a list of content parts"),
            ))
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let part_path = format!("{path}[{j}]");
        let mut part: ContentPart = parse_object(part, &part_path)?;
        let type_path = field_path(&part_path, "type");
        let kind = required(inner(part.kind), &type_path)?;
        match (kind.as_str(), role) {
            ("input_text", _) => {}
            ("output_text", Role::Assistant) => {
                // Echoed output: citations and log-probabilities are not part of the text.
                accept_inert(&mut part.unknown, &["annotations", "logprobs"]);
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    type_path,
                    format!(
                        "content part type '{other}' is not supported here (input_text{} only)",
                        if role == Role::Assistant {
                            " and output_text"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        }
        let text = required(inner(part.text), &field_path(&part_path, "text"))?;
        policy.finish(&part_path, &part.unknown)?;
        texts.push(text);
    }
    Ok(texts.join("\n"))
}

/// Every `function_call_output` must answer a `function_call` made earlier in the conversation.
/// `first_input` is the index of the first item of this request's `input` (the items before it
/// come from `previous_response_id`), for the error's `param`.
pub fn check_call_outputs(conversation: &[Item], first_input: usize) -> Result<(), ApiError> {
    // A set: a conversation of many calls is checked in linear time.
    let mut calls: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (index, item) in conversation.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, .. } => {
                calls.insert(call_id);
            }
            Item::FunctionCallOutput { call_id, .. } if !calls.contains(call_id.as_str()) => {
                let param = format!("input[{}].call_id", index.saturating_sub(first_input));
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "function_call_output answers call_id '{call_id}', but no earlier \
                         function_call in the conversation has that call_id"
                    ),
                ));
            }
            Item::FunctionCallOutput { .. } | Item::Message { .. } => {}
        }
    }
    Ok(())
}

/// The chat messages of a conversation, `instructions` first. Function calls join the assistant
/// message next to them (before or after, as long as no other item intervenes), which is how
/// one chat completion holds text and tool calls together; a function call without such a
/// message gets an assistant message with empty content.
pub fn to_messages(instructions: &[Item], conversation: &[Item]) -> Vec<ChatMessage> {
    let mut messages: Vec<ChatMessage> = Vec::new();
    // The last message is an assistant message that later calls (or its text) may still join.
    let mut assistant_open = false;
    for item in instructions.iter().chain(conversation) {
        match item {
            Item::Message {
                role: Role::Assistant,
                text,
                ..
            } => match messages.last_mut() {
                Some(last) if assistant_open && last.content.is_empty() => {
                    last.content = text.clone();
                }
                _ => {
                    messages.push(message("assistant", text));
                    assistant_open = true;
                }
            },
            Item::Message { role, text, .. } => {
                messages.push(message(role.chat_role(), text));
                assistant_open = false;
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                if !assistant_open {
                    messages.push(message("assistant", ""));
                    assistant_open = true;
                }
                if let Some(last) = messages.last_mut() {
                    last.tool_calls.push(ToolCall {
                        id: call_id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            Item::FunctionCallOutput {
                call_id, output, ..
            } => {
                let mut tool = message("tool", output);
                tool.tool_call_id = Some(call_id.clone());
                messages.push(tool);
                assistant_open = false;
            }
        }
    }
    messages
}

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
        ..ChatMessage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(value: Value) -> Vec<Item> {
        parse_input(value, "input", &FieldPolicy::new(true)).unwrap()
    }

    fn param(value: Value) -> String {
        parse_input(value, "input", &FieldPolicy::new(true))
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn a_string_is_one_user_message() {
        let messages = to_messages(&[], &items(json!("hi")));
        assert_eq!(messages, vec![message("user", "hi")]);
    }

    #[test]
    fn every_item_type_becomes_its_chat_message() {
        let conversation = items(json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "calling", "annotations": [], "logprobs": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
             "arguments": "{\"x\":1}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "ok"}]},
        ]));
        let instructions = [Item::Message {
            id: None,
            role: Role::System,
            text: "sys".into(),
        }];
        let messages = to_messages(&instructions, &conversation);
        let mut assistant = message("assistant", "calling");
        assistant.tool_calls = vec![
            ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{\"x\":1}".into(),
            },
            ToolCall {
                id: "call_2".into(),
                name: "g".into(),
                arguments: "{}".into(),
            },
        ];
        let mut tool_1 = message("tool", "42");
        tool_1.tool_call_id = Some("call_1".into());
        let mut tool_2 = message("tool", "ok");
        tool_2.tool_call_id = Some("call_2".into());
        assert_eq!(
            messages,
            vec![
                message("system", "sys"),
                message("system", "be brief"),
                message("user", "a\nb"),
                assistant,
                tool_1,
                tool_2,
            ]
        );
        assert!(check_call_outputs(&conversation, 0).is_ok());
    }

    #[test]
    fn calls_join_the_neighbouring_assistant_message() {
        // Text after the call (a stream that opened the call item first) joins the same message.
        let conversation = items(json!([
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"role": "assistant", "content": "late text"},
            {"role": "assistant", "content": "second message"},
        ]));
        let messages = to_messages(&[], &conversation);
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1].content, "late text");
        assert_eq!(messages[1].tool_calls.len(), 1);
        assert_eq!(messages[2].content, "second message");
        assert!(messages[2].tool_calls.is_empty());
    }

    #[test]
    fn output_items_parse_back_to_themselves() {
        let produced = vec![
            Item::Message {
                id: Some("msg_1".into()),
                role: Role::Assistant,
                text: "hello".into(),
            },
            Item::FunctionCall {
                id: Some("fc_1".into()),
                call_id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            },
        ];
        let echoed: Vec<Value> = produced.iter().map(|i| i.to_json("completed")).collect();
        assert_eq!(items(Value::Array(echoed)), produced);
    }

    #[test]
    fn bad_items_name_their_field() {
        assert_eq!(
            param(json!([{"type": "web_search_call", "id": "x"}])),
            "input[0].type"
        );
        assert_eq!(
            param(json!([{"role": "robot", "content": "x"}])),
            "input[0].role"
        );
        assert_eq!(
            param(
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}])
            ),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(json!([{"role": "user", "content": [{"type": "output_text", "text": "u"}]}])),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
            "input[0].call_id"
        );
        assert_eq!(
            param(json!([{"role": "user", "content": "x", "extra": 1}])),
            "input[0].extra"
        );
        assert_eq!(param(json!(5)), "input");
        let orphan =
            items(json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}]));
        assert_eq!(
            check_call_outputs(&orphan, 0).unwrap_err().param.as_deref(),
            Some("input[0].call_id")
        );
    }
}
