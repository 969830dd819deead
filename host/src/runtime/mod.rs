//! The host runtime: loads each role's component (embedded or from a file), checks its
//! world, pre-instantiates it once, and runs every plugin call and HTTP request in a fresh
//! `Store` with a deadline and a memory cap; calls into Provider Retry are made one at a
//! time. What passes between plugins (availability queries and changes) is
//! [`crate::mediation::mediator`]'s: its `Host::new` builds the mediation and hands it to
//! [`Host::assemble`] here, which only wires it into the stores (so this module never
//! names the mediator's types).

pub mod allocator;
pub mod bindings;
pub mod data_lock;
pub mod embedded;
pub mod engine;
pub mod imports;
pub mod roles;
pub mod state;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context;
use pooler_core::clock::SharedClock;
use wasmtime::component::Linker;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use crate::config::{ComponentSource, Config};
use crate::runtime::bindings::pool::{AccountPool, AccountPoolPre};
use crate::runtime::bindings::retry::{ProviderRetry, ProviderRetryPre};
use crate::runtime::engine::{EPOCH_TICK, EngineLimits};
use crate::runtime::imports::availability::AvailabilitySource;
use crate::runtime::imports::clocks::ClockView;
use crate::runtime::imports::http_out::{AllowList, OutgoingClient};
use crate::runtime::imports::incoming_client::IncomingClientView;
use crate::runtime::imports::listener::ChangeSink;
use crate::runtime::imports::sqlite::SqliteView;
use crate::runtime::imports::threads::ThreadsService;
use crate::runtime::imports::{
    availability, clocks, incoming_client, listener, log, metrics, sqlite, threads,
};
use crate::runtime::roles::{Role, Surface, check_world};
use crate::runtime::state::{PluginMeta, PluginState, Services};

/// Instances that may be alive at once (requests in flight plus plugin calls).
const MAX_INSTANCES: u32 = 500;

/// What the host needs to start.
pub struct HostOptions {
    pub config: Config,
    /// The data directory; plugins' databases live under `plugins/`.
    pub data_dir: PathBuf,
    /// The host clock (manual in tests).
    pub clock: SharedClock,
    /// What answers the `threads` import.
    pub threads: Arc<dyn ThreadsService>,
    /// The compile cache (precompiled components, see [`crate::runtime::engine`]), which any number
    /// of data directories and processes may share; `None` compiles on every start.
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
    #[error("no plugin fills the {0} role")]
    NoPlugin(Role),
    #[error("plugin `{plugin}` trapped in `{call}`: {reason}")]
    Trap {
        plugin: String,
        call: String,
        reason: String,
    },
    #[error(
        "plugin `{plugin}` ran past its deadline of {deadline_ms} ms in `{call}` and was stopped"
    )]
    Deadline {
        plugin: String,
        call: String,
        deadline_ms: u128,
    },
    #[error("plugin `{plugin}` answered a transient error in `{call}`: {reason}")]
    Transient {
        plugin: String,
        call: String,
        reason: String,
    },
    #[error("plugin `{plugin}` could not be instantiated for `{call}`: {reason}")]
    Instantiate {
        plugin: String,
        call: String,
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

/// A role's component, loaded and pre-instantiated.
pub(crate) struct Loaded<P> {
    pub(crate) meta: Arc<PluginMeta>,
    pub(crate) pre: P,
    /// Held for the whole of each call when the role takes one call at a time.
    serial: Option<tokio::sync::Mutex<()>>,
}

/// Instantiation of a role's world bindings from its pre-instantiated component.
pub trait Instantiate: Send + Sync + 'static {
    type Bindings: Send + Sync + 'static;
    fn instantiate<'a>(
        &'a self,
        store: &'a mut Store<PluginState>,
    ) -> Pin<Box<dyn Future<Output = wasmtime::Result<Self::Bindings>> + Send + 'a>>;
}

/// The pool's component, pre-instantiated twice over: with its whole world's bindings (for
/// the plugin calls), and with only `wasi:http/incoming-handler`'s (for the HTTP path).
/// Instantiating through the world's bindings looks up and type-checks every export of
/// every interface on each instantiation; a request needs one function.
pub(crate) struct PoolPre {
    world: AccountPoolPre<PluginState>,
    pub(crate) http: ProxyPre<PluginState>,
}

impl PoolPre {
    fn new(pre: wasmtime::component::InstancePre<PluginState>) -> wasmtime::Result<Self> {
        Ok(PoolPre {
            http: ProxyPre::new(pre.clone())?,
            world: AccountPoolPre::new(pre)?,
        })
    }
}

