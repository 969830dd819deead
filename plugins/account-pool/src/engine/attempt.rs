//! One attempt on one account: send with the account's credential, record what the
//! answer says about the account's quota, hold a served event stream's head until its
//! first event (a stream that opens with an overload or a rate limit is judged as that
//! status), classify the answer by the outcome table, and retry the same account where the
//! table says so (transient failures, a short 429, one refresh).

use super::{
    Cancel, Clock, Ctx, Deadlines, Engine, Level, Log, Raced, Random, Refreshed, TransportError,
    Upstream, UpstreamRequest, UpstreamResponse, unless_gone,
};
use crate::first_event::{FirstEvent, OpeningFailure, Verdict};
use crate::http::{self, Headers, PoolError};
use crate::model::{ChangeCause, Credential, Family, HoldKind, OAuthTokens, Provider};
use crate::policy::{self, AccountState, AttemptOutcome, Classified};
use crate::quota::{self, EXTRA_USAGE_WINDOW, Observation, Restriction, Window};
use crate::redact::{Redactor, StreamRedactor};
use crate::settings::Settings;
use crate::stream::{self, BodyEnd, BodyStream, Prefix};
use pooler_plugin_kit::time::after;
use pooler_plugin_kit::{Db, DbError};

/// How much of a failed upstream body is kept as its detail.
const DETAIL_LIMIT: usize = 1024;

/// The most of a stream held while waiting for its first event (and one chunk more): a
/// Messages API `message_start` is about 1 KiB, the Responses API's announcement echoes
/// the request's instructions and tools. Past it the stream is relayed as it comes.
pub(super) const FIRST_EVENT_LIMIT: usize = 256 << 10;
/// How much of a 400 or 402 is read to tell the provider's billing refusal from a refusal
/// of the request (the billing texts come first in a short error envelope).
const BILLING_PEEK: usize = 4096;

/// How long an account the billing refused for a family (no reset given) is left alone
/// before the pool tries it again (assumed: the provider says nothing of when).
const BILLING_RECHECK_MS: u64 = 3_600_000;

