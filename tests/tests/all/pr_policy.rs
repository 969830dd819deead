//! Provider Retry scenarios PR-11 … PR-20 (spec `provider-retry.md` §6): the policy, the
//! gates, the history and the swap, with the real Account Pooler, the real Provider Retry
//! (or the alternative one of `fixtures/alt-retry`) and the host core, a scripted fake
//! upstream on 127.0.0.1 and the manual clock.

use std::time::Duration;

use pooler_core::{FailureCategory, FailureOrigin, Provider, ThreadStatus, TurnOutcomeKind};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    Credential, NewAccount, OauthCredential,
};
use pooler_host::runtime::bindings::retry::exports::pooler::plugins::retry_admin::{
    Action, ChainHistory, HistoryEntry, Trigger,
};
use pooler_host::runtime::bindings::types as wit;
use pooler_tests::core::{CoreHost, CoreSetup, success};
use pooler_tests::pool::reply;
use pooler_tests::upstream::Reply;

const SECOND: u64 = 1_000;
/// The default backoff base, reset buffer and jitter bound of Provider Retry.
const BACKOFF: u64 = 5 * SECOND;
const BUFFER: u64 = 15 * SECOND;
const JITTER: u64 = 30 * SECOND;

/// The entries of the one chain of a thread.
fn entries(histories: &[ChainHistory]) -> &[HistoryEntry] {
    assert_eq!(histories.len(), 1, "one chain: {histories:?}");
    &histories[0].entries
}

/// A Codex streaming reply that completes with `text`.
fn codex_success(text: &str) -> Reply {
    let delta = format!(r#"{{"type":"response.output_text.delta","delta":{text:?}}}"#);
    Reply::sse()
        .event(
            "response.created",
            r#"{"type":"response.created","response":{"id":"resp_1"}}"#,
        )
        .event("response.output_text.delta", &delta)
        .event(
            "response.completed",
            r#"{"type":"response.completed","response":{"id":"resp_1"}}"#,
        )
}

/// A Codex stream that starts, then reports `event` with `data` (a failure event).
fn codex_failure(event: &str, data: &str) -> Reply {
    Reply::sse()
        .event(
            "response.created",
            r#"{"type":"response.created","response":{"id":"resp_1"}}"#,
        )
        .event(event, data)
}

/// A Codex thread through the pool, with a Codex OAuth account in it.
async fn codex_thread(h: &CoreHost) -> String {
    h.set_pool(
        "codex-upstream-url",
        &format!("{}/backend-api/codex", h.upstream.url()),
    )
    .await;
    h.add_account(NewAccount {
        provider: wit::Provider::Codex,
        credential: Credential::Oauth(OauthCredential {
            access_token: "tok-x".into(),
            refresh_token: "refresh-x".into(),
            expires_at: None,
            chatgpt_account_id: Some("acct-x".into()),
        }),
        label: None,
        priority: None,
        options: None,
    })
    .await;
    h.link
        .new_thread(Provider::Codex, Some("gpt-test"))
        .await
        .expect("a Codex thread")
}

/// What one #4839 shape must give.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Exponential backoff of attempt 1: [now + base, now + 2 × base).
    Backoff,
    /// A rate limit the pool does not know of (it answered 2xx): the pool is ready, so
    /// now + buffer + jitter.
    Ready,
    /// A rate limit the pool holds the account for: no earlier than the pool's own hold.
    PoolHold,
    /// No retry.
    None,
}

