//! The caller's side of a submitted request: its event stream ([`RequestHandle`]), its
//! cancellation flag ([`CancelToken`]) and, for traced requests, its trace ([`TraceLog`]); and the
//! output thread's word to the core that a stop string ended an answer ([`StopSignal`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::api::Event;
use crate::decode::request::TraceStep;

/// The per-forward trace of one request ([`crate::Engine::submit_traced`]): the block tokens after
/// every denoising forward, filled in when the request ends (before `Done` is sent).
#[derive(Clone, Debug, Default)]
pub struct TraceLog(Arc<Mutex<Vec<TraceStep>>>);

impl TraceLog {
    /// The recorded steps (empty until the request has ended).
    pub fn steps(&self) -> Vec<TraceStep> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn store(&self, steps: &[TraceStep]) {
        if let Ok(mut s) = self.0.lock() {
            *s = steps.to_vec();
        }
    }
}

/// Cancels a request from any thread; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Set by the output thread when a stop string ended a request's answer: the core then ends the
/// request at its next schedule (pages released) as if its decoder had stopped there.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The caller's end of a submitted request. Dropping it cancels the request, so a server that
/// loses its client frees the slot at once.
pub struct RequestHandle {
    pub id: u64,
    pub(crate) events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    pub(crate) cancel: CancelToken,
}

impl RequestHandle {
    /// Next event, for async callers. `None` after `Done`/`Error`.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Next event, for synchronous callers (not from inside a tokio runtime).
    pub fn blocking_next_event(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }

    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
