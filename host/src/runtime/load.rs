//! Loading the roles' components and assembling a new host: one linker holding every import,
//! each role's component compiled (or taken from the compile cache), checked against its
//! role's world and pre-instantiated, and the state every store of the host shares.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context;
use wasmtime::component::Linker;
use wasmtime::{Engine, Store};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use super::{HostOptions, Shared, Wiring};
use crate::config::{ComponentSource, Config};
use crate::runtime::bindings::pool::{AccountPool, AccountPoolPre};
use crate::runtime::bindings::retry::{ProviderRetry, ProviderRetryPre};
use crate::runtime::engine::{self, EngineLimits};
use crate::runtime::imports::clocks::ClockView;
use crate::runtime::imports::http_out::allow::AllowList;
use crate::runtime::imports::http_out::client::OutgoingClient;
use crate::runtime::imports::incoming_client::IncomingClientView;
use crate::runtime::imports::sqlite::SqliteView;
use crate::runtime::imports::{
    availability, clocks, incoming_client, listener, log, metrics, sqlite, threads,
};
use crate::runtime::roles::{Role, Surface, check_world};
use crate::runtime::state::{PluginMeta, PluginState, Services};

/// Instances that may be alive at once (requests in flight plus plugin calls).
const MAX_INSTANCES: u32 = 500;

/// A role's component, loaded and pre-instantiated.
pub(crate) struct Loaded<P> {
    pub(crate) meta: Arc<PluginMeta>,
    pub(crate) pre: P,
    /// Held for the whole of each call when the role takes one call at a time.
    pub(super) serial: Option<tokio::sync::Mutex<()>>,
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

/// The file in a plugin's directory that keeps the hosts a person allowed it by setting a
/// URL (see [`AllowList`]). Not a database name, so the plugin cannot open it.
const GRANTS_FILE: &str = "allowed-hosts";

fn linker(engine: &Engine) -> anyhow::Result<Linker<PluginState>> {
    let mut linker = Linker::<PluginState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    // Replace wasmtime-wasi's monotonic clock with one over the host clock.
    linker.allow_shadowing(true);
    clocks::add_to_linker(&mut linker, |s| ClockView {
        clock: &s.clock,
        table: &mut s.table,
    })?;
    linker.allow_shadowing(false);
    crate::runtime::bindings::pool::pooler::plugins::types::add_to_linker::<
        PluginState,
        wasmtime::component::HasSelf<PluginState>,
    >(&mut linker, |s| s)?;
    sqlite::add_to_linker(&mut linker, |s| SqliteView {
        ctx: &mut s.sqlite,
        table: &mut s.table,
    })?;
    log::add_to_linker(&mut linker, |s| &mut s.log)?;
    metrics::add_to_linker(&mut linker, |s| &mut s.metrics)?;
    listener::add_to_linker(&mut linker, |s| &mut s.listener)?;
    availability::add_to_linker(&mut linker, |s| &mut s.availability)?;
    threads::add_to_linker(&mut linker, |s| &mut s.threads)?;
    incoming_client::add_to_linker(&mut linker, |s| IncomingClientView {
        ctx: &s.incoming_client,
        table: &mut s.table,
    })?;
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
        .map_err(anyhow::Error::from)
        .with_context(|| {
            format!("plugin `{id}` ({source}) cannot be linked against the host's imports")
        })?;
    let pre = typed(pre).map_err(anyhow::Error::from).with_context(|| {
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

/// Load every configured role, start the epoch ticker, and build the state the host's stores
/// share, wired to the mediation `wire` builds ([`super::Host::assemble`]).
pub(super) fn assemble(
    options: HostOptions,
    wire: impl FnOnce(&Weak<Shared>) -> Wiring,
) -> anyhow::Result<Arc<Shared>> {
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
    crate::runtime::imports::sqlite::ConnectionCache::spawn_checkpoints(&databases, seed.is_some());
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
    Ok(shared)
}
