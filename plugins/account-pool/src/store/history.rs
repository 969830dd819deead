//! The `quota_history` table: the quota timeline of each account (window observations that
//! changed what a chart shows, holds, errors), kept [`HISTORY_RETENTION_MS`] and at most
//! [`HISTORY_CAP_PER_ACCOUNT`] entries per account. Written inside the transaction of the
//! change it records, so it adds no commit to a request.

use super::Store;
use crate::history::{HISTORY_CAP_PER_ACCOUNT, HISTORY_RETENTION_MS, HistoryEntry, HistoryEvent};
use crate::model::{Family, Provider};
use crate::quota::Window;
use pooler_plugin_kit::{Db, DbError, Value};

impl<'a, D: Db> Store<'a, D> {
    // ---- quota history ----------------------------------------------------------------

    /// Keep one history entry of account `id` at `at`.
    pub fn record_history(&self, id: &str, at: u64, event: &HistoryEvent) -> Result<(), DbError> {
        let none = || Value::Null;
        let (kind, name, family, utilization, resets_at, status, until) = match event {
            HistoryEvent::Window(w) => (
                "window",
                Value::from(w.name.as_str()),
                w.family.map(Family::as_str).into(),
                w.utilization.into(),
                w.resets_at.into(),
                w.status.clone().into(),
                none(),
            ),
            HistoryEvent::Hold { until } => (
                "hold",
                none(),
                none(),
                none(),
                none(),
                none(),
                (*until).into(),
            ),
            HistoryEvent::Error => ("error", none(), none(), none(), none(), none(), none()),
        };
        self.db.execute(
            "INSERT INTO quota_history (account_id, at, kind, name, family, utilization, resets_at, status, until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            &[id.into(), at.into(), kind.into(), name, family, utilization, resets_at, status, until],
        )?;
        Ok(())
    }

    /// The history of the accounts of `provider` (all when None) from `since` on, oldest
    /// first (in the order written at the same instant).
    pub fn quota_history(
        &self,
        provider: Option<Provider>,
        since: u64,
    ) -> Result<Vec<HistoryEntry>, DbError> {
        let rows = self.db.query(
            "SELECT h.account_id, h.at, h.kind, h.name, h.family, h.utilization, h.resets_at,
                    h.status, h.until
             FROM quota_history h JOIN accounts a ON a.id = h.account_id
             WHERE h.at >= ?1 AND (?2 IS NULL OR a.provider = ?2)
             ORDER BY h.at, h.rowid",
            &[since.into(), provider.map(Provider::as_str).into()],
        )?;
        rows.iter()
            .filter_map(|r| {
                let at = match r.u64("at") {
                    Ok(at) => at,
                    Err(e) => return Some(Err(e)),
                };
                let event = match r.text("kind") {
                    Ok(kind) => match kind.as_str() {
                        "window" => (|| {
                            Ok(HistoryEvent::Window(Window {
                                name: r.text("name")?,
                                family: r.opt_text("family")?.and_then(|f| Family::parse(&f)),
                                utilization: r.opt_f64("utilization")?,
                                resets_at: r.opt_u64("resets_at")?,
                                status: r.opt_text("status")?,
                                observed_at: at,
                            }))
                        })(),
                        "hold" => r.u64("until").map(|until| HistoryEvent::Hold { until }),
                        "error" => Ok(HistoryEvent::Error),
                        // A kind a later version wrote: not shown.
                        _ => return None,
                    },
                    Err(e) => Err(e),
                };
                Some(event.and_then(|event| {
                    Ok(HistoryEntry {
                        account: r.text("account_id")?,
                        at,
                        event,
                    })
                }))
            })
            .collect()
    }

    /// Drop history older than [`HISTORY_RETENTION_MS`], and each account's beyond its
    /// newest [`HISTORY_CAP_PER_ACCOUNT`] entries.
    pub fn prune_history(&self, now: u64) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM quota_history WHERE at < ?1",
            &[now.saturating_sub(HISTORY_RETENTION_MS).into()],
        )?;
        let over = self.db.query(
            "SELECT account_id FROM quota_history GROUP BY account_id HAVING COUNT(*) > ?1",
            &[HISTORY_CAP_PER_ACCOUNT.into()],
        )?;
        for r in over.iter() {
            self.db.execute(
                "DELETE FROM quota_history WHERE rowid IN (
                    SELECT rowid FROM quota_history WHERE account_id = ?1
                    ORDER BY at DESC, rowid DESC LIMIT -1 OFFSET ?2)",
                &[r.text("account_id")?.into(), HISTORY_CAP_PER_ACCOUNT.into()],
            )?;
        }
        Ok(())
    }
}
