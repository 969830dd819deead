//! The `sqlite` import: each plugin's own SQLite databases, over rusqlite.
//!
//! A database name maps to `DATA_DIR/plugins/<plugin-id>/<name>.sqlite3`; the directory is
//! created 0700 and files 0600, and names that could leave the directory (or are awkward as
//! file names) are refused. Every connection runs in WAL mode with a 5 s busy timeout and
//! foreign keys on. SQL errors are returned as the WIT `error` variant, never as traps.
//! Dropping a connection closes it, which rolls back a transaction left open.
//!
//! Calls run synchronously on the calling task: SQLite work here is short, and a plugin
//! waiting on a lock is bounded by the busy timeout. Waiting on a lock is the exception: the
//! busy handler hands the runtime worker to other tasks before it sleeps
//! (`block_in_place`), because the lock holder may be another guest that yielded between
//! its `BEGIN IMMEDIATE` and its `COMMIT`; with every worker asleep in a busy handler it
//! could never run to release the lock, and every waiter would fail after the timeout.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{ErrorCode, OpenFlags};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::bindings::pool::pooler::plugins::sqlite::{
    self, Error, Host, HostConnection, Rows, Value,
};

/// How long a statement waits for a lock held by another connection.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Open connections one instance may hold.
pub const MAX_CONNECTIONS: usize = 8;
/// Longest database name.
pub const MAX_NAME_CHARS: usize = 64;

/// An open connection: the host side of the WIT `connection` resource.
pub struct Connection {
    conn: rusqlite::Connection,
}

/// Per-instance state of the import.
pub struct SqliteCtx {
    /// The plugin's own directory (`DATA_DIR/plugins/<plugin-id>`).
    dir: PathBuf,
    open: usize,
}

impl SqliteCtx {
    pub fn new(dir: PathBuf) -> Self {
        SqliteCtx { dir, open: 0 }
    }
}

/// What the generated `Host` traits are implemented on.
pub struct SqliteView<'a> {
    pub ctx: &'a mut SqliteCtx,
    pub table: &'a mut ResourceTable,
}

struct SqliteImport;
impl HasData for SqliteImport {
    type Data<'a> = SqliteView<'a>;
}

/// Add the `sqlite` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> SqliteView<'_>,
) -> wasmtime::Result<()> {
    sqlite::add_to_linker::<T, SqliteImport>(linker, view)
}

/// Why `name` cannot be a database name, if it cannot.
pub fn check_name(name: &str) -> Result<(), Error> {
    let refused = name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.contains(['/', '\\'])
        || name.contains("..")
        || name.chars().any(char::is_control)
        || Path::new(name).is_absolute();
    if refused {
        Err(Error::InvalidName(name.to_string()))
    } else {
        Ok(())
    }
}

/// Create `dir` (and parents) and make it private to the owner.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    set_mode(dir, 0o700)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// Create the database file 0600 before SQLite opens it (SQLite gives its -wal and -shm
/// files the same mode as the database).
fn private_file(path: &Path) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => set_mode(path, 0o600),
        Err(e) => Err(e),
    }
}

/// Open `name` in `dir` with the host's settings.
pub fn open(dir: &Path, name: &str) -> Result<rusqlite::Connection, Error> {
    check_name(name)?;
    private_dir(dir)
        .map_err(|e| Error::Io(format!("cannot create the plugin's directory: {e}")))?;
    let path = dir.join(format!("{name}.sqlite3"));
    private_file(&path).map_err(|e| Error::Io(format!("cannot create database `{name}`: {e}")))?;
    let mut conn = rusqlite::Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(map_error)?;
    conn.busy_handler(Some(wait_for_lock)).map_err(map_error)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(map_error)?;
    // In WAL mode, NORMAL syncs at checkpoints instead of on every commit: a crash of the
    // host or the plugin loses nothing and the database stays consistent; only a power
    // loss can drop the last transactions. FULL cost an fsync per commit, and a pooled
    // request commits several times (pins, cursor, observations).
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(map_error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(map_error)?;
    Ok(conn)
}

/// SQLite's busy handler: sleep a little and try again, for at most [`BUSY_TIMEOUT`] in all.
/// On a multi-threaded tokio runtime the sleep happens in `block_in_place`, so the worker's
/// other tasks (the lock holder among them) keep running meanwhile. Only contended calls get
/// here.
///
/// The waits start at 50 µs and double up to 10 ms. Plugin transactions last tens of
/// microseconds, and the usual contention is a request's first transaction meeting the
/// previous request's last one (its response already sent): SQLite's own schedule, which
/// starts at 1 ms and soon waits 25 ms, cost a pooled request ~10 ms of sleeping.
fn wait_for_lock(attempt: i32) -> bool {
    let Some(delay) = lock_wait(attempt) else {
        return false;
    };
    let sleep = || std::thread::sleep(delay);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(sleep)
        }
        _ => sleep(),
    }
    true
}

