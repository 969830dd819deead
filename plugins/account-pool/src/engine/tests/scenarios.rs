//! Every AP scenario of the spec (AP-1 to AP-24) at the unit level.

use super::*;

pub(super) fn quota_reject(window: &str, reset_ms: u64) -> Reply {
    let prefix = "anthropic-ratelimit-unified-";
    Reply::Status(
        429,
        vec![
            (
                Box::leak(format!("{prefix}{window}-status").into_boxed_str()),
                "rejected".into(),
            ),
            (
                Box::leak(format!("{prefix}{window}-reset").into_boxed_str()),
                (reset_ms / 1000).to_string(),
            ),
        ],
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"limit"}}"#.into(),
    )
}

/// AP-1: a session stays on its account while that account is eligible.
#[test]
fn ap1_session_sticks_to_its_account() {
    let p = Pool::abc();
    for _ in 0..3 {
        assert_eq!(p.claude(Some("S")).status, 200);
    }
    assert_eq!(p.up.seen(), ["a", "a", "a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// AP-2 (#6990): for each transient failure, the pinned account is retried with backoff,
/// another serves as a detour, and the next request goes home to the pinned account.
#[test]
fn ap2_pinned_session_returns_home_after_each_transient_failure() {
    let failures = [
        status(408),
        status(500),
        status(502),
        status(503),
        status(504),
        status(529),
        Reply::Drop,
    ];
    for failure in failures {
        let p = Pool::abc();
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a"]);
        p.up.set("a", failure.clone());
        assert_eq!(p.claude(Some("S")).status, 200, "{failure:?}");
        assert_eq!(
            p.up.seen(),
            ["a", "a", "a", "b"],
            "{failure:?}: retried twice, then a detour"
        );
        assert_eq!(
            *p.env.sleeps.borrow(),
            [250, 1_000],
            "{failure:?}: backoff 250 ms then 1 s"
        );
        p.up.clear("a");
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a"], "{failure:?}: home first and only");
        assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
        assert_eq!(
            p.cursor().as_deref(),
            Some("a"),
            "{failure:?}: the cursor did not move"
        );
    }
}

/// A provider-wide overload: every account answers 529. The request gives up after three
/// accounts failed it (each retried on itself first) instead of trying all five, and the
/// client gets the overload to retry; nothing moves.
#[test]
fn a_provider_wide_overload_stops_after_three_accounts() {
    let p = Pool::new();
    for l in ["a", "b", "c", "d", "e"] {
        p.add_key(l);
    }
    assert_eq!(p.claude(Some("S")).status, 200);
    p.up.seen();
    for l in ["a", "b", "c", "d", "e"] {
        p.up.set(l, status(529));
    }
    assert_eq!(p.claude(Some("S")).status, 529);
    assert_eq!(
        p.up.seen(),
        ["a", "a", "a", "b", "b", "b", "c", "c", "c"],
        "three accounts, three tries each; d and e untouched"
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    // One account in trouble alone is still detoured around.
    p.up.clear("b");
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
}

/// AP-3: a longer outage detours every request (each trying the pin first) and returns
/// on the first request after recovery.
#[test]
fn ap3_outage_longer_than_retries_detours_each_request() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.set("a", status(503));
    for _ in 0..3 {
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
    }
    p.up.clear("a");
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
    let recent = p
        .admin()
        .explain_session(Provider::Claude, "S")
        .unwrap()
        .recent;
    assert!(recent.iter().any(|r| r.outcome.as_str() == "detour"));
    assert!(
        recent
            .iter()
            .any(|r| r.outcome.as_str() == "transient" && r.status == Some(503))
    );
}

/// `explain-session` shows every recorded outcome as its case, in order; a stored word
/// that names no outcome (only an edited database has one) is left out with a warning,
/// and the explanation still answers.
#[test]
fn explain_session_reads_outcomes_and_skips_an_unknown_word() {
    use crate::policy::AttemptOutcome;
    let p = Pool::abc();
    let store = p.store();
    let record = |at, word| {
        store
            .record_attempt(Provider::Claude, "session:S", at, "a", None, word, 4096)
            .unwrap()
    };
    for (at, o) in (1..).zip(AttemptOutcome::ALL.iter().copied()) {
        record(at, o.as_str());
    }
    record(100, "edited by hand");
    record(101, "served");
    let e = p.admin().explain_session(Provider::Claude, "S").unwrap();
    let outcomes: Vec<_> = e.recent.iter().map(|r| (r.at, r.outcome)).collect();
    let mut expected: Vec<_> = (1..).zip(AttemptOutcome::ALL.iter().copied()).collect();
    expected.push((101, AttemptOutcome::Served));
    assert_eq!(outcomes, expected);
    assert_eq!(
        e.why,
        "no pin: its pin expired or no request of it succeeded"
    );
    let logs = p.env.logs.borrow();
    assert!(
        logs.iter().any(|l| l.contains("unknown outcome")
            && l.contains("edited by hand")
            && l.contains("\"a\"")),
        "{logs:?}"
    );
}

/// AP-4: an API key refused with 401 is a lasting reason: the session re-pins and stays
/// on the new account after the old one is re-enabled.
#[test]
fn ap4_auth_refusal_re_pins_for_good() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.set("a", status(401));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Error);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("b"));
    p.up.clear("a");
    p.admin().enable(&p.id("a")).unwrap();
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["b"]);
    let why = p
        .admin()
        .explain_session(Provider::Claude, "S")
        .unwrap()
        .why;
    assert!(why.contains("re-pinned") && why.contains("auth"), "{why}");
}

