//! The host's imports, one module per WIT interface it provides, each with its per-instance
//! state and an `add_to_linker`. WASI 0.2 itself comes from wasmtime-wasi and
//! wasmtime-wasi-http; `clocks` puts the host clock under it and `http_out` the outgoing
//! policy. Incoming requests are no import: [`crate::operate::http_in`] hands them to the pool.

pub mod availability;
pub mod clocks;
pub mod http_out;
pub mod incoming_client;
pub mod listener;
pub mod log;
pub mod metrics;
pub mod sqlite;
pub mod threads;
