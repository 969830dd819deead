//! What one plugin statement may spend: time (the calling guest call's deadline, enforced
//! by a progress handler), result size (rows and bytes collected in host memory), and
//! SQLite's own limits (`SQLITE_LIMIT_*`) on what a statement may be.
//!
//! **Time.** A store has one [`Budget`]: the role's `deadline-ms` of CPU time, spent by the
//! guest's instructions (one epoch tick per tick of guest execution, `runtime/mod.rs`) and by its
//! SQL (each statement's running time, lock waits excluded), and for an export call a
//! wall-clock deadline too (the same `deadline-ms` from the call's start, the bound
//! `tokio::time::timeout` puts on the call, which cannot fire while a statement runs on the
//! worker). A statement runs until the earlier of the two; past it SQLite's progress handler
//! interrupts it, it fails with `invalid-statement` (`interrupted: …`), the budget is
//! spent, and the call is stopped at its next tick of guest execution as past its deadline
//! (as a guest loop would be): the statement ends with an error value, never a trap inside
//! the import, and the call ends as every call past its deadline does. Lock waits are not CPU
//! time and are bounded on their own (`BUSY_TIMEOUT`).
//!
//! **Size.** A query's rows are collected in host memory before they are handed to the
//! guest: at most [`MAX_ROWS`] rows and [`Bounds::max_bytes`] bytes (the plugin's memory
//! cap: a larger result could not be lowered into the guest anyway), counted as the rows
//! are stepped, so a huge result is refused after that much, not collected whole.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rusqlite::limits::Limit;

use crate::runtime::bindings::pool::pooler::plugins::sqlite::{Error, Value};

/// Rows one query may return. The largest query of the real plugins, Provider Retry's open
/// chains (`store::open_chains`, one row per pending retry), returns 10,000 rows in the
/// re-evaluation benchmark; this leaves 25 times that.
pub const MAX_ROWS: usize = 250_000;
/// Result bytes of one query when the caller sets no cap (unit tests): the default memory
/// cap of an instance.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;
/// What one cell counts for on top of its text or blob: about what a `value` takes in the
/// guest's memory (and half what it takes in the host's).
pub const CELL_BYTES: usize = 16;
/// SQLite virtual-machine instructions between two looks at the clock.
pub const PROGRESS_OPS: i32 = 1_000;

/// SQLite limits on every plugin connection: (limit, value, why). Each leaves room for the
/// real plugins' statements (their schema batch is ~6 KiB, their widest table ~20 columns).
pub const LIMITS: &[(Limit, i32, &str)] = &[
    (
        Limit::SQLITE_LIMIT_LENGTH,
        16 << 20,
        "a text, blob or row: 16 MiB (default 1 GB)",
    ),
    (
        Limit::SQLITE_LIMIT_SQL_LENGTH,
        1 << 20,
        "SQL text, a whole batch: 1 MiB",
    ),
    (
        Limit::SQLITE_LIMIT_COLUMN,
        500,
        "columns of a table, result, index, GROUP BY or ORDER BY",
    ),
    (Limit::SQLITE_LIMIT_EXPR_DEPTH, 200, "expression tree depth"),
    (
        Limit::SQLITE_LIMIT_COMPOUND_SELECT,
        64,
        "terms of a compound SELECT",
    ),
    (
        Limit::SQLITE_LIMIT_VDBE_OP,
        250_000,
        "instructions of one prepared statement",
    ),
    (
        Limit::SQLITE_LIMIT_FUNCTION_ARG,
        64,
        "arguments of a function",
    ),
    (
        Limit::SQLITE_LIMIT_ATTACHED,
        0,
        "attached databases: none (nor VACUUM, which attaches one)",
    ),
    (
        Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH,
        1_000,
        "a LIKE or GLOB pattern",
    ),
    (
        Limit::SQLITE_LIMIT_VARIABLE_NUMBER,
        10_000,
        "the largest parameter number",
    ),
    (Limit::SQLITE_LIMIT_TRIGGER_DEPTH, 16, "nested triggers"),
];

