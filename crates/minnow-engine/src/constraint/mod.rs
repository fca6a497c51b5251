//! Structured outputs: a request's grammar (JSON Schema, `json_object`, regex or Lark) compiled by
//! `llguidance` against the checkpoint's vocabulary, and the per-request matcher that the
//! constrained decoder (`decode::constrained`) consults. docs/decoding.md §13 says what is
//! guaranteed.
//!
//! Map of the module:
//! - [`vocabulary`]: the token trie built from `tokenizer.json` (every id's bytes).
//! - [`compiler`]: compiles a [`OutputConstraint`] once per grammar text (a bounded cache) and
//!   turns grammar errors into [`GrammarError`].
//! - [`matcher`]: [`TokenMatcher`], one request's parser state over its decided tokens.
//! - [`tools`]: the grammar of strict tool calls in the checkpoint's tool-call markup.

pub mod compiler;
pub mod matcher;
pub mod tools;
pub mod vocabulary;

pub use compiler::{GrammarCompiler, GrammarError};
pub use matcher::TokenMatcher;

/// What an answer must obey. Part of [`crate::api::GenerateRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint {
    /// A JSON document valid under this JSON Schema (OpenAI `json_schema`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI `json_object`).
    JsonObject,
    /// Text matching this regular expression as a whole.
    Regex(String),
    /// A Lark grammar in llguidance's dialect (`%json { ... }` embeds a JSON Schema).
    Lark(String),
    /// Tool calls whose arguments obey the `strict` tools' schemas, in the checkpoint's markup
    /// ([`tools`]); the engine turns it into a Lark grammar.
    ToolCalls {
        tools: Vec<tools::StrictTool>,
        choice: crate::api::ToolChoice,
    },
}

impl OutputConstraint {
    /// The grammar kind, for error messages and the cache key.
    pub fn kind(&self) -> &'static str {
        match self {
            OutputConstraint::JsonSchema(_) => "json_schema",
            OutputConstraint::JsonObject => "json_object",
            OutputConstraint::Regex(_) => "regex",
            OutputConstraint::Lark(_) => "lark",
            OutputConstraint::ToolCalls { .. } => "tool call",
        }
    }
}
