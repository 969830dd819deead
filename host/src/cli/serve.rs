//! `pooler serve`: load the plugins, serve the pool's HTTP endpoint and the admin API, run
//! the maintenance tick, and stop cleanly on SIGINT/SIGTERM. While it serves, the data
//! directory holds `server.json` (where it listens, its pid; 0600), which the other commands
//! read to find it; a clean exit removes it. It also holds the lock on `DATA_DIR/lock`
//! ([`crate::runtime::data_lock`]): a second server on the same directory is refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::client::ServerFile;
use crate::config::Config;
use crate::mediation::core_link::{CoreLink, CoreOptions};
use crate::operate::logging::LogFormat;
use crate::operate::server::Server;
use crate::operate::wire::ADMIN_TOKEN_FILE;
use crate::runtime::data_lock::DataDirLock;
use crate::runtime::{Host, HostOptions};

/// Run the host: load the plugins and serve the pool's HTTP endpoint.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler serve\n  \
    pooler serve --listen 127.0.0.1:9000 --config ~/.config/pooler/pooler.toml\n  \
    POOLER_DATA_DIR=/tmp/pooler pooler serve --listen 127.0.0.1:0   # any free port\n  \
    pooler serve --log-format json --log-level debug   # for a log collector\n\n\
    Metrics: GET /metrics on the listen address, in the Prometheus text format, with \
    `Authorization: Bearer <token>` (the admin token file).\n\n\
    One server per data directory: it holds DATA_DIR/lock while it runs, and a second \
    `pooler serve` on the same directory exits with status 1, naming the running one's pid \
    and address. The lock dies with the process, even on SIGKILL.\n\n\
    Retention ([core.retention] in the configuration; 0 days keeps forever): history-days \
    = 30, outbox-days = 7 (acknowledged events), turn-days = 90 (finished turns no thread \
    still needs), pruned every prune-interval-s = 60, at most prune-batch = 500 rows per \
    table per tick. [core] claim-lease-s = 300: a due row whose verdict could not be \
    recorded is gated again after this long.")]
pub struct ServeArgs {
    /// Configuration file (TOML). Without it the defaults apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (overrides `server.listen`; default 127.0.0.1:8787).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory (default: $POOLER_DATA_DIR, else the platform's data directory).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How log lines are written to standard error: `text`, or `json` (one object per line,
    /// a plugin's fields as members of their own).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which log lines are written: a level (`trace`, `debug`, `info`, `warn`, `error`, `off`)
    /// or a filter such as `info,pooler::plugin=debug`. Default: $RUST_LOG, else `info`.
    /// Secrets are never logged, at any level.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Where compiled components are kept, shared by every data directory so only the first
    /// start after a change compiles (default: $POOLER_CACHE_DIR, else `[server]
    /// compile-cache`, else `pooler` in the platform's cache directory, e.g.
    /// ~/.cache/pooler). It and its files must be yours alone (0700/0600); deleting it is
    /// always safe.
    #[arg(long, value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
}

pub(super) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    let data_dir = super::data_dir(args.data_dir)?;
    // Before anything is read from or written to it: another user's, or one others can
    // write, is refused.
    pooler_core::private_file::create_private_dir(&data_dir)
        .with_context(|| format!("cannot use the data directory {}", data_dir.display()))?;
    // Before anything else touches the directory: a second server must not run recovery
    // against this one's live turns nor replace its admin token.
    let mut lock = DataDirLock::acquire(&data_dir)?;
    let listen = config.server.listen;
    let compile_cache = super::compile_cache_dir(
        args.compile_cache,
        config.server.compile_cache.as_deref(),
        &data_dir,
    );
    let interval = Duration::from_secs(config.maintenance.interval_s);
    let alerts_interval = Duration::from_secs(config.alerts.check_interval_s);
    let clock: pooler_core::clock::SharedClock = Arc::new(pooler_core::clock::SystemClock::new());
    // The core first: its recovery runs before any plugin call, and its `threads` service
    // answers the plugins' import.
    let core = CoreLink::open(
        &data_dir,
        clock.clone(),
        CoreOptions::from_host_config(&config),
    )?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data_dir.clone(),
        clock,
        threads: core.threads_service(),
        cache_dir: Some(compile_cache.clone()),
        seed: None,
    })?;
    let core = core.attach(&host)?;
    let server = Server::bind(host.clone(), listen)
        .await?
        .with_core(core.clone())?;
    let addr = server.local_addr()?;
    let server_file = ServerFile::new(addr);
    server_file.write(&data_dir)?;
    lock.set_url(&server_file.url)?;
    println!("pooler listening on http://{addr}");
    println!("data directory: {}", data_dir.display());
    println!("admin token: {}", data_dir.join(ADMIN_TOKEN_FILE).display());
    println!("compile cache: {}", compile_cache.display());
    for role in crate::runtime::roles::Role::ALL {
        match host.plugin_source(role) {
            Some(source) => println!("plugin {role}: {source}"),
            None => println!("plugin {role}: none"),
        }
    }
    // Before the first request: the pool drops what the calls of a server that stopped
    // held (its OAuth refresh leases). Safe because the lock above makes this server the
    // directory's only one.
    host.start_pool().await;
    let maintenance = tokio::spawn(host.clone().run_maintenance(interval));
    let alerts = tokio::spawn(host.clone().run_alerts(alerts_interval));
    let result = server.run(shutdown_signal()).await;
    maintenance.abort();
    alerts.abort();
    // Let a due pass finish the row it is gating; running turns are recorded as
    // interrupted at the next start.
    core.shutdown().await;
    // Only our own file (the lock keeps other servers out, but someone may have put a
    // file there by hand).
    server_file.remove_if_ours(&data_dir);
    // Released last, after every write to the directory.
    drop(lock);
    result?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down: draining in-flight requests");
}
