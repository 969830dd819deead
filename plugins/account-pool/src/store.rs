//! The pool's state, all of it in SQLite: the schema (idempotent migrations with a schema
//! version row) and every read and write. Nothing is kept in guest memory between calls;
//! read-modify-writes that concurrent instances could interleave run inside
//! `BEGIN IMMEDIATE` transactions (pin claims and binds, the cursor, refresh leases,
//! taking pending signals). No transaction is held across an `await`.

use crate::model::{
    ChangeCause, Credential, CredentialKind, Family, HoldKind, OAuthTokens, Provider,
};
use crate::policy::{AccountState, PinSeen};
use crate::quota::{QuotaState, Restriction, Window};
use crate::settings::Settings;
use pooler_plugin_kit::{Db, DbError, Row, Value};

/// The schema version this code writes. 2: `attempts` is keyed by session (`WITHOUT
/// ROWID`, ids counted per session) instead of a global AUTOINCREMENT id plus an index.
pub const SCHEMA_VERSION: i64 = 2;

/// Recent attempts kept per session for `explain-session`.
pub const RECENT_ATTEMPTS: usize = 20;

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
    needs_sign_in INTEGER NOT NULL DEFAULT 0
);
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

/// A stored pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub account: String,
    pub thread: Option<String>,
    pub last_used_at: u64,
    pub generation: i64,
    pub provisional: bool,
    pub why: String,
}

/// An account's fields that only people need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountMeta {
    pub label: String,
    pub created_at: u64,
    pub last_used_at: Option<u64>,
}

/// One recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub at: u64,
    pub account: String,
    pub status: Option<u16>,
    pub outcome: String,
}

/// Refresh bookkeeping of an OAuth account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefreshState {
    pub lease_until: Option<u64>,
    pub lease_owner: Option<String>,
    pub backoff_ms: Option<u64>,
    pub retry_at: Option<u64>,
    /// `transient` or `refused`: what the last failed refresh was.
    pub failure: Option<String>,
    pub last_usage_at: Option<u64>,
}

