//! One attempt on one account: send with the account's credential, record what the
//! answer says about the account's quota, classify it by the outcome table, and retry the
//! same account where the table says so (transient failures, a short 429, one refresh).

use super::{
    Cancel, Clock, Ctx, Deadlines, Engine, Level, Log, Raced, Random, Refreshed, TransportError,
    Upstream, UpstreamRequest, UpstreamResponse, unless_gone,
};
use crate::http::{self, Headers, PoolError};
use crate::model::{ChangeCause, Credential, HoldKind, Provider};
use crate::policy::{self, AccountState, AttemptOutcome, Classified};
use crate::quota;
use crate::settings::Settings;
use crate::stream::{self, BodyStream};
use pooler_plugin_kit::{Db, DbError};

/// How much of a failed upstream body is kept as its detail.
const DETAIL_LIMIT: usize = 1024;

/// What one attempt on one account came to.
pub(super) enum Attempt<B> {
    /// A response for the client: 2xx served, or passed through as is.
    Respond {
        response: UpstreamResponse<B>,
        served: bool,
    },
    /// The account could not serve; the failure (if any) is what the client sees if
    /// nothing else serves.
    Failed {
        outcome: AttemptOutcome,
        failure: Option<PoolError>,
    },
    /// The client went away: the attempt stopped where it stood. `status` is the last
    /// answer the account gave it (None when it had none, or its call was in flight).
    Cancelled { status: Option<u16> },
}

