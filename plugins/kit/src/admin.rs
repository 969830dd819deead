//! The records of the pool's `accounts` and `routing` interfaces in plain Rust: the pool
//! builds them, the host's admin API serves them as JSON and its command line reads them
//! back. One definition, so the three agree; serde (feature `serde`) spells them as the
//! admin API does: `snake_case` fields, enum values as the WIT case names, timestamps in
//! epoch milliseconds.

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

// Accounts.

wire_enum! {
    /// How an account authenticates upstream (WIT `accounts.credential-kind`).
    pub enum CredentialKind {
        /// An API key.
        ApiKey => "api-key",
        /// A subscription's OAuth tokens.
        OAuth => "oauth",
    }
}

wire_enum! {
    /// An account's derived status, first match wins (WIT `accounts.account-status`).
    pub enum AccountStatus {
        /// A person disabled it.
        Disabled => "disabled",
        /// Its credential was refused for good; it serves again once a person fixes it.
        Error => "error",
        /// Skipped until its hold ends (a 429 with Retry-After, or a refused fresh token).
        Held => "held",
        /// A window that blocks it is spent.
        Exhausted => "exhausted",
        /// Serves, but a window is past the switch threshold.
        NearLimit => "near-limit",
        /// Serves.
        Ready => "ready",
    }
}

admin_record! {
    /// How the pool may use one account beyond its credential (WIT `accounts.account-options`).
    /// The defaults change nothing: not last-resort, extra usage denied, no in-flight limit,
    /// no preserve ceiling. The admin API shows them as fields of the account, each with its
    /// default when a reader's server left it out; `extra_usage` as `allow` or `deny`.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct AccountOptions {
        /// Used only when no other account of the provider is eligible.
        #[cfg_attr(feature = "serde", serde(default))]
        pub last_resort: bool,
        /// Whether paid extra usage (Claude overage, Codex credits) may cover a spent window.
        #[cfg_attr(feature = "serde", serde(default, with = "allow_deny"))]
        pub extra_usage: bool,
        /// The most requests in flight on the account at once; 0: no limit.
        #[cfg_attr(feature = "serde", serde(default))]
        pub max_in_flight: u32,
        /// The weekly utilization (a fraction > 0 and ≤ 1) from which the account takes no
        /// new conversation while another account can; 1: no ceiling.
        #[cfg_attr(feature = "serde", serde(default = "no_ceiling"))]
        pub preserve: f64,
    }
}

impl Default for AccountOptions {
    fn default() -> Self {
        AccountOptions {
            last_resort: false,
            extra_usage: false,
            max_in_flight: 0,
            preserve: 1.0,
        }
    }
}

impl AccountOptions {
    /// The options that differ from the defaults, in words (`last-resort`, `extra usage
    /// allowed`, `≤ 4 in flight`, `preserve 80%`); empty when none does.
    pub fn words(&self) -> Vec<String> {
        let mut words = Vec::new();
        if self.last_resort {
            words.push("last-resort".to_owned());
        }
        if self.extra_usage {
            words.push("extra usage allowed".to_owned());
        }
        if self.max_in_flight > 0 {
            words.push(format!("≤ {} in flight", self.max_in_flight));
        }
        if self.preserve < 1.0 {
            words.push(format!("preserve {:.0}%", self.preserve * 100.0));
        }
        words
    }
}

#[cfg(feature = "serde")]
fn no_ceiling() -> f64 {
    1.0
}

/// `extra_usage` as the admin API spells it: `allow` or `deny`.
#[cfg(feature = "serde")]
mod allow_deny {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(allow: &bool, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if *allow { "allow" } else { "deny" })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        match String::deserialize(d)?.as_str() {
            "allow" => Ok(true),
            "deny" => Ok(false),
            other => Err(D::Error::custom(format!(
                "extra_usage is `allow` or `deny`, not {other:?}"
            ))),
        }
    }
}

