//! The `sqlite` import: each plugin's own SQLite databases, over rusqlite.
//!
//! A database name maps to `DATA_DIR/plugins/<plugin-id>/<name>.sqlite3` (directory 0700,
//! files 0600); names that could leave the directory are refused, and so is attaching
//! another file. SQL errors are WIT `error` values, never traps; dropping a connection rolls
//! back a transaction left open. The settings (WAL, `synchronous=NORMAL`, 5 s of lock waits,
//! foreign keys, QPSG) and the measurements behind them: `docs/04-sqlite-settings.md`.
//!
//! Host connections outlive instances ([`ConnectionCache`], per file), and a guest's
//! `connection` borrows one per statement, holding it only inside a transaction or after
//! changing per-connection state (a pragma given a value, a temporary table, `ATTACH ''`),
//! so the most used connection keeps its page cache. Hence `last-insert-rowid` is kept per
//! guest connection, while SQL's `changes()` outside a transaction may report another
//! instance's statement.
//!
//! Calls run synchronously on the calling task; only a lock wait hands the worker on
//! (`block_in_place`), because the holder may be another guest between its `BEGIN` and its
//! `COMMIT` that needs a worker to finish.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pooler_core::sqlite_file::{self, Busy, ExistingFile, OpenError, Settings};
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
/// dropped. Sized for 64 concurrent requests, which 16 made reopen on most requests
/// (`docs/04-sqlite-settings.md`).
pub const MAX_IDLE_PER_DATABASE: usize = 64;
/// How often the host looks at plugin databases' write-ahead logs, to copy them back into
/// the database files or start them over ([`ConnectionCache::checkpoint`]), off the
/// request path.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Log frames (pages) after which the background checkpoint restarts the write-ahead log
/// (~16 MiB of 4 KiB pages): under steady load `PASSIVE` alone never lets the log start
/// over, and it grows until commits checkpoint inline (`docs/04-sqlite-settings.md`).
const RESTART_FRAMES: i64 = 4_096;
/// How long a restarting checkpoint waits for the writer and the readers before it gives
/// up until the next tick. Writers wait while it holds the write lock.
const RESTART_WAIT: Duration = Duration::from_millis(100);
/// WAL pages after which a committing connection checkpoints by itself: only reached when
/// the background checkpoints fall behind (SQLite's default, 1,000, put that on the request
/// path; `docs/04-sqlite-settings.md`).
const AUTOCHECKPOINT_PAGES: i64 = 16_384;

/// Open connections no instance is using, by database file, shared by every store of the
/// host. Only the plugin whose directory holds a file ever opens it, so a connection never
/// passes between plugins.
#[derive(Default)]
pub struct ConnectionCache {
    files: Mutex<HashMap<PathBuf, Arc<FileSlot>>>,
    /// Per database path: its commits, which connections waiting for its write lock
    /// wake on.
    commits: Mutex<HashMap<PathBuf, Arc<Commits>>>,
}

/// Write transactions ended on one database file (committed or rolled back), counted so
/// a connection waiting for the write lock wakes as soon as it may be free instead of
/// polling, which under load was most of a pooled request's time.
#[derive(Default)]
pub struct Commits {
    count: Mutex<u64>,
    changed: std::sync::Condvar,
    /// Frames in the write-ahead log after the last commit (from the WAL hook).
    frames: std::sync::atomic::AtomicI64,
}

impl Commits {
    fn ended(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_all();
    }

    /// Frames in the write-ahead log after the last commit.
    fn frames(&self) -> i64 {
        self.frames.load(std::sync::atomic::Ordering::Relaxed)
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

/// One database file: where it is, which file it was when opened, and its idle connections
/// (the most recently used last).
struct FileSlot {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    file: FileId,
    commits: Arc<Commits>,
    idle: Mutex<Vec<rusqlite::Connection>>,
    /// The commit count at the last checkpoint tick, and when this file was last
    /// checkpointed (see [`checkpoint_mode`]).
    ticks: Mutex<Ticks>,
}

/// What the background checkpoint remembers of a file between ticks.
#[derive(Default)]
struct Ticks {
    /// The commit count the previous tick saw.
    seen: Option<u64>,
    /// The commit count when the file was last checkpointed.
    checkpointed: Option<u64>,
}

impl FileSlot {
    /// The most recently used idle connection, or a new one.
    fn take(&self) -> Result<rusqlite::Connection, Error> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.open_new(),
        }
    }

