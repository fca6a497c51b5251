//! From a validated OpenAI request to engine work: render and tokenize the prompt, build the
//! `GenerateRequest`, submit it, and (for non-streaming requests) wait for the result. Streaming
//! lives in `sse`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::{Response, StatusCode};
use minnow_engine::{
    ChatIdsOptions, ChatPrompt, Engine, EngineError, Event, FinishReason, GenerateRequest,
    GenerationStats, RenderedPrompt, ToolCall, ToolCallDelta,
};
use rand::Rng;
use tokio::sync::Semaphore;

use super::errors::ApiError;
use super::http::{json_response, Body};
use super::openai::{ChatRequest, CommonOptions, CompletionRequest, MaxTokens, PromptInput};
use super::responses::{self, Endpoint, Outcome, ResponseMeta, StopCause};
use super::state::{unix_now, AppState, RequestLog};

/// A request ready to submit.
pub struct Job {
    pub meta: ResponseMeta,
    pub common: CommonOptions,
    pub request: GenerateRequest,
    /// `parallel_tool_calls: false`: only the first call is returned.
    pub single_tool_call: bool,
}

impl Job {
    /// Drops the fragments of every call after the first when only one call is allowed.
    pub fn filter_deltas(&self, deltas: &[ToolCallDelta]) -> Vec<ToolCallDelta> {
        deltas
            .iter()
            .filter(|d| !self.single_tool_call || d.index == 0)
            .cloned()
            .collect()
    }

    pub fn filter_calls(&self, calls: &[ToolCall]) -> Vec<ToolCall> {
        let keep = if self.single_tool_call {
            1
        } else {
            calls.len()
        };
        calls.iter().take(keep).cloned().collect()
    }
}

/// Runs a synchronous engine call off the async workers (tokenizing a megabyte prompt or
/// rendering a template is CPU work).
async fn blocking<T: Send + 'static>(
    engine: &Engine,
    work: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || work(&engine))
        .await
        .map_err(|e| ApiError::internal(format!("engine task failed: {e}")))?
        .map_err(ApiError::from)
}

/// 404 when the request names a model this server does not serve (absent is fine).
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(name) if name == state.model_id => Ok(()),
        Some(name) if name == state.config.model_path.to_string_lossy() => Ok(()),
        Some(name) => Err(ApiError::model_not_found(name)),
    }
}

/// Tokenizations running at once (each holds a few hundred bytes per prompt byte while it runs);
/// more wait their turn instead of multiplying the peak memory. A turn is held by the blocking
/// task itself, so work whose client has gone keeps counting until it has stopped.
static TOKENIZING: Semaphore = Semaphore::const_new(2);

/// Tells blocking work that its request was dropped (the client went away): set when the
/// request's future drops this guard, read by the work between pieces (`cancelled`).
struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    fn new() -> Self {
        CancelOnDrop(Arc::new(AtomicBool::new(false)))
    }

    /// A check for the blocking work.
    fn cancelled(&self) -> impl Fn() -> bool + Send + 'static {
        let flag = self.0.clone();
        move || flag.load(Ordering::Relaxed)
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs a tokenizing job on a blocking thread in one of the `TOKENIZING` turns; the job stops
/// early (between pieces) if the request is dropped meanwhile.
pub async fn tokenizing<T: Send + 'static>(
    engine: &Engine,
    work: impl FnOnce(&Engine, &dyn Fn() -> bool) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    let turn = TOKENIZING
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the tokenizer queue is closed"))?;
    let guard = CancelOnDrop::new();
    let cancelled = guard.cancelled();
    let result = blocking(engine, move |engine| {
        let _turn = turn;
        if cancelled() {
            return Err(EngineError::InvalidRequest("the client went away".into()));
        }
        work(engine, &cancelled)
    })
    .await;
    drop(guard);
    result
}

/// Normalization may shrink text a little; the byte bound allows for twice the plain estimate.
const NORMALIZATION_SLACK: usize = 2;

