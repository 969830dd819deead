//! The `pending_signals` table: availability-changed causes queued per provider,
//! coalesced, and taken for delivery in one transaction.

use super::{Store, decode};
use crate::model::{ChangeCause, Provider};
use pooler_plugin_kit::{Db, DbError};

/// Signals taken for delivery: per provider, the causes in first-seen order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSignal {
    pub provider: Provider,
    pub causes: Vec<ChangeCause>,
    pub detected_at: u64,
}

impl<'a, D: Db> Store<'a, D> {
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
            &[provider.as_str().into(), cause.name().into(), now.into()],
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
