//! The plugin-side logic of each scenario of spec §6 (PR-1 … PR-19), natively: the real
//! engine, policy and SQLite store, with a fake core, pool, clock and random source. The
//! integration tests in the real host cover the same ids end to end.

use crate::common;

use std::collections::HashSet;

use common::*;
use provider_retry::Settings;
use provider_retry::store;
use provider_retry::types::{
    Action, Availability, AvailabilityChange, CandidateState, ChangeCause, DispatchVerdict,
    FailureCategory as C, PluginError, Provider, Trigger, TurnSucceededEvent, UnavailableReason,
};

fn signal(w: &World, causes: &[ChangeCause]) {
    w.engine()
        .availability_changed(&AvailabilityChange {
            provider: Provider::Claude,
            causes: causes.to_vec(),
            earliest: Availability::Ready,
            detected_at: w.clock.0.get(),
        })
        .expect("signal handled");
}

/// Spec PR-1's setting: a pooled turn failed with the pool's 429 while account A is blocked
/// for 2 h and B is disabled. Returns the event.
fn pooled_429_blocked_two_hours(w: &World, thread: &str) -> provider_retry::types::TurnFailedEvent {
    w.pool.set(blocked(T + 2 * H));
    let e = w.first_failure(thread, &format!("{thread}_req"), Some(pool_429()), true);
    w.engine().turn_failed(&e).expect("turn-failed handled");
    e
}

fn actions(w: &World, thread: &str) -> Vec<(Trigger, Action)> {
    w.engine()
        .explain(thread)
        .expect("explain")
        .into_iter()
        .flat_map(|c| c.entries)
        .map(|e| (e.trigger, e.action))
        .collect()
}

/// PR-1: the row set for ≈ T+2 h moves to now + buffer + jitter when B is enabled, and is
/// dispatched when due as attempt 2, passing the gate.
#[test]
fn row_moves_earlier_when_account_enabled_and_dispatches_as_attempt_2() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let row = w.only_row("thr_a");
    assert!(row.send_at >= T + 2 * H + 15 * S && row.send_at < T + 2 * H + 45 * S);
    assert_eq!(row.attempt, 2);

    w.clock.advance(10 * M);
    w.pool.set(Availability::Ready);
    signal(&w, &[ChangeCause::AccountEnabled]);
    let moved = w.only_row("thr_a");
    assert_eq!(moved.id, row.id, "the same row moved; no second row");
    assert_eq!(moved.attempt, 2, "moving spends no attempt");
    let now = w.clock.0.get();
    assert!(
        moved.send_at >= now + 15 * S && moved.send_at < now + 45 * S,
        "{}",
        moved.send_at - now
    );
    assert!(
        moved.send_at - T < 11 * M,
        "sent within about a minute of the enable"
    );

    w.clock.set(moved.send_at);
    assert_eq!(
        w.engine().before_dispatch(&moved).unwrap(),
        DispatchVerdict::Proceed
    );
}

/// PR-2: the same for adding an account, clearing an errored account and lowering the
/// threshold (config change).
#[test]
fn row_moves_earlier_for_every_recovery_cause() {
    for cause in [
        ChangeCause::AccountAdded,
        ChangeCause::ErrorCleared,
        ChangeCause::ConfigChanged,
    ] {
        let w = World::new();
        pooled_429_blocked_two_hours(&w, "thr_a");
        w.clock.advance(M);
        w.pool.set(Availability::Ready);
        signal(&w, &[cause]);
        let row = w.only_row("thr_a");
        assert!(row.send_at < w.clock.0.get() + 45 * S, "{cause:?}");
        let history = w.engine().explain("thr_a").unwrap();
        let last = history[0].entries.last().unwrap();
        assert_eq!(last.trigger, Trigger::Signal(vec![cause]));
        assert!(matches!(last.action, Action::Rescheduled(old, new) if old > new));
    }
}

