//! The core, wired into the host: [`CoreLink`] owns the core database (`pooler_core::Core`)
//! for a running host and drives everything the core needs from the host:
//!
//! - the `threads` import ([`CoreThreads`], answered from the core's database);
//! - threads and their pool routes (each thread gets a route through the pool's
//!   `routing.open-route`, served at the host's own listener);
//! - the turn tasks: each turn of an `http` thread is a real streaming request to the host's
//!   own listener with the thread's route token, i.e. through the pool exactly as an agent's
//!   request would go; each turn of a `claude-code` or `codex` thread runs that agent CLI
//!   with the route in its environment ([`pooler_core::agent`]), while the listener records
//!   its answers on the route ([`crate::operate::tap`]) for the failure description; a cancel or an
//!   archive stops a running turn;
//! - the outbox delivery to the provider-retry role (`turn-events`);
//! - the due loop (concurrency gate, then `scheduler.before-dispatch`) and `on-start` /
//!   `on-tick`;
//! - a person's send-now (`retry-admin.sent-by-person` tells the plugin).
//!
//! This file holds the link itself (open, attach, the thread operations a person calls) and
//! the route calls; the rest is one file per seam: `convert` (core ↔ WIT records, the
//! `threads` service), `loops` (the three loops and their wake-ups), `dispatch` (the due
//! pass and its gates), `outbox` (event delivery), `turns` (turn tasks, agent turns too) and
//! `options`.
//!
//! # Start order
//!
//! ```text
//! CoreLink::open(data_dir)   Core::open + recover (claimed rows back to the queue, turns a
//!                            crash left running recorded as failed, with their event)
//! Host::new(threads = link.threads_service())
//! link.attach(&host)         register the outbox subscriber, spawn the loops
//! Server::with_core          tells the link its listener (set_listener); turns need it
//! due loop                   waits for the listener → on-start → first due check → loop
//! ```
//!
//! # The loops
//!
//! Everything is timed by the host clock (manual in tests: advancing it wakes the loops).
//! One `watch` value (`Activity`) carries the wake-ups and tells when the link is idle
//! ([`CoreLink::settled`]), so tests wait for work to finish instead of sleeping.
//!
//! - **Due loop**: sleeps until the earliest row's send time, or until poked (a `threads`
//!   call changed the queue, a person sent a message, a turn finished and freed a slot).
//!   A pass starts queued person messages as turns, then claims due rows (the core's
//!   concurrency gate: a row that meets a full limit waits, marked waiting-for-slot) and
//!   asks `before-dispatch` for each: `proceed` dispatches (turn request created and row
//!   deleted in one transaction), `wait-until(t)` postpones, `drop` removes, and a trap or
//!   error postpones by 60 s. Without a provider-retry plugin there is no gate to ask, and
//!   due rows proceed.
//! - **Outbox loop**: delivers pending events in event order, one call at a time; a failed
//!   delivery (trap, deadline, transient plugin error) leaves the event pending and skips
//!   that thread's later events in the same pass, so each thread's events arrive in order.
//!   The first redelivery is immediate, later ones wait 2, 4, … up to 60 s of host time; a
//!   restart redelivers everything pending at once.
//! - **Tick loop**: `scheduler.on-tick(now)` every `retry-tick` of host time after start.
//! - **Prune loop**: the core's retention ([`pooler_core::Core::prune`]) every
//!   `[core.retention] prune-interval-s` of host time after start, one batch per table per
//!   tick (the next tick comes at once while a table has more).
//! - A claim whose verdict could not be recorded is released by the due loop once its
//!   lease (`[core] claim-lease-s`) ends: the core's next due time includes it.
//!
//! Calls into the provider-retry plugin are serialised by the runtime (one at a time), so
//! the loops never call it concurrently. Route tokens are secrets: they are stored in the
//! core, sent to the listener, and never logged.

