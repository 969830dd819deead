//! The `log` import: a plugin's log lines go to the host's `tracing` output, each tagged with
//! the calling plugin's id (`plugin` field, target `pooler::plugin`). Its fields are given
//! twice: `fields`, as `name=value` text, and `fields_json`, as one JSON object, so each log
//! format ([`crate::operate::logging`]) shows them as fields of their own.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::runtime::bindings::pool::pooler::plugins::log::{self, Host, Level};

/// Longest line kept (message and fields together); the rest is cut.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// Most bytes of lines (message and fields, each as kept) one instance — one export call or
/// one incoming request — may log; the lines past it are dropped, counted and reported once
/// when the instance ends. Far above what the real plugins log in one call (a re-evaluation
/// pass moving 10,000 rows logs about 2 MiB), so only a plugin logging in a loop meets it.
pub const MAX_CALL_BYTES: usize = 16 * 1024 * 1024;

/// Per-instance state: who is logging, whether a cut line was reported yet, and how much the
/// instance logged and dropped.
pub struct LogCtx {
    plugin: Arc<str>,
    cut_reported: bool,
    /// Bytes of the lines logged so far (as kept, after any cut).
    logged: usize,
    /// Lines dropped past [`MAX_CALL_BYTES`], and their bytes (as they would have been kept).
    dropped: (u64, u64),
}

impl LogCtx {
    /// The state of one instance of `plugin`, which has logged nothing yet.
    pub fn new(plugin: Arc<str>) -> Self {
        LogCtx {
            plugin,
            cut_reported: false,
            logged: 0,
            dropped: (0, 0),
        }
    }

    /// Take a line of `kept` bytes into the call's budget: false when it does not fit (the
    /// line is dropped and counted, and so is every later line of the instance).
    fn admit(&mut self, kept: usize) -> bool {
        if self.dropped.0 > 0 || self.logged.saturating_add(kept) > MAX_CALL_BYTES {
            self.dropped.0 += 1;
            self.dropped.1 += kept as u64;
            return false;
        }
        self.logged += kept;
        true
    }

    /// A line of `bytes` (message and fields) past [`MAX_LINE_BYTES`] was cut: say so once
    /// per instance, naming the plugin and the rule (a plugin that logs megabytes in a loop
    /// gets one warning per call, not one per line).
    fn report_cut(&mut self, bytes: usize) {
        if !self.cut_reported {
            self.cut_reported = true;
            tracing::warn!(
                plugin = &*self.plugin,
                bytes,
                limit = MAX_LINE_BYTES,
                rule = "a plugin's log line is at most 8 KiB",
                "plugin log line cut (said once per call)"
            );
        }
    }
}

