//! Fakes of the host capabilities for the engine's native tests: a core with threads and the
//! retry queue that enforces the WIT `threads` contract, a scriptable pool, a manual clock, a
//! deterministic random source and a log that keeps its lines.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use pooler_plugin_kit::{Db, DbError, NativeDb, Rows, Value};
use provider_retry::Engine;
use provider_retry::policy::Random;
use provider_retry::ports::{
    AvailabilityQuery, AvailabilitySource, Clock, Level, Log, RowMove, Threads,
};
use provider_retry::store;
use provider_retry::types::{
    Availability, BlockCause, Failure, FailureCategory, FailureOrigin, Provider, QueuedRow,
    RowKind, ThreadInfo, ThreadStatus, ThreadsError, TurnFailedEvent, UnavailableReason,
};

pub const T: u64 = 1_792_756_800_000; // 2026-10-23T12:00:00Z
pub const S: u64 = 1_000;
pub const M: u64 = 60 * S;
pub const H: u64 = 60 * M;

/// The manual host clock; wall and monotonic time move together.
#[derive(Default)]
pub struct FakeClock(pub Cell<u64>);

impl FakeClock {
    pub fn set(&self, at: u64) {
        self.0.set(at);
    }
    pub fn advance(&self, by: u64) {
        self.0.set(self.0.get() + by);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.0.get()
    }
    fn monotonic_ms(&self) -> u64 {
        self.0.get()
    }
}

/// xorshift64*: distinct, reproducible draws.
pub struct SeqRandom(pub Cell<u64>);

impl Random for SeqRandom {
    fn next_u64(&self) -> u64 {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Log lines kept for assertions.
#[derive(Default)]
pub struct Lines(pub RefCell<Vec<(Level, String)>>);

impl Log for Lines {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]) {
        let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0
            .borrow_mut()
            .push((level, format!("{message} {}", fields.join(" "))));
    }
}

/// What the fake pool answers.
#[derive(Clone, Copy, Debug)]
pub enum PoolScript {
    Answer(Availability),
    /// The host could not ask the pool.
    Error,
    /// The answer arrives after this many milliseconds (the clock moves on).
    Slow(Availability, u64),
}

/// A pool that answers every query with its current script and counts the queries.
pub struct FakePool {
    pub script: RefCell<PoolScript>,
    pub queries: RefCell<Vec<AvailabilityQuery>>,
    /// The size of each `query-many` call, in order.
    pub batches: RefCell<Vec<usize>>,
    /// The answer of a `Slow` script moves this clock on.
    pub clock: Rc<FakeClock>,
}

impl FakePool {
    pub fn set(&self, a: Availability) {
        *self.script.borrow_mut() = PoolScript::Answer(a);
    }
    pub fn count(&self) -> usize {
        self.queries.borrow().len()
    }
}

impl AvailabilitySource for FakePool {
    fn query(&self, query: &AvailabilityQuery) -> Result<Availability, String> {
        self.query_many(std::slice::from_ref(query))
            .map(|mut answers| answers.remove(0))
    }

    /// One call for all the queries: a `Slow` script moves the clock once.
    fn query_many(&self, queries: &[AvailabilityQuery]) -> Result<Vec<Availability>, String> {
        self.queries.borrow_mut().extend_from_slice(queries);
        self.batches.borrow_mut().push(queries.len());
        let answer = match *self.script.borrow() {
            PoolScript::Answer(a) => a,
            PoolScript::Error => return Err("account-pool trapped".into()),
            PoolScript::Slow(a, ms) => {
                self.clock.advance(ms);
                a
            }
        };
        Ok(vec![answer; queries.len()])
    }
}

/// One turn request as the fake core knows it.
#[derive(Clone, Debug)]
pub struct Request {
    pub original: String,
    pub attempt: u32,
}

