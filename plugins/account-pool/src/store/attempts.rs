//! The `attempts` table: each session's recent attempts, for `explain-session`.

use super::Store;
use crate::model::Provider;
use pooler_plugin_kit::{Db, DbError};

/// Recent attempts kept per session for `explain-session`.
pub const RECENT_ATTEMPTS: usize = 20;

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
}
