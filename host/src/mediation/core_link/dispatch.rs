//! The due pass and its gates: queued person messages start as turns, then due rows are
//! claimed (the core's concurrency gate) and each goes through `scheduler.before-dispatch`,
//! whose verdict is carried out; `scheduler.on-start` comes before the first pass.

use std::sync::Arc;

use pooler_core::{Claim, CoreError};

use super::outbox::plugin_error;
use super::{GATE_FAILURE_PAUSE_MS, Inner, SUBSCRIBER, convert};
use crate::runtime::Host;
use crate::runtime::bindings::retry::exports::pooler::plugins::scheduler::DispatchVerdict;
use crate::runtime::roles::Role;

/// The shortest move of a `wait-until`: a time not in the future would gate the row again
/// at once, in a loop with the plugin.
const MIN_WAIT_MS: u64 = 1_000;

/// The longest text the core keeps as a postpone reason from a failed gate.
const MAX_REASON_CHARS: usize = 200;

/// Where a `wait-until(asked)` verdict moves a row: at least [`MIN_WAIT_MS`] from now, at
/// most [`convert::MAX_SEND_AT`].
pub(super) fn wait_until(asked: u64, now: u64) -> u64 {
    asked
        .max(now.saturating_add(MIN_WAIT_MS))
        .min(convert::MAX_SEND_AT.max(now))
}

/// A `drop` verdict's text as the core keeps it: at most [`MAX_REASON_CHARS`] characters
/// (the rest cut, with a warning), and never empty.
pub(super) fn bounded_reason(why: &str, row: u64) -> String {
    let chars = why.chars().count();
    if chars > MAX_REASON_CHARS {
        tracing::warn!(
            plugin = SUBSCRIBER,
            row,
            chars,
            rule = "a drop reason is at most 200 characters",
            "plugin's drop reason cut"
        );
    }
    let kept: String = why.chars().take(MAX_REASON_CHARS).collect();
    if kept.trim().is_empty() {
        "before-dispatch: drop".to_string()
    } else {
        kept
    }
}

impl Inner {
    pub(super) async fn on_start(&self) {
        let Ok(host) = self.host() else { return };
        if !host.has_role(Role::ProviderRetry) {
            return;
        }
        let now = self.now();
        let answer = host
            .call_retry("scheduler.on-start", move |store, retry| {
                Box::pin(retry.pooler_plugins_scheduler().call_on_start(store, now))
            })
            .await;
        match answer {
            Ok(Ok(())) => tracing::info!(plugin = SUBSCRIBER, now, "on-start done"),
            Ok(Err(e)) => {
                tracing::warn!(plugin = SUBSCRIBER, error = ?e, "on-start answered an error")
            }
            Err(_) => {} // logged by the runtime; the queue runs regardless
        }
    }

    /// One due pass: start queued messages, then gate and dispatch due rows until none is
    /// claimable.
    pub(super) async fn due_pass(self: &Arc<Self>, host: &Host) {
        // The rows gated in this pass: none is gated twice (see `due_again`).
        let mut gated = std::collections::HashSet::new();
        loop {
            if self.signals.is_closed() {
                return;
            }
            match self.core.start_turns() {
                Ok(plans) => plans.into_iter().for_each(|plan| self.spawn_turn(plan)),
                Err(e) => tracing::error!(error = %e, "cannot start queued turns"),
            }
            let claims = match self.core.claim_due(self.now()) {
                Ok(claims) => claims,
                Err(e) => {
                    tracing::error!(error = %e, "cannot claim due rows");
                    return;
                }
            };
            if claims.is_empty() {
                return;
            }
            for claim in claims {
                if self.signals.is_closed() {
                    // Left claimed: the next start releases the row and gates it again.
                    return;
                }
                if !gated.insert(claim.row.id) {
                    self.due_again(&claim);
                    continue;
                }
                self.gate(host, claim).await;
            }
        }
    }

