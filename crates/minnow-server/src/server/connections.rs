//! Limits on connections, so that idle or slow clients cannot exhaust the server:
//! - a cap on open connections (`--max-connections`) and on those of one peer address
//!   (`--max-connections-per-peer`), so that one address cannot take every slot; excess
//!   connections get a complete 503 and are closed;
//! - a first-byte deadline (a connection that sends nothing, or stalls inside the HTTP/2
//!   preface, is dropped after `--header-timeout`; hyper's own header timeout covers the rest of
//!   an HTTP/1 head);
//! - the same two deadlines for both protocols once the connection is served ([`serve`]): a
//!   connection whose first request has not started within `--header-timeout`, or that has had no
//!   request in flight for `--idle-timeout`, is shut down (HTTP/2: GOAWAY) and closed, since an
//!   HTTP/2 connection that sent its preface and SETTINGS and then nothing would otherwise hold a
//!   slot for ever;
//! - the default cap, derived from the process's file-descriptor limit.
//!
//! A trickled request body is the body reader's to close (`routes::read_json`,
//! `--min-body-rate`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::config::ConnectionLimits;
use super::http::hold_until_sent;
use super::routes;
use super::state::AppState;

/// How long a connection shut down for idleness may take to finish closing before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

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

/// Open connections per peer address (`--max-connections-per-peer`).
#[derive(Default)]
pub struct PeerCounts {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`PeerCounts`]; dropping it gives the place back.
pub struct PeerSlot {
    counts: Arc<PeerCounts>,
    peer: IpAddr,
}

impl PeerCounts {
    /// A place for one more connection from `peer`, or `None` when it already has `cap`.
    pub fn take(self: &Arc<Self>, peer: IpAddr, cap: usize) -> Option<PeerSlot> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(peer).or_insert(0);
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// What the connection watchdog knows of a connection's requests.
struct Activity {
    in_flight: AtomicUsize,
    started: AtomicUsize,
    /// When the last request ended (or the connection opened).
    quiet_since: Mutex<Instant>,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// The time at which the connection counts as idle if nothing changes; `None` while a
    /// request is in flight.
    fn idle_at(&self, first_request: Duration, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let quiet = *self
            .quiet_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let limit = if self.started.load(Ordering::SeqCst) == 0 {
            first_request
        } else {
            idle
        };
        Some(quiet + limit)
    }
}

/// A request in flight; it ends when its response body has been sent (or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut quiet) = self.0.quiet_since.lock() {
            *quiet = Instant::now();
        }
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one accepted connection (either protocol) until it ends, is idle past its deadline
/// or the server shuts down (`shutdown` turns true: finish the open requests, then close).
pub async fn serve(
    stream: TcpStream,
    state: Arc<AppState>,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    if !first_bytes_arrive(&stream, limits.header_timeout).await {
        tracing::debug!("dropping a connection that sent no request in time");
        return;
    }
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        quiet_since: Mutex::new(Instant::now()),
    });
    let service = {
        let activity = activity.clone();
        service_fn(move |request| {
            let state = state.clone();
            let in_flight = activity.begin();
            async move {
                let response = routes::handle(state, request).await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|inner| hold_until_sent(inner, in_flight)),
                )
            }
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that never finishes sending its headers is dropped.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let closing_idle = loop {
        let idle_at = activity.idle_at(limits.header_timeout, limits.idle_timeout);
        // While a request is in flight, look again after a while (its end resets the clock).
        let wake = idle_at
            .unwrap_or_else(|| Instant::now() + limits.idle_timeout.min(Duration::from_secs(1)));
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended with an error: {e}");
                }
                return;
            }
            () = tokio::time::sleep_until(wake) => {
                let idle = activity
                    .idle_at(limits.header_timeout, limits.idle_timeout)
                    .is_some_and(|at| at <= Instant::now());
                if idle {
                    break true;
                }
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break false;
                }
            }
        }
    };
    connection.as_mut().graceful_shutdown();
    if closing_idle {
        tracing::debug!("closing an idle connection (--idle-timeout / --header-timeout)");
        let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
    } else {
        // The server's shutdown bounds this wait (--shutdown-grace).
        let _ = connection.await;
    }
}

/// Answers a connection over a cap with a complete HTTP/1.1 503 (OpenAI-shaped body,
/// `Retry-After`) and closes it; best effort, bounded by a short write deadline. `why` says
/// which cap.
pub async fn refuse_over_capacity(mut stream: TcpStream, why: String) {
    let body = serde_json::json!({"error": {
        "message": why,
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
