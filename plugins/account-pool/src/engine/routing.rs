//! Routing: the attempt loop over a provider's accounts. It chooses an account by the
//! policy, claims a new session's pin, waits out or detours around holds, runs one
//! [attempt](super::attempt) per account, and commits pins and the cursor by the #6990
//! rule once one serves; when none serves it answers the failure the client should see.

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
use crate::store::TOUCH_GRANULARITY_MS;
use crate::stream::Relay;
use pooler_plugin_kit::{Db, DbError};

/// The outcome recorded for an attempt the client's leaving stopped.
const CANCELLED: &str = "cancelled";

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> Engine<'a, D, U, E> {
    /// The attempt loop, from what the request read before choosing.
    pub(super) async fn route(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        snapshot: Snapshot,
    ) -> Result<Response<U::Body>, DbError> {
        let s = ctx.settings;
        let (provider, threshold) = (ctx.provider, s.switch_threshold);
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
        let mut pin: Option<PinSeen> = pin.map(|p| PinSeen {
            confirmed_use: (!p.provisional).then_some(p.last_used_at),
            account: p.account,
            generation: p.generation,
            claimed: false,
        });
        let mut attempted: Vec<String> = Vec::new();
        let mut outcomes: Vec<(String, AttemptOutcome)> = Vec::new();
        let mut waited: Vec<String> = Vec::new();
        let mut previous: Option<String> = None;
        let mut failure: Option<PoolError> = None;
        let mut rechecked = false;

        loop {
            if self.env.gone() {
                // Between attempts (the last one was recorded with its own outcome).
                return self.cancelled(ctx, pin.as_ref(), previous.as_deref());
            }
            let now = self.env.now();
            let states: Vec<AccountState> = match fresh.take() {
                Some(states) => states,
                None => self
                    .store
                    .accounts(Some(provider))?
                    .into_iter()
                    .filter(|a| snapshot.contains(&a.id))
                    .collect(),
            };
            let candidates: Vec<Candidate> = states
                .iter()
                .map(|a| Candidate {
                    id: a.id.clone(),
                    tier: policy::tier(a, ctx.family, threshold, now),
                    held: a.held(now),
                })
                .collect();
            let Some((id, role)) = policy::choose(Selection {
                candidates: &candidates,
                attempted: &attempted,
                pinned: pin.as_ref().map(|p| p.account.as_str()),
                inherited: inherited.as_deref(),
                cursor: cursor.as_deref(),
                previous: previous.as_deref(),
            }) else {
                if !rechecked && failure.is_none() {
                    rechecked = true;
                    if self
                        .recheck_exhausted(provider, &states, ctx.family, s)
                        .await?
                    {
                        continue;
                    }
                }
                break;
            };
            if let (Some(key), None) = (ctx.key, &pin) {
                let why = if role == Role::Inherited {
                    "inherited from its parent session"
                } else {
                    "pinned on first success"
                };
                let seen = self.store.claim_pin(
                    provider,
                    key,
                    &id,
                    Some(thread),
                    now,
                    s.pin_lifetime_ms,
                    s.pin_cap,
                    why,
                )?;
                let other = seen.account != id;
                pin = Some(seen);
                if other {
                    // A concurrent request of the same new session claimed it first: follow it.
                    continue;
                }
            }
            let Some(state) = states.iter().find(|a| a.id == id) else {
                break;
            };
            if let Some(until) = state.unusable_until(now) {
                // Only the pin is chosen while held: wait out a short hold once, else detour.
                let remaining = until - now;
                if remaining <= s.inline_wait_ms && !waited.contains(&id) {
                    if let Raced::Gone = unless_gone(self.env, self.env.sleep(remaining)).await {
                        self.note_attempt(ctx, self.env.now(), &id, None, CANCELLED)?;
                        return self.cancelled(ctx, pin.as_ref(), Some(&id));
                    }
                    waited.push(id);
                    continue;
                }
                attempted.push(id.clone());
                outcomes.push((id.clone(), AttemptOutcome::Hold));
                failure = Some(hold_failure(state, until, now));
                self.note_attempt(ctx, now, &id, None, AttemptOutcome::Hold.as_str())?;
                previous = Some(id);
                continue;
            }
            attempted.push(id.clone());
            previous = Some(id.clone());
            match self.attempt(ctx, state, &mut waited).await? {
                Attempt::Respond { response, served } => {
                    let now = self.env.now();
                    // What this outcome changes is one commit (one WAL write, one lock).
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        let mut outcome = if served { "served" } else { "passed-through" };
                        if served {
                            let detour = self.commit(
                                ctx,
                                thread,
                                &id,
                                pin.as_ref(),
                                cursor.as_deref(),
                                &outcomes,
                                now,
                            )?;
                            if detour {
                                outcome = "detour";
                            }
                        } else if let Some(p) = pin.as_ref().filter(|p| p.claimed) {
                            store.release_claim(
                                provider,
                                ctx.key.unwrap_or_default(),
                                p.generation,
                            )?;
                        }
                        self.note_attempt(ctx, now, &id, Some(response.status), outcome)
                    })?;
                    return Ok(self.relay(ctx, &id, response));
                }
                Attempt::Cancelled { status } => {
                    // Recorded, and nothing else: no pin, cursor or failure of this request
                    // is committed.
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        self.note_attempt(ctx, self.env.now(), &id, status, CANCELLED)
                    })?;
                    return self.cancelled(ctx, pin.as_ref(), Some(&id));
                }
                Attempt::Failed {
                    outcome,
                    failure: f,
                } => {
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        self.note_attempt(
                            ctx,
                            self.env.now(),
                            &id,
                            f.as_ref().map(|f| f.status),
                            outcome.as_str(),
                        )
                    })?;
                    outcomes.push((id, outcome));
                    if f.is_some() {
                        failure = f;
                    }
                }
            }
        }

        // Nothing served: commit nothing.
        if let (Some(key), Some(p)) = (ctx.key, pin.as_ref().filter(|p| p.claimed)) {
            self.store.release_claim(provider, key, p.generation)?;
        }
        let now = self.env.now();
        let error = match failure {
            Some(f) => f,
            None => {
                let states = self.store.accounts(Some(provider))?;
                let verdict = policy::verdict(&states, ctx.family, threshold, now);
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
                error
            }
        };
        Ok(Response::pool(provider, &error))
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
        self.env.log(
            Level::Info,
            CANCELLED_MESSAGE,
            &[
                ("provider", ctx.provider.to_string()),
                ("account", account.unwrap_or("none").to_owned()),
                ("attempts", self.sends.get().to_string()),
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
        outcome: &str,
    ) -> Result<(), DbError> {
        match ctx.key {
            Some(key) => self
                .store
                .record_attempt(ctx.provider, key, at, account, status, outcome),
            None => Ok(()),
        }
    }

    fn relay(
        &self,
        ctx: &Ctx<'_>,
        account: &str,
        response: UpstreamResponse<U::Body>,
    ) -> Response<U::Body> {
        let mut headers = Headers::new();
        for (n, v) in response.headers.iter() {
            if http::forward_response_header(n) {
                headers.push(n, v);
            }
        }
        let relay = Relay::new(
            response.body,
            ctx.provider,
            response.headers.get("content-type"),
        )
        .for_account(account);
        Response {
            status: response.status,
            headers,
            body: Body::Stream(relay),
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
