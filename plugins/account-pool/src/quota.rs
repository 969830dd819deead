//! Quota observations: parsing the upstreams' rate-limit headers and usage endpoints,
//! merging observations into an account's stored windows, and the predicates over them
//! (rejected, near the switch threshold, blocking reset).
//!
//! Utilization is always a fraction 0..=1. A window whose reset has passed never blocks,
//! whatever it last said. A reset or a `Retry-After` further ahead than
//! [`RESET_HORIZON_MS`] (30 days) is unknown: a window then has no known reset, a
//! `Retry-After` counts as absent.

use crate::http::Headers;
use crate::model::Family;
use pooler_plugin_kit::ratelimit;
use pooler_plugin_kit::time::{RESET_HORIZON_MS, RetryAfter, after, secs_to_ms, within_horizon};
use serde_json::Value;

/// What a `Retry-After` means when it is missing or unreadable.
pub const DEFAULT_RETRY_AFTER_MS: u64 = 1_000;

/// An absolute reset: a number (seconds below 10¹², else milliseconds) or an HTTP date; the
/// kit's reading, which the core's snapshots share.
pub use pooler_plugin_kit::ratelimit::parse_reset;

/// `Retry-After` as a delay in milliseconds: numeric seconds (fractions rounded up to the
/// millisecond) or an HTTP date minus `now`. Missing, invalid or past the horizon: 1 s.
pub fn parse_retry_after(value: Option<&str>, now: u64) -> u64 {
    retry_after_ms(value, now).unwrap_or(DEFAULT_RETRY_AFTER_MS)
}

/// `Retry-After` as a delay in milliseconds, None when missing, invalid or further than
/// [`RESET_HORIZON_MS`] ahead (a date in year 9999 would hold an account, and tell the
/// client to wait, for millennia).
pub fn retry_after_ms(value: Option<&str>, now: u64) -> Option<u64> {
    let delay = match pooler_plugin_kit::time::parse_retry_after(value?)? {
        RetryAfter::Delay(ms) => ms,
        RetryAfter::At(at) => at.saturating_sub(now),
    };
    (delay <= RESET_HORIZON_MS).then_some(delay)
}

/// The window the pool records when the provider's billing refused an account for a model
/// family (extra usage spent, or required and not on): scoped to that family, refused
/// until its reset, whatever extra usage the headers offer.
pub const EXTRA_USAGE_WINDOW: &str = "extra-usage";

/// One observed quota window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// `5h`, `7d`, `7d_<bucket>` (Claude), `primary`, `secondary` (Codex).
    pub name: String,
    /// The family a scoped window applies to; None for shared windows.
    pub family: Option<Family>,
    pub utilization: Option<f64>,
    pub resets_at: Option<u64>,
    /// `allowed`, `allowed_warning` or `rejected`.
    pub status: Option<String>,
    pub observed_at: u64,
}

impl Window {
    fn reset_pending(&self, now: u64) -> bool {
        self.resets_at.is_none_or(|r| r > now)
    }

    /// A weekly window (Claude `7d`, `7d_<bucket>`; Codex `secondary`); the others (Claude
    /// `5h`, Codex `primary`) are the short windows.
    pub fn is_weekly(&self) -> bool {
        self.name == "7d" || self.name == "secondary" || self.name.starts_with("7d_")
    }

    /// The share of the window left now, 0..=1: all of it once its reset has passed, none
    /// while it is refused, else 1 − utilization (all of it when no utilization was seen).
    pub fn left(&self, now: u64) -> f64 {
        if !self.reset_pending(now) {
            1.0
        } else if self.rejected(now) {
            0.0
        } else {
            1.0 - self.utilization.unwrap_or(0.0).clamp(0.0, 1.0)
        }
    }

    /// Refused by the upstream: status `rejected` or utilization ≥ 1, reset not passed.
    pub fn rejected(&self, now: u64) -> bool {
        self.reset_pending(now)
            && (self.status.as_deref() == Some("rejected")
                || self.utilization.is_some_and(|u| u >= 1.0))
    }

    /// Whether the window keeps its account from serving now: refused, and not a family
    /// window that `extra_usage` covers.
    pub fn blocks(&self, extra_usage: bool, now: u64) -> bool {
        self.rejected(now)
            && (self.family.is_none() || self.name == EXTRA_USAGE_WINDOW || !extra_usage)
    }

    /// At or over the switch threshold but not refused: a reserve account (#6169).
    pub fn near(&self, threshold: f64, now: u64) -> bool {
        self.reset_pending(now)
            && !self.rejected(now)
            && self.utilization.is_some_and(|u| u >= threshold)
    }
}

/// A usage restriction (Codex workspace hard stop): blocks even below the threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Restriction {
    pub reason: String,
    pub resets_at: Option<u64>,
}

/// Everything observed about one account's quota.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaState {
    pub windows: Vec<Window>,
    /// Claude `overage-status` (`allowed`, `allowed_warning`, `rejected`).
    pub overage: Option<String>,
    /// Codex credits that allow use beyond the windows.
    pub credits: Option<bool>,
    pub representative_claim: Option<String>,
    pub restriction: Option<Restriction>,
    /// The account's own choice, not an observation: whether paid extra usage may cover a
    /// model-family window its plan has spent (`extra-usage = allow`). Off (`deny`), such a
    /// window counts as spent whatever the headers allow.
    pub extra_usage_allowed: bool,
}

