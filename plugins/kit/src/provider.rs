//! The AI provider (the WIT `types.provider`), in plain Rust: the pool's accounts, routes
//! and requests and Provider Retry's threads all belong to one. One definition, so every
//! plugin names and stores providers alike (`claude`, `codex`: the WIT case names).

use std::fmt;

/// The AI provider an account, a route, a request or a thread belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Provider {
    /// Anthropic's Messages API (Claude Code).
    Claude,
    /// OpenAI's Responses API (Codex CLI).
    Codex,
}

impl Provider {
    /// Every provider, in the WIT's order.
    pub const ALL: [Provider; 2] = [Provider::Claude, Provider::Codex];

    /// The WIT case name, which is also the stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Claude => "claude",
            Provider::Codex => "codex",
        }
    }

    /// The provider a WIT case name names.
    pub fn parse(s: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The upstream's name for people ("Anthropic", "ChatGPT").
    pub fn upstream_name(self) -> &'static str {
        match self {
            Provider::Claude => "Anthropic",
            Provider::Codex => "ChatGPT",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_parses_back_from_its_name() {
        for p in Provider::ALL {
            assert_eq!(Provider::parse(p.as_str()), Some(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(Provider::parse("Claude"), None);
        assert_eq!(Provider::parse(""), None);
    }
}
