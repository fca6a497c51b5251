//! The API endpoints over real TCP against the tiny fixtures: informational routes, chat and text
//! completions (plain and streamed, SSE parsed chunk by chunk), usage/timings consistency, the
//! text utilities, and tool calls as far as a random-weight model allows.

#[path = "server_harness.rs"]
mod harness;

use harness::*;
use serde_json::{json, Value};

const MODEL_ID: &str = "llada2-tiny-v21";

#[tokio::test(flavor = "multi_thread")]
async fn informational_routes() {
    let server = Server::start(None, &["--parallel", "2"]).await;
    assert!(
        server
            .logs()
            .iter()
            .any(|l| l.contains("bundled tiny fixture")),
        "the fallback to the fixture is announced"
    );
    for path in ["/health", "/v1/health"] {
        let (status, body) = get_json(&server, path).await;
        assert_eq!((status, body), (200, json!({"status": "ok"})));
    }
    for path in ["/v1/models", "/models"] {
        let (status, body) = get_json(&server, path).await;
        assert_eq!(status, 200);
        assert_eq!(body["object"], "list");
        assert_eq!(body["data"][0]["id"], MODEL_ID);
        assert_eq!(body["data"][0]["object"], "model");
        assert_eq!(body["data"][0]["owned_by"], "minnow");
        assert_eq!(body["data"][0]["meta"]["n_ctx"], 512);
    }
    let (status, body) = get_json(&server, &format!("/v1/models/{MODEL_ID}")).await;
    assert_eq!(status, 200);
    assert_eq!(body["id"], MODEL_ID);

    let (status, props) = get_json(&server, "/props").await;
    assert_eq!(status, 200);
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);
    assert!(props["default_generation_settings"]["params"]["temperature"].is_number());
    assert!(props["chat_template"]
        .as_str()
        .unwrap()
        .contains("<role>SYSTEM</role>"));
    assert!(props["model_path"]
        .as_str()
        .unwrap()
        .ends_with("llada2-tiny-v21"));
    assert!(props["build_info"].as_str().unwrap().starts_with("minnow"));
    assert_eq!(props["minnow"]["block_size"], 32);
    assert_eq!(props["minnow"]["family"], "LLaDA2.1");
    assert!(props["minnow"]["algorithm"].is_string());
    assert!(props["minnow"]["cache"].is_object());

    let (status, slots) = get_json(&server, "/slots").await;
    assert_eq!(status, 200);
    assert_eq!(slots.as_array().unwrap().len(), 2);
    assert_eq!(slots[0]["n_ctx"], 512);
    assert_eq!(slots[0]["is_processing"], false);

    let metrics = reqwest::get(server.url("/metrics")).await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = metrics.text().await.unwrap();
    for name in [
        "minnow_requests_total{route=\"/health\",status=\"200\"}",
        "minnow_prompt_tokens_total",
        "minnow_generated_tokens_total",
        "minnow_denoise_forwards_total",
        "minnow_queue_depth",
        "minnow_busy_slots",
        "minnow_request_duration_seconds_bucket",
        "# TYPE minnow_request_duration_seconds histogram",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn alias_names_the_model() {
    let server = Server::start(None, &["--alias", "tiny"]).await;
    let (_, body) = get_json(&server, "/v1/models").await;
    assert_eq!(body["data"][0]["id"], "tiny");
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "tiny");
}