/// One #4839 shape on a fresh host: the first turn fails with `failure`, the core's
/// classifier describes it (`category`, `status`), and Provider Retry's policy decides
/// `expect`; a scheduled retry is sent at its time and succeeds as attempt 2, the only one.
async fn shape(
    name: &str,
    codex: bool,
    failure: Reply,
    category: FailureCategory,
    status: Option<u16>,
    expect: Expect,
) {
    let h = CoreSetup::new().real_retry().start().await;
    let thread = if codex {
        codex_thread(&h).await
    } else {
        h.new_thread().await
    };
    h.upstream.push(failure);
    let first = h.send(&thread, "hello");
    h.settle().await;
    let failed_at = h.now();

    // The classifier kept what it knew (#4839: the status inside a Codex variant).
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 1, "{name}");
    let described = turns[0].failure.clone().expect("a failure description");
    assert_eq!(described.category, category, "{name}: {described:?}");
    assert_eq!(described.http_status, status, "{name}: {described:?}");
    assert_ne!(described.origin, FailureOrigin::Transport, "{name}");

    let rows = h.rows(&thread);
    let Some(row) = rows.first().cloned() else {
        assert!(matches!(expect, Expect::None), "{name}: no row");
        // Declined for good: nothing is watched, nothing is ever sent.
        let histories = h.explain(&thread).await;
        let last = entries(&histories).last().unwrap();
        assert!(matches!(last.action, Action::Declined), "{name}: {last:?}");
        assert_eq!(last.reason, "not-retryable", "{name}");
        assert!(h.candidates(Some(&thread)).await.is_empty(), "{name}");
        h.advance(Duration::from_secs(3_600)).await;
        assert_eq!(h.turns(&thread).len(), 1, "{name}");
        assert!(h.rows(&thread).is_empty(), "{name}");
        return;
    };
    assert_eq!(rows.len(), 1, "{name}");
    assert_eq!(row.attempt, 2, "{name}");
    match expect {
        Expect::Backoff => assert!(
            (failed_at + BACKOFF..failed_at + 2 * BACKOFF).contains(&row.send_at),
            "{name}: backoff row at +{} ms",
            row.send_at - failed_at
        ),
        Expect::Ready => assert!(
            (failed_at + BUFFER..failed_at + BUFFER + JITTER).contains(&row.send_at),
            "{name}: ready row at +{} ms",
            row.send_at - failed_at
        ),
        Expect::PoolHold => assert!(
            row.send_at >= failed_at + BUFFER,
            "{name}: row at +{} ms",
            row.send_at - failed_at
        ),
        Expect::None => panic!("{name}: a row was scheduled: {row:?}"),
    }

    // The retry goes at its time, once, and succeeds.
    h.upstream.push(if codex {
        codex_success("ok")
    } else {
        success("ok")
    });
    h.clock.set(row.send_at - 1);
    h.settle().await;
    assert_eq!(h.turns(&thread).len(), 1, "{name}: not before its time");
    h.clock.set(row.send_at);
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2, "{name}: one retry");
    assert_eq!(turns[1].attempt, 2, "{name}");
    assert_eq!(turns[1].original_request, first, "{name}");
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok), "{name}");
    assert!(h.rows(&thread).is_empty(), "{name}");
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Idle,
        "{name}"
    );
    // Nothing more is sent later.
    h.advance(Duration::from_secs(3_600)).await;
    assert_eq!(h.turns(&thread).len(), 2, "{name}");
}

/// PR-13: Gateway failures (#4839) through the real classifier and policy: Claude 429
/// without snapshot, Claude 502, Claude 503, Codex too-many-failed-attempts with 429, Codex
/// stream-disconnected with 502 → each gets one retry; HTTP 401 → none; 529 → backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_13_gateway_failures_each_get_one_retry_401_none_529_backoff() {
    use FailureCategory as C;
    shape(
        "claude 429 without snapshot",
        false,
        reply(429, &[]),
        C::RateLimit,
        Some(429),
        Expect::PoolHold,
    )
    .await;
    shape(
        "claude 502",
        false,
        reply(502, &[]),
        C::Internal,
        Some(502),
        Expect::Backoff,
    )
    .await;
    shape(
        "claude 503",
        false,
        reply(503, &[]),
        C::Internal,
        Some(503),
        Expect::Backoff,
    )
    .await;
    shape(
        "codex too-many-failed-attempts 429",
        true,
        codex_failure(
            "response.failed",
            r#"{"type":"response.failed","response":{"id":"resp_1","error":{"code":"too_many_failed_attempts","message":"exceeded retry limit, last status: 429 Too Many Requests","codexErrorInfo":{"responseTooManyFailedAttempts":{"httpStatusCode":429}}}}}"#,
        ),
        C::TooManyFailedAttempts,
        Some(429),
        Expect::Ready,
    )
    .await;
    shape(
        "codex stream-disconnected 502",
        true,
        codex_failure(
            "error",
            r#"{"type":"error","code":"stream_disconnected","message":"stream disconnected before completion: 502 Bad Gateway","codexErrorInfo":{"responseStreamDisconnected":{"httpStatusCode":502}}}"#,
        ),
        C::StreamDisconnected,
        Some(502),
        Expect::Backoff,
    )
    .await;
    shape(
        "claude 401",
        false,
        reply(401, &[]),
        C::Unauthorized,
        Some(401),
        Expect::None,
    )
    .await;
    shape(
        "claude 529",
        false,
        reply(529, &[]),
        C::Overloaded,
        Some(529),
        Expect::Backoff,
    )
    .await;
}

