//! A client that goes away: during a backoff, an attempt in flight, a short 429 wait,
//! or mid-stream, the request stops and records `cancelled`.

use super::*;

/// The latest attempt recorded for `session`: (account label, status, outcome).
fn latest_attempt(p: &Pool, session: &str) -> (String, Option<u16>, String) {
    let recent = p
        .admin()
        .explain_session(Provider::Claude, session)
        .unwrap()
        .recent;
    let last = recent.last().expect("an attempt was recorded");
    (
        p.label_of(&last.account),
        last.status,
        last.outcome.as_str().to_owned(),
    )
}

/// The cancellation log lines so far.
fn cancel_lines(p: &Pool) -> Vec<String> {
    p.env
        .logs
        .borrow()
        .iter()
        .filter(|l| l.starts_with(CANCELLED_MESSAGE))
        .cloned()
        .collect()
}

/// The client goes away during the backoff after a 503 (spec §4: "the client cancelling
/// stops every further attempt and wait"): no further upstream attempt, no detour, the
/// attempt is recorded `cancelled`, and pin, cursor and the account's standing are as they
/// were; one log line says so. A new session whose client leaves so is not pinned at all.
#[test]
fn a_client_gone_during_the_backoff_after_a_503_stops_the_request() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    p.up.set("a", status(503));
    p.env.leave_during_sleep(1);
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 499, "{}", r.body);
    assert_eq!(p.up.seen(), ["a"], "no retry of a, no detour to b");
    assert_eq!(
        *p.env.sleeps.borrow(),
        [250],
        "the first backoff only began"
    );
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(503), "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Ready);
    let lines = cancel_lines(&p);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(&p.id("a")) && lines[0].contains("(\"attempts\", \"1\")"),
        "{lines:?}"
    );
    assert!(!lines[0].contains(&p.claude_token), "no secret in the log");

    // A new session: its provisional pin is released, the cursor stays.
    p.env.leave_during_sleep(1);
    assert_eq!(p.claude(Some("N")).status, 499);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(
        p.pinned(Provider::Claude, "N"),
        None,
        "a cancelled request pins nothing"
    );
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(
        latest_attempt(&p, "N"),
        ("a".into(), Some(503), "cancelled".into())
    );

    // With its client there, the same request retries and detours as before.
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
}

/// The client goes away while an attempt's upstream call is in flight: the call is dropped
/// unanswered (in the component, wasi:http aborts it), nothing else is tried, and the
/// attempt is recorded `cancelled` with no status.
#[test]
fn a_client_gone_while_an_attempt_is_in_flight_drops_it() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    p.up.seen();
    p.up.delays.borrow_mut().insert("a".into(), 5);
    p.up.leave_during_call(1);
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 499, "{}", r.body);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.up.abandoned.get(), 1, "the call in flight was dropped");
    assert!(p.env.sleeps.borrow().is_empty());
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), None, "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(cancel_lines(&p).len(), 1);
}

/// The client goes away during the inline wait for a short 429: the account is not tried
/// again. The hold the upstream asked for stays (it is the upstream's word, not the
/// request's), the pin does not move.
#[test]
fn a_client_gone_during_a_short_429_wait_stops_the_request() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    p.up.seen();
    p.up.push("a", with_headers(429, &[("retry-after", "5".into())]));
    p.env.leave_during_sleep(1);
    assert_eq!(p.claude(Some("S")).status, 499);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(*p.env.sleeps.borrow(), [5_000]);
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(429), "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// The client goes away in the middle of a relayed stream: relaying stops at once (the
/// upstream's next chunk is not even read), with one log line; the attempt that served the
/// head keeps its record.
#[test]
fn a_client_gone_mid_stream_stops_relaying() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Sse(
            vec![
                "event: message_start\ndata: {}\n\n",
                "event: ping\ndata: {}\n\n",
                "event: message_stop\ndata: {}\n\n",
            ],
            false,
        ),
    );
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet"))
            .await;
        assert_eq!(r.status, 200);
        let Body::Stream(mut relay) = r.body else {
            panic!("a stream")
        };
        let first = relay_next(&mut relay, &p.env).await.unwrap().unwrap();
        assert!(first.starts_with(b"event: message_start"));
        p.env.gone.set(true);
        assert!(relay_next(&mut relay, &p.env).await.is_none());
        assert!(relay_next(&mut relay, &p.env).await.is_none());
    });
    assert_eq!(p.up.pulled.get(), 1, "nothing more was read from upstream");
    let lines = cancel_lines(&p);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&p.id("a")), "{lines:?}");
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(200), "served".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}
