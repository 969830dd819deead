//! Provider Retry: durable retries of failed agent turns that stay true when the pool's
//! availability changes (spec `provider-retry.md` §2–4; fixes #4839 and #6172).
//!
//! The plugin is plain Rust over small traits, tested natively; `component.rs` is the glue
//! that exports it as the WIT world `provider-retry` (wasm32 only).
//!
//! | module | owns |
//! |---|---|
//! | [`types`] | plain mirrors of the WIT records and variants |
//! | [`policy`] | the pure decision table of spec §2 and the send-time formulas |
//! | [`settings`] | every duration and the attempt cap: defaults, validation, storage |
//! | [`store`] | the SQLite schema: chains, processed events, history, meta |
//! | [`ports`] | the host capabilities as traits (threads, availability, clock, log) |
//! | [`engine`] | events, re-evaluation (spec §3), the dispatch gate, admin |

pub mod engine;
pub mod policy;
pub mod ports;
pub mod settings;
pub mod store;
pub mod types;

#[cfg(target_arch = "wasm32")]
mod component;

pub use engine::{Engine, PassSummary};
pub use policy::{Decision, PoolAnswer, Random, decide};
pub use settings::Settings;
