//! What one proxied request came to, for people: gathered while the request runs
//! ([`Report`]), then, when its answer's head is ready, written as ONE info log line and as
//! the pool's metrics ([`Report::emit`]).
//!
//! The line (message [`REQUEST_MESSAGE`]) has the fields `thread`, `provider`, `session` (a
//! short hash of the session key, never the key), `account` and `why` (the account that
//! answered, or the last one chosen, and why it was chosen: `pinned`, `inherited`, `cursor`,
//! `next`, `strategy`), `attempts` (every upstream call, `account:status:ms` comma-separated; status
//! `transport` when no head came), `outcome`, `status`, `upstream_ms` (time spent waiting for
//! upstream heads) and `added_ms` (the rest: the pool's own time, waits and backoffs).
//!
//! Metrics (names per the WIT `metrics` rules):
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `pooler_pool_requests_total` | provider, account, outcome | proxied requests |
//! | `pooler_pool_attempts_total` | provider, account, outcome | account attempts, by the attempt outcome |
//! | `pooler_pool_same_account_retries_total` | provider, account | upstream calls repeated on the same account |
//! | `pooler_pool_detours_total` | provider | requests served away from the session's pin, which stays |
//! | `pooler_pool_failovers_total` | provider | moves to another account after one could not serve |
//! | `pooler_pool_cancels_total` | provider | requests stopped because the client left |
//! | `pooler_pool_own_responses_total` | provider, status | answers the pool made itself (`x-pooler-origin: pool`), its 429s among them |
//! | `pooler_pool_added_latency_seconds` | provider | histogram of `added_ms` |
//! | `pooler_pool_upstream_latency_seconds` | provider | histogram of `upstream_ms` |
//! | `pooler_pool_tokens_total` | provider, account, kind | tokens served answers reported (`input`, `output`, `cache_read`, `cache_write`; written when the answer's relay ends, [`super::record_tokens`]) |
//!
//! `outcome` of a request: `served`, `detour`, `passed-through` (an upstream answer relayed as
//! is), `failed` (no account served: the pool's own answer), `cancelled`, `refused` (the pool
//! answered before choosing: bad token, path, method, size, routing off), `error` (storage).
//! `account` is `none` when no account was tried.

use sha2::{Digest, Sha256};

use super::Log;
use super::ports::Level;
use crate::model::Provider;
use crate::policy::Role;
use pooler_plugin_kit::Metrics;

/// The message of the one line per proxied request.
pub const REQUEST_MESSAGE: &str = "Account Pooler request";

/// The header that marks an answer the pool made itself.
const ORIGIN_HEADER: &str = crate::http::ORIGIN_HEADER;

/// One upstream call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub account: String,
    /// The answer's status; None when no head arrived (transport failure, cancelled).
    pub status: Option<u16>,
    pub ms: u64,
}

/// What a request came to so far.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub provider: Option<Provider>,
    pub thread: Option<String>,
    /// The session key's short hash.
    pub session: Option<String>,
    /// Each account chosen, in order, and why.
    pub chosen: Vec<(String, Role)>,
    /// Every upstream call, in order.
    pub sends: Vec<Call>,
    /// Each account attempt's outcome (`note_attempt`), in order.
    pub attempts: Vec<(String, &'static str)>,
    /// Upstream calls repeated on the same account within one attempt, per account.
    pub retries: Vec<(String, u64)>,
    /// The request's outcome, once known.
    pub outcome: Option<&'static str>,
    /// The account that answered (served, passed through).
    pub answered_by: Option<String>,
}

