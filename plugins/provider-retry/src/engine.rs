//! The engine: what the plugin does on each host call. It turns failures into decisions
//! (policy), keeps the decisions true as the pool changes (re-evaluation, spec §3), answers
//! the dispatch gate and the admin calls, and records every step in the chain's history.
//!
//! State is read from and written to the database on every call (nothing is kept in memory).
//! Each event, and each candidate of a re-evaluation pass, is handled in one database
//! transaction; calls into the core (`threads`) cannot join that transaction, so every core
//! refusal that a crash between the two could cause (`already-queued`, `no-such-row`) is
//! handled by adopting what the core has.

use std::cell::RefCell;
use std::collections::HashMap;

use pooler_plugin_kit::Db;

use crate::policy::{
    self, Decision, PoolAnswer, Random, ScheduleReason, WatchReason, backoff_send_at,
    beyond_maximum_wait, reset_send_at,
};
use crate::ports::{AvailabilityQuery, AvailabilitySource, Clock, Level, Log, RowMove, Threads};
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{
    Action, AdminError, Availability, AvailabilityChange, Candidate, CandidateState, ChainHistory,
    DispatchVerdict, HistoryEntry, PluginError, QueuedRow, ThreadInfo, ThreadStatus, ThreadsError,
    Timestamp, Trigger, TurnFailedEvent, TurnSucceededEvent,
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

/// What re-evaluating one candidate did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Unchanged,
    Created,
    Moved,
    Closed,
    /// Its row's move waits for the chunk's one `reschedule-many`; counted when it returns.
    Deferred,
}

/// A row move decided during a pass, sent to the core with the rest of its chunk.
struct PendingMove {
    /// The chain's live row.
    row: u64,
    chain: Chain,
    send_at: Timestamp,
    reason: String,
    trigger: Trigger,
    seen: Option<Availability>,
    now: Timestamp,
    /// What the candidate counts as when the move succeeds: `Moved` for a scheduled chain
    /// whose stored record differs only in what a move changes (`store::save_move`), or
    /// `Created` for a watch that adopted a live row (saved whole).
    on_success: Outcome,
}

/// What a pass reads ahead and defers for one chunk of candidates: a pass over N candidates
/// makes a few calls per chunk into the core and the pool, not a few per candidate (one
/// availability change can concern thousands of rows; issue 5).
#[derive(Default)]
struct Chunk {
    /// The chunk's threads, read with one `get-threads` (taken on use).
    threads: HashMap<String, Result<ThreadInfo, ThreadsError>>,
    /// The pool's answers for the chunk's rate-limited candidates, by chain (taken on use).
    answers: HashMap<i64, PoolAnswer>,
    /// Row moves waiting for the chunk's `reschedule-many`; `None` outside a pass (a move
    /// is then made at once).
    moves: Option<Vec<PendingMove>>,
}

/// Whether a chain is still the thread's current failure.
enum Freshness {
    Fresh(ThreadInfo),
    /// Stale, with the cause in stable words (`stale: newer request`).
    Stale(String),
}

/// The engine over its host capabilities. Cheap to build; build one per host call.
pub struct Engine<'a, D: Db> {
    pub db: &'a D,
    pub threads: &'a dyn Threads,
    pub pool: &'a dyn AvailabilitySource,
    pub clock: &'a dyn Clock,
    pub random: &'a dyn Random,
    pub log: &'a dyn Log,
    /// The chunk of a pass in progress (empty otherwise).
    chunk: RefCell<Chunk>,
}

fn dependency(e: ThreadsError) -> PluginError {
    match e {
        ThreadsError::Storage(m) => PluginError::Dependency(format!("core storage: {m}")),
        other => PluginError::Dependency(format!("threads: {other}")),
    }
}