/// PR-3: all accounts errored → watch `pool-unavailable(authentication)`; enabling one
/// account creates the row (attempt = failed attempt + 1).
#[test]
fn watch_becomes_a_row_when_an_errored_pool_recovers() {
    let w = World::new();
    w.pool.set(unavailable(UnavailableReason::Authentication));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    assert!(w.core.rows_of("thr_a").is_empty());
    let status = w.engine().status(Some("thr_a")).unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].state, CandidateState::Watching);
    assert_eq!(status[0].reason, "pool-unavailable(authentication)");

    w.clock.advance(20 * M);
    w.pool.set(Availability::Ready);
    signal(&w, &[ChangeCause::AccountEnabled]);
    let row = w.only_row("thr_a");
    assert_eq!(row.attempt, 2);
    assert!(row.send_at < w.clock.0.get() + 45 * S);
    assert_eq!(
        w.engine().status(Some("thr_a")).unwrap()[0].state,
        CandidateState::Scheduled
    );
}

/// PR-4: a reset beyond the maximum wait (T+7 h, cap 6 h) → watch; adding an account
/// schedules it.
#[test]
fn beyond_maximum_wait_is_watched_and_scheduled_when_an_account_is_added() {
    let w = World::new();
    w.pool.set(blocked(T + 7 * H));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    assert!(w.core.rows_of("thr_a").is_empty());
    assert_eq!(
        w.engine().status(None).unwrap()[0].reason,
        "beyond-maximum-wait"
    );

    w.clock.advance(H);
    w.pool.set(blocked(T + 2 * H));
    signal(&w, &[ChangeCause::AccountAdded]);
    let row = w.only_row("thr_a");
    assert!(row.send_at >= T + 2 * H + 15 * S && row.send_at < T + 2 * H + 45 * S);
}

/// PR-5: after a restart (a new engine over the same database, nothing in memory), a pending
/// row is re-evaluated on start and moved early when the pool is now ready.
#[test]
fn restart_re_evaluates_pending_rows_on_start() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    w.clock.advance(30 * M);
    w.pool.set(Availability::Ready);
    let queries = w.pool.count();
    let summary = w.engine().on_start(w.clock.0.get()).unwrap();
    assert_eq!(summary.moved, 1);
    assert_eq!(w.pool.count(), queries + 1);
    assert!(w.only_row("thr_a").send_at < w.clock.0.get() + 45 * S);
    assert_eq!(actions(&w, "thr_a").last().unwrap().0, Trigger::Start);
}

/// PR-6: ten pending threads are released with ten distinct send times; attempts and row ids
/// are unchanged by the re-evaluation.
#[test]
fn ten_released_rows_are_staggered_with_their_own_jitter() {
    let w = World::new();
    let threads: Vec<String> = (0..10).map(|i| format!("thr_{i}")).collect();
    for t in &threads {
        pooled_429_blocked_two_hours(&w, t);
    }
    let before: Vec<_> = threads.iter().map(|t| w.only_row(t)).collect();
    w.clock.advance(M);
    w.pool.set(Availability::Ready);
    signal(&w, &[ChangeCause::AccountEnabled]);
    let after: Vec<_> = threads.iter().map(|t| w.only_row(t)).collect();
    let times: HashSet<u64> = after.iter().map(|r| r.send_at).collect();
    assert_eq!(times.len(), 10, "ten distinct send times: {times:?}");
    let now = w.clock.0.get();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((a.id, a.attempt), (b.id, b.attempt));
        assert!(a.send_at >= now + 15 * S && a.send_at < now + 45 * S);
    }
    assert_eq!(
        w.core.calls_matching("schedule"),
        10,
        "no second row for anyone"
    );
}

/// PR-7: the thread completed newer turns while its row waited → the row is dropped as stale
/// by the next re-evaluation and no turn starts.
#[test]
fn stale_row_is_cancelled_when_the_thread_moved_on() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let row = w.only_row("thr_a");
    w.core.newer_turn_completed("thr_a", "req_newer");
    w.clock.advance(10 * M);
    w.pool.set(Availability::Ready);
    signal(&w, &[ChangeCause::AccountEnabled]);
    assert!(w.core.rows_of("thr_a").is_empty());
    assert_eq!(w.core.calls_matching(&format!("cancel {}", row.id)), 1);
    assert!(w.engine().status(Some("thr_a")).unwrap().is_empty());
    let last = w.engine().explain("thr_a").unwrap()[0]
        .entries
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last.action, last.reason.as_str()),
        (Action::Dropped, "stale: newer request")
    );
}

