//! Structured outputs on the random-weight fixtures (whose text is noise, so only the grammar
//! makes an answer valid): every constrained answer is checked by an independent validator
//! (the `jsonschema` crate, the `regex` crate), under the three algorithms and both 2.1 settings,
//! and constrained requests batched with unconstrained ones leave the latter's tokens unchanged.
//!
//! The schemas bound every string, number and array, so that a complete document fits the token
//! budget: the noise model never prefers to close a string, and an unbounded one would run into
//! the budget (finish reason "length", a valid prefix but not a document).

#[path = "support/best_ids_runner.rs"]
mod best_ids_runner;
#[path = "support/fixtures.rs"]
mod fixtures;

use best_ids_runner::BestIdsRunner;

use fixtures::fixture;
use minnow_engine::constraint::OutputConstraint;
use minnow_engine::{
    Algorithm, DecodeParams, Engine, EngineError, EngineOptions, Event, FinishReason,
    GenerateRequest,
};
use minnow_runtime::device::DeviceRequest;
use serde_json::{json, Value};

fn engine(name: &str, parallel: usize) -> Engine {
    Engine::load(
        &fixture(name),
        EngineOptions {
            device: DeviceRequest::Cpu,
            parallel,
            ..Default::default()
        },
    )
    .unwrap()
}

/// What a finished request produced.
struct Answer {
    text: String,
    ids: Vec<u32>,
    reason: FinishReason,
    /// The text of every `Block` event, in order.
    blocks: Vec<String>,
    /// Full logits rows the grammar read because a row's best ids held no allowed token.
    rows_read: usize,
}

fn collect(handle: &mut minnow_engine::RequestHandle) -> Answer {
    let mut blocks = Vec::new();
    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::Block { text_delta, .. } => blocks.push(text_delta),
            Event::Done {
                text,
                output_ids,
                finish_reason,
                stats,
                ..
            } => {
                return Answer {
                    text,
                    ids: output_ids,
                    reason: finish_reason,
                    blocks,
                    rows_read: stats.grammar_rows_read,
                }
            }
            Event::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("the stream ended without Done");
}

fn prompt(seed: u32) -> Vec<u32> {
    (0..5 + seed % 7)
        .map(|i| (seed * 31 + i * 17) % 400)
        .collect()
}

fn request(
    seed: u32,
    constraint: Option<OutputConstraint>,
    params: DecodeParams,
) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt(seed),
        max_tokens: Some(160),
        params,
        constraint,
        ..Default::default()
    }
}

fn joint() -> DecodeParams {
    DecodeParams {
        algorithm: Some(Algorithm::Joint),
        ..Default::default()
    }
}

/// Runs every request at once on `engine` and returns the answers in order.
fn run_all(engine: &Engine, requests: Vec<GenerateRequest>) -> Vec<Answer> {
    let mut handles: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).unwrap())
        .collect();
    handles.iter_mut().map(collect).collect()
}

fn int(min: i64, max: i64) -> Value {
    json!({"type": "integer", "minimum": min, "maximum": max})
}

