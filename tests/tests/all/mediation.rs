//! Mediation between plugins: availability queries answered by the pool in a fresh instance,
//! availability changes coalesced and delivered after the signalling call returned, at least
//! once; and the `threads` import reaching the core's service with the caller's id.

use pooler_host::runtime::bindings::retry::exports::pooler::plugins::scheduler::DispatchVerdict;
use pooler_host::runtime::bindings::retry::exports::pooler::plugins::turn_events::TurnFailedEvent;
use pooler_host::runtime::bindings::types::Provider;
use pooler_host::runtime::imports::threads::ThreadStatus;
use pooler_host::runtime::roles::Role;
use pooler_tests::fixtures;
use pooler_tests::harness::{START_MS, Setup, TestHost};

fn both(pool_settings: &str) -> TestHost {
    setup(pool_settings).start().unwrap()
}

fn setup(pool_settings: &str) -> Setup {
    Setup::new()
        .role(Role::AccountPool, fixtures::POOL, pool_settings)
        .role(Role::ProviderRetry, fixtures::RETRY, "")
}

/// Both fixtures, the pool with a short wall-time deadline (`deadline-ms`), its database
/// already created: creating one syncs files, which on a machine still writing out a
/// build can take longer than that deadline by itself. Created under the default deadline,
/// by one query, then the host restarts with the short one.
async fn both_with_deadline(deadline_ms: u64) -> TestHost {
    let mut host = both("");
    assert_eq!(ask(&host, "t1").await, "not-routed");
    host.restart_as(setup(&format!("deadline-ms = {deadline_ms}")))
        .await
        .unwrap();
    host
}

/// What Provider Retry's tick hears from the pool when it asks about `threads` (one, or
/// several comma-separated through `query-many`), as the retry fixture records it.
async fn ask(host: &TestHost, threads: &str) -> String {
    host.set_setting(Role::ProviderRetry, "query-thread", threads)
        .await
        .unwrap();
    retry_tick(host).await;
    host.setting(Role::ProviderRetry, "answer").await.unwrap()
}

