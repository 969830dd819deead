//! Account Pooler scenarios (spec `account-pool.md` §11): streaming, Codex session keys,
//! restart, availability-changed signals, admin refusals and bad input. The real pool in
//! the real host, fake upstreams on 127.0.0.1, the manual clock.

use std::time::Duration;

use http_body_util::BodyExt;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountStatus, AccountsError, Credential,
};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::routing::RoutingError;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::settings::SettingsError;
use pooler_host::runtime::bindings::types::Provider;
use pooler_host::runtime::roles::Role;
use pooler_tests::harness::START_MS;
use pooler_tests::pool::{Pool, PoolSetup, SOON, five_hour_rejected, oauth, reply};
use pooler_tests::provider::{claude, codex};
use pooler_tests::upstream::{Gate, Reply};

/// AP-14: streaming — an SSE response is passed through as it comes (the first event
/// reaches the client while the upstream is still paused); an upstream break after the first
/// event ends the stream with an SSE `error` event, and nothing is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap14_sse_streams_through_and_a_broken_stream_ends_with_an_error_event() {
    let pool = Pool::claude().await;
    let gate = Gate::new();
    pool.upstream.push(
        Reply::sse()
            .event("message_start", "{\"n\":1}")
            .pause(&gate)
            .event("message_stop", "{\"n\":2}"),
    );
    let response = tokio::time::timeout(SOON, pool.client.open(pool.messages("S")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(SOON, body.frame())
        .await
        .expect("the first event arrives while the upstream is paused")
        .unwrap()
        .unwrap();
    assert_eq!(
        first.data_ref().unwrap().as_ref(),
        b"event: message_start\ndata: {\"n\":1}\n\n"
    );
    gate.open();
    let rest = tokio::time::timeout(SOON, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest.as_ref(), b"event: message_stop\ndata: {\"n\":2}\n\n");

    // The upstream breaks after the first event.
    let gate = Gate::new();
    pool.upstream.push(
        Reply::sse()
            .event("message_start", "{\"n\":1}")
            .pause(&gate)
            .disconnect(),
    );
    let response = tokio::time::timeout(SOON, pool.client.open(pool.messages("S")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(SOON, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first.data_ref().unwrap().as_ref(),
        b"event: message_start\ndata: {\"n\":1}\n\n"
    );
    gate.open();
    let rest = tokio::time::timeout(SOON, body.collect())
        .await
        .unwrap()
        .expect("the stream ends cleanly, with an error event")
        .to_bytes();
    let rest = std::str::from_utf8(&rest).unwrap();
    let error = rest
        .strip_prefix("event: error\ndata: ")
        .and_then(|e| e.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("not an SSE error event: {rest:?}"));
    let error: serde_json::Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream was interrupted")
    );
    assert_eq!(
        pool.seen(),
        ["A", "A"],
        "no second attempt after headers were sent"
    );
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
}

/// The longest wait the tests below let the clock run through: the transient backoffs
/// (250 ms, 1 s), never the wait for a stream's first event (`first-event-wait`, 5 s).
const BACKOFFS_ONLY: Duration = Duration::from_secs(2);

/// The text of a scripted reply's body.
fn text_of(reply: &Reply) -> String {
    String::from_utf8(reply.body_bytes()).unwrap()
}

/// A 200 stream whose first event is an `overloaded_error` has delivered nothing: the pool
/// held its head, retries the account as it would a 529 (after the transient backoff), and
/// the client sees one clean stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opening_with_an_overload_is_retried_and_the_client_sees_one_clean_stream() {
    let pool = Pool::claude().await;
    pool.upstream
        .push(claude::failed_stream("overloaded_error", "Overloaded"));
    pool.upstream.push(claude::message("pong"));
    let (answer, moves) = pool.drive_within(pool.messages("S"), BACKOFFS_ONLY).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    assert_eq!(answer.body, text_of(&claude::message("pong")));
    assert_eq!(pool.seen(), ["A", "A"], "the same account, again");
    assert_eq!(moves, [Duration::from_millis(250)], "the transient backoff");
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
}

/// A 200 stream whose first event is a `rate_limit_error`, its head saying the shared
/// 5-hour window is rejected, is a lasting refusal as that 429 would be: the conversation
/// moves, and its next request goes to its new account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opening_with_a_shared_rate_limit_moves_the_conversation() {
    let pool = Pool::claude().await;
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    let mut limited = claude::failed_stream(
        "rate_limit_error",
        "Number of request tokens has exceeded your rate limit.",
    );
    for (name, value) in claude::unified_headers("rejected", 1.0, pool.now() + 3_600_000) {
        limited = limited.header(&name, &value);
    }
    pool.upstream.push(limited);
    pool.upstream.push(claude::message("from B"));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body, text_of(&claude::message("from B")));
    assert_eq!(pool.seen_after(1), ["A", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
    assert_eq!(pool.account("A").await.status, AccountStatus::Exhausted);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["B"], "its next request goes to B");
}

