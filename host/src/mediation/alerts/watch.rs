//! Finding the conditions that need a person, through the WIT only: the pool's
//! `accounts.list-accounts` (sign-in flag, error, blocking resets), Provider Retry's
//! `retry-admin.status` and `explain` (which failed turns it still works on, and why it
//! stopped), and the core's `threads` answers (whether a thread is still stuck on that
//! failure). A look runs on the watcher's own task — on an interval of the host clock, and
//! soon after the pool signals an availability change — never on a request path.
//! [`Host::check_alerts`] and [`Host::run_alerts`] delegate here.

use std::collections::BTreeMap;

use super::model::{AlertKind, Condition};
use crate::runtime::Host;
use crate::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountStatus, ExtraUsage,
};
use crate::runtime::bindings::types::Provider;
use crate::runtime::imports::threads::ThreadStatus;
use crate::runtime::roles::Role;

/// The caller the watcher's `threads` reads are made as (their log lines name it).
const CALLER: &str = "alerts";

/// The kinds an account look decides (opens and closes).
const ACCOUNT_KINDS: [AlertKind; 5] = [
    AlertKind::SignIn,
    AlertKind::AccountError,
    AlertKind::ProviderUnavailable,
    AlertKind::ExtraUsage,
    AlertKind::LastResort,
];

/// Failed turns Provider Retry took on: thread → the failed request it last worked on.
/// When it no longer has a candidate for the thread and the thread is still in error on that
/// same request, it will not retry it.
#[derive(Debug, Default)]
pub struct Tracked {
    failed: BTreeMap<String, String>,
}

impl Tracked {
    /// Provider Retry has been told of `request`'s failure (its `turn-failed` was delivered).
    pub fn note(&mut self, thread: &str, request: &str) {
        self.failed.insert(thread.to_string(), request.to_string());
    }
}

/// The least time between two looks that events asked for (milliseconds of the host clock).
pub const MIN_LOOK_GAP_MS: u64 = 1_000;

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Claude => "claude",
        Provider::Codex => "codex",
    }
}

/// Whether the account can take a request now.
fn serves(a: &AccountInfo) -> bool {
    a.enabled && matches!(a.status, AccountStatus::Ready | AccountStatus::NearLimit)
}

