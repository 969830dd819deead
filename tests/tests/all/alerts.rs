//! Alerts (`[alerts]`, `docs/alerts.md`): the real pool in the real host, a loopback webhook
//! receiver (the fake upstream server, recording what it is sent), a fake command, the
//! manual clock. Each condition is announced once per episode and once more when it ends;
//! a window's alerts go out together; a receiver that fails or hangs never holds a proxied
//! request.

use std::time::{Duration, Instant};

use pooler_host::mediation::alerts::model::AlertKind;
use pooler_tests::pool::{Pool, PoolSetup, SOON, api_key};
use pooler_tests::provider::claude;
use pooler_tests::upstream::{FakeUpstream, Gate, Received, Reply};

/// The webhook's path: a secret, as a Slack or ntfy URL's is.
const HOOK_PATH: &str = "/hook/T0SECRETPATH42";

/// A pool of `accounts` Claude API keys whose alerts go to `receiver` after `coalesce_s`.
async fn pool_with_hook(accounts: usize, receiver: &FakeUpstream, more: &str) -> Pool {
    PoolSetup::claude_keys(accounts)
        .config(&format!(
            "[alerts]\nwebhook = \"{}{HOOK_PATH}\"\n{more}\n",
            receiver.url()
        ))
        .start()
        .await
}

/// Make account A's key refused (401 echoing it): the request moves to B and A is in error.
async fn refuse_a(pool: &Pool) {
    pool.upstream.push(claude::error(
        401,
        "authentication_error",
        &format!("invalid x-api-key {}", api_key("A")),
    ));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "B served: {}", answer.body);
}

fn document(received: &Received) -> serde_json::Value {
    serde_json::from_slice(&received.body).expect("a JSON document")
}

fn alerts_counter(pool: &Pool, kind: &str) -> u64 {
    pool.host
        .host
        .metrics()
        .counter("pooler_alerts_total", &[("kind", kind)])
}

/// The median time `n` requests through the pool take to be answered (each served).
async fn median_latency(pool: &Pool, n: usize) -> Duration {
    let mut took = Vec::new();
    for i in 0..n {
        let started = Instant::now();
        let answer = pool.send(pool.messages(&format!("q{i}"))).await;
        took.push(started.elapsed());
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    took.sort();
    took[took.len() / 2]
}

/// An account in error fires once however often it is looked at, with the pool's redacted
/// text and never the key; enabling it again sends the recovery; the webhook gets the
/// documented JSON document at its path; `/metrics` counts the episode once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_in_error_alerts_once_per_episode_and_closes_on_recovery() {
    let receiver = FakeUpstream::start().await;
    let pool = pool_with_hook(2, &receiver, "coalesce-s = 10").await;
    let host = &pool.host.host;
    refuse_a(&pool).await;
    for _ in 0..3 {
        host.check_alerts().await;
    }
    // The window closes on the host clock, not in real time.
    assert_eq!(
        receiver.received().len(),
        0,
        "nothing before the window closes"
    );
    let moved = pool.host.sleep_through(SOON).await;
    assert_eq!(moved, Some(Duration::from_secs(10)));
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    let sent = receiver.received();
    assert_eq!(sent.len(), 1, "one delivery");
    assert_eq!(sent[0].method, "POST");
    assert_eq!(sent[0].path, HOOK_PATH);
    assert_eq!(sent[0].header("content-type"), Some("application/json"));
    let doc = document(&sent[0]);
    assert_eq!(doc["source"], "pooler");
    assert_eq!(doc["state"], "firing");
    let alerts = doc["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{doc}");
    assert_eq!(alerts[0]["kind"], "account-error");
    assert_eq!(alerts[0]["account"], pool.id("A"));
    assert_eq!(alerts[0]["provider"], "claude");
    let reason = alerts[0]["reason"].as_str().unwrap();
    assert!(reason.contains("[redacted]"), "{reason}");
    let text = String::from_utf8_lossy(&sent[0].body).to_string();
    assert!(!text.contains("key-a"), "no piece of the key: {text}");
    assert_eq!(alerts_counter(&pool, "account-error"), 1);

    // Still in error: more looks say nothing.
    host.check_alerts().await;
    host.check_alerts().await;
    assert_eq!(host.alerts().open().len(), 1);
    assert!(
        pool.host
            .next_wake(Duration::from_millis(200))
            .await
            .is_none(),
        "no window opened"
    );

    // Recovery closes the episode.
    pool.enable("A").await;
    host.check_alerts().await;
    pool.host.sleep_through(SOON).await;
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    let sent = receiver.received();
    assert_eq!(sent.len(), 2);
    let doc = document(&sent[1]);
    assert_eq!(doc["state"], "resolved");
    assert_eq!(doc["alerts"][0]["kind"], "account-error");
    assert_eq!(
        doc["alerts"][0]["since"],
        doc["alerts"][0]["at"].as_u64().unwrap() - 10_000
    );
    assert!(host.alerts().open().is_empty());
    assert_eq!(
        alerts_counter(&pool, "account-error"),
        1,
        "counted per episode"
    );
}

