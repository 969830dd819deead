//! Setting value formats shared by the plugins: durations and booleans.
//!
//! Durations are written `250ms`, `20s`, `5m`, `6h`, `1d`, or as a plain number of
//! milliseconds; the canonical form is the largest unit that divides the value exactly.

/// Parse a duration into milliseconds. `None` for anything else (empty, negative, unknown
/// unit, overflow).
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    let factor: u64 = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// The canonical text of a duration in milliseconds.
pub fn format_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    if ms == 0 {
        return "0s".to_owned();
    }
    for (factor, unit) in UNITS {
        if ms.is_multiple_of(factor) {
            return format!("{}{unit}", ms / factor);
        }
    }
    format!("{ms}ms")
}

/// Parse `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// The canonical text of a boolean setting.
pub fn format_bool(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("20s"), Some(20_000));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("6h"), Some(21_600_000));
        assert_eq!(parse_duration_ms("1500"), Some(1500));
        assert_eq!(parse_duration_ms(" 2d "), Some(172_800_000));
        for bad in ["", "s", "-5s", "5x", "1.5s", "99999999999999999999h"] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
        assert_eq!(format_duration_ms(21_600_000), "6h");
        assert_eq!(format_duration_ms(90_000), "90s");
        assert_eq!(format_duration_ms(250), "250ms");
        assert_eq!(format_duration_ms(0), "0s");
    }

    #[test]
    fn booleans_parse() {
        assert_eq!(parse_bool("on"), Some(true));
        assert_eq!(parse_bool("OFF"), Some(false));
        assert_eq!(parse_bool("maybe"), None);
        assert_eq!(format_bool(true), "on");
    }
}
