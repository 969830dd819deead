//! Hostile SQL from real guests: an endless `WITH RECURSIVE`,
//! a result that would fill the host's memory, and pragmas that would change the process or
//! the files, run by the fixture pool (`/hostile-sql/<case>`) and the fixture Provider Retry
//! (`settings.get-setting("hostile-sql:<case>")`). Each is refused or bounded with a logged
//! reason, while other requests, the other plugin, the real pool and the core's database
//! carry on.
//!
//! These tests wait on real time where they say so: a statement's deadline is the call's
//! CPU (and, for an export call, wall-clock) deadline, which runs on the real clock.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use pooler_core::TurnOutcomeKind;
use pooler_host::runtime::CallError;
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::core::{CoreSetup, success};
use pooler_tests::fixtures;
use pooler_tests::harness::Setup;
use pooler_tests::logs::{Logs, logs};

const SOON: Duration = Duration::from_secs(10);
const DEADLINE_MS: u64 = 300;
/// How long after its deadline a stopped call may take to end (a loaded 2-core machine).
const GRACE: Duration = Duration::from_millis(1500);

/// Wait for the host's log line saying it refused a statement of `plugin` for `reason`.
async fn refusal_logged(logs: &Logs, plugin: &str, reason: &str) -> bool {
    logs.wait_for(SOON, |l| {
        l.message == "plugin statement refused"
            && l.fields.get("plugin").is_some_and(|p| p == plugin)
            && l.fields.get("reason").is_some_and(|r| r.contains(reason))
    })
    .await
    .is_some()
}

/// Real time: the endless statement runs until the request's CPU budget is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_sql_in_the_pool_is_bounded_or_refused_and_the_host_carries_on() {
    let logs = logs();
    let mut host = Setup::new()
        .role(
            Role::AccountPool,
            fixtures::POOL,
            &format!("deadline-ms = {DEADLINE_MS}"),
        )
        .role(Role::ProviderRetry, fixtures::RETRY, "")
        .start()
        .unwrap();
    let url = host.serve().await.unwrap();
    let client = TestClient::new();

    // An endless WITH RECURSIVE, while other requests of the same plugin are served.
    let started = Instant::now();
    let endless = tokio::spawn({
        let client = client.clone();
        let url = format!("{url}/hostile-sql/endless");
        async move { client.get(&url).await }
    });
    for _ in 0..3 {
        let echo = client
            .get_within(&format!("{url}/echo"), SOON)
            .await
            .unwrap();
        assert_eq!(echo.status, StatusCode::OK);
    }
    let answer = tokio::time::timeout(SOON, endless)
        .await
        .expect("the endless statement ended")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(DEADLINE_MS) + GRACE,
        "ended after {took:?}"
    );
    // The statement failed with an error value; the request, its budget spent, was stopped
    // as past its deadline.
    assert_eq!(
        answer.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("ran past its deadline of 300 ms"),
        "{}",
        answer.body
    );
    assert!(refusal_logged(&logs, "account-pool", "interrupted: the statement ran past").await);

    // A result that would fill the host's memory: refused at the instance's memory cap.
    let huge = client
        .get_within(&format!("{url}/hostile-sql/huge"), SOON)
        .await
        .unwrap();
    assert_eq!(huge.status, StatusCode::OK, "{}", huge.body);
    assert!(
        huge.body.contains(
            "huge refused Error::InvalidStatement(\"result too large: more than 67108864 bytes"
        ),
        "{}",
        huge.body
    );
    assert!(refusal_logged(&logs, "account-pool", "result too large").await);

    // Pragmas that change the process, the files or what the host relies on: each refused.
    let pragmas = client
        .get_within(&format!("{url}/hostile-sql/pragmas"), SOON)
        .await
        .unwrap();
    assert_eq!(pragmas.status, StatusCode::OK);
    let lines: Vec<&str> = pragmas.body.lines().collect();
    assert_eq!(lines.len(), 8, "{}", pragmas.body);
    for line in &lines {
        assert!(
            line.contains(" refused Error::InvalidStatement(\"not authorized: PRAGMA "),
            "{line}"
        );
    }
    assert!(refusal_logged(&logs, "account-pool", "PRAGMA hard_heap_limit").await);
    // SAFETY: a negative argument only reads the process-wide limits.
    assert_eq!(unsafe { rusqlite::ffi::sqlite3_hard_heap_limit64(-1) }, 0);
    // SAFETY: a negative argument only reads the process-wide limit.
    assert_eq!(unsafe { rusqlite::ffi::sqlite3_soft_heap_limit64(-1) }, 0);

    // The plugin, its database and the other plugin are fine.
    let write = client
        .get_within(&format!("{url}/hostile-sql/write"), SOON)
        .await
        .unwrap();
    assert!(
        write.body.starts_with("write ok Value::Integer("),
        "{}",
        write.body
    );
    let tour = client
        .get_within(&format!("{url}/sqlite"), SOON)
        .await
        .unwrap();
    assert!(tour.body.contains("inserted=1"), "{}", tour.body);
    host.set_setting(Role::ProviderRetry, "answer", "42")
        .await
        .unwrap();
    assert_eq!(
        host.setting(Role::ProviderRetry, "answer").await.as_deref(),
        Some("42")
    );
}

/// Real time: the export call's deadline. Provider Retry takes one call at a time: an
/// endless statement inside its transaction must not keep the next call (or the lock on its
/// database) waiting past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_sql_in_provider_retry_frees_its_turn_and_spares_the_pool_and_the_core() {
    let logs = logs();
    let h = CoreSetup::new()
        .retry_settings(&format!("deadline-ms = {DEADLINE_MS}"))
        .start()
        .await;
    let get = |key: &'static str| {
        let host = h.host.clone();
        async move {
            host.call_retry("settings.get-setting", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_get_setting(store, key)
                        .await
                })
            })
            .await
        }
    };
    let started = Instant::now();
    let endless = tokio::spawn(get("hostile-sql:endless-in-transaction"));
    // Queued behind it: it writes the same database the endless call holds locked.
    tokio::task::yield_now().await;
    let next = tokio::spawn(get("hostile-sql:write"));
    let first = tokio::time::timeout(SOON, endless)
        .await
        .expect("the endless call ended")
        .unwrap();
    assert!(
        matches!(&first, Err(CallError::Deadline { plugin, .. }) if plugin == "provider-retry"),
        "{first:?}"
    );
    let second = tokio::time::timeout(SOON, next)
        .await
        .expect("the next call was not kept waiting")
        .unwrap()
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    // The transaction was rolled back: the write is the table's only row.
    assert_eq!(second.value, "write ok Value::Integer(1)\n");
    assert!(
        took < Duration::from_millis(DEADLINE_MS) + GRACE,
        "both calls took {took:?}"
    );
    assert!(
        refusal_logged(
            &logs,
            "provider-retry",
            "interrupted: the statement ran past"
        )
        .await
    );

    // A result past the cap and a forbidden pragma from this plugin too.
    let huge = get("hostile-sql:huge").await.unwrap().unwrap();
    assert!(huge.value.contains("result too large"), "{}", huge.value);
    let pragmas = get("hostile-sql:pragmas").await.unwrap().unwrap();
    assert_eq!(
        pragmas.value.matches("not authorized").count(),
        8,
        "{}",
        pragmas.value
    );

    // The real pool serves a turn, and the core's database is sound.
    h.upstream.push(success("fine"));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(h.turns(&thread)[0].outcome, Some(TurnOutcomeKind::Ok));
    let core = rusqlite::Connection::open_with_flags(
        h.data.path().join("core.sqlite3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let check: String = core
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