async fn retry_tick(host: &TestHost) {
    let now = START_MS;
    host.host
        .call_retry("scheduler.on-tick", move |store, retry| {
            Box::pin(retry.pooler_plugins_scheduler().call_on_tick(store, now))
        })
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_signals_in_one_call_arrive_once_coalesced_after_the_call_returned() {
    let host = both("");
    // Before any tick the pool answers not-routed: the query reaches the pool.
    retry_tick(&host).await;
    assert_eq!(
        host.setting(Role::ProviderRetry, "answer").await.as_deref(),
        Some("not-routed")
    );

    // The pool's tick signals three times (account-added, hold-ended, account-added), then
    // records the tick time as the end of its call.
    let now = START_MS + 5_000;
    host.host.maintenance_tick(now).await.unwrap().unwrap();
    host.host.availability_changes_settled().await;

    let retry = |key: &'static str| host.setting(Role::ProviderRetry, key);
    assert_eq!(retry("deliveries").await.as_deref(), Some("1"));
    assert_eq!(
        retry("causes").await.as_deref(),
        Some("ChangeCause::AccountAdded,ChangeCause::HoldEnded")
    );
    assert_eq!(retry("provider").await.as_deref(), Some("Provider::Claude"));
    // Inside the delivery the listener asked the pool, which already had the record its
    // tick wrote last: the delivery came after the pool's call returned.
    assert_eq!(retry("answer").await, Some(format!("blocked@{now}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_traps_gets_the_change_again() {
    let host = both("");
    host.set_setting(Role::ProviderRetry, "listener-trap", "armed")
        .await
        .unwrap();
    host.host.maintenance_tick(START_MS).await.unwrap().unwrap();
    host.host.availability_changes_settled().await;
    assert_eq!(
        host.setting(Role::ProviderRetry, "listener-trap")
            .await
            .as_deref(),
        Some("fired")
    );
    assert_eq!(
        host.setting(Role::ProviderRetry, "deliveries")
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        host.setting(Role::ProviderRetry, "causes").await.as_deref(),
        Some("ChangeCause::AccountAdded,ChangeCause::HoldEnded")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_pool_availability_is_not_routed() {
    let host = Setup::new()
        .role(Role::ProviderRetry, fixtures::RETRY, "")
        .start()
        .unwrap();
    retry_tick(&host).await;
    assert_eq!(
        host.setting(Role::ProviderRetry, "answer").await.as_deref(),
        Some("not-routed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_traps_or_overruns_answers_source_unavailable_and_the_next_query_works() {
    let host = both_with_deadline(200).await;
    let unavailable = "unavailable:UnavailableReason::SourceUnavailable";
    assert_eq!(ask(&host, "trap").await, unavailable);
    assert_eq!(ask(&host, "spin").await, unavailable);
    assert_eq!(ask(&host, "t1").await, "not-routed");
}

/// `query-many` answers each query in order through one call into the pool; a pool that
/// traps, overruns or answers a list of another length gets `source-unavailable` for every
/// query, and the next call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_many_answers_in_order_or_source_unavailable_for_all() {
    let host = both_with_deadline(200).await;
    let ask = |threads| ask(&host, threads);
    let unavailable = "unavailable:UnavailableReason::SourceUnavailable";
    assert_eq!(ask("t1,t2").await, "not-routed;not-routed");
    for broken in ["t1,trap", "spin,t1", "t1,short,t2"] {
        let answers = ask(broken).await;
        assert!(
            answers.split(';').all(|a| a == unavailable) && answers.split(';').count() >= 2,
            "{broken}: {answers}"
        );
    }
    assert_eq!(ask("t1,t2,t3").await, "not-routed;not-routed;not-routed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_call_that_traps_names_the_plugin_and_the_call_and_the_next_call_works() {
    let host = both("");
    host.set_setting(Role::ProviderRetry, "listener-trap", "armed")
        .await
        .unwrap();
    let change = pooler_host::runtime::bindings::types::AvailabilityChange {
        provider: Provider::Codex,
        causes: vec![pooler_host::runtime::bindings::types::ChangeCause::ConfigChanged],
        earliest: pooler_host::runtime::bindings::types::Availability::Ready,
        detected_at: START_MS,
    };
    let call = |change: pooler_host::runtime::bindings::types::AvailabilityChange| {
        host.host.call_retry(
            "availability-listener.availability-changed",
            move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_availability_listener()
                        .call_availability_changed(store, &change)
                        .await
                })
            },
        )
    };
    let err = call(change.clone()).await.unwrap_err().to_string();
    assert!(
        err.contains(
            "plugin `provider-retry` trapped in `availability-listener.availability-changed`"
        ),
        "{err}"
    );
    call(change).await.unwrap().unwrap();
    assert_eq!(
        host.setting(Role::ProviderRetry, "provider")
            .await
            .as_deref(),
        Some("Provider::Codex")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_calls_reach_the_core_service_with_the_callers_id() {
    let host = Setup::new()
        .role(Role::ProviderRetry, fixtures::RETRY, "")
        .start()
        .unwrap();
    host.threads.add_thread("t1", ThreadStatus::Error, "r1");
    let event = TurnFailedEvent {
        thread: "t1".into(),
        provider: Provider::Claude,
        model: None,
        failed_request: "r1".into(),
        original_request: "r1".into(),
        attempt: 1,
        failed_at: START_MS,
        chain_started_at: START_MS,
        input_accepted: true,
        routed_by_pool: true,
        rate_limits: None,
        failure: None,
    };
    host.host
        .call_retry("turn-events.turn-failed", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_turn_events()
                    .call_turn_failed(store, &event)
                    .await
            })
        })
        .await
        .unwrap()
        .unwrap();
    let rows = host.threads.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].send_at, START_MS + 1000);
    assert_eq!(
        host.setting(Role::ProviderRetry, "row").await.as_deref(),
        Some("1")
    );

    let row = rows[0].clone();
    let verdict = host
        .host
        .call_retry("scheduler.before-dispatch", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_scheduler()
                    .call_before_dispatch(store, &row)
                    .await
            })
        })
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(verdict, DispatchVerdict::Proceed));
    let calls = host.threads.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            format!(
                "provider-retry: schedule-retry(t1, r1, {})",
                START_MS + 1000
            ),
            "provider-retry: get-thread(t1)".to_string(),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_into_provider_retry_are_made_one_at_a_time() {
    let logs = pooler_tests::logs::logs();
    let host = both("");
    host.set_setting(Role::ProviderRetry, "query-thread", "sleep")
        .await
        .unwrap();
    // A: a tick whose availability query holds it until the manual clock moves.
    let first = tokio::spawn({
        let host = host.host.clone();
        async move {
            host.call_retry("scheduler.on-tick", |store, retry| {
                Box::pin(
                    retry
                        .pooler_plugins_scheduler()
                        .call_on_tick(store, START_MS),
                )
            })
            .await
        }
    });
    logs.wait_for(std::time::Duration::from_secs(10), |l| {
        l.message == "availability sleeping"
    })
    .await
    .expect("the first call reached the pool");
    // B: queued behind A, so it reads what A wrote, not the state before A.
    let second = tokio::spawn({
        let host = host.host.clone();
        async move {
            host.call_retry("settings.get-setting", |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_get_setting(store, "answer")
                        .await
                })
            })
            .await
        }
    });
    tokio::task::yield_now().await;
    assert!(!second.is_finished());
    host.clock.advance(std::time::Duration::from_secs(10));
    first.await.unwrap().unwrap().unwrap();
    let answer = second.await.unwrap().unwrap().unwrap();
    assert_eq!(answer.value, "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maintenance_loop_ticks_the_pool_on_the_host_clock() {
    let logs = pooler_tests::logs::logs();
    let host = both("");
    let looping = tokio::spawn(
        host.host
            .clone()
            .run_maintenance(std::time::Duration::from_secs(10)),
    );
    let data_dir = host.data.path().display().to_string();
    let ticked = |now: u64| {
        let logs = logs.clone();
        async move {
            logs.wait_for(std::time::Duration::from_secs(10), |l| {
                l.message == "maintenance tick done"
                    && l.fields.get("now").is_some_and(|n| *n == now.to_string())
            })
            .await
        }
    };
    // At start-up, then each time the host clock passes the interval.
    assert!(
        ticked(START_MS).await.is_some(),
        "no tick at start ({data_dir})"
    );
    host.clock.advance(std::time::Duration::from_secs(10));
    assert!(
        ticked(START_MS + 10_000).await.is_some(),
        "no tick after the interval"
    );
    assert_eq!(
        host.setting(Role::AccountPool, "ticked").await,
        Some((START_MS + 10_000).to_string())
    );
    looping.abort();
}
