//! Turns generated text into OpenAI content and tool calls (chat-format doc §4), for both LLaDA2
//! formats:
//!
//! - [`ToolCallFormat::TaggedJson`] (2.0/2.1): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//!   blocks (§4.1);
//! - [`ToolCallFormat::NativeMarkers`] (2.2): `<|tool_calls_section_begin|>` sections of
//!   `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
//!   calls (§4.2).
//!
//! One scanner serves streaming and the final parse: [`StreamParser::push`] is fed the whole
//! generated text after each committed block and emits what became certain since the last push;
//! [`StreamParser::finish`] resolves the rest. Because both run the same scanner over the same
//! (append-only) text, the streamed deltas always add up to the final result.
//!
//! Policy (documented choices):
//! - **Invalid markup is content.** A call to an undeclared function, with arguments that are not
//!   a JSON object, with malformed JSON or a malformed header, or a call left unterminated by a
//!   stop string or the end of the answer is returned as plain text content, exactly as
//!   generated, never as a tool call.
//! - **A call cut off by the token budget is dropped**, markup and partial arguments alike: the
//!   content ends before it and the finish reason is `length`, so a client sees that the answer
//!   is incomplete without marker text in its content (chat-format doc §4.3: never emit marker
//!   text as content). The server issue requires this for undeclared
//!   names and non-object arguments; the rest follows the same rule so that nothing is lost.
//! - **A call is streamed once it is complete and valid**, as two [`ToolCallDelta`]s: the header
//!   (`index`, `id`, `name`, empty arguments), then the whole `arguments` string. Streaming
//!   argument fragments earlier would make it impossible to turn a call that later proves invalid
//!   into text. Blocks commit up to 32 tokens at once, so the delay is small.
//! - Content ends at the first `<|role_end|>` or `<|endoftext|>`; text after it is dropped.
//! - 2.0/2.1: one `\n` before each call is removed (the template inserts it); whitespace-only text
//!   before, between or after calls is dropped; other text after a call is appended to the content
//!   verbatim. 2.2: text before a section is content verbatim; whitespace inside a section is
//!   skipped; other text inside a section and text after it (unless whitespace-only) is content.
//! - A marker that appears outside its place (e.g. `<|tool_call_begin|>` without a section) is
//!   content.
//! - `arguments` is the JSON object text exactly as generated (trimmed): in 2.2 the text between
//!   the markers, in 2.0/2.1 the `"arguments"` member's value inside the call object. It keeps
//!   the model's key order, spacing and number spelling, and the 2.0/2.1 template prints it back
//!   verbatim in the next turn. A 2.0/2.1 string value that itself holds a JSON object is used as
//!   is; a missing `arguments` key means `{}`.
//! - With no declared tools, nothing is parsed: markup is content.
//! - Call ids are `{call_id_prefix}_{n}` (n = 0, 1, ... in order), e.g. `call_42_0`.

use serde_json::Value as Json;

use super::held_back::partial_prefix_suffix;
use crate::api::{FinishReason, ToolCall, ToolCallDelta};
use crate::error::{EngineError, EngineResult};
use crate::text::tokenizer::markers::{
    ARGUMENT_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END,
};
use crate::text::tokenizer::{EOS_TOKEN, ROLE_END_TOKEN};
use crate::text::tool_format::{ToolCallFormat, TAG_CLOSE, TAG_OPEN};

/// End-of-answer markers: content stops at the first of them.
const END_MARKERS: [&str; 2] = [ROLE_END_TOKEN, EOS_TOKEN];
/// What became visible since the previous push.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Deltas {
    /// New content text (tool markup and held-back text excluded).
    pub content: String,
    /// Newly completed calls, one delta each (index, id, name and the whole arguments).
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Deltas {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// The parsed response.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedOutput {
    /// Content with tool markup removed; may be empty (an API response shows `null` then, when
    /// there are tool calls).
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// `ToolCalls` if at least one valid call was parsed (unless cancelled), else the reason the
    /// generation ended.
    pub finish_reason: FinishReason,
}

/// Incremental parser for one response. Feed it the whole generated text so far after every
/// committed block ([`push`](Self::push)), then call [`finish`](Self::finish) once.
#[derive(Clone, Debug)]
pub struct StreamParser {
    format: ToolCallFormat,
    declared: Vec<String>,
    forced_prefix: String,
    call_id_prefix: String,
    /// Content emitted so far.
    content: String,
    /// Calls emitted so far.
    calls: Vec<ToolCall>,
}

impl StreamParser {
    /// `declared_tool_names` empty disables tool parsing. `forced_prefix` is the steering text
    /// the prompt ended with ([`crate::RenderedPrompt::forced_prefix`]); it is parsed as if the
    /// model had generated it. Call ids are `{call_id_prefix}_{n}`.
    pub fn new(
        format: ToolCallFormat,
        declared_tool_names: Vec<String>,
        forced_prefix: Option<String>,
        call_id_prefix: impl Into<String>,
    ) -> StreamParser {
        StreamParser {
            format,
            declared: declared_tool_names,
            forced_prefix: forced_prefix.unwrap_or_default(),
            call_id_prefix: call_id_prefix.into(),
            content: String::new(),
            calls: Vec::new(),
        }
    }