/// Refuses a prompt text that cannot fit the context, before it is rendered or tokenized: no
/// token stands for more than `max_token_bytes` bytes, so `bytes` of text need at least
/// `bytes / max_token_bytes` tokens.
pub fn check_prompt_bytes(engine: &Engine, bytes: usize, param: &str) -> Result<(), ApiError> {
    let n_ctx = engine.info().n_ctx;
    let per_token = engine.tokenizer().max_token_bytes();
    let bound = n_ctx
        .saturating_mul(per_token)
        .saturating_mul(NORMALIZATION_SLACK);
    if bytes <= bound {
        return Ok(());
    }
    Err(ApiError::prompt_too_long(
        param,
        bytes,
        bytes.div_ceil(per_token * NORMALIZATION_SLACK),
        n_ctx,
    ))
}

/// Bytes of client text in a conversation (what the template will copy into the prompt).
fn conversation_bytes(prompt: &ChatPrompt) -> usize {
    let messages: usize = prompt
        .messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.reasoning_content.as_ref().map_or(0, String::len)
                + m.tool_calls
                    .iter()
                    .map(|c| c.arguments.len() + c.name.len())
                    .sum::<usize>()
        })
        .sum();
    messages
        + prompt
            .tools
            .iter()
            .map(|t| t.to_string().len())
            .sum::<usize>()
}

/// Renders a conversation as `/apply-template` shows it (the client's text as written).
pub async fn render(state: &AppState, prompt: ChatPrompt) -> Result<RenderedPrompt, ApiError> {
    let engine = state.engine()?;
    let protect = !state.config.allow_special_in_content;
    blocking(engine, move |engine| {
        let (rendered, _) = render_and_tokenize(engine, prompt, protect, false, &|| false)?;
        Ok(rendered)
    })
    .await
}

/// Renders a conversation and (when `tokenize`) its ids; with `protect`, special-token strings
/// in the client's text stay plain text (`Engine::chat_prompt_ids_with`, the engine's one way
/// from a chat to ids).
fn render_and_tokenize(
    engine: &Engine,
    prompt: ChatPrompt,
    protect: bool,
    tokenize: bool,
    cancelled: &dyn Fn() -> bool,
) -> Result<(RenderedPrompt, Vec<u32>), EngineError> {
    // The template adds its markup: check the rendered text too before tokenizing it.
    let fits = |rendered: &RenderedPrompt| {
        check_prompt_bytes(engine, rendered.text.len(), "messages").map_err(|e| {
            EngineError::ContextExceeded {
                n_prompt_tokens: e.extra_count("n_prompt_tokens"),
                n_ctx: engine.info().n_ctx,
            }
        })
    };
    if !protect {
        let rendered = engine.render_chat(&prompt)?;
        fits(&rendered)?;
        let ids = if tokenize {
            engine.tokenize(&rendered.text)?
        } else {
            Vec::new()
        };
        return Ok((rendered, ids));
    }
    let options = ChatIdsOptions {
        tokenize,
        check_rendered: Some(&fits),
        cancelled: Some(cancelled),
    };
    let (ids, rendered) = engine.chat_prompt_ids_with(&prompt, &options)?;
    Ok((rendered, ids))
}

pub async fn prepare_chat(state: &Arc<AppState>, chat: ChatRequest) -> Result<Job, ApiError> {
    check_model(state, chat.common.model.as_deref())?;
    let engine = state.engine()?;
    check_params(engine, &chat.common)?;
    let prompt = chat.prompt;
    check_prompt_bytes(engine, conversation_bytes(&prompt), "messages")?;
    let protect = !state.config.allow_special_in_content;
    let (rendered, ids) = tokenizing(engine, move |engine, cancelled| {
        render_and_tokenize(engine, prompt, protect, true, cancelled)
    })
    .await?;
    check_prompt_ids(engine, &ids, "messages")?;
    Ok(Job {
        meta: new_meta(state, Endpoint::Chat),
        request: GenerateRequest {
            prompt_ids: ids,
            max_tokens: resolve_max_tokens(state, chat.common.max_tokens),
            stop: chat.common.stop.clone(),
            params: chat.common.params.clone(),
            forced_prefix: rendered.forced_prefix,
            tool_names: chat.tool_names,
            cache_prompt: chat.common.cache_prompt,
            cache_salt: chat.common.cache_salt.clone(),
            constraint: chat.common.constraint.clone(),
        },
        common: chat.common,
        single_tool_call: !chat.parallel_tool_calls,
    })
}

