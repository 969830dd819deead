//! Account Pooler scenarios (spec `account-pool.md` §11) about where a session goes: affinity,
//! transient failures as detours (#6990), lasting disqualifications, parents, concurrency
//! and stale completions. The real pool in the real host, a fake upstream on 127.0.0.1, the
//! manual clock; accounts A, B, C are API keys `key-a`, `key-b`, `key-c`.

use std::time::Duration;

use pooler_tests::pool::{Pool, PoolSetup, reply};
use pooler_tests::upstream::{Gate, Reply};

/// The default transient backoff (250 ms, then 1 s) as the clock moves during a request.
const BACKOFF: [Duration; 2] = [Duration::from_millis(250), Duration::from_secs(1)];

/// AP-1: Sticky — session S goes to A on every request while A is eligible (and other
/// sessions do not move it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap1_a_session_stays_on_its_account_while_it_is_eligible() {
    let pool = Pool::claude().await;
    for _ in 0..4 {
        let answer = pool.send(pool.messages("S")).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body, "ok");
    }
    // Another conversation in between does not move S.
    assert_eq!(pool.send(pool.messages("other")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A", "A", "A", "A", "A", "A"]);
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.account, Some(pool.id("A")));
    assert_eq!(explained.key, "session:S");
    assert_eq!(explained.thread.as_deref(), Some("t1"));
    assert_eq!(explained.why, "pinned on first success");
    // The upstream got the Claude Code request as sent: path and query, body, headers.
    let first = &pool.upstream.received()[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/messages?beta=true");
    assert_eq!(first.header("x-claude-code-session-id"), Some("S"));
    assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        first.header("authorization"),
        None,
        "the route token stays in the pool"
    );
    assert_eq!(
        first.body,
        pooler_tests::pool::claude_body("S", pooler_tests::pool::SONNET)
    );
}

/// AP-2 (#6990), one transient failure kind: S is served by A; A fails transiently for one
/// request — tried three times (the first try and the default two retries after 250 ms and
/// 1 s), then B serves as a detour; the pin stays on A, and S's next request goes to A
/// first and only.
async fn recovered_pin_after_transient_failure(failure: Reply) {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A"]);

    for _ in 0..3 {
        pool.upstream.push(failure.clone());
    }
    let (answer, moves) = pool.drive(pool.messages("S")).await;
    assert_eq!(
        answer.status,
        200,
        "{} {:?} {moves:?}",
        answer.body,
        pool.seen()
    );
    assert_eq!(answer.body, "ok");
    assert_eq!(pool.seen_after(1), ["A", "A", "A", "B"]);
    assert_eq!(moves, BACKOFF, "the retries waited 250 ms, then 1 s");
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(
        explained.account,
        Some(pool.id("A")),
        "the detour moved the pin"
    );
    let outcomes: Vec<&str> = explained
        .recent
        .iter()
        .map(|r| r.outcome.as_str())
        .collect();
    assert_eq!(outcomes, ["served", "transient", "detour"]);

    // A recovered: the next request of S goes to A, first and only.
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(pool.seen_after(5), ["A"]);
    // And the cursor did not move either: a new conversation starts on A.
    assert_eq!(pool.send(pool.messages("new")).await.status, 200);
    assert_eq!(pool.seen_after(6), ["A"]);
}

/// AP-2: 408 Request Timeout is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_408s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(408, &[])).await;
}

/// AP-2: 500 Internal Server Error is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_500s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(500, &[])).await;
}

/// AP-2: 502 Bad Gateway is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_502s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(502, &[])).await;
}

/// AP-2: 503 Service Unavailable is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_503s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(503, &[])).await;
}

/// AP-2: 504 Gateway Timeout is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_504s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(504, &[])).await;
}

/// AP-2: 529 Overloaded is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_529s_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(reply(529, &[])).await;
}

/// AP-2: a connection dropped before any response is transient; the pin survives the detour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap2_after_dropped_connections_the_session_detours_once_and_returns_to_its_account() {
    recovered_pin_after_transient_failure(Reply::drop_connection()).await;
}

/// A 503 whose body stalls after its head holds the request only for the host's
/// `error-body-timeout-ms` (100 ms of real time here: it bounds a real socket), not for the
/// between-bytes limit a model call gets (600 s): A is tried three times with the usual
/// backoffs, its part of a detail kept, and B serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_whose_body_stalls_is_given_up_on_and_detoured() {
    let pool = PoolSetup::claude_keys(3)
        .plugin("error-body-timeout-ms = 100")
        .start()
        .await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    let stall = Gate::new();
    for _ in 0..3 {
        pool.upstream.push(
            Reply::status(503)
                .header("content-type", "application/json")
                .body(r#"{"type":"error","error":{"type":"overlo"#)
                .pause(&stall),
        );
    }
    let (answer, moves) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen_after(1), ["A", "A", "A", "B"]);
    assert_eq!(moves, BACKOFF, "only the backoffs moved the clock");
    assert_eq!(pool.explain("S").await.unwrap().account, Some(pool.id("A")));
}

