//! The turn events (WIT `turn-events`): a failed turn becomes a decision (policy) and a
//! row, a watch or a declined chain; a succeeded turn resolves its chain and makes the
//! thread's other open chains stale.

use pooler_plugin_kit::Db;

use super::{Engine, Freshness, non_empty};
use crate::policy::{self, Decision, PoolAnswer};
use crate::ports::Level;
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{
    Action, Availability, PluginError, Timestamp, Trigger, TurnFailedEvent, TurnSucceededEvent,
};

impl<D: Db> Engine<'_, D> {
    /// A turn failed: decide, then schedule, watch or decline, and record it. Idempotent per
    /// (thread, failed request).
    pub fn turn_failed(&self, event: &TurnFailedEvent) -> Result<(), PluginError> {
        validate_failed(event)?;
        if store::is_processed(self.db, "failed", &event.thread, &event.failed_request)? {
            return Ok(());
        }
        let now = self.clock.now();
        let settings = Settings::load(self.db)?;
        let freshness = self.freshness_of(&event.thread, &event.failed_request)?;
        self.db.transaction(|db| {
            self.close_superseded(db, event, now)?;
            let mut chain = self.chain_of_failure(db, event, now)?;
            match freshness {
                Freshness::Stale(cause) => self.decline_stale(db, chain, &cause, now)?,
                Freshness::Fresh(thread) => {
                    let opted_out = thread.retry_opt_out;
                    let (decision, seen) =
                        self.decide_failure(event, &mut chain, opted_out, &settings, now);
                    self.apply_decision(db, chain, decision, seen, now)?;
                }
            }
            store::mark_processed(db, "failed", &event.thread, &event.failed_request, now)?;
            Ok(())
        })
    }

    /// A newer failure of the thread supersedes any other chain still open on it.
    fn close_superseded(
        &self,
        db: &D,
        event: &TurnFailedEvent,
        now: Timestamp,
    ) -> Result<(), PluginError> {
        for other in store::chains_of_thread(db, &event.thread)? {
            if other.state.is_open() && other.original_request != event.original_request {
                self.close(other, "stale: newer request", &Trigger::Failure, now, None)?;
            }
        }
        Ok(())
    }

    /// The failure's chain (found, or new), holding the failure and no row: a row still live
    /// for an earlier failure of the chain is cancelled.
    fn chain_of_failure(
        &self,
        db: &D,
        event: &TurnFailedEvent,
        now: Timestamp,
    ) -> Result<Chain, PluginError> {
        let mut chain = match store::find_chain(db, &event.thread, &event.original_request)? {
            Some(existing) => existing,
            None => new_chain(event, now),
        };
        // A row still live for an earlier failure of this chain retries a request that
        // is no longer the latest: it must not run alongside the new decision.
        if let (ChainState::Scheduled, Some(row)) = (chain.state, chain.row_id) {
            self.cancel_row(&chain.thread, row, "superseded by a newer failure")?;
        }
        absorb_failure(&mut chain, event, now);
        Ok(chain)
    }

    /// The failure is no longer the thread's current one: decline it, with the cause.
    fn decline_stale(
        &self,
        db: &D,
        mut chain: Chain,
        cause: &str,
        now: Timestamp,
    ) -> Result<(), PluginError> {
        chain.reason = cause.to_owned();
        chain.id = store::save_chain(db, &chain)?;
        self.record(
            &chain,
            now,
            &Trigger::Failure,
            None,
            Action::Declined,
            cause,
        )
    }

    /// Ask the pool when the policy wants its answer, note what it said on the chain, decide,
    /// and log the decision.
    fn decide_failure(
        &self,
        event: &TurnFailedEvent,
        chain: &mut Chain,
        opted_out: bool,
        settings: &Settings,
        now: Timestamp,
    ) -> (Decision, Option<Availability>) {
        let answer = if policy::wants_availability(event, settings, opted_out) {
            self.ask_pool(chain, settings)
        } else {
            PoolAnswer::NotAsked
        };
        let seen = answer.seen();
        chain.last_availability = seen;
        let decision = policy::decide(event, opted_out, answer, settings, now, self.random);
        self.log.log(
            Level::Info,
            "retry decision",
            &[
                ("thread", event.thread.clone()),
                ("request", event.failed_request.clone()),
                ("attempt", event.attempt.to_string()),
                ("decision", format!("{decision:?}")),
            ],
        );
        (decision, seen)
    }

    /// Carry out a decision: schedule a row, watch, or decline; save the chain and record it.
    fn apply_decision(
        &self,
        db: &D,
        mut chain: Chain,
        decision: Decision,
        seen: Option<Availability>,
        now: Timestamp,
    ) -> Result<(), PluginError> {
        match decision {
            Decision::Schedule { send_at, reason } => {
                chain.id = store::save_chain(db, &chain)?;
                self.create_row(
                    chain,
                    send_at,
                    &reason.to_string(),
                    &Trigger::Failure,
                    seen,
                    now,
                )?;
            }
            Decision::Watch(reason) => {
                chain.state = ChainState::Watching;
                chain.rate_limited = true;
                chain.reason = reason.to_string();
                chain.id = store::save_chain(db, &chain)?;
                self.record(
                    &chain,
                    now,
                    &Trigger::Failure,
                    seen,
                    Action::Watching,
                    &chain.reason,
                )?;
            }
            Decision::Decline(reason) => {
                chain.reason = reason.to_string();
                chain.id = store::save_chain(db, &chain)?;
                self.record(
                    &chain,
                    now,
                    &Trigger::Failure,
                    seen,
                    Action::Declined,
                    &chain.reason,
                )?;
            }
        }
        Ok(())
    }

    /// A turn succeeded: its chain is resolved, and any other open chain of the thread is
    /// stale (the thread has moved on). Idempotent per (thread, request).
    pub fn turn_succeeded(&self, event: &TurnSucceededEvent) -> Result<(), PluginError> {
        non_empty("thread", &event.thread)?;
        non_empty("request", &event.request)?;
        if store::is_processed(self.db, "succeeded", &event.thread, &event.request)? {
            return Ok(());
        }
        let now = self.clock.now();
        self.db.transaction(|db| {
            for chain in store::chains_of_thread(db, &event.thread)? {
                if chain.original_request == event.original_request {
                    if chain.state != ChainState::Resolved {
                        let reason = format!("succeeded as attempt {}", event.attempt);
                        self.close(chain, &reason, &Trigger::Dispatch, now, None)?;
                    }
                } else if chain.state.is_open() {
                    self.close(
                        chain,
                        "stale: newer request succeeded",
                        &Trigger::Dispatch,
                        now,
                        None,
                    )?;
                }
            }
            store::mark_processed(db, "succeeded", &event.thread, &event.request, now)?;
            Ok(())
        })
    }
}

