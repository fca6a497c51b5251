//! The Responses API over real TCP against the tiny fixture: input items rendering exactly like
//! the equivalent chat messages, `previous_response_id` continuing a conversation with the same
//! prompt tokens as a full resend, function calls and their outputs, the streamed event sequence
//! parsed event by event, stored responses (GET, DELETE, `store: false`, LRU eviction at
//! `--responses-max`), the unknown-field policy in both modes, and the error cases. Shapes are checked against `async-openai`'s strict
//! Responses types as well.

#[path = "server_harness.rs"]
mod harness;

use async_openai::types::responses::{Response as TypedResponse, ResponseStreamEvent};
use harness::*;
use serde_json::{json, Value};

fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{} rejects {value}: {e}", std::any::type_name::<T>()))
}

async fn create(server: &Server, body: Value) -> (u16, Value) {
    post_json(server, "/v1/responses", body).await
}

/// A successful create, checked against the typed client model.
async fn created(server: &Server, body: Value) -> Value {
    let (status, response) = create(server, body).await;
    assert_eq!(status, 200, "{response}");
    let _: TypedResponse = typed(&response);
    response
}

/// The prompt token ids a create request with this body would submit.
async fn prompt_ids(server: &Server, body: Value) -> Vec<u64> {
    let (status, counted) = post_json(server, "/v1/responses/input_tokens", body).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["object"], "response.input_tokens");
    let ids: Vec<u64> = counted["minnow"]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect();
    assert_eq!(counted["input_tokens"], ids.len());
    ids
}

/// The prompt token ids of a chat request: its rendered template, tokenized.
async fn chat_prompt_ids(server: &Server, chat: Value) -> Vec<u64> {
    let (status, rendered) = post_json(server, "/apply-template", chat).await;
    assert_eq!(status, 200, "{rendered}");
    let (status, tokens) =
        post_json(server, "/tokenize", json!({"content": rendered["prompt"]})).await;
    assert_eq!(status, 200, "{tokens}");
    tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect()
}

fn flat_weather_tool() -> Value {
    json!({
        "type": "function",
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": true,
    })
}

fn chat_weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }})
}

/// The text of a response's message items.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_string())
        .collect()
}