/// AP-5: a shared quota refusal moves the session and the cursor; after the reset the
/// cursor stays on the new account and so does the session.
#[test]
fn ap5_shared_quota_exhaustion_moves_session_and_cursor() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.push("a", quota_reject("5h", T0 + 60_000));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Exhausted);
    p.claude(Some("N1"));
    assert_eq!(p.up.seen(), ["b"], "new sessions go to the cursor, now b");
    p.env.advance(61_000);
    p.claude(Some("N2"));
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["b", "b"]);
    assert_eq!(p.cursor().as_deref(), Some("b"));
}

/// AP-6: a family limit detours only that family's requests; the pin stays.
#[test]
fn ap6_family_limit_is_a_detour() {
    let p = Pool::abc();
    p.send(p.claude_req(Some("S"), "claude-opus-4-1"));
    p.up.seen();
    p.up.push("a", quota_reject("7d_opus", T0 + 3_600_000));
    assert_eq!(
        p.send(p.claude_req(Some("S"), "claude-opus-4-1")).status,
        200
    );
    assert_eq!(p.up.seen(), ["a", "b"]);
    p.send(p.claude_req(Some("S"), "claude-opus-4-1"));
    assert_eq!(p.up.seen(), ["b"], "the opus window is known to be refused");
    p.send(p.claude_req(Some("S"), "claude-sonnet-4-5"));
    assert_eq!(p.up.seen(), ["a"], "other families stay home");
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(
        p.status_of("a"),
        crate::model::AccountStatus::Ready,
        "a family limit does not change status"
    );
}

/// AP-7: a short 429 is waited out once and the same account retried.
#[test]
fn ap7_short_429_waits_once_and_retries() {
    let p = Pool::abc();
    p.up.push("a", with_headers(429, &[("retry-after", "5".into())]));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a"]);
    assert_eq!(*p.env.sleeps.borrow(), [5_000]);
}

