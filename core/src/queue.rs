//! The durable retry queue: the WIT `threads` operations plugins call (`schedule-retry`,
//! `reschedule`, `cancel`, `list-rows`) and the due loop the host drives.
//!
//! A row's wait state is `time` (waiting for `send_at`), `waiting-for-slot` (due, but the
//! concurrency limit was full) or `claimed` (handed to the host for its `before-dispatch`
//! gate). The due loop is:
//!
//! ```text
//! claim_due(now) ──► host asks the plugin's before-dispatch ──┬─ proceed    ─► dispatch(claim)
//!                                                              ├─ wait-until ─► postpone(claim, t)
//!                                                              └─ drop       ─► drop_row(claim, why)
//! ```
//!
//! Exactly once: `dispatch` creates the turn request and deletes the row in one
//! transaction, guarded by the claim's generation. A claimed row is still a live row (so the
//! chain cannot get a second one), and a row a crash left claimed is released by
//! [`Core::recover`] and gated again; since the row still exists, its dispatch never
//! committed.

use rusqlite::{Transaction, params};

use crate::error::{CoreError, ThreadsError};
use crate::ids;
use crate::model::*;
use crate::store::{self, Actor, CachedSql, Core, LiveRow};
use crate::threads::{CONTINUE_INPUT, start_request};

/// The longest `reason` a row may carry, in characters.
pub const MAX_REASON_CHARS: usize = 200;

/// A due row handed to the host for its dispatch gate. Only the holder of the current claim
/// can dispatch, postpone or drop it; any change to the row in between voids the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub row: QueuedRow,
    generation: u64,
}

fn validate_reason(reason: &str) -> Result<(), ThreadsError> {
    let chars = reason.chars().count();
    if chars == 0 || chars > MAX_REASON_CHARS {
        return Err(ThreadsError::InvalidArgument(format!(
            "reason must be 1–{MAX_REASON_CHARS} characters, got {chars}"
        )));
    }
    Ok(())
}

fn live_row(tx: &Transaction<'_>, id: RowId) -> Result<LiveRow, ThreadsError> {
    store::load_row(tx, id)?.ok_or(ThreadsError::NoSuchRow(id))
}

/// Live row `id`, if it is a row of `thread`: read in the caller's transaction, so the
/// check and the write that follows it see the same row.
fn live_row_of(tx: &Transaction<'_>, thread: &str, id: RowId) -> Result<LiveRow, ThreadsError> {
    let live = live_row(tx, id)?;
    if live.row.thread != thread {
        return Err(ThreadsError::RowOfOtherThread {
            row: id,
            owner: live.row.thread,
        });
    }
    Ok(live)
}

/// Moves live row `id` of `thread` to `send_at` (voiding any claim), with its history entry.
/// Refused with `no-such-row` or `row-of-other-thread` before any write.
fn move_row(
    tx: &Transaction<'_>,
    thread: &str,
    id: RowId,
    send_at: Timestamp,
    reason: &str,
    now: Timestamp,
) -> Result<QueuedRow, ThreadsError> {
    let live = live_row_of(tx, thread, id)?;
    tx.exec(
        "UPDATE queued_rows SET send_at = ?2, reason = ?3, wait_state = 'time',
                claim_gen = claim_gen + 1, claimed_at = NULL, updated_at = ?4
         WHERE id = ?1",
        params![id, send_at, reason, now],
    )?;
    store::add_history(
        tx,
        now,
        &live.row.thread,
        Some(id),
        Some(&live.row.original_request),
        Actor::Plugin,
        "rescheduled",
        Some(send_at),
        Some(&format!("{} → {send_at}: {reason}", live.row.send_at)),
    )?;
    let mut row = live.row;
    row.send_at = send_at;
    row.reason = reason.to_owned();
    row.waiting_for_slot = false;
    Ok(row)
}

/// The row behind `claim`, if the claim is still the current one.
fn claimed_row(tx: &Transaction<'_>, claim: &Claim) -> Result<LiveRow, CoreError> {
    let live = store::load_row(tx, claim.row.id)?.ok_or(CoreError::ClaimLost(claim.row.id))?;
    if live.wait_state != "claimed" || live.claim_gen != claim.generation {
        return Err(CoreError::ClaimLost(claim.row.id));
    }
    Ok(live)
}

