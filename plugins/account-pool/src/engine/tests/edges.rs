//! The proxy's edges: forwarding, beta headers, passed-through statuses, unreachable
//! upstreams, refusals, settings, maintenance and usage fetches.

use super::*;

#[test]
fn claude_forwarding_keeps_path_query_and_allowed_headers_only() {
    let p = Pool::abc();
    let mut req = p.claude_req(Some("S"), "m");
    req.headers.push("x-stainless-os", "Linux");
    req.headers.push("cookie", "c=1");
    p.send(req);
    let sent = p.up.last();
    assert_eq!(sent.url, "https://api.anthropic.com/v1/messages?beta=true");
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.headers.get("x-api-key"), Some("a"));
    assert_eq!(sent.headers.get("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.headers.get("x-stainless-os"), Some("Linux"));
    assert!(
        sent.headers.get("authorization").is_none(),
        "the route token never goes upstream"
    );
    assert!(sent.headers.get("cookie").is_none());
    let mut count = p.claude_req(Some("S"), "m");
    count.path = "/v1/messages/count_tokens".into();
    count.query = None;
    assert_eq!(p.send(count).status, 200);
    assert_eq!(
        p.up.last().url,
        "https://api.anthropic.com/v1/messages/count_tokens"
    );
}

/// Claude Code sends its own `anthropic-beta` list; an OAuth account's request carries it
/// plus the OAuth beta (once, the client's order kept), an API-key account's request carries
/// it unchanged, and a request with no betas gets the OAuth beta alone on OAuth.
#[test]
fn an_oauth_request_adds_the_oauth_beta_to_the_clients_betas() {
    let claude_code = "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24";
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "at-o", None);
    let beta_of = |betas: Option<&str>| {
        let mut req = p.claude_req(Some("S"), "m");
        if let Some(b) = betas {
            req.headers.push("anthropic-beta", b);
        }
        assert_eq!(p.send(req).status, 200);
        let sent = p.up.last();
        assert_eq!(sent.headers.get("authorization"), Some("Bearer at-o"));
        let all: Vec<&str> = sent
            .headers
            .iter()
            .filter(|(n, _)| *n == "anthropic-beta")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(all.len(), 1, "one anthropic-beta header: {all:?}");
        all[0].to_string()
    };
    assert_eq!(
        beta_of(Some(claude_code)),
        format!("{claude_code},oauth-2025-04-20")
    );
    assert_eq!(beta_of(None), "oauth-2025-04-20");
    assert_eq!(
        beta_of(Some("oauth-2025-04-20,claude-code-20250219")),
        "oauth-2025-04-20,claude-code-20250219"
    );

    let k = Pool::abc();
    let mut req = k.claude_req(Some("S"), "m");
    req.headers.push("anthropic-beta", claude_code);
    assert_eq!(k.send(req).status, 200);
    let sent = k.up.last();
    assert_eq!(sent.headers.get("x-api-key"), Some("a"));
    assert_eq!(sent.headers.get("anthropic-beta"), Some(claude_code));
    assert!(k.send(k.claude_req(Some("S"), "m")).status == 200);
    assert_eq!(k.up.last().headers.get("anthropic-beta"), None);
}

/// An upstream's `x-pooler-origin` would read as the pool's own verdict, and its
/// `set-cookie` is for a client that never talks to the provider: neither reaches the
/// client, on a success or on a passed-through failure; the rate-limit headers do.
#[test]
fn upstream_origin_and_cookie_headers_never_reach_the_client() {
    let p = Pool::abc();
    for status in [200, 400] {
        p.up.set(
            "a",
            Reply::Status(
                status,
                vec![
                    ("content-type", "application/json".into()),
                    ("x-pooler-origin", "pool".into()),
                    ("set-cookie", "__cf_bm=abc; HttpOnly".into()),
                    ("anthropic-ratelimit-unified-status", "allowed".into()),
                ],
                "{}".into(),
            ),
        );
        let r = p.claude(Some("S"));
        assert_eq!(r.status, status);
        assert_eq!(r.headers.get("x-pooler-origin"), None, "{status}");
        assert_eq!(r.headers.get("set-cookie"), None, "{status}");
        assert_eq!(
            r.headers.get("anthropic-ratelimit-unified-status"),
            Some("allowed")
        );
    }
}

#[test]
fn passed_through_statuses_are_returned_as_is() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Status(
            400,
            vec![
                ("content-type", "application/json".into()),
                ("content-length", "9".into()),
            ],
            r#"{"bad":1}"#.into(),
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (400, r#"{"bad":1}"#));
    assert_eq!(
        r.headers.get("content-length"),
        None,
        "framing headers are the host's"
    );
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.store().pin_count().unwrap(), 0, "only a success pins");
}

#[test]
fn unreachable_upstream_gives_the_pools_502_and_logs_no_secret() {
    let p = Pool::new();
    p.add_key("sk-secret-key");
    p.up.set("sk-secret-key", Reply::Drop);
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (502, Some("pool"))
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not reach Anthropic")
    );
    let logs = p.env.logs.borrow().join("\n");
    assert!(
        logs.contains("ECONNRESET") && !logs.contains("sk-secret"),
        "{logs}"
    );
}

#[test]
fn no_enabled_account_is_the_pools_503_and_routing_off_refuses() {
    let p = Pool::new();
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (503, Some("pool"))
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no enabled account")
    );
    p.add_key("a");
    p.admin().set_setting("claude-routing", "off").unwrap();
    assert_eq!(p.claude(None).status, 503);
    assert!(p.up.seen().is_empty());
}

