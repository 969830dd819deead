//! The plugin's database (`retry`): schema, and typed reads and writes of chains, their
//! histories, processed-event keys, settings and the time of the last re-evaluation pass.
//!
//! Everything the plugin knows between calls is here: the host may drop the instance after
//! any call. All SQL of the plugin lives in this module, so the schema can be read in one
//! place; callers group writes in `Db::transaction`.

use pooler_plugin_kit::{Db, DbError, Row, Value};

use crate::types::{
    Action, Availability, ChangeCause, FailureCategory, HistoryEntry, Provider, Timestamp, Trigger,
    stored_cause,
};

/// How many history entries are kept per chain (spec §4).
pub const HISTORY_LIMIT: u32 = 50;

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
-- One row per retry chain (thread + original request). A chain is open while it is
-- `scheduled` (a live row in the core's queue) or `watching` (no row, revisited on every
-- re-evaluation until T0 + maximum wait). `dispatched` means the row has become a turn whose
-- outcome event has not arrived yet.
CREATE TABLE IF NOT EXISTS chains (
    id               INTEGER PRIMARY KEY,
    thread           TEXT NOT NULL,
    original_request TEXT NOT NULL,
    failed_request   TEXT NOT NULL,
    provider         TEXT NOT NULL,
    model            TEXT,
    failed_attempt   INTEGER NOT NULL,
    chain_started_at INTEGER NOT NULL,
    failed_at        INTEGER NOT NULL,
    category         TEXT,
    http_status      INTEGER,
    retry_after      INTEGER,
    rate_limited     INTEGER NOT NULL,
    routed_by_pool   INTEGER NOT NULL,
    last_availability TEXT,
    state            TEXT NOT NULL
                     CHECK (state IN ('scheduled', 'watching', 'dispatched', 'resolved')),
    row_id           INTEGER,
    send_at          INTEGER,
    reason           TEXT NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (thread, original_request)
);
CREATE INDEX IF NOT EXISTS chains_by_state ON chains (state, provider);
CREATE INDEX IF NOT EXISTS chains_by_row ON chains (row_id);
CREATE INDEX IF NOT EXISTS chains_by_thread ON chains (thread);
-- Events already handled, so a redelivered event changes nothing (keyed by thread+request).
CREATE TABLE IF NOT EXISTS processed_events (
    kind         TEXT NOT NULL,
    thread       TEXT NOT NULL,
    request      TEXT NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (kind, thread, request)
);
-- Per-chain history, the last HISTORY_LIMIT entries of each chain.
CREATE TABLE IF NOT EXISTS history (
    id             INTEGER PRIMARY KEY,
    chain_id       INTEGER NOT NULL REFERENCES chains (id) ON DELETE CASCADE,
    at             INTEGER NOT NULL,
    trigger_kind   TEXT NOT NULL,
    trigger_detail TEXT,
    availability   TEXT,
    action         TEXT NOT NULL,
    time_a         INTEGER,
    time_b         INTEGER,
    reason         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_by_chain ON history (chain_id, id);
";

/// Create or upgrade the schema. Cheap when already current (one pragma read).
pub fn migrate(db: &impl Db) -> Result<(), DbError> {
    let version = db
        .query("PRAGMA user_version", &[])?
        .first()
        .map(|r| r.i64("user_version"))
        .transpose()?
        .unwrap_or(0);
    if version < SCHEMA_VERSION {
        db.execute_batch(SCHEMA)?;
        db.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
    }
    Ok(())
}

/// A chain's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainState {
    Scheduled,
    Watching,
    Dispatched,
    Resolved,
}

impl ChainState {
    fn name(self) -> &'static str {
        match self {
            ChainState::Scheduled => "scheduled",
            ChainState::Watching => "watching",
            ChainState::Dispatched => "dispatched",
            ChainState::Resolved => "resolved",
        }
    }
    fn parse(s: &str) -> Result<Self, DbError> {
        Ok(match s {
            "scheduled" => ChainState::Scheduled,
            "watching" => ChainState::Watching,
            "dispatched" => ChainState::Dispatched,
            "resolved" => ChainState::Resolved,
            other => return Err(DbError::Decode(format!("chain state {other:?}"))),
        })
    }
    /// Open candidates are re-evaluated; other states wait for an event.
    pub fn is_open(self) -> bool {
        matches!(self, ChainState::Scheduled | ChainState::Watching)
    }
}

