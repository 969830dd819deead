//! Routing: the attempt loop over a provider's accounts. It chooses an account by the
//! policy (a new or moving conversation by the provider's strategy, its placement recorded
//! so concurrent ones spread), claims a new session's pin, waits out or detours around
//! holds and full in-flight limits, runs one [attempt](super::attempt) per account, and
//! commits pins and the cursor by the #6990 rule once one serves; when none serves it
//! answers the failure the client should see.

use super::admission::Snapshot;
use super::attempt::Attempt;
use super::{
    Body, CANCELLED_MESSAGE, Cancel, Clock, Ctx, Engine, Level, Log, Raced, Random, Response,
    Upstream, UpstreamResponse, unless_gone,
};
use crate::http::{self, Headers, PoolError};
use crate::model::HoldKind;
use crate::policy::{
    self, AccountState, AttemptOutcome, Candidate, PinAction, PinSeen, Role, Selection,
};
use crate::redact::StreamRedactor;
use crate::store::{Load, Pin, TOUCH_GRANULARITY_MS};
use crate::stream::{Prefix, Relay};
use pooler_plugin_kit::{Db, DbError};
use std::collections::HashMap;

/// What the attempt loop has learned so far, carried from one pass to the next.
struct Progress {
    /// The session's pin as this request last saw it (found, or claimed by it).
    pin: Option<PinSeen>,
    /// Accounts tried (or found held), in order: not chosen again.
    attempted: Vec<String>,
    /// What each tried account came to, for the commit rule.
    outcomes: Vec<(String, AttemptOutcome)>,
    /// Accounts whose short hold or 429 this request already waited out once.
    waited: Vec<String>,
    /// The account tried last.
    previous: Option<String>,
    /// What the client sees if nothing serves.
    failure: Option<PoolError>,
    /// Whether the exhausted accounts' usage was already re-fetched.
    rechecked: bool,
    /// Accounts passed over because their in-flight limit was full (also in `attempted`
    /// until the request waits for one to free).
    busy: Vec<String>,
    /// Time waited inline for an in-flight limit to free.
    busy_waited: u64,
}

impl Progress {
    fn new(pin: Option<Pin>) -> Self {
        Progress {
            pin: pin.map(|p| PinSeen {
                confirmed_use: (!p.provisional).then_some(p.last_used_at),
                account: p.account,
                generation: p.generation,
                claimed: false,
            }),
            attempted: Vec::new(),
            outcomes: Vec::new(),
            waited: Vec::new(),
            previous: None,
            failure: None,
            rechecked: false,
            busy: Vec::new(),
            busy_waited: 0,
        }
    }
}

/// A request stops detouring after this many accounts failed it transiently (each after
/// its same-account retries), and answers the last failure.
pub(super) const TRANSIENT_ACCOUNTS_MAX: usize = 3;

/// How many accounts this request has seen fail transiently.
fn transient_accounts(p: &Progress) -> usize {
    p.outcomes
        .iter()
        .filter(|(_, o)| *o == AttemptOutcome::Transient)
        .count()
}

/// The first wait for an account's in-flight limit to free, doubled on each further wait
/// up to [`BUSY_WAIT_MAX_MS`], all within the inline wait limit.
const BUSY_WAIT_FIRST_MS: u64 = 100;
const BUSY_WAIT_MAX_MS: u64 = 2_000;

