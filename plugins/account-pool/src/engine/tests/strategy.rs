//! The routing strategies, paced movers, last-resort accounts, in-flight limits and the
//! extra-usage switch, through the engine.

use super::scenarios::quota_reject;
use super::*;
use crate::model::{AccountStatus, OptionsChange};

fn strategy(p: &Pool, s: &str) {
    p.admin().set_setting("claude-strategy", s).unwrap();
}

fn options(p: &Pool, label: &str, change: OptionsChange) {
    p.admin().update_options(&p.id(label), change).unwrap();
}

fn pool(labels: &[&str]) -> Pool {
    let p = Pool::new();
    for l in labels {
        p.add_key(l);
    }
    p
}

/// A served answer whose unified headers say the 5-hour window is `used` spent.
fn served_at(used: f64) -> Reply {
    Reply::Status(
        200,
        vec![
            ("content-type", "application/json".into()),
            (
                "anthropic-ratelimit-unified-5h-utilization",
                used.to_string(),
            ),
            ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
            (
                "anthropic-ratelimit-unified-5h-reset",
                ((T0 + 3_600_000) / 1000).to_string(),
            ),
        ],
        r#"{"ok":true}"#.into(),
    )
}

/// spread: a new conversation goes to the account with the most left; conversations that
/// start together (within a minute) spread one per account before any takes a second; a
/// pinned conversation stays home whatever the ranking says.
#[test]
fn spread_places_new_conversations_by_capacity_and_spreads_a_burst() {
    let p = pool(&["a", "b", "c"]);
    strategy(&p, "spread");
    p.up.set("a", served_at(0.5));
    p.up.set("b", served_at(0.3));
    p.up.set("c", served_at(0.9));
    for s in ["S1", "S2", "S3", "S4"] {
        assert_eq!(p.claude(Some(s)).status, 200);
    }
    assert_eq!(
        p.up.seen(),
        ["a", "b", "c", "b"],
        "the first by order (nothing known), then one each, then the most left"
    );
    p.env.advance(61_000);
    assert_eq!(p.claude(Some("S5")).status, 200);
    assert_eq!(p.claude(Some("S3")).status, 200);
    assert_eq!(
        p.up.seen(),
        ["a", "c"],
        "b holds two conversations (0.7 / 3 each), a one (0.5 / 2); S3 stays on c"
    );
    let lines = p.env.request_lines();
    assert_eq!(lines[0]["why"], "strategy");
    assert_eq!(lines.last().unwrap()["why"], "pinned");
}

/// A pool nobody configured places by soonest-reset (the default the week simulator's
/// figures chose): new conversations on fresh accounts spread, none piles onto the first.
#[test]
fn an_unconfigured_pool_spreads_new_conversations_by_soonest_reset() {
    let p = Pool::unconfigured(NativeDb::memory());
    for l in ["a", "b", "c"] {
        p.add_key(l);
    }
    for s in ["S1", "S2", "S3"] {
        assert_eq!(p.claude(Some(s)).status, 200);
    }
    assert_eq!(p.up.seen(), ["a", "b", "c"]);
    let strategy = p.admin().get_setting("claude-strategy").unwrap();
    assert_eq!(strategy.value, "soonest-reset");
}

/// fill-first keeps today's cursor: every new conversation on the cursor account.
#[test]
fn fill_first_piles_new_conversations_on_the_cursor() {
    let p = pool(&["a", "b", "c"]);
    for s in ["S1", "S2", "S3", "S4"] {
        p.claude(Some(s));
    }
    assert_eq!(p.up.seen(), ["a", "a", "a", "a"]);
}

/// When an account is refused for a lasting reason, its conversations move one by one as
/// they next send, each by the strategy: spread over the others, not all onto the next
/// account (fill-first's herd).
#[test]
fn movers_of_a_spent_account_spread_instead_of_herding() {
    for (s, want) in [
        ("spread", vec!["b", "c", "d"]),
        ("soonest-reset", vec!["b", "c", "d"]),
        ("fill-first", vec!["b", "b", "b"]),
    ] {
        let p = pool(&["a", "b", "c", "d"]);
        for conv in ["S1", "S2", "S3"] {
            p.claude(Some(conv));
        }
        assert_eq!(p.up.seen(), ["a", "a", "a"]);
        strategy(&p, s);
        p.up.push("a", quota_reject("5h", T0 + 3_600_000));
        let mut moved = Vec::new();
        for conv in ["S1", "S2", "S3"] {
            assert_eq!(p.claude(Some(conv)).status, 200);
            moved.push(p.pinned(Provider::Claude, conv).unwrap());
        }
        assert_eq!(moved, want, "{s}");
        let tried = p.up.seen();
        assert_eq!(tried[0], "a", "{s}");
        assert_eq!(tried[1..], want, "{s}: the others knew a was spent");
    }
}

