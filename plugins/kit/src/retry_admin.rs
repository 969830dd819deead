//! Provider Retry's diagnostics (WIT `retry-admin`: open candidates and each chain's
//! history) in plain Rust: the plugin builds them, the host's admin API serves them as JSON
//! and its command line reads them back. One definition, so the three agree; serde (feature
//! `serde`) spells them as the admin API does: `snake_case` fields, cases by their WIT
//! names, epoch milliseconds, and each variant as an object whose `kind` is the case name
//! (`{"kind": "rescheduled", "from": …, "to": …}`).

use crate::availability::Availability;
use crate::cause::ChangeCause;

wire_enum! {
    /// Where an open candidate stands (WIT `retry-admin.candidate-state`).
    pub enum CandidateState {
        /// A live retry row waits for its send time.
        Scheduled => "scheduled",
        /// Declined for now: revisited on every re-evaluation.
        Watching => "watching",
    }
}

/// An open candidate: a chain with a live retry row or a watch.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Candidate {
    /// The thread the candidate belongs to.
    pub thread: String,
    /// The chain's original request.
    pub original_request: String,
    /// The chain's latest failed request.
    pub failed_request: String,
    /// Scheduled (a live row) or watching.
    pub state: CandidateState,
    /// The live row, when scheduled.
    pub row: Option<u64>,
    /// When the row is due, when scheduled. Epoch milliseconds.
    pub send_at: Option<u64>,
    /// The attempt the next dispatch will carry.
    pub next_attempt: u32,
    /// Why it is in this state.
    pub reason: String,
    /// When the chain first failed (T0). Epoch milliseconds.
    pub chain_started_at: u64,
}

/// What set off an entry of a chain's history (WIT `retry-admin.trigger`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(into = "wire::Trigger", try_from = "wire::Trigger")
)]
pub enum Trigger {
    /// A `turn-failed` event.
    Failure,
    /// An `availability-changed` signal, with its causes (each once, first seen first; none
    /// when the pool sent none). The admin API shows them in words, joined with ", "
    /// (`"causes": "account enabled, hold ended"`).
    Signal(Vec<ChangeCause>),
    /// `on-start`.
    Start,
    /// `on-tick`.
    Tick,
    /// `before-dispatch` of the due row.
    Due,
    /// A person (cancel, send-now).
    Person,
    /// The turn was dispatched by the core (seen on the next event).
    Dispatch,
}

/// What an entry of a chain's history did (WIT `retry-admin.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(into = "wire::Action", from = "wire::Action")
)]
pub enum Action {
    /// A row was created for this send time (`at`). Epoch milliseconds.
    Scheduled(u64),
    /// The row moved from one send time to another (`from`, `to`). Epoch milliseconds.
    Rescheduled(u64, u64),
    /// Declined for now, kept open.
    Watching,
    /// Declined for good.
    Declined,
    /// The row was removed without dispatch.
    Dropped,
    /// The row was (or will be) dispatched as this attempt (`attempt`; 1 is the original
    /// request).
    Dispatched(u32),
    /// The candidate was closed (succeeded, stale, expired, cancelled).
    Resolved,
    /// Nothing changed (the decision stands).
    Unchanged,
}

/// One entry of a chain's history.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HistoryEntry {
    /// When the entry was recorded (host time). Epoch milliseconds.
    pub at: u64,
    /// What set off the evaluation that produced the entry.
    pub trigger: Trigger,
    /// The pool's availability as the plugin saw it, when it asked.
    pub availability: Option<Availability>,
    /// What the plugin did as a result.
    pub action: Action,
    /// The reason, in the plugin's stable words (`rate-limited`, `stale: newer request`, …).
    pub reason: String,
}

/// The history of one chain, oldest entry first.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ChainHistory {
    /// The thread the chain belongs to.
    pub thread: String,
    /// The chain's original request (attempt 1): identifies the chain within the thread.
    pub original_request: String,
    /// The entries, oldest first (the plugin keeps the last 50).
    pub entries: Vec<HistoryEntry>,
}

/// The admin API's forms of the history's variants: each an object whose `kind` is the case
/// name, its fields named.
#[cfg(feature = "serde")]
mod wire {
    use crate::cause::ChangeCause;

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    pub enum Trigger {
        Failure,
        Signal { causes: String },
        Start,
        Tick,
        Due,
        Person,
        Dispatch,
    }

    impl From<super::Trigger> for Trigger {
        fn from(t: super::Trigger) -> Self {
            match t {
                super::Trigger::Failure => Trigger::Failure,
                super::Trigger::Signal(causes) => Trigger::Signal {
                    causes: causes
                        .iter()
                        .map(|c| c.words())
                        .collect::<Vec<_>>()
                        .join(", "),
                },
                super::Trigger::Start => Trigger::Start,
                super::Trigger::Tick => Trigger::Tick,
                super::Trigger::Due => Trigger::Due,
                super::Trigger::Person => Trigger::Person,
                super::Trigger::Dispatch => Trigger::Dispatch,
            }
        }
    }

    impl TryFrom<Trigger> for super::Trigger {
        type Error = String;
        fn try_from(t: Trigger) -> Result<Self, String> {
            Ok(match t {
                Trigger::Failure => super::Trigger::Failure,
                Trigger::Signal { causes } if causes.is_empty() => super::Trigger::Signal(vec![]),
                Trigger::Signal { causes } => super::Trigger::Signal(
                    causes
                        .split(", ")
                        .map(|w| {
                            ChangeCause::from_words(w)
                                .ok_or_else(|| format!("no change cause reads {w:?}"))
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Trigger::Start => super::Trigger::Start,
                Trigger::Tick => super::Trigger::Tick,
                Trigger::Due => super::Trigger::Due,
                Trigger::Person => super::Trigger::Person,
                Trigger::Dispatch => super::Trigger::Dispatch,
            })
        }
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    pub enum Action {
        Scheduled { at: u64 },
        Rescheduled { from: u64, to: u64 },
        Watching,
        Declined,
        Dropped,
        Dispatched { attempt: u32 },
        Resolved,
        Unchanged,
    }

    impl From<super::Action> for Action {
        fn from(a: super::Action) -> Self {
            match a {
                super::Action::Scheduled(at) => Action::Scheduled { at },
                super::Action::Rescheduled(from, to) => Action::Rescheduled { from, to },
                super::Action::Watching => Action::Watching,
                super::Action::Declined => Action::Declined,
                super::Action::Dropped => Action::Dropped,
                super::Action::Dispatched(attempt) => Action::Dispatched { attempt },
                super::Action::Resolved => Action::Resolved,
                super::Action::Unchanged => Action::Unchanged,
            }
        }
    }

    impl From<Action> for super::Action {
        fn from(a: Action) -> Self {
            match a {
                Action::Scheduled { at } => super::Action::Scheduled(at),
                Action::Rescheduled { from, to } => super::Action::Rescheduled(from, to),
                Action::Watching => super::Action::Watching,
                Action::Declined => super::Action::Declined,
                Action::Dropped => super::Action::Dropped,
                Action::Dispatched { attempt } => super::Action::Dispatched(attempt),
                Action::Resolved => super::Action::Resolved,
                Action::Unchanged => super::Action::Unchanged,
            }
        }
    }
}
