//! Block-by-block output text (decoding doc §9–10, chat-format doc §4.3): after each committed
//! block the engine hands over all output ids so far; this module decodes them (special tokens
//! kept, so tool markers survive), hides a trailing incomplete UTF-8 sequence (U+FFFD), matches
//! the user's stop strings on the decoded text, holds back a suffix that could still become a
//! stop string, and passes the stable text to the tool-call [`StreamParser`], which holds back
//! partial markers in turn.
//!
//! [`StopStrings`] is the stop-string matcher on its own; [`OutputStream`] is the whole pipeline
//! the engine drives:
//!
//! ```text
//! let mut out = OutputStream::new(request.stop.clone(), parser);
//! for each committed block:
//!     let step = out.push_block(&tokenizer, &output_ids)?;   // text_delta, tool_call_deltas
//!     if let Some(hit) = step.stop { output_ids.truncate(hit.keep_tokens); break }
//! let done = out.finish(&tokenizer, &output_ids, end)?;      // last deltas + parsed response
//! ```
//!
//! Stop strings are matched on the raw decoded text, tool markup included (like OpenAI, the stop
//! applies to everything the model writes); the returned content excludes the stop string.

use super::held_back::partial_prefix_suffix;
use super::tool_calls::StreamParser;
use crate::api::{FinishReason, ToolCall, ToolCallDelta};
use crate::error::EngineResult;
use crate::text::tokenizer::Tokenizer;

/// A stop string found in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset where the stop string starts (the content ends here).
    pub start: usize,
    /// Byte offset just after it.
    pub end: usize,
    pub stop: String,
}

/// Result of checking the decoded text so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextCheck {
    /// Bytes of the text that are final: no trailing incomplete character, no suffix that may
    /// still become a stop string. With a stop match, `stable_len == stop.start`.
    pub stable_len: usize,
    pub stop: Option<StopMatch>,
}

/// Matches user stop strings across blocks.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Matches cannot start before this offset (everything before it was checked and stable).
    checked: usize,
}

impl StopStrings {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> StopStrings {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            checked: 0,
        }
    }

    /// Checks the whole decoded text so far. `finished`: no more text will come, so nothing is
    /// held back (a trailing U+FFFD is then kept: the output really ends in a broken character).
    pub fn check(&mut self, text: &str, finished: bool) -> TextCheck {
        let visible = if finished {
            text
        } else {
            text.trim_end_matches('\u{FFFD}')
        };
        let from = if self.checked <= visible.len() && visible.is_char_boundary(self.checked) {
            self.checked
        } else {
            0
        };
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| {
                visible[from..]
                    .find(stop.as_str())
                    .map(|i| (from + i, stop))
            })
            .min_by_key(|(start, stop)| (*start, usize::MAX - stop.len()));
        if let Some((start, stop)) = earliest {
            return TextCheck {
                stable_len: start,
                stop: Some(StopMatch {
                    start,
                    end: start + stop.len(),
                    stop: stop.clone(),
                }),
            };
        }
        let held = if finished {
            0
        } else {
            partial_prefix_suffix(visible, &self.stops)
        };
        self.checked = visible.len() - held;
        TextCheck {
            stable_len: self.checked,
            stop: None,
        }
    }
}

/// Generation must end because a stop string appeared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopHit {
    pub stop: String,
    /// Output ids to keep: up to and including the token that completed the stop string.
    pub keep_tokens: usize,
}

/// What one committed block made visible.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockText {
    pub text_delta: String,
    pub tool_call_deltas: Vec<ToolCallDelta>,
    /// Set when a stop string appeared: stop generating, then call [`OutputStream::finish`].
    pub stop: Option<StopHit>,
}

/// The end of the stream: the last deltas and the whole parsed response.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalText {
    pub text_delta: String,
    pub tool_call_deltas: Vec<ToolCallDelta>,
    /// Visible content (tool markup and stop string removed).
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: FinishReason,
    /// Output ids that belong to the answer (fewer than given when a stop string ends it).
    pub kept_tokens: usize,
}

