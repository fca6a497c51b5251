//! Request routing: Host and origin guard (`origin.rs`), method and path to handler, API-key
//! check, body limit, CORS for the origins `--cors-origin` allows, and the
//! conversion of every failure into an OpenAI-shaped error response. No handler error or bad
//! input escapes as a panic or a dropped connection.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, ACCEPT_ENCODING, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ALLOW,
    CONNECTION, CONTENT_LENGTH, RETRY_AFTER, VARY, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::errors::ApiError;
use super::fields::{FieldPolicy, IGNORED_FIELDS_HEADER};
use super::generation;
use super::http::{error_response, json_response, text_response, Body};
use super::openai;
use super::origin::Verdict;
use super::responses::Endpoint;
use super::state::{AppState, RequestLog};
use super::{auth, lifecycle, messages_api, responses_api, sse, static_files, worker_api};

/// The API routes. Anything else is a static UI file (with `--ui-dir`) or a 404.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Health,
    Livez,
    Load,
    ServerInfo,
    ModelInfo,
    Models,
    Model,
    Props,
    Slots,
    Metrics,
    ChatCompletions,
    Completions,
    NativeCompletion,
    Tokenize,
    Detokenize,
    ApplyTemplate,
    Responses,
    ResponsesInputTokens,
    StoredResponse,
    Messages,
    MessagesCountTokens,
}

impl Route {
    fn find(path: &str) -> Option<Route> {
        Some(match path {
            "/health" | "/v1/health" | "/health_generate" => Route::Health,
            "/livez" => Route::Livez,
            "/get_load" => Route::Load,
            "/server_info" | "/get_server_info" => Route::ServerInfo,
            "/model_info" | "/get_model_info" => Route::ModelInfo,
            "/v1/models" | "/models" => Route::Models,
            "/props" => Route::Props,
            "/slots" => Route::Slots,
            "/metrics" => Route::Metrics,
            "/v1/chat/completions" | "/chat/completions" => Route::ChatCompletions,
            "/v1/completions" | "/completions" => Route::Completions,
            "/completion" => Route::NativeCompletion,
            "/tokenize" => Route::Tokenize,
            "/detokenize" => Route::Detokenize,
            "/apply-template" => Route::ApplyTemplate,
            "/v1/responses" | "/responses" => Route::Responses,
            "/v1/responses/input_tokens" | "/responses/input_tokens" => Route::ResponsesInputTokens,
            "/v1/messages" => Route::Messages,
            "/v1/messages/count_tokens" => Route::MessagesCountTokens,
            _ if model_id_in_path(path).is_some() => Route::Model,
            _ if response_id_in_path(path).is_some() => Route::StoredResponse,
            _ => return None,
        })
    }

    fn method(self) -> Method {
        match self {
            Route::Health
            | Route::Livez
            | Route::Load
            | Route::ServerInfo
            | Route::ModelInfo
            | Route::Models
            | Route::Model
            | Route::Props
            | Route::Slots
            | Route::Metrics
            | Route::StoredResponse => Method::GET,
            _ => Method::POST,
        }
    }

    /// Whether `method` may be used here: the route's method (GET also answers HEAD), and DELETE
    /// on a stored response.
    fn allows(self, method: &Method) -> bool {
        let allowed = self.method();
        *method == allowed
            || (*method == Method::HEAD && allowed == Method::GET)
            || (self == Route::StoredResponse && *method == Method::DELETE)
    }

    /// Routes that run the model: admitted one by one, and refused while draining
    /// (`lifecycle.rs`).
    fn generates(self) -> bool {
        matches!(
            self,
            Route::ChatCompletions
                | Route::Completions
                | Route::NativeCompletion
                | Route::Responses
                | Route::Messages
        )
    }

    /// Routes of Anthropic's Messages API, whose errors take its shape.
    fn anthropic(self) -> bool {
        matches!(self, Route::Messages | Route::MessagesCountTokens)
    }

