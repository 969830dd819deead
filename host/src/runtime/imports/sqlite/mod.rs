//! The `sqlite` import: each plugin's own SQLite databases, over rusqlite. This module owns
//! the WIT side: the per-instance state, the `connection` resource's methods and
//! `add_to_linker`.
//!
//! A database name maps to `DATA_DIR/plugins/<plugin-id>/<name>.sqlite3` (directory 0700,
//! files 0600); names that could leave the directory are refused, and so is attaching
//! another file (`opening.rs`). SQL errors are WIT `error` values, never traps;
//! dropping a connection rolls back a transaction left open. The settings and the
//! measurements behind them: `docs/04-sqlite-settings.md`.
//!
//! Host connections outlive instances ([`ConnectionCache`], per file), and a guest's
//! `connection` borrows one per statement, holding it only inside a transaction or after
//! changing per-connection state (a pragma given a value, a temporary table, `ATTACH ''`),
//! so the most used connection keeps its page cache (`connection.rs`). Hence
//! `last-insert-rowid` is kept per guest connection, while SQL's `changes()` outside a
//! transaction may report another instance's statement.
//!
//! Calls run synchronously on the calling task; only a lock wait hands the worker on
//! (`block_in_place`, `lock_wait.rs`), because the holder may be another guest between its
//! `BEGIN` and its `COMMIT` that needs a worker to finish.
//!
//! | module          | owns |
//! |-----------------|------|
//! | `mod.rs`        | the WIT impl, per-instance state, `add_to_linker` |
//! | `cache.rs`      | the host-wide connection cache and the background checkpoints |
//! | `connection.rs` | the guest's `connection`: statements on borrowed host connections |
//! | `slot.rs`       | one database file's idle host connections, which both of those use |
//! | `opening.rs`    | opening a database: names, the private file, settings, the authorizer |
//! | `lock_wait.rs`  | commit counts and the busy handler that waits on them |
//! | `bounds.rs`     | what a statement may cost: CPU budget, result size, SQLite limits |
//! | `error.rs`      | rusqlite's errors as the WIT's |
//!
//! Each module uses only the ones below it in this table (`mod.rs` uses them all), so
//! there is no import circle; tests of a lower module may build a cache or a connection
//! through this module's front to exercise their code.

mod bounds;
mod cache;
mod connection;
mod error;
mod lock_wait;
mod opening;
mod slot;

use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::runtime::bindings::pool::pooler::plugins::sqlite::{
    self, Error, Host, HostConnection, Rows, Value,
};

pub use bounds::{Budget, CELL_BYTES, DEFAULT_MAX_BYTES, LIMITS, MAX_ROWS, PROGRESS_OPS};
pub use cache::{CHECKPOINT_INTERVAL, ConnectionCache};
pub use connection::Connection;
pub use error::map_error;
pub use lock_wait::{BUSY_TIMEOUT, Commits};
pub use opening::{MAX_NAME_CHARS, check_name, open};
pub use slot::MAX_IDLE_PER_DATABASE;

/// Open connections one instance may hold.
pub const MAX_CONNECTIONS: usize = 8;

/// How the `invalid-statement` texts of the host's own refusals start (the deadline, the
/// result caps, the authorizer): these are logged.
pub const REFUSALS: [&str; 3] = ["interrupted:", "result too large:", "not authorized:"];

/// Per-instance state of the import.
pub struct SqliteCtx {
    /// The plugin's id, for log lines.
    plugin: Arc<str>,
    /// The plugin's own directory (`DATA_DIR/plugins/<plugin-id>`).
    dir: PathBuf,
    cache: Arc<ConnectionCache>,
    open: usize,
    /// Connections of this instance inside a transaction.
    transactions: usize,
    /// The store's time budget, which its statements spend too (`bounds.rs`).
    budget: Budget,
    /// Result bytes one query may collect: the instance's memory cap.
    max_result_bytes: usize,
}

impl SqliteCtx {
    /// The import's state for one store whose calls have `budget` and whose memory cap is
    /// `memory_bytes` (the cap of one query's result too).
    pub fn new(
        plugin: Arc<str>,
        dir: PathBuf,
        cache: Arc<ConnectionCache>,
        budget: Budget,
        memory_bytes: usize,
    ) -> Self {
        SqliteCtx {
            plugin,
            dir,
            cache,
            open: 0,
            transactions: 0,
            budget,
            max_result_bytes: memory_bytes,
        }
    }

    /// The store's time budget: the epoch callback spends it too.
    pub fn budget_mut(&mut self) -> &mut Budget {
        &mut self.budget
    }

    /// Whether the instance has a transaction open (and so may hold a database lock other
    /// instances wait for): the host does not make it yield to other tasks meanwhile.
    pub fn in_transaction(&self) -> bool {
        self.transactions > 0
    }