/// AP-8: a long 429 on the pinned account: another serves as a detour; after the hold the
/// session is home.
#[test]
fn ap8_long_429_detours_then_returns_after_the_hold() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.push("a", with_headers(429, &[("retry-after", "60".into())]));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["b"], "held: no call to a");
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Held);
    p.env.advance(60_000);
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// AP-9: every account failing transiently: the client gets the last failure (503), and
/// pin and cursor stay.
#[test]
fn ap9_all_accounts_failing_commits_nothing() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    for l in ["a", "b", "c"] {
        p.up.set(l, status(503));
    }
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["message"], "upstream 503");
    assert_eq!(
        r.headers.get("x-pooler-origin"),
        None,
        "an upstream failure, re-shaped"
    );
    assert_eq!(p.up.seen(), ["a", "a", "a", "b", "b", "b", "c", "c", "c"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    for l in ["a", "b", "c"] {
        p.up.clear(l);
    }
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
}

/// AP-10: everything exhausted: the pool's 429 with Retry-After to the earliest reset,
/// no upstream call on a repeat, availability blocked at the same time; after A's reset,
/// A serves.
#[test]
fn ap10_everything_exhausted_gives_the_pools_429() {
    let p = Pool::new();
    p.add_key("a");
    p.add_key("b");
    p.up.push("a", quota_reject("5h", T0 + 60_000));
    p.up.push("b", quota_reject("7d", T0 + 120_000));
    let r = p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(r.status, 429);
    assert_eq!(r.headers.get("retry-after"), Some("60"));
    assert_eq!(r.headers.get("x-pooler-origin"), Some("pool"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let again = p.claude(Some("S"));
    assert_eq!(
        (again.status, again.headers.get("retry-after")),
        (429, Some("60"))
    );
    assert!(p.up.seen().is_empty(), "no upstream call on a repeat");
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Blocked {
            retry_at: T0 + 60_000,
            cause: BlockCause::QuotaExhausted
        }
    );
    p.env.advance(60_000);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
}

/// AP-11 (#6169): accounts at 99 % still serve; a new session prefers one under the
/// threshold.
#[test]
fn ap11_threshold_is_a_preference() {
    let p = Pool::new();
    p.add_key("a");
    p.add_key("b");
    let near = |u: &str| {
        with_headers(
            200,
            &[
                ("anthropic-ratelimit-unified-5h-utilization", u.into()),
                ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
            ],
        )
    };
    p.up.set("a", near("0.99"));
    p.up.set("b", near("0.99"));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.claude(Some("T")).status, 200);
    assert_eq!(p.claude(None).status, 200);
    // S lands on the cursor a, which turns reserve; T prefers b, which turns reserve too;
    // with nothing preferred left, a new request takes the reserve cursor a.
    assert_eq!(p.up.seen(), ["a", "b", "a"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::NearLimit);
    assert_eq!(
        p.claude(Some("S")).status,
        200,
        "a pinned session stays on its reserve account"
    );
    assert_eq!(p.up.seen(), ["a"]);
    p.up.set("b", near("0.5"));
    p.claude(Some("T"));
    p.claude(Some("U"));
    p.claude(Some("V"));
    assert_eq!(
        p.up.seen(),
        ["b", "b", "b"],
        "T's answer showed b under the threshold: new sessions prefer it"
    );
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Ready
    );
}

/// AP-12 (#6167): a refused proactive refresh keeps a valid token serving with the flag;
/// after expiry with refresh still refused, the account is in error.
#[test]
fn ap12_refused_proactive_refresh_keeps_a_valid_token() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 10 * 60_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(400, vec![], r#"{"error":"invalid_grant"}"#.into()),
    );
    p.env.advance(6 * 60_000);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["at-1"]);
    assert_eq!(p.up.count("token-endpoint"), 1);
    let info = p.admin().list(None).unwrap().remove(0);
    assert!(info.needs_sign_in && info.error.is_none());
    assert_eq!(info.status, crate::model::AccountStatus::Ready);
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Ready
    );
    p.env.advance(5 * 60_000);
    let r = p.claude(Some("S"));
    assert_ne!(r.status, 200);
    assert_eq!(p.status_of("o"), crate::model::AccountStatus::Error);
    assert!(p.up.seen().is_empty(), "an expired token is never sent");
}

