//! Each conversion keeps every field and spells every case as the WIT names it.

use super::*;
use crate::operate::wire;
use crate::runtime::bindings::types::Blocked;
use serde_json::json;

/// Every outcome shows as the word the pool recorded before the WIT had an enum, so the
/// admin API's `outcome` strings did not change.
#[test]
fn every_attempt_outcome_shows_as_its_stable_word() {
    let cases = [
        (AttemptOutcome::Served, "served"),
        (AttemptOutcome::Detour, "detour"),
        (AttemptOutcome::PassedThrough, "passed-through"),
        (AttemptOutcome::Transient, "transient"),
        (AttemptOutcome::Hold, "hold"),
        (AttemptOutcome::Quota, "quota"),
        (AttemptOutcome::Family, "family"),
        (AttemptOutcome::Auth, "auth"),
        (AttemptOutcome::Cancelled, "cancelled"),
    ];
    for (outcome, word) in cases {
        let view = AttemptView::from(AttemptRecord {
            at: 7,
            account: "acc".into(),
            status: Some(503),
            outcome,
        });
        assert_eq!(
            serde_json::to_value(&view).unwrap(),
            serde_json::json!({"at": 7, "account": "acc", "status": 503, "outcome": word})
        );
    }
}

#[test]
fn candidates_keep_every_field() {
    let view = candidate_view(Candidate {
        thread: "th_1".into(),
        original_request: "rq_1".into(),
        failed_request: "rq_2".into(),
        state: CandidateState::Scheduled,
        row: Some(7),
        send_at: Some(2_000),
        next_attempt: 3,
        reason: "rate-limited".into(),
        chain_started_at: 1_000,
    });
    assert_eq!(
        serde_json::to_value(&view).unwrap(),
        json!({
            "thread": "th_1", "original_request": "rq_1", "failed_request": "rq_2",
            "state": "scheduled", "row": 7, "send_at": 2_000, "next_attempt": 3,
            "reason": "rate-limited", "chain_started_at": 1_000,
        })
    );
    let watching = candidate_view(Candidate {
        state: CandidateState::Watching,
        row: None,
        send_at: None,
        ..Candidate {
            thread: "th_1".into(),
            original_request: "rq_1".into(),
            failed_request: "rq_1".into(),
            state: CandidateState::Scheduled,
            row: None,
            send_at: None,
            next_attempt: 2,
            reason: "pool-unavailable(authentication)".into(),
            chain_started_at: 1_000,
        }
    });
    assert_eq!(watching.state.as_str(), "watching");
    assert_eq!(watching.send_at, None);
}

/// A signal's causes show in the words the plugin used to send as text, joined with
/// ", ", so the admin API's `causes` and the CLI's lines did not change.
#[test]
fn signal_causes_show_in_words() {
    use ChangeCause::*;
    let cases = [
        (AccountAdded, "account added"),
        (AccountEnabled, "account enabled"),
        (AccountDisabled, "account disabled"),
        (AccountRemoved, "account removed"),
        (ErrorCleared, "account error cleared"),
        (ErrorSet, "account error"),
        (HoldEnded, "hold ended"),
        (ConfigChanged, "pool settings changed"),
        (RoutingChanged, "routing changed"),
        (PriorityChanged, "account priorities changed"),
        (EarlierResetObserved, "earlier reset observed"),
        (LaterResetObserved, "later reset observed"),
        (ResetPassed, "reset passed"),
    ];
    for (cause, words) in cases {
        assert_eq!(change_cause(cause).words(), words);
    }
    let view = |causes| {
        entry_view(HistoryEntry {
            at: 1,
            trigger: Trigger::Signal(causes),
            availability: None,
            action: Action::Unchanged,
            reason: "r".into(),
        })
        .trigger
    };
    assert_eq!(
        serde_json::to_value(view(vec![AccountEnabled, HoldEnded])).unwrap(),
        json!({"kind": "signal", "causes": "account enabled, hold ended"})
    );
    assert_eq!(view(vec![]), TriggerView::Signal(vec![]));
    assert_eq!(
        serde_json::to_value(view(vec![])).unwrap(),
        json!({"kind": "signal", "causes": ""})
    );
}

