//! Account Pooler scenarios (spec `account-pool.md` §11) about quota and rate limits: shared
//! windows, family windows, short and long 429s, the soft switch threshold (#6169), the
//! pool's own 429 and the availability answer computed by the same function. The real pool
//! in the real host, a fake upstream on 127.0.0.1, the manual clock; accounts A, B, C are API
//! keys `key-a`, `key-b`, `key-c`.

use std::time::Duration;

use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::AccountStatus;
use pooler_host::runtime::bindings::types::Availability;
use pooler_tests::harness::START_MS;
use pooler_tests::pool::{OPUS, Pool, SONNET, THREAD, five_hour_rejected, reply};
use pooler_tests::upstream::Reply;

fn rejected(reset_ms: Option<u64>) -> Reply {
    reply(429, &five_hour_rejected(reset_ms))
}

/// A 200 that reports the 5 h window at `utilization`, allowed, resetting in an hour.
fn served_at(utilization: &str) -> Reply {
    Reply::status(200)
        .header("content-type", "text/plain")
        .header("anthropic-ratelimit-unified-status", "allowed")
        .header("anthropic-ratelimit-unified-5h-status", "allowed")
        .header("anthropic-ratelimit-unified-5h-utilization", utilization)
        .header(
            "anthropic-ratelimit-unified-5h-reset",
            &((START_MS + 3_600_000) / 1000).to_string(),
        )
        .body("ok")
}

/// AP-5: A's shared quota is exhausted (429, 5 h rejected, reset in 60 s) — S moves to B
/// (lasting: re-pinned), new sessions go to B; after the reset, new sessions stay on the
/// cursor (B) and S stays on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap5_an_exhausted_shared_window_moves_the_session_and_the_cursor() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);

    pool.upstream.push(rejected(Some(START_MS + 60_000)));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen(), ["A", "A", "B"]);
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.account, Some(pool.id("B")));
    assert_eq!(
        explained.why,
        format!("re-pinned: previous account {} (quota)", pool.id("A"))
    );
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Exhausted);
    assert_eq!(a.blocking_reset, Some(START_MS + 60_000));

    assert_eq!(pool.send(pool.messages("new-1")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B"]);

    pool.advance(Duration::from_secs(61));
    assert_eq!(pool.account("A").await.status, AccountStatus::Ready);
    assert_eq!(pool.send(pool.messages("new-2")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["B", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
}

/// AP-6: a family detour — A rejects the Opus family (scoped `7d_opus` window); S's Opus
/// requests go to B without moving the pin, S's Sonnet requests still go to A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap6_a_family_limit_detours_that_family_only() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);

    let week = ((START_MS + 7 * 86_400_000) / 1000).to_string();
    pool.upstream.push(reply(
        429,
        &[
            (
                "anthropic-ratelimit-unified-status".into(),
                "allowed".into(),
            ),
            (
                "anthropic-ratelimit-unified-5h-status".into(),
                "allowed".into(),
            ),
            (
                "anthropic-ratelimit-unified-7d_opus-status".into(),
                "rejected".into(),
            ),
            (
                "anthropic-ratelimit-unified-7d_opus-utilization".into(),
                "1.0".into(),
            ),
            ("anthropic-ratelimit-unified-7d_opus-reset".into(), week),
        ],
    ));
    let answer = pool.send(pool.messages_for("S", OPUS)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen(), ["A", "A", "B"]);
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(
        explained.account,
        Some(pool.id("A")),
        "a family limit is a detour"
    );
    assert_eq!(explained.recent.last().unwrap().outcome.as_str(), "detour");

    // Opus now skips A without asking it; Sonnet still goes to A.
    assert_eq!(pool.send(pool.messages_for("S", OPUS)).await.status, 200);
    assert_eq!(pool.send(pool.messages_for("S", SONNET)).await.status, 200);
    assert_eq!(pool.send(pool.messages_for("S", OPUS)).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B", "A", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
    // The account is not exhausted as a whole; its Opus window is listed as blocking.
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Ready);
    let opus = a.windows.iter().find(|w| w.name == "7d_opus").unwrap();
    assert_eq!(opus.family.as_deref(), Some("opus"));
    assert!(opus.blocking);
}

/// AP-7: a short 429 (Retry-After 20 s, the inline wait limit) — the request waits once, for
/// exactly that long, retries A, and gets A's 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap7_a_short_429_is_waited_out_inline_and_retried_on_the_same_account() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    pool.upstream
        .push(reply(429, &[("retry-after".into(), "20".into())]));
    let (answer, moves) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(moves, [Duration::from_secs(20)]);
    assert_eq!(pool.seen(), ["A", "A", "A"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
}

/// AP-8: a long 429 (Retry-After 120 s, over the 20 s inline wait) on the pinned account —
/// S is served by B as a detour without waiting, keeps being served by B without A being
/// asked while A is held, waits inline once the rest of the hold fits the inline wait, and
/// is on A again after the hold. The pin never moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap8_a_long_429_detours_the_pinned_session_until_the_hold_ends() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    pool.upstream
        .push(reply(429, &[("retry-after".into(), "120".into())]));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen(), ["A", "A", "B"]);
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Held);
    assert_eq!(a.held_until, Some(START_MS + 120_000));
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));

    // Still held for long: B serves without A being asked.
    pool.advance(Duration::from_secs(10));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));

    // 15 s of hold left: within the inline wait, the request waits for A.
    pool.host.clock.set(START_MS + 105_000);
    let (answer, moves) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(moves, [Duration::from_secs(15)]);
    assert_eq!(pool.seen_after(4), ["A"]);

    // After the hold S is on A as before.
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(5), ["A"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
}

