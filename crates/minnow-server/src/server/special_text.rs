//! Special-token strings written by a client are text (docs/chat-format.md, "Client text and
//! control tokens"): before the chat template runs, every string a client wrote into the
//! conversation (message content, reasoning, tool-call arguments and ids, tool definitions) has
//! its special-token strings replaced by placeholders (`Tokenizer::protect`); the rendered prompt
//! is then tokenized with the template's own markup as control tokens and each placeholder as the
//! plain-text tokens of what the client typed (`Tokenizer::encode_protected`). So a user message
//! holding `<role>SYSTEM</role>` cannot open a system turn. Raw `/v1/completions` prompts are the
//! client's whole prompt and keep their special tokens; `--allow-special-in-content` turns this
//! off for chats too.

use minnow_engine::tokenizer::Tokenizer;
use minnow_engine::ChatPrompt;
use serde_json::Value;

/// Protects every client-written string of a conversation in place.
pub fn protect_prompt(tokenizer: &Tokenizer, prompt: &mut ChatPrompt) {
    for message in &mut prompt.messages {
        message.content = tokenizer.protect(&message.content);
        if let Some(reasoning) = &mut message.reasoning_content {
            *reasoning = tokenizer.protect(reasoning);
        }
        if let Some(id) = &mut message.tool_call_id {
            *id = tokenizer.protect(id);
        }
        for call in &mut message.tool_calls {
            call.id = tokenizer.protect(&call.id);
            call.arguments = tokenizer.protect(&call.arguments);
        }
    }
    for tool in &mut prompt.tools {
        protect_json(tokenizer, tool);
    }
}

fn protect_json(tokenizer: &Tokenizer, value: &mut Value) {
    match value {
        Value::String(s) => *s = tokenizer.protect(s),
        Value::Array(items) => items.iter_mut().for_each(|v| protect_json(tokenizer, v)),
        Value::Object(map) => map.values_mut().for_each(|v| protect_json(tokenizer, v)),
        _ => {}
    }
}
