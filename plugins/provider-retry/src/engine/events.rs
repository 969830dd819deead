//! The turn events (WIT `turn-events`): a failed turn becomes a decision (policy) and a
//! row, a watch or a declined chain; a succeeded turn resolves its chain and makes the
//! thread's other open chains stale.

use pooler_plugin_kit::Db;

use super::{Engine, Freshness, non_empty};
use crate::policy::{self, Decision, PoolAnswer};
use crate::ports::Level;
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{Action, PluginError, Trigger, TurnFailedEvent, TurnSucceededEvent};

impl<D: Db> Engine<'_, D> {
    /// A turn failed: decide, then schedule, watch or decline, and record it. Idempotent per
    /// (thread, failed request).
    pub fn turn_failed(&self, event: &TurnFailedEvent) -> Result<(), PluginError> {
        non_empty("thread", &event.thread)?;
        non_empty("failed-request", &event.failed_request)?;
        non_empty("original-request", &event.original_request)?;
        if event.attempt == 0 {
            return Err(PluginError::InvalidInput(
                "attempt 0 (attempts start at 1)".into(),
            ));
        }
        if store::is_processed(self.db, "failed", &event.thread, &event.failed_request)? {
            return Ok(());
        }
        let now = self.clock.now();
        let settings = Settings::load(self.db)?;
        let freshness = self.freshness_of(&event.thread, &event.failed_request)?;
        self.db.transaction(|db| {
            // A newer failure of the thread supersedes any other chain still open on it.
            for other in store::chains_of_thread(db, &event.thread)? {
                if other.state.is_open() && other.original_request != event.original_request {
                    self.close(other, "stale: newer request", &Trigger::Failure, now, None)?;
                }
            }
            let mut chain = match store::find_chain(db, &event.thread, &event.original_request)? {
                Some(existing) => existing,
                None => Chain {
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
                },
            };
            // A row still live for an earlier failure of this chain retries a request that
            // is no longer the latest: it must not run alongside the new decision.
            if let (ChainState::Scheduled, Some(row)) = (chain.state, chain.row_id) {
                self.cancel_row(row, "superseded by a newer failure")?;
            }
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

            let thread = match freshness {
                Freshness::Stale(cause) => {
                    chain.reason = cause.clone();
                    chain.id = store::save_chain(db, &chain)?;
                    self.record(
                        &chain,
                        now,
                        &Trigger::Failure,
                        None,
                        Action::Declined,
                        &cause,
                    )?;
                    store::mark_processed(db, "failed", &event.thread, &event.failed_request, now)?;
                    return Ok(());
                }
                Freshness::Fresh(thread) => thread,
            };
            let opted_out = thread.retry_opt_out;
            let answer = if policy::wants_availability(event, &settings, opted_out) {
                self.ask_pool(&chain, &settings)
            } else {
                PoolAnswer::NotAsked
            };
            let seen = answer.seen();
            chain.last_availability = seen;
            let decision = policy::decide(event, opted_out, answer, &settings, now, self.random);
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
            store::mark_processed(db, "failed", &event.thread, &event.failed_request, now)?;
            Ok(())
        })
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
