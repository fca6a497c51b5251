//! Limits on connections, so that idle or slow clients cannot exhaust the server: a cap on open
//! connections (`--max-connections`; excess connections get a complete 503 and are closed), a
//! first-byte deadline (a connection that sends nothing, or stalls inside the HTTP/2 preface,
//! is dropped after `--header-timeout`; hyper's own header timeout covers the rest of an HTTP/1
//! head), and the default cap derived from the process's file-descriptor limit.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The HTTP/2 connection preface; HTTP/1 requests differ from it within the first bytes.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Descriptors kept free of connections for the model files, logs and the listener.
const RESERVED_FDS: u64 = 128;

/// Upper end of the default cap (beyond it a CPU-bound server only queues work anyway).
const DEFAULT_CAP_CEILING: u64 = 8192;

/// The default `--max-connections`: the soft `RLIMIT_NOFILE` less a reserve, within
/// [32, 8192]; 1024 where the limit cannot be read.
pub fn default_max_connections() -> usize {
    let soft = soft_fd_limit().unwrap_or(1024 + RESERVED_FDS);
    soft.saturating_sub(RESERVED_FDS)
        .clamp(32, DEFAULT_CAP_CEILING) as usize
}

/// The soft open-files limit, from `/proc/self/limits` (Linux); `None` elsewhere.
fn soft_fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_soft_fd_limit(&limits)
}

fn parse_soft_fd_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// Waits until the client has sent enough bytes for the protocol to be known without blocking
/// (`hyper_util`'s auto-detection reads until the bytes leave the HTTP/2 preface or complete it,
/// with no timer of its own). `false`: the deadline passed or the client closed first.
pub async fn first_bytes_arrive(stream: &TcpStream, deadline: Duration) -> bool {
    let wait = async {
        let mut buffer = [0u8; H2_PREFACE.len()];
        loop {
            let n = match stream.peek(&mut buffer).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            if n == H2_PREFACE.len() || buffer[..n] != H2_PREFACE[..n] {
                return true;
            }
            // A partial preface: let more bytes arrive rather than spinning on the same peek.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(deadline, wait).await.unwrap_or(false)
}

/// Answers a connection over the cap with a complete HTTP/1.1 503 (OpenAI-shaped body,
/// `Retry-After`) and closes it; best effort, bounded by a short write deadline.
pub async fn refuse_over_capacity(mut stream: TcpStream, cap: usize) {
    let body = serde_json::json!({"error": {
        "message": format!("the server has reached its limit of {cap} open connections; retry later"),
        "type": "unavailable_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soft_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_soft_fd_limit(limits), Some(1024));
        assert_eq!(
            parse_soft_fd_limit("Max open files  unlimited unlimited files"),
            Some(u64::MAX)
        );
        assert_eq!(parse_soft_fd_limit("nothing"), None);
        let cap = default_max_connections();
        assert!((32..=8192).contains(&cap), "{cap}");
    }

    #[tokio::test]
    async fn silent_and_partial_preface_clients_time_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Silent.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        assert!(!first_bytes_arrive(&server_side, Duration::from_millis(100)).await);
        // Stalled inside the HTTP/2 preface.
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"PRI * HT").await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        assert!(!first_bytes_arrive(&server_side, Duration::from_millis(100)).await);
        // An HTTP/1 request is recognised at its first byte.
        let mut http1 = TcpStream::connect(addr).await.unwrap();
        http1.write_all(b"G").await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        assert!(first_bytes_arrive(&server_side, Duration::from_secs(5)).await);
    }
}
