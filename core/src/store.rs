//! [`Core`]: the handle the host holds. It owns one connection to the core database and the
//! host clock; the operations live in `threads`, `queue` and `outbox` as `impl Core` blocks.
//! This module also holds the small SQL readers those modules share.
//!
//! Every call is synchronous and short (one SQLite transaction). Writes use `BEGIN
//! IMMEDIATE`, so two `Core`s on the same file (or two processes) serialise their
//! read-modify-write sequences instead of racing. A commit survives a crash of the process
//! once it returns; the commits that start a turn also survive a power loss
//! ([`Core::write_durable`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use crate::clock::SharedClock;
use crate::db;
use crate::error::CoreError;
use crate::model::*;

/// The default number of turns the core runs at once.
pub const DEFAULT_CONCURRENCY_LIMIT: u32 = 4;
/// How long a due row may stay claimed for its dispatch gate by default: 5 minutes, far
/// longer than a plugin call may run (its deadline), so only a claim whose verdict could
/// not be recorded (a failed `postpone` or `drop`) ever reaches it.
pub const DEFAULT_CLAIM_LEASE_MS: u64 = 5 * 60_000;
const CONCURRENCY_LIMIT_KEY: &str = "concurrency-limit";

/// The core: threads, turn requests, the retry queue, the outbox. See the crate docs for
/// the order in which the host calls it.
pub struct Core {
    conn: Mutex<Connection>,
    clock: SharedClock,
    path: PathBuf,
    /// Commits made by [`Core::write_durable`] (synced one by one).
    durable_commits: AtomicU64,
    /// How long a claim holds its row (milliseconds); see [`Core::set_claim_lease`].
    claim_lease_ms: AtomicU64,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("path", &self.path).finish()
    }
}

impl Core {
    /// Opens the core database in `data_dir` (creating it), migrating its schema. Call
    /// [`Core::recover`] once after opening, before the first due check.
    pub fn open(data_dir: impl AsRef<Path>, clock: SharedClock) -> Result<Core, CoreError> {
        let (conn, path) = db::open(data_dir.as_ref())?;
        Ok(Core {
            conn: Mutex::new(conn),
            clock,
            path,
            durable_commits: AtomicU64::new(0),
            claim_lease_ms: AtomicU64::new(DEFAULT_CLAIM_LEASE_MS),
        })
    }

    /// The host clock the core stamps its records with.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The database file.
    pub fn database_path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now_ms()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable: an open transaction
        // was rolled back when its guard dropped.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` inside one immediate write transaction, committed when `f` succeeds.
    pub(crate) fn write<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<rusqlite::Error>,
    {
        commit(&mut self.lock(), f)
    }

