//! The Pooler reference host: runs the plugin components (WebAssembly, WIT package
//! `pooler:plugins@0.1.0`) in wasmtime and gives them what the contract promises.
//!
//! The crate is laid out by its three jobs, with the configuration ([`config`]) at the root
//! because all three read it:
//!
//! - [`runtime`]: the wasm runtime. [`runtime::Host`] and every one of its methods, the
//!   [`runtime::engine`] (component model, epoch deadlines, pooling allocator, on-disk
//!   compile cache), each store's [`runtime::state`], the [`runtime::roles`] and their
//!   worlds, the WIT [`runtime::bindings`], the [`runtime::embedded`] components, and the
//!   [`runtime::imports`] (one module per WIT interface the host provides).
//! - [`mediation`]: what passes between plugins, always through the host: availability
//!   queries and changes ([`mediation::mediator`]), the pool's maintenance calls, the link
//!   to the agent core ([`mediation::core_link`]) and the alerts to a person
//!   ([`mediation::alerts`]).
//! - [`operate`]: the operator's surface: the listener ([`operate::server`]), the
//!   incoming-HTTP driver ([`operate::http_in`]), the admin API ([`operate::admin`]) and its
//!   wire format ([`operate::wire`]), metrics, overview, timeline and logs.
//!
//! The `pooler` command line ([`cli`]) sits beside them: `pooler serve` starts all three,
//! and the other commands are clients of a running server's admin API ([`operate::wire`],
//! with the shapes of [`operate::wire::overview`]).
//!
//! How it fits together, in the order a request meets it:
//!
//! 1. [`config::Config`] says which component fills each [`runtime::roles::Role`] (the
//!    embedded one or a file) and each plugin's allowed hosts, deadline and memory cap.
//! 2. [`runtime::Host::new`] builds one [`runtime::engine`], checks each component's world
//!    against its role ([`runtime::roles::check_world`]) and pre-instantiates it against one
//!    linker holding every import ([`runtime::imports`]).
//! 3. Every plugin call ([`runtime::Host::call_pool`], [`runtime::Host::call_retry`]) and
//!    every HTTP request ([`operate::server`], handed to the pool by [`operate::http_in`])
//!    gets a fresh `Store` ([`runtime::state::PluginState`]) with a CPU deadline and a
//!    memory cap; a trap is reported with the plugin id and the call, and the next call
//!    starts clean.
//! 4. Plugins reach each other only through the host ([`mediation::mediator`]):
//!    availability queries go to a fresh pool instance, availability changes are queued and
//!    delivered after the signalling call returned, and Provider Retry takes one call at a
//!    time.
//! 5. People reach the plugins through the admin API ([`operate::admin`], under `/_pooler/`
//!    on the same listener) with the `pooler` command line ([`cli`]).
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use pooler_host::{config::Config, operate::server::Server, runtime::{Host, HostOptions}};
//! use pooler_host::runtime::imports::threads::NoCore;
//!
//! let host = Host::new(HostOptions {
//!     config: Config::parse("[plugins.account-pool]\ncomponent = \"pool.wasm\"\n")?,
//!     data_dir: "/tmp/pooler".into(),
//!     clock: Arc::new(pooler_core::clock::SystemClock::new()),
//!     threads: Arc::new(NoCore),
//!     cache_dir: Some("/tmp/pooler/cache".into()),
//!     seed: None,
//! })?;
//! let server = Server::bind(host, "127.0.0.1:8787".parse()?).await?;
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod cli;
pub mod config;
pub mod mediation;
pub mod operate;
pub mod runtime;
pub mod time;
