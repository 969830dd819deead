//! The `availability` interface: the answer for a thread's next request, and the
//! coalesced availability-changed signals taken for delivery with their answers.

use super::Admin;
use crate::engine::{Cancel, Clock, Log, Random, Upstream};
use crate::model::{Availability, Family, Provider};
use crate::policy;
use crate::store::PendingSignal;
use pooler_plugin_kit::{Db, DbError};

/// An availability-changed signal ready for delivery: the kit's record, which Provider
/// Retry receives.
pub use pooler_plugin_kit::availability::AvailabilityChange as Change;

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
    /// The availability answer for a thread's next request (pure read).
    pub fn availability(
        &self,
        thread: &str,
        provider: Provider,
        model: Option<&str>,
    ) -> Result<Availability, DbError> {
        let mut answers = self.availability_many(&[(thread, provider, model)])?;
        Ok(answers.remove(0))
    }

    /// The answers for several threads' next requests, as [`Admin::availability`] gives
    /// each, read at one instant: settings and each provider's accounts are read once.
    pub fn availability_many(
        &self,
        queries: &[(&str, Provider, Option<&str>)],
    ) -> Result<Vec<Availability>, DbError> {
        self.store.read(|store| {
            let s = store.settings()?;
            let now = self.env.now();
            let mut accounts = std::collections::HashMap::new();
            let mut answers = Vec::with_capacity(queries.len());
            for &(thread, provider, model) in queries {
                if !s.routing(provider) || !store.has_route(thread, provider)? {
                    answers.push(Availability::NotRouted);
                    continue;
                }
                let family = match provider {
                    Provider::Claude => model.map(Family::of),
                    Provider::Codex => None,
                };
                let accounts = match accounts.entry(provider) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(store.accounts(Some(provider))?)
                    }
                };
                answers.push(policy::verdict(accounts, family, s.switch_threshold, now));
            }
            Ok(answers)
        })
    }

    /// The pool-wide answer for a new conversation of `provider`.
    fn provider_availability(&self, provider: Provider) -> Result<Availability, DbError> {
        let s = self.store.settings()?;
        if !s.routing(provider) {
            return Ok(Availability::NotRouted);
        }
        let accounts = self.store.accounts(Some(provider))?;
        Ok(policy::verdict(
            &accounts,
            None,
            s.switch_threshold,
            self.env.now(),
        ))
    }

    /// Take the pending signals, each with the provider's current answer.
    pub fn take_changes(&self) -> Result<Vec<Change>, DbError> {
        let pending: Vec<PendingSignal> = self.store.take_signals()?;
        pending
            .into_iter()
            .map(|p| {
                Ok(Change {
                    earliest: self.provider_availability(p.provider)?,
                    provider: p.provider,
                    causes: p.causes,
                    detected_at: p.detected_at,
                })
            })
            .collect()
    }
}
