//! One database file's slot in the connection cache: which file it is, its idle host
//! connections, and what the background checkpoint remembers of it. Below both the cache,
//! which keeps the slots, and the guest connection, which borrows from one.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::map_error;
use super::lock_wait::{Commits, signal_commits};
use super::opening::open;
use crate::runtime::bindings::pool::pooler::plugins::sqlite::Error;

/// Idle connections kept per database file; more than this in use at once are closed when
/// dropped. Sized for 64 concurrent requests (`docs/04-sqlite-settings.md`).
pub const MAX_IDLE_PER_DATABASE: usize = 64;

/// One database file: where it is, which file it was when opened, and its idle connections
/// (the most recently used last).
pub(super) struct FileSlot {
    dir: PathBuf,
    name: String,
    pub(super) path: PathBuf,
    pub(super) file: FileId,
    pub(super) commits: Arc<Commits>,
    idle: Mutex<Vec<rusqlite::Connection>>,
    /// The commit count at the last checkpoint tick, and when this file was last
    /// checkpointed (see the cache's `checkpoint_mode`).
    pub(super) ticks: Mutex<Ticks>,
}

/// What the background checkpoint remembers of a file between ticks.
#[derive(Default)]
pub(super) struct Ticks {
    /// The commit count the previous tick saw.
    pub(super) seen: Option<u64>,
    /// The commit count when the file was last checkpointed.
    pub(super) checkpointed: Option<u64>,
}

impl FileSlot {
    /// The slot of the database file `name` in `dir` (at `path`, identified as `file`), with
    /// no idle connection yet.
    pub(super) fn new(
        dir: &Path,
        name: &str,
        path: PathBuf,
        file: FileId,
        commits: Arc<Commits>,
    ) -> FileSlot {
        FileSlot {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            path,
            file,
            commits,
            idle: Mutex::new(Vec::new()),
            ticks: Mutex::new(Ticks::default()),
        }
    }

    /// The most recently used idle connection, or a new one.
    pub(super) fn take(&self) -> Result<rusqlite::Connection, Error> {
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
    pub(super) fn put(&self, conn: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_PER_DATABASE {
            idle.push(conn);
        }
    }

    /// The least recently used idle connection, if any (for background work, which
    /// leaves the hot one to requests).
    pub(super) fn take_coldest(&self) -> Option<rusqlite::Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        (!idle.is_empty()).then(|| idle.remove(0))
    }

    /// Take back a connection [`take_coldest`](Self::take_coldest) gave out, as the least
    /// recently used again (or close it, like [`put`](Self::put), when enough are idle).
    pub(super) fn put_coldest(&self, conn: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_PER_DATABASE {
            idle.insert(0, conn);
        }
    }

    pub(super) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// What identifies a file across renames: a connection keeps the file it opened, so when
/// the path names another file (restored from a backup, moved away, replaced by something
/// that is not a database) the idle connections are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(not(unix))]
    len: u64,
}

impl FileId {
    pub(super) fn of(path: &Path) -> Option<FileId> {
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
