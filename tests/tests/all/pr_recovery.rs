//! Provider Retry scenarios PR-1 … PR-10 (spec `provider-retry.md` §6): recovery of pending
//! retries when the pool recovers, with the real Account Pooler, the real Provider Retry and
//! the host core, a scripted fake upstream on 127.0.0.1 and the manual clock.

use std::time::Duration;

use pooler_core::{ThreadStatus, TurnOutcomeKind, TurnTrigger};
use pooler_host::runtime::bindings::retry::exports::pooler::plugins::retry_admin::{
    Action, ChainHistory, Trigger,
};
use pooler_tests::core::{API_KEY, CoreHost, CoreSetup, success};
use pooler_tests::pool::{five_hour_rejected, reply};

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
/// The default reset buffer and jitter bound of Provider Retry.
const BUFFER: u64 = 15 * SECOND;
const JITTER: u64 = 30 * SECOND;

/// The pool of the scenarios: A (the harness's account) and B, disabled. Returns B's id.
async fn with_b_disabled(h: &CoreHost) -> String {
    let b = h.add_claude_key("sk-ant-api03-key-b").await;
    h.disable_account(&b.id).await;
    h.settle().await;
    b.id
}

/// A thread whose pooled turn fails with a 429 that blocks A until `reset` (unified 5h
/// rejected). Returns (thread, failed request).
async fn blocked_turn(h: &CoreHost, reset: u64) -> (String, String) {
    h.upstream
        .push(reply(429, &five_hour_rejected(Some(reset))));
    let thread = h.new_thread().await;
    let request = h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    (thread, request)
}

/// The entries of the one chain of `thread`.
fn entries(
    histories: &[ChainHistory],
) -> &[pooler_host::runtime::bindings::retry::exports::pooler::plugins::retry_admin::HistoryEntry] {
    assert_eq!(histories.len(), 1, "one chain: {histories:?}");
    &histories[0].entries
}

/// PR-1: Enable (seed acceptance). A pooled turn fails with 429 while A is blocked for 2 h
/// and B disabled → a row at ≈ T+2 h. Enable B → within one minute of virtual time the row
/// is sent through the dispatch gates, served by B, and the thread is idle with attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_1_enabling_an_account_sends_the_pending_retry_within_a_minute() {
    let h = CoreSetup::new().real_retry().start().await;
    let b = with_b_disabled(&h).await;
    let t0 = h.now();
    let reset = t0 + 2 * HOUR;
    let (thread, first) = blocked_turn(&h, reset).await;
    assert_eq!(h.upstream.received()[0].header("x-api-key"), Some(API_KEY));

    // The row waits for A's reset: ≈ T+2 h (plus the buffer and jitter).
    let row = h.row(&thread);
    assert_eq!(row.attempt, 2);
    assert_eq!(row.original_request, first);
    assert!(
        (reset + BUFFER..reset + BUFFER + JITTER).contains(&row.send_at),
        "row at {} for a reset at {reset}",
        row.send_at
    );

    // A minute passes: nothing moves.
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(h.row(&thread).send_at, row.send_at);
    assert_eq!(h.upstream_turns(), 1);

    // `pooler account enable B`.
    h.upstream.push(success("served by B"));
    let enabled_at = h.now();
    h.enable_account(&b).await;
    h.settle().await;
    // The same row moved earlier, the attempt unchanged, due within the minute.
    let moved = h.row(&thread);
    assert_eq!((moved.id, moved.attempt), (row.id, 2));
    assert!(
        (enabled_at + BUFFER..enabled_at + BUFFER + JITTER).contains(&moved.send_at),
        "moved to {} (enabled at {enabled_at})",
        moved.send_at
    );
    // Not before its time; at its time, by the clock alone.
    h.clock.set(moved.send_at - 1);
    h.settle().await;
    assert_eq!(h.upstream_turns(), 1, "not sent before its time");
    h.clock.set(moved.send_at);
    h.settle().await;
    assert!(
        h.now() <= enabled_at + MINUTE,
        "sent within a minute of virtual time"
    );

    // Sent once, served by B, attempt 2; the thread is idle.
    assert_eq!(h.upstream_turns(), 2);
    let received = h.upstream.received();
    assert_eq!(
        received.last().unwrap().header("x-api-key"),
        Some("sk-ant-api03-key-b")
    );
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    let retry = &turns[1];
    assert_eq!(retry.attempt, 2);
    assert_eq!(retry.original_request, first);
    assert_eq!(retry.trigger, TurnTrigger::Retry);
    assert_eq!(retry.outcome, Some(TurnOutcomeKind::Ok));
    assert!(h.rows(&thread).is_empty());
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Idle
    );

    // Through the gates: the plugin's `before-dispatch` let attempt 2 go.
    let histories = h.explain(&thread).await;
    let entries = entries(&histories);
    assert!(
        entries
            .iter()
            .any(|e| matches!(e.trigger, Trigger::Due) && matches!(e.action, Action::Dispatched(2))),
        "{entries:?}"
    );
    assert!(
        entries
            .iter()
            .any(|e| matches!(e.trigger, Trigger::Signal(_))
                && matches!(e.action, Action::Rescheduled((old, new)) if old == row.send_at && new < old)),
        "{entries:?}"
    );
}