fn file_db(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("pool-{name}-{}.sqlite3", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// AP-13: a 401 on an OAuth token: one refresh, a retry with the new token, 200; two
/// concurrent requests (two instances on one database) share one refresh.
#[test]
fn ap13_oauth_401_refreshes_once_for_concurrent_requests() {
    let path = file_db("ap13");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    p.add_oauth(Provider::Claude, "o", "old", Some(T0 + 3_600_000));
    p.up.set("old", status(401));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"new","expires_in":3600}"#.into(),
        ),
    );
    p.up.delays.borrow_mut().insert("token-endpoint".into(), 3);
    let second = NativeDb::open(&path).unwrap();
    let (r1, r2) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S1"), "claude-sonnet"))
                        .await,
                )
                .await
            },
            async {
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S2"), "claude-sonnet"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((r1.status, r2.status), (200, 200));
    assert_eq!(p.up.count("token-endpoint"), 1, "one refresh in flight");
    let seen = p.up.seen();
    assert_eq!(seen.iter().filter(|c| *c == "new").count(), 2);
    assert!(seen.iter().all(|c| c == "old" || c == "new"));
    let _ = std::fs::remove_file(&path);
}

/// AP-14: an SSE response is relayed chunk by chunk; a break after the first chunk gives
/// an SSE error event and no second attempt.
#[test]
fn ap14_sse_streams_through_and_a_break_becomes_an_error_event() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Sse(
            vec![
                "event: message_start\ndata: {}\n\n",
                "event: ping\ndata: {}\n\n",
            ],
            true,
        ),
    );
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet"))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers.get("content-type"), Some("text/event-stream"));
        let Body::Stream(mut relay) = r.body else {
            panic!("a stream")
        };
        let first = relay.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"event: message_start"));
        assert_eq!(
            p.up.pulled.get(),
            1,
            "the first chunk reached the client before the rest was read"
        );
        let second = relay.next().await.unwrap().unwrap();
        assert!(second.starts_with(b"event: ping"));
        let error = String::from_utf8(relay.next().await.unwrap().unwrap()).unwrap();
        assert!(
            error.starts_with("event: error\n") && error.contains("api_error"),
            "{error}"
        );
        assert!(relay.next().await.is_none());
    });
    assert_eq!(p.up.seen(), ["a"], "no second attempt");
}

