//! Outgoing `wasi:http` requests: wasmtime-wasi-http's `send_request` hook, replaced so that
//! every request goes through one shared keep-alive client (wasmtime-wasi-http's default
//! opens a connection per request; `shared/TOOLCHAIN.md`: +30–45 % req/s) and is checked
//! against the calling plugin's allow-list of hosts first. The list is empty by default
//! (deny); a refused request fails with `HTTP-request-denied`, an error the guest sees and
//! handles — it is not a trap. The guest's request options are honoured: connect, first
//! byte and between bytes, each with a finite default; the body of an answer that is not a
//! 2xx gets at most the plugin's `error-body-timeout-ms` between bytes.
//!
//! | module      | owns |
//! |-------------|------|
//! | `hook.rs`   | the `send_request` hook: the allow-list's verdict, then the client |
//! | `allow.rs`  | the allow-list: configured entries, granted origins, the grants file |
//! | `client.rs` | the shared keep-alive client and the timeouts of a request and its body |

pub mod allow;
pub mod client;
pub mod hook;