#[tokio::test(flavor = "multi_thread")]
async fn text_utilities() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(
        &server,
        "/tokenize",
        json!({"content": "Hello world<|role_end|>"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let ids: Vec<u64> = body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        *ids.last().unwrap(),
        485,
        "special-token strings map to their id"
    );
    let (status, body) = post_json(&server, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(status, 200);
    assert_eq!(body["content"], "Hello world<|role_end|>");
    let (_, pieces) = post_json(
        &server,
        "/tokenize",
        json!({"content": "Hi<|role_end|>", "with_pieces": true}),
    )
    .await;
    let last = pieces["tokens"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last, json!({"id": 485, "piece": "<|role_end|>"}));
    let (status, body) = post_json(&server, "/detokenize", json!({"tokens": [99999]})).await;
    assert_error(status, &body, 400, "invalid_request_error");

    let (status, body) = post_json(
        &server,
        "/apply-template",
        json!({"messages": [{"role": "user", "content": "Hello"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["prompt"],
        "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hello<|role_end|><role>ASSISTANT</role>"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_history_goes_through_the_template() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(
        &server,
        "/apply-template",
        json!({
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let prompt = body["prompt"].as_str().unwrap();
    assert!(
        prompt.starts_with("<role>SYSTEM</role>Be brief.\n"),
        "{prompt}"
    );
    assert!(prompt.contains("<tools>"), "{prompt}");
    assert!(prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    assert!(
        prompt.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            "<role>OBSERVATION</role>\n<tool_response>\n18C\n</tool_response><|role_end|>"
        ),
        "{prompt}"
    );
    assert!(prompt.ends_with("<role>ASSISTANT</role>"));
}

fn check_usage_and_timings(usage: &Value, timings: &Value) {
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion);
    assert!(prompt > 0);
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        timings["prompt_n"].as_u64().unwrap() + timings["cache_n"].as_u64().unwrap(),
        prompt
    );
    assert_eq!(timings["cache_n"].as_u64().unwrap(), cached);
    assert_eq!(timings["predicted_n"].as_u64().unwrap(), completion);
    for key in [
        "prompt_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_second",
    ] {
        assert!(timings[key].as_f64().unwrap() >= 0.0, "{key}: {timings}");
    }
    let predicted_ms = timings["predicted_ms"].as_f64().unwrap();
    if predicted_ms > 0.0 {
        let rate = completion as f64 * 1000.0 / predicted_ms;
        assert!(
            (timings["predicted_per_second"].as_f64().unwrap() - rate).abs() < 1e-6 * rate.max(1.0)
        );
    }
}

fn greedy_chat(stream: bool) -> Value {
    json!({
        "model": MODEL_ID,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Write about rivers."}],
        "max_tokens": 70,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_completion_plain() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(&server, "/v1/chat/completions", greedy_chat(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], MODEL_ID);
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || finish == "length", "{finish}");
    let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion <= 70, "max_tokens is a cap: {completion}");
    if finish == "length" {
        assert_eq!(completion, 70);
    }
    check_usage_and_timings(&body["usage"], &body["timings"]);
    assert!(body["minnow"]["blocks"].as_u64().unwrap() >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_completion_streamed_matches_plain() {
    let server = Server::start(None, &["--keep-alive", "0.05"]).await;
    let (_, plain) = post_json(&server, "/v1/chat/completions", greedy_chat(false)).await;
    let events = read_sse(post(&server, "/v1/chat/completions", greedy_chat(true)).await).await;

    assert_eq!(events.last(), Some(&Sse::Done), "ends with [DONE]");
    assert_eq!(events.iter().filter(|e| **e == Sse::Done).count(), 1);
    let chunks = data_events(&events);
    let id = chunks[0]["id"].as_str().unwrap().to_string();
    for chunk in &chunks {
        assert_eq!(chunk["id"], id.as_str(), "one id per stream");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], MODEL_ID);
    }
    // Role chunk first.
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    // Usage chunk last, with empty choices.
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    // The finish chunk just before it.
    let finish_chunk = &chunks[chunks.len() - 2];
    let finish = finish_chunk["choices"][0]["finish_reason"]
        .as_str()
        .unwrap();
    assert_eq!(finish_chunk["choices"][0]["delta"], json!({}));
    check_usage_and_timings(&usage_chunk["usage"], &finish_chunk["timings"]);
    assert!(finish_chunk["minnow"]["blocks"].as_u64().unwrap() >= 1);
    // Block chunks in between: content deltas and per-block statistics.
    let blocks = &chunks[1..chunks.len() - 2];
    assert!(!blocks.is_empty());
    let mut streamed = String::new();
    let mut previous_block: Option<u64> = None;
    for chunk in blocks {
        assert!(chunk["choices"][0]["finish_reason"].is_null());
        assert!(chunk["choices"][0]["delta"].get("role").is_none());
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(text);
        }
        let stats = &chunk["minnow"];
        let block = stats["block"].as_u64().unwrap();
        assert!(
            previous_block.is_none_or(|p| block > p),
            "block indices increase: {stats}"
        );
        previous_block = Some(block);
        assert!(stats["steps"].as_u64().unwrap() >= 1, "{stats}");
        assert!(stats["forwards"].as_u64().unwrap() >= stats["steps"].as_u64().unwrap());
    }
    // Greedy decoding is deterministic: streaming changes nothing.
    assert_eq!(
        streamed,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        finish,
        plain["choices"][0]["finish_reason"].as_str().unwrap()
    );
    // The streamed request came second, so its complete prompt blocks came from the prefix
    // cache; every other count is the same.
    let mut expected_usage = plain["usage"].clone();
    let prompt = expected_usage["prompt_tokens"].as_u64().unwrap();
    expected_usage["prompt_tokens_details"]["cached_tokens"] = json!(prompt / 32 * 32);
    assert_eq!(usage_chunk["usage"], expected_usage);
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_without_usage_and_with_progress() {
    let server = Server::start(None, &[]).await;
    let mut body = greedy_chat(true);
    body.as_object_mut().unwrap().remove("stream_options");
    body["return_progress"] = json!(true);
    body["max_tokens"] = json!(8);
    let events = read_sse(post(&server, "/v1/chat/completions", body).await).await;
    let chunks = data_events(&events);
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage chunk unless asked"
    );
    let last = chunks.last().unwrap();
    assert!(last["choices"][0]["finish_reason"].is_string());
    let progress: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(
        !progress.is_empty(),
        "return_progress reports prompt processing"
    );
    for chunk in chunks
        .iter()
        .filter(|c| c.get("minnow").is_some() && c["choices"][0]["finish_reason"].is_null())
    {
        assert!(
            chunk["timings"]["predicted_n"].is_u64(),
            "running timings with return_progress: {chunk}"
        );
    }
    for p in &progress {
        assert_eq!(p["choices"], json!([]));
        let pp = &p["prompt_progress"];
        assert!(pp["processed"].as_u64().unwrap() <= pp["total"].as_u64().unwrap());
        assert!(pp["cache"].is_u64() && pp["time_ms"].is_u64());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn text_completions() {
    let server = Server::start(None, &[]).await;
    for path in ["/v1/completions", "/completions"] {
        let (status, body) = post_json(
            &server,
            path,
            json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["object"], "text_completion");
        assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
        assert!(body["choices"][0]["text"].is_string());
        assert!(body["choices"][0]["logprobs"].is_null());
        check_usage_and_timings(&body["usage"], &body["timings"]);
        assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 16);
    }
    // Token-id prompts: the same ids as the text give the same greedy answer.
    let (_, tokens) = post_json(&server, "/tokenize", json!({"content": "Once upon a time"})).await;
    let (_, by_text) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}),
    )
    .await;
    let (status, by_ids) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": tokens["tokens"], "max_tokens": 16, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(by_ids["choices"][0]["text"], by_text["choices"][0]["text"]);
    assert_eq!(
        by_ids["usage"]["prompt_tokens"],
        by_text["usage"]["prompt_tokens"]
    );

    let events = read_sse(post(&server, "/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stream": true})).await).await;
    assert_eq!(events.last(), Some(&Sse::Done));
    let chunks = data_events(&events);
    let mut text = String::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "text_completion");
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, by_text["choices"][0]["text"].as_str().unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"],
        by_text["choices"][0]["finish_reason"]
    );
    assert!(last["timings"].is_object());
}

/// llama-server's native `/completion`: the OpenAI completion's text as `content` with `stop:
/// true`, `stop_type` limit / word (with the matched `stopping_word`), and streamed as
/// `stop: false` pieces whose text joins to it, then the `stop: true` object, with no `[DONE]`.
#[tokio::test(flavor = "multi_thread")]
async fn native_completion_answers_like_llama_server() {
    let server = Server::start(None, &[]).await;
    let request = json!({"prompt": "Once upon a time", "n_predict": 40, "temperature": 0});
    let (_, openai) = post_json(&server, "/v1/completions", request.clone()).await;
    let text = openai["choices"][0]["text"].as_str().unwrap().to_string();
    let (status, native) = post_json(&server, "/completion", request.clone()).await;
    assert_eq!(status, 200, "{native}");
    assert_eq!(native["content"], text.as_str());
    assert_eq!(native["stop"], true);
    assert_eq!(native["stop_type"], "limit");
    assert_eq!(native["stopping_word"], "");
    assert_eq!(native["tokens_predicted"], 40);
    assert_eq!(native["tokens_evaluated"], openai["usage"]["prompt_tokens"]);
    assert_eq!(native["has_new_line"], text.contains('\n'));
    assert!(
        native["timings"]["predicted_n"].as_u64().is_some(),
        "{native}"
    );
    assert!(native.get("choices").is_none());

    // A stop string inside the greedy answer ends it there, and is named.
    let at = text
        .char_indices()
        .nth(3)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("the 40-token answer {text:?} is too short to cut"));
    let stop = text[at..].chars().next().unwrap().to_string();
    let mut cut_request = request.clone();
    cut_request["stop"] = json!(["never in this text \u{1}", stop]);
    let (_, cut) = post_json(&server, "/completion", cut_request).await;
    let content = cut["content"].as_str().unwrap();
    assert!(
        text.starts_with(content) && !content.contains(stop.as_str()),
        "{cut}"
    );
    assert_eq!(cut["stop_type"], "word", "{cut}");
    assert_eq!(cut["stopping_word"], stop.as_str(), "{cut}");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = read_sse(post(&server, "/completion", streamed).await).await;
    assert!(
        !events.contains(&Sse::Done),
        "a native stream ends without [DONE]"
    );
    let objects = data_events(&events);
    let (last, pieces) = objects.split_last().unwrap();
    let mut joined = String::new();
    for piece in pieces {
        assert_eq!(piece["stop"], false, "{piece}");
        joined.push_str(piece["content"].as_str().unwrap());
    }
    assert_eq!(joined, text);
    assert_eq!(last["stop"], true);
    assert_eq!(last["content"], "");
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["tokens_predicted"], 40);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_strings_and_server_max_tokens() {
    let server = Server::start(None, &["--max-tokens", "8"]).await;
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "abc", "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["usage"]["completion_tokens"].as_u64().unwrap() <= 8,
        "--max-tokens caps requests without a limit"
    );
    // Whatever the model wrote, cutting at its first character must stop there.
    let (_, free) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "abc", "temperature": 0, "max_tokens": 40}),
    )
    .await;
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    // Greedy, so the same answer every run: it must be long enough to cut inside.
    let at = text
        .char_indices()
        .nth(3)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("the 40-token answer {text:?} is too short to cut"));
    let stop = &text[at..at + text[at..].chars().next().unwrap().len_utf8()];
    let (_, cut) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "abc", "temperature": 0, "max_tokens": 40, "stop": [stop]}),
    )
    .await;
    let cut_text = cut["choices"][0]["text"].as_str().unwrap();
    assert!(
        !cut_text.contains(stop),
        "stop string removed: {cut_text:?} vs {stop:?}"
    );
    assert!(text.starts_with(cut_text));
    assert!(cut_text.len() < text.len(), "nothing was cut");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }}])
}