/// When an account will serve again, as far as its quota goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockingReset {
    /// Nothing blocks.
    NotBlocked,
    /// Blocked until this time (the latest reset among the blocking windows).
    At(u64),
    /// Blocked by a window (or restriction) without a known reset.
    Unknown,
}

impl QuotaState {
    pub fn restricted(&self, now: u64) -> bool {
        self.restriction
            .as_ref()
            .is_some_and(|r| r.resets_at.is_none_or(|t| t > now))
    }

    /// Extra usage (paid overage or credits) lets an account serve a family whose window
    /// is exhausted: the account allows it, the upstream offers it, and no restriction
    /// stands.
    pub fn extra_usage(&self, now: u64) -> bool {
        self.extra_usage_allowed
            && !self.restricted(now)
            && (matches!(self.overage.as_deref(), Some("allowed" | "allowed_warning"))
                || self.credits == Some(true))
    }

    fn shared(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().filter(|w| w.family.is_none())
    }

    fn scoped(&self, family: Family) -> impl Iterator<Item = &Window> {
        self.windows
            .iter()
            .filter(move |w| w.family == Some(family))
    }

    /// A shared window (5 h, 7 d, a Codex window) is refused.
    pub fn shared_exhausted(&self, now: u64) -> bool {
        self.shared().any(|w| w.rejected(now))
    }

    /// The family's own window is refused and no extra usage covers it (the provider's
    /// billing refusal, [`EXTRA_USAGE_WINDOW`], is never covered).
    pub fn family_exhausted(&self, family: Family, now: u64) -> bool {
        let extra = self.extra_usage(now);
        self.scoped(family).any(|w| w.blocks(extra, now))
    }

    /// The share left of the tightest window a request of `family` draws on (the shared
    /// windows and the family's own), 0..=1; all of it when nothing was observed.
    pub fn remaining(&self, family: Option<Family>, now: u64) -> f64 {
        self.windows
            .iter()
            .filter(|w| w.family.is_none() || w.family == family)
            .map(|w| w.left(now))
            .fold(1.0, f64::min)
    }

    /// The share left of the tightest weekly window a request of `family` draws on, and
    /// when the shared weekly window resets (else the family's): what expires unused at
    /// that reset. `(1.0, None)` when no weekly window was observed.
    pub fn weekly_left(&self, family: Option<Family>, now: u64) -> (f64, Option<u64>) {
        let weekly = || {
            self.windows
                .iter()
                .filter(move |w| w.is_weekly() && (w.family.is_none() || w.family == family))
        };
        let left = weekly().map(|w| w.left(now)).fold(1.0, f64::min);
        let pending = |w: &&Window| w.resets_at.filter(|t| *t > now);
        let reset = weekly()
            .filter(|w| w.family.is_none())
            .find_map(|w| pending(&w))
            .or_else(|| weekly().find_map(|w| pending(&w)));
        (left, reset)
    }

    /// The share left of the account's short (5-hour) shared windows: all of it when none
    /// was observed or its reset has passed.
    pub fn short_left(&self, now: u64) -> f64 {
        self.shared()
            .filter(|w| !w.is_weekly())
            .map(|w| w.left(now))
            .fold(1.0, f64::min)
    }

    /// The utilization of the account's shared weekly window(s) now (0 when none is known,
    /// or its reset has passed): what a per-account `preserve` ceiling is compared with.
    pub fn weekly_utilization(&self, now: u64) -> f64 {
        self.shared()
            .filter(|w| w.is_weekly())
            .map(|w| 1.0 - w.left(now))
            .fold(0.0, f64::max)
    }

    /// A shared or (when given) family window is at or over the threshold.
    pub fn near_limit(&self, family: Option<Family>, threshold: f64, now: u64) -> bool {
        self.shared().any(|w| w.near(threshold, now))
            || family.is_some_and(|f| self.scoped(f).any(|w| w.near(threshold, now)))
    }

    /// The account's blocking reset for `family`: the restriction's reset when restricted;
    /// else the **latest** reset among the refused shared windows and the refused family
    /// window; unknown when one of them has no reset.
    pub fn blocking_reset(&self, family: Option<Family>, now: u64) -> BlockingReset {
        if self.restricted(now) {
            return match self.restriction.as_ref().and_then(|r| r.resets_at) {
                Some(t) => BlockingReset::At(t),
                None => BlockingReset::Unknown,
            };
        }
        let family_blocks = family.is_some_and(|f| self.family_exhausted(f, now));
        let blocking = self.windows.iter().filter(|w| {
            w.rejected(now)
                && match w.family {
                    None => true,
                    Some(f) => family_blocks && Some(f) == family,
                }
        });
        let mut latest = None;
        for w in blocking {
            match w.resets_at {
                None => return BlockingReset::Unknown,
                Some(t) => latest = Some(latest.map_or(t, |l: u64| l.max(t))),
            }
        }
        latest.map_or(BlockingReset::NotBlocked, BlockingReset::At)
    }

    /// Merge an observation: windows are updated field by field (absent fields keep their
    /// previous value); other fields replace when present.
    pub fn merge(&mut self, obs: &Observation) {
        for w in &obs.windows {
            match self.windows.iter_mut().find(|x| x.name == w.name) {
                Some(x) => {
                    x.family = w.family.or(x.family);
                    if w.utilization.is_some() {
                        x.utilization = w.utilization;
                    }
                    if w.resets_at.is_some() {
                        x.resets_at = w.resets_at;
                    }
                    if w.status.is_some() {
                        x.status = w.status.clone();
                    }
                    x.observed_at = w.observed_at;
                }
                None => self.windows.push(w.clone()),
            }
        }
        if obs.overage.is_some() {
            self.overage = obs.overage.clone();
        }
        if obs.credits.is_some() {
            self.credits = obs.credits;
        }
        if obs.representative_claim.is_some() {
            self.representative_claim = obs.representative_claim.clone();
        }
        if obs.restriction.is_some() {
            self.restriction = obs.restriction.clone();
        } else if obs.clears_restriction {
            self.restriction = None;
        }
    }
}