    /// A new connection, refused if the path names another file than this slot's now (the
    /// database was moved or replaced since it was first opened).
    fn open_new(&self) -> Result<rusqlite::Connection, Error> {
        let mut conn = open(&self.dir, &self.name)?;
        if FileId::of(&self.path) != Some(self.file) {
            return Err(Error::Io(format!(
                "database `{}` was moved or replaced while open",
                self.name
            )));
        }
        signal_commits(&mut conn, &self.commits).map_err(map_error)?;
        Ok(conn)
    }

    /// Take `conn` back, unless enough are idle already (then it closes).
    fn put(&self, conn: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_PER_DATABASE {
            idle.push(conn);
        }
    }

    /// The least recently used idle connection, if any (for background work, which
    /// leaves the hot one to requests).
    fn take_coldest(&self) -> Option<rusqlite::Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        (!idle.is_empty()).then(|| idle.remove(0))
    }

    /// Take back a connection [`take_coldest`](Self::take_coldest) gave out, as the least
    /// recently used again (or close it, like [`put`](Self::put), when enough are idle).
    fn put_coldest(&self, conn: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_PER_DATABASE {
            idle.insert(0, conn);
        }
    }

    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
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

    /// A connection to `name` in `dir`. It runs its statements on the file's idle
    /// connections; opening checks that the database opens (taking an idle connection, or
    /// opening one, and putting it back).
    pub fn open(self: &Arc<Self>, dir: &Path, name: &str) -> Result<Connection, Error> {
        check_name(name)?;
        let path = dir.join(format!("{name}.sqlite3"));
        let file = FileId::of(&path);
        let known = {
            let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
            match files.get(&path) {
                Some(slot) if Some(slot.file) == file => Some(slot.clone()),
                Some(_) => {
                    // The path names another file now (or none): forget what was kept;
                    // its idle connections close with the last guest connection using it.
                    files.remove(&path);
                    None
                }
                None => None,
            }
        };
        let slot = match known {
            Some(slot) => {
                let conn = slot.take()?;
                slot.put(conn);
                slot
            }
            None => {
                // A file not seen before (or replaced): a slot of its own.
                let conn = open(dir, name)?;
                let file = FileId::of(&path)
                    .ok_or_else(|| Error::Io(format!("database `{name}` is not a regular file")))?;
                let commits = self
                    .commits
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(path.clone())
                    .or_default()
                    .clone();
                let slot = Arc::new(FileSlot {
                    dir: dir.to_path_buf(),
                    name: name.to_string(),
                    path: path.clone(),
                    file,
                    commits,
                    idle: Mutex::new(Vec::new()),
                    ticks: Mutex::new(Ticks::default()),
                });
                let mut conn = conn;
                signal_commits(&mut conn, &slot.commits).map_err(map_error)?;
                slot.put(conn);
                self.files
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(path, slot.clone());
                slot
            }
        };
        Ok(Connection {
            state: RefCell::new(Held {
                conn: None,
                keep: false,
                last_rowid: 0,
            }),
            slot: Some(slot),
        })
    }

    /// One checkpoint tick (see [`checkpoint_mode`] for which files and how): copy what the
    /// write-ahead logs hold back into the database files, and keep the logs short, so no
    /// request pays for it. Uses a file's least recently used idle connection (the hot one
    /// stays free for requests, its page cache warm); a file with none idle waits for the
    /// next tick. Blocking; run off the runtime's workers.
    pub fn checkpoint(&self) {
        let slots: Vec<Arc<FileSlot>> = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for slot in slots {
            let count = slot.commits.current();
            let frames = slot.commits.frames();
            let mode = {
                let mut ticks = slot.ticks.lock().unwrap_or_else(|e| e.into_inner());
                let quiet = ticks.seen.replace(count) == Some(count);
                checkpoint_mode(frames, quiet, ticks.checkpointed != Some(count))
            };
            let Some(mode) = mode else {
                continue;
            };
            let Some(mut conn) = slot.take_coldest() else {
                continue;
            };
            let done = match mode {
                CheckpointMode::Passive => {
                    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
                }
                CheckpointMode::Restart => {
                    // Copy back what it can first, without blocking anyone, so the writers
                    // wait only for the frames committed meanwhile.
                    let ran = conn
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .and_then(|()| conn.busy_timeout(RESTART_WAIT))
                        .and_then(|()| {
                            conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                                r.get::<_, i64>(0)
                            })
                        });
                    // Writers waited on the lock it held: wake them now.
                    slot.commits.ended();
                    ran.and_then(|busy| {
                        conn.busy_handler(Some(wait_for_lock))?;
                        Ok(busy)
                    })
                }
            };
            match done {
                // Not busy: done. Busy (a writer or reader did not finish in time): the
                // next tick tries again.
                Ok(0) => {
                    slot.ticks
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .checkpointed = Some(slot.commits.current());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(database = %slot.path.display(), error = %e, "checkpoint failed");
                    // Its busy handler may be the short one: do not hand it on.
                    continue;
                }
            }
            slot.put_coldest(conn);
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
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .map_or(0, |slot| slot.idle_count())
    }
}