/// The first 8 hex digits of a SHA-256 of the session key: enough to tell sessions apart in
/// a log, nothing to recover the key from.
pub fn session_hash(key: &str) -> String {
    let digest = Sha256::digest(format!("pooler-session:{key}").as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

fn why(role: Role) -> &'static str {
    match role {
        Role::Pinned => "pinned",
        Role::Inherited => "inherited",
        Role::Cursor => "cursor",
        Role::Next => "next",
        Role::Strategy => "strategy",
    }
}

impl Report {
    /// Count `n` same-account repeats on `account`.
    pub fn retried(&mut self, account: &str, n: u64) {
        if n == 0 {
            return;
        }
        match self.retries.iter_mut().find(|(a, _)| a == account) {
            Some((_, total)) => *total += n,
            None => self.retries.push((account.to_owned(), n)),
        }
    }

    /// How many times the request moved on to another account after an attempt.
    pub fn failovers(&self) -> u64 {
        self.attempts
            .windows(2)
            .filter(|w| w[0].0 != w[1].0)
            .count() as u64
    }

    /// Milliseconds spent waiting for upstream heads.
    pub fn upstream_ms(&self) -> u64 {
        self.sends.iter().map(|s| s.ms).sum()
    }

    /// Write the request's line and metrics. `status` and `headers_origin` describe the
    /// answer's head; `total_ms` is the time from the request's start to that head.
    pub fn emit(
        &self,
        log: &impl Log,
        metrics: &impl Metrics,
        status: u16,
        own_answer: bool,
        total_ms: u64,
    ) {
        let provider = self.provider.map_or("unknown", Provider::as_str);
        let outcome = self.outcome.unwrap_or(if own_answer {
            "refused"
        } else {
            "passed-through"
        });
        let (account, role) = match (&self.answered_by, self.chosen.last()) {
            (Some(a), _) => (
                a.as_str(),
                self.chosen
                    .iter()
                    .rev()
                    .find(|(c, _)| c == a)
                    .map_or("-", |(_, r)| why(*r)),
            ),
            (None, Some((a, r))) => (a.as_str(), why(*r)),
            (None, None) => ("none", "-"),
        };
        let upstream_ms = self.upstream_ms();
        let added_ms = total_ms.saturating_sub(upstream_ms);
        let attempts = self
            .sends
            .iter()
            .map(|s| {
                let status = s.status.map_or("transport".to_owned(), |c| c.to_string());
                format!("{}:{status}:{}", s.account, s.ms)
            })
            .collect::<Vec<_>>()
            .join(",");
        log.log(
            Level::Info,
            REQUEST_MESSAGE,
            &[
                ("thread", self.thread.clone().unwrap_or_else(|| "-".into())),
                ("provider", provider.to_owned()),
                (
                    "session",
                    self.session.clone().unwrap_or_else(|| "-".into()),
                ),
                ("account", account.to_owned()),
                ("why", role.to_owned()),
                ("attempts", attempts),
                ("outcome", outcome.to_owned()),
                ("status", status.to_string()),
                ("upstream_ms", upstream_ms.to_string()),
                ("added_ms", added_ms.to_string()),
            ],
        );

        let p = ("provider", provider);
        metrics.counter_add(
            "pooler_pool_requests_total",
            &[p, ("account", account), ("outcome", outcome)],
            1,
        );
        for (a, o) in &self.attempts {
            metrics.counter_add(
                "pooler_pool_attempts_total",
                &[p, ("account", a), ("outcome", o)],
                1,
            );
        }
        for (a, n) in &self.retries {
            metrics.counter_add(
                "pooler_pool_same_account_retries_total",
                &[p, ("account", a)],
                *n,
            );
        }
        if outcome == "detour" {
            metrics.counter_add("pooler_pool_detours_total", &[p], 1);
        }
        let failovers = self.failovers();
        if failovers > 0 {
            metrics.counter_add("pooler_pool_failovers_total", &[p], failovers);
        }
        if outcome == "cancelled" {
            metrics.counter_add("pooler_pool_cancels_total", &[p], 1);
        }
        if own_answer {
            let status = status.to_string();
            metrics.counter_add(
                "pooler_pool_own_responses_total",
                &[p, ("status", &status)],
                1,
            );
        }
        metrics.observe(
            "pooler_pool_added_latency_seconds",
            &[p],
            added_ms as f64 / 1000.0,
        );
        metrics.observe(
            "pooler_pool_upstream_latency_seconds",
            &[p],
            upstream_ms as f64 / 1000.0,
        );
    }
}

/// Whether `headers` mark the pool's own answer.
pub fn is_own(headers: &crate::http::Headers) -> bool {
    headers.get(ORIGIN_HEADER) == Some("pool")
}
