//! What the core tells plugins about threads and their turns (the WIT `types` failure and
//! rate-limit records, `threads` and `turn-events`), in plain Rust. The core produces these
//! records and Provider Retry consumes them: one definition, so a field added to the
//! contract is added once, and the core's stored spelling is the plugins' too.

use crate::Provider;

/// Serde for a record, under the WIT's kebab-case field names (feature `serde`).
macro_rules! wire_record {
    ($item:item) => {
        #[cfg_attr(
            feature = "serde",
            derive(serde::Serialize, serde::Deserialize),
            serde(rename_all = "kebab-case")
        )]
        $item
    };
}

wire_enum! {
    /// A thread's status (WIT `thread-status`).
    pub enum ThreadStatus {
        /// No turn running; the last turn succeeded (or none ran).
        Idle => "idle",
        /// A turn is running.
        Active => "active",
        /// The last turn failed.
        Error => "error",
    }
}

wire_enum! {
    /// The failure category of a turn (WIT `failure-category`); the list is closed and
    /// `Unknown` is the catch-all.
    pub enum FailureCategory {
        ActiveTurnNotSteerable => "active-turn-not-steerable",
        BadRequest => "bad-request",
        Billing => "billing",
        BudgetExceeded => "budget-exceeded",
        ConnectionFailed => "connection-failed",
        ContextWindowExceeded => "context-window-exceeded",
        Internal => "internal",
        MaxOutputTokens => "max-output-tokens",
        MaxTurns => "max-turns",
        Overloaded => "overloaded",
        Policy => "policy",
        RateLimit => "rate-limit",
        Sandbox => "sandbox",
        StreamDisconnected => "stream-disconnected",
        StructuredOutputRetries => "structured-output-retries",
        ThreadRollbackFailed => "thread-rollback-failed",
        TooManyFailedAttempts => "too-many-failed-attempts",
        Unauthorized => "unauthorized",
        Unknown => "unknown",
    }
}

wire_enum! {
    /// Who produced the failing answer (WIT `failure-origin`).
    pub enum FailureOrigin {
        /// The upstream provider API answered.
        Provider => "provider",
        /// The pool answered for itself (`x-pooler-origin: pool`).
        Pool => "pool",
        /// No HTTP answer at all.
        Transport => "transport",
    }
}

wire_enum! {
    /// Status of a rate-limit window or snapshot (WIT `limit-status`).
    pub enum LimitStatus {
        Allowed => "allowed",
        Warning => "warning",
        Blocked => "blocked",
        Unknown => "unknown",
    }
}

wire_enum! {
    /// What kind of limit a snapshot describes (WIT `limit-kind`).
    pub enum LimitKind {
        SubscriptionWindow => "subscription-window",
        Credits => "credits",
        SpendControl => "spend-control",
        Unknown => "unknown",
    }
}

wire_enum! {
    /// The kind of a queued row (WIT `row-kind`).
    pub enum RowKind {
        /// An automatic retry of a failed turn.
        Retry => "retry",
    }
}

wire_record! {
    /// What is known about why a turn failed (WIT `failure`). Nothing known is dropped.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Failure {
        pub category: FailureCategory,
        /// The provider's own error code or variant name, when there was one.
        pub provider_code: Option<String>,
        /// The HTTP status of the failing response, or the status a Codex variant carried.
        pub http_status: Option<u16>,
        pub origin: FailureOrigin,
        /// Absolute deadline (epoch ms) from `Retry-After` or a body reset field.
        pub retry_after: Option<u64>,
        /// A short human-readable message (≤ 1 KiB), never containing a credential.
        pub message: Option<String>,
    }
}

wire_record! {
    /// One rate-limit window of a snapshot (WIT `limit-window`).
    #[derive(Debug, Clone, PartialEq)]
    pub struct LimitWindow {
        pub key: Option<String>,
        pub label: Option<String>,
        pub status: LimitStatus,
        pub resets_at: Option<u64>,
        /// Fraction 0..=1.
        pub utilization: Option<f64>,
    }
}

wire_record! {
    /// The latest rate-limit state observed for a provider (WIT `rate-limit-snapshot`); it
    /// may be stale or describe another account than the thread's.
    #[derive(Debug, Clone, PartialEq)]
    pub struct RateLimitSnapshot {
        pub provider: Provider,
        pub status: LimitStatus,
        pub kind: LimitKind,
        pub windows: Vec<LimitWindow>,
        pub reached_reason: Option<String>,
        pub observed_at: u64,
    }
}

