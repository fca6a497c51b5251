//! What a router in front of several replicas, or an orchestrator's probes, read from one
//! replica (docs/deploy.md):
//! - readiness, `/health`: 200 when the model is loaded and the server admits requests; 503 with
//!   an OpenAI-shaped error saying why (loading, or draining after a shutdown signal);
//! - liveness, `/livez`: 200 as long as the process answers HTTP, whatever its phase, so that a
//!   replica that is loading or draining is not killed for it;
//! - load, `/get_load`: running and queued requests and K/V pages in use, in the shape
//!   sglang-router reads (a list with one entry per data-parallel rank; `num_tokens` is what its
//!   power-of-two policy compares) plus a `minnow` object with the same counts by name;
//! - `/server_info` and `/model_info` (also under SGLang's `/get_server_info` and
//!   `/get_model_info`): what the router asks when a worker registers.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::errors::ApiError;
use super::http::{json_response, Body};
use super::state::AppState;

/// `/health`: readiness.
pub fn health(state: &AppState) -> Result<Response<Body>, ApiError> {
    state.readiness()?;
    Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
}

/// `/livez`: liveness, with the phase for people reading it: 200 while the process answers,
/// 503 once the engine has stalled (a step past `--stall-limit`: only a restart frees a device
/// that no longer answers).
pub fn livez(state: &AppState) -> Response<Body> {
    match phase(state) {
        "stalled" => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "stalled", "phase": "stalled"}),
        ),
        phase => json_response(StatusCode::OK, &json!({"status": "alive", "phase": phase})),
    }
}

fn phase(state: &AppState) -> &'static str {
    if state.stalled_for().is_some() {
        "stalled"
    } else if state.lifecycle.is_draining() {
        "draining"
    } else if state.is_loaded() {
        "ready"
    } else {
        "loading"
    }
}

/// `/get_load`: the replica's load now. Answered in every phase (zeros while loading), since a
/// router polls it on its own schedule.
pub fn load(state: &AppState) -> Response<Body> {
    let gauges = state.gauges();
    let cache = &gauges.engine.cache;
    let page_tokens = state.engine().map_or(0, |e| e.info().block_size);
    let entry = json!({
        "dp_rank": 0,
        "num_reqs": gauges.busy_slots,
        "num_waiting_reqs": gauges.queue_depth,
        // Tokens of K/V held by running requests (whole pages).
        "num_tokens": cache.pages_held * page_tokens,
        "minnow": {
            "phase": phase(state),
            "running": gauges.busy_slots,
            "queued": gauges.queue_depth,
            "load": gauges.busy_slots + gauges.queue_depth,
            "requests_in_flight": gauges.admitted,
            "slots": gauges.total_slots,
            "kv_pages_used": cache.pages_held,
            "kv_pages_cached": cache.pages_cached,
            "kv_pages_total": cache.pages_total,
            "kv_page_tokens": page_tokens,
        },
    });
    json_response(StatusCode::OK, &Value::Array(vec![entry]))
}

/// `/model_info`: the served model.
pub fn model_info(state: &AppState) -> Result<Response<Body>, ApiError> {
    let info = state.engine()?.info();
    let path = info.path.display().to_string();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "model_path": path,
            "tokenizer_path": path,
            "served_model_name": state.model_id,
            "is_generation": true,
            "model_type": info.family,
            "architectures": [],
        }),
    ))
}

/// `/server_info`: the replica's capacity and limits.
pub fn server_info(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let info = engine.info();
    let cache = engine.stats().cache;
    let path = info.path.display().to_string();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "served_model_name": state.model_id,
            "model_path": path,
            "tokenizer_path": path,
            "context_length": info.n_ctx,
            "page_size": info.block_size,
            "max_total_num_tokens": cache.pages_total * info.block_size,
            "max_running_requests": info.parallel,
            "max_queued_requests": state.config.engine.queue_capacity,
            "dp_size": 1,
            "device": info.device,
            "version": env!("CARGO_PKG_VERSION"),
        }),
    ))
}
