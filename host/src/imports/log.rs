//! The `log` import: a plugin's log lines go to the host's `tracing` output, each tagged with
//! the calling plugin's id (`plugin` field, target `pooler::plugin`). Its fields are given
//! twice: `fields`, as `name=value` text, and `fields_json`, as one JSON object, so each log
//! format ([`crate::logging`]) shows them as fields of their own.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::bindings::pool::pooler::plugins::log::{self, Host, Level};

/// Longest line kept (message and fields together); the rest is cut.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// Per-instance state: who is logging.
pub struct LogCtx {
    plugin: Arc<str>,
}

impl LogCtx {
    pub fn new(plugin: Arc<str>) -> Self {
        LogCtx { plugin }
    }
}

struct LogImport;
impl HasData for LogImport {
    type Data<'a> = &'a mut LogCtx;
}

/// Add the `log` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> &mut LogCtx,
) -> wasmtime::Result<()> {
    log::add_to_linker::<T, LogImport>(linker, view)
}

/// Cut `text` to at most `max` bytes on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// The fields as one JSON object (the JSON log format spreads it into the line, see
/// [`crate::logging`]); `None` when it would pass `max` bytes (the text form, cut, stays).
fn fields_json(fields: &[(String, String)], max: usize) -> Option<String> {
    let object: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    let text = serde_json::Value::Object(object).to_string();
    (text.len() <= max).then_some(text)
}

impl Host for &mut LogCtx {
    fn log(
        &mut self,
        level: Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let mut message = message;
        truncate(&mut message, MAX_LINE_BYTES);
        let mut fields_text = fields
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        truncate(
            &mut fields_text,
            MAX_LINE_BYTES.saturating_sub(message.len()),
        );
        let fields_json = fields_json(&fields, MAX_LINE_BYTES.saturating_sub(message.len()));
        let plugin = &*self.plugin;
        match level {
            Level::Trace => {
                tracing::trace!(target: "pooler::plugin", plugin, fields = %fields_text, fields_json = fields_json.as_deref(), "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "pooler::plugin", plugin, fields = %fields_text, fields_json = fields_json.as_deref(), "{message}")
            }
            Level::Info => {
                tracing::info!(target: "pooler::plugin", plugin, fields = %fields_text, fields_json = fields_json.as_deref(), "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "pooler::plugin", plugin, fields = %fields_text, fields_json = fields_json.as_deref(), "{message}")
            }
            Level::Error => {
                tracing::error!(target: "pooler::plugin", plugin, fields = %fields_text, fields_json = fields_json.as_deref(), "{message}")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_become_one_json_object_unless_too_long() {
        let fields = vec![
            ("thread".to_string(), "t \"1\"".to_string()),
            ("outcome".to_string(), "served".to_string()),
        ];
        let text = fields_json(&fields, 1000).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["thread"], "t \"1\"");
        assert_eq!(value["outcome"], "served");
        assert_eq!(fields_json(&fields, 10), None);
    }

    #[test]
    fn long_lines_are_cut_on_a_character_boundary() {
        let mut text = "é".repeat(10);
        truncate(&mut text, 5);
        assert_eq!(text, "éé…");
        let mut short = "ok".to_string();
        truncate(&mut short, 5);
        assert_eq!(short, "ok");
    }
}