/// The account conditions of one list at `now`: each account needing a sign-in or in error,
/// each provider with accounts of which none can serve now (with the earliest time one
/// will), each account serving a spent model-family window on extra usage, and each
/// last-resort account that is its provider's only one able to serve.
pub fn account_conditions(accounts: &[AccountInfo], now: u64) -> Vec<Condition> {
    let mut out = Vec::new();
    let describe = |kind, a: &AccountInfo| {
        let mut c = Condition::new(kind, a.id.clone());
        c.provider = Some(provider_name(a.provider).into());
        c.account = Some(a.id.clone());
        c.label = Some(a.label.clone());
        c
    };
    for a in accounts {
        if !a.enabled {
            continue;
        }
        if a.status == AccountStatus::Error {
            let mut c = describe(AlertKind::AccountError, a);
            // The pool's text has the credential redacted (the accounts contract).
            c.reason = a.error.clone();
            out.push(c);
        } else if a.needs_sign_in {
            let mut c = describe(AlertKind::SignIn, a);
            c.until = a.token_expires_at;
            c.reason =
                Some("a token refresh was refused; sign in again before the token expires".into());
            out.push(c);
        }
    }
    for a in accounts.iter().filter(|a| serves(a)) {
        if a.options.extra_usage != ExtraUsage::Allow {
            continue;
        }
        // A family window refused by its plan but not blocking: extra usage covers it.
        let covered = a.windows.iter().find(|w| {
            w.family.is_some()
                && !w.blocking
                && (w.status.as_deref() == Some("rejected")
                    || w.utilization.is_some_and(|u| u >= 1.0))
                && w.resets_at.is_none_or(|t| t > now)
        });
        if let Some(w) = covered {
            let mut c = describe(AlertKind::ExtraUsage, a);
            c.until = w.resets_at;
            c.reason = Some(format!(
                "its {} window is spent; paid extra usage covers it until it resets",
                w.family.as_deref().unwrap_or(&w.name)
            ));
            out.push(c);
        }
    }
    for provider in [Provider::Claude, Provider::Codex] {
        let of = |a: &&AccountInfo| a.provider == provider;
        let others_serve = accounts
            .iter()
            .filter(of)
            .any(|a| !a.options.last_resort && serves(a));
        if !others_serve {
            for a in accounts
                .iter()
                .filter(of)
                .filter(|a| a.options.last_resort && serves(a))
            {
                let mut c = describe(AlertKind::LastResort, a);
                c.reason = Some("no other account of the provider can serve".into());
                out.push(c);
            }
        }
    }
    for provider in [Provider::Claude, Provider::Codex] {
        let enabled: Vec<&AccountInfo> = accounts
            .iter()
            .filter(|a| a.provider == provider && a.enabled)
            .collect();
        if enabled.is_empty() {
            continue;
        }
        let serving = enabled
            .iter()
            .any(|a| matches!(a.status, AccountStatus::Ready | AccountStatus::NearLimit));
        if serving {
            continue;
        }
        let name = provider_name(provider);
        let mut c = Condition::new(AlertKind::ProviderUnavailable, name);
        c.provider = Some(name.into());
        // The earliest an account serves again; none known when every one is in error.
        c.until = enabled
            .iter()
            .filter(|a| a.status != AccountStatus::Error)
            .filter_map(|a| a.blocking_reset.or(a.held_until))
            .min();
        let mut why: Vec<String> = Vec::new();
        for status in ["error", "held", "exhausted"] {
            let n = enabled
                .iter()
                .filter(|a| status_name(a.status) == status)
                .count();
            if n > 0 {
                why.push(format!("{n} {status}"));
            }
        }
        c.reason = Some(why.join(", "));
        out.push(c);
    }
    out
}

fn status_name(s: AccountStatus) -> &'static str {
    match s {
        AccountStatus::Disabled => "disabled",
        AccountStatus::Error => "error",
        AccountStatus::Held => "held",
        AccountStatus::Exhausted => "exhausted",
        AccountStatus::NearLimit => "near-limit",
        AccountStatus::Ready => "ready",
    }
}

/// [`Host::check_alerts`]: look at the accounts and threads now and announce what started
/// or ended. A source that cannot be read is skipped (its episodes stay as they were).
pub(crate) async fn check(host: &Host) {
    let alerts = host.alerts().clone();
    let _looking = alerts.looking.lock().await;
    let now = host.clock().now_ms();
    let mut alerts = Vec::new();
    if host.has_role(Role::AccountPool) {
        let listed = host
            .call_pool("accounts.list-accounts", |store, pool| {
                Box::pin(
                    pool.pooler_plugins_accounts()
                        .call_list_accounts(store, None),
                )
            })
            .await;
        match listed {
            Ok(Ok(accounts)) => {
                let present = account_conditions(&accounts, now);
                let mut episodes = host
                    .alerts()
                    .episodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                alerts.extend(episodes.observe(&ACCOUNT_KINDS, present, now));
            }
            Ok(Err(e)) => tracing::debug!(error = ?e, "alerts: cannot list the accounts"),
            Err(e) => tracing::debug!(error = %e, "alerts: cannot list the accounts"),
        }
    }
    if host.has_role(Role::ProviderRetry) {
        alerts.extend(check_threads(host, now).await);
    }
    host.alerts().emit(alerts);
}

