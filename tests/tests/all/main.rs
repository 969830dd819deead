//! The integration tests of the Pooler host: one binary, a module per area (fixture
//! components in the real host, fake upstreams on 127.0.0.1, the manual clock), so the
//! workspace links wasmtime and Cranelift into one test binary here instead of one per file.
//!
//! The modules share one process, so one log capture (`pooler_tests::logs`): a test here
//! may wait for or count lines it can tell apart (its plugin, its rule, its values), not
//! assert on every line the process logged. Two tests that must have the process to
//! themselves are binaries of their own: `ap_bodies` (no line at level ERROR was logged,
//! while other tests here make plugins trap on purpose) and `soak` (it stops the capture
//! for good, to keep it out of the memory it measures).

mod agents;
mod alerts;
mod ap_auth;
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
mod status_page;