    /// Metrics label.
    fn label(self) -> &'static str {
        match self {
            Route::Health => "/health",
            Route::Livez => "/livez",
            Route::Load => "/get_load",
            Route::ServerInfo => "/server_info",
            Route::ModelInfo => "/model_info",
            Route::Models => "/v1/models",
            Route::Model => "/v1/models/{id}",
            Route::Props => "/props",
            Route::Slots => "/slots",
            Route::Metrics => "/metrics",
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::NativeCompletion => "/completion",
            Route::Tokenize => "/tokenize",
            Route::Detokenize => "/detokenize",
            Route::ApplyTemplate => "/apply-template",
            Route::Responses => "/v1/responses",
            Route::ResponsesInputTokens => "/v1/responses/input_tokens",
            Route::StoredResponse => "/v1/responses/{id}",
            Route::Messages => "/v1/messages",
            Route::MessagesCountTokens => "/v1/messages/count_tokens",
        }
    }
}

/// The id in `/v1/responses/{id}` (one path segment).
fn response_id_in_path(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/responses/")
        .or_else(|| path.strip_prefix("/responses/"))
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

fn model_id_in_path(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/models/")
        .or_else(|| path.strip_prefix("/models/"))
        .filter(|id| !id.is_empty())
}

/// The hyper service function: never fails, every problem is a response.
pub async fn handle(
    state: Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let id = state.next_request_id();
    let path = request.uri().path().to_string();
    let route = Route::find(&path);
    let label = route.map_or(
        if state.config.ui_dir.is_some() {
            "static"
        } else {
            "unknown"
        },
        Route::label,
    );
    let log = Arc::new(RequestLog::new(
        state.clone(),
        id,
        request.method().as_str(),
        &path,
        label,
    ));
    let verdict = state.config.origin.check(&request);
    let outcome = match &verdict {
        Ok(verdict) => dispatch(&state, route, request, &log, verdict).await,
        Err(refused) => Err(refused.clone()),
    };
    let mut response = match outcome {
        Ok(response) => response,
        Err(error) => {
            if error.status.is_server_error() || error.status.is_client_error() {
                // A client's 4xx is logged with its reason too: the operator sees why.
                log.set_outcome(error.message.clone());
            }
            failure(route, &error)
        }
    };
    log.set_status(response.status().as_u16());
    if let Ok(Verdict::Cors(origin)) = &verdict {
        allow_cross_origin(&mut response, origin.clone());
    }
    if response.status() == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static(auth::CHALLENGE));
    }
    if matches!(
        response.status(),
        StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
    ) {
        // The rest of that body is not worth waiting for.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
        headers.insert("x-request-id", value);
    }
    Ok(response)
}