    /// A row came due a second time in one pass: its gate moved it into the past (or
    /// `threads.reschedule` did while the gate ran). Asking the plugin again at once could
    /// go on without end, the pass never finishing: the row waits [`MIN_WAIT_MS`] instead.
    fn due_again(&self, claim: &Claim) {
        let row = &claim.row;
        tracing::warn!(
            plugin = SUBSCRIBER,
            row = row.id,
            thread = %row.thread,
            rule = "a row is gated at most once per due pass",
            "row came due again within one due pass; postponed by 1 s without asking the plugin"
        );
        let until = self.now().saturating_add(MIN_WAIT_MS);
        match self
            .core
            .postpone(claim, until, "due again within one due pass")
        {
            Ok(_) | Err(CoreError::ClaimLost(_)) => {}
            Err(e) => tracing::error!(row = row.id, error = %e, "due row not handled"),
        }
    }

    /// Asks `before-dispatch` about a claimed row and carries out the verdict.
    async fn gate(self: &Arc<Self>, host: &Host, claim: Claim) {
        let row = claim.row.clone();
        let verdict = if host.has_role(Role::ProviderRetry) {
            let wit_row = convert::row(row.clone());
            host.call_retry("scheduler.before-dispatch", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_scheduler()
                        .call_before_dispatch(store, &wit_row)
                        .await
                })
            })
            .await
        } else {
            // No plugin, no gate to ask: the row passed the core's own gate.
            Ok(Ok(DispatchVerdict::Proceed))
        };
        let now = self.now();
        let failed_gate = |why: String| -> Result<(), CoreError> {
            let why: String = why.chars().take(MAX_REASON_CHARS).collect();
            tracing::warn!(row = row.id, thread = %row.thread, reason = %why, "before-dispatch failed; row postponed by 60 s");
            self.core
                .postpone(&claim, now + GATE_FAILURE_PAUSE_MS, &why)
                .map(drop)
        };
        let verdict_word = match &verdict {
            Ok(Ok(DispatchVerdict::Proceed)) => "dispatched",
            Ok(Ok(DispatchVerdict::WaitUntil(_))) => "postponed",
            Ok(Ok(DispatchVerdict::Drop(_))) => "dropped",
            Ok(Err(_)) | Err(_) => "gate-failed",
        };
        let result = match verdict {
            Ok(Ok(DispatchVerdict::Proceed)) => match self.core.dispatch(&claim) {
                Ok(plan) => {
                    self.spawn_turn(plan);
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Ok(Ok(DispatchVerdict::WaitUntil(asked))) => {
                let at = wait_until(asked, now);
                if at != asked && asked > convert::MAX_SEND_AT {
                    tracing::warn!(
                        plugin = SUBSCRIBER,
                        row = row.id,
                        asked,
                        kept = at,
                        rule = "send-at after year 9999 is moved to 9999-12-31",
                        "plugin's wait-until bounded"
                    );
                }
                tracing::info!(row = row.id, thread = %row.thread, until = at, "row postponed by before-dispatch");
                self.core
                    .postpone(&claim, at, "before-dispatch: wait-until")
                    .map(drop)
            }
            Ok(Ok(DispatchVerdict::Drop(why))) => {
                let why = bounded_reason(&why, row.id);
                tracing::info!(row = row.id, thread = %row.thread, reason = %why, "row dropped by before-dispatch");
                self.core.drop_row(&claim, &why)
            }
            Ok(Err(e)) => failed_gate(format!(
                "before-dispatch answered an error: {}",
                plugin_error(&e)
            )),
            Err(e) => failed_gate(format!("before-dispatch failed: {e}")),
        };
        let counted = match (&verdict_word, &result) {
            (_, Err(_)) => "not-dispatched",
            (word, Ok(())) => *word,
        };
        let _ = host.metrics().counter_add(
            "pooler_core_dispatches_total",
            "Due rows of the retry queue through the dispatch gate, by result (dispatched, postponed, dropped, gate-failed, not-dispatched).",
            &[("result", counted)],
            1,
        );
        match result {
            Ok(()) => {}
            // The row changed while its gate ran (rescheduled, cancelled, sent by a
            // person): the change wins, nothing to do.
            Err(CoreError::ClaimLost(id)) => {
                tracing::info!(row = id, "row changed during its gate; not dispatched")
            }
            Err(CoreError::Archived) => {
                tracing::info!(row = row.id, thread = %row.thread, "thread archived during the gate; row dropped")
            }
            Err(CoreError::ThreadBusy(t)) => {
                tracing::info!(row = row.id, thread = %t, "thread started a turn during the gate; row waits")
            }
            Err(e) => tracing::error!(row = row.id, error = %e, "due row not handled"),
        }
    }
}

