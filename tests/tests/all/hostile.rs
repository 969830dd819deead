//! Hostile plugins: fixtures that give the host absurd values —
//! send times in the far past and past year 9999, a row moved into the past during its own
//! gate, a megabyte drop reason, megabyte log lines, thousands of availability signals in
//! one call, ids the core does not know — or that try to reach hosts nobody granted them.
//! Each is refused or bounded with a warning naming the plugin and the rule, and the host,
//! the other plugin and the core's data stay sound: a normal request or retry afterwards
//! still works. (Hostile SQL is `hostile_sql.rs`.)

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use pooler_core::ThreadStatus;
use pooler_host::mediation::core_link::{FOREIGN_ROW_RULE, MAX_SEND_AT};
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::core::{CoreHost, CoreSetup, failure, success};
use pooler_tests::fixtures;
use pooler_tests::harness::{Setup, TestHost};
use pooler_tests::logs::{LogLine, logs};
use pooler_tests::upstream::{FakeUpstream, Reply};

/// A safety net for requests that should finish at once.
const SOON: Duration = Duration::from_secs(10);

/// The captured warnings whose `rule` field is `rule` and that satisfy `more`.
fn warnings(rule: &str, more: impl Fn(&LogLine) -> bool) -> Vec<LogLine> {
    logs()
        .lines()
        .into_iter()
        .filter(|l| l.level == tracing::Level::WARN)
        .filter(|l| l.fields.get("rule").map(String::as_str) == Some(rule))
        .filter(|l| more(l))
        .collect()
}

// ---------------------------------------------------------------------------------------
// The outbound allow-list: the fixture pool, its `/fetch?url=` and the admin API.

async fn pool_host(settings: &str, with_listener: bool) -> (TestHost, String) {
    let mut setup = Setup::new().role(Role::AccountPool, fixtures::POOL, settings);
    if with_listener {
        setup = setup.role(Role::ProviderRetry, fixtures::RETRY, "");
    }
    let mut host = setup.start().unwrap();
    let url = host.serve().await.unwrap();
    (host, url)
}

/// `PUT /_pooler/settings/{key}` through the admin API: the status and the JSON answer.
async fn put_setting(
    host: &TestHost,
    url: &str,
    key: &str,
    value: &str,
) -> (u16, serde_json::Value) {
    let token = host.admin_token().unwrap();
    let request = Request::put(format!("{url}/_pooler/settings/{key}"))
        .header("authorization", format!("Bearer {}", token.trim()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::json!({ "value": value }).to_string(),
        )))
        .unwrap();
    let answer = tokio::time::timeout(SOON, TestClient::new().send(request))
        .await
        .unwrap()
        .unwrap();
    let json = serde_json::from_str(&answer.body).unwrap_or(serde_json::Value::Null);
    (answer.status.as_u16(), json)
}

/// What the fixture pool got when it fetched `target`: `status=… body=…` or `error=…`.
async fn fetch(url: &str, target: &str) -> String {
    TestClient::new()
        .get_within(&format!("{url}/fetch?url={target}"), SOON)
        .await
        .unwrap()
        .body
}

const DENIED: &str = "error=ErrorCode::HttpRequestDenied";

/// The fixture stores (and answers) another URL than the one the person set: the host
/// grants the person's, not the plugin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_setting_grants_the_origin_the_person_gave_not_the_one_the_plugin_answered() {
    let (person, plugin) = (FakeUpstream::start().await, FakeUpstream::start().await);
    person.push(Reply::status(200).body("person's"));
    plugin.push(Reply::status(200).body("plugin's"));
    let (host, url) = pool_host("", false).await;
    // Scripted straight through the plugin's export (not the admin API, which would grant).
    host.set_setting(Role::AccountPool, "rewrite-to", &plugin.url())
        .await
        .unwrap();

    let (status, answer) = put_setting(&host, &url, "pool.upstream-url", &person.url()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["setting"]["value"],
        plugin.url(),
        "the fixture answered its own URL"
    );
    assert_eq!(fetch(&url, &format!("{}/p", plugin.url())).await, DENIED);
    assert_eq!(
        fetch(&url, &format!("{}/p", person.url())).await,
        "status=200 body=person's"
    );
    assert_eq!(plugin.received().len(), 0);
    let warned = warnings("a setting grants the origin the person gave", |l| {
        l.fields.get("granted").map(String::as_str)
            == Some(format!("http://127.0.0.1:{}", person.addr().port()).as_str())
    });
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].fields["plugin"], "account-pool");
}