/// The fake core: threads, requests and the retry queue, enforcing the `threads` contract
/// (spec §5): schedule only for the latest failed request of a thread in `error`, one live
/// row per chain, reschedule moves without spending an attempt.
#[derive(Default)]
pub struct FakeCore {
    pub threads: RefCell<HashMap<String, ThreadInfo>>,
    pub requests: RefCell<HashMap<String, Request>>,
    /// Live rows by id.
    pub rows: RefCell<BTreeMap<u64, QueuedRow>>,
    pub next_row: Cell<u64>,
    pub next_request: Cell<u64>,
    /// Every mutating call, in order (`schedule thr_1`, `reschedule 1`, `cancel 1`).
    pub calls: RefCell<Vec<String>>,
    pub now: Cell<u64>,
    /// When set, every call fails with this storage error.
    pub broken: RefCell<Option<String>>,
    /// When set, reading this one thread fails with a storage error.
    pub broken_thread: RefCell<Option<String>>,
    /// When set, moving this one row fails with a storage error.
    pub broken_row: Cell<Option<u64>>,
    /// Every batched call with its size, in order (`get-threads 3`, `reschedule-many 2`).
    pub batches: RefCell<Vec<String>>,
    /// Every move or cancel refused for naming another thread's row ("thread → row of
    /// owner"). The engine must never do that: a `FakeCore` dropped with one fails the test.
    pub foreign: RefCell<Vec<String>>,
}

impl Drop for FakeCore {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(
                self.foreign.get_mut(),
                &Vec::<String>::new(),
                "the engine named rows of other threads"
            );
        }
    }
}

impl FakeCore {
    pub fn add_thread(&self, id: &str, routed: bool) {
        self.threads.borrow_mut().insert(
            id.to_owned(),
            ThreadInfo {
                id: id.to_owned(),
                provider: Provider::Claude,
                model: Some("claude-opus-4-1".into()),
                status: ThreadStatus::Idle,
                archived: false,
                retry_opt_out: false,
                latest_request: None,
                input_queued: false,
                routed_by_pool: routed,
            },
        );
    }

    /// A turn of `thread` ran as `request` (a new chain unless `retry_of` names one) and failed.
    pub fn fail(&self, thread: &str, request: &str, original: &str, attempt: u32) {
        self.requests.borrow_mut().insert(
            request.to_owned(),
            Request {
                original: original.to_owned(),
                attempt,
            },
        );
        let mut threads = self.threads.borrow_mut();
        let t = threads.get_mut(thread).expect("thread");
        t.status = ThreadStatus::Error;
        t.latest_request = Some(request.to_owned());
    }

    pub fn thread_mut(&self, id: &str, f: impl FnOnce(&mut ThreadInfo)) {
        f(self.threads.borrow_mut().get_mut(id).expect("thread"));
    }

    /// The core's due loop dispatched `row`: it becomes a new request of the chain with the
    /// row's attempt, the thread is active. Returns the new request id.
    pub fn dispatch(&self, row: u64) -> String {
        let r = self.take_row(row).expect("live row");
        let n = self.next_request.get() + 1;
        self.next_request.set(n);
        let id = format!("req_retry_{n}");
        self.requests.borrow_mut().insert(
            id.clone(),
            Request {
                original: r.original_request.clone(),
                attempt: r.attempt,
            },
        );
        self.thread_mut(&r.thread, |t| {
            t.status = ThreadStatus::Active;
            t.latest_request = Some(id.clone());
        });
        id
    }

    /// A person (or an agent) started a new turn on the thread, which completed.
    pub fn newer_turn_completed(&self, thread: &str, request: &str) {
        self.requests.borrow_mut().insert(
            request.to_owned(),
            Request {
                original: request.to_owned(),
                attempt: 1,
            },
        );
        self.thread_mut(thread, |t| {
            t.status = ThreadStatus::Idle;
            t.latest_request = Some(request.to_owned());
        });
    }

    /// As the core: a live row of another thread than the one named is refused as
    /// `no-such-row`, and the refusal is kept in `foreign` ("thread named → row of owner").
    fn own_row(&self, thread: &str, row: u64) -> Result<(), ThreadsError> {
        match self.rows.borrow().get(&row) {
            Some(r) if r.thread != thread => {
                self.foreign
                    .borrow_mut()
                    .push(format!("{thread} → {row} of {}", r.thread));
                Err(ThreadsError::NoSuchRow(row))
            }
            _ => Ok(()),
        }
    }

    pub fn take_row(&self, row: u64) -> Option<QueuedRow> {
        self.rows.borrow_mut().remove(&row)
    }

    pub fn row(&self, id: u64) -> Option<QueuedRow> {
        self.rows.borrow().get(&id).cloned()
    }

    pub fn rows_of(&self, thread: &str) -> Vec<QueuedRow> {
        self.rows
            .borrow()
            .values()
            .filter(|r| r.thread == thread)
            .cloned()
            .collect()
    }