/// What a step of the attempt loop leaves the loop to do.
enum Step<B> {
    /// Go on with this pass.
    On,
    /// Start the next pass.
    Again,
    /// Answer the client with this.
    Answer(Response<B>),
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    /// The attempt loop, from what the request read before choosing: each pass chooses
    /// an account, claims a new session's pin, gets past a hold, and attempts it, until
    /// one answers the client or none is left.
    pub(super) async fn route(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        snapshot: Snapshot,
    ) -> Result<Response<U::Body>, DbError> {
        // The accounts this request may use: those that exist now. The first pass of the
        // loop uses the snapshot's read; later passes read again (an attempt changes state).
        let Snapshot {
            accounts,
            pin,
            inherited,
            cursor,
            ..
        } = snapshot;
        let snapshot: Vec<String> = accounts.iter().map(|a| a.id.clone()).collect();
        let mut fresh = Some(accounts);
        let mut p = Progress::new(pin);

        loop {
            if self.env.gone() {
                // Between attempts (the last one was recorded with its own outcome).
                return self.cancelled(ctx, p.pin.as_ref(), p.previous.as_deref());
            }
            let now = self.env.now();
            let states: Vec<AccountState> = match fresh.take() {
                Some(states) => states,
                None => self
                    .store
                    .accounts(Some(ctx.provider))?
                    .into_iter()
                    .filter(|a| snapshot.contains(&a.id))
                    .collect(),
            };
            let (choice, followed) = self.choose(
                ctx,
                thread,
                &states,
                &mut p,
                inherited.as_deref(),
                cursor.as_deref(),
                now,
            )?;
            if followed {
                continue;
            }
            let Some((id, role)) = choice else {
                match self.wait_for_flight(ctx, &mut p).await? {
                    Step::Again => continue,
                    Step::Answer(response) => return Ok(response),
                    Step::On => {}
                }
                if self.recheck_once(ctx, &states, &mut p).await? {
                    continue;
                }
                break;
            };
            ctx.report.borrow_mut().chosen.push((id.clone(), role));
            if self.claim_new_session(ctx, thread, &id, role, now, &mut p)? {
                continue;
            }
            let Some(state) = states.iter().find(|a| a.id == id) else {
                break;
            };
            match self.past_hold(ctx, state, now, &mut p).await? {
                Step::On => {}
                Step::Again => continue,
                Step::Answer(response) => return Ok(response),
            }
            let lease = match self.take_flight(state, now, &mut p)? {
                Some(lease) => lease,
                None => continue,
            };
            p.attempted.push(id.clone());
            p.previous = Some(id);
            let attempt = self.attempt(ctx, state, &mut p.waited).await;
            let settled = attempt.and_then(|attempt| {
                self.settle(ctx, thread, state, cursor.as_deref(), attempt, &mut p)
            });
            match settled {
                Ok(Step::Answer(mut response)) if lease.is_some() => {
                    if matches!(response.body, Body::Stream(_)) {
                        response.lease = lease;
                    } else {
                        self.end_flight(lease.as_deref());
                    }
                    return Ok(response);
                }
                Ok(Step::Answer(response)) => return Ok(response),
                Ok(_) => self.end_flight(lease.as_deref()),
                Err(e) => {
                    self.end_flight(lease.as_deref());
                    return Err(e);
                }
            }
            if transient_accounts(&p) >= TRANSIENT_ACCOUNTS_MAX {
                // As many accounts failed the same passing way: the provider's trouble, not
                // theirs. Trying every other account too multiplies the load on an
                // overloaded provider (a 40-account pool: 120 attempts per request) and
                // answers no sooner; the failure goes back for the client to retry.
                break;
            }
        }

        self.none_served(ctx, p)
    }

