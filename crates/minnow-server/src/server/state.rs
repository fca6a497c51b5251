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

    /// Whether a load balancer should send requests here: loaded, not draining and not
    /// stalled; the error says why not.
    pub fn readiness(&self) -> Result<&Engine, ApiError> {
        let engine = self.engine()?;
        if self.lifecycle.is_draining() {
            return Err(ApiError::draining(self.lifecycle.admitted()));
        }
        self.not_stalled()?;
        Ok(engine)
    }

    /// 503 while the engine's current step has run longer than `--stall-limit` (its device no
    /// longer answers, so a new request would wait forever).
    pub fn not_stalled(&self) -> Result<(), ApiError> {
        match self.stalled_for() {
            Some(running) => Err(ApiError::stalled(running)),
            None => Ok(()),
        }
    }

    /// How long the engine's current step has run, when that is longer than `--stall-limit`.
    pub fn stalled_for(&self) -> Option<std::time::Duration> {
        let running = self.engine.get()?.step_running()?;
        (running > self.config.limits.stall_limit).then_some(running)
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
            ready: engine.is_some()
                && !self.lifecycle.is_draining()
                && self.stalled_for().is_none(),
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use minnow_engine::{Engine, EngineOptions, GenerateRequest};
    use minnow_model::ModelRunner;
    use minnow_model::{Segment, SegmentOutput};

    use super::*;
    use crate::server::config::ConnectionLimits;

    /// The bundled fixture's CPU runner, each forward held until the test lets it go (a device
    /// that stops answering, for as long as the test wants, up to 30 s).
    struct HeldRunner {
        inner: Box<dyn ModelRunner>,
        go: mpsc::Receiver<()>,
    }

    impl ModelRunner for HeldRunner {
        fn config(&self) -> &minnow_model::Config {
            self.inner.config()
        }
        fn device_name(&self) -> String {
            self.inner.device_name()
        }
        fn kv_pages(&self) -> usize {
            self.inner.kv_pages()
        }
        fn kv_page_bytes(&self) -> usize {
            self.inner.kv_page_bytes()
        }
        fn forward_batch(
            &mut self,
            segments: &[Segment<'_>],
        ) -> minnow_model::Result<Vec<SegmentOutput>> {
            // At most 30 s: a failing test unwinds (dropping the engine waits for this forward)
            // instead of hanging.
            self.go.recv_timeout(Duration::from_secs(30)).ok();
            self.inner.forward_batch(segments)
        }
        fn logits_row(&mut self, segment: usize, row: usize) -> minnow_model::Result<Vec<f32>> {
            self.inner.logits_row(segment, row)
        }
    }

    /// Polls `condition` every 2 ms for up to 10 s.
    fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
        let since = std::time::Instant::now();
        while !condition() {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "waited 10 s for {what}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_step_past_the_stall_limit_makes_the_server_unready_until_it_ends() {
        let path = std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/llada2-tiny-v21"
        ));
        let options = EngineOptions::default();
        let inner = minnow_engine::select_runner(&path, &options).unwrap();
        let (go, held) = mpsc::channel();
        let runner = HeldRunner { inner, go: held };
        let engine = Engine::with_runner(&path, Box::new(runner), options).unwrap();
        let config = ServerConfig {
            limits: ConnectionLimits {
                stall_limit: Duration::from_millis(100),
                ..ConnectionLimits::default()
            },
            ..crate::server::config::test_config(path.clone())
        };
        let state = AppState::new(config);
        state.set_engine(engine);
        assert!(state.readiness().is_ok(), "ready before any step");
        let engine = state.engine().unwrap();
        let mut handle = engine
            .submit(GenerateRequest {
                prompt_ids: vec![1; 8],
                max_tokens: Some(1),
                ..Default::default()
            })
            .unwrap();
        // The first forward is held: within the limit the server is ready, then it is not.
        wait_for("a step to begin", || engine.step_running().is_some());
        std::thread::sleep(Duration::from_millis(150));
        let error = state.readiness().err().expect("a held step past the limit");
        assert_eq!(error.status, hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.code, Some("engine_stalled"));
        assert!(state.not_stalled().is_err());
        assert!(!state.gauges().ready);
        let livez = crate::server::worker_api::livez(&state);
        assert_eq!(livez.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        // Released, the request finishes and the server is ready again.
        let feeder = std::thread::spawn(move || {
            while go.send(()).is_ok() {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        while let Some(event) = handle.blocking_next_event() {
            if matches!(
                event,
                minnow_engine::Event::Done { .. } | minnow_engine::Event::Error(_)
            ) {
                break;
            }
        }
        wait_for("readiness after the step", || state.readiness().is_ok());
        drop(handle);
        drop(state);
        feeder.join().unwrap();
    }
}