    pub fn calls_matching(&self, prefix: &str) -> usize {
        self.calls
            .borrow()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    fn check(&self) -> Result<(), ThreadsError> {
        match &*self.broken.borrow() {
            Some(m) => Err(ThreadsError::Storage(m.clone())),
            None => Ok(()),
        }
    }
}

impl Threads for FakeCore {
    fn get_thread(&self, thread: &str) -> Result<ThreadInfo, ThreadsError> {
        self.check()?;
        if self.broken_thread.borrow().as_deref() == Some(thread) {
            return Err(ThreadsError::Storage(format!("{thread} unreadable")));
        }
        self.threads
            .borrow()
            .get(thread)
            .cloned()
            .ok_or_else(|| ThreadsError::NoSuchThread(thread.to_owned()))
    }

    fn schedule_retry(
        &self,
        thread: &str,
        failed_request: &str,
        send_at: u64,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        self.check()?;
        self.calls.borrow_mut().push(format!("schedule {thread}"));
        let info = self.get_thread(thread)?;
        if info.archived {
            return Err(ThreadsError::Archived);
        }
        if info.status != ThreadStatus::Error
            || info.latest_request.as_deref() != Some(failed_request)
        {
            return Err(ThreadsError::NoFailedTurn);
        }
        if reason.is_empty() || reason.chars().count() > 200 {
            return Err(ThreadsError::InvalidArgument("reason".into()));
        }
        let req = self
            .requests
            .borrow()
            .get(failed_request)
            .cloned()
            .expect("request");
        if let Some(live) = self
            .rows
            .borrow()
            .values()
            .find(|r| r.thread == thread && r.original_request == req.original)
        {
            return Err(ThreadsError::AlreadyQueued(live.id));
        }
        let id = self.next_row.get() + 1;
        self.next_row.set(id);
        let row = QueuedRow {
            id,
            thread: thread.to_owned(),
            kind: RowKind::Retry,
            failed_request: failed_request.to_owned(),
            original_request: req.original,
            attempt: req.attempt + 1,
            send_at,
            reason: reason.to_owned(),
            created_at: self.now.get(),
            waiting_for_slot: false,
        };
        self.rows.borrow_mut().insert(id, row.clone());
        Ok(row)
    }

    fn reschedule(
        &self,
        thread: &str,
        row: u64,
        send_at: u64,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        self.check()?;
        if self.broken_row.get() == Some(row) {
            return Err(ThreadsError::Storage(format!("row {row} unwritable")));
        }
        self.own_row(thread, row)?;
        self.calls.borrow_mut().push(format!("reschedule {row}"));
        let mut rows = self.rows.borrow_mut();
        let r = rows.get_mut(&row).ok_or(ThreadsError::NoSuchRow(row))?;
        r.send_at = send_at;
        r.reason = reason.to_owned();
        Ok(r.clone())
    }

    fn cancel(&self, thread: &str, row: u64, _reason: &str) -> Result<(), ThreadsError> {
        self.check()?;
        self.own_row(thread, row)?;
        self.calls.borrow_mut().push(format!("cancel {row}"));
        self.take_row(row)
            .map(|_| ())
            .ok_or(ThreadsError::NoSuchRow(row))
    }

    fn get_threads(&self, threads: &[&str]) -> Vec<Result<ThreadInfo, ThreadsError>> {
        self.batches
            .borrow_mut()
            .push(format!("get-threads {}", threads.len()));
        threads.iter().map(|t| self.get_thread(t)).collect()
    }

    fn reschedule_many(&self, moves: &[RowMove]) -> Vec<Result<QueuedRow, ThreadsError>> {
        self.batches
            .borrow_mut()
            .push(format!("reschedule-many {}", moves.len()));
        moves
            .iter()
            .map(|m| self.reschedule(&m.thread, m.row, m.send_at, &m.reason))
            .collect()
    }

