//! The records of the pool's `routing` interface in plain Rust: the pool builds them, the
//! host's admin API serves them as JSON and its command line reads them back. One
//! definition, so the three agree; serde (feature `serde`) spells them as the admin API
//! does: `snake_case` fields, enum values as the WIT case names, timestamps in epoch
//! milliseconds.

use crate::Provider;

/// Serde for an admin record, under its Rust (`snake_case`) field names (feature `serde`).
macro_rules! admin_record {
    ($item:item) => {
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        $item
    };
}

wire_enum! {
    /// What became of one upstream attempt of a session (WIT `routing.attempt-outcome`,
    /// whose docs say what each case means). The pool stores the case name.
    pub enum AttemptOutcome {
        /// Served, and the session is pinned on it.
        Served => "served",
        /// Served while the session stays pinned elsewhere (the commit rule kept the pin).
        Detour => "detour",
        /// Its answer was returned to the client as is.
        PassedThrough => "passed-through",
        /// Failed transiently (after its same-account retries): a detour.
        Transient => "transient",
        /// Held (429 or refused fresh token): a detour.
        Hold => "hold",
        /// A shared quota window refused it: lasting.
        Quota => "quota",
        /// The requested family's window refused it: a detour.
        Family => "family",
        /// Its credential was refused for good: lasting.
        Auth => "auth",
        /// The client went away during the attempt (or the wait before it).
        Cancelled => "cancelled",
    }
}

impl AttemptOutcome {
    /// Whether the refusal outlasts the request (a spent shared window, a refused
    /// credential), so the session's pin must move.
    pub fn is_lasting(self) -> bool {
        matches!(self, AttemptOutcome::Quota | AttemptOutcome::Auth)
    }
}

admin_record! {
    /// A thread's route through the pool, with its token: shown once, to whoever opened it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Route {
        /// The thread the route belongs to.
        pub thread: String,
        /// The provider the route serves.
        pub provider: Provider,
        /// The URL the agent sends its requests to (the server's endpoint; plus `/v1` for
        /// Codex).
        pub base_url: String,
        /// The route's secret token.
        pub token: String,
        /// Environment variables the agent needs, in order.
        pub env: Vec<EnvVar>,
        /// Extra command-line arguments the agent needs (Codex CLI's `-c …` flags).
        pub args: Vec<String>,
        /// The same configuration as `config.toml` lines (Codex CLI).
        pub config_lines: Vec<String>,
        /// When the route was opened. Epoch milliseconds.
        pub opened_at: u64,
    }
}

admin_record! {
    /// One environment variable an agent needs.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct EnvVar {
        /// The variable's name (`ANTHROPIC_BASE_URL`).
        pub name: String,
        /// Its value, verbatim.
        pub value: String,
    }
}

admin_record! {
    /// An open route as a listing shows it: no token (the pool keeps only its hash).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct RouteSummary {
        /// The thread the route belongs to.
        pub thread: String,
        /// The provider the route serves.
        pub provider: Provider,
        /// When the route was (last) opened. Epoch milliseconds.
        pub opened_at: u64,
    }
}

admin_record! {
    /// Where a session is pinned and why.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SessionExplanation {
        /// The provider of the session.
        pub provider: Provider,
        /// The session key as the pool stores it.
        pub key: String,
        /// The pinned account, when a fresh pin exists.
        pub account: Option<String>,
        /// The thread whose route made the pin, when known.
        pub thread: Option<String>,
        /// When the pin was last used. Epoch milliseconds.
        pub last_used_at: Option<u64>,
        /// When the pin expires: `last_used_at` plus the pin idle lifetime. Epoch
        /// milliseconds.
        pub expires_at: Option<u64>,
        /// Why the session is where it is, in words (`pinned on first success`).
        pub why: String,
        /// The latest attempts, newest last.
        pub recent: Vec<AttemptRecord>,
    }
}

admin_record! {
    /// A pinned session as a listing shows it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SessionSummary {
        /// The provider of the session.
        pub provider: Provider,
        /// The session key as the pool stores it (what `session explain` takes).
        pub key: String,
        /// The account it is pinned on.
        pub account: String,
        /// The thread whose route made the pin, when known.
        pub thread: Option<String>,
        /// When the pin was last used (to the second). Epoch milliseconds.
        pub last_used_at: u64,
        /// When the pin expires. Epoch milliseconds.
        pub expires_at: u64,
        /// The first request of the session is still in flight.
        pub provisional: bool,
    }
}

admin_record! {
    /// One upstream attempt of a session.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct AttemptRecord {
        /// When the attempt finished. Epoch milliseconds.
        pub at: u64,
        /// The account tried.
        pub account: String,
        /// The upstream status; `None` for a transport failure.
        pub status: Option<u16>,
        /// What became of it.
        pub outcome: AttemptOutcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_reads_back_from_its_word_and_a_spent_window_or_key_lasts() {
        for &o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(AttemptOutcome::parse("Served"), None);
        assert!(AttemptOutcome::Quota.is_lasting() && AttemptOutcome::Auth.is_lasting());
        assert!(!AttemptOutcome::Hold.is_lasting() && !AttemptOutcome::Family.is_lasting());
    }
}