mod convert;
mod dispatch;
mod loops;
mod options;
mod outbox;
mod turns;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use pooler_core::agent::Cli;
use pooler_core::clock::SharedClock;
use pooler_core::driver::TurnDriver;
use pooler_core::{
    AgentSpec, Core, CoreError, EventId, Provider, RequestId, Route, RowId, ThreadId, Timestamp,
};
use tokio::sync::watch;

pub use convert::{CoreThreads, FAR_PAST_MS, FOREIGN_ROW_RULE, MAX_SEND_AT, bound_send_at};
pub use options::{AgentOptions, CoreOptions};

use crate::runtime::imports::threads::ThreadsService;
use crate::runtime::roles::Role;
use crate::runtime::{Host, Shared};
use loops::{Activity, Signals, due_loop, outbox_loop, prune_loop, spawn_loop, tick_loop};
use turns::StopHandle;

/// The outbox subscriber name of the provider-retry role (its delivery state survives a
/// swap of the component filling the role).
pub const SUBSCRIBER: &str = "provider-retry";

/// How far a row moves when its `before-dispatch` traps or errs (the contract's 60 s).
pub const GATE_FAILURE_PAUSE_MS: u64 = 60_000;

/// Why a thread operation of the link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The core refused or failed (no such thread, archived, busy, storage…).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// Something the operation needs is not there (no pool, no listener yet, the pool
    /// refused the route, the host is stopping).
    #[error("{0}")]
    Unavailable(String),
}

/// What a person's send-now did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SentNow {
    /// The thread the row belonged to.
    pub thread: ThreadId,
    /// The row that was dispatched.
    pub row: RowId,
    /// The new turn request.
    pub request: RequestId,
    /// The attempt the dispatched turn carries.
    pub attempt: u32,
    /// Whether the provider-retry plugin took note (`retry-admin.sent-by-person`).
    pub plugin_told: bool,
}

/// The core of a running host; see the module docs. Dropping it (with the host) stops the
/// loops; turns still running are abandoned and recorded as interrupted at the next start.
pub struct CoreLink {
    inner: Arc<Inner>,
}

impl Drop for CoreLink {
    fn drop(&mut self) {
        self.inner.signals.modify(|a| a.closed = true);
    }
}

impl std::fmt::Debug for CoreLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreLink")
            .field("core", &self.inner.core)
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

struct Inner {
    core: Arc<Core>,
    signals: Arc<Signals>,
    driver: TurnDriver,
    options: CoreOptions,
    /// `http://<listener>`: where turns are sent and routes are opened for.
    endpoint: RwLock<Option<String>>,
    host: OnceLock<Weak<Shared>>,
    /// Events whose delivery failed: when they may be delivered again (host time). Kept in
    /// memory only, so a restart redelivers at once.
    redeliver_at: Mutex<HashMap<EventId, Timestamp>>,
    /// Turns running in this process, by thread: archiving the thread, or a person's
    /// cancel, stops its turn (with the reason sent here).
    running: Mutex<HashMap<ThreadId, StopHandle>>,
}

