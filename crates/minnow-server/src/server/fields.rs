//! Typed, field-named access to a JSON request object. Every key a handler reads is marked as
//! known; `finish` deals with the keys left over according to the request's `FieldPolicy`: by
//! default they are ignored but never silently (a debug log line, and the `x-minnow-ignored-fields`
//! response header lists them); `serve --strict-fields` turns each into a 400 naming it. A field
//! whose value would change the answer in a way the server cannot honour is refused by the
//! handler itself, whatever the policy. `null` counts as "absent", as OpenAI clients send explicit
//! nulls for optional fields.

use std::cell::RefCell;

use serde_json::{Map, Value};

use super::errors::ApiError;

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
}

pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Dotted path of this object inside the request ("" at the top), for error messages.
    prefix: String,
    known: Vec<&'a str>,
    policy: &'a FieldPolicy,
}

impl<'a> Fields<'a> {
    /// `path` names the object itself in errors (`"request body"`, `"messages[2]"`, ...).
    pub fn new(value: &'a Value, path: &str, policy: &'a FieldPolicy) -> Result<Self, ApiError> {
        let map = value.as_object().ok_or_else(|| {
            ApiError::invalid(
                path,
                format!("{} must be a JSON object", display_path(path)),
            )
        })?;
        let prefix = if path.is_empty() || path == "request body" {
            String::new()
        } else {
            format!("{path}.")
        };
        Ok(Self {
            map,
            prefix,
            known: Vec::new(),
            policy,
        })
    }