/// A named `tool_choice` appends the steering prefix (the start of a call), so the parser sees a
/// call start. The fixture's random weights then write no end of call within 64 tokens (greedy,
/// so every run): the call cut off by `max_tokens` is left out entirely, plain and streamed alike
/// (docs/api.md, "Tool calls"). Calls the model does write are checked with a scripted model in
/// minnow-engine's `tests/scripted_model.rs`; no test here sees the server stream a real call.
#[tokio::test(flavor = "multi_thread")]
async fn named_tool_choice_cut_off_by_max_tokens_streams_like_plain() {
    let server = Server::start(None, &[]).await;
    let request = |stream: bool| {
        json!({
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": weather_tools(),
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 64,
            "temperature": 0,
            "stream": stream,
        })
    };
    let (_, rendered) = post_json(&server, "/apply-template", request(false)).await;
    assert!(
        rendered["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
        "{rendered}"
    );
    let (status, plain) = post_json(&server, "/v1/chat/completions", request(false)).await;
    assert_eq!(status, 200, "{plain}");
    let message = &plain["choices"][0]["message"];
    assert_eq!(plain["choices"][0]["finish_reason"], "length", "{plain}");
    assert!(message.get("tool_calls").is_none(), "{plain}");
    assert_eq!(message["content"], "", "no markup of the cut-off call");

    let events = read_sse(post(&server, "/v1/chat/completions", request(true)).await).await;
    let chunks = data_events(&events);
    let mut content = String::new();
    for chunk in &chunks {
        let delta = &chunk["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        assert!(delta.get("tool_calls").is_none(), "{chunk}");
    }
    let stream_finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(stream_finish, Some("length"));
    assert_eq!(content, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_choice_none_and_required() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "tools": weather_tools(), "tool_choice": "none", "max_tokens": 16}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["choices"][0]["message"].get("tool_calls").is_none(),
        "none: no calls are parsed"
    );
    assert_ne!(body["choices"][0]["finish_reason"], "tool_calls");

    // `required` steers: the prompt ends with the start of a call. The random model writes no
    // end of call within 32 tokens (greedy), so the cut-off call is left out: no call, no text.
    // A model that does call under `required` is minnow-engine's tests/scripted_model.rs.
    let required = json!({"messages": [{"role": "user", "content": "hi"}], "tools": weather_tools(), "tool_choice": "required", "max_tokens": 32, "temperature": 0, "parallel_tool_calls": false});
    let (_, rendered) = post_json(&server, "/apply-template", required.clone()).await;
    assert!(
        rendered["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<tool_call>\n{\"name\": \""),
        "{rendered}"
    );
    let (status, body) = post_json(&server, "/v1/chat/completions", required).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert!(
        body["choices"][0]["message"].get("tool_calls").is_none(),
        "{body}"
    );
    assert_eq!(body["choices"][0]["message"]["content"], "", "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn v20_checkpoint_serves_too() {
    let server = Server::start(Some(FIXTURE_V20), &[]).await;
    let (_, props) = get_json(&server, "/props").await;
    assert_eq!(props["minnow"]["family"], "LLaDA2.0");
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "llada2-tiny-v20");
}

#[tokio::test(flavor = "multi_thread")]
async fn llama_web_ui_request_is_accepted() {
    let server = Server::start(None, &[]).await;
    // What the llama.cpp web UI sends with the settings it syncs from /props.
    let (_, props) = get_json(&server, "/props").await;
    let params = &props["default_generation_settings"]["params"];
    let mut body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "stream": true,
        "return_progress": true,
        "reasoning_format": "auto",
        "timings_per_token": false,
        "max_tokens": 8,
    });
    for key in [
        "temperature",
        "dynatemp_range",
        "dynatemp_exponent",
        "top_k",
        "top_p",
        "min_p",
        "xtc_probability",
        "xtc_threshold",
        "typical_p",
        "repeat_last_n",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "samplers",
    ] {
        let value = params[key].clone();
        assert!(!value.is_null(), "/props advertises {key}");
        body[if key == "typical_p" { "typ_p" } else { key }] = value;
    }
    let events = read_sse(post(&server, "/v1/chat/completions", body).await).await;
    assert_eq!(events.last(), Some(&Sse::Done));
}