/// The chat message a client would send for a response's output.
fn assistant_message(response: &Value) -> Value {
    let calls: Vec<Value> = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .map(|item| {
            json!({"id": item["call_id"], "type": "function",
                   "function": {"name": item["name"], "arguments": item["arguments"]}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": output_text(response)});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

#[tokio::test(flavor = "multi_thread")]
async fn every_item_type_renders_like_its_chat_message() {
    let server = Server::start(None, &[]).await;
    let input = json!([
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Paris"}, {"type": "input_text", "text": "and Rome?"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21C"}]},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Thanks"},
    ]);
    let ids = prompt_ids(
        &server,
        json!({"instructions": "You are a weather bot.", "input": input, "tools": [flat_weather_tool()]}),
    )
    .await;
    let chat = chat_prompt_ids(
        &server,
        json!({
            "messages": [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Weather in Paris\nand Rome?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [chat_weather_tool()],
        }),
    )
    .await;
    assert_eq!(
        ids, chat,
        "Responses items render exactly like the chat messages"
    );

    // A string input is one user message; json_object adds the chat path's instruction.
    let plain = prompt_ids(&server, json!({"input": "Hello"})).await;
    let chat_plain = chat_prompt_ids(
        &server,
        json!({"messages": [{"role": "user", "content": "Hello"}]}),
    )
    .await;
    assert_eq!(plain, chat_plain);
    let json_mode = prompt_ids(
        &server,
        json!({"input": "Hello", "text": {"format": {"type": "json_object"}}}),
    )
    .await;
    let chat_json = chat_prompt_ids(
        &server,
        json!({"messages": [{"role": "user", "content": "Hello"}], "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(json_mode, chat_json);

    // A history with calls and outputs generates (a short one: the fixture's context is 512).
    let short = json!({"input": [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ], "max_output_tokens": 4, "temperature": 0});
    let short_ids = prompt_ids(&server, short.clone()).await;
    let response = created(&server, short).await;
    assert_eq!(response["usage"]["input_tokens"], short_ids.len());
    assert_eq!(response["tools"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn previous_response_id_renders_the_full_resend() {
    let server = Server::start(None, &[]).await;
    let settings = json!({"instructions": "Be brief.", "max_output_tokens": 12, "temperature": 0});
    let with = |extra: Value| {
        let mut body = settings.clone();
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let first = created(&server, with(json!({"input": "Hello"}))).await;
    assert_eq!(first["object"], "response");
    assert!(first["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(first["store"], true);
    assert_eq!(first["instructions"], "Be brief.");
    let status = first["status"].as_str().unwrap();
    assert!(status == "completed" || status == "incomplete", "{first}");
    if status == "incomplete" {
        assert_eq!(first["incomplete_details"]["reason"], "max_output_tokens");
    }

    let next = json!({"role": "user", "content": "And then?"});
    let continued = with(json!({"previous_response_id": first["id"], "input": [next]}));
    let mut full_input = vec![json!({"role": "user", "content": "Hello"})];
    full_input.extend(first["output"].as_array().unwrap().iter().cloned());
    full_input.push(next.clone());
    let resent = with(json!({"input": full_input}));

    let continued_ids = prompt_ids(&server, continued.clone()).await;
    assert_eq!(continued_ids, prompt_ids(&server, resent.clone()).await);
    let chat_ids = chat_prompt_ids(
        &server,
        json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            assistant_message(&first),
            next,
        ]}),
    )
    .await;
    assert_eq!(
        continued_ids, chat_ids,
        "the stored output re-renders as the assistant turn"
    );

    // Generating both ways: the same prompt, so (greedy) the same answer and usage.
    let second = created(&server, continued).await;
    let second_resent = created(&server, resent).await;
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_eq!(second["usage"]["input_tokens"], continued_ids.len());
    assert_eq!(
        second["usage"]["input_tokens"],
        second_resent["usage"]["input_tokens"]
    );
    assert_eq!(output_text(&second), output_text(&second_resent));
    let usage = &second["usage"];
    // The continued turn starts with the first turn's prompt, whose complete blocks the prefix
    // cache holds (and maybe answer blocks too).
    let first_prompt = first["usage"]["input_tokens"].as_u64().unwrap();
    let cached = usage["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached.is_multiple_of(32)
            && cached >= first_prompt / 32 * 32
            && cached < continued_ids.len() as u64,
        "cached {cached} after a first prompt of {first_prompt}"
    );
    assert_eq!(
        usage["input_tokens_details"]["cached_tokens"], second["minnow"]["cached_tokens"],
        "cached tokens are the engine's count"
    );
    assert_eq!(
        usage["input_tokens_details"]["cached_tokens"],
        second["timings"]["cache_n"]
    );
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );

    // A third turn chains through both stored responses; instructions are per request.
    let third_input = json!({"role": "user", "content": "Bye"});
    let chained = prompt_ids(
        &server,
        json!({"previous_response_id": second["id"], "input": [third_input], "instructions": "Be kind."}),
    )
    .await;
    let chat_chained = chat_prompt_ids(
        &server,
        json!({"messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hello"},
            assistant_message(&first),
            {"role": "user", "content": "And then?"},
            assistant_message(&second),
            third_input,
        ]}),
    )
    .await;
    assert_eq!(chained, chat_chained);
}

#[tokio::test(flavor = "multi_thread")]
async fn function_calls_and_their_outputs() {
    let server = Server::start(None, &[]).await;
    // A random-weight model writes a call only when steered; whatever it writes must be
    // well-formed, and streaming must agree with the plain answer.
    let request = |stream: bool| {
        json!({
            "input": "Weather in Paris?",
            "tools": [flat_weather_tool()],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 64,
            "temperature": 0,
            "stream": stream,
        })
    };
    let plain = created(&server, request(false)).await;
    assert_eq!(
        plain["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    let calls: Vec<Value> = plain["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .cloned()
        .collect();
    for call in &calls {
        assert_eq!(call["name"], "get_weather");
        assert!(call["id"].as_str().unwrap().starts_with("fc_"));
        assert!(call["call_id"].as_str().unwrap().len() > 3);
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(arguments.is_object());
    }
    let events = read_named_events(post(&server, "/v1/responses", request(true)).await).await;
    let last = &events.last().unwrap().1["response"];
    let streamed_calls: Vec<Value> = last["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .cloned()
        .collect();
    assert_eq!(streamed_calls.len(), calls.len());
    for (streamed, call) in streamed_calls.iter().zip(&calls) {
        assert_eq!(streamed["name"], call["name"]);
        assert_eq!(streamed["arguments"], call["arguments"]);
        assert_eq!(streamed["call_id"], call["call_id"]);
    }
    assert_eq!(output_text(last), output_text(&plain));
    // Each streamed call: its item added, its arguments streamed and done, the item done.
    for (n, (_, event)) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n);
        if !event["type"].as_str().unwrap().starts_with("minnow.") {
            let _: ResponseStreamEvent = typed(event);
        }
    }
    for call in &streamed_calls {
        let of_call = |name: &str| -> Vec<usize> {
            events
                .iter()
                .enumerate()
                .filter(|(_, (n, e))| {
                    n == name && (e["item_id"] == call["id"] || e["item"]["id"] == call["id"])
                })
                .map(|(i, _)| i)
                .collect()
        };
        let added = of_call("response.output_item.added");
        let deltas = of_call("response.function_call_arguments.delta");
        let done = of_call("response.function_call_arguments.done");
        let item_done = of_call("response.output_item.done");
        assert_eq!((added.len(), done.len(), item_done.len()), (1, 1, 1));
        assert!(deltas.iter().all(|&d| added[0] < d && d < done[0]));
        assert!(done[0] < item_done[0]);
        let streamed_arguments: String = deltas
            .iter()
            .map(|&d| events[d].1["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(streamed_arguments, call["arguments"].as_str().unwrap());
        assert_eq!(events[done[0]].1["arguments"], call["arguments"]);
        assert_eq!(events[item_done[0]].1["item"], *call);
    }

    // Answer each call (or, without one, a call from the history) and continue.
    let (previous, call_ids) = if calls.is_empty() {
        let history = created(
            &server,
            json!({"input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "call_h", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            ], "tools": [flat_weather_tool()], "max_output_tokens": 4}),
        )
        .await;
        (history, vec!["call_h".to_string()])
    } else {
        let ids = calls
            .iter()
            .map(|c| c["call_id"].as_str().unwrap().to_string())
            .collect();
        (plain.clone(), ids)
    };
    let outputs: Vec<Value> = call_ids
        .iter()
        .map(|id| json!({"type": "function_call_output", "call_id": id, "output": "18C"}))
        .collect();
    // Tools are per request; leaving them out keeps the prompt within the fixture's context.
    let continued = json!({
        "previous_response_id": previous["id"],
        "input": outputs,
        "max_output_tokens": 8,
    });
    let continued_ids = prompt_ids(&server, continued.clone()).await;
    let response = created(&server, continued).await;
    assert_eq!(response["usage"]["input_tokens"], continued_ids.len());

    // An output that answers no call is refused, naming the item.
    let (status, body) = create(
        &server,
        json!({"previous_response_id": previous["id"],
               "input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}),
    )
    .await;
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["param"], "input[0].call_id");
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_event_sequence() {
    let server = Server::start(None, &["--keep-alive", "0.05"]).await;
    let body = |stream: bool| {
        json!({"input": "Hello", "max_output_tokens": 40, "temperature": 0, "stream": stream,
               "return_progress": stream, "metadata": {"run": "7"}})
    };
    let plain = created(&server, body(false)).await;
    let events = read_named_events(post(&server, "/v1/responses", body(true)).await).await;

    for (n, (_, event)) in events.iter().enumerate() {
        assert_eq!(
            event["sequence_number"], n,
            "sequence numbers count from 0: {event}"
        );
        if !event["type"].as_str().unwrap().starts_with("minnow.") {
            let _: ResponseStreamEvent = typed(event);
        }
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[0], "response.created");
    assert_eq!(names[1], "response.in_progress");
    let created_event = &events[0].1["response"];
    assert_eq!(created_event["status"], "in_progress");
    assert_eq!(created_event["output"], json!([]));
    assert!(created_event["usage"].is_null());
    assert_eq!(created_event["metadata"], json!({"run": "7"}));
    let id = created_event["id"].as_str().unwrap();

    // Progress (asked for) comes before any output.
    let progress: Vec<usize> = (0..names.len())
        .filter(|&i| names[i] == "minnow.prompt_progress")
        .collect();
    assert!(!progress.is_empty(), "return_progress reports the prefill");
    let first_output = names
        .iter()
        .position(|n| *n == "response.output_item.added")
        .unwrap();
    assert!(progress.iter().all(|&i| i < first_output));
    for &i in &progress {
        let p = &events[i].1;
        assert!(p["processed"].as_u64().unwrap() <= p["total"].as_u64().unwrap());
    }

    // Then one message item: added, part added, text deltas, text done, part done, item done.
    let rest: Vec<&str> = names[first_output..].to_vec();
    let deltas = rest
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    let mut expected = vec!["response.output_item.added", "response.content_part.added"];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    let final_name = if plain["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        final_name,
    ]);
    assert_eq!(rest, expected);

    let by_name = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v)
            .collect()
    };
    let added = by_name("response.output_item.added")[0];
    let item_id = added["item"]["id"].as_str().unwrap();
    assert!(item_id.starts_with("msg_"));
    assert_eq!(added["item"]["status"], "in_progress");
    assert_eq!(added["output_index"], 0);
    let mut text = String::new();
    for delta in by_name("response.output_text.delta") {
        assert_eq!(delta["item_id"], item_id);
        assert_eq!(
            (
                delta["output_index"].as_u64(),
                delta["content_index"].as_u64()
            ),
            (Some(0), Some(0))
        );
        text.push_str(delta["delta"].as_str().unwrap());
    }
    assert_eq!(
        by_name("response.output_text.done")[0]["text"],
        text.as_str()
    );
    assert_eq!(
        by_name("response.content_part.done")[0]["part"]["text"],
        text.as_str()
    );
    let done_item = &by_name("response.output_item.done")[0]["item"];
    assert_eq!(done_item["id"], item_id);
    assert_eq!(done_item["content"][0]["text"], text.as_str());

    let last = &events.last().unwrap().1["response"];
    assert_eq!(last["id"], id);
    assert_eq!(last["status"], plain["status"]);
    assert_eq!(
        output_text(last),
        text,
        "the final object holds the streamed text"
    );
    // Greedy decoding: streaming changes nothing.
    assert_eq!(text, output_text(&plain));
    assert_eq!(
        last["usage"]["input_tokens"],
        plain["usage"]["input_tokens"]
    );
    assert_eq!(
        last["usage"]["output_tokens"],
        plain["usage"]["output_tokens"]
    );
    // The streamed response is stored like any other.
    let (status, stored) = get_json(&server, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(&stored, last);
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_and_unknown_ids() {
    let server = Server::start(None, &[]).await;
    let (status, body) = create(
        &server,
        json!({"input": "x", "tools": [flat_weather_tool(), {"type": "web_search"}]}),
    )
    .await;
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["param"], "tools[1].type");
    assert!(
        error["message"].as_str().unwrap().contains("'web_search'"),
        "{error}"
    );

    let (status, body) = create(
        &server,
        json!({"input": "x", "previous_response_id": "resp_nope"}),
    )
    .await;
    let error = assert_error(status, &body, 404, "invalid_request_error");
    assert_eq!(error["param"], "previous_response_id");
    assert_eq!(error["code"], "previous_response_not_found");

    let first = created(&server, json!({"input": "Hello", "max_output_tokens": 4})).await;
    let mut whole = vec![json!({"role": "user", "content": "Hello"})];
    whole.extend(first["output"].as_array().unwrap().iter().cloned());
    whole.push(json!({"role": "user", "content": "More"}));
    let (status, body) = create(
        &server,
        json!({"previous_response_id": first["id"], "input": whole}),
    )
    .await;
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["param"], "input");
    let (status, body) = create(
        &server,
        json!({"previous_response_id": first["id"], "input": [first["output"][0], {"role": "user", "content": "More"}]}),
    )
    .await;
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["param"], "input[0].id");

    for (body, param) in [
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "store": "yes"}), "store"),
        (json!({}), "input"),
    ] {
        let (status, response) = create(&server, body).await;
        let error = assert_error(status, &response, 400, "invalid_request_error");
        assert_eq!(error["param"], param);
    }
    let (status, response) = create(&server, json!({"input": "x", "model": "other"})).await;
    assert_error(status, &response, 404, "not_found_error");

    for path in ["/v1/responses/resp_nope", "/responses/resp_nope"] {
        let (status, body) = get_json(&server, path).await;
        let error = assert_error(status, &body, 404, "invalid_request_error");
        assert_eq!(error["code"], "response_not_found");
    }
    let deleted = reqwest::Client::new()
        .delete(server.url("/v1/responses/resp_nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 404);
    let put = reqwest::Client::new()
        .put(server.url("/v1/responses/resp_nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 405);
    assert_eq!(put.headers()["allow"], "GET, HEAD, DELETE");
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_responses_get_delete_and_eviction() {
    let server = Server::start(None, &["--responses-max", "2"]).await;
    let small = |text: &str| json!({"input": text, "max_output_tokens": 2});
    let r1 = created(&server, small("one")).await;
    let r2 = created(&server, small("two")).await;
    let get = |id: &Value| {
        let path = format!("/v1/responses/{}", id.as_str().unwrap());
        let server = &server;
        async move { get_json(server, &path).await }
    };
    let (status, stored) = get(&r1["id"]).await;
    assert_eq!(status, 200);
    assert_eq!(stored, r1, "GET returns the created object");
    let _: TypedResponse = typed(&stored);

    // store: false is answered but never kept.
    let unstored = created(
        &server,
        json!({"input": "x", "max_output_tokens": 2, "store": false}),
    )
    .await;
    assert_eq!(unstored["store"], false);
    assert_eq!(get(&unstored["id"]).await.0, 404);
    let (status, _) = create(
        &server,
        json!({"input": "y", "previous_response_id": unstored["id"]}),
    )
    .await;
    assert_eq!(status, 404);

    // DELETE removes it.
    let response = reqwest::Client::new()
        .delete(server.url(&format!("/v1/responses/{}", r2["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let deleted: Value = response.json().await.unwrap();
    assert_eq!(
        deleted,
        json!({"id": r2["id"], "object": "response", "deleted": true})
    );
    assert_eq!(get(&r2["id"]).await.0, 404);

    // Kept: r1. Two more: r1, the least recently used, is evicted.
    let r3 = created(&server, small("three")).await;
    let r4 = created(&server, small("four")).await;
    assert_eq!(get(&r1["id"]).await.0, 404, "evicted at --responses-max 2");
    let (status, body) = create(
        &server,
        json!({"input": "again", "previous_response_id": r1["id"]}),
    )
    .await;
    let error = assert_error(status, &body, 404, "invalid_request_error");
    assert_eq!(error["param"], "previous_response_id");
    // Reading r3 makes r4 the least recently used.
    assert_eq!(get(&r3["id"]).await.0, 200);
    let r5 = created(
        &server,
        json!({"input": "five", "max_output_tokens": 2, "previous_response_id": r3["id"]}),
    )
    .await;
    assert_eq!(get(&r4["id"]).await.0, 404);
    assert_eq!(get(&r3["id"]).await.0, 200);
    assert_eq!(get(&r5["id"]).await.0, 200);
}

/// The server's field policy covers the Responses API: a field of no schema, at the top or inside
/// an input item or a tool, is ignored and listed in `x-minnow-ignored-fields` (plain, streamed
/// and counted requests alike), and `--strict-fields` makes it a 400 naming it.
#[tokio::test(flavor = "multi_thread")]
async fn unknown_fields_are_ignored_and_listed_unless_strict() {
    let body = |extra: Value| {
        let mut body = json!({
            "input": [{"role": "user", "content": "Hello", "client_note": "n"}],
            "tools": [flat_weather_tool()],
            "max_output_tokens": 4,
            "future_option": 1,
        });
        body["tools"][0]["x_cache"] = json!(true);
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let listed = "future_option, input[0].client_note, tools[0].x_cache";
    let server = Server::start(None, &[]).await;
    let known = post(
        &server,
        "/v1/responses",
        json!({"input": "Hello", "max_output_tokens": 4}),
    )
    .await;
    assert_eq!(known.status(), 200);
    assert!(known.headers().get("x-minnow-ignored-fields").is_none());
    for (path, extra) in [
        ("/v1/responses", json!({})),
        ("/v1/responses", json!({"stream": true})),
        ("/v1/responses/input_tokens", json!({})),
    ] {
        let response = post(&server, path, body(extra.clone())).await;
        assert_eq!(response.status(), 200, "{path} {extra}");
        let header = response
            .headers()
            .get("x-minnow-ignored-fields")
            .unwrap_or_else(|| panic!("{path} {extra}: no x-minnow-ignored-fields"))
            .to_str()
            .unwrap()
            .to_string();
        let mut names: Vec<&str> = header.split(", ").collect();
        names.sort_unstable();
        assert_eq!(names.join(", "), listed, "{path} {extra}");
        // The answer itself is whole.
        response.bytes().await.unwrap();
    }

    let strict = Server::start(None, &["--strict-fields"]).await;
    for (extra, param) in [
        (json!({"future_option": 1}), "future_option"),
        (
            json!({"input": [{"role": "user", "content": "Hello", "client_note": "n"}]}),
            "input[0].client_note",
        ),
    ] {
        let mut request = json!({"input": "Hello", "max_output_tokens": 4});
        for (key, value) in extra.as_object().unwrap() {
            request[key] = value.clone();
        }
        for path in ["/v1/responses", "/v1/responses/input_tokens"] {
            let (status, response) = post_json(&strict, path, request.clone()).await;
            let error = assert_error(status, &response, 400, "invalid_request_error");
            assert_eq!(error["param"], param, "{path}");
        }
    }
    let (status, response) =
        create(&strict, json!({"input": "Hello", "max_output_tokens": 4})).await;
    assert_eq!(status, 200, "{response}");
}
