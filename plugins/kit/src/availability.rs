//! The pool's answer to "when can you serve this thread again?" (the WIT `types.availability`
//! and its parts), in plain Rust: the pool computes it, Provider Retry schedules by it. One
//! definition, so both plugins mean the same by every case.

use crate::Provider;
use crate::cause::ChangeCause;

wire_enum! {
    /// Why nothing can serve and no time is known (WIT `unavailable-reason`).
    pub enum UnavailableReason {
        /// No enabled account for the provider (or none whose credential kind fits).
        NoEnabledAccount => "no-enabled-account",
        /// Every candidate account needs a person to sign in again.
        Authentication => "authentication",
        /// Blocked, and no blocking window has a known reset.
        ResetUnknown => "reset-unknown",
        /// The pool could not be asked (no pool loaded, or the call failed); never the pool's
        /// own answer.
        SourceUnavailable => "source-unavailable",
    }
}

wire_enum! {
    /// Why a blocked pool is blocked (WIT `block-cause`); informational.
    pub enum BlockCause {
        /// A shared window (5 h, 7 d, a Codex window) is spent on every candidate.
        QuotaExhausted => "quota-exhausted",
        /// The model family's own window is spent on every candidate.
        FamilyQuotaExhausted => "family-quota-exhausted",
        /// Every candidate is held after a refusal.
        Held => "held",
        /// A usage restriction (a Codex workspace hard stop) stands on every candidate.
        UsageRestricted => "usage-restricted",
    }
}

/// The pool's answer to "when can you serve this thread again?" (WIT `availability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(into = "wire::Availability", from = "wire::Availability")
)]
pub enum Availability {
    /// The thread is not routed through the pool: the pool has no say.
    NotRouted,
    /// An account can serve now.
    Ready,
    /// Nothing can serve before `retry_at`.
    Blocked { retry_at: u64, cause: BlockCause },
    /// Nothing can serve, and no time is known.
    Unavailable(UnavailableReason),
}

impl Availability {
    /// A compact, stable text form, used for storage and parsed back by [`Self::decode`]:
    /// `not-routed`, `ready`, `blocked:<retry-at>:<cause>`, `unavailable:<reason>`.
    pub fn encode(&self) -> String {
        match self {
            Availability::NotRouted => "not-routed".to_owned(),
            Availability::Ready => "ready".to_owned(),
            Availability::Blocked { retry_at, cause } => format!("blocked:{retry_at}:{cause}"),
            Availability::Unavailable(r) => format!("unavailable:{r}"),
        }
    }

    /// The inverse of [`Self::encode`]; `None` for any other text.
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

/// The pool's signal that its availability for a provider may have changed (WIT
/// `availability-change`).
#[derive(Debug, Clone, PartialEq)]
pub struct AvailabilityChange {
    pub provider: Provider,
    /// What happened, each distinct cause once, first seen first.
    pub causes: Vec<ChangeCause>,
    /// The pool-wide answer for a new conversation of the provider: a hint, since pins and
    /// model families differ per thread.
    pub earliest: Availability,
    /// When the (first coalesced) change was detected (epoch ms).
    pub detected_at: u64,
}

/// The admin API's form of an availability: an object whose `kind` is the case name
/// (`{"kind": "blocked", "retry_at": …, "cause": "held"}`, `{"kind": "unavailable",
/// "reason": "authentication"}`).
#[cfg(feature = "serde")]
mod wire {
    use super::{BlockCause, UnavailableReason};

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    pub enum Availability {
        NotRouted,
        Ready,
        Blocked { retry_at: u64, cause: BlockCause },
        Unavailable { reason: UnavailableReason },
    }

    impl From<super::Availability> for Availability {
        fn from(a: super::Availability) -> Self {
            match a {
                super::Availability::NotRouted => Availability::NotRouted,
                super::Availability::Ready => Availability::Ready,
                super::Availability::Blocked { retry_at, cause } => {
                    Availability::Blocked { retry_at, cause }
                }
                super::Availability::Unavailable(reason) => Availability::Unavailable { reason },
            }
        }
    }

    impl From<Availability> for super::Availability {
        fn from(a: Availability) -> Self {
            match a {
                Availability::NotRouted => super::Availability::NotRouted,
                Availability::Ready => super::Availability::Ready,
                Availability::Blocked { retry_at, cause } => {
                    super::Availability::Blocked { retry_at, cause }
                }
                Availability::Unavailable { reason } => super::Availability::Unavailable(reason),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_availability_round_trips_its_text_form() {
        let mut all = vec![Availability::NotRouted, Availability::Ready];
        for &cause in BlockCause::ALL {
            all.push(Availability::Blocked {
                retry_at: 1_700_000_000_123,
                cause,
            });
        }
        for &r in UnavailableReason::ALL {
            all.push(Availability::Unavailable(r));
        }
        for a in all {
            assert_eq!(Availability::decode(&a.encode()), Some(a), "{a:?}");
        }
        for bad in [
            "",
            "blocked:x:held",
            "blocked:1:nope",
            "unavailable:",
            "Ready",
        ] {
            assert_eq!(Availability::decode(bad), None, "{bad}");
        }
    }
}
