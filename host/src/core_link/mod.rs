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
//!   its answers on the route ([`crate::tap`]) for the failure description; a cancel or an
//!   archive stops a running turn;
//! - the outbox delivery to the provider-retry role (`turn-events`);
//! - the due loop (concurrency gate, then `scheduler.before-dispatch`) and `on-start` /
//!   `on-tick`;
//! - a person's send-now (`retry-admin.sent-by-person` tells the plugin).
//!
//! # Start order
//!
//! ```text
//! CoreLink::open(data_dir)   Core::open + recover (claimed rows back to the queue, turns a
//!                            crash left running recorded as failed, with their event)
//! Host::new(threads = link.threads_service())
//! link.attach(&host)         register the outbox subscriber, spawn the loops
//! Server::bind               tells the link its listener (set_listener); turns need it
//! due loop                   waits for the listener → on-start → first due check → loop
//! ```
//!
//! # The loops
//!
//! Everything is timed by the host clock (manual in tests: advancing it wakes the loops).
//! One `watch` value ([`Activity`]) carries the wake-ups and tells when the link is idle
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
//!
//! Calls into the provider-retry plugin are serialised by the runtime (one at a time), so
//! the loops never call it concurrently. Route tokens are secrets: they are stored in the
//! core, sent to the listener, and never logged.

mod convert;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use pooler_core::agent::{self, AgentLimits, Cli};
use pooler_core::clock::SharedClock;
use pooler_core::driver::{self, DriverConfig, TurnDriver};
use pooler_core::{
    AgentSpec, Claim, Core, CoreError, EventId, OutboxEvent, PluginEvent, Provider, RequestId,
    Route, RowId, ThreadId, Timestamp, TurnOutcome, TurnPlan,
};
use tokio::sync::watch;

pub use convert::CoreThreads;

use crate::bindings::retry::exports::pooler::plugins::scheduler::DispatchVerdict;
use crate::bindings::types::PluginError;
use crate::config::{AgentsConfig, CoreConfig};
use crate::imports::threads::ThreadsService;
use crate::roles::Role;
use crate::runtime::{Host, Shared};

/// The outbox subscriber name of the provider-retry role (its delivery state survives a
/// swap of the component filling the role).
pub const SUBSCRIBER: &str = "provider-retry";

/// How far a row moves when its `before-dispatch` traps or errs (the contract's 60 s).
pub const GATE_FAILURE_PAUSE_MS: u64 = 60_000;

/// The shortest move of a `wait-until`: a time not in the future would gate the row again
/// at once, in a loop with the plugin.
const MIN_WAIT_MS: u64 = 1_000;

/// Longest pause between redeliveries of an event that keeps failing.
const MAX_REDELIVERY_PAUSE_MS: u64 = 60_000;

/// Events read from the outbox per pass.
const OUTBOX_BATCH: usize = 100;

/// The longest text the core keeps as a postpone reason from a failed gate.
const MAX_REASON_CHARS: usize = 200;

/// How the link runs.
#[derive(Debug, Clone)]
pub struct CoreOptions {
    /// Provider Retry's `on-tick` interval in host time (zero: never).
    pub retry_tick: Duration,
    /// Stored as the core's concurrency limit at open, when set.
    pub concurrency_limit: Option<u32>,
    /// The turn driver's settings.
    pub driver: DriverConfig,
    /// The agent CLIs of agent threads.
    pub agents: AgentOptions,
}

/// Where the agent CLIs are and how long a turn may run.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// Claude Code's binary from the configuration (else `POOLER_CLAUDE_CODE_BIN`, else
    /// `claude` on `PATH`).
    pub claude_code: Option<PathBuf>,
    /// Codex's binary from the configuration (else `POOLER_CODEX_BIN`, else `codex`).
    pub codex: Option<PathBuf>,
    pub limits: AgentLimits,
}

impl AgentOptions {
    pub fn from_config(config: &AgentsConfig) -> Self {
        AgentOptions {
            claude_code: config.claude_code.clone(),
            codex: config.codex.clone(),
            limits: AgentLimits {
                time_limit: Duration::from_secs(config.turn_time_limit_s),
                ..AgentLimits::default()
            },
        }
    }

