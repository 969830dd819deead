//! The host's limits on guests: a deadline that stops a runaway loop without disturbing other
//! requests, traps reported with the plugin and the call, a memory cap, and the world check.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::harness::{Setup, TestHost};
use pooler_tests::logs::logs;

const SOON: Duration = Duration::from_secs(10);

async fn pool_host(settings: &str) -> (TestHost, String) {
    let mut host = Setup::new()
        .role(Role::AccountPool, fixtures::POOL, settings)
        .start()
        .unwrap();
    let url = host.serve().await.unwrap();
    (host, url)
}

/// This test waits on real time: the deadline measures the guest's CPU time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_within_a_second_of_its_deadline_while_other_requests_complete()
{
    const DEADLINE_MS: u64 = 300;
    let (_host, url) = pool_host(&format!("deadline-ms = {DEADLINE_MS}")).await;
    let client = TestClient::new();
    let started = Instant::now();
    let spinning = tokio::spawn({
        let client = client.clone();
        let url = format!("{url}/spin");
        async move { client.get(&url).await }
    });
    // Another instance of the same plugin serves normally meanwhile.
    for _ in 0..3 {
        let echo = client
            .get_within(&format!("{url}/echo"), SOON)
            .await
            .unwrap();
        assert_eq!(echo.status, StatusCode::OK);
    }
    assert!(
        !spinning.is_finished(),
        "the loop ended before the other requests"
    );
    let answer = tokio::time::timeout(SOON, spinning)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(DEADLINE_MS + 1000),
        "stopped after {elapsed:?}, deadline {DEADLINE_MS} ms"
    );
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert!(
        answer.body.contains("plugin `account-pool` ran past its deadline of 300 ms in `wasi:http/incoming-handler.handle`"),
        "{}",
        answer.body
    );
    // And the plugin still works.
    assert_eq!(
        client
            .get_within(&format!("{url}/echo"), SOON)
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_is_reported_with_the_plugin_and_the_call_and_the_next_request_succeeds() {
    let logs = logs();
    let (_host, url) = pool_host("").await;
    let client = TestClient::new();
    let answer = client
        .get_within(&format!("{url}/trap"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert!(
        answer
            .body
            .contains("plugin `account-pool` trapped in `wasi:http/incoming-handler.handle`: wasm trap: wasm `unreachable` instruction executed"),
        "{}",
        answer.body
    );
    // The client hears the cause in one line; the guest's backtrace is for the log.
    assert!(!answer.body.contains("backtrace"), "{}", answer.body);
    let logged = logs
        .wait_for(SOON, |l| {
            l.message == "plugin call failed"
                && l.fields.get("plugin").is_some_and(|p| p == "account-pool")
                && l.fields.get("error").is_some_and(|e| e.contains("trapped"))
                && l.fields
                    .get("detail")
                    .is_some_and(|d| d.contains("wasm backtrace"))
        })
        .await;
    assert!(
        logged.is_some(),
        "the trap was logged with the plugin id and the backtrace"
    );
    let next = client
        .get_within(&format!("{url}/echo"), SOON)
        .await
        .unwrap();
    assert_eq!(next.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_past_the_cap_is_refused_and_the_host_carries_on() {
    let (_host, url) = pool_host("memory-mib = 16").await;
    let client = TestClient::new();
    let refused = client
        .get_within(&format!("{url}/alloc?mib=32"), SOON)
        .await
        .unwrap();
    assert_eq!(
        refused.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{}",
        refused.body
    );
    assert!(refused.body.starts_with("refused"), "{}", refused.body);
    let within = client
        .get_within(&format!("{url}/alloc?mib=4"), SOON)
        .await
        .unwrap();
    assert_eq!(within.body, "allocated 4 MiB");
    assert_eq!(
        client
            .get_within(&format!("{url}/echo"), SOON)
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_of_the_wrong_world_is_refused_with_the_expected_and_found_worlds() {
    let Err(err) = Setup::new()
        .role(Role::AccountPool, fixtures::RETRY, "")
        .start()
    else {
        panic!("a provider-retry component was accepted in the account-pool role");
    };
    let text = format!("{err:#}");
    assert!(text.contains("plugin `account-pool`"), "{text}");
    assert!(
        text.contains("expected world pooler:plugins/account-pool@0.1.0"),
        "{text}"
    );
    assert!(
        text.contains("found a component of world pooler:plugins/provider-retry@0.1.0"),
        "{text}"
    );
    assert!(text.contains("missing exports [availability, routing, accounts, maintenance, tokens, wasi:http/incoming-handler]"), "{text}");

    let Err(err) = Setup::new()
        .role(Role::ProviderRetry, fixtures::POOL, "")
        .start()
    else {
        panic!("an account-pool component was accepted in the provider-retry role");
    };
    let text = format!("{err:#}");
    assert!(text.contains("plugin `provider-retry`"), "{text}");
    assert!(
        text.contains("expected world pooler:plugins/provider-retry@0.1.0"),
        "{text}"
    );
    assert!(
        text.contains("found a component of world pooler:plugins/account-pool@0.1.0"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_component_is_refused_naming_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.wasm");
    std::fs::write(&path, b"not wasm").unwrap();
    let Err(err) = Setup::new().role(Role::AccountPool, &path, "").start() else {
        panic!("junk was accepted");
    };
    let text = format!("{err:#}");
    assert!(
        text.contains("plugin `account-pool`") && text.contains("not a valid component"),
        "{text}"
    );
}
