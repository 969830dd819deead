//! The due pass and its gates: queued person messages start as turns, then due rows are
//! claimed (the core's concurrency gate) and each goes through `scheduler.before-dispatch`,
//! whose verdict is carried out; `scheduler.on-start` comes before the first pass.

use std::sync::Arc;

use pooler_core::{Claim, CoreError};

use super::outbox::plugin_error;
use super::{GATE_FAILURE_PAUSE_MS, Inner, SUBSCRIBER, convert};
use crate::bindings::retry::exports::pooler::plugins::scheduler::DispatchVerdict;
use crate::roles::Role;
use crate::runtime::Host;

/// The shortest move of a `wait-until`: a time not in the future would gate the row again
/// at once, in a loop with the plugin.
const MIN_WAIT_MS: u64 = 1_000;

/// The longest text the core keeps as a postpone reason from a failed gate.
const MAX_REASON_CHARS: usize = 200;

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
                self.gate(host, claim).await;
            }
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
            Ok(Ok(DispatchVerdict::WaitUntil(at))) => {
                let at = at.max(now + MIN_WAIT_MS);
                tracing::info!(row = row.id, thread = %row.thread, until = at, "row postponed by before-dispatch");
                self.core
                    .postpone(&claim, at, "before-dispatch: wait-until")
                    .map(drop)
            }
            Ok(Ok(DispatchVerdict::Drop(why))) => {
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