/// What one attempt on one account came to.
pub(super) enum Attempt<B> {
    /// A response for the client: 2xx served, or passed through as is (its body with
    /// the account's credential taken out by `redact`).
    Respond {
        response: UpstreamResponse<B>,
        served: bool,
        redact: Option<StreamRedactor>,
        /// What was read of the body before its head went out (relayed first).
        prefix: Prefix,
        /// What the answer's head said of the account's quota, and when: written in one
        /// commit with the attempt it belongs to.
        observed: Box<(Observation, u64)>,
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

/// What one attempt has been through so far, across its tries of the same account.
struct Tries {
    /// Transient failures retried so far.
    retries: u32,
    /// Time slept backing off from them.
    slept: u64,
    /// Whether the token was refreshed after a refusal (once per attempt).
    refreshed: bool,
    /// The last answer the account gave this attempt (what a cancelled one records).
    status: Option<u16>,
}

/// What holding a served stream's head until its first event came to.
enum Opening {
    /// Relay the stream, what was read of it first.
    Relay(Prefix),
    /// The stream opened with this failure; what was read of it is dropped.
    Failed(OpeningFailure),
    /// The client went away meanwhile.
    Gone,
}

/// What waiting for a body's next chunk within a time limit came to.
enum Waited<T> {
    Chunk(T),
    TimedOut,
    Gone,
}

/// What one try leaves its attempt to do.
enum Next<B> {
    /// Try the same account again.
    Again,
    /// The attempt came to this.
    Done(Attempt<B>),
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
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
        let mut tries = Tries {
            retries: 0,
            slept: 0,
            refreshed: false,
            status: None,
        };
        let sends_before = ctx.sends.get();
        loop {
            let next = match self.send_try(ctx, state, &mut tries).await? {
                Ok((credential, response)) => {
                    self.judge(ctx, &state.id, &credential, response, waited, &mut tries)
                        .await?
                }
                Err(next) => next,
            };
            if let Next::Done(attempt) = next {
                // Every upstream call after the attempt's first repeated it on this account.
                let repeats = ctx
                    .sends
                    .get()
                    .saturating_sub(sends_before)
                    .saturating_sub(1);
                ctx.report
                    .borrow_mut()
                    .retried(&state.id, u64::from(repeats));
                return Ok(attempt);
            }
        }
    }

    /// One try up to the account's answer: the credential to send (refreshed when due),
    /// then the upstream call. `Err` says what the try came to when no answer arrived.
    async fn send_try(
        &self,
        ctx: &Ctx<'_>,
        state: &AccountState,
        tries: &mut Tries,
    ) -> Result<Result<(Credential, UpstreamResponse<U::Body>), Next<U::Body>>, DbError> {
        let cancelled = |status| Ok(Err(Next::Done(Attempt::Cancelled { status })));
        if self.env.gone() {
            return cancelled(tries.status);
        }
        let now = self.env.now();
        ctx.last_try.set(now);
        // A token refresh started here runs to its end even if the client leaves
        // meanwhile: the endpoint may already have spent the old refresh token, and
        // only storing its answer keeps the account signed in.
        let credential = match self.usable_credential(ctx, state).await? {
            Ok(c) => c,
            // Whatever kept the credential from us, the client's leaving comes first.
            Err(_) if self.env.gone() => return cancelled(tries.status),
            Err(failed) => return Ok(Err(Next::Done(failed))),
        };
        if self.env.gone() {
            return cancelled(tries.status);
        }
        let request = self.upstream_request(ctx, &credential);
        ctx.sends.set(ctx.sends.get() + 1);
        tries.status = None;
        // Dropped unanswered when the client goes: wasi:http then aborts the request.
        let sent_at = self.env.now();
        let sent = unless_gone(self.env, self.upstream.send(request)).await;
        let status = match &sent {
            Raced::Done(Ok(response)) => Some(response.status),
            _ => None,
        };
        ctx.report.borrow_mut().sends.push(super::report::Call {
            account: state.id.clone(),
            status,
            ms: self.env.now().saturating_sub(sent_at),
        });
        let sent = match sent {
            Raced::Done(sent) => sent,
            Raced::Gone => return cancelled(None),
        };
        // `100 Continue` is interim and the HTTP client consumes it: a 1xx that arrives as
        // the answer (a `101 Switching Protocols` to a plain POST) is a broken exchange.
        let sent = match sent {
            Ok(response) if response.status < 200 => Err(TransportError(format!(
                "the upstream answered HTTP {} instead of a response",
                response.status
            ))),
            sent => sent,
        };
        match sent {
            Ok(response) => Ok(Ok((credential, response))),
            Err(TransportError(code)) => {
                self.env.log(
                    Level::Warn,
                    "Account Pooler upstream transport failed",
                    &[
                        ("provider", ctx.provider.to_string()),
                        ("account", state.id.clone()),
                        ("error", code),
                    ],
                );
                let failure = PoolError::pool(
                    502,
                    format!(
                        "Account Pooler could not reach {}.",
                        ctx.provider.upstream_name()
                    ),
                );
                Ok(Err(self
                    .retry_transient(ctx.settings, tries, failure)
                    .await))
            }
        }
    }

    /// What the account's answer says: its quota observation is merged, then the outcome
    /// table decides whether it is the response, a failure, or a reason to try again.
    async fn judge(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        credential: &Credential,
        mut response: UpstreamResponse<U::Body>,
        waited: &mut Vec<String>,
        tries: &mut Tries,
    ) -> Result<Next<U::Body>, DbError> {
        let s = ctx.settings;
        let now = self.env.now();
        tries.status = Some(response.status);
        let redactor = Redactor::for_credential(credential);
        let mut obs = match ctx.provider {
            Provider::Claude => quota::parse_claude_headers(&response.headers, now),
            Provider::Codex => quota::parse_codex_headers(&response.headers, now),
        };
        obs.redact(&redactor);
        // What the answer says about the account's quota is bookkeeping: if it cannot be
        // written, the answer still decides (and may be served). An answer the client
        // will get has it written with its attempt, in one commit; any other at once, as
        // what follows (a retry, the next account) chooses by it.
        let observed_at = now;
        let write_observation = |obs: &Observation| {
            self.bookkeeping(id, "the quota observation of this answer", || {
                self.observe(ctx.provider, id, obs, s.switch_threshold, observed_at)
            });
        };
        let answering = matches!(
            policy::classify(response.status, &obs, ctx.family, now),
            Classified::Served | Classified::PassThrough
        );
        if !answering {
            write_observation(&obs);
        }
        let failed = |outcome, failure| Ok(Next::Done(Attempt::Failed { outcome, failure }));
        let mut status = response.status;
        let mut now = now;
        // The failure a stream's first event told, in place of a body to read.
        let mut told = None;
        let mut prefix = Prefix::default();
        if policy::classify(status, &obs, ctx.family, now) == Classified::Served {
            match self.opening(ctx, id, &mut response).await {
                Opening::Relay(read) => prefix = read,
                Opening::Failed(f) => {
                    write_observation(&obs);
                    status = f.status;
                    now = self.env.now();
                    told = Some(opening_failure(&f, &response.headers, &redactor, now));
                }
                Opening::Gone => {
                    write_observation(&obs);
                    return Ok(Next::Done(Attempt::Cancelled {
                        status: tries.status,
                    }));
                }
            }
        }
        match policy::classify(status, &obs, ctx.family, now) {
            // A served answer is the model's: relayed untouched (an upstream echoes what it
            // was sent in its refusals, and rewriting model output would corrupt it).
            Classified::Served => Ok(Next::Done(Attempt::Respond {
                response,
                served: true,
                redact: None,
                prefix,
                observed: Box::new((obs, observed_at)),
            })),
            Classified::PassThrough => {
                if matches!(response.status, 400 | 402) {
                    let Raced::Done(read) = unless_gone(
                        self.env,
                        stream::read_head(&mut response.body, BILLING_PEEK),
                    )
                    .await
                    else {
                        write_observation(&obs);
                        return Ok(Next::Done(Attempt::Cancelled {
                            status: tries.status,
                        }));
                    };
                    if policy::billing_refusal(response.status, &read.bytes) {
                        write_observation(&obs);
                        let failure = billing_failure(&response, &read.bytes, &redactor, now);
                        return self
                            .billing_refused(ctx, id, credential, &response.headers, failure, now)
                            .map(Next::Done);
                    }
                    prefix = read;
                }
                Ok(Next::Done(Attempt::Respond {
                    response,
                    served: false,
                    redact: Some(StreamRedactor::new(credential)),
                    prefix,
                    observed: Box::new((obs, observed_at)),
                }))
            }
            Classified::Quota => failed(AttemptOutcome::Quota, None),
            Classified::Family => failed(AttemptOutcome::Family, None),
            Classified::Transient => {
                let Raced::Done(failure) = self.detail(&mut response, &redactor, told, now).await
                else {
                    return Ok(Next::Done(Attempt::Cancelled {
                        status: tries.status,
                    }));
                };
                Ok(self.retry_transient(s, tries, failure).await)
            }
            Classified::RateLimited => {
                self.rate_limited(ctx, id, &redactor, &mut response, told, now, waited, tries)
                    .await
            }
            Classified::AuthRefused => {
                self.auth_refused(ctx, id, credential, &mut response, now, tries)
                    .await
            }
        }
    }

    /// A served event stream: its head is held until its first event, for at most the
    /// `first-event-wait` setting and [`FIRST_EVENT_LIMIT`] bytes. An opening failure is
    /// told; anything else — content, a failure left to the client, the end, a break, the
    /// time or the bytes running out — relays the stream with what was read first.
    async fn opening(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        response: &mut UpstreamResponse<U::Body>,
    ) -> Opening {
        let wait = ctx.settings.first_event_wait_ms;
        let sse = !http::is_encoded(&response.headers)
            && stream::is_event_stream(response.headers.get("content-type"));
        let mut prefix = Prefix::default();
        if wait == 0 || !sse {
            return Opening::Relay(prefix);
        }
        let mut scan = FirstEvent::new(ctx.provider);
        // One deadline for the whole wait, started only if the body keeps us waiting.
        let timer = self.env.sleep(wait);
        let mut timer = std::pin::pin!(timer);
        while prefix.bytes.len() < FIRST_EVENT_LIMIT {
            let chunk = match self
                .within(response.body.next_chunk(), timer.as_mut())
                .await
            {
                Waited::Gone => return Opening::Gone,
                Waited::TimedOut => break,
                Waited::Chunk(chunk) => chunk,
            };
            match chunk {
                Some(Ok(chunk)) => prefix.bytes.extend_from_slice(&chunk),
                None => {
                    prefix.end = BodyEnd::Ended;
                    break;
                }
                Some(Err(e)) => {
                    prefix.end = BodyEnd::Broke(e);
                    break;
                }
            }
            match scan.advance(&prefix.bytes) {
                Verdict::Undecided => {}
                Verdict::Relay => break,
                Verdict::Failed(failure) => {
                    self.env.log(
                        Level::Info,
                        "Account Pooler upstream stream failed at its first event",
                        &[
                            ("provider", ctx.provider.to_string()),
                            ("account", id.to_owned()),
                            ("code", failure.code.clone()),
                            ("as-status", failure.status.to_string()),
                        ],
                    );
                    return Opening::Failed(failure);
                }
            }
        }
        Opening::Relay(prefix)
    }

    /// What a failed answer says for itself: what its stream's first event `told`, else
    /// its body's detail, read unless the client goes first.
    async fn detail(
        &self,
        response: &mut UpstreamResponse<U::Body>,
        redactor: &Redactor<'_>,
        told: Option<PoolError>,
        now: u64,
    ) -> Raced<PoolError> {
        match told {
            Some(failure) => Raced::Done(failure),
            None => unless_gone(self.env, upstream_failure(response, redactor, now)).await,
        }
    }

    /// `chunk` unless the client goes first or `timer` ends first. The timer is polled
    /// only while the chunk keeps us waiting, so a body whose bytes are there never starts
    /// it (a sleep on the host clock).
    async fn within<T>(
        &self,
        chunk: impl Future<Output = T>,
        mut timer: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Waited<T> {
        if self.env.gone() {
            return Waited::Gone;
        }
        let mut chunk = std::pin::pin!(chunk);
        let mut gone = std::pin::pin!(self.env.gone_wait());
        std::future::poll_fn(|cx| {
            if gone.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(Waited::Gone);
            }
            if let std::task::Poll::Ready(c) = chunk.as_mut().poll(cx) {
                return std::task::Poll::Ready(Waited::Chunk(c));
            }
            timer.as_mut().poll(cx).map(|()| Waited::TimedOut)
        })
        .await
    }

    /// The provider's billing refused the account (not the request): a lasting refusal,
    /// so the conversation fails over and moves. An API key's organisation is out of
    /// credits: the account is in error until a person acts. A subscription's extra usage
    /// is spent (or required and off): the account is refused for the request's family
    /// until the reset the answer gives (else for [`BILLING_RECHECK_MS`]), whatever extra
    /// usage the headers offer; a request without a family (Codex) refuses the account.
    fn billing_refused(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        credential: &Credential,
        headers: &Headers,
        failure: PoolError,
        now: u64,
    ) -> Result<Attempt<U::Body>, DbError> {
        let s = ctx.settings;
        let upstream = ctx.provider.upstream_name();
        if let Credential::ApiKey(_) = credential {
            let text = format!(
                "{upstream} refused the account for billing: {}",
                failure.message
            );
            if self.store.set_error(id, &text, now)? {
                self.store
                    .push_signal(ctx.provider, ChangeCause::ErrorSet, now)?;
            }
        } else {
            let until = headers
                .get("anthropic-ratelimit-unified-reset")
                .and_then(quota::parse_reset)
                .filter(|t| {
                    *t > now && *t <= now.saturating_add(pooler_plugin_kit::time::RESET_HORIZON_MS)
                })
                .or_else(|| {
                    failure
                        .retry_after_secs
                        .map(|secs| after(now, secs.saturating_mul(1000)))
                })
                .unwrap_or_else(|| after(now, BILLING_RECHECK_MS));
            let reason = format!("{upstream} billing: {}", failure.message);
            let obs = match ctx.family {
                Some(family) => Observation {
                    windows: vec![Window {
                        name: EXTRA_USAGE_WINDOW.to_owned(),
                        family: Some(family),
                        utilization: Some(1.0),
                        resets_at: Some(until),
                        status: Some("rejected".to_owned()),
                        observed_at: now,
                    }],
                    ..Observation::default()
                },
                None => Observation {
                    restriction: Some(Restriction {
                        reason,
                        resets_at: Some(until),
                    }),
                    ..Observation::default()
                },
            };
            self.observe(ctx.provider, id, &obs, s.switch_threshold, now)?;
        }
        self.env.log(
            Level::Info,
            "Account Pooler account refused by the provider's billing; failing over",
            &[
                ("provider", ctx.provider.to_string()),
                ("account", id.to_owned()),
                (
                    "family",
                    ctx.family.map_or("any", Family::as_str).to_owned(),
                ),
            ],
        );
        Ok(Attempt::Failed {
            outcome: AttemptOutcome::Quota,
            failure: Some(failure),
        })
    }

    /// After a transient failure: the same account again once the backoff allows, else
    /// the failure (or the client's leaving, during the wait).
    async fn retry_transient(
        &self,
        s: &Settings,
        tries: &mut Tries,
        failure: PoolError,
    ) -> Next<U::Body> {
        match self
            .transient_retry(s, &mut tries.retries, &mut tries.slept)
            .await
        {
            Backoff::Retry => Next::Again,
            Backoff::Gone => Next::Done(Attempt::Cancelled {
                status: tries.status,
            }),
            Backoff::GiveUp => Next::Done(Attempt::Failed {
                outcome: AttemptOutcome::Transient,
                failure: Some(failure),
            }),
        }
    }

    /// A 429 (or a stream that opened with a rate limit, `told`): hold the account for its
    /// Retry-After; wait it out here once if it is short, else fail over.
    #[allow(clippy::too_many_arguments)]
    async fn rate_limited(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        redactor: &Redactor<'_>,
        response: &mut UpstreamResponse<U::Body>,
        told: Option<PoolError>,
        now: u64,
        waited: &mut Vec<String>,
        tries: &Tries,
    ) -> Result<Next<U::Body>, DbError> {
        let wait = quota::parse_retry_after(response.headers.get("retry-after"), now);
        // The hold is the upstream's word about the account, not this request's
        // doing: it stays even if the client leaves during the wait.
        self.store
            .set_hold(id, after(now, wait), HoldKind::RateLimit, now)?;
        let Raced::Done(failure) = self.detail(response, redactor, told, now).await else {
            return Ok(Next::Done(Attempt::Cancelled {
                status: tries.status,
            }));
        };
        if wait <= ctx.settings.inline_wait_ms && !waited.iter().any(|w| w == id) {
            waited.push(id.to_owned());
            if let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await {
                return Ok(Next::Done(Attempt::Cancelled {
                    status: tries.status,
                }));
            }
            return Ok(Next::Again);
        }
        Ok(Next::Done(Attempt::Failed {
            outcome: AttemptOutcome::Hold,
            failure: Some(failure),
        }))
    }

    /// The upstream refused the credential: an API key is in error; an OAuth token is
    /// refreshed once and tried again, and a freshly refreshed one refused again is held.
    async fn auth_refused(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        credential: &Credential,
        response: &mut UpstreamResponse<U::Body>,
        now: u64,
        tries: &mut Tries,
    ) -> Result<Next<U::Body>, DbError> {
        let redactor = Redactor::for_credential(credential);
        let Raced::Done(failure) =
            unless_gone(self.env, upstream_failure(response, &redactor, now)).await
        else {
            return Ok(Next::Done(Attempt::Cancelled {
                status: tries.status,
            }));
        };
        match credential {
            Credential::ApiKey(_) => self.api_key_refused(ctx, id, failure, now),
            Credential::OAuth(tokens) if !tries.refreshed => {
                self.refresh_after_refusal(ctx, id, tokens, failure, now, tries)
                    .await
            }
            Credential::OAuth(tokens) => self.fresh_token_refused(ctx, id, tokens, &failure, now),
        }
    }

    /// A refused API key: the account is in error until a person fixes it.
    fn api_key_refused(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        failure: PoolError,
        now: u64,
    ) -> Result<Next<U::Body>, DbError> {
        let text = format!(
            "{} refused the API key: {}",
            ctx.provider.upstream_name(),
            failure.message
        );
        if self.store.set_error(id, &text, now)? {
            self.store
                .push_signal(ctx.provider, ChangeCause::ErrorSet, now)?;
        }
        Ok(Next::Done(Attempt::Failed {
            outcome: AttemptOutcome::Auth,
            failure: Some(failure),
        }))
    }

    /// A refused OAuth token, the first time in this attempt: refresh it and try again.
    async fn refresh_after_refusal(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        tokens: &OAuthTokens,
        failure: PoolError,
        now: u64,
        tries: &mut Tries,
    ) -> Result<Next<U::Body>, DbError> {
        match self.refresh(ctx.provider, id, tokens, ctx.settings).await? {
            Refreshed::Tokens(_) => {
                tries.refreshed = true;
                Ok(Next::Again)
            }
            Refreshed::Refused(status) => {
                // The upstream refused the token and the refresh is refused too.
                if self.store.access_token(id)?.as_deref() == Some(tokens.access_token.as_str()) {
                    self.mark_error(
                        ctx.provider,
                        id,
                        &format!("OAuth refresh failed with HTTP {status}."),
                        now,
                    )?;
                }
                Ok(Next::Done(Attempt::Failed {
                    outcome: AttemptOutcome::Auth,
                    failure: Some(failure),
                }))
            }
            // It stopped waiting for another request's refresh.
            Refreshed::Transient(_) if self.env.gone() => Ok(Next::Done(Attempt::Cancelled {
                status: tries.status,
            })),
            Refreshed::Transient(_) => {
                let f = PoolError::pool(
                    503,
                    format!(
                        "Account Pooler could not refresh the {} sign-in; try again shortly.",
                        ctx.provider.upstream_name()
                    ),
                );
                Ok(Next::Done(Attempt::Failed {
                    outcome: AttemptOutcome::Transient,
                    failure: Some(f),
                }))
            }
        }
    }

    /// A freshly refreshed OAuth token refused again: not an auth error; hold that token.
    fn fresh_token_refused(
        &self,
        ctx: &Ctx<'_>,
        id: &str,
        tokens: &OAuthTokens,
        failure: &PoolError,
        now: u64,
    ) -> Result<Next<U::Body>, DbError> {
        if self.store.access_token(id)?.as_deref() == Some(tokens.access_token.as_str()) {
            self.store.set_hold(
                id,
                after(now, ctx.settings.token_hold_ms),
                HoldKind::Token,
                now,
            )?;
        }
        let f = PoolError::pool(
            503,
            format!(
                "{} refused a freshly refreshed token; treating it as an upstream failure: {}",
                ctx.provider.upstream_name(),
                failure.message
            ),
        );
        Ok(Next::Done(Attempt::Failed {
            outcome: AttemptOutcome::Hold,
            failure: Some(f),
        }))
    }

    /// Wait before another same-account try after a transient failure, if the retry limit
    /// and the inline wait allow, unless the client goes away first.
    async fn transient_retry(&self, s: &Settings, retries: &mut u32, slept: &mut u64) -> Backoff {
        if *retries >= s.transient_retries {
            return Backoff::GiveUp;
        }
        let wait = s.backoff(*retries);
        if slept.saturating_add(wait) > s.inline_wait_ms {
            return Backoff::GiveUp;
        }
        *retries += 1;
        *slept = slept.saturating_add(wait);
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
        headers.set(http::ACCEPT_ENCODING, http::IDENTITY);
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

/// A billing refusal as the client would see it if nothing else serves: its status, its
/// detail (the credential taken out) and its Retry-After.
fn billing_failure<B>(
    response: &UpstreamResponse<B>,
    body: &[u8],
    redactor: &Redactor<'_>,
    now: u64,
) -> PoolError {
    let body = &body[..body.len().min(DETAIL_LIMIT)];
    let message = http::upstream_detail(body)
        .map(|m| redactor.redact(&m).into_owned())
        .unwrap_or_else(|| format!("upstream returned HTTP {}.", response.status));
    PoolError {
        status: response.status,
        message,
        retry_after_secs: quota::retry_after_ms(response.headers.get("retry-after"), now)
            .map(|ms| ms.div_ceil(1000).max(1)),
        pool_origin: false,
    }
}

/// A failed upstream answer as the client would see it if nothing else serves: its
/// status, its detail (≤ 1 KiB, the account's credential taken out: this text is kept as
/// the account's error and answered to the client) and its Retry-After.
async fn upstream_failure<B: BodyStream>(
    response: &mut UpstreamResponse<B>,
    redactor: &Redactor<'_>,
    now: u64,
) -> PoolError {
    let body = stream::read_prefix(&mut response.body, DETAIL_LIMIT).await;
    let message = http::upstream_detail(&body)
        .map(|m| redactor.redact(&m).into_owned())
        .unwrap_or_else(|| format!("upstream returned HTTP {}.", response.status));
    PoolError {
        status: response.status,
        message,
        retry_after_secs: quota::retry_after_ms(response.headers.get("retry-after"), now)
            .map(|ms| ms.div_ceil(1000).max(1)),
        pool_origin: false,
    }
}

/// The failure a stream that opened with `f` stands for, as the client would see it if
/// nothing else serves: the status it stands for, its message (the account's credential
/// taken out) and the head's Retry-After.
fn opening_failure(
    f: &OpeningFailure,
    headers: &Headers,
    redactor: &Redactor<'_>,
    now: u64,
) -> PoolError {
    PoolError {
        status: f.status,
        message: f.message.as_deref().map_or_else(
            || format!("upstream stream opened with {}.", f.code),
            |m| redactor.redact(m).into_owned(),
        ),
        retry_after_secs: quota::retry_after_ms(headers.get("retry-after"), now)
            .map(|ms| ms.div_ceil(1000).max(1)),
        pool_origin: false,
    }
}
