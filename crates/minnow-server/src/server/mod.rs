//! The OpenAI-compatible HTTP server behind `minnow serve`: hyper 1.x over tokio, a thin layer
//! over `minnow_engine::Engine`.
//!
//! Startup binds the socket first and loads the model on a blocking thread, so `/health` answers
//! 503 while loading and 200 after. SIGINT/SIGTERM during loading exit at once; after it they
//! start a drain (`lifecycle`): the server keeps listening, but `/health` and every new
//! generation answer 503 (with `Retry-After`) while the admitted requests (streams included)
//! finish for up to `--shutdown-grace` seconds; then it stops listening and exits 0. Requests
//! still running when the grace runs out end with an error event (or a 503) and the exit status
//! is non-zero; a second signal exits at once. `connections` bounds open, idle and per-address
//! connections; `worker_api` answers a router's and an orchestrator's probes.
//!
//! Map: `routes` (dispatch, auth, body limit) → `openai` + `fields` (request validation) →
//! `generation` (prompt preparation, non-streaming) / `sse` (streaming) → `responses` (OpenAI
//! JSON) ; `responses_api` serves the Responses API on the same path; `errors`, `metrics`, `static_files`, `auth`, `http`, `state`, `config` support them.

mod auth;
mod config;
mod connections;
mod errors;
mod fields;
mod generation;
mod http;
mod json_body;
mod lifecycle;
mod messages_api;
mod metrics;
mod openai;
mod origin;
mod responses;
mod responses_api;
mod routes;
mod sse;
mod state;
mod static_files;
mod worker_api;

use std::sync::Arc;
use std::time::Duration;

use minnow_engine::{Engine, LoadProgress};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

pub use config::{
    ConnectionLimits, ServerConfig, DEFAULT_BODY_LIMIT, DEFAULT_RESPONSES_MAX,
    DEFAULT_RESPONSES_MAX_MIB,
};
pub use connections::default_max_connections;
pub use origin::{host_name, OriginPolicy};
use state::AppState;

/// Runs the server until a shutdown signal; returns an error line if it cannot start, the model
/// fails to load, or the shutdown grace period ran out with streams still open.
pub fn run(config: ServerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(serve(config));
    // Do not wait for blocking work: a signal during loading must not wait for the weights (the
    // loader thread dies with the process).
    runtime.shutdown_background();
    result
}

async fn serve(config: ServerConfig) -> Result<(), String> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    if config.model_is_fixture {
        tracing::warn!(
            "no --model given: serving the bundled tiny fixture {} (random weights, random text)",
            config.model_path.display()
        );
    }
    tracing::info!("listening on http://{address}");

    let mut config = config;
    // Bound to the loopback only: the Host guard against DNS rebinding applies.
    config.origin.loopback_only = address.ip().is_loopback();
    let state = Arc::new(AppState::new(config));
    let (load_failed_tx, mut load_failed) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(load_model(state.clone(), load_failed_tx));

    // Turns true when the server closes: every connection finishes its requests and closes.
    let (closing, close_watch) = watch::channel(false);
    let limits = state.config.limits.clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let acceptor = tokio::spawn(accept_connections(
        listener,
        state.clone(),
        slots.clone(),
        close_watch,
    ));

    // Set once the loader has finished (its channel closes on success).
    let mut loader_done = false;
    let mut shutdown = Box::pin(shutdown_signal());
    loop {
        tokio::select! {
            message = &mut load_failed, if !loader_done => {
                if let Ok(message) = message {
                    return Err(message);
                }
                loader_done = true;
            }
            () = &mut shutdown => break,
        }
    }

    if !state.is_loaded() {
        // Nothing can be in flight before the model is ready; `run` does not wait for the loader.
        tracing::info!("shutting down during loading");
        return Ok(());
    }
    drain(&state, acceptor, &closing, &slots).await
}

