//! The pool at a glance: one snapshot, `GET /_pooler/overview` (built by the admin API's
//! `overview` area), that both `pooler status` and the status page (`/_pooler/page`) read,
//! so the two cannot disagree.
//!
//! What it holds, and where each part comes from:
//!
//! - `now`: the host clock when the snapshot was taken. Relative times ("in 2 h 10 m") are
//!   computed against it, because retry send times and resets are on the host's clock.
//! - `providers`: per provider, whether it can serve now or when next ([`Serving`]), a
//!   summary of its accounts by [`summarize`] (the same reading of `account-info` a person
//!   makes: an enabled account that is `ready` or `near-limit` serves now; otherwise the
//!   earliest `blocking-reset` of the held or exhausted ones).
//! - `accounts`: the pool's `accounts.list-accounts`, unchanged (no secret in it).
//! - `threads`: the core's threads that are not archived, each with the pool's own answer to
//!   `availability.query` for it (what Provider Retry sees), its open retry candidate from
//!   Provider Retry's `retry-admin.status` (state, reason) and the core's live retry row
//!   (send time, attempt).
//! - `pinned_sessions`: per account id, how many conversations are pinned to it now (the
//!   pool's `routing.list-sessions`; pins whose first request is still in flight are not
//!   counted). An account with none is absent.
//! - `tokens`: per account id, the token usage its served answers reported today (since the
//!   local midnight of the reader's UTC offset, `?utc_offset_s=` on the request; UTC
//!   without it; the instant is `tokens_today_since`) and in the last five hours (the pool's
//!   `tokens.totals`). An account with none is absent.
//! - `problems`: the parts that could not be read (a plugin not loaded, no core, a plugin that
//!   failed), each with its message; the rest of the snapshot is still filled in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::operate::wire::{
    AccountStatus, AccountTokensView, AccountView, AvailabilityView, CandidateView, ProviderName,
};

/// The snapshot; see the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overview {
    /// The host clock at the snapshot (epoch ms).
    pub now: u64,
    /// Per provider: whether it can serve now, or when next, and its accounts summed up.
    pub providers: Vec<ProviderOverview>,
    /// The pool's accounts, as `accounts.list-accounts` gave them (no secret in them).
    pub accounts: Vec<AccountView>,
    /// The core's threads that are not archived, each with its retry.
    pub threads: Vec<ThreadOverview>,
    /// Account id → sessions pinned to it (absent: none).
    #[serde(default)]
    pub pinned_sessions: BTreeMap<String, usize>,
    /// Account id → its token usage today and in the last five hours (absent: none).
    #[serde(default)]
    pub tokens: BTreeMap<String, AccountTokensView>,
    /// When "today" began for `tokens` (epoch ms).
    #[serde(default)]
    pub tokens_today_since: u64,
    /// The parts that could not be read; the rest of the snapshot is filled in regardless.
    pub problems: Vec<Problem>,
}

/// The start of the day `now` falls in, at `utc_offset_s` east of UTC (epoch ms).
pub fn day_start(now: u64, utc_offset_s: i32) -> u64 {
    let off = i64::from(utc_offset_s) * 1000;
    let local = i64::try_from(now).unwrap_or(i64::MAX).saturating_add(off);
    let start = local - local.rem_euclid(86_400_000) - off;
    u64::try_from(start).unwrap_or(0)
}

/// One provider's accounts, summed up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderOverview {
    /// The provider summed up (`claude` or `codex`).
    pub provider: ProviderName,
    /// Accounts of the provider.
    pub accounts: usize,
    /// Of those, enabled.
    pub enabled: usize,
    /// Of those, serving now (`ready` or `near-limit`).
    pub serving_accounts: usize,
    /// Whether it can serve now, or when next.
    pub serving: Serving,
    /// How it places new conversations (the pool's `<provider>-strategy` setting), when
    /// the pool said.
    #[serde(default)]
    pub strategy: Option<String>,
}

/// Whether a provider can serve now, or when next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Serving {
    /// At least one enabled account serves now.
    Ready,
    /// Nothing serves before `retry_at`: the earliest reset or end of hold among the enabled
    /// accounts; `cause` is `held` when that account is held, else `quota-exhausted`.
    Blocked {
        /// The earliest reset or end of hold among the enabled accounts. Epoch milliseconds.
        retry_at: u64,
        /// `held` or `quota-exhausted`.
        cause: String,
    },
    /// Nothing serves and no time is known: `reason` is `no-enabled-account`,
    /// `authentication` (every enabled account is in error) or `reset-unknown`.
    Unavailable {
        /// `no-enabled-account`, `authentication` or `reset-unknown`.
        reason: String,
    },
}

/// A thread that is not archived, with its retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadOverview {
    /// The thread's id.
    pub id: String,
    /// The provider the thread runs on.
    pub provider: ProviderName,
    /// The model the thread asked for, when it named one.
    pub model: Option<String>,
    /// `http`, `claude-code` or `codex`.
    pub agent: String,
    /// `idle`, `active` or `error`.
    pub status: String,
    /// Whether the thread opted out of automatic retries.
    pub retry_opt_out: bool,
    /// A person's message waits to start.
    pub input_queued: bool,
    /// When the core created the thread. Epoch milliseconds.
    pub created_at: u64,
    /// The pool's availability answer for this thread (None when it was not asked).
    pub availability: Option<AvailabilityView>,
    /// Provider Retry's open candidate for the thread (a scheduled row or a watch).
    pub retry: Option<CandidateView>,
    /// The core's live retry row: when it is sent, as which attempt.
    pub row: Option<RowOverview>,
}

