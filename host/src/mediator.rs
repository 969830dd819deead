//! Delivery of availability changes between plugins. A finished call's signalled changes are
//! queued here (coalesced per provider: causes unioned in first-seen order), and one task
//! delivers them to every listening plugin — after the signalling call has returned, one
//! call at a time, and at least once: a listener that traps or times out gets the change
//! again (at once, then with a growing pause while it keeps failing).

use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::bindings::types::AvailabilityChange;
use crate::imports::listener::{ChangeSink, coalesce};
use crate::runtime::{Host, Shared};

/// Longest pause between redeliveries to a failing listener.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The queue of changes waiting for delivery.
pub struct ChangeQueue {
    pending: Mutex<Vec<AvailabilityChange>>,
    wake: Notify,
    /// Changes queued or being delivered; 0 when settled.
    outstanding: watch::Sender<usize>,
    closed: watch::Sender<bool>,
}

impl ChangeQueue {
    pub fn new() -> Self {
        ChangeQueue {
            pending: Mutex::new(Vec::new()),
            wake: Notify::new(),
            outstanding: watch::Sender::new(0),
            closed: watch::Sender::new(false),
        }
    }

    fn push(&self, change: AvailabilityChange) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if coalesce(&mut pending, change) {
            self.outstanding.send_modify(|n| *n += 1);
        }
    }

    fn take(&self) -> Vec<AvailabilityChange> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Put back a change whose delivery failed (merged with any newer one of its provider).
    fn requeue(&self, change: AvailabilityChange) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !coalesce(&mut pending, change) {
            self.outstanding.send_modify(|n| *n = n.saturating_sub(1));
        }
    }

    fn delivered(&self) {
        self.outstanding.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Resolves once nothing is queued or being delivered.
    pub async fn settled(&self) {
        let mut rx = self.outstanding.subscribe();
        let mut closed = self.closed.subscribe();
        tokio::select! {
            _ = rx.wait_for(|n| *n == 0) => {}
            _ = closed.wait_for(|c| *c) => {}
        }
    }

    /// Stop the delivery task (the host is going away).
    pub fn close(&self) {
        self.closed.send_replace(true);
        self.wake.notify_one();
    }
}

impl Default for ChangeQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl ChangeSink for ChangeQueue {
    fn enqueue(&self, from: &str, changes: Vec<AvailabilityChange>) {
        tracing::debug!(
            plugin = from,
            count = changes.len(),
            "availability changes queued"
        );
        for change in changes {
            self.push(change);
        }
        self.wake.notify_one();
    }
}

/// The delivery task: runs until the host is dropped.
pub(crate) async fn deliver(queue: std::sync::Arc<ChangeQueue>, host: Weak<Shared>) {
    let mut failures: u32 = 0;
    loop {
        if *queue.closed.borrow() {
            return;
        }
        let batch = queue.take();
        if batch.is_empty() {
            queue.wake.notified().await;
            continue;
        }
        let Some(shared) = host.upgrade() else { return };
        let host_handle = Host { shared };
        let mut failed = false;
        for change in batch {
            if failed {
                queue.requeue(change);
                continue;
            }
            match host_handle.deliver_change(&change).await {
                Ok(()) => {
                    failures = 0;
                    queue.delivered();
                }
                Err(e) => {
                    tracing::warn!(error = %e, provider = ?change.provider, "availability change not delivered; will deliver again");
                    failed = true;
                    queue.requeue(change);
                }
            }
        }
        drop(host_handle);
        if failed {
            // The first redelivery is immediate; a listener that keeps failing is given
            // growing pauses.
            if failures > 0 {
                let pause = Duration::from_secs(1u64 << failures.min(6)).min(MAX_BACKOFF);
                let mut closed = queue.closed.subscribe();
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = closed.wait_for(|c| *c) => return,
                }
            }
            failures = failures.saturating_add(1);
        }
    }
}
