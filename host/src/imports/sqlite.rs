//! The `sqlite` import: each plugin's own SQLite databases, over rusqlite.
//!
//! A database name maps to `DATA_DIR/plugins/<plugin-id>/<name>.sqlite3`; the directory is
//! created 0700 and files 0600, and names that could leave the directory (or are awkward as
//! file names) are refused. Every connection runs in WAL mode with a 5 s busy timeout and
//! foreign keys on, and may not attach other database files. SQL errors are returned as the
//! WIT `error` variant, never as traps. Dropping a connection rolls back a transaction left
//! open.
//!
//! Connections outlive the instance that opened them: a dropped one goes back to a
//! [`ConnectionCache`] keyed by its file, and the next instance of the same plugin that opens
//! that database gets it (with its prepared statements) instead of a new one. A fresh
//! instance per request would otherwise open and close the database on every request, and
//! closing the last connection of a WAL database checkpoints it, syncs it twice and deletes
//! its -wal and -shm files, which the next open creates again: measured at several
//! milliseconds per pooled request.
//!
//! Calls run synchronously on the calling task: SQLite work here is short, and a plugin
//! waiting on a lock is bounded by the busy timeout. Waiting on a lock is the exception: the
//! busy handler hands the runtime worker to other tasks before it sleeps
//! (`block_in_place`), because the lock holder may be another guest that yielded between
//! its `BEGIN IMMEDIATE` and its `COMMIT`; with every worker asleep in a busy handler it
//! could never run to release the lock, and every waiter would fail after the timeout.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
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
/// Idle connections kept per database file; more than this in use at once are closed when
/// dropped. Each request in flight holds one, so this bounds what a burst leaves open; with
/// 16, a load of 64 concurrent pooled requests opened and closed a connection on most
/// requests (measured 437 vs 576 requests/s at 64 clients).
pub const MAX_IDLE_PER_DATABASE: usize = 64;
/// How often the host copies plugin databases' write-ahead logs back into the database
/// files ([`ConnectionCache::checkpoint`]), off the request path.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// WAL pages after which a committing connection checkpoints by itself: only reached when
/// the background checkpoints fall behind. SQLite's default (1,000 pages) made every
/// ~250th pooled request copy the log back and sync the database file twice on its way.
const AUTOCHECKPOINT_PAGES: i64 = 16_384;
/// Prepared statements kept per connection. A plugin issues a few dozen distinct
/// statements; preparing one costs more than running it.
const STATEMENT_CACHE: usize = 128;

/// Open connections no instance is using, by database file, shared by every store of the
/// host. Only the plugin whose directory holds a file ever opens it, so a connection never
/// passes between plugins.
#[derive(Default)]
pub struct ConnectionCache {
    idle: Mutex<HashMap<PathBuf, Idle>>,
    /// Per database file: its commits, which connections waiting for its write lock
    /// wake on.
    commits: Mutex<HashMap<PathBuf, Arc<Commits>>>,
}

/// Write transactions ended on one database file (committed or rolled back), counted so
/// a connection waiting for the write lock wakes as soon as it may be free instead of
/// sleeping a fixed time and polling. Under load that polling was most of a pooled
/// request's time: at 64 clients each request waited ~3 times, ~11 ms in all.
#[derive(Default)]
pub struct Commits {
    count: Mutex<u64>,
    changed: std::sync::Condvar,
}

impl Commits {
    fn ended(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_all();
    }

    fn current(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until a write transaction ends after `seen` (or `timeout` passes); the count
    /// then.
    fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let (count, _) = self
            .changed
            .wait_timeout_while(count, timeout, |now| *now == seen)
            .unwrap_or_else(|e| e.into_inner());
        *count
    }
}

/// The idle connections of one database file, and which file they have open.
struct Idle {
    file: FileId,
    connections: Vec<rusqlite::Connection>,
}

/// What identifies a file across renames: a connection keeps the file it opened, so when
/// the path names another file (restored from a backup, moved away, replaced by something
/// that is not a database) the idle connections are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(not(unix))]
    len: u64,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        let meta = fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            })
        }
        #[cfg(not(unix))]
        Some(FileId { len: meta.len() })
    }
}