/// A live row of the core's retry queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowOverview {
    /// The row's id in the core's retry queue.
    pub id: u64,
    /// When the row is sent. Epoch milliseconds.
    pub send_at: u64,
    /// The attempt the row's dispatch will carry (rescheduling never changes it).
    pub attempt: u32,
    /// Why the row was scheduled, as Provider Retry stated it.
    pub reason: String,
    /// Due, but waiting for a free slot under the concurrency limit.
    pub waiting_for_slot: bool,
}

/// A part of the snapshot that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// `accounts`, `threads`, `retries` or `availability`.
    pub part: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// Sum up one provider's accounts (see [`Serving`] for the rules).
pub fn summarize(provider: ProviderName, accounts: &[AccountView]) -> ProviderOverview {
    let mine: Vec<&AccountView> = accounts.iter().filter(|a| a.provider == provider).collect();
    let enabled: Vec<&AccountView> = mine.iter().copied().filter(|a| a.enabled).collect();
    let serving_accounts = enabled
        .iter()
        .filter(|a| matches!(a.status.as_str(), "ready" | "near-limit"))
        .count();
    let unavailable = |reason: &str| Serving::Unavailable {
        reason: reason.to_owned(),
    };
    let serving = if enabled.is_empty() {
        unavailable("no-enabled-account")
    } else if serving_accounts > 0 {
        Serving::Ready
    } else {
        let blocked: Vec<&AccountView> = enabled
            .iter()
            .copied()
            .filter(|a| a.status != AccountStatus::Error)
            .collect();
        if blocked.is_empty() {
            unavailable("authentication")
        } else if blocked.iter().any(|a| a.blocking_reset.is_none()) {
            unavailable("reset-unknown")
        } else {
            let first = blocked
                .iter()
                .min_by_key(|a| a.blocking_reset)
                .expect("not empty");
            Serving::Blocked {
                retry_at: first.blocking_reset.unwrap_or_default(),
                cause: if first.status == AccountStatus::Held {
                    "held"
                } else {
                    "quota-exhausted"
                }
                .to_owned(),
            }
        }
    };
    ProviderOverview {
        provider,
        accounts: mine.len(),
        enabled: enabled.len(),
        serving_accounts,
        serving,
        strategy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operate::wire::{AccountOptions, CredentialKind};

    pub(crate) fn account(
        id: &str,
        status: &str,
        enabled: bool,
        reset: Option<u64>,
    ) -> AccountView {
        AccountView {
            id: id.into(),
            provider: ProviderName::Claude,
            kind: CredentialKind::ApiKey,
            label: format!("key {id}"),
            priority: 0,
            enabled,
            status: AccountStatus::parse(status).expect("a status word"),
            secret_hint: "…abcd".into(),
            created_at: 0,
            last_used_at: None,
            error: None,
            held_until: None,
            needs_sign_in: false,
            token_expires_at: None,
            windows: Vec::new(),
            blocking_reset: reset,
            options: AccountOptions::default(),
        }
    }

    fn serving(accounts: &[AccountView]) -> Serving {
        summarize(ProviderName::Claude, accounts).serving
    }

    #[test]
    fn a_provider_serves_when_one_enabled_account_does() {
        let accounts = [
            account("a", "held", true, Some(9)),
            account("b", "near-limit", true, None),
        ];
        assert_eq!(serving(&accounts), Serving::Ready);
        let s = summarize(ProviderName::Claude, &accounts);
        assert_eq!((s.accounts, s.enabled, s.serving_accounts), (2, 2, 1));
        // Codex has none of them.
        let codex = summarize(ProviderName::Codex, &accounts);
        assert_eq!(codex.accounts, 0);
        assert_eq!(
            codex.serving,
            Serving::Unavailable {
                reason: "no-enabled-account".into()
            }
        );
    }

    #[test]
    fn a_blocked_provider_serves_at_the_earliest_reset_and_says_why() {
        let accounts = [
            account("a", "exhausted", true, Some(9_000)),
            account("b", "held", true, Some(5_000)),
            account("c", "disabled", false, None),
        ];
        assert_eq!(
            serving(&accounts),
            Serving::Blocked {
                retry_at: 5_000,
                cause: "held".into()
            }
        );
        assert_eq!(
            serving(&accounts[..1]),
            Serving::Blocked {
                retry_at: 9_000,
                cause: "quota-exhausted".into()
            }
        );
    }

    #[test]
    fn nothing_enabled_errors_only_or_an_unknown_reset_have_no_time() {
        let reason = |r: &str| Serving::Unavailable { reason: r.into() };
        assert_eq!(
            serving(&[account("a", "disabled", false, None)]),
            reason("no-enabled-account")
        );
        assert_eq!(
            serving(&[account("a", "error", true, None)]),
            reason("authentication")
        );
        assert_eq!(
            serving(&[
                account("a", "exhausted", true, None),
                account("b", "held", true, Some(5))
            ]),
            reason("reset-unknown")
        );
    }
}