fn candidate(chain: &Chain) -> Option<Candidate> {
    let state = match chain.state {
        ChainState::Scheduled => CandidateState::Scheduled,
        ChainState::Watching => CandidateState::Watching,
        ChainState::Dispatched | ChainState::Resolved => return None,
    };
    Some(Candidate {
        thread: chain.thread.clone(),
        original_request: chain.original_request.clone(),
        failed_request: chain.failed_request.clone(),
        state,
        row: chain.row_id,
        send_at: chain.send_at,
        next_attempt: chain.failed_attempt + 1,
        reason: chain.reason.clone(),
        chain_started_at: chain.chain_started_at,
    })
}

/// The pool query about a chain's thread.
fn query_of(chain: &Chain) -> AvailabilityQuery {
    AvailabilityQuery {
        thread: chain.thread.clone(),
        provider: chain.provider,
        request: Some(chain.failed_request.clone()),
        model: chain.model.clone(),
    }
}

fn non_empty(what: &str, value: &str) -> Result<(), PluginError> {
    if value.is_empty() {
        return Err(PluginError::InvalidInput(format!("{what} is empty")));
    }
    Ok(())
}

impl<'a, D: Db> Engine<'a, D> {
    pub fn new(
        db: &'a D,
        threads: &'a dyn Threads,
        pool: &'a dyn AvailabilitySource,
        clock: &'a dyn Clock,
        random: &'a dyn Random,
        log: &'a dyn Log,
    ) -> Self {
        Engine {
            db,
            threads,
            pool,
            clock,
            random,
            log,
            chunk: RefCell::default(),
        }
    }

    // ----- events -------------------------------------------------------------------------

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

    // ----- re-evaluation ------------------------------------------------------------------

