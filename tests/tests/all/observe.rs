//! Metrics and the per-request log line, end to end: the real pool in the real host in front
//! of the strict fake provider, scraped at `GET /metrics` on the host's listener.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use pooler_tests::harness::START_MS;
use pooler_tests::logs::logs;
use pooler_tests::pool::{Pool, PoolSetup, five_hour_rejected, reply};

/// `GET /metrics` with `token` as the bearer (none: no authorization).
async fn scrape(pool: &Pool, token: Option<&str>) -> (u16, String, Option<String>) {
    let mut builder = Request::builder()
        .method("GET")
        .uri(format!("{}/metrics", pool.url));
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let answer = pool
        .send(builder.body(Full::new(Bytes::new())).unwrap())
        .await;
    (
        answer.status.as_u16(),
        answer.body.clone(),
        answer.header("content-type").map(str::to_owned),
    )
}

/// The samples of a scrape: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no sample {series} in {samples:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_successes_retries_detours_and_need_the_admin_token() {
    let pool = Pool::claude().await;
    let token = pool.host.admin_token().unwrap();

    assert_eq!(scrape(&pool, None).await.0, 401);
    assert_eq!(scrape(&pool, Some("not-the-token")).await.0, 401);

    // A success on A.
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    // A same-account retry: A fails once, then serves.
    pool.upstream.push(reply(503, &[]));
    let (answer, _) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 200);
    // A detour: A fails three times, B serves; the pin stays on A.
    for _ in 0..3 {
        pool.upstream.push(reply(503, &[]));
    }
    let (answer, _) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(pool.seen(), ["A", "A", "A", "A", "A", "A", "B"]);

    let (status, text, content_type) = scrape(&pool, Some(&token)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let s = samples(&text);
    let (a, b) = (pool.id("A"), pool.id("B"));
    let claude = "provider=\"claude\"";
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_requests_total{{account=\"{a}\",outcome=\"served\",{claude}}}")
        ),
        2.0
    );
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_requests_total{{account=\"{b}\",outcome=\"detour\",{claude}}}")
        ),
        1.0
    );
    // One retry in the second request, two in the third.
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_same_account_retries_total{{account=\"{a}\",{claude}}}")
        ),
        3.0
    );
    assert_eq!(
        value(&s, &format!("pooler_pool_detours_total{{{claude}}}")),
        1.0
    );
    assert_eq!(
        value(&s, &format!("pooler_pool_failovers_total{{{claude}}}")),
        1.0
    );
    // The added latency: three requests, the backoffs (250 ms; 250 ms + 1 s) in them.
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_added_latency_seconds_count{{{claude}}}")
        ),
        3.0
    );
    assert!(
        value(
            &s,
            &format!("pooler_pool_added_latency_seconds_sum{{{claude}}}")
        ) >= 1.5,
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_added_latency_seconds_bucket{{{claude},le=\"+Inf\"}}")
        ),
        3.0
    );
    assert!(text.contains("# TYPE pooler_pool_added_latency_seconds histogram\n"));
    assert!(text.contains("# TYPE pooler_pool_requests_total counter\n"));
    // The host's own: accounts by status (computed now), requests through the listener.
    assert!(text.contains("# TYPE pooler_accounts gauge\n"), "{text}");
    assert_eq!(
        value(&s, "pooler_accounts{provider=\"claude\",status=\"ready\"}"),
        3.0
    );
    assert_eq!(
        value(&s, "pooler_accounts{provider=\"codex\",status=\"ready\"}"),
        0.0
    );
    assert_eq!(
        value(
            &s,
            "pooler_http_requests_total{kind=\"proxy\",status=\"200\"}"
        ),
        3.0
    );
    assert_eq!(
        value(
            &s,
            "pooler_http_requests_total{kind=\"metrics\",status=\"401\"}"
        ),
        2.0
    );
    // No secret in the scrape: the API keys and the route token.
    for secret in [
        pooler_tests::pool::api_key("a"),
        pooler_tests::pool::api_key("b"),
        pool.token.clone(),
        token.clone(),
    ] {
        assert!(!text.contains(&secret), "a secret in the scrape");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_own_429_is_counted() {
    let pool = PoolSetup::claude_keys(1).start().await;
    let token = pool.host.admin_token().unwrap();
    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(START_MS + 600_000))));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    // A wrong route token: the pool's own 401.
    let refused = pool
        .send(pool.request_with("POST", "/v1/messages", Some("wrong"), "{}"))
        .await;
    assert_eq!(refused.status, 401);

    let (_, text, _) = scrape(&pool, Some(&token)).await;
    let s = samples(&text);
    let claude = "provider=\"claude\"";
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_own_responses_total{{{claude},status=\"429\"}}")
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            &format!("pooler_pool_own_responses_total{{{claude},status=\"401\"}}")
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            &format!(
                "pooler_pool_requests_total{{account=\"{}\",outcome=\"failed\",{claude}}}",
                pool.id("A")
            )
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "pooler_accounts{provider=\"claude\",status=\"exhausted\"}"
        ),
        1.0
    );
}

/// The one line per proxied request, with its fields as fields (what the JSON format
/// spreads into the line: the `fields_json` object).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_proxied_request_has_one_line_with_its_fields() {
    let pool = Pool::claude().await;
    pool.upstream.push(reply(503, &[]));
    let (answer, _) = pool.drive(pool.messages("line-session")).await;
    assert_eq!(answer.status, 200);
    let a = pool.id("A");
    let line = logs()
        .wait_for(Duration::from_secs(5), |l| {
            l.message == "Account Pooler request"
                && l.fields
                    .get("fields_json")
                    .is_some_and(|f| f.contains(&format!("{a}:503:")))
        })
        .await
        .expect("the per-request line");
    assert_eq!(line.target, "pooler::plugin");
    assert_eq!(line.fields["plugin"], "account-pool");
    let fields: serde_json::Value = serde_json::from_str(&line.fields["fields_json"]).unwrap();
    assert_eq!(fields["thread"], "t1");
    assert_eq!(fields["provider"], "claude");
    assert_eq!(fields["account"], a.as_str());
    assert_eq!(fields["outcome"], "served");
    assert_eq!(fields["status"], "200");
    assert_eq!(fields["attempts"], format!("{a}:503:0,{a}:200:0"));
    assert_eq!(fields["upstream_ms"], "0");
    assert_eq!(fields["added_ms"], "250", "the backoff");
    let session = fields["session"].as_str().unwrap();
    assert!(session.len() == 8 && !session.contains("line-session"));
    // One line for this request: the session's other lines are not per-request lines.
    let count = logs()
        .lines()
        .iter()
        .filter(|l| {
            l.message == "Account Pooler request"
                && l.fields
                    .get("fields_json")
                    .is_some_and(|f| f.contains(&format!("\"session\":\"{session}\"")))
        })
        .count();
    assert_eq!(count, 1);
}