fn string(min: usize, max: usize) -> Value {
    json!({"type": "string", "minLength": min, "maxLength": max})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

/// At least 50 schemas: scalars, bounded numbers, enums, patterns, arrays with item bounds,
/// nested objects with required and optional members, anyOf, allOf, $ref (both `$defs` and
/// `definitions`), tuples and nullable types.
fn schemas() -> Vec<Value> {
    let mut all = vec![
        json!({"type": "boolean"}),
        json!({"type": "null"}),
        json!({"enum": ["red", "green", "blue"]}),
        json!({"const": "fixed"}),
        json!({"enum": [1, "two", null, true]}),
        json!({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5}),
        json!({"type": "string", "pattern": "^[a-z]{3}$"}),
        json!({"type": "string", "pattern": "^[0-9]{2}-[0-9]{2}$"}),
        json!({"type": "string", "pattern": "^(yes|no|maybe)$"}),
        json!({"type": "string", "enum": ["a", "bb", "ccc"]}),
        json!({"type": ["integer", "null"], "minimum": -3, "maximum": 3}),
        json!({"type": ["string", "null"], "maxLength": 3}),
        json!({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}),
        json!({"type": "array", "items": int(0, 3), "maxItems": 4}),
        json!({"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 2}),
        json!({"type": "array", "items": string(1, 2), "minItems": 0, "maxItems": 3}),
        json!({
            "type": "array",
            "prefixItems": [int(0, 9), {"type": "boolean"}, {"const": "end"}],
            "items": false
        }),
        json!({"type": "array", "items": object(json!({"id": int(0, 99)}), &["id"]), "maxItems": 2}),
        object(
            json!({"name": string(1, 6), "age": int(0, 120)}),
            &["name", "age"],
        ),
        object(json!({"a": {"type": "boolean"}, "b": int(0, 5)}), &[]),
        object(
            json!({"a": {"type": "boolean"}, "b": int(0, 5), "c": {"type": "null"}}),
            &["b"],
        ),
        object(
            json!({"user": object(json!({
                "id": int(1, 999),
                "tags": {"type": "array", "items": {"enum": ["admin", "dev"]}, "maxItems": 2}
            }), &["id", "tags"])}),
            &["user"],
        ),
        object(
            json!({"l1": object(json!({"l2": object(json!({"l3": {"type": "boolean"}}), &["l3"])}), &["l2"])}),
            &["l1"],
        ),
        json!({"anyOf": [int(0, 9), string(0, 3)]}),
        json!({"anyOf": [
            object(json!({"kind": {"const": "a"}, "x": {"type": "boolean"}}), &["kind", "x"]),
            object(json!({"kind": {"const": "b"}, "y": int(0, 9)}), &["kind", "y"])
        ]}),
        json!({"anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "null"}, "maxItems": 2}]}),
        json!({
            "$defs": {"point": object(json!({"x": int(0, 9), "y": int(0, 9)}), &["x", "y"])},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
            "required": ["a", "b"],
            "additionalProperties": false
        }),
        json!({
            "definitions": {"color": {"enum": ["c", "m", "y", "k"]}},
            "type": "array",
            "items": {"$ref": "#/definitions/color"},
            "minItems": 1,
            "maxItems": 3
        }),
        json!({
            "$defs": {"leaf": {"type": "string", "maxLength": 2}, "pair": {
                "type": "array", "prefixItems": [{"$ref": "#/$defs/leaf"}, {"$ref": "#/$defs/leaf"}],
                "items": false
            }},
            "$ref": "#/$defs/pair"
        }),
        json!({"allOf": [
            {"type": "object", "properties": {"a": int(0, 3)}, "required": ["a"]},
            {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}
        ], "additionalProperties": false, "properties": {"a": int(0, 3), "b": {"type": "boolean"}}}),
        object(
            json!({
                "status": {"enum": ["ok", "error"]},
                "code": int(100, 599),
                "detail": {"type": ["string", "null"], "maxLength": 4}
            }),
            &["status", "code", "detail"],
        ),
        object(
            json!({"when": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])$"}}),
            &["when"],
        ),
        object(
            json!({"items": {"type": "array", "items": object(json!({
                "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
                "qty": int(1, 9)
            }), &["sku", "qty"]), "minItems": 1, "maxItems": 2}}),
            &["items"],
        ),
    ];
    // Bounded integers of several widths and signs.
    for (min, max) in [(0, 9), (-50, 50), (100, 999), (-9, -1), (0, 0), (10, 20)] {
        all.push(int(min, max));
    }
    // Strings of bounded length.
    for (min, max) in [(0, 1), (0, 4), (2, 4), (3, 3), (1, 8)] {
        all.push(string(min, max));
    }
    // Objects with 1 to 4 required members of different kinds.
    let members = [
        ("flag", json!({"type": "boolean"})),
        ("count", int(0, 50)),
        ("label", string(0, 5)),
        ("mode", json!({"enum": ["fast", "slow"]})),
    ];
    for n in 1..=4 {
        let mut properties = serde_json::Map::new();
        let mut required = Vec::new();
        for (name, schema) in &members[..n] {
            properties.insert(name.to_string(), schema.clone());
            required.push(*name);
        }
        all.push(object(Value::Object(properties), &required));
    }
    // Arrays of every member kind with different bounds.
    for (i, (_, item)) in members.iter().enumerate() {
        all.push(json!({"type": "array", "items": item, "minItems": i % 2, "maxItems": 1 + i}));
    }
    // Small numbers with bounds (their fractions are bounded by a multiple).
    all.push(json!({"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}));
    all.push(json!({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 10}));
    all
}

fn check_json(schema: &Value, answer: &Answer, what: &str) {
    assert_eq!(
        answer.reason,
        FinishReason::Stop,
        "{what}: the answer {:?} did not end",
        answer.text
    );
    let value: Value = serde_json::from_str(&answer.text)
        .unwrap_or_else(|e| panic!("{what}: {:?} is not JSON: {e}", answer.text));
    let validator = jsonschema::validator_for(schema).unwrap();
    assert!(
        validator.is_valid(&value),
        "{what}: {value} does not validate against {schema}"
    );
    // Streaming: the blocks add up to the answer.
    assert_eq!(answer.blocks.concat(), answer.text, "{what}");
}

#[test]
fn every_answer_validates_against_its_schema() {
    let schemas = schemas();
    assert!(schemas.len() >= 50, "{} schemas", schemas.len());
    let engine = engine("llada2-tiny-v21", 16);
    let requests = schemas
        .iter()
        .enumerate()
        .map(|(i, s)| {
            request(
                i as u32,
                Some(OutputConstraint::JsonSchema(s.clone())),
                joint(),
            )
        })
        .collect();
    for (i, (schema, answer)) in schemas.iter().zip(run_all(&engine, requests)).enumerate() {
        check_json(schema, &answer, &format!("schema #{i}"));
    }
}

#[test]
fn all_algorithms_and_both_editing_settings_obey_the_grammar() {
    let schemas = schemas();
    let picked: Vec<&Value> = [17, 18, 21, 24, 26, 32]
        .iter()
        .map(|&i| &schemas[i])
        .collect();
    let settings = [
        ("llada2-tiny-v20", Algorithm::LowConfidence, None),
        ("llada2-tiny-v21", Algorithm::Joint, None),
        // The 2.1 quality setting: high thresholds, editing on.
        ("llada2-tiny-v21", Algorithm::Joint, Some((0.95, 0.9))),
        ("llada2-tiny-v22", Algorithm::Indel, None),
    ];
    for (fixture_name, algorithm, thresholds) in settings {
        let engine = engine(fixture_name, 8);
        let params = DecodeParams {
            algorithm: Some(algorithm),
            threshold: thresholds.map(|t| t.0),
            editing_threshold: thresholds.map(|t| t.1),
            ..Default::default()
        };
        let requests = picked
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let constraint = Some(OutputConstraint::JsonSchema((*s).clone()));
                request(100 + i as u32, constraint, params.clone())
            })
            .collect();
        for (schema, answer) in picked.iter().zip(run_all(&engine, requests)) {
            check_json(
                schema,
                &answer,
                &format!("{fixture_name} {algorithm:?} {thresholds:?}"),
            );
        }
    }
}

#[test]
fn sampled_answers_obey_the_grammar_too() {
    let engine = engine("llada2-tiny-v21", 4);
    let schema = &schemas()[18];
    let requests = (0..4)
        .map(|seed| {
            let params = DecodeParams {
                algorithm: Some(Algorithm::Joint),
                temperature: Some(1.0),
                top_p: Some(0.9),
                seed: Some(seed),
                ..Default::default()
            };
            request(
                7,
                Some(OutputConstraint::JsonSchema(schema.clone())),
                params,
            )
        })
        .collect();
    for answer in run_all(&engine, requests) {
        check_json(schema, &answer, "sampled");
    }
}

#[test]
fn regexes_match_and_lark_grammars_hold() {
    let engine = engine("llada2-tiny-v22", 8);
    let regexes = [
        r"[0-9]{3}-[0-9]{4}",
        r"(cat|dog|bird)s?",
        r"[A-Z][a-z]{2,5}( [A-Z][a-z]{2,5}){0,2}",
        r"0x[0-9a-f]{1,6}",
        r"(true|false)(,(true|false)){0,3}",
    ];
    let requests = regexes
        .iter()
        .enumerate()
        .map(|(i, rx)| {
            let params = DecodeParams {
                algorithm: Some(Algorithm::Indel),
                ..Default::default()
            };
            request(
                50 + i as u32,
                Some(OutputConstraint::Regex(rx.to_string())),
                params,
            )
        })
        .collect();
    for (rx, answer) in regexes.iter().zip(run_all(&engine, requests)) {
        assert_eq!(answer.reason, FinishReason::Stop, "{rx}: {:?}", answer.text);
        let whole = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
        assert!(whole.is_match(&answer.text), "{rx}: {:?}", answer.text);
    }
    let lark = "start: greeting \" \" name\ngreeting: \"hello\" | \"hi\"\nname: /[a-z]{1,4}/\n";
    let engine = engine_v21();
    let mut handle = engine
        .submit(request(
            60,
            Some(OutputConstraint::Lark(lark.into())),
            joint(),
        ))
        .unwrap();
    let answer = collect(&mut handle);
    assert_eq!(answer.reason, FinishReason::Stop);
    let whole = regex::Regex::new("^(hello|hi) [a-z]{1,4}$").unwrap();
    assert!(whole.is_match(&answer.text), "{:?}", answer.text);
}

fn engine_v21() -> Engine {
    engine("llada2-tiny-v21", 4)
}

#[test]
fn unconstrained_requests_batched_with_constrained_ones_keep_their_tokens() {
    let alone_engine = engine("llada2-tiny-v21", 1);
    let plain = |seed: u32| GenerateRequest {
        prompt_ids: prompt(seed),
        max_tokens: Some(64),
        params: joint(),
        ..Default::default()
    };
    let alone: Vec<Vec<u32>> = [1, 2]
        .iter()
        .map(|&seed| collect(&mut alone_engine.submit(plain(seed)).unwrap()).ids)
        .collect();
    let batched_engine = engine("llada2-tiny-v21", 4);
    let schema = schemas()[18].clone();
    let requests = vec![
        plain(1),
        request(
            3,
            Some(OutputConstraint::JsonSchema(schema.clone())),
            joint(),
        ),
        plain(2),
        request(
            4,
            Some(OutputConstraint::Regex("[a-c]{40}".into())),
            joint(),
        ),
    ];
    let answers = run_all(&batched_engine, requests);
    assert_eq!(answers[0].ids, alone[0]);
    assert_eq!(answers[2].ids, alone[1]);
    check_json(&schema, &answers[1], "batched");
    assert!(regex::Regex::new("^[a-c]{40}$")
        .unwrap()
        .is_match(&answers[3].text));
}

/// The CPU runner answers a constrained greedy step with full logits; the best ids the GPU
/// answers with decide the same tokens. The same requests on the CPU runner made to ask for the
/// best ids give the same answers, for the three greedy algorithms that read them (2.0, 2.1 with
/// and without editing, 2.2), while reading full rows where the fixtures' noise ranks no allowed
/// id among a row's best.
#[test]
fn cpu_constrained_tokens_are_the_same_from_full_logits_and_from_best_ids() {
    let schemas = schemas();
    let settings = [
        ("llada2-tiny-v20", Algorithm::LowConfidence, None),
        ("llada2-tiny-v21", Algorithm::Joint, None),
        ("llada2-tiny-v21", Algorithm::Joint, Some((0.95, 0.9))),
        ("llada2-tiny-v22", Algorithm::Indel, None),
    ];
    for (fixture_name, algorithm, thresholds) in settings {
        let params = DecodeParams {
            algorithm: Some(algorithm),
            threshold: thresholds.map(|t| t.0),
            editing_threshold: thresholds.map(|t| t.1),
            ..Default::default()
        };
        let requests = || {
            let mut requests: Vec<GenerateRequest> = [18, 24]
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let constraint = Some(OutputConstraint::JsonSchema(schemas[s].clone()));
                    request(200 + i as u32, constraint, params.clone())
                })
                .collect();
            let regex = OutputConstraint::Regex("(cat|dog|bird)s? [0-9]{2,4}".into());
            requests.push(request(210, Some(regex), params.clone()));
            requests
        };
        let full_logits = run_all(&engine(fixture_name, 3), requests());
        let cpu = minnow_model::cpu::CpuRunner::load(&fixture(fixture_name)).unwrap();
        let best_ids = Engine::with_runner(
            &fixture(fixture_name),
            Box::new(BestIdsRunner::new(cpu)),
            EngineOptions {
                parallel: 3,
                ..Default::default()
            },
        )
        .unwrap();
        let best_ids = run_all(&best_ids, requests());
        let what = format!("{fixture_name} {algorithm:?} {thresholds:?}");
        for (i, (full, best)) in full_logits.iter().zip(&best_ids).enumerate() {
            assert_eq!(full.ids, best.ids, "{what}: request {i}");
            assert_eq!(full.reason, FinishReason::Stop, "{what}: request {i}");
            assert_eq!(full.rows_read, 0, "{what}: full logits read no row twice");
        }
        let rows_read: usize = best_ids.iter().map(|a| a.rows_read).sum();
        assert!(
            rows_read > 0,
            "{what}: the best ids never sent a row to be read"
        );
    }
}

#[test]
fn grammar_errors_are_invalid_requests_naming_the_problem() {
    let engine = engine_v21();
    for (constraint, needle) in [
        (
            OutputConstraint::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "json_schema",
        ),
        (OutputConstraint::Regex("a{2,1}".into()), "regex"),
        (OutputConstraint::Lark("start: nothing_here".into()), "lark"),
    ] {
        match engine.submit(request(1, Some(constraint), joint())) {
            Err(EngineError::InvalidRequest(message)) => {
                assert!(message.contains(needle), "{message}")
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("{needle}: accepted"),
        }
    }
}

/// A copy of a fixture with a 1024-token context (the templates spell tool definitions out at
/// length; random weights make any position as good as another), and for 2.2 the test template
/// of chat-format doc §3, which writes native tool markers.
fn long_context_checkpoint(name: &str, native_markers: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture(name);
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    if native_markers {
        std::fs::copy(
            fixture("templates/llada2.2-native-tools.test.jinja"),
            dir.path().join("chat_template.jinja"),
        )
        .unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(1024);
    std::fs::write(&config_path, config.to_string()).unwrap();
    dir
}

/// Two strict tools with small schemas (the fixture's context is 512 tokens and its vocabulary
/// spells JSON nearly byte by byte).
fn strict_tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "w",
            "strict": true,
            "parameters": object(json!({"c": string(1, 4)}), &["c"])
        }}),
        json!({"type": "function", "function": {
            "name": "add",
            "strict": true,
            "parameters": object(json!({"a": int(0, 99)}), &["a"])
        }}),
    ]
}

fn check_strict_tool_calls(engine: &Engine, what: &str) {
    use minnow_engine::constraint::tools::strict_tools as read_strict;
    use minnow_engine::{ChatMessage, ChatPrompt, ToolChoice};
    let tools = strict_tools();
    let schema_of = |name: &str| {
        tools
            .iter()
            .find(|t| t["function"]["name"] == name)
            .map(|t| t["function"]["parameters"].clone())
            .unwrap()
    };
    let choices = [
        ToolChoice::Function("add".into()),
        ToolChoice::Required,
        ToolChoice::Auto,
    ];
    for (i, choice) in choices.into_iter().enumerate() {
        let rendered = engine
            .render_chat(&ChatPrompt {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                    ..Default::default()
                }],
                tools: tools.clone(),
                tool_choice: choice.clone(),
                add_generation_prompt: true,
                ..Default::default()
            })
            .unwrap();
        let constraint = OutputConstraint::ToolCalls {
            tools: read_strict(&tools).unwrap(),
            choice: choice.clone(),
        };
        let mut handle = engine
            .submit(GenerateRequest {
                prompt_ids: engine.tokenize(&rendered.text).unwrap(),
                max_tokens: Some(96),
                forced_prefix: rendered.forced_prefix,
                tool_names: vec!["w".into(), "add".into()],
                constraint: Some(constraint),
                params: DecodeParams {
                    seed: Some(i as u64),
                    ..Default::default()
                },
                ..Default::default()
            })
            .unwrap();
        let mut calls = Vec::new();
        let mut done = None;
        while let Some(event) = handle.blocking_next_event() {
            match event {
                Event::Done {
                    tool_calls,
                    finish_reason,
                    text,
                    ..
                } => {
                    calls = tool_calls;
                    done = Some((finish_reason, text));
                }
                Event::Error(e) => panic!("{what}: {e}"),
                _ => {}
            }
        }
        let (reason, text) = done.unwrap();
        if choice != ToolChoice::Auto {
            assert_eq!(
                reason,
                FinishReason::ToolCalls,
                "{what} {choice:?}: {text:?}"
            );
            assert_eq!(calls.len(), 1, "{what} {choice:?}");
        }
        if let ToolChoice::Function(name) = &choice {
            assert_eq!(&calls[0].name, name);
        }
        if calls.is_empty() {
            // `auto` may answer in text (noise here, so it may well run to the budget); in the
            // tagged markup that text cannot hold `<` (decoding doc §13.4).
            assert_eq!(choice, ToolChoice::Auto, "{what}: {text:?}");
            assert!(
                !text.contains('<') || what.contains("native"),
                "{what}: {text:?}"
            );
        }
        for call in &calls {
            let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
            let validator = jsonschema::validator_for(&schema_of(&call.name)).unwrap();
            assert!(
                validator.is_valid(&arguments),
                "{what} {choice:?}: {} {arguments}",
                call.name
            );
        }
    }
}

#[test]
fn strict_tool_call_arguments_validate_in_both_markups() {
    for (name, native, what) in [
        ("llada2-tiny-v21", false, "tagged JSON (2.1)"),
        ("llada2-tiny-v22", true, "native markers (2.2)"),
    ] {
        let dir = long_context_checkpoint(name, native);
        let engine = Engine::load(
            dir.path(),
            EngineOptions {
                device: DeviceRequest::Cpu,
                ..Default::default()
            },
        )
        .unwrap();
        check_strict_tool_calls(&engine, what);
    }
}
