//! The outbox delivery to the provider-retry role (`turn-events`): pending events in event
//! order, one call at a time; a failed delivery holds back that thread's later events and is
//! retried after a growing pause (kept in memory, so a restart redelivers at once).

use std::collections::HashSet;

use pooler_core::{OutboxEvent, PluginEvent, Timestamp};

use super::{Inner, SUBSCRIBER, convert};
use crate::runtime::Host;
use crate::runtime::bindings::types::PluginError;

/// Longest pause between redeliveries of an event that keeps failing.
const MAX_REDELIVERY_PAUSE_MS: u64 = 60_000;

/// Events read from the outbox per pass.
const OUTBOX_BATCH: usize = 100;

impl Inner {
    /// One outbox pass; returns when the next failed event may be delivered again.
    pub(super) async fn outbox_pass(&self, host: &Host) -> Option<Timestamp> {
        let events = match self.core.pending_events(SUBSCRIBER, OUTBOX_BATCH) {
            Ok(events) => events,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the outbox");
                return Some(self.now() + MAX_REDELIVERY_PAUSE_MS);
            }
        };
        let full_batch = events.len() == OUTBOX_BATCH;
        let mut held_threads: HashSet<String> = HashSet::new();
        let mut next_retry: Option<Timestamp> = None;
        let mut delivered_any = false;
        for event in events {
            if self.signals.is_closed() {
                return None;
            }
            let thread = event.event.thread().to_string();
            if held_threads.contains(&thread) {
                continue;
            }
            let now = self.now();
            let due_at = self.redeliver_at.lock().unwrap().get(&event.id).copied();
            if let Some(at) = due_at.filter(|at| *at > now) {
                held_threads.insert(thread);
                next_retry = Some(next_retry.map_or(at, |n| n.min(at)));
                continue;
            }
            match deliver(host, &event).await {
                Ok(()) => {
                    self.redeliver_at.lock().unwrap().remove(&event.id);
                    delivered_any = true;
                    // Provider Retry has taken this failure on: the alerts' watcher can
                    // tell from now on whether it will retry it.
                    if let PluginEvent::TurnFailed(failed) = &event.event {
                        host.alerts()
                            .threads
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .note(&failed.thread, &failed.failed_request);
                        host.alerts().look.notify_one();
                    }
                    if let Err(e) = self.core.ack(SUBSCRIBER, event.id) {
                        tracing::error!(event = event.id, error = %e, "cannot acknowledge a delivered event; it will be delivered again");
                        held_threads.insert(thread);
                    }
                }
                Err(reason) => {
                    if let Err(e) = self
                        .core
                        .note_delivery_failure(SUBSCRIBER, event.id, &reason)
                    {
                        tracing::error!(event = event.id, error = %e, "cannot record a failed delivery");
                    }
                    let failures = event.failed_deliveries + 1;
                    // The first redelivery is immediate (a trap is usually a one-off); a
                    // plugin that keeps failing gets growing pauses.
                    let pause = if failures <= 1 {
                        0
                    } else {
                        (1_000u64 << (failures - 1).min(6)).min(MAX_REDELIVERY_PAUSE_MS)
                    };
                    let at = self.now() + pause;
                    tracing::warn!(event = event.id, thread = %thread, failures, retry_in_ms = pause, %reason, "event not delivered; will deliver again");
                    self.redeliver_at.lock().unwrap().insert(event.id, at);
                    held_threads.insert(thread);
                    next_retry = Some(next_retry.map_or(at, |n| n.min(at)));
                }
            }
        }
        if full_batch && delivered_any {
            self.signals.outbox();
        }
        next_retry
    }
}

/// Delivers one event to the provider-retry role. `Err` carries why it must be delivered
/// again; `invalid-input` is final and counts as delivered.
async fn deliver(host: &Host, event: &OutboxEvent) -> Result<(), String> {
    let (call, answer) = match event.event.clone() {
        PluginEvent::TurnFailed(e) => {
            const CALL: &str = "turn-events.turn-failed";
            let e = convert::turn_failed(e);
            let answer = host
                .call_retry(CALL, move |store, retry| {
                    Box::pin(async move {
                        retry
                            .pooler_plugins_turn_events()
                            .call_turn_failed(store, &e)
                            .await
                    })
                })
                .await;
            (CALL, answer)
        }
        PluginEvent::TurnSucceeded(e) => {
            const CALL: &str = "turn-events.turn-succeeded";
            let e = convert::turn_succeeded(e);
            let answer = host
                .call_retry(CALL, move |store, retry| {
                    Box::pin(async move {
                        retry
                            .pooler_plugins_turn_events()
                            .call_turn_succeeded(store, &e)
                            .await
                    })
                })
                .await;
            (CALL, answer)
        }
    };
    match answer {
        Ok(Ok(())) => Ok(()),
        Ok(Err(PluginError::InvalidInput(reason))) => {
            tracing::warn!(plugin = SUBSCRIBER, call, event = event.id, %reason, "the plugin refused an event as invalid; not delivered again");
            Ok(())
        }
        Ok(Err(e)) => Err(plugin_error(&e)),
        Err(e) => Err(e.to_string()),
    }
}

pub(super) fn plugin_error(e: &PluginError) -> String {
    match e {
        PluginError::Storage(m) => format!("storage: {m}"),
        PluginError::Dependency(m) => format!("dependency: {m}"),
        PluginError::InvalidInput(m) => format!("invalid-input: {m}"),
    }
}