/// A text completion job: OpenAI's `/v1/completions` (`Endpoint::Completion`) or
/// llama-server's native `/completion` (`Endpoint::Native`); the same request, other answers.
pub async fn prepare_completion(
    state: &Arc<AppState>,
    completion: CompletionRequest,
    endpoint: Endpoint,
) -> Result<Job, ApiError> {
    check_model(state, completion.common.model.as_deref())?;
    let engine = state.engine()?;
    check_params(engine, &completion.common)?;
    let ids = match completion.prompt {
        PromptInput::Ids(ids) => ids,
        PromptInput::Text(text) => {
            check_prompt_bytes(engine, text.len(), "prompt")?;
            tokenizing(engine, move |engine, _| engine.tokenize(&text)).await?
        }
    };
    check_prompt_ids(engine, &ids, "prompt")?;
    Ok(Job {
        meta: new_meta(state, endpoint),
        request: GenerateRequest {
            prompt_ids: ids,
            max_tokens: resolve_max_tokens(state, completion.common.max_tokens),
            stop: completion.common.stop.clone(),
            params: completion.common.params.clone(),
            forced_prefix: None,
            tool_names: Vec::new(),
            cache_prompt: completion.common.cache_prompt,
            cache_salt: completion.common.cache_salt.clone(),
            constraint: completion.common.constraint.clone(),
        },
        common: completion.common,
        single_tool_call: false,
    })
}

fn new_meta(state: &AppState, endpoint: Endpoint) -> ResponseMeta {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion | Endpoint::Native => "cmpl",
    };
    let suffix: u64 = rand::thread_rng().gen();
    ResponseMeta {
        endpoint,
        id: format!("{prefix}-{suffix:016x}"),
        created: unix_now(),
        model: state.model_id.clone(),
    }
}

fn resolve_max_tokens(state: &AppState, requested: MaxTokens) -> Option<usize> {
    match requested {
        MaxTokens::ServerDefault => state.config.max_tokens,
        MaxTokens::Unlimited => None,
        MaxTokens::Limit(n) => Some(n),
    }
}

/// The engine's check of the decoding parameters (ranges, and an algorithm this checkpoint can
/// run: `indel` needs LLaDA2.2's DELETE/SPLIT tokens), before any tokenizing; the error names the
/// field. `Engine::submit` runs the same check again as part of `Engine::validate`.
fn check_params(engine: &Engine, common: &CommonOptions) -> Result<(), ApiError> {
    engine.check_params(&common.params).map_err(ApiError::from)
}