/// Once the answer's first event has passed, a failure later in the stream is relayed as
/// today: the client gets what came and the `error` event, and nothing is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_event_followed_by_an_error_is_relayed_as_today() {
    let pool = Pool::claude().await;
    let failing = claude::stream_error("Let me look", "overloaded_error");
    pool.upstream.push(failing.clone());
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, text_of(&failing));
    assert!(answer.body.contains("overloaded_error"));
    assert_eq!(pool.seen(), ["A"], "no second attempt");
}

/// A stream whose first event is slower than `first-event-wait` is relayed as today: the
/// head goes out when the wait is up, and the events as they come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_event_slower_than_the_wait_is_relayed_as_today() {
    let pool = Pool::claude().await;
    let gate = Gate::new();
    pool.upstream.push(
        Reply::sse()
            .pause(&gate)
            .event("message_start", "{\"n\":1}")
            .event("message_stop", "{\"n\":2}"),
    );
    let client = pool.client.clone();
    let request = pool.messages("S");
    let opened = tokio::spawn(async move { client.open(request).await });
    let wait = pool.host.next_wake(SOON).await;
    assert_eq!(
        wait,
        Some(Duration::from_secs(5)),
        "the head is held for the first event, `first-event-wait` at most"
    );
    assert!(!opened.is_finished(), "no head while it is held");
    pool.advance(Duration::from_secs(5));
    let response = tokio::time::timeout(SOON, opened)
        .await
        .expect("the head came once the wait was up")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    gate.open();
    let body = tokio::time::timeout(SOON, response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(
        body.as_ref(),
        b"event: message_start\ndata: {\"n\":1}\n\nevent: message_stop\ndata: {\"n\":2}\n\n"
    );
    assert_eq!(pool.seen(), ["A"]);
}

/// Codex: a Responses stream that announces its response and then fails with
/// `server_is_overloaded` has delivered no output: retried, one clean stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_stream_failing_after_its_announcement_is_retried() {
    let pool = PoolSetup::new(Provider::Codex)
        .account(oauth(Provider::Codex, "A", None))
        .account(oauth(Provider::Codex, "B", None))
        .start()
        .await;
    pool.upstream.push(codex::failed_response(
        "server_is_overloaded",
        "Our servers are currently overloaded. Please try again later.",
    ));
    pool.upstream.push(codex::response("pong"));
    let request = codex_request(
        &pool,
        &[("session-id", "s1")],
        serde_json::json!({"model": "gpt-5-codex", "input": [], "stream": true, "store": false}),
    );
    let (answer, moves) = pool.drive_within(request, BACKOFFS_ONLY).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body, text_of(&codex::response("pong")));
    assert_eq!(pool.seen(), ["A", "A"]);
    assert_eq!(moves, [Duration::from_millis(250)]);
}

/// A Codex `POST /v1/responses` with these headers and body.
fn codex_request(
    pool: &Pool,
    headers: &[(&str, &str)],
    body: serde_json::Value,
) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    let mut request = pool.request("POST", "/v1/responses", body.to_string());
    for (name, value) in headers {
        request.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    request
}

