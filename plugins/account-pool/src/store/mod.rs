//! The pool's state, all of it in SQLite: the schema (idempotent migrations with a schema
//! version row) and every read and write. Nothing is kept in guest memory between calls;
//! read-modify-writes that concurrent instances could interleave run inside
//! `BEGIN IMMEDIATE` transactions (pin claims and binds, the cursor, refresh leases,
//! taking pending signals). No transaction is held across an `await`.
//!
//! | part | owns (tables) |
//! |---|---|
//! | this file | the schema and its migrations, transactions, `meta`, `settings` |
//! | [`accounts`] | `accounts`, `secrets` |
//! | [`quota`] | `windows`, `quota`, `refresh_state` (quota; OAuth refresh leases and backoff) |
//! | [`routes`] | `routes`, `pins`, `cursors` |
//! | [`load`] | `placements`, `in_flight` (conversations placed lately, requests in flight) |
//! | [`attempts`] | `attempts` |
//! | [`history`] | `quota_history` (the quota timeline) |
//! | [`signals`] | `pending_signals` |
//! | [`tokens`] | `tokens` (token usage of served answers) |

mod accounts;
mod attempts;
mod history;
mod load;
mod quota;
mod routes;
mod signals;
mod tokens;

pub use accounts::{AccountMeta, Secret};
pub use attempts::{AttemptRow, RECENT_ATTEMPTS, attempt_sessions_slack};
pub use load::{FLIGHT_LEASE_MS, Load, PLACEMENT_WINDOW_MS};
pub use quota::RefreshState;
pub use routes::Pin;
pub use signals::PendingSignal;
pub use tokens::{TOKEN_BUCKET_MS, TOKEN_RETENTION_MS, TokenRow};

use crate::settings::Settings;
use pooler_plugin_kit::{Db, DbError, Value};

/// The schema version this code writes. 2: `attempts` is keyed by session (`WITHOUT
/// ROWID`, ids counted per session) instead of a global AUTOINCREMENT id plus an index.
/// 3: accounts have their options (last-resort, extra usage, in-flight limit, preserve),
/// and `placements` and `in_flight` count conversations placed lately and requests in flight.
/// 4: `tokens` sums the token usage of served answers; `quota_history` (the quota timeline).
/// 5: `accounts_by_provider`, so a request reads its provider's accounts in selection order
/// without sorting them.
pub const SCHEMA_VERSION: i64 = 5;

/// How stale a pin's or an account's "last used" time may get before a request that uses
/// it writes it again. Writing it on every request cost each pooled request two more
/// pages in its commit (the row and the `pins_by_use` entry); a pin's idle lifetime is
/// minutes, so a second changes nothing a person or the LRU cap could notice.
pub const TOUCH_GRANULARITY_MS: u64 = 1_000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    provider TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    priority INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    error TEXT,
    held_until INTEGER,
    hold_kind TEXT,
    needs_sign_in INTEGER NOT NULL DEFAULT 0,
    last_resort INTEGER NOT NULL DEFAULT 0,
    extra_usage INTEGER NOT NULL DEFAULT 0,
    max_in_flight INTEGER NOT NULL DEFAULT 0,
    preserve REAL NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS accounts_by_provider ON accounts(provider, priority, seq);