    /// Run `f` (one statement or batch) on `conn` within the store's budget and result cap,
    /// and keep count of whether it left a transaction open.
    fn tracked<R>(
        &mut self,
        conn: &Connection,
        f: impl FnOnce(&Connection) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let before = conn.in_transaction();
        let result = self.budget.run(self.max_result_bytes, || f(conn));
        if let Err(Error::InvalidStatement(reason)) = &result
            && REFUSALS.iter().any(|p| reason.starts_with(p))
        {
            // The host's bounds, not a plugin's mistake: logged (the reason, never the SQL,
            // which may hold a secret).
            tracing::warn!(plugin = &*self.plugin, %reason, "plugin statement refused");
        }
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
    /// The instance's SQLite state: the plugin's directory, its connections and its budget.
    pub ctx: &'a mut SqliteCtx,
    /// The store's resource table, where the connection resources live.
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
    use std::time::{Duration, Instant};

    use super::*;

    fn ctx(dir: &std::path::Path, cache: &Arc<ConnectionCache>, deadline: Duration) -> SqliteCtx {
        let budget = Budget::new(deadline, Duration::from_millis(10));
        SqliteCtx::new(
            Arc::from("test"),
            dir.to_path_buf(),
            cache.clone(),
            budget,
            DEFAULT_MAX_BYTES,
        )
    }

    /// A statement that never ends by itself.
    const ENDLESS: &str =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

    fn interrupted(result: Result<impl std::fmt::Debug, Error>, deadline_ms: u64) {
        match result {
            Err(Error::InvalidStatement(m)) => assert!(
                m.starts_with("interrupted:")
                    && m.contains(&format!("deadline of {deadline_ms} ms")),
                "{m}"
            ),
            other => panic!("not interrupted: {other:?}"),
        }
    }

    /// Real time: the budget is CPU time, spent by the statement as it runs.
    #[test]
    fn an_endless_statement_ends_with_an_error_when_the_budget_is_spent() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let conn = cache.open(tmp.path(), "db").unwrap();
        for run in ["query", "execute", "execute-batch"] {
            let mut ctx = ctx(tmp.path(), &cache, Duration::from_millis(200));
            let started = Instant::now();
            match run {
                "query" => interrupted(ctx.tracked(&conn, |c| c.query(ENDLESS, vec![])), 200),
                "execute" => interrupted(ctx.tracked(&conn, |c| c.execute(ENDLESS, vec![])), 200),
                _ => interrupted(ctx.tracked(&conn, |c| c.execute_batch(ENDLESS)), 200),
            }
            let took = started.elapsed();
            assert!(
                took >= Duration::from_millis(190) && took < Duration::from_millis(1200),
                "{run}: interrupted after {took:?}"
            );
            // The budget is spent: the guest is stopped at its next tick.
            assert!(
                !ctx.budget_mut().take_tick(Duration::from_millis(10)),
                "{run}"
            );
        }
        // The host connection is fine for the next instance.
        let mut next = ctx(tmp.path(), &cache, Duration::from_secs(10));
        let rows = next
            .tracked(&conn, |c| c.query("SELECT 1 + 1", vec![]))
            .unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(2)));
        assert_eq!(cache.idle_count(&tmp.path().join("db.sqlite3")), 1);
    }

    /// Real time: an export call's wall-clock deadline ends a statement that has CPU budget
    /// left.
    #[test]
    fn a_statement_ends_at_the_calls_wall_clock_deadline() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let conn = cache.open(tmp.path(), "db").unwrap();
        let mut ctx = ctx(tmp.path(), &cache, Duration::from_secs(10));
        let started = Instant::now();
        ctx.budget_mut()
            .set_wall_deadline(started + Duration::from_millis(150));
        interrupted(ctx.tracked(&conn, |c| c.query(ENDLESS, vec![])), 10_000);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(140) && took < Duration::from_millis(1150),
            "interrupted after {took:?}"
        );
    }

    /// Real time: another connection holds the write lock for longer than the budget; the
    /// wait is not CPU time, so the statement still runs once the lock is free.
    #[test]
    fn waiting_for_a_lock_does_not_spend_the_budget() {
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
                let conn = cache.open(&dir, "db").unwrap();
                let mut ctx = ctx(&dir, &cache, Duration::from_millis(100));
                let result = ctx.tracked(&conn, |c| c.execute("INSERT INTO t VALUES (2)", vec![]));
                (result, ctx.budget_mut().cpu_left())
            })
        };
        // Hold the lock for three times the writer's budget (the writer waits meanwhile).
        std::thread::sleep(Duration::from_millis(300));
        holder.execute_batch("COMMIT").unwrap();
        let (result, left) = writer.join().unwrap();
        assert_eq!(result.unwrap(), 1);
        assert!(left > Duration::from_millis(50), "{left:?} left");
    }

    #[test]
    fn the_import_knows_when_an_instance_has_a_transaction_open() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ConnectionCache::new();
        let mut ctx = ctx(tmp.path(), &cache, Duration::from_secs(10));
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
