//! An upstream that echoes the account's credential in what it answers: the pool keeps and
//! relays that text without it (the account's error, its quota observation, the failure
//! answered to the client, a passed-through error body), whole or in 12-byte pieces.

use super::*;

const KEY: &str = "sk-ant-api03-Qz7xK2pL9mW4vN8rOKOK";

/// Every 12-byte piece of `secret`.
fn pieces(secret: &str) -> Vec<&str> {
    (0..=secret.len() - crate::redact::PIECE)
        .map(|i| &secret[i..i + crate::redact::PIECE])
        .collect()
}

fn assert_clean(what: &str, text: &str, secret: &str) {
    for p in pieces(secret) {
        assert!(
            !text.contains(p),
            "{what} holds `{p}` of the secret: {text}"
        );
    }
}

fn echo(status: u16, kind: &str, message: &str) -> Reply {
    Reply::Status(
        status,
        vec![("content-type", "application/json".into())],
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string(),
    )
}

/// A pool with one account whose API key is `KEY` (labelled `k`).
fn pool_with_key() -> Pool {
    let p = Pool::new();
    let info = p
        .admin()
        .add(NewAccount {
            provider: Provider::Claude,
            credential: Credential::ApiKey(KEY.into()),
            label: Some("k".into()),
            priority: None,
            options: None,
        })
        .unwrap();
    p.ids.borrow_mut().insert("k".into(), info.id);
    p
}

#[test]
fn a_401_echoing_the_api_key_leaves_it_out_of_the_error_and_the_answer() {
    let p = pool_with_key();
    p.up.set(
        KEY,
        echo(
            401,
            "authentication_error",
            &format!("invalid x-api-key {KEY}"),
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 401, "{}", r.body);
    assert_clean("the answer", &r.body, KEY);
    assert_eq!(
        r.json()["error"]["message"],
        "invalid x-api-key [redacted]",
        "the rest of the upstream's message is kept"
    );
    let listed = p.admin().list(None).unwrap();
    let error = listed[0].error.clone().expect("in error");
    assert_clean("the account's error", &error, KEY);
    assert!(error.ends_with("invalid x-api-key [redacted]"), "{error}");
}

#[test]
fn a_refused_fresh_token_echoed_is_left_out_of_the_503() {
    let p = Pool::new();
    let access = "sk-ant-oat01-Lp4oI8uY2tR6eW1qOLDA";
    let fresh = "sk-ant-oat01-Gh8jK2lP6oI4uY9tNEWA";
    let refresh = "sk-ant-ort01-Zx1cV5bN9mQ3wE7rNEWR";
    p.add_oauth(Provider::Claude, "o", access, None);
    p.up.set(access, echo(401, "authentication_error", "expired"));
    p.up.set(
        fresh,
        echo(
            403,
            "permission_error",
            &format!("token {fresh} (refresh {refresh}) is not allowed"),
        ),
    );
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            json!({"access_token": fresh, "refresh_token": refresh}).to_string(),
        ),
    );
    let r = p.claude(None);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_clean("the answer", &r.body, fresh);
    assert_clean("the answer", &r.body, refresh);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.ends_with("token [redacted] (refresh [redacted]) is not allowed"),
        "{message}"
    );
}

/// A passed-through error body is relayed as it streams, the key taken out even where it
/// is split across chunks; the rest of the body is byte for byte the upstream's, and no
/// `content-length` promises the upstream's length.
#[test]
fn a_passed_through_body_echoing_the_key_across_chunks_is_relayed_without_it() {
    let p = pool_with_key();
    let body = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": format!("header x-api-key: {KEY} is not valid here: «é»")}})
    .to_string();
    let at = body.find("api03-").unwrap();
    let chunks = vec![
        body[..at].to_owned(),
        body[at..at + 7].to_owned(),
        body[at + 7..].to_owned(),
    ];
    p.up.set(
        KEY,
        Reply::Chunked(
            400,
            vec![
                ("content-type", "application/json".into()),
                ("content-length", body.len().to_string()),
            ],
            chunks,
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 400);
    assert_eq!(r.body, body.replace(KEY, "[redacted]"));
    assert_eq!(r.headers.get("content-length"), None);
    assert_eq!(p.status_of("k"), crate::model::AccountStatus::Ready);
}

#[test]
fn a_served_answer_is_relayed_untouched() {
    let p = pool_with_key();
    let text = format!(r#"{{"content":"keys look like {KEY}"}}"#);
    p.up.set(
        KEY,
        Reply::Status(
            200,
            vec![("content-type", "application/json".into())],
            text.clone(),
        ),
    );
    assert_eq!(p.claude(Some("S")).body, text);
}

#[test]
fn quota_headers_echoing_the_key_are_stored_without_it() {
    let p = pool_with_key();
    p.up.set(
        KEY,
        Reply::Status(
            200,
            vec![
                ("content-type", "application/json".into()),
                ("anthropic-ratelimit-unified-5h-utilization", "0.5".into()),
                (
                    "anthropic-ratelimit-unified-5h-status",
                    format!("allowed {KEY}"),
                ),
                (
                    "anthropic-ratelimit-unified-representative-claim",
                    KEY.into(),
                ),
            ],
            "{}".into(),
        ),
    );
    assert_eq!(p.claude(Some("S")).status, 200);
    let a = p.store().account(&p.id("k")).unwrap().unwrap();
    assert_eq!(a.quota.representative_claim.as_deref(), Some("[redacted]"));
    // The parser lowercases a status: the key is found whatever its letters' case.
    assert_eq!(
        a.quota.windows[0].status.as_deref(),
        Some("allowed [redacted]")
    );
}
