//! How a checkpoint writes tool calls (chat-format doc §2–§4): LLaDA2.0/2.1's `<tool_call>` JSON
//! blocks or LLaDA2.2's native marker tokens, which of the two a checkpoint uses, and the prompt
//! suffixes that steer the model into a call. Reading calls back out of generated text is
//! `output::tool_calls`.

use crate::text::tokenizer::markers::{ARGUMENT_BEGIN, CALL_BEGIN, SECTION_BEGIN};
use crate::text::tokenizer::Tokenizer;

/// 2.0/2.1 call tags.
pub const TAG_OPEN: &str = "<tool_call>";
pub const TAG_CLOSE: &str = "</tool_call>";

/// How a checkpoint writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// LLaDA2.0/2.1: `<tool_call>` JSON blocks.
    TaggedJson,
    /// LLaDA2.2: native marker tokens.
    NativeMarkers,
}

impl ToolCallFormat {
    /// Native markers when the vocabulary has `<|tool_calls_section_begin|>` **and** the chat
    /// template uses it; `<tool_call>` blocks otherwise (the tiny 2.0/2.1 fixtures have the
    /// marker tokens but a template that never mentions them).
    pub fn detect(tokenizer: &Tokenizer, template_source: &str) -> ToolCallFormat {
        if tokenizer.special().tool_markers.section_begin.is_some()
            && template_source.contains(SECTION_BEGIN)
        {
            ToolCallFormat::NativeMarkers
        } else {
            ToolCallFormat::TaggedJson
        }
    }

    /// Prompt suffix that forces some tool call (`tool_choice: "required"`).
    pub fn required_prefix(self) -> String {
        match self {
            ToolCallFormat::NativeMarkers => format!("{SECTION_BEGIN}{CALL_BEGIN}functions."),
            ToolCallFormat::TaggedJson => format!("{TAG_OPEN}\n{{\"name\": \""),
        }
    }

    /// Prompt suffix that forces a call of `name` (named `tool_choice`); the model continues
    /// with the arguments object.
    pub fn named_prefix(self, name: &str) -> String {
        match self {
            ToolCallFormat::NativeMarkers => {
                format!("{SECTION_BEGIN}{CALL_BEGIN}functions.{name}:0{ARGUMENT_BEGIN}")
            }
            ToolCallFormat::TaggedJson => {
                format!("{TAG_OPEN}\n{{\"name\": \"{name}\", \"arguments\": ")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_format_from_tokenizer_and_template() {
        let dir = crate::text::tokenizer::tests_support::fixture("llada2-tiny-v21");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let ling = crate::text::chat_template::ChatTemplate::from_dir(&dir).unwrap();
        assert_eq!(
            ToolCallFormat::detect(&tok, ling.source()),
            ToolCallFormat::TaggedJson
        );
        assert_eq!(
            ToolCallFormat::detect(&tok, "{{ '<|tool_calls_section_begin|>' }}"),
            ToolCallFormat::NativeMarkers
        );
    }
}