/// Set [`LIMITS`] and the progress handler on a plugin connection.
pub(super) fn bound(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    for &(limit, value, _) in LIMITS {
        conn.set_limit(limit, value)?;
    }
    conn.progress_handler(PROGRESS_OPS, Some(past_deadline))
}

/// One store's time budget (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Budget {
    /// The role's `deadline-ms`, for messages.
    deadline: Duration,
    /// CPU time left.
    cpu_left: Duration,
    /// When an export call's wall-clock deadline passes (none for an HTTP request).
    wall: Option<Instant>,
}

impl Budget {
    /// `deadline` of CPU time (whole epoch ticks of `tick`, at least one), no wall deadline.
    pub fn new(deadline: Duration, tick: Duration) -> Budget {
        let ticks = (deadline.as_nanos() / tick.as_nanos().max(1)).max(1);
        Budget {
            deadline,
            cpu_left: tick.saturating_mul(u32::try_from(ticks).unwrap_or(u32::MAX)),
            wall: None,
        }
    }

    /// The call must end by `at` (wall clock).
    pub fn set_wall_deadline(&mut self, at: Instant) {
        self.wall = Some(at);
    }

    /// Spend one epoch tick of guest execution: false (the call is past its deadline) once
    /// nothing is left.
    pub fn take_tick(&mut self, tick: Duration) -> bool {
        if self.cpu_left.is_zero() {
            return false;
        }
        self.cpu_left = self.cpu_left.saturating_sub(tick);
        true
    }

    /// CPU time left.
    pub fn cpu_left(&self) -> Duration {
        self.cpu_left
    }

    /// The bounds of a statement starting `now`.
    fn statement(&self, now: Instant, max_bytes: usize) -> Bounds {
        Bounds {
            cpu_until: now.checked_add(self.cpu_left),
            wall_until: self.wall,
            deadline: self.deadline,
            max_bytes,
        }
    }

    /// Run `f` (one statement) within this budget, with results capped at `max_bytes`, and
    /// charge its running time (lock waits excluded) to the CPU left.
    pub(super) fn run<R>(
        &mut self,
        max_bytes: usize,
        f: impl FnOnce() -> Result<R, Error>,
    ) -> Result<R, Error> {
        let start = Instant::now();
        let (result, waited, interrupted) = within(self.statement(start, max_bytes), f);
        let ran = start.elapsed().saturating_sub(waited);
        self.cpu_left = if interrupted {
            // Past the deadline (CPU or wall): nothing left, so the call is stopped at its
            // next tick of guest execution.
            Duration::ZERO
        } else {
            self.cpu_left.saturating_sub(ran)
        };
        result
    }
}

/// The bounds of the statement running on this thread.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// When its CPU budget is spent (lock waits move it later); none: never.
    pub(super) cpu_until: Option<Instant>,
    /// When the call's wall-clock deadline passes.
    pub(super) wall_until: Option<Instant>,
    /// The role's `deadline-ms`, for the message.
    pub(super) deadline: Duration,
    /// Result bytes it may collect.
    pub max_bytes: usize,
}

impl Bounds {
    /// No deadline, the default byte cap (statements run outside a store: unit tests).
    pub const UNBOUNDED: Bounds = Bounds {
        cpu_until: None,
        wall_until: None,
        deadline: Duration::ZERO,
        max_bytes: DEFAULT_MAX_BYTES,
    };
}

thread_local! {
    /// The statement running on this thread: its bounds, the time it spent waiting for
    /// locks so far, and whether the progress handler interrupted it.
    static CURRENT: Cell<(Bounds, Duration, bool)> =
        const { Cell::new((Bounds::UNBOUNDED, Duration::ZERO, false)) };
}