/// PR-7, at due time: a stale row that comes due is dropped, not dispatched.
#[test]
fn stale_row_is_dropped_when_it_comes_due() {
    for (name, change) in [
        (
            "newer request",
            Box::new(|w: &World| w.core.newer_turn_completed("thr_a", "req_newer"))
                as Box<dyn Fn(&World)>,
        ),
        (
            "archived",
            Box::new(|w: &World| w.core.thread_mut("thr_a", |t| t.archived = true)),
        ),
        (
            "newer input queued",
            Box::new(|w: &World| w.core.thread_mut("thr_a", |t| t.input_queued = true)),
        ),
        (
            "deleted",
            Box::new(|w: &World| {
                w.core.threads.borrow_mut().remove("thr_a");
            }),
        ),
    ] {
        let w = World::new();
        pooled_429_blocked_two_hours(&w, "thr_a");
        let row = w.only_row("thr_a");
        change(&w);
        w.clock.set(row.send_at);
        match w.engine().before_dispatch(&row).unwrap() {
            DispatchVerdict::Drop(reason) => {
                assert!(reason.starts_with("stale: "), "{name}: {reason}")
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(w.pool.count(), 1, "{name}: no pool query for a stale row");
    }
}

/// PR-8: re-evaluation sees a later reset → the row moves later, no attempt spent.
#[test]
fn row_moves_later_when_the_reset_moves_later() {
    let w = World::new();
    w.pool.set(blocked(T + 10 * M));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    w.pool.set(blocked(T + H));
    signal(&w, &[ChangeCause::LaterResetObserved]);
    let moved = w.only_row("thr_a");
    assert_eq!((moved.id, moved.attempt), (row.id, row.attempt));
    assert!(moved.send_at >= T + H + 15 * S && moved.send_at < T + H + 45 * S);
    // The same answer again moves nothing (the row already fits that reset).
    signal(&w, &[ChangeCause::LaterResetObserved]);
    assert_eq!(w.only_row("thr_a").send_at, moved.send_at);
    assert_eq!(w.core.calls_matching("reschedule"), 1);
}

/// PR-8, beyond the maximum wait: a row whose pool now resets after T0 + maximum wait is
/// cancelled and the candidate resolved expired.
#[test]
fn row_is_cancelled_as_expired_when_the_reset_passes_the_maximum_wait() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    w.pool.set(blocked(T + 7 * H));
    signal(&w, &[ChangeCause::LaterResetObserved]);
    assert!(w.core.rows_of("thr_a").is_empty());
    let chains = w.engine().explain("thr_a").unwrap();
    let last = chains[0].entries.last().unwrap();
    assert_eq!(last.action, Action::Dropped);
    assert!(last.reason.starts_with("expired"), "{}", last.reason);
}

/// PR-9: due while still blocked → wait-until the new reset, no dispatch, no attempt.
#[test]
fn due_row_still_blocked_waits_until_the_reset() {
    let w = World::new();
    w.pool.set(blocked(T + 10 * M));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    w.clock.set(row.send_at);
    let reset = row.send_at + 20 * M;
    w.pool.set(blocked(reset));
    match w.engine().before_dispatch(&row).unwrap() {
        DispatchVerdict::WaitUntil(t) => assert!(t >= reset + 15 * S && t < reset + 45 * S),
        other => panic!("{other:?}"),
    }
    // Unavailable at due time: postpone by one re-evaluation interval.
    w.pool.set(unavailable(UnavailableReason::ResetUnknown));
    assert_eq!(
        w.engine().before_dispatch(&row).unwrap(),
        DispatchVerdict::WaitUntil(w.clock.0.get() + 5 * M)
    );
    let history = &w.engine().explain("thr_a").unwrap()[0].entries;
    assert!(
        history
            .iter()
            .all(|e| !matches!(e.action, Action::Dispatched(_)))
    );
}

/// PR-9, at the end of the maximum wait: a due row whose pool is still unavailable after
/// T0 + maximum wait is dropped as expired.
#[test]
fn due_row_is_dropped_once_the_maximum_wait_has_passed() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let row = w.only_row("thr_a");
    w.clock.set(T + 6 * H + M);
    w.pool.set(unavailable(UnavailableReason::Authentication));
    match w.engine().before_dispatch(&row).unwrap() {
        DispatchVerdict::Drop(reason) => assert!(reason.starts_with("expired")),
        other => panic!("{other:?}"),
    }
}