#[test]
fn every_trigger_action_and_availability_maps_to_its_view() {
    let entry = |trigger, action, availability| HistoryEntry {
        at: 5,
        trigger,
        availability,
        action,
        reason: "r".into(),
    };
    let cases = [
        (
            entry(Trigger::Failure, Action::Scheduled(9), None),
            TriggerView::Failure,
            ActionView::Scheduled(9),
            None,
        ),
        (
            entry(
                Trigger::Signal(vec![ChangeCause::AccountEnabled]),
                Action::Rescheduled((9, 6)),
                Some(Availability::Ready),
            ),
            TriggerView::Signal(vec![wire::ChangeCause::AccountEnabled]),
            ActionView::Rescheduled(9, 6),
            Some(AvailabilityView::Ready),
        ),
        (
            entry(
                Trigger::Start,
                Action::Watching,
                Some(Availability::Unavailable(UnavailableReason::Authentication)),
            ),
            TriggerView::Start,
            ActionView::Watching,
            Some(AvailabilityView::Unavailable(
                wire::UnavailableReason::Authentication,
            )),
        ),
        (
            entry(
                Trigger::Tick,
                Action::Declined,
                Some(Availability::NotRouted),
            ),
            TriggerView::Tick,
            ActionView::Declined,
            Some(AvailabilityView::NotRouted),
        ),
        (
            entry(
                Trigger::Due,
                Action::Dropped,
                Some(Availability::Blocked(Blocked {
                    retry_at: 8,
                    cause: BlockCause::FamilyQuotaExhausted,
                })),
            ),
            TriggerView::Due,
            ActionView::Dropped,
            Some(AvailabilityView::Blocked {
                retry_at: 8,
                cause: wire::BlockCause::FamilyQuotaExhausted,
            }),
        ),
        (
            entry(Trigger::Person, Action::Dispatched(2), None),
            TriggerView::Person,
            ActionView::Dispatched(2),
            None,
        ),
        (
            entry(Trigger::Dispatch, Action::Resolved, None),
            TriggerView::Dispatch,
            ActionView::Resolved,
            None,
        ),
        (
            entry(Trigger::Tick, Action::Unchanged, None),
            TriggerView::Tick,
            ActionView::Unchanged,
            None,
        ),
    ];
    for (wit, trigger, action, availability) in cases {
        assert_eq!(
            entry_view(wit),
            EntryView {
                at: 5,
                trigger,
                availability,
                action,
                reason: "r".into(),
            }
        );
    }
    let chain = chain_view(ChainHistory {
        thread: "th_1".into(),
        original_request: "rq_1".into(),
        entries: vec![entry(Trigger::Failure, Action::Watching, None)],
    });
    assert_eq!(chain.entries.len(), 1);
    assert_eq!(chain.original_request, "rq_1");
}

#[test]
fn every_block_cause_and_unavailable_reason_keeps_its_wit_name() {
    for (cause, name) in [
        (BlockCause::QuotaExhausted, "quota-exhausted"),
        (BlockCause::FamilyQuotaExhausted, "family-quota-exhausted"),
        (BlockCause::Held, "held"),
        (BlockCause::UsageRestricted, "usage-restricted"),
    ] {
        assert_eq!(
            serde_json::to_value(availability_view(Availability::Blocked(Blocked {
                retry_at: 1,
                cause
            })))
            .unwrap(),
            json!({"kind": "blocked", "retry_at": 1, "cause": name})
        );
    }
    for (reason, name) in [
        (UnavailableReason::NoEnabledAccount, "no-enabled-account"),
        (UnavailableReason::Authentication, "authentication"),
        (UnavailableReason::ResetUnknown, "reset-unknown"),
        (UnavailableReason::SourceUnavailable, "source-unavailable"),
    ] {
        assert_eq!(
            serde_json::to_value(availability_view(Availability::Unavailable(reason))).unwrap(),
            json!({"kind": "unavailable", "reason": name})
        );
    }
}
