//! Account Pooler scenarios (spec `account-pool.md` §3 items 6–9, §6) about choosing among
//! accounts: the routing strategy spreads new conversations that start together and the
//! conversations that move off a spent account; a last-resort account serves only when the
//! others are refused; a full in-flight limit detours a request; an account whose extra
//! usage is denied is skipped once its family's window is spent, and the provider's "out of
//! extra usage" refusal fails over. The real pool in the real host, the strict fake upstream
//! on 127.0.0.1, the manual clock; accounts A, B, C.

use std::collections::BTreeMap;
use std::time::Duration;

use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountStatus, ExtraUsage, OptionsChange,
};
use pooler_tests::harness::START_MS;
use pooler_tests::pool::{OPUS, Pool, PoolSetup, SOON, five_hour_rejected, oauth, reply};
use pooler_tests::provider::claude;
use pooler_tests::upstream::{Gate, Reply};

fn ok() -> Reply {
    Reply::status(200)
        .header("content-type", "text/plain")
        .body("ok")
}

/// How many of the upstream's requests each account got.
fn counts(seen: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in seen {
        *counts.entry(s.clone()).or_insert(0) += 1;
    }
    counts
}

/// Six new conversations start together (every first request in flight at once, each in
/// its own instance) on three fresh accounts under `spread`: each account takes two. Under
/// fill-first they would all land on A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_new_conversations_spread_over_the_accounts() {
    const N: usize = 6;
    let pool = Pool::claude().await;
    pool.set("claude-strategy", "spread").await.unwrap();
    let gate = Gate::new();
    for _ in 0..N {
        pool.upstream.push(
            Reply::status(200)
                .header("content-type", "text/plain")
                .hold_head(&gate)
                .body("ok"),
        );
    }
    let mut tasks = Vec::new();
    for n in 0..N {
        let client = pool.client.clone();
        let request = pool.messages(&format!("new-{n}"));
        tasks.push(tokio::spawn(async move { client.send(request).await }));
    }
    tokio::time::timeout(SOON, pool.upstream.wait_for_hits(N))
        .await
        .expect("every first request reached the upstream while the others were in flight");
    gate.open();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status, 200);
    }
    let counts = counts(&pool.seen());
    assert_eq!(
        counts,
        BTreeMap::from([("A".into(), 2), ("B".into(), 2), ("C".into(), 2)]),
        "no account takes more than its share"
    );
    for n in 0..N {
        let session = format!("new-{n}");
        let pinned = pool.pinned(&session).await.expect("pinned");
        let explained = pool.explain(&session).await.unwrap();
        assert_eq!(explained.why, "pinned on first success", "{pinned}");
    }
}

/// The pool's default strategy is soonest-reset (the one the week simulator's figures
/// favour, docs/08): back at the default, new conversations on three fresh accounts take
/// one each where fill-first would put all three on A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_strategy_spreads_new_conversations() {
    let pool = Pool::claude().await;
    let setting = pool.set("claude-strategy", "fill-first").await.unwrap();
    assert_eq!(setting.default_value, "soonest-reset");
    pool.set("claude-strategy", &setting.default_value)
        .await
        .unwrap();
    for s in ["S1", "S2", "S3"] {
        assert_eq!(pool.send(pool.messages(s)).await.status, 200);
    }
    assert_eq!(pool.seen(), ["A", "B", "C"]);
}

/// The conversations of an account refused for a lasting reason move as they next send,
/// each by the strategy: spread over B and C, not herded onto B (fill-first's way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_moving_off_a_spent_account_spread() {
    let pool = Pool::claude().await;
    for s in ["S1", "S2"] {
        assert_eq!(pool.send(pool.messages(s)).await.status, 200);
    }
    assert_eq!(pool.seen(), ["A", "A"], "fill-first, the fixture's");
    pool.set("claude-strategy", "soonest-reset").await.unwrap();
    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(START_MS + 3_600_000))));
    for s in ["S1", "S2"] {
        assert_eq!(pool.send(pool.messages(s)).await.status, 200);
    }
    assert_eq!(pool.seen_after(2), ["A", "B", "C"]);
    assert_eq!(pool.pinned("S1").await.as_deref(), Some("B"));
    assert_eq!(pool.pinned("S2").await.as_deref(), Some("C"));
}

