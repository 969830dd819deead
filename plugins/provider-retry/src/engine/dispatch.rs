//! The dispatch gate (WIT `scheduler.before-dispatch`): a due retry row proceeds, waits or
//! is dropped after a fresh check of its thread and, for rate limits, of the pool.

use pooler_plugin_kit::Db;

use super::{Engine, Freshness};
use crate::policy::{PoolAnswer, beyond_maximum_wait, reset_send_at};
use crate::settings::Settings;
use crate::store::{self, Chain, ChainState};
use crate::types::{
    Action, Availability, DispatchVerdict, PluginError, QueuedRow, Timestamp, Trigger,
};

impl<D: Db> Engine<'_, D> {
    /// A retry row came due and passed the concurrency gate: proceed, postpone or drop it
    /// after a fresh check. Postponing never spends an attempt.
    pub fn before_dispatch(&self, row: &QueuedRow) -> Result<DispatchVerdict, PluginError> {
        let now = self.clock.now();
        let s = Settings::load(self.db)?;
        self.db.transaction(|db| {
            let found = match store::find_chain_by_row(db, row.id)? {
                Some(c) => Some(c),
                None => store::find_chain(db, &row.thread, &row.original_request)?,
            };
            let Some(mut chain) = found else {
                // A row this plugin holds no chain for (its state was lost, or another
                // component scheduled it): still never send a stale one.
                return Ok(match self.freshness_of(&row.thread, &row.failed_request)? {
                    Freshness::Stale(cause) => DispatchVerdict::Drop(cause),
                    Freshness::Fresh(t) if t.retry_opt_out => {
                        DispatchVerdict::Drop("opted-out".into())
                    }
                    Freshness::Fresh(_) => DispatchVerdict::Proceed,
                });
            };
            if chain.state == ChainState::Resolved {
                // Closed earlier (its cancel did not reach the core): the row must not run.
                return Ok(DispatchVerdict::Drop(chain.reason.clone()));
            }
            chain.state = ChainState::Scheduled;
            chain.row_id = Some(row.id);
            chain.send_at = Some(row.send_at);
            chain.updated_at = now;
            match self.freshness_of(&chain.thread, &chain.failed_request)? {
                Freshness::Stale(cause) => {
                    return self.drop_due(chain, &cause, now, None);
                }
                Freshness::Fresh(t) if t.retry_opt_out => {
                    return self.drop_due(chain, "opted-out", now, None);
                }
                Freshness::Fresh(_) => {}
            }
            if !chain.rate_limited {
                return self.proceed(chain, row.attempt, now, None);
            }
            let answer = self.ask_pool(&chain, &s);
            let seen = answer.seen();
            chain.last_availability = seen;
            let expiry = s.expiry(chain.chain_started_at);
            match answer {
                PoolAnswer::Answered(Availability::Ready | Availability::NotRouted) => {
                    self.proceed(chain, row.attempt, now, seen)
                }
                PoolAnswer::Answered(Availability::Blocked { retry_at, .. }) if retry_at <= now => {
                    self.proceed(chain, row.attempt, now, seen)
                }
                PoolAnswer::Answered(Availability::Blocked { retry_at, .. }) => {
                    if beyond_maximum_wait(retry_at, chain.chain_started_at, &s) {
                        return self.drop_due(
                            chain,
                            "expired: pool blocked beyond maximum wait",
                            now,
                            seen,
                        );
                    }
                    let target = reset_send_at(retry_at, now, &s, self.random);
                    self.postpone(chain, row.send_at, target, "still blocked", now, seen)
                }
                PoolAnswer::Answered(Availability::Unavailable(_))
                | PoolAnswer::Failed
                | PoolAnswer::NotAsked => {
                    if expiry.is_some_and(|e| now >= e) {
                        return self.drop_due(
                            chain,
                            "expired: pool unavailable until maximum wait",
                            now,
                            seen,
                        );
                    }
                    let later = pooler_plugin_kit::time::after(now, s.reevaluation_interval_ms);
                    let target = expiry.map_or(later, |e| later.min(e));
                    self.postpone(chain, row.send_at, target, "pool unavailable", now, seen)
                }
            }
        })
    }

    fn proceed(
        &self,
        mut chain: Chain,
        attempt: u32,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.state = ChainState::Dispatched;
        chain.row_id = None;
        chain.reason = format!("dispatched as attempt {attempt}");
        store::save_chain(self.db, &chain)?;
        self.record(
            &chain,
            now,
            &Trigger::Due,
            seen,
            Action::Dispatched(attempt),
            "passed the dispatch gates",
        )?;
        Ok(DispatchVerdict::Proceed)
    }

    fn postpone(
        &self,
        mut chain: Chain,
        old: Timestamp,
        new: Timestamp,
        why: &str,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.send_at = Some(new);
        store::save_chain(self.db, &chain)?;
        self.record(
            &chain,
            now,
            &Trigger::Due,
            seen,
            Action::Rescheduled(old, new),
            why,
        )?;
        Ok(DispatchVerdict::WaitUntil(new))
    }

    /// Drop a due row: the core removes it on our verdict, so no `cancel` call.
    fn drop_due(
        &self,
        mut chain: Chain,
        cause: &str,
        now: Timestamp,
        seen: Option<Availability>,
    ) -> Result<DispatchVerdict, PluginError> {
        chain.state = ChainState::Resolved;
        chain.row_id = None;
        chain.send_at = None;
        chain.reason = cause.to_owned();
        if seen.is_some() {
            chain.last_availability = seen;
        }
        store::save_chain(self.db, &chain)?;
        self.record(&chain, now, &Trigger::Due, seen, Action::Dropped, cause)?;
        Ok(DispatchVerdict::Drop(cause.to_owned()))
    }
}