/// The response of a failed request on `route`: the error in its API's shape (the Messages
/// API's own, else OpenAI's). Busy or loading: SDKs back off and retry on these statuses, so
/// `Retry-After` tells them when (and nothing when the request can never succeed here, so they
/// do not retry it forever).
fn failure(route: Option<Route>, error: &ApiError) -> Response<Body> {
    let mut response = if route.is_some_and(Route::anthropic) {
        messages_api::error_response(error)
    } else {
        error_response(error)
    };
    if error.retryable()
        && matches!(
            error.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
    {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// A browser client on an origin `--cors-origin` allows may read the answer; the key (if any)
/// still protects the API.
fn allow_cross_origin(response: &mut Response<Body>, origin: HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(VARY, HeaderValue::from_static("Origin"));
    headers.insert(
        ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("x-request-id, x-minnow-ignored-fields, retry-after"),
    );
}

async fn dispatch(
    state: &Arc<AppState>,
    route: Option<Route>,
    request: Request<Incoming>,
    log: &Arc<RequestLog>,
    verdict: &Verdict,
) -> Result<Response<Body>, ApiError> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();

    if method == Method::OPTIONS {
        // Only an allowed cross-origin caller gets a CORS preflight answer; a same-origin page
        // never sends one.
        return Ok(match verdict {
            Verdict::Cors(_) => preflight(request.headers()),
            Verdict::SameOrigin => {
                let mut response = Response::new(super::http::full(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, HEAD, POST, OPTIONS"));
                response
            }
        });
    }
    let Some(route) = route else {
        return serve_static(state, &request, &path).await;
    };
    if !route.allows(&method) {
        let refusal = ApiError::method_not_allowed(method.as_str(), &path);
        let mut response = failure(Some(route), &refusal);
        response.headers_mut().insert(
            ALLOW,
            HeaderValue::from_static(match route.method() {
                _ if route == Route::StoredResponse => "GET, HEAD, DELETE",
                Method::GET => "GET, HEAD",
                _ => "POST",
            }),
        );
        return Ok(response);
    }
    if !auth::is_public(&path)
        && !auth::authorized(state.config.api_key.as_deref(), request.headers())
    {
        return Err(ApiError::unauthorized());
    }
    if !route.generates() {
        return serve_route(state, route, request, log, &path).await;
    }
    // A generation holds its admission until its response is sent; a drain waits for it. When
    // the shutdown grace runs out first, a request still waiting for its answer gets a 503 (a
    // stream that has started ends with an error event instead: `sse.rs`).
    state.not_stalled()?;
    let admission = state.lifecycle.admit()?;
    tokio::select! {
        response = serve_route(state, route, request, log, &path) => {
            Ok(lifecycle::hold_until_sent(response?, admission))
        }
        () = state.lifecycle.grace_over() => Err(ApiError::shutdown_grace_over()),
    }
}

async fn serve_route(
    state: &Arc<AppState>,
    route: Route,
    request: Request<Incoming>,
    log: &Arc<RequestLog>,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let method = request.method().clone();
    match route {
        Route::Health => worker_api::health(state),
        Route::Livez => Ok(worker_api::livez(state)),
        Route::Load => Ok(worker_api::load(state)),
        Route::ServerInfo => worker_api::server_info(state),
        Route::ModelInfo => worker_api::model_info(state),
        Route::Metrics => Ok(text_response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(&state.gauges()),
        )),
        Route::Models => models(state),
        Route::Model => {
            let id = percent_decoded(model_id_in_path(path).unwrap_or_default());
            model(state, &id)
        }
        Route::Props => props(state),
        Route::Slots => slots(state),
        Route::ChatCompletions => {
            let body = read_json(state, request).await?;
            let (chat, ignored) = parsed(state, |policy| openai::parse_chat(&body, policy))?;
            // The parsed request holds what is needed; the raw JSON would only double the memory
            // for as long as the generation runs.
            drop(body);
            let job = generation::prepare_chat(state, chat).await?;
            with_ignored(route, run(state, job, log).await, ignored)
        }
        Route::Completions | Route::NativeCompletion => {
            let body = read_json(state, request).await?;
            let (completion, ignored) =
                parsed(state, |policy| openai::parse_completion(&body, policy))?;
            drop(body);
            let endpoint = if route == Route::NativeCompletion {
                Endpoint::Native
            } else {
                Endpoint::Completion
            };
            let job = generation::prepare_completion(state, completion, endpoint).await?;
            with_ignored(route, run(state, job, log).await, ignored)
        }
        Route::Tokenize => {
            let body = read_json(state, request).await?;
            let (request, ignored) = parsed(state, |policy| openai::parse_tokenize(&body, policy))?;
            with_ignored(route, tokenize(state, request).await, ignored)
        }
        Route::Detokenize => {
            let body = read_json(state, request).await?;
            let (ids, ignored) = parsed(state, |policy| openai::parse_detokenize(&body, policy))?;
            let engine = state.engine()?;
            // The token bound of a prompt: no more ids than the context holds.
            let n_ctx = engine.info().n_ctx;
            if ids.len() > n_ctx {
                return Err(ApiError::invalid(
                    "tokens",
                    format!(
                        "{} token ids are more than the context of {n_ctx} tokens holds",
                        ids.len()
                    ),
                ));
            }
            let vocab = engine.info().vocab_size;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "tokens",
                    format!("token id {bad} is outside the vocabulary (size {vocab})"),
                ));
            }
            let content = engine.detokenize(&ids, true)?;
            with_ignored(
                route,
                Ok(json_response(
                    StatusCode::OK,
                    &json!({ "content": content }),
                )),
                ignored,
            )
        }
        Route::ApplyTemplate => {
            let body = read_json(state, request).await?;
            let (chat, ignored) = parsed(state, |policy| openai::parse_chat(&body, policy))?;
            generation::check_model(state, chat.common.model.as_deref())?;
            let rendered = generation::render(state, chat.prompt).await?;
            with_ignored(
                route,
                Ok(json_response(
                    StatusCode::OK,
                    &json!({ "prompt": rendered.text }),
                )),
                ignored,
            )
        }
        Route::Responses => {
            let body = read_json(state, request).await?;
            let (request, ignored) = parsed(state, |policy| responses_api::parse(&body, policy))?;
            drop(body);
            with_ignored(
                route,
                responses_api::create(state, request, log).await,
                ignored,
            )
        }
        Route::ResponsesInputTokens => {
            let body = read_json(state, request).await?;
            let (request, ignored) = parsed(state, |policy| responses_api::parse(&body, policy))?;
            drop(body);
            with_ignored(
                route,
                responses_api::input_tokens(state, request).await,
                ignored,
            )
        }
        Route::Messages | Route::MessagesCountTokens => {
            let body = read_json(state, request).await?;
            let counting = route == Route::MessagesCountTokens;
            let (request, ignored) = parsed(state, |policy| {
                if counting {
                    messages_api::parse_count(&body, policy)
                } else {
                    messages_api::parse(&body, policy)
                }
            })?;
            drop(body);
            let answer = if counting {
                messages_api::count_tokens(state, request).await
            } else {
                messages_api::create(state, request, log).await
            };
            with_ignored(route, answer, ignored)
        }
        Route::StoredResponse => {
            let id = percent_decoded(response_id_in_path(path).unwrap_or_default());
            if method == Method::DELETE {
                responses_api::delete(state, &id)
            } else {
                responses_api::retrieve(state, &id)
            }
        }
    }
}