/// One retry chain as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// 0 until inserted.
    pub id: i64,
    pub thread: String,
    pub original_request: String,
    /// The chain's latest failed request.
    pub failed_request: String,
    pub provider: Provider,
    pub model: Option<String>,
    /// The attempt number of the latest failure; the next dispatch is this + 1.
    pub failed_attempt: u32,
    /// T0.
    pub chain_started_at: Timestamp,
    pub failed_at: Timestamp,
    /// None when the failure had no description.
    pub category: Option<FailureCategory>,
    pub http_status: Option<u16>,
    pub retry_after: Option<Timestamp>,
    /// Decided as a rate limit (re-evaluation asks the pool only for these).
    pub rate_limited: bool,
    pub routed_by_pool: bool,
    pub last_availability: Option<Availability>,
    pub state: ChainState,
    pub row_id: Option<u64>,
    pub send_at: Option<Timestamp>,
    /// Why it is in its state, in stable words.
    pub reason: String,
    pub updated_at: Timestamp,
}

const CHAIN_COLUMNS: &str = "id, thread, original_request, failed_request, provider, model, \
    failed_attempt, chain_started_at, failed_at, category, http_status, retry_after, \
    rate_limited, routed_by_pool, last_availability, state, row_id, send_at, reason, updated_at";

fn chain_from(row: &Row<'_>) -> Result<Chain, DbError> {
    let provider = row.text("provider")?;
    let category = row.opt_text("category")?;
    let availability = row.opt_text("last_availability")?;
    Ok(Chain {
        id: row.i64("id")?,
        thread: row.text("thread")?,
        original_request: row.text("original_request")?,
        failed_request: row.text("failed_request")?,
        provider: Provider::parse(&provider)
            .ok_or_else(|| DbError::Decode(format!("provider {provider:?}")))?,
        model: row.opt_text("model")?,
        failed_attempt: u32::try_from(row.u64("failed_attempt")?)
            .map_err(|_| DbError::Decode("failed_attempt out of range".into()))?,
        chain_started_at: row.u64("chain_started_at")?,
        failed_at: row.u64("failed_at")?,
        category: category
            .map(|c| {
                FailureCategory::parse(&c).ok_or_else(|| DbError::Decode(format!("category {c:?}")))
            })
            .transpose()?,
        http_status: row
            .opt_u64("http_status")?
            .and_then(|s| u16::try_from(s).ok()),
        retry_after: row.opt_u64("retry_after")?,
        rate_limited: row.bool("rate_limited")?,
        routed_by_pool: row.bool("routed_by_pool")?,
        last_availability: availability.as_deref().and_then(Availability::decode),
        state: ChainState::parse(&row.text("state")?)?,
        row_id: row.opt_u64("row_id")?,
        send_at: row.opt_u64("send_at")?,
        reason: row.text("reason")?,
        updated_at: row.u64("updated_at")?,
    })
}

fn chains_where(db: &impl Db, clause: &str, params: &[Value]) -> Result<Vec<Chain>, DbError> {
    let sql = format!("SELECT {CHAIN_COLUMNS} FROM chains WHERE {clause}");
    db.query(&sql, params)?
        .iter()
        .map(|r| chain_from(&r))
        .collect()
}

/// The chain of `thread` whose original request is `original_request`.
pub fn find_chain(
    db: &impl Db,
    thread: &str,
    original_request: &str,
) -> Result<Option<Chain>, DbError> {
    Ok(chains_where(
        db,
        "thread = ?1 AND original_request = ?2",
        &[thread.into(), original_request.into()],
    )?
    .into_iter()
    .next())
}

/// The chain whose live row is `row`.
pub fn find_chain_by_row(db: &impl Db, row: u64) -> Result<Option<Chain>, DbError> {
    Ok(
        chains_where(db, "row_id = ?1 ORDER BY id DESC", &[row.into()])?
            .into_iter()
            .next(),
    )
}

/// Open chains (scheduled or watching), of one provider or all, oldest first.
pub fn open_chains(db: &impl Db, provider: Option<Provider>) -> Result<Vec<Chain>, DbError> {
    match provider {
        Some(p) => chains_where(
            db,
            "state IN ('scheduled', 'watching') AND provider = ?1 ORDER BY id",
            &[p.as_str().into()],
        ),
        None => chains_where(db, "state IN ('scheduled', 'watching') ORDER BY id", &[]),
    }
}

