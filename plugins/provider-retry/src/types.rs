//! Plain-Rust mirrors of the WIT types this plugin reads and answers with.
//!
//! The logic never sees generated bindings: `component.rs` converts WIT values into these
//! types and back, so every decision is testable natively. Names follow the WIT contract
//! (`wit/types.wit`, `threads.wit`, `turn-events.wit`, `retry-admin.wit`); each type's
//! `name()`/`Display` spells the WIT case, which is also how it is stored in the database.

use std::fmt;

/// A point in time: unix epoch milliseconds (UTC).
pub type Timestamp = u64;

/// The AI provider of a thread: the kit's, shared by every plugin.
pub use pooler_plugin_kit::Provider;

/// Why the pool cannot say when it will serve again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnavailableReason {
    NoEnabledAccount,
    Authentication,
    ResetUnknown,
    SourceUnavailable,
}

impl UnavailableReason {
    pub fn name(self) -> &'static str {
        match self {
            UnavailableReason::NoEnabledAccount => "no-enabled-account",
            UnavailableReason::Authentication => "authentication",
            UnavailableReason::ResetUnknown => "reset-unknown",
            UnavailableReason::SourceUnavailable => "source-unavailable",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            UnavailableReason::NoEnabledAccount,
            UnavailableReason::Authentication,
            UnavailableReason::ResetUnknown,
            UnavailableReason::SourceUnavailable,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
}

/// Why a blocked pool is blocked (informational).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockCause {
    QuotaExhausted,
    FamilyQuotaExhausted,
    Held,
    UsageRestricted,
}

impl BlockCause {
    pub fn name(self) -> &'static str {
        match self {
            BlockCause::QuotaExhausted => "quota-exhausted",
            BlockCause::FamilyQuotaExhausted => "family-quota-exhausted",
            BlockCause::Held => "held",
            BlockCause::UsageRestricted => "usage-restricted",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            BlockCause::QuotaExhausted,
            BlockCause::FamilyQuotaExhausted,
            BlockCause::Held,
            BlockCause::UsageRestricted,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// The pool's answer to "when can you serve this thread again?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    NotRouted,
    Ready,
    Blocked {
        retry_at: Timestamp,
        cause: BlockCause,
    },
    Unavailable(UnavailableReason),
}

impl Availability {
    /// A compact, stable text form, used for storage and parsed back by [`Self::decode`]:
    /// `not-routed`, `ready`, `blocked:<retry-at>:<cause>`, `unavailable:<reason>`.
    pub fn encode(&self) -> String {
        match self {
            Availability::NotRouted => "not-routed".to_owned(),
            Availability::Ready => "ready".to_owned(),
            Availability::Blocked { retry_at, cause } => {
                format!("blocked:{retry_at}:{}", cause.name())
            }
            Availability::Unavailable(r) => format!("unavailable:{}", r.name()),
        }
    }