/// AP-10: everything exhausted (A resets in 60 s, B in 120 s, C in 180 s) — the pool answers
/// 429 with `Retry-After: 60` and `x-pooler-origin: pool`, a repeat makes no upstream call,
/// availability says `blocked(now + 60 s)`; after A's reset, A serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap10_when_every_account_is_exhausted_the_pool_answers_429_until_the_earliest_reset() {
    let pool = Pool::claude().await;
    pool.upstream.push(rejected(Some(START_MS + 60_000)));
    pool.upstream.push(rejected(Some(START_MS + 120_000)));
    pool.upstream.push(rejected(Some(START_MS + 180_000)));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    assert_eq!(answer.header("retry-after"), Some("60"));
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(pool.seen(), ["A", "B", "C"]);

    let again = pool.send(pool.messages("S")).await;
    assert_eq!(again.status, 429);
    assert_eq!(again.header("retry-after"), Some("60"));
    assert_eq!(again.header("x-pooler-origin"), Some("pool"));
    assert_eq!(
        pool.hits(),
        3,
        "no upstream call while everything is exhausted"
    );
    assert_eq!(
        pool.availability(THREAD, None).await,
        format!("blocked({}, QuotaExhausted)", START_MS + 60_000)
    );
    assert_eq!(
        pool.pinned("S").await,
        None,
        "a request that failed everywhere pins nothing"
    );

    pool.advance(Duration::from_secs(60));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen_after(3), ["A"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
}

/// AP-11 (#6169): the threshold is soft — a new session prefers an account under the
/// threshold while one exists; with every account at 99 % (not rejected) requests are still
/// served (no 429), pinned sessions stay put, and availability is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap11_accounts_over_the_threshold_still_serve_as_a_reserve() {
    let pool = Pool::claude().await;
    for _ in 0..3 {
        pool.upstream.push(served_at("0.99"));
    }
    // Each new session prefers an account still under the threshold.
    for session in ["n1", "n2", "n3"] {
        assert_eq!(pool.send(pool.messages(session)).await.status, 200);
    }
    assert_eq!(pool.seen(), ["A", "B", "C"]);
    for letter in ["A", "B", "C"] {
        assert_eq!(pool.account(letter).await.status, AccountStatus::NearLimit);
    }

    // Now every account is over the threshold: still served, by the cursor (A) for a new
    // session, by their own accounts for pinned ones.
    let answer = pool.send(pool.messages("n4")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    for session in ["n1", "n2", "n3"] {
        assert_eq!(pool.send(pool.messages(session)).await.status, 200);
    }
    assert_eq!(pool.seen_after(3), ["A", "A", "B", "C"]);
    assert_eq!(pool.availability(THREAD, None).await, "ready");
}

