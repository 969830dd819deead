//! The reading of the upstreams' rate-limit headers, shared by the core (the snapshot it puts
//! in every `turn-failed` event) and the pool (the observations it routes by): which header
//! names a window, and what each value says, are read here once, and each side builds its
//! own record from the reading.
//!
//! - Anthropic: `anthropic-ratelimit-unified-<window>-{status,reset,utilization}` per window
//!   (`5h`, `7d`, `7d_<bucket>`…), plus `-status`, `-overage-status` and
//!   `-representative-claim` for the whole answer.
//! - Codex: `x-codex-{primary,secondary}-{used-percent,window-minutes,reset-at,
//!   reset-after-seconds,over-limit}`.
//!
//! Every value is trimmed. A number that is not finite is no number; a reset further ahead
//! than [`RESET_HORIZON_MS`](crate::time::RESET_HORIZON_MS) is unknown.

use crate::time::{FAR_FUTURE_MS, after, parse_http_date, secs_text_to_ms, within_horizon};

/// The headers of one answer, as the reading needs them: every name, and a value by name.
/// Names are lowercase, as HTTP/2 and every header map here keep them.
pub trait HeaderSource {
    /// Every header name, each at least once.
    fn names(&self) -> impl Iterator<Item = &str>;
    /// The value of header `name`, if it is present and text.
    fn value(&self, name: &str) -> Option<&str>;
}

/// The prefix of Anthropic's unified rate-limit headers.
pub const CLAUDE_PREFIX: &str = "anthropic-ratelimit-unified-";

/// A numeric reset below this is in seconds; at or above, in milliseconds.
const SECONDS_LIMIT: f64 = 1e12;

/// An absolute reset: a number (seconds below 10¹², else milliseconds) or an HTTP date. A
/// reset beyond the far future is the far future.
pub fn parse_reset(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        if !n.is_finite() || n < 0.0 {
            return None;
        }
        // `as` saturates a float too large for u64; the cap keeps it storable.
        let ms = if n < SECONDS_LIMIT {
            (n * 1000.0).round() as u64
        } else {
            n as u64
        };
        return Some(ms.min(FAR_FUTURE_MS));
    }
    parse_http_date(s)
}

/// A finite number, or nothing.
fn number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|n| n.is_finite())
}

/// One Anthropic window as its headers state it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaudeWindow<'a> {
    /// `5h`, `7d`, `7d_<bucket>`: the text between the prefix and the field.
    pub key: &'a str,
    /// `allowed`, `allowed_warning`, `rejected`, or whatever else the upstream said.
    pub status: Option<&'a str>,
    /// Within the horizon of `now`.
    pub resets_at: Option<u64>,
    /// A fraction, clamped to 0..=1.
    pub utilization: Option<f64>,
}

/// Anthropic's unified rate-limit headers of one answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaudeHeaders<'a> {
    /// In the order their first header came.
    pub windows: Vec<ClaudeWindow<'a>>,
    /// The whole answer's status (`…-unified-status`).
    pub status: Option<&'a str>,
    /// Extra usage (`…-unified-overage-status`).
    pub overage_status: Option<&'a str>,
    /// The window that decided a refusal (`…-unified-representative-claim`).
    pub representative_claim: Option<&'a str>,
}

impl ClaudeHeaders<'_> {
    /// Whether the answer carried any unified rate-limit state at all.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
            && self.status.is_none()
            && self.overage_status.is_none()
            && self.representative_claim.is_none()
    }
}

/// Reads Anthropic's unified headers. A window's key is what stands between the prefix and
/// `-status`, `-reset` or `-utilization`; it is never empty, never `overage` (extra usage is
/// no window) and never holds a `-`, the headers' own separator.
pub fn claude_headers<'a, H: HeaderSource + ?Sized>(headers: &'a H, now: u64) -> ClaudeHeaders<'a> {
    let mut keys: Vec<&'a str> = Vec::new();
    for name in headers.names() {
        let Some(rest) = name.strip_prefix(CLAUDE_PREFIX) else {
            continue;
        };
        let Some((key, field)) = rest.rsplit_once('-') else {
            continue;
        };
        if matches!(field, "status" | "reset" | "utilization")
            && !key.is_empty()
            && key != "overage"
            && !key.contains('-')
            && !keys.contains(&key)
        {
            keys.push(key);
        }
    }
    let field = |name: &str| headers.value(name).map(str::trim);
    let windows = keys
        .into_iter()
        .map(|key| {
            let get = |f: &str| field(&format!("{CLAUDE_PREFIX}{key}-{f}"));
            ClaudeWindow {
                key,
                status: get("status"),
                resets_at: get("reset")
                    .and_then(parse_reset)
                    .and_then(|at| within_horizon(at, now)),
                utilization: get("utilization")
                    .and_then(number)
                    .map(|u| u.clamp(0.0, 1.0)),
            }
        })
        .collect();
    ClaudeHeaders {
        windows,
        status: field(&format!("{CLAUDE_PREFIX}status")),
        overage_status: field(&format!("{CLAUDE_PREFIX}overage-status")),
        representative_claim: field(&format!("{CLAUDE_PREFIX}representative-claim")),
    }
}

/// One Codex window (`primary`, `secondary`) as its headers state it.
#[derive(Debug, Clone, PartialEq)]
pub struct CodexWindow {
    /// `primary` (the short window) or `secondary` (the weekly one).
    pub slot: &'static str,
    /// `used-percent` ÷ 100, clamped to 0..=1.
    pub utilization: Option<f64>,
    /// `window-minutes`.
    pub minutes: Option<u64>,
    /// `reset-at`, else now + `reset-after-seconds`; within the horizon of `now`.
    pub resets_at: Option<u64>,
    /// `over-limit` (`true`, any case, is true; any other value false).
    pub over_limit: Option<bool>,
}