    /// The binary of `cli`: the configuration's, else the environment variable's, else the
    /// usual name on `PATH`. An error names where it looked.
    pub fn binary(&self, cli: Cli) -> Result<PathBuf, String> {
        let (configured, var, name) = match cli {
            Cli::ClaudeCode => (&self.claude_code, "POOLER_CLAUDE_CODE_BIN", "claude"),
            Cli::Codex => (&self.codex, "POOLER_CODEX_BIN", "codex"),
        };
        let agent = cli.agent();
        let executable = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if let Some(path) = configured {
            return if executable(path) {
                Ok(path.clone())
            } else {
                Err(format!(
                    "the {agent} binary {} ([agents] in the configuration) is not an executable file",
                    path.display()
                ))
            };
        }
        if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(path);
            return if executable(&path) {
                Ok(path)
            } else {
                Err(format!(
                    "the {agent} binary {} (${var}) is not an executable file",
                    path.display()
                ))
            };
        }
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| executable(p))
            .ok_or_else(|| {
                format!(
                    "no {agent} binary: `{name}` is not on PATH; install it, or name it in \
                     [agents] of the configuration or in ${var}"
                )
            })
    }
}

impl CoreOptions {
    pub fn from_config(config: &CoreConfig) -> Self {
        CoreOptions {
            retry_tick: Duration::from_secs(config.retry_tick_s),
            concurrency_limit: config.concurrency_limit,
            driver: DriverConfig {
                idle_timeout: Duration::from_secs(config.turn_idle_timeout_s),
                ..DriverConfig::default()
            },
            agents: AgentOptions::default(),
        }
    }

    /// [`CoreOptions::from_config`] plus the `[agents]` table.
    pub fn from_host_config(config: &crate::config::Config) -> Self {
        CoreOptions {
            agents: AgentOptions::from_config(&config.agents),
            ..CoreOptions::from_config(&config.core)
        }
    }
}

impl Default for CoreOptions {
    fn default() -> Self {
        CoreOptions::from_config(&CoreConfig::default())
    }
}

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
    pub thread: ThreadId,
    /// The row that was dispatched.
    pub row: RowId,
    /// The new turn request.
    pub request: RequestId,
    pub attempt: u32,
    /// Whether the provider-retry plugin took note (`retry-admin.sent-by-person`).
    pub plugin_told: bool,
}

/// What the loops are doing; also their wake-up channel.
#[derive(Debug, Clone, Default)]
pub(crate) struct Activity {
    /// The host's listener is known (turns can be sent).
    listening: bool,
    /// `on-start` was called and the first due check may run.
    started: bool,
    due_dirty: bool,
    due_busy: bool,
    /// When the due loop wakes by itself (the earliest future send time).
    due_next: Option<Timestamp>,
    outbox_dirty: bool,
    outbox_busy: bool,
    /// When the outbox loop wakes by itself (the next redelivery).
    outbox_next: Option<Timestamp>,
    tick_busy: bool,
    /// When the next `on-tick` is due.
    tick_next: Option<Timestamp>,
    /// Turn tasks running in this process.
    turns: usize,
    /// Loop tasks still running (they end after `closed`).
    loops: usize,
    closed: bool,
}

impl Activity {
    /// Nothing to do at `now`: started, no pass pending or running, no turn running, and
    /// no timer of a loop already due (the clock may have moved past one that has not
    /// fired yet).
    fn idle_at(&self, now: Timestamp) -> bool {
        let later = |t: Option<Timestamp>| t.is_none_or(|t| t > now);
        self.started
            && !self.due_dirty
            && !self.due_busy
            && !self.outbox_dirty
            && !self.outbox_busy
            && !self.tick_busy
            && self.turns == 0
            && later(self.due_next)
            && later(self.outbox_next)
            && later(self.tick_next)
    }
}

/// The wake-up handle shared by the link and the `threads` service.
pub(crate) struct Signals(watch::Sender<Activity>);

impl Signals {
    fn modify(&self, f: impl FnOnce(&mut Activity)) {
        self.0.send_modify(f);
    }

    /// The queue changed: the due loop looks again.
    pub(crate) fn due(&self) {
        self.modify(|a| a.due_dirty = true);
    }

