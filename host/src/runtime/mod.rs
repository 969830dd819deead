//! The host runtime: loads each role's component (embedded or from a file), checks its
//! world, pre-instantiates it once (`load.rs`), and runs every plugin call and HTTP request
//! in a fresh `Store` with a deadline and a memory cap; calls into Provider Retry are made
//! one at a time.
//!
//! [`Host`] is the handle everything else holds, and every method of it is here. Where a
//! method's work belongs to another part of the host it delegates in a line: availability
//! queries and the start-up wiring to [`crate::mediation::mediator`] (which builds the
//! mediation and hands it to `Host::assemble`, so this module never names the mediator's
//! types), the maintenance calls to `mediation::maintenance`, the alerts' looks to
//! [`crate::mediation::alerts`], and incoming requests to [`crate::operate::http_in`].

pub mod allocator;
pub mod bindings;
pub mod data_lock;
pub mod embedded;
pub mod engine;
pub mod imports;
mod load;
pub mod roles;
pub mod state;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Body;
use hyper::{Request, Response};
use pooler_core::clock::SharedClock;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::config::Config;
use crate::mediation::{alerts, maintenance, mediator};
use crate::operate::http_in;
use crate::runtime::bindings::pool::AccountPool;
use crate::runtime::bindings::retry::{ProviderRetry, ProviderRetryPre};
use crate::runtime::bindings::types::{Availability, PluginError};
use crate::runtime::engine::EPOCH_TICK;
use crate::runtime::imports::availability::{AvailabilityQuery, AvailabilitySource};
use crate::runtime::imports::listener::ChangeSink;
use crate::runtime::imports::threads::ThreadsService;
use crate::runtime::roles::Role;
use crate::runtime::state::{PluginMeta, PluginState, Services};
use load::{Instantiate, Loaded, PoolPre};

/// What the host needs to start.
pub struct HostOptions {
    /// Which component fills each role, and each plugin's limits and allowed hosts.
    pub config: Config,
    /// The data directory; plugins' databases live under `plugins/`.
    pub data_dir: PathBuf,
    /// The host clock (manual in tests).
    pub clock: SharedClock,
    /// What answers the `threads` import.
    pub threads: Arc<dyn ThreadsService>,
    /// The compile cache (precompiled components, see [`crate::runtime::engine`]), which
    /// any number of data directories and processes may share; `None` compiles on every
    /// start.
    pub cache_dir: Option<PathBuf>,
    /// `Some` makes a run repeat exactly: every random number a plugin draws (WASI random)
    /// comes from generators seeded with this, and a guest is never made to yield to other
    /// tasks midway on its CPU ticks (when it yields would depend on real time). For the week
    /// simulator, on a single-threaded runtime with a virtual clock. `None` (every server):
    /// the operating system's random source, and busy guests yield.
    pub seed: Option<u64>,
}

/// Why a call into a plugin failed. The plugin's next call starts from a fresh instance.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The role has no component loaded: nothing was called.
    #[error("no plugin fills the {0} role")]
    NoPlugin(Role),
    /// The guest trapped (or a host import failed it); `reason` is the root cause in one line.
    #[error("plugin `{plugin}` trapped in `{call}`: {reason}")]
    Trap {
        /// The plugin's id (its role's name).
        plugin: String,
        /// The export called, `interface.function`.
        call: String,
        /// The trap's root cause.
        reason: String,
    },
    /// The call spent its CPU budget or outlived its wall-clock deadline and was stopped.
    #[error(
        "plugin `{plugin}` ran past its deadline of {deadline_ms} ms in `{call}` and was stopped"
    )]
    Deadline {
        /// The plugin's id (its role's name).
        plugin: String,
        /// The export called, `interface.function`.
        call: String,
        /// The role's `deadline-ms`.
        deadline_ms: u128,
    },
    /// The call returned, with an error the plugin may not answer next time (`storage`,
    /// `dependency`): worth calling again later.
    #[error("plugin `{plugin}` answered a transient error in `{call}`: {reason}")]
    Transient {
        /// The plugin's id (its role's name).
        plugin: String,
        /// The export called, `interface.function`.
        call: String,
        /// The plugin's error text.
        reason: String,
    },
    /// A fresh instance could not be made (out of instance slots or memory, a start
    /// function that trapped): the export was not called.
    #[error("plugin `{plugin}` could not be instantiated for `{call}`: {reason}")]
    Instantiate {
        /// The plugin's id (its role's name).
        plugin: String,
        /// The export that was to be called, `interface.function`.
        call: String,
        /// Why instantiation failed, with its whole chain.
        reason: String,
    },
}

