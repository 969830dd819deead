//! Mediation between plugins, in both directions. Queries: a plugin's availability query
//! goes to a fresh instance of the pool (`Mediator`, the stores' `AvailabilitySource`),
//! with the contract's answers when the pool cannot answer. Changes: a finished call's
//! signalled changes are queued here (coalesced per provider: causes unioned in first-seen
//! order), and one task delivers them to every listening plugin — after the signalling call
//! has returned, one call at a time, and at least once: a listener that traps or times out
//! gets the change again (at once, then with a growing pause while it keeps failing).
//! [`Host::new`] and [`Host`]'s availability queries delegate here.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use wasmtime::Store;

use crate::runtime::bindings::pool::AccountPool;
use crate::runtime::bindings::types::{
    Availability, AvailabilityChange, PluginError, UnavailableReason,
};
use crate::runtime::imports::availability::{AvailabilityQuery, AvailabilitySource};
use crate::runtime::imports::listener::{ChangeSink, coalesce};
use crate::runtime::roles::Role;
use crate::runtime::state::PluginState;
use crate::runtime::{CallError, CallFuture, Host, HostOptions, Mediation, Shared, Wiring};

/// How long an availability query may take before the host answers
/// `unavailable(source-unavailable)` (the contract's 5 s).
pub const AVAILABILITY_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest pause between redeliveries to a failing listener.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the host answers for a pool that could not answer.
const SOURCE_UNAVAILABLE: Availability =
    Availability::Unavailable(UnavailableReason::SourceUnavailable);

/// A plugin's query as the pool's export takes it.
fn pool_query(
    query: AvailabilityQuery,
) -> crate::runtime::bindings::pool::exports::pooler::plugins::availability::AvailabilityQuery {
    crate::runtime::bindings::pool::exports::pooler::plugins::availability::AvailabilityQuery {
        thread: query.thread,
        provider: query.provider,
        request: query.request,
        model: query.model,
    }
}

/// Answers availability queries for the stores (holds the host weakly: stores must not keep
/// the host alive).
pub(crate) struct Mediator(Weak<Shared>);

impl Mediator {
    pub(crate) fn new(host: Weak<Shared>) -> Self {
        Mediator(host)
    }
}

impl AvailabilitySource for Mediator {
    fn query(
        &self,
        caller: Arc<str>,
        query: AvailabilityQuery,
    ) -> Pin<Box<dyn Future<Output = Availability> + Send>> {
        let host = self.0.upgrade().map(|shared| Host { shared });
        Box::pin(async move {
            match host {
                Some(host) => host.query_availability(&caller, query).await,
                None => SOURCE_UNAVAILABLE,
            }
        })
    }

    fn query_many(
        &self,
        caller: Arc<str>,
        queries: Vec<AvailabilityQuery>,
    ) -> Pin<Box<dyn Future<Output = Vec<Availability>> + Send>> {
        let host = self.0.upgrade().map(|shared| Host { shared });
        Box::pin(async move {
            match host {
                Some(host) => host.query_availability_many(&caller, queries).await,
                None => vec![SOURCE_UNAVAILABLE; queries.len()],
            }
        })
    }
}

/// [`Host::query_availability`]: one query from `caller`, through a fresh instance of the pool.
pub(crate) async fn query(host: &Host, caller: &str, query: AvailabilityQuery) -> Availability {
    let query = pool_query(query);
    let mut answers = ask_pool(host, caller, "availability.query", 1, move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_availability()
                .call_query(store, &query)
                .await
                .map(|answer| vec![answer])
        })
    })
    .await;
    answers.pop().unwrap_or(SOURCE_UNAVAILABLE)
}

/// [`Host::query_availability_many`]: several queries from `caller`, with one call into a
/// fresh instance of the pool (`availability.query-many`): one answer per query, in order.
pub(crate) async fn query_many(
    host: &Host,
    caller: &str,
    queries: Vec<AvailabilityQuery>,
) -> Vec<Availability> {
    if queries.is_empty() {
        return Vec::new();
    }
    let count = queries.len();
    let queries: Vec<_> = queries.into_iter().map(pool_query).collect();
    ask_pool(
        host,
        caller,
        "availability.query-many",
        count,
        move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_availability()
                    .call_query_many(store, &queries)
                    .await
            })
        },
    )
    .await
}