    /// Parses the generated text so far (without the forced prefix; special tokens kept) as a
    /// partial response and returns what is new. Text that may still turn out to be markup
    /// (a partial marker, an open call, whitespace before a possible call) is held back.
    pub fn push(&mut self, generated_text: &str) -> EngineResult<Deltas> {
        let scan = self.scan(generated_text, false, false);
        self.advance(scan)
    }

    /// Parses the complete generated text (cut at a stop string by the caller, if any) and
    /// returns the last deltas plus the whole response. `end` is why generation ended (`Stop`,
    /// `Length` or `Cancelled`).
    pub fn finish(
        &mut self,
        generated_text: &str,
        end: FinishReason,
    ) -> EngineResult<(Deltas, ParsedOutput)> {
        let scan = self.scan(generated_text, true, end == FinishReason::Length);
        let dropped_call = scan.dropped_call;
        let deltas = self.advance(scan)?;
        let finish_reason = if dropped_call {
            FinishReason::Length
        } else if !self.calls.is_empty() && end != FinishReason::Cancelled {
            FinishReason::ToolCalls
        } else {
            end
        };
        let output = ParsedOutput {
            content: self.content.clone(),
            tool_calls: self.calls.clone(),
            finish_reason,
        };
        Ok((deltas, output))
    }

    fn scan(&self, generated_text: &str, is_final: bool, truncated: bool) -> Scan {
        let text;
        let full = if self.forced_prefix.is_empty() {
            generated_text
        } else {
            text = format!("{}{generated_text}", self.forced_prefix);
            &text
        };
        scan(full, self.format, &self.declared, is_final, truncated)
    }

    /// Emits the difference between the new scan and what was emitted before. Committed text
    /// never changes, so anything but an extension is an internal error.
    fn advance(&mut self, scan: Scan) -> EngineResult<Deltas> {
        let new_content = scan
            .content
            .strip_prefix(self.content.as_str())
            .ok_or_else(|| {
                EngineError::Internal(format!(
                    "streamed content changed: had {:?}, now {:?}",
                    self.content, scan.content
                ))
            })?;
        let mut deltas = Deltas {
            content: new_content.to_string(),
            tool_calls: Vec::new(),
        };
        let same_calls = scan.calls.len() >= self.calls.len()
            && self
                .calls
                .iter()
                .zip(&scan.calls)
                .all(|(old, new)| old.name == new.name && old.arguments == new.arguments);
        if !same_calls {
            return Err(EngineError::Internal(
                "streamed tool calls changed after they were emitted".into(),
            ));
        }
        for call in &scan.calls[self.calls.len()..] {
            let index = self.calls.len();
            let id = format!("{}_{index}", self.call_id_prefix);
            // OpenAI's shape: the header (index, id, name) first, then the argument text.
            deltas.tool_calls.push(ToolCallDelta {
                index,
                id: Some(id.clone()),
                name: Some(call.name.clone()),
                arguments: String::new(),
            });
            deltas.tool_calls.push(ToolCallDelta {
                index,
                id: None,
                name: None,
                arguments: call.arguments.clone(),
            });
            self.calls.push(ToolCall {
                id,
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
        }
        self.content.push_str(&deltas.content);
        Ok(deltas)
    }
}

/// Parses a complete response in one go (same rules as streaming).
pub fn parse_response(
    format: ToolCallFormat,
    declared_tool_names: &[String],
    forced_prefix: Option<&str>,
    generated_text: &str,
    end: FinishReason,
    call_id_prefix: &str,
) -> EngineResult<ParsedOutput> {
    let mut parser = StreamParser::new(
        format,
        declared_tool_names.to_vec(),
        forced_prefix.map(str::to_string),
        call_id_prefix,
    );
    Ok(parser.finish(generated_text, end)?.1)
}

/// A call as parsed, before an id is assigned.
#[derive(Clone, Debug, PartialEq)]
struct ParsedCall {
    name: String,
    arguments: String,
}

/// Everything of the text that is resolved: content and valid calls, in order.
#[derive(Debug, Default)]
struct Scan {
    content: String,
    calls: Vec<ParsedCall>,
    /// A call cut off by the token budget was left out.
    dropped_call: bool,
}

/// How a run of plain text ends.
enum RunEnd<'a> {
    /// A valid call (2.0/2.1) or a section (2.2) follows.
    BeforeCall { strip_newline: bool },
    /// The text is complete and ends with this run.
    FinalTail,
    /// More text may follow: hold back a suffix that may start one of `markers`, and trailing
    /// whitespace when `hold_whitespace` (it may still be dropped).
    PendingTail {
        markers: &'a [&'a str],
        hold_whitespace: bool,
    },
}