/// PR-20: Swap. The alternative Provider Retry (`fixtures/alt-retry`, a different and
/// simpler implementation of the same world) loads in the provider-retry role by
/// configuration only and receives the same events: `turn-failed`, the row's
/// `before-dispatch`, `turn-succeeded`; its admin export answers for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_20_an_alternative_provider_retry_loads_by_configuration_and_receives_the_events() {
    let h = CoreSetup::new().alt_retry().start().await;
    h.upstream.push(reply(429, &[]));
    let thread = h.new_thread().await;
    let first = h.send(&thread, "hello");
    h.settle().await;
    let failed_at = h.now();

    // Its own policy: a fixed retry 30 s after the failure, through the core's queue.
    let row = h.row(&thread);
    assert_eq!((row.attempt, row.send_at), (2, failed_at + 30 * SECOND));
    assert_eq!(row.reason, "alt-retry: rate-limit");
    let candidates = h.candidates(Some(&thread)).await;
    assert_eq!(candidates.len(), 1);
    assert_eq!(candidates[0].row, Some(row.id));

    h.upstream.push(success("ok"));
    h.clock.set(row.send_at);
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].attempt, 2);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));

    // The events it received, in order, as it recorded them.
    let histories = h.explain(&thread).await;
    assert_eq!(histories.len(), 1, "{histories:?}");
    assert_eq!(histories[0].original_request, first);
    let seen: Vec<(String, String)> = histories[0]
        .entries
        .iter()
        .map(|e| (format!("{:?}/{:?}", e.trigger, e.action), e.reason.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                format!("Trigger::Failure/Action::Scheduled({})", row.send_at),
                format!("scheduled row {} at {}", row.id, row.send_at)
            ),
            (
                "Trigger::Due/Action::Unchanged".to_owned(),
                format!("row {} attempt 2: proceed", row.id)
            ),
            (
                "Trigger::Dispatch/Action::Resolved".to_owned(),
                "attempt 2".to_owned()
            ),
        ]
    );
    // The host's other calls reach it too: `on-start`, and the pool's availability change
    // (an account added), as recorded in its own database.
    h.add_claude_key("sk-ant-api03-key-b").await;
    h.settle().await;
    let db = rusqlite::Connection::open(pooler_tests::harness::find_file(
        h.data.path(),
        "alt-retry.sqlite3",
    ))
    .unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let kinds: Vec<String> = db
        .prepare("SELECT kind FROM events ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("on-start"),
        "{kinds:?}"
    );
    for kind in ["turn-failed", "before-dispatch", "turn-succeeded"] {
        assert_eq!(kinds.iter().filter(|k| *k == kind).count(), 1, "{kinds:?}");
    }
    let change: String = db
        .query_row(
            "SELECT detail FROM events WHERE kind = 'availability-changed' ORDER BY id DESC",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(change.contains("AccountAdded"), "{change}");

    // It has no settings: the real plugin's are not there.
    assert!(
        h.host
            .call_retry("settings.get-setting", |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_get_setting(store, "attempt-cap")
                        .await
                })
            })
            .await
            .unwrap()
            .is_err()
    );
}

