//! The pool's settings: every duration and limit of spec §1, their defaults, their
//! validation (a refused value names the key and the accepted range; nothing changes) and
//! their canonical text. Values are stored as canonical text in the `settings` table.

use crate::model::Provider;
use crate::policy::Strategy;
use pooler_plugin_kit::format::{format_bool, format_duration_ms, parse_bool, parse_duration_ms};

/// One setting's description.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub key: &'static str,
    pub default: &'static str,
    pub description: &'static str,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Url,
    Fraction,
    Bool,
    /// A duration between the bounds, in milliseconds.
    Duration(u64, u64),
    /// An integer between the bounds.
    Count(u64, u64),
    /// A comma-separated list of durations (each ≤ the bound), at least one.
    Durations(u64),
    /// One of these words.
    Choice(&'static [&'static str]),
}

/// The routing strategy's words, in the order `--help` lists them.
const STRATEGIES: &[&str] = &["fill-first", "spread", "soonest-reset"];

/// What a strategy setting says, and the default's word.
const STRATEGY_HELP: &str = "fill-first: every new conversation goes to the provider's current account until it is refused (the cursor); spread: to the eligible account with the most capacity left across its 5-hour and weekly windows, shared with the conversations already on it; soonest-reset: to the account whose weekly quota left per hour until its reset is highest (quota about to expire is spent first), sparing any account whose 5-hour window is nearly spent. With spread and soonest-reset, conversations that start or move together are spread: no account takes more than its fair share of them within a minute. A pinned conversation stays on its account whatever the strategy.";

/// Every setting, sorted by key.
pub const SPECS: [Spec; 18] = [
    Spec {
        key: "claude-routing",
        default: "on",
        kind: Kind::Bool,
        description: "Whether Claude requests are routed through the pool (on/off).",
    },
    Spec {
        key: "claude-strategy",
        default: Strategy::DEFAULT.as_str(),
        kind: Kind::Choice(STRATEGIES),
        description: STRATEGY_HELP,
    },
    Spec {
        key: "claude-token-url",
        default: "https://console.anthropic.com/v1/oauth/token",
        kind: Kind::Url,
        description: "The Claude OAuth token endpoint used to refresh access tokens (absolute http(s) URL).",
    },
    Spec {
        key: "claude-upstream-url",
        default: "https://api.anthropic.com",
        kind: Kind::Url,
        description: "The Anthropic API base URL requests are forwarded to (absolute http(s) URL).",
    },
    Spec {
        key: "codex-routing",
        default: "on",
        kind: Kind::Bool,
        description: "Whether Codex requests are routed through the pool (on/off).",
    },
    Spec {
        key: "codex-strategy",
        default: Strategy::DEFAULT.as_str(),
        kind: Kind::Choice(STRATEGIES),
        description: STRATEGY_HELP,
    },
    Spec {
        key: "codex-token-url",
        default: "https://auth.openai.com/oauth/token",
        kind: Kind::Url,
        description: "The OpenAI OAuth token endpoint used to refresh access tokens (absolute http(s) URL).",
    },
    Spec {
        key: "codex-upstream-url",
        default: "https://chatgpt.com/backend-api/codex",
        kind: Kind::Url,
        description: "The ChatGPT Codex API base URL requests are forwarded to (absolute http(s) URL).",
    },
    Spec {
        key: "first-event-wait",
        default: "5s",
        kind: Kind::Duration(0, 30_000),
        description: "How long a served event stream's head is held for its first event, so that a stream opening with an overload or rate-limit error is retried or moved like the matching status instead of relayed (a duration from 0s to 30s; 0s relays the head at once). A stream whose first event is slower is relayed as it comes.",
    },
    Spec {
        key: "inline-wait",
        default: "20s",
        kind: Kind::Duration(0, 300_000),
        description: "The longest a request waits inline for an account (short 429s, transient retry backoff): a duration from 0s to 5m.",
    },
    Spec {
        key: "max-request-body",
        default: "33554432",
        kind: Kind::Count(1024, 1 << 30),
        description: "The largest request body accepted, in bytes (1024 to 1073741824, and no more than the pool's memory holds: a body is held whole, and the host caps the pool's memory, `memory-mib` in the reference host); larger requests get 413.",
    },
    Spec {
        key: "pin-cap",
        default: "4096",
        kind: Kind::Count(1, 1_000_000),
        description: "The most session pins kept; the least recently used is evicted (1 to 1000000). It also bounds the attempts kept to explain sessions: those of the pin-cap most recently active sessions (an eighth more, at least 16, between two trims), the latest 20 of each.",
    },
    Spec {
        key: "pin-lifetime",
        default: "30m",
        kind: Kind::Duration(1_000, 7 * 86_400_000),
        description: "How long an idle session pin lasts: a duration from 1s to 7d.",
    },
    Spec {
        key: "switch-threshold",
        default: "0.98",
        kind: Kind::Fraction,
        description: "Utilization at which new conversations prefer other accounts (a fraction > 0 and ≤ 1); accounts over it still serve as a reserve.",
    },
    Spec {
        key: "token-hold",
        default: "1m",
        kind: Kind::Duration(1_000, 3_600_000),
        description: "How long an account is held after the upstream refused a freshly refreshed OAuth token: a duration from 1s to 1h.",
    },
    Spec {
        key: "transient-backoff",
        default: "250ms,1s",
        kind: Kind::Durations(60_000),
        description: "The waits before each same-account retry after a transient failure, comma-separated (each from 0s to 1m); the last repeats.",
    },
    Spec {
        key: "transient-retries",
        default: "2",
        kind: Kind::Count(0, 10),
        description: "How many times a transient failure (408, 5xx, 529, dropped connection) is retried on the same account before a detour (0 to 10).",
    },
    Spec {
        key: "usage-refresh",
        default: "5m",
        kind: Kind::Duration(30_000, 86_400_000),
        description: "How often the maintenance tick refreshes usage from the usage endpoints: a duration from 30s to 1d.",
    },
];

