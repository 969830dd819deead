//! Lock waits: each database file's count of ended write transactions ([`Commits`], kept
//! by SQLite's WAL and rollback hooks) and the busy handler that sleeps on it, so a
//! connection waiting for the write lock wakes as soon as the holder is done.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a statement waits for a lock held by another connection.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// WAL pages after which a committing connection checkpoints by itself: only reached when
/// the background checkpoints fall behind (SQLite's default, 1,000, put that on the request
/// path; `docs/04-sqlite-settings.md`).
pub(super) const AUTOCHECKPOINT_PAGES: i64 = 16_384;

/// Write transactions ended on one database file (committed or rolled back), counted so
/// a connection waiting for the write lock wakes as soon as it may be free instead of
/// polling (`docs/04-sqlite-settings.md`).
#[derive(Default)]
pub struct Commits {
    count: Mutex<u64>,
    changed: std::sync::Condvar,
    /// Frames in the write-ahead log after the last commit (from the WAL hook).
    frames: std::sync::atomic::AtomicI64,
}

impl Commits {
    pub(super) fn ended(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_all();
    }

    /// Frames in the write-ahead log after the last commit.
    pub(super) fn frames(&self) -> i64 {
        self.frames.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn current(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until a write transaction ends after `seen` (or `timeout` passes); the count
    /// then.
    pub(super) fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let (count, _) = self
            .changed
            .wait_timeout_while(count, timeout, |now| *now == seen)
            .unwrap_or_else(|e| e.into_inner());
        *count
    }
}

/// Count `conn`'s ended write transactions in `commits`. The WAL hook runs after a commit
/// has released the write lock; a rollback is seen just before it releases the lock (a
/// waiter woken that early finds the lock still held and waits again). Installing a WAL
/// hook replaces SQLite's automatic checkpoint, so the hook checkpoints when the log
/// passes [`AUTOCHECKPOINT_PAGES`] as that would have.
pub(super) fn signal_commits(
    conn: &mut rusqlite::Connection,
    commits: &Arc<Commits>,
) -> rusqlite::Result<()> {
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

/// Close `conn`, a connection [`signal_commits`] hooked: roll back what it has open and
/// remove the hooks first. rusqlite frees the hooks' closures before `sqlite3_close`, and
/// SQLite's rollback of a transaction left open while closing would call the freed one.
pub(super) fn close(mut conn: rusqlite::Connection) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let _ = conn.rollback_hook(None::<fn()>);
    let _ = conn
        .wal_hook(None::<fn(&mut rusqlite::hooks::Wal, std::ffi::c_int) -> rusqlite::Result<()>>);
    drop(conn);
}

thread_local! {
    /// The commits of the database the statement running on this thread uses, and the
    /// count when it started: what [`wait_for_lock`] waits on.
    static WAITING: std::cell::Cell<Option<(*const Commits, u64)>> =
        const { std::cell::Cell::new(None) };
}

/// Run `f` (one SQLite call on a connection of `commits`' file) so that its lock waits
/// wake on that file's commits.
pub(super) fn with_commits<R>(commits: Option<&Arc<Commits>>, f: impl FnOnce() -> R) -> R {
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
/// The waits start at 50 µs and double up to 10 ms: plugin transactions last tens of
/// microseconds, and SQLite's own schedule oversleeps them (`docs/04-sqlite-settings.md`).
pub(super) fn wait_for_lock(attempt: i32) -> bool {
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
    let start = std::time::Instant::now();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(sleep)
        }
        _ => sleep(),
    }
    // Waiting is not the statement's CPU time: its deadline moves on by as much.
    super::bounds::waited(start.elapsed());
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

#[cfg(test)]
mod tests {
    use super::super::ConnectionCache;
    use super::*;
    use crate::runtime::bindings::pool::pooler::plugins::sqlite::Value;

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
}
