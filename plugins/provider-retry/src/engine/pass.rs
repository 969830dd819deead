//! The re-evaluation pass (spec §3): on an availability change, at start and on the
//! fallback tick, every open candidate concerned is re-evaluated against its thread and the
//! pool's current answer, in chunks that read ahead and move rows in one call each.

use std::collections::HashMap;

use pooler_plugin_kit::Db;
use pooler_plugin_kit::time::after;

use super::steps::{Outcome, PendingMove};
use super::{Engine, Freshness, query_of};
use crate::policy::{
    PoolAnswer, ScheduleReason, WatchReason, backoff_send_at, beyond_maximum_wait, reset_send_at,
};
use crate::ports::{AvailabilityQuery, Level, RowMove};
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{
    Action, Availability, AvailabilityChange, PluginError, ThreadInfo, ThreadsError, Timestamp,
    Trigger,
};

/// Key of the last full re-evaluation pass (start or tick) in the `meta` table.
const LAST_PASS: &str = "last-pass-at";

/// Candidates re-evaluated per database transaction in a pass.
pub const PASS_CHUNK: usize = 4096;
/// The result of a re-evaluation pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassSummary {
    /// Open candidates looked at.
    pub examined: usize,
    /// Rows created from watches.
    pub created: usize,
    /// Rows moved (earlier or later).
    pub moved: usize,
    /// Candidates closed (stale, expired, opted out).
    pub closed: usize,
    /// Candidates whose re-evaluation failed (left as they were; the next pass retries).
    pub failed: usize,
}
/// What a pass reads ahead and defers for one chunk of candidates: a pass over N candidates
/// makes a few calls per chunk into the core and the pool, not a few per candidate (one
/// availability change can concern thousands of rows).
#[derive(Default)]
pub(super) struct Chunk {
    /// The chunk's threads, read with one `get-threads` (taken on use).
    pub(super) threads: HashMap<String, Result<ThreadInfo, ThreadsError>>,
    /// The pool's answers for the chunk's rate-limited candidates, by chain (taken on use).
    pub(super) answers: HashMap<i64, PoolAnswer>,
    /// Row moves waiting for the chunk's `reschedule-many`; `None` outside a pass (a move
    /// is then made at once).
    pub(super) moves: Option<Vec<PendingMove>>,
}

