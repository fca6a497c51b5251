//! The engine around a scripted model that reads its own K/V pages: every page remembers the ids
//! written into it, and a row's prediction depends on the first id of the sequence the row's
//! pages belong to. Two requests with different prompts therefore get different answers, and a
//! row computed over another request's pages, or handed to the wrong request, gets the other
//! request's answer. With it, behaviour a random-weight model only does by chance is forced:
//! two interleaved requests with different targets, and a model that writes a tool call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use minnow_engine::{
    ChatMessage, ChatPrompt, Engine, EngineOptions, Event, FinishReason, GenerateRequest,
    RequestHandle, ToolCall, ToolChoice,
};
use minnow_model::{Config, ModelRunner, PageId, Segment, SegmentOutput, Want};

const FIXTURE: &str = "llada2-tiny-v21";
const PAGES: usize = 1024;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(FIXTURE)
}

/// What the model writes: `(first id of the sequence, position) → token`.
type Script = Box<dyn Fn(u32, usize) -> u32 + Send>;

struct PageReadingRunner {
    config: Config,
    /// The ids written at each page's positions (what the page's K/V would encode).
    pages: HashMap<PageId, Vec<u32>>,
    script: Script,
    /// Deliberately broken: in a batch of several segments, segment k reads the first id of
    /// segment k + 1's sequence (the outputs of the test of the test).
    crossed: bool,
    /// The most segments one forward held.
    widest_batch: Arc<AtomicUsize>,
    /// The latest forward's wanted logits rows, for `logits_row`.
    kept: (minnow_model::runner::TopKRows, Vec<f32>),
}

impl PageReadingRunner {
    fn new(script: impl Fn(u32, usize) -> u32 + Send + 'static, crossed: bool) -> Self {
        let mut config = Config::from_dir(&fixture()).unwrap();
        // Room for the tool prompts (the fixture's own context is 512).
        config.max_position_embeddings = 4096;
        Self {
            config,
            pages: HashMap::new(),
            script: Box::new(script),
            crossed,
            widest_batch: Arc::new(AtomicUsize::new(0)),
            kept: Default::default(),
        }
    }
}

