//! Usage: merging quota observations (from response headers or a usage endpoint) and
//! signalling the blocking-time changes they make, and fetching an OAuth account's usage,
//! on demand or when nothing is eligible (exhausted windows may lift early).

use super::{
    Cancel, Clock, Deadlines, Engine, Level, Log, Random, Refreshed, TransportError, Upstream,
    UpstreamRequest,
};
use crate::http::{self, Headers};
use crate::model::{ChangeCause, Credential, Family, Provider};
use crate::policy::{self, AccountState};
use crate::quota::{self, Observation};
use crate::redact::Redactor;
use crate::settings::Settings;
use crate::stream;
use pooler_plugin_kit::{Db, DbError};

/// An exhausted OAuth account's usage is re-fetched by requests at most this often.
pub const EXHAUSTED_RECHECK_MS: u64 = 30_000;

/// Why an account's usage was not merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFailure {
    /// The usage endpoint refused the access token (HTTP 401).
    Unauthorized(u16),
    /// The token refresh that followed a 401 was refused with this status.
    SignInRefused(u16),
    /// Anything else (unreachable, another status, unreadable answer, no usage endpoint).
    Other(String),
}

impl std::fmt::Display for UsageFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsageFailure::Unauthorized(status) => {
                write!(f, "usage endpoint refused the access token (HTTP {status})")
            }
            UsageFailure::SignInRefused(status) => write!(
                f,
                "usage endpoint refused the access token and the token refresh failed with HTTP {status}"
            ),
            UsageFailure::Other(why) => f.write_str(why),
        }
    }
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    /// Merge a quota observation and queue a signal when it moved the account's blocking
    /// time.
    pub fn observe(
        &self,
        provider: Provider,
        id: &str,
        obs: &Observation,
        threshold: f64,
        now: u64,
    ) -> Result<(), DbError> {
        if obs.is_empty() {
            return Ok(());
        }
        // One commit: the windows are replaced (deleted, then inserted) together with the
        // signal they cause, so a failure midway leaves the old ones, never none.
        self.store.tx(|store| {
            let Some(mut state) = store.account(id)? else {
                return Ok(());
            };
            let before = policy::blocked_until(&state, None, threshold, now);
            let windows_before = state.quota.windows.clone();
            state.quota.merge(obs);
            store.save_quota(id, &state.quota)?;
            for w in crate::history::changed_windows(&windows_before, &state.quota.windows) {
                store.record_history(id, now, &crate::history::HistoryEvent::Window(w))?;
            }
            let after = policy::blocked_until(&state, None, threshold, now);
            let cause = match (before, after) {
                (Some(_), None) => Some(ChangeCause::EarlierResetObserved),
                (None, Some(_)) => Some(ChangeCause::LaterResetObserved),
                (Some(Some(b)), Some(Some(a))) if a < b => Some(ChangeCause::EarlierResetObserved),
                (Some(Some(b)), Some(Some(a))) if a > b => Some(ChangeCause::LaterResetObserved),
                _ => None,
            };
            if let Some(c) = cause {
                store.push_signal(provider, c, now)?;
            }
            Ok(())
        })
    }

    /// When nothing is eligible, re-fetch the usage of exhausted OAuth accounts not
    /// fetched in the last 30 s (their windows may have been lifted early). Returns whether
    /// any was fetched.
    pub(super) async fn recheck_exhausted(
        &self,
        provider: Provider,
        states: &[AccountState],
        family: Option<Family>,
        s: &Settings,
    ) -> Result<bool, DbError> {
        let mut fetched = false;
        for a in states {
            let now = self.env.now();
            let exhausted = matches!(
                policy::tier(a, family, s.switch_threshold, now),
                policy::Tier::Refused(
                    policy::Refusal::SharedExhausted
                        | policy::Refusal::FamilyExhausted
                        | policy::Refusal::Restricted
                )
            );
            if a.kind != crate::model::CredentialKind::OAuth || !exhausted {
                continue;
            }
            let last = self.store.refresh_state(&a.id)?.last_usage_at;
            if last.is_some_and(|t| now < pooler_plugin_kit::time::after(t, EXHAUSTED_RECHECK_MS)) {
                continue;
            }
            if self
                .refresh_usage_signed_in(provider, &a.id, s)
                .await?
                .is_ok()
            {
                fetched = true;
            }
        }
        Ok(fetched)
    }

    /// [`Engine::refresh_usage`], and when the usage endpoint refuses the access token
    /// (401), one token refresh and one more fetch with the new token. A refused refresh
    /// is the caller's to judge ([`UsageFailure::SignInRefused`]).
    pub async fn refresh_usage_signed_in(
        &self,
        provider: Provider,
        id: &str,
        s: &Settings,
    ) -> Result<Result<(), UsageFailure>, DbError> {
        match self.refresh_usage(provider, id, s).await? {
            Err(UsageFailure::Unauthorized(status)) => {
                let Some(Credential::OAuth(tokens)) = self.store.credential(id)? else {
                    return Ok(Err(UsageFailure::Unauthorized(status)));
                };
                self.env.log(
                    Level::Info,
                    "Account Pooler usage endpoint refused the access token; refreshing it",
                    &[("account", id.to_owned()), ("status", status.to_string())],
                );
                match self.refresh(provider, id, &tokens, s).await? {
                    Refreshed::Tokens(_) => self.refresh_usage(provider, id, s).await,
                    Refreshed::Refused(status) => Ok(Err(UsageFailure::SignInRefused(status))),
                    Refreshed::Transient(detail) => Ok(Err(UsageFailure::Other(format!(
                        "the token refresh after the usage endpoint's HTTP {status} did not complete: {detail}"
                    )))),
                }
            }
            other => Ok(other),
        }
    }

    /// Fetch an OAuth account's usage from its provider's usage endpoint and merge it.
    /// `Err` (inside `Ok`) says why nothing was merged; API-key accounts have no usage
    /// endpoint.
    pub async fn refresh_usage(
        &self,
        provider: Provider,
        id: &str,
        s: &Settings,
    ) -> Result<Result<(), UsageFailure>, DbError> {
        let Some(Credential::OAuth(tokens)) = self.store.credential(id)? else {
            return Ok(Err(UsageFailure::Other(
                "API-key accounts have no usage endpoint".into(),
            )));
        };
        let now = self.env.now();
        self.store.set_last_usage(id, now)?;
        let mut headers = Headers::new();
        headers.push("authorization", format!("Bearer {}", tokens.access_token));
        headers.push("accept", "application/json");
        let url = match provider {
            Provider::Claude => {
                headers.push("anthropic-beta", http::OAUTH_BETA);
                format!(
                    "{}/api/oauth/usage",
                    s.claude_upstream_url.trim_end_matches('/')
                )
            }
            Provider::Codex => {
                if let Some(acct) = &tokens.chatgpt_account_id {
                    headers.push("chatgpt-account-id", acct.as_str());
                }
                headers.push("originator", "pooler");
                codex_usage_url(&s.codex_upstream_url)
            }
        };
        headers.push(http::ACCEPT_ENCODING, http::IDENTITY);
        let request = UpstreamRequest {
            method: "GET".into(),
            url,
            headers,
            body: crate::body::RequestBody::new(),
            deadlines: Deadlines::SERVICE,
        };
        let mut response = match self.upstream.send(request).await {
            Ok(r) => r,
            Err(TransportError(e)) => {
                return Ok(Err(UsageFailure::Other(format!(
                    "usage endpoint unreachable: {e}"
                ))));
            }
        };
        if response.status == 401 {
            return Ok(Err(UsageFailure::Unauthorized(response.status)));
        }
        if !(200..300).contains(&response.status) {
            return Ok(Err(UsageFailure::Other(format!(
                "usage endpoint answered HTTP {}",
                response.status
            ))));
        }
        let body = stream::read_to_end(&mut response.body, 256 * 1024)
            .await
            .unwrap_or_default();
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return Ok(Err(UsageFailure::Other(
                "usage endpoint answered with unreadable JSON".into(),
            )));
        };
        let now = self.env.now();
        let mut obs = match provider {
            Provider::Claude => quota::parse_claude_usage(&json, now),
            Provider::Codex => quota::parse_codex_usage(&json, now),
        };
        let credential = Credential::OAuth(tokens);
        obs.redact(&Redactor::for_credential(&credential));
        self.observe(provider, id, &obs, s.switch_threshold, now)?;
        Ok(Ok(()))
    }
}

/// Codex's usage endpoint: the `…/backend-api/wham/usage` beside the Codex API base
/// (`…/backend-api/codex`); for another base, `<base>/wham/usage`.
pub fn codex_usage_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    let root = base.strip_suffix("/codex").unwrap_or(base);
    format!("{root}/wham/usage")
}
