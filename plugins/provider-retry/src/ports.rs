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
    /// Move a live row, earlier or later; spends no attempt.
    fn reschedule(
        &self,
        row: u64,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    /// Remove a live row without dispatching it.
    fn cancel(&self, row: u64, reason: &str) -> Result<(), ThreadsError>;
    /// Live rows of one thread or all, by send time.
    fn list_rows(&self, thread: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError>;
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
}

/// The host clock, as the guest sees it (WASI wall and monotonic clocks).
pub trait Clock {
    /// Wall time: unix epoch milliseconds.
    fn now(&self) -> Timestamp;
    /// Monotonic milliseconds since an arbitrary origin; for measuring how long a call took.
    fn monotonic_ms(&self) -> u64;
}

/// Log severity (WIT `log.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Structured log lines (WIT `log`).
pub trait Logger {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]);
}