impl Instantiate for PoolPre {
    type Bindings = AccountPool;
    fn instantiate<'a>(
        &'a self,
        store: &'a mut Store<PluginState>,
    ) -> Pin<Box<dyn Future<Output = wasmtime::Result<AccountPool>> + Send + 'a>> {
        Box::pin(self.world.instantiate_async(store))
    }
}

impl Instantiate for ProviderRetryPre<PluginState> {
    type Bindings = ProviderRetry;
    fn instantiate<'a>(
        &'a self,
        store: &'a mut Store<PluginState>,
    ) -> Pin<Box<dyn Future<Output = wasmtime::Result<ProviderRetry>> + Send + 'a>> {
        Box::pin(self.instantiate_async(store))
    }
}

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

/// The file in a plugin's directory that keeps the hosts a person allowed it by setting a
/// URL (see [`AllowList`]). Not a database name, so the plugin cannot open it.
const GRANTS_FILE: &str = "allowed-hosts";

/// The running host. Cheap to clone.
#[derive(Clone)]
pub struct Host {
    pub(crate) shared: Arc<Shared>,
}

fn linker(engine: &Engine) -> anyhow::Result<Linker<PluginState>> {
    let mut linker = Linker::<PluginState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(crate::wasmtime_error)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
        .map_err(crate::wasmtime_error)?;
    // Replace wasmtime-wasi's monotonic clock with one over the host clock.
    linker.allow_shadowing(true);
    clocks::add_to_linker(&mut linker, |s| ClockView {
        clock: &s.clock,
        table: &mut s.table,
    })
    .map_err(crate::wasmtime_error)?;
    linker.allow_shadowing(false);
    crate::runtime::bindings::pool::pooler::plugins::types::add_to_linker::<
        PluginState,
        wasmtime::component::HasSelf<PluginState>,
    >(&mut linker, |s| s)
    .map_err(crate::wasmtime_error)?;
    sqlite::add_to_linker(&mut linker, |s| SqliteView {
        ctx: &mut s.sqlite,
        table: &mut s.table,
    })
    .map_err(crate::wasmtime_error)?;
    log::add_to_linker(&mut linker, |s| &mut s.log).map_err(crate::wasmtime_error)?;
    metrics::add_to_linker(&mut linker, |s| &mut s.metrics).map_err(crate::wasmtime_error)?;
    listener::add_to_linker(&mut linker, |s| &mut s.listener).map_err(crate::wasmtime_error)?;
    availability::add_to_linker(&mut linker, |s| &mut s.availability)
        .map_err(crate::wasmtime_error)?;
    threads::add_to_linker(&mut linker, |s| &mut s.threads).map_err(crate::wasmtime_error)?;
    incoming_client::add_to_linker(&mut linker, |s| IncomingClientView {
        ctx: &s.incoming_client,
        table: &mut s.table,
    })
    .map_err(crate::wasmtime_error)?;
    Ok(linker)
}

impl crate::runtime::bindings::pool::pooler::plugins::types::Host for PluginState {}

/// The component bytes configured for `role`, and where they came from.
fn component_bytes(config: &Config, role: Role) -> anyhow::Result<Option<(Vec<u8>, String)>> {
    match config.plugin(role).component {
        ComponentSource::Embedded => Ok(crate::runtime::embedded::component(role)
            .map(|bytes| (bytes.to_vec(), "embedded".to_string()))),
        ComponentSource::File(path) => {
            let bytes = std::fs::read(&path)
                .with_context(|| format!("cannot read the {role} component {}", path.display()))?;
            Ok(Some((bytes, path.display().to_string())))
        }
        ComponentSource::None => Ok(None),
    }
}