/// After a shutdown signal: keep listening, but admit no new generation (503 with
/// `Retry-After`, `/health` 503, so that a router moves on) while the admitted ones finish; then
/// stop listening and close the connections. Within `--shutdown-grace` that is a clean exit;
/// past it, what still runs ends with an error (events on streams) and the exit is an error.
async fn drain(
    state: &AppState,
    acceptor: tokio::task::JoinHandle<()>,
    closing: &watch::Sender<bool>,
    slots: &Arc<Semaphore>,
) -> Result<(), String> {
    let limits = &state.config.limits;
    let grace = limits.shutdown_grace;
    let deadline = tokio::time::Instant::now() + grace;
    state.lifecycle.start_draining();
    tracing::info!(
        "shutting down: draining {} request(s) in flight (at most {}s, --shutdown-grace); \
         new ones get 503",
        state.lifecycle.admitted(),
        grace.as_secs_f64()
    );
    let drained = tokio::select! {
        () = state.lifecycle.drained() => true,
        () = tokio::time::sleep_until(deadline) => false,
        () = shutdown_signal() => return Err("second signal: exited without draining".to_string()),
    };
    let cut = state.lifecycle.admitted();
    if !drained {
        // Streams send their error event and end; waiting requests are answered 503.
        state.lifecycle.end_grace();
    }
    acceptor.abort();
    // The listener goes with the task: nothing new connects from here on.
    let _ = acceptor.await;
    let _ = closing.send(true);
    // Every connection holds one slot until it has closed: all slots back means all closed.
    let all_closed = slots.acquire_many(limits.max_connections as u32);
    if !drained {
        // A moment for the error events to reach their clients.
        let _ = tokio::time::timeout(GRACE_OVER_FLUSH, all_closed).await;
        return Err(format!(
            "--shutdown-grace of {}s ran out: ended {cut} request(s) still running with an error",
            grace.as_secs_f64()
        ));
    }
    tokio::select! {
        _ = all_closed => {
            tracing::info!("all requests finished; bye");
            Ok(())
        }
        () = tokio::time::sleep_until(deadline) => Err(format!(
            "--shutdown-grace of {}s ran out: closed the connections still open",
            grace.as_secs_f64()
        )),
        () = shutdown_signal() => Err("second signal: exited without draining".to_string()),
    }
}

/// How long the error events of requests cut at the end of the grace period may take to leave.
const GRACE_OVER_FLUSH: Duration = Duration::from_secs(2);

/// Accepts connections until the task is aborted (which drops the listener), each under the
/// connection caps; `closing` tells the open ones to finish their requests and close.
async fn accept_connections(
    listener: TcpListener,
    state: Arc<AppState>,
    slots: Arc<Semaphore>,
    closing: watch::Receiver<bool>,
) {
    let limits = state.config.limits.clone();
    let peers = Arc::new(connections::PeerCounts::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: keep serving the others.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                "refusing a connection: {} already open (--max-connections)",
                limits.max_connections
            );
            tokio::spawn(connections::refuse_over_capacity(
                stream,
                format!(
                    "the server has reached its limit of {} open connections; retry later",
                    limits.max_connections
                ),
            ));
            continue;
        };
        let Some(peer_slot) = peers.take(peer.ip(), limits.max_connections_per_peer) else {
            tracing::warn!(
                "refusing a connection from {}: {} already open from there \
                 (--max-connections-per-peer)",
                peer.ip(),
                limits.max_connections_per_peer
            );
            tokio::spawn(connections::refuse_over_capacity(
                stream,
                format!(
                    "this address has reached its limit of {} open connections; retry later",
                    limits.max_connections_per_peer
                ),
            ));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let limits = limits.clone();
        let closing = closing.clone();
        tokio::spawn(async move {
            let _slots = (permit, peer_slot);
            connections::serve(stream, state, limits, closing).await;
        });
    }
}

/// Loads the engine on a blocking thread; a failure ends the server with that message.
async fn load_model(state: Arc<AppState>, failed: tokio::sync::oneshot::Sender<String>) {
    let path = state.config.model_path.clone();
    let options = state.config.engine.clone();
    // A byte-counting bar on a terminal; it fills as the weights reach their device.
    let bar = state.config.show_progress.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("a valid progress template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("loading {}", path.display()));
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
    let started = std::time::Instant::now();
    let loader_bar = bar.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        Engine::load_with_progress(&path, options, &|p: LoadProgress| {
            if let Some(bar) = &loader_bar {
                bar.set_length(p.bytes_total);
                bar.set_position(p.bytes_done);
            }
        })
    })
    .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    match loaded {
        Ok(Ok(engine)) => {
            let info = engine.info();
            tracing::info!(
                "model ready in {:.1}s: {} ({}), id '{}', context {} tokens, block {}, device {}",
                started.elapsed().as_secs_f64(),
                info.path.display(),
                info.family,
                state.model_id,
                info.n_ctx,
                info.block_size,
                info.device
            );
            state.set_engine(engine);
        }
        Ok(Err(e)) => {
            let _ = failed.send(format!(
                "cannot load {}: {e}",
                state.config.model_path.display()
            ));
        }
        Err(e) => {
            let _ = failed.send(format!("the model loader crashed: {e}"));
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
}
