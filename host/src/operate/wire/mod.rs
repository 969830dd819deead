//! The admin API on the wire: what the server ([`crate::operate::admin`]) and its client, the
//! `pooler` command line ([`crate::cli`]), both speak — the path prefix, the token file, the
//! origin header, path-segment percent-encoding and every JSON view. The server converts
//! the plugins' answers into these views; the CLI reads them. Neither end owns them, so the
//! CLI is a pure client of this module and the server never depends on its client. Where a
//! plugin has a plain-Rust record of its own (accounts, routes, sessions, settings, retry
//! candidates and histories), the view is that record, defined once in the plugins' kit;
//! the rest (tokens, the overview, the core's threads) are defined here.
//!
//! Conventions: timestamps are unix epoch milliseconds (UTC); field names are `snake_case`;
//! enum values are the WIT case names; a variant with fields is an object whose `kind` is
//! the case name (`{"kind": "rescheduled", "from": …, "to": …}`).

pub mod overview;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The admin API's path prefix.
pub const ADMIN_PREFIX: &str = "/_pooler/";
/// The admin token's file name in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
/// The header that marks a response the pool or the host made itself, not the upstream
/// provider (`x-pooler-origin: pool`): the core's, which reads it when it classifies a turn.
pub use pooler_core::classify::POOL_ORIGIN_HEADER as ORIGIN_HEADER;

/// `http://<addr>`, with the loopback address when the server listens on every address: the
/// URL agents reach a server at (routes are opened with it, the core sends its turns to it).
pub fn endpoint_url(addr: SocketAddr) -> String {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{addr}")
}

/// Every byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`): safe in a path
/// segment, a query component and a form field alike.
pub const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode a path segment (everything but unreserved characters).
pub fn percent_encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, COMPONENT).to_string()
}

/// A provider as the admin API and the CLI spell it (`claude`, `codex`): the one provider
/// type of every crate, under the name the wire types have always used.
pub use pooler_core::Provider as ProviderName;

/// The CLI's parser of a `--provider` value: the wire spellings, each with its help.
pub fn provider_arg() -> impl clap::builder::TypedValueParser<Value = ProviderName> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new([
        PossibleValue::new("claude").help("Anthropic (Claude Code)"),
        PossibleValue::new("codex").help("OpenAI (Codex CLI)"),
    ])
    .map(|s| ProviderName::parse(&s).expect("one of the possible values"))
}

// Accounts (`/_pooler/accounts…`).

/// An account as the admin API shows it (no secret), its status, kind and options, and its
/// observed quota windows: the pool's own records (the plugins' kit's). The options show as
/// fields of the account (`last_resort`, `extra_usage`: `allow` or `deny`, `max_in_flight`,
/// `preserve`), each taking its default when a server left it out.
pub use pooler_plugin_kit::admin::{
    AccountInfo as AccountView, AccountOptions, AccountStatus, CredentialKind,
    WindowInfo as WindowView,
};

// Routes (`/_pooler/routes…`) and sessions (`/_pooler/sessions…`): the pool's own records
// (the plugins' kit's), which the pool builds and serde spells as this API does.

/// One environment variable of a route.
pub use pooler_plugin_kit::admin::EnvVar;
/// A route as the admin API shows it, once, to whoever opened it.
pub use pooler_plugin_kit::admin::Route as RouteView;
/// An open route as `GET /routes` lists it: no token (the pool keeps only its hash).
pub use pooler_plugin_kit::admin::RouteSummary as RouteSummaryView;
/// Where a session is pinned and why.
pub use pooler_plugin_kit::admin::SessionExplanation as SessionView;
/// A pinned session as `GET /sessions` lists it.
pub use pooler_plugin_kit::admin::SessionSummary as SessionSummaryView;
/// One upstream attempt of a session; `outcome` is the WIT `attempt-outcome` case's name.
pub use pooler_plugin_kit::admin::{AttemptOutcome, AttemptRecord as AttemptView};

// Settings (`/_pooler/settings…`).

/// One setting as the admin API shows it: the plugins' own record (the kit's), its key with
/// its role prefix (`pool.switch-threshold`), `default_value` spelled `default`.
pub use pooler_plugin_kit::settings::Setting as SettingView;

// Provider Retry's diagnostics (`/_pooler/retry…`).

/// An open candidate (a chain with a live retry row or a watch) and its state: Provider
/// Retry's own record (the plugins' kit's). `state` is `scheduled` or `watching`.
pub use pooler_plugin_kit::retry_admin::{Candidate as CandidateView, CandidateState};

/// A chain's history (oldest entry first), each entry's trigger, action and the pool's
/// availability as the plugin saw it: Provider Retry's own records (the plugins' kit's),
/// each variant an object whose `kind` is the case name; a signal's `causes` in words,
/// joined with ", " ("account enabled, hold ended").
pub use pooler_plugin_kit::availability::Availability as AvailabilityView;
pub use pooler_plugin_kit::availability::{BlockCause, UnavailableReason};
pub use pooler_plugin_kit::cause::ChangeCause;
pub use pooler_plugin_kit::retry_admin::{
    Action as ActionView, ChainHistory as ChainView, HistoryEntry as EntryView,
    Trigger as TriggerView,
};

// Tokens (`/_pooler/tokens`, the overview, `GET /threads/{id}`).

/// Tokens of served answers by kind, as the pool's `tokens.token-counts` states them: the
/// input kinds never overlap (every input token is fresh `input`, a `cache_read` or a
/// `cache_write`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCountsView {
    /// Answers that reported usage.
    pub answers: u64,
    /// Input tokens neither read from nor written to the prompt cache.
    pub input: u64,
    /// Output tokens, reasoning tokens included.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache (always 0 for Codex).
    pub cache_write: u64,
}

impl TokenCountsView {
    /// The share of input tokens read from the prompt cache (0 to 1); None with no input.
    pub fn cache_hit_share(&self) -> Option<f64> {
        let all = self
            .input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write);
        (all > 0).then(|| self.cache_read as f64 / all as f64)
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == TokenCountsView::default()
    }
}

/// The usage of one group (`tokens.token-total`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenTotalView {
    /// The provider of the account.
    pub provider: ProviderName,
    /// The account that served the answers (it may have been removed since).
    pub account: String,
    /// The thread (grouped by thread only).
    pub thread: Option<String>,
    /// The model the answers named (grouped by thread only).
    pub model: Option<String>,
    /// The tokens counted for the group.
    pub counts: TokenCountsView,
}

/// An account's token usage today (since the local midnight of the reader's UTC offset) and
/// in the last five hours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountTokensView {
    /// Since the overview's `tokens_today_since`: local midnight at the reader's UTC offset.
    pub today: TokenCountsView,
    /// In the last five hours.
    pub last_5h: TokenCountsView,
}
