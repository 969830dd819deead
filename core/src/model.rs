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

use pooler_plugin_kit::wire_enum;

/// The AI provider of a thread: the one definition every crate uses (the plugins' kit's),
/// with its wire spelling (`claude`, `codex`) in serde.
pub use pooler_plugin_kit::Provider;

/// The records the core serves to plugins (threads, queued rows, turn events, failures and
/// rate-limit snapshots): the plugins' kit's, so the core and Provider Retry share one
/// definition, and serde spells them as the WIT does.
pub use pooler_plugin_kit::turns::{
    Failure, FailureCategory, FailureOrigin, LimitKind, LimitStatus, LimitWindow, QueuedRow,
    RateLimitSnapshot, RowKind, ThreadInfo, ThreadStatus, TurnFailedEvent, TurnSucceededEvent,
};

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

/// One move of a live row for [`crate::Core::reschedule_many`] (WIT `threads.row-move`):
/// `row` must be a live row of `thread`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMove {
    pub thread: ThreadId,
    pub row: RowId,
    pub send_at: Timestamp,
    pub reason: String,
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