    /// [`Core::write`] for a commit that must survive a power loss, not only a crash of the
    /// process: the database runs `synchronous=NORMAL` (see `db::open`), and this commit is
    /// made under FULL, so it is synced before it returns — and with it every earlier commit
    /// (the WAL is one sequential log). For the commits after which something leaves the
    /// process for good: a turn about to be sent to a provider.
    pub(crate) fn write_durable<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<rusqlite::Error>,
    {
        let mut conn = self.lock();
        conn.pragma_update(None, "synchronous", "FULL")?;
        let out = commit(&mut conn, f);
        if let Err(e) = conn.pragma_update(None, "synchronous", "NORMAL") {
            // Left at FULL: slower, never less safe.
            tracing::warn!(error = %e, "cannot set the core database back to synchronous=NORMAL");
        }
        if out.is_ok() {
            self.durable_commits.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// How long a due row stays claimed at most (default [`DEFAULT_CLAIM_LEASE_MS`]). A
    /// claim older than this is released by the next [`Core::claim_due`]: its generation is
    /// bumped, so the old claim can no longer dispatch, postpone or drop the row, and the
    /// row is gated again. It must be longer than a gate may take (the retry plugin's call
    /// deadline), or a slow gate's verdict is voided (never carried out twice: only the
    /// current claim can dispatch). Zero is refused.
    pub fn set_claim_lease(&self, lease: std::time::Duration) -> Result<(), CoreError> {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Err(CoreError::InvalidArgument(
                "the claim lease must be positive".into(),
            ));
        }
        self.claim_lease_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    /// The claim lease in milliseconds (see [`Core::set_claim_lease`]).
    pub fn claim_lease_ms(&self) -> u64 {
        self.claim_lease_ms.load(Ordering::Relaxed)
    }

    /// How many commits [`Core::write_durable`] made since the core was opened.
    pub fn durable_commits(&self) -> u64 {
        self.durable_commits.load(Ordering::Relaxed)
    }

    /// Runs `f` against the connection, for reads.
    pub(crate) fn read<T, E>(&self, f: impl FnOnce(&Connection) -> Result<T, E>) -> Result<T, E> {
        let conn = self.lock();
        f(&conn)
    }

    /// How many turns may run at once (setting, default 4). Retry rows that come due while
    /// this many turns run wait for a slot.
    pub fn concurrency_limit(&self) -> Result<u32, CoreError> {
        self.read(concurrency_limit)
    }

    /// Changes the concurrency limit (at least 1). Stored, so it survives restarts.
    pub fn set_concurrency_limit(&self, limit: u32) -> Result<(), CoreError> {
        if limit == 0 {
            return Err(CoreError::InvalidArgument(
                "the concurrency limit must be at least 1".into(),
            ));
        }
        self.write(|tx| {
            tx.exec(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![CONCURRENCY_LIMIT_KEY, limit.to_string()],
            )?;
            Ok(())
        })
    }
}

pub(crate) fn concurrency_limit(conn: &Connection) -> Result<u32, CoreError> {
    let stored: Option<String> = conn
        .row(
            "SELECT value FROM settings WHERE key = ?1",
            [CONCURRENCY_LIMIT_KEY],
            |r| r.get(0),
        )
        .optional()?;
    Ok(stored
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CONCURRENCY_LIMIT))
}

/// A thread row with everything the core needs internally (including the route).
#[derive(Debug, Clone)]
pub(crate) struct ThreadRow {
    pub id: ThreadId,
    pub provider: Provider,
    pub model: Option<String>,
    pub status: ThreadStatus,
    pub archived: bool,
    pub session_id: String,
    pub route: Option<Route>,
    pub created_at: Timestamp,
    pub agent: AgentSpec,
    pub agent_session: Option<String>,
}

fn bad_text(col: usize, what: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        col,
        rusqlite::types::Type::Text,
        format!("unexpected {what}").into(),
    )
}

fn parse_col<T>(
    row: &Row<'_>,
    col: usize,
    parse: fn(&str) -> Option<T>,
    what: &str,
) -> rusqlite::Result<T> {
    let text: String = row.get(col)?;
    parse(&text).ok_or_else(|| bad_text(col, what))
}

fn json_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    col: usize,
) -> rusqlite::Result<Option<T>> {
    let text: Option<String> = row.get(col)?;
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, e.into())
        })
    })
    .transpose()
}

const THREAD_COLUMNS: &str = "id, provider, model, status, archived, retry_opt_out, session_id, \
                              route_base_url, route_token, created_at, agent, cwd, agent_args, \
                              agent_session";

fn thread_from_row(row: &Row<'_>) -> rusqlite::Result<ThreadRow> {
    let base: Option<String> = row.get(7)?;
    let token: Option<String> = row.get(8)?;
    Ok(ThreadRow {
        id: row.get(0)?,
        provider: parse_col(row, 1, Provider::parse, "provider")?,
        model: row.get(2)?,
        status: parse_col(row, 3, ThreadStatus::parse, "thread status")?,
        archived: row.get(4)?,
        session_id: row.get(6)?,
        route: match (base, token) {
            (Some(base_url), Some(token)) => Some(Route { base_url, token }),
            _ => None,
        },
        created_at: row.get(9)?,
        agent: AgentSpec {
            agent: parse_col(row, 10, Agent::parse, "agent")?,
            cwd: row.get(11)?,
            args: json_col(row, 12)?.unwrap_or_default(),
        },
        agent_session: row.get(13)?,
    })
}