/// Every chain of a thread, oldest first.
pub fn chains_of_thread(db: &impl Db, thread: &str) -> Result<Vec<Chain>, DbError> {
    chains_where(db, "thread = ?1 ORDER BY id", &[thread.into()])
}

/// Insert (id 0) or update a chain; returns its id.
pub fn save_chain(db: &impl Db, chain: &Chain) -> Result<i64, DbError> {
    let params: Vec<Value> = vec![
        chain.thread.as_str().into(),
        chain.original_request.as_str().into(),
        chain.failed_request.as_str().into(),
        chain.provider.as_str().into(),
        chain.model.clone().into(),
        chain.failed_attempt.into(),
        chain.chain_started_at.into(),
        chain.failed_at.into(),
        chain.category.map(FailureCategory::as_str).into(),
        chain.http_status.map(u32::from).into(),
        chain.retry_after.into(),
        chain.rate_limited.into(),
        chain.routed_by_pool.into(),
        chain.last_availability.map(|a| a.encode()).into(),
        chain.state.name().into(),
        chain.row_id.into(),
        chain.send_at.into(),
        chain.reason.as_str().into(),
        chain.updated_at.into(),
    ];
    if chain.id == 0 {
        db.execute(
            "INSERT INTO chains (thread, original_request, failed_request, provider, model, \
             failed_attempt, chain_started_at, failed_at, category, http_status, retry_after, \
             rate_limited, routed_by_pool, last_availability, state, row_id, send_at, reason, \
             updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             ?15, ?16, ?17, ?18, ?19)",
            &params,
        )?;
        Ok(db.last_insert_rowid())
    } else {
        let mut params = params;
        params.push(chain.id.into());
        db.execute(
            "UPDATE chains SET thread = ?1, original_request = ?2, failed_request = ?3, \
             provider = ?4, model = ?5, failed_attempt = ?6, chain_started_at = ?7, \
             failed_at = ?8, category = ?9, http_status = ?10, retry_after = ?11, \
             rate_limited = ?12, routed_by_pool = ?13, last_availability = ?14, state = ?15, \
             row_id = ?16, send_at = ?17, reason = ?18, updated_at = ?19 WHERE id = ?20",
            &params,
        )?;
        Ok(chain.id)
    }
}

/// Record that a stored chain's row moved: only the columns a move changes, none of them
/// indexed (a pass can move thousands of rows; `save_chain` rewrites every column and
/// every index entry).
pub fn save_move<D: Db>(db: &D, chain: &Chain) -> Result<(), DbError> {
    db.execute(
        "UPDATE chains SET last_availability = ?1, send_at = ?2, reason = ?3, updated_at = ?4          WHERE id = ?5",
        &[
            chain.last_availability.map(|a| a.encode()).into(),
            chain.send_at.into(),
            chain.reason.as_str().into(),
            chain.updated_at.into(),
            chain.id.into(),
        ],
    )?;
    Ok(())
}

/// Whether an event with this key was already handled.
pub fn is_processed(
    db: &impl Db,
    kind: &str,
    thread: &str,
    request: &str,
) -> Result<bool, DbError> {
    Ok(!db
        .query(
            "SELECT 1 AS seen FROM processed_events WHERE kind = ?1 AND thread = ?2 AND request = ?3",
            &[kind.into(), thread.into(), request.into()],
        )?
        .is_empty())
}

/// Remember that an event was handled.
pub fn mark_processed(
    db: &impl Db,
    kind: &str,
    thread: &str,
    request: &str,
    at: Timestamp,
) -> Result<(), DbError> {
    db.execute(
        "INSERT OR IGNORE INTO processed_events (kind, thread, request, processed_at) \
         VALUES (?1, ?2, ?3, ?4)",
        &[kind.into(), thread.into(), request.into(), at.into()],
    )?;
    Ok(())
}