/// PR-10: no signal is delivered; the tick finds the recovery within one interval, and not
/// before the interval has passed.
#[test]
fn tick_finds_a_missed_recovery_within_one_interval() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    assert!(w.engine().on_start(T).unwrap().examined == 1);
    w.pool.set(Availability::Ready);
    w.clock.advance(4 * M);
    assert_eq!(
        w.engine().on_tick(w.clock.0.get()).unwrap(),
        None,
        "interval not yet passed"
    );
    assert!(w.only_row("thr_a").send_at > T + 2 * H);
    w.clock.advance(M);
    let summary = w
        .engine()
        .on_tick(w.clock.0.get())
        .unwrap()
        .expect("a pass ran");
    assert_eq!(summary.moved, 1);
    assert!(w.only_row("thr_a").send_at < w.clock.0.get() + 45 * S);
}

/// PR-11: a due row waiting on the concurrency limit is left alone by re-evaluation and
/// proceeds when the gate finally asks.
#[test]
fn row_waiting_for_a_slot_keeps_its_place_and_proceeds_later() {
    let w = World::new();
    w.pool.set(Availability::Ready);
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    let mut row = w.only_row("thr_a");
    w.clock.set(row.send_at + M);
    row.waiting_for_slot = true;
    signal(&w, &[ChangeCause::AccountEnabled]);
    assert_eq!(w.core.calls_matching("reschedule"), 0);
    w.clock.advance(10 * M);
    assert_eq!(
        w.engine().before_dispatch(&row).unwrap(),
        DispatchVerdict::Proceed
    );
}

/// PR-12: the core already holds a live row for the chain (an earlier delivery created it);
/// the second schedule is refused and the plugin adopts the live row: one row.
#[test]
fn already_queued_adopts_the_live_row_instead_of_creating_a_second() {
    let w = World::new();
    w.pool.set(Availability::Ready);
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    // A row of this chain exists that the plugin's database does not know.
    let existing = threads_schedule(&w, "thr_a", "req_1", T + H);
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    assert_eq!(row.id, existing);
    assert!(
        row.send_at < T + 45 * S,
        "adopted and moved to the new decision's time"
    );
    let status = w.engine().status(Some("thr_a")).unwrap();
    assert_eq!(status[0].row, Some(existing));
}

fn threads_schedule(w: &World, thread: &str, request: &str, at: u64) -> u64 {
    use provider_retry::ports::Threads;
    w.core
        .schedule_retry(thread, request, at, "earlier delivery")
        .unwrap()
        .id
}

/// PR-13: each #4839 shape gets one retry through the engine; 401 gets none; 529 backs off.
#[test]
fn gateway_failures_of_issue_4839_each_get_one_retry() {
    let mut codex_attempts = failure(C::TooManyFailedAttempts, Some(429));
    codex_attempts.provider_code = Some("responseTooManyFailedAttempts".into());
    let mut codex_disconnect = failure(C::StreamDisconnected, Some(502));
    codex_disconnect.provider_code = Some("responseStreamDisconnected".into());
    let cases = [
        (
            "Claude 429 without snapshot",
            failure(C::RateLimit, Some(429)),
            1,
        ),
        ("Claude 502", failure(C::Internal, Some(502)), 1),
        ("Claude 503", failure(C::Internal, Some(503)), 1),
        ("Codex too-many-failed-attempts 429", codex_attempts, 1),
        ("Codex stream-disconnected 502", codex_disconnect, 1),
        ("HTTP 401", failure(C::Unauthorized, Some(401)), 0),
        ("529", failure(C::Overloaded, Some(529)), 1),
    ];
    for (name, f, rows) in cases {
        let w = World::new();
        let e = w.first_failure("thr_a", "req_1", Some(f), false);
        w.engine().turn_failed(&e).unwrap();
        let live = w.core.rows_of("thr_a");
        assert_eq!(live.len(), rows, "{name}");
        if let Some(r) = live.first() {
            assert!(
                r.send_at >= T + 5 * S && r.send_at < T + 10 * S,
                "{name}: backoff 5–10 s"
            );
            assert_eq!(r.attempt, 2);
        }
        assert_eq!(
            w.pool.count(),
            0,
            "{name}: not routed, the pool is not asked"
        );
    }
}

/// PR-14: a 503 with `Retry-After: 120` is sent no earlier than +120 s.
#[test]
fn retry_after_is_honoured() {
    let w = World::new();
    let mut f = failure(C::Internal, Some(503));
    f.retry_after = Some(T + 120 * S);
    let e = w.first_failure("thr_a", "req_1", Some(f), false);
    w.engine().turn_failed(&e).unwrap();
    assert!(w.only_row("thr_a").send_at >= T + 120 * S);
}