pub(crate) fn load_thread(conn: &Connection, id: &str) -> rusqlite::Result<Option<ThreadRow>> {
    conn.row(
        &format!("SELECT {THREAD_COLUMNS} FROM threads WHERE id = ?1"),
        [id],
        thread_from_row,
    )
    .optional()
}

pub(crate) fn all_threads(conn: &Connection) -> rusqlite::Result<Vec<ThreadRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {THREAD_COLUMNS} FROM threads ORDER BY created_at, id"
    ))?;
    let rows = stmt.query_map([], thread_from_row)?;
    rows.collect()
}

/// The id of the thread's latest started request.
pub(crate) fn latest_request(
    conn: &Connection,
    thread: &str,
) -> rusqlite::Result<Option<RequestId>> {
    conn.row(
        "SELECT id FROM turn_requests WHERE thread_id = ?1 AND start_seq IS NOT NULL
         ORDER BY start_seq DESC LIMIT 1",
        [thread],
        |r| r.get(0),
    )
    .optional()
}

/// A thread as plugins see it, read with one statement (`get-threads` reads thousands).
pub(crate) fn load_thread_info(
    conn: &Connection,
    id: &str,
) -> rusqlite::Result<Option<ThreadInfo>> {
    conn.row(
        "SELECT t.id, t.provider, t.model, t.status, t.archived, t.retry_opt_out,
                t.route_base_url IS NOT NULL AND t.route_token IS NOT NULL,
                (SELECT r.id FROM turn_requests r
                 WHERE r.thread_id = t.id AND r.start_seq IS NOT NULL
                 ORDER BY r.start_seq DESC LIMIT 1),
                EXISTS (SELECT 1 FROM turn_requests q
                        WHERE q.thread_id = t.id AND q.started_at IS NULL)
         FROM threads t WHERE t.id = ?1",
        [id],
        |row| {
            Ok(ThreadInfo {
                id: row.get(0)?,
                provider: parse_col(row, 1, Provider::parse, "provider")?,
                model: row.get(2)?,
                status: parse_col(row, 3, ThreadStatus::parse, "thread status")?,
                archived: row.get(4)?,
                retry_opt_out: row.get(5)?,
                routed_by_pool: row.get(6)?,
                latest_request: row.get(7)?,
                input_queued: row.get(8)?,
            })
        },
    )
    .optional()
}

/// A turn request with the columns the core reasons about.
#[derive(Debug, Clone)]
pub(crate) struct RequestRow {
    pub id: RequestId,
    pub thread: ThreadId,
    pub input: String,
    pub original_request: RequestId,
    pub attempt: u32,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub input_accepted: bool,
    /// The input is in the agent's session (agent threads).
    pub in_agent_session: bool,
}

pub(crate) fn load_request(conn: &Connection, id: &str) -> rusqlite::Result<Option<RequestRow>> {
    conn.row(
        "SELECT id, thread_id, input, original_request, attempt, started_at, finished_at,
                input_accepted, in_agent_session
         FROM turn_requests WHERE id = ?1",
        [id],
        |r| {
            Ok(RequestRow {
                id: r.get(0)?,
                thread: r.get(1)?,
                input: r.get(2)?,
                original_request: r.get(3)?,
                attempt: r.get(4)?,
                started_at: r.get(5)?,
                finished_at: r.get(6)?,
                input_accepted: r.get(7)?,
                in_agent_session: r.get(8)?,
            })
        },
    )
    .optional()
}

