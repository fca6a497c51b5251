//! Request bodies parsed into JSON with bounded work and memory: serde_json alone accepts any
//! number of values (a 7 MB body of small values grew to hundreds of megabytes as a `Value`),
//! lets a repeated key silently replace the first, and nests up to its recursion limit. This
//! parser builds the same `Value` in one pass, but
//! - charges every value, object member and string the memory it will occupy against a budget
//!   proportional to the body ([`budget_for`]), and stops (413) as soon as it is spent;
//! - refuses a key repeated within one object (400 naming the key), since two readers of the same
//!   body could otherwise disagree on what it says;
//! - refuses nesting deeper than [`MAX_DEPTH`] (400).

use std::cell::Cell;
use std::fmt;

use hyper::StatusCode;
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::errors::ApiError;

/// Deepest nesting of arrays and objects accepted (a tool's JSON Schema rarely passes 10).
pub const MAX_DEPTH: usize = 64;

/// Memory a body may become, in bytes: this many times its length, plus a floor so that small
/// bodies of small values (a short list of token ids) are never refused.
pub const BYTES_PER_BODY_BYTE: usize = 48;
pub const BUDGET_FLOOR: usize = 1024 * 1024;

/// The memory budget of a body of `len` bytes.
pub fn budget_for(len: usize) -> usize {
    len.saturating_mul(BYTES_PER_BODY_BYTE)
        .saturating_add(BUDGET_FLOOR)
}

/// Why parsing stopped early (the parser's own error only carries text).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Refusal {
    TooLarge,
    TooDeep,
}

struct Budget {
    left: Cell<usize>,
    depth: Cell<usize>,
    refused: Cell<Option<Refusal>>,
}

impl Budget {
    fn charge<E: serde::de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.refused.set(Some(Refusal::TooLarge));
                Err(E::custom("the body's JSON values exceed the memory budget"))
            }
        }
    }
}

/// A slot of a `Vec<Value>` as it grows (up to twice the elements).
const ARRAY_SLOT: usize = 2 * std::mem::size_of::<Value>();
/// A member of a `Map`: its entry (hash, key, value) with growth slack and its hash index.
const MAP_ENTRY: usize =
    2 * (std::mem::size_of::<(u64, String, Value)>() + 2 * std::mem::size_of::<usize>());
/// The first allocation of a non-empty array or object holds room for a few elements at once.
const ARRAY_FIRST: usize = 4 * std::mem::size_of::<Value>();
const MAP_FIRST: usize = 2 * MAP_ENTRY;

/// Parses a request body; the top level must be an object.
pub fn parse(body: &[u8]) -> Result<Value, ApiError> {
    let budget = Budget {
        left: Cell::new(budget_for(body.len())),
        depth: Cell::new(0),
        refused: Cell::new(None),
    };
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let parsed = BoundedValue { budget: &budget }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    let value = match (parsed, budget.refused.get()) {
        (Ok(value), _) => value,
        (Err(_), Some(Refusal::TooLarge)) => {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                kind: "invalid_request_error",
                message: format!(
                    "the request body holds too many JSON values for its size (a body may take \
                     at most {BYTES_PER_BODY_BYTE} bytes of memory per byte, plus {BUDGET_FLOOR})"
                ),
                param: None,
                code: Some("json_too_large"),
                extra: Vec::new(),
            })
        }
        (Err(_), Some(Refusal::TooDeep)) => {
            return Err(ApiError::bad_request(format!(
                "the request body nests arrays and objects deeper than {MAX_DEPTH} levels"
            )))
        }
        (Err(e), None) => {
            return Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {e}"
            )))
        }
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

struct BoundedValue<'a> {
    budget: &'a Budget,
}

impl<'de> DeserializeSeed<'de> for BoundedValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl BoundedValue<'_> {
    fn enter<E: serde::de::Error>(&self) -> Result<(), E> {
        let depth = self.budget.depth.get() + 1;
        if depth > MAX_DEPTH {
            self.budget.refused.set(Some(Refusal::TooDeep));
            return Err(E::custom("nested too deeply"));
        }
        self.budget.depth.set(depth);
        Ok(())
    }

    fn leave(&self) {
        self.budget.depth.set(self.budget.depth.get() - 1);
    }
}

impl<'de> Visitor<'de> for BoundedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.charge::<E>(v.len())?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.charge::<E>(v.len())?;
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.enter::<A::Error>()?;
        let mut items = Vec::new();
        loop {
            let first = if items.is_empty() { ARRAY_FIRST } else { 0 };
            self.budget.charge::<A::Error>(ARRAY_SLOT + first)?;
            match seq.next_element_seed(BoundedValue {
                budget: self.budget,
            })? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        self.leave();
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        self.enter::<A::Error>()?;
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let first = if map.is_empty() { MAP_FIRST } else { 0 };
            self.budget
                .charge::<A::Error>(MAP_ENTRY + key.len() + first)?;
            if map.contains_key(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(A::Error::custom(format!(
                    "the key '{shown}' appears twice in one object"
                )));
            }
            let value = access.next_value_seed(BoundedValue {
                budget: self.budget,
            })?;
            map.insert(key, value);
        }
        self.leave();
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_serde_json() {
        let body = br#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": "\u00e9"}"#;
        let expected: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(parse(body).unwrap(), expected);
        assert!(parse(b"{not json").is_err());
        assert!(parse(b"[1]").is_err());
        assert!(parse(b"{} {}").is_err());
    }

    #[test]
    fn a_repeated_key_is_refused() {
        let error = parse(br#"{"model": "a", "model": "b"}"#).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(
            error.message.contains("'model' appears twice"),
            "{}",
            error.message
        );
        // The same key in different objects is fine.
        assert!(parse(br#"{"a": {"k": 1}, "b": {"k": 2}}"#).is_ok());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!(
            "{{\"a\": {}{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        let error = parse(deep.as_bytes()).unwrap_err();
        assert!(error.message.contains("deeper"), "{}", error.message);
        let ok = format!(
            "{{\"a\": {}{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn many_small_values_are_refused_before_they_are_built() {
        // 2 MB of one-key objects: as `Value`s they would take several hundred bytes each.
        let mut body = String::from("{\"a\": [");
        body.push_str(&"{\"k\":0},".repeat(250_000));
        body.push_str("{}]}");
        let error = parse(body.as_bytes()).unwrap_err();
        assert_eq!(error.status, StatusCode::PAYLOAD_TOO_LARGE);
        // A realistic prompt of token ids (six bytes each with the comma) stays well inside.
        let ids: Vec<String> = (0..200_000).map(|i| (100_000 + i).to_string()).collect();
        let body = format!("{{\"prompt\": [{}]}}", ids.join(","));
        assert!(parse(body.as_bytes()).is_ok());
        // So does a long text.
        let body = format!("{{\"prompt\": \"{}\"}}", "word ".repeat(1_000_000));
        assert!(parse(body.as_bytes()).is_ok());
    }
}