/// Parses a body under the server's unknown-field policy; returns the parsed request and the
/// `x-minnow-ignored-fields` value (`None` when nothing was ignored).
fn parsed<T>(
    state: &AppState,
    parse: impl FnOnce(&FieldPolicy) -> Result<T, ApiError>,
) -> Result<(T, Option<String>), ApiError> {
    let policy = FieldPolicy::new(state.config.strict_fields);
    let request = parse(&policy)?;
    Ok((request, policy.header_value()))
}

/// Names the ignored fields on the response (errors included: a 400 for another reason may be
/// explained by a misspelt field, so an error becomes its response here).
fn with_ignored(
    route: Route,
    response: Result<Response<Body>, ApiError>,
    ignored: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let Some(ignored) = ignored else {
        return response;
    };
    let mut response = response.unwrap_or_else(|error| failure(Some(route), &error));
    if let Ok(value) = HeaderValue::from_str(&ignored) {
        response.headers_mut().insert(IGNORED_FIELDS_HEADER, value);
    }
    Ok(response)
}

async fn run(
    state: &Arc<AppState>,
    job: generation::Job,
    log: &Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    if job.common.stream {
        sse::start(state, job, log.clone())
    } else {
        generation::complete(state, job, log).await
    }
}

/// Request headers an allowed origin may always send: the key, the body type, the Anthropic
/// SDKs' version headers.
const ALLOWED_HEADERS: &str = "authorization, content-type, x-api-key, x-conversation-id, \
    anthropic-version, anthropic-beta, anthropic-dangerous-direct-browser-access";

