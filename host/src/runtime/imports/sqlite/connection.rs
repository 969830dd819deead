//! The host side of the WIT `connection` resource: a guest connection that runs each
//! statement on a host connection borrowed from the [`ConnectionCache`](super::ConnectionCache)
//! (or one of its own), rusqlite's values and errors as the WIT's.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use rusqlite::types::{Value as SqlValue, ValueRef};

use super::bounds::{self, ResultSize};
use super::error::map_error;
use super::lock_wait::{close, with_commits};
use super::opening::{STATE_CHANGED, open, take_refusal};
use super::slot::FileSlot;
use crate::runtime::bindings::pool::pooler::plugins::sqlite::{Error, Rows, Value};

/// An open connection: the host side of the WIT `connection` resource. It runs each
/// statement on a host connection of its file's `FileSlot`, which it holds on to only
/// while it needs it (a transaction open, per-connection state changed) and otherwise gives
/// back after the statement. Dropping it rolls back a transaction left open and gives back
/// what it holds.
pub struct Connection {
    state: RefCell<Held>,
    /// Where its host connections come from; none for a connection of its own, which it
    /// always holds.
    pub(super) slot: Option<Arc<FileSlot>>,
}

/// What a [`Connection`] holds between statements.
struct Held {
    conn: Option<rusqlite::Connection>,
    /// Keep `conn` to the end: a statement changed its per-connection state.
    keep: bool,
    /// The rowid of this guest connection's last successful INSERT.
    last_rowid: i64,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let held = self.state.get_mut();
        let Some(conn) = held.conn.take() else {
            return;
        };
        // A connection whose own state a statement changed (a temporary table, view,
        // index or trigger) is closed rather than handed to another instance, which would
        // see that state. Closing drops it all.
        if held.keep {
            return close(conn);
        }
        // A transaction the plugin left open (it trapped, ran out of time, or forgot to
        // commit) is rolled back now, so the next user starts clean and no lock is held.
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            // Cannot tell what state it is in: close it rather than hand it on.
            return close(conn);
        }
        match &self.slot {
            Some(slot) => slot.put(conn),
            None => close(conn),
        }
    }
}

fn to_sql(value: Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Integer(i) => SqlValue::Integer(i),
        Value::Real(r) => SqlValue::Real(r),
        Value::Text(t) => SqlValue::Text(t),
        Value::Blob(b) => SqlValue::Blob(b),
    }
}

