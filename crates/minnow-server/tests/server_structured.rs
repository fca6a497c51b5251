//! Structured outputs over HTTP on the tiny fixtures (noise text, so only the grammar makes an
//! answer valid): chat `response_format`, streaming, the Responses API's `text.format`, strict
//! tools, llama-server's `json_schema` and `grammar`, grammar errors as 400s, and the official
//! OpenAI Python client's parse helpers when its `openai` and `pydantic` modules are installed.

#[path = "server_harness.rs"]
mod harness;

use harness::*;
use serde_json::{json, Value};

/// Every string, number and array bounded, so a document fits the token budget.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "role": {"enum": ["admin", "user"]},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}
        },
        "required": ["name", "age", "role", "tags"],
        "additionalProperties": false
    })
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Who is it?"}],
        "max_tokens": 128
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

fn assert_valid(schema: &Value, text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    assert!(
        jsonschema::validator_for(schema).unwrap().is_valid(&value),
        "{value} does not validate against {schema}"
    );
}

fn json_schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}})
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_response_formats_and_streaming_obey_the_schema() {
    let server = Server::start(Some(FIXTURE_V21), &[]).await;
    let schema = person_schema();
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        chat(json!({"response_format": json_schema_format(&schema)})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    assert_valid(
        &schema,
        body["choices"][0]["message"]["content"].as_str().unwrap(),
    );

    // Streaming: the deltas add up to a valid document.
    let response = post(
        &server,
        "/v1/chat/completions",
        chat(json!({"response_format": json_schema_format(&schema), "stream": true})),
    )
    .await;
    let text: String = data_events(&read_sse(response).await)
        .iter()
        .filter_map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_valid(&schema, &text);

    // json_object: an object.
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 8})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with('{'), "{content:?}");

    // llama-server's json_schema field, on the raw completion endpoint too.
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "Data:", "max_tokens": 128, "json_schema": schema}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_valid(&schema, body["choices"][0]["text"].as_str().unwrap());

    // A Lark grammar in llama.cpp's llguidance form.
    let grammar = "%llguidance {}\nstart: (\"yes\" | \"no\") \"!\"\n";
    let (status, body) = post_json(
        &server,
        "/v1/completions",
        json!({"prompt": "Answer:", "max_tokens": 16, "grammar": grammar}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(text == "yes!" || text == "no!", "{text:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_grammars_are_400s_naming_the_field_or_the_problem() {
    let server = Server::start(Some(FIXTURE_V21), &[]).await;
    let cases = [
        (chat(json!({"grammar": "root ::= \"a\""})), "grammar"),
        (
            chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format.json_schema.schema",
        ),
        (
            chat(
                json!({"json_schema": person_schema(), "response_format": {"type": "json_object"}}),
            ),
            "response_format",
        ),
    ];
    for (body, param) in cases {
        let (status, body) = post_json(&server, "/v1/chat/completions", body).await;
        let error = assert_error(status, &body, 400, "invalid_request_error");
        assert_eq!(error["param"], param, "{body}");
    }
    // A schema llguidance cannot compile: the message names the kind and the problem.
    let bad = json!({"type": "integer", "minimum": 5, "maximum": 1});
    let (status, body) = post_json(
        &server,
        "/v1/chat/completions",
        chat(json!({"response_format": json_schema_format(&bad)})),
    )
    .await;
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert!(
        error["message"].as_str().unwrap().contains("json_schema"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_text_format_and_strict_tools_validate() {
    let server = Server::start(Some(FIXTURE_V21), &[]).await;
    let schema = person_schema();
    let (status, body) = post_json(
        &server,
        "/v1/responses",
        json!({
            "input": "Who is it?",
            "max_output_tokens": 128,
            "text": {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": true}}
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    let text = body["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_valid(&schema, text);

    // Chat tools with strict: true, forced by tool_choice: one call whose arguments validate.
    // (A small schema and budget: the fixture's template spells tools out within 512 positions.)
    let parameters = json!({
        "type": "object",
        "properties": {"c": {"type": "string", "maxLength": 4}},
        "required": ["c"],
        "additionalProperties": false
    });
    let tools = json!([{"type": "function", "function": {
        "name": "f", "strict": true, "parameters": parameters
    }}]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "f"}}),
    ] {
        let (status, body) = post_json(
            &server,
            "/v1/chat/completions",
            chat(json!({"tools": tools, "tool_choice": choice, "max_tokens": 40})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{body}");
        let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "f");
        assert_valid(&parameters, call["arguments"].as_str().unwrap());
    }
}

/// The official OpenAI Python client's `chat.completions.parse` and `responses.parse` with a
/// Pydantic model. Runs when `python3 -c "import openai, pydantic"` works; reports itself
/// skipped otherwise (CI machines may not have the modules).
#[tokio::test(flavor = "multi_thread")]
async fn official_python_client_parse_helpers() {
    let available = std::process::Command::new("python3")
        .args(["-c", "import openai, pydantic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("skipped: python3 with the openai and pydantic modules is not installed");
        return;
    }
    let server = Server::start(Some(FIXTURE_V21), &[]).await;
    let script = r#"
import sys
from typing import List, Literal
from openai import OpenAI
from pydantic import BaseModel, Field

class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=99)
    role: Literal["admin", "user"]
    tags: List[Literal["x", "y"]] = Field(max_length=2)

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
model = client.models.list().data[0].id
chat = client.chat.completions.parse(
    model=model,
    messages=[{"role": "user", "content": "Who is it?"}],
    response_format=Person,
    max_tokens=128,
)
person = chat.choices[0].message.parsed
assert isinstance(person, Person), chat
response = client.responses.parse(
    model=model, input="Who is it?", text_format=Person, max_output_tokens=128
)
assert isinstance(response.output_parsed, Person), response
print("ok", person.model_dump_json(), response.output_parsed.model_dump_json())
"#;
    let base = server.base.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", script, &base])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("ok"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