/// AP-17: Codex session keys — the id from the `thread-id` header, from the turn-metadata
/// header, from the body's `client_metadata`; the `prompt_cache_key` fallback in its own
/// `cache:` namespace (a real id wins over it); each request sent to the Codex upstream
/// with the account's token and ChatGPT account id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap17_codex_sessions_come_from_headers_body_and_the_cache_key_namespace() {
    let pool = PoolSetup::new(Provider::Codex)
        .account(oauth(Provider::Codex, "A", None))
        .account(oauth(Provider::Codex, "B", None))
        .start()
        .await;
    let plain = |extra: serde_json::Value| {
        let mut body = serde_json::json!({
            "model": "gpt-5-codex", "input": [], "stream": true, "store": false,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };

    // Codex CLI as observed: every field names the same id.
    let metadata = r#"{"session_id":"T1","thread_id":"T1","turn_id":"u1"}"#;
    let request = codex_request(
        &pool,
        &[
            ("thread-id", "T1"),
            ("session-id", "T1"),
            ("x-codex-turn-metadata", metadata),
            ("originator", "codex_cli_rs"),
        ],
        plain(serde_json::json!({
            "prompt_cache_key": "T1",
            "client_metadata": { "session_id": "T1", "thread_id": "T1" },
        })),
    );
    let answer = pool.send(request).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let sent = &pool.upstream.received()[0];
    assert_eq!(sent.path, "/backend-api/codex/responses");
    assert_eq!(sent.header("authorization"), Some("Bearer tok-a"));
    assert_eq!(sent.header("chatgpt-account-id"), Some("acct-a"));
    assert_eq!(sent.header("thread-id"), Some("T1"));
    assert_eq!(sent.header("originator"), Some("codex_cli_rs"));
    let t1 = pool.explain("T1").await.unwrap();
    assert_eq!(t1.key, "session:T1");
    assert_eq!(t1.account, Some(pool.id("A")));
    assert_eq!(pool.pinned("cache:T1").await, None);

    // Only the turn-metadata header; only the body's client metadata.
    let only_header = r#"{"thread_id":"T2","turn_id":"u2"}"#;
    let request = codex_request(
        &pool,
        &[("x-codex-turn-metadata", only_header)],
        plain(serde_json::json!({})),
    );
    assert_eq!(pool.send(request).await.status, 200);
    assert_eq!(pool.pinned("T2").await.as_deref(), Some("A"));
    let request = codex_request(
        &pool,
        &[],
        plain(serde_json::json!({ "client_metadata": { "session_id": "T3" } })),
    );
    assert_eq!(pool.send(request).await.status, 200);
    assert_eq!(pool.pinned("session:T3").await.as_deref(), Some("A"));

    // Only a prompt cache key: its own namespace.
    let request = codex_request(
        &pool,
        &[],
        plain(serde_json::json!({ "prompt_cache_key": "K4" })),
    );
    assert_eq!(pool.send(request).await.status, 200);
    let k4 = pool.explain("cache:K4").await.unwrap();
    assert_eq!(k4.key, "cache:K4");
    assert_eq!(k4.account, Some(pool.id("A")));
    assert_eq!(pool.pinned("K4").await, None, "session:K4 is another key");

    // A real id beside a cache key: the id wins.
    let request = codex_request(
        &pool,
        &[("session-id", "T5")],
        plain(serde_json::json!({ "prompt_cache_key": "K5" })),
    );
    assert_eq!(pool.send(request).await.status, 200);
    assert_eq!(pool.pinned("T5").await.as_deref(), Some("A"));
    assert_eq!(pool.pinned("cache:K5").await, None);

    // The keys route: after A's token is refused for good (its refresh refused too) T1
    // moves to B.
    assert_eq!(pool.seen(), ["A", "A", "A", "A", "A"]);
    pool.upstream.push(reply(401, &[]));
    pool.tokens.push(reply(400, &[]));
    let request = codex_request(&pool, &[("thread-id", "T1")], plain(serde_json::json!({})));
    assert_eq!(pool.send(request).await.status, 200);
    assert_eq!(pool.seen_after(5), ["A", "B"]);
    assert_eq!(pool.pinned("T1").await.as_deref(), Some("B"));
    assert_eq!(pool.account("A").await.status, AccountStatus::Error);
}

/// AP-20: restart — pins, the cursor, holds and quota observations survive a restart of
/// the host on the same data directory (and so do route tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap20_pins_cursor_holds_and_quota_survive_a_restart() {
    let mut pool = Pool::claude().await;
    // A's shared window is exhausted for 10 min: S and the cursor move to B.
    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(START_MS + 600_000))));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    // B gets a 5 min hold: S detours to C.
    pool.upstream
        .push(reply(429, &[("retry-after".into(), "300".into())]));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A", "B", "B", "C"]);

    pool.restart().await;

    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Exhausted);
    assert_eq!(a.blocking_reset, Some(START_MS + 600_000));
    let b = pool.account("B").await;
    assert_eq!(b.status, AccountStatus::Held);
    assert_eq!(b.held_until, Some(START_MS + 300_000));
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.account, Some(pool.id("B")));
    assert_eq!(explained.why, "pinned on first success");
    let outcomes: Vec<&str> = explained
        .recent
        .iter()
        .map(|r| r.outcome.as_str())
        .collect();
    assert_eq!(outcomes, ["quota", "served", "hold", "detour"]);

    // The route token still works; the hold and the quota still steer requests.
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.send(pool.messages("new-1")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["C", "C"]);
    // The hold is over: the cursor (B) takes new conversations.
    pool.host.clock.set(START_MS + 301_000);
    assert_eq!(pool.send(pool.messages("new-2")).await.status, 200);
    // A's window reset: without the cursor a new conversation would start on A.
    pool.host.clock.set(START_MS + 601_000);
    assert_eq!(pool.send(pool.messages("new-3")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(6), ["B", "B", "B"]);
}

