//! Rate-limit snapshots read from provider response headers: Anthropic's unified
//! subscription headers (`anthropic-ratelimit-unified-*`) and Codex's window headers
//! (`x-codex-primary-*`, `x-codex-secondary-*`). The core keeps the latest snapshot per
//! provider and puts it in every `turn-failed` event; it may be stale or describe another
//! account, which is why plugins prefer the pool's availability when a thread is routed.
//! A reset further ahead than [`RESET_HORIZON_MS`] is unknown.

use hyper::HeaderMap;

use crate::model::{LimitKind, LimitStatus, LimitWindow, Provider, RateLimitSnapshot, Timestamp};

/// How far ahead a reset or a `Retry-After` is believed: the plugins' horizon, one
/// definition. A time beyond it (a date in year 9999) is unknown.
pub use pooler_plugin_kit::time::RESET_HORIZON_MS;

use pooler_plugin_kit::ratelimit::{self, HeaderSource};

/// The snapshot the headers describe, or `None` when they carry no rate-limit state.
pub fn snapshot_from_headers(
    provider: Provider,
    headers: &HeaderMap,
    now: Timestamp,
) -> Option<RateLimitSnapshot> {
    let headers = Hyper(headers);
    match provider {
        Provider::Claude => claude_snapshot(&headers, now),
        Provider::Codex => codex_snapshot(&headers, now),
    }
}

/// A hyper header map as the kit's reading of rate-limit headers takes it.
struct Hyper<'a>(&'a HeaderMap);

impl HeaderSource for Hyper<'_> {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(|k| k.as_str())
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|v| v.to_str().ok())
    }
}

fn claude_status(text: &str) -> LimitStatus {
    match text {
        "allowed" => LimitStatus::Allowed,
        "allowed_warning" => LimitStatus::Warning,
        "rejected" => LimitStatus::Blocked,
        _ => LimitStatus::Unknown,
    }
}

fn worst(statuses: impl Iterator<Item = LimitStatus>) -> LimitStatus {
    let rank = |s: LimitStatus| match s {
        LimitStatus::Blocked => 3,
        LimitStatus::Warning => 2,
        LimitStatus::Allowed => 1,
        LimitStatus::Unknown => 0,
    };
    statuses
        .max_by_key(|s| rank(*s))
        .unwrap_or(LimitStatus::Unknown)
}

fn claude_snapshot(headers: &Hyper<'_>, now: Timestamp) -> Option<RateLimitSnapshot> {
    let read = ratelimit::claude_headers(headers, now);
    let overall = read.status.map(claude_status);
    if read.windows.is_empty() && overall.is_none() {
        return None;
    }
    let mut windows: Vec<LimitWindow> = read
        .windows
        .iter()
        .map(|w| LimitWindow {
            key: Some(w.key.to_string()),
            label: None,
            status: w.status.map_or(LimitStatus::Unknown, claude_status),
            resets_at: w.resets_at,
            utilization: w.utilization,
        })
        .collect();
    let mut status = overall.unwrap_or_else(|| worst(windows.iter().map(|w| w.status)));
    let mut kind = LimitKind::SubscriptionWindow;
    // Extra usage (overage) keeps serving past a rejected window: not a hard block then.
    if status == LimitStatus::Blocked {
        match read.overage_status {
            Some("allowed") => {
                status = LimitStatus::Allowed;
                kind = LimitKind::Credits;
            }
            Some("allowed_warning") => {
                status = LimitStatus::Warning;
                kind = LimitKind::Credits;
            }
            _ => {}
        }
    }
    let reached_reason = (status == LimitStatus::Blocked)
        .then_some(read.representative_claim)
        .flatten()
        .map(str::to_string);
    // Short windows first, as people read them; the rest by key.
    windows.sort_by(|a, b| {
        let rank = |w: &LimitWindow| match w.key.as_deref() {
            Some("5h") => 0,
            Some("7d") => 1,
            _ => 2,
        };
        (rank(a), &a.key).cmp(&(rank(b), &b.key))
    });
    Some(RateLimitSnapshot {
        provider: Provider::Claude,
        status,
        kind,
        windows,
        reached_reason,
        observed_at: now,
    })
}

fn window_label(minutes: u64) -> String {
    if minutes.is_multiple_of(24 * 60) {
        format!("{}d", minutes / (24 * 60))
    } else if minutes.is_multiple_of(60) {
        format!("{}h", minutes / 60)
    } else {
        format!("{minutes}m")
    }
}

