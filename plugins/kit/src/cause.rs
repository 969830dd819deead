//! The causes of an availability change (the WIT `types.change-cause`), in plain Rust: the
//! pool records them with the changes it signals, a listener keeps them in its history.
//! One definition, so every plugin names and stores them alike.

/// Why the pool's availability may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeCause {
    AccountAdded,
    AccountEnabled,
    AccountDisabled,
    AccountRemoved,
    ErrorCleared,
    ErrorSet,
    HoldEnded,
    ConfigChanged,
    RoutingChanged,
    PriorityChanged,
    EarlierResetObserved,
    LaterResetObserved,
    ResetPassed,
}

impl ChangeCause {
    /// Every cause, in the WIT's order.
    pub const ALL: [ChangeCause; 13] = [
        ChangeCause::AccountAdded,
        ChangeCause::AccountEnabled,
        ChangeCause::AccountDisabled,
        ChangeCause::AccountRemoved,
        ChangeCause::ErrorCleared,
        ChangeCause::ErrorSet,
        ChangeCause::HoldEnded,
        ChangeCause::ConfigChanged,
        ChangeCause::RoutingChanged,
        ChangeCause::PriorityChanged,
        ChangeCause::EarlierResetObserved,
        ChangeCause::LaterResetObserved,
        ChangeCause::ResetPassed,
    ];

    /// The cause's stable name, its WIT case's (`account-enabled`): how plugins store it.
    pub fn name(self) -> &'static str {
        match self {
            ChangeCause::AccountAdded => "account-added",
            ChangeCause::AccountEnabled => "account-enabled",
            ChangeCause::AccountDisabled => "account-disabled",
            ChangeCause::AccountRemoved => "account-removed",
            ChangeCause::ErrorCleared => "error-cleared",
            ChangeCause::ErrorSet => "error-set",
            ChangeCause::HoldEnded => "hold-ended",
            ChangeCause::ConfigChanged => "config-changed",
            ChangeCause::RoutingChanged => "routing-changed",
            ChangeCause::PriorityChanged => "priority-changed",
            ChangeCause::EarlierResetObserved => "earlier-reset-observed",
            ChangeCause::LaterResetObserved => "later-reset-observed",
            ChangeCause::ResetPassed => "reset-passed",
        }
    }

    /// The cause in words ("account enabled"), as the admin API and `pooler retry explain`
    /// show it, and as Provider Retry's history once stored it.
    pub fn words(self) -> &'static str {
        match self {
            ChangeCause::AccountAdded => "account added",
            ChangeCause::AccountEnabled => "account enabled",
            ChangeCause::AccountDisabled => "account disabled",
            ChangeCause::AccountRemoved => "account removed",
            ChangeCause::ErrorCleared => "account error cleared",
            ChangeCause::ErrorSet => "account error",
            ChangeCause::HoldEnded => "hold ended",
            ChangeCause::ConfigChanged => "pool settings changed",
            ChangeCause::RoutingChanged => "routing changed",
            ChangeCause::PriorityChanged => "account priorities changed",
            ChangeCause::EarlierResetObserved => "earlier reset observed",
            ChangeCause::LaterResetObserved => "later reset observed",
            ChangeCause::ResetPassed => "reset passed",
        }
    }

    /// The cause these words stand for (exactly as [`ChangeCause::words`] writes them).
    pub fn from_words(words: &str) -> Option<ChangeCause> {
        Self::ALL.into_iter().find(|c| c.words() == words)
    }

    /// The cause a stable name stands for (exactly as [`ChangeCause::name`] writes it).
    pub fn parse(s: &str) -> Option<ChangeCause> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_causes_round_trip_their_names() {
        for cause in ChangeCause::ALL {
            assert_eq!(ChangeCause::parse(cause.name()), Some(cause));
        }
    }
}
