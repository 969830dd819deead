//! The `maintenance` interface: the start (dropping a stopped host's refresh leases) and
//! the periodic tick (ended holds and passed resets,
//! pruning, token refreshes that come due, usage fetches).

use super::Admin;
use crate::engine::{Cancel, Clock, Level, Log, Random, Upstream};
use crate::model::{ChangeCause, Credential, CredentialKind};
use crate::oauth;
use crate::policy::AccountState;
use pooler_plugin_kit::{Db, DbError};

/// Attempts older than this are dropped by the tick.
const ATTEMPT_RETENTION_MS: u64 = 24 * 3_600_000;

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
    /// The host started (`maintenance.on-start`): drop the OAuth refresh leases its
    /// predecessor's calls held, so a refresh that died with that process does not keep
    /// the account unrefreshed for the rest of its lease; and end the in-flight leases of
    /// its requests, none of which is in flight any more.
    pub fn start(&self, now: u64) -> Result<(), DbError> {
        self.store.end_flight_leases()?;
        let dropped = self.store.drop_leases()?;
        if dropped > 0 {
            self.env.log(
                Level::Info,
                "Account Pooler dropped the OAuth refresh leases a stopped host left",
                &[("leases", dropped.to_string()), ("now", now.to_string())],
            );
        }
        Ok(())
    }

    /// Periodic work: detect ended holds and passed resets (queueing signals), drop
    /// expired pins, old attempts and old token usage, refresh tokens that expire soon and usage when due.
    pub async fn tick(&self, now: u64) -> Result<(), DbError> {
        let s = self.store.settings()?;
        let last = self
            .store
            .meta_i64("last-tick")?
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(now);
        let passed = |t: Option<u64>| t.is_some_and(|t| t > last && t <= now);
        for a in self.store.accounts(None)? {
            if passed(a.held_until) {
                self.store
                    .push_signal(a.provider, ChangeCause::HoldEnded, now)?;
            }
            let reset_passed = a.quota.windows.iter().any(|w| {
                passed(w.resets_at)
                    && (w.status.as_deref() == Some("rejected")
                        || w.utilization.is_some_and(|u| u >= s.switch_threshold))
            }) || passed(a.quota.restriction.as_ref().and_then(|r| r.resets_at));
            if reset_passed {
                self.store
                    .push_signal(a.provider, ChangeCause::ResetPassed, now)?;
            }
        }
        self.store.prune_pins(now, s.pin_lifetime_ms, s.pin_cap)?;
        self.store
            .prune_attempts(now, ATTEMPT_RETENTION_MS, s.pin_cap)?;
        self.store.prune_history(now)?;
        self.store
            .prune_tokens(now, crate::store::TOKEN_RETENTION_MS)?;
        self.store
            .set_meta_i64("last-tick", i64::try_from(now).unwrap_or(i64::MAX))?;

        for a in self.store.accounts(None)? {
            if a.kind != CredentialKind::OAuth || !a.enabled || a.error.is_some() {
                continue;
            }
            let rs = self.store.refresh_state(&a.id)?;
            let backing_off = rs.retry_at.is_some_and(|t| t > now);
            if oauth::need(a.token_expires_at, now) != oauth::Need::None
                && !backing_off
                && let Some(Credential::OAuth(tokens)) = self.store.credential(&a.id)?
            {
                // A refresh another request is running does this one's job: the tick
                // does not wait for it (a later tick looks again).
                let result = self
                    .engine
                    .refresh_within(a.provider, &a.id, &tokens, &s, 0)
                    .await?;
                let expired = a.token_expires_at.is_some_and(|t| t <= now);
                if matches!(result, crate::engine::Refreshed::Refused(_)) && expired {
                    self.refused_refresh_of_expired_token(&a, now)?;
                    continue;
                }
            }
            if rs
                .last_usage_at
                .is_none_or(|t| now >= pooler_plugin_kit::time::after(t, s.usage_refresh_ms))
            {
                // A failed usage fetch is retried on a later tick; responses keep quota
                // current. A refused access token gets one refresh first; a refused refresh
                // of a token that has not expired flags the sign-in and keeps serving
                // (#6167), as above.
                let _ = self
                    .engine
                    .refresh_usage_signed_in(a.provider, &a.id, &s)
                    .await?;
            }
        }
        Ok(())
    }

    /// #6167: only an expired token whose refresh was refused puts an account in error.
    fn refused_refresh_of_expired_token(&self, a: &AccountState, now: u64) -> Result<(), DbError> {
        let text = "OAuth refresh failed and the access token has expired.";
        if self.store.set_error(&a.id, text, now)? {
            self.store
                .push_signal(a.provider, ChangeCause::ErrorSet, now)?;
        }
        Ok(())
    }
}