/// Compile, check and pre-instantiate `role`'s component.
fn load<P>(
    engine: &Engine,
    linker: &Linker<PluginState>,
    config: &Config,
    data_dir: &std::path::Path,
    cache_dir: Option<&std::path::Path>,
    role: Role,
    typed: impl FnOnce(wasmtime::component::InstancePre<PluginState>) -> wasmtime::Result<P>,
) -> anyhow::Result<Option<Loaded<P>>> {
    let Some((bytes, source)) = component_bytes(config, role)? else {
        return Ok(None);
    };
    let id = role.name();
    let (component, cached) = engine::load_component(engine, &bytes, cache_dir)
        .with_context(|| format!("plugin `{id}` ({source}) is not a valid component"))?;
    let cache = match &cached {
        engine::CacheOutcome::Hit => "hit",
        engine::CacheOutcome::Compiled => "compiled",
        engine::CacheOutcome::Recompiled(_) => "recompiled",
        engine::CacheOutcome::Uncached(_) => "uncached",
    };
    check_world(id, role, &Surface::of(&component, engine))
        .with_context(|| format!("cannot load {source}"))?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(crate::wasmtime_error)
        .with_context(|| {
            format!("plugin `{id}` ({source}) cannot be linked against the host's imports")
        })?;
    let pre = typed(pre).map_err(crate::wasmtime_error).with_context(|| {
        format!(
            "plugin `{id}` ({source}) does not export the world {} correctly",
            role.world()
        )
    })?;
    let settings = config.plugin(role);
    // The plugin's directory and the one it is in, checked before anything in them is read:
    // another user's, or one others can write, is refused.
    let plugins = data_dir.join("plugins");
    let dir = plugins.join(id);
    for dir in [&plugins, &dir] {
        pooler_core::private_file::create_private_dir(dir)
            .with_context(|| format!("cannot use the plugin directory {}", dir.display()))?;
    }
    let meta = PluginMeta {
        id: Arc::from(id),
        role,
        source,
        deadline: Duration::from_millis(settings.deadline_ms),
        memory_bytes: usize::try_from(settings.memory_mib << 20).unwrap_or(usize::MAX),
        error_body_timeout: Duration::from_millis(settings.error_body_timeout_ms),
        allow: Arc::new(AllowList::with_grants(
            &config.allowed_hosts(role),
            dir.join(GRANTS_FILE),
        )?),
        dir,
    };
    tracing::info!(plugin = id, source = %meta.source, compile_cache = cache, "plugin loaded");
    Ok(Some(Loaded {
        meta: Arc::new(meta),
        pre,
        serial: (role == Role::ProviderRetry).then(|| tokio::sync::Mutex::new(())),
    }))
}

impl Host {
    /// Load every configured role, start the epoch ticker, and wire the stores to the
    /// mediation `wire` builds (`Host::new` in [`crate::mediation::mediator`] is the one caller).
    pub(crate) fn assemble(
        options: HostOptions,
        wire: impl FnOnce(&Weak<Shared>) -> Wiring,
    ) -> anyhow::Result<Host> {
        let HostOptions {
            config,
            data_dir,
            clock,
            threads,
            cache_dir,
            seed,
        } = options;
        pooler_core::private_file::create_private_dir(&data_dir)
            .with_context(|| format!("cannot use the data directory {}", data_dir.display()))?;
        let max_memory = Role::ALL
            .into_iter()
            .map(|role| config.plugin(role).memory_mib)
            .max()
            .unwrap_or(64);
        let engine = engine::build(EngineLimits {
            max_instances: MAX_INSTANCES,
            max_memory_bytes: usize::try_from(max_memory << 20).unwrap_or(usize::MAX),
        })?;
        engine::start_ticker(&engine)?;
        let linker = linker(&engine)?;
        let pool = load(
            &engine,
            &linker,
            &config,
            &data_dir,
            cache_dir.as_deref(),
            Role::AccountPool,
            PoolPre::new,
        )?;
        let retry = load(
            &engine,
            &linker,
            &config,
            &data_dir,
            cache_dir.as_deref(),
            Role::ProviderRetry,
            ProviderRetryPre::new,
        )?;
        let databases = crate::runtime::imports::sqlite::ConnectionCache::new();
        crate::runtime::imports::sqlite::ConnectionCache::spawn_checkpoints(
            &databases,
            seed.is_some(),
        );
        let client = OutgoingClient::new();
        let metrics: Arc<crate::operate::metrics::Registry> = Arc::default();
        let alerts = Arc::new(crate::mediation::alerts::Alerts::new(
            config.alerts.clone(),
            clock.clone(),
            metrics.clone(),
            client.clone(),
        ));
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let Wiring {
                availability,
                changes,
                mediation,
            } = wire(weak);
            Shared {
                engine,
                config,
                data_dir,
                clock: clock.clone(),
                services: Services {
                    clock,
                    client,
                    threads,
                    availability,
                    changes,
                    databases,
                    metrics,
                    seeds: seed.map(|seed| Arc::new(crate::runtime::state::Seeds::new(seed))),
                },
                pool,
                retry,
                mediation,
                taps: Arc::default(),
                alerts,
                alerts_stop: tokio::sync::watch::Sender::new(false),
            }
        });
        Ok(Host { shared })
    }

    /// The routes whose answers the listener records while agent turns run.
    /// The host's metrics: what `GET /metrics` serves, added to by the host and the plugins.
    pub fn metrics(&self) -> &Arc<crate::operate::metrics::Registry> {
        &self.shared.services.metrics
    }

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

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub fn data_dir(&self) -> &std::path::Path {
        &self.shared.data_dir
    }

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
    ) -> anyhow::Result<Option<crate::runtime::imports::http_out::Origin>> {
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
}
