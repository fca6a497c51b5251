//! The OpenAI Responses API: `POST /v1/responses` (plain or streamed), `GET` and `DELETE
//! /v1/responses/{id}`, and `POST /v1/responses/input_tokens`.
//!
//! A request's `input` items (`items`) become the chat messages the checkpoint's template
//! renders, then the job goes through the same preparation and engine path as a chat completion
//! (`generation`). The answer is a `response` object (`object`), or its event sequence
//! (`stream`). With `store` (the default) the response and its conversation are kept in an LRU
//! store (`store`, `--responses-max`), so `previous_response_id` continues it without a resend:
//! the continued turn renders exactly the prompt a full resend renders, which is what lets the
//! engine's prefix cache reuse the earlier turn's tokens (reported as
//! `usage.input_tokens_details.cached_tokens`).
//!
//! Map: `request` (body validation) → `items` (conversation → chat messages) → `prepared` (the
//! job and what its answer reports) → `object` / `stream` (answers) ; `store` (state).

mod items;
mod object;
mod prepared;
mod request;
pub(super) mod store;
mod stream;

use std::sync::Arc;

use hyper::{Response, StatusCode};
use minnow_engine::ChatPrompt;
use serde_json::{json, Map};

use super::errors::ApiError;
use super::generation;
use super::http::{json_response, text_response, Body};
use super::openai::{self, ChatRequest};
use super::state::{unix_now, AppState, RequestLog};
use items::Item;
use object::{Header, Status};
use prepared::Prepared;
pub use request::{parse, ResponsesRequest};

/// `POST /v1/responses`, its body already parsed ([`parse`]).
pub async fn create(
    state: &Arc<AppState>,
    request: ResponsesRequest,
    log: &Arc<RequestLog>,
) -> Result<Response<Body>, ApiError> {
    let mut prepared = prepare(state, request).await?;
    if prepared.job.common.stream {
        return stream::start(state, prepared, log.clone());
    }
    let finished = generation::run_to_end(state, &mut prepared.job, log).await?;
    let calls = prepared.job.filter_calls(&finished.tool_calls);
    let output = object::output_items(&finished.text, &calls);
    let status = Status::from_finish(finished.finish_reason);
    let response = object::build(&prepared.header, &status, &output, Some(&finished.stats));
    prepared.remember(state, &response, output);
    Ok(json_response(StatusCode::OK, &response))
}

/// `POST /v1/responses/input_tokens`: the prompt a create request with this body would submit,
/// counted, plus its token ids (`minnow.prompt_ids`, to check what the prefix cache sees).
pub async fn input_tokens(
    state: &Arc<AppState>,
    request: ResponsesRequest,
) -> Result<Response<Body>, ApiError> {
    let prepared = prepare(state, request).await?;
    let ids = &prepared.job.request.prompt_ids;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "object": "response.input_tokens",
            "input_tokens": ids.len(),
            "minnow": {"prompt_ids": ids},
        }),
    ))
}

/// `GET /v1/responses/{id}`.
pub fn retrieve(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    let stored = state
        .responses
        .get(id)
        .ok_or_else(|| response_not_found(id))?;
    Ok(text_response(
        StatusCode::OK,
        "application/json",
        stored.object.to_string(),
    ))
}

/// `DELETE /v1/responses/{id}`.
pub fn delete(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    if !state.responses.remove(id) {
        return Err(response_not_found(id));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"id": id, "object": "response", "deleted": true}),
    ))
}

/// Resolves the conversation, renders and tokenizes it (through the chat path) and names the
/// response.
async fn prepare(state: &Arc<AppState>, request: ResponsesRequest) -> Result<Prepared, ApiError> {
    let parent = match &request.previous_response_id {
        None => None,
        Some(id) => Some(
            state
                .responses
                .get(id)
                .ok_or_else(|| previous_not_found(id))?
                .turn,
        ),
    };
    let history = parent
        .as_ref()
        .map(|turn| turn.conversation())
        .unwrap_or_default();
    check_not_resent(&history, &request.input)?;
    let first_input = history.len();
    let mut conversation = history;
    conversation.extend(request.input.iter().cloned());
    items::check_call_outputs(&conversation, first_input)?;

    let mut messages = items::to_messages(&request.instructions, &conversation);
    if messages.is_empty() {
        return Err(ApiError::invalid("input", "the conversation is empty"));
    }
    if request.json_object {
        openai::add_json_instruction(&mut messages);
    }
    let chat = ChatRequest {
        common: request.common,
        prompt: ChatPrompt {
            messages,
            tools: request.tools,
            tool_choice: request.tool_choice,
            add_generation_prompt: true,
            template_kwargs: Map::new(),
        },
        tool_names: request.tool_names,
        parallel_tool_calls: request.parallel_tool_calls,
    };
    let job = generation::prepare_chat(state, chat)
        .await
        .map_err(|mut error| {
            // The chat path names its prompt `messages`; here it is the conversation.
            if error.param.as_deref() == Some("messages") {
                error.param = Some("input".into());
            }
            error
        })?;
    Ok(Prepared {
        header: Header {
            id: object::new_id("resp"),
            created_at: unix_now(),
            model: state.model_id.clone(),
            echo: request.echo,
        },
        job,
        input: request.input,
        parent,
        store: request.store,
        return_progress: request.return_progress,
    })
}