/// Conversations that move together (all in flight at once when their account is
/// disabled) take their fair share of the others each: two on B, two on C. Their pins move
/// only when each is served, so only the placements the pool records (shared by every
/// instance through the database) can tell the later ones where the earlier went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_moving_together_take_their_fair_share_each() {
    const N: usize = 4;
    let pool = Pool::claude().await;
    let sessions: Vec<String> = (0..N).map(|n| format!("S{n}")).collect();
    for s in &sessions {
        assert_eq!(pool.send(pool.messages(s)).await.status, 200);
    }
    assert_eq!(pool.seen(), ["A"; N]);
    pool.set("claude-strategy", "spread").await.unwrap();
    pool.disable("A").await;
    let gate = Gate::new();
    for _ in 0..N {
        pool.upstream.push(
            Reply::status(200)
                .header("content-type", "text/plain")
                .hold_head(&gate)
                .body("ok"),
        );
    }
    let mut tasks = Vec::new();
    for s in &sessions {
        let client = pool.client.clone();
        let request = pool.messages(s);
        tasks.push(tokio::spawn(async move { client.send(request).await }));
    }
    tokio::time::timeout(SOON, pool.upstream.wait_for_hits(2 * N))
        .await
        .expect("every mover reached the upstream while the others were in flight");
    gate.open();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status, 200);
    }
    assert_eq!(
        counts(&pool.seen_after(N)),
        BTreeMap::from([("B".into(), 2), ("C".into(), 2)])
    );
    let mut pinned = BTreeMap::new();
    for s in &sessions {
        *pinned.entry(pool.pinned(s).await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(pinned, BTreeMap::from([("B".into(), 2), ("C".into(), 2)]));
}

/// A last-resort account serves only when every other account is refused: a conversation
/// moves onto it, new conversations use it; once another account can serve, new
/// conversations leave it and the one pinned there stays (no lasting reason to move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_resort_account_serves_only_when_the_others_are_refused() {
    let pool = PoolSetup::claude_keys(2).start().await;
    pool.set("claude-strategy", "spread").await.unwrap();
    let info = pool
        .update_options(
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
    assert!(info.options.last_resort);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["B"], "skipped while B is eligible");

    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(START_MS + 60_000))));
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(1), ["B", "A"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
    assert_eq!(pool.availability("t1", None).await, "ready", "it counts");
    assert_eq!(pool.send(pool.messages("N")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["A"]);

    pool.advance(Duration::from_secs(61));
    assert_eq!(pool.send(pool.messages("M")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["B", "A"]);
}

/// An account at its in-flight limit is passed over: while one request of S is in flight
/// on A (limit 1), the next goes to B as a detour (S stays pinned to A); once the first
/// has been relayed, A takes S again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_an_accounts_in_flight_limit_detours() {
    let pool = Pool::claude().await;
    pool.update_options(
        "A",
        OptionsChange {
            last_resort: None,
            extra_usage: None,
            max_in_flight: Some(1),
            preserve: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    let gate = Gate::new();
    pool.upstream.push(
        Reply::status(200)
            .header("content-type", "text/plain")
            .hold_head(&gate)
            .body("first"),
    );
    let first = tokio::spawn({
        let client = pool.client.clone();
        let request = pool.messages("S");
        async move { client.send(request).await }
    });
    tokio::time::timeout(SOON, pool.upstream.wait_for_hits(2))
        .await
        .unwrap();
    pool.upstream.push(ok());
    let second = pool.send(pool.messages("S")).await;
    assert_eq!(second.status, 200);
    assert_eq!(pool.seen(), ["A", "A", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("A"));
    let explained = pool.explain("S").await.unwrap();
    assert_eq!(explained.recent.last().unwrap().outcome.as_str(), "detour");
    gate.open();
    assert_eq!(first.await.unwrap().unwrap().body, "first");
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen_after(3), ["A"], "the lease ended with the relay");
}

/// `extra-usage = deny` (the default): A served an Opus request on paid overage (its
/// `7d_opus` window rejected, overage allowed); the next Opus request skips A. With
/// `allow`, A serves Opus again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_usage_deny_account_whose_family_window_is_spent_is_skipped() {
    let pool = Pool::claude().await;
    let week = ((START_MS + 7 * 86_400_000) / 1000).to_string();
    pool.upstream.push(
        Reply::status(200)
            .header("content-type", "text/plain")
            .header("anthropic-ratelimit-unified-status", "allowed")
            .header("anthropic-ratelimit-unified-7d_opus-status", "rejected")
            .header("anthropic-ratelimit-unified-7d_opus-utilization", "1.0")
            .header("anthropic-ratelimit-unified-7d_opus-reset", &week)
            .header("anthropic-ratelimit-unified-overage-status", "allowed")
            .body("on overage"),
    );
    assert_eq!(pool.send(pool.messages_for("S", OPUS)).await.status, 200);
    assert_eq!(pool.send(pool.messages_for("S", OPUS)).await.status, 200);
    assert_eq!(pool.seen(), ["A", "B"]);
    let a = pool.account("A").await;
    assert_eq!(a.options.extra_usage, ExtraUsage::Deny);
    assert!(a.windows.iter().any(|w| w.name == "7d_opus" && w.blocking));

    pool.update_options(
        "A",
        OptionsChange {
            last_resort: None,
            extra_usage: Some(ExtraUsage::Allow),
            max_in_flight: None,
            preserve: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(pool.send(pool.messages_for("S", OPUS)).await.status, 200);
    assert_eq!(pool.seen_after(2), ["A"]);
    assert!(
        !pool
            .account("A")
            .await
            .windows
            .iter()
            .any(|w| w.name == "7d_opus" && w.blocking),
        "covered by the overage now"
    );
}

/// The provider's "You're out of extra usage" refusal of a subscription is a lasting
/// refusal of that account for that family: the client never sees the 400, the
/// conversation moves to B, and A is left alone for Opus (its Sonnet still serves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_extra_usage_fails_over_and_refuses_the_family() {
    let far = Some(START_MS + 30 * 86_400_000);
    let pool = PoolSetup::new(pooler_host::runtime::bindings::types::Provider::Claude)
        .account(oauth(
            pooler_host::runtime::bindings::types::Provider::Claude,
            "A",
            far,
        ))
        .account(oauth(
            pooler_host::runtime::bindings::types::Provider::Claude,
            "B",
            far,
        ))
        .start()
        .await;
    assert_eq!(pool.send(pool.messages("T")).await.status, 200);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    pool.upstream.push(claude::out_of_extra_usage());
    let answer = pool.send(pool.messages_for("S", OPUS)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.seen(), ["A", "A", "A", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"), "moved");
    let explained = pool.explain("S").await.unwrap();
    assert!(explained.why.contains("(quota)"), "{}", explained.why);
    let a = pool.account("A").await;
    assert_eq!(a.status, AccountStatus::Ready);
    let refused = a.windows.iter().find(|w| w.name == "extra-usage").unwrap();
    assert_eq!(refused.family.as_deref(), Some("opus"));
    assert!(refused.blocking);
    assert_eq!(pool.send(pool.messages_for("T", OPUS)).await.status, 200);
    assert_eq!(pool.send(pool.messages("T")).await.status, 200);
    assert_eq!(pool.seen_after(4), ["B", "A"], "Opus skips A, Sonnet stays");
    assert_eq!(pool.pinned("T").await.as_deref(), Some("A"));
}