/// Prompts must be non-empty, in the vocabulary, and free of the mask token (a mask in the
/// prompt would be "denoised" like output). The engine also refuses edit tokens it knows about.
fn check_prompt_ids(engine: &Engine, ids: &[u32], param: &str) -> Result<(), ApiError> {
    engine
        .check_prompt(ids)
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

/// Non-streaming: submit, wait for `Done`, answer with one JSON object. If the client goes
/// away, hyper drops this future, which drops the handle and cancels the request.
pub async fn complete(
    state: &Arc<AppState>,
    mut job: Job,
    log: &RequestLog,
) -> Result<Response<Body>, ApiError> {
    let finished = run_to_end(state, &mut job, log).await?;
    if job.meta.endpoint == Endpoint::Native {
        let stop = stop_cause(state.engine()?, &finished, &job.common.stop);
        let text = &finished.text;
        let body =
            responses::native_final(&job.meta, text, text.contains('\n'), &stop, &finished.stats);
        return Ok(json_response(StatusCode::OK, &body));
    }
    let tool_calls = job.filter_calls(&finished.tool_calls);
    let body = responses::completion_response(
        &job.meta,
        &Outcome {
            text: &finished.text,
            tool_calls: &tool_calls,
            finish: finished.finish_reason,
            stats: &finished.stats,
        },
    );
    Ok(json_response(StatusCode::OK, &body))
}

/// The result of a generation run to its end (tool calls not yet filtered).
pub struct Finished {
    pub finish_reason: FinishReason,
    /// The generated ids (through a stop string that ended the answer).
    pub output_ids: Vec<u32>,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub stats: GenerationStats,
}

impl Finished {
    /// The answer a `Done` event carries, recorded in the metrics and the request's log line:
    /// every endpoint, streamed or not, finishes through here. `None` for any other event.
    pub fn recorded(state: &AppState, log: &RequestLog, event: Event) -> Option<Finished> {
        let Event::Done {
            finish_reason,
            output_ids,
            text,
            tool_calls,
            stats,
        } = event
        else {
            return None;
        };
        state.metrics.record_generation(&stats);
        log.set_generation(&stats);
        log.set_outcome(responses::finish_reason(finish_reason));
        Some(Finished {
            finish_reason,
            output_ids,
            text,
            tool_calls,
            stats,
        })
    }
}

/// Why a finished answer stopped, naming the stop string that ended it. The engine cuts the visible text
/// where a stop string begins but keeps the ids through it, so the stop string that ended an
/// answer is the one its ids spell right after the text; a `Stop` without one is the model's
/// own end.
pub fn stop_cause(engine: &Engine, finished: &Finished, stops: &[String]) -> StopCause {
    match finished.finish_reason {
        FinishReason::Length => return StopCause::Limit,
        FinishReason::Stop if !stops.is_empty() => {}
        _ => return StopCause::Eos,
    }
    let spelled = engine
        .detokenize(&finished.output_ids, false)
        .unwrap_or_default();
    let after = spelled
        .strip_prefix(finished.text.as_str())
        .unwrap_or(spelled.as_str());
    let word = stops
        .iter()
        .find(|stop| after.starts_with(stop.as_str()))
        .or_else(|| {
            // Text and ids disagree (a partial character at the cut): the earliest stop string
            // the ids spell.
            stops
                .iter()
                .filter_map(|stop| spelled.find(stop.as_str()).map(|at| (at, stop)))
                .min_by_key(|(at, _)| *at)
                .map(|(_, stop)| stop)
        });
    word.map_or(StopCause::Eos, |word| StopCause::Word(word.clone()))
}

/// Submits the job's request and waits for `Done`, recording metrics and the log fields; shared
/// by every non-streaming endpoint.
pub async fn run_to_end(
    state: &Arc<AppState>,
    job: &mut Job,
    log: &RequestLog,
) -> Result<Finished, ApiError> {
    let engine = state.engine()?;
    let mut handle = engine.submit(std::mem::take(&mut job.request))?;
    let mut watch = CancelCounter {
        state,
        finished: false,
    };
    loop {
        match handle.next_event().await {
            Some(Event::Error(error)) => {
                watch.finished = true;
                log.set_outcome(format!("error: {error}"));
                return Err(ApiError::from(error));
            }
            Some(event) => {
                if let Some(finished) = Finished::recorded(state, log, event) {
                    watch.finished = true;
                    return Ok(finished);
                }
            }
            None => {
                watch.finished = true;
                return Err(ApiError::internal(
                    "the engine ended the request without a result",
                ));
            }
        }
    }
}

/// Counts a non-streaming generation whose handler hyper dropped (client gone) as cancelled; the
/// `RequestHandle` dropped alongside it cancels the work in the engine.
struct CancelCounter<'a> {
    state: &'a AppState,
    finished: bool,
}

impl Drop for CancelCounter<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.state.metrics.record_cancelled();
        }
    }
}