/// A last-resort account serves only when every other account is refused — a
/// conversation moves there, and so do new ones — and new conversations leave it as soon
/// as another account can serve, while the one pinned there stays until its next lasting
/// reason.
#[test]
fn a_last_resort_account_serves_only_when_the_others_are_refused() {
    for s in ["fill-first", "spread", "soonest-reset"] {
        let p = pool(&["reserve", "b"]);
        strategy(&p, s);
        options(
            &p,
            "reserve",
            OptionsChange {
                last_resort: Some(true),
                ..OptionsChange::default()
            },
        );
        p.claude(Some("S"));
        assert_eq!(p.up.seen(), ["b"], "{s}: skipped while b is eligible");
        p.up.push("b", quota_reject("5h", T0 + 60_000));
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["b", "reserve"], "{s}");
        assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("reserve"));
        p.claude(Some("N"));
        assert_eq!(p.up.seen(), ["reserve"], "{s}: nothing else can serve");
        p.env.advance(61_000);
        p.claude(Some("M"));
        p.claude(Some("S"));
        assert_eq!(
            p.up.seen(),
            ["b", "reserve"],
            "{s}: a new conversation leaves it; the pinned one stays"
        );
    }
}

/// An account at its in-flight limit is passed over: a pinned conversation detours (its
/// pin stays); when every eligible account is full the request waits inline, then gets
/// the pool's 429; a lease is ended once the answer is relayed, and at once when the
/// attempt failed.
#[test]
fn a_full_in_flight_limit_detours_then_waits_inline() {
    let p = pool(&["a", "b"]);
    let one = OptionsChange {
        max_in_flight: Some(1),
        ..OptionsChange::default()
    };
    options(&p, "a", one);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.store().flight_leases(&p.id("a"), T0).unwrap(), 0, "ended");
    p.up.seen();
    // Another request is in flight on a.
    assert!(
        p.store()
            .take_flight_lease(&p.id("a"), 1, "other", T0)
            .unwrap()
    );
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["b"], "a detour: a was never called");
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    options(&p, "b", one);
    assert!(
        p.store()
            .take_flight_lease(&p.id("b"), 1, "other-b", T0)
            .unwrap()
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 429);
    assert!(r.body.contains("in-flight limit"), "{}", r.body);
    assert_eq!(r.headers.get("x-pooler-origin"), Some("pool"));
    assert!(p.up.seen().is_empty());
    let waited: u64 = p.env.sleeps.borrow().iter().sum();
    assert_eq!(waited, 20_000, "the inline wait, no more");
    p.store().end_flight_lease("other").unwrap();
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"], "home again once a frees");
    // A failed attempt ends its lease at once.
    p.up.push("a", status(503));
    p.up.push("a", status(503));
    p.up.push("a", status(503));
    p.store().end_flight_lease("other-b").unwrap();
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
    assert_eq!(p.store().flight_leases(&p.id("a"), p.env.now()).unwrap(), 0);
    assert_eq!(p.store().flight_leases(&p.id("b"), p.env.now()).unwrap(), 0);
}

/// The answer served by the last free account while a waiting request slept gets it.
#[test]
fn a_request_waiting_for_a_full_limit_is_served_when_a_lease_expires() {
    let p = pool(&["a"]);
    options(
        &p,
        "a",
        OptionsChange {
            max_in_flight: Some(1),
            ..OptionsChange::default()
        },
    );
    // A lease left by a request that died: it expires within the wait.
    let now = p.env.now();
    assert!(
        p.store()
            .take_flight_lease(&p.id("a"), 1, "dead", now + 500 - FLIGHT_LEASE_MS)
            .unwrap()
    );
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    assert!(p.env.sleeps.borrow().iter().sum::<u64>() >= 500);
}

fn opus(p: &Pool, session: &str) -> Resp {
    p.send(p.claude_req(Some(session), "claude-opus-4-1"))
}

