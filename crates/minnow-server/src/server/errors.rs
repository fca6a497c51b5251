//! OpenAI-shaped API errors: every failure a client can see is
//! `{"error":{"message","type","param","code"}}` with a matching HTTP status, so OpenAI clients
//! raise their usual exception classes (BadRequestError, AuthenticationError, ...).

use hyper::StatusCode;
use minnow_engine::EngineError;
use serde_json::{json, Value};

/// One error response. `param` names the offending request field when there is one.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Extra members of the error object (llama-server's `n_prompt_tokens`/`n_ctx`).
    pub extra: Vec<(&'static str, Value)>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            extra: Vec::new(),
        }
    }

    /// 400 for a request the server cannot honour, naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        error.param = Some(param.into());
        error
    }

    /// 400 without a specific field (malformed JSON, a template failure, ...).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> Self {
        let mut error = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key (send 'Authorization: Bearer KEY')",
        );
        error.code = Some("invalid_api_key");
        error
    }

    /// 403 for a request refused for where it comes from (Host guard, cross-origin policy).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        let mut error = Self::new(StatusCode::FORBIDDEN, "permission_error", message);
        error.code = Some(code);
        error
    }

    pub fn route_not_found(path: &str) -> Self {
        let mut error = Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route for '{path}'"),
        );
        error.code = Some("not_found");
        error
    }

    pub fn model_not_found(model: &str) -> Self {
        let mut error = Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("the model '{model}' does not exist (see GET /v1/models)"),
        );
        error.param = Some("model".into());
        error.code = Some("model_not_found");
        error
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let mut error = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method {method} is not allowed on '{path}'"),
        );
        error.code = Some("method_not_allowed");
        error
    }

    pub fn body_too_large(limit: usize) -> Self {
        let mut error = Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        );
        error.code = Some("request_too_large");
        error
    }

    pub fn body_timeout(pause: std::time::Duration) -> Self {
        let mut error = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body stalled for more than {}s (--body-timeout)",
                pause.as_secs_f64()
            ),
        );
        error.code = Some("request_timeout");
        error
    }

    pub fn body_too_slow(rate: u64) -> Self {
        let mut error = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body arrived slower than {rate} bytes per second (--min-body-rate)"
            ),
        );
        error.code = Some("request_timeout");
        error
    }

    /// 400 for a prompt text too long for the context, refused before tokenization; the
    /// token count is a lower bound (llama-server's `exceed_context_size_error` shape).
    pub fn prompt_too_long(param: &str, bytes: usize, min_tokens: usize, n_ctx: usize) -> Self {
        let mut error = Self::new(
            StatusCode::BAD_REQUEST,
            "exceed_context_size_error",
            format!(
                "the prompt is {bytes} bytes long: at least {min_tokens} tokens, more than the context of {n_ctx} tokens holds"
            ),
        );
        error.param = Some(param.to_string());
        error.code = Some("exceed_context_size_error");
        error.extra = vec![
            ("n_prompt_tokens", json!(min_tokens)),
            ("n_ctx", json!(n_ctx)),
        ];
        error
    }

    /// Whether the same request may succeed later (429 and 503 answers then carry
    /// `Retry-After`): not when it can never fit the K/V cache.
    pub fn retryable(&self) -> bool {
        self.code != Some(KV_CACHE_TOO_SMALL)
    }

    /// A numeric member of `extra` (0 when absent).
    pub fn extra_count(&self, key: &str) -> usize {
        self.extra
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.as_u64())
            .map_or(0, |n| n as usize)
    }

    pub fn queue_full() -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server is busy: the request queue is full, retry later",
        );
        error.code = Some("queue_full");
        error
    }

    pub fn loading() -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the model is still loading",
        );
        error.code = Some("model_loading");
        error
    }

    /// 503 for a request that arrives after a shutdown signal (`lifecycle.rs`): this replica
    /// finishes what it has and takes nothing new, so the request belongs elsewhere (retryable).
    pub fn draining(in_flight: usize) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            format!(
                "the server is shutting down: it finishes the {in_flight} request(s) in flight and admits no new one; retry on another replica"
            ),
        );
        error.code = Some("server_draining");
        error
    }

    /// 503 while the engine's current step has run longer than `--stall-limit` (retryable
    /// elsewhere: this replica's device no longer answers).
    pub fn stalled(running: std::time::Duration) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            format!(
                "the model's current step has run for {:.0} s (longer than --stall-limit): the device no longer answers; retry on another replica",
                running.as_secs_f64()
            ),
        );
        error.code = Some("engine_stalled");
        error
    }

    /// A request still running when `--shutdown-grace` ran out; a stream gets it as its last
    /// event.
    pub fn shutdown_grace_over() -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the server shut down before this request finished (--shutdown-grace ran out); retry it",
        );
        error.code = Some("shutdown_grace_over");
        error
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body, also used for in-stream error events.
    pub fn to_json(&self) -> Value {
        let mut error = json!({
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        });
        for (key, value) in &self.extra {
            error[*key] = value.clone();
        }
        json!({ "error": error })
    }
}