/// A refused setting: the key, the value given and the accepted values in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    UnknownKey(String),
    Invalid {
        key: String,
        value: String,
        accepted: String,
    },
}

/// Find a setting's description.
pub fn spec(key: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.key == key)
}

fn accepted(kind: Kind) -> String {
    match kind {
        Kind::Url => "an absolute http(s) URL, `http(s)://host[:port][/path]`: a host of letters, digits, `-`, `.` and `_` (or `[IPv6]`), a port from 1 to 65535, no `user@`, no percent-encoding in the host, no backslash, space or control character".into(),
        Kind::Fraction => "a fraction > 0 and ≤ 1".into(),
        Kind::Bool => "on or off".into(),
        Kind::Duration(lo, hi) => format!(
            "a duration from {} to {} (e.g. 250ms, 20s, 5m)",
            format_duration_ms(lo),
            format_duration_ms(hi)
        ),
        Kind::Count(lo, hi) => format!("a whole number from {lo} to {hi}"),
        Kind::Durations(hi) => format!(
            "one or more comma-separated durations, each from 0s to {}",
            format_duration_ms(hi)
        ),
        Kind::Choice(words) => format!("one of {}", words.join(", ")),
    }
}

/// An absolute `http(s)://` URL whose origin reads the same to every parser: a host of
/// ASCII letters, digits, `-`, `.` and `_` (or a bracketed IPv6 address), a port from 1 to
/// 65535 when one is given, no userinfo (`user@`), and no percent-encoding in the host, no
/// backslash, whitespace or control character (NUL included) anywhere. Looser forms
/// (`http://evil.example\@127.0.0.1/`) are read as one host by one parser and another by
/// the next, and a port past 65535 or a NUL fails every request.
fn valid_url(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    if s.chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
    {
        return false;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, tail)) => match tail.strip_prefix(':') {
                Some(port) => (addr, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_ok = if authority.starts_with('[') {
        host.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=65_535).contains(&n))
    });
    host_ok && port_ok
}