/// An open connection: the host side of the WIT `connection` resource. It runs each
/// statement on a host connection of its file's [`FileSlot`], which it holds on to only
/// while it needs it (a transaction open, per-connection state changed) and otherwise gives
/// back after the statement. Dropping it rolls back a transaction left open and gives back
/// what it holds.
pub struct Connection {
    state: RefCell<Held>,
    /// Where its host connections come from; none for a connection of its own, which it
    /// always holds.
    slot: Option<Arc<FileSlot>>,
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
        let Some(conn) = self.state.get_mut().conn.take() else {
            return;
        };
        // A transaction the plugin left open (it trapped, ran out of time, or forgot to
        // commit) is rolled back now, so the next user starts clean and no lock is held.
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            // Cannot tell what state it is in: close it rather than hand it on.
            return;
        }
        if let Some(slot) = &self.slot {
            slot.put(conn);
        }
    }
}

thread_local! {
    /// Set by the authorizer when a statement being prepared on this thread changes its
    /// connection's own state (see [`changes_connection_state`]).
    static STATE_CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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

/// Open `name` in `dir` with the host's settings.
pub fn open(dir: &Path, name: &str) -> Result<rusqlite::Connection, Error> {
    check_name(name)?;
    private_dir(dir)
        .map_err(|e| Error::Io(format!("cannot create the plugin's directory: {e}")))?;
    let path = dir.join(format!("{name}.sqlite3"));
    let settings = Settings {
        flags: OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        busy: Busy::Handler(wait_for_lock),
        existing: ExistingFile::SetMode,
        wal_autocheckpoint: Some(AUTOCHECKPOINT_PAGES),
    };
    let mut conn = sqlite_file::open(&path, &settings).map_err(|e| match e {
        OpenError::File(e) => Error::Io(format!("cannot create database `{name}`: {e}")),
        OpenError::Sqlite(e) => map_error(e),
    })?;
    conn.authorizer(Some(authorize)).map_err(map_error)?;
    Ok(conn)
}

/// Refuse what would reach files outside the plugin's own database: attaching another
/// file (`ATTACH`, and `VACUUM INTO` which attaches its target) and the pragmas that move
/// SQLite's temporary or data files. `ATTACH ''` (a private temporary database, which
/// plain `VACUUM` uses) stays allowed; a file name given as an expression rather than a
/// literal cannot be checked, so it is refused.
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    if changes_connection_state(&ctx.action) {
        STATE_CHANGED.set(true);
    }
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

/// Whether an action changes state that belongs to the connection rather than the database
/// file (a pragma given a value, a temporary object, an attached private database): a
/// guest connection that did so keeps its host connection, so its later statements see
/// that state. Errs on the side of keeping (`PRAGMA table_info(t)` counts, too).
fn changes_connection_state(action: &AuthAction<'_>) -> bool {
    matches!(
        action,
        AuthAction::Pragma {
            pragma_value: Some(_),
            ..
        } | AuthAction::CreateTempIndex { .. }
            | AuthAction::CreateTempTable { .. }
            | AuthAction::CreateTempTrigger { .. }
            | AuthAction::CreateTempView { .. }
            | AuthAction::Attach { .. }
            | AuthAction::Detach { .. }
    )
}

/// How a checkpoint tick treats one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointMode {
    /// Copy back what it can without waiting for anyone.
    Passive,
    /// Take the write lock (waiting up to [`RESTART_WAIT`]), copy everything back, and wait
    /// for readers to leave the log, so the next commit starts it over.
    Restart,
}