/// AP-15: missing, wrong or closed tokens get 401 without an upstream call; tokens of two
/// threads are independent.
#[test]
fn ap15_route_tokens_guard_the_pool() {
    let p = Pool::abc();
    let mut missing = p.claude_req(Some("S"), "m");
    missing.headers = Headers::from([("content-type", "application/json")]);
    let mut wrong = p.claude_req(Some("S"), "m");
    wrong.headers.set("authorization", "Bearer not-a-token");
    let mut codex_token_on_claude = p.claude_req(Some("S"), "m");
    codex_token_on_claude
        .headers
        .set("authorization", format!("Bearer {}", p.codex_token));
    for req in [missing, wrong, codex_token_on_claude] {
        let r = p.send(req);
        assert_eq!(r.status, 401);
        assert_eq!(r.json()["error"]["type"], "authentication_error");
        assert_eq!(r.headers.get("x-pooler-origin"), Some("pool"));
    }
    let t2 = p
        .admin()
        .open_route("t2", Provider::Claude, "http://127.0.0.1:8787")
        .unwrap()
        .token;
    p.admin().close_route("t1", Provider::Claude).unwrap();
    assert_eq!(
        p.claude(Some("S")).status,
        401,
        "a closed route's token stops at once"
    );
    let mut via_t2 = p.claude_req(Some("S"), "m");
    via_t2.headers.set("x-api-key", t2);
    via_t2.headers = Headers::from([("x-api-key", via_t2.headers.get("x-api-key").unwrap())]);
    assert_eq!(p.send(via_t2).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(
        p.admin().close_route("t1", Provider::Claude),
        Err(crate::admin::RoutingError::NoSuchRoute)
    );
}

/// AP-16: a child session starts on its parent's account; its own later failover does not
/// move the parent (nor extend the parent's pin).
#[test]
fn ap16_child_inherits_parent_account() {
    let p = Pool::abc();
    p.admin().disable(&p.id("a")).unwrap();
    p.claude(Some("P"));
    p.admin().enable(&p.id("a")).unwrap();
    p.store()
        .cas_cursor(Provider::Claude, Some(&p.id("b")), &p.id("a"))
        .unwrap();
    p.up.seen();
    let parent_used = p
        .admin()
        .explain_session(Provider::Claude, "P")
        .unwrap()
        .last_used_at;
    let child = |p: &Pool| {
        let mut req = p.claude_req(None, "claude-sonnet");
        let mut body: serde_json::Value = serde_json::from_slice(&req.body.to_vec()).unwrap();
        body["metadata"] =
            json!({"user_id": json!({"session_id": "C", "parent_session_id": "P"}).to_string()});
        req.body = body.to_string().into_bytes().into();
        p.send(req)
    };
    p.env.advance(1_000);
    assert_eq!(child(&p).status, 200);
    assert_eq!(p.up.seen(), ["b"], "inherited, not the cursor a");
    assert_eq!(p.pinned(Provider::Claude, "C").as_deref(), Some("b"));
    p.up.set("b", status(503));
    child(&p);
    assert_eq!(p.up.seen(), ["b", "b", "b", "c"]);
    assert_eq!(p.pinned(Provider::Claude, "P").as_deref(), Some("b"));
    assert_eq!(
        p.admin()
            .explain_session(Provider::Claude, "P")
            .unwrap()
            .last_used_at,
        parent_used
    );
    let why = p
        .admin()
        .explain_session(Provider::Claude, "C")
        .unwrap()
        .why;
    assert!(why.contains("inherited"), "{why}");
}

/// AP-17: Codex session keys from headers and body, the `cache:` namespace, and the
/// Codex forwarding (base URL without `/v1`, bearer token, account id).
#[test]
fn ap17_codex_session_keys_and_forwarding() {
    let p = Pool::new();
    p.add_oauth(Provider::Codex, "x", "cx-1", None);
    p.add_oauth(Provider::Codex, "y", "cx-2", None);
    let codex = |headers: &[(&str, &str)], body: serde_json::Value| {
        let mut h = Headers::from([(
            "authorization",
            format!("Bearer {}", p.codex_token).as_str(),
        )]);
        for (n, v) in headers {
            h.push(n, *v);
        }
        p.send(IncomingRequest {
            method: "POST".into(),
            path: "/v1/responses".into(),
            query: None,
            headers: h,
            body: body.to_string().into_bytes().into(),
            body_refused: None,
        })
    };
    assert_eq!(
        codex(
            &[("session-id", "s1"), ("thread-id", "th1")],
            json!({"prompt_cache_key": "k", "stream": true})
        )
        .status,
        200
    );
    let req = p.up.last();
    assert_eq!(req.url, "https://chatgpt.com/backend-api/codex/responses");
    assert_eq!(req.headers.get("authorization"), Some("Bearer cx-1"));
    assert_eq!(req.headers.get("chatgpt-account-id"), Some("acct-x"));
    assert_eq!(req.headers.get("session-id"), Some("s1"));
    assert!(req.headers.get("x-api-key").is_none());
    assert_eq!(p.pinned(Provider::Codex, "th1").as_deref(), Some("x"));
    assert_eq!(
        p.pinned(Provider::Codex, "s1"),
        None,
        "thread-id wins over session-id"
    );
    codex(&[], json!({"prompt_cache_key": "k2"}));
    assert_eq!(p.pinned(Provider::Codex, "cache:k2").as_deref(), Some("x"));
    assert_eq!(
        p.pinned(Provider::Codex, "k2"),
        None,
        "a cache key is its own namespace"
    );
    let models = p.send(IncomingRequest {
        method: "GET".into(),
        path: "/v1/models".into(),
        query: Some("client_version=0.169.0".into()),
        headers: Headers::from([(
            "authorization",
            format!("Bearer {}", p.codex_token).as_str(),
        )]),
        body: crate::body::RequestBody::new(),
        body_refused: None,
    });
    assert_eq!(models.status, 200);
    assert_eq!(
        p.up.last().url,
        "https://chatgpt.com/backend-api/codex/models?client_version=0.169.0"
    );
}

/// AP-18: concurrent first requests of a new session land on one account, even when the
/// cursor moves between them.
#[test]
fn ap18_concurrent_first_requests_share_one_account() {
    let path = file_db("ap18");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    p.add_key("a");
    p.add_key("b");
    p.up.delays.borrow_mut().insert("a".into(), 5);
    let second = NativeDb::open(&path).unwrap();
    let (r1, r2) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
            async {
                // Meanwhile another request moved the cursor to b.
                Store::new(&second)
                    .cas_cursor(Provider::Claude, None, &p.id("b"))
                    .unwrap();
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((r1.status, r2.status), (200, 200));
    assert_eq!(p.up.seen(), ["a", "a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    let _ = std::fs::remove_file(&path);
}

/// AP-19: an older request completing after a newer one re-pinned the session does not
/// overwrite the newer pin.
#[test]
fn ap19_stale_completion_keeps_the_newer_pin() {
    let path = file_db("ap19");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    for l in ["a", "b"] {
        p.add_key(l);
    }
    p.claude(Some("S"));
    p.up.seen();
    p.up.delays.borrow_mut().insert("a".into(), 5);
    let second = NativeDb::open(&path).unwrap();
    let (old, new) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
            async {
                Admin::new(&second, &p.up, &p.env)
                    .unwrap()
                    .disable(&p.id("a"))
                    .unwrap();
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((old.status, new.status), (200, 200));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(
        p.pinned(Provider::Claude, "S").as_deref(),
        Some("b"),
        "the newer pin stands"
    );
    let _ = std::fs::remove_file(&path);
}

/// AP-20: pins, cursor, holds and quota observations survive a restart (a new connection
/// to the same database, no guest memory).
#[test]
fn ap20_state_survives_a_restart() {
    let path = file_db("ap20");
    let (ids, now) = {
        let p = Pool::on(NativeDb::open(&path).unwrap());
        p.add_key("a");
        p.add_key("b");
        p.claude(Some("original"));
        p.up.push("a", quota_reject("5h", T0 + 60_000));
        p.claude(Some("fallback"));
        assert_eq!(p.up.seen(), ["a", "a", "b"]);
        p.env.advance(61_000);
        p.up.push("b", with_headers(429, &[("retry-after", "600".into())]));
        p.claude(Some("held"));
        (p.ids.borrow().clone(), p.env.now())
    };
    let p = Pool::on(NativeDb::open(&path).unwrap());
    *p.ids.borrow_mut() = ids;
    p.env.now.set(now);
    assert_eq!(
        p.status_of("b"),
        crate::model::AccountStatus::Held,
        "the hold survived"
    );
    assert!(
        p.admin().list(None).unwrap()[0]
            .windows
            .iter()
            .any(|w| w.name == "5h"),
        "observations survived"
    );
    p.env.advance(600_000);
    p.claude(Some("fresh"));
    p.claude(Some("original"));
    p.claude(Some("fallback"));
    assert_eq!(p.up.seen(), ["b", "a", "b"]);
    let _ = std::fs::remove_file(&path);
}

/// AP-21: the availability answers, and `blocked` equal to the 429's Retry-After.
#[test]
fn ap21_availability_answers() {
    let p = Pool::new();
    let admin = p.admin();
    assert_eq!(
        admin
            .availability("nobody", Provider::Claude, None)
            .unwrap(),
        Availability::NotRouted
    );
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Unavailable(UnavailableReason::NoEnabledAccount)
    );
    p.add_key("a");
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Ready
    );
    p.up.set("a", status(401));
    p.claude(None);
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Unavailable(UnavailableReason::Authentication)
    );
    admin.enable(&p.id("a")).unwrap();
    p.up.set("a", with_headers(429, &[("retry-after", "42".into())]));
    let r = p.claude(None);
    assert_eq!(r.status, 429);
    let blocked = admin.availability("t1", Provider::Claude, None).unwrap();
    assert_eq!(
        blocked,
        Availability::Blocked {
            retry_at: p.env.now() + 42_000,
            cause: BlockCause::Held
        }
    );
    p.up.seen();
    let pool429 = p.claude(None);
    let Availability::Blocked { retry_at, .. } = blocked else {
        unreachable!()
    };
    assert_eq!(
        pool429.headers.get("retry-after"),
        Some(
            crate::policy::retry_after_secs(retry_at, p.env.now())
                .to_string()
                .as_str()
        )
    );
    assert_eq!(pool429.headers.get("x-pooler-origin"), Some("pool"));
    admin.set_setting("claude-routing", "off").unwrap();
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::NotRouted
    );
    admin.set_setting("claude-routing", "on").unwrap();

    let q = Pool::new();
    q.add_oauth(Provider::Codex, "x", "cx", None);
    q.up.set(
        "cx",
        with_headers(429, &[("x-codex-primary-over-limit", "true".into())]),
    );
    let mut h = Headers::from([(
        "authorization",
        format!("Bearer {}", q.codex_token).as_str(),
    )]);
    h.push("session-id", "s");
    let r = q.send(IncomingRequest {
        method: "POST".into(),
        path: "/v1/responses".into(),
        query: None,
        headers: h,
        body: b"{}"[..].into(),
        body_refused: None,
    });
    assert_eq!((r.status, r.headers.get("retry-after")), (429, Some("60")));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        q.admin().availability("t1", Provider::Codex, None).unwrap(),
        Availability::Unavailable(UnavailableReason::ResetUnknown)
    );
}