/// AP-3: a transient outage longer than the retries — S detours to B on each request while
/// A is down, trying A first each time, and returns to A on the first request after A
/// recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap3_during_an_outage_each_request_tries_its_account_first_then_detours() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    for round in 0..3 {
        for _ in 0..3 {
            pool.upstream.push(reply(503, &[]));
        }
        let before = pool.hits();
        let (answer, moves) = pool.drive(pool.messages("S")).await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.body);
        assert_eq!(
            pool.seen_after(before),
            ["A", "A", "A", "B"],
            "round {round}"
        );
        assert_eq!(moves, BACKOFF);
        assert_eq!(
            pool.pinned("S").await.as_deref(),
            Some("A"),
            "round {round}"
        );
    }
    let before = pool.hits();
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(before), ["A"]);
}

/// AP-4: a lasting disqualification re-pins — A's API key gets 401, A goes into error, S
/// moves to B and stays there after A is re-enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap4_a_refused_api_key_moves_the_session_for_good() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);

    pool.upstream.push(reply(401, &[]));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen_after(1), ["A", "B"], "a 401 is not retried");
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.account, Some(pool.id("B")));
    assert_eq!(
        explained.why,
        format!("re-pinned: previous account {} (auth)", pool.id("A"))
    );
    let a = pool.account("A").await;
    assert_eq!(
        a.status,
        pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::AccountStatus::Error
    );
    assert!(a.error.unwrap().contains("refused the API key"));

    // While A is in error nothing goes to it, new conversations included.
    assert_eq!(pool.send(pool.messages("new")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B"]);

    // Re-enabled, A serves again, but S stays where it was re-pinned.
    let a = pool.enable("A").await;
    assert_eq!(a.error, None);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["B", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
}

/// AP-9: every account answers 503 — the client gets the last upstream 503 (not a pool
/// verdict); S's pin and the cursor are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap9_when_every_account_fails_transiently_the_client_gets_503_and_nothing_moves() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    for _ in 0..9 {
        pool.upstream.push(reply(503, &[]));
    }
    let (answer, moves) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(
        answer.header("x-pooler-origin"),
        None,
        "an upstream failure"
    );
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["message"], "scripted 503");
    assert_eq!(
        pool.seen_after(1),
        ["A", "A", "A", "B", "B", "B", "C", "C", "C"]
    );
    assert_eq!(moves, [BACKOFF, BACKOFF, BACKOFF].concat());
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));

    // Nothing moved: S goes back to A, and a new conversation starts on the cursor, A.
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.send(pool.messages("new")).await.status, 200);
    assert_eq!(pool.seen_after(10), ["A", "A"]);
}

/// AP-16: parent inheritance — a child session of S starts on S's account (not on the
/// cursor's); the child's own later failover re-pins the child and leaves S's pin alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap16_a_child_session_starts_on_its_parents_account_and_fails_over_alone() {
    let pool = Pool::claude().await;
    // Put S on B while the cursor stays on A: X (on A) gets a long 429, holding A for 5 min.
    assert_eq!(pool.send(pool.messages("X")).await.status, 200);
    pool.upstream
        .push(reply(429, &[("retry-after".into(), "300".into())]));
    assert_eq!(pool.send(pool.messages("X")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A", "A", "B", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
    assert_eq!(pool.pinned("X").await.as_deref(), Some("A"));
    pool.advance(Duration::from_secs(301));
    // The cursor is still A: a new conversation starts there.
    assert_eq!(pool.send(pool.messages("new")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["A"]);

    // The child K of S starts on B, its parent's account.
    let child = |pool: &Pool| {
        let user_id = serde_json::json!({ "session_id": "K", "parent_session_id": "S" });
        let body = serde_json::json!({
            "model": pooler_tests::pool::SONNET,
            "max_tokens": 16,
            "metadata": { "user_id": user_id.to_string() },
            "messages": [{ "role": "user", "content": "hi" }],
        });
        pool.request("POST", "/v1/messages", body.to_string())
    };
    assert_eq!(pool.send(child(&pool)).await.status, 200);
    assert_eq!(pool.seen_after(5), ["B"]);
    let explained = pool.explain("K").await.unwrap();
    assert_eq!(explained.account, Some(pool.id("B")));
    assert_eq!(explained.why, "inherited from its parent session");

    // K's own failover (B refuses its key) re-pins K only.
    pool.upstream.push(reply(403, &[]));
    assert_eq!(pool.send(child(&pool)).await.status, 200);
    assert_eq!(pool.seen_after(6), ["B", "C"]);
    assert_eq!(pool.pinned("K").await.as_deref(), Some("C"));
    let parent = pool.explain("S").await.unwrap();
    assert_eq!(parent.account, Some(pool.id("B")));
    assert_eq!(parent.why, "pinned on first success");
}

/// AP-18: concurrent first requests of a new session all land on one account, and the
/// session is pinned there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap18_concurrent_first_requests_of_a_new_session_land_on_one_account() {
    const N: usize = 8;
    let pool = Pool::claude().await;
    // Every upstream answer waits until all N requests are in flight at once.
    let gate = Gate::new();
    for _ in 0..N {
        pool.upstream.push(
            Reply::status(200)
                .header("content-type", "text/plain")
                .hold_head(&gate)
                .body("ok"),
        );
    }
    let mut tasks = Vec::new();
    for _ in 0..N {
        let client = pool.client.clone();
        let request = pool.messages("S");
        tasks.push(tokio::spawn(async move { client.send(request).await }));
    }
    tokio::time::timeout(pooler_tests::pool::SOON, pool.upstream.wait_for_hits(N))
        .await
        .expect("every request reached the upstream while the others were in flight");
    gate.open();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status, 200);
    }
    let seen = pool.seen();
    assert_eq!(seen.len(), N);
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
    assert_eq!(pool.pinned("S").await, Some(seen[0].clone()));
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.why, "pinned on first success");
}