/// PR-15: the fifth failure of a chain is `attempts-exhausted`: no row. Attempts grow only by
/// dispatch, never by moves.
#[test]
fn fifth_failure_of_a_chain_is_attempts_exhausted() {
    let w = World::new();
    let first = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Overloaded, Some(529))),
        false,
    );
    w.engine().turn_failed(&first).unwrap();
    for attempt in 2..=5 {
        let row = w.only_row("thr_a");
        assert_eq!(row.attempt, attempt);
        w.clock.set(row.send_at);
        assert_eq!(
            w.engine().before_dispatch(&row).unwrap(),
            DispatchVerdict::Proceed
        );
        let request = w.core.dispatch(row.id);
        w.clock.advance(S);
        let e = w.retry_failure(&first, &request, Some(failure(C::Overloaded, Some(529))));
        w.engine().turn_failed(&e).unwrap();
    }
    assert!(w.core.rows_of("thr_a").is_empty());
    let last = w.engine().explain("thr_a").unwrap()[0]
        .entries
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last.action, last.reason.as_str()),
        (Action::Declined, "attempts-exhausted")
    );
    assert_eq!(w.core.calls_matching("schedule"), 4);
}

/// PR-16: an opted-out thread gets no retry; a thread opted out while its row waits has the
/// row dropped at the next re-evaluation.
#[test]
fn opted_out_threads_get_no_retry() {
    let w = World::new();
    let e = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Overloaded, Some(529))),
        false,
    );
    w.core.thread_mut("thr_a", |t| t.retry_opt_out = true);
    w.engine().turn_failed(&e).unwrap();
    assert!(w.core.rows_of("thr_a").is_empty());
    assert_eq!(
        w.engine().explain("thr_a").unwrap()[0].entries[0].reason,
        "opted-out"
    );

    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_b");
    w.core.thread_mut("thr_b", |t| t.retry_opt_out = true);
    w.clock.advance(6 * M);
    w.engine().on_tick(w.clock.0.get()).unwrap();
    assert!(w.core.rows_of("thr_b").is_empty());
}

/// PR-17: the plugin traps while handling `turn-failed` after the core created the row; the
/// event is delivered again and the retry exists once.
#[test]
fn redelivered_event_after_a_trap_schedules_once() {
    let w = World::new();
    w.pool.set(blocked(T + H));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.db.trap_next_commit.set(true);
    assert!(
        w.engine().turn_failed(&e).is_err(),
        "the trap surfaces as an error"
    );
    assert_eq!(w.core.rows_of("thr_a").len(), 1, "the core kept the row");
    assert!(
        w.engine().explain("thr_a").is_err(),
        "the plugin's writes were rolled back"
    );

    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    assert_eq!(
        w.engine().status(Some("thr_a")).unwrap()[0].row,
        Some(row.id)
    );
    // A third delivery changes nothing at all.
    let calls = w.core.calls.borrow().len();
    w.engine().turn_failed(&e).unwrap();
    assert_eq!(w.core.calls.borrow().len(), calls);
    assert_eq!(w.engine().explain("thr_a").unwrap()[0].entries.len(), 1);
}

/// Idempotent redelivery: the same failure and success events delivered twice act once.
#[test]
fn duplicate_events_are_handled_once() {
    let w = World::new();
    let e = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Internal, Some(502))),
        false,
    );
    w.engine().turn_failed(&e).unwrap();
    w.engine().turn_failed(&e).unwrap();
    assert_eq!(w.core.calls_matching("schedule"), 1);
    let row = w.only_row("thr_a");
    w.clock.set(row.send_at);
    w.engine().before_dispatch(&row).unwrap();
    let request = w.core.dispatch(row.id);
    let ok = TurnSucceededEvent {
        thread: "thr_a".into(),
        provider: Provider::Claude,
        request,
        original_request: "req_1".into(),
        attempt: 2,
        succeeded_at: w.clock.0.get(),
    };
    w.engine().turn_succeeded(&ok).unwrap();
    w.engine().turn_succeeded(&ok).unwrap();
    let entries = &w.engine().explain("thr_a").unwrap()[0].entries;
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.action == Action::Resolved)
            .count(),
        1
    );
    assert_eq!(entries.last().unwrap().reason, "succeeded as attempt 2");
}

