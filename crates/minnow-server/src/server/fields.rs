//! Typed, field-named access to a JSON request object. Every key a handler reads is marked as
//! known; `finish` turns any key left over into a 400 naming it, so an unknown or misspelt field is
//! never silently ignored. `null` counts as "absent", as OpenAI clients send explicit nulls for
//! optional fields.

use serde_json::{Map, Value};

use super::errors::ApiError;

pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Dotted path of this object inside the request ("" at the top), for error messages.
    prefix: String,
    known: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    /// `path` names the object itself in errors ("request body", "messages[2]", ...).
    pub fn new(value: &'a Value, path: &str) -> Result<Self, ApiError> {
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
        })
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

    /// Fails on the first field nobody asked for.
    pub fn finish(self) -> Result<(), ApiError> {
        match self
            .map
            .keys()
            .find(|key| !self.known.contains(&key.as_str()))
        {
            Some(key) => Err(ApiError::invalid(
                self.path(key),
                format!("unknown field '{}'", self.path(key)),
            )),
            None => Ok(()),
        }
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
    fn unknown_field_is_named() {
        let value = json!({"a": 1, "bogus": true});
        let mut fields = Fields::new(&value, "request body").unwrap();
        assert_eq!(fields.integer("a", 0, 5).unwrap(), Some(1));
        let error = fields.finish().unwrap_err();
        assert_eq!(error.param.as_deref(), Some("bogus"));
    }

    #[test]
    fn nested_paths_and_types() {
        let value = json!({"include_usage": "yes"});
        let mut fields = Fields::new(&value, "stream_options").unwrap();
        let error = fields.bool("include_usage").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("stream_options.include_usage"));
        assert!(error.message.contains("boolean"));
    }

    #[test]
    fn ranges_nulls_and_neutral_values() {
        let value = json!({"t": 3.5, "n": null, "k": 2.0, "p": 1.0, "q": 1.1});
        let mut fields = Fields::new(&value, "request body").unwrap();
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
        assert!(Fields::new(&value, "request body").is_err());
    }
}