impl ConnectionCache {
    pub fn new() -> Arc<Self> {
        Arc::new(ConnectionCache::default())
    }

    /// A connection to `name` in `dir`: an idle one if there is one, else a new one.
    pub fn open(self: &Arc<Self>, dir: &Path, name: &str) -> Result<Connection, Error> {
        check_name(name)?;
        let path = dir.join(format!("{name}.sqlite3"));
        let file = FileId::of(&path);
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            match idle.get_mut(&path) {
                Some(entry) if Some(entry.file) == file => entry.connections.pop(),
                Some(_) => {
                    // The path names another file now (or none): close what was kept.
                    idle.remove(&path);
                    None
                }
                None => None,
            }
        };
        let commits = self
            .commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path.clone())
            .or_default()
            .clone();
        let (conn, file) = match (reused, file) {
            (Some(conn), Some(file)) => (conn, file),
            _ => {
                let mut conn = open(dir, name)?;
                signal_commits(&mut conn, &commits).map_err(map_error)?;
                let file = FileId::of(&path)
                    .ok_or_else(|| Error::Io(format!("database `{name}` is not a regular file")))?;
                (conn, file)
            }
        };
        Ok(Connection {
            conn: Some(conn),
            path,
            file: Some(file),
            cache: Some(self.clone()),
            commits: Some(commits),
        })
    }

    /// Take `conn` (open on `file`) back, unless enough are idle already or the path now
    /// names another file (then it closes).
    fn put(&self, path: PathBuf, file: FileId, conn: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let entry = idle.entry(path).or_insert_with(|| Idle {
            file,
            connections: Vec::new(),
        });
        if entry.file == file && entry.connections.len() < MAX_IDLE_PER_DATABASE {
            entry.connections.push(conn);
        }
    }

    /// Checkpoint every database that has an idle connection (`PASSIVE`: copy what the
    /// write-ahead log holds back into the database file without waiting for anyone), so
    /// the log stays short and no request pays for it. Blocking; run off the runtime's
    /// workers.
    pub fn checkpoint(&self) {
        let paths: Vec<PathBuf> = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for path in paths {
            let taken = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.get_mut(&path)
                    .and_then(|entry| Some((entry.file, entry.connections.pop()?)))
            };
            let Some((file, conn)) = taken else {
                continue;
            };
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::warn!(database = %path.display(), error = %e, "checkpoint failed");
            }
            self.put(path, file, conn);
        }
    }

    /// Checkpoint every [`CHECKPOINT_INTERVAL`] on the blocking pool, until `cache` is
    /// dropped. Needs a tokio runtime.
    pub fn spawn_checkpoints(cache: &Arc<ConnectionCache>) {
        let weak = Arc::downgrade(cache);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(CHECKPOINT_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(cache) = weak.upgrade() else {
                    return;
                };
                let _ = tokio::task::spawn_blocking(move || cache.checkpoint()).await;
            }
        });
    }

    /// How many idle connections are kept for `path`.
    pub fn idle_count(&self, path: &Path) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .map_or(0, |entry| entry.connections.len())
    }
}

/// An open connection: the host side of the WIT `connection` resource. Dropping it rolls
/// back a transaction left open, then hands it back to its cache (if it came from one).
pub struct Connection {
    conn: Option<rusqlite::Connection>,
    path: PathBuf,
    file: Option<FileId>,
    cache: Option<Arc<ConnectionCache>>,
    /// The commits of its file, when it came from a cache (lock waits wake on them).
    commits: Option<Arc<Commits>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // A transaction the plugin left open (it trapped, ran out of time, or forgot to
        // commit) is rolled back now, so the next user starts clean and no lock is held.
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            // Cannot tell what state it is in: close it rather than hand it on.
            return;
        }
        if let (Some(cache), Some(file)) = (&self.cache, self.file) {
            cache.put(std::mem::take(&mut self.path), file, conn);
        }
    }
}

