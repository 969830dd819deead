//! Reading an admin request's JSON body one named field at a time ([`Fields`]): each
//! accessor removes its field and `finish` refuses the rest by name. Messages name the
//! field and the expected type, never the value, because bodies carry secrets.

use serde_json::{Map, Value};

use super::ApiError;
use crate::operate::wire::ProviderName;
use crate::runtime::bindings::types::Provider;

/// A JSON request body, read one named field at a time. Each accessor removes its field;
/// [`Fields::finish`] refuses the fields nobody asked for, by name. Messages name the field
/// and the expected type, never the value (bodies carry secrets).
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
    /// `outer.` for a nested object, so messages name the whole path.
    prefix: String,
}

impl Fields {
    pub(super) fn new(map: Map<String, Value>) -> Self {
        Fields {
            map,
            prefix: String::new(),
        }
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    fn wrong(&self, name: &str, expected: &str) -> ApiError {
        ApiError::bad_request(
            "invalid-field",
            format!("`{}{name}` must be {expected}", self.prefix),
        )
    }

    fn missing(&self, name: &str) -> ApiError {
        ApiError::bad_request(
            "missing-field",
            format!("`{}{name}` is required", self.prefix),
        )
    }

    /// Take `name` as a string; None when absent or null, `invalid-field` when not a string.
    pub fn opt_str(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(name, "a string")),
        }
    }

    /// Take `name` as a string; `missing-field` when absent or null.
    pub fn str(&mut self, name: &str) -> Result<String, ApiError> {
        self.opt_str(name)?.ok_or_else(|| self.missing(name))
    }

    /// Take `name` as a 32-bit whole number; None when absent or null.
    pub fn opt_i32(&mut self, name: &str) -> Result<Option<i32>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(name, "a whole number (32-bit)")),
        }
    }

    /// Take `name` as a 32-bit whole number; `missing-field` when absent or null.
    pub fn i32(&mut self, name: &str) -> Result<i32, ApiError> {
        self.opt_i32(name)?.ok_or_else(|| self.missing(name))
    }

    /// Take `name` as a non-negative whole number; None when absent or null.
    pub fn opt_u64(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(name, "a non-negative whole number")),
        }
    }

    /// Take `name` as `true` or `false`; None when absent or null.
    pub fn opt_bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(self.wrong(name, "true or false")),
        }
    }

    /// Take `name` as a number; None when absent or null.
    pub fn opt_f64(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(name, "a number")),
        }
    }

    /// Take `name` as a provider (`claude` or `codex`); `missing-field` when absent or null.
    pub fn provider(&mut self, name: &str) -> Result<Provider, ApiError> {
        let text = self.str(name)?;
        ProviderName::parse(&text)
            .map(Provider::from)
            .ok_or_else(|| self.wrong(name, "`claude` or `codex`"))
    }

    /// Take `name` as a provider (`claude` or `codex`); None when absent or null.
    pub fn opt_provider(&mut self, name: &str) -> Result<Option<Provider>, ApiError> {
        if self.map.get(name).is_none_or(Value::is_null) {
            // A null is as good as no field: read it, so `finish` does not call it unknown.
            self.map.remove(name);
            return Ok(None);
        }
        self.provider(name).map(Some)
    }

    /// A list of strings, empty when the field is missing or null.
    pub fn opt_strings(&mut self, name: &str) -> Result<Vec<String>, ApiError> {
        if self.map.get(name).is_none_or(Value::is_null) {
            self.map.remove(name);
            return Ok(Vec::new());
        }
        self.strings(name)
    }

    /// Take `name` as a list of strings; `missing-field` when absent or null.
    pub fn strings(&mut self, name: &str) -> Result<Vec<String>, ApiError> {
        match self.take(name) {
            None => Err(self.missing(name)),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    _ => Err(self.wrong(name, "a list of strings")),
                })
                .collect(),
            Some(_) => Err(self.wrong(name, "a list of strings")),
        }
    }

    /// A nested object, read the same way (field names in messages are `outer.inner`).
    pub fn object(&mut self, name: &str) -> Result<Option<Fields>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields {
                map,
                prefix: format!("{}{name}.", self.prefix),
            })),
            Some(_) => Err(self.wrong(name, "an object")),
        }
    }

    /// Refuse any field left unread, naming it.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(name) => Err(ApiError::bad_request(
                "unknown-field",
                format!("unknown field `{}{name}`", self.prefix),
            )),
        }
    }
}
