//! The `pooler` command line. Exit codes: 0 success, 1 failure, 2 usage error (clap's).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::imports::threads::NoCore;
use crate::runtime::{Host, HostOptions};
use crate::server::{ADMIN_TOKEN_FILE, Server};

/// Pooler keeps AI coding-agent threads working across a pool of provider accounts and
/// through provider outages.
#[derive(Debug, Parser)]
#[command(name = "pooler", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host: load the plugins and serve the pool's HTTP endpoint.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
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
}

/// Parse the command line and run it.
pub fn main() -> ExitCode {
    // Usage errors exit 2, --help and --version 0 (clap's convention).
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The data directory: the flag, else `$POOLER_DATA_DIR`, else the platform's.
pub fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os("POOLER_DATA_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    platform_data_dir()
        .map(|dir| dir.join("pooler"))
        .context("no data directory: pass --data-dir or set POOLER_DATA_DIR")
}

fn platform_data_dir() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library").join("Application Support"));
    }
    if cfg!(windows) {
        return std::env::var_os("APPDATA").map(PathBuf::from);
    }
    // XDG base directories.
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| h.join(".local").join("share")))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    let data_dir = data_dir(args.data_dir)?;
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let listen = config.server.listen;
    let interval = Duration::from_secs(config.maintenance.interval_s);
    let host = Host::new(HostOptions {
        config,
        data_dir: data_dir.clone(),
        clock: Arc::new(pooler_core::clock::SystemClock::new()),
        threads: Arc::new(NoCore),
        cache_dir: Some(data_dir.join("cache")),
    })?;
    let server = Server::bind(host.clone(), listen).await?;
    let addr = server.local_addr()?;
    println!("pooler listening on http://{addr}");
    println!("data directory: {}", data_dir.display());
    println!("admin token: {}", data_dir.join(ADMIN_TOKEN_FILE).display());
    for role in crate::roles::Role::ALL {
        match host.plugin_source(role) {
            Some(source) => println!("plugin {role}: {source}"),
            None => println!("plugin {role}: none"),
        }
    }
    let maintenance = tokio::spawn(host.clone().run_maintenance(interval));
    server.run(shutdown_signal()).await?;
    maintenance.abort();
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
