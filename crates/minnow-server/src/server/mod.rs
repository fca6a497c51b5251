//! The OpenAI-compatible HTTP server behind `minnow serve`: hyper 1.x over tokio, a thin layer
//! over `minnow_engine::Engine`.
//!
//! Startup binds the socket first and loads the model on a blocking thread, so `/health` answers
//! 503 while loading and 200 after. SIGINT/SIGTERM during loading exit at once; after it they
//! stop accepting connections and let in-flight requests (streams included) finish for up to
//! `--shutdown-grace` seconds, after which the rest are cut and the exit status is non-zero; a
//! second signal exits at once. `connections` bounds open, idle and per-address connections.
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
mod metrics;
mod openai;
mod origin;
mod responses;
mod responses_api;
mod routes;
mod special_text;
mod sse;
mod state;
mod static_files;

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

    // Set once the loader has finished (its channel closes on success).
    let mut loader_done = false;
    // Turns true when the server shuts down: every connection finishes its requests and closes.
    let (stopping, stop_watch) = watch::channel(false);
    let mut shutdown = Box::pin(shutdown_signal());
    let limits = state.config.limits.clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(connections::PeerCounts::default());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
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
                    tokio::spawn(connections::refuse_over_capacity(stream, format!(
                        "the server has reached its limit of {} open connections; retry later",
                        limits.max_connections
                    )));
                    continue;
                };
                let Some(peer_slot) = peers.take(peer.ip(), limits.max_connections_per_peer) else {
                    tracing::warn!(
                        "refusing a connection from {}: {} already open from there \
                         (--max-connections-per-peer)",
                        peer.ip(),
                        limits.max_connections_per_peer
                    );
                    tokio::spawn(connections::refuse_over_capacity(stream, format!(
                        "this address has reached its limit of {} open connections; retry later",
                        limits.max_connections_per_peer
                    )));
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let limits = limits.clone();
                let stop_watch = stop_watch.clone();
                tokio::spawn(async move {
                    let _slots = (permit, peer_slot);
                    connections::serve(stream, state, limits, stop_watch).await;
                });
            }
            message = &mut load_failed, if !loader_done => {
                if let Ok(message) = message {
                    return Err(message);
                }
                loader_done = true;
            }
            () = &mut shutdown => break,
        }
    }

    drop(listener);
    if !state.is_ready() {
        // Nothing can be in flight before the model is ready; `run` does not wait for the loader.
        tracing::info!("shutting down during loading");
        return Ok(());
    }
    let open = limits.max_connections - slots.available_permits();
    tracing::info!(
        "shutting down: draining {open} open connection(s) (at most {}s, --shutdown-grace)",
        limits.shutdown_grace.as_secs_f64()
    );
    let _ = stopping.send(true);
    // Every connection holds one slot until it has closed: all slots back means all closed.
    let all_closed = slots.acquire_many(limits.max_connections as u32);
    tokio::select! {
        _ = all_closed => {
            tracing::info!("all requests finished; bye");
            Ok(())
        }
        () = tokio::time::sleep(limits.shutdown_grace) => Err(format!(
            "--shutdown-grace of {}s ran out: closed the connections still open",
            limits.shutdown_grace.as_secs_f64()
        )),
        () = shutdown_signal() => Err("second signal: exited without draining".to_string()),
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