/// What a checkpoint tick does with a file whose log holds `frames` frames: restart a log
/// that has grown past [`RESTART_FRAMES`]; copy back, without blocking anyone, a log whose
/// file had no commit since the previous tick (`quiet`); otherwise nothing, so a busy
/// database is not made to sync every second. Nothing either when nothing was committed
/// since the last checkpoint (`committed`).
fn checkpoint_mode(frames: i64, quiet: bool, committed: bool) -> Option<CheckpointMode> {
    if !committed || frames <= 0 {
        None
    } else if frames >= RESTART_FRAMES {
        Some(CheckpointMode::Restart)
    } else if quiet {
        Some(CheckpointMode::Passive)
    } else {
        None
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
        on_commit
            .frames
            .store(i64::from(pages), std::sync::atomic::Ordering::Relaxed);
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
/// The waits start at 50 µs and double up to 10 ms, because plugin transactions last tens
/// of microseconds; SQLite's own schedule (1 ms, soon 25 ms) oversleeps them
/// (`docs/04-sqlite-settings.md`).
fn wait_for_lock(attempt: i32) -> bool {
    let Some(delay) = lock_wait(attempt) else {
        return false;
    };
    let sleep = || match WAITING.get() {
        Some((commits, seen)) => {
            // SAFETY: the pointer is set only for the duration of a call made through
            // `with_commits`, which holds an `Arc` to it; the handler runs inside that call.
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
        let result = with_commits(self.slot.as_ref().map(|s| &s.commits), || f(&conn));
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

    pub fn query(&self, sql: &str, params: Vec<Value>) -> Result<Rows, Error> {
        self.run(|conn| query_on(conn, sql, params))
    }

    pub fn last_insert_rowid(&self) -> i64 {
        self.state.borrow().last_rowid
    }

    /// Whether it holds a host connection between statements (tests).
    #[cfg(test)]
    fn holds_connection(&self) -> bool {
        self.state.borrow().conn.is_some()
    }

    /// Run `f` on the host connection the next statement would use (tests).
    #[cfg(test)]
    fn with_raw<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> R {
        self.run(|conn| Ok(f(conn))).unwrap()
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
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(map_error)? {
                let mut cells = Vec::with_capacity(width);
                for i in 0..width {
                    cells.push(from_sql(row.get_ref(i).map_err(map_error)?));
                }
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
        let mode: String = conn.with_raw(|c| {
            c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap()
        });
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
        assert!(first.holds_connection());
        assert_eq!(cache.idle_count(&path), 0);
        drop(first);
        assert_eq!(cache.idle_count(&path), 1);
        // The same host connection comes back, with the left-open transaction rolled back.
        let again = cache.open(tmp.path(), "db").unwrap();
        assert!(again.query("SELECT * FROM temp.marker", vec![]).is_ok());
        assert!(!again.in_transaction());
        let rows = again.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(0)));
        // Between statements it holds none.
        assert!(!again.holds_connection());
        assert_eq!(cache.idle_count(&path), 1);
        drop(again);
        // A burst, each inside a transaction and so holding a host connection of its own,
        // leaves at most MAX_IDLE_PER_DATABASE open.
        let burst: Vec<Connection> = (0..MAX_IDLE_PER_DATABASE + 3)
            .map(|_| {
                let c = cache.open(tmp.path(), "db").unwrap();
                c.execute_batch("BEGIN").unwrap();
                c.query("SELECT count(*) FROM t", vec![]).unwrap();
                assert!(c.holds_connection());
                c
            })
            .collect();
        assert_eq!(cache.idle_count(&path), 0);
        drop(burst);
        assert_eq!(cache.idle_count(&path), MAX_IDLE_PER_DATABASE);
        // Another name is another file, with connections of its own.
        let other = cache.open(tmp.path(), "other").unwrap();
        assert!(other.query("SELECT count(*) FROM t", vec![]).is_err());
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
        // A pragma given a value too; one only read does not.
        let d = cache.open(tmp.path(), "db").unwrap();
        d.query("PRAGMA user_version", vec![]).unwrap();
        assert!(!d.holds_connection());
        d.execute_batch("PRAGMA cache_size = 100").unwrap();
        assert!(d.holds_connection());
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
        let reprepared = conn.with_raw(|c| {
            c.prepare_cached(sql)
                .unwrap()
                .get_status(rusqlite::StatementStatus::RePrepare)
        });
        assert_eq!(reprepared, 0, "the cached statement was prepared again");
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
        assert_eq!(
            file_only(),
            None,
            "commits since the previous tick: left alone"
        );
        cache.checkpoint();
        assert_eq!(file_only(), Some(1), "quiet for a tick: copied back");
        // The connection went back to the cache.
        assert_eq!(cache.idle_count(&tmp.path().join("db.sqlite3")), 1);
    }

    #[test]
    fn a_checkpoint_tick_restarts_long_logs_and_copies_back_quiet_ones() {
        use CheckpointMode::{Passive, Restart};
        assert_eq!(checkpoint_mode(RESTART_FRAMES, false, true), Some(Restart));
        assert_eq!(checkpoint_mode(RESTART_FRAMES, true, true), Some(Restart));
        assert_eq!(
            checkpoint_mode(RESTART_FRAMES - 1, false, true),
            None,
            "busy"
        );
        assert_eq!(
            checkpoint_mode(RESTART_FRAMES - 1, true, true),
            Some(Passive)
        );
        assert_eq!(checkpoint_mode(10, true, false), None, "checkpointed since");
        assert_eq!(checkpoint_mode(0, true, true), None, "an empty log");
    }

    #[test]
    fn a_long_log_starts_over_after_one_tick_of_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let conn = cache.open(tmp.path(), "db").unwrap();
        let commits = conn.slot.as_ref().unwrap().commits.clone();
        let frames = || commits.frames();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        // 64 KiB a commit: about 17 frames each.
        let insert = || {
            conn.execute("INSERT INTO t VALUES (zeroblob(65536))", Vec::new())
                .unwrap();
        };
        cache.checkpoint();
        while frames() < RESTART_FRAMES {
            insert();
        }
        let before = frames();
        // Commits since the previous tick, so a short log would be left alone; this one is
        // restarted: the next commit writes at the start of the log again.
        cache.checkpoint();
        insert();
        assert!(
            frames() < 100,
            "{} frames after the restart (the log held {before})",
            frames()
        );
        assert_eq!(
            cache.idle_count(&tmp.path().join("db.sqlite3")),
            1,
            "the connection went back, with its usual busy handler"
        );
    }

    #[test]
    fn ended_write_transactions_are_counted_and_wake_waiters() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let a = cache.open(tmp.path(), "db").unwrap();
        let commits = a.slot.as_ref().unwrap().commits.clone();
        let start = commits.current();
        a.execute_batch("CREATE TABLE t (x)").unwrap();
        assert_eq!(commits.current(), start + 1, "a commit");
        a.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1); ROLLBACK;")
            .unwrap();
        assert_eq!(commits.current(), start + 2, "a rollback");
        // Another connection of the same file shares the count.
        let b = cache.open(tmp.path(), "db").unwrap();
        assert!(Arc::ptr_eq(&b.slot.as_ref().unwrap().commits, &commits));
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
