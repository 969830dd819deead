//! A served event stream's head is held until its first event (spec §4): a stream that
//! opens with an overload or a rate limit is retried, detoured or moved like the status it
//! stands for, and the client sees one clean stream; anything else is relayed as it comes,
//! within the time and byte bounds.

use super::*;
use crate::engine::attempt::FIRST_EVENT_LIMIT;

const OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
const RATE_LIMITED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of requests has exceeded your rate limit.\"}}\n\n";
const START: &str = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
const DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n";
const STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// A whole answer, in one chunk per event.
fn answer() -> Reply {
    Reply::Sse(vec![START, DELTA, STOP], false)
}

const CLEAN: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

/// A 200 event stream with these headers and chunks.
fn stream(headers: &[(&'static str, String)], chunks: Vec<&'static str>) -> Reply {
    let mut h = vec![("content-type", "text/event-stream".to_owned())];
    h.extend_from_slice(headers);
    Reply::Chunks(h, chunks, false)
}

/// Claude's unified headers of `window` rejected, resetting at `reset_ms`.
fn rejected(window: &str, reset_ms: u64) -> Vec<(&'static str, String)> {
    let prefix = "anthropic-ratelimit-unified-";
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    vec![
        (leak(format!("{prefix}{window}-status")), "rejected".into()),
        (
            leak(format!("{prefix}{window}-reset")),
            (reset_ms / 1000).to_string(),
        ),
    ]
}

#[test]
fn a_stream_opening_with_an_overload_is_retried_and_the_client_sees_one_clean_stream() {
    let p = Pool::abc();
    p.up.push("a", Reply::Sse(vec![OVERLOADED], false));
    p.up.set("a", answer());
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (200, CLEAN));
    assert_eq!(p.up.seen(), ["a", "a"], "the same account, again");
    assert_eq!(*p.env.sleeps.borrow(), [250], "after the transient backoff");
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    let lines = p.env.request_lines();
    assert_eq!(lines[0]["outcome"], "served");
    assert!(
        p.env.logs.borrow().iter().any(|l| l
            .starts_with("Account Pooler upstream stream failed at its first event")
            && l.contains("overloaded_error")),
        "{:?}",
        p.env.logs.borrow()
    );
}

/// An overload that outlasts the retries is a detour: the pin stays, and the next request
/// tries its account first (the #6990 rule, as for a 529).
#[test]
fn a_stream_opening_with_overloads_past_the_retries_detours_without_moving_the_pin() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    for _ in 0..3 {
        p.up.push("a", Reply::Sse(vec![OVERLOADED], false));
    }
    p.up.set("b", answer());
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (200, CLEAN));
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"], "home again");

    // Every account overloaded: the client gets the overload as the status it stands for.
    for l in ["a", "b", "c"] {
        p.up.set(l, Reply::Sse(vec![OVERLOADED], false));
    }
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 529, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], "Overloaded");
    assert!(
        r.headers.get("x-pooler-origin").is_none(),
        "the upstream's word"
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// A rate limit whose headers say the shared window is spent is a lasting refusal, as
/// the 429 would be: the conversation moves, and its next request goes to its new account.
#[test]
fn a_stream_opening_with_a_shared_rate_limit_moves_the_conversation() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.push(
        "a",
        stream(&rejected("5h", T0 + 3_600_000), vec![RATE_LIMITED]),
    );
    p.up.set("b", answer());
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (200, CLEAN));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("b"));
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Exhausted);
    p.claude(Some("S"));
    assert_eq!(
        p.up.seen(),
        ["b"],
        "its next request goes to its new account"
    );
}

/// A family-scoped rejection is a family detour; a rate limit the headers do not explain
/// is a hold (a short one waited out once, on the same account).
#[test]
fn a_stream_opening_with_another_rate_limit_is_a_detour_or_a_hold() {
    let p = Pool::abc();
    let opus = |p: &Pool| p.send(p.claude_req(Some("S"), "claude-opus-4-1"));
    opus(&p);
    p.up.seen();
    p.up.push(
        "a",
        stream(&rejected("7d_opus", T0 + 3_600_000), vec![RATE_LIMITED]),
    );
    assert_eq!(opus(&p).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));

    let p = Pool::abc();
    p.up.push("a", Reply::Sse(vec![RATE_LIMITED], false));
    p.up.set("a", answer());
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (200, CLEAN));
    assert_eq!(p.up.seen(), ["a", "a"]);
    assert_eq!(
        *p.env.sleeps.borrow(),
        [crate::quota::DEFAULT_RETRY_AFTER_MS],
        "no Retry-After: the default hold, waited out once"
    );
}

/// Once the answer's first event has come, a failure later in the stream is relayed as
/// today: no second attempt.
#[test]
fn a_content_event_then_an_error_is_relayed_as_today() {
    let p = Pool::abc();
    p.up.set("a", Reply::Sse(vec![START, DELTA, OVERLOADED], false));
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, format!("{START}{DELTA}{OVERLOADED}"));
    assert_eq!(p.up.seen(), ["a"]);
    assert!(p.env.sleeps.borrow().is_empty(), "nothing waited");
}

/// A stream whose first event is slower than `first-event-wait` is relayed as it comes
/// once the wait is up; the held head costs that wait and no more.
#[test]
fn a_first_event_slower_than_the_wait_is_relayed_as_it_comes() {
    let p = Pool::abc();
    p.admin().set_setting("first-event-wait", "2s").unwrap();
    p.up.set("a", Reply::Sse(vec![STALL, OVERLOADED], false));
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet-4-5"))
            .await;
        assert_eq!(r.status, 200, "the head, once the wait is up");
        assert_eq!(*p.env.sleeps.borrow(), [2_000]);
        assert_eq!(p.up.pulled.get(), 0, "nothing had come");
        let body = collect(r).await.body;
        assert_eq!(body, OVERLOADED, "then the stream as it comes");
    });
    assert_eq!(p.up.seen(), ["a"], "no second attempt");
}

