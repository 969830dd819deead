//! The core's retention driven by the host's prune tick, on the manual
//! clock: `[core.retention]` from the configuration, delivered events, old history and
//! unneeded turns gone after a tick, and a waiting retry row with everything it needs kept
//! and still dispatched.

use std::time::Duration;

use pooler_core::{ThreadStatus, TurnOutcomeKind};
use pooler_tests::core::{CoreSetup, failure, success};
use rusqlite::{Connection, OpenFlags};

const DAY: u64 = 24 * 3_600_000;

fn count(db: &std::path::Path, sql: &str) -> i64 {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prune_tick_removes_what_is_past_retention_and_keeps_a_waiting_rows_needs() {
    let h = CoreSetup::new()
        .core("retention = { history-days = 1, outbox-days = 1, turn-days = 1, prune-interval-s = 60 }")
        .start()
        .await;
    let db = h.core().database_path().to_path_buf();

    // A chain done with: failed, retried by the plugin, succeeded.
    h.upstream.push(failure(500));
    let done = h.new_thread().await;
    h.send(&done, "hello");
    h.settle().await;
    h.upstream.push(success("ok"));
    h.clock.set(h.rows(&done)[0].send_at);
    h.settle().await;
    assert_eq!(h.turns(&done).len(), 2);

    // A chain still waiting: its row is due in ten days.
    h.retry_set("schedule", "off").await;
    h.upstream.push(failure(500));
    let waiting = h.new_thread().await;
    let failed = h.send(&waiting, "later");
    h.settle().await;
    let send_at = h.now() + 10 * DAY;
    h.link
        .threads_service()
        .schedule_retry("provider-retry", &waiting, &failed, send_at, "much later")
        .unwrap();
    h.settle().await;
    let events = count(&db, "SELECT COUNT(*) FROM outbox");
    assert_eq!(events, 3, "two failures and a success, all delivered");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM outbox_deliveries WHERE done_at IS NULL"
        ),
        0
    );

    // Two days on: one prune tick.
    h.advance(Duration::from_millis(2 * DAY)).await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM outbox"), 0);
    assert!(h.core().show(&done).unwrap().history.is_empty());
    let kept = h.core().show(&waiting).unwrap().history;
    assert!(kept.iter().any(|e| e.action == "scheduled"), "{kept:?}");
    let done_turns = h.turns(&done);
    assert_eq!(done_turns.len(), 1, "the refused attempt is gone");
    assert_eq!(done_turns[0].outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(h.turns(&waiting).len(), 1, "the row's failed turn stays");

    // The waiting row is still served in full.
    h.upstream.push(success("at last"));
    h.clock.set(send_at);
    h.settle().await;
    // The row's attempt 2 was built from the failed turn's input, so that turn was kept
    // until the dispatch; once dispatched, nothing names it, and the prune tick the same
    // jump of the clock runs may already have removed it (whether it ran before or after
    // the dispatch is up to the tasks' order).
    let turns = h.turns(&waiting);
    let last = turns.last().expect("the retried turn");
    assert_eq!(
        (last.attempt, last.outcome),
        (2, Some(TurnOutcomeKind::Ok)),
        "{turns:?}"
    );
    assert_eq!(
        h.core().get_thread(&waiting).unwrap().status,
        ThreadStatus::Idle
    );
}