#[cfg(test)]
mod tests {
    //! What the host makes of the times and texts Provider Retry returns, for any value.

    use super::*;
    use crate::mediation::core_link::convert::{FAR_PAST_MS, MAX_SEND_AT, bound_send_at};
    use proptest::prelude::*;

    #[test]
    fn wait_until_is_at_least_a_second_ahead_and_at_most_year_9999() {
        let now = 1_767_225_600_000;
        assert_eq!(wait_until(0, now), now + MIN_WAIT_MS);
        assert_eq!(wait_until(now + 5_000, now), now + 5_000);
        assert_eq!(wait_until(u64::MAX, now), MAX_SEND_AT);
        assert_eq!(wait_until(u64::MAX, u64::MAX), u64::MAX, "no overflow");
    }

    #[test]
    fn a_long_drop_reason_is_cut_and_an_empty_one_named() {
        assert_eq!(bounded_reason(&"é".repeat(500), 1), "é".repeat(200));
        assert_eq!(bounded_reason("stale", 1), "stale");
        assert_eq!(bounded_reason("  ", 1), "before-dispatch: drop");
    }

    fn any_time() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            Just(MAX_SEND_AT),
            Just(MAX_SEND_AT + 1),
            Just(i64::MAX as u64),
            Just(i64::MAX as u64 + 1),
            0u64..=MAX_SEND_AT,
            any::<u64>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any `wait-until` of any plugin at any host time: no panic, and a time the core
        /// can store (a signed 64-bit integer) that is never earlier than a second ahead.
        #[test]
        fn any_wait_until_becomes_a_storable_time(asked in any_time(), now in 0u64..=MAX_SEND_AT) {
            let at = wait_until(asked, now);
            prop_assert!(at <= MAX_SEND_AT);
            prop_assert!(i64::try_from(at).is_ok());
            prop_assert!(at >= now.saturating_add(MIN_WAIT_MS).min(MAX_SEND_AT));
            if asked >= now.saturating_add(MIN_WAIT_MS) && asked <= MAX_SEND_AT {
                prop_assert_eq!(at, asked, "a sane time is kept as asked");
            }
        }

        /// Any send time of `schedule-retry` / `reschedule`: no panic, storable, and kept
        /// exactly when it is neither far past nor after 9999.
        #[test]
        fn any_send_at_becomes_a_storable_time(asked in any_time(), now in 0u64..=MAX_SEND_AT) {
            let (kept, rule) = bound_send_at(asked, now);
            prop_assert!(kept <= MAX_SEND_AT);
            prop_assert!(i64::try_from(kept).is_ok());
            let sane = asked <= MAX_SEND_AT && now.saturating_sub(asked) <= FAR_PAST_MS;
            prop_assert_eq!(sane, rule.is_none());
            if sane {
                prop_assert_eq!(kept, asked);
            } else {
                prop_assert!(kept == now || kept == MAX_SEND_AT);
            }
        }

        /// Any drop reason: no panic, 1–200 characters (what the core's history accepts),
        /// a prefix of what was given when that was not blank.
        #[test]
        fn any_drop_reason_becomes_one_the_core_keeps(why in any::<String>()) {
            let kept = bounded_reason(&why, 7);
            let chars = kept.chars().count();
            prop_assert!((1..=MAX_REASON_CHARS).contains(&chars));
            if why.chars().take(MAX_REASON_CHARS).any(|c| !c.is_whitespace()) {
                prop_assert!(why.starts_with(&kept));
            }
        }
    }
}
