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
//! | `lock_wait.rs`  | commit counts and the busy handler that waits on them |
//! | `connection.rs` | the guest's `connection`: statements on borrowed host connections |
//! | `opening.rs`    | opening a database: names, the private file, settings, the authorizer |

mod cache;
mod connection;
mod lock_wait;
mod opening;

use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use crate::bindings::pool::pooler::plugins::sqlite::{
    self, Error, Host, HostConnection, Rows, Value,
};

pub use cache::{CHECKPOINT_INTERVAL, ConnectionCache, MAX_IDLE_PER_DATABASE};
pub use connection::{Connection, map_error};
pub use lock_wait::{BUSY_TIMEOUT, Commits};
pub use opening::{MAX_NAME_CHARS, check_name, open};

/// Open connections one instance may hold.
pub const MAX_CONNECTIONS: usize = 8;

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