    /// The next account to try and why. A conversation placed by a ranking strategy is
    /// placed in one write transaction that reads every account's load, records the
    /// placement and claims a new session's pin, so concurrent requests (each in its own
    /// instance) see each other's. The flag says another request had claimed the session
    /// first: the loop follows that pin.
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        states: &[AccountState],
        p: &mut Progress,
        inherited: Option<&str>,
        cursor: Option<&str>,
        now: u64,
    ) -> Result<(Option<(String, Role)>, bool), DbError> {
        let placing = placing(ctx, states, p, now);
        let strategy = ctx.settings.strategy(ctx.provider);
        if !(placing && strategy.ranks() && ctx.key.is_some()) {
            let choice = next_choice(ctx, states, p, inherited, cursor, now, placing, None);
            return Ok((choice, false));
        }
        self.store.tx(|store| {
            let loads = store.loads(ctx.provider, now, ctx.settings.pin_lifetime_ms)?;
            let choice = next_choice(ctx, states, p, inherited, cursor, now, true, Some(&loads));
            let mut followed = false;
            if let Some((id, role @ Role::Strategy)) = &choice {
                store.record_placement(ctx.provider, id, now)?;
                followed = self.claim_new_session(ctx, thread, id, *role, now, p)?;
            }
            Ok((choice, followed))
        })
    }

    /// Take an in-flight lease on `state` when it has a limit: `Some(None)` when it has
    /// none, `Some(Some(lease))` when one was taken, and None when the limit is full (the
    /// account is passed over for now, as a detour would pass it).
    fn take_flight(
        &self,
        state: &AccountState,
        now: u64,
        p: &mut Progress,
    ) -> Result<Option<Option<String>>, DbError> {
        let limit = state.options.max_in_flight;
        if limit == 0 {
            return Ok(Some(None));
        }
        let lease = super::new_id(self.env);
        if self
            .store
            .take_flight_lease(&state.id, limit, &lease, now)?
        {
            return Ok(Some(Some(lease)));
        }
        p.attempted.push(state.id.clone());
        p.busy.push(state.id.clone());
        p.previous = Some(state.id.clone());
        Ok(None)
    }

    /// End an in-flight lease this request no longer needs. Failing to is no reason to
    /// fail the request: the lease expires by itself.
    fn end_flight(&self, lease: Option<&str>) {
        if let Some(lease) = lease
            && let Err(e) = self.store.end_flight_lease(lease)
        {
            self.env.log(
                Level::Warn,
                "Account Pooler could not end an in-flight lease; it expires by itself",
                &[("error", e.to_string())],
            );
        }
    }

    /// Nothing is left to choose but accounts whose in-flight limit was full: wait a
    /// little (doubling, within the inline wait limit) and choose among them again
    /// (`Again`); once the wait is spent, answer that every such account is busy (unless
    /// another failure was recorded, which the loop answers). `On` when no account was
    /// passed over as busy.
    async fn wait_for_flight(
        &self,
        ctx: &Ctx<'_>,
        p: &mut Progress,
    ) -> Result<Step<U::Body>, DbError> {
        if p.busy.is_empty() {
            return Ok(Step::On);
        }
        let left = ctx.settings.inline_wait_ms.saturating_sub(p.busy_waited);
        if left == 0 {
            if p.failure.is_some() {
                return Ok(Step::On);
            }
            ctx.report.borrow_mut().outcome = Some("failed");
            if let (Some(key), Some(pin)) = (ctx.key, p.pin.as_ref().filter(|p| p.claimed)) {
                self.store
                    .release_claim(ctx.provider, key, pin.generation)?;
            }
            let error = PoolError::pool(
                429,
                "Every eligible Account Pooler account is at its in-flight limit.",
            )
            .with_retry_after(1);
            return Ok(Step::Answer(Response::pool(ctx.provider, &error)));
        }
        let wait = p
            .busy_waited
            .clamp(BUSY_WAIT_FIRST_MS, BUSY_WAIT_MAX_MS)
            .min(left);
        if let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await {
            return self
                .cancelled(ctx, p.pin.as_ref(), p.previous.as_deref())
                .map(Step::Answer);
        }
        p.busy_waited += wait;
        let busy = std::mem::take(&mut p.busy);
        p.attempted.retain(|a| !busy.contains(a));
        Ok(Step::Again)
    }

    /// When nothing is eligible and nothing has failed yet, re-fetch the exhausted
    /// accounts' usage once; whether any was fetched (then the loop chooses again).
    async fn recheck_once(
        &self,
        ctx: &Ctx<'_>,
        states: &[AccountState],
        p: &mut Progress,
    ) -> Result<bool, DbError> {
        if p.rechecked || p.failure.is_some() {
            return Ok(false);
        }
        p.rechecked = true;
        self.recheck_exhausted(ctx.provider, states, ctx.family, ctx.settings)
            .await
    }

    /// A session without a pin claims one on the chosen account before trying it, so
    /// the concurrent requests of a new session go to one account. Returns whether another
    /// request claimed it first (the loop then follows that pin).
    fn claim_new_session(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        id: &str,
        role: Role,
        now: u64,
        p: &mut Progress,
    ) -> Result<bool, DbError> {
        let (Some(key), None) = (ctx.key, &p.pin) else {
            return Ok(false);
        };
        let s = ctx.settings;
        let why = if role == Role::Inherited {
            "inherited from its parent session"
        } else {
            "pinned on first success"
        };
        let seen = self.store.claim_pin(
            ctx.provider,
            key,
            id,
            Some(thread),
            now,
            s.pin_lifetime_ms,
            s.pin_cap,
            why,
        )?;
        let other = seen.account != id;
        p.pin = Some(seen);
        // A concurrent request of the same new session claimed it first: follow it.
        Ok(other)
    }

    /// A chosen account that is held (only the pin is chosen while held): wait out a short
    /// hold once, else record the hold and detour. `On` when it is not held.
    async fn past_hold(
        &self,
        ctx: &Ctx<'_>,
        state: &AccountState,
        now: u64,
        p: &mut Progress,
    ) -> Result<Step<U::Body>, DbError> {
        let Some(until) = state.unusable_until(now) else {
            return Ok(Step::On);
        };
        let id = &state.id;
        let remaining = until - now;
        if remaining <= ctx.settings.inline_wait_ms && !p.waited.contains(id) {
            if let Raced::Gone = unless_gone(self.env, self.env.sleep(remaining)).await {
                self.note_attempt(ctx, self.env.now(), id, None, AttemptOutcome::Cancelled)?;
                return self
                    .cancelled(ctx, p.pin.as_ref(), Some(id))
                    .map(Step::Answer);
            }
            p.waited.push(id.clone());
            return Ok(Step::Again);
        }
        p.attempted.push(id.clone());
        p.outcomes.push((id.clone(), AttemptOutcome::Hold));
        p.failure = Some(hold_failure(state, until, now));
        self.note_attempt(ctx, now, id, None, AttemptOutcome::Hold)?;
        p.previous = Some(id.clone());
        Ok(Step::Again)
    }

    /// Record what the attempt on `state` came to, in one commit with what it changes: a
    /// served answer commits the pin and cursor and is relayed; a cancelled one commits
    /// nothing else; a failed one is kept for the answer if nothing serves.
    fn settle(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        state: &AccountState,
        cursor: Option<&str>,
        attempt: Attempt<U::Body>,
        p: &mut Progress,
    ) -> Result<Step<U::Body>, DbError> {
        let id = state.id.as_str();
        match attempt {
            Attempt::Respond {
                response,
                served,
                redact,
                prefix,
                observed,
            } => {
                let now = self.env.now();
                let noted = ctx.report.borrow().attempts.len();
                // What this outcome changes is one commit (one WAL write, one lock). The
                // answer is in hand: if the commit cannot be written, it is tried again,
                // then given up with a warning, and the client gets the answer anyway.
                let lost = if served {
                    "the quota observation of this answer, the attempt record, the session's pin and the cursor move"
                } else {
                    "the quota observation of this answer, the attempt record and the release of the session's claimed pin"
                };
                self.bookkeeping(id, lost, || {
                    // A try that failed noted the attempt in the report already.
                    ctx.report.borrow_mut().attempts.truncate(noted);
                    self.store.tx(|store| {
                        let (observation, observed_at) = &*observed;
                        self.observe(
                            ctx.provider,
                            id,
                            observation,
                            ctx.settings.switch_threshold,
                            *observed_at,
                        )?;
                        store.touch_account(id, state.last_used_at, ctx.last_try.get())?;
                        let mut outcome = if served {
                            AttemptOutcome::Served
                        } else {
                            AttemptOutcome::PassedThrough
                        };
                        if served {
                            let detour = self.commit(
                                ctx,
                                thread,
                                id,
                                p.pin.as_ref(),
                                cursor,
                                &p.outcomes,
                                now,
                            )?;
                            if detour {
                                outcome = AttemptOutcome::Detour;
                            }
                        } else if let Some(pin) = p.pin.as_ref().filter(|p| p.claimed) {
                            store.release_claim(
                                ctx.provider,
                                ctx.key.unwrap_or_default(),
                                pin.generation,
                            )?;
                        }
                        self.note_attempt(ctx, now, id, Some(response.status), outcome)
                    })
                });
                {
                    let mut report = ctx.report.borrow_mut();
                    let detour = report.attempts.last().is_some_and(|(_, o)| *o == "detour");
                    report.answered_by = Some(id.to_owned());
                    report.outcome = Some(match (served, detour) {
                        (true, true) => "detour",
                        (true, false) => "served",
                        (false, _) => "passed-through",
                    });
                }
                Ok(Step::Answer(self.relay(
                    ctx,
                    id,
                    response,
                    redact,
                    prefix,
                    served.then_some(thread),
                )))
            }
            Attempt::Cancelled { status } => {
                // Recorded, and nothing else: no pin, cursor or failure of this request
                // is committed.
                self.store.tx(|store| {
                    store.touch_account(id, state.last_used_at, ctx.last_try.get())?;
                    self.note_attempt(ctx, self.env.now(), id, status, AttemptOutcome::Cancelled)
                })?;
                self.cancelled(ctx, p.pin.as_ref(), Some(id))
                    .map(Step::Answer)
            }
            Attempt::Failed { outcome, failure } => {
                self.store.tx(|store| {
                    store.touch_account(id, state.last_used_at, ctx.last_try.get())?;
                    self.note_attempt(
                        ctx,
                        self.env.now(),
                        id,
                        failure.as_ref().map(|f| f.status),
                        outcome,
                    )
                })?;
                p.outcomes.push((id.to_owned(), outcome));
                if failure.is_some() {
                    p.failure = failure;
                }
                Ok(Step::Again)
            }
        }
    }

    /// Nothing served: commit nothing (release the pin this request claimed), and answer
    /// the last failure, or why no account is eligible.
    fn none_served(&self, ctx: &Ctx<'_>, p: Progress) -> Result<Response<U::Body>, DbError> {
        let provider = ctx.provider;
        if let (Some(key), Some(pin)) = (ctx.key, p.pin.as_ref().filter(|p| p.claimed)) {
            self.store.release_claim(provider, key, pin.generation)?;
        }
        let now = self.env.now();
        ctx.report.borrow_mut().outcome = Some("failed");
        let error = match p.failure {
            Some(f) => f,
            None => self.none_eligible(ctx, now)?,
        };
        Ok(Response::pool(provider, &error))
    }

    /// Why no account of the request's provider is eligible, by the policy's verdict.
    fn none_eligible(&self, ctx: &Ctx<'_>, now: u64) -> Result<PoolError, DbError> {
        let provider = ctx.provider;
        let states = self.store.accounts(Some(provider))?;
        let verdict = policy::verdict(&states, ctx.family, ctx.settings.switch_threshold, now);
        let mut error = policy::no_eligible_response(verdict, now);
        if token_held_only(&states, now) {
            // Every usable account is held because the upstream refused its fresh
            // token: an upstream failure, answered 503 (at the same retry time).
            error.status = 503;
            error.message = format!(
                "{} refused the pool's sign-ins; Account Pooler is holding them.",
                provider.upstream_name()
            );
        }
        Ok(error)
    }

    /// Stop a request whose client went away: release the pin it claimed (a cancelled
    /// request pins nothing), say so in one log line, and answer something nobody reads.
    fn cancelled(
        &self,
        ctx: &Ctx<'_>,
        pin: Option<&PinSeen>,
        account: Option<&str>,
    ) -> Result<Response<U::Body>, DbError> {
        if let (Some(key), Some(p)) = (ctx.key, pin.filter(|p| p.claimed)) {
            self.store.release_claim(ctx.provider, key, p.generation)?;
        }
        ctx.report.borrow_mut().outcome = Some("cancelled");
        self.env.log(
            Level::Info,
            CANCELLED_MESSAGE,
            &[
                ("provider", ctx.provider.to_string()),
                ("account", account.unwrap_or("none").to_owned()),
                ("attempts", ctx.sends.get().to_string()),
            ],
        );
        Ok(Response::pool(
            ctx.provider,
            &PoolError::pool(
                499,
                "The client closed the request; Account Pooler stopped it.",
            ),
        ))
    }

    /// Apply the commit rule after a success on `served`. Returns whether it was a detour
    /// (the session stays pinned elsewhere).
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        served: &str,
        pin: Option<&PinSeen>,
        cursor: Option<&str>,
        outcomes: &[(String, AttemptOutcome)],
        now: u64,
    ) -> Result<bool, DbError> {
        let s = ctx.settings;
        let threshold = s.switch_threshold;
        let outcome_of = |id: &str| {
            outcomes
                .iter()
                .rev()
                .find(|(a, _)| a == id)
                .map(|(_, o)| *o)
        };
        let gone = |id: &str| -> Result<bool, DbError> {
            Ok(policy::gone_for_good(
                self.store.account(id)?.as_ref(),
                outcome_of(id),
                threshold,
                now,
            ))
        };
        let mut detour = false;
        if let Some(key) = ctx.key {
            let pinned_gone = match pin {
                Some(p) if p.account != served && !p.claimed => gone(&p.account)?,
                _ => false,
            };
            match policy::pin_action(true, pin, served, pinned_gone) {
                PinAction::Touch => {
                    if let Some(p) = pin.filter(|p| p.touch_due(now, TOUCH_GRANULARITY_MS)) {
                        self.store.touch_pin(ctx.provider, key, p.generation, now)?;
                    }
                }
                PinAction::Bind => {
                    let why = match pin {
                        Some(p) if !p.claimed => {
                            let reason = outcome_of(&p.account)
                                .filter(|o| o.is_lasting())
                                .map_or("no longer usable", AttemptOutcome::as_str);
                            format!("re-pinned: previous account {} ({reason})", p.account)
                        }
                        _ => "pinned on first success".to_owned(),
                    };
                    self.store.bind_pin(
                        ctx.provider,
                        key,
                        served,
                        Some(thread),
                        pin.map(|p| p.generation),
                        now,
                        s.pin_lifetime_ms,
                        &why,
                        s.pin_cap,
                    )?;
                }
                PinAction::Keep => detour = pin.is_some(),
            }
        }
        let cursor_gone = match cursor {
            Some(c) if c != served => gone(c)?,
            _ => false,
        };
        if policy::cursor_moves(cursor, served, cursor_gone) {
            self.store.cas_cursor(ctx.provider, cursor, served)?;
        }
        Ok(detour)
    }

    fn note_attempt(
        &self,
        ctx: &Ctx<'_>,
        at: u64,
        account: &str,
        status: Option<u16>,
        outcome: AttemptOutcome,
    ) -> Result<(), DbError> {
        ctx.report
            .borrow_mut()
            .attempts
            .push((account.to_owned(), outcome.as_str()));
        match ctx.key {
            Some(key) => self.store.record_attempt(
                ctx.provider,
                key,
                at,
                account,
                status,
                outcome.as_str(),
                ctx.settings.pin_cap,
            ),
            None => Ok(()),
        }
    }

    /// The upstream's answer, relayed; a served one (`served_for` its thread) has its
    /// token usage metered as it passes.
    fn relay(
        &self,
        ctx: &Ctx<'_>,
        account: &str,
        response: UpstreamResponse<U::Body>,
        redact: Option<StreamRedactor>,
        prefix: Prefix,
        served_for: Option<&str>,
    ) -> Response<U::Body> {
        let mut headers = Headers::new();
        for (n, v) in response.headers.iter() {
            if http::forward_response_header(n) {
                headers.push(n, v);
            }
        }
        // An encoded stream is relayed as bytes: an `error` event appended in plain text
        // would corrupt it, so a break ends it with an error instead.
        let content_type = if http::is_encoded(&response.headers) {
            None
        } else {
            response.headers.get("content-type")
        };
        let mut relay = Relay::new(response.body, ctx.provider, content_type)
            .for_account(account)
            .redacting(redact)
            .after(prefix);
        if let Some(thread) = served_for
            && !http::is_encoded(&response.headers)
        {
            relay = relay.metering(Some(thread));
        }
        Response {
            status: response.status,
            headers,
            body: Body::Stream(relay),
            lease: None,
        }
    }
}

