//! Serving many users over real TCP: 64 concurrent clients batched together get exactly the
//! answers each gets alone; a second chat turn reuses the first turn's blocks from the prefix
//! cache (and says so in usage, timings and /metrics); a K/V budget too small for a request
//! answers 503 and the server keeps serving.

#[path = "server_harness.rs"]
mod harness;

use harness::*;
use serde_json::{json, Value};
use std::time::Duration;

fn request(i: usize) -> (&'static str, Value) {
    let max_tokens = 8 + (i * 7) % 60;
    if i.is_multiple_of(2) {
        (
            "/v1/chat/completions",
            json!({
                "messages": [{"role": "user", "content": format!("Question number {i}: why?")}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": i.is_multiple_of(4),
            }),
        )
    } else {
        (
            "/v1/completions",
            json!({
                "prompt": "A shared opening line for every completion. ".repeat(1 + i % 3) + &format!("Prompt {i}"),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": i % 4 == 1,
            }),
        )
    }
}

/// The answer text of a plain or streamed response.
async fn answer(server: &Server, path: &str, body: Value) -> String {
    let streamed = body["stream"].as_bool().unwrap_or(false);
    let response = post(server, path, body).await;
    if streamed {
        let mut text = String::new();
        for chunk in data_events(&read_sse(response).await) {
            let choice = &chunk["choices"][0];
            if let Some(t) = choice["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = choice["text"].as_str() {
                text.push_str(t);
            }
        }
        text
    } else {
        assert_eq!(response.status(), 200);
        let value: Value = response.json().await.unwrap();
        let choice = &value["choices"][0];
        choice["message"]["content"]
            .as_str()
            .or(choice["text"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_concurrent_clients_get_their_answers_alone() {
    let alone = Server::start(None, &["--parallel", "1"]).await;
    let mut expected = Vec::new();
    for i in 0..64 {
        let (path, mut body) = request(i);
        body["cache_prompt"] = json!(false);
        expected.push(answer(&alone, path, body).await);
    }
    drop(alone);

    let server = Server::start(None, &["--parallel", "16", "--queue-capacity", "64"]).await;
    let server = std::sync::Arc::new(server);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let server = server.clone();
            tokio::spawn(async move {
                let (path, body) = request(i);
                answer(&server, path, body).await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        assert_eq!(
            task.await.unwrap(),
            expected[i],
            "request {i} differs when batched"
        );
    }
    // Forwards really held several sequences, and the shared openings hit the cache.
    let batched = server.metric("minnow_forward_batch_size_count").await
        - server
            .metric("minnow_forward_batch_size_bucket{le=\"1\"}")
            .await;
    assert!(batched > 0.0, "no forward held two sequences");
    assert!(server.metric("minnow_prefix_cache_hit_tokens_total").await > 0.0);
    // Every page is free once the engine has stepped past the last answer.
    server
        .wait_for_metric("minnow_kv_pages_used", 0.0, Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_turn_reuses_the_first_turns_blocks() {
    let server = Server::start(None, &["--parallel", "2"]).await;
    let system = "You are a careful assistant. ".repeat(12);
    let first = json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Say something."},
        ],
        "max_tokens": 40,
        "temperature": 0,
    });
    let (status, turn1) = post_json(&server, "/v1/chat/completions", first).await;
    assert_eq!(status, 200, "{turn1}");
    assert_eq!(turn1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let reply = turn1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let second = json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Say something."},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And more?"},
        ],
        "max_tokens": 20,
        "temperature": 0,
    });
    let (status, turn2) = post_json(&server, "/v1/chat/completions", second.clone()).await;
    assert_eq!(status, 200, "{turn2}");
    let cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = turn2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= 32 && cached.is_multiple_of(32) && cached < prompt,
        "cached {cached} of {prompt}"
    );
    assert_eq!(turn2["timings"]["cache_n"].as_u64(), Some(cached));
    assert!(server.metric("minnow_prefix_cache_hit_tokens_total").await >= cached as f64);

    // The same turn without the cache gives the same answer.
    let mut cold = second;
    cold["cache_prompt"] = json!(false);
    let (_, turn2_cold) = post_json(&server, "/v1/chat/completions", cold).await;
    assert_eq!(
        turn2_cold["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert_eq!(
        turn2_cold["choices"][0]["message"]["content"],
        turn2["choices"][0]["message"]["content"]
    );

    // Another tenant (a different cache_salt) shares nothing.
    let (_, salted) = post_json(
        &server,
        "/v1/chat/completions",
        json!({
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Say something."},
            ],
            "max_tokens": 4,
            "cache_salt": "tenant-b",
        }),
    )
    .await;
    assert_eq!(salted["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_the_kv_budget_cannot_hold_is_503_and_the_server_recovers() {
    // 0.05 MiB holds three 16 KiB pages of the tiny model: 96 tokens of canvas.
    let server = Server::start(None, &["--parallel", "2", "--kv-cache-mib", "0.05"]).await;
    assert_eq!(server.metric("minnow_kv_pages_total").await, 3.0);
    let refused = post(
        &server,
        "/v1/completions",
        json!({"prompt": "word ".repeat(60), "max_tokens": 64}),
    )
    .await;
    assert!(
        refused.headers().get("retry-after").is_none(),
        "a request that can never fit is not to be retried"
    );
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.unwrap();
    let error = assert_error(status, &body, 503, "unavailable_error");
    assert_eq!(error["code"], "kv_cache_full");
    assert!(
        error["message"].as_str().unwrap().contains("K/V"),
        "{error}"
    );
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