pub(crate) fn turn_records(conn: &Connection, thread: &str) -> rusqlite::Result<Vec<TurnRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, input, trigger, original_request, attempt, created_at, started_at,
                finished_at, outcome, reply, input_accepted, failure
         FROM turn_requests WHERE thread_id = ?1
         ORDER BY start_seq IS NULL, start_seq, rowid",
    )?;
    let rows = stmt.query_map([thread], |r| {
        let outcome: Option<String> = r.get(8)?;
        Ok(TurnRecord {
            id: r.get(0)?,
            input: r.get(1)?,
            trigger: parse_col(r, 2, TurnTrigger::parse, "trigger")?,
            original_request: r.get(3)?,
            attempt: r.get(4)?,
            created_at: r.get(5)?,
            started_at: r.get(6)?,
            finished_at: r.get(7)?,
            outcome: match outcome {
                Some(o) => Some(TurnOutcomeKind::parse(&o).ok_or_else(|| bad_text(8, "outcome"))?),
                None => None,
            },
            reply: r.get(9)?,
            input_accepted: r.get(10)?,
            failure: json_col(r, 11)?,
        })
    })?;
    rows.collect()
}

/// Earlier exchanges whose input the provider accepted, oldest first, for the history a
/// turn replays.
pub(crate) fn exchanges(conn: &Connection, thread: &str) -> rusqlite::Result<Vec<Exchange>> {
    let mut stmt = conn.prepare_cached(
        "SELECT input, COALESCE(reply, '') FROM turn_requests
         WHERE thread_id = ?1 AND finished_at IS NOT NULL AND input_accepted = 1
         ORDER BY start_seq",
    )?;
    let rows = stmt.query_map([thread], |r| {
        Ok(Exchange {
            user: r.get(0)?,
            assistant: r.get(1)?,
        })
    })?;
    rows.collect()
}

pub(crate) const ROW_COLUMNS: &str = "id, thread_id, kind, failed_request, original_request, \
                                      attempt, send_at, reason, created_at, wait_state, claim_gen";

/// A live row with its claim state.
#[derive(Debug, Clone)]
pub(crate) struct LiveRow {
    pub row: QueuedRow,
    pub wait_state: String,
    pub claim_gen: u64,
}

pub(crate) fn live_row_from(r: &Row<'_>) -> rusqlite::Result<LiveRow> {
    let wait_state: String = r.get(9)?;
    Ok(LiveRow {
        row: QueuedRow {
            id: r.get(0)?,
            thread: r.get(1)?,
            kind: parse_col(r, 2, RowKind::parse, "row kind")?,
            failed_request: r.get(3)?,
            original_request: r.get(4)?,
            attempt: r.get(5)?,
            send_at: r.get(6)?,
            reason: r.get(7)?,
            created_at: r.get(8)?,
            waiting_for_slot: wait_state == "waiting-for-slot",
        },
        wait_state,
        claim_gen: r.get(10)?,
    })
}

pub(crate) fn load_row(conn: &Connection, id: RowId) -> rusqlite::Result<Option<LiveRow>> {
    conn.row(
        &format!("SELECT {ROW_COLUMNS} FROM queued_rows WHERE id = ?1"),
        [id],
        live_row_from,
    )
    .optional()
}

pub(crate) fn list_rows(
    conn: &Connection,
    thread: Option<&str>,
) -> rusqlite::Result<Vec<QueuedRow>> {
    // Two statements, so one thread's rows are found through its index.
    let filter = match thread {
        Some(_) => "WHERE thread_id = ?1",
        None => "WHERE ?1 IS NULL",
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM queued_rows {filter} ORDER BY send_at, id"
    ))?;
    let rows = stmt.query_map([thread], |r| live_row_from(r).map(|l| l.row))?;
    rows.collect()
}

/// Who caused a change to the queue, for the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Actor {
    Plugin,
    Core,
    Person,
}

impl Actor {
    fn as_str(self) -> &'static str {
        match self {
            Actor::Plugin => "plugin",
            Actor::Core => "core",
            Actor::Person => "person",
        }
    }
}

/// Appends one history entry.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_history(
    tx: &Transaction<'_>,
    at: Timestamp,
    thread: &str,
    row: Option<RowId>,
    original_request: Option<&str>,
    actor: Actor,
    action: &str,
    send_at: Option<Timestamp>,
    detail: Option<&str>,
) -> rusqlite::Result<()> {
    tx.exec(
        "INSERT INTO history (at, thread_id, row_id, original_request, actor, action, send_at,
                              detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            at,
            thread,
            row,
            original_request,
            actor.as_str(),
            action,
            send_at,
            detail
        ],
    )?;
    Ok(())
}