impl ModelRunner for PageReadingRunner {
    fn config(&self) -> &Config {
        &self.config
    }
    fn device_name(&self) -> String {
        "scripted, reading its pages".into()
    }
    fn kv_pages(&self) -> usize {
        PAGES
    }
    fn kv_page_bytes(&self) -> usize {
        1
    }
    fn forward_batch(
        &mut self,
        segments: &[Segment<'_>],
    ) -> minnow_model::Result<Vec<SegmentOutput>> {
        minnow_model::batch::validate(&self.config, PAGES, segments)?;
        // A forward takes a moment, so that a request submitted just after another joins it.
        std::thread::sleep(std::time::Duration::from_millis(2));
        self.widest_batch
            .fetch_max(segments.len(), Ordering::Relaxed);
        let block = self.config.block_size;
        for seg in segments {
            for (i, &id) in seg.ids.iter().enumerate() {
                let pos = seg.start + i;
                let page = self
                    .pages
                    .entry(seg.pages[pos / block])
                    .or_insert_with(|| vec![u32::MAX; block]);
                page[pos % block] = id;
            }
        }
        let vocab = self.config.vocab_size;
        let n = segments.len();
        let mut out = Vec::with_capacity(n);
        let mut kept = Vec::new();
        for (k, seg) in segments.iter().enumerate() {
            let source = if self.crossed && n > 1 {
                (k + 1) % n
            } else {
                k
            };
            let first = self.pages[&segments[source].pages[0]][0];
            let rows = seg.want.rows();
            let mut logits = vec![0f32; rows.len() * vocab];
            for (r, row) in logits.chunks_exact_mut(vocab).enumerate() {
                row[(self.script)(first, seg.start + rows.start + r) as usize] = 20.0;
            }
            out.push(match seg.want {
                Want::Nothing => SegmentOutput::Nothing,
                Want::Logits(_) => SegmentOutput::Logits(logits.clone()),
                Want::Top1(_) => SegmentOutput::Top1(
                    logits
                        .chunks_exact(vocab)
                        .map(minnow_model::runner::top1)
                        .collect(),
                ),
                Want::TopK(_) => {
                    SegmentOutput::TopK(minnow_model::runner::top_k_of_rows(&logits, vocab))
                }
            });
            kept.extend_from_slice(&logits);
        }
        self.kept = (minnow_model::runner::TopKRows::new(segments), kept);
        Ok(out)
    }
    fn logits_row(&mut self, segment: usize, row: usize) -> minnow_model::Result<Vec<f32>> {
        let at = self.kept.0.index(segment, row)?;
        let v = self.config.vocab_size;
        Ok(self.kept.1[at * v..(at + 1) * v].to_vec())
    }
}

/// An engine whose model answers a prompt starting with `first` (and `prompt_len` long) with
/// `answer` and then end-of-text; token 0 anywhere else.
fn engine(
    answers: Vec<(u32, usize, Vec<u32>)>,
    parallel: usize,
    crossed: bool,
) -> (Engine, Arc<AtomicUsize>) {
    let eos = Config::from_dir(&fixture()).unwrap().eos_token_id.unwrap();
    let runner = PageReadingRunner::new(
        move |first, pos| {
            answers
                .iter()
                .find(|(f, _, _)| *f == first)
                .and_then(|(_, len, answer)| {
                    let i = pos.checked_sub(*len)?;
                    Some(answer.get(i).copied().unwrap_or(eos))
                })
                .unwrap_or(0)
        },
        crossed,
    );
    let widest = runner.widest_batch.clone();
    let options = EngineOptions {
        parallel,
        ..Default::default()
    };
    let engine = Engine::with_runner(&fixture(), Box::new(runner), options).unwrap();
    (engine, widest)
}

fn events(handle: &mut RequestHandle) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(event) = handle.blocking_next_event() {
        let end = matches!(event, Event::Done { .. } | Event::Error(_));
        events.push(event);
        if end {
            break;
        }
    }
    events
}

/// (finish reason, output ids, content, tool calls) of a finished request.
fn done(events: &[Event]) -> (FinishReason, Vec<u32>, String, Vec<ToolCall>) {
    match events.last() {
        Some(Event::Done {
            finish_reason,
            output_ids,
            text,
            tool_calls,
            ..
        }) => (
            *finish_reason,
            output_ids.clone(),
            text.clone(),
            tool_calls.clone(),
        ),
        other => panic!("expected Done, got {other:?}"),
    }
}

fn tokens(engine: &Engine, text: &str, n: usize) -> Vec<u32> {
    let ids = engine.tokenize(text).unwrap();
    assert!(ids.len() >= n, "{text:?} is only {} tokens", ids.len());
    ids[..n].to_vec()
}

/// Two requests with different prompts and different answers, decoded two at a time: their
/// outputs as produced when decoding (max tokens 70 and 30), and whether a forward ever held
/// both.
fn two_requests_at_once(crossed: bool) -> ([Vec<u32>; 2], [Vec<u32>; 2], usize) {
    // Prompts and answers are tokenized by a throwaway engine (same tokenizer).
    let (plain, _) = engine(Vec::new(), 1, false);
    let prompts = [
        tokens(
            &plain,
            &"The quick brown fox jumps over the lazy dog. ".repeat(8),
            40,
        ),
        tokens(
            &plain,
            &"Pack my box with five dozen liquor jugs. ".repeat(8),
            40,
        ),
    ];
    let answers = [
        tokens(&plain, &"one two three four five six ".repeat(12), 70),
        tokens(&plain, &"seven eight nine ten eleven ".repeat(12), 30),
    ];
    assert_ne!(prompts[0][0], prompts[1][0], "the prompts must start apart");
    assert_ne!(answers[0][..30], answers[1][..30]);
    let script = (0..2)
        .map(|i| (prompts[i][0], 40, answers[i].clone()))
        .collect();
    let (engine, widest) = engine(script, 2, crossed);
    let submit = |i: usize| {
        engine
            .submit(GenerateRequest {
                prompt_ids: prompts[i].clone(),
                max_tokens: Some(answers[i].len()),
                ..Default::default()
            })
            .unwrap()
    };
    let (mut a, mut b) = (submit(0), submit(1));
    let got = [done(&events(&mut a)).1, done(&events(&mut b)).1];
    (got, answers, widest.load(Ordering::Relaxed))
}