/// The listener's record: (deliveries so far, causes of the last one, its provider).
async fn deliveries(pool: &Pool) -> (u32, String, String) {
    pool.host.host.availability_changes_settled().await;
    let get = |key: &'static str| pool.host.setting(Role::ProviderRetry, key);
    (
        get("deliveries")
            .await
            .map_or(0, |n| n.parse().expect("a count")),
        get("causes").await.unwrap_or_default(),
        get("provider").await.unwrap_or_default(),
    )
}

/// AP-22: signals — adding, enabling, clearing an error, changing the threshold and a reset
/// time passing each reach the listener as one coalesced `availability-changed` for
/// Claude; several events before a delivery become one with each cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap22_each_availability_change_reaches_the_listener_once_coalesced() {
    let pool = PoolSetup::claude_keys(3).with_listener().start().await;
    let (mut count, _, _) = deliveries(&pool).await;
    assert!(count >= 1, "setting up the pool was signalled");

    // Adding (and removing).
    let d = pool
        .add(Credential::ApiKey("sk-ant-api03-key-d".into()))
        .await
        .unwrap();
    expect_one(&pool, &mut count, "ChangeCause::AccountAdded").await;
    pool.remove(&d.id).await.unwrap();
    expect_one(&pool, &mut count, "ChangeCause::AccountRemoved").await;

    // Enabling (after disabling).
    pool.disable("A").await;
    expect_one(&pool, &mut count, "ChangeCause::AccountDisabled").await;
    pool.enable("A").await;
    expect_one(&pool, &mut count, "ChangeCause::AccountEnabled").await;

    // Two accounts refuse their keys (two events), delivered on the next tick as one.
    pool.upstream.push(reply(401, &[]));
    pool.upstream.push(reply(401, &[]));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A", "B", "C"]);
    pool.tick().await;
    expect_one(&pool, &mut count, "ChangeCause::ErrorSet").await;
    // Clearing an error (a person re-enables the account).
    pool.enable("A").await;
    expect_one(
        &pool,
        &mut count,
        "ChangeCause::AccountEnabled,ChangeCause::ErrorCleared",
    )
    .await;

    // Changing the threshold: it applies to both providers, so each gets one signal (the
    // listener keeps the last); setting it to its current value changes nothing.
    pool.set("switch-threshold", "0.9").await.unwrap();
    let (now, causes, _) = deliveries(&pool).await;
    assert_eq!(
        (now - count, causes.as_str()),
        (2, "ChangeCause::ConfigChanged")
    );
    count = now;
    pool.set("switch-threshold", "0.9").await.unwrap();
    assert_eq!(deliveries(&pool).await.0, count);

    // A reset time passing: C's window is exhausted for 60 s (observed by a request,
    // delivered on the next tick), then the tick after the reset reports it.
    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(START_MS + 60_000))));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["C", "A"]);
    pool.tick().await;
    expect_one(&pool, &mut count, "ChangeCause::LaterResetObserved").await;
    pool.tick().await;
    assert_eq!(
        deliveries(&pool).await.0,
        count,
        "a quiet tick signals nothing"
    );
    pool.advance(Duration::from_secs(61));
    pool.tick().await;
    expect_one(&pool, &mut count, "ChangeCause::ResetPassed").await;
}

