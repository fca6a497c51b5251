//! Shared server state: the configuration, the engine once it has loaded, metrics, and the
//! per-request access log that writes one line when the request is fully answered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use minnow_engine::{Engine, GenerationStats};

use super::config::ServerConfig;
use super::errors::ApiError;
use super::lifecycle::Lifecycle;
use super::metrics::{Gauges, Metrics};
use super::responses_api::store::ResponseStore;

pub struct AppState {
    pub config: ServerConfig,
    pub model_id: String,
    engine: OnceLock<Engine>,
    pub metrics: Metrics,
    next_id: AtomicU64,
    /// Unix time the server started; reported as the model's `created`.
    pub started_unix: u64,
    /// Stored Responses API responses (`--responses-max`, `--responses-max-mib`).
    pub responses: ResponseStore,
    /// Admission of generation requests and the drain after a shutdown signal.
    pub lifecycle: Arc<Lifecycle>,
}

impl AppState {
    pub fn new(config: ServerConfig) -> Self {
        let model_id = config.model_id();
        Self {
            responses: ResponseStore::new(config.responses_max, config.responses_max_bytes),
            config,
            model_id,
            engine: OnceLock::new(),
            metrics: Metrics::default(),
            next_id: AtomicU64::new(1),
            started_unix: unix_now(),
            lifecycle: Arc::new(Lifecycle::default()),
        }
    }

    /// The engine, or 503 while the model is still loading.
    pub fn engine(&self) -> Result<&Engine, ApiError> {
        self.engine.get().ok_or_else(ApiError::loading)
    }

    pub fn set_engine(&self, engine: Engine) {
        let _ = self.engine.set(engine);
    }

    /// The model has loaded (the server may be draining since).
    pub fn is_loaded(&self) -> bool {
        self.engine.get().is_some()
    }

    /// Whether a load balancer should send requests here: loaded and not draining; the error
    /// says why not.
    pub fn readiness(&self) -> Result<&Engine, ApiError> {
        let engine = self.engine()?;
        if self.lifecycle.is_draining() {
            return Err(ApiError::draining(self.lifecycle.admitted()));
        }
        Ok(engine)
    }

    pub fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn gauges(&self) -> Gauges {
        let engine = self.engine.get();
        Gauges {
            queue_depth: engine.map_or(0, Engine::queue_depth),
            busy_slots: engine.map_or(0, Engine::busy_slots),
            total_slots: engine.map_or(self.config.engine.parallel, |e| e.info().parallel),
            ready: engine.is_some() && !self.lifecycle.is_draining(),
            draining: self.lifecycle.is_draining(),
            admitted: self.lifecycle.admitted(),
            engine: engine.map(Engine::stats).unwrap_or_default(),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the access-log line of one request reports. Generation handlers fill in token counts;
/// a streaming response keeps the log alive until its stream ends.
#[derive(Default)]
struct LogFields {
    status: u16,
    generation: Option<GenerationStats>,
    outcome: Option<String>,
}

pub struct RequestLog {
    pub id: u64,
    method: String,
    path: String,
    /// Low-cardinality route label for metrics ("/v1/models/{id}", "static", ...).
    route: &'static str,
    start: Instant,
    fields: Mutex<LogFields>,
    state: std::sync::Arc<AppState>,
}

impl RequestLog {
    pub fn new(
        state: std::sync::Arc<AppState>,
        id: u64,
        method: &str,
        path: &str,
        route: &'static str,
    ) -> Self {
        Self {
            id,
            method: method.to_string(),
            path: path.to_string(),
            route,
            start: Instant::now(),
            fields: Mutex::new(LogFields::default()),
            state,
        }
    }

    pub fn set_status(&self, status: u16) {
        if let Ok(mut fields) = self.fields.lock() {
            fields.status = status;
        }
    }

    /// Token counts and timings of the finished generation, for the log line.
    pub fn set_generation(&self, stats: &GenerationStats) {
        if let Ok(mut fields) = self.fields.lock() {
            fields.generation = Some(stats.clone());
        }
    }

    /// How a generation ended ("stop", "client disconnected", an error message, ...).
    pub fn set_outcome(&self, outcome: impl Into<String>) {
        if let Ok(mut fields) = self.fields.lock() {
            fields.outcome = Some(outcome.into());
        }
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let elapsed = self.start.elapsed();
        let mut fields = match self.fields.lock() {
            Ok(mut fields) => std::mem::take(&mut *fields),
            Err(_) => LogFields::default(),
        };
        if fields.status == 0 {
            // hyper dropped the handler: the client closed the connection before the response
            // (nginx's 499 convention, so metrics and logs show it).
            fields.status = 499;
            fields.outcome = Some("client disconnected".into());
        }
        self.state
            .metrics
            .record_request(self.route, fields.status, elapsed.as_secs_f64());
        let tokens = match &fields.generation {
            Some(g) => format!(
                " prompt_tokens={} cached_tokens={} completion_tokens={} prefill_ms={:.1} decode_ms={:.1}",
                g.prompt_tokens,
                g.cached_tokens,
                g.completion_tokens,
                g.prefill_seconds * 1000.0,
                g.decode_seconds * 1000.0
            ),
            None => String::new(),
        };
        let outcome = fields
            .outcome
            .map(|o| format!(" outcome=\"{o}\""))
            .unwrap_or_default();
        tracing::info!(
            "request id={} {} {} status={}{}{} ms={:.1}",
            self.id,
            self.method,
            self.path,
            fields.status,
            tokens,
            outcome,
            elapsed.as_secs_f64() * 1000.0
        );
    }
}
