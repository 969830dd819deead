//! The integration tests of the Pooler host: one binary, a module per area (fixture
//! components in the real host, fake upstreams on 127.0.0.1, the manual clock), so the
//! workspace links wasmtime and Cranelift into one test binary here instead of one per file.

mod agents;
mod alerts;
mod ap_auth;
mod ap_bodies;
mod ap_cancel;
mod ap_misc;
mod ap_quota;
mod ap_routing;
mod ap_strategy;
mod ap_tokens;
mod core_admin;
mod core_queue;
mod core_retention;
mod core_turns;
mod example_js_host;
mod examples;
mod hostile;
mod hostile_sql;
mod imports;
mod limits;
mod mediation;
mod observe;
mod odd_answers;
mod pr_policy;
mod pr_recovery;
mod server;
mod sim_report;
mod soak;
mod status_page;
