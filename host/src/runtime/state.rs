//! What a `Store` holds: one instance's state for one HTTP request or one plugin call. Every
//! import's context lives here, built fresh per store, so nothing a guest does survives the
//! call except what it wrote to its databases.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pooler_core::clock::SharedClock;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::runtime::imports::availability::{AvailabilityCtx, AvailabilitySource};
use crate::runtime::imports::clocks::{MonotonicClock, WallClock};
use crate::runtime::imports::http_out::allow::AllowList;
use crate::runtime::imports::http_out::client::OutgoingClient;
use crate::runtime::imports::http_out::hook::OutgoingPolicy;
use crate::runtime::imports::incoming_client::IncomingClientCtx;
use crate::runtime::imports::listener::{ChangeSink, ListenerCtx};
use crate::runtime::imports::log::LogCtx;
use crate::runtime::imports::metrics::MetricsCtx;
use crate::runtime::imports::sqlite::{Budget, ConnectionCache, SqliteCtx};
use crate::runtime::imports::threads::{ThreadsCtx, ThreadsService};
use crate::runtime::roles::Role;

/// What the host knows about a loaded plugin, shared by all its stores.
#[derive(Debug)]
pub struct PluginMeta {
    /// The plugin's id: its role's name. Tags its log lines, names its data directory.
    pub id: Arc<str>,
    /// The role the plugin fills.
    pub role: Role,
    /// Where its component came from (`embedded` or a path), for messages.
    pub source: String,
    /// Its per-call deadline.
    pub deadline: Duration,
    /// Its memory cap per instance.
    pub memory_bytes: usize,
    /// Hosts it may send HTTP requests to.
    pub allow: Arc<AllowList>,
    /// How long a non-2xx answer's body may stall (`error-body-timeout-ms`).
    pub error_body_timeout: Duration,
    /// Its database directory, `DATA_DIR/plugins/<id>`.
    pub dir: PathBuf,
}

/// The host services every store reaches.
#[derive(Clone)]
pub struct Services {
    /// The host clock every store reads time from (wall and monotonic).
    pub clock: SharedClock,
    /// The client every plugin's outgoing HTTP goes through.
    pub client: OutgoingClient,
    /// What answers the `threads` import: the core, or
    /// [`crate::runtime::imports::threads::NoCore`] without one.
    pub threads: Arc<dyn ThreadsService>,
    /// What answers the `availability` import (a fresh pool instance).
    pub availability: Arc<dyn AvailabilitySource>,
    /// Where the availability changes a call signalled are queued for delivery.
    pub changes: Arc<dyn ChangeSink>,
    /// Plugin database connections between instances.
    pub databases: Arc<ConnectionCache>,
    /// The metrics registry (`metrics` import, `GET /metrics`).
    pub metrics: Arc<crate::operate::metrics::Registry>,
    /// Seeds for the stores' random generators, in a repeatable run
    /// ([`crate::runtime::HostOptions::seed`]); `None`: the operating system's.
    pub seeds: Option<Arc<Seeds>>,
}

/// The seeds of a repeatable run: each new store gets the next one, so the same sequence
/// of stores draws the same random numbers.
#[derive(Debug)]
pub struct Seeds {
    seed: u64,
    stores: std::sync::atomic::AtomicU64,
}

impl Seeds {
    /// Seeds derived from `seed`, one per store in the order the stores are made.
    pub fn new(seed: u64) -> Self {
        Seeds {
            seed,
            stores: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The seed of the next store.
    fn next(&self) -> u64 {
        let n = self
            .stores
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

/// The data of one `Store`.
pub struct PluginState {
    pub(crate) meta: Arc<PluginMeta>,
    pub(crate) table: ResourceTable,
    pub(crate) clock: SharedClock,
    pub(crate) limits: StoreLimits,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    outgoing: OutgoingPolicy,
    pub(crate) sqlite: SqliteCtx,
    pub(crate) log: LogCtx,
    pub(crate) metrics: MetricsCtx,
    pub(crate) listener: ListenerCtx,
    pub(crate) availability: AvailabilityCtx,
    pub(crate) threads: ThreadsCtx,
    /// The client of the HTTP request this store handles (none for a plugin call).
    pub(crate) incoming_client: IncomingClientCtx,
    /// A repeatable run ([`crate::runtime::HostOptions::seed`]).
    repeatable: bool,
}

impl PluginState {
    /// A fresh store's data for a plugin: no stdio, environment, sockets or preopened
    /// directories; the host's clocks; the plugin's allow-list and memory cap.
    pub fn new(meta: Arc<PluginMeta>, services: &Services) -> Self {
        let id = meta.id.clone();
        // Stdio is not connected: plugins log through the `log` import. Environment and
        // arguments are empty; there are no preopened directories or sockets.
        let mut wasi = WasiCtx::builder();
        wasi.wall_clock(WallClock(services.clock.clone()))
            .monotonic_clock(MonotonicClock(services.clock.clone()))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(seeds) = &services.seeds {
            use rand::SeedableRng;
            let seed = seeds.next();
            wasi.secure_random(rand::rngs::StdRng::seed_from_u64(seed))
                .insecure_random(rand::rngs::StdRng::seed_from_u64(!seed))
                .insecure_random_seed(u128::from(seed));
        }
        let repeatable = services.seeds.is_some();
        let wasi = wasi.build();
        // A failed memory.grow returns -1 to the guest (which may handle it) instead of
        // trapping at once.
        let limits = StoreLimitsBuilder::new()
            .memory_size(meta.memory_bytes)
            .trap_on_grow_failure(false)
            .build();
        PluginState {
            table: ResourceTable::new(),
            clock: services.clock.clone(),
            limits,
            wasi,
            http: WasiHttpCtx::new(),
            outgoing: OutgoingPolicy::new(
                id.clone(),
                meta.allow.clone(),
                services.client.clone(),
                meta.error_body_timeout,
            ),
            sqlite: SqliteCtx::new(
                id.clone(),
                meta.dir.clone(),
                services.databases.clone(),
                Budget::new(meta.deadline, crate::runtime::engine::EPOCH_TICK),
                meta.memory_bytes,
            ),
            log: LogCtx::new(id.clone()),
            metrics: MetricsCtx::new(id.clone(), services.metrics.clone()),
            listener: ListenerCtx::new(id.clone(), services.changes.clone()),
            availability: AvailabilityCtx::new(id.clone(), services.availability.clone()),
            threads: ThreadsCtx::new(id, services.threads.clone()),
            incoming_client: IncomingClientCtx::none(),
            meta,
            repeatable,
        }
    }

    /// Part of a repeatable run: the guest never yields on its CPU ticks.
    pub(crate) fn repeatable(&self) -> bool {
        self.repeatable
    }
}

impl PluginState {
    /// The id of the plugin this store runs.
    pub fn plugin_id(&self) -> &str {
        &self.meta.id
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outgoing,
        }
    }
}