    /// The policy this object's unknown fields follow (handed on to nested objects).
    pub fn policy(&self) -> &'a FieldPolicy {
        self.policy
    }

    /// The request-relative name of `key`, as reported in `param`.
    pub fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The raw value of a field (marks it known); `None` when absent or null.
    pub fn value(&mut self, key: &'a str) -> Option<&'a Value> {
        self.known.push(key);
        self.map.get(key).filter(|value| !value.is_null())
    }

    pub fn string(&mut self, key: &'a str) -> Result<Option<String>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.type_error(key, "a string")),
        }
    }

    pub fn bool(&mut self, key: &'a str) -> Result<Option<bool>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.type_error(key, "a boolean")),
        }
    }

    /// A number within `[min, max]`.
    pub fn number(&mut self, key: &'a str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if x.is_finite() && x >= min && x <= max {
                    Ok(Some(x))
                } else {
                    Err(ApiError::invalid(
                        self.path(key),
                        format!("'{}' must be between {min} and {max}", self.path(key)),
                    ))
                }
            }
            Some(_) => Err(self.type_error(key, "a number")),
        }
    }

    /// An integer within `[min, max]`. `1.0` is accepted as 1 (JavaScript clients send floats).
    pub fn integer(&mut self, key: &'a str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let int = n.as_i64().or_else(|| {
                    n.as_f64()
                        .filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15)
                        .map(|x| x as i64)
                });
                match int {
                    Some(i) if i >= min && i <= max => Ok(Some(i)),
                    Some(_) => Err(ApiError::invalid(
                        self.path(key),
                        format!("'{}' must be between {min} and {max}", self.path(key)),
                    )),
                    None => Err(self.type_error(key, "an integer")),
                }
            }
            Some(_) => Err(self.type_error(key, "an integer")),
        }
    }

    /// A field the server accepts only at its neutral value (`neutral`), e.g. a repetition penalty
    /// it does not implement: the neutral value changes nothing, any other is refused.
    pub fn neutral_number(&mut self, key: &'a str, neutral: f64) -> Result<(), ApiError> {
        if let Some(x) = self.number(key, f64::MIN, f64::MAX)? {
            if (x - neutral).abs() > 1e-9 {
                return Err(ApiError::invalid(
                    self.path(key),
                    format!(
                        "'{}' is not supported by this server (only {neutral}, which disables it)",
                        self.path(key)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Like `neutral_number` for a boolean feature flag that must be off.
    pub fn must_be_false(&mut self, key: &'a str) -> Result<(), ApiError> {
        if self.bool(key)? == Some(true) {
            return Err(ApiError::invalid(
                self.path(key),
                format!("'{}' is not supported by this server", self.path(key)),
            ));
        }
        Ok(())
    }

    /// A field that is refused whenever it is present (and not null).
    pub fn unsupported(&mut self, key: &'a str) -> Result<(), ApiError> {
        if self.value(key).is_some() {
            return Err(ApiError::invalid(
                self.path(key),
                format!("'{}' is not supported by this server", self.path(key)),
            ));
        }
        Ok(())
    }

    /// A field whose value has no effect by design (documented in docs/api.md); any JSON value is
    /// accepted.
    pub fn accept_any(&mut self, key: &'a str) {
        self.known.push(key);
    }

    /// Deals with the fields nobody asked for: under `--strict-fields` the first is a 400 naming
    /// it; otherwise each is logged and recorded for the `x-minnow-ignored-fields` header.
    pub fn finish(self) -> Result<(), ApiError> {
        for key in self.map.keys() {
            if self.known.contains(&key.as_str()) {
                continue;
            }
            let path = self.path(key);
            if self.policy.strict {
                return Err(ApiError::invalid(
                    path.clone(),
                    format!("unknown field '{path}' (the server runs with --strict-fields)"),
                ));
            }
            tracing::debug!("ignoring unknown request field '{path}'");
            self.policy.ignored.borrow_mut().push(path);
        }
        Ok(())
    }

    pub fn type_error(&self, key: &str, expected: &str) -> ApiError {
        ApiError::invalid(
            self.path(key),
            format!("'{}' must be {expected}", self.path(key)),
        )
    }
}

fn display_path(path: &str) -> String {
    if path == "request body" {
        "the request body".into()
    } else {
        format!("'{path}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_field_is_named_when_strict() {
        let value = json!({"a": 1, "bogus": true});
        let strict = FieldPolicy::new(true);
        let mut fields = Fields::new(&value, "request body", &strict).unwrap();
        assert_eq!(fields.integer("a", 0, 5).unwrap(), Some(1));
        let error = fields.finish().unwrap_err();
        assert_eq!(error.param.as_deref(), Some("bogus"));
        assert!(strict.header_value().is_none());
    }

    #[test]
    fn unknown_fields_are_listed_when_lenient() {
        let value = json!({"a": 1, "bogus": true, "nested": {"x": 1, "y": 2}});
        let lenient = FieldPolicy::new(false);
        let mut fields = Fields::new(&value, "request body", &lenient).unwrap();
        fields.integer("a", 0, 5).unwrap();
        let nested = fields.value("nested").unwrap();
        fields.finish().unwrap();
        let mut sub = Fields::new(nested, "nested", &lenient).unwrap();
        sub.integer("x", 0, 5).unwrap();
        sub.finish().unwrap();
        assert_eq!(
            lenient.ignored(),
            vec!["bogus".to_string(), "nested.y".into()]
        );
        assert_eq!(lenient.header_value().as_deref(), Some("bogus, nested.y"));
    }

    #[test]
    fn the_header_list_is_capped() {
        let map: Map<String, Value> = (0..100).map(|i| (format!("k{i:03}"), json!(i))).collect();
        let value = Value::Object(map);
        let lenient = FieldPolicy::new(false);
        Fields::new(&value, "request body", &lenient)
            .unwrap()
            .finish()
            .unwrap();
        let header = lenient.header_value().unwrap();
        assert_eq!(header.split(", ").count(), MAX_LISTED + 1);
        assert!(header.ends_with("..."));
    }

    #[test]
    fn nested_paths_and_types() {
        let value = json!({"include_usage": "yes"});
        let strict = FieldPolicy::new(true);
        let mut fields = Fields::new(&value, "stream_options", &strict).unwrap();
        let error = fields.bool("include_usage").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("stream_options.include_usage"));
        assert!(error.message.contains("boolean"));
    }

    #[test]
    fn ranges_nulls_and_neutral_values() {
        let value = json!({"t": 3.5, "n": null, "k": 2.0, "p": 1.0, "q": 1.1});
        let strict = FieldPolicy::new(true);
        let mut fields = Fields::new(&value, "request body", &strict).unwrap();
        assert!(fields.number("t", 0.0, 2.0).is_err());
        assert_eq!(fields.integer("n", 0, 1).unwrap(), None);
        assert_eq!(fields.integer("k", 0, 10).unwrap(), Some(2));
        assert!(fields.neutral_number("p", 1.0).is_ok());
        assert_eq!(
            fields
                .neutral_number("q", 1.0)
                .unwrap_err()
                .param
                .as_deref(),
            Some("q")
        );
        assert!(fields.finish().is_ok());
    }

    #[test]
    fn non_object_is_refused() {
        let value = json!([1, 2]);
        assert!(Fields::new(&value, "request body", &FieldPolicy::new(true)).is_err());
    }
}