/// Threads whose failed turn Provider Retry no longer works on while the thread is still
/// in error on it.
async fn check_threads(host: &Host, now: u64) -> Vec<crate::mediation::alerts::model::Alert> {
    let status = host
        .call_retry("retry-admin.status", |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_status(store, None)
                    .await
            })
        })
        .await;
    let candidates = match status {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(error = ?e, "alerts: cannot read the retry candidates");
            return Vec::new();
        }
        Err(e) => {
            tracing::debug!(error = %e, "alerts: cannot read the retry candidates");
            return Vec::new();
        }
    };
    let tracked: Vec<(String, String)> = {
        let mut tracked = host
            .alerts()
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for c in &candidates {
            tracked.note(&c.thread, &c.failed_request);
        }
        tracked
            .failed
            .iter()
            .filter(|(t, _)| !candidates.iter().any(|c| &c.thread == *t))
            .map(|(t, r)| (t.clone(), r.clone()))
            .collect()
    };
    let ids: Vec<String> = tracked.iter().map(|(t, _)| t.clone()).collect();
    let infos = host.shared.services.threads.get_threads(CALLER, &ids);
    let mut stuck: Vec<String> = Vec::new();
    let mut done: Vec<String> = Vec::new();
    for ((thread, request), info) in tracked.into_iter().zip(infos) {
        match info {
            Ok(info)
                if info.status == ThreadStatus::Error
                    && !info.archived
                    && !info.input_queued
                    && info.latest_request.as_deref() == Some(request.as_str()) =>
            {
                stuck.push(thread);
            }
            // Moved on (a new turn, a person's message, archived) or gone.
            _ => done.push(thread),
        }
    }
    {
        let mut tracked = host
            .alerts()
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for thread in &done {
            tracked.failed.remove(thread);
        }
    }
    let mut present = Vec::new();
    for thread in stuck {
        let open = host
            .alerts()
            .episodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_open(AlertKind::RetriesEnded, &thread);
        let mut c = Condition::new(AlertKind::RetriesEnded, thread.clone());
        c.thread = Some(thread.clone());
        if !open {
            c.reason = why_retries_ended(host, &thread).await;
        }
        present.push(c);
    }
    let mut episodes = host
        .alerts()
        .episodes
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    episodes.observe(&[AlertKind::RetriesEnded], present, now)
}

/// Provider Retry's own words for its last decision on the thread's latest chain.
async fn why_retries_ended(host: &Host, thread: &str) -> Option<String> {
    let target = thread.to_string();
    let chains = host
        .call_retry("retry-admin.explain", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_explain(store, &target)
                    .await
            })
        })
        .await
        .ok()?
        .ok()?;
    let entry = chains.last()?.entries.last()?;
    (!entry.reason.is_empty()).then(|| entry.reason.clone())
}