/// A Claude thread whose first pooled turn failed with `failure`; returns (thread, request).
async fn failed(h: &CoreHost, failure: Reply) -> (String, String) {
    h.upstream.push(failure);
    let thread = h.new_thread().await;
    let request = h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    (thread, request)
}

/// A thread whose turn streams until the test opens `gate`, holding a concurrency slot.
async fn busy_thread(h: &CoreHost, gate: &pooler_tests::upstream::Gate) -> String {
    let before = h.upstream_turns();
    h.upstream.push(
        Reply::sse()
            .event("message_start", r#"{"type":"message_start"}"#)
            .pause(gate)
            .event("message_stop", r#"{"type":"message_stop"}"#),
    );
    let busy = h.new_thread().await;
    h.send(&busy, "a long answer");
    h.wait_for("the long turn to start", |h| {
        h.upstream_turns() == before + 1
    })
    .await;
    busy
}

/// PR-11: Concurrency limit full when a row is due → the row waits (not gated, not lost)
/// and is dispatched through `before-dispatch` when a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_11_a_due_row_waits_for_a_free_slot() {
    let h = CoreSetup::new()
        .real_retry()
        .core("concurrency-limit = 1")
        .start()
        .await;
    let (thread, _) = failed(&h, reply(502, &[])).await;
    let row = h.row(&thread);
    let gate = pooler_tests::upstream::Gate::new();
    let busy = busy_thread(&h, &gate).await;

    h.clock.set(row.send_at);
    h.wait_for("the row to wait for a slot", |h| {
        h.rows(&thread).first().is_some_and(|r| r.waiting_for_slot)
    })
    .await;
    assert_eq!(h.turns(&thread).len(), 1);
    let histories = h.explain(&thread).await;
    assert!(
        !entries(&histories)
            .iter()
            .any(|e| matches!(e.trigger, Trigger::Due)),
        "not gated while waiting: {histories:?}"
    );

    h.upstream.push(success("ok"));
    gate.open();
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(
        (turns[1].attempt, turns[1].outcome),
        (2, Some(TurnOutcomeKind::Ok))
    );
    assert_eq!(h.turns(&busy)[0].outcome, Some(TurnOutcomeKind::Ok));
    let histories = h.explain(&thread).await;
    let due: Vec<_> = entries(&histories)
        .iter()
        .filter(|e| matches!(e.trigger, Trigger::Due))
        .collect();
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(matches!(due[0].action, Action::Dispatched(2)));
    assert!(
        h.show(&thread)
            .history
            .iter()
            .any(|e| e.action == "waiting-for-slot" && e.row == Some(row.id))
    );
}

/// PR-12: One live row: concurrent schedule attempts for one chain → one row, the others
/// refused with its id; a second schedule for a chain Provider Retry already scheduled is
/// refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_12_one_live_row_per_chain() {
    use pooler_host::runtime::imports::threads::ThreadsError;
    let h = CoreSetup::new().real_retry().start().await;
    let service = h.link.threads_service();

    // Provider Retry scheduled this chain: another schedule is refused.
    let (scheduled, failed_request) = failed(&h, reply(502, &[])).await;
    let row = h.row(&scheduled);
    assert!(matches!(
        service.schedule_retry("provider-retry", &scheduled, &failed_request, h.now() + 1, "again"),
        Err(ThreadsError::AlreadyQueued(id)) if id == row.id
    ));

    // An opted-out chain has no row: sixteen schedules at once make exactly one.
    let thread = h.new_thread().await;
    h.link.set_opt_out(&thread, true).unwrap();
    h.upstream.push(reply(502, &[]));
    let request = h.send(&thread, "hello");
    h.settle().await;
    assert!(h.rows(&thread).is_empty());
    let send_at = h.now() + 60_000;
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let (service, thread, request) = (service.clone(), thread.clone(), request.clone());
            tokio::task::spawn_blocking(move || {
                service.schedule_retry(
                    "provider-retry",
                    &thread,
                    &request,
                    send_at + i,
                    "concurrent",
                )
            })
        })
        .collect();
    let (mut created, mut refused) = (Vec::new(), Vec::new());
    for call in calls {
        match call.await.unwrap() {
            Ok(row) => created.push(row),
            Err(ThreadsError::AlreadyQueued(id)) => refused.push(id),
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
    }
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(refused.len(), 15);
    assert!(refused.iter().all(|id| *id == created[0].id));
    assert_eq!(h.rows(&thread).len(), 1);
    assert_eq!(h.rows(&scheduled).len(), 1);
}

