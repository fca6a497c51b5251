//! From committed token ids to what a client sees: incremental detokenization and stop strings
//! ([`text_stream`]), tool calls read out of the generated text ([`tool_calls`]), and the text
//! both must hold back while the next block may complete a stop string or a marker
//! ([`held_back`]).

pub mod held_back;
pub mod text_stream;
pub mod tool_calls;