impl<D: Db> Engine<'_, D> {
    /// The pool's availability for `change.provider` may have changed: re-evaluate that
    /// provider's open candidates.
    pub fn availability_changed(
        &self,
        change: &AvailabilityChange,
    ) -> Result<PassSummary, PluginError> {
        let chains = store::open_chains(self.db, Some(change.provider))?;
        self.pass(
            chains,
            &Trigger::Signal(change.causes.clone()),
            self.clock.now(),
        )
    }

    /// The host started: re-evaluate every open candidate before any row comes due.
    pub fn on_start(&self, now: Timestamp) -> Result<PassSummary, PluginError> {
        let chains = store::open_chains(self.db, None)?;
        let summary = self.pass(chains, &Trigger::Start, now);
        store::set_meta_time(self.db, LAST_PASS, now)?;
        summary
    }

    /// The host's fallback tick: re-evaluate every open candidate when the re-evaluation
    /// interval has passed since the last full pass. `None` when it was not yet time.
    pub fn on_tick(&self, now: Timestamp) -> Result<Option<PassSummary>, PluginError> {
        let settings = Settings::load(self.db)?;
        if let Some(last) = store::meta_time(self.db, LAST_PASS)?
            && now.saturating_sub(last) < settings.reevaluation_interval_ms
        {
            return Ok(None);
        }
        let chains = store::open_chains(self.db, None)?;
        store::set_meta_time(self.db, LAST_PASS, now)?;
        if chains.is_empty() {
            return Ok(None);
        }
        self.pass(chains, &Trigger::Tick, now).map(Some)
    }

    fn pass(
        &self,
        chains: Vec<Chain>,
        trigger: &Trigger,
        now: Timestamp,
    ) -> Result<PassSummary, PluginError> {
        let settings = Settings::load(self.db)?;
        let mut summary = PassSummary::default();
        let mut first_error = None;
        let mut chains = chains.into_iter().peekable();
        while chains.peek().is_some() {
            let chunk: Vec<Chain> = chains.by_ref().take(PASS_CHUNK).collect();
            self.read_ahead(&chunk, &settings);
            // One commit per chunk rather than per candidate (a file database syncs on every
            // commit); a savepoint per candidate keeps each one's writes all-or-nothing. The
            // chunk's row moves reach the core (one commit there) before this commit.
            let result = self.db.transaction(|db| {
                for chain in chunk {
                    summary.examined += 1;
                    let (thread, id) = (chain.thread.clone(), chain.id);
                    let outcome =
                        self.in_savepoint(db, || self.reevaluate(chain, trigger, now, &settings))?;
                    self.count(&mut summary, &mut first_error, &thread, id, outcome);
                }
                let moves = self.chunk.borrow_mut().moves.take().unwrap_or_default();
                self.send_moves(db, moves, &mut summary, &mut first_error)
            });
            *self.chunk.borrow_mut() = Chunk::default();
            result?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    }

    /// Read what a chunk's candidates need, two calls for the whole chunk: their threads
    /// (`get-threads`) and, for the rate-limited ones, the pool's answers (`query-many`,
    /// bounded as one query is: a slower answer is `source-unavailable` for all of them).
    /// Row moves are deferred until the chunk's end.
    fn read_ahead(&self, chunk: &[Chain], s: &Settings) {
        let mut ahead = Chunk {
            moves: Some(Vec::new()),
            ..Chunk::default()
        };
        let mut threads: Vec<&str> = chunk.iter().map(|c| c.thread.as_str()).collect();
        threads.sort_unstable();
        threads.dedup();
        for (thread, info) in threads.iter().zip(self.threads.get_threads(&threads)) {
            ahead.threads.insert((*thread).to_owned(), info);
        }
        let asked: Vec<&Chain> = chunk.iter().filter(|c| c.rate_limited).collect();
        if !asked.is_empty() {
            let queries: Vec<AvailabilityQuery> = asked.iter().map(|c| query_of(c)).collect();
            let answers = self.timed_query(&queries, s, ("chains", asked.len().to_string()));
            for (chain, answer) in asked.iter().zip(answers) {
                ahead.answers.insert(chain.id, answer);
            }
        }
        *self.chunk.borrow_mut() = ahead;
    }

    /// Ask the pool `queries`, bounded by the availability timeout: one answer per query,
    /// `Failed` for all of them when the call failed or was too slow. `about` names the
    /// queries in the log line (`thread`, or the number of `chains`).
    pub(super) fn timed_query(
        &self,
        queries: &[AvailabilityQuery],
        s: &Settings,
        about: (&str, String),
    ) -> Vec<PoolAnswer> {
        let started = self.clock.monotonic_ms();
        let result = self.pool.query_many(queries);
        let took = self.clock.monotonic_ms().saturating_sub(started);
        let failed = |message: &str, detail: (&str, String)| {
            self.log.log(Level::Warn, message, &[about.clone(), detail]);
            vec![PoolAnswer::Failed; queries.len()]
        };
        match result {
            Ok(answers) if answers.len() != queries.len() => failed(
                "availability answers do not match the queries",
                ("answers", answers.len().to_string()),
            ),
            Ok(answers) if took <= s.availability_timeout_ms => {
                answers.into_iter().map(PoolAnswer::Answered).collect()
            }
            Ok(_) => failed("availability answer too slow", ("ms", took.to_string())),
            Err(e) => failed("availability query failed", ("error", e)),
        }
    }

    /// Run one candidate's step inside a savepoint: its writes are kept when it succeeds and
    /// undone when it fails. The outer error is the database failing the savepoint itself.
    fn in_savepoint(
        &self,
        db: &D,
        step: impl FnOnce() -> Result<Outcome, PluginError>,
    ) -> Result<Result<Outcome, PluginError>, PluginError> {
        // `execute`, not `execute_batch`: a host can keep single statements prepared.
        db.execute("SAVEPOINT candidate", &[])?;
        let outcome = step();
        if outcome.is_err() {
            db.execute("ROLLBACK TO candidate", &[])?;
        }
        db.execute("RELEASE candidate", &[])?;
        Ok(outcome)
    }

    /// Count one candidate's outcome. One candidate's failure must not hold up the others:
    /// it is left as it was, and the next pass (tick, signal or due check) retries it.
    fn count(
        &self,
        summary: &mut PassSummary,
        first_error: &mut Option<PluginError>,
        thread: &str,
        id: i64,
        outcome: Result<Outcome, PluginError>,
    ) {
        match outcome {
            Ok(Outcome::Unchanged | Outcome::Deferred) => {}
            Ok(Outcome::Created) => summary.created += 1,
            Ok(Outcome::Moved) => summary.moved += 1,
            Ok(Outcome::Closed) => summary.closed += 1,
            Err(e) => {
                summary.failed += 1;
                self.log.log(
                    Level::Warn,
                    "re-evaluation failed",
                    &[
                        ("thread", thread.to_owned()),
                        ("chain", id.to_string()),
                        ("error", e.to_string()),
                    ],
                );
                first_error.get_or_insert(e);
            }
        }
    }

    /// Send a chunk's deferred row moves to the core in one `reschedule-many`, then record
    /// each one's result (a candidate per savepoint, as in the pass).
    fn send_moves(
        &self,
        db: &D,
        moves: Vec<PendingMove>,
        summary: &mut PassSummary,
        first_error: &mut Option<PluginError>,
    ) -> Result<(), PluginError> {
        if moves.is_empty() {
            return Ok(());
        }
        let requests: Vec<RowMove> = moves
            .iter()
            .map(|m| RowMove {
                thread: m.chain.thread.clone(),
                row: m.row,
                send_at: m.send_at,
                reason: m.reason.clone(),
            })
            .collect();
        let mut results = self.threads.reschedule_many(&requests).into_iter();
        for pending in moves {
            let (thread, id) = (pending.chain.thread.clone(), pending.chain.id);
            let result = results.next().unwrap_or_else(|| {
                Err(ThreadsError::Storage(
                    "the core answered fewer moves than were sent".into(),
                ))
            });
            let outcome = self.in_savepoint(db, || self.finish_move(pending, result))?;
            self.count(summary, first_error, &thread, id, outcome);
        }
        Ok(())
    }

    /// Re-evaluate one open candidate (spec §3): expiry, freshness, opt-out, then for rate
    /// limits the pool's current answer.
    fn reevaluate(
        &self,
        mut chain: Chain,
        trigger: &Trigger,
        now: Timestamp,
        s: &Settings,
    ) -> Result<Outcome, PluginError> {
        if chain.state == ChainState::Watching
            && s.expiry(chain.chain_started_at).is_some_and(|e| now > e)
        {
            self.close(chain, "expired: maximum wait passed", trigger, now, None)?;
            return Ok(Outcome::Closed);
        }
        let thread = match self.freshness_of(&chain.thread, &chain.failed_request)? {
            Freshness::Stale(cause) => {
                self.close(chain, &cause, trigger, now, None)?;
                return Ok(Outcome::Closed);
            }
            Freshness::Fresh(thread) => thread,
        };
        if thread.retry_opt_out {
            self.close(chain, "opted-out", trigger, now, None)?;
            return Ok(Outcome::Closed);
        }
        if !chain.rate_limited {
            // Temporary-failure rows wait out their backoff; the pool has no say over them.
            return Ok(Outcome::Unchanged);
        }
        let answer = self.ask_pool(&chain, s);
        let stored = chain.clone();
        let seen = answer.seen();
        let availability_changed = seen != chain.last_availability;
        chain.last_availability = seen;
        chain.updated_at = now;
        let watching = chain.state == ChainState::Watching;
        match (answer, chain.send_at) {
            (PoolAnswer::Answered(Availability::Ready), current) => {
                // A row already inside the "ready" window (now + buffer + jitter) stays, so
                // repeated signals do not shuffle rows that are about to go.
                let window_end = after(after(now, s.reset_buffer_ms), s.reset_jitter_ms);
                let target = reset_send_at(now, now, s, self.random);
                let reason = ScheduleReason::PoolReady.to_string();
                if watching {
                    return self.create_row(chain, target, &reason, trigger, seen, now);
                }
                if current.is_some_and(|c| c > window_end) {
                    return self.move_row(
                        chain,
                        target,
                        &reason,
                        trigger,
                        seen,
                        now,
                        Outcome::Moved,
                    );
                }
            }
            (PoolAnswer::Answered(Availability::Blocked { retry_at, .. }), current) => {
                if beyond_maximum_wait(retry_at, chain.chain_started_at, s) {
                    if watching {
                        chain.reason = WatchReason::BeyondMaximumWait.to_string();
                    } else {
                        self.close(
                            chain,
                            "expired: pool blocked beyond maximum wait",
                            trigger,
                            now,
                            seen,
                        )?;
                        return Ok(Outcome::Closed);
                    }
                } else {
                    let base = after(retry_at.max(now), s.reset_buffer_ms);
                    let target = reset_send_at(retry_at, now, s, self.random);
                    let reason = ScheduleReason::PoolBlocked.to_string();
                    if watching {
                        return self.create_row(chain, target, &reason, trigger, seen, now);
                    }
                    // Earlier or later: only a row outside the window of this reset moves.
                    if current.is_some_and(|c| c < base || c > after(base, s.reset_jitter_ms)) {
                        return self.move_row(
                            chain,
                            target,
                            &reason,
                            trigger,
                            seen,
                            now,
                            Outcome::Moved,
                        );
                    }
                }
            }
            (PoolAnswer::Answered(Availability::NotRouted), _) => {
                // The pool no longer routes the thread; with nothing else known, a watch
                // falls back to the backoff a not-routed rate limit gets. A row keeps its time.
                if watching {
                    let target = backoff_send_at(chain.failed_attempt, now, s, self.random);
                    let reason = ScheduleReason::RateLimitBackoff.to_string();
                    return self.create_row(chain, target, &reason, trigger, seen, now);
                }
            }
            (PoolAnswer::Answered(Availability::Unavailable(reason)), _) => {
                if watching {
                    chain.reason = match reason {
                        crate::types::UnavailableReason::SourceUnavailable => {
                            WatchReason::SourceUnavailable
                        }
                        other => WatchReason::PoolUnavailable(other),
                    }
                    .to_string();
                }
            }
            (PoolAnswer::Failed | PoolAnswer::NotAsked, _) => {
                if watching {
                    chain.reason = WatchReason::SourceUnavailable.to_string();
                }
            }
        }
        // Nothing moved. Write the record only when more than its time changed (a tick
        // re-evaluates every open candidate), and the history only when the pool's answer
        // differs from the last one seen, so it shows what changed without a line per tick.
        if chain
            != (Chain {
                updated_at: chain.updated_at,
                ..stored
            })
        {
            store::save_chain(self.db, &chain)?;
        }
        if availability_changed {
            self.record(&chain, now, trigger, seen, Action::Unchanged, &chain.reason)?;
        }
        Ok(Outcome::Unchanged)
    }
}
