//! The `log` import: a plugin's log lines go to the host's `tracing` output, each tagged with
//! the calling plugin's id (`plugin` field, target `pooler::plugin`).

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
        let plugin = &*self.plugin;
        match level {
            Level::Trace => {
                tracing::trace!(target: "pooler::plugin", plugin, fields = %fields_text, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "pooler::plugin", plugin, fields = %fields_text, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "pooler::plugin", plugin, fields = %fields_text, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "pooler::plugin", plugin, fields = %fields_text, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "pooler::plugin", plugin, fields = %fields_text, "{message}")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
