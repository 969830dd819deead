//! The host's imports, one module per WIT interface it provides, each with its per-instance
//! state and an `add_to_linker`. WASI 0.2 itself comes from wasmtime-wasi and
//! wasmtime-wasi-http; `clocks` puts the host clock under it, `http_out` the outgoing
//! policy and `http_in` the incoming requests handed to the pool.

pub mod availability;
pub mod clocks;
pub mod http_in;
pub mod http_out;
pub mod incoming_client;
pub mod listener;
pub mod log;
pub mod metrics;
pub mod sqlite;
pub mod threads;
