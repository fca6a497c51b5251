//! Shared by the `server_*` integration tests (included with `#[path]`): starts the real `minnow`
//! binary on a free port over the tiny fixtures, reads the bound address from its log, and
//! offers small HTTP/SSE helpers. Compiled alone it is an empty test crate.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

pub const FIXTURE_V21: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/llada2-tiny-v21"
);
pub const FIXTURE_V20: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/llada2-tiny-v20"
);

pub struct Server {
    child: Child,
    pub base: String,
    pub addr: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `minnow [--model M] serve --listen 127.0.0.1:0 ARGS` and waits for the listening line
    /// (not for the model: see `wait_ready`).
    pub fn spawn(model: Option<&str>, args: &[&str]) -> Server {
        Server::spawn_at("127.0.0.1:0", model, args)
    }

    /// `spawn` on a given address (a replica restarted on its port).
    pub fn spawn_at(listen: &str, model: Option<&str>, args: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_minnow"));
        if let Some(model) = model {
            command.args(["--model", model]);
        }
        command
            .args(["--device", "cpu", "serve", "--listen", listen])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("MINNOW_API_KEY")
            .env_remove("MINNOW_MODEL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start minnow");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        {
            let logs = logs.clone();
            // Keeps draining stderr for the server's whole life so it never blocks on logging.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find("listening on http://") {
                        let addr: String = line[at + "listening on http://".len()..]
                            .chars()
                            .take_while(|c| !c.is_whitespace())
                            .collect();
                        let _ = tx.send(addr);
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "server did not start; log:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        };
        Server {
            child,
            base: format!("http://{addr}"),
            addr,
            logs,
        }
    }

    /// Spawns and waits until `/health` says 200.
    pub async fn start(model: Option<&str>, args: &[&str]) -> Server {
        let server = Server::spawn(model, args);
        server.wait_ready().await;
        server
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let client = reqwest::Client::new();
        loop {
            if let Some(error) = self.logs().iter().find(|l| l.starts_with("minnow: error:")) {
                panic!("server failed: {error}");
            }
            if let Ok(response) = client.get(self.url("/health")).send().await {
                if response.status() == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "model did not load; log:\n{}",
                self.logs().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Sends raw bytes (for requests an HTTP client would normalize) and returns the response
    /// status code and the whole response text.
    pub fn raw(&self, request: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    /// Asserts that the server still generates: a 4-token completion answers 200.
    pub async fn assert_generates(&self) {
        let (status, body) = post_json(
            self,
            "/v1/completions",
            serde_json::json!({"prompt": "hi", "max_tokens": 4}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }

    /// A metric value from `/metrics` (first sample whose line starts with `name`).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
    }

    /// Waits until the metric equals `wanted`, failing after `timeout`: for gauges that settle
    /// after the answers are out (slots free up, and a request a stop string ended releases its
    /// pages at the engine's next step, which may come just after its client has the answer).
    pub async fn wait_for_metric(&self, name: &str, wanted: f64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.metric(name).await;
            if value == wanted {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} stayed {value}, wanted {wanted}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub enum Sse {
    Data(Value),
    Done,
    Comment(String),
}

/// Splits an SSE body into events, checking the framing: every event is `data: JSON`,
/// `data: [DONE]` or a `:` comment, each terminated by a blank line.
pub fn parse_sse(body: &str) -> Vec<Sse> {
    assert!(
        body.ends_with("\n\n"),
        "stream does not end with a blank line: {body:?}"
    );
    body.trim_end_matches('\n')
        .split("\n\n")
        .map(|event| {
            assert!(!event.contains('\n'), "multi-line event: {event:?}");
            if let Some(comment) = event.strip_prefix(':') {
                Sse::Comment(comment.trim().to_string())
            } else if event == "data: [DONE]" {
                Sse::Done
            } else {
                let json = event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {event:?}"));
                Sse::Data(
                    serde_json::from_str(json).unwrap_or_else(|e| panic!("bad JSON {json:?}: {e}")),
                )
            }
        })
        .collect()
}

/// Reads a streaming response (200, an event stream) to its end.
async fn read_stream(response: reqwest::Response) -> String {
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = String::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.push_str(std::str::from_utf8(&chunk.expect("stream chunk")).expect("utf-8"));
    }
    body
}

/// Reads a streaming response to its end and parses it.
pub async fn read_sse(response: reqwest::Response) -> Vec<Sse> {
    parse_sse(&read_stream(response).await)
}

/// Splits an event stream of named events (the Responses and Messages APIs) into `(event name,
/// data)` pairs, checking the framing (every
/// event is `event: NAME` + `data: JSON` or a `:` comment) and that each data's `type` is its
/// event name.
pub async fn read_named_events(response: reqwest::Response) -> Vec<(String, Value)> {
    let body = read_stream(response).await;
    assert!(body.ends_with("\n\n"), "{body:?}");
    let mut events = Vec::new();
    for frame in body.trim_end_matches('\n').split("\n\n") {
        if frame.starts_with(':') {
            continue;
        }
        let (name_line, data_line) = frame
            .split_once('\n')
            .unwrap_or_else(|| panic!("not an event: {frame:?}"));
        let name = name_line
            .strip_prefix("event: ")
            .unwrap_or_else(|| panic!("no event name: {frame:?}"));
        let data = data_line
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("no data: {frame:?}"));
        let value: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{data}: {e}"));
        assert_eq!(value["type"], name, "{frame}");
        events.push((name.to_string(), value));
    }
    events
}

pub fn data_events(events: &[Sse]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match e {
            Sse::Data(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

pub async fn post(server: &Server, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("request")
}

/// Posts and returns (status, JSON body).
pub async fn post_json(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let response = post(server, path, body).await;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

pub async fn get_json(server: &Server, path: &str) -> (u16, Value) {
    let response = reqwest::get(server.url(path)).await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

/// Asserts an OpenAI-shaped error and returns its object.
pub fn assert_error(status: u16, body: &Value, expected_status: u16, expected_type: &str) -> Value {
    assert_eq!(status, expected_status, "body: {body}");
    let error = &body["error"];
    assert!(error.is_object(), "no error object: {body}");
    assert_eq!(error["type"], expected_type, "body: {body}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(error.get("param").is_some() && error.get("code").is_some());
    error.clone()
}