/// The answer to an allowed origin's preflight. The headers it asks for are allowed as asked
/// (the SDKs add their own `x-stainless-*` headers, a list that grows): the origin is what the
/// policy checks, and it passed.
fn preflight(request: &hyper::HeaderMap) -> Response<Body> {
    let mut response = Response::new(super::http::full(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    let asked = request
        .get("access-control-request-headers")
        .filter(|value| {
            value.to_str().is_ok_and(|list| {
                list.split(',').all(|name| {
                    let name = name.trim();
                    !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
            })
        })
        .cloned();
    let headers = response.headers_mut();
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    headers.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        asked.unwrap_or(HeaderValue::from_static(ALLOWED_HEADERS)),
    );
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}

/// Bodies over the limit are still read (and discarded) up to this many bytes, so that a client
/// still uploading gets the 413 instead of a broken pipe; beyond it the connection is dropped.
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Time a request body gets after its first byte before `--min-body-rate` applies.
const BODY_RATE_ALLOWANCE: Duration = Duration::from_secs(2);

/// Bodies up to this size are parsed on the async thread; larger ones on a blocking thread, so
/// that parsing megabytes never delays `/health` or another connection.
const PARSE_INLINE_LIMIT: usize = 64 * 1024;

/// Reads the body within `--body-limit` (413 beyond) and at `--min-body-rate` at least (408
/// below), and parses it as a JSON object (`json_body`).
async fn read_json(state: &AppState, request: Request<Incoming>) -> Result<Value, ApiError> {
    let limit = state.config.body_limit;
    let too_large = ApiError::body_too_large(limit);
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return Err(too_large);
    }
    let mut body = request.into_body();
    let mut buffer = Vec::new();
    let mut seen: u64 = 0;
    let pause = state.config.limits.body_timeout;
    let rate = state.config.limits.min_body_rate;
    let mut first_byte: Option<Instant> = None;
    loop {
        // A client that stops sending mid-body gets a 408 instead of holding the connection (and
        // a graceful shutdown) forever; one that trickles gets it once its average falls below
        // the minimum rate.
        let mut wait = pause;
        let mut rate_bound = false;
        if let (Some(start), true) = (first_byte, rate > 0) {
            let due =
                start + BODY_RATE_ALLOWANCE + Duration::from_secs_f64(seen as f64 / rate as f64);
            let left = due.saturating_duration_since(Instant::now());
            if left < wait {
                wait = left;
                rate_bound = true;
            }
        }
        let frame = match tokio::time::timeout(wait, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) if rate_bound => return Err(ApiError::body_too_slow(rate)),
            Err(_) => return Err(ApiError::body_timeout(pause)),
        };
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if first_byte.is_none() && !data.is_empty() {
            first_byte = Some(Instant::now());
        }
        seen += data.len() as u64;
        if seen <= limit as u64 {
            buffer.extend_from_slice(&data);
        } else if seen > DRAIN_LIMIT {
            break;
        }
    }
    if seen > limit as u64 {
        return Err(too_large);
    }
    if buffer.len() <= PARSE_INLINE_LIMIT {
        return openai::parse_json(&buffer);
    }
    tokio::task::spawn_blocking(move || openai::parse_json(&buffer))
        .await
        .map_err(|e| ApiError::internal(format!("the body parser failed: {e}")))?
}

fn model_object(state: &AppState) -> Result<Value, ApiError> {
    let info = state.engine()?.info();
    Ok(json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started_unix,
        "owned_by": "minnow",
        "meta": {
            "family": info.family,
            "n_ctx": info.n_ctx,
            "n_ctx_train": info.n_ctx,
            "n_vocab": info.vocab_size,
            "block_size": info.block_size,
            "path": info.path.display().to_string(),
        },
    }))
}

