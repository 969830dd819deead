//! Threads, turns and the outbox: what a finished turn records, what the plugin events carry,
//! and how the outbox delivers them at least once, in order per thread, across restarts.

use crate::common;

use common::*;
use pooler_core::*;

#[test]
fn a_message_waits_as_queued_input_until_the_turn_starts() {
    let f = Fixture::new();
    let thread = f.core.new_thread(Provider::Claude, None, None).unwrap();
    let request = f.core.send(&thread, "hello").unwrap();
    let info = f.core.get_thread(&thread).unwrap();
    assert!(info.input_queued);
    assert_eq!(info.latest_request, None);
    assert_eq!(info.status, ThreadStatus::Idle);
    assert!(!info.routed_by_pool);

    let plans = f.core.start_turns().unwrap();
    assert_eq!(plans.len(), 1);
    let plan = &plans[0];
    assert_eq!(plan.request, request);
    assert_eq!(
        (plan.attempt, plan.original_request.as_str()),
        (1, request.as_str())
    );
    assert_eq!(plan.trigger, TurnTrigger::User);
    assert_eq!(plan.session_id.len(), 36);
    let info = f.core.get_thread(&thread).unwrap();
    assert_eq!(info.status, ThreadStatus::Active);
    assert!(!info.input_queued);
    assert_eq!(info.latest_request, Some(request));
    assert!(
        f.core.start_turns().unwrap().is_empty(),
        "one turn per thread at a time"
    );
}

#[test]
fn messages_start_only_while_the_concurrency_limit_has_room() {
    let f = Fixture::new();
    f.core.set_concurrency_limit(2).unwrap();
    let threads: Vec<ThreadId> = (0..3)
        .map(|i| {
            let t = f.core.new_thread(Provider::Codex, None, None).unwrap();
            f.core.send(&t, &format!("m{i}")).unwrap();
            t
        })
        .collect();
    let started = f.core.start_turns().unwrap();
    assert_eq!(started.len(), 2);
    assert!(f.core.get_thread(&threads[2]).unwrap().input_queued);
    f.succeed(&started[0].request);
    let next = f.core.start_turns().unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].thread, threads[2]);
}

#[test]
fn a_success_marks_the_thread_idle_and_writes_turn_succeeded() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    let (thread, plan) = f.running_thread(Provider::Claude, "hi");
    f.advance_ms(1_500);
    let event_id = f.succeed(&plan.request);
    assert_eq!(
        f.core.get_thread(&thread).unwrap().status,
        ThreadStatus::Idle
    );
    let pending = f.core.pending_events("provider-retry", 10).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, event_id);
    assert_eq!(
        pending[0].event,
        PluginEvent::TurnSucceeded(TurnSucceededEvent {
            thread,
            provider: Provider::Claude,
            request: plan.request.clone(),
            original_request: plan.request,
            attempt: 1,
            succeeded_at: T0 + 1_500,
        })
    );
}

