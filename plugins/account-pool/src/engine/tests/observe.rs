//! What a person sees of each request: its one log line ([`REQUEST_MESSAGE`]) and the
//! metrics reported through the port.

use super::scenarios::quota_reject;
use super::*;
use std::collections::BTreeMap;

/// The last per-request line, with every field.
fn last_line(p: &Pool) -> BTreeMap<String, String> {
    p.env
        .request_lines()
        .pop()
        .expect("a per-request line was logged")
}

fn counter(p: &Pool, name: &str, labels: &[(&str, &str)]) -> u64 {
    p.env.metrics.counter(name, labels)
}

const FIELDS: [&str; 10] = [
    "thread",
    "provider",
    "session",
    "account",
    "why",
    "attempts",
    "outcome",
    "status",
    "upstream_ms",
    "added_ms",
];

#[test]
fn a_served_request_logs_one_line_with_every_field_and_counts_itself() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    let lines = p.env.request_lines();
    assert_eq!(lines.len(), 1, "one line per request");
    let line = &lines[0];
    assert_eq!(line.keys().map(String::as_str).collect::<Vec<_>>(), {
        let mut f = FIELDS.to_vec();
        f.sort();
        f
    });
    let a = p.id("a");
    assert_eq!(line["thread"], "t1");
    assert_eq!(line["provider"], "claude");
    assert_eq!(line["account"], a);
    assert_eq!(line["attempts"], format!("{a}:200:0"));
    assert_eq!(line["outcome"], "served");
    assert_eq!(line["status"], "200");
    assert_eq!(
        (line["upstream_ms"].as_str(), line["added_ms"].as_str()),
        ("0", "0")
    );
    assert!(
        ["pinned", "inherited", "cursor", "next"].contains(&line["why"].as_str()),
        "{line:?}"
    );
    let session = &line["session"];
    assert!(
        session.len() == 8 && session.bytes().all(|b| b.is_ascii_hexdigit()),
        "{session}"
    );
    // The same session hashes the same; another differently.
    p.claude(Some("S"));
    assert_eq!(last_line(&p)["session"], *session);
    assert_eq!(last_line(&p)["why"], "pinned");
    p.claude(Some("T"));
    assert_ne!(last_line(&p)["session"], *session);

    let served = [
        ("provider", "claude"),
        ("account", a.as_str()),
        ("outcome", "served"),
    ];
    assert_eq!(counter(&p, "pooler_pool_requests_total", &served), 3);
    assert_eq!(counter(&p, "pooler_pool_attempts_total", &served), 3);
    assert_eq!(
        p.env
            .metrics
            .counter_sum("pooler_pool_same_account_retries_total"),
        0
    );
    assert_eq!(
        p.env.metrics.counter_sum("pooler_pool_own_responses_total"),
        0
    );
    let added = p.env.metrics.observed("pooler_pool_added_latency_seconds");
    assert_eq!(added.len(), 3);
    assert_eq!(added[0].0, [("provider".to_owned(), "claude".to_owned())]);
}

/// AP-2's path: the pin fails transiently three times (two same-account retries, with 250 ms
/// and 1 s of backoff), then another account serves as a detour.
#[test]
fn retries_a_detour_and_the_added_latency_are_reported() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.set("a", status(503));
    assert_eq!(p.claude(Some("S")).status, 200);
    let (a, b) = (p.id("a"), p.id("b"));
    let line = last_line(&p);
    assert_eq!(
        line["attempts"],
        format!("{a}:503:0,{a}:503:0,{a}:503:0,{b}:200:0")
    );
    assert_eq!(line["outcome"], "detour");
    assert_eq!(line["account"], b);
    assert_eq!(
        line["added_ms"], "1250",
        "the backoffs are the pool's own time"
    );
    assert_eq!(line["upstream_ms"], "0");
    let claude = ("provider", "claude");
    assert_eq!(
        counter(
            &p,
            "pooler_pool_same_account_retries_total",
            &[claude, ("account", &a)]
        ),
        2
    );
    assert_eq!(counter(&p, "pooler_pool_detours_total", &[claude]), 1);
    assert_eq!(counter(&p, "pooler_pool_failovers_total", &[claude]), 1);
    assert_eq!(
        counter(
            &p,
            "pooler_pool_attempts_total",
            &[claude, ("account", &a), ("outcome", "transient")]
        ),
        1
    );
    assert_eq!(
        counter(
            &p,
            "pooler_pool_requests_total",
            &[claude, ("account", &b), ("outcome", "detour")]
        ),
        1
    );
    let added = p.env.metrics.observed("pooler_pool_added_latency_seconds");
    assert_eq!(added.last().unwrap().1, 1.25);
}

