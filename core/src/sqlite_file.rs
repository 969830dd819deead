//! How Pooler opens a SQLite database file, the core's own (`core.sqlite3`, [`crate::db`])
//! and each plugin's (the host's `sqlite` import): created private (0600, with
//! [`create_private_file`]), WAL with `synchronous=NORMAL`, foreign keys on, a statement
//! cache and the query planner stability guarantee. What differs between the two is a
//! field of [`Settings`]. The measurements behind each setting: `docs/04-sqlite-settings.md`.

use std::io;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::private_file::{Existing, create_private_file, make_private};

/// Prepared statements kept per connection: room for every statement the core runs (about
/// 60) or a plugin issues (a few dozen), so none is parsed twice; preparing one costs more
/// than running it.
pub const STATEMENT_CACHE: usize = 128;

/// What differs between the databases opened with [`open`].
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How SQLite opens the file (which exists by then: [`open`] creates it).
    pub flags: OpenFlags,
    /// What a statement does when another connection holds the lock it needs.
    pub busy: Busy,
    /// What is done with a file already at the path before SQLite opens it.
    pub existing: ExistingFile,
    /// `PRAGMA wal_autocheckpoint`, in pages; `None` keeps SQLite's default.
    pub wal_autocheckpoint: Option<i64>,
}

/// How a connection waits for a lock held by another connection.
#[derive(Debug, Clone, Copy)]
pub enum Busy {
    /// SQLite's own busy handler, for at most this long.
    Timeout(Duration),
    /// This busy handler (SQLite's `sqlite3_busy_handler`: given the retry count, whether
    /// to try again).
    Handler(fn(i32) -> bool),
}

/// What [`open`] does with a database file that is already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingFile {
    /// Open it for appending (so it must be writable) and make it 0600.
    Open,
    /// Only make it 0600 (through a read-only handle), leaving its contents for SQLite to
    /// open or refuse.
    SetMode,
}

/// Why [`open`] failed: creating the file, or SQLite opening and setting it up.
#[derive(Debug)]
pub enum OpenError {
    File(io::Error),
    Sqlite(rusqlite::Error),
}

impl From<rusqlite::Error> for OpenError {
    fn from(e: rusqlite::Error) -> Self {
        OpenError::Sqlite(e)
    }
}

/// Opens the database file `path` (creating it private if needed; its directory must
/// exist) with Pooler's settings and `settings`.
pub fn open(path: &Path, settings: &Settings) -> Result<Connection, OpenError> {
    private_database_file(path, settings.existing).map_err(OpenError::File)?;
    let mut conn = Connection::open_with_flags(path, settings.flags)?;
    match settings.busy {
        Busy::Timeout(timeout) => conn.busy_timeout(timeout)?,
        Busy::Handler(handler) => conn.busy_handler(Some(handler))?,
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // In WAL mode NORMAL syncs at checkpoints, not on every commit: a crash of the process
    // loses nothing; a power loss can roll back the last commits, never corrupt the file.
    // FULL cost an fsync per commit.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    if let Some(pages) = settings.wal_autocheckpoint {
        conn.pragma_update(None, "wal_autocheckpoint", pages)?;
    }
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Keep a cached statement's plan when it is rebound: otherwise SQLite re-plans one whose
    // plan could depend on a bound value on every reuse from the cache.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(conn)
}

/// Create the database file 0600 before SQLite opens it, so it is never readable by others,
/// not even for an instant (SQLite gives its -wal and -shm files the database's mode). A
/// file already there is checked first ([`create_private_file`]'s rules: no symbolic link,
/// this user's, one link).
fn private_database_file(path: &Path, existing: ExistingFile) -> io::Result<()> {
    match existing {
        ExistingFile::Open => create_private_file(path, Existing::Append).map(drop),
        ExistingFile::SetMode => match create_private_file(path, Existing::Fail) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => make_private(path),
            Err(e) => Err(e),
        },
    }
}