#[test]
fn a_failure_marks_the_thread_error_and_writes_a_complete_turn_failed_event() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    // An earlier success observed a snapshot for the provider.
    let (_, earlier) = f.running_thread(Provider::Claude, "warm-up");
    let snapshot = RateLimitSnapshot {
        provider: Provider::Claude,
        status: LimitStatus::Blocked,
        kind: LimitKind::SubscriptionWindow,
        windows: vec![LimitWindow {
            key: Some("5h".into()),
            label: None,
            status: LimitStatus::Blocked,
            resets_at: Some(T0 + 7_200_000),
            utilization: Some(1.0),
        }],
        reached_reason: Some("five_hour".into()),
        observed_at: T0,
    };
    f.core
        .record_outcome(
            &earlier.request,
            &TurnOutcome {
                result: TurnResult::Succeeded { reply: "ok".into() },
                input_accepted: true,
                rate_limits: Some(snapshot.clone()),
                agent_session: None,
                input_in_session: false,
            },
        )
        .unwrap();

    let (thread, plan) = f.running_thread(Provider::Claude, "the real work");
    f.core.mark_input_accepted(&plan.request).unwrap();
    f.advance_ms(10_000);
    // The driver lost track of acceptance; what was noted during the turn still counts.
    let mut outcome = failed_outcome(false);
    outcome.input_accepted = false;
    f.core.record_outcome(&plan.request, &outcome).unwrap();

    let info = f.core.get_thread(&thread).unwrap();
    assert_eq!(info.status, ThreadStatus::Error);
    let pending = f.core.pending_events("provider-retry", 10).unwrap();
    let PluginEvent::TurnFailed(event) = &pending.last().unwrap().event else {
        panic!("expected turn-failed, got {pending:?}");
    };
    assert_eq!(
        event,
        &TurnFailedEvent {
            thread: thread.clone(),
            provider: Provider::Claude,
            model: Some("model-x".into()),
            failed_request: plan.request.clone(),
            original_request: plan.request.clone(),
            attempt: 1,
            failed_at: T0 + 10_000,
            chain_started_at: T0 + 10_000,
            input_accepted: true,
            routed_by_pool: true,
            rate_limits: Some(snapshot),
            failure: Some(rate_limit_failure()),
        }
    );
}

#[test]
fn a_retry_failure_carries_its_attempt_and_the_chain_start() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    let (thread, original) = f.failed_thread("hello");
    f.core
        .schedule_retry(&thread, &original, T0 + 60_000, "r")
        .unwrap();
    f.advance_ms(60_000);
    let retry = f
        .core
        .dispatch(&f.core.claim_due(f.now()).unwrap().remove(0))
        .unwrap();
    f.advance_ms(5_000);
    f.fail(&retry.request, false);
    let pending = f.core.pending_events("provider-retry", 10).unwrap();
    let PluginEvent::TurnFailed(event) = &pending[1].event else {
        panic!("expected turn-failed");
    };
    assert_eq!(event.failed_request, retry.request);
    assert_eq!(event.original_request, original);
    assert_eq!(event.attempt, 2);
    assert_eq!(event.failed_at, T0 + 65_000);
    assert_eq!(
        event.chain_started_at, T0,
        "T0 is the chain's first failure"
    );
    assert_eq!(event.rate_limits, None);
}

#[test]
fn recording_an_outcome_twice_is_refused() {
    let f = Fixture::new();
    let (_, plan) = f.running_thread(Provider::Claude, "hi");
    f.succeed(&plan.request);
    assert_eq!(
        f.core.record_outcome(&plan.request, &failed_outcome(false)),
        Err(CoreError::NotRunning(plan.request.clone()))
    );
}