    /// A row was scheduled or moved to `send_at`: the due loop looks again, unless its armed
    /// timer fires no later than that anyway (then the pass at that timer sees the row).
    /// One availability change can move thousands of rows; each used to wake the loop for a
    /// pass over the queue.
    pub(crate) fn due_at(&self, send_at: Timestamp) {
        self.0.send_if_modified(|a| {
            let armed_in_time = !a.due_busy && a.due_next.is_some_and(|next| next <= send_at);
            if a.due_dirty || armed_in_time {
                return false;
            }
            a.due_dirty = true;
            true
        });
    }

    fn outbox(&self) {
        self.modify(|a| a.outbox_dirty = true);
    }

    fn subscribe(&self) -> watch::Receiver<Activity> {
        self.0.subscribe()
    }

    fn is_closed(&self) -> bool {
        self.0.borrow().closed
    }
}

/// Counts a loop task as running until dropped (when the task ends, however it ends).
struct LoopGuard(Arc<Signals>);

impl LoopGuard {
    fn new(signals: &Arc<Signals>) -> Self {
        signals.modify(|a| a.loops += 1);
        LoopGuard(signals.clone())
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.0.modify(|a| a.loops -= 1);
    }
}

/// Spawns a loop task, counted as running from now (so a shutdown right after attach still
/// waits for it) until it ends.
fn spawn_loop(inner: &Arc<Inner>, task: impl Future<Output = ()> + Send + 'static) {
    let guard = LoopGuard::new(&inner.signals);
    tokio::spawn(async move {
        let _running = guard;
        task.await;
    });
}

/// Resolves when the link closes.
async fn closed(mut rx: watch::Receiver<Activity>) {
    let _ = rx.wait_for(|a| a.closed).await;
}