#[test]
fn parallel_requests_interleave_and_match_a_lone_run() {
    let (got, answers, widest) = two_requests_at_once(false);
    assert!(widest >= 2, "no forward held both requests");
    assert_eq!(got[0], answers[0], "request a");
    assert_eq!(got[1], answers[1], "request b");
}

/// The test of the test: a runner that hands batched rows the other request's answer makes the
/// check above fail.
#[test]
fn crossed_outputs_would_fail_the_parallel_check() {
    let (got, answers, widest) = two_requests_at_once(true);
    assert!(widest >= 2);
    assert_ne!(
        got[0], answers[0],
        "crossed outputs went unseen for request a"
    );
    assert_ne!(
        got[1], answers[1],
        "crossed outputs went unseen for request b"
    );
}

fn weather_prompt(choice: ToolChoice) -> ChatPrompt {
    ChatPrompt {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: "Weather in Paris?".into(),
            ..Default::default()
        }],
        tools: vec![serde_json::json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }})],
        tool_choice: choice,
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// Renders the weather question under `tool_choice: required` and has the model write
/// `continuation` after the steering prefix; returns the events.
fn required_call_answered_with(continuation: &str) -> (String, Vec<Event>) {
    let (plain, _) = engine(Vec::new(), 1, false);
    let rendered = plain
        .render_chat(&weather_prompt(ToolChoice::Required))
        .unwrap();
    let prefix = rendered.forced_prefix.clone().expect("a steering prefix");
    assert!(rendered.text.ends_with(&prefix));
    let prompt = plain.tokenize(&rendered.text).unwrap();
    let answer = plain.tokenize(continuation).unwrap();
    let (engine, _) = engine(vec![(prompt[0], prompt.len(), answer)], 1, false);
    let mut handle = engine
        .submit(GenerateRequest {
            prompt_ids: prompt,
            max_tokens: Some(96),
            forced_prefix: rendered.forced_prefix,
            tool_names: vec!["get_weather".into()],
            ..Default::default()
        })
        .unwrap();
    (prefix, events(&mut handle))
}

#[test]
fn tool_choice_required_with_a_model_that_calls_returns_the_call_streamed_and_whole() {
    let (prefix, events) = required_call_answered_with(
        "get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    assert!(prefix.contains("<tool_call>"), "{prefix:?}");
    let (reason, _, content, calls) = done(&events);
    assert_eq!(reason, FinishReason::ToolCalls, "{events:?}");
    assert_eq!(content, "");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].name, "get_weather");
    let arguments: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(arguments, serde_json::json!({"city": "Paris"}));
    // The streamed fragments rebuild the same call, OpenAI-client style.
    let mut rebuilt: Vec<(String, String, String)> = Vec::new();
    for event in &events {
        if let Event::Block {
            tool_call_deltas, ..
        } = event
        {
            for delta in tool_call_deltas {
                if delta.index == rebuilt.len() {
                    rebuilt.push((
                        delta.id.clone().expect("the first fragment carries the id"),
                        delta.name.clone().expect("and the name"),
                        String::new(),
                    ));
                }
                rebuilt[delta.index].2.push_str(&delta.arguments);
            }
        }
    }
    assert_eq!(
        rebuilt,
        vec![(
            calls[0].id.clone(),
            calls[0].name.clone(),
            calls[0].arguments.clone()
        )]
    );
}

/// `required` steers, it cannot compel: a model that answers in prose after the steering prefix
/// makes no call, and the unterminated markup comes back as text (docs/api.md, "Tool calls").
#[test]
fn tool_choice_required_with_a_model_that_does_not_call_returns_the_markup_as_text() {
    let (prefix, events) = required_call_answered_with("I would rather not.");
    let (reason, _, content, calls) = done(&events);
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(content, format!("{prefix}I would rather not."));
}