/// With `first-event-wait = 0s` the head goes out at once, as before: an opening failure
/// is the client's.
#[test]
fn no_wait_relays_the_head_at_once() {
    let p = Pool::abc();
    p.admin().set_setting("first-event-wait", "0s").unwrap();
    p.up.set("a", Reply::Sse(vec![OVERLOADED], false));
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet-4-5"))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            p.up.pulled.get(),
            0,
            "the head went before any byte was read"
        );
        assert_eq!(collect(r).await.body, OVERLOADED);
    });
    assert_eq!(p.up.seen(), ["a"]);
}

/// What is held is bounded: a stream that has not opened with a whole event within
/// [`FIRST_EVENT_LIMIT`] bytes is relayed as it comes, every byte of it.
#[test]
fn the_held_bytes_are_bounded() {
    let p = Pool::abc();
    // A comment line longer than the bound, then the failure.
    let piece: &'static str = Box::leak(format!(":{}", "x".repeat(64 << 10)).into_boxed_str());
    let pieces = FIRST_EVENT_LIMIT.div_ceil(piece.len());
    let mut chunks = vec![piece; pieces + 3];
    chunks.push("\n\n");
    chunks.push(OVERLOADED);
    p.up.set("a", Reply::Sse(chunks.clone(), false));
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet-4-5"))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            p.up.pulled.get(),
            pieces,
            "read up to the bound, and no further"
        );
        assert_eq!(collect(r).await.body, chunks.concat());
    });
    assert_eq!(p.up.seen(), ["a"]);
}

/// A stream that breaks or ends before its first event is relayed as today (the break
/// as an SSE `error` event after what came).
#[test]
fn a_break_before_the_first_event_is_relayed_as_today() {
    let p = Pool::abc();
    p.up.set("a", Reply::Sse(vec![": hello\n\n"], true));
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200);
    assert!(
        r.body.starts_with(": hello\n\nevent: error\n") && r.body.contains("api_error"),
        "{}",
        r.body
    );
    p.up.set("a", Reply::Sse(vec![": hello\n\n"], false));
    assert_eq!(p.claude(Some("S")).body, ": hello\n\n");
    assert_eq!(p.up.seen(), ["a", "a"]);
}

/// The client leaving while the head is held stops the attempt where it stands.
#[test]
fn a_client_leaving_during_the_wait_stops_the_attempt() {
    let p = Pool::abc();
    p.up.set("a", Reply::Sse(vec![STALL, OVERLOADED], false));
    p.env.leave_during_sleep(1);
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet-4-5"))
            .await;
        assert_eq!(r.status, 499);
    });
    assert_eq!(p.up.seen(), ["a"], "no retry");
    assert!(
        p.pinned(Provider::Claude, "S").is_none(),
        "nothing committed"
    );
}

/// Codex: a stream that announces its response and then fails with a rate limit (the
/// Responses API's `response.failed`) is judged by its headers as the 429 would be; an
/// overload after the announcement is retried.
#[test]
fn a_codex_stream_failing_after_its_announcement_fails_over() {
    const CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n";
    const IN_PROGRESS: &str = "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"r\"}}\n\n";
    const RATE: &str = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"Rate limit reached.\"}}}\n\n";
    const OVERLOAD: &str = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"server_is_overloaded\",\"message\":\"Our servers are currently overloaded.\"}}}\n\n";
    const DONE: &str = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"}}\n\n";
    let p = Pool::new();
    p.add_oauth(Provider::Codex, "x", "cx-1", None);
    p.add_oauth(Provider::Codex, "y", "cx-2", None);
    let codex = || {
        let mut h = Headers::from([(
            "authorization",
            format!("Bearer {}", p.codex_token).as_str(),
        )]);
        h.push("session-id", "s1");
        p.send(IncomingRequest {
            method: "POST".into(),
            path: "/v1/responses".into(),
            query: None,
            headers: h,
            body: bytes::Bytes::from_static(br#"{"stream":true}"#).into(),
            body_refused: None,
        })
    };
    p.up.set("cx-1", Reply::Sse(vec![CREATED, DONE], false));
    assert_eq!(codex().body, format!("{CREATED}{DONE}"));
    p.up.seen();

    p.up.push(
        "cx-1",
        Reply::Sse(vec![CREATED, IN_PROGRESS, OVERLOAD], false),
    );
    assert_eq!(codex().body, format!("{CREATED}{DONE}"));
    assert_eq!(p.up.seen(), ["cx-1", "cx-1"], "retried on the same account");

    let spent = vec![
        ("x-codex-primary-used-percent", "100".to_owned()),
        ("x-codex-primary-reset-after-seconds", "3600".to_owned()),
    ];
    p.up.push("cx-1", stream(&spent, vec![CREATED, IN_PROGRESS, RATE]));
    p.up.set("cx-2", Reply::Sse(vec![CREATED, DONE], false));
    assert_eq!(codex().body, format!("{CREATED}{DONE}"));
    assert_eq!(p.up.seen(), ["cx-1", "cx-2"]);
    assert_eq!(
        p.pinned(Provider::Codex, "s1").as_deref(),
        Some("y"),
        "moved"
    );
}