CREATE TABLE IF NOT EXISTS secrets (
    account_id TEXT PRIMARY KEY REFERENCES accounts(id) ON DELETE CASCADE,
    api_key TEXT,
    access_token TEXT,
    refresh_token TEXT,
    expires_at INTEGER,
    chatgpt_account_id TEXT
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS routes (
    thread TEXT NOT NULL,
    provider TEXT NOT NULL,
    token_hash BLOB NOT NULL,
    opened_at INTEGER NOT NULL,
    PRIMARY KEY (thread, provider)
);
CREATE INDEX IF NOT EXISTS routes_by_hash ON routes(token_hash);
CREATE TABLE IF NOT EXISTS pins (
    provider TEXT NOT NULL,
    key TEXT NOT NULL,
    account_id TEXT NOT NULL,
    thread TEXT,
    last_used_at INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    provisional INTEGER NOT NULL DEFAULT 0,
    why TEXT NOT NULL,
    PRIMARY KEY (provider, key)
);
CREATE INDEX IF NOT EXISTS pins_by_use ON pins(last_used_at);
CREATE TABLE IF NOT EXISTS cursors (provider TEXT PRIMARY KEY, account_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS windows (
    account_id TEXT NOT NULL,
    name TEXT NOT NULL,
    family TEXT,
    utilization REAL,
    resets_at INTEGER,
    status TEXT,
    observed_at INTEGER NOT NULL,
    PRIMARY KEY (account_id, name)
);
CREATE TABLE IF NOT EXISTS quota (
    account_id TEXT PRIMARY KEY,
    overage TEXT,
    credits INTEGER,
    representative_claim TEXT,
    restriction_reason TEXT,
    restriction_reset INTEGER
);
CREATE TABLE IF NOT EXISTS refresh_state (
    account_id TEXT PRIMARY KEY,
    lease_until INTEGER,
    lease_owner TEXT,
    backoff_ms INTEGER,
    retry_at INTEGER,
    failure TEXT,
    last_usage_at INTEGER
);
CREATE TABLE IF NOT EXISTS attempts (
    provider TEXT NOT NULL,
    key TEXT NOT NULL,
    id INTEGER NOT NULL,
    at INTEGER NOT NULL,
    account_id TEXT NOT NULL,
    status INTEGER,
    outcome TEXT NOT NULL,
    PRIMARY KEY (provider, key, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS placements (
    provider TEXT NOT NULL,
    account_id TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS placements_by_time ON placements(provider, at);
CREATE TABLE IF NOT EXISTS in_flight (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS in_flight_by_account ON in_flight(account_id, expires_at);
CREATE TABLE IF NOT EXISTS tokens (
    at INTEGER NOT NULL,
    provider TEXT NOT NULL,
    account_id TEXT NOT NULL,
    thread TEXT NOT NULL,
    model TEXT NOT NULL,
    answers INTEGER NOT NULL,
    input INTEGER NOT NULL,
    output INTEGER NOT NULL,
    cache_read INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    PRIMARY KEY (at, provider, account_id, thread, model)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS quota_history (
    account_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    family TEXT,
    utilization REAL,
    resets_at INTEGER,
    status TEXT,
    until INTEGER
);
CREATE INDEX IF NOT EXISTS quota_history_by_account ON quota_history(account_id, at);
CREATE INDEX IF NOT EXISTS quota_history_by_time ON quota_history(at);
CREATE TABLE IF NOT EXISTS pending_signals (
    provider TEXT NOT NULL,
    cause TEXT NOT NULL,
    seq INTEGER NOT NULL,
    detected_at INTEGER NOT NULL,
    PRIMARY KEY (provider, cause)
);
";

/// Schema 1 to 2, around [`SCHEMA`] (which creates the new `attempts`): the old table is
/// set aside first, and its rows (ids and so order kept) copied over after.
const ATTEMPTS_V2_BEFORE: &str = "
ALTER TABLE attempts RENAME TO attempts_v1;
DROP INDEX IF EXISTS attempts_by_key;
";
const ATTEMPTS_V2_AFTER: &str = "
INSERT INTO attempts (provider, key, id, at, account_id, status, outcome)
    SELECT provider, key, id, at, account_id, status, outcome FROM attempts_v1;
DROP TABLE attempts_v1;
";

/// Schema 2 (or 1) to 3: the accounts' options, with the defaults that change nothing.
const OPTIONS_V3: &str = "
ALTER TABLE accounts ADD COLUMN last_resort INTEGER NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN extra_usage INTEGER NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN max_in_flight INTEGER NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN preserve REAL NOT NULL DEFAULT 1;
";

/// The pool's database.
pub struct Store<'a, D: Db> {
    db: &'a D,
    /// Inside [`Store::tx`]: a nested `tx` joins the open transaction.
    in_tx: std::cell::Cell<bool>,
}

fn decode<T>(what: &str, v: Option<T>) -> Result<T, DbError> {
    v.ok_or_else(|| DbError::Decode(format!("bad {what}")))
}

impl<'a, D: Db> Store<'a, D> {
    pub fn new(db: &'a D) -> Self {
        Store {
            db,
            in_tx: std::cell::Cell::new(false),
        }
    }

    pub fn db(&self) -> &'a D {
        self.db
    }

    /// Create the schema if absent and record its version. Safe to run on every call.
    pub fn migrate(&self) -> Result<(), DbError> {
        self.tx(|st| {
            // No meta table yet (a fresh database) reads as no version.
            let version = st.meta_i64("schema-version").ok().flatten();
            if version.is_some_and(|v| v >= SCHEMA_VERSION) {
                return Ok(());
            }
            if version == Some(1) {
                st.db.execute_batch(ATTEMPTS_V2_BEFORE)?;
            }
            // Before the schema, which would create a missing `accounts` with the columns.
            if version.is_some_and(|v| v < 3) && st.table_exists("accounts")? {
                st.db.execute_batch(OPTIONS_V3)?;
            }
            st.db.execute_batch(SCHEMA)?;
            if version == Some(1) {
                st.db.execute_batch(ATTEMPTS_V2_AFTER)?;
            }
            st.set_meta_i64("schema-version", SCHEMA_VERSION)
        })
    }

    fn table_exists(&self, name: &str) -> Result<bool, DbError> {
        Ok(!self
            .db
            .query(
                "SELECT 1 AS x FROM sqlite_master WHERE type = 'table' AND name = ?1",
                &[name.into()],
            )?
            .is_empty())
    }

    /// Migrate unless the schema version row already says this version (the common case
    /// costs one read, no write lock).
    pub fn ensure_schema(&self) -> Result<(), DbError> {
        if self.schema_current()? {
            return Ok(());
        }
        self.migrate()
    }

    /// Whether the schema is this version's (false for a fresh database, whose tables do
    /// not exist yet).
    pub fn schema_current(&self) -> Result<bool, DbError> {
        Ok(matches!(self.meta_i64("schema-version"), Ok(Some(v)) if v >= SCHEMA_VERSION))
    }

    /// Run `f` in a `BEGIN IMMEDIATE` transaction. Called inside another `tx` of this
    /// store, `f` simply joins it (and the outer one commits or rolls back everything), so
    /// a caller can group several writes that each are atomic on their own into one commit.
    pub fn tx<T>(&self, f: impl FnOnce(&Store<'a, D>) -> Result<T, DbError>) -> Result<T, DbError> {
        if self.in_tx.get() {
            return f(self);
        }
        self.db.transaction(|_| {
            self.in_tx.set(true);
            let result = f(self);
            self.in_tx.set(false);
            result
        })
    }

    /// Run `f` in one read transaction (`BEGIN DEFERRED`): every read sees the same
    /// instant, and SQLite takes its read lock once instead of once per statement. Inside a
    /// `tx`, `f` joins it.
    pub fn read<T>(
        &self,
        f: impl FnOnce(&Store<'a, D>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        if self.in_tx.get() {
            return f(self);
        }
        self.db.execute_batch("BEGIN DEFERRED")?;
        self.in_tx.set(true);
        let result = f(self);
        self.in_tx.set(false);
        let end = self
            .db
            .execute_batch(if result.is_ok() { "COMMIT" } else { "ROLLBACK" });
        let value = result?;
        end?;
        Ok(value)
    }

    // ---- meta -------------------------------------------------------------------------

    pub fn meta_i64(&self, key: &str) -> Result<Option<i64>, DbError> {
        let rows = self
            .db
            .query("SELECT value FROM meta WHERE key = ?1", &[key.into()])?;
        Ok(rows
            .first()
            .and_then(|r| r.get("value").ok().and_then(Value::as_i64)))
    }

    pub fn set_meta_i64(&self, key: &str, v: i64) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            &[key.into(), v.into()],
        )?;
        Ok(())
    }

    fn next_generation(&self) -> Result<i64, DbError> {
        let g = self.meta_i64("pin-generation")?.unwrap_or(0) + 1;
        self.set_meta_i64("pin-generation", g)?;
        Ok(g)
    }

    // ---- settings ---------------------------------------------------------------------

    pub fn setting_pairs(&self) -> Result<Vec<(String, String)>, DbError> {
        let rows = self.db.query("SELECT key, value FROM settings", &[])?;
        rows.iter()
            .map(|r| Ok((r.text("key")?, r.text("value")?)))
            .collect()
    }

    pub fn settings(&self) -> Result<Settings, DbError> {
        Ok(Settings::from_pairs(&self.setting_pairs()?))
    }

    pub fn put_setting(&self, key: &str, canonical: &str) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            &[key.into(), canonical.into()],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