/// Assert the row of `thread` was moved (same row, same attempt) to within a minute of
/// `at`, then send it at its time with a success queued; returns the key that served it.
async fn sent_soon_after(h: &CoreHost, thread: &str, row_id: u64, at: u64) -> String {
    let moved = h.row(thread);
    assert_eq!((moved.id, moved.attempt), (row_id, 2));
    assert!(
        (at + BUFFER..at + BUFFER + JITTER).contains(&moved.send_at),
        "moved to +{} ms",
        moved.send_at.saturating_sub(at)
    );
    let before = h.upstream_turns();
    h.upstream.push(success("recovered"));
    h.clock.set(moved.send_at - 1);
    h.settle().await;
    assert_eq!(h.upstream_turns(), before, "not before its time");
    h.clock.set(moved.send_at);
    h.settle().await;
    assert_eq!(h.upstream_turns(), before + 1);
    let turns = h.turns(thread);
    let last = turns.last().unwrap();
    assert_eq!(last.attempt, 2);
    assert_eq!(last.outcome, Some(TurnOutcomeKind::Ok));
    assert!(h.rows(thread).is_empty());
    assert_eq!(
        h.core().get_thread(thread).unwrap().status,
        ThreadStatus::Idle
    );
    h.upstream
        .received()
        .last()
        .unwrap()
        .header("x-api-key")
        .unwrap()
        .to_owned()
}

/// PR-2: The same as PR-1 for adding an account, clearing an errored account, and a
/// threshold change (in this pool the switch threshold only orders accounts, it never
/// blocks: lowering it is re-evaluated and leaves a blocked row where it is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_2_adding_clearing_and_threshold_changes_are_re_evaluated() {
    // Adding an account.
    let h = CoreSetup::new().real_retry().start().await;
    with_b_disabled(&h).await;
    let (thread, _) = blocked_turn(&h, h.now() + 2 * HOUR).await;
    let row = h.row(&thread);
    // Lowering the threshold: re-evaluated, still blocked (B is disabled and A's window is
    // rejected whatever the threshold) → the row stays where it is, nothing is sent.
    h.set_pool("switch-threshold", "0.5").await;
    h.settle().await;
    assert_eq!(h.row(&thread).send_at, row.send_at);
    assert_eq!(h.upstream_turns(), 1);
    h.advance(Duration::from_secs(30)).await;
    let added_at = h.now();
    h.add_claude_key("sk-ant-api03-key-c").await;
    h.settle().await;
    assert_eq!(
        sent_soon_after(&h, &thread, row.id, added_at).await,
        "sk-ant-api03-key-c"
    );

    // Clearing an errored account: B enabled, then errored by another thread's 401, then
    // cleared (enabled again, as `pooler account enable` does).
    let h = CoreSetup::new().real_retry().start().await;
    let b = with_b_disabled(&h).await;
    let reset = h.now() + 2 * HOUR;
    let (thread, _) = blocked_turn(&h, reset).await;
    let row = h.row(&thread);
    h.enable_account(&b).await;
    h.settle().await;
    assert!(h.row(&thread).send_at < row.send_at);
    h.upstream.push(reply(401, &[]));
    let other = h.new_thread().await;
    h.send(&other, "hello");
    h.settle().await;
    assert_eq!(
        h.upstream.received()[1].header("x-api-key"),
        Some("sk-ant-api03-key-b")
    );
    // B errored; the pool signals it on its maintenance tick: the row goes back to A's reset.
    h.maintenance_tick().await;
    let back = h.row(&thread);
    assert_eq!((back.id, back.attempt), (row.id, 2));
    assert!(
        back.send_at >= reset + BUFFER,
        "{back:?} {:?} {:?}",
        h.explain(&thread).await,
        h.accounts().await
    );
    h.advance(Duration::from_secs(30)).await;
    let cleared_at = h.now();
    h.enable_account(&b).await;
    h.settle().await;
    assert_eq!(
        sent_soon_after(&h, &thread, row.id, cleared_at).await,
        "sk-ant-api03-key-b"
    );
}