impl CodexWindow {
    /// Whether the window refuses: the upstream says it is over its limit, or it is fully
    /// used.
    pub fn is_spent(&self) -> bool {
        self.over_limit == Some(true) || self.utilization.is_some_and(|u| u >= 1.0)
    }
}

/// Reads Codex's window headers: a slot is present when any of its headers says something
/// readable.
pub fn codex_windows<H: HeaderSource + ?Sized>(headers: &H, now: u64) -> Vec<CodexWindow> {
    let mut windows = Vec::new();
    for slot in ["primary", "secondary"] {
        let get = |f: &str| headers.value(&format!("x-codex-{slot}-{f}")).map(str::trim);
        let utilization = get("used-percent")
            .and_then(number)
            .map(|u| (u / 100.0).clamp(0.0, 1.0));
        let minutes = get("window-minutes").and_then(|v| v.parse::<u64>().ok());
        let resets_at = get("reset-at")
            .and_then(parse_reset)
            .or_else(|| {
                get("reset-after-seconds")
                    .and_then(secs_text_to_ms)
                    .map(|ms| after(now, ms))
            })
            .and_then(|at| within_horizon(at, now));
        let over_limit = get("over-limit").map(|v| v.eq_ignore_ascii_case("true"));
        if utilization.is_none() && minutes.is_none() && resets_at.is_none() && over_limit.is_none()
        {
            continue;
        }
        windows.push(CodexWindow {
            slot,
            utilization,
            minutes,
            resets_at,
            over_limit,
        });
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pairs(Vec<(&'static str, &'static str)>);

    impl HeaderSource for Pairs {
        fn names(&self) -> impl Iterator<Item = &str> {
            self.0.iter().map(|(n, _)| *n)
        }
        fn value(&self, name: &str) -> Option<&str> {
            self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        }
    }

    const NOW: u64 = 1_790_000_000_000;

    #[test]
    fn claude_windows_are_keyed_by_the_text_before_their_field() {
        let h = Pairs(vec![
            ("anthropic-ratelimit-unified-7d-utilization", " 0.4 "),
            ("anthropic-ratelimit-unified-5h-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-reset", "1790003600"),
            ("anthropic-ratelimit-unified-5h-utilization", "1.02"),
            ("anthropic-ratelimit-unified-7d_opus-status", "allowed"),
            ("anthropic-ratelimit-unified-overage-status", "allowed"),
            ("anthropic-ratelimit-unified-a-b-status", "allowed"),
            ("anthropic-ratelimit-unified--status", "allowed"),
            ("anthropic-ratelimit-unified-5h-other", "x"),
            ("anthropic-ratelimit-unified-status", "rejected"),
        ]);
        let r = claude_headers(&h, NOW);
        let keys: Vec<&str> = r.windows.iter().map(|w| w.key).collect();
        assert_eq!(keys, ["7d", "5h", "7d_opus"]);
        assert_eq!(r.windows[0].utilization, Some(0.4));
        assert_eq!(r.windows[1].utilization, Some(1.0));
        assert_eq!(r.windows[1].resets_at, Some(1_790_003_600_000));
        assert_eq!(r.windows[1].status, Some("rejected"));
        assert_eq!(r.status, Some("rejected"));
        assert_eq!(r.overage_status, Some("allowed"));
        assert!(!r.is_empty());
        assert!(claude_headers(&Pairs(vec![("content-type", "x")]), NOW).is_empty());
    }

    #[test]
    fn numbers_that_are_not_finite_and_resets_past_the_horizon_are_unknown() {
        let h = Pairs(vec![
            ("anthropic-ratelimit-unified-5h-utilization", "NaN"),
            ("anthropic-ratelimit-unified-5h-reset", "1e300"),
            ("anthropic-ratelimit-unified-7d-utilization", "inf"),
            ("x-codex-primary-used-percent", "-inf"),
            ("x-codex-primary-reset-after-seconds", "99999999999"),
        ]);
        let r = claude_headers(&h, NOW);
        assert_eq!(r.windows[0].utilization, None);
        assert_eq!(r.windows[0].resets_at, None);
        assert_eq!(r.windows[1].utilization, None);
        // Neither of the slot's headers says anything readable: no slot.
        assert!(codex_windows(&h, NOW).is_empty());
    }

    #[test]
    fn codex_slots_are_present_when_any_header_is_readable() {
        let h = Pairs(vec![
            ("x-codex-primary-used-percent", "42.5"),
            ("x-codex-primary-window-minutes", "300"),
            ("x-codex-primary-reset-after-seconds", "60"),
            ("x-codex-secondary-over-limit", "TRUE"),
        ]);
        let c = codex_windows(&h, NOW);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].slot, "primary");
        assert_eq!(c[0].utilization, Some(0.425));
        assert_eq!(c[0].minutes, Some(300));
        assert_eq!(c[0].resets_at, Some(NOW + 60_000));
        assert_eq!(c[1].over_limit, Some(true));
        assert_eq!(c[1].utilization, None);
        assert!(codex_windows(&Pairs(vec![]), NOW).is_empty());
    }

    #[test]
    fn resets_are_seconds_below_1e12_else_milliseconds_or_dates() {
        assert_eq!(parse_reset("1790003600"), Some(1_790_003_600_000));
        assert_eq!(parse_reset("1790003600000"), Some(1_790_003_600_000));
        assert_eq!(parse_reset("Thu, 01 Jan 1970 00:01:00 GMT"), Some(60_000));
        assert_eq!(parse_reset("-1"), None);
        assert_eq!(parse_reset("1e400"), None);
    }
}