/// Exactly one more delivery happened, for Claude, with these causes.
async fn expect_one(pool: &Pool, count: &mut u32, causes: &str) {
    let (now, got, provider) = deliveries(pool).await;
    assert_eq!((now - *count, got.as_str()), (1, causes));
    assert_eq!(provider, "Provider::Claude");
    *count = now;
}

/// AP-23: admin refusals — reorder refuses an incomplete, duplicate or unknown list and
/// changes nothing; invalid settings are refused by name with the accepted range and change
/// nothing; listing never shows a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap23_admin_refuses_bad_orders_and_settings_and_never_shows_a_secret() {
    let pool = PoolSetup::claude_keys(3)
        .account(oauth(Provider::Claude, "D", Some(START_MS + 3_600_000)))
        .start()
        .await;
    let ids = pool.ids.clone();
    let (a, b, c, d) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let refused = |result: Result<_, AccountsError>| match result {
        Err(AccountsError::InvalidOrder(text)) => text,
        other => panic!("not refused: {other:?}"),
    };
    let text = refused(pool.reorder(vec![a.clone(), b.clone(), c.clone()]).await);
    assert!(text.contains(&format!("missing {d}")), "{text}");
    let text = refused(
        pool.reorder(vec![a.clone(), a.clone(), b.clone(), c.clone(), d.clone()])
            .await,
    );
    assert!(text.contains(&format!("duplicate {a}")), "{text}");
    let text = refused(
        pool.reorder(vec![
            a.clone(),
            b.clone(),
            c.clone(),
            d.clone(),
            "nope".into(),
        ])
        .await,
    );
    assert!(text.contains("unknown nope"), "{text}");
    let order = |list: Vec<
        pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::AccountInfo,
    >| {
        list.into_iter()
            .map(|a| (a.id, a.priority))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        order(pool.list().await),
        [
            (a.clone(), 0),
            (b.clone(), 0),
            (c.clone(), 0),
            (d.clone(), 0)
        ]
    );
    // A complete list is taken, and the order decides where a new conversation starts.
    let listed = pool
        .reorder(vec![c.clone(), a.clone(), d.clone(), b.clone()])
        .await
        .unwrap();
    assert_eq!(
        order(listed),
        [
            (c.clone(), 0),
            (a.clone(), 1),
            (d.clone(), 2),
            (b.clone(), 3)
        ]
    );
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["C"]);

    // Invalid settings: refused by name, with the accepted values; nothing changes.
    for (key, value, accepted) in [
        ("switch-threshold", "1.5", "a fraction > 0 and ≤ 1"),
        ("switch-threshold", "0", "a fraction > 0 and ≤ 1"),
        ("inline-wait", "10m", "from 0s to 5m"),
        ("transient-retries", "11", "from 0 to 10"),
        ("transient-backoff", "250ms,2m", "each from 0s to 1m"),
        ("pin-lifetime", "0s", "from 1s to 7d"),
        (
            "claude-upstream-url",
            "ftp://example.com",
            "an absolute http(s) URL",
        ),
        ("claude-routing", "maybe", "on or off"),
    ] {
        let before = pool.get(key).await;
        match pool.set(key, value).await {
            Err(SettingsError::InvalidValue(refusal)) => {
                assert_eq!(refusal.key, key);
                assert_eq!(refusal.value, value);
                assert!(
                    refusal.accepted.contains(accepted),
                    "{key}: {}",
                    refusal.accepted
                );
            }
            other => panic!("{key} = {value} was not refused: {other:?}"),
        }
        assert_eq!(pool.get(key).await, before, "{key} changed");
    }
    assert!(matches!(
        pool.set("no-such-setting", "1").await,
        Err(SettingsError::UnknownKey(key)) if key == "no-such-setting"
    ));
    assert_eq!(pool.get("switch-threshold").await, "0.98");

    // Listing shows hints, never a secret.
    let listed = pool.list().await;
    let shown = format!("{listed:?}");
    for secret in [
        "sk-ant-api03-key-a",
        "sk-ant-api03-key-b",
        "sk-ant-api03-key-c",
        "sk-ant-oat01-tok-d",
        "sk-ant-ort01-refresh-d",
    ] {
        assert!(!shown.contains(secret), "{secret} is listed: {shown}");
    }
    let hints: Vec<&str> = listed.iter().map(|a| a.secret_hint.as_str()).collect();
    assert_eq!(hints, ["…ey-c", "…ey-a", "oauth", "…ey-b"]);
}