/// PR-17 (core side): an event whose delivery trapped is delivered again, also after a
/// restart, and in order per thread.
#[test]
fn unacknowledged_events_are_delivered_again_in_order_also_after_a_restart() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    let (thread, first) = f.failed_thread("one");
    f.core.send(&thread, "two").unwrap();
    let second = f.core.start_turns().unwrap().remove(0);
    f.succeed(&second.request);
    let pending = f.core.pending_events("provider-retry", 10).unwrap();
    assert_eq!(pending.len(), 2);
    assert!(pending[0].id < pending[1].id);
    assert!(matches!(&pending[0].event, PluginEvent::TurnFailed(e) if e.failed_request == first));

    // The plugin trapped on the first event.
    f.core
        .note_delivery_failure("provider-retry", pending[0].id, "trap: unreachable")
        .unwrap();
    let f = f.restart();
    f.core.recover().unwrap();
    let again = f.core.pending_events("provider-retry", 10).unwrap();
    assert_eq!(again.len(), 2);
    assert_eq!(again[0].id, pending[0].id);
    assert_eq!(again[0].failed_deliveries, 1);

    f.core.ack("provider-retry", again[0].id).unwrap();
    f.core.ack("provider-retry", again[0].id).unwrap(); // idempotent
    let rest = f.core.pending_events("provider-retry", 10).unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id, pending[1].id);
    f.core.ack("provider-retry", rest[0].id).unwrap();
    assert!(
        f.core
            .pending_events("provider-retry", 10)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn each_subscriber_has_its_own_delivery_state() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    f.core.register_subscriber("audit").unwrap();
    let (_, _) = f.failed_thread("x");
    let event = f.core.pending_events("provider-retry", 10).unwrap()[0].id;
    f.core.ack("provider-retry", event).unwrap();
    assert!(
        f.core
            .pending_events("provider-retry", 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(f.core.pending_events("audit", 10).unwrap().len(), 1);
}

#[test]
fn a_new_subscriber_starts_after_the_events_already_written() {
    let f = Fixture::new();
    f.failed_thread("before");
    f.core.register_subscriber("late").unwrap();
    assert!(f.core.pending_events("late", 10).unwrap().is_empty());
    f.failed_thread("after");
    assert_eq!(f.core.pending_events("late", 10).unwrap().len(), 1);
    f.core.register_subscriber("late").unwrap(); // re-registering keeps the state
    assert_eq!(f.core.pending_events("late", 10).unwrap().len(), 1);
    assert!(matches!(
        f.core.pending_events("nobody", 10),
        Err(CoreError::InvalidArgument(_))
    ));
    let event = f.core.pending_events("late", 10).unwrap()[0].id;
    assert!(matches!(
        f.core.ack("nobody", event),
        Err(CoreError::InvalidArgument(_))
    ));
}

#[test]
fn show_lists_turns_with_attempts_outcomes_and_rows_but_never_the_route_token() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core
        .schedule_retry(&thread, &failed, T0 + 60_000, "Rate limited")
        .unwrap();
    let show = f.core.show(&thread).unwrap();
    assert_eq!(show.turns.len(), 1);
    assert_eq!(show.turns[0].attempt, 1);
    assert_eq!(show.turns[0].outcome, Some(TurnOutcomeKind::Failed));
    assert_eq!(show.rows.len(), 1);
    assert_eq!(show.rows[0].attempt, 2);
    assert_eq!(show.history[0].action, "scheduled");
    let json = serde_json::to_string(&show).unwrap();
    assert!(!json.contains("secret-route-token"));
    assert!(!format!("{show:?}").contains("secret-route-token"));
    assert!(!format!("{:?}", f.core.route(&thread).unwrap()).contains("secret-route-token"));
    assert_eq!(f.core.route(&thread).unwrap(), Some(route()));
}

#[test]
fn opt_out_and_list_are_visible_to_plugins_and_people() {
    let f = Fixture::new();
    let a = f
        .core
        .new_thread(Provider::Claude, Some("opus"), None)
        .unwrap();
    let b = f
        .core
        .new_thread(Provider::Codex, None, Some(route()))
        .unwrap();
    f.core.set_opt_out(&a, true).unwrap();
    assert!(f.core.get_thread(&a).unwrap().retry_opt_out);
    let list = f.core.list_threads().unwrap();
    let ids: Vec<&str> = list.iter().map(|t| t.info.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    assert_eq!(
        f.core.get_thread("th_missing"),
        Err(ThreadsError::NoSuchThread("th_missing".into()))
    );
}

/// A turn running when the host died is reported failed on start (with its event), since
/// nobody holds its stream any more.
#[test]
fn a_turn_running_when_the_host_died_is_reported_failed_on_start() {
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    let (thread, plan) = f.running_thread(Provider::Claude, "hi");
    f.core.mark_input_accepted(&plan.request).unwrap();
    let f = f.restart();
    let report = f.core.recover().unwrap();
    assert_eq!(report.interrupted_turns, vec![plan.request.clone()]);
    assert_eq!(
        f.core.get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    let pending = f.core.pending_events("provider-retry", 10).unwrap();
    let PluginEvent::TurnFailed(event) = &pending[0].event else {
        panic!("expected turn-failed");
    };
    assert!(event.input_accepted);
    assert_eq!(
        event.failure.as_ref().unwrap().category,
        FailureCategory::ConnectionFailed
    );
    assert_eq!(
        f.core.recover().unwrap(),
        RecoveryReport::default(),
        "recovery is idempotent"
    );
}