/// `extra-usage = deny` (the default): an account whose opus window is spent is skipped
/// for opus even though its headers offer paid overage; `allow` lets it serve.
#[test]
fn a_denied_extra_usage_account_whose_family_window_is_spent_is_skipped() {
    let p = pool(&["a", "b"]);
    p.up.push(
        "a",
        Reply::Status(
            200,
            vec![
                ("content-type", "application/json".into()),
                (
                    "anthropic-ratelimit-unified-7d_opus-status",
                    "rejected".into(),
                ),
                (
                    "anthropic-ratelimit-unified-7d_opus-reset",
                    ((T0 + 3_600_000) / 1000).to_string(),
                ),
                (
                    "anthropic-ratelimit-unified-overage-status",
                    "allowed".into(),
                ),
            ],
            r#"{"ok":true}"#.into(),
        ),
    );
    assert_eq!(opus(&p, "S").status, 200);
    assert_eq!(opus(&p, "S").status, 200);
    assert_eq!(
        p.up.seen(),
        ["a", "b"],
        "the spent opus window counts as spent"
    );
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"], "other families serve");
    options(
        &p,
        "a",
        OptionsChange {
            extra_usage: Some(true),
            ..OptionsChange::default()
        },
    );
    assert_eq!(opus(&p, "S").status, 200);
    assert_eq!(p.up.seen(), ["a"], "allowed: the overage covers it");
}

fn claude_error(status: u16, kind: &str, message: &str) -> Reply {
    Reply::Status(
        status,
        vec![("content-type", "application/json".into())],
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string(),
    )
}

/// "You're out of extra usage" is the provider's billing refusing the account for that
/// family: the conversation fails over and moves (never sees the 400), the account is
/// left alone for that family until the reset, and serves its other families.
#[test]
fn an_out_of_extra_usage_refusal_fails_over_and_refuses_that_family() {
    let p = Pool::new();
    for l in ["a", "b"] {
        p.add_oauth(Provider::Claude, l, l, Some(T0 + 86_400_000));
    }
    p.admin().set_setting("pin-lifetime", "2h").unwrap();
    p.claude(Some("T"));
    p.up.seen();
    p.up.push(
        "a",
        claude_error(
            400,
            "invalid_request_error",
            "You're out of extra usage. Add more at claude.ai/settings/usage and keep going.",
        ),
    );
    let r = opus(&p, "S");
    assert_eq!((r.status, r.body.as_str()), (200, r#"{"ok":true}"#));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(
        p.pinned(Provider::Claude, "S").as_deref(),
        Some("b"),
        "moved"
    );
    let a = p
        .admin()
        .list(None)
        .unwrap()
        .into_iter()
        .find(|x| x.id == p.id("a"))
        .unwrap();
    let w = a.windows.iter().find(|w| w.name == "extra-usage").unwrap();
    assert_eq!(w.family.as_deref(), Some(Family::Opus.as_str()));
    assert!(w.blocking);
    assert_eq!(
        w.resets_at,
        Some(T0 + 3_600_000),
        "an hour, as no reset was given"
    );
    assert_eq!(
        a.status,
        AccountStatus::Ready,
        "a family limit keeps its status"
    );
    p.claude(Some("T"));
    opus(&p, "T");
    assert_eq!(
        p.up.seen(),
        ["a", "b"],
        "sonnet on a; opus skips a without a call"
    );
    // Extra usage allowed does not cover the billing's own refusal.
    options(
        &p,
        "a",
        OptionsChange {
            extra_usage: Some(true),
            ..OptionsChange::default()
        },
    );
    opus(&p, "T");
    assert_eq!(p.up.seen(), ["b"]);
    p.env.advance(3_600_000);
    opus(&p, "T");
    assert_eq!(p.up.seen(), ["a"], "tried again after the recheck time");
}

/// An API organisation out of credits ("Your credit balance is too low…") puts the key in
/// error and fails over; any other 400 is relayed as is, body whole.
#[test]
fn a_spent_credit_balance_puts_an_api_key_in_error_and_other_400s_pass() {
    let p = pool(&["a", "b"]);
    p.up.push(
        "a",
        claude_error(
            400,
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        ),
    );
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.status_of("a"), AccountStatus::Error);
    let plain = json!({"type": "error", "error": {"type": "invalid_request_error",
                       "message": "x".repeat(6000)}})
    .to_string();
    let parts = vec![
        plain[..3000].to_owned(),
        plain[3000..5000].to_owned(),
        plain[5000..].to_owned(),
    ];
    p.up.push(
        "b",
        Reply::Chunked(
            400,
            vec![("content-type", "application/json".into())],
            parts,
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"].as_str().unwrap().len(), 6000);
    assert_eq!(p.up.seen(), ["b"]);
}

/// A 402 is the billing's whatever its body says.
#[test]
fn a_402_fails_over() {
    let p = pool(&["a", "b"]);
    p.up.push("a", status(402));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
}