/// AP-22: enabling, adding, clearing an error, changing the threshold and a reset passing
/// each produce one coalesced availability-changed for that provider.
#[test]
fn ap22_signals_are_coalesced_per_provider() {
    let p = Pool::new();
    let admin = p.admin();
    admin.take_changes().unwrap();
    let one = |want: ChangeCause| {
        let changes = admin.take_changes().unwrap();
        assert_eq!(changes.len(), 1, "{want:?}: {changes:?}");
        assert_eq!(changes[0].provider, Provider::Claude);
        assert!(changes[0].causes.contains(&want), "{want:?}: {changes:?}");
        changes
    };
    p.add_key("a");
    one(ChangeCause::AccountAdded);
    admin.disable(&p.id("a")).unwrap();
    admin.enable(&p.id("a")).unwrap();
    admin.enable(&p.id("a")).unwrap();
    let c = one(ChangeCause::AccountEnabled);
    assert_eq!(
        c[0].causes,
        [ChangeCause::AccountDisabled, ChangeCause::AccountEnabled],
        "coalesced, first seen first"
    );
    assert_eq!(c[0].earliest, Availability::Ready);

    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 3_600_000));
    admin.take_changes().unwrap();
    p.store()
        .set_error(&o, "OAuth refresh failed with HTTP 400.", 0)
        .unwrap();
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    block_on(admin.refresh(&o)).unwrap();
    one(ChangeCause::ErrorCleared);

    admin.set_setting("switch-threshold", "0.9").unwrap();
    let c = admin.take_changes().unwrap();
    assert_eq!(c.len(), 2, "the threshold concerns both providers");
    assert!(c.iter().all(|c| c.causes == [ChangeCause::ConfigChanged]));

    block_on(admin.tick(p.env.now())).unwrap();
    admin.take_changes().unwrap();
    p.up.push("a", quota_reject("5h", p.env.now() + 30_000));
    p.up.push("at-2", quota_reject("5h", p.env.now() + 30_000));
    p.claude(None);
    admin.take_changes().unwrap();
    p.env.advance(31_000);
    block_on(admin.tick(p.env.now())).unwrap();
    let c = one(ChangeCause::ResetPassed);
    assert_eq!(c[0].earliest, Availability::Ready);
}

