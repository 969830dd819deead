//! Text output shared by the commands: times (UTC ISO-8601 and relative), tables with aligned
//! columns, shell quoting for `KEY=VALUE` lines, and the escaping of text that came from
//! outside (an upstream's error, a label, a client's session id) so that it cannot move the
//! cursor, retitle or clear the terminal, reorder what is shown (bidi controls) or hide in
//! it (zero-width characters): [`visible`] for one text, [`visible_json`] for a whole answer
//! the text printers read, [`json_text`] for `--json`.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Now, in unix epoch milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2025-01-31T09:05:00Z` (seconds precision, UTC).
pub fn iso(ms: u64) -> String {
    crate::time::rfc3339(ms)
}

/// `in 42m`, `3h 5m ago`, `now` — relative to `now` (both epoch ms).
pub fn relative(ms: u64, now: u64) -> String {
    let (delta, future) = if ms >= now {
        (ms - now, true)
    } else {
        (now - ms, false)
    };
    let secs = delta / 1000;
    if secs < 1 {
        return "now".to_owned();
    }
    let text = if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m", secs / 60)
    } else if secs < 86_400 {
        match secs % 3600 / 60 {
            0 => format!("{}h", secs / 3600),
            m => format!("{}h {m}m", secs / 3600),
        }
    } else {
        match secs % 86_400 / 3600 {
            0 => format!("{}d", secs / 86_400),
            h => format!("{}d {h}h", secs / 86_400),
        }
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// `2025-01-31T09:05:00Z (in 42m)`.
pub fn when(ms: u64, now: u64) -> String {
    format!("{} ({})", iso(ms), relative(ms, now))
}

/// Rows under a header, each column as wide as its widest cell; the last column is not
/// padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `value` as one shell word: unchanged when it needs no quoting, else single-quoted.
pub fn shell_quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:@%+=,".contains(&b));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// Whether `c` is shown escaped: C0 controls, DEL and C1 controls (terminal escapes,
/// `\x9b` is a one-byte CSI), the bidi controls (embeddings, overrides, isolates, marks),
/// zero-width and other invisible format characters, line and paragraph separators, and
/// tag characters.
pub fn hidden(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

/// `text` with every [`hidden`] character written out visibly, Rust-style: `\n`, `\r`,
/// `\t`, `\x1b` up to U+00FF, `\u{202e}` beyond. Nothing is dropped; text without such
/// characters is returned as is.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hidden(c) && u32::from(c) <= 0xff => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if hidden(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`visible`], keeping line breaks: for a message whose lines are the writer's own (an
/// error with its context lines).
pub fn visible_lines(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && hidden(c)) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.split('\n').map(visible).collect::<Vec<_>>().join("\n"))
}

/// `value` with every string in it (object keys too) made [`visible`]: what the text
/// printers read, so that no field they print, now or later, can reach the terminal raw.
pub fn visible_json(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(visible(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(visible_json).collect()),
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(k, v)| (visible(k).into_owned(), visible_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `value` as JSON text (indented when `pretty`) with every [`hidden`] character written as
/// a `\uXXXX` escape. serde_json escapes the C0 controls itself, but passes DEL, C1, bidi and
/// zero-width characters raw, and `--json` is read in terminals too. An escape is the same
/// string to every JSON reader, so nothing a program sees changes. Past the C0 range (whose
/// only raw members here are the layout's own line breaks) such characters occur only
/// inside strings, so escaping them anywhere in the text is sound.
pub fn json_text(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    }
    .unwrap_or_else(|_| value.to_string());
    let escaped = |c: char| c > '\u{1f}' && hidden(c);
    if !text.chars().any(escaped) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream error with an OSC title, a screen clear, a C1 CSI, a bidi override and
    /// a zero-width space: each written out, the rest kept.
    #[test]
    fn outside_text_is_shown_escaped_not_dropped() {
        let hostile =
            "bad\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m \u{202e}txt.exe\u{200b}!\n\tend\u{7f}";
        assert_eq!(
            visible(hostile),
            "bad\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m \\u{202e}txt.exe\\u{200b}!\\n\\tend\\x7f"
        );
        for c in [
            '\u{2066}',
            '\u{2069}',
            '\u{200e}',
            '\u{200f}',
            '\u{feff}',
            '\u{2028}',
            '\u{61c}',
            '\u{e0041}',
        ] {
            assert!(visible(&c.to_string()).starts_with("\\u{"), "{c:?}");
        }
        assert!(matches!(visible("plain ünïcode — ok"), Cow::Borrowed(_)));
        assert_eq!(visible_lines("a\u{1b}[2J\nb\tc"), "a\\x1b[2J\nb\\tc");
    }

    #[test]
    fn a_whole_answer_is_made_visible_and_json_stays_the_same_to_a_reader() {
        let answer = serde_json::json!({
            "label\u{202e}": ["x\u{1b}[2J", 1, null, {"s": "\u{9b}\u{200b}\u{e0041}"}],
        });
        assert_eq!(
            visible_json(&answer),
            serde_json::json!({
                "label\\u{202e}": ["x\\x1b[2J", 1, null, {"s": "\\x9b\\u{200b}\\u{e0041}"}],
            })
        );
        for pretty in [false, true] {
            let text = json_text(&answer, pretty);
            assert!(!text.chars().any(|c| c != '\n' && hidden(c)), "{text}");
            assert!(
                text.contains("\\u202e") && text.contains("\\udb40\\udc41"),
                "{text}"
            );
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), answer);
        }
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any text: nothing hidden is left in what is printed, and `--json` reads back
            /// as the same value.
            #[test]
            fn nothing_hidden_is_printed_and_json_reads_back(
                chars in prop::collection::vec(
                    prop_oneof![
                        any::<char>(),
                        prop::sample::select(vec![
                            '\u{1b}', '\u{7}', '\u{7f}', '\u{9b}', '\u{202e}', '\u{2066}',
                            '\u{200b}', '\u{feff}', '\u{e0041}', '\n', '"', '\\',
                        ]),
                    ],
                    0..24,
                ),
            ) {
                let text = String::from_iter(chars);
                prop_assert!(!visible(&text).chars().any(hidden));
                let value = serde_json::json!({ text.clone(): [text.clone()] });
                let json = json_text(&value, true);
                prop_assert!(!json.chars().any(|c| c != '\n' && hidden(c)));
                prop_assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), value);
            }
        }
    }

    #[test]
    fn times_print_as_utc_iso_8601() {
        assert_eq!(iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn relative_times_read_naturally() {
        let now = 1_000_000_000;
        assert_eq!(relative(now, now), "now");
        assert_eq!(relative(now + 42 * 60_000, now), "in 42m");
        assert_eq!(relative(now - 30_000, now), "30s ago");
        assert_eq!(relative(now + 2 * 3_600_000 + 5 * 60_000, now), "in 2h 5m");
        assert_eq!(relative(now + 3 * 86_400_000, now), "in 3d");
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["a1".to_owned(), "claude".to_owned(), "x".to_owned()],
            vec!["b".to_owned(), "codex".to_owned(), String::new()],
        ];
        assert_eq!(
            table(&["ID", "PROVIDER", "NOTE"], &rows),
            "ID  PROVIDER  NOTE\na1  claude    x\nb   codex"
        );
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(
            shell_quote("http://127.0.0.1:8787"),
            "http://127.0.0.1:8787"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