/// AP-24: bad input — a non-JSON body (refused by the provider, passed through) and invalid session ids are forwarded as session-less
/// requests; an oversized body, unknown paths, a wrong method and a route of the other
/// provider get a clear error in Claude's shape from the pool without reaching an
/// upstream; and the pool keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap24_bad_input_gets_a_clear_answer_and_the_pool_keeps_serving() {
    let pool = Pool::claude().await;

    // Not JSON: forwarded as is, session-less; the provider's refusal is passed through.
    let answer = pool
        .send(pool.request("POST", "/v1/messages", "this is {not json"))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(
        answer.header("x-pooler-origin"),
        None,
        "the provider's answer"
    );
    assert_eq!(
        pool.upstream.received()[0].body.as_ref(),
        b"this is {not json"
    );

    // Invalid session ids: forwarded session-less (no pin, no 500).
    let long = "x".repeat(513);
    for id in ["", "   ", "a\u{1}b", long.as_str()] {
        let answer = pool
            .send(pool.request(
                "POST",
                "/v1/messages",
                pooler_tests::pool::claude_body(id, pooler_tests::pool::SONNET),
            ))
            .await;
        assert_eq!(answer.status, 200, "{id:?}: {}", answer.body);
    }
    assert_eq!(pool.hits(), 5);
    assert!(matches!(
        pool.explain(&long).await,
        Err(RoutingError::InvalidSession(_))
    ));

    let pool_error = |answer: &pooler_tests::client::Answer, status: u16, kind: &str| {
        assert_eq!(answer.status, status, "{}", answer.body);
        assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
        let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(body["type"], "error", "{}", answer.body);
        assert_eq!(body["error"]["type"], kind, "{}", answer.body);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    };
    // Oversized body.
    pool.set("max-request-body", "1024").await.unwrap();
    let big = pool.request("POST", "/v1/messages", vec![b'x'; 2048]);
    pool_error(&pool.send(big).await, 413, "request_too_large");
    // Unknown paths, a wrong method, the other provider's endpoint.
    pool_error(
        &pool.send(pool.request("POST", "/v1/complete", "{}")).await,
        404,
        "not_found_error",
    );
    pool_error(
        &pool
            .send(pool.request("POST", "/v1/messages/batches", "{}"))
            .await,
        404,
        "not_found_error",
    );
    let wrong_method = pool.send(pool.request("GET", "/v1/messages", "")).await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("x-pooler-origin"), Some("pool"));
    let other = pool.send(pool.request("POST", "/v1/responses", "{}")).await;
    assert_eq!(other.status, 401, "a Claude route does not open Codex");
    assert_eq!(other.header("x-pooler-origin"), Some("pool"));
    assert_eq!(pool.hits(), 5, "none of these reached the upstream");

    // Still serving.
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(pool.hits(), 6);
}