impl Scan {
    /// Appends a run of plain text. `after_call`: the run follows a call/section, where
    /// whitespace-only runs are dropped.
    fn push_run(&mut self, run: &str, after_call: bool, end: RunEnd<'_>) {
        let visible = match end {
            RunEnd::BeforeCall { strip_newline } => {
                let run = if strip_newline {
                    run.strip_suffix('\n').unwrap_or(run)
                } else {
                    run
                };
                // 2.0/2.1 (`strip_newline`) hold whitespace back while streaming, so a
                // whitespace-only run before a call can be dropped; 2.2 shows text before a
                // section at once and must keep it.
                if (after_call || strip_newline) && run.trim().is_empty() {
                    ""
                } else {
                    run
                }
            }
            RunEnd::FinalTail => {
                if after_call && run.trim().is_empty() {
                    ""
                } else {
                    run
                }
            }
            RunEnd::PendingTail {
                markers,
                hold_whitespace,
            } => {
                let run = &run[..run.len() - partial_prefix_suffix(run, markers)];
                if hold_whitespace || after_call {
                    run.trim_end()
                } else {
                    run
                }
            }
        };
        self.content.push_str(visible);
    }
}

fn find_from(text: &str, from: usize, pattern: &str) -> Option<usize> {
    text[from..].find(pattern).map(|i| from + i)
}

/// `truncated`: the text ended because the token budget ran out (only meaningful when final).
fn scan(
    text: &str,
    format: ToolCallFormat,
    declared: &[String],
    is_final: bool,
    truncated: bool,
) -> Scan {
    // Content ends at the first end marker; what precedes it is complete.
    let (text, is_final, truncated) = match END_MARKERS.iter().filter_map(|m| text.find(m)).min() {
        Some(end) => (&text[..end], true, false),
        None => (text, is_final, truncated),
    };
    let mut out = Scan::default();
    if declared.is_empty() {
        let end = if is_final {
            RunEnd::FinalTail
        } else {
            RunEnd::PendingTail {
                markers: &END_MARKERS,
                hold_whitespace: false,
            }
        };
        out.push_run(text, false, end);
        return out;
    }
    match format {
        ToolCallFormat::TaggedJson => scan_tagged(text, declared, is_final, truncated, &mut out),
        ToolCallFormat::NativeMarkers => scan_native(text, declared, is_final, truncated, &mut out),
    }
    out
}

/// 2.0/2.1 (§4.1).
fn scan_tagged(text: &str, declared: &[String], is_final: bool, truncated: bool, out: &mut Scan) {
    const HELD: [&str; 3] = [TAG_OPEN, ROLE_END_TOKEN, EOS_TOKEN];
    let mut run_start = 0;
    let mut pos = 0;
    let mut after_call = false;
    loop {
        let Some(open) = find_from(text, pos, TAG_OPEN) else {
            let end = if is_final {
                RunEnd::FinalTail
            } else {
                RunEnd::PendingTail {
                    markers: &HELD,
                    hold_whitespace: true,
                }
            };
            out.push_run(&text[run_start..], after_call, end);
            return;
        };
        let body_start = open + TAG_OPEN.len();
        let Some(close) = find_from(text, body_start, TAG_CLOSE) else {
            if is_final && truncated {
                // Cut off by the token budget: the text before it, then nothing.
                let end = RunEnd::BeforeCall {
                    strip_newline: true,
                };
                out.push_run(&text[run_start..open], after_call, end);
                out.dropped_call = true;
            } else if is_final {
                // Unterminated call: content, as generated.
                out.push_run(&text[run_start..], after_call, RunEnd::FinalTail);
            } else {
                let end = RunEnd::PendingTail {
                    markers: &[],
                    hold_whitespace: true,
                };
                out.push_run(&text[run_start..open], after_call, end);
            }
            return;
        };
        pos = close + TAG_CLOSE.len();
        if let Some(call) = parse_tagged_call(&text[body_start..close], declared) {
            let end = RunEnd::BeforeCall {
                strip_newline: true,
            };
            out.push_run(&text[run_start..open], after_call, end);
            out.calls.push(call);
            after_call = true;
            run_start = pos;
        }
        // An invalid call stays in the current run, as text.
    }
}