/// Whether the enabled, error-free accounts are all held, and all by token holds.
fn token_held_only(states: &[AccountState], now: u64) -> bool {
    let mut live = states
        .iter()
        .filter(|a| a.enabled && a.error.is_none())
        .peekable();
    live.peek().is_some() && live.all(|a| a.held(now) && a.hold_kind == Some(HoldKind::Token))
}

/// The failure a held account stands for: 429 with the hold's Retry-After, or 503 for a
/// token hold.
fn hold_failure(state: &AccountState, until: u64, now: u64) -> PoolError {
    match state.hold_kind {
        Some(HoldKind::Token) => PoolError::pool(
            503,
            "The account's sign-in was refused upstream; Account Pooler is holding it.",
        ),
        _ => PoolError::pool(
            429,
            "The current Account Pooler account is temporarily rate limited.",
        )
        .with_retry_after(policy::retry_after_secs(until, now)),
    }
}

/// Whether the request places its conversation (rather than serving it on its pin, or
/// detouring): it has no pin, or claimed the one it has, or its pinned account is gone
/// for a lasting reason (refused lastingly in this request or now, or removed).
fn placing(ctx: &Ctx<'_>, states: &[AccountState], p: &Progress, now: u64) -> bool {
    match &p.pin {
        None => true,
        Some(pin) if pin.claimed => true,
        Some(pin) => {
            let outcome = p
                .outcomes
                .iter()
                .rev()
                .find(|(a, _)| *a == pin.account)
                .map(|(_, o)| *o);
            policy::gone_for_good(
                states.iter().find(|a| a.id == pin.account),
                outcome,
                ctx.settings.switch_threshold,
                now,
            )
        }
    }
}

