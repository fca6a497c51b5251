//! Text in and around the model: the checkpoint's tokenizer and special tokens
//! ([`tokenizer`]), its chat template ([`chat_template`]), the tool-call markup it uses
//! ([`tool_format`]), and how a client's strings keep special-token text plain
//! ([`client_text`]). Nothing here knows about decoding or the engine's threads.

pub mod chat_template;
pub mod client_text;
pub mod tokenizer;
pub mod tool_format;