/// The contract of both availability calls: `not-routed` without a pool;
/// `source-unavailable` for every query when the pool traps, takes over 5 s, answers
/// the wrong number of answers, or is the caller itself.
async fn ask_pool(
    host: &Host,
    caller: &str,
    name: &str,
    count: usize,
    call: impl for<'a> FnOnce(
        &'a mut Store<PluginState>,
        &'a AccountPool,
    ) -> CallFuture<'a, Vec<Availability>>
    + Send,
) -> Vec<Availability> {
    if host.shared.pool.is_none() {
        return vec![Availability::NotRouted; count];
    }
    if caller == Role::AccountPool.name() {
        // The pool asking itself would be a call into a plugin from inside its own call.
        tracing::warn!(
            plugin = caller,
            "refused an availability query of the pool by itself"
        );
        return vec![SOURCE_UNAVAILABLE; count];
    }
    match tokio::time::timeout(AVAILABILITY_TIMEOUT, host.call_pool(name, call)).await {
        Ok(Ok(answers)) if answers.len() == count => answers,
        Ok(Ok(answers)) => {
            tracing::warn!(
                caller,
                asked = count,
                answered = answers.len(),
                "availability source answered the wrong number of queries"
            );
            vec![SOURCE_UNAVAILABLE; count]
        }
        Ok(Err(e)) => {
            tracing::warn!(caller, error = %e, "availability source failed");
            vec![SOURCE_UNAVAILABLE; count]
        }
        Err(_) => {
            tracing::warn!(caller, "availability source did not answer within 5 s");
            vec![SOURCE_UNAVAILABLE; count]
        }
    }
}

/// Deliver one availability change to every listening plugin; the first failure stops
/// the round (the whole change is delivered again later).
async fn deliver_change(host: &Host, change: &AvailabilityChange) -> Result<(), CallError> {
    for role in Role::ALL.into_iter().filter(|role| role.is_listener()) {
        match role {
            Role::ProviderRetry if host.shared.retry.is_some() => {
                const CALL: &str = "availability-listener.availability-changed";
                let change = change.clone();
                let answer = host
                    .call_retry(CALL, move |store, retry| {
                        Box::pin(async move {
                            retry
                                .pooler_plugins_availability_listener()
                                .call_availability_changed(store, &change)
                                .await
                        })
                    })
                    .await?;
                match answer {
                    Ok(()) => {}
                    // The plugin says this change can never be handled: redelivering it
                    // would loop, so it is logged and dropped.
                    Err(PluginError::InvalidInput(reason)) => {
                        tracing::warn!(plugin = role.name(), call = CALL, %reason, "listener refused an availability change");
                    }
                    Err(PluginError::Storage(reason) | PluginError::Dependency(reason)) => {
                        return Err(CallError::Transient {
                            plugin: role.name().to_owned(),
                            call: CALL.to_owned(),
                            reason,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// [`Host::new`]: load every configured role and start the host's background work (the
/// epoch ticker, the availability-change delivery, the alerts' delivery).
pub(crate) fn start(options: HostOptions) -> anyhow::Result<Host> {
    let queue = Arc::new(ChangeQueue::new());
    let host = Host::assemble(options, |weak| Wiring {
        availability: Arc::new(Mediator::new(weak.clone())),
        changes: queue.clone(),
        mediation: queue.clone(),
    })?;
    tokio::spawn(deliver(queue, Arc::downgrade(&host.shared)));
    tokio::spawn(
        host.shared
            .alerts
            .clone()
            .run_deliveries(host.shared.alerts_stop.subscribe()),
    );
    Ok(host)
}

/// The queue of changes waiting for delivery.
pub struct ChangeQueue {
    pending: Mutex<Vec<AvailabilityChange>>,
    wake: Notify,
    /// Changes queued or being delivered; 0 when settled.
    outstanding: watch::Sender<usize>,
    closed: watch::Sender<bool>,
}

impl ChangeQueue {
    /// An empty, open queue; nothing is delivered until a delivery task drains it.
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

impl Mediation for ChangeQueue {
    fn close(&self) {
        ChangeQueue::close(self);
    }

    fn settled(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(ChangeQueue::settled(self))
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
pub(crate) async fn deliver(queue: Arc<ChangeQueue>, host: Weak<Shared>) {
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
            match deliver_change(&host_handle, &change).await {
                Ok(()) => {
                    failures = 0;
                    queue.delivered();
                    // One line per availability signal delivered (coalesced per provider).
                    tracing::info!(provider = ?change.provider, causes = ?change.causes, detected_at = change.detected_at, "availability change delivered");
                    let provider = match change.provider {
                        crate::runtime::bindings::types::Provider::Claude => "claude",
                        crate::runtime::bindings::types::Provider::Codex => "codex",
                    };
                    let _ = host_handle.metrics().counter_add(
                        "pooler_availability_changes_total",
                        "Availability changes the pool signalled that the host delivered, by provider (after coalescing).",
                        &[("provider", provider)],
                        1,
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, provider = ?change.provider, "availability change not delivered; will deliver again");
                    failed = true;
                    queue.requeue(change);
                }
            }
        }
        // What the pool can serve may have changed: the alerts' watcher looks soon.
        host_handle.alerts().look.notify_one();
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