impl Core {
    /// `threads.schedule-retry`: queues a retry of `failed_request` at `send_at`.
    ///
    /// Refused with `no-failed-turn` unless the thread is in `error` and `failed_request` is
    /// its latest request; with `already-queued(row)` while the chain has a live row (also
    /// while that row is claimed for dispatch). The row's attempt is the failed attempt + 1.
    /// Concurrent calls for one chain, from any number of connections, create one row: the
    /// check runs in an immediate transaction, and a UNIQUE index on the chain backs it.
    pub fn schedule_retry(
        &self,
        thread: &str,
        failed_request: &str,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        validate_reason(reason)?;
        let now = self.now();
        let result = self.write(|tx| {
            let t = store::load_thread(tx, thread)?
                .ok_or_else(|| ThreadsError::NoSuchThread(thread.to_string()))?;
            if t.archived {
                return Err(ThreadsError::Archived);
            }
            if t.status != ThreadStatus::Error
                || store::latest_request(tx, thread)?.as_deref() != Some(failed_request)
            {
                return Err(ThreadsError::NoFailedTurn);
            }
            let failed =
                store::load_request(tx, failed_request)?.ok_or(ThreadsError::NoFailedTurn)?;
            if let Some(existing) = existing_row(tx, &failed.original_request)? {
                return Err(ThreadsError::AlreadyQueued(existing));
            }
            let inserted = tx.exec(
                "INSERT INTO queued_rows (thread_id, original_request, failed_request, attempt,
                                          send_at, reason, wait_state, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'time', ?7, ?7)",
                params![
                    thread,
                    failed.original_request,
                    failed_request,
                    failed.attempt + 1,
                    send_at,
                    reason,
                    now
                ],
            );
            match inserted {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => {
                    let existing = existing_row(tx, &failed.original_request)?;
                    return Err(existing.map_or(
                        ThreadsError::Storage(e.to_string()),
                        ThreadsError::AlreadyQueued,
                    ));
                }
                Err(e) => return Err(e.into()),
            }
            let id = tx.last_insert_rowid() as RowId;
            store::add_history(
                tx,
                now,
                thread,
                Some(id),
                Some(&failed.original_request),
                Actor::Plugin,
                "scheduled",
                Some(send_at),
                Some(reason),
            )?;
            Ok(live_row(tx, id)?.row)
        });
        if let Ok(row) = &result {
            tracing::info!(
                thread,
                row = row.id,
                attempt = row.attempt,
                send_at,
                "retry scheduled"
            );
        }
        result
    }

    /// `threads.reschedule`: moves live row `row` of `thread` to `send_at`. Spends no
    /// attempt, creates no row. A row claimed for dispatch is taken back (its claim is void),
    /// so the move wins over a dispatch that has not committed yet. A live row of another
    /// thread is refused with [`ThreadsError::RowOfOtherThread`], checked in the move's own
    /// transaction, and left as it was.
    pub fn reschedule(
        &self,
        thread: &str,
        row: RowId,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        validate_reason(reason)?;
        let now = self.now();
        self.write(|tx| move_row(tx, thread, row, send_at, reason, now))
    }

    /// `threads.reschedule-many`: each move as [`Core::reschedule`] would make it, one
    /// answer per move in order, all in one commit. A refused move changes nothing and does
    /// not stop the others; a database failure answers `storage` for every move, and nothing
    /// moved.
    pub fn reschedule_many(&self, moves: &[RowMove]) -> Vec<Result<QueuedRow, ThreadsError>> {
        let now = self.now();
        let done = self.write(|tx| {
            let mut answers = Vec::with_capacity(moves.len());
            for m in moves {
                let answer = validate_reason(&m.reason)
                    .and_then(|()| move_row(tx, &m.thread, m.row, m.send_at, &m.reason, now));
                if let Err(ThreadsError::Storage(e)) = answer {
                    return Err(ThreadsError::Storage(e));
                }
                answers.push(answer);
            }
            Ok(answers)
        });
        done.unwrap_or_else(|e| vec![Err(e); moves.len()])
    }

    /// `threads.cancel`: removes live row `row` of `thread` without dispatching it. A live
    /// row of another thread is refused with [`ThreadsError::RowOfOtherThread`] (checked in
    /// the same transaction) and left as it was.
    pub fn cancel(&self, thread: &str, row: RowId, reason: &str) -> Result<(), ThreadsError> {
        validate_reason(reason)?;
        let now = self.now();
        self.write(|tx| {
            let live = live_row_of(tx, thread, row)?;
            store::remove_row(tx, now, &live.row, Actor::Plugin, "cancelled", reason)?;
            Ok(())
        })
    }

    /// `threads.list-rows`: the live rows of one thread, or of all, ordered by send time.
    pub fn list_rows(&self, thread: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError> {
        self.read(|c| {
            if let Some(t) = thread
                && store::load_thread(c, t)?.is_none()
            {
                return Err(ThreadsError::NoSuchThread(t.to_string()));
            }
            Ok(store::list_rows(c, thread)?)
        })
    }

    /// The earliest `send_at` of a row waiting for its time, or the earliest expiry of a
    /// claim's lease (see [`Core::set_claim_lease`]), whichever comes first: for the host's
    /// due-loop sleep. Rows waiting for a slot are not included: they are due already, and
    /// become claimable when a turn finishes.
    pub fn next_due_at(&self) -> Result<Option<Timestamp>, CoreError> {
        let lease = self.claim_lease_ms();
        self.read(|c| {
            let send: Option<Timestamp> = c.row(
                "SELECT MIN(send_at) FROM queued_rows WHERE wait_state = 'time'",
                [],
                |r| r.get(0),
            )?;
            let claimed: Option<Timestamp> = c.row(
                "SELECT MIN(claimed_at) FROM queued_rows WHERE wait_state = 'claimed'",
                [],
                |r| r.get(0),
            )?;
            let expiry = claimed.map(|at| at.saturating_add(lease));
            Ok(match (send, expiry) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
    }

    /// Claims the rows whose time has come (`send_at <= now`, or already waiting for a
    /// slot), oldest send time first, at most one per thread, skipping archived threads and
    /// threads running a turn. Each claim takes a concurrency slot (running turns + claimed
    /// rows ≤ limit); a due row that meets a full limit is marked waiting-for-slot and
    /// claimed by a later call. The host must then ask `before-dispatch` and answer with
    /// [`Core::dispatch`], [`Core::postpone`] or [`Core::drop_row`].
    ///
    /// First, claims older than the lease ([`Core::set_claim_lease`]) are released: a
    /// verdict that could not be recorded (its `postpone` or `drop` failed) would otherwise
    /// keep the row claimed, and holding a slot, until a restart. The old claim is void
    /// from then on, so the row is never dispatched twice.
    pub fn claim_due(&self, now: Timestamp) -> Result<Vec<Claim>, CoreError> {
        let lease = self.claim_lease_ms();
        self.write(|tx| {
            release_expired_claims(tx, now, lease)?;
            let limit = store::concurrency_limit(tx)?;
            let mut free = limit.saturating_sub(store::busy_slots(tx)?);
            let due: Vec<LiveRow> = {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {} FROM queued_rows q JOIN threads t ON t.id = q.thread_id
                     WHERE ((q.wait_state = 'time' AND q.send_at <= ?1)
                            OR q.wait_state = 'waiting-for-slot')
                       AND t.archived = 0 AND t.status != 'active'
                       AND NOT EXISTS (SELECT 1 FROM queued_rows c
                                       WHERE c.thread_id = q.thread_id
                                         AND c.wait_state = 'claimed')
                     ORDER BY q.send_at, q.id",
                    prefixed_row_columns()
                ))?;
                stmt.query_map([now], store::live_row_from)?
                    .collect::<Result<_, _>>()?
            };
            let mut claims = Vec::new();
            let mut claimed_threads = std::collections::HashSet::new();
            for live in due {
                if claimed_threads.contains(&live.row.thread) {
                    continue;
                }
                if free == 0 {
                    if live.wait_state != "waiting-for-slot" {
                        tx.exec(
                            "UPDATE queued_rows SET wait_state = 'waiting-for-slot', updated_at = ?2
                             WHERE id = ?1",
                            params![live.row.id, now],
                        )?;
                        store::add_history(
                            tx,
                            now,
                            &live.row.thread,
                            Some(live.row.id),
                            Some(&live.row.original_request),
                            Actor::Core,
                            "waiting-for-slot",
                            Some(live.row.send_at),
                            Some(&format!("{limit} of {limit} turns running")),
                        )?;
                    }
                    continue;
                }
                let generation = live.claim_gen + 1;
                tx.exec(
                    "UPDATE queued_rows SET wait_state = 'claimed', claim_gen = ?2,
                            claimed_at = ?3, updated_at = ?3
                     WHERE id = ?1",
                    params![live.row.id, generation, now],
                )?;
                free -= 1;
                claimed_threads.insert(live.row.thread.clone());
                let mut row = live.row;
                row.waiting_for_slot = false;
                claims.push(Claim { row, generation });
            }
            Ok(claims)
        })
    }

    /// `proceed`: turns the claimed row into the chain's next turn request (attempt n + 1,
    /// the failed request's input — or "Please continue." when the provider had accepted
    /// it) and deletes the row, in one transaction. Returns the turn to run.
    ///
    /// Fails with `ClaimLost` when the row changed since the claim (nothing happens),
    /// `Archived` when the thread was archived meanwhile (the row is dropped), `ThreadBusy`
    /// when a turn started on the thread meanwhile (the row goes back to the queue).
    pub fn dispatch(&self, claim: &Claim) -> Result<TurnPlan, CoreError> {
        let now = self.now();
        // Refusals that change the row must commit, so they are returned as values here
        // and turned into errors after the transaction.
        // Durable: the turn is sent to the provider next; a power loss must not bring the
        // row back to be dispatched a second time.
        let outcome =
            self.write_durable(|tx| -> Result<Result<TurnPlan, CoreError>, CoreError> {
                let live = claimed_row(tx, claim)?;
                let thread = store::load_thread(tx, &live.row.thread)?
                    .ok_or_else(|| CoreError::NoSuchThread(live.row.thread.clone()))?;
                if thread.archived {
                    store::remove_row(
                        tx,
                        now,
                        &live.row,
                        Actor::Core,
                        "dropped",
                        "thread archived",
                    )?;
                    return Ok(Err(CoreError::Archived));
                }
                if thread.status == ThreadStatus::Active {
                    tx.exec(
                        "UPDATE queued_rows SET wait_state = 'time', claim_gen = claim_gen + 1,
                            claimed_at = NULL, updated_at = ?2 WHERE id = ?1",
                        params![live.row.id, now],
                    )?;
                    return Ok(Err(CoreError::ThreadBusy(thread.id)));
                }
                let plan = dispatch_row(tx, &live, TurnTrigger::Retry, Actor::Core, now)?;
                Ok(Ok(plan))
            })?;
        let plan = outcome?;
        tracing::info!(
            thread = %plan.thread,
            request = %plan.request,
            attempt = plan.attempt,
            "retry dispatched"
        );
        Ok(plan)
    }

    /// `wait-until(t)`: moves the claimed row to `until` and back to waiting for its time.
    /// No attempt is spent.
    pub fn postpone(
        &self,
        claim: &Claim,
        until: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, CoreError> {
        let now = self.now();
        self.write(|tx| {
            let live = claimed_row(tx, claim)?;
            tx.exec(
                "UPDATE queued_rows SET send_at = ?2, wait_state = 'time',
                        claim_gen = claim_gen + 1, claimed_at = NULL, updated_at = ?3
                 WHERE id = ?1",
                params![live.row.id, until, now],
            )?;
            store::add_history(
                tx,
                now,
                &live.row.thread,
                Some(live.row.id),
                Some(&live.row.original_request),
                Actor::Plugin,
                "postponed",
                Some(until),
                Some(reason),
            )?;
            Ok(live_row(tx, live.row.id)?.row)
        })
    }

    /// `drop(reason)`: removes the claimed row without dispatching it.
    pub fn drop_row(&self, claim: &Claim, reason: &str) -> Result<(), CoreError> {
        let now = self.now();
        self.write(|tx| {
            let live = claimed_row(tx, claim)?;
            store::remove_row(tx, now, &live.row, Actor::Plugin, "dropped", reason)?;
            Ok(())
        })
    }

    /// A person's send-now: dispatches the thread's live retry row at once, bypassing its
    /// send time, the concurrency limit and every `before-dispatch` gate, and records it in
    /// the history. It does not bypass the core's own waits: an archived thread or one
    /// running a turn is refused. A claim the host holds on the row becomes void.
    pub fn send_now(&self, thread: &str, now: Timestamp) -> Result<TurnPlan, CoreError> {
        self.send_now_row(thread, now).map(|(_, plan)| plan)
    }

    /// [`Core::send_now`], also returning the id of the row it dispatched (the host tells
    /// the retry plugin which row a person sent).
    pub fn send_now_row(
        &self,
        thread: &str,
        now: Timestamp,
    ) -> Result<(RowId, TurnPlan), CoreError> {
        // Durable, as `dispatch`: the turn is sent next.
        let (row, plan) = self.write_durable(|tx| {
            let t = store::load_thread(tx, thread)?
                .ok_or_else(|| CoreError::NoSuchThread(thread.to_string()))?;
            if t.archived {
                return Err(CoreError::Archived);
            }
            let live = tx
                .row(
                    &format!(
                        "SELECT {} FROM queued_rows WHERE thread_id = ?1
                         ORDER BY send_at, id LIMIT 1",
                        store::ROW_COLUMNS
                    ),
                    [thread],
                    store::live_row_from,
                )
                .map_err(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => {
                        CoreError::NoPendingRetry(thread.to_string())
                    }
                    e => e.into(),
                })?;
            if t.status == ThreadStatus::Active {
                return Err(CoreError::ThreadBusy(thread.to_string()));
            }
            let plan = dispatch_row(tx, &live, TurnTrigger::SendNow, Actor::Person, now)?;
            Ok((live.row.id, plan))
        })?;
        tracing::info!(thread, row, request = %plan.request, attempt = plan.attempt, "retry sent now by a person");
        Ok((row, plan))
    }
}

/// Creates the chain's next turn request from a live row, starts it, deletes the row.
fn dispatch_row(
    tx: &Transaction<'_>,
    live: &LiveRow,
    trigger: TurnTrigger,
    actor: Actor,
    now: Timestamp,
) -> Result<TurnPlan, CoreError> {
    let failed = store::load_request(tx, &live.row.failed_request)?
        .ok_or_else(|| CoreError::NoSuchRequest(live.row.failed_request.clone()))?;
    // The failed request's own input, not attempt 1's: when an earlier attempt of the chain
    // was accepted, the failed one was already "Please continue.", and the original input
    // is in the replayed history. An agent CLI keeps the input in its own session even when
    // the provider refused it: resending it would put the person's message there twice.
    let input = if failed.input_accepted || failed.in_agent_session {
        CONTINUE_INPUT.to_string()
    } else {
        failed.input.clone()
    };
    let request = ids::new_id("rq");
    tx.exec(
        "INSERT INTO turn_requests (id, thread_id, input, trigger, original_request, retry_of,
                                    attempt, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            request,
            live.row.thread,
            input,
            trigger.as_str(),
            live.row.original_request,
            live.row.failed_request,
            live.row.attempt,
            now
        ],
    )?;
    let action = if trigger == TurnTrigger::SendNow {
        "send-now"
    } else {
        "dispatched"
    };
    let detail = format!("attempt {} as {request}", live.row.attempt);
    store::remove_row(tx, now, &live.row, actor, action, &detail)?;
    start_request(tx, &live.row.thread, &request, now)
}