/// Signals taken for delivery: per provider, the causes in first-seen order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSignal {
    pub provider: Provider,
    pub causes: Vec<ChangeCause>,
    pub detected_at: u64,
}

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
            st.db.execute_batch(SCHEMA)?;
            if version == Some(1) {
                st.db.execute_batch(ATTEMPTS_V2_AFTER)?;
            }
            st.set_meta_i64("schema-version", SCHEMA_VERSION)
        })
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

    // ---- accounts ---------------------------------------------------------------------

    /// Insert a new account with its secret; it gets the next insertion order.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_account(
        &self,
        id: &str,
        provider: Provider,
        credential: &Credential,
        label: &str,
        priority: i32,
        now: u64,
    ) -> Result<(), DbError> {
        self.tx(|s| {
            let seq = s
                .db
                .query("SELECT COALESCE(MAX(seq), 0) + 1 AS n FROM accounts", &[])?
                .first()
                .map(|r| r.i64("n"))
                .transpose()?
                .unwrap_or(1);
            s.db.execute(
                "INSERT INTO accounts (id, seq, provider, kind, label, priority, enabled, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7)",
                &[
                    id.into(),
                    seq.into(),
                    provider.as_str().into(),
                    credential.kind().as_str().into(),
                    label.into(),
                    priority.into(),
                    now.into(),
                ],
            )?;
            s.put_credential(id, credential)
        })
    }

    const ACCOUNT_SELECT: &'static str =
        "SELECT a.id, a.seq, a.provider, a.kind, a.priority, a.enabled, a.error,
            a.held_until, a.hold_kind, a.needs_sign_in, a.last_used_at, s.expires_at, r.retry_at, r.failure,
            q.overage, q.credits, q.representative_claim, q.restriction_reason, q.restriction_reset
        FROM accounts a
        LEFT JOIN secrets s ON s.account_id = a.id
        LEFT JOIN refresh_state r ON r.account_id = a.id
        LEFT JOIN quota q ON q.account_id = a.id";

    fn account_from_row(&self, r: &Row<'_>, windows: Vec<Window>) -> Result<AccountState, DbError> {
        let id = r.text("id")?;
        let failure = r.opt_text("failure")?;
        let quota = QuotaState {
            windows,
            overage: r.opt_text("overage")?,
            credits: r.get("credits")?.as_i64().map(|c| c != 0),
            representative_claim: r.opt_text("representative_claim")?,
            restriction: r.opt_text("restriction_reason")?.map(|reason| Restriction {
                reason,
                resets_at: r.opt_u64("restriction_reset").ok().flatten(),
            }),
        };
        Ok(AccountState {
            provider: decode("provider", Provider::parse(&r.text("provider")?))?,
            kind: decode("kind", CredentialKind::parse(&r.text("kind")?))?,
            priority: i32::try_from(r.i64("priority")?).unwrap_or(0),
            seq: r.i64("seq")?,
            enabled: r.bool("enabled")?,
            error: r.opt_text("error")?,
            held_until: r.opt_u64("held_until")?,
            hold_kind: r.opt_text("hold_kind")?.and_then(|k| HoldKind::parse(&k)),
            quota,
            needs_sign_in: r.bool("needs_sign_in")?,
            token_expires_at: r.opt_u64("expires_at")?,
            refresh_retry_at: if failure.as_deref() == Some("transient") {
                r.opt_u64("retry_at")?
            } else {
                None
            },
            last_used_at: r.opt_u64("last_used_at")?,
            id,
        })
    }

    /// Accounts of a provider (or all), in selection order: priority, then order added.
    pub fn accounts(&self, provider: Option<Provider>) -> Result<Vec<AccountState>, DbError> {
        let rows = match provider {
            Some(p) => self.db.query(
                &format!(
                    "{} WHERE a.provider = ?1 ORDER BY a.priority, a.seq",
                    Self::ACCOUNT_SELECT
                ),
                &[p.as_str().into()],
            )?,
            None => self.db.query(
                &format!(
                    "{} ORDER BY a.provider, a.priority, a.seq",
                    Self::ACCOUNT_SELECT
                ),
                &[],
            )?,
        };
        // Every listed account's windows in one query rather than one query per account.
        let mut windows = match provider {
            Some(p) => self.windows_where(
                "WHERE account_id IN (SELECT id FROM accounts WHERE provider = ?1)",
                &[p.as_str().into()],
            )?,
            None => self.windows_where("", &[])?,
        };
        rows.iter()
            .map(|r| {
                let own = windows.remove(&r.text("id")?).unwrap_or_default();
                self.account_from_row(&r, own)
            })
            .collect()
    }

    pub fn account(&self, id: &str) -> Result<Option<AccountState>, DbError> {
        let rows = self.db.query(
            &format!("{} WHERE a.id = ?1", Self::ACCOUNT_SELECT),
            &[id.into()],
        )?;
        rows.first()
            .map(|r| self.account_from_row(&r, self.windows(id)?))
            .transpose()
    }

    pub fn account_meta(&self, id: &str) -> Result<Option<AccountMeta>, DbError> {
        let rows = self.db.query(
            "SELECT label, created_at, last_used_at FROM accounts WHERE id = ?1",
            &[id.into()],
        )?;
        rows.first()
            .map(|r| {
                Ok(AccountMeta {
                    label: r.text("label")?,
                    created_at: r.u64("created_at")?,
                    last_used_at: r.opt_u64("last_used_at")?,
                })
            })
            .transpose()
    }

    /// Set `enabled`; enabling also clears the error, the hold and the sign-in flag.
    pub fn set_enabled(&self, id: &str, enabled: bool) -> Result<bool, DbError> {
        let sql = if enabled {
            "UPDATE accounts SET enabled = 1, error = NULL, held_until = NULL, hold_kind = NULL WHERE id = ?1"
        } else {
            "UPDATE accounts SET enabled = 0 WHERE id = ?1"
        };
        Ok(self.db.execute(sql, &[id.into()])? > 0)
    }

    pub fn set_priority(&self, id: &str, priority: i32) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE accounts SET priority = ?2 WHERE id = ?1",
            &[id.into(), priority.into()],
        )? > 0)
    }

    /// Put the account in authentication error. Returns whether it was not already.
    pub fn set_error(&self, id: &str, text: &str) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE accounts SET error = ?2 WHERE id = ?1 AND error IS NULL",
            &[id.into(), text.into()],
        )? > 0)
    }

    /// Clear the error and the sign-in flag. Returns whether an error was cleared.
    pub fn clear_error(&self, id: &str) -> Result<bool, DbError> {
        let had = self.db.execute(
            "UPDATE accounts SET error = NULL, needs_sign_in = 0 WHERE id = ?1 AND error IS NOT NULL",
            &[id.into()],
        )? > 0;
        self.db.execute(
            "UPDATE accounts SET needs_sign_in = 0 WHERE id = ?1",
            &[id.into()],
        )?;
        Ok(had)
    }

    pub fn set_needs_sign_in(&self, id: &str, flag: bool) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE accounts SET needs_sign_in = ?2 WHERE id = ?1",
            &[id.into(), flag.into()],
        )?;
        Ok(())
    }

    /// Hold the account until `until` (a later existing hold is kept).
    pub fn set_hold(&self, id: &str, until: u64, kind: HoldKind) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE accounts SET held_until = ?2, hold_kind = ?3
             WHERE id = ?1 AND (held_until IS NULL OR held_until < ?2)",
            &[id.into(), until.into(), kind.as_str().into()],
        )?;
        Ok(())
    }

    /// Record that the account was used at `now`, unless its last use is already within
    /// [`TOUCH_GRANULARITY_MS`] of it (then nothing is written). `seen` is its last use as
    /// the caller read it: when that is recent enough, no statement runs at all.
    pub fn touch_account(&self, id: &str, seen: Option<u64>, now: u64) -> Result<(), DbError> {
        if !crate::policy::use_due(seen, now, TOUCH_GRANULARITY_MS) {
            return Ok(());
        }
        self.db.execute(
            "UPDATE accounts SET last_used_at = ?2
             WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at + ?3 <= ?2)",
            &[id.into(), now.into(), TOUCH_GRANULARITY_MS.into()],
        )?;
        Ok(())
    }

    /// Remove an account, its secret, quota and refresh state. Pins to it stay and re-pin
    /// on their next success; the cursor moves on the next success elsewhere.
    pub fn remove_account(&self, id: &str) -> Result<bool, DbError> {
        self.tx(|s| {
            for sql in [
                "DELETE FROM secrets WHERE account_id = ?1",
                "DELETE FROM windows WHERE account_id = ?1",
                "DELETE FROM quota WHERE account_id = ?1",
                "DELETE FROM refresh_state WHERE account_id = ?1",
            ] {
                s.db.execute(sql, &[id.into()])?;
            }
            Ok(s.db
                .execute("DELETE FROM accounts WHERE id = ?1", &[id.into()])?
                > 0)
        })
    }

    // ---- secrets ----------------------------------------------------------------------

    pub fn credential(&self, id: &str) -> Result<Option<Credential>, DbError> {
        let rows = self.db.query(
            "SELECT a.kind, s.api_key, s.access_token, s.refresh_token, s.expires_at, s.chatgpt_account_id
             FROM accounts a JOIN secrets s ON s.account_id = a.id WHERE a.id = ?1",
            &[id.into()],
        )?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(match CredentialKind::parse(&r.text("kind")?) {
            Some(CredentialKind::ApiKey) => Credential::ApiKey(r.text("api_key")?),
            Some(CredentialKind::OAuth) => Credential::OAuth(OAuthTokens {
                access_token: r.text("access_token")?,
                refresh_token: r.text("refresh_token")?,
                expires_at: r.opt_u64("expires_at")?,
                chatgpt_account_id: r.opt_text("chatgpt_account_id")?,
            }),
            None => return Err(DbError::Decode("bad kind".into())),
        }))
    }

    pub fn put_credential(&self, id: &str, c: &Credential) -> Result<(), DbError> {
        let (api, at, rt, exp, acct): (Value, Value, Value, Value, Value) = match c {
            Credential::ApiKey(k) => (k.into(), Value::Null, Value::Null, Value::Null, Value::Null),
            Credential::OAuth(t) => (
                Value::Null,
                (&t.access_token).into(),
                (&t.refresh_token).into(),
                t.expires_at.into(),
                t.chatgpt_account_id.clone().into(),
            ),
        };
        self.db.execute(
            "INSERT INTO secrets (account_id, api_key, access_token, refresh_token, expires_at, chatgpt_account_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(account_id) DO UPDATE SET api_key = excluded.api_key,
                access_token = excluded.access_token, refresh_token = excluded.refresh_token,
                expires_at = excluded.expires_at, chatgpt_account_id = excluded.chatgpt_account_id",
            &[id.into(), api, at, rt, exp, acct],
        )?;
        Ok(())
    }

    /// The current access token of an OAuth account (to guard writes against a token that
    /// was replaced meanwhile).
    pub fn access_token(&self, id: &str) -> Result<Option<String>, DbError> {
        let rows = self.db.query(
            "SELECT access_token FROM secrets WHERE account_id = ?1",
            &[id.into()],
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.opt_text("access_token").ok().flatten()))
    }

    // ---- quota ------------------------------------------------------------------------

    fn windows(&self, id: &str) -> Result<Vec<Window>, DbError> {
        Ok(self
            .windows_where("WHERE account_id = ?1", &[id.into()])?
            .remove(id)
            .unwrap_or_default())
    }

    /// The stored windows of the accounts `filter` selects, by account, each account's in
    /// name order.
    fn windows_where(
        &self,
        filter: &str,
        params: &[Value],
    ) -> Result<std::collections::HashMap<String, Vec<Window>>, DbError> {
        let rows = self.db.query(
            &format!(
                "SELECT account_id, name, family, utilization, resets_at, status, observed_at
                 FROM windows {filter} ORDER BY account_id, name"
            ),
            params,
        )?;
        let mut by_account: std::collections::HashMap<String, Vec<Window>> =
            std::collections::HashMap::new();
        for r in rows.iter() {
            by_account
                .entry(r.text("account_id")?)
                .or_default()
                .push(Window {
                    name: r.text("name")?,
                    family: r.opt_text("family")?.and_then(|f| Family::parse(&f)),
                    utilization: r.opt_f64("utilization")?,
                    resets_at: r.opt_u64("resets_at")?,
                    status: r.opt_text("status")?,
                    observed_at: r.u64("observed_at")?,
                });
        }
        Ok(by_account)
    }

    /// Replace an account's stored quota.
    pub fn save_quota(&self, id: &str, q: &QuotaState) -> Result<(), DbError> {
        self.db
            .execute("DELETE FROM windows WHERE account_id = ?1", &[id.into()])?;
        for w in &q.windows {
            self.db.execute(
                "INSERT INTO windows (account_id, name, family, utilization, resets_at, status, observed_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &[
                    id.into(),
                    (&w.name).into(),
                    w.family.map(Family::as_str).into(),
                    w.utilization.into(),
                    w.resets_at.into(),
                    w.status.clone().into(),
                    w.observed_at.into(),
                ],
            )?;
        }
        self.db.execute(
            "INSERT INTO quota (account_id, overage, credits, representative_claim, restriction_reason, restriction_reset)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(account_id) DO UPDATE SET overage = excluded.overage, credits = excluded.credits,
                representative_claim = excluded.representative_claim,
                restriction_reason = excluded.restriction_reason, restriction_reset = excluded.restriction_reset",
            &[
                id.into(),
                q.overage.clone().into(),
                q.credits.into(),
                q.representative_claim.clone().into(),
                q.restriction.as_ref().map(|r| r.reason.clone()).into(),
                q.restriction.as_ref().and_then(|r| r.resets_at).into(),
            ],
        )?;
        Ok(())
    }

    // ---- refresh state ----------------------------------------------------------------

    pub fn refresh_state(&self, id: &str) -> Result<RefreshState, DbError> {
        let rows = self.db.query(
            "SELECT lease_until, lease_owner, backoff_ms, retry_at, failure, last_usage_at
             FROM refresh_state WHERE account_id = ?1",
            &[id.into()],
        )?;
        let Some(r) = rows.first() else {
            return Ok(RefreshState::default());
        };
        Ok(RefreshState {
            lease_until: r.opt_u64("lease_until")?,
            lease_owner: r.opt_text("lease_owner")?,
            backoff_ms: r.opt_u64("backoff_ms")?,
            retry_at: r.opt_u64("retry_at")?,
            failure: r.opt_text("failure")?,
            last_usage_at: r.opt_u64("last_usage_at")?,
        })
    }

    fn ensure_refresh_row(&self, id: &str) -> Result<(), DbError> {
        self.db.execute(
            "INSERT OR IGNORE INTO refresh_state (account_id) VALUES (?1)",
            &[id.into()],
        )?;
        Ok(())
    }

    /// Take the account's refresh lease (single flight across instances) unless another
    /// owner holds an unexpired one.
    pub fn try_lease(&self, id: &str, owner: &str, now: u64, until: u64) -> Result<bool, DbError> {
        self.tx(|s| {
            s.ensure_refresh_row(id)?;
            let n = s.db.execute(
                "UPDATE refresh_state SET lease_until = ?3, lease_owner = ?2
                 WHERE account_id = ?1 AND (lease_until IS NULL OR lease_until <= ?4 OR lease_owner = ?2)",
                &[id.into(), owner.into(), until.into(), now.into()],
            )?;
            Ok(n > 0)
        })
    }

    pub fn release_lease(&self, id: &str, owner: &str) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE refresh_state SET lease_until = NULL, lease_owner = NULL WHERE account_id = ?1 AND lease_owner = ?2",
            &[id.into(), owner.into()],
        )?;
        Ok(())
    }

    /// Record a failed refresh: its kind and the backoff until the next try.
    pub fn set_refresh_failure(
        &self,
        id: &str,
        failure: &str,
        backoff_ms: u64,
        retry_at: u64,
    ) -> Result<(), DbError> {
        self.ensure_refresh_row(id)?;
        self.db.execute(
            "UPDATE refresh_state SET failure = ?2, backoff_ms = ?3, retry_at = ?4 WHERE account_id = ?1",
            &[id.into(), failure.into(), backoff_ms.into(), retry_at.into()],
        )?;
        Ok(())
    }

    pub fn clear_refresh_failure(&self, id: &str) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE refresh_state SET failure = NULL, backoff_ms = NULL, retry_at = NULL WHERE account_id = ?1",
            &[id.into()],
        )?;
        Ok(())
    }

    pub fn set_last_usage(&self, id: &str, now: u64) -> Result<(), DbError> {
        self.ensure_refresh_row(id)?;
        self.db.execute(
            "UPDATE refresh_state SET last_usage_at = ?2 WHERE account_id = ?1",
            &[id.into(), now.into()],
        )?;
        Ok(())
    }

    // ---- routes -----------------------------------------------------------------------

    /// Open (or replace) a route; the old token of the thread stops working at once.
    pub fn open_route(
        &self,
        thread: &str,
        provider: Provider,
        hash: &[u8],
        now: u64,
    ) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO routes (thread, provider, token_hash, opened_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(thread, provider) DO UPDATE SET token_hash = excluded.token_hash, opened_at = excluded.opened_at",
            &[thread.into(), provider.as_str().into(), hash.to_vec().into(), now.into()],
        )?;
        Ok(())
    }

    pub fn close_route(&self, thread: &str, provider: Provider) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "DELETE FROM routes WHERE thread = ?1 AND provider = ?2",
            &[thread.into(), provider.as_str().into()],
        )? > 0)
    }

    pub fn has_route(&self, thread: &str, provider: Provider) -> Result<bool, DbError> {
        Ok(!self
            .db
            .query(
                "SELECT 1 AS x FROM routes WHERE thread = ?1 AND provider = ?2",
                &[thread.into(), provider.as_str().into()],
            )?
            .is_empty())
    }

    /// The route whose token has this hash: (thread, provider). The stored hash is compared
    /// in constant time after the indexed lookup.
    pub fn route_by_hash(&self, hash: &[u8]) -> Result<Option<(String, Provider)>, DbError> {
        let rows = self.db.query(
            "SELECT thread, provider, token_hash FROM routes WHERE token_hash = ?1",
            &[hash.to_vec().into()],
        )?;
        for r in rows.iter() {
            let stored = r.get("token_hash")?.as_blob().unwrap_or_default();
            if crate::token::constant_time_eq(stored, hash) {
                let provider = decode("provider", Provider::parse(&r.text("provider")?))?;
                return Ok(Some((r.text("thread")?, provider)));
            }
        }
        Ok(None)
    }

    // ---- pins -------------------------------------------------------------------------

    /// The pin of a session, if fresh (used within the idle lifetime).
    pub fn pin(
        &self,
        provider: Provider,
        key: &str,
        now: u64,
        lifetime: u64,
    ) -> Result<Option<Pin>, DbError> {
        let rows = self.db.query(
            "SELECT account_id, thread, last_used_at, generation, provisional, why FROM pins
             WHERE provider = ?1 AND key = ?2",
            &[provider.as_str().into(), key.into()],
        )?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let pin = Pin {
            account: r.text("account_id")?,
            thread: r.opt_text("thread")?,
            last_used_at: r.u64("last_used_at")?,
            generation: r.i64("generation")?,
            provisional: r.bool("provisional")?,
            why: r.text("why")?,
        };
        Ok((now.saturating_sub(pin.last_used_at) < lifetime).then_some(pin))
    }

    #[allow(clippy::too_many_arguments)]
    fn write_pin(
        &self,
        provider: Provider,
        key: &str,
        account: &str,
        thread: Option<&str>,
        now: u64,
        provisional: bool,
        why: &str,
        cap: u64,
    ) -> Result<i64, DbError> {
        let generation = self.next_generation()?;
        self.db.execute(
            "INSERT INTO pins (provider, key, account_id, thread, last_used_at, generation, provisional, why)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT(provider, key) DO UPDATE SET account_id = excluded.account_id, thread = excluded.thread,
                last_used_at = excluded.last_used_at, generation = excluded.generation,
                provisional = excluded.provisional, why = excluded.why",
            &[
                provider.as_str().into(),
                key.into(),
                account.into(),
                thread.into(),
                now.into(),
                generation.into(),
                provisional.into(),
                why.into(),
            ],
        )?;
        self.evict_pins(cap)?;
        Ok(generation)
    }

    /// Claim a provisional pin for a session that has none, atomically: if another request
    /// pinned the session meanwhile, that pin wins and is returned unclaimed. Concurrent
    /// first requests of one session therefore land on one account.
    #[allow(clippy::too_many_arguments)]
    pub fn claim_pin(
        &self,
        provider: Provider,
        key: &str,
        account: &str,
        thread: Option<&str>,
        now: u64,
        lifetime: u64,
        cap: u64,
        why: &str,
    ) -> Result<PinSeen, DbError> {
        self.tx(|s| {
            if let Some(p) = s.pin(provider, key, now, lifetime)? {
                return Ok(PinSeen {
                    confirmed_use: (!p.provisional).then_some(p.last_used_at),
                    account: p.account,
                    generation: p.generation,
                    claimed: false,
                });
            }
            let generation = s.write_pin(provider, key, account, thread, now, true, why, cap)?;
            Ok(PinSeen {
                account: account.to_owned(),
                generation,
                claimed: true,
                confirmed_use: None,
            })
        })
    }

    /// Bind the session to `account` unless a newer request re-pinned it since this request
    /// saw generation `expected` (None: the request saw no pin). Returns whether it bound.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_pin(
        &self,
        provider: Provider,
        key: &str,
        account: &str,
        thread: Option<&str>,
        expected: Option<i64>,
        now: u64,
        lifetime: u64,
        why: &str,
        cap: u64,
    ) -> Result<bool, DbError> {
        self.tx(|s| {
            let current = s.pin(provider, key, now, lifetime)?.map(|p| p.generation);
            if current.is_some() && current != expected {
                return Ok(false);
            }
            s.write_pin(provider, key, account, thread, now, false, why, cap)?;
            Ok(true)
        })
    }

    /// Refresh a pin's last use (and confirm a provisional pin) if it is still the one the
    /// request saw. A confirmed pin used within [`TOUCH_GRANULARITY_MS`] is left as it is.
    /// Returns whether it wrote.
    pub fn touch_pin(
        &self,
        provider: Provider,
        key: &str,
        generation: i64,
        now: u64,
    ) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE pins SET last_used_at = ?4, provisional = 0
             WHERE provider = ?1 AND key = ?2 AND generation = ?3
               AND (provisional = 1 OR last_used_at + ?5 <= ?4)",
            &[
                provider.as_str().into(),
                key.into(),
                generation.into(),
                now.into(),
                TOUCH_GRANULARITY_MS.into(),
            ],
        )? > 0)
    }

    /// Drop a provisional pin this request claimed, when it served nothing.
    pub fn release_claim(
        &self,
        provider: Provider,
        key: &str,
        generation: i64,
    ) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM pins WHERE provider = ?1 AND key = ?2 AND generation = ?3 AND provisional = 1",
            &[provider.as_str().into(), key.into(), generation.into()],
        )?;
        Ok(())
    }

    fn evict_pins(&self, cap: u64) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM pins WHERE rowid IN (
                SELECT rowid FROM pins ORDER BY last_used_at DESC, generation DESC LIMIT -1 OFFSET ?1)",
            &[cap.into()],
        )?;
        Ok(())
    }

    /// Delete expired pins and keep at most `cap`. Returns how many were deleted.
    pub fn prune_pins(&self, now: u64, lifetime: u64, cap: u64) -> Result<u64, DbError> {
        let n = self.db.execute(
            "DELETE FROM pins WHERE last_used_at <= ?1",
            &[now.saturating_sub(lifetime).into()],
        )?;
        self.evict_pins(cap)?;
        Ok(n)
    }

    pub fn pin_count(&self) -> Result<u64, DbError> {
        let rows = self.db.query("SELECT COUNT(*) AS n FROM pins", &[])?;
        rows.first().map_or(Ok(0), |r| r.u64("n"))
    }

    // ---- cursor -----------------------------------------------------------------------

    pub fn cursor(&self, provider: Provider) -> Result<Option<String>, DbError> {
        let rows = self.db.query(
            "SELECT account_id FROM cursors WHERE provider = ?1",
            &[provider.as_str().into()],
        )?;
        rows.first().map(|r| r.text("account_id")).transpose()
    }

    /// Move the cursor to `new` if it is still `expected`.
    pub fn cas_cursor(
        &self,
        provider: Provider,
        expected: Option<&str>,
        new: &str,
    ) -> Result<bool, DbError> {
        self.tx(|s| {
            if s.cursor(provider)?.as_deref() != expected {
                return Ok(false);
            }
            s.db.execute(
                "INSERT INTO cursors (provider, account_id) VALUES (?1, ?2)
                 ON CONFLICT(provider) DO UPDATE SET account_id = excluded.account_id",
                &[provider.as_str().into(), new.into()],
            )?;
            Ok(true)
        })
    }

    // ---- attempts ---------------------------------------------------------------------

    pub fn record_attempt(
        &self,
        provider: Provider,
        key: &str,
        at: u64,
        account: &str,
        status: Option<u16>,
        outcome: &str,
    ) -> Result<(), DbError> {
        // Ids count up per session; every RECENT_ATTEMPTS-th one trims the session back to
        // its last RECENT_ATTEMPTS, so most attempts write one row and nothing else.
        let rows = self.db.query(
            "INSERT INTO attempts (provider, key, id, at, account_id, status, outcome)
             SELECT ?1, ?2, COALESCE(MAX(id), 0) + 1, ?3, ?4, ?5, ?6
             FROM attempts WHERE provider = ?1 AND key = ?2
             RETURNING id",
            &[
                provider.as_str().into(),
                key.into(),
                at.into(),
                account.into(),
                status.map(u32::from).into(),
                outcome.into(),
            ],
        )?;
        let id = rows.first().map_or(Ok(0), |r| r.i64("id"))?;
        let keep = RECENT_ATTEMPTS as i64;
        if id > 0 && id % keep == 0 {
            self.db.execute(
                "DELETE FROM attempts WHERE provider = ?1 AND key = ?2 AND id <= ?3",
                &[provider.as_str().into(), key.into(), (id - keep).into()],
            )?;
        }
        Ok(())
    }

    /// The latest attempts of a session, newest last.
    pub fn recent_attempts(
        &self,
        provider: Provider,
        key: &str,
    ) -> Result<Vec<AttemptRow>, DbError> {
        let rows = self.db.query(
            "SELECT at, account_id, status, outcome FROM attempts WHERE provider = ?1 AND key = ?2
             ORDER BY id DESC LIMIT ?3",
            &[
                provider.as_str().into(),
                key.into(),
                (RECENT_ATTEMPTS as u64).into(),
            ],
        )?;
        let mut rows: Vec<_> = rows.iter().collect();
        rows.reverse();
        rows.into_iter()
            .map(|r| {
                Ok(AttemptRow {
                    at: r.u64("at")?,
                    account: r.text("account_id")?,
                    status: r.opt_u64("status")?.and_then(|s| u16::try_from(s).ok()),
                    outcome: r.text("outcome")?,
                })
            })
            .collect()
    }

    /// Drop attempts of sessions idle longer than `age`.
    pub fn prune_attempts(&self, now: u64, age: u64) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM attempts WHERE at <= ?1",
            &[now.saturating_sub(age).into()],
        )?;
        Ok(())
    }

    // ---- signals ----------------------------------------------------------------------

    /// Queue an availability-changed cause; repeated causes coalesce.
    pub fn push_signal(
        &self,
        provider: Provider,
        cause: ChangeCause,
        now: u64,
    ) -> Result<(), DbError> {
        self.db.execute(
            "INSERT OR IGNORE INTO pending_signals (provider, cause, seq, detected_at)
             VALUES (?1, ?2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM pending_signals), ?3)",
            &[provider.as_str().into(), cause.as_str().into(), now.into()],
        )?;
        Ok(())
    }

    /// Take every pending signal (atomically, so two instances never deliver the same one),
    /// grouped per provider with causes in first-seen order.
    pub fn take_signals(&self) -> Result<Vec<PendingSignal>, DbError> {
        self.tx(|s| {
            let rows = s.db.query(
                "SELECT provider, cause, detected_at FROM pending_signals ORDER BY seq",
                &[],
            )?;
            let mut out: Vec<PendingSignal> = Vec::new();
            for r in rows.iter() {
                let provider = decode("provider", Provider::parse(&r.text("provider")?))?;
                let Some(cause) = ChangeCause::parse(&r.text("cause")?) else {
                    continue;
                };
                let at = r.u64("detected_at")?;
                match out.iter_mut().find(|p| p.provider == provider) {
                    Some(p) => p.causes.push(cause),
                    None => out.push(PendingSignal {
                        provider,
                        causes: vec![cause],
                        detected_at: at,
                    }),
                }
            }
            s.db.execute("DELETE FROM pending_signals", &[])?;
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pooler_plugin_kit::NativeDb;

    fn store(db: &NativeDb) -> Store<'_, NativeDb> {
        let s = Store::new(db);
        s.migrate().unwrap();
        s
    }

    #[test]
    fn migrations_are_idempotent_and_versioned() {
        let db = NativeDb::memory();
        let s = store(&db);
        s.migrate().unwrap();
        assert_eq!(s.meta_i64("schema-version").unwrap(), Some(SCHEMA_VERSION));
    }

    #[test]
    fn accounts_round_trip_in_selection_order() {
        let db = NativeDb::memory();
        let s = store(&db);
        s.insert_account(
            "b",
            Provider::Claude,
            &Credential::ApiKey("k-b".into()),
            "B",
            0,
            10,
        )
        .unwrap();
        s.insert_account(
            "a",
            Provider::Claude,
            &Credential::ApiKey("k-a".into()),
            "A",
            0,
            11,
        )
        .unwrap();
        s.insert_account(
            "z",
            Provider::Claude,
            &Credential::ApiKey("k-z".into()),
            "Z",
            -1,
            12,
        )
        .unwrap();
        s.insert_account(
            "c",
            Provider::Codex,
            &Credential::OAuth(OAuthTokens {
                access_token: "at".into(),
                refresh_token: "rt".into(),
                expires_at: Some(99),
                chatgpt_account_id: Some("x".into()),
            }),
            "C",
            0,
            13,
        )
        .unwrap();
        let ids: Vec<String> = s
            .accounts(Some(Provider::Claude))
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect();
        assert_eq!(ids, ["z", "b", "a"], "priority, then order added");
        let c = s.account("c").unwrap().unwrap();
        assert_eq!(
            (c.kind, c.token_expires_at),
            (CredentialKind::OAuth, Some(99))
        );
        assert!(
            matches!(s.credential("c").unwrap(), Some(Credential::OAuth(t)) if t.refresh_token == "rt")
        );
        assert!(s.remove_account("c").unwrap());
        assert_eq!(s.credential("c").unwrap(), None);
    }

    /// AP-19: a bind that saw an older generation does not overwrite a newer pin.
    #[test]
    fn pin_binds_are_guarded_by_generation() {
        let db = NativeDb::memory();
        let s = store(&db);
        let (p, k, life, cap) = (Provider::Claude, "session:s", 1_000_000, 10);
        let seen = s
            .claim_pin(p, k, "a", Some("t1"), 0, life, cap, "first")
            .unwrap();
        assert!(seen.claimed);
        let again = s
            .claim_pin(p, k, "b", Some("t1"), 1, life, cap, "first")
            .unwrap();
        assert_eq!(
            (again.account.as_str(), again.claimed),
            ("a", false),
            "the first claim wins"
        );
        // A newer request re-pins to b.
        assert!(
            s.bind_pin(
                p,
                k,
                "b",
                None,
                Some(seen.generation),
                2,
                life,
                "rebound",
                cap
            )
            .unwrap()
        );
        // The older request, which also saw the first generation, completes later.
        assert!(
            !s.bind_pin(
                p,
                k,
                "c",
                None,
                Some(seen.generation),
                3,
                life,
                "stale",
                cap
            )
            .unwrap()
        );
        assert!(!s.touch_pin(p, k, seen.generation, 4).unwrap());
        assert_eq!(s.pin(p, k, 5, life).unwrap().unwrap().account, "b");
    }

    #[test]
    fn pins_expire_and_are_capped_least_recently_used_first() {
        let db = NativeDb::memory();
        let s = store(&db);
        let p = Provider::Claude;
        // Seconds apart: a use within TOUCH_GRANULARITY_MS of the last is not written.
        const SEC: u64 = 1_000;
        let life = 100 * SEC;
        for (i, k) in ["k1", "k2", "k3", "k4"].into_iter().enumerate() {
            s.bind_pin(p, k, "a", None, None, i as u64 * SEC, life, "x", 4)
                .unwrap();
        }
        let g1 = s.pin(p, "k1", 4 * SEC, life).unwrap().unwrap().generation;
        assert!(s.touch_pin(p, "k1", g1, 10 * SEC).unwrap());
        s.bind_pin(p, "k5", "a", None, None, 11 * SEC, life, "x", 4)
            .unwrap();
        assert!(
            s.pin(p, "k1", 12 * SEC, life).unwrap().is_some(),
            "touched pin survives"
        );
        assert!(
            s.pin(p, "k2", 12 * SEC, life).unwrap().is_none(),
            "LRU evicted"
        );
        assert_eq!(s.pin_count().unwrap(), 4);
        assert!(
            s.pin(p, "k5", 111 * SEC, life).unwrap().is_none(),
            "expired after the idle lifetime"
        );
        assert_eq!(s.prune_pins(111 * SEC, life, 4).unwrap(), 4);
    }

    #[test]
    fn a_use_within_the_granularity_writes_nothing() {
        let db = NativeDb::memory();
        let s = store(&db);
        let p = Provider::Claude;
        s.bind_pin(p, "k", "a", None, None, 5_000, 60_000, "x", 8)
            .unwrap();
        let pin = s.pin(p, "k", 5_000, 60_000).unwrap().unwrap();
        let later = 5_000 + TOUCH_GRANULARITY_MS - 1;
        assert!(!s.touch_pin(p, "k", pin.generation, later).unwrap());
        assert_eq!(
            s.pin(p, "k", later, 60_000).unwrap().unwrap().last_used_at,
            5_000
        );
        let later = 5_000 + TOUCH_GRANULARITY_MS;
        assert!(s.touch_pin(p, "k", pin.generation, later).unwrap());
        assert_eq!(
            s.pin(p, "k", later, 60_000).unwrap().unwrap().last_used_at,
            later
        );
    }

    #[test]
    fn cursor_moves_only_from_the_expected_value() {
        let db = NativeDb::memory();
        let s = store(&db);
        assert!(s.cas_cursor(Provider::Codex, None, "a").unwrap());
        assert!(!s.cas_cursor(Provider::Codex, None, "b").unwrap());
        assert!(s.cas_cursor(Provider::Codex, Some("a"), "b").unwrap());
        assert_eq!(s.cursor(Provider::Codex).unwrap().as_deref(), Some("b"));
        assert_eq!(s.cursor(Provider::Claude).unwrap(), None);
    }

    #[test]
    fn refresh_lease_is_single_flight_until_it_expires() {
        let db = NativeDb::memory();
        let s = store(&db);
        assert!(s.try_lease("a", "r1", 0, 100).unwrap());
        assert!(!s.try_lease("a", "r2", 50, 150).unwrap());
        assert!(
            s.try_lease("a", "r2", 100, 200).unwrap(),
            "an expired lease can be taken"
        );
        s.release_lease("a", "r2").unwrap();
        assert!(s.try_lease("a", "r3", 101, 200).unwrap());
    }

    #[test]
    fn signals_coalesce_per_provider_in_first_seen_order() {
        let db = NativeDb::memory();
        let s = store(&db);
        s.push_signal(Provider::Claude, ChangeCause::AccountEnabled, 5)
            .unwrap();
        s.push_signal(Provider::Codex, ChangeCause::ConfigChanged, 6)
            .unwrap();
        s.push_signal(Provider::Claude, ChangeCause::ErrorCleared, 7)
            .unwrap();
        s.push_signal(Provider::Claude, ChangeCause::AccountEnabled, 8)
            .unwrap();
        let taken = s.take_signals().unwrap();
        assert_eq!(
            taken,
            vec![
                PendingSignal {
                    provider: Provider::Claude,
                    causes: vec![ChangeCause::AccountEnabled, ChangeCause::ErrorCleared],
                    detected_at: 5
                },
                PendingSignal {
                    provider: Provider::Codex,
                    causes: vec![ChangeCause::ConfigChanged],
                    detected_at: 6
                },
            ]
        );
        assert!(s.take_signals().unwrap().is_empty());
    }

    #[test]
    fn attempts_keep_the_latest_twenty_per_session() {
        let db = NativeDb::memory();
        let s = store(&db);
        for i in 0..25u64 {
            s.record_attempt(Provider::Claude, "session:s", i, "a", Some(200), "served")
                .unwrap();
        }
        let recent = s.recent_attempts(Provider::Claude, "session:s").unwrap();
        assert_eq!(recent.len(), RECENT_ATTEMPTS);
        assert_eq!((recent[0].at, recent[19].at), (5, 24));
        // Another session counts its own ids and keeps its own attempts.
        s.record_attempt(Provider::Claude, "session:t", 99, "b", None, "transient")
            .unwrap();
        let other = s.recent_attempts(Provider::Claude, "session:t").unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!((other[0].at, other[0].account.as_str()), (99, "b"));
        // Stored rows stay bounded: trimmed back to twenty on every twentieth attempt.
        for i in 25..40u64 {
            s.record_attempt(Provider::Claude, "session:s", i, "a", Some(200), "served")
                .unwrap();
        }
        let rows = db
            .query(
                "SELECT COUNT(*) AS n FROM attempts WHERE key = 'session:s'",
                &[],
            )
            .unwrap();
        assert_eq!(
            rows.first().unwrap().u64("n").unwrap(),
            RECENT_ATTEMPTS as u64
        );
        let recent = s.recent_attempts(Provider::Claude, "session:s").unwrap();
        assert_eq!((recent[0].at, recent[19].at), (20, 39));
    }

    #[test]
    fn a_schema_1_database_migrates_keeping_its_attempts() {
        let db = NativeDb::memory();
        db.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value);
             INSERT INTO meta VALUES ('schema-version', 1);
             CREATE TABLE attempts (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 provider TEXT NOT NULL, key TEXT NOT NULL, at INTEGER NOT NULL,
                 account_id TEXT NOT NULL, status INTEGER, outcome TEXT NOT NULL);
             CREATE INDEX attempts_by_key ON attempts(provider, key, id);
             INSERT INTO attempts (provider, key, at, account_id, status, outcome) VALUES
                 ('claude', 'session:s', 1, 'a', 200, 'served'),
                 ('claude', 'session:u', 2, 'b', 529, 'transient'),
                 ('claude', 'session:s', 3, 'c', NULL, 'hold');",
        )
        .unwrap();
        let s = Store::new(&db);
        assert!(!s.schema_current().unwrap());
        s.ensure_schema().unwrap();
        assert!(s.schema_current().unwrap());
        let at = |key: &str| -> Vec<(u64, String)> {
            s.recent_attempts(Provider::Claude, key)
                .unwrap()
                .into_iter()
                .map(|a| (a.at, a.outcome))
                .collect()
        };
        assert_eq!(at("session:s"), [(1, "served".into()), (3, "hold".into())]);
        assert_eq!(at("session:u"), [(2, "transient".into())]);
        // New attempts continue after the migrated ones.
        s.record_attempt(Provider::Claude, "session:s", 4, "a", Some(200), "served")
            .unwrap();
        assert_eq!(at("session:s").last(), Some(&(4, "served".into())));
        // The old table and its index are gone.
        let rows = db
            .query(
                "SELECT COUNT(*) AS n FROM sqlite_master WHERE name IN ('attempts_v1', 'attempts_by_key')",
                &[],
            )
            .unwrap();
        assert_eq!(rows.first().unwrap().u64("n").unwrap(), 0);
    }

    #[test]
    fn routes_are_found_by_hash_and_close_at_once() {
        let db = NativeDb::memory();
        let s = store(&db);
        let h1 = crate::token::hash("tok-1");
        s.open_route("t1", Provider::Claude, &h1, 1).unwrap();
        assert_eq!(
            s.route_by_hash(&h1).unwrap(),
            Some(("t1".into(), Provider::Claude))
        );
        let h2 = crate::token::hash("tok-2");
        s.open_route("t1", Provider::Claude, &h2, 2).unwrap();
        assert_eq!(
            s.route_by_hash(&h1).unwrap(),
            None,
            "re-opening replaces the token"
        );
        assert!(s.close_route("t1", Provider::Claude).unwrap());
        assert_eq!(s.route_by_hash(&h2).unwrap(), None);
        assert!(!s.has_route("t1", Provider::Claude).unwrap());
    }
}
