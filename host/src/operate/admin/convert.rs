//! The admin API's one boundary with the plugins' bindings: every conversion from a record
//! the host's generated WIT bindings return to the wire view the API serves it as
//! ([`crate::operate::wire`]). Each is a total match, so a case added to the WIT fails to
//! compile here; a refusal's meaning for a person (its HTTP status and words) stays with its
//! endpoint.

use crate::operate::wire::{
    self, AccountView, ActionView, AttemptView, AvailabilityView, CandidateView, ChainView,
    EntryView, EnvVar, ProviderName, RouteSummaryView, RouteView, SessionSummaryView, SessionView,
    TokenCountsView, TokenTotalView, TriggerView, WindowView,
};
use crate::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountStatus, CredentialKind, ExtraUsage, UsageWindow,
};
use crate::runtime::bindings::pool::exports::pooler::plugins::routing::{
    AttemptOutcome, AttemptRecord, Route, RouteSummary, SessionExplanation, SessionSummary,
};
use crate::runtime::bindings::pool::exports::pooler::plugins::tokens::{TokenCounts, TokenTotal};
use crate::runtime::bindings::retry::exports::pooler::plugins::retry_admin::{
    Action, Candidate, CandidateState, ChainHistory, HistoryEntry, Trigger,
};
use crate::runtime::bindings::types::{
    Availability, BlockCause, ChangeCause, Provider, UnavailableReason,
};

// The provider.

impl From<Provider> for ProviderName {
    fn from(p: Provider) -> Self {
        match p {
            Provider::Claude => ProviderName::Claude,
            Provider::Codex => ProviderName::Codex,
        }
    }
}

impl From<ProviderName> for Provider {
    fn from(p: ProviderName) -> Self {
        match p {
            ProviderName::Claude => Provider::Claude,
            ProviderName::Codex => Provider::Codex,
        }
    }
}

// Accounts.

impl From<AccountInfo> for AccountView {
    fn from(a: AccountInfo) -> Self {
        use crate::operate::wire::{AccountOptions, AccountStatus as S, CredentialKind as K};
        AccountView {
            id: a.id,
            provider: a.provider.into(),
            kind: match a.kind {
                CredentialKind::ApiKey => K::ApiKey,
                CredentialKind::Oauth => K::OAuth,
            },
            label: a.label,
            priority: a.priority,
            enabled: a.enabled,
            status: match a.status {
                AccountStatus::Disabled => S::Disabled,
                AccountStatus::Error => S::Error,
                AccountStatus::Held => S::Held,
                AccountStatus::Exhausted => S::Exhausted,
                AccountStatus::NearLimit => S::NearLimit,
                AccountStatus::Ready => S::Ready,
            },
            secret_hint: a.secret_hint,
            created_at: a.created_at,
            last_used_at: a.last_used_at,
            error: a.error,
            held_until: a.held_until,
            needs_sign_in: a.needs_sign_in,
            token_expires_at: a.token_expires_at,
            windows: a.windows.into_iter().map(WindowView::from).collect(),
            blocking_reset: a.blocking_reset,
            options: AccountOptions {
                last_resort: a.options.last_resort,
                extra_usage: a.options.extra_usage == ExtraUsage::Allow,
                max_in_flight: a.options.max_in_flight,
                preserve: a.options.preserve,
            },
        }
    }
}

impl From<UsageWindow> for WindowView {
    fn from(w: UsageWindow) -> Self {
        WindowView {
            name: w.name,
            family: w.family,
            utilization: w.utilization,
            resets_at: w.resets_at,
            status: w.status,
            blocking: w.blocking,
            observed_at: w.observed_at,
        }
    }
}

// Routes and sessions.

impl From<RouteSummary> for RouteSummaryView {
    fn from(r: RouteSummary) -> Self {
        RouteSummaryView {
            thread: r.thread,
            provider: r.provider.into(),
            opened_at: r.opened_at,
        }
    }
}

impl From<Route> for RouteView {
    fn from(r: Route) -> Self {
        RouteView {
            thread: r.thread,
            provider: r.provider.into(),
            base_url: r.base_url,
            token: r.token,
            env: r
                .env
                .into_iter()
                .map(|(name, value)| EnvVar { name, value })
                .collect(),
            args: r.args,
            config_lines: r.config_lines,
            opened_at: r.opened_at,
        }
    }
}

impl From<SessionSummary> for SessionSummaryView {
    fn from(s: SessionSummary) -> Self {
        SessionSummaryView {
            provider: s.provider.into(),
            key: s.key,
            account: s.account,
            thread: s.thread,
            last_used_at: s.last_used_at,
            expires_at: s.expires_at,
            provisional: s.provisional,
        }
    }
}

impl From<SessionExplanation> for SessionView {
    fn from(s: SessionExplanation) -> Self {
        SessionView {
            provider: s.provider.into(),
            key: s.key,
            account: s.account,
            thread: s.thread,
            last_used_at: s.last_used_at,
            expires_at: s.expires_at,
            why: s.why,
            recent: s.recent.into_iter().map(AttemptView::from).collect(),
        }
    }
}

