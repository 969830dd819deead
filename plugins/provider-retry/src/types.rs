//! The plain-Rust types this plugin reads and answers with: the contract's shared records
//! (availability, failures, threads, queued rows, turn events) are the plugins' kit's, and
//! this plugin's own (candidates, history, admin answers) are defined here.
//!
//! The logic never sees generated bindings: the kit and `component.rs` convert WIT values
//! into these types and back, so every decision is testable natively. Names follow the WIT
//! contract (`wit/types.wit`, `threads.wit`, `turn-events.wit`, `retry-admin.wit`); each
//! enum's `as_str()`/`Display` spells the WIT case, which is also how it is stored.

use std::fmt;

/// A point in time: unix epoch milliseconds (UTC).
pub type Timestamp = u64;

/// The AI provider of a thread: the kit's, shared by every plugin.
pub use pooler_plugin_kit::Provider;

/// What happened that may have changed the pool's availability: the kit's, shared with
/// every plugin.
pub use pooler_plugin_kit::cause::ChangeCause;

/// The cause a stored piece of a signal's history stands for: its name, or its words (the
/// history stored a signal's causes as their words, joined with ", ", before it stored
/// names).
pub fn stored_cause(s: &str) -> Option<ChangeCause> {
    ChangeCause::parse(s).or_else(|| ChangeCause::from_words(s))
}

/// The pool's availability answer and its change signal: the kit's, shared with the pool.
pub use pooler_plugin_kit::availability::{
    Availability, AvailabilityChange, BlockCause, UnavailableReason,
};

/// The core's records of threads, turns, failures and rate limits, and its refusals: the
/// kit's, which the core itself uses.
pub use pooler_plugin_kit::turns::{
    Failure, FailureCategory, FailureOrigin, LimitKind, LimitStatus, LimitWindow, QueuedRow,
    RateLimitSnapshot, RowKind, ThreadInfo, ThreadStatus, ThreadsError, TurnFailedEvent,
    TurnSucceededEvent,
};

/// An error returned from one of the plugin's callbacks (WIT `plugin-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    /// Transient: the plugin's database failed.
    Storage(String),
    /// Transient: a host capability answered with an unexpected error.
    Dependency(String),
    /// Final: the input can never be processed.
    InvalidInput(String),
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::Storage(m) => write!(f, "storage: {m}"),
            PluginError::Dependency(m) => write!(f, "dependency: {m}"),
            PluginError::InvalidInput(m) => write!(f, "invalid input: {m}"),
        }
    }
}

impl From<pooler_plugin_kit::DbError> for PluginError {
    fn from(e: pooler_plugin_kit::DbError) -> Self {
        PluginError::Storage(e.to_string())
    }
}

/// The answer of `before-dispatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchVerdict {
    Proceed,
    WaitUntil(Timestamp),
    Drop(String),
}

/// An open candidate and its state: the kit's, which the host's admin API serves.
pub use pooler_plugin_kit::retry_admin::{Candidate, CandidateState};

/// A chain's history and what sets off and does each entry: the kit's, which the host's
/// admin API serves.
pub use pooler_plugin_kit::retry_admin::{Action, ChainHistory, HistoryEntry, Trigger};

/// Why an admin call was refused (WIT `admin-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminError {
    UnknownThread(String),
    NothingPending(String),
    Dependency(String),
    Storage(String),
}

impl From<PluginError> for AdminError {
    fn from(e: PluginError) -> Self {
        match e {
            PluginError::Storage(m) => AdminError::Storage(m),
            PluginError::Dependency(m) | PluginError::InvalidInput(m) => AdminError::Dependency(m),
        }
    }
}

impl From<pooler_plugin_kit::DbError> for AdminError {
    fn from(e: pooler_plugin_kit::DbError) -> Self {
        AdminError::Storage(e.to_string())
    }
}