/// A new value of a URL setting revokes the old value's grant, now and after a restart;
/// grants match the scheme as well as host and port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_url_setting_revokes_the_old_grant_and_the_scheme_must_match() {
    let (old, new) = (FakeUpstream::start().await, FakeUpstream::start().await);
    for _ in 0..3 {
        old.push(Reply::status(200).body("old"));
        new.push(Reply::status(200).body("new"));
    }
    let (mut host, url) = pool_host("", false).await;
    assert_eq!(
        put_setting(&host, &url, "pool.upstream-url", &old.url())
            .await
            .0,
        200
    );
    assert_eq!(
        fetch(&url, &format!("{}/a", old.url())).await,
        "status=200 body=old"
    );

    assert_eq!(
        put_setting(&host, &url, "pool.upstream-url", &new.url())
            .await
            .0,
        200
    );
    assert_eq!(
        fetch(&url, &format!("{}/a", old.url())).await,
        DENIED,
        "revoked"
    );
    assert_eq!(
        fetch(&url, &format!("{}/a", new.url())).await,
        "status=200 body=new"
    );

    // https://127.0.0.1:PORT is granted, not http:// on the same port.
    let https = format!("https://127.0.0.1:{}", old.addr().port());
    assert_eq!(
        put_setting(&host, &url, "pool.token-url", &https).await.0,
        200
    );
    assert_eq!(
        fetch(&url, &format!("{}/a", old.url())).await,
        DENIED,
        "scheme"
    );

    let url = host.restart().await.unwrap().unwrap();
    assert_eq!(fetch(&url, &format!("{}/a", old.url())).await, DENIED);
    assert_eq!(
        fetch(&url, &format!("{}/b", new.url())).await,
        "status=200 body=new"
    );
    assert_eq!(
        old.received().len(),
        1,
        "only the first fetch reached the old upstream"
    );
}

/// Plain http:// beyond loopback is refused: as a setting (before the plugin stores it), in
/// the configuration, and for a request whatever the list says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_beyond_loopback_is_refused_as_a_setting_a_configured_host_and_a_request() {
    let (host, url) = pool_host("allowed-hosts = [\"example.invalid:80\"]", false).await;
    let (status, answer) = put_setting(
        &host,
        &url,
        "pool.upstream-url",
        "http://example.invalid/v1",
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid-value", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("https://"),
        "{answer}"
    );
    assert_eq!(
        host.setting(Role::AccountPool, "upstream-url").await,
        None,
        "the plugin never stored it"
    );
    // `example.invalid:80` is https on port 80: http to it is refused before any lookup.
    assert_eq!(fetch(&url, "http://example.invalid/x").await, DENIED);
    let refused = warnings("plain http:// is allowed only to loopback", |l| {
        l.fields.get("host").map(String::as_str) == Some("example.invalid")
    });
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].fields["plugin"], "account-pool");

    let config = Setup::new()
        .role(
            Role::AccountPool,
            fixtures::POOL,
            "allowed-hosts = [\"http://example.invalid\"]",
        )
        .start();
    let error = format!("{:#}", config.err().expect("refused"));
    assert!(error.contains("http://example.invalid"), "{error}");
    assert!(error.contains("use https://"), "{error}");

    // The host still serves, and loopback http still works.
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::status(200).body("fine"));
    assert_eq!(
        put_setting(&host, &url, "pool.upstream-url", &upstream.url())
            .await
            .0,
        200
    );
    assert_eq!(fetch(&url, &upstream.url()).await, "status=200 body=fine");
}