/// With `previous_response_id`, `input` holds only the new items: resending the stored
/// conversation (all of it, or an item of it by id or call id) would put it in the prompt twice.
fn check_not_resent(history: &[Item], input: &[Item]) -> Result<(), ApiError> {
    if history.is_empty() {
        return Ok(());
    }
    let whole = input.len() >= history.len()
        && history
            .iter()
            .zip(input)
            .all(|(old, new)| old.same_content(new));
    if whole {
        return Err(ApiError::invalid(
            "input",
            "'input' repeats the whole conversation of previous_response_id; send only the new \
             items, or the whole conversation without previous_response_id",
        ));
    }
    // Sets: a long history and a long input are compared in linear time.
    let old_ids: std::collections::HashSet<&str> = history.iter().filter_map(Item::id).collect();
    let old_calls: std::collections::HashSet<&str> = history
        .iter()
        .filter_map(|old| match old {
            Item::FunctionCall { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    for (i, item) in input.iter().enumerate() {
        if let Some(id) = item.id() {
            if old_ids.contains(id) {
                return Err(ApiError::invalid(
                    format!("input[{i}].id"),
                    format!(
                        "item '{id}' is already part of the conversation of previous_response_id"
                    ),
                ));
            }
        }
        if let Item::FunctionCall { call_id, .. } = item {
            if old_calls.contains(call_id.as_str()) {
                return Err(ApiError::invalid(
                    format!("input[{i}].call_id"),
                    format!(
                        "function_call '{call_id}' is already part of the conversation of \
                         previous_response_id"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn not_found(message: String, param: Option<&str>, code: &'static str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        message,
        param: param.map(str::to_string),
        code: Some(code),
        extra: Vec::new(),
    }
}

fn response_not_found(id: &str) -> ApiError {
    not_found(
        format!("no stored response with id '{id}' (never stored, deleted or evicted)"),
        None,
        "response_not_found",
    )
}

fn previous_not_found(id: &str) -> ApiError {
    not_found(
        format!(
            "previous response with id '{id}' not found (never stored, deleted or evicted; \
             resend the whole conversation instead)"
        ),
        Some("previous_response_id"),
        "previous_response_not_found",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use items::Role;

    fn user(text: &str) -> Item {
        Item::Message {
            id: None,
            role: Role::User,
            text: text.into(),
        }
    }

    fn call(id: Option<&str>, call_id: &str) -> Item {
        Item::FunctionCall {
            id: id.map(str::to_string),
            call_id: call_id.into(),
            name: "f".into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn resent_history_is_refused() {
        let history = vec![user("hi"), call(Some("fc_1"), "call_1")];
        assert!(check_not_resent(&history, &[user("next")]).is_ok());
        assert!(check_not_resent(&[], &history).is_ok());
        // The whole conversation again, ids stripped as a client might.
        let resent = vec![user("hi"), call(None, "call_1"), user("next")];
        assert_eq!(
            check_not_resent(&history, &resent)
                .unwrap_err()
                .param
                .as_deref(),
            Some("input")
        );
        assert_eq!(
            check_not_resent(&history, &[call(Some("fc_1"), "call_9")])
                .unwrap_err()
                .param
                .as_deref(),
            Some("input[0].id")
        );
        assert_eq!(
            check_not_resent(&history, &[user("x"), call(None, "call_1")])
                .unwrap_err()
                .param
                .as_deref(),
            Some("input[1].call_id")
        );
    }

    #[test]
    fn not_found_errors_have_the_openai_shape() {
        let error = previous_not_found("resp_x").to_json();
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["param"], "previous_response_id");
        assert_eq!(error["error"]["code"], "previous_response_not_found");
        assert_eq!(response_not_found("r").status, StatusCode::NOT_FOUND);
    }
}
