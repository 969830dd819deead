//! The `attempts` table: each session's recent attempts, for `explain-session`. Bounded as
//! pins are: per session its latest [`RECENT_ATTEMPTS`], and overall the attempts of at
//! most `pin-cap` sessions (the most recently active), so a flood of new sessions cannot
//! grow it. The number of sessions with attempts is counted in `meta`, so only a session's
//! first attempt looks at the overall bound: every other attempt writes one row.

use super::Store;
use crate::model::Provider;
use pooler_plugin_kit::{Db, DbError};

/// Recent attempts kept per session for `explain-session`.
pub const RECENT_ATTEMPTS: usize = 20;

/// The `meta` key counting the sessions that have attempts.
const SESSIONS_KEY: &str = "attempt-sessions";

/// How many sessions past `pin-cap` may have attempts before the oldest are dropped (in
/// one pass, back to `pin-cap`): an eighth of the cap, at least 16, so the pass is rare.
pub fn attempt_sessions_slack(pin_cap: u64) -> u64 {
    (pin_cap / 8).max(16)
}

/// One recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub at: u64,
    pub account: String,
    pub status: Option<u16>,
    pub outcome: String,
}

impl<'a, D: Db> Store<'a, D> {
    // ---- attempts ---------------------------------------------------------------------

    /// Record one attempt of a session, within both bounds: the session's latest
    /// [`RECENT_ATTEMPTS`], and the attempts of at most `pin_cap` sessions (plus
    /// [`attempt_sessions_slack`] between two passes).
    #[allow(clippy::too_many_arguments)]
    pub fn record_attempt(
        &self,
        provider: Provider,
        key: &str,
        at: u64,
        account: &str,
        status: Option<u16>,
        outcome: &str,
        pin_cap: u64,
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
        // The session's first attempt (none of its rows left): one more session.
        if id == 1 {
            let counted = self.db.query(
                "UPDATE meta SET value = value + 1 WHERE key = ?1 RETURNING value",
                &[SESSIONS_KEY.into()],
            )?;
            let sessions = match counted.first() {
                Some(r) => r.u64("value")?,
                None => self.recount_attempt_sessions()?,
            };
            if sessions > pin_cap.saturating_add(attempt_sessions_slack(pin_cap)) {
                self.drop_oldest_sessions(pin_cap)?;
            }
        }
        Ok(())
    }

    /// Count the sessions that have attempts (one pass over the table) and keep the count.
    fn recount_attempt_sessions(&self) -> Result<u64, DbError> {
        let rows = self.db.query(
            "SELECT COUNT(*) AS n FROM (SELECT 1 FROM attempts GROUP BY provider, key)",
            &[],
        )?;
        let n = rows.first().map_or(Ok(0), |r| r.u64("n"))?;
        self.set_meta_i64(SESSIONS_KEY, i64::try_from(n).unwrap_or(i64::MAX))?;
        Ok(n)
    }

    /// Keep the attempts of the `keep` most recently active sessions only.
    fn drop_oldest_sessions(&self, keep: u64) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM attempts WHERE (provider, key) IN (
                SELECT provider, key FROM attempts GROUP BY provider, key
                ORDER BY MAX(at) DESC LIMIT -1 OFFSET ?1)",
            &[keep.into()],
        )?;
        self.recount_attempt_sessions()?;
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

    /// Drop attempts older than `age`, and the attempts of the least recently active
    /// sessions beyond `pin_cap` (a cap lowered since they were written).
    pub fn prune_attempts(&self, now: u64, age: u64, pin_cap: u64) -> Result<(), DbError> {
        let dropped = self.db.execute(
            "DELETE FROM attempts WHERE at <= ?1",
            &[now.saturating_sub(age).into()],
        )?;
        let counted = self
            .meta_i64(SESSIONS_KEY)?
            .and_then(|n| u64::try_from(n).ok());
        let sessions = match counted {
            Some(n) if dropped == 0 => n,
            _ => self.recount_attempt_sessions()?,
        };
        if sessions > pin_cap {
            self.drop_oldest_sessions(pin_cap)?;
        }
        Ok(())
    }
}