    fn list_rows(&self, thread: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError> {
        self.check()?;
        let mut rows: Vec<QueuedRow> = self
            .rows
            .borrow()
            .values()
            .filter(|r| thread.is_none_or(|t| r.thread == t))
            .cloned()
            .collect();
        rows.sort_by_key(|r| r.send_at);
        Ok(rows)
    }
}

/// A database whose next COMMIT fails after rolling back, as when the plugin traps between
/// its host calls and the end of its call (the host drops the connection, SQLite rolls back).
pub struct TrappingDb {
    pub inner: NativeDb,
    pub trap_next_commit: Cell<bool>,
    /// Every statement run through `execute`, in order.
    pub executed: RefCell<Vec<String>>,
}

impl Db for TrappingDb {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.executed.borrow_mut().push(sql.to_owned());
        self.inner.execute(sql, params)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        if sql == "COMMIT" && self.trap_next_commit.replace(false) {
            self.inner.execute_batch("ROLLBACK")?;
            return Err(DbError::Io("trap".into()));
        }
        self.inner.execute_batch(sql)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.inner.query(sql, params)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.inner.last_insert_rowid()
    }
}

/// Everything an engine call needs, with the database surviving "restarts" (a new engine
/// over the same database is a restarted plugin: nothing else carries over).
pub struct World {
    pub db: TrappingDb,
    pub core: FakeCore,
    pub pool: FakePool,
    pub clock: Rc<FakeClock>,
    pub random: SeqRandom,
    pub log: Lines,
    /// What the engine reported through the metrics port.
    pub metrics: pooler_plugin_kit::metrics::Recorded,
}

impl World {
    pub fn new() -> World {
        let db = NativeDb::memory();
        store::migrate(&db).expect("schema");
        let clock = Rc::new(FakeClock::default());
        clock.set(T);
        World {
            db: TrappingDb {
                inner: db,
                trap_next_commit: Cell::new(false),
                executed: RefCell::new(Vec::new()),
            },
            core: FakeCore::default(),
            pool: FakePool {
                script: RefCell::new(PoolScript::Answer(Availability::Ready)),
                queries: RefCell::new(Vec::new()),
                batches: RefCell::new(Vec::new()),
                clock: Rc::clone(&clock),
            },
            clock,
            random: SeqRandom(Cell::new(0x9E37_79B9_7F4A_7C15)),
            log: Lines::default(),
            metrics: Default::default(),
        }
    }

    pub fn engine(&self) -> Engine<'_, TrappingDb> {
        self.core.now.set(self.clock.now());
        Engine::new(
            &self.db,
            &self.core,
            &self.pool,
            &*self.clock,
            &self.random,
            &self.log,
        )
        .with_metrics(&self.metrics)
    }

    /// A thread whose first turn `request` failed with `failure`; returns the event the core
    /// would deliver.
    pub fn first_failure(
        &self,
        thread: &str,
        request: &str,
        failure: Option<Failure>,
        routed: bool,
    ) -> TurnFailedEvent {
        if !self.core.threads.borrow().contains_key(thread) {
            self.core.add_thread(thread, routed);
        }
        self.core.fail(thread, request, request, 1);
        TurnFailedEvent {
            thread: thread.to_owned(),
            provider: Provider::Claude,
            model: Some("claude-opus-4-1".into()),
            failed_request: request.to_owned(),
            original_request: request.to_owned(),
            attempt: 1,
            failed_at: self.clock.now(),
            chain_started_at: self.clock.now(),
            input_accepted: false,
            routed_by_pool: routed,
            rate_limits: None,
            failure,
        }
    }

    /// The retry `request` of an existing chain failed; returns the event.
    pub fn retry_failure(
        &self,
        first: &TurnFailedEvent,
        request: &str,
        failure: Option<Failure>,
    ) -> TurnFailedEvent {
        let attempt = self
            .core
            .requests
            .borrow()
            .get(request)
            .expect("dispatched")
            .attempt;
        self.core
            .fail(&first.thread, request, &first.original_request, attempt);
        TurnFailedEvent {
            failed_request: request.to_owned(),
            attempt,
            failed_at: self.clock.now(),
            failure,
            ..first.clone()
        }
    }

    /// The one live row of a thread (panics if there is not exactly one).
    pub fn only_row(&self, thread: &str) -> QueuedRow {
        let rows = self.core.rows_of(thread);
        assert_eq!(rows.len(), 1, "live rows of {thread}: {rows:?}");
        rows[0].clone()
    }
}

pub fn failure(category: FailureCategory, status: Option<u16>) -> Failure {
    Failure {
        category,
        provider_code: None,
        http_status: status,
        origin: FailureOrigin::Provider,
        retry_after: None,
        message: None,
    }
}

/// The pool's own 429 (every account blocked).
pub fn pool_429() -> Failure {
    Failure {
        origin: FailureOrigin::Pool,
        ..failure(FailureCategory::RateLimit, Some(429))
    }
}

pub fn blocked(at: u64) -> Availability {
    Availability::Blocked {
        retry_at: at,
        cause: BlockCause::QuotaExhausted,
    }
}

pub fn unavailable(r: UnavailableReason) -> Availability {
    Availability::Unavailable(r)
}