/// What one response (or usage fetch) said about quota.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    pub windows: Vec<Window>,
    pub overage: Option<String>,
    pub credits: Option<bool>,
    pub representative_claim: Option<String>,
    pub restriction: Option<Restriction>,
    /// A full usage snapshot without a restriction lifts a stored one.
    pub clears_restriction: bool,
}

impl Observation {
    /// Take the account's credential out of every text the upstream put in it (window
    /// names from header names or usage keys, statuses, the claim), before it is stored.
    pub fn redact(&mut self, redactor: &crate::redact::Redactor<'_>) {
        let clean = |text: &mut String| {
            if let std::borrow::Cow::Owned(redacted) = redactor.redact(text) {
                *text = redacted;
            }
        };
        for w in &mut self.windows {
            clean(&mut w.name);
            w.status.as_mut().map(clean);
        }
        self.overage.as_mut().map(clean);
        self.representative_claim.as_mut().map(clean);
        if let Some(r) = &mut self.restriction {
            clean(&mut r.reason);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
            && self.overage.is_none()
            && self.credits.is_none()
            && self.representative_claim.is_none()
            && self.restriction.is_none()
    }

    /// A shared window is refused in this observation (a quota 429, lasting).
    pub fn rejects_shared(&self, now: u64) -> bool {
        self.restriction.is_some()
            || self
                .windows
                .iter()
                .any(|w| w.family.is_none() && w.rejected(now))
    }

    /// The given family's window is refused in this observation (a family detour).
    pub fn rejects_family(&self, family: Family, now: u64) -> bool {
        self.windows
            .iter()
            .any(|w| w.family == Some(family) && w.rejected(now))
    }
}

/// Parse Claude's `anthropic-ratelimit-unified-*` headers (read by the kit, as the core
/// reads them): the `5h` and `7d` windows, every scoped `7d_<bucket>` filed under the family
/// its bucket name names, `overage-status` and `representative-claim`.
pub fn parse_claude_headers(headers: &Headers, now: u64) -> Observation {
    let read = ratelimit::claude_headers(headers, now);
    let mut obs = Observation::default();
    for w in read.windows {
        if !(w.key == "5h" || w.key == "7d" || w.key.starts_with("7d_")) {
            continue;
        }
        obs.windows.push(Window {
            name: w.key.to_owned(),
            family: w.key.strip_prefix("7d_").map(Family::of),
            utilization: w.utilization,
            resets_at: w.resets_at,
            status: w.status.map(str::to_ascii_lowercase),
            observed_at: now,
        });
    }
    obs.overage = read.overage_status.map(str::to_ascii_lowercase);
    obs.representative_claim = read.representative_claim.map(str::to_owned);
    obs
}

/// The Codex workspace hard stops that become a usage restriction.
const CODEX_HARD_STOPS: [&str; 5] = [
    "workspace_owner_credits_depleted",
    "workspace_member_credits_depleted",
    "workspace_owner_usage_limit_reached",
    "workspace_member_usage_limit_reached",
    "spend_control_reached",
];

/// Parse Codex's `x-codex-{primary|secondary}-*` windows (`used-percent` ÷ 100,
/// `window-minutes`, `reset-at` or `reset-after-seconds`, `over-limit`), the
/// `x-codex-credits-*` headers (credits count as extra usage) and a hard stop named by
/// `x-codex-rate-limit-reached-type` (unknown limit types are ignored).
pub fn parse_codex_headers(headers: &Headers, now: u64) -> Observation {
    let mut obs = Observation::default();
    for w in ratelimit::codex_windows(headers, now) {
        // A window's length alone says nothing the pool routes by.
        if w.utilization.is_none() && w.resets_at.is_none() && w.over_limit.is_none() {
            continue;
        }
        let rejected = w.is_spent();
        obs.windows.push(Window {
            name: w.slot.to_owned(),
            family: None,
            utilization: w.utilization,
            resets_at: w.resets_at,
            status: Some(if rejected { "rejected" } else { "allowed" }.to_owned()),
            observed_at: now,
        });
    }
    let flag = |name: &str| {
        headers
            .get(name)
            .map(|v| v.trim().eq_ignore_ascii_case("true"))
    };
    let has = flag("x-codex-credits-has-credits");
    let unlimited = flag("x-codex-credits-unlimited");
    if has.is_some() || unlimited.is_some() {
        obs.credits = Some(has == Some(true) || unlimited == Some(true));
    }
    if let Some(kind) = headers.get("x-codex-rate-limit-reached-type") {
        let kind = kind.trim();
        if CODEX_HARD_STOPS.contains(&kind) {
            obs.restriction = Some(Restriction {
                reason: kind.to_owned(),
                resets_at: None,
            });
        }
    }
    obs
}

fn percent(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
        .filter(|u| u.is_finite())
        .map(|u| (u / 100.0).clamp(0.0, 1.0))
}

fn usage_window(name: &str, family: Option<Family>, v: &Value, now: u64) -> Option<Window> {
    let utilization = percent(v.get("utilization").or_else(|| v.get("used_percent")));
    let resets_at = match v.get("resets_at").or_else(|| v.get("reset_at")) {
        Some(Value::String(s)) => parse_reset(s).or_else(|| parse_rfc3339(s)),
        Some(Value::Number(n)) => n.as_f64().and_then(|f| parse_reset(&f.to_string())),
        _ => None,
    }
    .or_else(|| {
        v.get("reset_after_seconds")
            .and_then(Value::as_f64)
            .and_then(secs_to_ms)
            .map(|ms| after(now, ms))
    })
    .and_then(|at| within_horizon(at, now));
    utilization?;
    let status = if utilization.is_some_and(|u| u >= 1.0) {
        "rejected"
    } else {
        "allowed"
    };
    Some(Window {
        name: name.to_owned(),
        family,
        utilization,
        resets_at,
        status: Some(status.to_owned()),
        observed_at: now,
    })
}

/// Parse Claude's usage endpoint (`GET /api/oauth/usage`): `five_hour`, `seven_day`,
/// `seven_day_<family>`; values are percent.
pub fn parse_claude_usage(body: &Value, now: u64) -> Observation {
    let mut obs = Observation {
        clears_restriction: true,
        ..Observation::default()
    };
    for (key, name) in [("five_hour", "5h"), ("seven_day", "7d")] {
        if let Some(w) = body.get(key).and_then(|v| usage_window(name, None, v, now)) {
            obs.windows.push(w);
        }
    }
    if let Some(map) = body.as_object() {
        for (key, v) in map {
            if let Some(bucket) = key.strip_prefix("seven_day_")
                && let Some(w) =
                    usage_window(&format!("7d_{bucket}"), Some(Family::of(bucket)), v, now)
            {
                obs.windows.push(w);
            }
        }
    }
    obs
}

/// Parse Codex's usage endpoint (`GET …/wham/usage`): `rate_limit.primary_window` and
/// `secondary_window`, and `credits`.
pub fn parse_codex_usage(body: &Value, now: u64) -> Observation {
    let mut obs = Observation {
        clears_restriction: true,
        ..Observation::default()
    };
    for (key, name) in [
        ("primary_window", "primary"),
        ("secondary_window", "secondary"),
    ] {
        if let Some(w) = body
            .pointer(&format!("/rate_limit/{key}"))
            .and_then(|v| usage_window(name, None, v, now))
        {
            obs.windows.push(w);
        }
    }
    if let Some(c) = body.get("credits") {
        let has = c.get("has_credits").and_then(Value::as_bool);
        let unlimited = c.get("unlimited").and_then(Value::as_bool);
        if has.is_some() || unlimited.is_some() {
            obs.credits = Some(has == Some(true) || unlimited == Some(true));
        }
    }
    obs
}

/// A minimal RFC 3339 reader (`2026-11-04T10:00:00Z`, optional fraction and offset), for
/// usage endpoints that state resets as ISO times.
fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
        let mut ms = digits.chars().take(3).collect::<String>();
        while ms.len() < 3 {
            ms.push('0');
        }
        millis = ms.parse().ok()?;
        rest = &frac[digits.len()..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 60 + om)
        }
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_min * 60;
    u64::try_from(secs * 1000 + millis).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pooler_plugin_kit::ratelimit::CLAUDE_PREFIX;
    use pooler_plugin_kit::time::parse_http_date;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn numeric_resets_are_seconds_below_1e12_else_milliseconds() {
        let table = [
            ("1700000060", Some(1_700_000_060_000)),
            ("1700000060000", Some(1_700_000_060_000)),
            ("1700000060.5", Some(1_700_000_060_500)),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(784_111_777_000)),
            ("-5", None),
            ("soon", None),
        ];
        for (input, want) in table {
            assert_eq!(parse_reset(input), want, "{input}");
        }
    }

    #[test]
    fn retry_after_is_seconds_or_http_date_else_one_second() {
        let date = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(NOW + 30_000),
        );
        let table: [(Option<&str>, u64); 6] = [
            (Some("7"), 7_000),
            (Some("0.0015"), 2),
            (Some(date.as_str()), 30_000),
            (Some("garbage"), 1_000),
            (Some("-3"), 1_000),
            (None, 1_000),
        ];
        for (input, want) in table {
            assert_eq!(parse_retry_after(input, NOW), want, "{input:?}");
        }
    }

    /// A delay or a reset further ahead than the horizon (30 days) is unknown, whether it is
    /// a date in year 9999 or an absurd number of seconds: never a hold of years, never a
    /// time wrapped into the past (release) or a panic (debug). Up to the horizon it counts.
    #[test]
    fn delays_and_resets_past_the_horizon_are_unknown() {
        use pooler_plugin_kit::time::RESET_HORIZON_MS;
        let year_9999 = "Fri, 31 Dec 9999 23:59:59 GMT";
        assert_eq!(retry_after_ms(Some("2592000"), NOW), Some(RESET_HORIZON_MS));
        assert_eq!(retry_after_ms(Some("2592000.001"), NOW), None);
        assert_eq!(retry_after_ms(Some(year_9999), NOW), None);
        assert_eq!(
            parse_retry_after(Some(year_9999), NOW),
            DEFAULT_RETRY_AFTER_MS,
            "as if absent"
        );
        let last = ((NOW + RESET_HORIZON_MS) / 1000).to_string();
        let past = ((NOW + RESET_HORIZON_MS) / 1000 + 1).to_string();
        for (reset, want) in [
            (last.as_str(), Some(NOW + RESET_HORIZON_MS)),
            (past.as_str(), None),
            ("253402300799", None),
            ("1e300", None),
            ("18446744073709551615", None),
            ("9223372036854775807", None),
        ] {
            let claude = Headers::from([
                ("anthropic-ratelimit-unified-5h-status", "rejected"),
                ("anthropic-ratelimit-unified-5h-reset", reset),
            ]);
            let obs = parse_claude_headers(&claude, NOW);
            assert_eq!(obs.windows[0].resets_at, want, "claude {reset}");
            assert!(obs.rejects_shared(NOW), "still refused, reset unknown");
            let codex = Headers::from([
                ("x-codex-primary-used-percent", "100"),
                ("x-codex-primary-reset-at", reset),
            ]);
            let obs = parse_codex_headers(&codex, NOW);
            assert_eq!(obs.windows[0].resets_at, want, "codex {reset}");
        }
        for huge in ["2592001", "1e300", "18446744073709551615"] {
            assert_eq!(retry_after_ms(Some(huge), NOW), None, "{huge}");
            let codex = Headers::from([
                ("x-codex-primary-used-percent", "100"),
                ("x-codex-primary-reset-after-seconds", huge),
            ]);
            let obs = parse_codex_headers(&codex, NOW);
            assert_eq!(obs.windows[0].resets_at, None, "{huge}");
        }
        let usage = serde_json::json!({"rate_limit": {"primary_window": {
            "used_percent": 100.0, "reset_after_seconds": 1e300}}});
        let obs = parse_codex_usage(&usage, NOW);
        assert_eq!(obs.windows[0].resets_at, None);
        let usage = serde_json::json!({"five_hour": {"utilization": 100.0,
            "resets_at": "9999-12-31T23:59:59Z"}});
        let obs = parse_claude_usage(&usage, NOW);
        assert_eq!(obs.windows[0].resets_at, None);
        // Now itself at the far future: still no wrap.
        let obs = parse_codex_headers(
            &Headers::from([("x-codex-primary-reset-after-seconds", "60")]),
            u64::MAX,
        );
        assert_eq!(obs.windows[0].resets_at, Some(FAR_FUTURE_MS));
    }

    #[test]
    fn rfc3339_times_parse() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.250Z"),
            Some(1_700_000_000_250)
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T23:13:20+01:00"),
            Some(1_700_000_000_000)
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    fn claude_headers(pairs: &[(&str, &str)]) -> Headers {
        let mut h = Headers::new();
        for (n, v) in pairs {
            h.push(&format!("{CLAUDE_PREFIX}{n}"), *v);
        }
        h
    }

    #[test]
    fn claude_headers_file_scoped_buckets_by_bucket_name() {
        let h = claude_headers(&[
            ("5h-utilization", "0.42"),
            ("5h-reset", "1700003600"),
            ("5h-status", "allowed"),
            ("7d-utilization", "0.9"),
            ("7d_opus-status", "rejected"),
            ("7d_opus-reset", "1700100000"),
            ("7d_sonnet-utilization", "0.5"),
            ("overage-status", "allowed_warning"),
            ("representative-claim", "five_hour"),
        ]);
        let obs = parse_claude_headers(&h, NOW);
        let w = |name: &str| obs.windows.iter().find(|w| w.name == name).unwrap().clone();
        assert_eq!(w("5h").utilization, Some(0.42));
        assert_eq!(w("5h").resets_at, Some(1_700_003_600_000));
        assert_eq!(w("5h").family, None);
        assert_eq!(w("7d").status, None);
        assert_eq!(w("7d_opus").family, Some(Family::Opus));
        assert!(w("7d_opus").rejected(NOW));
        assert_eq!(w("7d_sonnet").family, Some(Family::Sonnet));
        assert_eq!(obs.overage.as_deref(), Some("allowed_warning"));
        assert_eq!(obs.representative_claim.as_deref(), Some("five_hour"));
        assert!(!obs.rejects_shared(NOW));
        assert!(obs.rejects_family(Family::Opus, NOW));
        assert!(
            !obs.rejects_family(Family::Sonnet, NOW),
            "filed by bucket, not by request"
        );
    }

    #[test]
    fn claude_shared_rejection_is_detected() {
        let h = claude_headers(&[("5h-status", "rejected"), ("5h-reset", "1700000060")]);
        let obs = parse_claude_headers(&h, NOW);
        assert!(obs.rejects_shared(NOW));
        assert!(
            !obs.rejects_shared(1_700_000_060_000),
            "a passed reset never blocks"
        );
    }

    #[test]
    fn codex_headers_windows_credits_and_hard_stops() {
        let h = Headers::from([
            ("x-codex-primary-used-percent", "100"),
            ("x-codex-primary-window-minutes", "300"),
            ("x-codex-primary-reset-after-seconds", "60"),
            ("x-codex-secondary-used-percent", "35.5"),
            ("x-codex-secondary-reset-at", "1700500000"),
            ("x-codex-credits-has-credits", "false"),
            ("x-codex-credits-unlimited", "true"),
            (
                "x-codex-rate-limit-reached-type",
                "workspace_member_usage_limit_reached",
            ),
        ]);
        let obs = parse_codex_headers(&h, NOW);
        let p = &obs.windows[0];
        assert_eq!(
            (p.name.as_str(), p.utilization, p.resets_at),
            ("primary", Some(1.0), Some(NOW + 60_000))
        );
        assert_eq!(p.status.as_deref(), Some("rejected"));
        let s = &obs.windows[1];
        assert_eq!(
            (s.utilization, s.resets_at),
            (Some(0.355), Some(1_700_500_000_000))
        );
        assert_eq!(obs.credits, Some(true));
        assert_eq!(
            obs.restriction.as_ref().unwrap().reason,
            "workspace_member_usage_limit_reached"
        );
        let over = parse_codex_headers(
            &Headers::from([("x-codex-primary-over-limit", "true")]),
            NOW,
        );
        assert!(
            over.rejects_shared(NOW),
            "over-limit without utilization still refuses"
        );
        let unknown = parse_codex_headers(
            &Headers::from([("x-codex-rate-limit-reached-type", "mystery")]),
            NOW,
        );
        assert!(
            unknown.restriction.is_none(),
            "unknown limit types are ignored"
        );
    }

    fn win(
        name: &str,
        family: Option<Family>,
        util: Option<f64>,
        reset: Option<u64>,
        status: Option<&str>,
    ) -> Window {
        Window {
            name: name.into(),
            family,
            utilization: util,
            resets_at: reset,
            status: status.map(str::to_owned),
            observed_at: NOW,
        }
    }

    #[test]
    fn blocking_reset_is_the_latest_active_window_and_passed_resets_never_block() {
        let q = QuotaState {
            windows: vec![
                win("5h", None, Some(1.0), Some(NOW + 60_000), None),
                win("7d", None, None, Some(NOW + 600_000), Some("rejected")),
                win(
                    "7d_opus",
                    Some(Family::Opus),
                    None,
                    Some(NOW + 900_000),
                    Some("rejected"),
                ),
                win("stale", None, Some(1.0), Some(NOW - 1), Some("rejected")),
            ],
            ..QuotaState::default()
        };
        let table = [
            (None, NOW, BlockingReset::At(NOW + 600_000)),
            (Some(Family::Sonnet), NOW, BlockingReset::At(NOW + 600_000)),
            (Some(Family::Opus), NOW, BlockingReset::At(NOW + 900_000)),
            (
                Some(Family::Opus),
                NOW + 700_000,
                BlockingReset::At(NOW + 900_000),
            ),
            (
                Some(Family::Sonnet),
                NOW + 700_000,
                BlockingReset::NotBlocked,
            ),
        ];
        for (family, now, want) in table {
            assert_eq!(q.blocking_reset(family, now), want, "{family:?} at {now}");
        }
        let unknown = QuotaState {
            windows: vec![win("primary", None, Some(1.0), None, None)],
            ..QuotaState::default()
        };
        assert_eq!(unknown.blocking_reset(None, NOW), BlockingReset::Unknown);
    }

    #[test]
    fn near_limit_is_reserve_not_rejected() {
        let q = QuotaState {
            windows: vec![win("5h", None, Some(0.99), Some(NOW + 1), Some("allowed"))],
            ..QuotaState::default()
        };
        assert!(q.near_limit(None, 0.98, NOW));
        assert!(!q.shared_exhausted(NOW));
        assert!(!q.near_limit(None, 0.995, NOW));
        assert!(
            !q.near_limit(None, 0.98, NOW + 1),
            "a passed reset lifts it"
        );
    }

    #[test]
    fn extra_usage_covers_family_windows_only_without_restriction() {
        let mut q = QuotaState {
            windows: vec![win("7d_opus", Some(Family::Opus), Some(1.0), None, None)],
            overage: Some("allowed".into()),
            extra_usage_allowed: true,
            ..QuotaState::default()
        };
        assert!(!q.family_exhausted(Family::Opus, NOW));
        q.overage = Some("rejected".into());
        assert!(q.family_exhausted(Family::Opus, NOW));
        q.credits = Some(true);
        assert!(!q.family_exhausted(Family::Opus, NOW));
        q.restriction = Some(Restriction {
            reason: "x".into(),
            resets_at: None,
        });
        assert!(q.family_exhausted(Family::Opus, NOW));
        assert_eq!(q.blocking_reset(None, NOW), BlockingReset::Unknown);
    }

    /// `extra-usage = deny` (the default): a family window the upstream would let paid
    /// overage or credits cover counts as spent all the same; `allow` lets it serve.
    #[test]
    fn denied_extra_usage_leaves_a_spent_family_window_spent() {
        let offered = |overage: Option<&str>, credits: Option<bool>, allowed: bool| QuotaState {
            windows: vec![win(
                "7d_opus",
                Some(Family::Opus),
                Some(1.0),
                Some(NOW + 60_000),
                Some("rejected"),
            )],
            overage: overage.map(str::to_owned),
            credits,
            extra_usage_allowed: allowed,
            ..QuotaState::default()
        };
        let table = [
            (Some("allowed"), None, false, true),
            (Some("allowed_warning"), None, false, true),
            (None, Some(true), false, true),
            (Some("allowed"), None, true, false),
            (Some("allowed_warning"), None, true, false),
            (None, Some(true), true, false),
            (Some("rejected"), Some(false), true, true),
            (None, None, true, true),
        ];
        for (overage, credits, allowed, spent) in table {
            let q = offered(overage, credits, allowed);
            assert_eq!(
                q.family_exhausted(Family::Opus, NOW),
                spent,
                "{overage:?} {credits:?} allow={allowed}"
            );
            let blocks = if spent {
                BlockingReset::At(NOW + 60_000)
            } else {
                BlockingReset::NotBlocked
            };
            assert_eq!(q.blocking_reset(Some(Family::Opus), NOW), blocks);
            assert!(
                !q.family_exhausted(Family::Sonnet, NOW),
                "other families serve"
            );
        }
    }

    /// What the routing strategies read: the share left of each window (all of it once
    /// its reset passed, none while refused), the tightest a request draws on, the weekly
    /// one with its reset, the short one, and the weekly utilization `preserve` compares.
    #[test]
    fn capacity_left_is_read_from_the_windows_as_observed() {
        let q = QuotaState {
            windows: vec![
                win(
                    "5h",
                    None,
                    Some(0.7),
                    Some(NOW + 3_600_000),
                    Some("allowed"),
                ),
                win(
                    "7d",
                    None,
                    Some(0.4),
                    Some(NOW + 86_400_000),
                    Some("allowed"),
                ),
                win(
                    "7d_opus",
                    Some(Family::Opus),
                    Some(0.9),
                    Some(NOW + 86_400_000),
                    Some("allowed"),
                ),
            ],
            ..QuotaState::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(q.remaining(None, NOW), 0.3));
        assert!(close(q.remaining(Some(Family::Sonnet), NOW), 0.3));
        assert!(close(q.remaining(Some(Family::Opus), NOW), 0.1));
        assert!(
            close(q.remaining(None, NOW + 3_600_000), 0.6),
            "the 5-hour window has reset"
        );
        let (left, reset) = q.weekly_left(Some(Family::Sonnet), NOW);
        assert!(close(left, 0.6) && reset == Some(NOW + 86_400_000));
        assert!(close(q.weekly_left(Some(Family::Opus), NOW).0, 0.1));
        assert!(close(q.short_left(NOW), 0.3));
        assert!(close(q.weekly_utilization(NOW), 0.4));
        assert_eq!(q.weekly_utilization(NOW + 86_400_000), 0.0);
        let refused = QuotaState {
            windows: vec![win("primary", None, Some(0.2), None, Some("rejected"))],
            ..QuotaState::default()
        };
        assert_eq!(refused.remaining(None, NOW), 0.0);
        assert_eq!(refused.short_left(NOW), 0.0);
        let fresh = QuotaState::default();
        assert_eq!(fresh.remaining(None, NOW), 1.0);
        assert_eq!(fresh.weekly_left(None, NOW), (1.0, None));
        let codex = QuotaState {
            windows: vec![
                win("primary", None, Some(0.5), Some(NOW + 1_000), None),
                win("secondary", None, Some(0.25), Some(NOW + 9_000), None),
            ],
            ..QuotaState::default()
        };
        assert_eq!(codex.weekly_left(None, NOW), (0.75, Some(NOW + 9_000)));
        assert_eq!(codex.short_left(NOW), 0.5);
    }

    #[test]
    fn merge_keeps_absent_fields() {
        let mut q = QuotaState::default();
        q.merge(&Observation {
            windows: vec![win("5h", None, Some(0.5), Some(NOW + 5), Some("allowed"))],
            ..Observation::default()
        });
        q.merge(&Observation {
            windows: vec![win("5h", None, None, None, Some("rejected"))],
            overage: Some("rejected".into()),
            ..Observation::default()
        });
        let w = &q.windows[0];
        assert_eq!(
            (w.utilization, w.resets_at, w.status.as_deref()),
            (Some(0.5), Some(NOW + 5), Some("rejected"))
        );
        assert_eq!(q.overage.as_deref(), Some("rejected"));
    }

    #[test]
    fn usage_endpoints_parse_percent_windows() {
        let claude = serde_json::json!({
            "five_hour": {"utilization": 30.0, "resets_at": "2023-11-14T23:13:20Z"},
            "seven_day": {"utilization": 100.0, "resets_at": null},
            "seven_day_opus": {"utilization": 12.0},
        });
        let obs = parse_claude_usage(&claude, NOW);
        assert_eq!(obs.windows.len(), 3);
        assert_eq!(obs.windows[0].utilization, Some(0.3));
        assert_eq!(obs.windows[0].resets_at, Some(1_700_003_600_000));
        assert!(obs.windows[1].rejected(NOW));
        assert_eq!(obs.windows[2].family, Some(Family::Opus));
        let codex = serde_json::json!({"rate_limit": {
            "primary_window": {"used_percent": 10, "reset_after_seconds": 100},
            "secondary_window": {"used_percent": 100, "reset_at": 1700000100}},
            "credits": {"has_credits": true}});
        let obs = parse_codex_usage(&codex, NOW);
        assert_eq!(obs.windows[0].resets_at, Some(NOW + 100_000));
        assert!(obs.rejects_shared(NOW));
        assert_eq!(obs.credits, Some(true));
    }

    use crate::props;
    use pooler_plugin_kit::time::{FAR_FUTURE_MS, RESET_HORIZON_MS, after};
    use proptest::prelude::*;

    fn any_claude_headers() -> impl Strategy<Value = Vec<(String, String)>> {
        let window =
            prop::sample::select(vec!["5h", "7d", "7d_opus", "7d_sonnet", "7d_", "overage"]);
        let field = prop::sample::select(vec!["utilization", "reset", "status"]);
        let named = (window, field).prop_map(|(w, f)| format!("{CLAUDE_PREFIX}{w}-{f}"));
        let other = prop::sample::select(vec![
            "anthropic-ratelimit-unified-overage-status",
            "anthropic-ratelimit-unified-representative-claim",
            "anthropic-ratelimit-unified-status",
            "retry-after",
        ])
        .prop_map(str::to_owned);
        prop::collection::vec(
            (prop_oneof![3 => named, 1 => other], props::header_value()),
            0..8,
        )
    }

    fn any_codex_headers() -> impl Strategy<Value = Vec<(String, String)>> {
        let slot = prop::sample::select(vec!["primary", "secondary"]);
        let field = prop::sample::select(vec![
            "used-percent",
            "window-minutes",
            "reset-at",
            "reset-after-seconds",
            "over-limit",
        ]);
        let named = (slot, field).prop_map(|(s, f)| format!("x-codex-{s}-{f}"));
        let other = prop::sample::select(vec![
            "x-codex-credits-has-credits",
            "x-codex-credits-unlimited",
            "x-codex-rate-limit-reached-type",
        ])
        .prop_map(str::to_owned);
        prop::collection::vec(
            (prop_oneof![3 => named, 1 => other], props::header_value()),
            0..8,
        )
    }

    fn headers_of(pairs: &[(String, String)]) -> Headers {
        let mut h = Headers::new();
        for (n, v) in pairs {
            h.push(n, v.as_str());
        }
        h
    }

    /// What every observation must satisfy, whatever the headers said.
    fn sane(obs: &Observation, now: u64) -> Result<(), TestCaseError> {
        for w in &obs.windows {
            if let Some(u) = w.utilization {
                prop_assert!((0.0..=1.0).contains(&u), "utilization {}", u);
            }
            if let Some(r) = w.resets_at {
                prop_assert!(r <= after(now, RESET_HORIZON_MS), "reset {} at {}", r, now);
            }
            prop_assert_eq!(w.observed_at, now);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(props::config())]

        /// Rate-limit headers of any values, at any time: parsing never panics (no
        /// overflow), is deterministic, keeps utilization in 0..=1 and every reset at or
        /// before the far future.
        #[test]
        fn rate_limit_headers_of_any_value_parse_sanely(
            claude in any_claude_headers(),
            codex in any_codex_headers(),
            now in prop_oneof![Just(NOW), Just(u64::MAX), Just(FAR_FUTURE_MS), any::<u64>()],
        ) {
            let h = headers_of(&claude);
            let obs = parse_claude_headers(&h, now);
            prop_assert_eq!(&obs, &parse_claude_headers(&h, now));
            sane(&obs, now)?;
            let h = headers_of(&codex);
            let obs = parse_codex_headers(&h, now);
            prop_assert_eq!(&obs, &parse_codex_headers(&h, now));
            sane(&obs, now)?;
        }

        /// Retry-After of any value at any time: a delay at most the horizon; 1 s when
        /// missing, unreadable or past the horizon; `now` plus it never wraps.
        #[test]
        fn retry_after_of_any_value_is_a_bounded_delay(
            v in props::header_value(),
            now in prop_oneof![Just(NOW), Just(u64::MAX), any::<u64>()],
        ) {
            let d = parse_retry_after(Some(&v), now);
            prop_assert!(d <= RESET_HORIZON_MS);
            prop_assert_eq!(retry_after_ms(Some(&v), now).unwrap_or(DEFAULT_RETRY_AFTER_MS), d);
            prop_assert!(pooler_plugin_kit::time::after(now, d) >= now.min(FAR_FUTURE_MS));
            prop_assert!(parse_reset(&v).is_none_or(|r| r <= FAR_FUTURE_MS));
        }

        /// Retry-After in seconds is those seconds in milliseconds, rounded up; unknown past
        /// the horizon.
        #[test]
        fn retry_after_seconds_are_milliseconds_rounded_up(ms in 0u64..10_000_000_000) {
            let secs = format!("{}.{:03}", ms / 1000, ms % 1000);
            let within = |d: u64| (d <= RESET_HORIZON_MS).then_some(d);
            prop_assert_eq!(retry_after_ms(Some(&secs), NOW), within(ms));
            prop_assert_eq!(retry_after_ms(Some(&(ms / 1000).to_string()), NOW), within(ms / 1000 * 1000));
        }

        /// Retry-After as an HTTP date is the time until it (0 once passed), to the second;
        /// unknown past the horizon.
        #[test]
        fn retry_after_dates_are_the_time_until_them(at_s in 0u64..4_000_000_000, now in 0u64..4_000_000_000_000) {
            let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(at_s));
            let d = (at_s * 1000).saturating_sub(now);
            prop_assert_eq!(retry_after_ms(Some(&date), now), (d <= RESET_HORIZON_MS).then_some(d));
        }

        /// RFC 3339 times of any digits, and any text: parsing never panics, and a time it
        /// reads is the one written (checked against an HTTP date of the same instant).
        #[test]
        fn rfc3339_of_any_text_never_panics(s in props::header_value(), ms in 0u64..253_402_300_799_000) {
            let _ = parse_rfc3339(&s);
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            let secs = ms / 1000;
            let days = secs / 86_400;
            // Civil date of `days` (Howard Hinnant's inverse), to write the time out.
            let z = days as i64 + 719_468;
            let era = z.div_euclid(146_097);
            let doe = z - era * 146_097;
            let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
            let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
            let mp = (5 * doy + 2) / 153;
            let d = doy - (153 * mp + 2) / 5 + 1;
            let m = if mp < 10 { mp + 3 } else { mp - 9 };
            let y = yoe + era * 400 + i64::from(m <= 2);
            let text = format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                secs % 86_400 / 3600,
                secs % 3600 / 60,
                secs % 60,
                ms % 1000
            );
            prop_assert_eq!(parse_rfc3339(&text), Some(ms), "{}", text);
            prop_assert_eq!(
                parse_http_date(&httpdate::fmt_http_date(t)),
                Some(secs * 1000)
            );
        }
    }
}