fn models(state: &AppState) -> Result<Response<Body>, ApiError> {
    let model = model_object(state)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model]}),
    ))
}

fn model(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    if id != state.model_id {
        return Err(ApiError::model_not_found(id));
    }
    Ok(json_response(StatusCode::OK, &model_object(state)?))
}

/// llama-server's `/props` shape (what its web UI reads), plus a `minnow` section. The sampler
/// settings this engine lacks are advertised at their neutral values, which is what the web UI
/// then sends back and what the request validator accepts.
fn props(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let cache = engine.stats().cache;
    let info = engine.info();
    let d = &info.default_params;
    let n_predict = state.config.max_tokens.map_or(-1, |n| n as i64);
    let eos_token = engine
        .detokenize(&[info.eos_token_id], true)
        .unwrap_or_default();
    let algorithm = d
        .algorithm
        .map(|a| serde_json::to_value(a).unwrap_or(Value::Null));
    let params = json!({
        "n_predict": n_predict,
        "max_tokens": n_predict,
        "seed": d.seed.map_or(json!(-1), |s| json!(s)),
        "temperature": d.temperature,
        "top_k": d.top_k,
        "top_p": d.top_p,
        "min_p": 0.0,
        "typical_p": 1.0,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "top_n_sigma": -1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": -1,
        "mirostat": 0,
        "stop": [],
        "samplers": ["top_k", "top_p", "temperature"],
        "stream": true,
        "threshold": d.threshold,
        "editing_threshold": d.editing_threshold,
        "max_post_steps": d.max_post_steps,
        "steps": d.steps,
        "algorithm": algorithm,
    });
    let body = json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": info.n_ctx,
            "speculative": false,
            "is_processing": engine.busy_slots() > 0,
            "params": params,
        },
        "total_slots": info.parallel,
        "model_alias": state.model_id,
        "model_path": info.path.display().to_string(),
        "modalities": {"vision": false, "audio": false},
        "chat_template": info.chat_template,
        "bos_token": "",
        "eos_token": eos_token,
        "build_info": concat!("minnow ", env!("CARGO_PKG_VERSION")),
        "webui": state.config.ui_dir.is_some(),
        "is_sleeping": false,
        "minnow": {
            "family": info.family,
            "block_size": info.block_size,
            "algorithm": algorithm,
            "vocab_size": info.vocab_size,
            "device": info.device,
            "mask_token_id": info.mask_token_id,
            "eos_token_id": info.eos_token_id,
            "role_end_token_id": info.role_end_token_id,
            "queue_capacity": state.config.engine.queue_capacity,
            "queue_depth": engine.queue_depth(),
            "busy_slots": engine.busy_slots(),
            "cache": {
                "type": "paged block-causal kv cache with a shared prefix cache",
                "n_ctx": info.n_ctx,
                "granularity_tokens": info.block_size,
                "pages_total": cache.pages_total,
                "pages_used": cache.pages_held,
                "pages_cached": cache.pages_cached,
                "prefix_cache_hit_tokens": cache.hit_tokens,
                "prefix_cache_evicted_pages": cache.evicted_pages,
            },
            "generation_settings": info.default_params,
        },
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// llama-server `/slots` (the web UI reads `n_ctx` from it): one entry per decoding slot. The
/// engine reports how many slots are busy, not which, so the first `busy_slots` are shown busy.
fn slots(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let n_ctx = engine.info().n_ctx;
    let busy = engine.busy_slots();
    let cache = engine.stats().cache;
    let slots: Vec<Value> = (0..engine.info().parallel)
        .map(|id| {
            json!({
                "id": id,
                "id_task": -1,
                "n_ctx": n_ctx,
                "speculative": false,
                "is_processing": id < busy,
                // The K/V pool and its prefix cache are shared by every slot.
                "kv_cache": {
                    "pages_total": cache.pages_total,
                    "pages_used": cache.pages_held,
                    "pages_cached": cache.pages_cached,
                    "prefix_cache_hit_tokens": cache.hit_tokens,
                },
            })
        })
        .collect();
    Ok(json_response(StatusCode::OK, &Value::Array(slots)))
}