/// Output ids → text deltas, tool-call deltas and the final response, for one request.
#[derive(Clone, Debug)]
pub struct OutputStream {
    stops: StopStrings,
    parser: StreamParser,
    /// Where a stop string cut the text, once found.
    stopped: Option<(StopMatch, usize)>,
}

impl OutputStream {
    pub fn new(stop_strings: Vec<String>, parser: StreamParser) -> OutputStream {
        OutputStream {
            stops: StopStrings::new(stop_strings),
            parser,
            stopped: None,
        }
    }

    /// Call after each committed block with all output ids so far (generated ids only, in
    /// order; a stop token may be included, the text is cut there).
    pub fn push_block(
        &mut self,
        tokenizer: &Tokenizer,
        output_ids: &[u32],
    ) -> EngineResult<BlockText> {
        if self.stopped.is_some() {
            return Ok(BlockText::default());
        }
        let text = tokenizer.decode(output_ids, true)?;
        let check = self.stops.check(&text, false);
        let deltas = self.parser.push(&text[..check.stable_len])?;
        let stop = match check.stop {
            Some(found) => {
                let keep_tokens = tokens_covering(tokenizer, output_ids, found.end)?;
                let hit = StopHit {
                    stop: found.stop.clone(),
                    keep_tokens,
                };
                self.stopped = Some((found, keep_tokens));
                Some(hit)
            }
            None => None,
        };
        Ok(BlockText {
            text_delta: deltas.content,
            tool_call_deltas: deltas.tool_calls,
            stop,
        })
    }

    /// Call once at the end with the output ids (truncated to `keep_tokens` after a stop hit,
    /// or not: the text is cut at the stop string either way). `end` is why generation ended;
    /// a stop string found here turns `Length` into `Stop`.
    pub fn finish(
        &mut self,
        tokenizer: &Tokenizer,
        output_ids: &[u32],
        end: FinishReason,
    ) -> EngineResult<FinalText> {
        let text = tokenizer.decode(output_ids, true)?;
        let (cut, end, kept_tokens) = match &self.stopped {
            Some((found, keep)) => (
                found.start,
                FinishReason::Stop,
                (*keep).min(output_ids.len()),
            ),
            None => {
                let check = self.stops.check(&text, true);
                match check.stop {
                    Some(found) => {
                        let keep = tokens_covering(tokenizer, output_ids, found.end)?;
                        let end = if end == FinishReason::Cancelled {
                            end
                        } else {
                            FinishReason::Stop
                        };
                        (found.start, end, keep)
                    }
                    None => (text.len(), end, output_ids.len()),
                }
            }
        };
        let (deltas, parsed) = self.parser.finish(&text[..cut.min(text.len())], end)?;
        Ok(FinalText {
            text_delta: deltas.content,
            tool_call_deltas: deltas.tool_calls,
            content: parsed.content,
            tool_calls: parsed.tool_calls,
            finish_reason: parsed.finish_reason,
            kept_tokens,
        })
    }
}