#[test]
fn refused_fresh_token_is_held_and_answered_with_503_not_error() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "old", None);
    p.up.set("old", status(403));
    p.up.set("new", status(403));
    p.up.set(
        "token-endpoint",
        Reply::Status(200, vec![], r#"{"access_token":"new"}"#.into()),
    );
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (503, Some("pool"))
    );
    assert_eq!(p.up.seen(), ["old", "new"]);
    assert_eq!(p.status_of("o"), crate::model::AccountStatus::Held);
    p.env.advance(30_000);
    assert_eq!(p.claude(None).status, 503);
    assert!(p.up.seen().is_empty(), "held: no upstream call");
    p.up.clear("new");
    p.env.advance(31_000);
    assert_eq!(p.claude(None).status, 200);
    assert_eq!(p.up.seen(), ["new"]);
    assert_eq!(p.up.count("token-endpoint"), 1, "no second refresh");
}

#[test]
fn token_refresh_refused_after_401_marks_the_account_in_error() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "old", None);
    p.add_key("b");
    p.up.set("old", status(401));
    p.up.set("token-endpoint", Reply::Status(400, vec![], "{}".into()));
    assert_eq!(p.claude(None).status, 200);
    assert_eq!(p.up.seen(), ["old", "b"]);
    let o = p
        .admin()
        .list(None)
        .unwrap()
        .into_iter()
        .find(|a| a.label == "o")
        .unwrap();
    assert_eq!(o.status, crate::model::AccountStatus::Error);
    assert_eq!(
        o.error.as_deref(),
        Some("OAuth refresh failed with HTTP 400.")
    );
}

#[test]
fn pin_lifetime_setting_expires_pins() {
    let p = Pool::abc();
    p.admin().set_setting("pin-lifetime", "1m").unwrap();
    p.claude(Some("S"));
    p.store()
        .cas_cursor(Provider::Claude, Some(&p.id("a")), &p.id("b"))
        .unwrap();
    p.env.advance(59_000);
    p.claude(Some("S"));
    p.env.advance(60_000);
    p.claude(Some("S"));
    assert_eq!(
        p.up.seen(),
        ["a", "a", "b"],
        "touched at 59 s, expired a minute later"
    );
}

#[test]
fn transient_retries_respect_settings_and_the_inline_wait() {
    let p = Pool::abc();
    p.admin().set_setting("transient-retries", "3").unwrap();
    p.admin().set_setting("transient-backoff", "4s").unwrap();
    p.admin().set_setting("inline-wait", "10s").unwrap();
    p.up.set("a", status(529));
    p.claude(Some("S"));
    assert_eq!(
        p.up.seen(),
        ["a", "a", "a", "b"],
        "the third retry would pass the inline wait"
    );
    assert_eq!(*p.env.sleeps.borrow(), [4_000, 4_000]);
}

#[test]
fn maintenance_refreshes_usage_and_expiring_tokens() {
    let p = Pool::new();
    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 2 * 60_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    p.up.set(
        "usage",
        Reply::Status(
            200,
            vec![],
            json!({"five_hour": {"utilization": 40.0, "resets_at": "2023-11-15T00:00:00Z"}})
                .to_string(),
        ),
    );
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 1);
    assert_eq!(p.up.count("usage"), 1);
    // Both are bounded; a model call is left the host's long defaults.
    for call in ["token-endpoint", "usage"] {
        assert_eq!(
            p.up.calls_to(call)[0].deadlines,
            Deadlines::SERVICE,
            "{call}"
        );
    }
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.last().deadlines, Deadlines::MODEL);
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.token_expires_at, Some(T0 + 3_600_000));
    assert_eq!(info.windows[0].utilization, Some(0.4));
    block_on(p.admin().tick(p.env.now() + 1_000)).unwrap();
    assert_eq!(
        p.up.count("usage"),
        1,
        "not due again before the usage refresh interval"
    );
    assert!(
        matches!(p.store().credential(&o).unwrap(), Some(Credential::OAuth(t)) if t.access_token == "at-2")
    );
}

/// The usage endpoint refusing the access token (401) leads to one token refresh and one
/// more usage fetch with the new token; a refused refresh of a valid token flags the
/// sign-in and keeps the account serving.
#[test]
fn a_usage_401_refreshes_the_token_once_and_fetches_again() {
    let p = Pool::new();
    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 3_600_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    p.up.push("usage", status(401));
    p.up.set(
        "usage",
        Reply::Status(
            200,
            vec![],
            json!({"five_hour": {"utilization": 40.0, "resets_at": "2023-11-15T00:00:00Z"}})
                .to_string(),
        ),
    );
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 1, "one refresh");
    let usage = p.up.calls_to("usage");
    assert_eq!(
        usage.len(),
        2,
        "the refused fetch and one with the new token"
    );
    assert_eq!(usage[0].headers.get("authorization"), Some("Bearer at-1"));
    assert_eq!(usage[1].headers.get("authorization"), Some("Bearer at-2"));
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.windows[0].utilization, Some(0.4));
    assert!(info.error.is_none());

    // A 401 again and the refresh refused while the token is still valid: the sign-in is
    // flagged, the account keeps serving (#6167), and nothing is fetched a third time.
    p.env.advance(20 * 60_000);
    p.up.push("usage", status(401));
    p.up.push("token-endpoint", status(400));
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 2);
    assert_eq!(p.up.count("usage"), 3);
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.id, o);
    assert!(info.needs_sign_in);
    assert!(info.error.is_none(), "{:?}", info.error);
}