/// Per-instance state of the import.
pub struct SqliteCtx {
    /// The plugin's own directory (`DATA_DIR/plugins/<plugin-id>`).
    dir: PathBuf,
    cache: Arc<ConnectionCache>,
    open: usize,
    /// Connections of this instance inside a transaction.
    transactions: usize,
}

impl SqliteCtx {
    pub fn new(dir: PathBuf, cache: Arc<ConnectionCache>) -> Self {
        SqliteCtx {
            dir,
            cache,
            open: 0,
            transactions: 0,
        }
    }

    /// Whether the instance has a transaction open (and so may hold a database lock other
    /// instances wait for): the host does not make it yield to other tasks meanwhile.
    pub fn in_transaction(&self) -> bool {
        self.transactions > 0
    }

    /// Run `f` on `conn` and keep count of whether it left a transaction open.
    fn tracked<R>(&mut self, conn: &Connection, f: impl FnOnce(&Connection) -> R) -> R {
        let before = conn.in_transaction();
        let result = f(conn);
        match (before, conn.in_transaction()) {
            (false, true) => self.transactions += 1,
            (true, false) => self.transactions = self.transactions.saturating_sub(1),
            _ => {}
        }
        result
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
    conn.pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT_PAGES)
        .map_err(map_error)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Keep a prepared statement's plan when its parameters are rebound. Otherwise SQLite
    // marks a statement whose plan *could* depend on a bound value (a parameter compared in
    // a join, a LIKE, ...) for re-preparing whenever its bindings are cleared, which the
    // statement cache does on every reuse: a cached three-join SELECT was parsed and planned
    // again on every run (measured 60-110 µs instead of 15).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(map_error)?;
    conn.authorizer(Some(authorize)).map_err(map_error)?;
    Ok(conn)
}

/// Refuse what would reach files outside the plugin's own database: attaching another
/// file (`ATTACH`, and `VACUUM INTO` which attaches its target) and the pragmas that move
/// SQLite's temporary or data files. `ATTACH ''` (a private temporary database, which
/// plain `VACUUM` uses) stays allowed; a file name given as an expression rather than a
/// literal cannot be checked, so it is refused.
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Attach { filename: "" } => Authorization::Allow,
        AuthAction::Attach { .. } => Authorization::Deny,
        AuthAction::Unknown { code, .. } if code == rusqlite::ffi::SQLITE_ATTACH => {
            Authorization::Deny
        }
        AuthAction::Pragma { pragma_name, .. }
            if pragma_name.eq_ignore_ascii_case("temp_store_directory")
                || pragma_name.eq_ignore_ascii_case("data_store_directory") =>
        {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }
}

/// Count `conn`'s ended write transactions in `commits`. The WAL hook runs after a commit
/// has released the write lock; a rollback is seen just before it releases the lock (a
/// waiter woken that early finds the lock still held and waits again). Installing a WAL
/// hook replaces SQLite's automatic checkpoint, so the hook checkpoints when the log
/// passes [`AUTOCHECKPOINT_PAGES`] as that would have.
fn signal_commits(conn: &mut rusqlite::Connection, commits: &Arc<Commits>) -> rusqlite::Result<()> {
    let on_commit = commits.clone();
    conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
        on_commit.ended();
        if i64::from(pages) >= AUTOCHECKPOINT_PAGES {
            // PASSIVE (the default mode), like the automatic checkpoint; one that finds
            // the database busy is simply tried again later.
            let _ = wal.checkpoint();
        }
        Ok(())
    }))?;
    let on_rollback = commits.clone();
    conn.rollback_hook(Some(move || on_rollback.ended()))?;
    Ok(())
}

thread_local! {
    /// The commits of the database the statement running on this thread uses, and the
    /// count when it started: what [`wait_for_lock`] waits on.
    static WAITING: std::cell::Cell<Option<(*const Commits, u64)>> =
        const { std::cell::Cell::new(None) };
}