/// A 2.2 checkpoint: the tiny v22 fixture plus the repository's 2.2 test template. A named
/// `tool_choice` puts the whole call header (`functions.NAME:0`) into the prompt.
fn v22_checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/llada2-tiny-v22"
    );
    for entry in std::fs::read_dir(fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/templates/llada2.2-native-tools.test.jinja"
        ),
        dir.path().join("chat_template.jinja"),
    )
    .unwrap();
    dir
}

fn v22_named_call(stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": weather_tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 64,
        "temperature": 0,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn v22_named_tool_choice_streams_like_plain() {
    let dir = v22_checkpoint();
    let server = Server::start(Some(dir.path().to_str().unwrap()), &[]).await;
    let (_, rendered) = post_json(&server, "/apply-template", v22_named_call(false)).await;
    assert!(
        rendered["prompt"].as_str().unwrap().ends_with(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        ),
        "{rendered}"
    );
    let (status, plain) = post_json(&server, "/v1/chat/completions", v22_named_call(false)).await;
    assert_eq!(status, 200, "{plain}");
    let events = read_sse(post(&server, "/v1/chat/completions", v22_named_call(true)).await).await;
    let chunks = data_events(&events);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let plain_message = &plain["choices"][0]["message"];
    assert_eq!(content, plain_message["content"].as_str().unwrap_or(""));
    let streamed_calls = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .filter(|fragment| fragment.get("id").is_some())
        .count();
    let plain_calls = plain_message["tool_calls"].as_array().map_or(0, Vec::len);
    assert_eq!(streamed_calls, plain_calls);
    // What that compared: the random weights write no end of call within 64 tokens (greedy), so
    // both answers leave the cut-off call out (real calls: minnow-engine's scripted_model.rs).
    assert_eq!((plain_calls, content.as_str()), (0, ""), "{plain}");
    assert_eq!(plain["choices"][0]["finish_reason"], "length", "{plain}");
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_cleartext_works_too() {
    let server = Server::start(None, &[]).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let response = client
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let events = read_sse(response).await;
    assert_eq!(events.last(), Some(&Sse::Done));
}
