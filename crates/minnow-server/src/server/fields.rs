//! Request bodies as typed structs. Each JSON object of a request is one `#[derive(Deserialize)]`
//! struct: its known keys are fields read through the leaf types below (whose errors say which
//! type was expected), and a `#[serde(flatten)]` [`Unknown`] map collects the rest.
//! [`parse_object`] deserializes one object and names the field that failed (its JSON path), and
//! [`FieldPolicy::finish`] deals with the collected keys: by default they are ignored but never
//! silently (a debug log line, and the `x-minnow-ignored-fields` response header lists them);
//! `serve --strict-fields` turns each into a 400 naming it. A field whose value would change the
//! answer in a way the server cannot honour is refused by the handler itself, whatever the policy.
//! `null` counts as "absent" (every field is an `Option`), as OpenAI clients send explicit nulls
//! for optional fields.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::fmt::Display;

use serde::de::{DeserializeOwned, Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::errors::ApiError;

/// The keys of one object that its struct does not declare, in body order.
pub type Unknown = Map<String, Value>;

/// A field accepted whatever its value (present unless absent or null).
pub type Present = Option<IgnoredAny>;

/// What happens to the fields of one request body that no handler reads.
#[derive(Debug, Default)]
pub struct FieldPolicy {
    /// `--strict-fields`: an unknown field is a 400.
    strict: bool,
    /// Request-relative paths of the unknown fields ignored so far, in body order.
    ignored: RefCell<Vec<String>>,
}

/// Header naming the fields a request carried that the server ignored.
pub const IGNORED_FIELDS_HEADER: &str = "x-minnow-ignored-fields";

/// At most this many names go into the header (a body may hold thousands of junk keys).
const MAX_LISTED: usize = 32;

impl FieldPolicy {
    pub fn new(strict: bool) -> Self {
        Self {
            strict,
            ignored: RefCell::new(Vec::new()),
        }
    }

    /// The ignored fields, comma-separated, for the response header (`None` when there are none).
    pub fn header_value(&self) -> Option<String> {
        let ignored = self.ignored.borrow();
        if ignored.is_empty() {
            return None;
        }
        let mut listed: Vec<&str> = ignored
            .iter()
            .take(MAX_LISTED)
            .map(String::as_str)
            .collect();
        if ignored.len() > MAX_LISTED {
            listed.push("...");
        }
        Some(listed.join(", "))
    }

    #[cfg(test)]
    pub fn ignored(&self) -> Vec<String> {
        self.ignored.borrow().clone()
    }

    /// Deals with the fields of the object at `path` that its struct left over: under
    /// `--strict-fields` the first is a 400 naming it; otherwise each is logged and recorded for
    /// the `x-minnow-ignored-fields` header.
    pub fn finish(&self, path: &str, unknown: &Unknown) -> Result<(), ApiError> {
        for key in unknown.keys() {
            let path = field_path(path, key);
            if self.strict {
                return Err(ApiError::invalid(
                    path.clone(),
                    format!("unknown field '{path}' (the server runs with --strict-fields)"),
                ));
            }
            tracing::debug!("ignoring unknown request field '{path}'");
            self.ignored.borrow_mut().push(path);
        }
        Ok(())
    }
}

/// Deserializes the JSON object at `path` (`"request body"` at the top, else `"messages[2]"`,
/// ...) into its struct. A value of the wrong type is a 400 naming its field: `'path.key' must be
/// a string`, as the leaf types word it. `value` is a `&Value`, or a `Value` whose strings then
/// move into the struct (a long conversation is not copied twice).
pub fn parse_object<'de, T, V>(value: V, path: &str) -> Result<T, ApiError>
where
    T: DeserializeOwned,
    V: Borrow<Value> + Deserializer<'de, Error = serde_json::Error>,
{
    if !value.borrow().is_object() {
        let object = if path == "request body" {
            "the request body".to_string()
        } else {
            format!("'{path}'")
        };
        return Err(ApiError::invalid(
            path,
            format!("{object} must be a JSON object"),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|error| {
        let field = match error.path().to_string().as_str() {
            "." => path.to_string(),
            inner => field_path(path, inner),
        };
        ApiError::invalid(field.clone(), format!("'{field}' {}", error.inner()))
    })
}

/// The request-relative name of `key` inside the object at `path`, as reported in `param`.
pub fn field_path(path: &str, key: &str) -> String {
    if path.is_empty() || path == "request body" {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The value of a field the request must carry, or a 400 naming it.
pub fn required<T>(value: Option<T>, path: &str) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::invalid(path, format!("'{path}' is required")))
}

/// `value` within `[min, max]`, or a 400 naming the field.
pub fn in_range<T: PartialOrd + Display>(
    path: &str,
    value: Option<T>,
    min: T,
    max: T,
) -> Result<Option<T>, ApiError> {
    match value {
        Some(x) if !(x >= min && x <= max) => Err(ApiError::invalid(
            path,
            format!("'{path}' must be between {min} and {max}"),
        )),
        value => Ok(value),
    }
}

/// The 400 of a field this server cannot honour.
pub fn not_supported(path: &str) -> ApiError {
    ApiError::invalid(path, format!("'{path}' is not supported by this server"))
}

/// A boolean feature flag that must be off (on would ask for what the server cannot do).
pub fn must_be_off(path: &str, flag: Option<bool>) -> Result<(), ApiError> {
    match flag {
        Some(true) => Err(not_supported(path)),
        _ => Ok(()),
    }
}

/// A field refused whenever it is present (and not null).
pub fn refuse_present(path: &str, field: Present) -> Result<(), ApiError> {
    match field {
        Some(_) => Err(not_supported(path)),
        None => Ok(()),
    }
}

/// A number the server accepts only at its neutral value (`neutral`), e.g. a repetition penalty
/// it does not implement: the neutral value changes nothing, any other is refused.
pub fn must_be_neutral(path: &str, value: Option<f64>, neutral: f64) -> Result<(), ApiError> {
    match value {
        Some(x) if (x - neutral).abs() > 1e-9 => Err(ApiError::invalid(
            path,
            format!("'{path}' is not supported by this server (only {neutral}, which disables it)"),
        )),
        _ => Ok(()),
    }
}

/// Removes the keys whose values have no effect by design (documented in docs/api.md): any JSON
/// value is accepted and they are not reported as unknown.
pub fn accept_inert(unknown: &mut Unknown, inert: &[&str]) {
    unknown.retain(|key, _| !inert.contains(&key.as_str()));
}

/// `unknown` with the keys of `object` named in `also` added where the body has them (any value,
/// null included), in body order: for keys a struct declares but that are unknown in this
/// object's form (`json_schema` in a `json_object` format).
pub fn with_unknown(object: &Value, mut unknown: Unknown, also: &[&str]) -> Unknown {
    let Some(map) = object.as_object() else {
        return unknown;
    };
    if !also.iter().any(|key| map.contains_key(*key)) {
        return unknown;
    }
    let mut ordered = Unknown::new();
    for (key, value) in map {
        if let Some(value) = unknown.remove(key) {
            ordered.insert(key.clone(), value);
        } else if also.contains(&key.as_str()) {
            ordered.insert(key.clone(), value.clone());
        }
    }
    ordered
}

/// Leaf types: each deserializes one JSON type and words the error as `must be <type>` (the
/// field's name is put in front by [`parse_object`]).
macro_rules! leaf {
    ($(#[$doc:meta])* $name:ident($inner:ty), $expected:literal, $pattern:pat => $value:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name(pub $inner);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[allow(unreachable_patterns)]
                match Value::deserialize(deserializer)? {
                    $pattern => $value.map($name).ok_or_else(|| D::Error::custom($expected)),
                    _ => Err(D::Error::custom($expected)),
                }
            }
        }
    };
}

leaf!(
    /// A JSON string.
    Text(String), "must be a string", Value::String(s) => Some(s)
);
leaf!(
    /// A JSON boolean.
    Flag(bool), "must be a boolean", Value::Bool(b) => Some(b)
);
leaf!(
    /// Any JSON number.
    Num(f64), "must be a number", Value::Number(n) => n.as_f64()
);
leaf!(
    /// A whole JSON number; `1.0` is accepted as 1 (JavaScript clients send floats).
    Int(i64), "must be an integer", Value::Number(n) => n.as_i64().or_else(|| {
        n.as_f64()
            .filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15)
            .map(|x| x as i64)
    })
);
leaf!(
    /// A whole JSON number over the range of i64 and u64 together (a seed drawn as 64 random
    /// bits is often above i64's range).
    Wide(i128), "must be an integer", Value::Number(n) => n
        .as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
        .or_else(|| n.as_f64().filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15).map(|x| x as i128))
);
leaf!(
    /// A JSON array of any values (each checked by its reader).
    List(Vec<Value>), "must be a list", Value::Array(items) => Some(items)
);
leaf!(
    /// A JSON object of any values.
    Object(Map<String, Value>), "must be an object", Value::Object(map) => Some(map)
);
leaf!(
    /// A JSON Schema: any JSON object (the grammar compiler checks the schema itself).
    Schema(Value), "must be a JSON Schema object", schema => Some(schema).filter(Value::is_object)
);