/// AP-19: a stale completion — an older request of S that finishes on A after a newer
/// request re-pinned S to B (A was disabled meanwhile) does not overwrite the newer pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap19_an_older_request_finishing_late_does_not_overwrite_a_newer_pin() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);

    // The older request reaches A and waits there for its answer.
    let gate = Gate::new();
    pool.upstream.push(
        Reply::status(200)
            .header("content-type", "text/plain")
            .hold_head(&gate)
            .body("late"),
    );
    let older = tokio::spawn({
        let client = pool.client.clone();
        let request = pool.messages("S");
        async move { client.send(request).await }
    });
    tokio::time::timeout(pooler_tests::pool::SOON, pool.upstream.wait_for_hits(2))
        .await
        .unwrap();

    // Meanwhile A is disabled and a newer request of S is re-pinned to B.
    pool.disable("A").await;
    let newer = pool.send(pool.messages("S")).await;
    assert_eq!(newer.status, 200);
    assert_eq!(pool.seen(), ["A", "A", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));

    // The older one completes on A: served, but the pin stays on B.
    pool.advance(Duration::from_secs(1));
    gate.open();
    let older = older.await.unwrap().unwrap();
    assert_eq!(older.status, 200);
    assert_eq!(older.body, "late");
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
    // Even once A is back, S stays on B.
    pool.enable("A").await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B"]);
}

/// An agent-sized body: the session is read from its metadata after ~300 KiB of
/// conversation (escapes, quotes and multi-byte text that the component's SIMD scan steps
/// over), and the body reaches the upstream byte for byte. A control character inside the
/// conversation makes the body not JSON: the request is served without a session, and
/// nothing is pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_read_after_a_long_conversation_and_a_broken_body_has_none() {
    let pool = Pool::claude().await;
    let body = |session: &str, text: &str| {
        let user_id = serde_json::json!({ "session_id": session }).to_string();
        serde_json::json!({
            "model": pooler_tests::pool::SONNET,
            "max_tokens": 16,
            "messages": [{ "role": "user", "content": text }],
            "metadata": { "user_id": user_id },
        })
        .to_string()
    };
    let line = "let s = \"quoted \\\\ text\"; // café ✓\n\ttabbed\r\n";
    let conversation = line.repeat(300 * 1024 / line.len());
    let big = body("BIG", &conversation);
    assert!(
        big.find("metadata").unwrap() > 300_000,
        "the metadata comes last"
    );
    let answer = pool
        .send(pool.request("POST", "/v1/messages", big.clone()))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.pinned("BIG").await.as_deref(), Some("A"));
    assert_eq!(pool.upstream.received()[0].body, big);

    // A raw control character (here U+0001) is not allowed in a JSON string.
    let broken = body("BROKEN", &conversation).replacen("café", "caf\u{1}", 1);
    let answer = pool
        .send(pool.request("POST", "/v1/messages", broken))
        .await;
    assert_eq!(
        answer.status, 400,
        "the provider refuses it: {}",
        answer.body
    );
    assert_eq!(
        answer.header("x-pooler-origin"),
        None,
        "forwarded, not refused by the pool"
    );
    assert_eq!(pool.pinned("BROKEN").await, None);
}
