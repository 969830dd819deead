//! The core's own database file, `DATA_DIR/core.sqlite3`: opening it (directory 0700, then
//! [`crate::sqlite_file`] with a 5 s busy timeout; why: `docs/04-sqlite-settings.md`) and
//! the schema migrations, which are idempotent: each runs once, recorded in
//! `PRAGMA user_version`, inside a transaction.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::CoreError;
use crate::sqlite_file::{self, Busy, ExistingFile, OpenError, Settings};

/// The file name of the core's database inside the data directory.
pub const FILE_NAME: &str = "core.sqlite3";

/// How long a writer waits for another connection's write transaction before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema versions, oldest first. Never edit a shipped entry; append a new one.
const MIGRATIONS: &[&str] = &[
    // v1
    r#"
    CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        provider TEXT NOT NULL CHECK (provider IN ('claude', 'codex')),
        model TEXT,
        status TEXT NOT NULL DEFAULT 'idle' CHECK (status IN ('idle', 'active', 'error')),
        archived INTEGER NOT NULL DEFAULT 0,
        retry_opt_out INTEGER NOT NULL DEFAULT 0,
        session_id TEXT NOT NULL,
        route_base_url TEXT,
        -- A secret: never logged, never returned by show/list.
        route_token TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );

    -- One row per dispatch of a turn, and per queued user message (started_at NULL).
    CREATE TABLE turn_requests (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL REFERENCES threads(id),
        input TEXT NOT NULL,
        trigger TEXT NOT NULL CHECK (trigger IN ('user', 'retry', 'send-now')),
        original_request TEXT NOT NULL,
        retry_of TEXT,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        created_at INTEGER NOT NULL,
        -- Order of starts within the thread; the largest is the thread's latest request.
        start_seq INTEGER,
        started_at INTEGER,
        finished_at INTEGER,
        outcome TEXT CHECK (outcome IN ('ok', 'failed')),
        reply TEXT,
        input_accepted INTEGER NOT NULL DEFAULT 0,
        failure TEXT,
        UNIQUE (thread_id, start_seq)
    );
    CREATE INDEX turn_requests_running ON turn_requests(thread_id)
        WHERE started_at IS NOT NULL AND finished_at IS NULL;
    CREATE INDEX turn_requests_queued ON turn_requests(thread_id) WHERE started_at IS NULL;

    -- Live rows only: a dispatched, cancelled or dropped row is deleted (its story stays in
    -- history), so one UNIQUE index is the "one live row per chain" rule.
    CREATE TABLE queued_rows (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL REFERENCES threads(id),
        kind TEXT NOT NULL DEFAULT 'retry' CHECK (kind IN ('retry')),
        original_request TEXT NOT NULL,
        failed_request TEXT NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 2),
        send_at INTEGER NOT NULL,
        reason TEXT NOT NULL,
        wait_state TEXT NOT NULL CHECK (wait_state IN ('time', 'waiting-for-slot', 'claimed')),
        -- Bumped by every claim and every change that voids a claim.
        claim_gen INTEGER NOT NULL DEFAULT 0,
        claimed_at INTEGER,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX queued_rows_one_live_per_chain ON queued_rows(original_request);
    CREATE INDEX queued_rows_by_send_at ON queued_rows(send_at);

    CREATE TABLE rate_limits (
        provider TEXT PRIMARY KEY,
        snapshot TEXT NOT NULL,
        observed_at INTEGER NOT NULL
    );

    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('turn-failed', 'turn-succeeded')),
        payload TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    -- A subscriber receives every event after first_event (set when it first registered).
    CREATE TABLE outbox_subscribers (
        name TEXT PRIMARY KEY,
        first_event INTEGER NOT NULL,
        registered_at INTEGER NOT NULL
    );
    CREATE TABLE outbox_deliveries (
        subscriber TEXT NOT NULL REFERENCES outbox_subscribers(name),
        event_id INTEGER NOT NULL REFERENCES outbox(id),
        failed_attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        done_at INTEGER,
        PRIMARY KEY (subscriber, event_id)
    );

    CREATE TABLE history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        thread_id TEXT NOT NULL,
        row_id INTEGER,
        original_request TEXT,
        actor TEXT NOT NULL CHECK (actor IN ('plugin', 'core', 'person')),
        action TEXT NOT NULL,
        send_at INTEGER,
        detail TEXT
    );
    CREATE INDEX history_by_thread ON history(thread_id, id);

    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    "#,
    // v2: the due loop's reads (claimable rows, claimed rows, a thread's live row) use
    // indexes; before, each pass scanned every queued row, and one availability change
    // that moved N rows made N passes.
    r#"
    CREATE INDEX queued_rows_by_thread ON queued_rows(thread_id);
    CREATE INDEX queued_rows_by_state ON queued_rows(wait_state, send_at);
    "#,
    // v3: every read by send time goes through queued_rows_by_state; one index fewer to
    // update on every move.
    r#"
    DROP INDEX queued_rows_by_send_at;
    "#,
    // v4: agent threads. A thread names the agent that runs its turns (`http`: the built-in
    // driver; `claude-code` / `codex`: the real CLI), the agent's own session id once its
    // first turn printed one, the directory it runs in and the extra arguments it gets. A
    // turn remembers whether its input is in the agent's session (a retry then continues
    // the session instead of sending the input again).
    r#"
    ALTER TABLE threads ADD COLUMN agent TEXT NOT NULL DEFAULT 'http'
        CHECK (agent IN ('http', 'claude-code', 'codex'));
    ALTER TABLE threads ADD COLUMN agent_session TEXT;
    ALTER TABLE threads ADD COLUMN cwd TEXT;
    ALTER TABLE threads ADD COLUMN agent_args TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE turn_requests ADD COLUMN in_agent_session INTEGER NOT NULL DEFAULT 0;
    "#,
    // v5: retention: the prune tick reads each table oldest first and stops at
    // its cutoff, so a pass costs its batch, not the table.
    r#"
    CREATE INDEX history_by_at ON history(at);
    CREATE INDEX outbox_by_created_at ON outbox(created_at);
    CREATE INDEX turn_requests_by_finished_at ON turn_requests(finished_at)
        WHERE finished_at IS NOT NULL;
    "#,
];