/// Removes a live row and records why in its history, in the caller's transaction: every
/// way a row leaves the queue (cancelled, dropped, dispatched) goes through here.
pub(crate) fn remove_row(
    tx: &Transaction<'_>,
    at: Timestamp,
    row: &QueuedRow,
    actor: Actor,
    action: &str,
    detail: &str,
) -> rusqlite::Result<()> {
    tx.exec("DELETE FROM queued_rows WHERE id = ?1", [row.id])?;
    add_history(
        tx,
        at,
        &row.thread,
        Some(row.id),
        Some(&row.original_request),
        actor,
        action,
        Some(row.send_at),
        Some(detail),
    )
}

pub(crate) fn history(conn: &Connection, thread: &str) -> rusqlite::Result<Vec<HistoryEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT at, thread_id, row_id, original_request, actor, action, send_at, detail
         FROM history WHERE thread_id = ?1 ORDER BY id",
    )?;
    let rows = stmt.query_map([thread], |r| {
        Ok(HistoryEntry {
            at: r.get(0)?,
            thread: r.get(1)?,
            row: r.get(2)?,
            original_request: r.get(3)?,
            actor: r.get(4)?,
            action: r.get(5)?,
            send_at: r.get(6)?,
            detail: r.get(7)?,
        })
    })?;
    rows.collect()
}

/// The core's statements run through rusqlite's statement cache: `Connection::execute`
/// and `query_row` parse their SQL on every call, and parsing was a sixth of the CPU of a
/// pass that moves many rows.
pub(crate) trait CachedSql {
    /// `execute` through the statement cache.
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// `query_row` through the statement cache.
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl CachedSql for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Number of turns running now plus rows claimed for dispatch (each will become a turn).
pub(crate) fn busy_slots(conn: &Connection) -> rusqlite::Result<u32> {
    conn.row(
        "SELECT (SELECT COUNT(*) FROM turn_requests
                 WHERE started_at IS NOT NULL AND finished_at IS NULL)
              + (SELECT COUNT(*) FROM queued_rows WHERE wait_state = 'claimed')",
        [],
        |r| r.get(0),
    )
}

/// Run `f` in one immediate write transaction on `conn`, committed when `f` succeeds.
fn commit<T, E>(
    conn: &mut Connection,
    f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<rusqlite::Error>,
{
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn synchronous(core: &Core) -> i64 {
        core.read(|c| c.row("PRAGMA synchronous", [], |r| r.get(0)))
            .unwrap()
    }

    #[test]
    fn a_durable_write_runs_under_full_and_goes_back_to_normal() {
        let dir = std::env::temp_dir().join(crate::ids::new_id("pooler-core-store"));
        let core = Core::open(&dir, ManualClock::new(1_000)).unwrap();
        assert_eq!(synchronous(&core), 1, "NORMAL");
        let inside: i64 = core
            .write_durable(|tx| {
                tx.exec(
                    "INSERT INTO settings (key, value) VALUES ('probe', '1')",
                    [],
                )?;
                tx.row("PRAGMA synchronous", [], |r| r.get(0))
            })
            .unwrap();
        assert_eq!(inside, 2, "FULL while the durable commit runs");
        assert_eq!(synchronous(&core), 1, "back to NORMAL");
        assert_eq!(core.durable_commits(), 1);
        // A failed durable write goes back to NORMAL too, and is not counted.
        let failed = core.write_durable(|tx| tx.exec("INSERT INTO no_such_table VALUES (1)", []));
        assert!(failed.is_err());
        assert_eq!(synchronous(&core), 1);
        assert_eq!(core.durable_commits(), 1);
        // Plain writes stay NORMAL.
        core.set_concurrency_limit(3).unwrap();
        assert_eq!(synchronous(&core), 1);
        assert_eq!(core.durable_commits(), 1);
        drop(core);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