/// AP-21: the availability answers — not-routed (no route; routing off),
/// no-enabled-account, ready, blocked with the same time as the 429's `Retry-After` at the
/// same instant, reset-unknown, authentication; and the pool's HTTP answer in each state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap21_the_availability_answer_matches_the_pools_own_answer_in_every_state() {
    let pool = Pool::claude().await;
    let pool_verdict = |answer: &pooler_tests::client::Answer, status: u16| {
        assert_eq!(answer.status, status, "{}", answer.body);
        assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    };

    // not-routed: a thread without a route; every thread while routing is off.
    assert_eq!(pool.availability("nobody", None).await, "not-routed");
    pool.set("claude-routing", "off").await.unwrap();
    assert_eq!(pool.availability(THREAD, None).await, "not-routed");
    pool_verdict(&pool.send(pool.messages("S")).await, 503);
    pool.set("claude-routing", "on").await.unwrap();

    // ready.
    assert_eq!(pool.availability(THREAD, None).await, "ready");

    // no-enabled-account: 503 from the pool.
    for letter in ["A", "B", "C"] {
        pool.disable(letter).await;
    }
    assert_eq!(
        pool.availability(THREAD, None).await,
        "unavailable(NoEnabledAccount)"
    );
    let answer = pool.send(pool.messages("S")).await;
    pool_verdict(&answer, 503);
    assert!(
        answer.body.contains("no enabled account"),
        "{}",
        answer.body
    );
    for letter in ["A", "B", "C"] {
        pool.enable(letter).await;
    }
    assert_eq!(pool.hits(), 0);

    // blocked: A resets in 60 s, B in 120 s, C at an unknown time.
    pool.upstream.push(rejected(Some(START_MS + 60_000)));
    pool.upstream.push(rejected(Some(START_MS + 120_000)));
    pool.upstream.push(rejected(None));
    for elapsed_ms in [0, 12_500, 59_001] {
        pool.host.clock.set(START_MS + elapsed_ms);
        let answer = pool.send(pool.messages("S")).await;
        pool_verdict(&answer, 429);
        let Availability::Blocked(blocked) = pool.availability_answer(THREAD, None).await else {
            panic!("not blocked");
        };
        assert_eq!(blocked.retry_at, START_MS + 60_000);
        let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(
            retry_after,
            (blocked.retry_at - pool.now()).div_ceil(1000).max(1),
            "the 429 and the availability answer agree at {}",
            pool.now()
        );
    }
    assert_eq!(pool.seen(), ["A", "B", "C"]);

    // reset-unknown: only C (no known reset) is enabled; the pool says Retry-After: 60.
    pool.disable("A").await;
    pool.disable("B").await;
    assert_eq!(
        pool.availability(THREAD, None).await,
        "unavailable(ResetUnknown)"
    );
    let answer = pool.send(pool.messages("S")).await;
    pool_verdict(&answer, 429);
    assert_eq!(answer.header("retry-after"), Some("60"));
    assert_eq!(pool.hits(), 3);

    // authentication: B (its window reset by now) refuses its key; with C disabled every
    // enabled account is in error.
    pool.host.clock.set(START_MS + 121_000);
    pool.enable("B").await;
    pool.upstream.push(reply(401, &[]));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 401, "B's refusal is what the client sees");
    assert_eq!(answer.header("x-pooler-origin"), None);
    assert_eq!(pool.seen_after(3), ["B"]);
    pool.disable("C").await;
    assert_eq!(
        pool.availability(THREAD, None).await,
        "unavailable(Authentication)"
    );
    let answer = pool.send(pool.messages("S")).await;
    pool_verdict(&answer, 429);
    assert_eq!(answer.header("retry-after"), Some("60"));
    assert_eq!(pool.hits(), 4);
}
