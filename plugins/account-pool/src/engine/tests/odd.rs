//! Odd upstream answers: a `1xx` as the final answer, a body compressed although the pool
//! asked for none; and the `accept-encoding` every upstream call carries.

use super::*;

/// A `101 Switching Protocols` (or any 1xx) as the answer to a plain request is a broken
/// exchange, not a response: a transport failure, retried on the same account by the
/// transient rules, then a detour; never relayed. With every account answering so, the
/// client gets the pool's 502.
#[test]
fn an_upstream_1xx_answer_is_a_transport_failure() {
    let p = Pool::abc();
    p.up.set("a", with_headers(101, &[("upgrade", "websocket".into())]));
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
    for l in ["a", "b", "c"] {
        p.up.set(l, with_headers(103, &[]));
    }
    let r = p.claude(Some("T"));
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(r.headers.get(http::ORIGIN_HEADER), Some("pool"));
    assert_eq!(r.json()["type"], "error", "{}", r.body);
}

/// Every upstream call asks for an unencoded body (`accept-encoding: identity`): the pool
/// reads error details, token and usage answers, and streams it relays.
#[test]
fn every_upstream_call_asks_for_an_identity_body() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 2 * 60_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.claude(Some("S")).status, 200);
    let calls = p.up.calls.borrow();
    let kinds: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert!(
        kinds.contains(&"token-endpoint") && kinds.contains(&"usage") && kinds.contains(&"at-2"),
        "{kinds:?}"
    );
    for (cred, call) in calls.iter() {
        assert_eq!(
            call.headers.get("accept-encoding"),
            Some("identity"),
            "{cred}: {:?}",
            call.headers
        );
    }
}

/// A body compressed anyway is relayed byte for byte with its `content-encoding`, so the
/// client can decode it; and a compressed event stream that breaks ends with an error, not
/// with a plain-text `error` event glued onto compressed bytes.
#[test]
fn a_compressed_answer_keeps_its_encoding_and_gets_nothing_appended() {
    let p = Pool::abc();
    let gz = vec![("content-encoding", "gzip".to_owned())];
    p.up.push(
        "a",
        Reply::Chunks(
            [
                gz.clone(),
                vec![("content-type", "application/json".into())],
            ]
            .concat(),
            vec!["\u{1f}\u{8b}compressed"],
            false,
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200);
    assert_eq!(r.headers.get("content-encoding"), Some("gzip"));
    assert_eq!(r.body, "\u{1f}\u{8b}compressed");
    p.up.push(
        "a",
        Reply::Chunks(
            [gz, vec![("content-type", "text/event-stream".into())]].concat(),
            vec!["\u{1f}\u{8b}part"],
            true,
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.headers.get("content-encoding"), Some("gzip"));
    assert_eq!(r.body, "\u{1f}\u{8b}part<error connection reset by peer>");
}

/// `CONNECT` (whose target names no path) and other methods the pool does not serve get
/// 405 in the provider's error shape, marked as the pool's.
#[test]
fn unserved_methods_get_405_in_the_pools_shape() {
    let p = Pool::abc();
    for (method, path) in [("CONNECT", ""), ("TRACE", "/v1/messages"), ("PATCH", "/x")] {
        let mut req = p.claude_req(Some("S"), "claude-sonnet-4-5");
        req.method = method.into();
        req.path = path.into();
        let r = p.send(req);
        assert_eq!(r.status, 405, "{method} {path}: {}", r.body);
        assert_eq!(r.headers.get(http::ORIGIN_HEADER), Some("pool"));
        assert_eq!(r.json()["type"], "error", "{}", r.body);
    }
    assert!(p.up.seen().is_empty());
}