/// The account to try next and why, by the policy over `states` as they are `now`;
/// `loads` (each account's conversations and recent placements) when a ranking strategy
/// places the conversation.
#[allow(clippy::too_many_arguments)]
fn next_choice(
    ctx: &Ctx<'_>,
    states: &[AccountState],
    p: &Progress,
    inherited: Option<&str>,
    cursor: Option<&str>,
    now: u64,
    placing: bool,
    loads: Option<&HashMap<String, Load>>,
) -> Option<(String, Role)> {
    let strategy = ctx.settings.strategy(ctx.provider);
    let candidates: Vec<Candidate> = states
        .iter()
        .map(|a| {
            let load = loads
                .and_then(|l| l.get(&a.id))
                .copied()
                .unwrap_or_default();
            Candidate {
                id: a.id.clone(),
                tier: policy::tier(a, ctx.family, ctx.settings.switch_threshold, now),
                held: a.held(now),
                standby: policy::standby(a, now),
                score: policy::capacity(strategy, a, ctx.family, now),
                live: load.live,
                recent: load.recent,
            }
        })
        .collect();
    policy::choose(Selection {
        candidates: &candidates,
        attempted: &p.attempted,
        pinned: p.pin.as_ref().map(|p| p.account.as_str()),
        inherited,
        cursor,
        previous: p.previous.as_deref(),
        placing,
        strategy,
    })
}
