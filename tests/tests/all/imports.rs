//! Every host import, exercised by the `fixture-pool` component through its HTTP handler:
//! sqlite, log, the WASI clocks under the manual clock, outbound HTTP with the allow-list,
//! and the incoming request itself.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};
use pooler_core::clock::Clock;
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::harness::{START_MS, Setup, TestHost};
use pooler_tests::logs::logs;
use pooler_tests::upstream::{FakeUpstream, Gate, Reply};

/// A safety net for requests that should finish at once.
const SOON: Duration = Duration::from_secs(10);

async fn pool_host(settings: &str) -> (TestHost, String) {
    let mut host = Setup::new()
        .role(Role::AccountPool, fixtures::POOL, settings)
        .start()
        .unwrap();
    let url = host.serve().await.unwrap();
    (host, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incoming_request_is_echoed_with_its_method_path_headers_and_body() {
    let (_host, url) = pool_host("").await;
    let request = Request::post(format!("{url}/echo"))
        .header("x-test", "yes")
        .body(Full::new(Bytes::from_static(b"hello pool")))
        .unwrap();
    let answer = TestClient::new().send(request).await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("x-echo-method"), Some("POST"));
    assert_eq!(answer.header("x-echo-path"), Some("/echo"));
    assert_eq!(answer.header("x-echo-x-test"), Some("yes"));
    assert_eq!(answer.body, "hello pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stores_every_value_type_rolls_back_dropped_transactions_and_refuses_bad_names() {
    let (host, url) = pool_host("").await;
    let answer = TestClient::new()
        .get_within(&format!("{url}/sqlite"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    let lines: Vec<&str> = answer.body.lines().collect();
    let expected = [
        "inserted=1 rowid=1",
        "columns=i,r,t,b,n",
        "row=integer:-42|real:1.5|text:héllo|blob:[0, 255, 7]|null",
        "after-rollback=integer:1",
        // "", "../escape", "a/b", "/abs", "a\\b", a control character, 65 characters.
        "refused invalid-name",
        "refused invalid-name",
        "refused invalid-name",
        "refused invalid-name",
        "refused invalid-name",
        "refused invalid-name",
        "refused invalid-name",
        "bad-statement=invalid-statement",
        "duplicate=constraint",
    ];
    assert_eq!(lines, expected, "full report:\n{}", answer.body);

    // The data is where the contract says, private to the owner, and readable natively.
    let dir = host.data.path().join("plugins").join("account-pool");
    let file = dir.join("tour.sqlite3");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
    }
    let conn = rusqlite::Connection::open(&file).unwrap();
    let (i, t): (i64, String) = conn
        .query_row("SELECT i, t FROM cells", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!((i, t.as_str()), (-42, "héllo"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_arrives_in_tracing_tagged_with_the_plugin_id() {
    let logs = logs();
    let (_host, url) = pool_host("").await;
    let answer = TestClient::new()
        .get_within(&format!("{url}/log"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "logged");
    let line = logs
        .wait_for(SOON, |l| l.message == "fixture says hello")
        .await
        .expect("the plugin's log line reached tracing");
    assert_eq!(line.target, "pooler::plugin");
    assert_eq!(line.level, tracing::Level::INFO);
    assert_eq!(
        line.fields.get("plugin").map(String::as_str),
        Some("account-pool")
    );
    assert_eq!(
        line.fields.get("fields").map(String::as_str),
        Some("answer=42")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_read_the_manual_clock_as_wall_and_monotonic_time() {
    let (host, url) = pool_host("").await;
    let client = TestClient::new();
    let before = client
        .get_within(&format!("{url}/time"), SOON)
        .await
        .unwrap()
        .body;
    assert_eq!(before, format!("wall={START_MS} mono=0"));
    host.clock.advance(Duration::from_secs(90));
    let after = client
        .get_within(&format!("{url}/time"), SOON)
        .await
        .unwrap()
        .body;
    assert_eq!(
        after,
        format!("wall={} mono={}", START_MS + 90_000, 90_000_000_000u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monotonic_subscription_wakes_when_the_manual_clock_passes_it() {
    let logs = logs();
    let (host, url) = pool_host("").await;
    let until = host.clock.monotonic_ns() + 60_000_000_000;
    let client = TestClient::new();
    let sleeping = tokio::spawn({
        let url = format!("{url}/sleep-until?mono={until}");
        async move { client.get(&url).await }
    });
    // The guest says it is about to block on the pollable...
    logs.wait_for(SOON, |l| {
        l.message == "sleeping"
            && l.fields
                .get("fields")
                .is_some_and(|f| f == &format!("until={until}"))
    })
    .await
    .expect("the guest reached its sleep");
    assert!(!sleeping.is_finished());
    // ...and wakes when (and because) the manual clock reaches the instant.
    host.clock.advance(Duration::from_secs(60));
    let answer = tokio::time::timeout(SOON, sleeping)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answer.body, format!("woke mono={until}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_requests_reach_allowed_hosts_and_are_refused_elsewhere_as_an_error() {
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::status(201).body("from upstream"));
    let (_host, url) = pool_host("allowed-hosts = [\"127.0.0.1\"]").await;
    let client = TestClient::new();

    let allowed = client
        .get_within(&format!("{url}/fetch?url={}/hello", upstream.url()), SOON)
        .await
        .unwrap();
    assert_eq!(allowed.body, "status=201 body=from upstream");
    let seen = upstream.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/hello");

    // Not on the list: the guest gets HTTP-request-denied back and answers normally.
    let refused = client
        .get_within(&format!("{url}/fetch?url=http://denied.invalid/x"), SOON)
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(refused.body, "error=ErrorCode::HttpRequestDenied");
    // A host that merely starts like an allowed one is not allowed.
    let refused = client
        .get_within(
            &format!(
                "{url}/fetch?url=http://127.0.0.10:{}/x",
                upstream.addr().port()
            ),
            SOON,
        )
        .await
        .unwrap();
    assert_eq!(refused.body, "error=ErrorCode::HttpRequestDenied");
    assert_eq!(upstream.received().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_allowed_hosts_every_outbound_request_is_refused() {
    let upstream = FakeUpstream::start().await;
    let (_host, url) = pool_host("").await;
    let answer = TestClient::new()
        .get_within(&format!("{url}/fetch?url={}/", upstream.url()), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "error=ErrorCode::HttpRequestDenied");
    assert!(upstream.received().is_empty());
}

/// wasi:http's `between-bytes-timeout` is honoured: a response body that stalls ends in
/// `connection-read-timeout` for the guest, which answers normally. Network deadlines run on
/// real time (they bound real sockets), so this one is short; its timing is covered with
/// paused time in the host's unit tests (`imports::http_out::client`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_response_body_times_out_between_bytes_as_the_guest_asked() {
    let upstream = FakeUpstream::start().await;
    let stall = Gate::new();
    upstream.push(Reply::status(200).body("part").pause(&stall).body("rest"));
    let (_host, url) = pool_host("allowed-hosts = [\"127.0.0.1\"]").await;
    let answer = TestClient::new()
        .get_within(
            &format!(
                "{url}/fetch?url={}/slow&between-bytes-ms=100",
                upstream.url()
            ),
            SOON,
        )
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert_eq!(answer.body, "status=200 body-error=connection read timeout");
    stall.open();
}
