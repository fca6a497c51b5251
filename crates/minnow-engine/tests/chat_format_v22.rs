//! The LLaDA2.2 native tool-marker format end to end through the public text API: a checkpoint
//! directory (the tiny v22 tokenizer plus our 2.2 *test* template, chat-format doc §3) is
//! loaded, a tool conversation is rendered and tokenized, and a native-marker answer is streamed
//! back through the output pipeline in 32-token blocks.

use std::path::{Path, PathBuf};

use minnow_engine::output::text_stream::OutputStream;
use minnow_engine::output::tool_calls::StreamParser;
use minnow_engine::text::chat_template::ChatTemplate;
use minnow_engine::text::tool_format::ToolCallFormat;
use minnow_engine::Tokenizer;
use minnow_engine::{ChatMessage, ChatPrompt, FinishReason, ToolCall, ToolChoice};
use serde_json::json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A temporary 2.2-style checkpoint directory: tiny v22 tokenizer files + the test template.
fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
    ] {
        std::fs::copy(
            fixtures().join("llada2-tiny-v22").join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    std::fs::copy(
        fixtures().join("templates/llada2.2-native-tools.test.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .unwrap();
    dir
}

fn weather_tool() -> serde_json::Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather, in °C.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    }
}

fn conversation() -> ChatPrompt {
    let mut assistant = message("assistant", "Checking both.");
    assistant.tool_calls = vec![
        ToolCall {
            id: "call_abc".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Montréal\"}".into(),
        },
        ToolCall {
            id: "call_xyz".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"東京\"}".into(),
        },
    ];
    let mut first = message("tool", "{\"temp\": -3}");
    first.tool_call_id = Some("call_abc".into());
    let mut second = message("tool", "{\"temp\": 21}");
    second.tool_call_id = Some("call_xyz".into());
    ChatPrompt {
        messages: vec![
            message("system", "Be brief."),
            message("user", "Weather in Montréal and Tokyo?"),
            assistant,
            // Results in the opposite order: the header follows the call id, not the position.
            second,
            first,
        ],
        tools: vec![weather_tool()],
        tool_choice: ToolChoice::Auto,
        add_generation_prompt: true,
        template_kwargs: Default::default(),
    }
}

#[test]
fn renders_native_markers_and_return_headers() {
    let dir = checkpoint();
    let template = ChatTemplate::from_dir(dir.path()).unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let format = ToolCallFormat::detect(&tokenizer, template.source());
    assert_eq!(format, ToolCallFormat::NativeMarkers);

    let rendered = template.render(&conversation(), format).unwrap();
    let expected = concat!(
        "<role>SYSTEM</role>Be brief.\n# Tools\n",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Current weather, in °C.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#,
        "\ndetailed thinking off<|role_end|>",
        "<role>HUMAN</role>Weather in Montréal and Tokyo?<|role_end|>",
        "<role>ASSISTANT</role>Checking both.<|tool_calls_section_begin|>",
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\":\"Montréal\"}<|tool_call_end|>",
        "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\":\"東京\"}<|tool_call_end|>",
        "<|tool_calls_section_end|><|role_end|>",
        "<role>OBSERVATION</role>## Return of functions.get_weather:1\n{\"temp\": 21}\n",
        "## Return of functions.get_weather:0\n{\"temp\": -3}\n<|role_end|>",
        "<role>ASSISTANT</role>",
    );
    assert_eq!(rendered.text, expected);
    assert_eq!(rendered.forced_prefix, None);

    // Markers are single tokens of the prompt.
    let ids = tokenizer.encode(&rendered.text).unwrap();
    let markers = &tokenizer.special().tool_markers;
    let count = |id: Option<u32>| ids.iter().filter(|&&i| Some(i) == id).count();
    assert_eq!(count(markers.section_begin), 1);
    assert_eq!(count(markers.call_begin), 2);
    assert_eq!(count(markers.argument_begin), 2);
    assert_eq!(count(markers.call_end), 2);
    assert_eq!(count(markers.section_end), 1);
    assert_eq!(count(tokenizer.special().role_end), 4);
    tokenizer.check_prompt(&ids).unwrap();
}

#[test]
fn native_tool_choice_prefixes() {
    let dir = checkpoint();
    let template = ChatTemplate::from_dir(dir.path()).unwrap();
    let mut prompt = conversation();
    prompt.messages.truncate(2);
    prompt
        .tools
        .push(json!({"type": "function", "function": {"name": "get_time"}}));

    prompt.tool_choice = ToolChoice::Function("get_weather".into());
    let named = template
        .render(&prompt, ToolCallFormat::NativeMarkers)
        .unwrap();
    let prefix = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>";
    assert_eq!(named.forced_prefix.as_deref(), Some(prefix));
    assert!(named
        .text
        .ends_with(&format!("<role>ASSISTANT</role>{prefix}")));
    assert!(!named.text.contains("get_time"));

    prompt.tool_choice = ToolChoice::Required;
    let required = template
        .render(&prompt, ToolCallFormat::NativeMarkers)
        .unwrap();
    assert_eq!(
        required.forced_prefix.as_deref(),
        Some("<|tool_calls_section_begin|><|tool_call_begin|>functions.")
    );
    assert!(required.text.contains("get_time"));

    prompt.tool_choice = ToolChoice::None;
    let none = template
        .render(&prompt, ToolCallFormat::NativeMarkers)
        .unwrap();
    assert!(!none.text.contains("# Tools"));
}

#[test]
fn unknown_tool_call_id_is_rejected_before_rendering() {
    let dir = checkpoint();
    let template = ChatTemplate::from_dir(dir.path()).unwrap();
    let mut prompt = conversation();
    prompt.messages[4].tool_call_id = Some("call_missing".into());
    let err = template
        .render(&prompt, ToolCallFormat::NativeMarkers)
        .unwrap_err();
    assert!(err.to_string().contains("call_missing"), "{err}");
}

#[test]
fn native_answer_streams_back_in_blocks() {
    let dir = checkpoint();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let answer = "Checking. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\":\"Montréal\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\":\"東京\"}<|tool_call_end|><|tool_calls_section_end|><|role_end|>";
    let ids = tokenizer.encode(answer).unwrap();
    let parser = StreamParser::new(
        ToolCallFormat::NativeMarkers,
        vec!["get_weather".into()],
        None,
        "call_5",
    );
    let mut stream = OutputStream::new(vec![], parser);
    let mut content = String::new();
    let mut deltas = Vec::new();
    let mut committed = Vec::new();
    for block in ids.chunks(32) {
        committed.extend_from_slice(block);
        let step = stream.push_block(&tokenizer, &committed).unwrap();
        assert!(step.stop.is_none());
        content.push_str(&step.text_delta);
        deltas.extend(step.tool_call_deltas);
    }
    let done = stream
        .finish(&tokenizer, &committed, FinishReason::Stop)
        .unwrap();
    content.push_str(&done.text_delta);
    deltas.extend(done.tool_call_deltas);
    assert_eq!(content, "Checking. ");
    assert_eq!(done.content, "Checking. ");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    // Per call: a header delta (id and name, empty arguments), then the arguments.
    let args: Vec<&str> = deltas.iter().map(|d| d.arguments.as_str()).collect();
    assert_eq!(
        args,
        ["", "{\"city\":\"Montréal\"}", "", "{\"city\":\"東京\"}"]
    );
    let names: Vec<Option<&str>> = deltas.iter().map(|d| d.name.as_deref()).collect();
    assert_eq!(
        names,
        [Some("get_weather"), None, Some("get_weather"), None]
    );
    assert_eq!(done.tool_calls[0].id, "call_5_0");
    assert_eq!(done.tool_calls[1].id, "call_5_1");
}