/// PR-18: `explain` records the initial decision, each reschedule with old → new time and its
/// trigger, and the dispatch.
#[test]
fn explain_shows_decision_reschedules_and_dispatch() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let first = w.only_row("thr_a").send_at;
    w.clock.advance(10 * M);
    w.pool.set(Availability::Ready);
    signal(&w, &[ChangeCause::AccountEnabled]);
    let row = w.only_row("thr_a");
    w.clock.set(row.send_at);
    w.engine().before_dispatch(&row).unwrap();

    let chains = w.engine().explain("thr_a").unwrap();
    let kinds: Vec<_> = chains[0]
        .entries
        .iter()
        .map(|e| (e.trigger.clone(), e.action))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Trigger::Failure, Action::Scheduled(first)),
            (
                Trigger::Signal(vec![ChangeCause::AccountEnabled]),
                Action::Rescheduled(first, row.send_at)
            ),
            (Trigger::Due, Action::Dispatched(2)),
        ]
    );
    // The words ("rescheduled 03:00:23 → 00:50:31 after pool availability changed (account
    // enabled)") are the host's to render from these records: see host/src/cli/explain.rs.
}

/// PR-18: the history survives a restart and keeps only the last 50 entries.
#[test]
fn history_is_bounded_to_fifty_entries() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    // Alternate the pool between two resets so every tick moves the row.
    for i in 0..60u64 {
        w.pool.set(blocked(T + 2 * H + (i % 2) * H));
        w.clock.advance(5 * M);
        w.engine().on_tick(w.clock.0.get()).unwrap();
    }
    let entries = &w.engine().explain("thr_a").unwrap()[0].entries;
    assert_eq!(entries.len(), store::HISTORY_LIMIT as usize);
    assert!(entries.iter().all(|e| e.trigger == Trigger::Tick));
}

/// PR-19: a person's send-now is recorded in the history with the attempt it ran as.
#[test]
fn send_now_by_a_person_is_recorded() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let row = w.only_row("thr_a");
    w.core.dispatch(row.id);
    w.engine()
        .sent_by_person("thr_a", row.id, w.clock.0.get())
        .unwrap();
    let last = w.engine().explain("thr_a").unwrap()[0]
        .entries
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last.trigger, last.action),
        (Trigger::Person, Action::Dispatched(2))
    );
    assert!(w.engine().status(Some("thr_a")).unwrap().is_empty());
}

/// The availability query is bounded: an error or an answer slower than the timeout reads
/// as source-unavailable, and the candidate is watched.
#[test]
fn failed_or_slow_availability_answers_are_source_unavailable() {
    for script in [
        PoolScript::Error,
        PoolScript::Slow(Availability::Ready, 6 * S),
    ] {
        let w = World::new();
        *w.pool.script.borrow_mut() = script;
        let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
        w.engine().turn_failed(&e).unwrap();
        assert!(w.core.rows_of("thr_a").is_empty(), "{script:?}");
        assert_eq!(
            w.engine().status(None).unwrap()[0].reason,
            "source-unavailable"
        );
    }
    // Within the timeout the answer counts.
    let w = World::new();
    *w.pool.script.borrow_mut() = PoolScript::Slow(Availability::Ready, 4 * S);
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    assert_eq!(w.core.rows_of("thr_a").len(), 1);
}

/// Watches expire at T0 + maximum wait, measured from the chain's first failure.
#[test]
fn watches_expire_at_the_maximum_wait_from_the_first_failure() {
    let w = World::new();
    w.pool.set(unavailable(UnavailableReason::NoEnabledAccount));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    w.clock.set(T + 6 * H - S);
    w.engine().on_tick(w.clock.0.get()).unwrap();
    assert_eq!(
        w.engine().status(None).unwrap().len(),
        1,
        "still open just before T0 + 6 h"
    );
    w.clock.set(T + 6 * H + 5 * M);
    w.engine().on_tick(w.clock.0.get()).unwrap();
    assert!(w.engine().status(None).unwrap().is_empty());
    let last = w.engine().explain("thr_a").unwrap()[0]
        .entries
        .last()
        .unwrap()
        .clone();
    assert_eq!(last.action, Action::Resolved);
    assert!(last.reason.starts_with("expired"));
    // With no limit the watch stays open.
    let w = World::new();
    provider_retry::settings::Settings::set(&w.db, "maximum-wait", "none").unwrap();
    w.pool.set(unavailable(UnavailableReason::NoEnabledAccount));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    w.clock.set(T + 48 * H);
    w.engine().on_tick(w.clock.0.get()).unwrap();
    assert_eq!(w.engine().status(None).unwrap().len(), 1);
}

