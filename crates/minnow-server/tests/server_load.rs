//! Load and lifecycle over real TCP: 32 concurrent clients, a full queue (429), a client that
//! disconnects mid-stream (its slot is freed), 503 while the model loads, and a SIGTERM that
//! drains an in-flight stream before exiting.

#[path = "server_harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::*;
use serde_json::{json, Value};

/// Slow decoding settings for the tiny model: nothing clears the threshold, so every block runs
/// its whole step schedule plus editing rounds, and the output runs to the end of the context.
fn slow_stream() -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "stream": true,
        "max_tokens": -1,
        "threshold": 1.0,
        "editing_threshold": 1.0,
        "steps": 32,
        "max_post_steps": 64,
    })
}

/// Waits until the one request a test hung up on is counted as cancelled and its slot is free.
async fn wait_until_cancelled_and_freed(server: &Server) {
    server
        .wait_for_metric("minnow_busy_slots", 0.0, Duration::from_secs(10))
        .await;
    wait_until_one_cancelled(server).await;
}

/// Waits until one request is counted as cancelled.
async fn wait_until_one_cancelled(server: &Server) {
    server
        .wait_for_metric(
            "minnow_requests_cancelled_total",
            1.0,
            Duration::from_secs(5),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_concurrent_clients_are_all_answered() {
    let server = Server::start(None, &["--parallel", "4", "--queue-capacity", "64"]).await;
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let client = client.clone();
        let url = server.url(if i % 2 == 0 {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        });
        let stream = i % 4 == 1;
        tasks.push(tokio::spawn(async move {
            let body = if i % 2 == 0 {
                json!({"messages": [{"role": "user", "content": format!("Question {i}")}], "max_tokens": 40, "seed": i})
            } else {
                json!({"prompt": format!("Prompt {i}"), "max_tokens": 40, "stream": stream, "seed": i})
            };
            let response = client.post(url).json(&body).send().await.expect("send");
            let status = response.status().as_u16();
            let text = response.text().await.expect("body");
            (status, stream, text)
        }));
    }
    for task in tasks {
        let (status, stream, text) = task.await.unwrap();
        assert_eq!(status, 200, "{text}");
        if stream {
            let events = parse_sse(&text);
            assert_eq!(events.last(), Some(&Sse::Done));
        } else {
            let body: Value = serde_json::from_str(&text).unwrap();
            assert!(body["choices"][0]["finish_reason"].is_string());
        }
    }
    server
        .wait_for_metric("minnow_busy_slots", 0.0, Duration::from_secs(5))
        .await;
    assert_eq!(server.metric("minnow_queue_depth").await, 0.0);
    let logged = server
        .logs()
        .iter()
        .filter(|l| l.contains("request id=") && l.contains("POST"))
        .count();
    assert_eq!(logged, 32, "one log line per request");
}

#[tokio::test(flavor = "multi_thread")]
async fn full_queue_is_429() {
    let server = Server::start(None, &["--parallel", "1", "--queue-capacity", "0"]).await;
    // Occupy the only slot with a slow stream and keep it open.
    let busy = post(&server, "/v1/chat/completions", slow_stream()).await;
    assert_eq!(busy.status(), 200);
    let mut busy_stream = busy.bytes_stream();
    busy_stream.next().await.expect("first chunk").unwrap();
    let refused = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(refused.headers()["retry-after"], "1");
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.unwrap();
    let error = assert_error(status, &body, 429, "rate_limit_error");
    assert_eq!(error["code"], "queue_full");
    drop(busy_stream);
    // Once the slot is free again, requests are served.
    server
        .wait_for_metric("minnow_busy_slots", 0.0, Duration::from_secs(10))
        .await;
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_mid_stream_frees_the_slot() {
    let server = Server::start(None, &["--parallel", "1"]).await;
    let response = post(&server, "/v1/chat/completions", slow_stream()).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    // Wait for the first block so the request is decoding, then hang up.
    let mut seen = String::new();
    while !seen.contains("\"minnow\"") {
        let chunk = stream
            .next()
            .await
            .expect("stream ended before a block")
            .unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(
        server.metric("minnow_busy_slots").await,
        1.0,
        "still generating"
    );
    let hung_up = Instant::now();
    drop(stream);
    wait_until_cancelled_and_freed(&server).await;
    eprintln!("slot freed {:?} after the disconnect", hung_up.elapsed());
    assert!(server
        .logs()
        .iter()
        .any(|l| l.contains("client disconnected")));
    // The freed slot serves the next client.
    server.assert_generates().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_in_flight_streams() {
    let mut server = Server::start(None, &[]).await;
    let mut body = slow_stream();
    body["max_tokens"] = json!(96);
    let response = post(&server, "/v1/chat/completions", body).await;
    let mut stream = response.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    let mut text = String::from_utf8(first.to_vec()).unwrap();
    server.signal("TERM");
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.expect("stream broken by shutdown")).unwrap());
    }
    let events = parse_sse(&text);
    assert_eq!(
        events.last(),
        Some(&Sse::Done),
        "the in-flight stream completed"
    );
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("server exits after draining");
    assert!(status.success(), "{status:?}");
    assert!(server.logs().iter().any(|l| l.contains("draining")));
    assert!(
        std::net::TcpStream::connect(&server.addr).is_err(),
        "no longer listening"
    );
}

/// Loading runs while the socket already answers: the checkpoint's config.json is a FIFO that
/// nobody writes until the test has seen /health answer 503.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn health_is_503_while_loading() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(FIXTURE_V21).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "config.json" {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let fifo = dir.path().join("config.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let model = dir.path().to_str().unwrap().to_string();
    let server = Server::spawn(Some(&model), &[]);

    let (status, body) = get_json(&server, "/health").await;
    let error = assert_error(status, &body, 503, "unavailable_error");
    assert_eq!(error["code"], "model_loading");
    let (status, body) = post_json(&server, "/v1/completions", json!({"prompt": "x"})).await;
    assert_error(status, &body, 503, "unavailable_error");
    // Alive while loading (a liveness probe must not kill a replica that loads), with no load.
    let (status, body) = get_json(&server, "/livez").await;
    assert_eq!(
        (status, body["phase"].as_str()),
        (200, Some("loading")),
        "{body}"
    );
    let (status, body) = get_json(&server, "/get_load").await;
    assert_eq!((status, &body[0]["num_reqs"]), (200, &json!(0)), "{body}");

    // The loader may open config.json more than once: feed the FIFO once per reader (opening
    // it for writing waits for the next reader; the pause lets the last reader see its EOF).
    let config = std::fs::read(format!("{FIXTURE_V21}/config.json")).unwrap();
    std::thread::spawn(move || loop {
        if std::fs::write(&fifo, &config).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    });
    server.wait_ready().await;
    server.assert_generates().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_before_a_plain_response_cancels_it() {
    let server = Server::start(None, &["--parallel", "1"]).await;
    let mut body = slow_stream();
    body["stream"] = json!(false);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let result = client
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await;
    assert!(
        result.is_err(),
        "the slow request outlives the client's timeout"
    );
    wait_until_cancelled_and_freed(&server).await;
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("route=\"/v1/chat/completions\",status=\"499\""),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_streams_get_keep_alive_comments() {
    let server = Server::start(None, &["--parallel", "1", "--keep-alive", "0.05"]).await;
    let busy = post(&server, "/v1/chat/completions", slow_stream()).await;
    let mut busy_stream = busy.bytes_stream();
    busy_stream.next().await.expect("first chunk").unwrap();
    // This one waits in the queue behind the slow stream, then runs.
    let mut queued = slow_stream();
    queued["max_tokens"] = json!(8);
    let events = read_sse(post(&server, "/v1/chat/completions", queued).await).await;
    drop(busy_stream);
    let comments = events
        .iter()
        .filter(|e| matches!(e, Sse::Comment(c) if c == "keep-alive"))
        .count();
    assert!(comments >= 1, "no keep-alive while queued: {events:?}");
    assert_eq!(events.last(), Some(&Sse::Done));
}

/// With nothing to write (queued behind another request, keep-alive far away), a hang-up is
/// still noticed at once: hyper drops the body on EOF and the stream task cancels.
#[tokio::test(flavor = "multi_thread")]
async fn disconnect_while_queued_is_noticed_at_once() {
    let server = Server::start(None, &["--parallel", "1", "--keep-alive", "60"]).await;
    let busy = post(&server, "/v1/chat/completions", slow_stream()).await;
    let mut busy_stream = busy.bytes_stream();
    busy_stream.next().await.expect("first chunk").unwrap();

    let queued = post(&server, "/v1/chat/completions", slow_stream()).await;
    let mut queued_stream = queued.bytes_stream();
    queued_stream.next().await.expect("role chunk").unwrap();
    drop(queued_stream);
    wait_until_one_cancelled(&server).await;
    assert_eq!(
        server.metric("minnow_busy_slots").await,
        1.0,
        "noticed while the other request still runs"
    );
    drop(busy_stream);
}