/// The inner values of optional leaves.
pub trait Leaf {
    type Inner;
    fn into_inner(self) -> Self::Inner;
}

macro_rules! leaf_inner {
    ($($name:ident($inner:ty)),*) => {$(
        impl Leaf for $name {
            type Inner = $inner;
            fn into_inner(self) -> $inner {
                self.0
            }
        }
    )*};
}
leaf_inner!(
    Text(String),
    Flag(bool),
    Num(f64),
    Int(i64),
    List(Vec<Value>),
    Object(Map<String, Value>),
    Schema(Value)
);

/// `Option<Leaf>` → `Option<inner value>`.
pub fn inner<L: Leaf>(field: Option<L>) -> Option<L::Inner> {
    field.map(Leaf::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Deserialize)]
    struct Sample {
        a: Option<Int>,
        nested: Option<Value>,
        #[serde(flatten)]
        unknown: Unknown,
    }

    #[derive(Deserialize)]
    struct Nested {
        x: Option<Int>,
        #[serde(rename = "include_usage")]
        _include_usage: Option<Flag>,
        #[serde(flatten)]
        unknown: Unknown,
    }

    #[test]
    fn unknown_field_is_named_when_strict() {
        let strict = FieldPolicy::new(true);
        let sample: Sample = parse_object(json!({"a": 1, "bogus": true}), "request body").unwrap();
        assert_eq!(inner(sample.a), Some(1));
        let error = strict.finish("request body", &sample.unknown).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("bogus"));
        assert!(strict.header_value().is_none());
    }

    #[test]
    fn unknown_fields_are_listed_when_lenient() {
        let value = json!({"a": 1, "bogus": true, "nested": {"x": 1, "y": 2}});
        let lenient = FieldPolicy::new(false);
        let sample: Sample = parse_object(&value, "request body").unwrap();
        lenient.finish("request body", &sample.unknown).unwrap();
        let nested: Nested = parse_object(sample.nested.as_ref().unwrap(), "nested").unwrap();
        assert_eq!(inner(nested.x), Some(1));
        lenient.finish("nested", &nested.unknown).unwrap();
        assert_eq!(
            lenient.ignored(),
            vec!["bogus".to_string(), "nested.y".into()]
        );
        assert_eq!(lenient.header_value().as_deref(), Some("bogus, nested.y"));
    }

    #[test]
    fn the_header_list_is_capped() {
        let map: Map<String, Value> = (0..100).map(|i| (format!("k{i:03}"), json!(i))).collect();
        let lenient = FieldPolicy::new(false);
        let sample: Sample = parse_object(Value::Object(map), "request body").unwrap();
        lenient.finish("request body", &sample.unknown).unwrap();
        let header = lenient.header_value().unwrap();
        assert_eq!(header.split(", ").count(), MAX_LISTED + 1);
        assert!(header.ends_with("..."));
    }

    #[test]
    fn type_errors_name_the_nested_path() {
        let error = parse_object::<Nested, _>(&json!({"include_usage": "yes"}), "stream_options")
            .err()
            .unwrap();
        assert_eq!(error.param.as_deref(), Some("stream_options.include_usage"));
        assert_eq!(
            error.message,
            "'stream_options.include_usage' must be a boolean"
        );
        let error = parse_object::<Sample, _>(&json!({"a": 1.5}), "request body")
            .err()
            .unwrap();
        assert_eq!(error.message, "'a' must be an integer");
    }

    #[test]
    fn ranges_nulls_and_neutral_values() {
        let sample: Sample = parse_object(json!({"a": null, "nested": null}), "").unwrap();
        assert!(sample.a.is_none() && sample.nested.is_none());
        let float_int: Sample = parse_object(json!({"a": 2.0}), "").unwrap();
        assert_eq!(inner(float_int.a), Some(2));
        assert!(in_range("t", Some(3.5), 0.0, 2.0).is_err());
        assert_eq!(in_range("k", Some(2), 0, 10).unwrap(), Some(2));
        assert!(must_be_neutral("p", Some(1.0), 1.0).is_ok());
        assert_eq!(
            must_be_neutral("q", Some(1.1), 1.0)
                .unwrap_err()
                .param
                .as_deref(),
            Some("q")
        );
    }

    #[test]
    fn non_object_is_refused() {
        let error = parse_object::<Sample, _>(&json!([1, 2]), "request body")
            .err()
            .unwrap();
        assert_eq!(error.message, "the request body must be a JSON object");
        let error = parse_object::<Nested, _>(&json!(3), "stream_options")
            .err()
            .unwrap();
        assert_eq!(error.message, "'stream_options' must be a JSON object");
    }
}