/// PR-3: All accounts errored → watch `pool-unavailable(authentication)`; enabling one
/// account creates the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_3_all_accounts_errored_is_watched_until_an_account_is_enabled() {
    let h = CoreSetup::new().real_retry().start().await;
    let b = with_b_disabled(&h).await;
    // A enters authentication error on another thread's 401.
    h.upstream.push(reply(401, &[]));
    let other = h.new_thread().await;
    h.send(&other, "hello");
    h.settle().await;
    assert!(h.rows(&other).is_empty());

    let thread = h.new_thread().await;
    let first = h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(h.upstream_turns(), 1, "the pool answered for itself");
    assert!(h.rows(&thread).is_empty());
    let candidates = h.candidates(Some(&thread)).await;
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    assert!(matches!(
        candidates[0].state,
        pooler_host::runtime::bindings::retry::exports::pooler::plugins::retry_admin::CandidateState::Watching
    ));
    assert_eq!(candidates[0].reason, "pool-unavailable(authentication)");

    h.advance(Duration::from_secs(60)).await;
    assert!(h.rows(&thread).is_empty(), "still watching");
    let enabled_at = h.now();
    h.enable_account(&b).await;
    h.settle().await;
    let row = h.row(&thread);
    assert_eq!(row.original_request, first);
    assert_eq!(
        sent_soon_after(&h, &thread, row.id, enabled_at).await,
        "sk-ant-api03-key-b"
    );
}

/// PR-4: Beyond maximum wait (reset T+7 h, cap 6 h) → watch; adding an account schedules
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_4_beyond_maximum_wait_is_watched_until_an_account_is_added() {
    let h = CoreSetup::new().real_retry().start().await;
    with_b_disabled(&h).await;
    let (thread, _) = blocked_turn(&h, h.now() + 7 * HOUR).await;
    assert!(h.rows(&thread).is_empty());
    let candidates = h.candidates(Some(&thread)).await;
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    assert_eq!(candidates[0].reason, "beyond-maximum-wait");

    h.advance(Duration::from_secs(600)).await;
    assert!(h.rows(&thread).is_empty());
    let added_at = h.now();
    h.add_claude_key("sk-ant-api03-key-c").await;
    h.settle().await;
    let row = h.row(&thread);
    assert_eq!(
        sent_soon_after(&h, &thread, row.id, added_at).await,
        "sk-ant-api03-key-c"
    );
}

/// PR-5: Restart: a pending row and a pool that became ready while the host was down →
/// re-evaluated on start (before the row is due), sent early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_5_on_start_re_evaluates_a_pending_row_and_sends_it_early() {
    let mut h = CoreSetup::new().real_retry().start().await;
    with_b_disabled(&h).await;
    // A long buffer for the first decision, so the row waits well past A's reset.
    h.retry_set("reset-buffer", "1h").await;
    let reset = h.now() + 2 * HOUR;
    let (thread, _) = blocked_turn(&h, reset).await;
    let row = h.row(&thread);
    assert!(row.send_at >= reset + HOUR);
    h.retry_set("reset-buffer", "15s").await;

    // Down across A's reset.
    h.stop().await;
    h.clock.set(reset + MINUTE);
    let started_at = h.now();
    h.restart().await;
    let histories = h.explain(&thread).await;
    assert!(
        entries(&histories).iter().any(|e| matches!(e.trigger, Trigger::Start)
            && matches!(e.action, Action::Rescheduled((old, new)) if old == row.send_at && new < old)),
        "{histories:?}"
    );
    assert_eq!(
        sent_soon_after(&h, &thread, row.id, started_at).await,
        API_KEY,
        "served by A, its window reset"
    );
    assert!(h.now() < row.send_at, "sent early");
}

