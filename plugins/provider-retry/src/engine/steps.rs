//! The steps the events, the pass and the gate share: asking the pool, checking a chain's
//! freshness, creating, moving and cancelling its row (adopting what the core has when a
//! refusal says an earlier delivery already did it), closing it, and recording its history.

use pooler_plugin_kit::Db;

use super::{Engine, Freshness, dependency, query_of};
use crate::policy::PoolAnswer;
use crate::ports::Level;
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{
    Action, Availability, HistoryEntry, PluginError, QueuedRow, ThreadStatus, ThreadsError,
    Timestamp, Trigger,
};

/// What re-evaluating one candidate did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Unchanged,
    Created,
    Moved,
    Closed,
    /// Its row's move waits for the chunk's one `reschedule-many`; counted when it returns.
    Deferred,
}
/// A row move decided during a pass, sent to the core with the rest of its chunk.
pub(super) struct PendingMove {
    /// The chain's live row.
    pub(super) row: u64,
    pub(super) chain: Chain,
    pub(super) send_at: Timestamp,
    pub(super) reason: String,
    pub(super) trigger: Trigger,
    pub(super) seen: Option<Availability>,
    pub(super) now: Timestamp,
    /// What the candidate counts as when the move succeeds: `Moved` for a scheduled chain
    /// whose stored record differs only in what a move changes (`store::save_move`), or
    /// `Created` for a watch that adopted a live row (saved whole).
    pub(super) on_success: Outcome,
}