/// The JSON body of a `<tool_call>` block: `{"name": NAME, "arguments": {...}}`.
fn parse_tagged_call(body: &str, declared: &[String]) -> Option<ParsedCall> {
    let Ok(Json::Object(object)) = serde_json::from_str::<Json>(body.trim()) else {
        return None;
    };
    let name = object.get("name")?.as_str()?;
    if !declared.iter().any(|d| d == name) {
        return None;
    }
    let arguments = match object.get("arguments") {
        None => "{}".to_string(),
        // The object exactly as generated (validated by the parse above).
        Some(Json::Object(_)) => raw_member_value(body.trim(), "arguments")?.to_string(),
        Some(Json::String(text)) => match serde_json::from_str::<Json>(text) {
            Ok(Json::Object(_)) => text.trim().to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

/// The exact text of the value of top-level member `key` (the last one, as serde_json keeps)
/// in `object`, a JSON object that already parsed successfully.
fn raw_member_value<'a>(object: &'a str, key: &str) -> Option<&'a str> {
    let bytes = object.as_bytes();
    let skip_ws = |mut i: usize| {
        while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut found = None;
    loop {
        i = skip_ws(i);
        if bytes.get(i) != Some(&b'"') {
            return found; // `}` of an empty object
        }
        let key_end = json_string_end(bytes, i)?;
        let raw_key = &object[i + 1..key_end - 1];
        i = skip_ws(key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(i + 1);
        let value_end = json_value_end(bytes, value_start)?;
        if raw_key == key {
            found = Some(&object[value_start..value_end]);
        }
        i = skip_ws(value_end);
        match bytes.get(i) {
            Some(b',') => i += 1,
            _ => return found,
        }
    }
}

/// Index just after the string starting at `start` (a `"`).
fn json_string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Index just after the JSON value starting at `start`.
fn json_value_end(bytes: &[u8], start: usize) -> Option<usize> {
    match bytes.get(start)? {
        b'"' => json_string_end(bytes, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = json_string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let len = bytes[start..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())
                .unwrap_or(bytes.len() - start);
            Some(start + len)
        }
    }
}

/// 2.2 (§4.2).
fn scan_native(text: &str, declared: &[String], is_final: bool, truncated: bool, out: &mut Scan) {
    const HELD_OUTSIDE: [&str; 3] = [SECTION_BEGIN, ROLE_END_TOKEN, EOS_TOKEN];
    const HELD_SECTION: [&str; 4] = [CALL_BEGIN, SECTION_END, ROLE_END_TOKEN, EOS_TOKEN];
    let mut run_start = 0;
    let mut after_section = false;
    loop {
        let Some(section) = find_from(text, run_start, SECTION_BEGIN) else {
            let end = if is_final {
                RunEnd::FinalTail
            } else {
                RunEnd::PendingTail {
                    markers: &HELD_OUTSIDE,
                    hold_whitespace: false,
                }
            };
            out.push_run(&text[run_start..], after_section, end);
            return;
        };
        let end = RunEnd::BeforeCall {
            strip_newline: false,
        };
        out.push_run(&text[run_start..section], after_section, end);
        let mut pos = section + SECTION_BEGIN.len();
        // Inside the section.
        loop {
            pos += text[pos..].len() - text[pos..].trim_start().len();
            let rest = &text[pos..];
            if rest.is_empty() {
                return; // open section: complete or not, nothing more to show
            }
            if let Some(after) = rest.strip_prefix(SECTION_END) {
                pos = text.len() - after.len();
                break;
            }
            if rest.starts_with(CALL_BEGIN) {
                let header_start = pos + CALL_BEGIN.len();
                let Some(call_end) = find_from(text, header_start, CALL_END) else {
                    if is_final && truncated {
                        // Cut off by the token budget: left out.
                        out.dropped_call = true;
                    } else if is_final {
                        // Unterminated call: content, as generated.
                        out.content.push_str(rest);
                    }
                    return;
                };
                let next = call_end + CALL_END.len();
                let parsed = text[header_start..call_end]
                    .split_once(ARGUMENT_BEGIN)
                    .and_then(|(header, arguments)| parse_native_call(header, arguments, declared));
                match parsed {
                    Some(call) => out.calls.push(call),
                    None => out.content.push_str(&text[pos..next]),
                }
                pos = next;
                continue;
            }
            if !is_final && partial_prefix_suffix(rest, &HELD_SECTION) == rest.len() {
                return; // may still become a marker
            }
            // Stray text inside a section: content, up to the next call or section end.
            let stray_end = [CALL_BEGIN, SECTION_END]
                .iter()
                .filter_map(|m| find_from(text, pos, m))
                .min();
            match stray_end {
                Some(end) => {
                    out.content.push_str(&text[pos..end]);
                    pos = end;
                }
                None if is_final => {
                    out.content.push_str(rest);
                    return;
                }
                None => return, // resolved once a marker or the end arrives
            }
        }
        after_section = true;
        run_start = pos;
    }
}

/// `functions.NAME:IDX` + a JSON object.
fn parse_native_call(header: &str, arguments: &str, declared: &[String]) -> Option<ParsedCall> {
    let (name, index) = header.trim().strip_prefix("functions.")?.rsplit_once(':')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !declared.iter().any(|d| d == name) {
        return None;
    }
    let arguments = arguments.trim();
    match serde_json::from_str::<Json>(arguments) {
        Ok(Json::Object(_)) => Some(ParsedCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// Feeds `text` in pieces (`cuts` are byte offsets on char boundaries), then finishes.
    /// Returns the concatenated content deltas, the per-call concatenated arguments and the final
    /// output, and checks that streaming agrees with the final parse.
    fn stream(
        format: ToolCallFormat,
        declared: &[&str],
        prefix: Option<&str>,
        text: &str,
        cuts: &[usize],
        end: FinishReason,
    ) -> (String, Vec<(String, String)>, ParsedOutput) {
        let mut parser = StreamParser::new(
            format,
            names(declared),
            prefix.map(str::to_string),
            "call_7",
        );
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let absorb = |d: Deltas, content: &mut String, calls: &mut Vec<(String, String)>| {
            content.push_str(&d.content);
            for delta in d.tool_calls {
                if delta.index == calls.len() {
                    assert_eq!(
                        delta.id.as_deref(),
                        Some(format!("call_7_{}", delta.index).as_str())
                    );
                    calls.push((delta.name.clone().unwrap(), String::new()));
                }
                calls[delta.index].1.push_str(&delta.arguments);
            }
        };
        for &cut in cuts {
            let d = parser.push(&text[..cut]).unwrap();
            absorb(d, &mut content, &mut calls);
        }
        let (d, output) = parser.finish(text, end).unwrap();
        absorb(d, &mut content, &mut calls);
        let final_calls: Vec<(String, String)> = output
            .tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect();
        assert_eq!(content, output.content, "streamed content == final content");
        assert_eq!(calls, final_calls, "streamed calls == final calls");
        let one_shot =
            parse_response(format, &names(declared), prefix, text, end, "call_7").unwrap();
        assert_eq!(one_shot, output, "one-shot parse == streamed parse");
        (content, calls, output)
    }

    fn char_cuts(text: &str) -> Vec<usize> {
        text.char_indices()
            .map(|(i, _)| i)
            .chain([text.len()])
            .collect()
    }

    const NATIVE_EXAMPLE: &str = "Checking. <|tool_calls_section_begin|><|tool_call_begin|>functions.weather:0<|tool_call_argument_begin|>{\"city\":\"Montréal\"}<|tool_call_end|><|tool_call_begin|>functions.weather:1<|tool_call_argument_begin|>{\"city\":\"東京\"}<|tool_call_end|><|tool_calls_section_end|><|role_end|><|endoftext|>";

    #[test]
    fn native_example_one_char_at_a_time() {
        let (content, calls, output) = stream(
            ToolCallFormat::NativeMarkers,
            &["weather"],
            None,
            NATIVE_EXAMPLE,
            &char_cuts(NATIVE_EXAMPLE),
            FinishReason::Stop,
        );
        assert_eq!(content, "Checking. ");
        assert_eq!(
            calls,
            vec![
                ("weather".to_string(), "{\"city\":\"Montréal\"}".to_string()),
                ("weather".to_string(), "{\"city\":\"東京\"}".to_string()),
            ]
        );
        assert_eq!(output.finish_reason, FinishReason::ToolCalls);
        assert_eq!(output.tool_calls[1].id, "call_7_1");
    }

    #[test]
    fn native_streaming_never_shows_marker_text() {
        let mut parser = StreamParser::new(
            ToolCallFormat::NativeMarkers,
            names(&["weather"]),
            None,
            "c",
        );
        for cut in char_cuts(NATIVE_EXAMPLE) {
            let d = parser.push(&NATIVE_EXAMPLE[..cut]).unwrap();
            assert!(
                !d.content.contains('<') && !d.content.contains('|'),
                "{:?}",
                d.content
            );
        }
    }

    #[test]
    fn native_calls_split_across_blocks() {
        // 32-byte "blocks" cut the markers and the arguments in the middle.
        let cuts: Vec<usize> = (1..)
            .map(|i| i * 32)
            .take_while(|&c| c < NATIVE_EXAMPLE.len())
            .filter(|&c| NATIVE_EXAMPLE.is_char_boundary(c))
            .collect();
        let mut parser = StreamParser::new(
            ToolCallFormat::NativeMarkers,
            names(&["weather"]),
            None,
            "c",
        );
        let mut first_call_seen_at = None;
        for (i, &cut) in cuts.iter().enumerate() {
            let d = parser.push(&NATIVE_EXAMPLE[..cut]).unwrap();
            if !d.tool_calls.is_empty() && first_call_seen_at.is_none() {
                first_call_seen_at = Some(i);
                // The first call is complete before the second one is.
                assert_eq!(d.tool_calls.len(), 2, "header and arguments of one call");
                assert_eq!(d.tool_calls[0].name.as_deref(), Some("weather"));
                assert_eq!(d.tool_calls[1].arguments, "{\"city\":\"Montréal\"}");
            }
        }
        assert!(first_call_seen_at.is_some());
        let (content, calls, _) = stream(
            ToolCallFormat::NativeMarkers,
            &["weather"],
            None,
            NATIVE_EXAMPLE,
            &cuts,
            FinishReason::Stop,
        );
        assert_eq!(content, "Checking. ");
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn native_forced_prefix_is_parsed_with_the_output() {
        let prefix = ToolCallFormat::NativeMarkers.named_prefix("weather");
        let generated =
            "{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|><|role_end|>";
        let (content, calls, output) = stream(
            ToolCallFormat::NativeMarkers,
            &["weather"],
            Some(&prefix),
            generated,
            &char_cuts(generated),
            FinishReason::Stop,
        );
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![("weather".into(), "{\"city\": \"Oslo\"}".into())]
        );
        assert_eq!(output.finish_reason, FinishReason::ToolCalls);

        let required = ToolCallFormat::NativeMarkers.required_prefix();
        let generated = "weather:0<|tool_call_argument_begin|>{}<|tool_call_end|>";
        let out = parse_response(
            ToolCallFormat::NativeMarkers,
            &names(&["weather"]),
            Some(&required),
            generated,
            FinishReason::Stop,
            "c",
        )
        .unwrap();
        assert_eq!(
            out.tool_calls.len(),
            1,
            "an open section at the end is allowed"
        );
        assert_eq!(out.tool_calls[0].arguments, "{}");
    }

    #[test]
    fn native_invalid_calls_become_content() {
        let call = |header: &str, args: &str| {
            format!("{CALL_BEGIN}{header}{ARGUMENT_BEGIN}{args}{CALL_END}")
        };
        let bad = [
            call("functions.unknown:0", "{}"),                    // undeclared
            call("functions.weather:0", "[1, 2]"),                // not an object
            call("functions.weather:0", "{\"city\": }"),          // malformed
            call("weather:0", "{}"),                              // header without functions.
            call("functions.weather:x", "{}"),                    // bad index
            format!("{CALL_BEGIN}functions.weather:0{CALL_END}"), // no argument marker
        ];
        for markup in bad {
            let text = format!("Hi {SECTION_BEGIN}{markup}{SECTION_END}<|role_end|>");
            let (content, calls, output) = stream(
                ToolCallFormat::NativeMarkers,
                &["weather"],
                None,
                &text,
                &char_cuts(&text),
                FinishReason::Stop,
            );
            assert_eq!(content, format!("Hi {markup}"));
            assert!(calls.is_empty());
            assert_eq!(output.finish_reason, FinishReason::Stop);
        }
        // A valid call next to an invalid one is still a call.
        let text = format!(
            "{SECTION_BEGIN}{}\n{}{SECTION_END}",
            call("functions.nope:0", "{}"),
            call("functions.weather:1", "{\"a\":1}")
        );
        let (content, calls, _) = stream(
            ToolCallFormat::NativeMarkers,
            &["weather"],
            None,
            &text,
            &char_cuts(&text),
            FinishReason::Stop,
        );
        assert_eq!(content, call("functions.nope:0", "{}"));
        assert_eq!(calls, vec![("weather".into(), "{\"a\":1}".into())]);
    }

    #[test]
    fn native_truncated_by_length() {
        let text = format!(
            "Looking{SECTION_BEGIN}{CALL_BEGIN}functions.weather:0{ARGUMENT_BEGIN}{{\"city\": \"Par"
        );
        let (content, calls, output) = stream(
            ToolCallFormat::NativeMarkers,
            &["weather"],
            None,
            &text,
            &char_cuts(&text),
            FinishReason::Length,
        );
        // The cut-off call is left out: no marker text in the content.
        assert!(calls.is_empty());
        assert_eq!(content, "Looking");
        assert_eq!(output.finish_reason, FinishReason::Length);
    }

    #[test]
    fn native_text_around_sections() {
        let text = format!(
            "a{SECTION_BEGIN} stray {CALL_BEGIN}functions.f:0{ARGUMENT_BEGIN}{{}}{CALL_END}{SECTION_END}  \n tail{SECTION_BEGIN}{SECTION_END}\n\n"
        );
        let (content, calls, output) = stream(
            ToolCallFormat::NativeMarkers,
            &["f"],
            None,
            &text,
            &char_cuts(&text),
            FinishReason::Stop,
        );
        assert_eq!(content, "astray   \n tail");
        assert_eq!(calls.len(), 1);
        assert_eq!(output.finish_reason, FinishReason::ToolCalls);
        // A bare call marker outside a section is text.
        let text = format!("{CALL_BEGIN}functions.f:0{ARGUMENT_BEGIN}{{}}{CALL_END}");
        let out = parse_response(
            ToolCallFormat::NativeMarkers,
            &names(&["f"]),
            None,
            &text,
            FinishReason::Stop,
            "c",
        )
        .unwrap();
        assert_eq!(out.content, text);
        assert!(out.tool_calls.is_empty());
    }

    const TAGGED_EXAMPLE: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"東京\",\"n\":1.50}}\n</tool_call><|role_end|><|endoftext|>";

    #[test]
    fn tagged_example_one_char_at_a_time() {
        let (content, calls, output) = stream(
            ToolCallFormat::TaggedJson,
            &["get_weather"],
            None,
            TAGGED_EXAMPLE,
            &char_cuts(TAGGED_EXAMPLE),
            FinishReason::Stop,
        );
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![
                (
                    "get_weather".into(),
                    "{\"city\": \"Paris\", \"unit\": \"c\"}".into()
                ),
                (
                    "get_weather".into(),
                    "{\"city\":\"東京\",\"n\":1.50}".into()
                ),
            ]
        );
        assert_eq!(output.finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn raw_member_values() {
        let object =
            r#" { "name" : "f", "arguments" : { "a" : [1, "}\"]"], "b": {} } , "x": 1e5 } "#;
        assert_eq!(
            raw_member_value(object, "arguments"),
            Some(r#"{ "a" : [1, "}\"]"], "b": {} }"#)
        );
        assert_eq!(raw_member_value(object, "x"), Some("1e5"));
        assert_eq!(raw_member_value(object, "name"), Some("\"f\""));
        assert_eq!(raw_member_value(object, "missing"), None);
        assert_eq!(raw_member_value(r#"{"k": 1, "k": [2]}"#, "k"), Some("[2]"));
        assert_eq!(raw_member_value("{}", "k"), None);
        // Big integers and number spellings survive untouched.
        let body =
            r#"{"name": "f", "arguments": {"id": 123456789012345678901234567890, "r": 1.50}}"#;
        let call = parse_tagged_call(body, &names(&["f"])).unwrap();
        assert_eq!(
            call.arguments,
            r#"{"id": 123456789012345678901234567890, "r": 1.50}"#
        );
    }

    #[test]
    fn tagged_streaming_holds_back_whitespace_and_partial_tags() {
        let mut parser = StreamParser::new(ToolCallFormat::TaggedJson, names(&["f"]), None, "c");
        assert_eq!(parser.push("Hello\n").unwrap().content, "Hello");
        assert_eq!(parser.push("Hello\n<tool_").unwrap().content, "");
        assert_eq!(parser.push("Hello\n<tool_x").unwrap().content, "\n<tool_x");
        let text = "Hello\n<tool_x <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> \n";
        let d = parser.push(text).unwrap();
        assert_eq!(d.content, " ");
        assert_eq!(d.tool_calls.len(), 2);
        assert_eq!(d.tool_calls[0].name.as_deref(), Some("f"));
        assert_eq!(d.tool_calls[1].arguments, "{}");
        let (d, out) = parser.finish(text, FinishReason::Stop).unwrap();
        assert!(d.is_empty(), "trailing whitespace after a call is dropped");
        assert_eq!(out.content, "Hello\n<tool_x ");
    }

    #[test]
    fn tagged_invalid_calls_become_content() {
        for body in [
            "{\"name\": \"other\", \"arguments\": {}}",  // undeclared
            "{\"name\": \"f\", \"arguments\": [1]}",     // not an object
            "{\"name\": \"f\", \"arguments\": \"[1]\"}", // string, not an object
            "{\"name\": \"f\", \"arguments\": {\"a\": }}", // malformed
            "[\"f\"]",                                   // not an object at all
            "{\"arguments\": {}}",                       // no name
        ] {
            let text = format!("x\n<tool_call>\n{body}\n</tool_call>");
            let (content, calls, output) = stream(
                ToolCallFormat::TaggedJson,
                &["f"],
                None,
                &text,
                &char_cuts(&text),
                FinishReason::Stop,
            );
            assert_eq!(content, text, "{body}");
            assert!(calls.is_empty());
            assert_eq!(output.finish_reason, FinishReason::Stop);
        }
        // String arguments holding an object are accepted verbatim; missing arguments mean {}.
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":1}\"}</tool_call>\n<tool_call>{\"name\": \"f\"}</tool_call>";
        let out = parse_response(
            ToolCallFormat::TaggedJson,
            &names(&["f"]),
            None,
            text,
            FinishReason::Stop,
            "c",
        )
        .unwrap();
        assert_eq!(out.content, "");
        assert_eq!(out.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(out.tool_calls[1].arguments, "{}");
    }

    #[test]
    fn tagged_calls_split_across_blocks_and_truncated() {
        let cuts: Vec<usize> = (1..)
            .map(|i| i * 17)
            .take_while(|&c| c < TAGGED_EXAMPLE.len())
            .filter(|&c| TAGGED_EXAMPLE.is_char_boundary(c))
            .collect();
        let (content, calls, _) = stream(
            ToolCallFormat::TaggedJson,
            &["get_weather"],
            None,
            TAGGED_EXAMPLE,
            &cuts,
            FinishReason::Stop,
        );
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);

        // Cut by the token budget inside the second call: the first is a call, the cut-off one is
        // left out and the finish reason says the answer is incomplete.
        let cut = TAGGED_EXAMPLE.find("\"東京\"").unwrap();
        let text = &TAGGED_EXAMPLE[..cut];
        let (content, calls, output) = stream(
            ToolCallFormat::TaggedJson,
            &["get_weather"],
            None,
            text,
            &char_cuts(text),
            FinishReason::Length,
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(content, "Let me check.");
        assert_eq!(output.finish_reason, FinishReason::Length);
    }

    #[test]
    fn tagged_forced_prefix() {
        let prefix = ToolCallFormat::TaggedJson.named_prefix("f");
        let generated = "{\"q\": \"x\"}}\n</tool_call><|role_end|>";
        let (content, calls, _) = stream(
            ToolCallFormat::TaggedJson,
            &["f"],
            Some(&prefix),
            generated,
            &char_cuts(generated),
            FinishReason::Stop,
        );
        assert_eq!(content, "");
        assert_eq!(calls, vec![("f".into(), "{\"q\": \"x\"}".into())]);
    }

    #[test]
    fn whitespace_only_content_before_a_tagged_call_is_dropped() {
        let text = " \n\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        let (content, calls, _) = stream(
            ToolCallFormat::TaggedJson,
            &["f"],
            None,
            text,
            &char_cuts(text),
            FinishReason::Stop,
        );
        assert_eq!(content, "");
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn text_after_a_call_is_appended() {
        let text = "A\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone.\n";
        let (content, calls, _) = stream(
            ToolCallFormat::TaggedJson,
            &["f"],
            None,
            text,
            &char_cuts(text),
            FinishReason::Stop,
        );
        assert_eq!(content, "A\nDone.\n");
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn without_declared_tools_markup_is_content() {
        for format in [ToolCallFormat::TaggedJson, ToolCallFormat::NativeMarkers] {
            let text = "Plain <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> text \n<|role_end|>junk";
            let (content, calls, output) = stream(
                format,
                &[],
                None,
                text,
                &char_cuts(text),
                FinishReason::Stop,
            );
            assert_eq!(
                content,
                "Plain <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> text \n"
            );
            assert!(calls.is_empty());
            assert_eq!(output.finish_reason, FinishReason::Stop);
        }
    }

    #[test]
    fn end_markers_cut_content_and_partial_end_markers_are_held() {
        let mut parser = StreamParser::new(ToolCallFormat::TaggedJson, vec![], None, "c");
        assert_eq!(parser.push("Hi <|role_").unwrap().content, "Hi ");
        assert_eq!(
            parser.push("Hi <|role_end|><|endoftext|>").unwrap().content,
            ""
        );
        let (_, out) = parser
            .finish("Hi <|role_end|><|endoftext|>", FinishReason::Stop)
            .unwrap();
        assert_eq!(out.content, "Hi ");
        let mut parser = StreamParser::new(ToolCallFormat::TaggedJson, vec![], None, "c");
        assert_eq!(parser.push("a<|endo").unwrap().content, "a");
        let (d, out) = parser.finish("a<|endo", FinishReason::Length).unwrap();
        assert_eq!(d.content, "<|endo");
        assert_eq!(out.content, "a<|endo");
        assert_eq!(out.finish_reason, FinishReason::Length);
    }

    #[test]
    fn cancelled_stays_cancelled() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        let out = parse_response(
            ToolCallFormat::TaggedJson,
            &names(&["f"]),
            None,
            text,
            FinishReason::Cancelled,
            "c",
        )
        .unwrap();
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.finish_reason, FinishReason::Cancelled);
    }

    #[test]
    fn non_append_text_is_an_internal_error() {
        let mut parser = StreamParser::new(ToolCallFormat::TaggedJson, vec![], None, "c");
        parser.push("Hello").unwrap();
        assert!(matches!(parser.push("Help"), Err(EngineError::Internal(_))));
    }

    #[test]
    fn partial_marker_suffixes_are_held() {
        assert_eq!(partial_prefix_suffix("abc<tool_", &[TAG_OPEN]), 6);
        assert_eq!(partial_prefix_suffix("abc<tool_call>", &[TAG_OPEN]), 0);
        assert_eq!(partial_prefix_suffix("abc<", &[TAG_OPEN, SECTION_BEGIN]), 1);
        assert_eq!(
            partial_prefix_suffix("<|tool_calls", &[TAG_OPEN, SECTION_BEGIN]),
            12
        );
        assert_eq!(partial_prefix_suffix("日本", &[TAG_OPEN]), 0);
    }

    /// Random mixes of text, markers and JSON pieces, cut at random points: streaming never
    /// errors, never shows a marker it later takes back, and always adds up to the final parse
    /// (`stream` checks that).
    #[test]
    fn random_markup_streams_consistently() {
        let tagged_call =
            format!("{TAG_OPEN}\n{{\"name\": \"f\", \"arguments\": {{\"a\": 1}}}}\n{TAG_CLOSE}");
        let native_call =
            format!("{CALL_BEGIN}functions.f:0{ARGUMENT_BEGIN}{{\"a\": [1]}}{CALL_END}");
        let native_section = format!("{SECTION_BEGIN}{native_call}{SECTION_END}");
        let pieces: Vec<&str> = vec![
            "Hi",
            " ",
            "\n",
            "日本",
            "<",
            "|",
            "tool",
            TAG_OPEN,
            TAG_CLOSE,
            "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
            "{\"name\": \"g\", \"arguments\": {}}",
            "{\"name\": \"f\", \"arguments\": ",
            "{",
            "}",
            SECTION_BEGIN,
            SECTION_END,
            CALL_BEGIN,
            ARGUMENT_BEGIN,
            CALL_END,
            "functions.f:0",
            "functions.x:1",
            "{\"k\": [1]}",
            ROLE_END_TOKEN,
            "<|tool_c",
            &tagged_call,
            &tagged_call,
            &native_call,
            &native_section,
            &native_section,
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            // xorshift64*: deterministic, no dependency.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        };
        let mut with_calls = 0;
        for case in 0..400 {
            let text: String = (0..1 + next(14))
                .map(|_| pieces[next(pieces.len())])
                .collect();
            let mut cuts: Vec<usize> = (0..next(6))
                .map(|_| next(text.len() + 1))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            cuts.sort_unstable();
            let format = if case % 2 == 0 {
                ToolCallFormat::TaggedJson
            } else {
                ToolCallFormat::NativeMarkers
            };
            let end = if case % 3 == 0 {
                FinishReason::Length
            } else {
                FinishReason::Stop
            };
            let declared: &[&str] = if case % 7 == 0 { &[] } else { &["f"] };
            stream(format, declared, None, &text, &cuts, end);
            let (_, calls, _) = stream(format, declared, None, &text, &char_cuts(&text), end);
            with_calls += usize::from(!calls.is_empty());
        }
        assert!(with_calls > 50, "only {with_calls} cases had calls");
    }
}
