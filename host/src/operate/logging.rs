//! The host's log output: `tracing` events written to standard error as text or as one JSON
//! object per line (`pooler serve --log-format text|json`), at the level `--log-level` gives
//! (a `tracing` filter such as `debug` or `info,pooler::plugin=debug`), else `RUST_LOG`, else
//! `info` for `serve` (`warn` for the other commands).
//!
//! A plugin's structured fields (the `log` import, [`crate::runtime::imports::log`]) come
//! out as fields of their own: in JSON as members of the line's object (a name the host
//! uses itself — `timestamp`, `level`, `target`, `message`, `plugin` — gets the prefix
//! `field.`), in text as `name=value` pairs after the message. The import hands them over
//! twice: `fields`, the pairs as text (what the text format prints), and [`PLUGIN_FIELDS`],
//! the same as a JSON object (what the JSON format spreads into the line); each format
//! drops the other.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event field that carries a plugin's fields as a JSON object (text).
pub const PLUGIN_FIELDS: &str = "fields_json";

/// The names the JSON format gives the line's own members.
const RESERVED: [&str; 5] = ["timestamp", "level", "target", "message", "plugin"];

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event: time, level, target, message, then `name=value` fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and every field.
    Json,
}

/// The filter: `level` if given (refused when it does not parse), else `RUST_LOG`, else
/// `default`.
pub fn filter(level: Option<&str>, default: &str) -> Result<EnvFilter, String> {
    match level {
        Some(level) => {
            // A bare word that is no level would pass as a target name: refuse it.
            let plain = level.parse::<LevelFilter>().is_ok();
            if !plain && !level.contains('=') {
                return Err(format!(
                    "--log-level `{level}` is not a level (trace, debug, info, warn, error, off) \
                     or a filter such as `info,pooler::plugin=debug`"
                ));
            }
            EnvFilter::try_new(level)
                .map_err(|e| format!("--log-level `{level}` is not a level or filter: {e}"))
        }
        None => Ok(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))),
    }
}

/// Install the global subscriber writing to standard error. Text is coloured only when
/// standard error is a terminal and `NO_COLOR` is unset (a log file or a pipe gets plain
/// text; JSON is never coloured).
pub fn init(format: LogFormat, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.fmt_fields(TextFields).init(),
        LogFormat::Json => builder.event_format(JsonLines).init(),
    }
}

/// Whether log text is coloured: on a terminal, unless `NO_COLOR` is set to anything
/// non-empty (<https://no-color.org>).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The text format's fields: `name=value` separated by spaces; a plugin's `fields` are
/// printed as they are (already `name=value …`), its [`PLUGIN_FIELDS`] not at all.
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct TextVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    fn write(&mut self, text: fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        if !self.first {
            self.result = self.writer.write_str(" ");
        }
        self.first = false;
        if self.result.is_ok() {
            self.result = self.writer.write_fmt(text);
        }
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.write(format_args!("{value}")),
            _ => self.record_debug(field, &value),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            PLUGIN_FIELDS => {}
            "message" | "fields" => self.write(format_args!("{value:?}")),
            name => self.write(format_args!("{name}={value:?}")),
        }
    }
}

/// The JSON format: one object per line.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let line = json_line(event, |out| {
            let mut time = String::new();
            let _ = SystemTime.format_time(&mut Writer::new(&mut time));
            out.insert("timestamp".into(), Value::String(time));
            // The spans the event is in, innermost last, with their fields as text.
            if let Some(scope) = ctx.event_scope() {
                let spans: Vec<Value> = scope
                    .from_root()
                    .map(|span| {
                        let ext = span.extensions();
                        let fields = ext
                            .get::<FormattedFields<N>>()
                            .map(|f| f.fields.clone())
                            .unwrap_or_default();
                        serde_json::json!({ "name": span.name(), "fields": fields })
                    })
                    .collect();
                if !spans.is_empty() {
                    out.insert("spans".into(), Value::Array(spans));
                }
            }
        });
        writeln!(writer, "{line}")
    }
}