/// How long to wait before try `attempt + 1` (attempt 0 is the first retry), or None once
/// [`BUSY_TIMEOUT`] has been spent.
fn lock_wait(attempt: i32) -> Option<Duration> {
    const FIRST_US: u64 = 50;
    const LONGEST_US: u64 = 10_000;
    let n = u32::try_from(attempt).unwrap_or(0);
    // Waited so far: the doubling steps below the cap, then whole caps.
    let doublings = (LONGEST_US / FIRST_US).ilog2(); // steps before the cap is reached
    let waited_us: u64 = (0..n.min(doublings)).map(|i| FIRST_US << i).sum::<u64>()
        + u64::from(n.saturating_sub(doublings)) * LONGEST_US;
    let delay_us = if n < doublings {
        FIRST_US << n
    } else {
        LONGEST_US
    };
    let limit_us = BUSY_TIMEOUT.as_micros() as u64;
    if waited_us >= limit_us {
        return None;
    }
    Some(Duration::from_micros(delay_us.min(limit_us - waited_us)))
}

/// rusqlite's error as the WIT variant.
pub fn map_error(e: rusqlite::Error) -> Error {
    match &e {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let text = message.clone().unwrap_or_else(|| failure.to_string());
            match failure.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Error::Busy,
                ErrorCode::ConstraintViolation => Error::Constraint(text),
                ErrorCode::CannotOpen
                | ErrorCode::ReadOnly
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::PermissionDenied
                | ErrorCode::DatabaseCorrupt
                | ErrorCode::NotADatabase
                | ErrorCode::OutOfMemory => Error::Io(text),
                _ => Error::InvalidStatement(text),
            }
        }
        _ => Error::InvalidStatement(e.to_string()),
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
    /// Run one statement; a statement that returns rows is stepped to its end.
    pub fn execute(&self, sql: &str, params: Vec<Value>) -> Result<u64, Error> {
        let mut stmt = self.conn.prepare(sql).map_err(map_error)?;
        let params = rusqlite::params_from_iter(params.into_iter().map(to_sql));
        if stmt.readonly() || stmt.column_count() > 0 {
            let mut rows = stmt.query(params).map_err(map_error)?;
            while rows.next().map_err(map_error)?.is_some() {}
            return Ok(self.conn.changes());
        }
        stmt.execute(params).map(|n| n as u64).map_err(map_error)
    }

    pub fn execute_batch(&self, sql: &str) -> Result<(), Error> {
        self.conn.execute_batch(sql).map_err(map_error)
    }

    pub fn query(&self, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
        let mut stmt = self.conn.prepare(sql).map_err(map_error)?;
        let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
        let width = columns.len();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.into_iter().map(to_sql)))
            .map_err(map_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(map_error)? {
            let mut cells = Vec::with_capacity(width);
            for i in 0..width {
                cells.push(from_sql(row.get_ref(i).map_err(map_error)?));
            }
            out.push(cells);
        }
        Ok(Rows { columns, rows: out })
    }

    pub fn last_insert_rowid(&self) -> i64 {
        self.conn.last_insert_rowid()
    }
}

