//! The connection cache: host connections kept per database file across instances, handed
//! to guest connections one statement at a time, and the background checkpoints that keep
//! each file's write-ahead log short off the request path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connection::Connection;
use super::error::map_error;
use super::lock_wait::{Commits, signal_commits, wait_for_lock};
use super::opening::{as_host, check_name, open};
use super::slot::{FileId, FileSlot};
use crate::runtime::bindings::pool::pooler::plugins::sqlite::Error;

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

impl ConnectionCache {
    /// An empty cache, shared by every instance of the host.
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
                let slot = Arc::new(FileSlot::new(dir, name, path.clone(), file, commits));
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
        Ok(Connection::cached(slot))
    }

    /// One checkpoint tick (see `checkpoint_mode` for which files and how): copy what the
    /// write-ahead logs hold back into the database files, and keep the logs short, so no
    /// request pays for it. Uses a file's least recently used idle connection (the hot one
    /// stays free for requests, its page cache warm); a file with none idle waits for the
    /// next tick. Blocking; run off the runtime's workers.
    pub fn checkpoint(&self) {
        self.checkpoint_with(RESTART_WAIT);
    }

    /// [`ConnectionCache::checkpoint`], a restart waiting at most `restart_wait`.
    fn checkpoint_with(&self, restart_wait: Duration) {
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
            let done = as_host(|| match mode {
                CheckpointMode::Passive => {
                    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
                }
                CheckpointMode::Restart => {
                    // Copy back what it can first, without blocking anyone, so the writers
                    // wait only for the frames committed meanwhile.
                    let ran = conn
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .and_then(|()| conn.busy_timeout(restart_wait))
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
            });
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
    ///
    /// `inline` runs each tick on the runtime's own thread instead, and a restarting
    /// checkpoint never waits for a reader: for a repeatable run on a single-threaded runtime
    /// with paused time (the week simulator), where a task on the blocking pool would hold
    /// the virtual clock still and make the runtime wait in real time, and where a reader
    /// that holds the log is a task this thread would have to run first.
    pub fn spawn_checkpoints(cache: &Arc<ConnectionCache>, inline: bool) {
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
                if inline {
                    cache.checkpoint_with(Duration::ZERO);
                } else {
                    let _ = tokio::task::spawn_blocking(move || cache.checkpoint()).await;
                }
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

#[cfg(test)]
mod tests {
    use std::fs;

    use rusqlite::OpenFlags;

    use super::super::slot::MAX_IDLE_PER_DATABASE;
    use super::*;
    use crate::runtime::bindings::pool::pooler::plugins::sqlite::Value;

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
        // It was closed, not handed on with its temporary table.
        assert_eq!(cache.idle_count(&path), 0);
        let again = cache.open(tmp.path(), "db").unwrap();
        assert!(again.query("SELECT * FROM temp.marker", vec![]).is_err());
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
    fn an_instance_borrowing_a_connection_sees_defaults_not_what_the_last_one_left() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let path = tmp.path().join("db.sqlite3");
        let setup = cache.open(tmp.path(), "db").unwrap();
        setup
            .execute_batch(
                "CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE c (p REFERENCES p(id))",
            )
            .unwrap();
        drop(setup);
        // Instance A changes all it can of its connection's state, and leaves a transaction
        // open; its pragmas may be refused (they are), the rest is not.
        let a = cache.open(tmp.path(), "db").unwrap();
        for sql in [
            "PRAGMA foreign_keys = OFF",
            "PRAGMA synchronous = OFF",
            "PRAGMA locking_mode = EXCLUSIVE",
            "PRAGMA cache_size = 7",
            "PRAGMA recursive_triggers = ON",
        ] {
            let _ = a.execute_batch(sql);
        }
        a.execute_batch(
            "CREATE TEMP TABLE scratch (x); CREATE TEMP VIEW v AS SELECT 1; \
             BEGIN IMMEDIATE; INSERT INTO p VALUES (99);",
        )
        .unwrap();
        drop(a);
        // Instance B, on the same file: the defaults, whichever host connection it gets.
        let b = cache.open(tmp.path(), "db").unwrap();
        assert!(
            b.query("SELECT * FROM temp.scratch", vec![]).is_err(),
            "temp table"
        );
        assert!(
            b.query("SELECT * FROM temp.v", vec![]).is_err(),
            "temp view"
        );
        assert!(!b.in_transaction());
        let rows = b.query("SELECT count(*) FROM p", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(0)), "rolled back");
        let read = |sql: &str| {
            b.with_raw(|c| {
                c.query_row(sql, [], |r| r.get::<_, rusqlite::types::Value>(0))
                    .unwrap()
            })
        };
        use rusqlite::types::Value as V;
        assert_eq!(read("PRAGMA foreign_keys"), V::Integer(1));
        assert_eq!(read("PRAGMA synchronous"), V::Integer(1), "NORMAL");
        assert_eq!(read("PRAGMA locking_mode"), V::Text("normal".into()));
        assert_eq!(read("PRAGMA cache_size"), V::Integer(-2000));
        assert_eq!(read("PRAGMA recursive_triggers"), V::Integer(0));
        assert!(
            matches!(
                b.execute("INSERT INTO c VALUES (99)", vec![]),
                Err(Error::Constraint(_))
            ),
            "foreign keys enforced"
        );
        // A connection that only ran statements goes back and is reused.
        drop(b);
        assert_eq!(cache.idle_count(&path), 1);
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
}
