//! Every error status of the API over real TCP: OpenAI-shaped bodies naming the field at fault,
//! API-key enforcement, and `--ui-dir` path traversal.

#[path = "server_harness.rs"]
mod harness;

use harness::*;
use serde_json::{json, Value};

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_requests_are_400_naming_the_field() {
    let server = Server::start(None, &[]).await;
    let cases = [
        (json!({"n": 2}), "n"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"logit_bias": {"12": 5}}), "logit_bias"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"frequency_penalty": -1}), "frequency_penalty"),
        (json!({"repeat_penalty": 1.3}), "repeat_penalty"),
        (json!({"temperature": "warm"}), "temperature"),
        (json!({"temperature": 9}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"threshold": 2}), "threshold"),
        (json!({"algorithm": "beam"}), "algorithm"),
        (json!({"stop": 5}), "stop"),
        (
            json!({"stream_options": {"include_usage": "yes"}}),
            "stream_options.include_usage",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}),
            "messages[0].tool_call_id",
        ),
        (json!({"messages": "hi"}), "messages"),
    ];
    for (extra, param) in cases {
        let (status, body) =
            post_json(&server, "/v1/chat/completions", chat_body(extra.clone())).await;
        let error = assert_error(status, &body, 400, "invalid_request_error");
        assert_eq!(error["param"], param, "request extra {extra}: {body}");
    }
    // Completions-only fields.
    for (extra, param) in [
        (json!({"prompt": "x", "echo": true}), "echo"),
        (json!({"prompt": "x", "suffix": "y"}), "suffix"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": [1, -2]}), "prompt"),
        (json!({"prompt": [100000]}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
    ] {
        let (status, body) = post_json(&server, "/v1/completions", extra.clone()).await;
        let error = assert_error(status, &body, 400, "invalid_request_error");
        assert_eq!(error["param"], param, "request {extra}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_bodies_are_400() {
    let server = Server::start(None, &[]).await;
    let client = reqwest::Client::new();
    for body in ["{not json", "[1,2]", "", "\"text\"", "{\"messages\": [}"] {
        let response = client
            .post(server.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let value: Value = response.json().await.unwrap();
        assert_error(status, &value, 400, "invalid_request_error");
    }
    // Invalid UTF-8 must not take a handler down either.
    let response = client
        .post(server.url("/v1/completions"))
        .body(vec![0xff, 0xfe, b'{'])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    // The server is still fine.
    let (status, _) = get_json(&server, "/health").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn special_tokens_in_prompts_are_refused() {
    let server = Server::start(None, &[]).await;
    // 482 is the fixture's <|mask|>, 486/487 its <|delete|>/<|split|>.
    for ids in [json!([100, 482, 101]), json!([100, 486]), json!([100, 487])] {
        let (status, body) = post_json(
            &server,
            "/v1/completions",
            json!({"prompt": ids, "max_tokens": 4}),
        )
        .await;
        assert_error(status, &body, 400, "invalid_request_error");
    }
    // A raw completion prompt's special-token strings are tokens, so a typed mask is refused...
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "a <|mask|> b", "max_tokens": 4}),
    )
    .await;
    assert_error(status, &body, 400, "invalid_request_error");
    // ...while in chat content it is plain text (docs/chat-format.md §6) and harmless.
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        chat_body(json!({"messages": [{"role": "user", "content": "a <|mask|> b"}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn context_overflow_reports_counts() {
    let server = Server::start(None, &[]).await;
    let long_prompt = "the river runs ".repeat(400);
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": long_prompt, "max_tokens": 8}),
    )
    .await;
    let error = assert_error(status, &body, 400, "exceed_context_size_error");
    assert_eq!(error["n_ctx"], 512, "{body}");
    assert!(error["n_prompt_tokens"].as_u64().unwrap() > 512, "{body}");
    // A short prompt asking for more output than fits is refused the same way.
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 100000}),
    )
    .await;
    let error = assert_error(status, &body, 400, "exceed_context_size_error");
    assert_eq!(error["n_ctx"], 512);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_routes_methods_and_models() {
    let server = Server::start(None, &[]).await;
    let (status, body) = get_json(&server, "/v1/nothing").await;
    assert_error(status, &body, 404, "not_found_error");

    let response = reqwest::get(server.url("/v1/chat/completions"))
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let value: Value = response.json().await.unwrap();
    assert_error(405, &value, 405, "invalid_request_error");
    let (status, body) = post_json(&server, "/v1/models", json!({})).await;
    assert_error(status, &body, 405, "invalid_request_error");

    let (status, body) = get_json(&server, "/v1/models/not-a-model").await;
    let error = assert_error(status, &body, 404, "not_found_error");
    assert_eq!(error["code"], "model_not_found");
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        chat_body(json!({"model": "gpt-4o"})),
    )
    .await;
    let error = assert_error(status, &body, 404, "not_found_error");
    assert_eq!(error["param"], "model");
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_are_413() {
    let server = Server::start(None, &["--body-limit", "4096"]).await;
    let big = json!({"prompt": "x".repeat(10_000)});
    let (status, body) = post_json(&server, "/v1/completions", big).await;
    let error = assert_error(status, &body, 413, "invalid_request_error");
    assert_eq!(error["code"], "request_too_large");
    // Chunked upload without a Content-Length is cut off at the limit too.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let response = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await;
    if let Ok(response) = response {
        assert_eq!(response.status(), 413);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_body_limit_is_8_mib() {
    let server = Server::start(None, &[]).await;
    let big = json!({"prompt": "x".repeat(9 * 1024 * 1024)});
    let (status, body) = post_json(&server, "/v1/completions", big).await;
    assert_error(status, &body, 413, "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread")]
async fn api_key_is_enforced() {
    let server = Server::start(None, &["--api-key", "sekrit"]).await;
    let client = reqwest::Client::new();
    // Health stays open (the harness already polled it without a key).
    assert_eq!(
        client
            .get(server.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for path in ["/v1/models", "/props", "/metrics"] {
        let response = client.get(server.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        let error = assert_error(status, &body, 401, "authentication_error");
        assert_eq!(error["code"], "invalid_api_key");
        let wrong = client
            .get(server.url(path))
            .bearer_auth("sekri")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401);
        let right = client
            .get(server.url(path))
            .bearer_auth("sekrit")
            .send()
            .await
            .unwrap();
        assert_eq!(right.status(), 200, "{path}");
    }
    let response = client
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let response = client
        .post(server.url("/v1/chat/completions"))
        .bearer_auth("sekrit")
        .json(&chat_body(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn ui_dir_serves_files_and_refuses_traversal() {
    let root = tempfile::tempdir().unwrap();
    let ui = root.path().join("ui");
    std::fs::create_dir_all(ui.join("assets")).unwrap();
    std::fs::write(ui.join("index.html"), "<html>minnow ui</html>").unwrap();
    std::fs::write(ui.join("assets/app.js"), "console.log(1)").unwrap();
    std::fs::write(root.path().join("secret.txt"), "TOP SECRET").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(root.path().join("secret.txt"), ui.join("link.txt")).unwrap();

    let ui_arg = ui.to_str().unwrap().to_string();
    let server = Server::start(None, &["--ui-dir", &ui_arg, "--api-key", "k"]).await;
    let text = |path: &str| {
        let url = server.url(path);
        async move {
            let response = reqwest::get(url).await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // The UI is public even with a key (the browser loads it before the user types the key).
    assert_eq!(text("/").await, (200, "<html>minnow ui</html>".to_string()));
    assert_eq!(
        text("/assets/app.js").await,
        (200, "console.log(1)".to_string())
    );
    assert_eq!(
        text("/c/some-conversation").await.0,
        200,
        "client routes fall back to index.html"
    );
    assert_eq!(text("/assets/missing.js").await.0, 404);
    assert_eq!(
        text("/link.txt").await.0,
        404,
        "a symlink out of the directory is refused"
    );

    for attack in [
        "/../secret.txt",
        "/assets/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/assets/%2e%2e/%2e%2e/secret.txt",
        "/..%2fsecret.txt",
        "/..%5csecret.txt",
        "/%2e%2e%2f%2e%2e%2fsecret.txt",
    ] {
        let (status, response) = server.raw(&format!(
            "GET {attack} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        ));
        assert!(!response.contains("TOP SECRET"), "{attack} leaked the file");
        assert!(status == 404 || status == 400, "{attack}: {status}");
    }
    // API routes still need the key.
    assert_eq!(
        reqwest::get(server.url("/v1/models"))
            .await
            .unwrap()
            .status(),
        401
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_never_takes_the_server_down() {
    let server = Server::start(None, &[]).await;
    let deep = format!("{{\"messages\": {}{}}}", "[".repeat(5000), "]".repeat(5000));
    let raw_requests = [
        "GARBAGE\r\n\r\n".to_string(),
        "GET / HTTP/9.9\r\n\r\n".to_string(),
        format!("GET /{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "a".repeat(100_000)),
        format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n", "b".repeat(200_000)),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n".to_string(),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{\"a\"".to_string(),
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\nConnection: close\r\n\r\n".to_string(),
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{deep}", deep.len()),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnull".to_string(),
        "GET /v1/models/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(),
    ];
    for request in &raw_requests {
        let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        use std::io::{Read, Write};
        let _ = stream.write_all(request.as_bytes());
        // A truncated body makes the server wait for the rest: hang up like a real client would.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response);
        if let Some(status) = text.split_whitespace().nth(1) {
            assert!(
                !status.starts_with('5'),
                "{:?} -> {text}",
                &request[..request.len().min(60)]
            );
        }
    }
    // Deep nesting through the normal path: a 400, not a stack overflow.
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .body(deep)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let (status, _) = get_json(&server, "/health").await;
    assert_eq!(status, 200, "still serving");
    server.assert_generates().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn json_object_format_instructs_the_model() {
    let server = Server::start(None, &[]).await;
    let (status, body) = post_json(
        &server,
        "/apply-template",
        json!({"messages": [{"role": "user", "content": "List two colours."}], "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["prompt"].as_str().unwrap().starts_with(
            "<role>SYSTEM</role>Respond with a single valid JSON object and nothing else.\n"
        ),
        "{body}"
    );
}