/// Every account refused: the provider cannot serve, with the earliest time one will; the
/// alerts raised within one window go out as one delivery (here in Slack's shape), and an
/// episode that started and ended within the window is not sent at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_cannot_serve_alerts_with_when_and_a_window_coalesces() {
    let receiver = FakeUpstream::start().await;
    let pool = pool_with_hook(2, &receiver, "coalesce-s = 3600\nformat = \"slack\"").await;
    let host = &pool.host.host;
    // A's 5-hour window is refused until +30 min, B's key is refused: nothing can serve.
    let reset = pool.now() + 1_800_000;
    pool.upstream.push(claude::rate_limited(reset, pool.now()));
    pool.upstream.push(claude::error(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 401, "the last refusal: {}", answer.body);
    host.check_alerts().await;
    let open = host.alerts().open();
    let kinds: Vec<_> = open.iter().map(|a| a.condition.kind).collect();
    assert_eq!(
        kinds,
        [AlertKind::AccountError, AlertKind::ProviderUnavailable],
        "{open:?}"
    );
    assert_eq!(open[1].condition.until, Some(reset), "when A serves again");

    // The window is open (its timer set) before the clock moves.
    assert_eq!(
        pool.host.next_wake(SOON).await,
        Some(Duration::from_secs(3_600))
    );
    // A's reset passes within the window: the provider serves again.
    pool.host.clock.advance(Duration::from_secs(1_800));
    host.check_alerts().await;
    assert_eq!(host.alerts().open().len(), 1);

    let moved = pool.host.sleep_through(SOON).await;
    assert_eq!(
        moved,
        Some(Duration::from_secs(1_800)),
        "the rest of the window"
    );
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    let sent = receiver.received();
    assert_eq!(sent.len(), 1, "one delivery for the window");
    let slack = document(&sent[0]);
    let text = slack["text"].as_str().unwrap();
    let b = pool.account("B").await.label;
    assert!(
        text.starts_with(&format!("*claude account {b} is in error*\n")),
        "{text}"
    );
    assert!(
        !text.contains("no account can serve"),
        "the provider's episode began and ended within the window: {text}"
    );
    assert_eq!(
        alerts_counter(&pool, "provider-unavailable"),
        1,
        "still logged and counted"
    );
}

/// A receiver that hangs never holds a proxied request: while the webhook's answer is
/// provably outstanding (its head held by the test), requests through the pool are
/// answered; and one that answers 500 is retried with backoff on the host clock, then given
/// up (counted), while requests go on being served. Prints the latency of requests during a
/// hung delivery against requests with no delivery at all (a figure, not an assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_or_failing_receiver_never_holds_a_proxied_request() {
    let receiver = FakeUpstream::start().await;
    let pool = pool_with_hook(2, &receiver, "coalesce-s = 0").await;
    let host = &pool.host.host;

    let baseline = median_latency(&pool, 30).await;

    let gate = Gate::new();
    receiver.push(Reply::status(200).hold_head(&gate));
    refuse_a(&pool).await;
    host.check_alerts().await;
    tokio::time::timeout(SOON, receiver.wait_for_hits(1))
        .await
        .expect("the webhook was called");
    let during = median_latency(&pool, 30).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(50), host.alerts().settled())
            .await
            .is_err(),
        "the delivery is still waiting on the receiver: the requests above did not wait for it"
    );
    gate.open();
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    eprintln!(
        "proxied request p50: {:.2} ms with no delivery, {:.2} ms while a webhook hangs ({:.2}x)",
        baseline.as_secs_f64() * 1e3,
        during.as_secs_f64() * 1e3,
        during.as_secs_f64() / baseline.as_secs_f64()
    );

    // A failing receiver: 500 on every attempt, retried after 1, 2, 4, 8 s of host time.
    for _ in 0..5 {
        receiver.push(Reply::status(500));
    }
    pool.enable("A").await;
    host.check_alerts().await;
    let mut waits = Vec::new();
    for _ in 0..4 {
        let moved = pool.host.sleep_through(SOON).await.expect("a backoff");
        waits.push(moved.as_secs());
        // Requests are served while the delivery backs off.
        let answer = pool.send(pool.messages("S2")).await;
        assert_eq!(answer.status, 200);
    }
    assert_eq!(waits, [1, 2, 4, 8]);
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    assert_eq!(receiver.received().len(), 1 + 5);
    assert_eq!(
        host.metrics().counter(
            "pooler_alert_deliveries_total",
            &[("via", "webhook"), ("outcome", "failed")]
        ),
        1
    );
    assert_eq!(
        host.metrics().counter(
            "pooler_alert_deliveries_total",
            &[("via", "webhook"), ("outcome", "sent")]
        ),
        1
    );
}

