//! The admin router without plugins: the token, the paths, the body rules and the error
//! shape. (With the real plugins it is driven end to end by `host/tests/all/cli_pool.rs`.)

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use serde_json::Value;

use super::*;
use crate::config::Config;
use crate::operate::wire::percent_encode;
use crate::runtime::HostOptions;
use crate::runtime::imports::threads::NoCore;

pub(super) const TOKEN: &str = "0123456789abcdef";

/// An admin router over a host with no plugins (shared with the areas' own tests).
pub(super) fn admin() -> (tempfile::TempDir, Admin) {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::new(HostOptions {
        config: Config::parse(
            "[plugins.account-pool]\ncomponent = \"none\"\n\
             [plugins.provider-retry]\ncomponent = \"none\"\n",
        )
        .unwrap(),
        data_dir: dir.path().to_owned(),
        clock: Arc::new(pooler_core::clock::SystemClock::new()),
        threads: Arc::new(NoCore),
        cache_dir: None,
        seed: None,
    })
    .unwrap();
    let admin = Admin::new(
        host,
        TOKEN.to_owned(),
        "0.0.0.0:8787".parse().unwrap(),
        Arc::new(AtomicUsize::new(0)),
    );
    (dir, admin)
}

pub(super) async fn call(
    admin: &Admin,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = admin.handle(request).await;
    let status = response.status();
    assert_eq!(response.headers()["content-type"], "application/json");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn error(value: &Value) -> (&str, &str) {
    (
        value["error"]["code"].as_str().unwrap(),
        value["error"]["message"].as_str().unwrap(),
    )
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_refused_with_401() {
    let (_dir, admin) = admin();
    for token in [None, Some("wrong"), Some("0123456789abcdeF"), Some("")] {
        let (status, body) = call(&admin, "GET", "/_pooler/status", token, "").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(error(&body).0, "unauthorized");
    }
    let (status, body) = call(&admin, "GET", "/_pooler/status", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    // Bound to every address, routes still point at loopback.
    assert_eq!(body["endpoint"], "http://127.0.0.1:8787");
}

#[tokio::test]
async fn unknown_endpoints_are_404_naming_the_path() {
    let (_dir, admin) = admin();
    for (method, path) in [
        ("GET", "/_pooler/nothing"),
        ("GET", "/_pooler"),
        ("PATCH", "/_pooler/accounts"),
        ("POST", "/_pooler/accounts/a1/explode"),
    ] {
        let (status, body) = call(&admin, method, path, Some(TOKEN), "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        let (code, message) = error(&body);
        assert_eq!(code, "no-such-endpoint");
        assert!(message.contains(method), "{message}");
    }
}

#[tokio::test]
async fn a_missing_plugin_is_503() {
    let (_dir, admin) = admin();
    let (status, body) = call(&admin, "GET", "/_pooler/accounts", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (code, message) = error(&body);
    assert_eq!(code, "plugin-unavailable");
    assert!(message.contains("account-pool"), "{message}");
    // With no plugin loaded there are no plugin settings, only the host's read-only
    // `[alerts]` table.
    let (status, body) = call(&admin, "GET", "/_pooler/settings", Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK);
    let keys: Vec<&str> = body["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("alerts.")),
        "{keys:?}"
    );
    let (status, body) = call(
        &admin,
        "PUT",
        "/_pooler/settings/alerts.webhook",
        Some(TOKEN),
        r#"{"value":"https://x.example/hook"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error(&body).1.contains("[alerts]"), "{body}");
    let (status, body) = call(
        &admin,
        "GET",
        "/_pooler/settings/alerts.format",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["setting"]["value"], "json");
}

#[tokio::test]
async fn refused_bodies_name_the_field_and_never_echo_a_secret() {
    let (_dir, admin) = admin();
    let cases = [
        ("not json", "bad-body", "not JSON"),
        ("[1]", "bad-body", "JSON object"),
        (
            r#"{"credential": {"api_key": "sk-secret-1"}}"#,
            "missing-field",
            "`provider`",
        ),
        (
            r#"{"provider": "gemini", "credential": {"api_key": "sk-secret-1"}}"#,
            "invalid-field",
            "`provider` must be `claude` or `codex`",
        ),
        (
            r#"{"provider": "claude", "credential": "sk-secret-1"}"#,
            "invalid-field",
            "`credential` must be an object",
        ),
        (
            r#"{"provider": "claude", "credential": {"api_key": "sk-secret-1"}, "prioirty": 1}"#,
            "unknown-field",
            "`prioirty`",
        ),
        (
            r#"{"provider": "claude", "credential": {"api_key": "sk-secret-1", "oauth": {}}}"#,
            "invalid-credential",
            "exactly one",
        ),
        (
            r#"{"provider": "codex", "credential": {"oauth": {"access_token": "sk-secret-1"}}}"#,
            "missing-field",
            "`credential.oauth.refresh_token` is required",
        ),
        (
            r#"{"provider": "claude", "credential": {"api_key": "sk-secret-1"}, "priority": "sk-secret-1"}"#,
            "invalid-field",
            "`priority` must be a whole number",
        ),
    ];
    for (body, code, says) in cases {
        let (status, answer) = call(&admin, "POST", "/_pooler/accounts", Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let (got, message) = error(&answer);
        assert_eq!(got, code, "{body}: {message}");
        assert!(message.contains(says), "{body}: {message}");
        assert!(!answer.to_string().contains("sk-secret"), "{answer}");
    }
}

#[tokio::test]
async fn settings_keys_need_a_role_prefix() {
    let (_dir, admin) = admin();
    let (status, body) = call(
        &admin,
        "PUT",
        "/_pooler/settings/switch-threshold",
        Some(TOKEN),
        r#"{"value": "0.5"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (code, message) = error(&body);
    assert_eq!(code, "unknown-setting");
    assert!(
        message.contains("`switch-threshold`") && message.contains("pool."),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let (_dir, admin) = admin();
    let body = "x".repeat(MAX_BODY_BYTES + 1);
    let (status, answer) = call(
        &admin,
        "POST",
        "/_pooler/accounts/import",
        Some(TOKEN),
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error(&answer).0, "body-too-large");
}

#[tokio::test]
async fn routes_need_a_known_provider_in_the_path() {
    let (_dir, admin) = admin();
    let (status, body) = call(
        &admin,
        "DELETE",
        "/_pooler/routes/gemini/t1",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error(&body).1.contains("`gemini`"));
}

#[test]
fn path_segments_round_trip_through_percent_encoding() {
    for text in ["plain", "session:abc/def", "a b%c", "ü-ñ", ""] {
        assert_eq!(percent_decode(&percent_encode(text)).unwrap(), text);
    }
    assert_eq!(percent_encode("a/b c"), "a%2Fb%20c");
    assert!(percent_decode("%zz").is_err());
    assert!(percent_decode("%4").is_err());
    assert!(percent_decode("%FF").is_err());
}

#[test]
fn requests_split_into_area_rest_and_query() {
    let req = AdminRequest::new(
        "GET",
        "/_pooler/sessions/claude/session%3Aabc%2F1",
        Some("provider=codex&x"),
        Bytes::new(),
    )
    .unwrap();
    assert_eq!(req.area(), "sessions");
    assert_eq!(req.rest(), vec!["claude", "session:abc/1"]);
    assert_eq!(req.query("provider"), Some("codex"));
    assert_eq!(req.query("x"), Some(""));
    assert_eq!(req.query("y"), None);
}
