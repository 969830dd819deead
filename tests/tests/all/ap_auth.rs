//! Account Pooler scenarios (spec `account-pool.md` §11) about credentials: OAuth refresh
//! (#6167, single flight) and route tokens. The real pool in the real host, fake upstream
//! and token endpoint on 127.0.0.1, the manual clock.

use std::time::Duration;

use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::AccountStatus;
use pooler_host::runtime::bindings::types::Provider;
use pooler_tests::harness::START_MS;
use pooler_tests::pool::{Pool, PoolSetup, SOON, oauth, reply};
use pooler_tests::upstream::{Gate, Reply};

/// The `Authorization` headers the upstream saw, in order.
fn bearers(pool: &Pool) -> Vec<String> {
    pool.upstream
        .received()
        .iter()
        .map(|r| r.header("authorization").unwrap_or("-").to_owned())
        .collect()
}

fn refused_grant() -> Reply {
    Reply::status(400)
        .header("content-type", "application/json")
        .body(r#"{"error":"invalid_grant","error_description":"refresh token revoked"}"#)
}

fn new_tokens(access: &str, refresh: &str) -> String {
    format!(r#"{{"access_token":"{access}","refresh_token":"{refresh}","expires_in":3600}}"#)
}

/// A Claude Code request (its own `anthropic-beta` list, Bearer route token) on a Claude
/// subscription (OAuth) account is served: the strict upstream, like the Messages API,
/// refuses an OAuth access token without the OAuth beta, and the pool sends Claude Code's
/// betas with the OAuth beta added once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_request_with_its_own_betas_is_served_on_an_oauth_account() {
    let pool = PoolSetup::new(Provider::Claude)
        .account(oauth(Provider::Claude, "A", None))
        .start()
        .await;
    let betas = "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24";
    let mut request = pool.messages("S");
    request
        .headers_mut()
        .insert("anthropic-beta", betas.parse().unwrap());
    let answer = pool.send(request).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.upstream.refused(), []);
    let sent = &pool.upstream.received()[0];
    assert_eq!(
        sent.header("anthropic-beta"),
        Some(format!("{betas},oauth-2025-04-20").as_str())
    );
}

/// AP-12 (#6167): a proactive refresh refused with 400 while the access token is still valid
/// — the request is served with the current token, the account is not in error and shows
/// the sign-in flag; once the token has expired and the refresh is still refused, the
/// account is in error (and the pool answers for itself without calling the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap12_a_refused_refresh_of_a_valid_token_flags_the_account_but_keeps_it_serving() {
    let expires = START_MS + 120_000;
    let pool = PoolSetup::new(Provider::Claude)
        .account(oauth(Provider::Claude, "A", Some(expires)))
        .start()
        .await;
    pool.tokens.push(refused_grant());
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(bearers(&pool), ["Bearer sk-ant-oat01-tok-a"]);
    let refresh = &pool.tokens.received()[0];
    assert_eq!(refresh.method, "POST");
    assert_eq!(refresh.path, "/oauth/token");
    let grant: serde_json::Value = serde_json::from_slice(&refresh.body).unwrap();
    assert_eq!(grant["grant_type"], "refresh_token");
    assert_eq!(grant["refresh_token"], "sk-ant-ort01-refresh-a");
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Ready);
    assert_eq!(a.error, None);
    assert!(a.needs_sign_in);

    // Within the refresh backoff the next request is served without asking again.
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.tokens.received().len(), 1);

    // Expired, and the refresh is refused again: now the account is in error.
    pool.advance(Duration::from_secs(180));
    pool.tokens.push(refused_grant());
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert_eq!(pool.tokens.received().len(), 2);
    assert_eq!(pool.hits(), 2, "an expired token is never sent upstream");
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Error);
    assert!(
        a.error.as_deref().unwrap().contains("HTTP 400"),
        "{:?}",
        a.error
    );
}