/// AP-23: reorder refuses incomplete or duplicate lists; invalid settings are refused by
/// name; list never shows a secret.
#[test]
fn ap23_admin_refusals_and_secrets() {
    let p = Pool::new();
    let admin = p.admin();
    let a = admin
        .add(NewAccount {
            provider: Provider::Claude,
            credential: Credential::ApiKey("sk-ant-secret-wxyz".into()),
            label: None,
            priority: None,
            options: None,
        })
        .unwrap();
    let b = p.add_key("b");
    for bad in [
        vec![a.id.clone()],
        vec![a.id.clone(), a.id.clone(), b.clone()],
        vec![a.id.clone(), b.clone(), "ghost".into()],
    ] {
        assert!(
            matches!(
                admin.reorder(Provider::Claude, &bad),
                Err(crate::admin::AccountsError::InvalidOrder(_))
            ),
            "{bad:?}"
        );
    }
    let order: Vec<String> = admin
        .list(Some(Provider::Claude))
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(order, [a.id.clone(), b.clone()], "nothing changed");
    let reordered = admin
        .reorder(Provider::Claude, &[b.clone(), a.id.clone()])
        .unwrap();
    assert_eq!(
        reordered
            .iter()
            .map(|i| (i.id.clone(), i.priority))
            .collect::<Vec<_>>(),
        [(b.clone(), 0), (a.id.clone(), 1)]
    );
    match admin.set_setting("switch-threshold", "1.5") {
        Err(crate::admin::SettingsError::Refused(crate::settings::SettingError::Invalid {
            key,
            accepted,
            ..
        })) => {
            assert_eq!(key, "switch-threshold");
            assert!(accepted.contains("≤ 1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(admin.get_setting("switch-threshold").unwrap().value, "0.98");
    let listed = format!("{:?}", admin.list(None).unwrap());
    assert!(!listed.contains("sk-ant-secret"), "{listed}");
    assert_eq!(
        admin
            .list(None)
            .unwrap()
            .iter()
            .find(|i| i.id == a.id)
            .unwrap()
            .secret_hint,
        "…wxyz"
    );
    assert_eq!(a.label, "Claude API key");
    assert!(matches!(
        admin.add(NewAccount {
            provider: Provider::Codex,
            credential: Credential::ApiKey("k".into()),
            label: None,
            priority: None,
            options: None,
        }),
        Err(crate::admin::AccountsError::ApiKeyNotSupported(
            Provider::Codex
        ))
    ));
}

/// AP-24: bad input gets a clear answer or a session-less forward, and the pool keeps
/// serving.
#[test]
fn ap24_bad_input_is_answered_clearly() {
    let p = Pool::abc();
    let mut not_json = p.claude_req(None, "m");
    not_json.body = b"{not json"[..].into();
    assert_eq!(p.send(not_json).status, 200, "forwarded session-less");
    assert_eq!(p.up.last().body, &b"{not json"[..]);

    let mut big = p.claude_req(None, "m");
    p.admin().set_setting("max-request-body", "1024").unwrap();
    big.body = vec![b' '; 2048].into();
    let r = p.send(big);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (413, Some("pool"))
    );
    let mut truncated = p.claude_req(None, "m");
    truncated.body_refused = Some(crate::body::Refused::OverLimit);
    assert_eq!(p.send(truncated).status, 413);
    // A body within the limit that the glue's memory could not hold: the pool's 413,
    // saying so, in the provider's shape.
    let mut unheld = p.claude_req(None, "m");
    unheld.body = crate::body::RequestBody::new();
    unheld.body_refused = Some(crate::body::Refused::OutOfMemory { held: 900 });
    let r = p.send(unheld);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (413, Some("pool"))
    );
    assert_eq!(r.json()["error"]["type"], "request_too_large");
    assert_eq!(
        r.json()["error"]["message"],
        crate::engine::BODY_OUT_OF_MEMORY
    );

    let bad_session = "x\u{1}y";
    assert_eq!(p.claude(Some(bad_session)).status, 200);
    assert_eq!(
        p.store().pin_count().unwrap(),
        0,
        "an invalid session id gives no pin"
    );

    let mut unknown = p.claude_req(None, "m");
    unknown.path = "/v1/complete".into();
    let r = p.send(unknown.clone());
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
    unknown.headers = Headers::new();
    assert_eq!(p.send(unknown).status, 401);
    let mut wrong_method = p.claude_req(None, "m");
    wrong_method.method = "GET".into();
    assert_eq!(p.send(wrong_method).status, 405);
    p.up.seen();
    assert_eq!(p.claude(Some("S")).status, 200, "still serving");
    assert_eq!(p.up.seen(), ["a"]);
}
