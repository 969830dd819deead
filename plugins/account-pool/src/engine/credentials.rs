//! Credentials: the credential an attempt sends, and OAuth token refreshes (§8), one in
//! flight per account across every instance (a lease row, held longer than a refresh can
//! take), each written only over the tokens it replaced, with their backoff and the error
//! and sign-in flags a refused refresh sets.

use super::admission::HEAD_READ_FRESH_MS;
use super::attempt::Attempt;
use super::{
    Cancel, Clock, Ctx, Deadlines, Engine, Level, Log, Raced, Random, TransportError, Upstream,
    UpstreamRequest, new_id, unless_gone,
};
use crate::http::{self, Headers, PoolError};
use crate::model::{ChangeCause, Credential, OAuthTokens, Provider};
use crate::oauth::{self, Need, RefreshResult, RefusedEffect};
use crate::policy::{AccountState, AttemptOutcome};
use crate::quota;
use crate::settings::Settings;
use crate::store::Secret;
use crate::stream::BodyStream;
use pooler_plugin_kit::time::after;
use pooler_plugin_kit::{Db, DbError};

/// How often a request waiting for another request's token refresh looks again.
const REFRESH_POLL_MS: u64 = 100;

/// What an OAuth refresh came to, for the caller.
#[derive(Debug)]
pub enum Refreshed {
    /// A usable token (new, or refreshed by another request meanwhile).
    Tokens(OAuthTokens),
    /// The endpoint refused the refresh token.
    Refused(u16),
    /// Not now (endpoint failure, or another refresh still running).
    Transient(String),
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    /// The credential to send now, refreshing an OAuth token that expires soon (§8). A
    /// refused proactive refresh keeps a valid token serving with the sign-in flag (#6167).
    /// The request's first try uses the secret its snapshot read, when it is for this
    /// account and no older than [`HEAD_READ_FRESH_MS`] (an inline wait may come first);
    /// every other try reads the secret again (a refresh may have replaced it).
    pub(super) async fn usable_credential(
        &self,
        ctx: &Ctx<'_>,
        state: &AccountState,
    ) -> Result<Result<Credential, Attempt<U::Body>>, DbError> {
        let (provider, s) = (ctx.provider, ctx.settings);
        let id = state.id.as_str();
        let upstream_name = provider.upstream_name();
        let now = self.env.now();
        let read_ahead = ctx
            .secret
            .take()
            .filter(|(at, secret)| secret.id == id && now.saturating_sub(*at) <= HEAD_READ_FRESH_MS)
            .map(|(_, secret)| secret);
        let Secret {
            credential,
            refresh: rs,
            ..
        } = match read_ahead {
            Some(secret) => secret,
            None => self.store.secret(id)?,
        };
        let Some(credential) = credential else {
            let now = self.env.now();
            self.mark_error(provider, id, "The account's secret is missing.", now)?;
            return Ok(Err(Attempt::Failed {
                outcome: AttemptOutcome::Auth,
                failure: None,
            }));
        };
        let Credential::OAuth(tokens) = &credential else {
            return Ok(Ok(credential));
        };
        let now = self.env.now();
        let backing_off = rs.retry_at.is_some_and(|t| t > now);
        match oauth::need(tokens.expires_at, now) {
            Need::None => Ok(Ok(credential)),
            Need::Proactive if backing_off => Ok(Ok(credential)),
            // The token is still valid: a refresh another request is running does the job,
            // and this one does not wait for it.
            Need::Proactive => match self.refresh_within(provider, id, tokens, s, 0).await? {
                Refreshed::Tokens(t) => Ok(Ok(Credential::OAuth(t))),
                Refreshed::Refused(_) | Refreshed::Transient(_) => Ok(Ok(credential)),
            },
            Need::Expired if backing_off && rs.failure.as_deref() == Some("transient") => {
                let f = PoolError::pool(
                    503,
                    format!(
                        "The {upstream_name} sign-in of this account is being refreshed; try again shortly."
                    ),
                );
                Ok(Err(Attempt::Failed {
                    outcome: AttemptOutcome::Transient,
                    failure: Some(f),
                }))
            }
            Need::Expired => match self.refresh(provider, id, tokens, s).await? {
                Refreshed::Tokens(t) => Ok(Ok(Credential::OAuth(t))),
                Refreshed::Refused(status) => {
                    let now = self.env.now();
                    self.mark_error(
                        provider,
                        id,
                        &format!("OAuth refresh failed with HTTP {status}."),
                        now,
                    )?;
                    let f = PoolError::pool(
                        401,
                        format!(
                            "The {upstream_name} sign-in of this account expired and could not be refreshed."
                        ),
                    );
                    Ok(Err(Attempt::Failed {
                        outcome: AttemptOutcome::Auth,
                        failure: Some(f),
                    }))
                }
                Refreshed::Transient(_) => {
                    let f = PoolError::pool(
                        503,
                        format!(
                            "Account Pooler could not refresh the {upstream_name} sign-in; try again shortly."
                        ),
                    );
                    Ok(Err(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(f),
                    }))
                }
            },
        }
    }

    /// Refresh an account's OAuth token, one refresh in flight per account across every
    /// instance (a lease row). A caller that finds another refresh running waits for it
    /// (as long as its lease, [`oauth::LEASE_MS`]) and uses its token. `old` is the token
    /// the caller holds: if the stored one already differs, it is used without another
    /// refresh.
    pub async fn refresh(
        &self,
        provider: Provider,
        id: &str,
        old: &OAuthTokens,
        s: &Settings,
    ) -> Result<Refreshed, DbError> {
        self.refresh_within(provider, id, old, s, oauth::LEASE_MS)
            .await
    }

    /// [`Engine::refresh`], waiting at most `patience_ms` for a refresh another request
    /// holds the lease of (0: not at all; then `Transient`).
    pub async fn refresh_within(
        &self,
        provider: Provider,
        id: &str,
        old: &OAuthTokens,
        s: &Settings,
        patience_ms: u64,
    ) -> Result<Refreshed, DbError> {
        let owner = new_id(self.env);
        let started = self.env.now();
        loop {
            let now = self.env.now();
            if self
                .store
                .try_lease(id, &owner, now, after(now, oauth::LEASE_MS))?
            {
                break;
            }
            if now >= after(started, patience_ms) {
                return Ok(Refreshed::Transient(
                    "another token refresh is still running".into(),
                ));
            }
            // Waiting for another request's refresh is this request's own work: it stops
            // when its client goes (the caller sees the client gone and records that).
            if let Raced::Gone = unless_gone(self.env, self.env.sleep(REFRESH_POLL_MS)).await {
                return Ok(Refreshed::Transient("the client went away".into()));
            }
            if let Some(Credential::OAuth(t)) = self.store.credential(id)?
                && t.access_token != old.access_token
            {
                return Ok(Refreshed::Tokens(t));
            }
        }
        let result = self.refresh_with_lease(provider, id, old, s).await;
        self.store.release_lease(id, &owner)?;
        result
    }

    async fn refresh_with_lease(
        &self,
        provider: Provider,
        id: &str,
        old: &OAuthTokens,
        s: &Settings,
    ) -> Result<Refreshed, DbError> {
        let current = match self.store.credential(id)? {
            Some(Credential::OAuth(t)) => t,
            _ => {
                return Ok(Refreshed::Transient(
                    "the account has no OAuth credential".into(),
                ));
            }
        };
        if current.access_token != old.access_token {
            return Ok(Refreshed::Tokens(current));
        }
        let mut headers = Headers::new();
        headers.push("content-type", "application/json");
        headers.push("accept", "application/json");
        headers.push(http::ACCEPT_ENCODING, http::IDENTITY);
        let request = UpstreamRequest {
            method: "POST".into(),
            url: s.token_url(provider).to_owned(),
            headers,
            body: oauth::refresh_request_body(provider, &current.refresh_token).into(),
            deadlines: Deadlines::SERVICE,
        };
        let sent_at = self.env.now();
        let sent = self.upstream.send(request).await;
        let now = self.env.now();
        let result = match sent {
            Err(TransportError(e)) => RefreshResult::Transient {
                retry_after_ms: None,
                detail: e,
            },
            Ok(mut r) => {
                let ra = quota::retry_after_ms(r.headers.get("retry-after"), now);
                match self.read_token_body(&mut r.body, sent_at).await {
                    Ok(body) => {
                        let now = self.env.now();
                        oauth::parse_refresh_response(r.status, &body, ra, &current, now)
                    }
                    Err(detail) => RefreshResult::Transient {
                        retry_after_ms: ra,
                        detail,
                    },
                }
            }
        };
        let now = self.env.now();
        let rs = self.store.refresh_state(id)?;
        Ok(match result {
            RefreshResult::Refreshed(tokens) => {
                // Written only over the tokens this refresh replaced: if another writer
                // stored new ones meanwhile (a refresh whose lease outlived its instance, a
                // person replacing the sign-in), theirs stand and are the ones to use.
                if !self.store.replace_tokens(id, &current, &tokens)? {
                    return Ok(match self.store.credential(id)? {
                        Some(Credential::OAuth(winner)) => {
                            self.env.log(
                                Level::Info,
                                "Account Pooler OAuth refresh lost to another; using its token",
                                &[("account", id.to_owned())],
                            );
                            Refreshed::Tokens(winner)
                        }
                        _ => Refreshed::Transient("the account's sign-in was removed".into()),
                    });
                }
                self.store.clear_refresh_failure(id)?;
                if self.store.clear_error(id)? {
                    self.store
                        .push_signal(provider, ChangeCause::ErrorCleared, now)?;
                }
                Refreshed::Tokens(tokens)
            }
            RefreshResult::Refused(status) => {
                let backoff = oauth::next_backoff(rs.backoff_ms, None);
                self.store
                    .set_refresh_failure(id, "refused", backoff, after(now, backoff))?;
                let valid = current.expires_at.is_none_or(|t| t > now);
                if oauth::on_refused(valid) == RefusedEffect::KeepServing {
                    self.store.set_needs_sign_in(id, true)?;
                }
                self.env.log(
                    Level::Warn,
                    "Account Pooler OAuth refresh refused",
                    &[("account", id.to_owned()), ("status", status.to_string())],
                );
                Refreshed::Refused(status)
            }
            RefreshResult::Transient {
                retry_after_ms,
                detail,
            } => {
                let backoff = oauth::next_backoff(rs.backoff_ms, retry_after_ms);
                self.store
                    .set_refresh_failure(id, "transient", backoff, after(now, backoff))?;
                Refreshed::Transient(detail)
            }
        })
    }

    /// A token endpoint's body (at most 64 KiB kept), unless it is still arriving
    /// [`oauth::REFRESH_BUDGET_MS`] after the refresh was sent: then the refresh fails, so
    /// that it ends within its lease.
    async fn read_token_body(&self, body: &mut U::Body, sent_at: u64) -> Result<Vec<u8>, String> {
        const LIMIT: usize = 64 * 1024;
        let mut out = Vec::new();
        while let Some(chunk) = body.next_chunk().await {
            let Ok(chunk) = chunk else {
                // A broken body reads as what arrived (then unreadable JSON: transient).
                break;
            };
            let room = LIMIT.saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if self.env.now() >= after(sent_at, oauth::REFRESH_BUDGET_MS) {
                return Err(format!(
                    "the token endpoint's answer took longer than {} s",
                    oauth::REFRESH_BUDGET_MS / 1000
                ));
            }
        }
        Ok(out)
    }

    pub(super) fn mark_error(
        &self,
        provider: Provider,
        id: &str,
        text: &str,
        now: u64,
    ) -> Result<(), DbError> {
        if self.store.set_error(id, text, now)? {
            self.store
                .push_signal(provider, ChangeCause::ErrorSet, now)?;
        }
        Ok(())
    }
}
