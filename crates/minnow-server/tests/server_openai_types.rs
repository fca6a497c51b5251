//! Responses checked against a third-party, strictly typed OpenAI client model (`async-openai`'s
//! types, which fail on missing required fields and unknown enum values): what an OpenAI SDK
//! deserializes must deserialize here too.

#[path = "server_harness.rs"]
mod harness;

use async_openai::types::chat::{
    CreateChatCompletionResponse, CreateChatCompletionStreamResponse, FinishReason,
};
use async_openai::types::completions::CreateCompletionResponse;
use async_openai::types::models::{ListModelResponse, Model};
use harness::*;
use serde_json::{json, Value};

fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{} rejects {value}: {e}", std::any::type_name::<T>()))
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_fit_the_openai_types() {
    let server = Server::start(None, &[]).await;

    let (_, models) = get_json(&server, "/v1/models").await;
    let list: ListModelResponse = typed(&models);
    assert_eq!(list.data[0].id, "llada2-tiny-v21");
    let (_, model) = get_json(&server, "/v1/models/llada2-tiny-v21").await;
    let _: Model = typed(&model);

    let chat = json!({
        "model": "llada2-tiny-v21",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 40,
        "temperature": 0,
    });
    let (status, plain) = post_json(&server, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200);
    let response: CreateChatCompletionResponse = typed(&plain);
    let usage = response.usage.expect("usage");
    assert_eq!(
        usage.total_tokens,
        usage.prompt_tokens + usage.completion_tokens
    );
    assert!(matches!(
        response.choices[0].finish_reason,
        Some(FinishReason::Stop | FinishReason::Length)
    ));

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = read_sse(post(&server, "/v1/chat/completions", streamed).await).await;
    let mut text = String::new();
    let mut usage_seen = false;
    for chunk in data_events(&events) {
        let chunk: CreateChatCompletionStreamResponse = typed(&chunk);
        if let Some(choice) = chunk.choices.first() {
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
        usage_seen |= chunk.usage.is_some();
    }
    assert!(usage_seen);
    assert_eq!(
        text,
        response.choices[0]
            .message
            .content
            .clone()
            .unwrap_or_default()
    );

    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let mut with_tools = chat.clone();
    with_tools["tools"] = tools;
    with_tools["tool_choice"] = json!("required");
    let (status, body) = post_json(&server, "/v1/chat/completions", with_tools.clone()).await;
    assert_eq!(status, 200, "{body}");
    let _: CreateChatCompletionResponse = typed(&body);
    with_tools["stream"] = json!(true);
    let events = read_sse(post(&server, "/v1/chat/completions", with_tools).await).await;
    for chunk in data_events(&events) {
        let _: CreateChatCompletionStreamResponse = typed(&chunk);
    }

    let (status, completion) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "Once upon", "max_tokens": 16}),
    )
    .await;
    assert_eq!(status, 200);
    let _: CreateCompletionResponse = typed(&completion);
    let events = read_sse(
        post(
            &server,
            "/v1/completions",
            json!({"prompt": "Once upon", "max_tokens": 16, "stream": true}),
        )
        .await,
    )
    .await;
    for chunk in data_events(&events) {
        let _: CreateCompletionResponse = typed(&chunk);
    }
}
