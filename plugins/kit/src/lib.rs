//! Plain-Rust helpers shared by the Pooler plugins.
//!
//! A plugin's logic never touches WIT types. It reads and writes its state through [`Db`],
//! which the component implements over the `pooler:plugins/sqlite` import and native tests
//! implement over rusqlite (`NativeDb`, feature `native`), so the same SQL runs in both.
//! It logs through [`Log`] ([`log`]) and reports counters and histograms through
//! [`Metrics`] ([`metrics`]). Time arithmetic on epoch milliseconds saturates ([`time`]).
//!
//! The contract's records that more than one side uses are defined here once, in plain Rust
//! with serde behind feature `serde`: the pool's availability ([`availability`], [`cause`]),
//! the core's threads, turns and failures ([`turns`]), and what the admin API shows of the
//! plugins ([`admin`], [`retry_admin`], [`settings`]). [`ratelimit`] is the one reading of
//! the providers' rate-limit headers, for the core's snapshots and the pool's quota.
//!
//! With feature `component` (wasm32 builds of a plugin) the kit also holds the guest
//! adapters every plugin needs over the shared imports: `component::WitDb`,
//! `component::WitLog`, and the conversions between the WIT and the kit types, with the
//! bindings of those interfaces for the plugin's own `generate!` to reuse.

// The kit's own name, for the serde attributes its exported `wire_enum!` writes.
extern crate self as pooler_plugin_kit;

#[macro_use]
mod wire_enum;

/// Serde as the kit's `wire_enum!` reaches it (not an interface of the kit).
#[cfg(feature = "serde")]
#[doc(hidden)]
pub use serde as __serde;

pub mod admin;
pub mod availability;
pub mod cause;
pub mod db;
pub mod format;
pub mod log;
pub mod metrics;
pub mod provider;
pub mod ratelimit;
pub mod retry_admin;
pub mod settings;
pub mod time;
pub mod turns;

#[cfg(feature = "component")]
pub mod component;

#[cfg(feature = "native")]
pub use db::NativeDb;
pub use db::{Db, DbError, Row, Rows, Value};
pub use log::{Level, Log};
pub use metrics::{Metrics, NoMetrics};
pub use provider::Provider;
pub use turns::ThreadsError;
