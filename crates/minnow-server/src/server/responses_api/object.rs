//! The `response` object: identity, status, output items, usage, the echoed request settings,
//! and our `timings`/`minnow` statistics (the same builders chat completions use).

use minnow_engine::{FinishReason, GenerationStats, ToolCall};
use rand::Rng;
use serde_json::{json, Map, Value};

use super::super::responses;
use super::items::{Item, Role};

/// A fresh id with OpenAI's prefix convention (`resp_`, `msg_`, `fc_`).
pub fn new_id(prefix: &str) -> String {
    let suffix: u128 = rand::thread_rng().gen();
    format!("{prefix}_{suffix:032x}")
}

/// How a response ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    InProgress,
    Completed,
    /// Cut short by the token limit (`incomplete_details.reason = "max_output_tokens"`).
    Incomplete,
    Failed(String),
}

impl Status {
    pub fn from_finish(reason: FinishReason) -> Status {
        match reason {
            FinishReason::Length => Status::Incomplete,
            FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Cancelled => {
                Status::Completed
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed(_) => "failed",
        }
    }

    /// The status of the output items of a response with this status.
    pub fn item_status(&self) -> &'static str {
        match self {
            Status::Incomplete | Status::Failed(_) => "incomplete",
            _ => "completed",
        }
    }

    /// The stream event that ends a response with this status.
    pub fn final_event(&self) -> &'static str {
        match self {
            Status::Incomplete => "response.incomplete",
            Status::Failed(_) => "response.failed",
            _ => "response.completed",
        }
    }
}

/// What stays the same across every object of one response.
#[derive(Clone, Debug)]
pub struct Header {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// Request settings reported back (`request::ResponsesRequest::echo`).
    pub echo: Map<String, Value>,
}

/// The output items of a finished non-streaming generation: the text as one message (also when
/// empty and nothing else was produced, as OpenAI does), then one item per call.
pub fn output_items(text: &str, calls: &[ToolCall]) -> Vec<Item> {
    let mut items = Vec::with_capacity(calls.len() + 1);
    if !text.is_empty() || calls.is_empty() {
        items.push(message_item(text));
    }
    items.extend(calls.iter().map(call_item));
    items
}

pub fn message_item(text: &str) -> Item {
    Item::Message {
        id: Some(new_id("msg")),
        role: Role::Assistant,
        text: text.to_string(),
    }
}

pub fn call_item(call: &ToolCall) -> Item {
    Item::FunctionCall {
        id: Some(new_id("fc")),
        call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone(),
    }
}

pub fn usage(stats: &GenerationStats) -> Value {
    json!({
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
    })
}

/// The response object. `stats` is `None` while in progress (no usage yet).
pub fn build(
    header: &Header,
    status: &Status,
    output: &[Item],
    stats: Option<&GenerationStats>,
) -> Value {
    let mut object = json!({
        "id": header.id,
        "object": "response",
        "created_at": header.created_at,
        "status": status.name(),
        "background": false,
        "error": null,
        "incomplete_details": null,
        "model": header.model,
        "output": output.iter().map(|item| item.to_json(status.item_status())).collect::<Vec<_>>(),
        "usage": stats.map(usage),
    });
    for (key, value) in &header.echo {
        object[key.as_str()] = value.clone();
    }
    match status {
        Status::Completed => {
            object["completed_at"] = json!(super::super::state::unix_now());
        }
        Status::Incomplete => {
            object["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        Status::Failed(message) => {
            object["error"] = json!({"code": "server_error", "message": message});
        }
        Status::InProgress => {}
    }
    if let Some(stats) = stats {
        object["timings"] = responses::timings(stats);
        object["minnow"] = responses::generation_stats(stats);
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        let mut echo = Map::new();
        echo.insert("store".into(), json!(true));
        Header {
            id: "resp_1".into(),
            created_at: 7,
            model: "m".into(),
            echo,
        }
    }

    #[test]
    fn usage_reports_cached_tokens() {
        let stats = GenerationStats {
            prompt_tokens: 10,
            cached_tokens: 6,
            completion_tokens: 3,
            ..GenerationStats::default()
        };
        let object = build(&header(), &Status::Completed, &[], Some(&stats));
        assert_eq!(object["usage"]["input_tokens"], 10);
        assert_eq!(object["usage"]["input_tokens_details"]["cached_tokens"], 6);
        assert_eq!(object["usage"]["total_tokens"], 13);
        assert_eq!(object["status"], "completed");
        assert_eq!(object["store"], true);
        assert!(object["completed_at"].is_u64());
        assert_eq!(object["timings"]["cache_n"], 6);
    }

    #[test]
    fn statuses() {
        let incomplete = build(&header(), &Status::Incomplete, &[message_item("x")], None);
        assert_eq!(
            incomplete["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(incomplete["output"][0]["status"], "incomplete");
        assert!(incomplete["usage"].is_null());
        let failed = build(&header(), &Status::Failed("boom".into()), &[], None);
        assert_eq!(failed["error"]["message"], "boom");
        assert_eq!(failed["status"], "failed");
    }

    #[test]
    fn output_layout() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        assert_eq!(
            output_items("", &[]).len(),
            1,
            "an empty answer is an empty message"
        );
        let only_call = output_items("", std::slice::from_ref(&call));
        assert!(matches!(only_call.as_slice(), [Item::FunctionCall { .. }]));
        let both = output_items("hi", &[call]);
        assert!(matches!(
            both.as_slice(),
            [Item::Message { .. }, Item::FunctionCall { .. }]
        ));
    }
}