/// A trigger as its kind and detail columns. A signal's detail is its causes' names
/// joined with "," (`account-enabled,hold-ended`); see [`signal_causes`] for reading it.
fn trigger_parts(t: &Trigger) -> (&'static str, Option<String>) {
    match t {
        Trigger::Failure => ("failure", None),
        Trigger::Signal(causes) => {
            let names: Vec<&str> = causes.iter().map(|c| c.name()).collect();
            ("signal", Some(names.join(",")))
        }
        Trigger::Start => ("start", None),
        Trigger::Tick => ("tick", None),
        Trigger::Due => ("due", None),
        Trigger::Person => ("person", None),
        Trigger::Dispatch => ("dispatch", None),
    }
}

fn action_parts(a: Action) -> (&'static str, Option<u64>, Option<u64>) {
    match a {
        Action::Scheduled(t) => ("scheduled", Some(t), None),
        Action::Rescheduled(old, new) => ("rescheduled", Some(old), Some(new)),
        Action::Watching => ("watching", None, None),
        Action::Declined => ("declined", None, None),
        Action::Dropped => ("dropped", None, None),
        Action::Dispatched(n) => ("dispatched", Some(n.into()), None),
        Action::Resolved => ("resolved", None, None),
        Action::Unchanged => ("unchanged", None, None),
    }
}

/// Append one entry to a chain's history and forget entries beyond the last
/// [`HISTORY_LIMIT`].
pub fn add_history(db: &impl Db, chain_id: i64, entry: &HistoryEntry) -> Result<(), DbError> {
    let (trigger, detail) = trigger_parts(&entry.trigger);
    let (action, a, b) = action_parts(entry.action);
    db.execute(
        "INSERT INTO history (chain_id, at, trigger_kind, trigger_detail, availability, action, \
         time_a, time_b, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        &[
            chain_id.into(),
            entry.at.into(),
            trigger.into(),
            detail.into(),
            entry.availability.map(|a| a.encode()).into(),
            action.into(),
            a.into(),
            b.into(),
            entry.reason.as_str().into(),
        ],
    )?;
    // Everything at or below the (limit+1)-th newest entry goes: one indexed lookup, and a
    // no-op while the chain has fewer entries.
    db.execute(
        "DELETE FROM history WHERE chain_id = ?1 AND id <= \
         (SELECT id FROM history WHERE chain_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
        &[chain_id.into(), HISTORY_LIMIT.into()],
    )?;
    Ok(())
}

/// The causes of a signal's stored detail: its comma-separated pieces, each a cause's name
/// (or, as stored before names, its words). A piece that names no cause (an edited
/// database, or a cause a later version added) is skipped: the entry stays, with the
/// causes that are known, rather than failing the whole history.
fn signal_causes(detail: &str) -> Vec<ChangeCause> {
    detail
        .split(',')
        .filter_map(|piece| stored_cause(piece.trim()))
        .collect()
}

fn entry_from(row: &Row<'_>) -> Result<HistoryEntry, DbError> {
    let bad = |what: &str| DbError::Decode(format!("history {what}"));
    let detail = row.opt_text("trigger_detail")?;
    let trigger = match row.text("trigger_kind")?.as_str() {
        "failure" => Trigger::Failure,
        "signal" => Trigger::Signal(signal_causes(detail.as_deref().unwrap_or_default())),
        "start" => Trigger::Start,
        "tick" => Trigger::Tick,
        "due" => Trigger::Due,
        "person" => Trigger::Person,
        "dispatch" => Trigger::Dispatch,
        _ => return Err(bad("trigger")),
    };
    let a = row.opt_u64("time_a")?;
    let b = row.opt_u64("time_b")?;
    let action = match (row.text("action")?.as_str(), a, b) {
        ("scheduled", Some(t), _) => Action::Scheduled(t),
        ("rescheduled", Some(old), Some(new)) => Action::Rescheduled(old, new),
        ("watching", ..) => Action::Watching,
        ("declined", ..) => Action::Declined,
        ("dropped", ..) => Action::Dropped,
        ("dispatched", Some(n), _) => {
            Action::Dispatched(u32::try_from(n).map_err(|_| bad("attempt"))?)
        }
        ("resolved", ..) => Action::Resolved,
        ("unchanged", ..) => Action::Unchanged,
        _ => return Err(bad("action")),
    };
    Ok(HistoryEntry {
        at: row.u64("at")?,
        trigger,
        availability: row
            .opt_text("availability")?
            .as_deref()
            .and_then(Availability::decode),
        action,
        reason: row.text("reason")?,
    })
}