/// Temporary-failure rows are only freshness-checked: the pool is never asked about them.
#[test]
fn temporary_rows_are_not_moved_by_pool_answers() {
    let w = World::new();
    let e = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Overloaded, Some(529))),
        true,
    );
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    w.pool.set(blocked(T + 3 * H));
    signal(&w, &[ChangeCause::LaterResetObserved]);
    w.clock.set(row.send_at);
    assert_eq!(
        w.engine().before_dispatch(&row).unwrap(),
        DispatchVerdict::Proceed
    );
    assert_eq!(w.pool.count(), 0);
    assert_eq!(w.core.calls_matching("reschedule"), 0);
}

/// Signals are per provider: a Codex signal leaves Claude candidates alone.
#[test]
fn signals_re_evaluate_only_their_provider() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    w.pool.set(Availability::Ready);
    let summary = w
        .engine()
        .availability_changed(&AvailabilityChange {
            provider: Provider::Codex,
            causes: vec![ChangeCause::AccountEnabled],
            earliest: Availability::Ready,
            detected_at: T,
        })
        .unwrap();
    assert_eq!(summary.examined, 0);
    assert!(w.only_row("thr_a").send_at > T + 2 * H);
}

/// A newer failure of another chain on the same thread supersedes the older open candidate.
#[test]
fn a_newer_chain_supersedes_the_older_open_one() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let old_row = w.only_row("thr_a");
    // The person sends a new message, which fails too (a new chain).
    w.clock.advance(M);
    w.core.newer_turn_completed("thr_a", "req_new");
    let e = w.first_failure(
        "thr_a",
        "req_new",
        Some(failure(C::Overloaded, Some(529))),
        true,
    );
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    assert_ne!(row.id, old_row.id);
    assert_eq!(row.original_request, "req_new");
    assert_eq!(w.engine().explain("thr_a").unwrap().len(), 2);
}

/// Admin: cancel removes the row and closes the candidate; cancelling again or an unknown
/// thread is refused.
#[test]
fn cancel_by_a_person_removes_the_row() {
    use provider_retry::types::AdminError;
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    let row = w.only_row("thr_a");
    let c = w.engine().cancel("thr_a", w.clock.0.get()).unwrap();
    assert_eq!(c.row, Some(row.id));
    assert!(w.core.rows_of("thr_a").is_empty());
    assert_eq!(
        w.engine().cancel("thr_a", T),
        Err(AdminError::NothingPending("thr_a".into()))
    );
    assert_eq!(
        w.engine().cancel("thr_x", T),
        Err(AdminError::UnknownThread("thr_x".into()))
    );
    assert_eq!(
        w.engine().explain("thr_x"),
        Err(AdminError::UnknownThread("thr_x".into()))
    );
    // A row the plugin closed but the core still had is dropped when it comes due.
    assert!(matches!(
        w.engine().before_dispatch(&row).unwrap(),
        DispatchVerdict::Drop(_)
    ));
}

/// Admin: status lists open candidates by next send time, watches last.
#[test]
fn status_orders_by_send_time_with_watches_last() {
    let w = World::new();
    w.pool.set(unavailable(UnavailableReason::Authentication));
    let e = w.first_failure("thr_w", "req_w", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    w.pool.set(blocked(T + 3 * H));
    let e = w.first_failure("thr_late", "req_l", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    let e = w.first_failure(
        "thr_soon",
        "req_s",
        Some(failure(C::Internal, Some(500))),
        false,
    );
    w.engine().turn_failed(&e).unwrap();
    let order: Vec<_> = w
        .engine()
        .status(None)
        .unwrap()
        .into_iter()
        .map(|c| (c.thread, c.next_attempt))
        .collect();
    assert_eq!(
        order,
        vec![
            ("thr_soon".into(), 2),
            ("thr_late".into(), 2),
            ("thr_w".into(), 2)
        ]
    );
}

/// A failing core surfaces as a transient dependency error, and the event is not marked
/// processed, so its redelivery is decided afresh.
#[test]
fn core_storage_errors_are_transient_and_leave_the_event_unprocessed() {
    let w = World::new();
    let e = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Internal, Some(502))),
        false,
    );
    *w.core.broken.borrow_mut() = Some("disk full".into());
    assert!(matches!(
        w.engine().turn_failed(&e),
        Err(PluginError::Dependency(_))
    ));
    *w.core.broken.borrow_mut() = None;
    w.engine().turn_failed(&e).unwrap();
    assert_eq!(w.core.rows_of("thr_a").len(), 1);
}

