//! Hostile clients against resource limits: memory under concurrent maximal bodies, idle and
//! stalled connections, the connection cap, the shutdown deadline, a signal during loading, and
//! the CLI's output files (symlinks, FIFOs and devices are never written through or replaced).

#[path = "server_harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use harness::*;
use serde_json::{json, Value};

/// A `/proc/PID/status` field in bytes (Linux).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing"));
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn eight_concurrent_7_mb_prompts_stay_within_500_mb() {
    let server = Server::start(None, &[]).await;
    let before = proc_status_bytes(server.pid(), "VmRSS:");
    let text = "the river runs ".repeat(7 * 1024 * 1024 / 15);
    let bodies: Vec<(&str, Value)> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                (
                    "/v1/chat/completions",
                    json!({"messages": [{"role": "user", "content": text}]}),
                )
            } else {
                ("/v1/completions", json!({"prompt": text}))
            }
        })
        .collect();
    let started = Instant::now();
    let answers = futures_util::future::join_all(
        bodies
            .into_iter()
            .map(|(path, body)| post_json(&server, path, body)),
    )
    .await;
    for (status, body) in answers {
        let error = assert_error(status, &body, 400, "exceed_context_size_error");
        assert!(error["n_ctx"].as_u64().is_some(), "{body}");
    }
    let peak = proc_status_bytes(server.pid(), "VmHWM:");
    let growth = peak.saturating_sub(before);
    assert!(
        growth < 500 * 1024 * 1024,
        "peak RSS grew by {} MB",
        growth / (1024 * 1024)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    server.assert_generates().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_and_stalled_connections_are_dropped() {
    let server = Server::start(None, &["--header-timeout", "1", "--body-timeout", "1"]).await;
    // Sends nothing: closed after the header timeout.
    let mut silent = TcpStream::connect(&server.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buffer = [0u8; 16];
    assert_eq!(silent.read(&mut buffer).unwrap_or(0), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    // Sends half a body: 408.
    let (status, text) = {
        let mut stalled = TcpStream::connect(&server.addr).unwrap();
        stalled
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stalled
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
            .unwrap();
        let mut text = String::new();
        let _ = stalled.read_to_string(&mut text);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    };
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    server.assert_generates().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_are_refused_cleanly() {
    let server = Server::start(None, &["--max-connections", "3"]).await;
    // Let the readiness probe's connection close first, so that the three below hold every slot.
    std::thread::sleep(Duration::from_millis(500));
    let idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, text) = server.raw("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("too_many_connections"), "{text}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    server.assert_generates().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_grace_cuts_a_stalled_client_and_exits_non_zero() {
    let mut server = Server::start(None, &["--shutdown-grace", "1"]).await;
    let mut stalled = TcpStream::connect(&server.addr).unwrap();
    stalled
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{",
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .expect("exits once the grace period is over");
    assert!(!status.success(), "{status:?}");
    assert!(
        server.logs().iter().any(|l| l.contains("--shutdown-grace")),
        "{}",
        server.logs().join("\n")
    );
}

/// config.json is a FIFO nobody writes: the loader blocks, and SIGTERM must still end the process.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_during_loading_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(FIXTURE_V21).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "config.json" {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let fifo = dir.path().join("config.json");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let model = dir.path().to_str().unwrap().to_string();
    let mut server = Server::spawn(Some(&model), &[]);
    let (status, _) = get_json(&server, "/health").await;
    assert_eq!(status, 503);
    server.signal("TERM");
    let started = Instant::now();
    server
        .wait_exit(Duration::from_secs(5))
        .expect("a signal during loading stops the process");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[cfg(unix)]
#[test]
fn forward_never_replaces_symlinks_fifos_or_devices() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.json");
    std::fs::write(&input, r#"{"input_ids": [1, 2, 3]}"#).unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep").unwrap();
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let dangling = dir.path().join("dangling.safetensors");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
    let fifo = dir.path().join("fifo.safetensors");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for output in [
        &link,
        &dangling,
        &fifo,
        &std::path::PathBuf::from("/dev/null"),
    ] {
        for force in [false, true] {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_minnow"));
            command.args([
                "--model",
                FIXTURE_V21,
                "--device",
                "cpu",
                "forward",
                "--input",
                input.to_str().unwrap(),
                "--output",
                output.to_str().unwrap(),
            ]);
            if force {
                command.arg("--force");
            }
            let result = command.output().unwrap();
            assert!(!result.status.success(), "{output:?} force={force}");
            let stderr = String::from_utf8_lossy(&result.stderr);
            assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        }
    }
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!dir.path().join("nowhere").exists());
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_config_with_a_billion_layers_fails_in_milliseconds() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(FIXTURE_V21).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["num_hidden_layers"] = json!(1_000_000_000u64);
    std::fs::write(&path, config.to_string()).unwrap();
    let started = Instant::now();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_minnow"))
        .args([
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "cpu",
            "inspect",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("num_hidden_layers"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
