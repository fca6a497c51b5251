//! The JSON spelling of every JSON grammar (`json_schema`, `json_object`, strict tool
//! arguments).

/// Compact JSON with no free whitespace: the answer is shorter and a model cannot stall a
/// document with endless blanks between tokens.
pub fn json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ",",
        "key_separator": ":",
    })
}