/// Waits until `pred` holds; false when the link closed first.
async fn wait_until(rx: &mut watch::Receiver<Activity>, pred: impl Fn(&Activity) -> bool) -> bool {
    match rx.wait_for(|a| a.closed || pred(a)).await {
        Ok(a) => !a.closed,
        Err(_) => false,
    }
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
    /// `Server::bind`), then calls `on-start`, then checks the queue.
    pub fn attach(self, host: &Host) -> anyhow::Result<Arc<CoreLink>> {
        if host.has_role(Role::ProviderRetry) {
            self.inner
                .core
                .register_subscriber(SUBSCRIBER)
                .map_err(|e| anyhow::anyhow!("cannot register the outbox subscriber: {e}"))?;
        }
        let _ = self.inner.host.set(Arc::downgrade(&host.shared));
        let link = Arc::new(self);
        if host.shared.core.set(link.clone()).is_err() {
            anyhow::bail!("the host already has a core");
        }
        spawn_loop(&link.inner, due_loop(link.inner.clone()));
        spawn_loop(&link.inner, outbox_loop(link.inner.clone()));
        spawn_loop(&link.inner, tick_loop(link.inner.clone()));
        Ok(link)
    }

    /// The core database.
    pub fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    /// The host's listener is at `addr`: turns are sent there and routes opened for it. An
    /// unspecified address (`0.0.0.0`) is reached through loopback.
    pub fn set_listener(&self, addr: SocketAddr) {
        let endpoint = crate::wire::endpoint_url(addr);
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

    /// Runs `plan` in its own task; when it ends, the queue and the outbox are looked at
    /// again (a slot freed, an event was written).
    fn spawn_turn(self: &Arc<Self>, plan: TurnPlan) {
        self.signals.modify(|a| a.turns += 1);
        let inner = self.clone();
        tokio::spawn(async move {
            let stop = closed(inner.signals.subscribe());
            tokio::select! {
                result = inner.run_turn(&plan) => match result {
                    Ok(event) => tracing::debug!(thread = %plan.thread, request = %plan.request, event, "turn recorded"),
                    Err(e) => tracing::error!(thread = %plan.thread, request = %plan.request, error = %e, "turn outcome not recorded"),
                },
                // The host is stopping: the turn stays running in the database, and the next
                // start records it as interrupted (what a crash would leave).
                _ = stop => tracing::info!(thread = %plan.thread, request = %plan.request, "turn abandoned: the host is stopping"),
            }
            inner.signals.modify(|a| {
                a.turns -= 1;
                a.due_dirty = true;
                a.outbox_dirty = true;
            });
        });
    }

    /// Sends the turn to the host's own listener with the thread's route token, reads it to
    /// its end and records the outcome with its event.
    async fn run_turn(&self, plan: &TurnPlan) -> Result<EventId, CoreError> {
        // The base URL is the listener of this run, not the one the route was opened at:
        // the listen address may change between runs, the token does not.
        let route = match (&plan.route, self.endpoint()) {
            (Some(route), Some(base_url)) => Route {
                base_url,
                token: route.token.clone(),
            },
            _ => {
                let outcome = unroutable(if plan.route.is_none() {
                    "the thread has no route through the pool"
                } else {
                    "the host is not listening"
                });
                return self.core.record_outcome(&plan.request, &outcome);
            }
        };
        tracing::info!(thread = %plan.thread, request = %plan.request, attempt = plan.attempt, trigger = %plan.trigger, agent = %plan.agent.agent, "turn started");
        let (stop, mut stopped) = watch::channel(None);
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(plan.thread.clone(), (plan.request.clone(), stop));
        let recorded = match Cli::of(plan.agent.agent) {
            None => {
                tokio::select! {
                    recorded = driver::run_and_record(&self.core, &self.driver, plan, &route) => recorded,
                    why = stop_reason(&mut stopped) => {
                        tracing::info!(thread = %plan.thread, request = %plan.request, reason = %why, "turn stopped");
                        self.core.record_outcome(&plan.request, &stopped_outcome(&why))
                    }
                }
            }
            Some(cli) => self.run_agent_turn(cli, plan, route, &mut stopped).await,
        };
        // The thread's next turn may have started once this one was recorded: its entry
        // stays.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running
            .get(&plan.thread)
            .is_some_and(|(request, _)| *request == plan.request)
        {
            running.remove(&plan.thread);
        }
        recorded
    }

    /// Stops the turn `thread` is running, if any, for `why`. True when there was one.
    fn stop_turn(&self, thread: &str, why: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(thread) {
            Some((_, stop)) => {
                stop.send_replace(Some(why.to_owned()));
                true
            }
            None => false,
        }
    }

    /// Runs an agent CLI for `plan` with the route in its environment, watching the route
    /// at the listener, and records the outcome. A cancel, archiving the thread or the host
    /// stopping kills the agent's process group.
    async fn run_agent_turn(
        &self,
        cli: Cli,
        plan: &TurnPlan,
        route: Route,
        stopped: &mut watch::Receiver<Option<String>>,
    ) -> Result<EventId, CoreError> {
        let host = match self.host() {
            Ok(host) => host,
            Err(e) => {
                return self
                    .core
                    .record_outcome(&plan.request, &unroutable(&e.to_string()));
            }
        };
        let program = match self.options.agents.binary(cli) {
            Ok(program) => program,
            Err(why) => return self.core.record_outcome(&plan.request, &unroutable(&why)),
        };
        let cwd = match self.agent_dir(&host, plan) {
            Ok(cwd) => cwd,
            Err(why) => return self.core.record_outcome(&plan.request, &unroutable(&why)),
        };
        // A first Claude Code turn names its session: the thread's own session id.
        let new_session = (cli == Cli::ClaudeCode && plan.agent_session.is_none())
            .then(|| plan.session_id.clone());
        let invocation =
            agent::invocation(cli, plan, &route, &program, &cwd, new_session.as_deref());
        let tap = host.taps().watch(&route.token, plan.provider);
        let ran = tokio::select! {
            ran = agent::run(&invocation, cli, &self.options.agents.limits) => Ok(ran),
            why = stop_reason(stopped) => Err(why),
        };
        let seen = tap.observation();
        drop(tap);
        let outcome = match ran {
            Ok(Ok(run)) => {
                tracing::info!(thread = %plan.thread, request = %plan.request, agent = %cli.agent(), ok = run.report.ok, requests = seen.requests, timed_out = run.timed_out, "agent turn ended");
                agent::outcome(plan, &run, &seen, new_session.as_deref(), self.now())
            }
            Ok(Err(e)) => unroutable(&format!(
                "the {} agent {} could not be started: {e}",
                cli.agent(),
                program.display()
            )),
            Err(why) => {
                tracing::info!(thread = %plan.thread, request = %plan.request, reason = %why, "agent turn stopped");
                let mut outcome = stopped_outcome(&why);
                outcome.input_in_session = seen.requests > 0;
                outcome.input_accepted = seen.accepted;
                outcome
            }
        };
        self.core
            .record_outcome(&plan.request, &redacted(outcome, &route.token))
    }

    /// The directory an agent runs in: the thread's own, else `DATA_DIR/threads/<id>/`
    /// (created 0700).
    fn agent_dir(&self, host: &Host, plan: &TurnPlan) -> Result<PathBuf, String> {
        if let Some(dir) = &plan.agent.cwd {
            return Ok(PathBuf::from(dir));
        }
        let dir = host.data_dir().join("threads").join(&plan.thread);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                format!(
                    "cannot create the thread's directory {}: {e}",
                    dir.display()
                )
            })?;
        Ok(dir)
    }

    async fn on_start(&self) {
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
    async fn due_pass(self: &Arc<Self>, host: &Host) {
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

    /// One outbox pass; returns when the next failed event may be delivered again.
    async fn outbox_pass(&self, host: &Host) -> Option<Timestamp> {
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

fn plugin_error(e: &PluginError) -> String {
    match e {
        PluginError::Storage(m) => format!("storage: {m}"),
        PluginError::Dependency(m) => format!("dependency: {m}"),
        PluginError::InvalidInput(m) => format!("invalid-input: {m}"),
    }
}

/// `outcome` with `token` taken out of its failure message: an agent's error text (the
/// end of its stderr, say) may echo the route token it was given, and the core stores it.
fn redacted(mut outcome: TurnOutcome, token: &str) -> TurnOutcome {
    if let pooler_core::TurnResult::Failed { failure, .. } = &mut outcome.result
        && let Some(message) = failure.message.as_mut()
        && token.len() >= 8
    {
        *message = message.replace(token, "[redacted]");
    }
    outcome
}

/// A running turn's request and the sender that stops it with a reason.
type StopHandle = (RequestId, watch::Sender<Option<String>>);

/// Resolves with the reason once the turn is asked to stop.
async fn stop_reason(stopped: &mut watch::Receiver<Option<String>>) -> String {
    let why = stopped
        .wait_for(Option::is_some)
        .await
        .map(|why| why.clone().unwrap_or_default());
    match why {
        Ok(why) => why,
        // The sender lives in the running map until the turn ends.
        Err(_) => std::future::pending().await,
    }
}

/// The outcome of a turn stopped by a person (cancel, archive): a failure of the host's own
/// (`unknown`, origin `transport`), which Provider Retry does not retry.
fn stopped_outcome(why: &str) -> TurnOutcome {
    TurnOutcome::failed(pooler_core::Failure {
        category: pooler_core::FailureCategory::Unknown,
        provider_code: None,
        http_status: None,
        origin: pooler_core::FailureOrigin::Transport,
        retry_after: None,
        message: Some(why.to_string()),
    })
}

/// The outcome of a turn that could not be sent at all.
fn unroutable(why: &str) -> TurnOutcome {
    TurnOutcome::failed(pooler_core::Failure {
        category: pooler_core::FailureCategory::ConnectionFailed,
        provider_code: None,
        http_status: None,
        origin: pooler_core::FailureOrigin::Transport,
        retry_after: None,
        message: Some(why.to_string()),
    })
}

async fn due_loop(inner: Arc<Inner>) {
    let mut rx = inner.signals.subscribe();
    // Turns go through the listener, so nothing is dispatched before it exists.
    if !wait_until(&mut rx, |a| a.listening).await {
        return;
    }
    // The contract: on-start before the first due check.
    inner.on_start().await;
    inner.signals.modify(|a| {
        a.started = true;
        a.due_dirty = true;
        a.outbox_dirty = true;
    });
    let clock = inner.core.clock().clone();
    // When the last pass began (the first pass is already asked for by `due_dirty`).
    let mut passed_at = clock.now_ms();
    loop {
        // A send time the last pass already saw belongs to a row that was not claimable
        // (its thread runs a turn); the turn's end pokes the loop, so it is not slept for.
        // A later one is, even if the clock has passed it since (a timer for the past
        // fires at once): filtering by the current time would strand a row that came due
        // between the pass and this line.
        let next = match inner.core.next_due_at() {
            Ok(next) => next.filter(|t| *t > passed_at),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the queue; looking again in 60 s");
                Some(clock.now_ms() + 60_000)
            }
        };
        // `due_busy` stays set from the pass until its timer is armed here: in between,
        // `settled` must not see an idle loop while a future row exists (a clock moved past
        // that row would then go unnoticed by a test waiting for it).
        inner.signals.modify(|a| {
            a.due_next = next;
            a.due_busy = false;
        });
        let timer = async {
            match next {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            woke = wait_until(&mut rx, |a| a.due_dirty) => if !woke { return },
            _ = timer => {}
        }
        // Both may be ready at once (a clock move and a shutdown): closing wins.
        if inner.signals.is_closed() {
            return;
        }
        inner.signals.modify(|a| {
            a.due_dirty = false;
            a.due_busy = true;
            a.due_next = None;
        });
        passed_at = clock.now_ms();
        if let Ok(host) = inner.host() {
            inner.due_pass(&host).await;
        }
        // `due_busy` is cleared when the next timer is armed, at the top of the loop.
    }
}

async fn outbox_loop(inner: Arc<Inner>) {
    let mut rx = inner.signals.subscribe();
    if !wait_until(&mut rx, |a| a.started).await {
        return;
    }
    let clock = inner.core.clock().clone();
    let mut next_retry: Option<Timestamp> = None;
    loop {
        inner.signals.modify(|a| a.outbox_next = next_retry);
        let timer = async {
            match next_retry {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            woke = wait_until(&mut rx, |a| a.outbox_dirty) => if !woke { return },
            _ = timer => {}
        }
        if inner.signals.is_closed() {
            return;
        }
        inner.signals.modify(|a| {
            a.outbox_dirty = false;
            a.outbox_busy = true;
            a.outbox_next = None;
        });
        next_retry = match inner.host() {
            Ok(host) if host.has_role(Role::ProviderRetry) => inner.outbox_pass(&host).await,
            _ => None,
        };
        inner.signals.modify(|a| {
            a.outbox_busy = false;
            // Armed in the same step, so `settled` never sees an idle loop that still has a
            // redelivery to wait for.
            a.outbox_next = next_retry;
            // An immediate redelivery is due now: look again at once.
            if next_retry.is_some_and(|at| at <= clock.now_ms()) {
                a.outbox_dirty = true;
            }
        });
    }
}

async fn tick_loop(inner: Arc<Inner>) {
    let step = u64::try_from(inner.options.retry_tick.as_millis()).unwrap_or(u64::MAX);
    let mut rx = inner.signals.subscribe();
    if step == 0 || !wait_until(&mut rx, |a| a.started).await {
        return;
    }
    if inner
        .host()
        .map_or(true, |host| !host.has_role(Role::ProviderRetry))
    {
        return;
    }
    let clock = inner.core.clock().clone();
    let mut next = clock.now_ms().saturating_add(step);
    loop {
        inner.signals.modify(|a| a.tick_next = Some(next));
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = closed(inner.signals.subscribe()) => return,
        }
        if inner.signals.is_closed() {
            return;
        }
        let Ok(host) = inner.host() else { return };
        inner.signals.modify(|a| a.tick_busy = true);
        let now = clock.now_ms();
        let answer = host
            .call_retry("scheduler.on-tick", move |store, retry| {
                Box::pin(retry.pooler_plugins_scheduler().call_on_tick(store, now))
            })
            .await;
        drop(host);
        inner.signals.modify(|a| a.tick_busy = false);
        match answer {
            Ok(Ok(())) => tracing::debug!(plugin = SUBSCRIBER, now, "on-tick done"),
            Ok(Err(e)) => {
                tracing::warn!(plugin = SUBSCRIBER, error = ?e, "on-tick answered an error")
            }
            Err(_) => {} // logged by the runtime
        }
        // The next tick is one interval after this one was due; a clock that jumped far
        // ahead gets one tick, not a burst.
        next = next.saturating_add(step).max(now.saturating_add(1));
    }
}

impl Host {
    /// The core linked to this host, when it runs with one ([`CoreLink::attach`]).
    pub fn core(&self) -> Option<&Arc<CoreLink>> {
        self.shared.core.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_needs_start_no_pending_or_running_work_and_no_due_timer() {
        let now = 1_000;
        let mut a = Activity::default();
        assert!(!a.idle_at(now), "not started");
        a.started = true;
        a.due_next = Some(now + 1);
        a.outbox_next = Some(now + 1);
        a.tick_next = Some(now + 1);
        assert!(a.idle_at(now));
        for set in [
            |a: &mut Activity| a.due_dirty = true,
            |a: &mut Activity| a.due_busy = true,
            |a: &mut Activity| a.outbox_dirty = true,
            |a: &mut Activity| a.outbox_busy = true,
            |a: &mut Activity| a.tick_busy = true,
            |a: &mut Activity| a.turns = 1,
            |a: &mut Activity| a.due_next = Some(1_000),
            |a: &mut Activity| a.outbox_next = Some(999),
            |a: &mut Activity| a.tick_next = Some(1_000),
        ] {
            let mut b = a.clone();
            set(&mut b);
            assert!(!b.idle_at(now), "{b:?}");
        }
    }

    /// A row scheduled or moved wakes the due loop only when its armed timer would fire
    /// too late for it, or when no timer is armed (idle with no future row, or a pass
    /// running that may already have read the queue).
    #[test]
    fn a_row_wakes_the_due_loop_only_before_its_armed_timer() {
        let signals = Signals(watch::Sender::new(Activity::default()));
        let mut rx = signals.0.subscribe();
        let armed = |next: Option<Timestamp>, busy: bool| {
            signals.modify(|a| {
                a.due_next = next;
                a.due_busy = busy;
                a.due_dirty = false;
            });
        };
        let woke = |rx: &mut watch::Receiver<Activity>| {
            let changed = rx.has_changed().unwrap();
            let dirty = rx.borrow_and_update().due_dirty;
            assert_eq!(
                changed, dirty,
                "a watcher is notified exactly when the loop must look"
            );
            dirty
        };
        armed(Some(5_000), false);
        rx.borrow_and_update();
        signals.due_at(5_000);
        assert!(!woke(&mut rx), "the timer at 5 s sees a row at 5 s");
        signals.due_at(9_000);
        assert!(!woke(&mut rx), "nor one later");
        signals.due_at(4_999);
        assert!(woke(&mut rx), "an earlier row wakes the loop");
        signals.due_at(1_000);
        assert!(
            !rx.has_changed().unwrap(),
            "already woken: no second notification"
        );
        armed(None, false);
        rx.borrow_and_update();
        signals.due_at(9_000);
        assert!(woke(&mut rx), "no timer armed: the loop sleeps until woken");
        armed(Some(5_000), true);
        rx.borrow_and_update();
        signals.due_at(9_000);
        assert!(
            woke(&mut rx),
            "a pass is running and may have read the queue already"
        );
    }

    #[test]
    fn an_agents_failure_text_never_keeps_the_route_token() {
        let token = "route-token-0123456789";
        let outcome = redacted(
            unroutable(&format!("claude: invalid token {token} (401)")),
            token,
        );
        match outcome.result {
            pooler_core::TurnResult::Failed { failure, .. } => assert_eq!(
                failure.message.as_deref(),
                Some("claude: invalid token [redacted] (401)")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unroutable_turn_fails_as_a_transport_failure() {
        let outcome = unroutable("no route");
        match outcome.result {
            pooler_core::TurnResult::Failed { failure, .. } => {
                assert_eq!(
                    failure.category,
                    pooler_core::FailureCategory::ConnectionFailed
                );
                assert_eq!(failure.origin, pooler_core::FailureOrigin::Transport);
            }
            other => panic!("{other:?}"),
        }
    }
}