/// Releases the claims taken at or before `now - lease`: back to waiting for their time
/// (they are due, so the same pass claims them again under a new generation), with a
/// history entry and a warning.
fn release_expired_claims(
    tx: &Transaction<'_>,
    now: Timestamp,
    lease: u64,
) -> Result<(), CoreError> {
    let Some(cutoff) = now.checked_sub(lease) else {
        return Ok(());
    };
    let expired: Vec<LiveRow> = {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT {} FROM queued_rows
             WHERE wait_state = 'claimed' AND claimed_at <= ?1 ORDER BY id",
            store::ROW_COLUMNS
        ))?;
        stmt.query_map([cutoff], store::live_row_from)?
            .collect::<Result<_, _>>()?
    };
    for live in expired {
        tx.exec(
            "UPDATE queued_rows SET wait_state = 'time', claim_gen = claim_gen + 1,
                    claimed_at = NULL, updated_at = ?2
             WHERE id = ?1",
            params![live.row.id, now],
        )?;
        store::add_history(
            tx,
            now,
            &live.row.thread,
            Some(live.row.id),
            Some(&live.row.original_request),
            Actor::Core,
            "claim-expired",
            Some(live.row.send_at),
            Some(&format!(
                "claimed for {lease} ms without a recorded verdict; gated again"
            )),
        )?;
        tracing::warn!(
            row = live.row.id,
            thread = %live.row.thread,
            lease_ms = lease,
            "a claim outlived its lease (its verdict was not recorded); the row is gated again"
        );
    }
    Ok(())
}