/// Opens (creating if needed) the core database in `data_dir` and brings its schema up to
/// date. Returns the connection and the file's path.
pub fn open(data_dir: &Path) -> Result<(Connection, PathBuf), CoreError> {
    crate::private_file::create_private_dir(data_dir).map_err(|e| {
        CoreError::Storage(format!(
            "cannot use the data directory {}: {e}",
            data_dir.display()
        ))
    })?;
    let path = data_dir.join(FILE_NAME);
    // Private from its creation on: it holds route tokens. What must survive a power loss (a
    // turn about to be sent to a provider), `synchronous=NORMAL` does not sync:
    // `Core::write_durable` does.
    let settings = Settings {
        flags: OpenFlags::default(),
        busy: Busy::Timeout(BUSY_TIMEOUT),
        existing: ExistingFile::Open,
        wal_autocheckpoint: None,
    };
    let mut conn = sqlite_file::open(&path, &settings).map_err(|e| match e {
        OpenError::File(e) => CoreError::Storage(format!("{}: {e}", path.display())),
        OpenError::Sqlite(e) => CoreError::from(e),
    })?;
    migrate(&mut conn)?;
    Ok((conn, path))
}

/// Applies every migration newer than the database's `user_version`. Safe to run any number
/// of times and from several connections at once (the version is re-read inside an
/// immediate transaction).
pub fn migrate(conn: &mut Connection) -> Result<(), CoreError> {
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let current: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if current < version {
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", version)?;
        }
        tx.commit()?;
    }
    Ok(())
}

/// The schema version this build writes.
pub fn schema_version() -> i64 {
    MIGRATIONS.len() as i64
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn temp_dir() -> PathBuf {
        std::env::temp_dir().join(crate::ids::new_id("pooler-core-db"))
    }

    #[test]
    fn opening_twice_keeps_the_schema_and_the_data() {
        let dir = temp_dir();
        let (conn, path) = open(&dir).unwrap();
        conn.execute(
            "INSERT INTO settings (key, value) VALUES ('probe', '1')",
            [],
        )
        .unwrap();
        drop(conn);
        let (mut conn, _) = open(&dir).unwrap();
        migrate(&mut conn).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, schema_version());
        let probe: String = conn
            .query_row("SELECT value FROM settings WHERE key = 'probe'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(probe, "1");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        // NORMAL (1): commits are not synced one by one (see `open`).
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1);
        let file_mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(file_mode, 0o600);
        let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