/// The fewest leading ids whose decoded text reaches byte `end` of the full decoded text.
/// Decoded text only grows as ids are added, so a binary search finds it.
fn tokens_covering(tokenizer: &Tokenizer, ids: &[u32], end: usize) -> EngineResult<usize> {
    let (mut lo, mut hi) = (0, ids.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let text = tokenizer.decode(&ids[..mid], true)?;
        if text.trim_end_matches('\u{FFFD}').len() >= end {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests_support::fixture;
    use crate::text::tool_format::ToolCallFormat;

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_dir(&fixture("llada2-tiny-v21")).unwrap()
    }

    fn plain_parser() -> StreamParser {
        StreamParser::new(ToolCallFormat::TaggedJson, vec![], None, "call_1")
    }

    #[test]
    fn partial_prefix_suffix_respects_char_boundaries() {
        assert_eq!(partial_prefix_suffix("abc<|ro", &["<|role_end|>"]), 4);
        assert_eq!(partial_prefix_suffix("xyz", &["zz", "yz!"]), 2);
        assert_eq!(partial_prefix_suffix("a日", &["日本"]), 3);
        assert_eq!(
            partial_prefix_suffix("a日本", &["日本"]),
            0,
            "a full match is not partial"
        );
        assert_eq!(partial_prefix_suffix("", &["abc"]), 0);
    }

    #[test]
    fn stop_strings_split_across_checks() {
        let mut stops = StopStrings::new(vec!["END!".into(), String::new()]);
        assert_eq!(stops.check("hello E", false).stable_len, 6);
        assert_eq!(stops.check("hello EN", false).stable_len, 6);
        let check = stops.check("hello END! more", false);
        assert_eq!(
            check.stop,
            Some(StopMatch {
                start: 6,
                end: 10,
                stop: "END!".into()
            })
        );
        assert_eq!(check.stable_len, 6);
        // A false start is released once it cannot be a stop string any more.
        let mut stops = StopStrings::new(vec!["END!".into()]);
        assert_eq!(stops.check("x EN", false).stable_len, 2);
        assert_eq!(stops.check("x ENZ", false).stable_len, 5);
        // The earliest match wins; at the same start the longer one.
        let mut stops = StopStrings::new(vec!["b".into(), "ab".into(), "abc".into()]);
        assert_eq!(stops.check("xabcd", false).stop.unwrap().stop, "abc");
    }

    /// Random texts and stop strings, checked at every growing prefix: the stable text only
    /// grows, never contains a stop string, and the stop found is the earliest complete one.
    #[test]
    fn random_stop_checks_agree_with_a_plain_search() {
        let alphabet = ["a", "b", "ab", "日", "\u{FFFD}", " "];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        };
        for _ in 0..500 {
            let text: String = (0..next(20))
                .map(|_| alphabet[next(alphabet.len())])
                .collect();
            let stops: Vec<String> = (0..1 + next(2))
                .map(|_| (0..1 + next(3)).map(|_| alphabet[next(4)]).collect())
                .collect();
            // A stop ends the text as soon as one is complete; among those complete at that
            // check, the earliest start wins.
            let earliest = |t: &str| stops.iter().filter_map(|s| t.find(s.as_str())).min();
            let mut matcher = StopStrings::new(stops.clone());
            let mut stable = 0;
            let mut found = None;
            let mut expected = None;
            let cuts = text.char_indices().map(|(i, _)| i).chain([text.len()]);
            for cut in cuts {
                let check = matcher.check(&text[..cut], false);
                if let Some(stop) = &check.stop {
                    assert!(stop.start >= stable, "a stop never cuts text already shown");
                }
                assert!(check.stable_len >= stable, "stable text only grows");
                stable = check.stable_len;
                let shown = &text[..stable];
                if let Some(stop) = check.stop {
                    found = Some(stop.start);
                    expected = earliest(text[..cut].trim_end_matches('\u{FFFD}'));
                    break;
                }
                assert!(stops.iter().all(|s| !shown.contains(s.as_str())));
            }
            if found.is_none() {
                found = matcher.check(&text, true).stop.map(|s| s.start);
                expected = earliest(&text);
            }
            assert_eq!(found, expected, "text {text:?} stops {stops:?}");
        }
    }

    #[test]
    fn incomplete_characters_are_held_until_finished() {
        let mut stops = StopStrings::new(vec![]);
        assert_eq!(stops.check("ab\u{FFFD}", false).stable_len, 2);
        assert_eq!(stops.check("ab\u{FFFD}", true).stable_len, 5);
    }

    /// Encodes `text`, feeds the ids in blocks of `block` tokens, and returns the concatenated
    /// text deltas, the block at which a stop was reported, and the final output.
    fn run_blocks(
        text: &str,
        stops: &[&str],
        block: usize,
    ) -> (String, Option<usize>, FinalText, Vec<u32>) {
        let tok = tokenizer();
        let ids = tok.encode(text).unwrap();
        let mut out = OutputStream::new(
            stops.iter().map(|s| s.to_string()).collect(),
            plain_parser(),
        );
        let mut streamed = String::new();
        let mut stopped_at = None;
        let mut committed = Vec::new();
        for (i, chunk) in ids.chunks(block).enumerate() {
            committed.extend_from_slice(chunk);
            let step = out.push_block(&tok, &committed).unwrap();
            for stop in stops {
                // Never show a piece of a stop string early.
                assert!(!step.text_delta.contains(stop), "{:?}", step.text_delta);
            }
            assert!(!step.text_delta.contains('\u{FFFD}'));
            streamed.push_str(&step.text_delta);
            if let Some(hit) = step.stop {
                committed.truncate(hit.keep_tokens);
                stopped_at = Some(i);
                break;
            }
        }
        let done = out.finish(&tok, &committed, FinishReason::Length).unwrap();
        streamed.push_str(&done.text_delta);
        assert_eq!(streamed, done.content, "deltas add up to the content");
        (streamed, stopped_at, done, committed)
    }

    #[test]
    fn stop_string_split_across_blocks() {
        let text = "the cat sat on the mat. STOP and then more words follow here";
        for block in 1..6 {
            let (streamed, stopped_at, done, kept) = run_blocks(text, &["STOP"], block);
            assert_eq!(streamed, "the cat sat on the mat. ", "block size {block}");
            assert!(stopped_at.is_some());
            assert_eq!(done.finish_reason, FinishReason::Stop);
            // The kept ids end with the token that completed the stop string.
            let tok = tokenizer();
            assert!(tok.decode(&kept, true).unwrap().contains("STOP"));
            assert!(!tok
                .decode(&kept[..kept.len() - 1], true)
                .unwrap()
                .contains("STOP"));
            assert_eq!(done.kept_tokens, kept.len());
        }
    }

    #[test]
    fn no_stop_string_means_length_and_everything_shown() {
        let text = "plain text with STO but no full stop string";
        let (streamed, stopped_at, done, kept) = run_blocks(text, &["STOP"], 3);
        assert_eq!(streamed, text);
        assert_eq!(stopped_at, None);
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert_eq!(done.kept_tokens, kept.len());
    }

    #[test]
    fn multibyte_characters_split_across_blocks() {
        let text = "naïve café 日本語 done";
        let tok = tokenizer();
        let ids = tok.encode(text).unwrap();
        assert!(
            ids.len() > text.chars().count(),
            "some characters span several tokens"
        );
        let (streamed, _, done, _) = run_blocks(text, &[], 1);
        assert_eq!(streamed, text);
        assert_eq!(done.content, text);
    }

    #[test]
    fn stop_found_only_at_finish_turns_length_into_stop() {
        let tok = tokenizer();
        let ids = tok.encode("abc STOP def").unwrap();
        let mut out = OutputStream::new(vec!["STOP".into()], plain_parser());
        let done = out.finish(&tok, &ids, FinishReason::Length).unwrap();
        assert_eq!(done.content, "abc ");
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert!(done.kept_tokens < ids.len());
    }

    #[test]
    fn stop_tokens_and_tool_calls_through_the_pipeline() {
        let tok = tokenizer();
        let text = "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|><|tool_calls_section_end|><|role_end|>";
        let ids = tok.encode(text).unwrap();
        let parser = StreamParser::new(
            ToolCallFormat::NativeMarkers,
            vec!["f".into()],
            None,
            "call_9",
        );
        let mut out = OutputStream::new(vec!["never".into()], parser);
        let mut streamed = String::new();
        let mut deltas = Vec::new();
        let mut committed = Vec::new();
        for chunk in ids.chunks(4) {
            committed.extend_from_slice(chunk);
            let step = out.push_block(&tok, &committed).unwrap();
            streamed.push_str(&step.text_delta);
            deltas.extend(step.tool_call_deltas);
        }
        let done = out.finish(&tok, &committed, FinishReason::Stop).unwrap();
        streamed.push_str(&done.text_delta);
        deltas.extend(done.tool_call_deltas);
        assert_eq!(streamed, "Sure.");
        assert_eq!(done.content, "Sure.");
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        // Header first (id and name, no arguments), then the arguments.
        assert_eq!(deltas.len(), 2);
        assert_eq!(deltas[0].id.as_deref(), Some("call_9_0"));
        assert_eq!(deltas[0].name.as_deref(), Some("f"));
        assert_eq!(deltas[0].arguments, "");
        assert_eq!((deltas[1].index, deltas[1].id.as_deref()), (0, None));
        assert_eq!(deltas[1].arguments, "{\"x\": 1}");
        assert_eq!(done.tool_calls[0].name, "f");
    }
}