/// The marker error the epoch callback raises when a guest's CPU budget is spent.
#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// A call made on a fresh instance: borrows the store and the world's bindings.
pub type CallFuture<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 'a>>;

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) config: Config,
    pub(crate) data_dir: PathBuf,
    pub(crate) clock: SharedClock,
    pub(crate) services: Services,
    pub(crate) pool: Option<Loaded<PoolPre>>,
    pub(crate) retry: Option<Loaded<ProviderRetryPre<PluginState>>>,
    pub(crate) mediation: Arc<dyn Mediation>,
    /// The routes whose answers the listener records (agent turns running).
    pub(crate) taps: Arc<crate::operate::tap::Taps>,
    /// Alerts to a person (`[alerts]`).
    pub(crate) alerts: Arc<crate::mediation::alerts::Alerts>,
    /// Stops the alerts' delivery task when the host goes.
    pub(crate) alerts_stop: tokio::sync::watch::Sender<bool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.mediation.close();
        self.alerts_stop.send_replace(true);
    }
}

/// The host's handle on the mediation between plugins (the mediator's change queue):
/// stop delivering when the host goes, and say when every change signalled so far has been
/// delivered.
pub(crate) trait Mediation: Send + Sync {
    fn close(&self);
    fn settled(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The mediation a new host's stores are wired to, built by the mediator from the host's
/// weak handle (stores must not keep the host alive).
pub(crate) struct Wiring {
    pub(crate) availability: Arc<dyn AvailabilitySource>,
    pub(crate) changes: Arc<dyn ChangeSink>,
    pub(crate) mediation: Arc<dyn Mediation>,
}

/// The running host. Cheap to clone.
#[derive(Clone)]
pub struct Host {
    pub(crate) shared: Arc<Shared>,
}

impl Host {
    /// Load every configured role and start the host's background work (the epoch ticker,
    /// the availability-change delivery, the alerts' delivery). Must be called inside a
    /// tokio runtime.
    pub fn new(options: HostOptions) -> anyhow::Result<Host> {
        mediator::start(options)
    }

    /// Load every configured role, start the epoch ticker, and wire the stores to the
    /// mediation `wire` builds ([`crate::mediation::mediator::start`] is the one caller).
    pub(crate) fn assemble(
        options: HostOptions,
        wire: impl FnOnce(&Weak<Shared>) -> Wiring,
    ) -> anyhow::Result<Host> {
        load::assemble(options, wire).map(|shared| Host { shared })
    }

    /// The host's metrics: what `GET /metrics` serves, added to by the host and the plugins.
    pub fn metrics(&self) -> &Arc<crate::operate::metrics::Registry> {
        &self.shared.services.metrics
    }

    /// The routes whose answers the listener records while agent turns run.
    pub fn taps(&self) -> &Arc<crate::operate::tap::Taps> {
        &self.shared.taps
    }

    /// Whether a plugin fills `role`.
    pub fn has_role(&self, role: Role) -> bool {
        match role {
            Role::AccountPool => self.shared.pool.is_some(),
            Role::ProviderRetry => self.shared.retry.is_some(),
        }
    }

    /// The configuration the host was started with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The data directory; each plugin's databases and grants file are under `plugins/<id>/`.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.shared.data_dir
    }

    /// The host clock: the time plugins see, and what times maintenance and alerts.
    pub fn clock(&self) -> &SharedClock {
        &self.shared.clock
    }

    /// Where `role`'s component came from, when one is loaded.
    pub fn plugin_source(&self, role: Role) -> Option<String> {
        match role {
            Role::AccountPool => self.shared.pool.as_ref().map(|p| p.meta.source.clone()),
            Role::ProviderRetry => self.shared.retry.as_ref().map(|p| p.meta.source.clone()),
        }
    }

    /// A person set `role`'s setting `key` to `value`: if it is an http(s) URL, the plugin
    /// may reach its scheme, host and port from now on (kept across restarts), instead of
    /// whatever the setting's earlier value granted; any other value revokes the setting's
    /// grant. Answers what the setting grants now.
    pub fn set_grant(
        &self,
        role: Role,
        key: &str,
        value: &str,
    ) -> anyhow::Result<Option<crate::runtime::imports::http_out::allow::Origin>> {
        let meta = match role {
            Role::AccountPool => self.shared.pool.as_ref().map(|p| &p.meta),
            Role::ProviderRetry => self.shared.retry.as_ref().map(|p| &p.meta),
        };
        match meta {
            Some(meta) => meta.allow.set_grant(key, value),
            None => Ok(None),
        }
    }

    /// A fresh store for one call or request of `meta`'s plugin, with its memory cap and a
    /// CPU budget of `meta.deadline`: the epoch callback runs once per tick while the guest
    /// executes (not while it waits on I/O), so counting callbacks counts CPU time, and the
    /// guest's SQL statements spend the same budget (`imports/sqlite/bounds.rs`); on each
    /// one the guest also yields to the runtime, so a busy guest cannot hog a worker
    /// (except inside a database transaction, where yielding would keep a lock held).
    pub(crate) fn new_store(&self, meta: &Arc<PluginMeta>) -> Store<PluginState> {
        let mut store = Store::new(
            &self.shared.engine,
            PluginState::new(meta.clone(), &self.shared.services),
        );
        store.limiter(|state| &mut state.limits);
        // The budget (whole ticks of `meta.deadline`) is the store's, in its sqlite state:
        // the guest's statements spend it too (`imports/sqlite/bounds.rs`).
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut ctx| {
            if !ctx.data_mut().sqlite.budget_mut().take_tick(EPOCH_TICK) {
                return Err(wasmtime::Error::new(DeadlineExceeded));
            }
            // A guest inside a database transaction may hold the write lock: parked behind
            // other tasks it would keep every other instance of its plugin waiting. A
            // repeatable run never yields here: where a tick falls depends on real time.
            if ctx.data().sqlite.in_transaction() || ctx.data().repeatable() {
                return Ok(UpdateDeadline::Continue(1));
            }
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }

    /// Describe a failed call, and log it with the plugin's id. A trap's description
    /// names its cause in one line (it reaches HTTP clients and admin callers); the log
    /// also has the whole error, with the guest's backtrace.
    pub(crate) fn call_error(meta: &PluginMeta, call: &str, error: wasmtime::Error) -> CallError {
        let err = if error.downcast_ref::<DeadlineExceeded>().is_some() {
            CallError::Deadline {
                plugin: meta.id.to_string(),
                call: call.to_string(),
                deadline_ms: meta.deadline.as_millis(),
            }
        } else {
            CallError::Trap {
                plugin: meta.id.to_string(),
                call: call.to_string(),
                reason: error.root_cause().to_string(),
            }
        };
        tracing::error!(
            plugin = &*meta.id,
            call,
            error = %err,
            detail = %format!("{error:#}"),
            "plugin call failed"
        );
        err
    }

    /// Run `f` on a fresh instance of `plugin`, within its deadline (CPU and wall time).
    async fn call<P, R>(
        &self,
        plugin: &Loaded<P>,
        call: &str,
        f: impl for<'a> FnOnce(&'a mut Store<PluginState>, &'a P::Bindings) -> CallFuture<'a, R> + Send,
    ) -> Result<R, CallError>
    where
        P: Instantiate,
        R: Send,
    {
        let _turn = match &plugin.serial {
            Some(serial) => Some(serial.lock().await),
            None => None,
        };
        let meta = &plugin.meta;
        let mut store = self.new_store(meta);
        let instance = match tokio::time::timeout(
            meta.deadline,
            Instantiate::instantiate(&plugin.pre, &mut store),
        )
        .await
        {
            Ok(Ok(instance)) => instance,
            Ok(Err(e)) => {
                let err = CallError::Instantiate {
                    plugin: meta.id.to_string(),
                    call: call.to_string(),
                    reason: format!("{e:#}"),
                };
                tracing::error!(plugin = &*meta.id, call, error = %err, "plugin instantiation failed");
                return Err(err);
            }
            Err(_) => {
                return Err(Self::call_error(
                    meta,
                    call,
                    wasmtime::Error::new(DeadlineExceeded),
                ));
            }
        };
        // The call's statements end by the same wall-clock deadline as the call: the
        // timeout below cannot fire while one runs on this worker.
        store
            .data_mut()
            .sqlite
            .budget_mut()
            .set_wall_deadline(std::time::Instant::now() + meta.deadline);
        let outcome = tokio::time::timeout(meta.deadline, f(&mut store, &instance)).await;
        drop(instance);
        // Dropping the store hands the changes the call signalled to the delivery queue:
        // only now, after the call returned.
        drop(store);
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(Self::call_error(meta, call, e)),
            Err(_) => Err(Self::call_error(
                meta,
                call,
                wasmtime::Error::new(DeadlineExceeded),
            )),
        }
    }

    /// Call the plugin in the account-pool role on a fresh instance.
    pub async fn call_pool<R: Send>(
        &self,
        call: &str,
        f: impl for<'a> FnOnce(&'a mut Store<PluginState>, &'a AccountPool) -> CallFuture<'a, R> + Send,
    ) -> Result<R, CallError> {
        let plugin = self
            .shared
            .pool
            .as_ref()
            .ok_or(CallError::NoPlugin(Role::AccountPool))?;
        self.call(plugin, call, f).await
    }

    /// Call the plugin in the provider-retry role on a fresh instance, after the calls
    /// queued before this one (the role takes one call at a time).
    pub async fn call_retry<R: Send>(
        &self,
        call: &str,
        f: impl for<'a> FnOnce(&'a mut Store<PluginState>, &'a ProviderRetry) -> CallFuture<'a, R>
        + Send,
    ) -> Result<R, CallError> {
        let plugin = self
            .shared
            .retry
            .as_ref()
            .ok_or(CallError::NoPlugin(Role::ProviderRetry))?;
        self.call(plugin, call, f).await
    }

    /// Hand one HTTP request to a fresh instance of the pool and return its response as soon
    /// as the guest sets it; the body streams while the guest keeps writing
    /// ([`crate::operate::http_in`]).
    pub async fn handle_http<B>(&self, req: Request<B>) -> Response<HyperOutgoingBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<wasmtime_wasi_http::Error>,
    {
        http_in::handle(self, req).await
    }

    /// Answer an availability query from `caller` through a fresh instance of the pool
    /// ([`crate::mediation::mediator`]).
    pub async fn query_availability(&self, caller: &str, query: AvailabilityQuery) -> Availability {
        mediator::query(self, caller, query).await
    }

    /// Answer several availability queries from `caller` with one call into a fresh
    /// instance of the pool (`availability.query-many`): one answer per query, in order.
    pub async fn query_availability_many(
        &self,
        caller: &str,
        queries: Vec<AvailabilityQuery>,
    ) -> Vec<Availability> {
        mediator::query_many(self, caller, queries).await
    }

    /// Resolves when every availability change signalled so far has been delivered (or
    /// there is no listener to deliver it to).
    pub async fn availability_changes_settled(&self) {
        self.shared.mediation.settled().await;
    }

    /// Call the pool's maintenance tick now and then every `interval`, until the returned
    /// future is dropped. Does nothing without a pool or with a zero interval.
    pub async fn run_maintenance(self, interval: Duration) {
        maintenance::run(self, interval).await;
    }

    /// Tell the pool the host started (`maintenance.on-start`), once, before serving: it
    /// drops what calls of a host that stopped held. A failure is logged and the host
    /// serves anyway (the pool only loses that cleanup). Nothing without a pool.
    pub async fn start_pool(&self) {
        maintenance::start(self).await;
    }

    /// The pool's `maintenance.on-start(now)`: once per start, before the server serves.
    pub async fn maintenance_start(&self, now: u64) -> Result<Result<(), PluginError>, CallError> {
        maintenance::on_start(self, now).await
    }

    /// The pool's `maintenance.on-tick(now)`.
    pub async fn maintenance_tick(&self, now: u64) -> Result<Result<(), PluginError>, CallError> {
        maintenance::on_tick(self, now).await
    }

    /// The host's alerts.
    pub fn alerts(&self) -> &Arc<alerts::Alerts> {
        &self.shared.alerts
    }

    /// Look at the accounts and threads now and announce what started or ended. A source
    /// that cannot be read is skipped (its episodes stay as they were).
    pub async fn check_alerts(&self) {
        alerts::watch::check(self).await;
    }

    /// Look at the accounts and threads every `interval` of the host clock, and soon after
    /// each availability change or failed turn (at most one look per
    /// `MIN_LOOK_GAP_MS` and twenty times the last look's duration), until
    /// the returned future is dropped.
    pub async fn run_alerts(self, interval: Duration) {
        alerts::watch::run(self, interval).await;
    }
}