/// PR-14: Retry-After honoured: a 503 with `Retry-After: 120` → sent no earlier than
/// +120 s (the later Retry-After wins over the backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_14_retry_after_is_honoured() {
    let h = CoreSetup::new().real_retry().start().await;
    let failure = reply(503, &[("retry-after".to_owned(), "120".to_owned())]);
    let (thread, _) = failed(&h, failure).await;
    let failed_at = h.now();
    let described = h.turns(&thread)[0].failure.clone().unwrap();
    assert_eq!(described.retry_after, Some(failed_at + 120 * SECOND));
    let row = h.row(&thread);
    assert_eq!((row.attempt, row.send_at), (2, failed_at + 120 * SECOND));

    h.upstream.push(success("ok"));
    h.clock.set(failed_at + 120 * SECOND - 1);
    h.settle().await;
    assert_eq!(h.upstream_turns(), 1, "not before +120 s");
    h.clock.set(failed_at + 120 * SECOND);
    h.settle().await;
    assert_eq!(h.upstream_turns(), 2);
    assert_eq!(h.turns(&thread)[1].outcome, Some(TurnOutcomeKind::Ok));
}

/// PR-15: Attempt cap: the fifth failure of a chain → `attempts-exhausted`, no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_15_the_fifth_failure_exhausts_the_attempts() {
    let h = CoreSetup::new().real_retry().start().await;
    let (thread, first) = failed(&h, reply(502, &[])).await;
    for attempt in 2..=5u32 {
        let row = h.row(&thread);
        assert_eq!(row.attempt, attempt);
        h.upstream.push(reply(502, &[]));
        h.clock.set(row.send_at);
        h.settle().await;
    }
    let turns = h.turns(&thread);
    let attempts: Vec<u32> = turns.iter().map(|t| t.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4, 5]);
    assert!(turns.iter().all(|t| t.original_request == first));
    assert!(h.rows(&thread).is_empty(), "no sixth dispatch");
    let histories = h.explain(&thread).await;
    let last = entries(&histories).last().unwrap();
    assert!(matches!(last.action, Action::Declined), "{last:?}");
    assert_eq!(last.reason, "attempts-exhausted");
    assert!(h.candidates(Some(&thread)).await.is_empty());
    h.advance(Duration::from_secs(3_600)).await;
    assert_eq!(h.upstream_turns(), 5);
}

/// PR-16: Opt-out: an opted-out thread gets no retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_16_an_opted_out_thread_gets_no_retry() {
    let h = CoreSetup::new().real_retry().start().await;
    let thread = h.new_thread().await;
    h.link.set_opt_out(&thread, true).unwrap();
    h.upstream.push(reply(502, &[]));
    h.send(&thread, "hello");
    h.settle().await;
    assert!(h.rows(&thread).is_empty());
    let histories = h.explain(&thread).await;
    let last = entries(&histories).last().unwrap();
    assert!(matches!(last.action, Action::Declined), "{last:?}");
    assert_eq!(last.reason, "opted-out");
    h.advance(Duration::from_secs(3_600)).await;
    assert_eq!(h.upstream_turns(), 1);
}

