//! The core that the reference host plays for the plugins: threads, turn requests, the
//! durable retry queue, the plugin-event outbox, failure classification and the turn driver.
//! Plain Rust over rusqlite and hyper; no WebAssembly here. The host wires it to plugins.
//!
//! | module       | owns |
//! |--------------|------|
//! | [`clock`]    | the one host clock (system, or manual in tests) |
//! | [`model`]    | plain-Rust mirrors of the WIT records, plus turn plans and outcomes |
//! | [`error`]    | [`ThreadsError`] (the WIT `threads-error`) and [`CoreError`] |
//! | [`db`]       | the database file `DATA_DIR/core.sqlite3` and its migrations |
//! | [`sqlite_file`] | how every SQLite database is opened (the core's and the plugins') |
//! | [`private_file`] | creating files only their owner can read (0600) |
//! | [`threads`]  | threads, person messages, starting turns, recording outcomes, recovery |
//! | [`queue`]    | the WIT `threads` queue operations and the due loop |
//! | [`outbox`]   | durable, at-least-once delivery of `turn-failed` / `turn-succeeded` |
//! | [`retention`] | pruning `history`, `outbox` and `turn_requests` past their retention |
//! | [`classify`] | Claude and Codex failure classification, origin, retry-after |
//! | [`ratelimit`]| rate-limit snapshots from response headers |
//! | [`sse`]      | the server-sent-events parser the driver reads streams with |
//! | [`driver`]   | the turn driver: one streaming provider request per turn |
//! | [`agent`]    | agent CLIs (Claude Code, Codex) as turn runners: command lines, output, outcomes |
//!
//! # How the host uses it
//!
//! ```text
//! start:        core = Core::open(data_dir, clock); core.recover();
//!               core.register_subscriber("provider-retry"); plugin on-start; then the loop
//! a new turn:   core.new_thread(..) / core.send(thread, text)
//!               for plan in core.start_turns():  spawn driver::run_and_record(core, driver, plan, route)
//! an outcome:   run_and_record → core.mark_input_accepted (stream began) → core.record_outcome
//!               (thread idle/error + outbox event, one transaction)
//! events:       for ev in core.pending_events(sub, n): plugin.turn-failed/succeeded(ev)
//!               → core.ack(sub, ev.id), or core.note_delivery_failure(..) on a trap
//! plugin calls: threads.* → core.get_thread / schedule_retry / reschedule / cancel / list_rows
//! due loop:     for claim in core.claim_due(now): plugin.before-dispatch(claim.row)
//!               proceed → core.dispatch(&claim) → run the returned plan
//!               wait-until(t) → core.postpone(&claim, t, ..); drop(r) → core.drop_row(&claim, r)
//!               trap/error → core.postpone(&claim, now + 60 s, ..)
//!               sleep until core.next_due_at() or a turn finishes (slots free up)
//! send-now:     core.send_now(thread, now) → run the returned plan (no gates)
//! ```

pub mod agent;
pub mod classify;
pub mod clock;
pub mod db;
pub mod driver;
pub mod error;
pub mod ids;
pub mod model;
pub mod outbox;
pub mod private_file;
pub mod queue;
pub mod ratelimit;
pub mod retention;
pub mod sqlite_file;
pub mod sse;
mod store;
pub mod threads;

pub use error::{CoreError, ThreadsError};
pub use model::*;
pub use queue::Claim;
pub use store::{Core, DEFAULT_CLAIM_LEASE_MS, DEFAULT_CONCURRENCY_LIMIT};
pub use threads::{CONTINUE_INPUT, RecoveryReport};