impl From<AttemptRecord> for AttemptView {
    fn from(a: AttemptRecord) -> Self {
        use crate::operate::wire::AttemptOutcome as W;
        AttemptView {
            at: a.at,
            account: a.account,
            status: a.status,
            outcome: match a.outcome {
                AttemptOutcome::Served => W::Served,
                AttemptOutcome::Detour => W::Detour,
                AttemptOutcome::PassedThrough => W::PassedThrough,
                AttemptOutcome::Transient => W::Transient,
                AttemptOutcome::Hold => W::Hold,
                AttemptOutcome::Quota => W::Quota,
                AttemptOutcome::Family => W::Family,
                AttemptOutcome::Auth => W::Auth,
                AttemptOutcome::Cancelled => W::Cancelled,
            },
        }
    }
}

// Tokens.

impl From<TokenCounts> for TokenCountsView {
    fn from(c: TokenCounts) -> Self {
        TokenCountsView {
            answers: c.answers,
            input: c.input,
            output: c.output,
            cache_read: c.cache_read,
            cache_write: c.cache_write,
        }
    }
}

impl From<TokenTotal> for TokenTotalView {
    fn from(t: TokenTotal) -> Self {
        TokenTotalView {
            provider: ProviderName::from(t.provider),
            account: t.account,
            thread: t.thread,
            model: t.model,
            counts: t.counts.into(),
        }
    }
}

// Provider Retry's diagnostics.

pub(super) fn candidate_view(c: Candidate) -> CandidateView {
    CandidateView {
        thread: c.thread,
        original_request: c.original_request,
        failed_request: c.failed_request,
        state: match c.state {
            CandidateState::Scheduled => crate::operate::wire::CandidateState::Scheduled,
            CandidateState::Watching => crate::operate::wire::CandidateState::Watching,
        },
        row: c.row,
        send_at: c.send_at,
        next_attempt: c.next_attempt,
        reason: c.reason,
        chain_started_at: c.chain_started_at,
    }
}

pub(super) fn chain_view(c: ChainHistory) -> ChainView {
    ChainView {
        thread: c.thread,
        original_request: c.original_request,
        entries: c.entries.into_iter().map(entry_view).collect(),
    }
}

pub(super) fn entry_view(e: HistoryEntry) -> EntryView {
    EntryView {
        at: e.at,
        trigger: match e.trigger {
            Trigger::Failure => TriggerView::Failure,
            Trigger::Signal(causes) => {
                TriggerView::Signal(causes.into_iter().map(change_cause).collect())
            }
            Trigger::Start => TriggerView::Start,
            Trigger::Tick => TriggerView::Tick,
            Trigger::Due => TriggerView::Due,
            Trigger::Person => TriggerView::Person,
            Trigger::Dispatch => TriggerView::Dispatch,
        },
        availability: e.availability.map(availability_view),
        action: match e.action {
            Action::Scheduled(at) => ActionView::Scheduled(at),
            Action::Rescheduled((from, to)) => ActionView::Rescheduled(from, to),
            Action::Watching => ActionView::Watching,
            Action::Declined => ActionView::Declined,
            Action::Dropped => ActionView::Dropped,
            Action::Dispatched(attempt) => ActionView::Dispatched(attempt),
            Action::Resolved => ActionView::Resolved,
            Action::Unchanged => ActionView::Unchanged,
        },
        reason: e.reason,
    }
}

/// A change cause as the kit names it, whose words the admin API and `pooler retry
/// explain` show.
pub(super) fn change_cause(c: ChangeCause) -> wire::ChangeCause {
    use wire::ChangeCause as K;
    match c {
        ChangeCause::AccountAdded => K::AccountAdded,
        ChangeCause::AccountEnabled => K::AccountEnabled,
        ChangeCause::AccountDisabled => K::AccountDisabled,
        ChangeCause::AccountRemoved => K::AccountRemoved,
        ChangeCause::ErrorCleared => K::ErrorCleared,
        ChangeCause::ErrorSet => K::ErrorSet,
        ChangeCause::HoldEnded => K::HoldEnded,
        ChangeCause::ConfigChanged => K::ConfigChanged,
        ChangeCause::RoutingChanged => K::RoutingChanged,
        ChangeCause::PriorityChanged => K::PriorityChanged,
        ChangeCause::EarlierResetObserved => K::EarlierResetObserved,
        ChangeCause::LaterResetObserved => K::LaterResetObserved,
        ChangeCause::ResetPassed => K::ResetPassed,
    }
}

pub(super) fn availability_view(a: Availability) -> AvailabilityView {
    use wire::{BlockCause as C, UnavailableReason as R};
    match a {
        Availability::NotRouted => AvailabilityView::NotRouted,
        Availability::Ready => AvailabilityView::Ready,
        Availability::Blocked(b) => AvailabilityView::Blocked {
            retry_at: b.retry_at,
            cause: match b.cause {
                BlockCause::QuotaExhausted => C::QuotaExhausted,
                BlockCause::FamilyQuotaExhausted => C::FamilyQuotaExhausted,
                BlockCause::Held => C::Held,
                BlockCause::UsageRestricted => C::UsageRestricted,
            },
        },
        Availability::Unavailable(r) => AvailabilityView::Unavailable(match r {
            UnavailableReason::NoEnabledAccount => R::NoEnabledAccount,
            UnavailableReason::Authentication => R::Authentication,
            UnavailableReason::ResetUnknown => R::ResetUnknown,
            UnavailableReason::SourceUnavailable => R::SourceUnavailable,
        }),
    }
}

#[cfg(test)]
mod tests;