/// Run `f` with `bounds` in force on this thread; its result (an interrupted statement's
/// error replaced by one that says why), the time it spent waiting for locks, and whether
/// it was interrupted.
pub(super) fn within<R>(
    bounds: Bounds,
    f: impl FnOnce() -> Result<R, Error>,
) -> (Result<R, Error>, Duration, bool) {
    let previous = CURRENT.replace((bounds, Duration::ZERO, false));
    let result = f();
    let (_, waited, interrupted) = CURRENT.replace(previous);
    let result = match result {
        Err(_) if interrupted => Err(Error::InvalidStatement(format!(
            "interrupted: the statement ran past the call's deadline of {} ms",
            bounds.deadline.as_millis()
        ))),
        other => other,
    };
    (result, waited, interrupted)
}

/// The busy handler slept `waited` (not CPU time: the CPU deadline moves on by as much).
pub(super) fn waited(waited: Duration) {
    let (bounds, so_far, interrupted) = CURRENT.get();
    CURRENT.set((bounds, so_far.saturating_add(waited), interrupted));
}

/// The result byte cap of the statement running on this thread.
pub(super) fn max_bytes() -> usize {
    CURRENT.get().0.max_bytes
}

/// SQLite's progress handler: interrupt the statement once its deadline has passed.
fn past_deadline() -> bool {
    let (bounds, waited, _) = CURRENT.get();
    if bounds.cpu_until.is_none() && bounds.wall_until.is_none() {
        return false;
    }
    let now = Instant::now();
    let past = bounds.wall_until.is_some_and(|w| now >= w)
        || bounds
            .cpu_until
            .and_then(|c| c.checked_add(waited))
            .is_some_and(|c| now >= c);
    if past {
        CURRENT.set((bounds, waited, true));
    }
    past
}

/// Counts a query's result as it is collected, refusing past [`MAX_ROWS`] or `max_bytes`.
pub(super) struct ResultSize {
    rows: usize,
    bytes: usize,
    max_bytes: usize,
}

impl ResultSize {
    pub(super) fn new(max_bytes: usize) -> ResultSize {
        ResultSize {
            rows: 0,
            bytes: 0,
            max_bytes,
        }
    }

    /// Count one more row of `cells`; an error once the result is too large.
    pub(super) fn add(&mut self, cells: &[Value]) -> Result<(), Error> {
        self.rows += 1;
        if self.rows > MAX_ROWS {
            return Err(Error::InvalidStatement(format!(
                "result too large: more than {MAX_ROWS} rows; select fewer (LIMIT) or page through them"
            )));
        }
        for cell in cells {
            let payload = match cell {
                Value::Text(t) => t.len(),
                Value::Blob(b) => b.len(),
                _ => 0,
            };
            self.bytes = self.bytes.saturating_add(CELL_BYTES + payload);
        }
        if self.bytes > self.max_bytes {
            return Err(Error::InvalidStatement(format!(
                "result too large: more than {} bytes (the plugin's memory cap); select fewer \
                 rows or columns (LIMIT) or page through them",
                self.max_bytes
            )));
        }
        Ok(())
    }