/// The code of a request larger than the whole K/V cache (the engine's `Overloaded`: requests
/// that fit wait for pages instead).
const KV_CACHE_TOO_SMALL: &str = "kv_cache_full";

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::InvalidRequest(message) => ApiError::bad_request(message),
            EngineError::InvalidParam { param, message } => ApiError::invalid(param, message),
            EngineError::Template(_) => ApiError::bad_request(error.to_string()),
            EngineError::ContextExceeded {
                n_prompt_tokens,
                n_ctx,
            } => {
                let mut api = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "exceed_context_size_error",
                    error.to_string(),
                );
                api.code = Some("exceed_context_size_error");
                api.extra = vec![
                    ("n_prompt_tokens", json!(n_prompt_tokens)),
                    ("n_ctx", json!(n_ctx)),
                ];
                api
            }
            EngineError::QueueFull => ApiError::queue_full(),
            EngineError::Overloaded(message) => {
                let mut api = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable_error",
                    message,
                );
                api.code = Some(KV_CACHE_TOO_SMALL);
                api
            }
            EngineError::Load(message) | EngineError::Internal(message) => {
                ApiError::internal(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_the_field() {
        let body = ApiError::invalid("temperature", "must be between 0 and 2").to_json();
        assert_eq!(body["error"]["param"], "temperature");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "must be between 0 and 2");
        assert!(body["error"]["code"].is_null());
    }

    #[test]
    fn context_exceeded_carries_counts() {
        let api = ApiError::from(EngineError::ContextExceeded {
            n_prompt_tokens: 600,
            n_ctx: 512,
        });
        assert_eq!(api.status, StatusCode::BAD_REQUEST);
        let body = api.to_json();
        assert_eq!(body["error"]["type"], "exceed_context_size_error");
        assert_eq!(body["error"]["n_prompt_tokens"], 600);
        assert_eq!(body["error"]["n_ctx"], 512);
    }

    #[test]
    fn engine_errors_map_to_statuses() {
        assert_eq!(
            ApiError::from(EngineError::QueueFull).status,
            StatusCode::TOO_MANY_REQUESTS
        );
        let too_large = ApiError::from(EngineError::Overloaded("x".into()));
        assert_eq!(too_large.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !too_large.retryable(),
            "a request the cache can never hold is not worth retrying"
        );
        assert!(ApiError::queue_full().retryable());
        assert!(ApiError::loading().retryable());
        assert_eq!(
            ApiError::from(EngineError::InvalidRequest("x".into())).status,
            StatusCode::BAD_REQUEST
        );
        let field = ApiError::from(EngineError::InvalidParam {
            param: "algorithm",
            message: "x".into(),
        });
        assert_eq!(field.status, StatusCode::BAD_REQUEST);
        assert_eq!(field.to_json()["error"]["param"], "algorithm");
        assert_eq!(
            ApiError::from(EngineError::Internal("x".into())).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