// ---------------------------------------------------------------------------------------
// Hostile values through the pool's imports: log and availability-listener.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_of_megabytes_is_cut_to_8_kib_with_one_warning_and_the_host_serves_on() {
    let (_host, url) = pool_host("", false).await;
    let client = TestClient::new();
    let answer = client
        .get_within(&format!("{url}/hostile/log?kib=3073"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "logged 3073 KiB");
    let bytes = 2 * (3073 << 10) + "huge".len() + 2;
    let cut = warnings("a plugin's log line is at most 8 KiB", |l| {
        l.fields.get("bytes") == Some(&bytes.to_string())
    });
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0].fields["plugin"], "account-pool");
    let lines: Vec<LogLine> = logs()
        .lines()
        .into_iter()
        .filter(|l| l.target == "pooler::plugin" && l.message.starts_with("mmmm"))
        .collect();
    assert_eq!(lines.len(), 1);
    let kept = lines[0].message.len() + lines[0].fields["fields"].len();
    assert!(kept <= 8 * 1024 + 8, "{kept} bytes kept");
    // A normal request afterwards.
    let echo = client
        .get_within(&format!("{url}/log"), SOON)
        .await
        .unwrap();
    assert_eq!(echo.body, "logged");
}

/// A plugin logging in a loop: one call's lines stop at 16 MiB, the rest are dropped and
/// counted in one warning when the call ends; the next call logs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_logging_past_16_mib_has_the_rest_dropped_with_one_warning_and_the_next_call_logs() {
    let (_host, url) = pool_host("", false).await;
    let client = TestClient::new();
    // 3,000 lines of just under 8 KiB: about 2,050 fit in 16 MiB.
    let answer = client
        .get_within(&format!("{url}/hostile/lines?n=3000&kib=8"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "logged 3000 lines");
    let plugin_lines = |prefix: &str| -> Vec<LogLine> {
        logs()
            .lines()
            .into_iter()
            .filter(|l| l.target == "pooler::plugin" && l.message.starts_with(prefix))
            .collect()
    };
    let kept = plugin_lines("line ");
    let bytes: usize = kept.iter().map(|l| l.message.len()).sum();
    assert!(
        bytes <= 16 << 20 && bytes > (16 << 20) - (8 << 10),
        "{} lines, {bytes} bytes kept: the budget filled, not passed",
        kept.len()
    );
    assert!(
        plugin_lines("after 3000 lines").is_empty(),
        "dropped, past the budget"
    );
    let dropped = warnings("a plugin logs at most 16 MiB in one call", |_| true);
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0].fields["plugin"], "account-pool");
    assert_eq!(
        dropped[0].fields["lines"],
        (3_001 - kept.len()).to_string(),
        "every line past the budget counted"
    );
    // The next call has its own budget.
    let answer = client
        .get_within(&format!("{url}/hostile/lines?n=2&kib=1"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "logged 2 lines");
    assert_eq!(plugin_lines("after 2 lines").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_signals_in_one_call_are_one_delivery_and_a_bounded_number_of_lines() {
    let (host, url) = pool_host("", true).await;
    // A detection time no other test uses, to tell this test's lines.
    let at = 4_242_424_242_u64;
    let answer = TestClient::new()
        .get_within(&format!("{url}/hostile/signals?n=5000&at={at}"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.body, "signalled 5000");
    host.host.availability_changes_settled().await;
    let logged = logs()
        .lines()
        .into_iter()
        .filter(|l| {
            l.message == "availability change signalled"
                && l.fields.get("detected_at") == Some(&at.to_string())
        })
        .count();
    assert_eq!(logged, 16, "the first 16 are logged, the rest coalesced");
    assert!(
        !warnings(
            "at most 16 availability signals of one call are logged",
            |_| true
        )
        .is_empty()
    );
    assert_eq!(
        host.setting(Role::ProviderRetry, "deliveries")
            .await
            .as_deref(),
        Some("1"),
        "one delivery for the one provider"
    );
    assert_eq!(
        host.setting(Role::ProviderRetry, "causes").await.as_deref(),
        Some("ChangeCause::AccountAdded,ChangeCause::HoldEnded,ChangeCause::ResetPassed"),
        "no cause lost"
    );
    assert_eq!(
        host.setting(Role::ProviderRetry, "provider")
            .await
            .as_deref(),
        Some("Provider::Codex")
    );
}

// ---------------------------------------------------------------------------------------
// Hostile values through `threads` and `before-dispatch`: the fixture retry
// plugin in front of the core, with the real pool and a fake upstream.

/// A thread whose first turn failed and was scheduled by the fixture with the current
/// script. Returns (thread, failed request).
async fn failed_thread(h: &CoreHost) -> (String, String) {
    h.upstream.push(failure(500));
    let thread = h.new_thread().await;
    let request = h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    (thread, request)
}

/// The core's database passes SQLite's integrity check.
fn core_database_is_sound(h: &CoreHost) {
    let db = rusqlite::Connection::open_with_flags(
        h.core().database_path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// The thread's row is moved to now by a person's-eye `reschedule` through the fixture,
/// dispatched, and its turn succeeds: the queue works after whatever came before.
async fn retry_still_works(h: &CoreHost, thread: &str) {
    h.retry_set("verdict", "proceed").await;
    let row = h.row(thread);
    h.upstream.push(success("recovered"));
    h.retry_set(
        "act",
        &format!("reschedule:{thread}:{}:{}", row.id, h.now()),
    )
    .await;
    h.settle().await;
    let turns = h.turns(thread);
    assert_eq!(
        turns.last().unwrap().outcome,
        Some(pooler_core::TurnOutcomeKind::Ok),
        "{turns:?}"
    );
    assert!(h.rows(thread).is_empty());
    core_database_is_sound(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_times_past_year_9999_or_in_the_far_past_are_bounded_with_a_warning() {
    let h = CoreSetup::new().start().await;
    h.retry_set("schedule", &format!("at:{}", u64::MAX)).await;
    let (thread, _) = failed_thread(&h).await;
    assert_eq!(h.retry_get("schedule-error").await, None);
    let row = h.row(&thread);
    assert_eq!(row.send_at, MAX_SEND_AT, "u64::MAX kept as 9999-12-31");
    let rule = "send-at after year 9999 is moved to 9999-12-31";
    assert!(
        !warnings(rule, |l| l.fields.get("asked")
            == Some(&u64::MAX.to_string()))
        .is_empty()
    );

    // Moved to time 0 (the far past): kept as now.
    h.upstream.push(success("ok"));
    h.retry_set("act", &format!("reschedule:{thread}:{}:0", row.id))
        .await;
    let acted = h.retry_get("acted").await.unwrap();
    assert!(acted.starts_with("Ok("), "{acted}");
    h.settle().await;
    // Due at once, so dispatched by the default verdict (the thread is in error).
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2, "dispatched once: {turns:?}");
    let moved = h
        .show(&thread)
        .history
        .into_iter()
        .find(|e| e.action == "rescheduled")
        .unwrap();
    assert!(
        moved.send_at.unwrap() >= pooler_tests::harness::START_MS,
        "{moved:?}"
    );
    assert!(
        !warnings("send-at far in the past is moved to now", |l| {
            l.fields.get("row") == Some(&row.id.to_string())
        })
        .is_empty()
    );
    core_database_is_sound(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_until_of_u64_max_postpones_the_row_to_9999_instead_of_leaving_it_claimed() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    h.retry_set("verdict", "hostile:wait-max").await;
    h.clock.set(h.row(&thread).send_at);
    h.settle().await;
    let row = h.row(&thread);
    assert_eq!(row.send_at, MAX_SEND_AT);
    assert_eq!(h.turns(&thread).len(), 1, "not dispatched");
    assert!(
        !warnings("send-at after year 9999 is moved to 9999-12-31", |l| {
            l.fields.get("row") == Some(&row.id.to_string())
        })
        .is_empty()
    );
    retry_still_works(&h, &thread).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_moved_into_the_past_by_its_own_gate_is_gated_once_per_pass_not_in_a_loop() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    h.retry_set("verdict", "hostile:reschedule-past").await;
    h.clock.set(h.row(&thread).send_at);
    h.settle().await;
    let checks = h.retry_lines("checks").await;
    assert!(checks.len() <= 2, "the gate ran {} times", checks.len());
    let row = h.row(&thread);
    assert_eq!(row.send_at, h.now() + 1_000, "postponed by 1 s");
    assert_eq!(
        h.turns(&thread).len(),
        1,
        "never dispatched on a void claim"
    );
    assert!(
        !warnings("a row is gated at most once per due pass", |l| {
            l.fields.get("row") == Some(&row.id.to_string())
        })
        .is_empty()
    );
    retry_still_works(&h, &thread).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_reason_of_a_megabyte_is_cut_to_200_characters() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    h.retry_set("verdict", "hostile:drop-huge").await;
    h.clock.set(h.row(&thread).send_at);
    h.settle().await;
    assert!(h.rows(&thread).is_empty(), "dropped");
    let dropped = h
        .show(&thread)
        .history
        .into_iter()
        .find(|e| e.action == "dropped")
        .unwrap();
    let detail = dropped.detail.unwrap();
    assert_eq!(
        detail.chars().count(),
        200,
        "{} characters kept",
        detail.len()
    );
    core_database_is_sound(&h);
    // The thread and the queue still work: a new failure is scheduled and retried.
    h.retry_set("verdict", "proceed").await;
    h.upstream.push(failure(500));
    h.send(&thread, "again");
    h.settle().await;
    retry_still_works(&h, &thread).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_refused_with_one_warning_per_call_and_rule() {
    let h = CoreSetup::new().start().await;
    let (thread, _) = failed_thread(&h).await;
    h.retry_set("act", "unknown-thread:1000").await;
    let acted = h.retry_get("acted").await.unwrap();
    assert_eq!(
        acted,
        "Err(ThreadsError::NoSuchThread(\"no-such-thread\")) \
         Err(ThreadsError::NoSuchThread(\"no-such-thread\"))"
    );
    let rule = "a thread id must name one of the core's threads";
    let calls: Vec<String> = warnings(rule, |l| l.fields["plugin"] == "provider-retry")
        .into_iter()
        .map(|l| l.fields["call"].clone())
        .collect();
    assert_eq!(
        calls.iter().filter(|c| *c == "get-thread").count(),
        1,
        "one warning for a thousand refusals: {calls:?}"
    );
    assert!(calls.iter().any(|c| c == "schedule-retry"), "{calls:?}");

    // A row that does not exist, moved a thousand times in one call.
    h.retry_set(
        "act",
        &format!("reschedule-many:{thread}:987654:{}:1000", h.now()),
    )
    .await;
    let acted = h.retry_get("acted").await.unwrap();
    assert_eq!(acted, "Some(Err(ThreadsError::NoSuchRow(987654)))");
    let rows = warnings("a row id must name a live row of the thread named", |l| {
        l.fields.get("error").is_some_and(|e| e.contains("987654"))
    });
    assert_eq!(rows.len(), 1, "{rows:?}");

    // Nothing changed for the real thread; its retry still runs.
    assert_eq!(h.rows(&thread).len(), 1);
    retry_still_works(&h, &thread).await;
}

/// The retry plugin, working on thread a, names thread b's row in
/// `reschedule`, `cancel` and a `reschedule-many` that also moves a's own row. Each foreign
/// call is refused as `no-such-row` with a warning naming the plugin, the row and both
/// threads; a's own move commits; b's row keeps its time, reason and history, and is still
/// retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_another_thread_is_refused_logged_and_left_intact() {
    let h = CoreSetup::new().start().await;
    let (a, _) = failed_thread(&h).await;
    let (b, _) = failed_thread(&h).await;
    let (row_a, row_b) = (h.row(&a), h.row(&b));
    let history_b = h.show(&b).history;
    let later = h.now() + 3_600_000;

    h.retry_set(
        "act",
        &format!("hijack:{a}:{}:{}:{later}", row_a.id, row_b.id),
    )
    .await;

    let refused = format!("Err(ThreadsError::NoSuchRow({}))", row_b.id);
    assert_eq!(
        h.retry_get("acted").await.unwrap(),
        format!("{refused} {refused} Ok(({}, {later})) {refused}", row_a.id)
    );
    let lines = warnings(FOREIGN_ROW_RULE, |l| {
        l.fields.get("row") == Some(&row_b.id.to_string())
    });
    let calls: Vec<&str> = lines.iter().map(|l| l.fields["call"].as_str()).collect();
    assert_eq!(
        calls,
        ["reschedule", "cancel", "reschedule-many"],
        "{lines:?}"
    );
    for l in &lines {
        assert_eq!(l.fields["plugin"], "provider-retry", "{l:?}");
        assert_eq!(l.fields["thread"], a, "the thread named: {l:?}");
        assert_eq!(l.fields["owner"], b, "the row's own thread: {l:?}");
    }
    assert_eq!(h.row(&b), row_b, "b's row as it was");
    assert_eq!(
        h.show(&b).history,
        history_b,
        "nothing written to b's history"
    );
    assert_eq!(h.row(&a).send_at, later, "a's own move committed");
    core_database_is_sound(&h);
    // B's row is still retried when due.
    retry_still_works(&h, &b).await;
}

/// `retry-admin` answers about other threads than the one asked, and rows of other threads'
/// chains: left out of what a person sees, with a warning; a cancel answered with another
/// thread's candidate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_admin_answers_about_other_threads_or_their_rows_are_left_out() {
    let h = CoreSetup::new().start().await;
    let (a, _) = failed_thread(&h).await;
    let (b, _) = failed_thread(&h).await;
    let (row_a, row_b) = (h.row(&a).id, h.row(&b).id);
    h.retry_set("hostile-status", &format!("{b}:{row_b},{a}:{row_b}"))
        .await;

    let (status, answer) = h
        .admin(
            "GET",
            &format!("retry/status?thread={a}"),
            serde_json::Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let candidates = answer["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 1, "{answer}");
    assert_eq!(candidates[0]["thread"], a.as_str());
    assert_eq!(candidates[0]["row"], serde_json::Value::Null, "{answer}");
    assert_eq!(
        warnings("an answer about a thread names only that thread", |l| {
            l.fields.get("thread") == Some(&a)
        })
        .len(),
        1
    );
    assert!(
        !warnings("a candidate's row is a row of its own thread", |l| {
            l.fields.get("row") == Some(&row_b.to_string())
        })
        .is_empty()
    );

    let (status, answer) = h
        .admin(
            "GET",
            &format!("retry/explain/{a}"),
            serde_json::Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let chains = answer["chains"].as_array().unwrap();
    assert_eq!(chains.len(), 1, "{answer}");
    assert_eq!(chains[0]["thread"], a.as_str());

    let (status, answer) = h
        .admin("POST", &format!("retry/cancel/{a}"), serde_json::json!({}))
        .await;
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["code"], "plugin-answer", "{answer}");

    // Both rows are untouched, and both threads' retries still run.
    assert_eq!(h.row(&a).id, row_a);
    assert_eq!(h.row(&b).id, row_b);
    h.retry_set("hostile-status", "").await;
    retry_still_works(&h, &a).await;
    retry_still_works(&h, &b).await;
}