/// PR-6: Many threads: ten pending threads are released staggered (ten distinct send
/// times) when an account is enabled; attempt numbers are unchanged by re-evaluation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_6_ten_pending_threads_are_released_staggered() {
    let h = CoreSetup::new().real_retry().start().await;
    let b = with_b_disabled(&h).await;
    let (first, _) = blocked_turn(&h, h.now() + 2 * HOUR).await;
    let mut threads = vec![first];
    for _ in 1..10 {
        let thread = h.new_thread().await;
        h.send(&thread, "hello");
        h.settle().await;
        threads.push(thread);
    }
    assert_eq!(h.upstream_turns(), 1, "the pool answered the others itself");
    let rows: Vec<_> = threads.iter().map(|t| h.row(t)).collect();
    assert!(rows.iter().all(|r| r.attempt == 2));

    let enabled_at = h.now();
    h.enable_account(&b).await;
    h.settle().await;
    let moved: Vec<_> = threads.iter().map(|t| h.row(t)).collect();
    let mut times: Vec<u64> = moved.iter().map(|r| r.send_at).collect();
    for (before, after) in rows.iter().zip(&moved) {
        assert_eq!((after.id, after.attempt), (before.id, 2));
        assert!((enabled_at + BUFFER..enabled_at + BUFFER + JITTER).contains(&after.send_at));
    }
    times.sort_unstable();
    times.dedup();
    assert_eq!(times.len(), 10, "ten distinct send times: {times:?}");

    for _ in 0..10 {
        h.upstream.push(success("recovered"));
    }
    h.clock.set(*times.last().unwrap());
    h.settle().await;
    assert_eq!(h.upstream_turns(), 11);
    for thread in &threads {
        let turns = h.turns(thread);
        assert_eq!(turns.len(), 2);
        assert_eq!(
            (turns[1].attempt, turns[1].outcome),
            (2, Some(TurnOutcomeKind::Ok))
        );
    }
    let keys: Vec<_> = h.upstream.received()[1..]
        .iter()
        .map(|r| r.header("x-api-key").unwrap().to_owned())
        .collect();
    assert!(keys.iter().all(|k| k == "sk-ant-api03-key-b"), "{keys:?}");
}

/// PR-7: Thread moved on: the thread completes a newer turn while its row waits → the row
/// is dropped as stale and no "Please continue." is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_7_a_thread_that_moved_on_drops_its_row_as_stale() {
    let h = CoreSetup::new().real_retry().start().await;
    h.retry_set("backoff-base", "1h").await;
    h.upstream.push(reply(502, &[]));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    let row = h.row(&thread);

    h.upstream.push(success("newer answer"));
    h.send(&thread, "something else");
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert!(h.rows(&thread).is_empty(), "the row is gone");

    h.clock.set(row.send_at + HOUR);
    h.settle().await;
    assert_eq!(h.upstream_turns(), 2);
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert!(turns.iter().all(|t| t.input != "Please continue."));
    let histories = h.explain(&thread).await;
    let stale = histories
        .iter()
        .flat_map(|c| &c.entries)
        .find(|e| e.reason.starts_with("stale"))
        .unwrap_or_else(|| panic!("{histories:?}"));
    assert!(matches!(stale.action, Action::Resolved | Action::Dropped));
    assert!(h.candidates(Some(&thread)).await.is_empty());
}

/// PR-8: Later reset: re-evaluation sees a later retry-at → the row moves later; no
/// attempt is spent at the old time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_8_a_later_reset_moves_the_row_later() {
    let h = CoreSetup::new().real_retry().start().await;
    let b = with_b_disabled(&h).await;
    // A is blocked until T+3 h by another thread; B serves, then is blocked until T+1 h.
    let late = h.now() + 3 * HOUR;
    blocked_turn(&h, late).await;
    h.enable_account(&b).await;
    h.settle().await;
    let early = h.now() + HOUR;
    let (thread, _) = blocked_turn(&h, early).await;
    assert_eq!(
        h.upstream.received()[1].header("x-api-key"),
        Some("sk-ant-api03-key-b")
    );
    let row = h.row(&thread);
    assert!((early + BUFFER..early + BUFFER + JITTER).contains(&row.send_at));

    // B is disabled: the earliest the pool can serve is A's reset, later.
    h.disable_account(&b).await;
    h.settle().await;
    let moved = h.row(&thread);
    assert_eq!((moved.id, moved.attempt), (row.id, 2));
    assert!((late + BUFFER..late + BUFFER + JITTER).contains(&moved.send_at));
    let turns_before = h.upstream_turns();
    h.clock.set(row.send_at);
    h.settle().await;
    assert_eq!(
        h.upstream_turns(),
        turns_before,
        "nothing sent at the old time"
    );
    assert_eq!(h.row(&thread).attempt, 2, "no attempt spent");
    let histories = h.explain(&thread).await;
    assert!(
        entries(&histories).iter().any(|e| matches!(e.action,
            Action::Rescheduled((old, new)) if old == row.send_at && new == moved.send_at)),
        "{histories:?}"
    );
}