/// A chain's history, oldest first.
pub fn history(db: &impl Db, chain_id: i64) -> Result<Vec<HistoryEntry>, DbError> {
    db.query(
        "SELECT at, trigger_kind, trigger_detail, availability, action, time_a, time_b, reason \
         FROM history WHERE chain_id = ?1 ORDER BY id",
        &[chain_id.into()],
    )?
    .iter()
    .map(|r| entry_from(&r))
    .collect()
}

/// Stored settings as (key, text) pairs.
pub fn load_settings(db: &impl Db) -> Result<Vec<(String, String)>, DbError> {
    db.query("SELECT key, value FROM settings ORDER BY key", &[])?
        .iter()
        .map(|r| Ok((r.text("key")?, r.text("value")?)))
        .collect()
}

/// Store one setting's canonical text.
pub fn save_setting(db: &impl Db, key: &str, value: &str) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO settings (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[key.into(), value.into()],
    )?;
    Ok(())
}

/// A stored instant (e.g. `last-pass-at`), if set.
pub fn meta_time(db: &impl Db, key: &str) -> Result<Option<Timestamp>, DbError> {
    db.query("SELECT value FROM meta WHERE key = ?1", &[key.into()])?
        .first()
        .map(|r| r.u64("value"))
        .transpose()
}