wire_record! {
    /// A live row of the core's retry queue (WIT `queued-row`).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct QueuedRow {
        /// Never reused.
        pub id: u64,
        pub thread: String,
        pub kind: RowKind,
        pub failed_request: String,
        pub original_request: String,
        /// The attempt the dispatch of this row will carry; rescheduling never changes it.
        pub attempt: u32,
        pub send_at: u64,
        pub reason: String,
        pub created_at: u64,
        pub waiting_for_slot: bool,
    }
}

wire_record! {
    /// A thread as plugins see it (WIT `thread-info`).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ThreadInfo {
        pub id: String,
        pub provider: Provider,
        pub model: Option<String>,
        pub status: ThreadStatus,
        pub archived: bool,
        pub retry_opt_out: bool,
        /// The latest turn request that was started (queued input does not count).
        pub latest_request: Option<String>,
        /// A user message is queued and not yet started.
        pub input_queued: bool,
        pub routed_by_pool: bool,
    }
}

wire_record! {
    /// A turn failed and its thread is now in `error` (WIT `turn-failed-event`).
    #[derive(Debug, Clone, PartialEq)]
    pub struct TurnFailedEvent {
        pub thread: String,
        pub provider: Provider,
        pub model: Option<String>,
        pub failed_request: String,
        pub original_request: String,
        /// 1 = the original dispatch.
        pub attempt: u32,
        pub failed_at: u64,
        /// T0: when the chain's first failure was recorded.
        pub chain_started_at: u64,
        pub input_accepted: bool,
        pub routed_by_pool: bool,
        pub rate_limits: Option<RateLimitSnapshot>,
        pub failure: Option<Failure>,
    }
}

wire_record! {
    /// A turn completed and its thread is now `idle` (WIT `turn-succeeded-event`).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct TurnSucceededEvent {
        pub thread: String,
        pub provider: Provider,
        pub request: String,
        pub original_request: String,
        pub attempt: u32,
        pub succeeded_at: u64,
    }
}

/// Why a `threads` call was refused (WIT `threads-error`). Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadsError {
    /// No thread has this id.
    NoSuchThread(String),
    /// The thread is not in `error`, or the request is not its latest request.
    NoFailedTurn,
    /// The chain already has a live row (also while that row is being dispatched).
    AlreadyQueued(u64),
    /// No live row has this id.
    NoSuchRow(u64),
    /// The live row `row` belongs to thread `owner`, not to the thread the caller named:
    /// the core's finding, which the host logs and answers across the WIT as `no-such-row`
    /// (the caller learns nothing it could not already list). A plugin never receives it.
    RowOfOtherThread { row: u64, owner: String },
    /// The thread is archived.
    Archived,
    /// An argument is invalid.
    InvalidArgument(String),
    /// The core's database failed. Transient.
    Storage(String),
}

impl std::fmt::Display for ThreadsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThreadsError::NoSuchThread(t) => write!(f, "no thread {t}"),
            ThreadsError::NoFailedTurn => {
                f.write_str("the thread has no failed turn with that request as its latest")
            }
            ThreadsError::AlreadyQueued(r) => write!(f, "the chain already has live row {r}"),
            ThreadsError::NoSuchRow(r) => write!(f, "no live row {r}"),
            ThreadsError::RowOfOtherThread { row, owner } => write!(
                f,
                "live row {row} is a row of thread {owner}, not of the thread named"
            ),
            ThreadsError::Archived => f.write_str("the thread is archived"),
            ThreadsError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            ThreadsError::Storage(m) => write!(f, "core storage: {m}"),
        }
    }
}

impl std::error::Error for ThreadsError {}

/// A database failure is transient: `storage`, with the database's words.
#[cfg(feature = "rusqlite")]
impl From<rusqlite::Error> for ThreadsError {
    fn from(e: rusqlite::Error) -> Self {
        ThreadsError::Storage(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_parses_back_from_its_wit_name() {
        for &c in FailureCategory::ALL {
            assert_eq!(FailureCategory::parse(c.as_str()), Some(c));
        }
        assert_eq!(FailureCategory::ALL.len(), 19);
        assert_eq!(FailureCategory::parse("RateLimit"), None);
        for &s in ThreadStatus::ALL {
            assert_eq!(ThreadStatus::parse(&s.to_string()), Some(s));
        }
    }
}
