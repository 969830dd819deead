//! The host capabilities the engine reaches through, as small traits. The component
//! implements them over the WIT imports (`threads`, `availability`, WASI clocks and random,
//! `log`); native tests implement them with fakes.

use crate::types::{Availability, Provider, QueuedRow, ThreadInfo, ThreadsError, Timestamp};

/// The core's threads and retry queue (WIT `threads`).
pub trait Threads {
    /// Read a thread.
    fn get_thread(&self, thread: &str) -> Result<ThreadInfo, ThreadsError>;
    /// Schedule a retry of `failed_request` at `send_at`; refused unless it is the thread's
    /// latest failed request, and while the chain already has a live row.
    fn schedule_retry(
        &self,
        thread: &str,
        failed_request: &str,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    /// Move live row `row` of `thread`, earlier or later; spends no attempt. Refused with
    /// `no-such-row` unless `row` is a live row of `thread`.
    fn reschedule(
        &self,
        thread: &str,
        row: u64,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    /// Remove live row `row` of `thread` without dispatching it; refused with `no-such-row`
    /// unless `row` is a live row of `thread`.
    fn cancel(&self, thread: &str, row: u64, reason: &str) -> Result<(), ThreadsError>;
    /// Live rows of one thread or all, by send time.
    fn list_rows(&self, thread: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError>;

    /// Read several threads; one answer per id, in order (WIT `get-threads`).
    fn get_threads(&self, threads: &[&str]) -> Vec<Result<ThreadInfo, ThreadsError>> {
        threads.iter().map(|t| self.get_thread(t)).collect()
    }

    /// Move several live rows in one commit of the core; one answer per move, in order, each
    /// as `reschedule` would give it (WIT `reschedule-many`).
    fn reschedule_many(&self, moves: &[RowMove]) -> Vec<Result<QueuedRow, ThreadsError>> {
        moves
            .iter()
            .map(|m| self.reschedule(&m.thread, m.row, m.send_at, &m.reason))
            .collect()
    }
}

/// One move of a live row (WIT `threads.row-move`): `row` is a live row of `thread`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMove {
    pub thread: String,
    pub row: u64,
    pub send_at: Timestamp,
    pub reason: String,
}

/// What the engine asks the pool (WIT `availability.availability-query`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvailabilityQuery {
    pub thread: String,
    pub provider: Provider,
    pub request: Option<String>,
    pub model: Option<String>,
}

/// The pool's availability answer (WIT `availability.query`, routed by the host).
pub trait AvailabilitySource {
    /// Ask the pool. `Err` when the source could not be asked at all; the engine treats that,
    /// and an answer slower than the availability timeout, as `source-unavailable`.
    fn query(&self, query: &AvailabilityQuery) -> Result<Availability, String>;

    /// Ask the pool about several threads at once (WIT `query-many`): one answer per query,
    /// in order. `Err` when the source could not be asked at all.
    fn query_many(&self, queries: &[AvailabilityQuery]) -> Result<Vec<Availability>, String> {
        queries.iter().map(|q| self.query(q)).collect()
    }
}

/// The host clock, as the guest sees it (WASI wall and monotonic clocks).
pub trait Clock {
    /// Wall time: unix epoch milliseconds.
    fn now(&self) -> Timestamp;
    /// Monotonic milliseconds since an arbitrary origin; for measuring how long a call took.
    fn monotonic_ms(&self) -> u64;
}

/// Structured log lines (WIT `log`): the kit's port, shared by every plugin.
pub use pooler_plugin_kit::log::{Level, Log};