fn codex_snapshot(headers: &Hyper<'_>, now: Timestamp) -> Option<RateLimitSnapshot> {
    let windows: Vec<LimitWindow> = ratelimit::codex_windows(headers, now)
        .into_iter()
        .map(|w| {
            let status = if w.is_spent() {
                LimitStatus::Blocked
            } else if w.utilization.is_some() {
                LimitStatus::Allowed
            } else {
                LimitStatus::Unknown
            };
            LimitWindow {
                key: Some(w.slot.to_string()),
                label: w.minutes.map(window_label),
                status,
                resets_at: w.resets_at,
                utilization: w.utilization,
            }
        })
        .collect();
    if windows.is_empty() {
        return None;
    }
    let status = worst(windows.iter().map(|w| w.status));
    Some(RateLimitSnapshot {
        provider: Provider::Codex,
        status,
        kind: LimitKind::SubscriptionWindow,
        reached_reason: (status == LimitStatus::Blocked).then(|| "usage limit reached".to_string()),
        windows,
        observed_at: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};
    use pooler_plugin_kit::ratelimit::CLAUDE_PREFIX;
    use pooler_plugin_kit::time::FAR_FUTURE_MS;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn claude_unified_headers_give_one_window_per_key() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-reset", "1790003600"),
            ("anthropic-ratelimit-unified-5h-utilization", "1.02"),
            ("anthropic-ratelimit-unified-7d-status", "allowed"),
            ("anthropic-ratelimit-unified-7d-utilization", "0.4"),
            (
                "anthropic-ratelimit-unified-representative-claim",
                "five_hour",
            ),
        ]);
        let now = 1_790_000_000_000;
        let s = snapshot_from_headers(Provider::Claude, &h, now).unwrap();
        assert_eq!(s.status, LimitStatus::Blocked);
        assert_eq!(s.kind, LimitKind::SubscriptionWindow);
        assert_eq!(s.reached_reason.as_deref(), Some("five_hour"));
        assert_eq!(s.observed_at, now);
        assert_eq!(s.windows.len(), 2);
        assert_eq!(s.windows[0].key.as_deref(), Some("5h"));
        assert_eq!(s.windows[0].resets_at, Some(1_790_003_600_000));
        assert_eq!(s.windows[0].utilization, Some(1.0));
        assert_eq!(s.windows[1].status, LimitStatus::Allowed);
    }

    #[test]
    fn claude_rejection_with_overage_allowed_is_not_a_block() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-overage-status", "allowed"),
        ]);
        let s = snapshot_from_headers(Provider::Claude, &h, 0).unwrap();
        assert_eq!(
            (s.status, s.kind),
            (LimitStatus::Allowed, LimitKind::Credits)
        );
    }

    #[test]
    fn responses_without_rate_limit_headers_give_no_snapshot() {
        let h = headers(&[("content-type", "text/event-stream")]);
        assert_eq!(snapshot_from_headers(Provider::Claude, &h, 0), None);
        assert_eq!(snapshot_from_headers(Provider::Codex, &h, 0), None);
    }

    #[test]
    fn codex_window_headers_give_primary_and_secondary_windows() {
        let h = headers(&[
            ("x-codex-primary-used-percent", "100"),
            ("x-codex-primary-window-minutes", "300"),
            ("x-codex-primary-reset-after-seconds", "60"),
            ("x-codex-secondary-used-percent", "35.5"),
            ("x-codex-secondary-window-minutes", "10080"),
            ("x-codex-secondary-reset-at", "1790600000"),
        ]);
        let now = 1_790_000_000_000;
        let s = snapshot_from_headers(Provider::Codex, &h, now).unwrap();
        assert_eq!(s.status, LimitStatus::Blocked);
        assert_eq!(s.windows[0].label.as_deref(), Some("5h"));
        assert_eq!(s.windows[0].resets_at, Some(now + 60_000));
        assert_eq!(s.windows[1].label.as_deref(), Some("7d"));
        assert_eq!(s.windows[1].status, LimitStatus::Allowed);
        assert_eq!(s.windows[1].utilization, Some(0.355));
        assert_eq!(s.windows[1].resets_at, Some(1_790_600_000_000));
    }

    /// Absurd resets (a date in year 9999, `1e300` seconds) are past the horizon (30 days):
    /// unknown, never a reset thousands of years out, an overflow panic or a time wrapped
    /// into the past. NaN is no utilization.
    #[test]
    fn resets_past_the_horizon_are_unknown_and_nan_is_no_utilization() {
        let now = 1_700_000_000_000;
        let last = (now + RESET_HORIZON_MS) / 1000;
        let (last, past) = (last.to_string(), (last + 1).to_string());
        let h = headers(&[
            ("x-codex-primary-used-percent", "100"),
            ("x-codex-primary-reset-after-seconds", "1e300"),
            ("x-codex-secondary-window-minutes", "10080"),
            ("x-codex-secondary-reset-at", "1e300"),
            ("x-codex-secondary-used-percent", "NaN"),
        ]);
        let s = snapshot_from_headers(Provider::Codex, &h, now).unwrap();
        assert_eq!(s.windows[0].resets_at, None);
        assert_eq!(s.windows[1].resets_at, None);
        assert_eq!(s.windows[1].utilization, None);
        let h = headers(&[("x-codex-primary-reset-after-seconds", "2592000")]);
        let s = snapshot_from_headers(Provider::Codex, &h, now).unwrap();
        assert_eq!(s.windows[0].resets_at, Some(now + RESET_HORIZON_MS));
        for (reset, want) in [
            ("253402300799", None),
            (past.as_str(), None),
            (last.as_str(), Some(now + RESET_HORIZON_MS)),
        ] {
            let h = headers(&[
                ("anthropic-ratelimit-unified-5h-status", "rejected"),
                ("anthropic-ratelimit-unified-5h-reset", reset),
            ]);
            let s = snapshot_from_headers(Provider::Claude, &h, now).unwrap();
            assert_eq!(s.windows[0].resets_at, want, "{reset}");
        }
        let h = headers(&[("anthropic-ratelimit-unified-5h-utilization", "NaN")]);
        let s = snapshot_from_headers(Provider::Claude, &h, 0).unwrap();
        assert_eq!(s.windows[0].utilization, None);
    }

    use proptest::prelude::*;

    /// A header value as an upstream may send one (numbers of every size and sign, NaN,
    /// infinities, words), restricted to what a header may hold.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            (-400i32..400).prop_map(|e| format!("1e{e}")),
            prop::sample::select(vec![
                "NaN",
                "nan",
                "inf",
                "-inf",
                "infinity",
                "-0",
                "",
                "true",
                "rejected",
                "allowed",
                "allowed_warning",
                "1e309",
                "18446744073709551616",
            ])
            .prop_map(str::to_owned),
            "[ -~]{0,24}",
        ]
    }

    fn names() -> impl Strategy<Value = String> {
        prop_oneof![
            (
                prop::sample::select(vec!["5h", "7d", "7d_opus", "overage", "a-b", ""]),
                prop::sample::select(vec!["status", "reset", "utilization"]),
            )
                .prop_map(|(w, f)| format!("{CLAUDE_PREFIX}{w}-{f}")),
            (
                prop::sample::select(vec!["primary", "secondary"]),
                prop::sample::select(vec![
                    "used-percent",
                    "window-minutes",
                    "reset-at",
                    "reset-after-seconds",
                    "over-limit",
                ]),
            )
                .prop_map(|(s, f)| format!("x-codex-{s}-{f}")),
            prop::sample::select(vec![
                "anthropic-ratelimit-unified-status",
                "anthropic-ratelimit-unified-overage-status",
                "anthropic-ratelimit-unified-representative-claim",
            ])
            .prop_map(str::to_owned),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Rate-limit headers of any value at any time: a snapshot
        /// never panics (no overflow), is deterministic, its utilizations are numbers
        /// in 0..=1 (never NaN), and no reset lies past the horizon.
        #[test]
        fn snapshots_of_any_header_values_are_sane(
            pairs in prop::collection::vec((names(), value()), 0..8),
            now in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
        ) {
            let mut h = HeaderMap::new();
            for (n, v) in &pairs {
                h.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            for provider in [Provider::Claude, Provider::Codex] {
                let s = snapshot_from_headers(provider, &h, now);
                prop_assert_eq!(&s, &snapshot_from_headers(provider, &h, now));
                for w in s.iter().flat_map(|s| &s.windows) {
                    if let Some(u) = w.utilization {
                        prop_assert!((0.0..=1.0).contains(&u), "utilization {}", u);
                    }
                    if let Some(r) = w.resets_at {
                        prop_assert!(
                            r <= now.saturating_add(RESET_HORIZON_MS).min(FAR_FUTURE_MS),
                            "reset {} at {}", r, now
                        );
                    }
                }
            }
        }
    }
}