fn existing_row(tx: &Transaction<'_>, original_request: &str) -> rusqlite::Result<Option<RowId>> {
    use rusqlite::OptionalExtension;
    tx.row(
        "SELECT id FROM queued_rows WHERE original_request = ?1",
        [original_request],
        |r| r.get(0),
    )
    .optional()
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    )
}

fn prefixed_row_columns() -> String {
    store::ROW_COLUMNS
        .split(", ")
        .map(|c| format!("q.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::clock::{Clock, ManualClock};

    const T0: Timestamp = 1_790_000_000_000;
    const HOUR: Timestamp = 3_600_000;

    /// A core with `n` threads in error, each with one retry row an hour from now.
    fn queue_of(n: usize) -> (Core, std::path::PathBuf) {
        queue_on(ManualClock::new(T0), n)
    }

    /// [`queue_of`] on a given clock (at T0).
    fn queue_on(clock: Arc<ManualClock>, n: usize) -> (Core, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(ids::new_id("pooler-core-queue"));
        let core = Core::open(&dir, clock).unwrap();
        let outcome = TurnOutcome {
            result: TurnResult::Failed {
                failure: Failure {
                    category: FailureCategory::RateLimit,
                    provider_code: None,
                    http_status: Some(429),
                    origin: FailureOrigin::Pool,
                    retry_after: None,
                    message: None,
                },
                partial_reply: String::new(),
            },
            input_accepted: false,
            rate_limits: None,
            agent_session: None,
            input_in_session: false,
        };
        for i in 0..n {
            let thread = core.new_thread(Provider::Claude, None, None).unwrap();
            core.send(&thread, "hello").unwrap();
            let plan = core.start_turns().unwrap().remove(0);
            core.record_outcome(&plan.request, &outcome).unwrap();
            core.schedule_retry(&thread, &plan.request, T0 + HOUR + i as u64, "later")
                .unwrap();
        }
        (core, dir)
    }

    /// SQLite virtual-machine steps `f` makes on the core's connection: a deterministic
    /// measure of the work a query does.
    fn vm_steps(core: &Core, f: impl FnOnce(&Core)) -> u64 {
        let steps = Arc::new(AtomicU64::new(0));
        let counter = steps.clone();
        core.lock()
            .progress_handler(
                1,
                Some(move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                    false
                }),
            )
            .unwrap();
        f(core);
        core.lock()
            .progress_handler(1, None::<fn() -> bool>)
            .unwrap();
        steps.load(Ordering::Relaxed)
    }

    /// What the due loop does on every wake (start queued turns, claim due rows, find the
    /// next send time) must not grow with the number of rows waiting for later: one
    /// availability change moving N rows wakes it up to N times.
    #[test]
    fn a_due_pass_costs_the_same_with_ten_times_more_future_rows() {
        let pass = |core: &Core| {
            assert!(core.start_turns().unwrap().is_empty());
            assert!(core.claim_due(T0).unwrap().is_empty());
            assert_eq!(core.next_due_at().unwrap(), Some(T0 + HOUR));
        };
        let (small, small_dir) = queue_of(40);
        let (large, large_dir) = queue_of(400);
        let (few, many) = (vm_steps(&small, pass), vm_steps(&large, pass));
        assert!(
            many < few * 2,
            "a due pass took {many} steps with 400 future rows, {few} with 40"
        );
        drop((small, large));
        std::fs::remove_dir_all(small_dir).unwrap();
        std::fs::remove_dir_all(large_dir).unwrap();
    }

    /// A verdict whose `postpone` or `drop` fails (a storage error)
    /// leaves the row claimed, holding a slot. After the claim lease the row is released
    /// and gated again, the old claim is void, and the row is dispatched exactly once.
    #[test]
    fn a_claim_whose_verdict_failed_is_released_after_its_lease_and_dispatched_once() {
        let clock = ManualClock::new(T0);
        let (core, dir) = queue_on(clock.clone(), 2);
        core.set_concurrency_limit(1).unwrap();
        let lease = 60_000;
        core.set_claim_lease(std::time::Duration::from_millis(lease))
            .unwrap();
        clock.set(T0 + HOUR + 1);
        let claimed_at = clock.now_ms();
        let first = core.claim_due(claimed_at).unwrap();
        assert_eq!(first.len(), 1, "one slot");
        let (row, thread) = (first[0].row.id, first[0].row.thread.clone());

        // The storage fails the verdict: no send time moves, no row leaves the queue.
        core.lock()
            .execute_batch(
                "CREATE TEMP TRIGGER fail_moves BEFORE UPDATE OF send_at ON queued_rows
                 BEGIN SELECT RAISE(ABORT, 'injected: disk I/O error'); END;
                 CREATE TEMP TRIGGER fail_deletes BEFORE DELETE ON queued_rows
                 BEGIN SELECT RAISE(ABORT, 'injected: disk I/O error'); END;",
            )
            .unwrap();
        let failed = core.postpone(&first[0], T0 + 2 * HOUR, "before-dispatch: wait-until");
        assert!(matches!(failed, Err(CoreError::Storage(_))), "{failed:?}");

        // Within the lease the row stays claimed and holds the one slot: the other due row
        // waits. The due loop is told to wake when the lease ends.
        clock.set(claimed_at + lease - 1);
        assert!(core.claim_due(clock.now_ms()).unwrap().is_empty());
        assert_eq!(core.next_due_at().unwrap(), Some(claimed_at + lease));

        // At its end the row is released and claimed again, under a new claim.
        clock.set(claimed_at + lease);
        let second = core.claim_due(clock.now_ms()).unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].row.id, row, "the oldest due row, gated again");
        assert_ne!(second[0], first[0]);
        assert!(matches!(
            core.dispatch(&first[0]),
            Err(CoreError::ClaimLost(id)) if id == row
        ));

        // A failing drop is released the same way.
        let failed = core.drop_row(&second[0], "before-dispatch: drop");
        assert!(matches!(failed, Err(CoreError::Storage(_))), "{failed:?}");
        clock.set(claimed_at + 2 * lease);
        let third = core.claim_due(clock.now_ms()).unwrap();
        assert_eq!(third.len(), 1);
        assert_eq!(third[0].row.id, row);

        // Healed storage: the current claim dispatches, once; the older claims cannot.
        core.lock()
            .execute_batch("DROP TRIGGER fail_moves; DROP TRIGGER fail_deletes;")
            .unwrap();
        let plan = core.dispatch(&third[0]).unwrap();
        assert_eq!(plan.attempt, 2);
        for old in [&first[0], &second[0], &third[0]] {
            assert!(matches!(core.dispatch(old), Err(CoreError::ClaimLost(_))));
        }
        let show = core.show(&thread).unwrap();
        let attempts: Vec<u32> = show.turns.iter().map(|t| t.attempt).collect();
        assert_eq!(attempts, [1, 2], "one retry turn, never two");
        let expired = show
            .history
            .iter()
            .filter(|h| h.action == "claim-expired")
            .count();
        assert_eq!(expired, 2, "each release is in the row's history");
        drop(core);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_zero_claim_lease_is_refused() {
        let (core, dir) = queue_of(0);
        assert!(core.set_claim_lease(std::time::Duration::ZERO).is_err());
        assert_eq!(core.claim_lease_ms(), crate::DEFAULT_CLAIM_LEASE_MS);
        drop(core);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