admin_record! {
    /// An account as a person sees it. Holds no secret.
    #[derive(Debug, Clone, PartialEq)]
    pub struct AccountInfo {
        /// The account's id, assigned by the pool when it was added.
        pub id: String,
        /// The provider the account serves; fixed for the account's life.
        pub provider: Provider,
        /// How it authenticates.
        pub kind: CredentialKind,
        /// The label people know it by: 1 to 200 characters.
        pub label: String,
        /// Lower is tried first; ties keep the order the accounts were added in. May be
        /// negative.
        pub priority: i32,
        /// False once a person disabled it (status `disabled`), true again after `enable`.
        pub enabled: bool,
        /// Its derived status.
        pub status: AccountStatus,
        /// `…abcd` for an API key, `oauth` for OAuth.
        pub secret_hint: String,
        /// When the account was added. Epoch milliseconds.
        pub created_at: u64,
        /// When the pool last tried a request upstream with it (to the second); `None` when
        /// never. Epoch milliseconds.
        pub last_used_at: Option<u64>,
        /// The authentication error, when the status is `error`; credentials in it are
        /// redacted.
        pub error: Option<String>,
        /// The end of the current hold, when held. Epoch milliseconds.
        pub held_until: Option<u64>,
        /// A proactive OAuth refresh was refused: it still serves, but a person should sign
        /// in again.
        pub needs_sign_in: bool,
        /// When the OAuth access token expires, when known. Epoch milliseconds.
        pub token_expires_at: Option<u64>,
        /// The quota windows observed for it.
        pub windows: Vec<WindowInfo>,
        /// When a blocked account serves again, when known. Epoch milliseconds.
        pub blocking_reset: Option<u64>,
        /// Its options (fields of the account on the wire).
        #[cfg_attr(feature = "serde", serde(flatten))]
        pub options: AccountOptions,
    }
}

admin_record! {
    /// One observed quota window of an account.
    #[derive(Debug, Clone, PartialEq)]
    pub struct WindowInfo {
        /// The window's name: `5h`, `7d`, `7d_<bucket>` (Claude), `primary` or `secondary`
        /// (Codex).
        pub name: String,
        /// The model family a scoped window applies to (`opus`, `sonnet`, …); `None` for a
        /// shared one. Text, as the WIT has it, so a pool that knows other families can
        /// name them.
        pub family: Option<String>,
        /// 0..=1.
        pub utilization: Option<f64>,
        /// When the window resets, when known. Epoch milliseconds.
        pub resets_at: Option<u64>,
        /// `allowed`, `allowed_warning` or `rejected`, as the provider last stated it.
        pub status: Option<String>,
        /// Whether this window blocks the account now.
        pub blocking: bool,
        /// When the window was observed. Epoch milliseconds.
        pub observed_at: u64,
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

    /// The options are fields of the account, `extra_usage` is `allow` or `deny`, and an
    /// answer without them (an older server) reads as the defaults.
    #[cfg(feature = "serde")]
    #[test]
    fn an_account_shows_its_options_as_its_own_fields() {
        let account = AccountInfo {
            id: "acc_1".into(),
            provider: Provider::Claude,
            kind: CredentialKind::OAuth,
            label: "work".into(),
            priority: -1,
            enabled: true,
            status: AccountStatus::NearLimit,
            secret_hint: "oauth".into(),
            created_at: 5,
            last_used_at: None,
            error: None,
            held_until: None,
            needs_sign_in: false,
            token_expires_at: Some(9),
            windows: vec![WindowInfo {
                name: "7d_opus".into(),
                family: Some("opus".into()),
                utilization: Some(0.5),
                resets_at: Some(7),
                status: Some("allowed".into()),
                blocking: false,
                observed_at: 6,
            }],
            blocking_reset: None,
            options: AccountOptions {
                last_resort: true,
                extra_usage: true,
                max_in_flight: 4,
                preserve: 0.8,
            },
        };
        let json = serde_json::to_value(&account).unwrap();
        assert_eq!(json["kind"], "oauth");
        assert_eq!(json["status"], "near-limit");
        assert_eq!(json["provider"], "claude");
        assert_eq!(json["extra_usage"], "allow");
        assert_eq!(json["last_resort"], true);
        assert_eq!(json["max_in_flight"], 4);
        assert_eq!(json["preserve"], 0.8);
        assert!(json.get("options").is_none());
        assert_eq!(json["windows"][0]["family"], "opus");
        assert_eq!(
            serde_json::from_value::<AccountInfo>(json.clone()).unwrap(),
            account
        );

        let mut older = json;
        for field in ["last_resort", "extra_usage", "max_in_flight", "preserve"] {
            older.as_object_mut().unwrap().remove(field);
        }
        let read: AccountInfo = serde_json::from_value(older.clone()).unwrap();
        assert_eq!(read.options, AccountOptions::default());

        older["extra_usage"] = "sometimes".into();
        let refused = serde_json::from_value::<AccountInfo>(older).unwrap_err();
        assert!(refused.to_string().contains("allow"), "{refused}");
    }
}