/// A request the pool refuses from its head alone (a wrong route token, a path it does not
/// serve) is answered without its body being kept: with the pool's memory capped at 8 MiB,
/// a 12 MiB body still gets its clean 401 or 404, read to its end so the client hears the
/// answer, and the pool keeps serving. (Kept, that body would not fit; the default
/// `max-request-body`, 32 MiB, lets it through to the pool.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_answered_without_its_body_being_kept() {
    let pool = PoolSetup::claude_keys(1)
        .plugin("memory-mib = 8")
        .start()
        .await;
    let big = || vec![b' '; 12 << 20];
    let wrong_token = pool.request_with("POST", "/v1/messages", Some("not-a-route"), big());
    let answer = pool.send(wrong_token).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    let elsewhere = pool.request("POST", "/v1/complete", big());
    let answer = pool.send(elsewhere).await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    assert_eq!(pool.hits(), 0);

    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen(), ["A"]);
}

/// The body skimmer's SIMD path runs only in the component, so bodies
/// whose conversation strings put quotes, escapes, non-ASCII and escaped control bytes at
/// every offset of a 16-byte block go through the real pool: every well-formed body's
/// session (stated only in `metadata.user_id`, no header) is read and pinned, and the same
/// body with a raw control byte inside a string (not JSON) gives no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_components_simd_skim_reads_sessions_at_every_block_offset() {
    let pool = Pool::claude().await;
    // A fixed linear congruential sequence: the same bodies on every run.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let pieces = ["\"", "\\", "é", "😀", "\u{1}", "\n", "\u{1f}", "/"];
    for case in 0..48u64 {
        let mut content = String::new();
        for _ in 0..next(6) + 1 {
            content.extend(std::iter::repeat_n('x', next(40) as usize));
            content.push_str(pieces[next(pieces.len() as u64) as usize]);
        }
        // The padding moves the strings across block boundaries from case to case.
        let pad = "p".repeat((case % 17) as usize);
        let session = format!("simd-{case}");
        let user_id = serde_json::json!({ "device_id": "d1", "session_id": session }).to_string();
        let body = serde_json::json!({
            "model": pooler_tests::pool::SONNET,
            "max_tokens": 16,
            "messages": [{ "role": "user", "content": content }, { "role": "user", "content": pad }],
            "metadata": { "user_id": user_id },
        })
        .to_string();
        let answer = pool
            .send(pool.request("POST", "/v1/messages?beta=true", body.clone()))
            .await;
        assert_eq!(answer.status, 200, "case {case}: {}", answer.body);
        let pinned = pool.explain(&session).await.ok().and_then(|v| v.account);
        assert_eq!(pinned, Some(pool.id("A")), "case {case}: {body}");

        // The same body with a raw control byte in the conversation string: not JSON.
        let broken_session = format!("broken-{case}");
        let at = body.find("\"content\":\"").expect("a content string") + 11;
        let mut broken = body.replace(&session, &broken_session).into_bytes();
        broken.insert(at + (case as usize % 8).min(content.len()), 0x01);
        let _ = pool
            .send(pool.request("POST", "/v1/messages?beta=true", broken))
            .await;
        let pinned = pool
            .explain(&broken_session)
            .await
            .ok()
            .and_then(|v| v.account);
        assert_eq!(
            pinned, None,
            "case {case}: a body that is not JSON has no session"
        );
    }
}

/// A request's body goes upstream framed by its length (`content-length`, the bytes the
/// client sent), not as a chunked body, which some servers refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_body_goes_upstream_with_its_length_not_chunked() {
    let pool = Pool::claude().await;
    let request = pool.messages("S");
    let sent = request.body().clone().collect().await.unwrap().to_bytes();
    assert_eq!(pool.send(request).await.status, 200);
    let received = pool.upstream.received();
    let post = received
        .iter()
        .find(|r| r.method == "POST")
        .expect("the POST went upstream");
    assert_eq!(post.body, sent);
    assert_eq!(
        post.header("content-length"),
        Some(sent.len().to_string().as_str()),
        "{:?}",
        post.headers
    );
    assert_eq!(post.header("transfer-encoding"), None, "{:?}", post.headers);
}
