//! The `routes`, `pins` and `cursors` tables: route tokens by thread, session pins (claimed,
//! bound under a generation guard, touched, pruned to the cap), and each provider's
//! round-robin cursor.

use super::{Store, TOUCH_GRANULARITY_MS, decode};
use crate::model::Provider;
use crate::policy::PinSeen;
use pooler_plugin_kit::{Db, DbError};

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

impl<'a, D: Db> Store<'a, D> {
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

    /// The open routes (thread, provider, opened at), of one provider or all, by thread
    /// then provider. The token hash is never read.
    pub fn routes(
        &self,
        provider: Option<Provider>,
    ) -> Result<Vec<(String, Provider, u64)>, DbError> {
        let rows = match provider {
            Some(p) => self.db.query(
                "SELECT thread, provider, opened_at FROM routes WHERE provider = ?1 ORDER BY thread, provider",
                &[p.as_str().into()],
            )?,
            None => self.db.query(
                "SELECT thread, provider, opened_at FROM routes ORDER BY thread, provider",
                &[],
            )?,
        };
        rows.iter()
            .map(|r| {
                Ok((
                    r.text("thread")?,
                    decode("provider", Provider::parse(&r.text("provider")?))?,
                    r.u64("opened_at")?,
                ))
            })
            .collect()
    }

    /// The fresh pins (used within `lifetime` of `now`), of one thread and/or provider,
    /// most recently used first: (provider, key, pin).
    pub fn pins(
        &self,
        thread: Option<&str>,
        provider: Option<Provider>,
        now: u64,
        lifetime: u64,
    ) -> Result<Vec<(Provider, String, Pin)>, DbError> {
        // The same freshness rule as `pin`: now − last use < lifetime.
        let rows = self.db.query(
            "SELECT provider, key, account_id, thread, last_used_at, generation, provisional, why FROM pins
             WHERE ?1 - last_used_at < ?4 AND (?2 IS NULL OR thread = ?2) AND (?3 IS NULL OR provider = ?3)
             ORDER BY last_used_at DESC, generation DESC",
            &[
                now.into(),
                thread.into(),
                provider.map(Provider::as_str).into(),
                lifetime.into(),
            ],
        )?;
        rows.iter()
            .map(|r| {
                Ok((
                    decode("provider", Provider::parse(&r.text("provider")?))?,
                    r.text("key")?,
                    Pin {
                        account: r.text("account_id")?,
                        thread: r.opt_text("thread")?,
                        last_used_at: r.u64("last_used_at")?,
                        generation: r.i64("generation")?,
                        provisional: r.bool("provisional")?,
                        why: r.text("why")?,
                    },
                ))
            })
            .collect()
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
}