/// PR-18: History: `explain` shows the initial decision, each reschedule with old → new
/// time and its trigger, and the dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_18_explain_shows_every_decision_in_order() {
    let h = CoreSetup::new().real_retry().start().await;
    let b = h.add_claude_key("sk-ant-api03-key-b").await.id;
    h.disable_account(&b).await;
    let reset = h.now() + 2 * 3_600 * SECOND;
    let failure = reply(429, &pooler_tests::pool::five_hour_rejected(Some(reset)));
    let (thread, first) = failed(&h, failure).await;
    let t1 = h.row(&thread).send_at;

    h.enable_account(&b).await; // earlier
    h.settle().await;
    let t2 = h.row(&thread).send_at;
    h.advance(Duration::from_secs(5)).await;
    h.disable_account(&b).await; // later again
    h.settle().await;
    let t3 = h.row(&thread).send_at;
    h.advance(Duration::from_secs(5)).await;
    h.enable_account(&b).await; // earlier again
    h.settle().await;
    let t4 = h.row(&thread).send_at;
    assert!(t2 < t1 && t3 > t2 && t4 < t3, "{t1} {t2} {t3} {t4}");
    h.upstream.push(success("ok"));
    h.clock.set(t4);
    h.settle().await;
    assert_eq!(h.turns(&thread).len(), 2);

    let histories = h.explain(&thread).await;
    assert_eq!(histories[0].original_request, first);
    let shown: Vec<String> = entries(&histories)
        .iter()
        .filter(|e| !matches!(e.action, Action::Unchanged))
        .map(|e| {
            let trigger = match &e.trigger {
                Trigger::Signal(causes) if causes.contains(&wit::ChangeCause::AccountEnabled) => {
                    "signal(account enabled)".to_owned()
                }
                Trigger::Signal(causes) if causes.contains(&wit::ChangeCause::AccountDisabled) => {
                    "signal(account disabled)".to_owned()
                }
                Trigger::Signal(causes) => format!("signal({causes:?})"),
                other => format!("{other:?}"),
            };
            format!("{trigger} {:?}", e.action)
        })
        .collect();
    let expected = [
        format!("Trigger::Failure Action::Scheduled({t1})"),
        format!("signal(account enabled) Action::Rescheduled(({t1}, {t2}))"),
        format!("signal(account disabled) Action::Rescheduled(({t2}, {t3}))"),
        format!("signal(account enabled) Action::Rescheduled(({t3}, {t4}))"),
        "Trigger::Due Action::Dispatched(2)".to_owned(),
        "Trigger::Dispatch Action::Resolved".to_owned(),
    ];
    assert_eq!(shown, expected);
    // The availability each decision saw is kept with it.
    let first_entry = &entries(&histories)[0];
    assert!(
        matches!(first_entry.availability, Some(wit::Availability::Blocked(ref b)) if b.retry_at == reset),
        "{first_entry:?}"
    );
}

/// PR-19: Send-now by a person bypasses the gates (a full concurrency limit, the row's
/// time, `before-dispatch`) and is recorded in the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_19_send_now_bypasses_the_gates_and_is_recorded() {
    let h = CoreSetup::new()
        .real_retry()
        .core("concurrency-limit = 1")
        .start()
        .await;
    h.retry_set("backoff-base", "1h").await;
    let (thread, _) = failed(&h, reply(502, &[])).await;
    let row = h.row(&thread);
    assert!(row.send_at >= h.now() + 3_600 * SECOND);
    let gate = pooler_tests::upstream::Gate::new();
    let busy = busy_thread(&h, &gate).await;

    h.upstream.push(success("sent now"));
    let sent = h.link.send_now(&thread).await.unwrap();
    h.wait_for("the sent-now turn to finish", |h| {
        h.turns(&thread).get(1).is_some_and(|t| t.outcome.is_some())
    })
    .await;
    assert_eq!((sent.row, sent.attempt), (row.id, 2));
    assert!(sent.plugin_told);
    let turns = h.turns(&thread);
    assert_eq!(turns[1].trigger, pooler_core::TurnTrigger::SendNow);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert!(h.rows(&thread).is_empty());
    assert!(
        h.show(&thread)
            .history
            .iter()
            .any(|e| e.action == "send-now" && e.actor == "person" && e.row == Some(row.id))
    );
    gate.open();
    h.settle().await;
    assert_eq!(h.turns(&busy)[0].outcome, Some(TurnOutcomeKind::Ok));

    let histories = h.explain(&thread).await;
    let entries = entries(&histories);
    assert!(
        !entries.iter().any(|e| matches!(e.trigger, Trigger::Due)),
        "no gate was asked: {entries:?}"
    );
    assert!(
        entries.iter().any(|e| matches!(e.trigger, Trigger::Person)),
        "{entries:?}"
    );
}