/// The event's own checks: named ids present, attempts counted from 1.
fn validate_failed(event: &TurnFailedEvent) -> Result<(), PluginError> {
    non_empty("thread", &event.thread)?;
    non_empty("failed-request", &event.failed_request)?;
    non_empty("original-request", &event.original_request)?;
    if event.attempt == 0 {
        return Err(PluginError::InvalidInput(
            "attempt 0 (attempts start at 1)".into(),
        ));
    }
    Ok(())
}

/// A chain for a failure seen for the first time; [`absorb_failure`] fills in the rest.
fn new_chain(event: &TurnFailedEvent, now: Timestamp) -> Chain {
    Chain {
        id: 0,
        thread: event.thread.clone(),
        original_request: event.original_request.clone(),
        failed_request: event.failed_request.clone(),
        provider: event.provider,
        model: None,
        failed_attempt: event.attempt,
        chain_started_at: event.chain_started_at,
        failed_at: event.failed_at,
        category: None,
        http_status: None,
        retry_after: None,
        rate_limited: false,
        routed_by_pool: false,
        last_availability: None,
        state: ChainState::Resolved,
        row_id: None,
        send_at: None,
        reason: String::new(),
        updated_at: now,
    }
}

/// Make the chain hold this failure, with no row and nothing decided yet.
fn absorb_failure(chain: &mut Chain, event: &TurnFailedEvent, now: Timestamp) {
    let failure = event.failure.as_ref();
    chain.failed_request = event.failed_request.clone();
    chain.provider = event.provider;
    chain.model = event.model.clone();
    chain.failed_attempt = event.attempt;
    chain.chain_started_at = event.chain_started_at;
    chain.failed_at = event.failed_at;
    chain.category = failure.map(|f| f.category);
    chain.http_status = failure.and_then(|f| f.http_status);
    chain.retry_after = failure.and_then(|f| f.retry_after);
    chain.rate_limited = failure.is_some_and(policy::is_rate_limited);
    chain.routed_by_pool = event.routed_by_pool;
    chain.row_id = None;
    chain.send_at = None;
    chain.state = ChainState::Resolved;
    chain.updated_at = now;
}