impl Drop for LogCtx {
    /// The instance ended: say once how many of its lines were dropped, if any.
    fn drop(&mut self) {
        let (lines, bytes) = self.dropped;
        if lines > 0 {
            tracing::warn!(
                plugin = &*self.plugin,
                lines,
                bytes,
                limit = MAX_CALL_BYTES,
                rule = "a plugin logs at most 16 MiB in one call",
                "plugin log lines dropped (said once per call)"
            );
        }
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
/// [`crate::operate::logging`]); `None` when it would pass `max` bytes (the text form, cut, stays).
fn fields_json(fields: &[(String, String)], max: usize) -> Option<String> {
    let object: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    let text = serde_json::Value::Object(object).to_string();
    (text.len() <= max).then_some(text)
}

/// Whether the host's filter keeps a plugin line of `level` (same target and fields as the
/// line itself, so a filter naming them decides alike).
fn enabled(level: Level) -> bool {
    match level {
        Level::Trace => {
            tracing::enabled!(target: "pooler::plugin", tracing::Level::TRACE, plugin, fields, fields_json)
        }
        Level::Debug => {
            tracing::enabled!(target: "pooler::plugin", tracing::Level::DEBUG, plugin, fields, fields_json)
        }
        Level::Info => {
            tracing::enabled!(target: "pooler::plugin", tracing::Level::INFO, plugin, fields, fields_json)
        }
        Level::Warn => {
            tracing::enabled!(target: "pooler::plugin", tracing::Level::WARN, plugin, fields, fields_json)
        }
        Level::Error => {
            tracing::enabled!(target: "pooler::plugin", tracing::Level::ERROR, plugin, fields, fields_json)
        }
    }
}

impl Host for &mut LogCtx {
    fn log(
        &mut self,
        level: Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        // A line the host's filter drops is not shaped at all: the pool logs a line per
        // request, and building its text and JSON for nobody was a visible share of its CPU.
        if !enabled(level) {
            return Ok(());
        }
        let bytes = message.len()
            + fields
                .iter()
                .map(|(name, value)| name.len() + value.len() + 2)
                .sum::<usize>();
        if !self.admit(bytes.min(MAX_LINE_BYTES)) {
            return Ok(());
        }
        if bytes > MAX_LINE_BYTES {
            self.report_cut(bytes);
        }
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
    fn a_call_logs_at_most_its_budget_and_counts_what_it_dropped() {
        let mut ctx = LogCtx::new(Arc::from("p"));
        let lines = MAX_CALL_BYTES / MAX_LINE_BYTES;
        for _ in 0..lines {
            assert!(ctx.admit(MAX_LINE_BYTES));
        }
        assert!(!ctx.admit(MAX_LINE_BYTES), "the budget is full");
        assert!(!ctx.admit(0), "and every later line is dropped too");
        assert!(!ctx.admit(1));
        assert_eq!(ctx.logged, MAX_CALL_BYTES);
        assert_eq!(ctx.dropped, (3, 1 + MAX_LINE_BYTES as u64));
        // A fresh instance has the whole budget again.
        assert!(LogCtx::new(Arc::from("p")).admit(MAX_LINE_BYTES));
    }

    /// Runs `f` with the host's log filter at `level`, the lines going nowhere.
    fn with_filter<R>(level: tracing::Level, f: impl FnOnce() -> R) -> R {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    }

    #[test]
    fn a_line_the_filter_drops_is_not_taken_into_the_budget() {
        let mut ctx = LogCtx::new(Arc::from("p"));
        with_filter(tracing::Level::WARN, || {
            let mut host = &mut ctx;
            let fields = vec![("thread".to_string(), "t1".to_string())];
            host.log(Level::Info, "served".into(), fields.clone())
                .unwrap();
            host.log(Level::Debug, "x".repeat(2 * MAX_LINE_BYTES), vec![])
                .unwrap();
            assert_eq!(host.logged, 0, "info and debug are under the filter");
            assert!(
                !host.cut_reported,
                "a dropped long line is not reported as cut"
            );
            host.log(Level::Warn, "served".into(), fields).unwrap();
        });
        assert_eq!(ctx.logged, "served".len() + "thread".len() + "t1".len() + 2);
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

    mod properties {
        use super::super::*;
        use super::with_filter;
        use proptest::prelude::*;

        fn level() -> impl Strategy<Value = Level> {
            prop_oneof![
                Just(Level::Trace),
                Just(Level::Debug),
                Just(Level::Info),
                Just(Level::Warn),
                Just(Level::Error),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any text cut at any length: no panic, valid UTF-8, a prefix of the text, at
            /// most `max` bytes plus the ellipsis.
            #[test]
            fn any_text_is_cut_on_a_boundary(text in any::<String>(), max in 0usize..64) {
                let mut cut = text.clone();
                truncate(&mut cut, max);
                if text.len() <= max {
                    prop_assert_eq!(&cut, &text);
                } else {
                    let kept = cut.strip_suffix('…').unwrap();
                    prop_assert!(kept.len() <= max);
                    prop_assert!(text.starts_with(kept));
                }
            }

            /// Any line a plugin may log (any level, message and fields, some far past the
            /// limit): the import answers `Ok` and never panics.
            #[test]
            fn any_log_call_is_taken(
                level in level(),
                message in prop_oneof![any::<String>(), "[a-z]{1,8}".prop_map(|s| s.repeat(2_000))],
                fields in proptest::collection::vec((any::<String>(), any::<String>()), 0..16),
            ) {
                let mut ctx = LogCtx::new(Arc::from("p"));
                let mut host = &mut ctx;
                if let Some(json) = fields_json(&fields, usize::MAX) {
                    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
                    prop_assert!(value.is_object());
                }
                let taken = with_filter(tracing::Level::TRACE, || host.log(level, message, fields));
                prop_assert!(taken.is_ok());
            }
        }
    }
}