/// What to do after a transient failure ([`Engine::transient_retry`]).
enum Backoff {
    /// The wait is over: try the same account again.
    Retry,
    /// No retry is left (or it would wait past the inline wait limit).
    GiveUp,
    /// The client went away during the wait.
    Gone,
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> Engine<'a, D, U, E> {
    /// One account: send, classify, and retry the same account where the outcome table
    /// says so (transient failures with backoff, one short-429 wait, one token refresh).
    /// Every wait and upstream call races against the client's leaving, except a token
    /// refresh, whose answer must be stored.
    pub(super) async fn attempt(
        &self,
        ctx: &Ctx<'_>,
        state: &AccountState,
        waited: &mut Vec<String>,
    ) -> Result<Attempt<U::Body>, DbError> {
        let s = ctx.settings;
        let id = state.id.as_str();
        let upstream_name = ctx.provider.upstream_name();
        let mut retries = 0u32;
        let mut slept = 0u64;
        let mut refreshed = false;
        // The last answer the account gave this attempt (what a cancelled one records).
        let mut status: Option<u16> = None;
        loop {
            if self.env.gone() {
                return Ok(Attempt::Cancelled { status });
            }
            let now = self.env.now();
            self.last_try.set(now);
            // A token refresh started here runs to its end even if the client leaves
            // meanwhile: the endpoint may already have spent the old refresh token, and
            // only storing its answer keeps the account signed in.
            let credential = match self.usable_credential(ctx.provider, state, s).await? {
                Ok(c) => c,
                // Whatever kept the credential from us, the client's leaving comes first.
                Err(_) if self.env.gone() => return Ok(Attempt::Cancelled { status }),
                Err(failed) => return Ok(failed),
            };
            if self.env.gone() {
                return Ok(Attempt::Cancelled { status });
            }
            let request = self.upstream_request(ctx, &credential);
            self.sends.set(self.sends.get() + 1);
            status = None;
            // Dropped unanswered when the client goes: wasi:http then aborts the request.
            let sent = match unless_gone(self.env, self.upstream.send(request)).await {
                Raced::Done(sent) => sent,
                Raced::Gone => return Ok(Attempt::Cancelled { status: None }),
            };
            let now = self.env.now();
            let mut response = match sent {
                Ok(r) => r,
                Err(TransportError(code)) => {
                    self.env.log(
                        Level::Warn,
                        "Account Pooler upstream transport failed",
                        &[
                            ("provider", ctx.provider.to_string()),
                            ("account", id.to_owned()),
                            ("error", code),
                        ],
                    );
                    let failure = PoolError::pool(
                        502,
                        format!("Account Pooler could not reach {upstream_name}."),
                    );
                    match self.transient_retry(s, &mut retries, &mut slept).await {
                        Backoff::Retry => continue,
                        Backoff::Gone => return Ok(Attempt::Cancelled { status }),
                        Backoff::GiveUp => {}
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(failure),
                    });
                }
            };
            status = Some(response.status);
            let obs = match ctx.provider {
                Provider::Claude => quota::parse_claude_headers(&response.headers, now),
                Provider::Codex => quota::parse_codex_headers(&response.headers, now),
            };
            self.observe(ctx.provider, id, &obs, s.switch_threshold, now)?;
            match policy::classify(response.status, &obs, ctx.family, now) {
                Classified::Served => {
                    return Ok(Attempt::Respond {
                        response,
                        served: true,
                    });
                }
                Classified::PassThrough => {
                    return Ok(Attempt::Respond {
                        response,
                        served: false,
                    });
                }
                Classified::Quota => {
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Quota,
                        failure: None,
                    });
                }
                Classified::Family => {
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Family,
                        failure: None,
                    });
                }
                Classified::Transient => {
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    match self.transient_retry(s, &mut retries, &mut slept).await {
                        Backoff::Retry => continue,
                        Backoff::Gone => return Ok(Attempt::Cancelled { status }),
                        Backoff::GiveUp => {}
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(failure),
                    });
                }
                Classified::RateLimited => {
                    let wait = quota::parse_retry_after(response.headers.get("retry-after"), now);
                    // The hold is the upstream's word about the account, not this request's
                    // doing: it stays even if the client leaves during the wait.
                    self.store.set_hold(id, now + wait, HoldKind::RateLimit)?;
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    if wait <= s.inline_wait_ms && !waited.iter().any(|w| w == id) {
                        waited.push(id.to_owned());
                        if let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await {
                            return Ok(Attempt::Cancelled { status });
                        }
                        continue;
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Hold,
                        failure: Some(failure),
                    });
                }
                Classified::AuthRefused => {
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    match &credential {
                        Credential::ApiKey(_) => {
                            let text =
                                format!("{upstream_name} refused the API key: {}", failure.message);
                            if self.store.set_error(id, &text)? {
                                self.store
                                    .push_signal(ctx.provider, ChangeCause::ErrorSet, now)?;
                            }
                            return Ok(Attempt::Failed {
                                outcome: AttemptOutcome::Auth,
                                failure: Some(failure),
                            });
                        }
                        Credential::OAuth(tokens) if !refreshed => {
                            match self.refresh(ctx.provider, id, tokens, s).await? {
                                Refreshed::Tokens(_) => {
                                    refreshed = true;
                                    continue;
                                }
                                Refreshed::Refused(status) => {
                                    // The upstream refused the token and the refresh is refused too.
                                    if self.store.access_token(id)?.as_deref()
                                        == Some(tokens.access_token.as_str())
                                    {
                                        self.mark_error(
                                            ctx.provider,
                                            id,
                                            &format!("OAuth refresh failed with HTTP {status}."),
                                            now,
                                        )?;
                                    }
                                    return Ok(Attempt::Failed {
                                        outcome: AttemptOutcome::Auth,
                                        failure: Some(failure),
                                    });
                                }
                                // It stopped waiting for another request's refresh.
                                Refreshed::Transient(_) if self.env.gone() => {
                                    return Ok(Attempt::Cancelled { status });
                                }
                                Refreshed::Transient(_) => {
                                    let f = PoolError::pool(
                                        503,
                                        format!(
                                            "Account Pooler could not refresh the {upstream_name} sign-in; try again shortly."
                                        ),
                                    );
                                    return Ok(Attempt::Failed {
                                        outcome: AttemptOutcome::Transient,
                                        failure: Some(f),
                                    });
                                }
                            }
                        }
                        Credential::OAuth(tokens) => {
                            // Refused again with a fresh token: not an auth error; hold that token.
                            if self.store.access_token(id)?.as_deref()
                                == Some(tokens.access_token.as_str())
                            {
                                self.store
                                    .set_hold(id, now + s.token_hold_ms, HoldKind::Token)?;
                            }
                            let f = PoolError::pool(
                                503,
                                format!(
                                    "{upstream_name} refused a freshly refreshed token; treating it as an upstream failure: {}",
                                    failure.message
                                ),
                            );
                            return Ok(Attempt::Failed {
                                outcome: AttemptOutcome::Hold,
                                failure: Some(f),
                            });
                        }
                    }
                }
            }
        }
    }

    /// Wait before another same-account try after a transient failure, if the retry limit
    /// and the inline wait allow, unless the client goes away first.
    async fn transient_retry(&self, s: &Settings, retries: &mut u32, slept: &mut u64) -> Backoff {
        if *retries >= s.transient_retries {
            return Backoff::GiveUp;
        }
        let wait = s.backoff(*retries);
        if *slept + wait > s.inline_wait_ms {
            return Backoff::GiveUp;
        }
        *retries += 1;
        *slept += wait;
        if wait > 0
            && let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await
        {
            return Backoff::Gone;
        }
        Backoff::Retry
    }

    fn upstream_request(&self, ctx: &Ctx<'_>, credential: &Credential) -> UpstreamRequest {
        let mut headers = Headers::new();
        for (n, v) in ctx.req.headers.iter() {
            if http::forward_request_header(ctx.provider, n) {
                headers.push(n, v);
            }
        }
        match credential {
            Credential::ApiKey(k) => headers.set("x-api-key", k.as_str()),
            Credential::OAuth(t) => {
                headers.set("authorization", format!("Bearer {}", t.access_token));
                if ctx.provider == Provider::Claude {
                    // Subscription tokens are accepted on the Messages API only with this beta.
                    let betas = http::with_oauth_beta(
                        ctx.req
                            .headers
                            .iter()
                            .filter(|(n, _)| n.eq_ignore_ascii_case("anthropic-beta"))
                            .map(|(_, v)| v),
                    );
                    headers.set("anthropic-beta", betas);
                }
                if let Some(acct) = &t.chatgpt_account_id {
                    headers.set("chatgpt-account-id", acct.as_str());
                }
            }
        }
        UpstreamRequest {
            method: ctx.req.method.to_ascii_uppercase(),
            url: http::upstream_url(
                ctx.provider,
                ctx.settings.upstream_url(ctx.provider),
                &ctx.req.path,
                ctx.req.query.as_deref(),
            ),
            headers,
            body: ctx.req.body.clone(),
            deadlines: Deadlines::MODEL,
        }
    }
}

/// A failed upstream answer as the client would see it if nothing else serves: its
/// status, its detail (≤ 1 KiB) and its Retry-After.
async fn upstream_failure<B: BodyStream>(
    response: &mut UpstreamResponse<B>,
    now: u64,
) -> PoolError {
    let body = stream::read_prefix(&mut response.body, DETAIL_LIMIT).await;
    let message = http::upstream_detail(&body)
        .unwrap_or_else(|| format!("upstream returned HTTP {}.", response.status));
    PoolError {
        status: response.status,
        message,
        retry_after_secs: quota::retry_after_ms(response.headers.get("retry-after"), now)
            .map(|ms| ms.div_ceil(1000).max(1)),
        pool_origin: false,
    }
}
