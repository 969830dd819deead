//! The core's vocabulary: plain-Rust mirrors of the WIT records the core serves to plugins
//! (`types`, `threads`, `turn-events`), plus the host-facing records (turn plans, outcomes,
//! thread views). The host converts these one-to-one into the generated WIT types.
//!
//! Every enum has a fixed wire spelling (the WIT case name), used both in the database and
//! in the JSON payloads of the outbox, so stored rows read the same as the contract.

use serde::{Deserialize, Serialize};

/// Unix epoch milliseconds (UTC), as everywhere in the contract.
pub type Timestamp = u64;
/// A thread id (`th_…`), assigned by the core.
pub type ThreadId = String;
/// A turn request id (`rq_…`), assigned by the core.
pub type RequestId = String;
/// A queued row id; never reused (SQLite `AUTOINCREMENT`).
pub type RowId = u64;
/// An outbox event id; increases with every event written.
pub type EventId = u64;

/// Declares an enum whose variants have one fixed text form, shared by SQL and JSON.
macro_rules! wire_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every case, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The wire spelling (the WIT case name).
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }

            /// Parses the wire spelling; `None` for anything else.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// The AI provider of a thread: the one definition every crate uses (the plugins' kit's),
/// with its wire spelling (`claude`, `codex`) in serde.
pub use pooler_plugin_kit::Provider;

wire_enum! {
    /// What runs a thread's turns.
    pub enum Agent {
        /// The host's built-in driver: one streaming request per turn, sent by the host.
        Http => "http",
        /// The real Claude Code CLI (`claude -p`), one process per turn.
        ClaudeCode => "claude-code",
        /// The real Codex CLI (`codex exec`), one process per turn.
        Codex => "codex",
    }
}

impl Agent {
    /// The provider an agent CLI talks to (`None` for the HTTP driver, which serves both).
    pub fn provider(self) -> Option<Provider> {
        match self {
            Agent::Http => None,
            Agent::ClaudeCode => Some(Provider::Claude),
            Agent::Codex => Some(Provider::Codex),
        }
    }
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
    /// The failure category (WIT `failure-category`); the list is closed.
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

wire_enum! {
    /// Who started a turn request.
    pub enum TurnTrigger {
        /// A person's message (`send`).
        User => "user",
        /// A retry row that passed the dispatch gates.
        Retry => "retry",
        /// A retry row a person sent with send-now, bypassing the gates.
        SendNow => "send-now",
    }
}

wire_enum! {
    /// How a finished turn ended.
    pub enum TurnOutcomeKind {
        Ok => "ok",
        Failed => "failed",
    }
}

/// What is known about why a turn failed (WIT `failure`). Nothing known is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Failure {
    pub category: FailureCategory,
    /// The provider's own error code or variant name, when there was one.
    pub provider_code: Option<String>,
    /// The HTTP status of the failing response, or the status a Codex variant carried.
    pub http_status: Option<u16>,
    pub origin: FailureOrigin,
    /// Absolute deadline from `Retry-After` or a body reset field.
    pub retry_after: Option<Timestamp>,
    /// A short human-readable message (≤ 1 KiB), never containing a credential.
    pub message: Option<String>,
}

/// One rate-limit window of a snapshot (WIT `limit-window`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LimitWindow {
    pub key: Option<String>,
    pub label: Option<String>,
    pub status: LimitStatus,
    pub resets_at: Option<Timestamp>,
    /// Fraction 0..=1.
    pub utilization: Option<f64>,
}

/// The latest rate-limit state observed for a provider (WIT `rate-limit-snapshot`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RateLimitSnapshot {
    pub provider: Provider,
    pub status: LimitStatus,
    pub kind: LimitKind,
    pub windows: Vec<LimitWindow>,
    pub reached_reason: Option<String>,
    pub observed_at: Timestamp,
}