/// One event as a JSON object (what [`JsonLines`] writes, `extra` adding members first).
pub fn json_line(event: &Event<'_>, extra: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let meta = event.metadata();
    let mut out = Map::new();
    extra(&mut out);
    out.insert("level".into(), Value::String(meta.level().to_string()));
    out.insert("target".into(), Value::String(meta.target().to_owned()));
    let mut visitor = JsonVisitor::default();
    event.record(&mut visitor);
    if let Some(message) = visitor.message {
        out.insert("message".into(), Value::String(message));
    }
    let spread = visitor.plugin_fields.is_some();
    for (name, value) in visitor.fields {
        // A plugin's `fields` text is spread from its JSON twin instead.
        if spread && name == "fields" {
            continue;
        }
        out.insert(name, value);
    }
    for (name, value) in visitor.plugin_fields.unwrap_or_default() {
        let name = if RESERVED.contains(&name.as_str()) || out.contains_key(&name) {
            format!("field.{name}")
        } else {
            name
        };
        out.insert(name, value);
    }
    Value::Object(out)
}

#[derive(Default)]
struct JsonVisitor {
    message: Option<String>,
    fields: Vec<(String, Value)>,
    plugin_fields: Option<Map<String, Value>>,
}

impl JsonVisitor {
    fn put(&mut self, field: &Field, value: Value) {
        self.fields.push((field.name().to_owned(), value));
    }
}

impl Visit for JsonVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = Some(value.to_owned()),
            PLUGIN_FIELDS => self.plugin_fields(value),
            _ => self.put(field, Value::String(value.to_owned())),
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        match field.name() {
            "message" => self.message = Some(text),
            PLUGIN_FIELDS => self.plugin_fields(&text),
            _ => self.put(field, Value::String(text)),
        }
    }
}

impl JsonVisitor {
    fn plugin_fields(&mut self, text: &str) {
        match serde_json::from_str::<Map<String, Value>>(text) {
            Ok(map) => self.plugin_fields = Some(map),
            // Not an object (cut short by the line limit): keep it as text.
            Err(_) => self
                .fields
                .push((PLUGIN_FIELDS.to_owned(), Value::String(text.to_owned()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn capture(format: LogFormat, f: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE);
        match format {
            LogFormat::Text => {
                tracing::subscriber::with_default(builder.fmt_fields(TextFields).finish(), f)
            }
            LogFormat::Json => {
                tracing::subscriber::with_default(builder.event_format(JsonLines).finish(), f)
            }
        }
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    fn plugin_line() {
        let fields = serde_json::json!({
            "thread": "t1", "attempts": "a1:200:5", "message": "clash", "upstream_ms": "12"
        })
        .to_string();
        tracing::info!(
            target: "pooler::plugin",
            plugin = "account-pool",
            fields = %"thread=t1 attempts=a1:200:5 message=clash upstream_ms=12",
            fields_json = %fields,
            "request served"
        );
    }

    #[test]
    fn text_is_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }

    #[test]
    fn json_lines_spread_a_plugins_fields_as_members() {
        let out = capture(LogFormat::Json, plugin_line);
        let line: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["target"], "pooler::plugin");
        assert_eq!(line["message"], "request served");
        assert_eq!(line["plugin"], "account-pool");
        assert_eq!(line["thread"], "t1");
        assert_eq!(line["attempts"], "a1:200:5");
        assert_eq!(line["upstream_ms"], "12");
        // A plugin field named like one of the line's own is kept under a prefix.
        assert_eq!(line["field.message"], "clash");
        assert!(
            line.get("fields").is_none() && line.get(PLUGIN_FIELDS).is_none(),
            "{line}"
        );
        assert!(
            line["timestamp"].as_str().is_some_and(|t| t.contains('T')),
            "{line}"
        );
    }

    #[test]
    fn json_lines_keep_the_hosts_own_fields_typed() {
        let out = capture(
            LogFormat::Json,
            || tracing::warn!(row = 7u64, ok = false, thread = %"t2", "row postponed"),
        );
        let line: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["row"], 7);
        assert_eq!(line["ok"], false);
        assert_eq!(line["thread"], "t2");
        assert_eq!(line["level"], "WARN");
    }

    #[test]
    fn text_lines_print_a_plugins_fields_as_name_value_pairs() {
        let out = capture(LogFormat::Text, plugin_line);
        assert!(
            out.contains(
                "request served plugin=\"account-pool\" thread=t1 attempts=a1:200:5 message=clash upstream_ms=12"
            ),
            "{out}"
        );
        assert!(!out.contains(PLUGIN_FIELDS) && !out.contains('{'), "{out}");
    }

    #[test]
    fn a_bad_level_is_refused_and_a_good_one_taken() {
        assert!(filter(Some("loud"), "info").is_err());
        assert!(filter(Some("debug"), "info").is_ok());
        assert!(filter(Some("info,pooler::plugin=trace"), "info").is_ok());
    }
}
