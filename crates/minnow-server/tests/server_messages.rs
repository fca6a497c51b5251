//! Anthropic's Messages API over TCP: a conversation answers as the same conversation sent to
//! chat completions, streamed or not; tool use round-trips; counting matches; errors take the
//! Messages API's shape; and the official Anthropic Python SDK works unchanged.

#[path = "server_harness.rs"]
mod harness;

use harness::*;
use serde_json::{json, Value};

fn hello(extra: Value) -> Value {
    let mut body = json!({"max_tokens": 24, "messages": [{"role": "user", "content": "Hello"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// Asserts a Messages API error of `status` and `kind`.
fn assert_anthropic_error(status: u16, body: &Value, expected: u16, kind: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

/// The text of a message's content blocks.
fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|block| block["type"] == "text")
        .map(|block| block["text"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_is_the_chat_completion_of_the_same_conversation() {
    let server = Server::start(None, &[]).await;
    let system = "You are terse.";
    let (status, message) = post_json(
        &server,
        "/v1/messages",
        hello(json!({"system": [{"type": "text", "text": system}], "metadata": {"user_id": "u"}})),
    )
    .await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    let (_, chat) = post_json(
        &server,
        "/v1/chat/completions",
        json!({"max_tokens": 24, "messages": [{"role": "system", "content": system},
            {"role": "user", "content": "Hello"}]}),
    )
    .await;
    assert_eq!(text_of(&message), chat["choices"][0]["message"]["content"]);
    let usage = &message["usage"];
    let prompt = chat["usage"]["prompt_tokens"].as_u64().unwrap();
    let (input, cached) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["cache_read_input_tokens"].as_u64().unwrap(),
    );
    assert_eq!(input + cached, prompt, "{usage}");
    assert_eq!(usage["output_tokens"], chat["usage"]["completion_tokens"]);
    let expected_reason = match chat["choices"][0]["finish_reason"].as_str().unwrap() {
        "length" => "max_tokens",
        _ => "end_turn",
    };
    assert_eq!(message["stop_reason"], expected_reason);
    assert!(message["stop_sequence"].is_null());

    let (status, count) = post_json(
        &server,
        "/v1/messages/count_tokens",
        json!({"system": system, "messages": [{"role": "user", "content": "Hello"}]}),
    )
    .await;
    assert_eq!(status, 200, "{count}");
    assert_eq!(count["input_tokens"], prompt);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_carries_the_plain_answer_in_anthropic_events() {
    let server = Server::start(None, &["--keep-alive", "0.05"]).await;
    let (_, plain) = post_json(&server, "/v1/messages", hello(json!({}))).await;
    let events =
        read_named_events(post(&server, "/v1/messages", hello(json!({"stream": true}))).await)
            .await;
    let names: Vec<&str> = events
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| *name != "ping")
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let mut text = String::new();
    for (name, event) in &events {
        if name == "content_block_delta" {
            assert_eq!(event["index"], 0);
            assert_eq!(event["delta"]["type"], "text_delta");
            text.push_str(event["delta"]["text"].as_str().unwrap());
        }
    }
    assert_eq!(text, text_of(&plain));
    let (_, delta) = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], plain["stop_reason"]);
    assert_eq!(
        delta["usage"]["output_tokens"],
        plain["usage"]["output_tokens"]
    );
    let (_, start) = &events[0];
    assert_eq!(start["message"]["content"], json!([]));
    assert!(start["message"]["stop_reason"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_sequence_is_named_in_the_answer() {
    let server = Server::start(None, &[]).await;
    let (_, free) = post_json(&server, "/v1/messages", hello(json!({"max_tokens": 40}))).await;
    let text = text_of(&free);
    let at = text
        .char_indices()
        .nth(3)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("the answer {text:?} is too short to cut"));
    let stop = text[at..].chars().next().unwrap().to_string();
    let (_, cut) = post_json(
        &server,
        "/v1/messages",
        hello(json!({"max_tokens": 40, "stop_sequences": [stop]})),
    )
    .await;
    assert_eq!(cut["stop_reason"], "stop_sequence", "{cut}");
    assert_eq!(cut["stop_sequence"], stop.as_str());
    assert!(text.starts_with(&text_of(&cut)) && !text_of(&cut).contains(stop.as_str()));
}

/// A strict tool with `tool_choice: any` always gets a call (the answer decodes under the
/// schema's grammar): a `tool_use` block, plain and streamed alike, and its result goes back in
/// the next turn.
#[tokio::test(flavor = "multi_thread")]
async fn tool_use_round_trips() {
    let server = Server::start(None, &[]).await;
    let tools = json!([{"name": "get_weather", "description": "weather", "strict": true,
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                         "required": ["city"], "additionalProperties": false}}]);
    let ask = |stream: bool| {
        json!({"max_tokens": 48, "stream": stream, "tools": tools, "tool_choice": {"type": "any"},
               "messages": [{"role": "user", "content": "Weather?"}]})
    };
    let (status, plain) = post_json(&server, "/v1/messages", ask(false)).await;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["stop_reason"], "tool_use", "{plain}");
    let call = plain["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|block| block["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {plain}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{call}");

    let events = read_named_events(post(&server, "/v1/messages", ask(true)).await).await;
    let (_, started) = events
        .iter()
        .find(|(name, event)| {
            name == "content_block_start" && event["content_block"]["type"] == "tool_use"
        })
        .expect("a tool_use block starts");
    assert_eq!(started["content_block"]["name"], "get_weather");
    let json_text: String = events
        .iter()
        .filter(|(name, event)| {
            name == "content_block_delta" && event["delta"]["type"] == "input_json_delta"
        })
        .map(|(_, event)| event["delta"]["partial_json"].as_str().unwrap())
        .collect();
    let input: Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(input, call["input"]);

    let (status, next) = post_json(
        &server,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [call.clone()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18 C"}]}]}),
    )
    .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["type"], "message");
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_take_the_messages_api_shape() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(&server, "/v1/messages", json!({"messages": []})).await;
    assert_anthropic_error(status, &body, 400, "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let (status, body) = post_json(
        &server,
        "/v1/messages",
        hello(json!({"model": "claude-somewhere"})),
    )
    .await;
    assert_anthropic_error(status, &body, 404, "not_found_error");
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]});
    let (status, body) = post_json(&server, "/v1/messages", hello(image)).await;
    assert_anthropic_error(status, &body, 400, "invalid_request_error");
    let (status, body) = get_json(&server, "/v1/messages").await;
    assert_anthropic_error(status, &body, 405, "invalid_request_error");
    // A parsed request with ignored fields that then fails still names them, in the same shape.
    let response = post(
        &server,
        "/v1/messages",
        hello(json!({"model": "claude-somewhere", "future_option": 1})),
    )
    .await;
    assert_eq!(
        response.headers()["x-minnow-ignored-fields"],
        "future_option"
    );
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_anthropic_error(status, &body, 404, "not_found_error");

    // Keys: Anthropic clients send `x-api-key`.
    let keyed = Server::start(None, &["--api-key", "sekret"]).await;
    let (status, body) = post_json(&keyed, "/v1/messages", hello(json!({}))).await;
    assert_anthropic_error(status, &body, 401, "authentication_error");
    let response = reqwest::Client::new()
        .post(keyed.url("/v1/messages"))
        .header("x-api-key", "sekret")
        .header("anthropic-version", "2023-06-01")
        .json(&hello(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// The official Anthropic Python SDK, unchanged, against the server: a message, the same message
/// streamed through its event accumulator, token counting, a tool call and an error. It needs
/// Python with the `anthropic` package (`MINNOW_ANTHROPIC_PYTHON`, default `python3`; `.ci/run`
/// installs it in a virtual environment); without it the test fails and says so, and
/// `MINNOW_SKIP_ANTHROPIC_TEST=1` skips it on purpose.
#[tokio::test(flavor = "multi_thread")]
async fn the_official_anthropic_sdk_works_unchanged() {
    if std::env::var("MINNOW_SKIP_ANTHROPIC_TEST").as_deref() == Ok("1") {
        eprintln!("skipped on purpose (MINNOW_SKIP_ANTHROPIC_TEST=1)");
        return;
    }
    let python = std::env::var("MINNOW_ANTHROPIC_PYTHON").unwrap_or_else(|_| "python3".into());
    let available = std::process::Command::new(&python)
        .args(["-c", "import anthropic"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        available,
        "{python} cannot import the anthropic package: install it (pip install anthropic), \
         point MINNOW_ANTHROPIC_PYTHON at a Python that has it, or set \
         MINNOW_SKIP_ANTHROPIC_TEST=1"
    );
    let server = Server::start(None, &[]).await;
    let script = r#"
import sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused")
model = "llada2-tiny-v21"
plain = client.messages.create(model=model, max_tokens=24,
                               messages=[{"role": "user", "content": "Hello"}])
assert plain.type == "message" and plain.role == "assistant", plain
with client.messages.stream(model=model, max_tokens=24,
                            messages=[{"role": "user", "content": "Hello"}]) as stream:
    streamed = stream.get_final_message()
assert streamed.content[0].text == plain.content[0].text, (streamed, plain)
assert streamed.stop_reason == plain.stop_reason and streamed.usage.output_tokens == plain.usage.output_tokens
count = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hello"}])
assert count.input_tokens == plain.usage.input_tokens + plain.usage.cache_read_input_tokens, (count, plain.usage)
tools = [{"name": "get_weather", "description": "weather", "strict": True,
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                           "required": ["city"], "additionalProperties": False}}]
called = client.messages.create(model=model, max_tokens=48, tools=tools, tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather?"}])
use = [block for block in called.content if block.type == "tool_use"]
assert called.stop_reason == "tool_use" and use and isinstance(use[0].input["city"], str), called
try:
    client.messages.create(model=model, max_tokens=8, messages=[])
    raise SystemExit("an empty conversation was accepted")
except anthropic.BadRequestError as error:
    assert error.body["error"]["type"] == "invalid_request_error", error.body
print("ok")
"#;
    let base = server.base.clone();
    // The script blocks on the server this runtime drives: off the async threads.
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .args(["-c", script, &base])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success() && stdout.trim() == "ok",
        "the Anthropic SDK script failed:\n{stdout}\n{stderr}"
    );
}