    /// Bytes counted so far.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_spent_by_ticks_and_by_statements() {
        // Ticks of a second, so the statement's few milliseconds stay well under one tick
        // however slowly a loaded machine runs it.
        let tick = Duration::from_secs(1);
        let mut budget = Budget::new(Duration::from_millis(3_500), tick);
        assert_eq!(budget.cpu_left(), Duration::from_secs(3), "whole ticks");
        assert!(budget.take_tick(tick));
        let _ = budget.run(DEFAULT_MAX_BYTES, || {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        });
        assert!(budget.cpu_left() <= Duration::from_millis(1_995));
        assert!(budget.take_tick(tick));
        assert!(budget.take_tick(tick), "what is left, even under a tick");
        assert!(!budget.take_tick(tick), "spent");
        // A deadline shorter than a tick still gives one tick.
        let mut short = Budget::new(Duration::from_millis(1), tick);
        assert!(short.take_tick(tick));
        assert!(!short.take_tick(tick));
    }

    /// A measurement, run on demand (`cargo test -p pooler-host --lib bounds -- --ignored
    /// --nocapture`): what the progress handler and the limits cost a statement, on two
    /// connections to one file, one bare and one bounded (under a deadline, so the handler
    /// reads the clock). Prints the figures; fails only if the bounded one is far slower.
    #[test]
    #[ignore = "a measurement: prints the per-statement cost of the bounds"]
    fn the_bounds_cost_a_statement_little() {
        use pooler_core::sqlite_file::{self, Busy, ExistingFile, Settings};
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.sqlite3");
        let settings = Settings {
            flags: rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                | rusqlite::OpenFlags::SQLITE_OPEN_CREATE,
            busy: Busy::Timeout(Duration::from_secs(5)),
            existing: ExistingFile::SetMode,
            wal_autocheckpoint: None,
        };
        let bare = sqlite_file::open(&path, &settings).unwrap();
        bare.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, x INTEGER, s TEXT);
             WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000)
             INSERT INTO t SELECT i, i * 7, 'row ' || i FROM c;",
        )
        .unwrap();
        let mut bounded = sqlite_file::open(&path, &settings).unwrap();
        bound(&mut bounded).unwrap();
        let far = Bounds {
            cpu_until: Some(Instant::now() + Duration::from_secs(3600)),
            wall_until: Some(Instant::now() + Duration::from_secs(3600)),
            deadline: Duration::from_secs(3600),
            max_bytes: DEFAULT_MAX_BYTES,
        };
        let lookups = |c: &rusqlite::Connection| {
            let start = Instant::now();
            for i in 0..20_000i64 {
                let mut stmt = c.prepare_cached("SELECT s FROM t WHERE id = ?").unwrap();
                let _: String = stmt.query_row([i % 10_000 + 1], |r| r.get(0)).unwrap();
            }
            start.elapsed() / 20_000
        };
        let scans = |c: &rusqlite::Connection| {
            let start = Instant::now();
            for _ in 0..50 {
                let mut stmt = c
                    .prepare_cached("SELECT sum(x) FROM t WHERE s LIKE 'row 1%'")
                    .unwrap();
                let _: i64 = stmt.query_row([], |r| r.get(0)).unwrap();
            }
            start.elapsed() / 50
        };
        let mut best = [Duration::MAX; 4];
        for _ in 0..5 {
            best[0] = best[0].min(lookups(&bare));
            best[1] = best[1].min(within(far, || Ok(lookups(&bounded))).0.unwrap());
            best[2] = best[2].min(scans(&bare));
            best[3] = best[3].min(within(far, || Ok(scans(&bounded))).0.unwrap());
        }
        println!(
            "point lookup: bare {:?}, bounded {:?}; 10,000-row scan: bare {:?}, bounded {:?}",
            best[0], best[1], best[2], best[3]
        );
        assert!(
            best[1] < best[0] * 3 / 2 && best[3] < best[2] * 3 / 2,
            "{best:?}"
        );
    }

    #[test]
    fn a_result_is_refused_past_its_rows_or_bytes() {
        let mut size = ResultSize::new(100);
        let row = [Value::Text("x".repeat(30)), Value::Integer(1)];
        assert!(size.add(&row).is_ok());
        assert_eq!(size.bytes(), 16 + 30 + 16);
        let err = size.add(&row).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidStatement(m) if m.contains("more than 100 bytes")),
            "{err:?}"
        );
        let mut many = ResultSize::new(usize::MAX);
        for _ in 0..MAX_ROWS {
            many.add(&[Value::Null]).unwrap();
        }
        let err = many.add(&[Value::Null]).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidStatement(m) if m.contains("more than 250000 rows")),
            "{err:?}"
        );
    }
}
