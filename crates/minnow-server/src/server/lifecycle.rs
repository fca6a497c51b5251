//! The server's life as a load balancer sees it: loading, ready, then draining after SIGTERM.
//!
//! Generation requests (chat, completions, responses) are *admitted*: each holds an
//! [`Admission`] until its response has been sent (a stream until its last event). Once draining
//! starts no new admission succeeds (the request gets a 503 with `Retry-After`, so a router or
//! an SDK sends it elsewhere or later), the readiness probe answers 503, and the server waits
//! for the admitted count to reach zero. If `--shutdown-grace` runs out first, the grace is
//! *over*: streams still running end with an error event and waiting requests get a 503, rather
//! than being cut silently.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use hyper::Response;
use tokio::sync::{watch, Notify};

use super::errors::ApiError;
use super::http::Body;

pub struct Lifecycle {
    draining: AtomicBool,
    admitted: AtomicUsize,
    /// Woken whenever the admitted count drops to zero.
    idle: Notify,
    /// Turns true when the shutdown grace period has run out.
    grace_over: watch::Sender<bool>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            admitted: AtomicUsize::new(0),
            idle: Notify::new(),
            grace_over: watch::channel(false).0,
        }
    }
}

/// One admitted generation request; dropping it (the response is complete, or the client left)
/// ends the admission.
pub struct Admission(Arc<Lifecycle>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Lifecycle {
    /// Admits a generation request, or refuses it (503, retryable) while draining.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, ApiError> {
        // Count first, then check: a drain that starts between the two cannot miss this request
        // (it either sees the count or the request sees the flag).
        self.admitted.fetch_add(1, Ordering::SeqCst);
        if self.draining.load(Ordering::SeqCst) {
            self.release();
            return Err(ApiError::draining(self.admitted()));
        }
        Ok(Admission(self.clone()))
    }

    fn release(&self) {
        if self.admitted.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Generation requests admitted and not yet answered in full.
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Stops admitting; readiness turns false for good.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Resolves once no admitted request is left (call after `start_draining`, so that the
    /// count can only fall).
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the check, so a release in between still wakes this.
            idle.as_mut().enable();
            if self.admitted() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The grace period is over: every admitted request ends now, with an error.
    pub fn end_grace(&self) {
        self.grace_over.send_replace(true);
    }

    /// Resolves when the grace period is over (never, while the server runs normally).
    pub async fn grace_over(&self) {
        let mut over = self.grace_over.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = over.wait_for(|over| *over).await;
    }
}

/// Keeps `admission` until the response body has been sent in full (or dropped, when the
/// client leaves).
pub fn hold_until_sent(response: Response<Body>, admission: Admission) -> Response<Body> {
    response.map(|inner| super::http::hold_until_sent(inner, admission))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn draining_refuses_new_work_and_waits_for_the_admitted() {
        let lifecycle = Arc::new(Lifecycle::default());
        let first = lifecycle.admit().unwrap();
        let second = lifecycle.admit().unwrap();
        assert_eq!(lifecycle.admitted(), 2);
        lifecycle.start_draining();
        let refused = lifecycle
            .admit()
            .err()
            .expect("no admission while draining");
        assert_eq!(refused.status, hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.retryable());
        assert_eq!(lifecycle.admitted(), 2, "a refused request is not counted");

        let waiter = tokio::spawn({
            let lifecycle = lifecycle.clone();
            async move { lifecycle.drained().await }
        });
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("drained once the last admission ended")
            .unwrap();
    }

    #[tokio::test]
    async fn grace_over_wakes_every_waiter() {
        let lifecycle = Arc::new(Lifecycle::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let lifecycle = lifecycle.clone();
                tokio::spawn(async move { lifecycle.grace_over().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        lifecycle.end_grace();
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("woken")
                .unwrap();
        }
        // A request that starts waiting after the end sees it at once.
        tokio::time::timeout(Duration::from_secs(1), lifecycle.grace_over())
            .await
            .expect("already over");
    }
}