/// PR-9: Due while still blocked → `wait-until`: no dispatch, no attempt, the row moves to
/// the pool's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_9_a_row_due_while_still_blocked_waits() {
    let h = CoreSetup::new().real_retry().start().await;
    with_b_disabled(&h).await;
    let reset = h.now() + 2 * HOUR;
    let (thread, _) = blocked_turn(&h, reset).await;
    let row = h.row(&thread);
    // The row comes due early (moved by hand through the core's queue).
    let early = h.now() + MINUTE;
    h.link
        .threads_service()
        .reschedule("provider-retry", &thread, row.id, early, "test: due early")
        .unwrap();
    h.clock.set(early);
    h.settle().await;
    assert_eq!(h.upstream_turns(), 1, "no dispatch");
    let waited = h.row(&thread);
    assert_eq!((waited.id, waited.attempt), (row.id, 2));
    assert!(
        (reset + BUFFER..reset + BUFFER + JITTER).contains(&waited.send_at),
        "{waited:?}"
    );
    assert!(
        h.show(&thread)
            .history
            .iter()
            .any(|e| e.action == "postponed" && e.row == Some(row.id)),
        "{:?}",
        h.show(&thread).history
    );
    let histories = h.explain(&thread).await;
    assert!(
        entries(&histories).iter().any(|e| matches!(e.trigger, Trigger::Due)
            && matches!(e.action, Action::Rescheduled((old, new)) if old == early && new == waited.send_at)),
        "{histories:?}"
    );
    // At its new time the window has reset: sent, as attempt 2.
    h.upstream.push(success("ok"));
    h.clock.set(waited.send_at);
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(
        (turns[1].attempt, turns[1].outcome),
        (2, Some(TurnOutcomeKind::Ok))
    );
}

/// PR-10: Missed signal: the pool recovers without any signal (B enabled behind the pool's
/// back, in its database); the tick finds the recovery within one re-evaluation interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_10_the_tick_finds_a_recovery_no_signal_reported() {
    let h = CoreSetup::new().real_retry().start().await;
    h.retry_set("reevaluation-interval", "1m").await;
    let b = with_b_disabled(&h).await;
    let (thread, _) = blocked_turn(&h, h.now() + 2 * HOUR).await;
    let row = h.row(&thread);

    let pool_db = pooler_tests::harness::find_file(h.data.path(), "pool.sqlite3");
    let db = rusqlite::Connection::open(pool_db).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        db.execute("UPDATE accounts SET enabled = 1 WHERE id = ?1", [&b])
            .unwrap(),
        1
    );
    drop(db);
    let recovered_at = h.now();
    // Ten-second steps of the host clock (its tick), up to one interval and one tick.
    let mut moved_at = None;
    while h.now() <= recovered_at + MINUTE + 10 * SECOND {
        h.advance(Duration::from_secs(10)).await;
        if h.rows(&thread)
            .first()
            .is_some_and(|r| r.send_at < row.send_at)
        {
            moved_at = Some(h.now());
            break;
        }
    }
    let moved_at = moved_at.expect("the tick re-evaluated within one interval");
    let histories = h.explain(&thread).await;
    assert!(
        entries(&histories)
            .iter()
            .any(|e| matches!(e.trigger, Trigger::Tick)
                && matches!(e.action, Action::Rescheduled((old, _)) if old == row.send_at)),
        "{histories:?}"
    );
    let moved = h.row(&thread);
    assert!(moved.send_at <= moved_at + BUFFER + JITTER);
    h.upstream.push(success("ok"));
    h.clock.set(moved.send_at);
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(
        (turns[1].attempt, turns[1].outcome),
        (2, Some(TurnOutcomeKind::Ok))
    );
    assert_eq!(
        h.upstream.received().last().unwrap().header("x-api-key"),
        Some("sk-ant-api03-key-b")
    );
}