/// The command gets each placeholder as one whole argument (no shell) and the alert's
/// fields in `POOLER_ALERT_*`; a webhook outside the allow-list is refused without a
/// request.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_alert_as_arguments_and_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("args");
    let env = dir.path().join("env");
    let program = dir.path().join("notify");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nprintf '%s\\0' \"$@\" > '{}'\nenv | grep '^POOLER_ALERT_' | sort > '{}'\n",
            out.display(),
            env.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let receiver = FakeUpstream::start().await;
    let pool = PoolSetup::claude_keys(2)
        .config(&format!(
            "[alerts]\ncoalesce-s = 0\ncommand = [\"{}\", \"-t\", \"{{title}}\", \"{{kind}}:{{account}}\", \"$(touch pwned); {{label}}\"]\n\
             webhook = \"{}{HOOK_PATH}\"\nallowed-hosts = [\"https://hooks.example\"]\n",
            program.display(),
            receiver.url(),
        ))
        .start()
        .await;
    let host = &pool.host.host;
    refuse_a(&pool).await;
    host.check_alerts().await;
    tokio::time::timeout(SOON, host.alerts().settled())
        .await
        .unwrap();
    let args = std::fs::read_to_string(&out).expect("the command ran");
    let args: Vec<&str> = args.trim_end_matches('\0').split('\0').collect();
    let a = pool.id("A");
    let label = pool.account("A").await.label;
    assert_eq!(
        args,
        [
            "-t",
            &format!("claude account {label} is in error"),
            &format!("account-error:{a}"),
            &format!("$(touch pwned); {label}"),
        ]
    );
    assert!(!dir.path().join("pwned").exists());
    let env = std::fs::read_to_string(&env).unwrap();
    assert!(
        env.contains(&format!("POOLER_ALERT_ACCOUNT={a}\n")),
        "{env}"
    );
    assert!(env.contains("POOLER_ALERT_STATE=firing\n"), "{env}");
    assert!(env.contains("POOLER_ALERT_PROVIDER=claude\n"), "{env}");
    // The webhook's origin is not on [alerts] allowed-hosts: refused, never sent.
    assert_eq!(receiver.received().len(), 0);
    let m = host.metrics();
    assert_eq!(
        m.counter(
            "pooler_alert_deliveries_total",
            &[("via", "command"), ("outcome", "sent")]
        ),
        1
    );
    assert_eq!(
        m.counter(
            "pooler_alert_deliveries_total",
            &[("via", "webhook"), ("outcome", "failed")]
        ),
        1
    );
}

/// A thread whose failed turn Provider Retry declines for good (an invalid request is not retryable)
/// fires `retries-ended` once, with the plugin's reason; a thread it schedules a retry for
/// does not; a person's next message that succeeds closes the episode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_whose_retries_ended_alerts_once_and_closes_when_it_runs_again() {
    use pooler_tests::core::{CoreSetup, failure, success};
    let h = CoreSetup::new().real_retry().start().await;
    let stuck = h.new_thread().await;
    h.upstream.push(claude::error(
        400,
        "invalid_request_error",
        "prompt is too long",
    ));
    h.send(&stuck, "hello");
    h.settle().await;
    let retried = h.new_thread().await;
    h.upstream.push(failure(500));
    h.send(&retried, "hello");
    h.settle().await;
    assert_eq!(
        h.candidates(Some(&retried)).await.len(),
        1,
        "a retry is scheduled"
    );

    for _ in 0..3 {
        h.host.check_alerts().await;
    }
    let open = h.host.alerts().open();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].condition.kind, AlertKind::RetriesEnded);
    assert_eq!(open[0].condition.thread.as_deref(), Some(stuck.as_str()));
    let reason = open[0].condition.reason.clone().unwrap_or_default();
    assert!(reason.contains("retry"), "the plugin's words: {reason}");
    let counter = |h: &pooler_tests::core::CoreHost| {
        h.host
            .metrics()
            .counter("pooler_alerts_total", &[("kind", "retries-ended")])
    };
    assert_eq!(counter(&h), 1);

    h.upstream.push(success("hi"));
    h.send(&stuck, "again");
    h.settle().await;
    h.host.check_alerts().await;
    assert!(
        h.host
            .alerts()
            .open()
            .iter()
            .all(|a| a.condition.kind != AlertKind::RetriesEnded),
        "closed"
    );
    assert_eq!(counter(&h), 1);
}

/// A last-resort account that takes over when the others are refused alerts once; the
/// others serving again (the reset passed) closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_resort_account_taking_over_alerts_once_and_closes_when_others_serve() {
    use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::OptionsChange;
    let pool = PoolSetup::claude_keys(2).start().await;
    let host = &pool.host.host;
    pool.update_options(
        "A",
        OptionsChange {
            last_resort: Some(true),
            extra_usage: None,
            max_in_flight: None,
            preserve: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    host.check_alerts().await;
    assert!(host.alerts().open().is_empty(), "B serves");

    let reset = pool.now() + 60_000;
    pool.upstream.push(claude::rate_limited(reset, pool.now()));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(1), ["B", "A"]);
    host.check_alerts().await;
    host.check_alerts().await;
    let open = host.alerts().open();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].condition.kind, AlertKind::LastResort);
    assert_eq!(open[0].condition.account, Some(pool.id("A")));

    pool.host.clock.advance(Duration::from_secs(60));
    host.check_alerts().await;
    assert!(host.alerts().open().is_empty(), "B can serve again");
    assert_eq!(alerts_counter(&pool, "last-resort"), 1);
}
