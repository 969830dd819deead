//! The core's retry queue driven by the host, with the fixture retry plugin and the real
//! pool in front of a fake upstream, on the manual clock: one live row per chain, reschedule
//! without an attempt, the concurrency gate, the `before-dispatch` verdicts (and a failing
//! gate), archived threads, the start order (`on-start` before the first due check) and
//! `on-tick`, and what a restart keeps.

use std::time::Duration;

use pooler_core::{ThreadStatus, TurnOutcomeKind};
use pooler_host::runtime::imports::threads::ThreadsError;
use pooler_tests::core::{CoreHost, CoreSetup, SOON, failure, success};
use pooler_tests::upstream::{Gate, Reply};

/// A thread whose first turn failed (HTTP 500) and was handled by the fixture with the
/// current script. Returns (thread, failed request).
async fn failed_thread(h: &CoreHost) -> (String, String) {
    h.upstream.push(failure(500));
    let thread = h.new_thread().await;
    let request = h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    (thread, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_live_row_per_chain_under_concurrent_scheduling_and_during_dispatch() {
    let h = CoreSetup::new().start().await;
    h.retry_set("schedule", "off").await;
    let (thread, failed) = failed_thread(&h).await;
    let send_at = h.now() + 5_000;

    // Sixteen schedule-retry calls for the same chain at once, as plugin calls arrive.
    let service = h.link.threads_service();
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let (service, thread, failed) = (service.clone(), thread.clone(), failed.clone());
            tokio::task::spawn_blocking(move || {
                service.schedule_retry(
                    "provider-retry",
                    &thread,
                    &failed,
                    send_at + i,
                    "concurrent",
                )
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(row) => created.push(row),
            Err(ThreadsError::AlreadyQueued(id)) => refused.push(id),
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
    }
    assert_eq!(created.len(), 1, "{created:?}");
    let row = &created[0];
    assert_eq!(row.attempt, 2);
    assert!(refused.iter().all(|id| *id == row.id), "{refused:?}");
    assert_eq!(h.rows(&thread).len(), 1);

    // While the row is being dispatched (claimed, its gate running), the chain is still
    // queued: the gate's own schedule-retry is refused with the row's id.
    h.retry_set("verdict", "schedule-again").await;
    h.upstream.push(success("ok"));
    h.clock.set(h.rows(&thread)[0].send_at);
    h.settle().await;
    assert_eq!(
        h.retry_get("inside-gate").await,
        Some(format!("Err(ThreadsError::AlreadyQueued({}))", row.id))
    );
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2, "dispatched exactly once");
    assert_eq!(turns[1].attempt, 2);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert!(h.rows(&thread).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_moves_the_row_without_spending_an_attempt() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    let row = h.row(&thread);
    assert_eq!((row.attempt, row.send_at), (2, h.now() + 1_000));

    let service = h.link.threads_service();
    let later = h.now() + 60_000;
    let moved = service
        .reschedule("provider-retry", &thread, row.id, later, "pool blocked")
        .unwrap();
    assert_eq!((moved.id, moved.attempt, moved.send_at), (row.id, 2, later));
    // The old time passes: nothing is gated or sent.
    h.advance(Duration::from_secs(1)).await;
    assert!(h.retry_lines("checks").await.is_empty());
    assert_eq!(h.turns(&thread).len(), 1);
    // Moved earlier again, then due: dispatched as attempt 2, the same row.
    let sooner = h.now() + 10_000;
    service
        .reschedule("provider-retry", &thread, row.id, sooner, "pool ready")
        .unwrap();
    h.upstream.push(success("ok"));
    h.advance(Duration::from_secs(10)).await;
    assert_eq!(h.retry_lines("checks").await, [format!("{}:2", row.id)]);
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].attempt, 2);
    assert!(matches!(
        service.reschedule("provider-retry", &thread, row.id, sooner, "gone"),
        Err(ThreadsError::NoSuchRow(id)) if id == row.id
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_concurrency_limit_holds_a_due_row_until_a_slot_frees() {
    let h = CoreSetup::new().core("concurrency-limit = 1").start().await;
    let (waiting, _) = failed_thread(&h).await;
    let row = h.row(&waiting);

    // Another thread's turn takes the only slot and streams until the test lets it end.
    let gate = Gate::new();
    h.upstream.push(
        Reply::sse()
            .event("message_start", r#"{"type":"message_start"}"#)
            .pause(&gate)
            .event("message_stop", r#"{"type":"message_stop"}"#),
    );
    let busy = h.new_thread().await;
    h.send(&busy, "a long answer");
    h.wait_for("the long turn to start", |h| h.upstream_turns() == 2)
        .await;

    // The row comes due while the slot is taken: it waits, marked, not gated, not lost.
    h.clock.advance(Duration::from_secs(1));
    h.wait_for("the row to wait for a slot", |h| {
        h.rows(&waiting).first().is_some_and(|r| r.waiting_for_slot)
    })
    .await;
    assert!(h.retry_lines("checks").await.is_empty());
    assert_eq!(h.turns(&waiting).len(), 1);

    // The slot frees: the row is gated and dispatched at once, no clock move needed.
    h.upstream.push(success("ok"));
    gate.open();
    h.settle().await;
    assert_eq!(h.retry_lines("checks").await, [format!("{}:2", row.id)]);
    let turns = h.turns(&waiting);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(h.turns(&busy)[0].outcome, Some(TurnOutcomeKind::Ok));
    let history = h.show(&waiting).history;
    assert!(
        history.iter().any(|e| e.action == "waiting-for-slot"),
        "{history:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_until_postpones_and_drop_removes() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    let row = h.row(&thread);

    let until = h.now() + 30_000;
    h.retry_set("verdict", &format!("wait:{until}")).await;
    h.advance(Duration::from_secs(1)).await;
    let moved = h.row(&thread);
    assert_eq!((moved.id, moved.attempt, moved.send_at), (row.id, 2, until));
    assert_eq!(h.turns(&thread).len(), 1, "no attempt spent");

    h.retry_set("verdict", "drop:stale: newer request").await;
    h.clock.set(until);
    h.settle().await;
    assert!(h.rows(&thread).is_empty());
    assert_eq!(h.turns(&thread).len(), 1);
    assert_eq!(h.upstream_turns(), 1);
    let history = h.show(&thread).history;
    let dropped = history.iter().find(|e| e.action == "dropped").unwrap();
    assert_eq!(dropped.detail.as_deref(), Some("stale: newer request"));
    assert_eq!(
        h.retry_lines("checks").await,
        [format!("{}:2", row.id), format!("{}:2", row.id)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_traps_or_errs_postpones_the_row_by_a_minute() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    let row = h.row(&thread);
    for verdict in ["trap", "error"] {
        h.retry_set("verdict", verdict).await;
        let due = h.row(&thread).send_at;
        h.clock.set(due);
        h.settle().await;
        let moved = h.row(&thread);
        assert_eq!(
            (moved.id, moved.attempt, moved.send_at),
            (row.id, 2, due + 60_000),
            "{verdict}"
        );
        assert_eq!(h.turns(&thread).len(), 1, "{verdict}: never dispatched");
    }
    h.retry_set("verdict", "proceed").await;
    h.upstream.push(success("ok"));
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(h.turns(&thread).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archived_thread_is_not_dispatched_while_waiting_or_during_its_gate() {
    let logs = pooler_tests::logs::logs();
    let h = CoreSetup::new().start().await;

    // Archived while the row waits for its time: the row goes, nothing is gated.
    let (waiting, _) = failed_thread(&h).await;
    assert_eq!(h.rows(&waiting).len(), 1);
    h.link.archive(&waiting).await.unwrap();
    assert!(h.rows(&waiting).is_empty());
    h.advance(Duration::from_secs(5)).await;
    assert!(h.retry_lines("checks").await.is_empty());
    assert_eq!(h.turns(&waiting).len(), 1);
    assert!(h.link.send(&waiting, "more").is_err());

    // Archived while its gate runs: the gate says proceed, the core does not dispatch.
    let (gated, _) = failed_thread(&h).await;
    let row = h.row(&gated);
    h.retry_set("verdict", "sleep:5000").await;
    h.clock.set(row.send_at);
    logs.wait_for(SOON, |l| l.message == "before-dispatch sleeping")
        .await
        .expect("the gate runs");
    h.link.archive(&gated).await.unwrap();
    h.advance(Duration::from_secs(5)).await;
    assert_eq!(h.turns(&gated).len(), 1);
    assert!(h.rows(&gated).is_empty());
    assert_eq!(h.upstream_turns(), 2, "only the two first turns were sent");
    assert!(h.core().get_thread(&gated).unwrap().archived);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_redelivers_after_the_plugin_traps() {
    let h = CoreSetup::new().start().await;
    h.retry_set("event-trap", "armed").await;
    let (thread, first) = failed_thread(&h).await;
    // The first delivery trapped, the second went through: recorded once, row scheduled.
    assert_eq!(h.retry_get("event-trap").await.as_deref(), Some("fired"));
    let events = h.retry_lines("events").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with(&format!("failed {thread} {first} ")));
    assert_eq!(h.rows(&thread).len(), 1);
    assert!(
        h.core()
            .pending_events("provider-retry", 10)
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_wait_in_order_per_thread_while_the_plugin_traps_and_arrive_after_a_restart() {
    let mut h = CoreSetup::new().start().await;
    h.retry_set("event-trap", "always").await;
    // By the time the failure arrives the thread has moved on; the fixture only records.
    h.retry_set("schedule", "off").await;
    let (thread, first) = failed_thread(&h).await;
    // A second turn of the same thread succeeds: its event must wait behind the first.
    h.upstream.push(success("ok"));
    let second = h.send(&thread, "again");
    h.settle().await;
    let pending = h.core().pending_events("provider-retry", 10).unwrap();
    assert_eq!(pending.len(), 2);
    let failures: Vec<u32> = pending.iter().map(|e| e.failed_deliveries).collect();
    assert!(
        failures[0] >= 2,
        "redelivered at once, then paused: {failures:?}"
    );
    assert_eq!(failures[1], 0, "never tried before the first: {failures:?}");
    // The pause grows on the host clock; each redelivery traps again.
    h.advance(Duration::from_secs(60)).await;
    let pending = h.core().pending_events("provider-retry", 10).unwrap();
    assert!(pending[0].failed_deliveries > failures[0]);
    assert!(h.retry_lines("events").await.is_empty());

    // The plugin is fixed and the host restarts: both arrive, in order, at once.
    h.retry_set("event-trap", "off").await;
    h.restart().await;
    let events = h.retry_lines("events").await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events[0].starts_with(&format!("failed {thread} {first} {first} 1 ")));
    assert_eq!(events[1], format!("succeeded {thread} {second} {second} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_rows_attempts_and_history_and_on_start_comes_before_the_due_check() {
    let mut h = CoreSetup::new().start().await;
    let (thread, first) = failed_thread(&h).await;
    let row = h.row(&thread);
    h.stop().await;
    // While the host is down the row's time passes: overdue at the next start.
    h.clock.advance(Duration::from_secs(30));
    h.upstream.push(success("ok"));
    h.restart().await;

    assert_eq!(
        h.retry_lines("calls").await,
        ["start", "start", "check"],
        "on-start of each run, and the overdue row gated only after the second"
    );
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].id, first);
    assert_eq!((turns[1].attempt, &turns[1].original_request), (2, &first));
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    let history = h.show(&thread).history;
    assert!(
        history
            .iter()
            .any(|e| e.action == "scheduled" && e.row == Some(row.id)),
        "{history:?}"
    );
    assert!(
        history
            .iter()
            .any(|e| e.action == "dispatched" && e.row == Some(row.id))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_tick_runs_every_interval_of_host_time() {
    let h = CoreSetup::new().core("retry-tick-s = 10").start().await;
    let start = h.now();
    assert!(h.retry_lines("ticks").await.is_empty());
    h.advance(Duration::from_secs(10)).await;
    h.advance(Duration::from_secs(10)).await;
    assert_eq!(
        h.retry_lines("ticks").await,
        [(start + 10_000).to_string(), (start + 20_000).to_string()]
    );
}