/// Store an instant under `key`.
pub fn set_meta_time(db: &impl Db, key: &str, at: Timestamp) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[key.into(), at.into()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{BlockCause, UnavailableReason};
    use pooler_plugin_kit::NativeDb;

    fn chain() -> Chain {
        Chain {
            id: 0,
            thread: "thr_1".into(),
            original_request: "req_1".into(),
            failed_request: "req_2".into(),
            provider: Provider::Codex,
            model: None,
            failed_attempt: 2,
            chain_started_at: 1_000,
            failed_at: 2_000,
            category: Some(FailureCategory::TooManyFailedAttempts),
            http_status: Some(429),
            retry_after: None,
            rate_limited: true,
            routed_by_pool: true,
            last_availability: Some(Availability::Blocked {
                retry_at: 9_000,
                cause: BlockCause::Held,
            }),
            state: ChainState::Scheduled,
            row_id: Some(7),
            send_at: Some(9_500),
            reason: "rate-limited: pool reset".into(),
            updated_at: 2_000,
        }
    }

    #[test]
    fn migrate_is_idempotent_and_chains_round_trip() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        migrate(&db).unwrap();
        let mut c = chain();
        c.id = save_chain(&db, &c).unwrap();
        assert_eq!(find_chain(&db, "thr_1", "req_1").unwrap(), Some(c.clone()));
        assert_eq!(find_chain_by_row(&db, 7).unwrap(), Some(c.clone()));
        c.state = ChainState::Watching;
        c.row_id = None;
        c.last_availability = Some(Availability::Unavailable(UnavailableReason::Authentication));
        save_chain(&db, &c).unwrap();
        assert_eq!(
            open_chains(&db, Some(Provider::Codex)).unwrap(),
            vec![c.clone()]
        );
        assert!(open_chains(&db, Some(Provider::Claude)).unwrap().is_empty());
        c.state = ChainState::Resolved;
        save_chain(&db, &c).unwrap();
        assert!(open_chains(&db, None).unwrap().is_empty());
        assert_eq!(chains_of_thread(&db, "thr_1").unwrap().len(), 1);
    }

    #[test]
    fn one_chain_per_thread_and_original_request() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        save_chain(&db, &chain()).unwrap();
        assert!(matches!(
            save_chain(&db, &chain()),
            Err(DbError::Constraint(_))
        ));
    }

    #[test]
    fn history_keeps_the_last_fifty_entries_in_order() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        let id = save_chain(&db, &chain()).unwrap();
        for i in 0..60u64 {
            add_history(
                &db,
                id,
                &HistoryEntry {
                    at: i,
                    trigger: if i % 2 == 0 {
                        Trigger::Tick
                    } else {
                        Trigger::Signal(vec![ChangeCause::AccountEnabled])
                    },
                    availability: Some(Availability::Ready),
                    action: Action::Rescheduled(i, i + 1),
                    reason: format!("r{i}"),
                },
            )
            .unwrap();
        }
        let h = history(&db, id).unwrap();
        assert_eq!(h.len(), 50);
        assert_eq!(h[0].at, 10);
        assert_eq!(h[49].at, 59);
        assert_eq!(
            h[49].trigger,
            Trigger::Signal(vec![ChangeCause::AccountEnabled])
        );
        assert_eq!(h[49].action, Action::Rescheduled(59, 60));
    }

    /// A signal's causes are stored as their names and read back in order; an empty list
    /// stays empty.
    #[test]
    fn a_signal_keeps_its_causes_as_names() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        let id = save_chain(&db, &chain()).unwrap();
        let entry = |trigger| HistoryEntry {
            at: 1,
            trigger,
            availability: None,
            action: Action::Unchanged,
            reason: "r".into(),
        };
        let mut every = ChangeCause::ALL.to_vec();
        every.reverse();
        add_history(&db, id, &entry(Trigger::Signal(every.clone()))).unwrap();
        add_history(&db, id, &entry(Trigger::Signal(vec![]))).unwrap();
        let details: Vec<Option<String>> = db
            .query("SELECT trigger_detail FROM history ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| r.opt_text("trigger_detail").unwrap())
            .collect();
        assert_eq!(
            details[0].as_deref().unwrap().split(',').next(),
            Some("reset-passed")
        );
        assert_eq!(details[1].as_deref(), Some(""));
        let h = history(&db, id).unwrap();
        assert_eq!(h[0].trigger, Trigger::Signal(every));
        assert_eq!(h[1].trigger, Trigger::Signal(vec![]));
    }

    /// A stored detail is read piece by piece: names, and the words the history stored
    /// before names; a piece that names no cause is skipped, the entry kept.
    #[test]
    fn a_signal_detail_reads_old_words_and_skips_unknown_names() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        let id = save_chain(&db, &chain()).unwrap();
        let stored = [
            (
                "account enabled, hold ended",
                vec![ChangeCause::AccountEnabled, ChangeCause::HoldEnded],
            ),
            ("account error", vec![ChangeCause::ErrorSet]),
            (
                "account-added,quota-bumped,reset-passed",
                vec![ChangeCause::AccountAdded, ChangeCause::ResetPassed],
            ),
            ("edited by hand", vec![]),
        ];
        for (at, (detail, _)) in (1u64..).zip(&stored) {
            db.execute(
                "INSERT INTO history (chain_id, at, trigger_kind, trigger_detail, action, reason) \
                 VALUES (?1, ?2, 'signal', ?3, 'unchanged', 'r')",
                &[id.into(), at.into(), (*detail).into()],
            )
            .unwrap();
        }
        let h = history(&db, id).unwrap();
        let read: Vec<_> = h.into_iter().map(|e| e.trigger).collect();
        let expected: Vec<_> = stored
            .into_iter()
            .map(|(_, causes)| Trigger::Signal(causes))
            .collect();
        assert_eq!(read, expected);
    }

    /// Every cause has its own name, read back to it; its words are read back too.
    #[test]
    fn change_causes_name_and_parse_both_ways() {
        let names: Vec<&str> = ChangeCause::ALL.iter().map(|c| c.name()).collect();
        let mut distinct = names.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ChangeCause::ALL.len());
        for c in ChangeCause::ALL {
            assert_eq!(ChangeCause::parse(c.name()), Some(c));
            assert_eq!(stored_cause(c.words()), Some(c));
        }
        assert_eq!(ChangeCause::parse(""), None);
        assert_eq!(ChangeCause::parse("Account-Enabled"), None);
    }

    #[test]
    fn processed_keys_and_meta_times_persist() {
        let db = NativeDb::memory();
        migrate(&db).unwrap();
        assert!(!is_processed(&db, "failed", "t", "r").unwrap());
        mark_processed(&db, "failed", "t", "r", 5).unwrap();
        mark_processed(&db, "failed", "t", "r", 6).unwrap();
        assert!(is_processed(&db, "failed", "t", "r").unwrap());
        assert!(!is_processed(&db, "succeeded", "t", "r").unwrap());
        assert_eq!(meta_time(&db, "last-pass-at").unwrap(), None);
        set_meta_time(&db, "last-pass-at", 42).unwrap();
        set_meta_time(&db, "last-pass-at", 43).unwrap();
        assert_eq!(meta_time(&db, "last-pass-at").unwrap(), Some(43));
    }
}