/// llama-server `/tokenize`, under a prompt's byte bound: the text must be able to fit the
/// context (`generation::check_prompt_bytes`, before any work), and it takes a tokenizer turn.
/// Its ids are not held to the context (counting a prompt that is a little too long is a use of
/// this route); the byte bound already bounds them.
async fn tokenize(
    state: &AppState,
    request: openai::TokenizeRequest,
) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    generation::check_prompt_bytes(engine, request.content.len(), "content")?;
    let content = request.content;
    let parse_special = request.parse_special;
    let ids = generation::tokenizing(engine, move |engine, _| {
        if parse_special {
            engine.tokenize(&content)
        } else {
            engine.tokenizer().encode_plain(&content)
        }
    })
    .await?;
    let tokens: Vec<Value> = if request.with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = engine.detokenize(&[id], true).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(json_response(StatusCode::OK, &json!({ "tokens": tokens })))
}

async fn serve_static(
    state: &AppState,
    request: &Request<Incoming>,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let Some(root) = &state.config.ui_dir else {
        return Err(ApiError::route_not_found(path));
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Err(ApiError::route_not_found(path));
    }
    let accepts_gzip = request
        .headers()
        .get(ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("gzip"));
    match static_files::serve(root, path, accepts_gzip).await {
        Ok(Some(response)) => Ok(response),
        Ok(None) => Err(ApiError::route_not_found(path)),
        Err(error) if error.status == StatusCode::BAD_REQUEST => {
            // A traversal attempt: answer like a missing file, revealing nothing.
            Err(ApiError::route_not_found(path))
        }
        Err(error) => Err(error),
    }
}

fn percent_decoded(segment: &str) -> String {
    static_files::percent_decode(segment).unwrap_or_else(|| segment.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match() {
        assert_eq!(
            Route::find("/v1/chat/completions"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(
            Route::find("/chat/completions"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(Route::find("/completions"), Some(Route::Completions));
        assert_eq!(Route::find("/completion"), Some(Route::NativeCompletion));
        assert_eq!(Route::find("/v1/models/abc"), Some(Route::Model));
        assert_eq!(Route::find("/v1/models/"), None);
        assert_eq!(Route::find("/v1/health"), Some(Route::Health));
        assert_eq!(Route::find("/livez"), Some(Route::Livez));
        assert_eq!(Route::find("/get_load"), Some(Route::Load));
        assert_eq!(Route::find("/get_server_info"), Some(Route::ServerInfo));
        assert_eq!(Route::find("/model_info"), Some(Route::ModelInfo));
        assert!(Route::ChatCompletions.generates() && Route::Responses.generates());
        assert!(!Route::Tokenize.generates() && !Route::Health.generates());
        assert_eq!(Route::find("/index.html"), None);
        assert_eq!(Route::Props.method(), Method::GET);
        assert_eq!(Route::Tokenize.method(), Method::POST);
        assert_eq!(Route::find("/v1/responses"), Some(Route::Responses));
        assert_eq!(Route::find("/responses"), Some(Route::Responses));
        assert_eq!(
            Route::find("/v1/responses/input_tokens"),
            Some(Route::ResponsesInputTokens)
        );
        assert_eq!(
            Route::find("/v1/responses/resp_1"),
            Some(Route::StoredResponse)
        );
        assert_eq!(Route::find("/v1/responses/resp_1/input_items"), None);
        assert!(Route::StoredResponse.allows(&Method::DELETE));
        assert!(!Route::Responses.allows(&Method::DELETE));
        assert!(Route::Props.allows(&Method::HEAD));
    }
}