/// Refuse a `max-request-body` (`canonical`, already in range) that the pool's memory could
/// never hold: `holds` says whether a body of so many bytes fits beside what a request
/// needs, `largest` finds the largest that does ([`crate::body`]). Other keys pass.
pub fn check_memory(
    key: &str,
    value: &str,
    canonical: &str,
    holds: impl Fn(u64) -> bool,
    largest: impl Fn(u64) -> u64,
) -> Result<(), SettingError> {
    if key != "max-request-body" {
        return Ok(());
    }
    let (Some(Kind::Count(lo, hi)), Ok(n)) = (spec(key).map(|s| s.kind), canonical.parse()) else {
        return Ok(());
    };
    if holds(n) {
        return Ok(());
    }
    Err(SettingError::Invalid {
        key: key.to_owned(),
        value: value.to_owned(),
        accepted: format!(
            "a whole number from {lo} to {hi}, and at most {} with the memory this pool is given (a request's body is held whole, to be sent again on a retry); for more, raise the pool's memory limit in its host (`memory-mib` in the reference host)",
            largest(n)
        ),
    })
}

/// Validate `value` for `key`; the canonical text on success.
pub fn canonical(key: &str, value: &str) -> Result<String, SettingError> {
    let spec = spec(key).ok_or_else(|| SettingError::UnknownKey(key.to_owned()))?;
    let invalid = || SettingError::Invalid {
        key: key.to_owned(),
        value: value.to_owned(),
        accepted: accepted(spec.kind),
    };
    let v = value.trim();
    match spec.kind {
        Kind::Url => valid_url(v)
            .then(|| v.trim_end_matches('/').to_owned())
            .ok_or_else(invalid),
        Kind::Fraction => match v.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(format!("{f}")),
            _ => Err(invalid()),
        },
        Kind::Bool => parse_bool(v)
            .map(|b| format_bool(b).to_owned())
            .ok_or_else(invalid),
        Kind::Duration(lo, hi) => match parse_duration_ms(v) {
            Some(ms) if (lo..=hi).contains(&ms) => Ok(format_duration_ms(ms)),
            _ => Err(invalid()),
        },
        Kind::Count(lo, hi) => match v.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n.to_string()),
            _ => Err(invalid()),
        },
        Kind::Durations(hi) => {
            let parts: Option<Vec<u64>> = v
                .split(',')
                .map(|p| parse_duration_ms(p).filter(|ms| *ms <= hi))
                .collect();
            match parts {
                Some(list) if !list.is_empty() => Ok(list
                    .into_iter()
                    .map(format_duration_ms)
                    .collect::<Vec<_>>()
                    .join(",")),
                _ => Err(invalid()),
            }
        }
        Kind::Choice(words) => words
            .iter()
            .find(|w| w.eq_ignore_ascii_case(v))
            .map(|w| (*w).to_owned())
            .ok_or_else(invalid),
    }
}

/// The settings as typed values, read once per call.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub claude_upstream_url: String,
    pub codex_upstream_url: String,
    pub claude_token_url: String,
    pub codex_token_url: String,
    pub claude_routing: bool,
    pub codex_routing: bool,
    pub claude_strategy: Strategy,
    pub codex_strategy: Strategy,
    pub switch_threshold: f64,
    pub inline_wait_ms: u64,
    pub pin_lifetime_ms: u64,
    pub pin_cap: u64,
    pub transient_retries: u32,
    pub transient_backoff_ms: Vec<u64>,
    pub usage_refresh_ms: u64,
    pub max_request_body: u64,
    pub token_hold_ms: u64,
    pub first_event_wait_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_pairs(&[])
    }
}

