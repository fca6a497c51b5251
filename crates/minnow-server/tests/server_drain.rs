//! One replica as a router and an orchestrator see it (docs/deploy.md): readiness, liveness and
//! load while it works, and the drain after SIGTERM: new requests get a 503 with `Retry-After`
//! while the streams in flight finish and the process exits 0; past `--shutdown-grace`, a
//! stream still running ends with an error event instead of a silent cut.

#[path = "server_harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::{assert_error, get_json, parse_sse, post, Server, Sse};
use serde_json::{json, Value};

/// A stream the tiny model takes a while over (15-65 ms a block on the development host, 16
/// blocks with `max_tokens: -1`): nothing clears the threshold, so every block runs its whole
/// step schedule.
fn slow_stream(max_tokens: i64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "stream": true,
        "max_tokens": max_tokens,
        "threshold": 1.0,
        "editing_threshold": 1.0,
        "steps": 32,
        "max_post_steps": 64,
    })
}

/// Reads a stream until its first content block has arrived (the request is decoding).
async fn first_block(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> String {
    let mut seen = String::new();
    while !seen.contains("\"minnow\"") {
        let chunk = stream.next().await.expect("stream ended early").unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    seen
}

async fn rest_of(
    mut stream: impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    mut text: String,
) -> String {
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.expect("stream broken")).unwrap());
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_and_load_then_a_drain_that_finishes_streams() {
    let mut server = Server::start(None, &["--shutdown-grace", "20"]).await;
    let (status, live) = get_json(&server, "/livez").await;
    assert_eq!((status, live["phase"].as_str()), (200, Some("ready")));
    let (status, idle) = get_json(&server, "/get_load").await;
    assert_eq!(status, 200);
    assert_eq!(idle[0]["num_reqs"], 0);
    assert_eq!(idle[0]["minnow"]["kv_pages_used"], 0);
    let (status, info) = get_json(&server, "/get_server_info").await;
    assert_eq!(status, 200);
    assert!(info["max_total_num_tokens"].as_u64().unwrap() > 0, "{info}");
    let (status, model) = get_json(&server, "/model_info").await;
    assert_eq!(status, 200);
    assert_eq!(model["is_generation"], true);

    let response = post(&server, "/v1/chat/completions", slow_stream(-1)).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let seen = first_block(&mut stream).await;

    // Load, from the engine's state: one request decoding, its pages held.
    let (_, busy) = get_json(&server, "/get_load").await;
    let entry = &busy[0];
    assert_eq!(entry["num_reqs"], 1, "{busy}");
    assert_eq!(entry["minnow"]["requests_in_flight"], 1, "{busy}");
    let pages = entry["minnow"]["kv_pages_used"].as_u64().unwrap();
    assert!(pages >= 1, "{busy}");
    assert_eq!(entry["num_tokens"].as_u64(), Some(pages * 32), "{busy}");

    server.signal("TERM");
    // Draining: not ready (and why), still alive, new work refused with a retryable 503.
    let deadline = Instant::now() + Duration::from_secs(10);
    let health = loop {
        let (status, body) = get_json(&server, "/health").await;
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "/health stayed {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let error = assert_error(503, &health, 503, "unavailable_error");
    assert_eq!(error["code"], "server_draining", "{health}");
    let (status, live) = get_json(&server, "/livez").await;
    assert_eq!((status, live["phase"].as_str()), (200, Some("draining")));
    let refused = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "server_draining", "{body}");
    assert_eq!(server.metric("minnow_draining").await, 1.0);
    assert_eq!(server.metric("minnow_ready").await, 0.0);

    // The stream admitted before the signal runs to its end.
    let text = rest_of(stream, seen).await;
    let events = parse_sse(&text);
    assert_eq!(events.last(), Some(&Sse::Done), "{text}");
    assert!(
        !text.contains("\"error\""),
        "the stream finished normally: {text}"
    );
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("exits once drained");
    assert!(status.success(), "{status:?}");
    assert!(
        std::net::TcpStream::connect(&server.addr).is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_still_running_when_the_grace_ends_gets_an_error_event() {
    // One slot: the first stream decodes, three more wait behind it, so the last cannot finish
    // within the grace however fast the host is.
    let mut server = Server::start(None, &["--parallel", "1", "--shutdown-grace", "0.5"]).await;
    let response = post(&server, "/v1/chat/completions", slow_stream(-1)).await;
    assert_eq!(response.status(), 200);
    let mut first = response.bytes_stream();
    let seen = first_block(&mut first).await;
    let mut streams = vec![tokio::spawn(rest_of(first, seen))];
    for _ in 0..3 {
        let response = post(&server, "/v1/chat/completions", slow_stream(-1)).await;
        assert_eq!(response.status(), 200);
        streams.push(tokio::spawn(rest_of(
            response.bytes_stream(),
            String::new(),
        )));
    }
    server.signal("TERM");
    let mut texts = Vec::new();
    for stream in streams {
        texts.push(stream.await.unwrap());
    }
    for text in &texts {
        assert_eq!(parse_sse(text).last(), Some(&Sse::Done), "{text}");
    }
    let last = texts.last().unwrap();
    let error = parse_sse(last)
        .iter()
        .find_map(|e| match e {
            Sse::Data(data) if data.get("error").is_some() => Some(data["error"].clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error event in {last}"));
    assert_eq!(error["code"], "shutdown_grace_over", "{error}");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .expect("exits after the grace");
    assert!(!status.success(), "requests were cut: {status:?}");
}