/// AP-13: an OAuth 401 — one refresh, the request retried with the new token, 200; when two
/// concurrent requests both get 401, they share one refresh (the second waits for the first
/// one's token instead of refreshing again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap13_an_oauth_401_refreshes_once_and_concurrent_requests_share_the_refresh() {
    let pool = PoolSetup::new(Provider::Claude)
        .account(oauth(Provider::Claude, "A", Some(START_MS + 3_600_000)))
        .account(oauth(Provider::Claude, "B", Some(START_MS + 3_600_000)))
        .start()
        .await;
    pool.upstream.push(reply(401, &[]));
    pool.tokens.push(
        Reply::status(200)
            .header("content-type", "application/json")
            .body(new_tokens("sk-ant-oat01-tok-a2", "sk-ant-ort01-refresh-a2")),
    );
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        bearers(&pool),
        ["Bearer sk-ant-oat01-tok-a", "Bearer sk-ant-oat01-tok-a2"]
    );
    assert_eq!(pool.tokens.received().len(), 1);
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Ready);
    assert_eq!(a.token_expires_at, Some(START_MS + 3_600_000));
    assert!(!a.needs_sign_in);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));

    // Two requests at once both get 401 for sk-ant-oat01-tok-a2; the token endpoint answers only when
    // the test says so.
    let gate = Gate::new();
    pool.upstream.push(reply(401, &[]));
    pool.upstream.push(reply(401, &[]));
    pool.tokens.push(
        Reply::status(200)
            .header("content-type", "application/json")
            .pause(&gate)
            .body(new_tokens("sk-ant-oat01-tok-a3", "sk-ant-ort01-refresh-a3")),
    );
    let mut tasks = Vec::new();
    for session in ["S", "S2"] {
        let client = pool.client.clone();
        let request = pool.messages(session);
        tasks.push(tokio::spawn(async move { client.send(request).await }));
    }
    tokio::time::timeout(SOON, pool.upstream.wait_for_hits(4))
        .await
        .unwrap();
    tokio::time::timeout(SOON, pool.tokens.wait_for_hits(2))
        .await
        .unwrap();
    // The other request waits for the refresh in flight (it polls on the host clock).
    let poll = pool.host.next_wake(SOON).await.expect("a waiting request");
    assert_eq!(poll, Duration::from_millis(100));
    gate.open();
    let deadline = tokio::time::Instant::now() + SOON;
    while tasks.iter().any(|t| !t.is_finished()) {
        assert!(tokio::time::Instant::now() < deadline, "requests hang");
        if let Some(wake) = pool.host.next_wake(Duration::from_millis(50)).await {
            pool.advance(wake);
        }
    }
    for task in tasks {
        let answer = task.await.unwrap().unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert_eq!(
        pool.tokens.received().len(),
        2,
        "one refresh for both requests"
    );
    let refresh: serde_json::Value =
        serde_json::from_slice(&pool.tokens.received()[1].body).unwrap();
    assert_eq!(refresh["refresh_token"], "sk-ant-ort01-refresh-a2");
    assert_eq!(
        bearers(&pool)[2..],
        [
            "Bearer sk-ant-oat01-tok-a2",
            "Bearer sk-ant-oat01-tok-a2",
            "Bearer sk-ant-oat01-tok-a3",
            "Bearer sk-ant-oat01-tok-a3"
        ]
    );
    assert_eq!(pool.account("A").await.status, AccountStatus::Ready);
}

/// AP-15: route tokens — a missing, wrong or closed token gets 401 in Claude's error shape
/// from the pool and never reaches an upstream; tokens of two threads are independent, and
/// re-opening a route replaces its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ap15_only_an_open_routes_token_reaches_an_upstream() {
    let pool = Pool::claude().await;
    let body = pooler_tests::pool::claude_body("S", pooler_tests::pool::SONNET);
    let refused = |answer: &pooler_tests::client::Answer| {
        assert_eq!(answer.status, 401, "{}", answer.body);
        assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
        let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "authentication_error");
    };
    refused(
        &pool
            .send(pool.request_with("POST", "/v1/messages", None, body.clone()))
            .await,
    );
    refused(
        &pool
            .send(pool.request_with(
                "POST",
                "/v1/messages",
                Some("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
                body.clone(),
            ))
            .await,
    );
    assert_eq!(pool.hits(), 0);

    // A second thread's token works beside the first; also as `x-api-key`.
    let t2 = pool.open_route("t2").await.unwrap();
    assert_eq!(t2.env[0], ("ANTHROPIC_BASE_URL".into(), pool.url.clone()));
    assert_eq!(t2.env[1], ("ANTHROPIC_AUTH_TOKEN".into(), t2.token.clone()));
    assert_ne!(t2.token, pool.token);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    let mut by_key = pool.request_with("POST", "/v1/messages", None, body.clone());
    by_key
        .headers_mut()
        .insert("x-api-key", t2.token.parse().unwrap());
    assert_eq!(pool.send(by_key).await.status, 200);
    assert_eq!(pool.hits(), 2);

    // Closing t1's route stops its token at once; t2's keeps working.
    pool.close_route("t1").await.unwrap();
    refused(&pool.send(pool.messages("S")).await);
    assert_eq!(
        pool.send(pool.request_with("POST", "/v1/messages", Some(&t2.token), body.clone()))
            .await
            .status,
        200
    );
    // Re-opening t2 replaces its token.
    let t2_again = pool.open_route("t2").await.unwrap();
    refused(
        &pool
            .send(pool.request_with("POST", "/v1/messages", Some(&t2.token), body.clone()))
            .await,
    );
    assert_eq!(
        pool.send(pool.request_with("POST", "/v1/messages", Some(&t2_again.token), body))
            .await
            .status,
        200
    );
    assert_eq!(pool.hits(), 4);
    // No route token ever went upstream; each request carried an account key instead.
    for received in pool.upstream.received() {
        assert!(
            received
                .header("x-api-key")
                .unwrap()
                .starts_with("sk-ant-api03-key-")
        );
        assert_eq!(received.header("authorization"), None);
    }
}