impl<D: Db> Engine<'_, D> {
    /// Ask the pool about a chain's thread, bounded by the availability timeout: an error or
    /// a slower answer is `Failed` (source-unavailable). A pass asked ahead for its chunk.
    pub(super) fn ask_pool(&self, chain: &Chain, s: &Settings) -> PoolAnswer {
        if let Some(answer) = self.chunk.borrow_mut().answers.remove(&chain.id) {
            return answer;
        }
        let query = query_of(chain);
        self.timed_query(
            std::slice::from_ref(&query),
            s,
            ("thread", chain.thread.clone()),
        )
        .pop()
        .unwrap_or(PoolAnswer::Failed)
    }

    /// Is the chain with this failed request still the thread's current failure?
    pub(super) fn freshness_of(
        &self,
        thread: &str,
        failed_request: &str,
    ) -> Result<Freshness, PluginError> {
        let read_ahead = self.chunk.borrow_mut().threads.remove(thread);
        let info = match read_ahead.unwrap_or_else(|| self.threads.get_thread(thread)) {
            Ok(info) => info,
            Err(ThreadsError::NoSuchThread(_)) => {
                return Ok(Freshness::Stale("stale: thread deleted".into()));
            }
            Err(ThreadsError::Archived) => {
                return Ok(Freshness::Stale("stale: thread archived".into()));
            }
            Err(e) => return Err(dependency(e)),
        };
        let cause = if info.archived {
            "stale: thread archived"
        } else if info.latest_request.as_deref() != Some(failed_request) {
            "stale: newer request"
        } else if info.status != ThreadStatus::Error {
            match info.status {
                ThreadStatus::Active => "stale: thread active",
                _ => "stale: thread idle",
            }
        } else if info.input_queued {
            "stale: newer input queued"
        } else {
            return Ok(Freshness::Fresh(info));
        };
        Ok(Freshness::Stale(cause.to_owned()))
    }

    /// Create the chain's one live row at `send_at`. `already-queued` adopts the live row
    /// (an earlier delivery of this call created it) and moves it to `send_at`; refusals
    /// that mean the chain moved on close it as stale.
    pub(super) fn create_row(
        &self,
        mut chain: Chain,
        send_at: Timestamp,
        reason: &str,
        trigger: &Trigger,
        seen: Option<Availability>,
        now: Timestamp,
    ) -> Result<Outcome, PluginError> {
        match self
            .threads
            .schedule_retry(&chain.thread, &chain.failed_request, send_at, reason)
        {
            Ok(row) => {
                chain.state = ChainState::Scheduled;
                chain.row_id = Some(row.id);
                chain.send_at = Some(row.send_at);
                chain.reason = reason.to_owned();
                chain.updated_at = now;
                store::save_chain(self.db, &chain)?;
                self.record(
                    &chain,
                    now,
                    trigger,
                    seen,
                    Action::Scheduled(row.send_at),
                    reason,
                )?;
                Ok(Outcome::Created)
            }
            Err(ThreadsError::AlreadyQueued(id)) => {
                let live = self
                    .threads
                    .list_rows(Some(&chain.thread))
                    .map_err(dependency)?
                    .into_iter()
                    .find(|r| r.id == id);
                let old = live.as_ref().map_or(send_at, |r| r.send_at);
                chain.state = ChainState::Scheduled;
                chain.row_id = Some(id);
                chain.send_at = Some(old);
                chain.reason = reason.to_owned();
                chain.updated_at = now;
                if old == send_at {
                    store::save_chain(self.db, &chain)?;
                    self.record(&chain, now, trigger, seen, Action::Scheduled(old), reason)?;
                    return Ok(Outcome::Created);
                }
                self.move_row(chain, send_at, reason, trigger, seen, now, Outcome::Created)
            }
            Err(ThreadsError::NoFailedTurn) => self
                .close(
                    chain,
                    "stale: not the thread's latest failed turn",
                    trigger,
                    now,
                    seen,
                )
                .map(|()| Outcome::Closed),
            Err(ThreadsError::NoSuchThread(_)) => self
                .close(chain, "stale: thread deleted", trigger, now, seen)
                .map(|()| Outcome::Closed),
            Err(ThreadsError::Archived) => self
                .close(chain, "stale: thread archived", trigger, now, seen)
                .map(|()| Outcome::Closed),
            Err(e) => Err(dependency(e)),
        }
    }

    /// Move the chain's live row to `send_at` (earlier or later), now or, inside a pass, at
    /// the end of the chunk; counted as `on_success` when the core accepts it. If the core
    /// no longer has the row, the chain is closed: it was dispatched or removed without us.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn move_row(
        &self,
        chain: Chain,
        send_at: Timestamp,
        reason: &str,
        trigger: &Trigger,
        seen: Option<Availability>,
        now: Timestamp,
        on_success: Outcome,
    ) -> Result<Outcome, PluginError> {
        let Some(row) = chain.row_id else {
            return self.create_row(chain, send_at, reason, trigger, seen, now);
        };
        self.make_move(PendingMove {
            row,
            chain,
            send_at,
            reason: reason.to_owned(),
            trigger: trigger.clone(),
            seen,
            now,
            on_success,
        })
    }

    /// Make a move now, or, inside a pass, leave it for the chunk's `reschedule-many`.
    fn make_move(&self, pending: PendingMove) -> Result<Outcome, PluginError> {
        if let Some(moves) = self.chunk.borrow_mut().moves.as_mut() {
            moves.push(pending);
            return Ok(Outcome::Deferred);
        }
        let result = self.threads.reschedule(
            &pending.chain.thread,
            pending.row,
            pending.send_at,
            &pending.reason,
        );
        self.finish_move(pending, result)
    }

    /// Record what the core did with a move.
    pub(super) fn finish_move(
        &self,
        pending: PendingMove,
        result: Result<QueuedRow, ThreadsError>,
    ) -> Result<Outcome, PluginError> {
        let PendingMove {
            row: _,
            mut chain,
            send_at,
            reason,
            trigger,
            seen,
            now,
            on_success,
        } = pending;
        let old = chain.send_at.unwrap_or(send_at);
        match result {
            Ok(moved) => {
                chain.send_at = Some(moved.send_at);
                chain.reason = reason.clone();
                chain.updated_at = now;
                if on_success == Outcome::Moved {
                    store::save_move(self.db, &chain)?;
                } else {
                    store::save_chain(self.db, &chain)?;
                }
                self.record(
                    &chain,
                    now,
                    &trigger,
                    seen,
                    Action::Rescheduled(old, moved.send_at),
                    &reason,
                )?;
                Ok(on_success)
            }
            Err(ThreadsError::NoSuchRow(_)) => {
                self.close(chain, "row no longer queued", &trigger, now, seen)?;
                Ok(Outcome::Closed)
            }
            Err(e) => Err(dependency(e)),
        }
    }

    /// Cancel live row `row` of `thread`.
    pub(super) fn cancel_row(
        &self,
        thread: &str,
        row: u64,
        reason: &str,
    ) -> Result<(), PluginError> {
        match self.threads.cancel(thread, row, reason) {
            // Already gone is what we wanted.
            Ok(()) | Err(ThreadsError::NoSuchRow(_)) => Ok(()),
            Err(e) => Err(dependency(e)),
        }
    }

    /// Close a chain for good: cancel its live row (if any) and record why.
    pub(super) fn close(
        &self,
        mut chain: Chain,
        reason: &str,
        trigger: &Trigger,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<(), PluginError> {
        let action = match (chain.state, chain.row_id) {
            (ChainState::Scheduled, Some(row)) => {
                self.cancel_row(&chain.thread, row, reason)?;
                Action::Dropped
            }
            _ => Action::Resolved,
        };
        chain.state = ChainState::Resolved;
        chain.row_id = None;
        chain.send_at = None;
        chain.reason = reason.to_owned();
        chain.updated_at = now;
        if seen.is_some() {
            chain.last_availability = seen;
        }
        store::save_chain(self.db, &chain)?;
        self.record(&chain, now, trigger, seen, action, reason)
    }

    pub(super) fn record(
        &self,
        chain: &Chain,
        at: Timestamp,
        trigger: &Trigger,
        availability: Option<Availability>,
        action: Action,
        reason: &str,
    ) -> Result<(), PluginError> {
        store::add_history(
            self.db,
            chain.id,
            &HistoryEntry {
                at,
                trigger: trigger.clone(),
                availability,
                action,
                reason: reason.to_owned(),
            },
        )?;
        self.report_step(chain, trigger, action, reason);
        Ok(())
    }

    /// Every recorded step, for people: one log line (info; debug for `unchanged`, which a
    /// re-evaluation pass records for every candidate it leaves be) and the counters
    /// `pooler_retry_decisions_total{kind,trigger}` and, for a moved row,
    /// `pooler_retry_rows_moved_total{direction}` (`earlier` or `later`).
    fn report_step(&self, chain: &Chain, trigger: &Trigger, action: Action, reason: &str) {
        let kind = action_word(action);
        let trigger = trigger_word(trigger);
        self.metrics.counter_add(
            "pooler_retry_decisions_total",
            &[("kind", kind), ("trigger", trigger)],
            1,
        );
        let mut fields = vec![
            ("thread", chain.thread.clone()),
            ("request", chain.failed_request.clone()),
            ("kind", kind.to_owned()),
            ("trigger", trigger.to_owned()),
            ("reason", reason.to_owned()),
        ];
        match action {
            Action::Rescheduled(old, new) if old != new => {
                let direction = if new < old { "earlier" } else { "later" };
                self.metrics.counter_add(
                    "pooler_retry_rows_moved_total",
                    &[("direction", direction)],
                    1,
                );
                fields.push(("direction", direction.to_owned()));
                fields.push(("send_at", new.to_string()));
            }
            Action::Scheduled(at) => fields.push(("send_at", at.to_string())),
            _ => {}
        }
        let level = if action == Action::Unchanged {
            Level::Debug
        } else {
            Level::Info
        };
        self.log.log(level, "retry step", &fields);
    }
}

/// An action's stable word (the `kind` label).
fn action_word(action: Action) -> &'static str {
    match action {
        Action::Scheduled(_) => "scheduled",
        Action::Rescheduled(..) => "rescheduled",
        Action::Watching => "watching",
        Action::Declined => "declined",
        Action::Dropped => "dropped",
        Action::Dispatched(_) => "dispatched",
        Action::Resolved => "resolved",
        Action::Unchanged => "unchanged",
    }
}

/// A trigger's stable word (the `trigger` label).
fn trigger_word(trigger: &Trigger) -> &'static str {
    match trigger {
        Trigger::Failure => "failure",
        Trigger::Signal(_) => "signal",
        Trigger::Start => "start",
        Trigger::Tick => "tick",
        Trigger::Due => "due",
        Trigger::Person => "person",
        Trigger::Dispatch => "dispatch",
    }
}
