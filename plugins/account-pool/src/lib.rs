//! Account Pooler: a session-affine, quota-aware HTTP proxy over a pool of Claude and
//! Codex accounts, built as a WebAssembly component (world `account-pool`).
//!
//! The decisions are plain Rust, unit-tested natively; state lives only in SQLite through
//! [`pooler_plugin_kit::Db`]; the proxy engine reaches the outside world through small
//! traits ([`engine::Upstream`], [`engine::Clock`], [`engine::Random`]); the component glue
//! (`component`, wasm32 only) adapts WIT types and wasi:http to them.
//!
//! | module | owns |
//! |---|---|
//! | [`model`] | providers, families, credentials, statuses, availability vocabulary |
//! | [`http`] | headers, served routes, upstream URLs, header allow-lists, error shapes |
//! | [`body`] | a request body held whole in chunks, within the instance's memory |
//! | [`session`] | session keys (Claude, Codex) and model family of a request |
//! | [`skim`] | a JSON scanner over a body's chunks that keeps only what it is asked for |
//! | [`quota`] | rate-limit header and usage parsing, windows, blocking resets |
//! | [`redact`] | an account's credential taken out of upstream text before it is kept or relayed |
//! | [`policy`] | eligibility tiers, status, choice, outcome table, commit rule, verdict |
//! | [`settings`] | setting keys, defaults, validation |
//! | [`oauth`] | refresh decisions, token endpoint shapes, login files |
//! | [`token`] | route tokens: generation, hashing, constant-time compare |
//! | [`store`] | the SQLite schema and every read and write |
//! | [`engine`] | the proxy's attempt loop over the traits |
//! | [`first_event`] | a served stream's first event: an opening failure the pool acts on |
//! | [`stream`] | the streaming relay with the SSE error event |
//! | [`admin`] | accounts, routes, settings, availability and maintenance operations |

pub mod admin;
pub mod body;
pub mod engine;
pub mod first_event;
pub mod history;
pub mod http;
pub mod model;
pub mod oauth;
pub mod policy;
pub mod quota;
pub mod redact;
pub mod session;
pub mod settings;
pub mod skim;
pub mod store;
pub mod stream;
pub mod token;
pub mod tokens;

/// Strategies of the property tests.
#[cfg(test)]
mod props;

#[cfg(target_arch = "wasm32")]
mod component;
