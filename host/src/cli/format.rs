//! Text output shared by the commands: times (UTC ISO-8601 and relative), tables with aligned
//! columns, and shell quoting for `KEY=VALUE` lines.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix epoch milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2025-01-31T09:05:00Z` (seconds precision, UTC).
pub fn iso(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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

#[cfg(test)]
mod tests {
    use super::*;

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