impl Host for SqliteView<'_> {}

impl HostConnection for SqliteView<'_> {
    fn open(&mut self, name: String) -> wasmtime::Result<Result<Resource<Connection>, Error>> {
        if let Err(e) = check_name(&name) {
            return Ok(Err(e));
        }
        if self.ctx.open >= MAX_CONNECTIONS {
            return Ok(Err(Error::TooManyConnections));
        }
        let conn = match open(&self.ctx.dir, &name) {
            Ok(conn) => conn,
            Err(e) => return Ok(Err(e)),
        };
        let handle = self.table.push(Connection { conn })?;
        self.ctx.open += 1;
        Ok(Ok(handle))
    }

    fn execute(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, Error>> {
        Ok(self.table.get(&conn)?.execute(&sql, params))
    }

    fn execute_batch(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
    ) -> wasmtime::Result<Result<(), Error>> {
        Ok(self.table.get(&conn)?.execute_batch(&sql))
    }

    fn query(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, Error>> {
        Ok(self.table.get(&conn)?.query(&sql, params))
    }

    fn last_insert_rowid(&mut self, conn: Resource<Connection>) -> wasmtime::Result<i64> {
        Ok(self.table.get(&conn)?.last_insert_rowid())
    }

    fn drop(&mut self, conn: Resource<Connection>) -> wasmtime::Result<()> {
        // Closing the connection rolls back a transaction the plugin left open.
        self.table.delete(conn)?;
        self.ctx.open = self.ctx.open.saturating_sub(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_waits_start_short_and_add_up_to_the_busy_timeout() {
        let first: Vec<u128> = (0..4).map(|n| lock_wait(n).unwrap().as_micros()).collect();
        assert_eq!(first, [50, 100, 200, 400]);
        assert_eq!(lock_wait(20).unwrap(), Duration::from_millis(10));
        let mut total = Duration::ZERO;
        let mut attempt = 0;
        while let Some(wait) = lock_wait(attempt) {
            total += wait;
            attempt += 1;
        }
        assert_eq!(total, BUSY_TIMEOUT);
    }

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        for name in [
            "",
            "..",
            "../x",
            "a/b",
            "a\\b",
            "/abs",
            "x\u{0}",
            "tab\t",
            &"n".repeat(65),
        ] {
            assert!(
                matches!(check_name(name), Err(Error::InvalidName(n)) if n == name),
                "{name:?}"
            );
        }
        for name in ["pool", "retry-state", "a.b", &"n".repeat(64)] {
            assert!(check_name(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn files_are_private_and_typed_values_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("plugins").join("p");
        let conn = Connection {
            conn: open(&dir, "db").unwrap(),
        };
        conn.execute_batch("CREATE TABLE t (a, b, c, d, e)")
            .unwrap();
        let values = vec![
            Value::Null,
            Value::Integer(i64::MIN),
            Value::Real(-0.25),
            Value::Text("ü".into()),
            Value::Blob(vec![0, 1, 255]),
        ];
        assert_eq!(
            conn.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?)", values.clone())
                .unwrap(),
            1
        );
        let rows = conn.query("SELECT * FROM t", vec![]).unwrap();
        assert_eq!(rows.columns, ["a", "b", "c", "d", "e"]);
        assert_eq!(rows.rows.len(), 1);
        for (got, want) in rows.rows[0].iter().zip(&values) {
            assert_eq!(format!("{got:?}"), format!("{want:?}"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&dir), 0o700);
            assert_eq!(mode(&dir.join("db.sqlite3")), 0o600);
        }
        let mode: String = conn
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn sql_errors_are_values_of_the_right_case() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection {
            conn: open(tmp.path(), "db").unwrap(),
        };
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
    fn a_connection_dropped_in_a_transaction_rolls_back() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Connection {
            conn: open(tmp.path(), "db").unwrap(),
        };
        first.execute_batch("CREATE TABLE t (x)").unwrap();
        {
            let tx = Connection {
                conn: open(tmp.path(), "db").unwrap(),
            };
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
}
