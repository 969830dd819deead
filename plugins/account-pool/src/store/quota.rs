//! The `windows`, `quota` and `refresh_state` tables: an account's quota windows and
//! restrictions as last observed, and its OAuth refresh bookkeeping (the single-flight
//! lease, backoff, last usage fetch).

use super::Store;
use crate::model::Family;
use crate::quota::{QuotaState, Window};
use pooler_plugin_kit::{Db, DbError, Value};

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

impl<'a, D: Db> Store<'a, D> {
    // ---- quota ------------------------------------------------------------------------

    pub(super) fn windows(&self, id: &str) -> Result<Vec<Window>, DbError> {
        Ok(self
            .windows_where("WHERE account_id = ?1", &[id.into()])?
            .remove(id)
            .unwrap_or_default())
    }

    /// The stored windows of the accounts `filter` selects, by account, each account's in
    /// name order.
    pub(super) fn windows_where(
        &self,
        filter: &str,
        params: &[Value],
    ) -> Result<std::collections::HashMap<String, Vec<Window>>, DbError> {
        let rows = self.db.query(
            &format!(
                "SELECT account_id, name, family, utilization, resets_at, status, observed_at
                 FROM windows {filter}"
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
        // Sorted here rather than by SQL: an ORDER BY over a join costs the request's read a
        // temporary B-tree, and an account has a handful of windows.
        for windows in by_account.values_mut() {
            windows.sort_by(|a, b| a.name.cmp(&b.name));
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
        rows.first()
            .map_or(Ok(RefreshState::default()), refresh_state_of)
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

    /// Drop every refresh lease (the host started: no refresh of a stopped host's calls is
    /// still running). Returns how many there were.
    pub fn drop_leases(&self) -> Result<u64, DbError> {
        self.db.execute(
            "UPDATE refresh_state SET lease_until = NULL, lease_owner = NULL WHERE lease_owner IS NOT NULL",
            &[],
        )
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
}

/// The refresh bookkeeping of a row with the `refresh_state` columns (all NULL: none).
pub(super) fn refresh_state_of(r: pooler_plugin_kit::Row<'_>) -> Result<RefreshState, DbError> {
    Ok(RefreshState {
        lease_until: r.opt_u64("lease_until")?,
        lease_owner: r.opt_text("lease_owner")?,
        backoff_ms: r.opt_u64("backoff_ms")?,
        retry_at: r.opt_u64("retry_at")?,
        failure: r.opt_text("failure")?,
        last_usage_at: r.opt_u64("last_usage_at")?,
    })
}