/// AP-10's path: every account exhausted, the pool answers its own 429.
#[test]
fn the_pools_own_429_is_counted() {
    let p = Pool::new();
    p.add_key("a");
    p.up.push("a", quota_reject("5h", T0 + 60_000));
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 429);
    let line = last_line(&p);
    assert_eq!(line["outcome"], "failed");
    assert_eq!(line["status"], "429");
    let claude = ("provider", "claude");
    assert_eq!(
        counter(
            &p,
            "pooler_pool_own_responses_total",
            &[claude, ("status", "429")]
        ),
        1
    );
    // The repeat makes no upstream call: the pool's 429 again, no attempt listed.
    p.claude(Some("S"));
    assert_eq!(last_line(&p)["attempts"], "");
    assert_eq!(
        counter(
            &p,
            "pooler_pool_own_responses_total",
            &[claude, ("status", "429")]
        ),
        2
    );
}

#[test]
fn a_refused_request_is_logged_and_counted_as_refused() {
    let p = Pool::abc();
    let mut req = p.claude_req(Some("S"), "claude-sonnet-4-5");
    req.headers = Headers::from([("authorization", "Bearer not-a-route-token")]);
    assert_eq!(p.send(req).status, 401);
    let line = last_line(&p);
    assert_eq!(line["outcome"], "refused");
    assert_eq!(line["account"], "none");
    assert!(
        p.env
            .logs
            .borrow()
            .iter()
            .all(|l| !l.contains("not-a-route-token"))
    );
    assert_eq!(
        counter(
            &p,
            "pooler_pool_own_responses_total",
            &[("provider", "claude"), ("status", "401")]
        ),
        1
    );
    assert_eq!(
        counter(
            &p,
            "pooler_pool_requests_total",
            &[
                ("provider", "claude"),
                ("account", "none"),
                ("outcome", "refused")
            ]
        ),
        1
    );
}

#[test]
fn a_cancelled_request_is_counted() {
    let p = Pool::abc();
    p.up.delays.borrow_mut().insert("a".into(), 5);
    p.up.leave_during_call(1);
    assert_eq!(p.claude(Some("S")).status, 499);
    let line = last_line(&p);
    assert_eq!(line["outcome"], "cancelled");
    assert_eq!(line["attempts"], format!("{}:transport:0", p.id("a")));
    assert_eq!(
        counter(&p, "pooler_pool_cancels_total", &[("provider", "claude")]),
        1
    );
}

/// The session key and the credentials never appear in the line: only the key's hash.
#[test]
fn the_line_has_no_session_key_and_no_credential() {
    let p = Pool::new();
    p.add_key("sk-ant-api03-very-secret-key");
    let session = "0b7e5d3c-session-key-that-may-be-sensitive";
    assert_eq!(p.claude(Some(session)).status, 200);
    let logs = p.env.logs.borrow().join("\n");
    for secret in [
        session,
        "sk-ant-api03-very-secret-key",
        p.claude_token.as_str(),
    ] {
        assert!(!logs.contains(secret), "{secret} in {logs}");
    }
    assert_eq!(p.env.request_lines().len(), 1);
}
