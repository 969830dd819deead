//! The `placements` and `in_flight` tables: what concurrent requests, each in its own
//! instance, must see of each other to spread conversations and to cap requests in flight.
//!
//! A placement is a new or moving conversation put on an account by a ranking strategy;
//! the placements of the last minute are each account's share of a burst. A lease is one
//! request in flight on an account with an in-flight limit, taken before its upstream call
//! and ended when its answer has been relayed; a lease nobody ended (an instance that
//! trapped, a host that was killed) ends by itself at its expiry, and every lease ends at
//! the next start.

use std::collections::HashMap;

use super::Store;
use crate::model::Provider;
use pooler_plugin_kit::{Db, DbError};

/// How long a placement counts toward its account's share of a burst.
pub const PLACEMENT_WINDOW_MS: u64 = 60_000;

/// How long a lease lasts when nobody ends it: longer than any answer streams.
pub const FLIGHT_LEASE_MS: u64 = 15 * 60_000;

/// What a ranking strategy counts of an account besides its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Conversations pinned to it now (fresh pins, provisional ones included).
    pub live: u32,
    /// Conversations placed on it within the last [`PLACEMENT_WINDOW_MS`].
    pub recent: u32,
}

impl<'a, D: Db> Store<'a, D> {
    /// The load of each account of `provider` that has any, at `now`.
    pub fn loads(
        &self,
        provider: Provider,
        now: u64,
        pin_lifetime: u64,
    ) -> Result<HashMap<String, Load>, DbError> {
        let mut loads: HashMap<String, Load> = HashMap::new();
        let live = self.db.query(
            "SELECT account_id, COUNT(*) AS n FROM pins
             WHERE provider = ?1 AND ?2 - last_used_at < ?3 GROUP BY account_id",
            &[provider.as_str().into(), now.into(), pin_lifetime.into()],
        )?;
        for r in live.iter() {
            loads.entry(r.text("account_id")?).or_default().live =
                u32::try_from(r.u64("n")?).unwrap_or(u32::MAX);
        }
        let recent = self.db.query(
            "SELECT account_id, COUNT(*) AS n FROM placements
             WHERE provider = ?1 AND at > ?2 GROUP BY account_id",
            &[
                provider.as_str().into(),
                now.saturating_sub(PLACEMENT_WINDOW_MS).into(),
            ],
        )?;
        for r in recent.iter() {
            loads.entry(r.text("account_id")?).or_default().recent =
                u32::try_from(r.u64("n")?).unwrap_or(u32::MAX);
        }
        Ok(loads)
    }

    /// Record a conversation placed on `account` at `now` (and forget the placements of
    /// `provider` that no longer count).
    pub fn record_placement(
        &self,
        provider: Provider,
        account: &str,
        now: u64,
    ) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM placements WHERE provider = ?1 AND at <= ?2",
            &[
                provider.as_str().into(),
                now.saturating_sub(PLACEMENT_WINDOW_MS).into(),
            ],
        )?;
        self.db.execute(
            "INSERT INTO placements (provider, account_id, at) VALUES (?1, ?2, ?3)",
            &[provider.as_str().into(), account.into(), now.into()],
        )?;
        Ok(())
    }

    /// Take lease `id` on `account` if fewer than `limit` of its leases are live at `now`
    /// (atomically: concurrent requests never take more than `limit`). Returns whether it
    /// was taken.
    pub fn take_flight_lease(
        &self,
        account: &str,
        limit: u32,
        id: &str,
        now: u64,
    ) -> Result<bool, DbError> {
        self.tx(|s| {
            s.db.execute(
                "DELETE FROM in_flight WHERE account_id = ?1 AND expires_at <= ?2",
                &[account.into(), now.into()],
            )?;
            let live =
                s.db.query(
                    "SELECT COUNT(*) AS n FROM in_flight WHERE account_id = ?1",
                    &[account.into()],
                )?
                .first()
                .map_or(Ok(0), |r| r.u64("n"))?;
            if live >= u64::from(limit) {
                return Ok(false);
            }
            s.db.execute(
                "INSERT INTO in_flight (id, account_id, expires_at) VALUES (?1, ?2, ?3)",
                &[
                    id.into(),
                    account.into(),
                    now.saturating_add(FLIGHT_LEASE_MS).into(),
                ],
            )?;
            Ok(true)
        })
    }

    /// End lease `id` (a no-op when it has ended already).
    pub fn end_flight_lease(&self, id: &str) -> Result<(), DbError> {
        self.db
            .execute("DELETE FROM in_flight WHERE id = ?1", &[id.into()])?;
        Ok(())
    }

    /// End every lease: at a start, no request of an earlier run is in flight.
    pub fn end_flight_leases(&self) -> Result<(), DbError> {
        self.db.execute("DELETE FROM in_flight", &[])?;
        Ok(())
    }

    /// The live leases of `account` at `now`.
    pub fn flight_leases(&self, account: &str, now: u64) -> Result<u32, DbError> {
        let n = self
            .db
            .query(
                "SELECT COUNT(*) AS n FROM in_flight WHERE account_id = ?1 AND expires_at > ?2",
                &[account.into(), now.into()],
            )?
            .first()
            .map_or(Ok(0), |r| r.u64("n"))?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }
}