    /// The inverse of [`Self::encode`].
    pub fn decode(s: &str) -> Option<Self> {
        match s {
            "not-routed" => return Some(Availability::NotRouted),
            "ready" => return Some(Availability::Ready),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix("blocked:") {
            let (at, cause) = rest.split_once(':')?;
            return Some(Availability::Blocked {
                retry_at: at.parse().ok()?,
                cause: BlockCause::parse(cause)?,
            });
        }
        let reason = s.strip_prefix("unavailable:")?;
        UnavailableReason::parse(reason).map(Availability::Unavailable)
    }
}

/// What happened that may have changed the pool's availability: the kit's, shared with
/// every plugin.
pub use pooler_plugin_kit::cause::ChangeCause;

/// The cause a stored piece of a signal's history stands for: its name, or its words (the
/// history stored a signal's causes as their words, joined with ", ", before it stored
/// names).
pub fn stored_cause(s: &str) -> Option<ChangeCause> {
    ChangeCause::parse(s).or_else(|| ChangeCause::ALL.into_iter().find(|c| cause_words(*c) == s))
}

/// The cause in words ("account enabled"): how the history stored a signal's causes
/// before it stored names, so [`stored_cause`] still reads them. The host puts the
/// WIT cause in the same words (`host/src/operate/admin/retry.rs`).
pub fn cause_words(cause: ChangeCause) -> &'static str {
    match cause {
        ChangeCause::AccountAdded => "account added",
        ChangeCause::AccountEnabled => "account enabled",
        ChangeCause::AccountDisabled => "account disabled",
        ChangeCause::AccountRemoved => "account removed",
        ChangeCause::ErrorCleared => "account error cleared",
        ChangeCause::ErrorSet => "account error",
        ChangeCause::HoldEnded => "hold ended",
        ChangeCause::ConfigChanged => "pool settings changed",
        ChangeCause::RoutingChanged => "routing changed",
        ChangeCause::PriorityChanged => "account priorities changed",
        ChangeCause::EarlierResetObserved => "earlier reset observed",
        ChangeCause::LaterResetObserved => "later reset observed",
        ChangeCause::ResetPassed => "reset passed",
    }
}

/// The availabilityChanged signal's payload.
#[derive(Debug, Clone, PartialEq)]
pub struct AvailabilityChange {
    pub provider: Provider,
    pub causes: Vec<ChangeCause>,
    pub earliest: Availability,
    pub detected_at: Timestamp,
}

/// The failure category of a turn (closed list; `Unknown` is the catch-all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCategory {
    ActiveTurnNotSteerable,
    BadRequest,
    Billing,
    BudgetExceeded,
    ConnectionFailed,
    ContextWindowExceeded,
    Internal,
    MaxOutputTokens,
    MaxTurns,
    Overloaded,
    Policy,
    RateLimit,
    Sandbox,
    StreamDisconnected,
    StructuredOutputRetries,
    ThreadRollbackFailed,
    TooManyFailedAttempts,
    Unauthorized,
    Unknown,
}

impl FailureCategory {
    /// Every category, in WIT order.
    pub const ALL: [FailureCategory; 19] = [
        FailureCategory::ActiveTurnNotSteerable,
        FailureCategory::BadRequest,
        FailureCategory::Billing,
        FailureCategory::BudgetExceeded,
        FailureCategory::ConnectionFailed,
        FailureCategory::ContextWindowExceeded,
        FailureCategory::Internal,
        FailureCategory::MaxOutputTokens,
        FailureCategory::MaxTurns,
        FailureCategory::Overloaded,
        FailureCategory::Policy,
        FailureCategory::RateLimit,
        FailureCategory::Sandbox,
        FailureCategory::StreamDisconnected,
        FailureCategory::StructuredOutputRetries,
        FailureCategory::ThreadRollbackFailed,
        FailureCategory::TooManyFailedAttempts,
        FailureCategory::Unauthorized,
        FailureCategory::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FailureCategory::ActiveTurnNotSteerable => "active-turn-not-steerable",
            FailureCategory::BadRequest => "bad-request",
            FailureCategory::Billing => "billing",
            FailureCategory::BudgetExceeded => "budget-exceeded",
            FailureCategory::ConnectionFailed => "connection-failed",
            FailureCategory::ContextWindowExceeded => "context-window-exceeded",
            FailureCategory::Internal => "internal",
            FailureCategory::MaxOutputTokens => "max-output-tokens",
            FailureCategory::MaxTurns => "max-turns",
            FailureCategory::Overloaded => "overloaded",
            FailureCategory::Policy => "policy",
            FailureCategory::RateLimit => "rate-limit",
            FailureCategory::Sandbox => "sandbox",
            FailureCategory::StreamDisconnected => "stream-disconnected",
            FailureCategory::StructuredOutputRetries => "structured-output-retries",
            FailureCategory::ThreadRollbackFailed => "thread-rollback-failed",
            FailureCategory::TooManyFailedAttempts => "too-many-failed-attempts",
            FailureCategory::Unauthorized => "unauthorized",
            FailureCategory::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Who produced the failing answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOrigin {
    Provider,
    Pool,
    Transport,
}

/// What is known about why a turn failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub category: FailureCategory,
    pub provider_code: Option<String>,
    pub http_status: Option<u16>,
    pub origin: FailureOrigin,
    pub retry_after: Option<Timestamp>,
    pub message: Option<String>,
}

/// Status of a rate-limit window or snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitStatus {
    Allowed,
    Warning,
    Blocked,
    Unknown,
}