/// Run `f` (one SQLite call on a connection of `commits`' file) so that its lock waits
/// wake on that file's commits.
fn with_commits<R>(commits: Option<&Arc<Commits>>, f: impl FnOnce() -> R) -> R {
    let Some(commits) = commits else {
        return f();
    };
    let previous = WAITING.replace(Some((Arc::as_ptr(commits), commits.current())));
    let result = f();
    WAITING.set(previous);
    result
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
    let sleep = || match WAITING.get() {
        // SAFETY: the pointer is set only for the duration of a call made through
        // `with_commits`, which holds an `Arc` to it; the handler runs inside that call.
        Some((commits, seen)) => {
            let now = unsafe { &*commits }.wait_past(seen, delay);
            WAITING.set(Some((commits, now)));
        }
        None => std::thread::sleep(delay),
    };
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
    /// A connection of its own (not from a cache): it closes when dropped.
    pub fn open_uncached(dir: &Path, name: &str) -> Result<Connection, Error> {
        Ok(Connection {
            conn: Some(open(dir, name)?),
            path: PathBuf::new(),
            file: None,
            cache: None,
            commits: None,
        })
    }

    /// Whether a transaction is open on it.
    pub fn in_transaction(&self) -> bool {
        !self.conn().is_autocommit()
    }

    fn conn(&self) -> &rusqlite::Connection {
        self.conn
            .as_ref()
            .expect("a connection is only taken when it is dropped")
    }

    /// Run one statement; a statement that returns rows is stepped to its end.
    pub fn execute(&self, sql: &str, params: Vec<Value>) -> Result<u64, Error> {
        with_commits(self.commits.as_ref(), || self.execute_now(sql, params))
    }

    fn execute_now(&self, sql: &str, params: Vec<Value>) -> Result<u64, Error> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql).map_err(map_error)?;
        let params = rusqlite::params_from_iter(params.into_iter().map(to_sql));
        if stmt.readonly() || stmt.column_count() > 0 {
            let mut rows = stmt.query(params).map_err(map_error)?;
            while rows.next().map_err(map_error)?.is_some() {}
            return Ok(conn.changes());
        }
        stmt.execute(params).map(|n| n as u64).map_err(map_error)
    }

    pub fn execute_batch(&self, sql: &str) -> Result<(), Error> {
        with_commits(self.commits.as_ref(), || {
            self.conn().execute_batch(sql).map_err(map_error)
        })
    }

    pub fn query(&self, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
        with_commits(self.commits.as_ref(), || self.query_now(sql, params))
    }

    fn query_now(&self, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
        let mut stmt = self.conn().prepare_cached(sql).map_err(map_error)?;
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
        self.conn().last_insert_rowid()
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
        let conn = match self.ctx.cache.open(&self.ctx.dir, &name) {
            Ok(conn) => conn,
            Err(e) => return Ok(Err(e)),
        };
        let handle = self.table.push(conn)?;
        self.ctx.open += 1;
        Ok(Ok(handle))
    }

    fn execute(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, Error>> {
        let conn = self.table.get(&conn)?;
        Ok(self.ctx.tracked(conn, |c| c.execute(&sql, params)))
    }

    fn execute_batch(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
    ) -> wasmtime::Result<Result<(), Error>> {
        let conn = self.table.get(&conn)?;
        Ok(self.ctx.tracked(conn, |c| c.execute_batch(&sql)))
    }

    fn query(
        &mut self,
        conn: Resource<Connection>,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, Error>> {
        let conn = self.table.get(&conn)?;
        Ok(self.ctx.tracked(conn, |c| c.query(&sql, params)))
    }

    fn last_insert_rowid(&mut self, conn: Resource<Connection>) -> wasmtime::Result<i64> {
        Ok(self.table.get(&conn)?.last_insert_rowid())
    }

    fn drop(&mut self, conn: Resource<Connection>) -> wasmtime::Result<()> {
        // Closing the connection rolls back a transaction the plugin left open.
        let conn = self.table.delete(conn)?;
        if conn.in_transaction() {
            self.ctx.transactions = self.ctx.transactions.saturating_sub(1);
        }
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
        let conn = Connection::open_uncached(&dir, "db").unwrap();
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
            .conn()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

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
    fn a_dropped_connection_is_reused_clean_and_idle_ones_are_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let path = tmp.path().join("db.sqlite3");
        let first = cache.open(tmp.path(), "db").unwrap();
        // A temporary table lives only as long as its connection: it marks this one.
        first
            .execute_batch(
                "CREATE TABLE t (x); CREATE TEMP TABLE marker (x);
                 BEGIN IMMEDIATE; INSERT INTO t VALUES (1);",
            )
            .unwrap();
        drop(first);
        assert_eq!(cache.idle_count(&path), 1);
        // The same connection comes back, with the left-open transaction rolled back.
        let again = cache.open(tmp.path(), "db").unwrap();
        assert!(again.query("SELECT * FROM temp.marker", vec![]).is_ok());
        assert!(again.conn().is_autocommit());
        let rows = again.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(0)));
        assert_eq!(cache.idle_count(&path), 0);
        drop(again);
        // A burst leaves at most MAX_IDLE_PER_DATABASE open.
        let burst: Vec<Connection> = (0..MAX_IDLE_PER_DATABASE + 3)
            .map(|_| cache.open(tmp.path(), "db").unwrap())
            .collect();
        drop(burst);
        assert_eq!(cache.idle_count(&path), MAX_IDLE_PER_DATABASE);
        // Another name is another file, with connections of its own.
        let other = cache.open(tmp.path(), "other").unwrap();
        assert!(other.query("SELECT count(*) FROM t", vec![]).is_err());
    }

    #[test]
    fn idle_connections_of_a_moved_or_replaced_file_are_not_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let path = tmp.path().join("db.sqlite3");
        let first = cache.open(tmp.path(), "db").unwrap();
        first.execute_batch("CREATE TABLE t (x)").unwrap();
        drop(first);
        assert_eq!(cache.idle_count(&path), 1);
        // Moved away, and a directory in its place: opening fails rather than writing on
        // through the kept connection to the moved file.
        fs::rename(&path, tmp.path().join("aside")).unwrap();
        fs::create_dir(&path).unwrap();
        assert!(matches!(cache.open(tmp.path(), "db"), Err(Error::Io(_))));
        assert_eq!(cache.idle_count(&path), 0);
        // A fresh file in its place is a fresh database.
        fs::remove_dir(&path).unwrap();
        let again = cache.open(tmp.path(), "db").unwrap();
        assert!(again.query("SELECT count(*) FROM t", vec![]).is_err());
    }

    #[test]
    fn other_files_cannot_be_attached_or_written() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.sqlite3");
        rusqlite::Connection::open(&outside)
            .unwrap()
            .execute_batch("CREATE TABLE secret (x); INSERT INTO secret VALUES (42);")
            .unwrap();
        let dir = tmp.path().join("plugins").join("p");
        let conn = Connection::open_uncached(&dir, "db").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let file = outside.display().to_string();
        for sql in [
            format!("ATTACH '{file}' AS o"),
            format!("ATTACH 'file:{file}?mode=ro' AS o"),
            format!("ATTACH '{file}' || '' AS o"),
            format!(
                "VACUUM INTO '{}'",
                tmp.path().join("copy.sqlite3").display()
            ),
            format!("PRAGMA temp_store_directory = '{}'", tmp.path().display()),
        ] {
            assert!(
                matches!(conn.execute_batch(&sql), Err(Error::InvalidStatement(_))),
                "{sql} was allowed"
            );
        }
        assert!(!tmp.path().join("copy.sqlite3").exists());
        // A private temporary database and plain VACUUM still work.
        conn.execute_batch("ATTACH '' AS scratch; DETACH scratch; VACUUM;")
            .unwrap();
    }

    #[test]
    fn a_cached_statement_is_not_planned_again_when_rebound() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        conn.execute_batch(
            "CREATE TABLE a (id TEXT PRIMARY KEY, p TEXT);
             CREATE TABLE s (a TEXT PRIMARY KEY, x);
             INSERT INTO a VALUES ('1', 'claude'), ('2', 'codex');",
        )
        .unwrap();
        // A parameter compared in a query with a join: without the planner stability
        // setting, SQLite re-prepares this on every reuse from the statement cache.
        let sql = "SELECT a.id, s.x FROM a LEFT JOIN s ON s.a = a.id WHERE a.p = ?1";
        for p in ["claude", "codex", "claude"] {
            let rows = conn.query(sql, vec![Value::Text(p.into())]).unwrap();
            assert_eq!(rows.rows.len(), 1);
        }
        let stmt = conn.conn().prepare_cached(sql).unwrap();
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "the cached statement was prepared again"
        );
    }

    #[test]
    fn checkpoints_move_the_log_into_the_database_file() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let conn = cache.open(tmp.path(), "db").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(conn);
        // A reader that ignores the log sees only what the database file holds.
        let file_only = || {
            let uri = format!(
                "file:{}?immutable=1",
                tmp.path().join("db.sqlite3").display()
            );
            let c = rusqlite::Connection::open_with_flags(
                uri,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
            )
            .unwrap();
            c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .ok()
        };
        assert_eq!(file_only(), None, "committed to the log only");
        cache.checkpoint();
        assert_eq!(file_only(), Some(1));
        // The connection went back to the cache.
        assert_eq!(cache.idle_count(&tmp.path().join("db.sqlite3")), 1);
    }

    #[test]
    fn ended_write_transactions_are_counted_and_wake_waiters() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let a = cache.open(tmp.path(), "db").unwrap();
        let commits = a.commits.clone().unwrap();
        let start = commits.current();
        a.execute_batch("CREATE TABLE t (x)").unwrap();
        assert_eq!(commits.current(), start + 1, "a commit");
        a.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1); ROLLBACK;")
            .unwrap();
        assert_eq!(commits.current(), start + 2, "a rollback");
        // Another connection of the same file shares the count.
        let b = cache.open(tmp.path(), "db").unwrap();
        assert!(Arc::ptr_eq(b.commits.as_ref().unwrap(), &commits));
        // A waiter wakes on the next end, long before its timeout.
        let seen = commits.current();
        let waiter = {
            let commits = commits.clone();
            std::thread::spawn(move || commits.wait_past(seen, Duration::from_secs(600)))
        };
        b.execute("INSERT INTO t VALUES (2)", vec![]).unwrap();
        assert_eq!(waiter.join().unwrap(), seen + 1);
    }

    #[test]
    fn a_connection_waiting_for_the_write_lock_gets_it_when_the_holder_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let holder = cache.open(tmp.path(), "db").unwrap();
        holder
            .execute_batch("CREATE TABLE t (x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
            .unwrap();
        let writer = {
            let cache = cache.clone();
            let dir = tmp.path().to_path_buf();
            std::thread::spawn(move || {
                let c = cache.open(&dir, "db").unwrap();
                c.execute("INSERT INTO t VALUES (2)", vec![])
            })
        };
        // Whenever the writer got to its insert, it waits for (or follows) this commit.
        holder.execute_batch("COMMIT").unwrap();
        assert_eq!(writer.join().unwrap().unwrap(), 1);
        let rows = holder.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(2)));
    }

    #[test]
    fn the_import_knows_when_an_instance_has_a_transaction_open() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let mut ctx = SqliteCtx::new(tmp.path().to_path_buf(), cache.clone());
        let conn = cache.open(tmp.path(), "db").unwrap();
        ctx.tracked(&conn, |c| c.execute_batch("CREATE TABLE t (x)"))
            .unwrap();
        assert!(!ctx.in_transaction());
        ctx.tracked(&conn, |c| c.execute_batch("BEGIN IMMEDIATE"))
            .unwrap();
        assert!(ctx.in_transaction());
        ctx.tracked(&conn, |c| c.execute("INSERT INTO t VALUES (1)", vec![]))
            .unwrap();
        assert!(ctx.in_transaction());
        ctx.tracked(&conn, |c| c.execute_batch("COMMIT")).unwrap();
        assert!(!ctx.in_transaction());
    }
}