    /// The pool's availability for `change.provider` may have changed: re-evaluate that
    /// provider's open candidates.
    pub fn availability_changed(
        &self,
        change: &AvailabilityChange,
    ) -> Result<PassSummary, PluginError> {
        let causes: Vec<&str> = change.causes.iter().map(|c| c.words()).collect();
        let chains = store::open_chains(self.db, Some(change.provider))?;
        self.pass(
            chains,
            &Trigger::Signal(causes.join(", ")),
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
    fn timed_query(
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
                let window_end = now + s.reset_buffer_ms + s.reset_jitter_ms;
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
                    let base = retry_at.max(now) + s.reset_buffer_ms;
                    let target = reset_send_at(retry_at, now, s, self.random);
                    let reason = ScheduleReason::PoolBlocked.to_string();
                    if watching {
                        return self.create_row(chain, target, &reason, trigger, seen, now);
                    }
                    // Earlier or later: only a row outside the window of this reset moves.
                    if current.is_some_and(|c| c < base || c > base + s.reset_jitter_ms) {
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

    // ----- the dispatch gate --------------------------------------------------------------

    /// A retry row came due and passed the concurrency gate: proceed, postpone or drop it
    /// after a fresh check. Postponing never spends an attempt.
    pub fn before_dispatch(&self, row: &QueuedRow) -> Result<DispatchVerdict, PluginError> {
        let now = self.clock.now();
        let s = Settings::load(self.db)?;
        self.db.transaction(|db| {
            let found = match store::find_chain_by_row(db, row.id)? {
                Some(c) => Some(c),
                None => store::find_chain(db, &row.thread, &row.original_request)?,
            };
            let Some(mut chain) = found else {
                // A row this plugin holds no chain for (its state was lost, or another
                // component scheduled it): still never send a stale one.
                return Ok(match self.freshness_of(&row.thread, &row.failed_request)? {
                    Freshness::Stale(cause) => DispatchVerdict::Drop(cause),
                    Freshness::Fresh(t) if t.retry_opt_out => {
                        DispatchVerdict::Drop("opted-out".into())
                    }
                    Freshness::Fresh(_) => DispatchVerdict::Proceed,
                });
            };
            if chain.state == ChainState::Resolved {
                // Closed earlier (its cancel did not reach the core): the row must not run.
                return Ok(DispatchVerdict::Drop(chain.reason.clone()));
            }
            chain.state = ChainState::Scheduled;
            chain.row_id = Some(row.id);
            chain.send_at = Some(row.send_at);
            chain.updated_at = now;
            match self.freshness_of(&chain.thread, &chain.failed_request)? {
                Freshness::Stale(cause) => {
                    return self.drop_due(chain, &cause, now, None);
                }
                Freshness::Fresh(t) if t.retry_opt_out => {
                    return self.drop_due(chain, "opted-out", now, None);
                }
                Freshness::Fresh(_) => {}
            }
            if !chain.rate_limited {
                return self.proceed(chain, row.attempt, now, None);
            }
            let answer = self.ask_pool(&chain, &s);
            let seen = answer.seen();
            chain.last_availability = seen;
            let expiry = s.expiry(chain.chain_started_at);
            match answer {
                PoolAnswer::Answered(Availability::Ready | Availability::NotRouted) => {
                    self.proceed(chain, row.attempt, now, seen)
                }
                PoolAnswer::Answered(Availability::Blocked { retry_at, .. }) if retry_at <= now => {
                    self.proceed(chain, row.attempt, now, seen)
                }
                PoolAnswer::Answered(Availability::Blocked { retry_at, .. }) => {
                    if beyond_maximum_wait(retry_at, chain.chain_started_at, &s) {
                        return self.drop_due(
                            chain,
                            "expired: pool blocked beyond maximum wait",
                            now,
                            seen,
                        );
                    }
                    let target = reset_send_at(retry_at, now, &s, self.random);
                    self.postpone(chain, row.send_at, target, "still blocked", now, seen)
                }
                PoolAnswer::Answered(Availability::Unavailable(_))
                | PoolAnswer::Failed
                | PoolAnswer::NotAsked => {
                    if expiry.is_some_and(|e| now >= e) {
                        return self.drop_due(
                            chain,
                            "expired: pool unavailable until maximum wait",
                            now,
                            seen,
                        );
                    }
                    let later = now + s.reevaluation_interval_ms;
                    let target = expiry.map_or(later, |e| later.min(e));
                    self.postpone(chain, row.send_at, target, "pool unavailable", now, seen)
                }
            }
        })
    }

    fn proceed(
        &self,
        mut chain: Chain,
        attempt: u32,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.state = ChainState::Dispatched;
        chain.row_id = None;
        chain.reason = format!("dispatched as attempt {attempt}");
        store::save_chain(self.db, &chain)?;
        self.record(
            &chain,
            now,
            &Trigger::Due,
            seen,
            Action::Dispatched(attempt),
            "passed the dispatch gates",
        )?;
        Ok(DispatchVerdict::Proceed)
    }

    fn postpone(
        &self,
        mut chain: Chain,
        old: Timestamp,
        new: Timestamp,
        why: &str,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.send_at = Some(new);
        store::save_chain(self.db, &chain)?;
        self.record(
            &chain,
            now,
            &Trigger::Due,
            seen,
            Action::Rescheduled(old, new),
            why,
        )?;
        Ok(DispatchVerdict::WaitUntil(new))
    }

    /// Drop a due row: the core removes it on our verdict, so no `cancel` call.
    fn drop_due(
        &self,
        mut chain: Chain,
        cause: &str,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.state = ChainState::Resolved;
        chain.row_id = None;
        chain.send_at = None;
        chain.reason = cause.to_owned();
        if seen.is_some() {
            chain.last_availability = seen;
        }
        store::save_chain(self.db, &chain)?;
        self.record(&chain, now, &Trigger::Due, seen, Action::Dropped, cause)?;
        Ok(DispatchVerdict::Drop(cause.to_owned()))
    }

    // ----- admin --------------------------------------------------------------------------

    /// Open candidates of one thread or all, by next send time, watches last.
    pub fn status(&self, thread: Option<&str>) -> Result<Vec<Candidate>, AdminError> {
        let chains = match thread {
            Some(t) => store::chains_of_thread(self.db, t)?,
            None => store::open_chains(self.db, None)?,
        };
        let mut list: Vec<Candidate> = chains.iter().filter_map(candidate).collect();
        list.sort_by_key(|c| (c.send_at.is_none(), c.send_at));
        Ok(list)
    }

    /// The histories of a thread's chains, oldest chain first.
    pub fn explain(&self, thread: &str) -> Result<Vec<ChainHistory>, AdminError> {
        let chains = store::chains_of_thread(self.db, thread)?;
        if chains.is_empty() {
            return Err(AdminError::UnknownThread(thread.to_owned()));
        }
        chains
            .into_iter()
            .map(|c| {
                Ok(ChainHistory {
                    entries: store::history(self.db, c.id)?,
                    thread: c.thread,
                    original_request: c.original_request,
                })
            })
            .collect()
    }

    /// Cancel the thread's open candidate on a person's behalf; returns it as it was.
    pub fn cancel(&self, thread: &str, now: Timestamp) -> Result<Candidate, AdminError> {
        let chain = self.open_chain_of(thread)?;
        let before = candidate(&chain);
        self.db.transaction(|_| {
            self.close(chain, "cancelled by a person", &Trigger::Person, now, None)
        })?;
        before.ok_or_else(|| AdminError::NothingPending(thread.to_owned()))
    }

    /// A person sent the thread's row now, bypassing the gates; record it.
    pub fn sent_by_person(&self, thread: &str, row: u64, now: Timestamp) -> Result<(), AdminError> {
        let mut chain = match store::find_chain_by_row(self.db, row)? {
            Some(c) if c.thread == thread => c,
            _ => self.open_chain_of(thread)?,
        };
        let attempt = chain.failed_attempt + 1;
        chain.state = ChainState::Dispatched;
        chain.row_id = None;
        chain.reason = format!("sent now by a person as attempt {attempt}");
        chain.updated_at = now;
        self.db.transaction(|db| {
            store::save_chain(db, &chain)?;
            self.record(
                &chain,
                now,
                &Trigger::Person,
                None,
                Action::Dispatched(attempt),
                "sent now by a person, bypassing the gates",
            )
        })?;
        Ok(())
    }

    fn open_chain_of(&self, thread: &str) -> Result<Chain, AdminError> {
        let chains = store::chains_of_thread(self.db, thread)?;
        if chains.is_empty() {
            return Err(AdminError::UnknownThread(thread.to_owned()));
        }
        chains
            .into_iter()
            .rev()
            .find(|c| c.state.is_open())
            .ok_or_else(|| AdminError::NothingPending(thread.to_owned()))
    }

    // ----- shared steps -------------------------------------------------------------------

    /// Ask the pool about a chain's thread, bounded by the availability timeout: an error or
    /// a slower answer is `Failed` (source-unavailable). A pass asked ahead for its chunk.
    fn ask_pool(&self, chain: &Chain, s: &Settings) -> PoolAnswer {
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
    fn freshness_of(&self, thread: &str, failed_request: &str) -> Result<Freshness, PluginError> {
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
    fn create_row(
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
    fn move_row(
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
        let result = self
            .threads
            .reschedule(pending.row, pending.send_at, &pending.reason);
        self.finish_move(pending, result)
    }

    /// Record what the core did with a move.
    fn finish_move(
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

    fn cancel_row(&self, row: u64, reason: &str) -> Result<(), PluginError> {
        match self.threads.cancel(row, reason) {
            // Already gone is what we wanted.
            Ok(()) | Err(ThreadsError::NoSuchRow(_)) => Ok(()),
            Err(e) => Err(dependency(e)),
        }
    }

    /// Close a chain for good: cancel its live row (if any) and record why.
    fn close(
        &self,
        mut chain: Chain,
        reason: &str,
        trigger: &Trigger,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<(), PluginError> {
        let action = match (chain.state, chain.row_id) {
            (ChainState::Scheduled, Some(row)) => {
                self.cancel_row(row, reason)?;
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

    fn record(
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
        Ok(())
    }
}