/// What kind of limit a snapshot describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    SubscriptionWindow,
    Credits,
    SpendControl,
    Unknown,
}

/// One rate-limit window of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitWindow {
    pub key: Option<String>,
    pub label: Option<String>,
    pub status: LimitStatus,
    pub resets_at: Option<Timestamp>,
    pub utilization: Option<f64>,
}

/// The latest rate-limit state the core observed for a thread's provider.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitSnapshot {
    pub provider: Provider,
    pub status: LimitStatus,
    pub kind: LimitKind,
    pub windows: Vec<LimitWindow>,
    pub reached_reason: Option<String>,
    pub observed_at: Timestamp,
}

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
    pub failed_at: Timestamp,
    /// T0: when the chain's first failure was recorded.
    pub chain_started_at: Timestamp,
    pub input_accepted: bool,
    pub routed_by_pool: bool,
    pub rate_limits: Option<RateLimitSnapshot>,
    pub failure: Option<Failure>,
}

/// A turn completed and its thread is now `idle` (WIT `turn-succeeded-event`).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSucceededEvent {
    pub thread: String,
    pub provider: Provider,
    pub request: String,
    pub original_request: String,
    pub attempt: u32,
    pub succeeded_at: Timestamp,
}

/// A thread's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadStatus {
    Idle,
    Active,
    Error,
}

/// A thread as the core shows it (WIT `threads.thread-info`).
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadInfo {
    pub id: String,
    pub provider: Provider,
    pub model: Option<String>,
    pub status: ThreadStatus,
    pub archived: bool,
    pub retry_opt_out: bool,
    pub latest_request: Option<String>,
    pub input_queued: bool,
    pub routed_by_pool: bool,
}

/// A live row of the core's retry queue (WIT `queued-row`).
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRow {
    pub id: u64,
    pub thread: String,
    pub failed_request: String,
    pub original_request: String,
    /// The attempt the dispatch of this row will carry.
    pub attempt: u32,
    pub send_at: Timestamp,
    pub reason: String,
    pub created_at: Timestamp,
    pub waiting_for_slot: bool,
}

/// Why a `threads` call was refused (WIT `threads-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadsError {
    NoSuchThread(String),
    NoFailedTurn,
    AlreadyQueued(u64),
    NoSuchRow(u64),
    Archived,
    InvalidArgument(String),
    Storage(String),
}

impl fmt::Display for ThreadsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThreadsError::NoSuchThread(t) => write!(f, "no such thread {t}"),
            ThreadsError::NoFailedTurn => write!(f, "no failed turn"),
            ThreadsError::AlreadyQueued(r) => write!(f, "already queued as row {r}"),
            ThreadsError::NoSuchRow(r) => write!(f, "no such row {r}"),
            ThreadsError::Archived => write!(f, "thread archived"),
            ThreadsError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            ThreadsError::Storage(m) => write!(f, "core storage: {m}"),
        }
    }
}

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

/// The state of an open candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateState {
    Scheduled,
    Watching,
}

/// An open candidate: a chain with a live row or a watch (WIT `retry-admin.candidate`).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub thread: String,
    pub original_request: String,
    pub failed_request: String,
    pub state: CandidateState,
    pub row: Option<u64>,
    pub send_at: Option<Timestamp>,
    pub next_attempt: u32,
    pub reason: String,
    pub chain_started_at: Timestamp,
}

/// What set off a history entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Failure,
    /// An availability-changed signal, with its causes (each once, first seen first).
    Signal(Vec<ChangeCause>),
    Start,
    Tick,
    Due,
    Person,
    Dispatch,
}

/// What a history entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Scheduled(Timestamp),
    /// Old time, new time.
    Rescheduled(Timestamp, Timestamp),
    Watching,
    Declined,
    Dropped,
    Dispatched(u32),
    Resolved,
    Unchanged,
}

/// One entry of a chain's history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub at: Timestamp,
    pub trigger: Trigger,
    pub availability: Option<Availability>,
    pub action: Action,
    pub reason: String,
}

/// The history of one chain, oldest entry first.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainHistory {
    pub thread: String,
    pub original_request: String,
    pub entries: Vec<HistoryEntry>,
}

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
