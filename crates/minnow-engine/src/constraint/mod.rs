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
//! - [`json_style`]: the JSON spelling every JSON grammar asks for.
//!
//! The request side, [`OutputConstraint`] and [`StrictTool`], is plain data of `crate::api`.

pub mod compiler;
pub mod json_style;
pub mod matcher;
pub mod tools;
pub mod vocabulary;

pub use crate::api::{OutputConstraint, StrictTool};
pub use compiler::{GrammarCompiler, GrammarError};
pub use matcher::TokenMatcher;