/// One move of a live row for [`crate::Core::reschedule_many`] (WIT `threads.row-move`):
/// `row` must be a live row of `thread`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMove {
    pub thread: ThreadId,
    pub row: RowId,
    pub send_at: Timestamp,
    pub reason: String,
}

/// A live row of the retry queue (WIT `queued-row`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct QueuedRow {
    pub id: RowId,
    pub thread: ThreadId,
    pub kind: RowKind,
    pub failed_request: RequestId,
    pub original_request: RequestId,
    /// The attempt the dispatch of this row will carry; rescheduling never changes it.
    pub attempt: u32,
    pub send_at: Timestamp,
    pub reason: String,
    pub created_at: Timestamp,
    pub waiting_for_slot: bool,
}

/// A thread as plugins see it (WIT `thread-info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ThreadInfo {
    pub id: ThreadId,
    pub provider: Provider,
    pub model: Option<String>,
    pub status: ThreadStatus,
    pub archived: bool,
    pub retry_opt_out: bool,
    /// The latest turn request that was started (queued input does not count).
    pub latest_request: Option<RequestId>,
    /// A user message is queued and not yet started.
    pub input_queued: bool,
    pub routed_by_pool: bool,
}

/// The `turn-failed` event (WIT `turn-failed-event`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TurnFailedEvent {
    pub thread: ThreadId,
    pub provider: Provider,
    pub model: Option<String>,
    pub failed_request: RequestId,
    pub original_request: RequestId,
    pub attempt: u32,
    pub failed_at: Timestamp,
    /// T0: when the chain's first failure was recorded.
    pub chain_started_at: Timestamp,
    pub input_accepted: bool,
    pub routed_by_pool: bool,
    pub rate_limits: Option<RateLimitSnapshot>,
    pub failure: Option<Failure>,
}

/// The `turn-succeeded` event (WIT `turn-succeeded-event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TurnSucceededEvent {
    pub thread: ThreadId,
    pub provider: Provider,
    pub request: RequestId,
    pub original_request: RequestId,
    pub attempt: u32,
    pub succeeded_at: Timestamp,
}

/// A plugin event as stored in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "event", rename_all = "kebab-case")]
pub enum PluginEvent {
    TurnFailed(TurnFailedEvent),
    TurnSucceeded(TurnSucceededEvent),
}

impl PluginEvent {
    /// The outbox `kind` column value.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginEvent::TurnFailed(_) => "turn-failed",
            PluginEvent::TurnSucceeded(_) => "turn-succeeded",
        }
    }

    /// The thread the event is about.
    pub fn thread(&self) -> &str {
        match self {
            PluginEvent::TurnFailed(e) => &e.thread,
            PluginEvent::TurnSucceeded(e) => &e.thread,
        }
    }
}

/// An event waiting in the outbox for one subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub id: EventId,
    pub created_at: Timestamp,
    /// How many deliveries to this subscriber failed so far.
    pub failed_deliveries: u32,
    pub event: PluginEvent,
}

/// Where a thread's turns are sent: the pool's route (base URL + per-thread token). The
/// token is a secret: `Debug` redacts it and nothing in this crate logs it.
#[derive(Clone, PartialEq, Eq)]
pub struct Route {
    /// E.g. `http://127.0.0.1:8080` (no trailing path; `/v1/...` is appended).
    pub base_url: String,
    /// The per-thread route token, sent as `Authorization: Bearer`.
    pub token: String,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("base_url", &self.base_url)
            .field("token", &"[redacted]")
            .finish()
    }
}

/// One earlier exchange of a thread, replayed as conversation history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub user: String,
    /// The assistant's reply (possibly partial, for a failed turn whose input was accepted).
    pub assistant: String,
}

/// How a thread's turns are run: the agent, and what an agent CLI needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AgentSpec {
    pub agent: Agent,
    /// The directory the agent runs in; `None`: the host picks one per thread.
    pub cwd: Option<String>,
    /// Extra command-line arguments for the agent CLI (after the host's own).
    pub args: Vec<String>,
}

