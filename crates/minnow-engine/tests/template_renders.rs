//! Differential renders: `tests/fixtures/templates/extra-renders.json` holds conversations
//! rendered by Jinja2 configured like transformers' chat-template environment
//! (`make-extra-renders.py` next to it regenerates the file). Every entry must come out of the
//! engine's renderer byte for byte, both from the raw template messages and through the
//! `ChatPrompt` / `ChatMessage` API.

use std::path::{Path, PathBuf};

use minnow_engine::text::chat_template::ChatTemplate;
use minnow_engine::text::tool_format::ToolCallFormat;
use minnow_engine::{ChatMessage, ChatPrompt, ToolCall, ToolChoice};
use serde_json::{json, Map, Value};

fn templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

fn extra_renders() -> Value {
    let text = std::fs::read_to_string(templates_dir().join("extra-renders.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn special_vars() -> Map<String, Value> {
    let mut vars = Map::new();
    vars.insert("bos_token".into(), json!("<|startoftext|>"));
    vars.insert("eos_token".into(), json!("<|endoftext|>"));
    vars.insert("pad_token".into(), json!("<|endoftext|>"));
    vars.insert("mask_token".into(), json!("<|mask|>"));
    vars
}

fn to_chat_message(m: &Value) -> ChatMessage {
    let text = |key: &str| m.get(key).and_then(Value::as_str).map(str::to_string);
    ChatMessage {
        role: text("role").unwrap(),
        content: text("content").unwrap_or_default(),
        tool_calls: m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| ToolCall {
                        id: c["id"].as_str().unwrap().into(),
                        name: c["function"]["name"].as_str().unwrap().into(),
                        arguments: c["function"]["arguments"].as_str().unwrap().into(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        tool_call_id: text("tool_call_id"),
        name: text("name"),
        reasoning_content: text("reasoning_content"),
    }
}

#[test]
fn conversations_render_like_transformers() {
    let data = extra_renders();
    let entries = data["renders"].as_array().unwrap();
    assert!(entries.len() >= 12);
    for entry in entries {
        let file = entry["template"].as_str().unwrap();
        let name = entry["name"].as_str().unwrap();
        let source = std::fs::read_to_string(templates_dir().join(file)).unwrap();
        let template = ChatTemplate::from_source(&source, special_vars()).unwrap();
        let messages = entry["messages"].as_array().unwrap();
        let tools = entry["tools"].as_array().cloned().unwrap_or_default();
        let add = entry["add_generation_prompt"].as_bool().unwrap();
        let expected = entry["rendered"].as_str().unwrap();

        let raw = template
            .render_json(messages, &tools, add, &Map::new())
            .unwrap_or_else(|e| panic!("{file} {name}: {e}"));
        assert_eq!(raw, expected, "{file} {name} (raw messages)");

        let prompt = ChatPrompt {
            messages: messages.iter().map(to_chat_message).collect(),
            tools,
            tool_choice: ToolChoice::Auto,
            add_generation_prompt: add,
            template_kwargs: Map::new(),
        };
        let format = if file.contains("native") {
            ToolCallFormat::NativeMarkers
        } else {
            ToolCallFormat::TaggedJson
        };
        let rendered = template
            .render(&prompt, format)
            .unwrap_or_else(|e| panic!("{file} {name}: {e}"));
        assert_eq!(rendered.text, expected, "{file} {name} (ChatPrompt)");
    }
}

#[test]
fn tojson_keyword_arguments_match_python() {
    let data = extra_renders();
    for entry in data["tojson"].as_array().unwrap() {
        let source = entry["template"].as_str().unwrap();
        let template = ChatTemplate::from_source(source, Map::new()).unwrap();
        let mut kwargs = Map::new();
        kwargs.insert("x".into(), entry["value"].clone());
        let out = template.render_json(&[], &[], false, &kwargs).unwrap();
        assert_eq!(out, entry["rendered"].as_str().unwrap(), "{source}");
    }
}

#[test]
fn jinja_features_match_python() {
    let data = extra_renders();
    let probes = data["probes"].as_array().unwrap();
    assert!(probes.len() >= 10);
    let mut failures = Vec::new();
    for probe in probes {
        let source = probe["template"].as_str().unwrap();
        let template = ChatTemplate::from_source(source, Map::new()).unwrap();
        let context = probe["context"].as_object().unwrap();
        let messages = context["messages"].as_array().unwrap();
        let mut kwargs = context.clone();
        kwargs.remove("messages");
        let out = template.render_json(messages, &[], false, &kwargs);
        let expected = probe["rendered"].as_str().unwrap();
        match out {
            Ok(text) if text == expected => {}
            other => failures.push(format!(
                "{source}\n  expected {expected:?}\n  got      {other:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