fn from_sql(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

impl Connection {
    /// A guest connection that runs its statements on `slot`'s host connections.
    pub(super) fn cached(slot: Arc<FileSlot>) -> Connection {
        Connection {
            state: RefCell::new(Held {
                conn: None,
                keep: false,
                last_rowid: 0,
            }),
            slot: Some(slot),
        }
    }

    /// A connection of its own (not from a cache): it closes when dropped.
    pub fn open_uncached(dir: &Path, name: &str) -> Result<Connection, Error> {
        Ok(Connection {
            state: RefCell::new(Held {
                conn: Some(open(dir, name)?),
                keep: true,
                last_rowid: 0,
            }),
            slot: None,
        })
    }

    /// Whether a transaction is open on it.
    pub fn in_transaction(&self) -> bool {
        self.state
            .borrow()
            .conn
            .as_ref()
            .is_some_and(|c| !c.is_autocommit())
    }

    /// Run `f` on a host connection: the one this holds, or its file's most recently used
    /// idle one (given this connection's last insert rowid), which goes back afterwards
    /// unless `f` left a transaction open or changed the connection's own state. Lock waits
    /// inside `f` wake on the file's commits.
    fn run<R>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut held = self.state.borrow_mut();
        let conn = match (held.conn.take(), &self.slot) {
            (Some(conn), _) => conn,
            (None, Some(slot)) => {
                let conn = slot.take()?;
                set_last_insert_rowid(&conn, held.last_rowid);
                conn
            }
            (None, None) => unreachable!("a connection of its own always holds it"),
        };
        STATE_CHANGED.set(false);
        take_refusal();
        let mut result = with_commits(self.slot.as_ref().map(|s| &s.commits), || f(&conn));
        if let (Err(_), Some(why)) = (&result, take_refusal()) {
            result = Err(Error::InvalidStatement(format!("not authorized: {why}")));
        }
        held.keep |= STATE_CHANGED.replace(false);
        held.last_rowid = conn.last_insert_rowid();
        match &self.slot {
            Some(slot) if !held.keep && conn.is_autocommit() => slot.put(conn),
            _ => held.conn = Some(conn),
        }
        result
    }

    /// Run one statement; a statement that returns rows is stepped to its end.
    pub fn execute(&self, sql: &str, params: Vec<Value>) -> Result<u64, Error> {
        self.run(|conn| execute_on(conn, sql, params))
    }

    /// Run `sql`, one or more statements without parameters. A single statement is
    /// prepared once and kept, like `execute`'s (a plugin's `BEGIN`, `COMMIT`).
    pub fn execute_batch(&self, sql: &str) -> Result<(), Error> {
        let single = sql.trim().trim_end_matches(';').trim_end();
        let simple = single.starts_with(|c: char| c.is_ascii_alphabetic()) && !single.contains(';');
        self.run(|conn| {
            if simple {
                let stmt = conn.prepare_cached(single).map_err(map_error)?;
                let bare = stmt.parameter_count() == 0;
                finish(stmt);
                if bare {
                    return execute_on(conn, single, Vec::new()).map(|_| ());
                }
            }
            conn.execute_batch(sql).map_err(map_error)
        })
    }

    /// Run one statement with `params` and return every row it produces.
    pub fn query(&self, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
        self.run(|conn| query_on(conn, sql, params))
    }

    /// The rowid of the latest successful `INSERT` through this connection; 0 before any.
    pub fn last_insert_rowid(&self) -> i64 {
        self.state.borrow().last_rowid
    }

    /// Whether it holds a host connection between statements (tests).
    #[cfg(test)]
    pub(super) fn holds_connection(&self) -> bool {
        self.state.borrow().conn.is_some()
    }

    /// Run `f` on the host connection the next statement would use (tests).
    #[cfg(test)]
    pub(super) fn with_raw<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> R {
        self.run(|conn| Ok(super::opening::as_host(|| f(conn))))
            .unwrap()
    }
}

/// Set what `conn` reports as its last insert rowid (SQLite keeps it per connection; a
/// guest connection keeps its own across the host connections it uses).
fn set_last_insert_rowid(conn: &rusqlite::Connection, rowid: i64) {
    // SAFETY: the handle is valid while `conn` is borrowed, and this call only stores the
    // value in it.
    unsafe { rusqlite::ffi::sqlite3_set_last_insert_rowid(conn.handle(), rowid) }
}

/// A prepared statement that changed connection state is not kept: taken from the cache
/// again it would not pass the authorizer, so a later guest connection running it would
/// not learn that it has to keep its host connection.
fn finish(stmt: rusqlite::CachedStatement<'_>) {
    if STATE_CHANGED.get() {
        stmt.discard();
    }
}

/// Run one statement on `conn`; a statement that returns rows is stepped to its end.
fn execute_on(conn: &rusqlite::Connection, sql: &str, params: Vec<Value>) -> Result<u64, Error> {
    let mut stmt = conn.prepare_cached(sql).map_err(map_error)?;
    let params = rusqlite::params_from_iter(params.into_iter().map(to_sql));
    let result = if stmt.readonly() || stmt.column_count() > 0 {
        stmt.query(params).map_err(map_error).and_then(|mut rows| {
            while rows.next().map_err(map_error)?.is_some() {}
            Ok(conn.changes())
        })
    } else {
        stmt.execute(params).map(|n| n as u64).map_err(map_error)
    };
    finish(stmt);
    result
}