impl Default for AgentSpec {
    fn default() -> Self {
        AgentSpec {
            agent: Agent::Http,
            cwd: None,
            args: Vec::new(),
        }
    }
}

/// A turn the host must now run: the core has marked it started and the thread active.
/// Hand it to [`crate::driver::TurnDriver`] and record the outcome with
/// [`crate::Core::record_outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnPlan {
    pub request: RequestId,
    pub thread: ThreadId,
    pub provider: Provider,
    pub model: Option<String>,
    /// The thread's provider session id (Claude `metadata.user_id.session_id`, Codex
    /// `session-id` / `prompt_cache_key`), stable for the thread's life.
    pub session_id: String,
    /// The text of this turn.
    pub input: String,
    pub attempt: u32,
    pub original_request: RequestId,
    pub trigger: TurnTrigger,
    /// The pool route, if the thread has one; `None` means the host sends it directly.
    pub route: Option<Route>,
    /// Earlier exchanges of the thread whose input the provider accepted, oldest first.
    pub history: Vec<Exchange>,
    /// What runs the turn.
    pub agent: AgentSpec,
    /// The agent's own session id, once an earlier turn printed one: this turn resumes it.
    pub agent_session: Option<String>,
}

/// How a turn ended, as the driver reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    pub result: TurnResult,
    /// The provider began answering (the stream started).
    pub input_accepted: bool,
    /// Rate-limit state read from the response headers, if they carried any.
    pub rate_limits: Option<RateLimitSnapshot>,
    /// The agent's session id, when an agent CLI printed one (recorded on the thread).
    pub agent_session: Option<String>,
    /// The turn's input is now part of the agent's session, whatever the outcome (a retry
    /// continues the session instead of sending the input again).
    pub input_in_session: bool,
}

impl TurnOutcome {
    /// A failure before anything was sent or accepted.
    pub fn failed(failure: Failure) -> TurnOutcome {
        TurnOutcome {
            result: TurnResult::Failed {
                failure,
                partial_reply: String::new(),
            },
            input_accepted: false,
            rate_limits: None,
            agent_session: None,
            input_in_session: false,
        }
    }
}

/// Success with the reply, or failure with its description.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    Succeeded {
        reply: String,
    },
    Failed {
        failure: Failure,
        partial_reply: String,
    },
}

/// A turn request as `show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TurnRecord {
    pub id: RequestId,
    pub input: String,
    pub trigger: TurnTrigger,
    pub original_request: RequestId,
    pub attempt: u32,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub outcome: Option<TurnOutcomeKind>,
    pub reply: Option<String>,
    pub input_accepted: bool,
    pub failure: Option<Failure>,
}

/// A thread with the fields people see (never the route token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ThreadView {
    #[serde(flatten)]
    pub info: ThreadInfo,
    pub session_id: String,
    pub created_at: Timestamp,
    /// What runs the thread's turns.
    pub agent: Agent,
    /// The agent CLI's own session id, once its first turn printed one.
    pub agent_session: Option<String>,
    /// The directory an agent CLI runs in, when the thread names one.
    pub cwd: Option<String>,
}

/// One entry of the queue's history (what happened to rows, and who did it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HistoryEntry {
    pub at: Timestamp,
    pub thread: ThreadId,
    pub row: Option<RowId>,
    pub original_request: Option<RequestId>,
    /// `plugin`, `core` or `person`.
    pub actor: String,
    /// `scheduled`, `rescheduled`, `cancelled`, `claimed`, `waiting-for-slot`, `postponed`,
    /// `dropped`, `dispatched`, `send-now`, `released`, `archived`.
    pub action: String,
    pub send_at: Option<Timestamp>,
    pub detail: Option<String>,
}

/// Everything `pooler thread show` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ThreadShow {
    pub thread: ThreadView,
    pub turns: Vec<TurnRecord>,
    pub rows: Vec<QueuedRow>,
    pub history: Vec<HistoryEntry>,
}