impl CoreLink {
    /// Opens (or creates) the core database in `data_dir` and repairs what a previous run
    /// left behind ([`Core::recover`]): rows it had claimed go back to the queue, turns it
    /// was running are recorded as failed with their `turn-failed` event.
    pub fn open(
        data_dir: &Path,
        clock: SharedClock,
        options: CoreOptions,
    ) -> anyhow::Result<CoreLink> {
        let core = Core::open(data_dir, clock.clone())
            .map_err(|e| anyhow::anyhow!("cannot open the core database: {e}"))?;
        // Agents a killed run left running would go on beside the retries of their turns.
        let notes = data_dir.join(pooler_core::agent::GROUP_NOTES);
        match pooler_core::agent::kill_left_behind(&notes) {
            Ok(killed) if !killed.is_empty() => tracing::warn!(
                process_groups = ?killed,
                "killed agent processes a previous run left running"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                dir = %notes.display(),
                error = %e,
                "cannot read the notes of agent processes a previous run left"
            ),
        }
        let report = core
            .recover()
            .map_err(|e| anyhow::anyhow!("cannot recover the core database: {e}"))?;
        if !report.released_rows.is_empty() || !report.interrupted_turns.is_empty() {
            tracing::info!(
                released_rows = ?report.released_rows,
                interrupted_turns = ?report.interrupted_turns,
                "core recovered after an unclean stop"
            );
        }
        core.set_claim_lease(options.claim_lease)
            .map_err(|e| anyhow::anyhow!("cannot set the claim lease: {e}"))?;
        if let Some(limit) = options.concurrency_limit {
            core.set_concurrency_limit(limit)
                .map_err(|e| anyhow::anyhow!("cannot store the concurrency limit: {e}"))?;
        }
        let signals = Arc::new(Signals(watch::Sender::new(Activity::default())));
        let driver = TurnDriver::new(clock, options.driver.clone());
        Ok(CoreLink {
            inner: Arc::new(Inner {
                core: Arc::new(core),
                signals,
                driver,
                options,
                endpoint: RwLock::new(None),
                host: OnceLock::new(),
                redeliver_at: Mutex::new(HashMap::new()),
                running: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// What answers the `threads` import: pass it as `HostOptions::threads`.
    pub fn threads_service(&self) -> Arc<dyn ThreadsService> {
        Arc::new(CoreThreads::new(
            self.inner.core.clone(),
            self.inner.signals.clone(),
        ))
    }

    /// Joins the link to `host` (built with [`CoreLink::threads_service`]) and starts the
    /// loops. The due loop waits for the listener ([`CoreLink::set_listener`], called by
    /// `Server::with_core`), then calls `on-start`, then checks the queue.
    pub fn attach(self, host: &Host) -> anyhow::Result<Arc<CoreLink>> {
        if host.has_role(Role::ProviderRetry) {
            self.inner
                .core
                .register_subscriber(SUBSCRIBER)
                .map_err(|e| anyhow::anyhow!("cannot register the outbox subscriber: {e}"))?;
        }
        let _ = self.inner.host.set(Arc::downgrade(&host.shared));
        let link = Arc::new(self);
        spawn_loop(&link.inner, due_loop(link.inner.clone()));
        spawn_loop(&link.inner, outbox_loop(link.inner.clone()));
        spawn_loop(&link.inner, tick_loop(link.inner.clone()));
        spawn_loop(&link.inner, prune_loop(link.inner.clone()));
        Ok(link)
    }

    /// The core database.
    pub fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    /// The host's listener is at `addr`: turns are sent there and routes opened for it. An
    /// unspecified address (`0.0.0.0`) is reached through loopback.
    pub fn set_listener(&self, addr: SocketAddr) {
        let endpoint = crate::operate::wire::endpoint_url(addr);
        tracing::info!(%endpoint, "core sends turns through the host's listener");
        *self
            .inner
            .endpoint
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(endpoint);
        self.inner.signals.modify(|a| {
            a.listening = true;
            a.due_dirty = true;
        });
    }

    /// `http://<listener>`, once the server is bound.
    pub fn endpoint(&self) -> Option<String> {
        self.inner.endpoint()
    }

    /// Resolves once the loops have nothing to do at the host clock's current time:
    /// `on-start` was called, no pass is pending or running, no turn is running and no
    /// loop's timer is due. Rows waiting for a later time and events waiting for a later
    /// redelivery do not count. (Also resolves when the link closes.) Tests move the manual
    /// clock and then wait for this instead of sleeping.
    pub async fn settled(&self) {
        let clock = self.inner.core.clock().clone();
        let mut rx = self.inner.signals.subscribe();
        let _ = rx.wait_for(|a| a.closed || a.idle_at(clock.now_ms())).await;
    }

    /// Whether [`CoreLink::settled`] would resolve now.
    pub fn is_settled(&self) -> bool {
        let a = self.inner.signals.0.borrow();
        a.closed || a.idle_at(self.inner.now())
    }

    /// Stops the loops and waits until they and the turn tasks have ended (as a host
    /// shutdown does): a pass in progress finishes the row it is gating, turns still
    /// running are abandoned and recorded as interrupted at the next start. The link cannot
    /// be restarted.
    pub async fn shutdown(&self) {
        let mut rx = self.inner.signals.subscribe();
        self.inner.signals.modify(|a| a.closed = true);
        let _ = rx.wait_for(|a| a.loops == 0 && a.turns == 0).await;
    }

    /// Looks at the queue and the outbox again now (e.g. after a change made directly in
    /// the core).
    pub fn wake(&self) {
        self.inner.signals.modify(|a| {
            a.due_dirty = true;
            a.outbox_dirty = true;
        });
    }

    /// Creates a thread of `provider` with a route through the pool. Needs a plugin in the
    /// account-pool role and a bound listener.
    pub async fn new_thread(
        &self,
        provider: Provider,
        model: Option<&str>,
    ) -> Result<ThreadId, LinkError> {
        self.new_agent_thread(provider, model, &AgentSpec::default())
            .await
    }

    /// [`CoreLink::new_thread`] for a thread whose turns `agent` runs. An agent CLI must be
    /// found now (a missing binary is this call's error, not a failed turn), and a named
    /// directory must exist; without one, the thread gets `DATA_DIR/threads/<id>/`.
    pub async fn new_agent_thread(
        &self,
        provider: Provider,
        model: Option<&str>,
        agent: &AgentSpec,
    ) -> Result<ThreadId, LinkError> {
        if let Some(cli) = Cli::of(agent.agent) {
            self.inner
                .options
                .agents
                .binary(cli)
                .map_err(|why| LinkError::Core(CoreError::InvalidArgument(why)))?;
        }
        if let Some(dir) = &agent.cwd
            && !Path::new(dir).is_dir()
        {
            return Err(LinkError::Core(CoreError::InvalidArgument(format!(
                "the thread's directory {dir} is not a directory"
            ))));
        }
        let host = self.inner.host()?;
        if !host.has_role(Role::AccountPool) {
            return Err(LinkError::Unavailable(
                "threads need a plugin in the account-pool role: their turns go through the pool"
                    .into(),
            ));
        }
        let endpoint = self.endpoint().ok_or_else(|| {
            LinkError::Unavailable("the host is not listening yet; turns go through it".into())
        })?;
        let id = Core::new_thread_id();
        let token = open_route(&host, &id, provider, &endpoint).await?;
        let route = Route {
            base_url: endpoint,
            token,
        };
        if let Err(e) = self
            .inner
            .core
            .new_agent_thread(&id, provider, model, Some(route), agent)
        {
            close_route(&host, &id, provider).await;
            return Err(e.into());
        }
        Ok(id)
    }

    /// Queues a person's message; it starts as a turn when the thread is free and a slot
    /// is. Returns its request id.
    pub fn send(&self, thread: &str, text: &str) -> Result<RequestId, LinkError> {
        let request = self.inner.core.send(thread, text)?;
        self.inner.signals.due();
        Ok(request)
    }

    /// Archives a thread: no further turn, its live rows removed, its pool route closed.
    pub async fn archive(&self, thread: &str) -> Result<(), LinkError> {
        let provider = self
            .inner
            .core
            .get_thread(thread)
            .map_err(CoreError::from)?;
        self.inner.core.archive(thread)?;
        self.inner
            .stop_turn(thread, "the thread was archived while its turn ran");
        if let Ok(host) = self.inner.host()
            && host.has_role(Role::AccountPool)
        {
            close_route(&host, thread, provider.provider).await;
        }
        self.inner.signals.due();
        Ok(())
    }

    /// A person's cancel of the turn `thread` is running: the turn stops (an agent CLI's
    /// process group is killed, the built-in driver's request is dropped, so the pool stops
    /// too) and is recorded as failed, a failure Provider Retry does not retry. False when
    /// the thread runs no turn in this process.
    pub fn cancel_turn(&self, thread: &str) -> Result<bool, LinkError> {
        self.inner
            .core
            .get_thread(thread)
            .map_err(CoreError::from)?;
        Ok(self.inner.stop_turn(thread, "a person cancelled the turn"))
    }

    /// Opts the thread out of automatic retries (or back in).
    pub fn set_opt_out(&self, thread: &str, opt_out: bool) -> Result<(), LinkError> {
        Ok(self.inner.core.set_opt_out(thread, opt_out)?)
    }

    /// A person's send-now: dispatches the thread's live retry row at once, bypassing its
    /// send time, the concurrency limit and every gate (recorded in the core's history),
    /// then tells the provider-retry plugin (`retry-admin.sent-by-person`).
    pub async fn send_now(&self, thread: &str) -> Result<SentNow, LinkError> {
        let host = self.inner.host()?;
        let now = self.inner.now();
        let (row, plan) = self.inner.core.send_now_row(thread, now)?;
        let mut sent = SentNow {
            thread: thread.to_string(),
            row,
            request: plan.request.clone(),
            attempt: plan.attempt,
            plugin_told: false,
        };
        self.inner.spawn_turn(plan);
        if host.has_role(Role::ProviderRetry) {
            const CALL: &str = "retry-admin.sent-by-person";
            let thread = thread.to_string();
            let answer = host
                .call_retry(CALL, move |store, retry| {
                    Box::pin(async move {
                        retry
                            .pooler_plugins_retry_admin()
                            .call_sent_by_person(store, &thread, row, now)
                            .await
                    })
                })
                .await;
            match answer {
                Ok(Ok(())) => sent.plugin_told = true,
                // The send happened regardless; the plugin sees the dispatch in its next
                // event of the thread.
                Ok(Err(e)) => {
                    tracing::warn!(plugin = SUBSCRIBER, call = CALL, error = ?e, "the plugin refused the note of a send-now")
                }
                Err(_) => {} // logged by the runtime
            }
        }
        Ok(sent)
    }
}

/// Opens the pool route of thread `id`; returns its token.
async fn open_route(
    host: &Host,
    id: &str,
    provider: Provider,
    endpoint: &str,
) -> Result<String, LinkError> {
    let (thread, wit_provider, endpoint) = (
        id.to_string(),
        convert::provider(provider),
        endpoint.to_string(),
    );
    let answer = host
        .call_pool("routing.open-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_open_route(store, &thread, wit_provider, &endpoint)
                    .await
            })
        })
        .await
        .map_err(|e| LinkError::Unavailable(e.to_string()))?;
    match answer {
        Ok(route) => Ok(route.token),
        Err(e) => Err(LinkError::Unavailable(format!(
            "the pool refused to open a route: {e:?}"
        ))),
    }
}

/// Closes the pool route of `thread`, best effort (a route already gone is fine).
async fn close_route(host: &Host, thread: &str, provider: Provider) {
    let (thread, wit_provider) = (thread.to_string(), convert::provider(provider));
    let answer = host
        .call_pool("routing.close-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_close_route(store, &thread, wit_provider)
                    .await
            })
        })
        .await;
    if let Ok(Err(e)) = answer {
        tracing::debug!(error = ?e, "route not closed");
    }
}

impl Inner {
    fn now(&self) -> Timestamp {
        self.core.clock().now_ms()
    }

    fn endpoint(&self) -> Option<String> {
        self.endpoint
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn host(&self) -> Result<Host, LinkError> {
        self.host
            .get()
            .and_then(Weak::upgrade)
            .map(|shared| Host { shared })
            .ok_or_else(|| LinkError::Unavailable("the host is stopping".into()))
    }
}