impl Settings {
    /// Build from stored (key, canonical value) pairs; a missing or unreadable value (which
    /// `set` never stores) falls back to the default.
    pub fn from_pairs(pairs: &[(String, String)]) -> Settings {
        let get = |key: &str| -> String {
            let default = spec(key).map_or("", |s| s.default);
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| canonical(key, v).ok())
                .unwrap_or_else(|| default.to_owned())
        };
        let dur = |key: &str| parse_duration_ms(&get(key)).unwrap_or(0);
        let num = |key: &str| get(key).parse::<u64>().unwrap_or(0);
        Settings {
            claude_upstream_url: get("claude-upstream-url"),
            codex_upstream_url: get("codex-upstream-url"),
            claude_token_url: get("claude-token-url"),
            codex_token_url: get("codex-token-url"),
            claude_routing: parse_bool(&get("claude-routing")).unwrap_or(true),
            codex_routing: parse_bool(&get("codex-routing")).unwrap_or(true),
            claude_strategy: Strategy::parse(&get("claude-strategy")).unwrap_or(Strategy::DEFAULT),
            codex_strategy: Strategy::parse(&get("codex-strategy")).unwrap_or(Strategy::DEFAULT),
            switch_threshold: get("switch-threshold").parse().unwrap_or(0.98),
            inline_wait_ms: dur("inline-wait"),
            pin_lifetime_ms: dur("pin-lifetime"),
            pin_cap: num("pin-cap"),
            transient_retries: u32::try_from(num("transient-retries")).unwrap_or(0),
            transient_backoff_ms: get("transient-backoff")
                .split(',')
                .filter_map(parse_duration_ms)
                .collect(),
            usage_refresh_ms: dur("usage-refresh"),
            max_request_body: num("max-request-body"),
            token_hold_ms: dur("token-hold"),
            first_event_wait_ms: dur("first-event-wait"),
        }
    }

    pub fn upstream_url(&self, p: Provider) -> &str {
        match p {
            Provider::Claude => &self.claude_upstream_url,
            Provider::Codex => &self.codex_upstream_url,
        }
    }

    pub fn token_url(&self, p: Provider) -> &str {
        match p {
            Provider::Claude => &self.claude_token_url,
            Provider::Codex => &self.codex_token_url,
        }
    }

    pub fn routing(&self, p: Provider) -> bool {
        match p {
            Provider::Claude => self.claude_routing,
            Provider::Codex => self.codex_routing,
        }
    }

    /// How new and moving conversations of `p` choose an account.
    pub fn strategy(&self, p: Provider) -> Strategy {
        match p {
            Provider::Claude => self.claude_strategy,
            Provider::Codex => self.codex_strategy,
        }
    }

    /// The wait before same-account retry number `n` (0-based); the last entry repeats.
    pub fn backoff(&self, n: u32) -> u64 {
        let list = &self.transient_backoff_ms;
        list.get(n as usize).or(list.last()).copied().unwrap_or(0)
    }
}