/// [`Host::run_alerts`]: look every `interval` of the host clock, and soon after each
/// availability change or failed turn (at most one look per [`MIN_LOOK_GAP_MS`] and twenty
/// times the last look's duration), until the future is dropped.
pub(crate) async fn run(host: Host, interval: std::time::Duration) {
    let step = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    loop {
        let started = std::time::Instant::now();
        host.check_alerts().await;
        // A look reads every retry candidate; a flood of failed turns (each one asks for
        // a look) must not make looks run back to back and starve the deliveries. After a
        // request for a look, wait at least a second and twenty times the last look.
        let spent = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let gap = spent.saturating_mul(20).max(MIN_LOOK_GAP_MS);
        let alerts = host.alerts().clone();
        let asked = async {
            alerts.look.notified().await;
            let soonest = host.clock().now_ms().saturating_add(gap);
            host.clock().sleep_until(soonest).await;
        };
        if step == 0 {
            asked.await;
        } else {
            let next = host.clock().now_ms().saturating_add(step);
            tokio::select! {
                _ = host.clock().sleep_until(next) => {}
                _ = asked => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::bindings::pool::exports::pooler::plugins::accounts::{
        AccountOptions, CredentialKind, UsageWindow,
    };

    fn account(id: &str, status: AccountStatus) -> AccountInfo {
        AccountInfo {
            id: id.into(),
            provider: Provider::Claude,
            kind: CredentialKind::ApiKey,
            label: format!("label {id}"),
            priority: 0,
            enabled: true,
            status,
            secret_hint: String::new(),
            created_at: 0,
            last_used_at: None,
            error: None,
            held_until: None,
            needs_sign_in: false,
            token_expires_at: None,
            windows: Vec::new(),
            blocking_reset: None,
            options: AccountOptions {
                last_resort: false,
                extra_usage: ExtraUsage::Deny,
                max_in_flight: 0,
                preserve: 1.0,
            },
        }
    }

    fn kinds(conditions: &[Condition]) -> Vec<(AlertKind, String)> {
        conditions
            .iter()
            .map(|c| (c.kind, c.subject.clone()))
            .collect()
    }

    #[test]
    fn errors_sign_ins_and_a_provider_that_cannot_serve_are_conditions() {
        let mut a = account("a", AccountStatus::Error);
        a.error = Some("invalid x-api-key [redacted]".into());
        let mut b = account("b", AccountStatus::Held);
        b.held_until = Some(500);
        let mut c = account("c", AccountStatus::Exhausted);
        c.blocking_reset = Some(300);
        let found = account_conditions(&[a.clone(), b.clone(), c.clone()], 0);
        assert_eq!(
            kinds(&found),
            vec![
                (AlertKind::AccountError, "a".into()),
                (AlertKind::ProviderUnavailable, "claude".into())
            ]
        );
        assert_eq!(
            found[0].reason.as_deref(),
            Some("invalid x-api-key [redacted]")
        );
        assert_eq!(
            found[1].until,
            Some(300),
            "the earliest account to serve again"
        );
        assert_eq!(
            found[1].reason.as_deref(),
            Some("1 error, 1 held, 1 exhausted")
        );

        // One account serving (a reserve counts) and the provider can serve.
        let mut d = account("d", AccountStatus::NearLimit);
        d.needs_sign_in = true;
        let found = account_conditions(&[a, b, c, d], 0);
        assert_eq!(
            kinds(&found),
            vec![
                (AlertKind::AccountError, "a".into()),
                (AlertKind::SignIn, "d".into())
            ]
        );
        // Disabled accounts are a person's choice: no alert, and no provider alert either.
        let mut e = account("e", AccountStatus::Disabled);
        e.enabled = false;
        assert!(account_conditions(&[e], 0).is_empty());
    }

    fn family_window(utilization: f64, blocking: bool, resets_at: u64) -> UsageWindow {
        UsageWindow {
            name: "7d_opus".into(),
            family: Some("opus".into()),
            utilization: Some(utilization),
            resets_at: Some(resets_at),
            status: Some("allowed_warning".into()),
            blocking,
            observed_at: 0,
        }
    }

    #[test]
    fn a_spent_family_window_covered_by_extra_usage_is_serving_on_it() {
        let mut a = account("a", AccountStatus::Ready);
        a.options.extra_usage = ExtraUsage::Allow;
        a.windows = vec![family_window(1.0, false, 500)];
        let found = account_conditions(std::slice::from_ref(&a), 100);
        assert_eq!(kinds(&found), vec![(AlertKind::ExtraUsage, "a".into())]);
        assert_eq!(found[0].until, Some(500));
        // The window reset: over.
        assert!(account_conditions(std::slice::from_ref(&a), 500).is_empty());
        // Not spent yet, or denied (the window then blocks): no extra usage.
        a.windows = vec![family_window(0.9, false, 500)];
        assert!(account_conditions(std::slice::from_ref(&a), 100).is_empty());
        a.options.extra_usage = ExtraUsage::Deny;
        a.windows = vec![family_window(1.0, true, 500)];
        assert!(account_conditions(&[a], 100).is_empty());
    }

    #[test]
    fn a_last_resort_account_alone_able_to_serve_is_serving() {
        let mut lr = account("lr", AccountStatus::Ready);
        lr.options.last_resort = true;
        let other = account("b", AccountStatus::Ready);
        assert!(account_conditions(&[other.clone(), lr.clone()], 0).is_empty());
        let mut spent = other;
        spent.status = AccountStatus::Exhausted;
        let found = account_conditions(&[spent, lr.clone()], 0);
        assert_eq!(kinds(&found), vec![(AlertKind::LastResort, "lr".into())]);
        // It cannot serve either: the provider cannot.
        lr.status = AccountStatus::Held;
        let found = account_conditions(&[lr], 0);
        assert_eq!(
            kinds(&found),
            vec![(AlertKind::ProviderUnavailable, "claude".into())]
        );
    }
}
