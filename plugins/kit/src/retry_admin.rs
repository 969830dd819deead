//! Provider Retry's open candidates (WIT `retry-admin.candidate`) in plain Rust: the plugin
//! builds them, the host's admin API serves them as JSON and its command line reads them
//! back. One definition, so the three agree; serde (feature `serde`) spells them as the
//! admin API does (`snake_case` fields, the state as its WIT case name, epoch milliseconds).

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