/// The providers whose availability a change of `key` may alter.
pub fn affected_providers(key: &str) -> Vec<Provider> {
    if key.starts_with("claude-") {
        vec![Provider::Claude]
    } else if key.starts_with("codex-") {
        vec![Provider::Codex]
    } else {
        Provider::ALL.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_sorted_by_key_and_defaults_are_valid() {
        let keys: Vec<&str> = SPECS.iter().map(|s| s.key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(keys, sorted, "sorted, no duplicates");
        for s in SPECS {
            assert_eq!(
                canonical(s.key, s.default).as_deref(),
                Ok(s.default),
                "{}",
                s.key
            );
        }
    }

    #[test]
    fn defaults_match_the_spec() {
        let s = Settings::default();
        assert_eq!(s.switch_threshold, 0.98);
        assert_eq!(s.inline_wait_ms, 20_000);
        assert_eq!(s.pin_lifetime_ms, 30 * 60_000);
        assert_eq!(s.pin_cap, 4096);
        assert_eq!(s.transient_retries, 2);
        assert_eq!(
            (s.backoff(0), s.backoff(1), s.backoff(5)),
            (250, 1_000, 1_000)
        );
        assert_eq!(s.usage_refresh_ms, 300_000);
        assert_eq!(s.first_event_wait_ms, 5_000);
        assert!(s.claude_routing && s.codex_routing);
        assert_eq!(
            s.upstream_url(Provider::Codex),
            "https://chatgpt.com/backend-api/codex"
        );
    }

    /// AP-23: invalid values are refused by name with the accepted range.
    #[test]
    fn invalid_values_are_refused_with_key_and_range() {
        let table = [
            ("switch-threshold", "0"),
            ("switch-threshold", "1.01"),
            ("switch-threshold", "NaN"),
            ("inline-wait", "10m"),
            ("inline-wait", "soon"),
            ("pin-cap", "0"),
            ("pin-cap", "-4"),
            ("transient-retries", "11"),
            ("transient-backoff", ""),
            ("transient-backoff", "250ms,2m"),
            ("claude-upstream-url", "ftp://x"),
            ("claude-upstream-url", "http://"),
            ("claude-upstream-url", "http://127.0.0.1:99999/"),
            ("claude-upstream-url", "http://127.0.0.1:0/"),
            ("claude-upstream-url", "http://127.0.0.1:/"),
            ("claude-upstream-url", "http://evil.example\\@127.0.0.1/"),
            ("claude-upstream-url", "http://user:pw@127.0.0.1/"),
            ("claude-upstream-url", "http://127.0.0.1%00.evil.example/"),
            ("claude-upstream-url", "http://127.0.0.1\0/"),
            ("claude-upstream-url", "http://127.0.0.1/v1\\x"),
            ("claude-upstream-url", "http://[::1/"),
            ("codex-token-url", "https://auth.example:65536/oauth/token"),
            ("codex-routing", "maybe"),
            ("usage-refresh", "1s"),
            ("first-event-wait", "31s"),
            ("claude-strategy", "round-robin"),
            ("codex-strategy", ""),
        ];
        for (key, value) in table {
            match canonical(key, value) {
                Err(SettingError::Invalid {
                    key: k,
                    value: v,
                    accepted,
                }) => {
                    assert_eq!((k.as_str(), v.as_str()), (key, value));
                    assert!(!accepted.is_empty());
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
        assert_eq!(
            canonical("nope", "1"),
            Err(SettingError::UnknownKey("nope".into()))
        );
    }

    /// A `max-request-body` the memory cannot hold is refused, naming the memory and the
    /// most it holds; one it holds, and every other key, pass.
    #[test]
    fn a_body_limit_the_memory_cannot_hold_is_refused() {
        let holds = |n: u64| n <= 40 << 20;
        let largest = |_| 40 << 20;
        let check = |key: &str, v: &str| check_memory(key, v, v, holds, largest);
        assert_eq!(check("max-request-body", "41943040"), Ok(()));
        let Err(SettingError::Invalid {
            key,
            value,
            accepted,
        }) = check("max-request-body", "67108864")
        else {
            panic!("accepted");
        };
        assert_eq!(
            (key.as_str(), value.as_str()),
            ("max-request-body", "67108864")
        );
        assert!(accepted.contains("1024 to 1073741824"), "{accepted}");
        assert!(
            accepted.contains("at most 41943040 with the memory"),
            "{accepted}"
        );
        assert!(accepted.contains("memory-mib"), "{accepted}");
        assert_eq!(check("pin-cap", "1000000"), Ok(()));
        assert_eq!(check("inline-wait", "5m"), Ok(()));
    }

    #[test]
    fn values_are_stored_canonically() {
        let table = [
            ("switch-threshold", "1", "1"),
            ("switch-threshold", " 0.5 ", "0.5"),
            ("inline-wait", "20000", "20s"),
            ("transient-backoff", "100ms, 2s,60000", "100ms,2s,1m"),
            ("claude-routing", "false", "off"),
            (
                "claude-upstream-url",
                "http://127.0.0.1:9/",
                "http://127.0.0.1:9",
            ),
            ("transient-retries", "0", "0"),
            ("first-event-wait", "0", "0s"),
            ("claude-strategy", " Spread ", "spread"),
            ("codex-strategy", "soonest-reset", "soonest-reset"),
            ("claude-strategy", "FILL-FIRST", "fill-first"),
            (
                "codex-upstream-url",
                "https://chatgpt.com:443/backend-api/codex",
                "https://chatgpt.com:443/backend-api/codex",
            ),
            (
                "claude-upstream-url",
                "http://[::1]:65535/",
                "http://[::1]:65535",
            ),
            (
                "claude-token-url",
                "https://console.anthropic.com/v1/oauth/token?x=%20y",
                "https://console.anthropic.com/v1/oauth/token?x=%20y",
            ),
        ];
        for (key, value, want) in table {
            assert_eq!(canonical(key, value).as_deref(), Ok(want), "{key}={value}");
        }
        let s = Settings::from_pairs(&[
            ("inline-wait".into(), "5s".into()),
            ("claude-routing".into(), "off".into()),
        ]);
        assert_eq!(s.inline_wait_ms, 5_000);
        assert!(!s.routing(Provider::Claude));
        let s = Settings::from_pairs(&[("codex-strategy".into(), "soonest-reset".into())]);
        assert_eq!(s.strategy(Provider::Codex), Strategy::SoonestReset);
        assert_eq!(s.strategy(Provider::Claude), Strategy::DEFAULT);
    }
}