/// Run one statement on `conn` and collect its rows.
fn query_on(conn: &rusqlite::Connection, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
    let mut stmt = conn.prepare_cached(sql).map_err(map_error)?;
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let width = columns.len();
    let collected = stmt
        .query(rusqlite::params_from_iter(params.into_iter().map(to_sql)))
        .map_err(map_error)
        .and_then(|mut rows| {
            // Counted as they come: a result past the caps is refused after that much.
            let mut size = ResultSize::new(bounds::max_bytes());
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(map_error)? {
                let mut cells = Vec::with_capacity(width);
                for i in 0..width {
                    cells.push(from_sql(row.get_ref(i).map_err(map_error)?));
                }
                size.add(&cells)?;
                out.push(cells);
            }
            Ok(out)
        });
    finish(stmt);
    Ok(Rows {
        columns,
        rows: collected?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::ConnectionCache;
    use super::*;

    #[test]
    fn sql_errors_are_values_of_the_right_case() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        conn.execute_batch(
            "CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE c (p REFERENCES p(id))",
        )
        .unwrap();
        assert!(matches!(
            conn.execute("SELEC 1", vec![]),
            Err(Error::InvalidStatement(_))
        ));
        // Foreign keys are on.
        assert!(matches!(
            conn.execute("INSERT INTO c VALUES (?)", vec![Value::Integer(9)]),
            Err(Error::Constraint(_))
        ));
        assert!(matches!(
            conn.execute("SELECT ?", vec![]),
            Err(Error::InvalidStatement(_))
        ));
    }

    #[test]
    fn a_result_past_its_rows_or_bytes_is_refused_while_it_is_collected() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        let count = |n: usize| {
            format!(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) \
                 SELECT x FROM c"
            )
        };
        assert_eq!(
            conn.query(&count(bounds::MAX_ROWS), vec![])
                .unwrap()
                .rows
                .len(),
            bounds::MAX_ROWS
        );
        let err = conn
            .query(&count(bounds::MAX_ROWS + 1), vec![])
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidStatement(m) if m.contains("result too large: more than 250000 rows")),
            "{err:?}"
        );
        // 1 MiB a row, endless: refused once the cap (64 MiB here) is passed.
        let huge = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
                    SELECT x, zeroblob(1048576) FROM c";
        let err = conn.query(huge, vec![]).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidStatement(m) if m.contains("more than 67108864 bytes")),
            "{err:?}"
        );
        // The cap is the caller's (the instance's memory cap).
        let within = |max_bytes| {
            let bounds = bounds::Bounds {
                max_bytes,
                ..bounds::Bounds::UNBOUNDED
            };
            bounds::within(bounds, || conn.query(&count(100), vec![])).0
        };
        assert!(within(100 * bounds::CELL_BYTES).is_ok());
        assert!(within(100 * bounds::CELL_BYTES - 1).is_err());
    }

    #[test]
    fn sqlite_limits_bound_what_a_statement_may_be() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let refused = |sql: &str, why: &str| match conn.execute_batch(sql) {
            Err(Error::InvalidStatement(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("{} allowed: {other:?}", &sql[..sql.len().min(60)]),
        };
        refused("SELECT zeroblob(16777217)", "too big");
        refused(
            &format!("SELECT '{}'", "x".repeat(1 << 20)),
            "statement too long",
        );
        refused(
            &format!("SELECT {}", vec!["1"; 202].join(" + ")),
            "Expression tree is too large",
        );
        refused(
            &vec!["SELECT 1"; 65].join(" UNION ALL "),
            "too many terms in compound SELECT",
        );
        refused(
            &format!("SELECT coalesce({})", vec!["1"; 65].join(",")),
            "too many arguments",
        );
        refused("SELECT ?10001", "variable number must be between");
        refused(
            &format!("SELECT 'a' LIKE '{}'", "%".repeat(1001)),
            "pattern too complex",
        );
        let columns: Vec<String> = (0..501).map(|i| format!("c{i}")).collect();
        refused(
            &format!("CREATE TABLE wide ({})", columns.join(", ")),
            "too many columns",
        );
        // What the real plugins run is well inside them.
        conn.execute_batch(&format!("SELECT '{}'", "x".repeat(100_000)))
            .unwrap();
    }

    #[test]
    fn a_connection_dropped_in_a_transaction_rolls_back() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Connection::open_uncached(tmp.path(), "db").unwrap();
        first.execute_batch("CREATE TABLE t (x)").unwrap();
        {
            let tx = Connection::open_uncached(tmp.path(), "db").unwrap();
            tx.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
                .unwrap();
        }
        let rows = first.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(0)));
        // The lock was released with the dropped connection.
        assert_eq!(
            first.execute("INSERT INTO t VALUES (2)", vec![]).unwrap(),
            1
        );
    }

    #[test]
    fn guest_connections_share_a_host_connection_between_statements() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let path = tmp.path().join("db.sqlite3");
        let a = cache.open(tmp.path(), "db").unwrap();
        let b = cache.open(tmp.path(), "db").unwrap();
        a.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, x)")
            .unwrap();
        a.execute("INSERT INTO t (x) VALUES (1)", vec![]).unwrap();
        b.execute("INSERT INTO t (x) VALUES (2)", vec![]).unwrap();
        assert_eq!(
            cache.idle_count(&path),
            1,
            "both ran on one host connection"
        );
        // The last insert rowid is each guest connection's own.
        assert_eq!(a.last_insert_rowid(), 1);
        assert_eq!(b.last_insert_rowid(), 2);
        let c = cache.open(tmp.path(), "db").unwrap();
        assert_eq!(c.last_insert_rowid(), 0);
        a.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert_eq!(
            a.last_insert_rowid(),
            1,
            "a statement inserting nothing keeps it"
        );
        // Inside a transaction a guest connection holds a host connection; the others use
        // another meanwhile and do not see its uncommitted rows.
        a.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert!(a.holds_connection());
        assert_eq!(cache.idle_count(&path), 0);
        a.execute("INSERT INTO t (x) VALUES (3)", vec![]).unwrap();
        let rows = b.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(2)));
        assert_eq!(cache.idle_count(&path), 1);
        a.execute_batch("COMMIT;").unwrap();
        assert!(!a.holds_connection());
        assert_eq!(cache.idle_count(&path), 2);
        assert_eq!(a.last_insert_rowid(), 3);
        let rows = b.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(3)));
    }

    #[test]
    fn a_guest_connection_that_changes_connection_state_keeps_its_host_connection() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let temp = "CREATE TEMP TABLE IF NOT EXISTS scratch (x)";
        let a = cache.open(tmp.path(), "db").unwrap();
        a.execute(temp, vec![]).unwrap();
        assert!(a.holds_connection());
        // Another guest connection's statements run on another host connection meanwhile;
        // the temporary table stays with `a`.
        let b = cache.open(tmp.path(), "db").unwrap();
        b.execute_batch("CREATE TABLE t (x)").unwrap();
        assert!(!b.holds_connection());
        a.execute("INSERT INTO scratch VALUES (1)", vec![]).unwrap();
        drop(a);
        // The same statement again, on the host connection `a` used (now the most recent
        // idle one): it is prepared again, not taken from the statement cache unseen by the
        // authorizer, so this guest connection keeps its host connection too.
        let c = cache.open(tmp.path(), "db").unwrap();
        c.execute(temp, vec![]).unwrap();
        assert!(c.holds_connection());
        // No allowed pragma changes the connection, read or set; a temporary view does.
        let d = cache.open(tmp.path(), "db").unwrap();
        d.query("PRAGMA user_version", vec![]).unwrap();
        d.execute_batch("PRAGMA user_version = 2").unwrap();
        assert!(!d.holds_connection());
        d.execute_batch("CREATE TEMP VIEW v AS SELECT 1").unwrap();
        assert!(d.holds_connection());
    }
}
