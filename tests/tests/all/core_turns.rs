//! Turns the host's core sends through the real Account Pooler to a fake upstream: the
//! request an agent would send, the failure classified with its origin and Retry-After, the
//! event delivered to the retry plugin, the retry dispatched when the host clock reaches its
//! send time, and a person's send-now.

use std::time::Duration;

use pooler_core::{FailureCategory, FailureOrigin, ThreadStatus, TurnOutcomeKind, TurnTrigger};
use pooler_tests::core::{API_KEY, CoreSetup, failure, success};
use pooler_tests::upstream::Reply;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_through_the_real_pool_is_classified_and_the_retry_succeeds_at_its_time() {
    let h = CoreSetup::new().start().await;
    h.retry_set("schedule", "retry-after").await;
    h.upstream.push(
        Reply::status(429)
            .header("content-type", "application/json")
            .header("retry-after", "120")
            .body(r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#),
    );
    let thread = h.new_thread().await;
    let first = h.send(&thread, "hello");
    h.settle().await;

    // The turn went through the pool with the account's key, as a Claude Code request.
    let received = h.upstream.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some(API_KEY));
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    let session = h.show(&thread).thread.session_id;
    assert_eq!(body["stream"], true);
    assert_eq!(body["model"], "claude-test");
    assert!(
        body["metadata"]["user_id"]
            .as_str()
            .unwrap()
            .contains(&session),
        "{body}"
    );

    // Classified: rate limit, 429, the deadline Retry-After stated; the thread is in error.
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 1);
    let failed = turns[0].failure.clone().expect("a failure description");
    assert_eq!(failed.category, FailureCategory::RateLimit);
    assert_eq!(failed.http_status, Some(429));
    let deadline = h.now() + 120_000;
    assert_eq!(failed.retry_after, Some(deadline));
    // The pool passed the upstream's answer through: the provider's.
    assert_eq!(failed.origin, FailureOrigin::Provider);
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );

    // The event reached the plugin with the same description; it scheduled at the deadline.
    let events = h.retry_lines("events").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0],
        format!(
            "failed {thread} {first} {first} 1 FailureCategory::RateLimit FailureOrigin::Provider 429 {deadline} false"
        )
    );
    let row = h.row(&thread);
    assert_eq!((row.attempt, row.send_at), (2, deadline));

    // One second early: nothing. At the deadline the clock alone wakes the due loop.
    h.upstream.push(success("hi there"));
    h.advance(Duration::from_millis(119_000)).await;
    assert_eq!(h.upstream_turns(), 1);
    assert!(h.retry_lines("checks").await.is_empty());
    h.clock.advance(Duration::from_secs(1));
    tokio::time::timeout(pooler_tests::core::SOON, h.upstream.wait_for_hits(2))
        .await
        .expect("the retry is sent when the clock reaches its time");
    h.settle().await;

    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    let retry = &turns[1];
    assert_eq!(retry.attempt, 2);
    assert_eq!(retry.original_request, first);
    assert_eq!(retry.trigger, TurnTrigger::Retry);
    assert_eq!(
        retry.input, "hello",
        "the input was not accepted: sent again"
    );
    assert_eq!(retry.outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(retry.reply.as_deref(), Some("hi there"));
    assert!(h.rows(&thread).is_empty());
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Idle
    );
    assert_eq!(
        h.retry_lines("events").await[1],
        format!("succeeded {thread} {} {first} 2", retry.id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_own_429_while_it_holds_the_account_is_classified_with_origin_pool() {
    let h = CoreSetup::new().start().await;
    h.upstream.push(
        Reply::status(429)
            .header("retry-after", "120")
            .body(r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#),
    );
    let thread = h.new_thread().await;
    let first = h.send(&thread, "hello");
    h.settle().await;
    let hold_ends = h.now() + 120_000;
    // The fixture retries one second later; the pool still holds its only account.
    h.retry_set("schedule", "off").await;
    h.advance(Duration::from_secs(1)).await;
    assert_eq!(h.upstream_turns(), 1, "the pool answered for itself");
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!((turns[1].attempt, &turns[1].original_request), (2, &first));
    let failed = turns[1].failure.clone().unwrap();
    assert_eq!(failed.category, FailureCategory::RateLimit);
    assert_eq!(failed.origin, FailureOrigin::Pool);
    assert_eq!(failed.http_status, Some(429));
    assert_eq!(failed.retry_after, Some(hold_ends));
    let events = h.retry_lines("events").await;
    assert_eq!(
        events[1],
        format!(
            "failed {thread} {} {first} 2 FailureCategory::RateLimit FailureOrigin::Pool 429 {hold_ends} false",
            turns[1].id
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_sends_a_retry_now_bypassing_its_time_and_the_gate() {
    let h = CoreSetup::new().core("concurrency-limit = 1").start().await;
    h.retry_set("delay-ms", "3600000").await;
    h.retry_set("verdict", "drop:the gate would refuse").await;
    h.upstream.push(failure(500));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    let row = h.row(&thread);
    assert_eq!(row.send_at, h.now() + 3_600_000);

    h.upstream.push(success("done"));
    let sent = h.link.send_now(&thread).await.unwrap();
    h.settle().await;
    assert_eq!((sent.row, sent.attempt), (row.id, 2));
    assert!(sent.plugin_told);
    assert_eq!(
        h.retry_get("sent-by-person").await,
        Some(format!("{thread}:{}", row.id))
    );
    // No gate was asked; the turn ran and is recorded as a person's.
    assert!(h.retry_lines("checks").await.is_empty());
    let turns = h.turns(&thread);
    assert_eq!(turns[1].trigger, TurnTrigger::SendNow);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    let history = h.show(&thread).history;
    assert!(
        history
            .iter()
            .any(|e| e.action == "send-now" && e.actor == "person" && e.row == Some(row.id)),
        "{history:?}"
    );
    // Nothing left to send now.
    assert!(h.link.send_now(&thread).await.is_err());
}

/// A person's cancel of a built-in driver's turn that waits on the provider: the turn is
/// recorded as failed at once (not retried), and the thread takes the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_stops_waiting_and_the_thread_moves_on() {
    let h = CoreSetup::new().real_retry().start().await;
    let gate = pooler_tests::upstream::Gate::new();
    h.upstream.push(success("late").hold_head(&gate));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    tokio::time::timeout(Duration::from_secs(20), h.upstream.wait_for_hits(1))
        .await
        .expect("the turn reached the provider");
    assert!(h.link.cancel_turn(&thread).expect("a thread"));
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns[0].outcome, Some(TurnOutcomeKind::Failed));
    let failure = turns[0].failure.clone().unwrap();
    assert_eq!(failure.category, FailureCategory::Unknown);
    assert!(failure.message.is_some_and(|m| m.contains("cancelled")));
    assert!(
        h.rows(&thread).is_empty(),
        "a person's cancel is not retried"
    );
    gate.open();
    h.upstream.push(success("next"));
    h.send(&thread, "next");
    h.settle().await;
    assert_eq!(h.turns(&thread)[1].outcome, Some(TurnOutcomeKind::Ok));
}
