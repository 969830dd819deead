//! The pool's vocabulary: providers, model families, credentials and account records as
//! plain Rust types. Nothing here touches storage or WIT; the store and the component glue
//! convert to and from these.

use std::fmt;

/// The AI provider an account, a route or a request belongs to: the kit's, shared by
/// every plugin.
pub use pooler_plugin_kit::Provider;

/// A model family: the unit Claude's scoped weekly windows (`7d_<bucket>`) apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Fable,
    Sonnet,
    Opus,
    Haiku,
    Other,
}

impl Family {
    /// The family a model name (or a scoped bucket name) belongs to: the first of fable,
    /// sonnet, opus, haiku found as a case-insensitive substring, else `Other`.
    pub fn of(name: &str) -> Family {
        let lower = name.to_ascii_lowercase();
        for (needle, family) in [
            ("fable", Family::Fable),
            ("sonnet", Family::Sonnet),
            ("opus", Family::Opus),
            ("haiku", Family::Haiku),
        ] {
            if lower.contains(needle) {
                return family;
            }
        }
        Family::Other
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Fable => "fable",
            Family::Sonnet => "sonnet",
            Family::Opus => "opus",
            Family::Haiku => "haiku",
            Family::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "fable" => Some(Family::Fable),
            "sonnet" => Some(Family::Sonnet),
            "opus" => Some(Family::Opus),
            "haiku" => Some(Family::Haiku),
            "other" => Some(Family::Other),
            _ => None,
        }
    }
}

/// How an account authenticates, its derived status and its options: the kit's records of
/// the `accounts` interface, which the admin API shows.
pub use pooler_plugin_kit::admin::{AccountOptions, AccountStatus, CredentialKind};

/// OAuth tokens of a subscription login.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthTokens {
    pub access_token: String,
    pub refresh_token: String,
    /// When the access token expires; None = unknown (valid until refused).
    pub expires_at: Option<u64>,
    /// Codex only: sent as `chatgpt-account-id`.
    pub chatgpt_account_id: Option<String>,
}

/// An account's secret. `Debug` never prints the secret itself.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    ApiKey(String),
    OAuth(OAuthTokens),
}

impl Credential {
    pub fn kind(&self) -> CredentialKind {
        match self {
            Credential::ApiKey(_) => CredentialKind::ApiKey,
            Credential::OAuth(_) => CredentialKind::OAuth,
        }
    }

    /// What a person may see of the secret: an API key's last 4 characters as `…abcd`,
    /// `oauth` for OAuth tokens.
    pub fn hint(&self) -> String {
        match self {
            Credential::ApiKey(key) => {
                let chars: Vec<char> = key.chars().collect();
                let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
                format!("…{tail}")
            }
            Credential::OAuth(_) => "oauth".to_owned(),
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credential({}, {})", self.kind().as_str(), self.hint())
    }
}

impl fmt::Debug for OAuthTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OAuthTokens(expires_at: {:?})", self.expires_at)
    }
}

/// Why an account is held (skipped until `held_until`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// A plain 429 with a Retry-After.
    RateLimit,
    /// The upstream refused a freshly refreshed OAuth token: the pool answers 503 for it.
    Token,
}

impl HoldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::RateLimit => "rate-limit",
            HoldKind::Token => "token",
        }
    }
    pub fn parse(s: &str) -> Option<HoldKind> {
        match s {
            "rate-limit" => Some(HoldKind::RateLimit),
            "token" => Some(HoldKind::Token),
            _ => None,
        }
    }
}

/// A change of an account's options: a field left `None` keeps its value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OptionsChange {
    pub last_resort: Option<bool>,
    pub extra_usage: Option<bool>,
    pub max_in_flight: Option<u32>,
    pub preserve: Option<f64>,
}

impl OptionsChange {
    /// The options after the change; an error naming the field when a value is out of
    /// range (nothing changes then).
    pub fn apply(&self, to: AccountOptions) -> Result<AccountOptions, String> {
        if let Some(p) = self.preserve
            && !(p.is_finite() && p > 0.0 && p <= 1.0)
        {
            return Err(format!(
                "preserve must be a fraction > 0 and ≤ 1 (1: no ceiling), got {p}"
            ));
        }
        if let Some(n) = self.max_in_flight
            && n > MAX_IN_FLIGHT_LIMIT
        {
            return Err(format!(
                "max-in-flight must be 0 (no limit) to {MAX_IN_FLIGHT_LIMIT}, got {n}"
            ));
        }
        Ok(AccountOptions {
            last_resort: self.last_resort.unwrap_or(to.last_resort),
            extra_usage: self.extra_usage.unwrap_or(to.extra_usage),
            max_in_flight: self.max_in_flight.unwrap_or(to.max_in_flight),
            preserve: self.preserve.unwrap_or(to.preserve),
        })
    }
}

/// The largest per-account in-flight limit accepted.
pub const MAX_IN_FLIGHT_LIMIT: u32 = 10_000;

/// Causes of an availability change: the kit's, shared with every plugin.
pub use pooler_plugin_kit::cause::ChangeCause;

/// The availability answer and its parts: the kit's, shared with Provider Retry. The pool
/// never answers `source-unavailable` itself (that is the host's answer when no pool can be
/// asked).
pub use pooler_plugin_kit::availability::{Availability, BlockCause, UnavailableReason};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_family_is_first_matching_substring_case_insensitive() {
        let table = [
            ("claude-opus-4-1", Family::Opus),
            ("claude-sonnet-4-5-20250929", Family::Sonnet),
            ("CLAUDE-HAIKU", Family::Haiku),
            ("fable-sonnet-hybrid", Family::Fable),
            ("gpt-5-codex", Family::Other),
            ("", Family::Other),
        ];
        for (model, want) in table {
            assert_eq!(Family::of(model), want, "{model}");
        }
    }

    #[test]
    fn credential_debug_and_hint_never_show_the_secret() {
        let key = Credential::ApiKey("sk-ant-secret-abcd".into());
        assert_eq!(key.hint(), "…abcd");
        let dbg = format!("{key:?}");
        assert!(!dbg.contains("secret"), "{dbg}");
        let oauth = Credential::OAuth(OAuthTokens {
            access_token: "at-secret".into(),
            refresh_token: "rt-secret".into(),
            expires_at: Some(5),
            chatgpt_account_id: None,
        });
        assert_eq!(oauth.hint(), "oauth");
        assert!(!format!("{oauth:?}").contains("secret"));
        assert_eq!(Credential::ApiKey("ab".into()).hint(), "…ab");
    }
}