/// PR-17: Durable events: Provider Retry fails while handling `turn-failed` (its database
/// cannot be opened, so the call fails) → the core keeps the event and delivers it again;
/// the retry is scheduled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pr_17_a_failed_delivery_is_redelivered_and_scheduled_once() {
    let h = CoreSetup::new().real_retry().start().await;
    // The retry waits long enough not to come due while the test waits for the redelivery.
    h.retry_set("backoff-base", "1h").await;
    let db = pooler_tests::harness::find_file(h.data.path(), "retry.sqlite3");
    let aside = db.with_extension("aside");
    let sidecars = ["-wal", "-shm"].map(|s| {
        let mut name = db.file_name().unwrap().to_os_string();
        name.push(s);
        db.with_file_name(name)
    });
    // Break the plugin's storage: its database path is a directory.
    std::fs::rename(&db, &aside).unwrap();
    for sidecar in &sidecars {
        if sidecar.exists() {
            let mut to = aside.clone().into_os_string();
            to.push(
                sidecar
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .trim_start_matches("retry.sqlite3"),
            );
            std::fs::rename(sidecar, to).unwrap();
        }
    }
    std::fs::create_dir(&db).unwrap();

    let (thread, first) = failed(&h, reply(502, &[])).await;
    assert!(h.rows(&thread).is_empty(), "not handled yet");
    // The core keeps the event, its failed deliveries counted.
    let pending = h
        .core()
        .pending_events(pooler_host::mediation::core_link::SUBSCRIBER, 10)
        .unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0].failed_deliveries >= 1, "{pending:?}");

    // Storage is back: the event is delivered again (within the redelivery pause).
    std::fs::remove_dir(&db).unwrap();
    std::fs::rename(&aside, &db).unwrap();
    for sidecar in &sidecars {
        let mut from = aside.clone().into_os_string();
        from.push(
            sidecar
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .trim_start_matches("retry.sqlite3"),
        );
        if std::path::Path::new(&from).exists() {
            std::fs::rename(&from, sidecar).unwrap();
        }
    }
    let mut waited = 0;
    while h.rows(&thread).is_empty() {
        assert!(waited < 120, "redelivered within two minutes of host time");
        h.advance(Duration::from_secs(1)).await;
        waited += 1;
    }
    let row = h.row(&thread);
    assert_eq!((row.attempt, &row.original_request), (2, &first));
    assert!(
        h.core()
            .pending_events(pooler_host::mediation::core_link::SUBSCRIBER, 10)
            .unwrap()
            .is_empty()
    );
    // Once: one decision in the history, one row; later passes change nothing.
    h.advance(Duration::from_secs(1)).await;
    assert_eq!(h.rows(&thread).len(), 1);
    let histories = h.explain(&thread).await;
    let failures: Vec<_> = entries(&histories)
        .iter()
        .filter(|e| matches!(e.trigger, Trigger::Failure))
        .collect();
    assert_eq!(failures.len(), 1, "{histories:?}");
    assert!(matches!(failures[0].action, Action::Scheduled(at) if at == row.send_at));

    h.upstream.push(success("ok"));
    h.clock.set(row.send_at);
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(
        (turns[1].attempt, turns[1].outcome),
        (2, Some(TurnOutcomeKind::Ok))
    );
}