/// Malformed events are refused as final `invalid-input`.
#[test]
fn malformed_events_are_invalid_input() {
    let w = World::new();
    let mut e = w.first_failure("thr_a", "req_1", None, false);
    e.thread.clear();
    assert!(matches!(
        w.engine().turn_failed(&e),
        Err(PluginError::InvalidInput(_))
    ));
}

/// Settings changed through the settings store take effect on the next decision.
#[test]
fn shortened_settings_take_effect() {
    let w = World::new();
    Settings::set(&w.db, "backoff-base", "1s").unwrap();
    let e = w.first_failure(
        "thr_a",
        "req_1",
        Some(failure(C::Overloaded, Some(529))),
        false,
    );
    w.engine().turn_failed(&e).unwrap();
    let at = w.only_row("thr_a").send_at;
    assert!((T + S..T + 2 * S).contains(&at), "{}", at - T);
}

/// One candidate whose re-evaluation fails is left exactly as it was; the others of the same
/// pass are re-evaluated and kept, and the pass reports the failure.
#[test]
fn a_failing_candidate_does_not_hold_up_the_others() {
    let w = World::new();
    pooled_429_blocked_two_hours(&w, "thr_a");
    pooled_429_blocked_two_hours(&w, "thr_b");
    let before_b = w.only_row("thr_b");
    let entries_b = w.engine().explain("thr_b").unwrap()[0].entries.len();
    *w.core.broken_thread.borrow_mut() = Some("thr_b".into());
    w.pool.set(Availability::Ready);
    let result = w.engine().availability_changed(&AvailabilityChange {
        provider: Provider::Claude,
        causes: vec![ChangeCause::AccountEnabled],
        earliest: Availability::Ready,
        detected_at: T,
    });
    assert!(
        matches!(result, Err(PluginError::Dependency(_))),
        "{result:?}"
    );
    assert!(w.only_row("thr_a").send_at < T + 45 * S, "thr_a moved");
    assert_eq!(w.only_row("thr_b"), before_b);
    assert_eq!(
        w.engine().explain("thr_b").unwrap()[0].entries.len(),
        entries_b
    );
    // The next pass picks it up.
    *w.core.broken_thread.borrow_mut() = None;
    signal(&w, &[ChangeCause::AccountEnabled]);
    assert!(w.only_row("thr_b").send_at < T + 45 * S);
}

/// The pool blocked until the far future (an absurd Retry-After
/// upstream) with no maximum wait moves the row to the far future: the send time
/// saturates instead of wrapping into the past (which would dispatch it at once) or
/// panicking.
#[test]
fn a_pool_blocked_until_the_far_future_moves_the_row_there_without_wrapping() {
    use pooler_plugin_kit::time::FAR_FUTURE_MS;
    let w = World::new();
    provider_retry::settings::Settings::set(&w.db, "maximum-wait", "none").unwrap();
    w.pool.set(blocked(T + 10 * M));
    let e = w.first_failure("thr_a", "req_1", Some(pool_429()), true);
    w.engine().turn_failed(&e).unwrap();
    let row = w.only_row("thr_a");
    for far in [u64::MAX, FAR_FUTURE_MS] {
        w.pool.set(blocked(far));
        signal(&w, &[ChangeCause::LaterResetObserved]);
        let moved = w.only_row("thr_a");
        assert_eq!(moved.id, row.id);
        assert_eq!(moved.send_at, FAR_FUTURE_MS, "far {far}");
        match w.engine().before_dispatch(&moved).unwrap() {
            DispatchVerdict::WaitUntil(t) => assert_eq!(t, FAR_FUTURE_MS),
            other => panic!("{other:?}"),
        }
    }
}
