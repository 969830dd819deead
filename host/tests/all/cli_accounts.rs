//! Accounts without a provider CLI, end to end: a real `pooler serve` process, the
//! `pooler account login|update`, `route list` and `session list` commands, and fakes on
//! 127.0.0.1 — Claude's authorize and token endpoints, Codex's device-code issuer, and an
//! Anthropic upstream. Each sign-in failure (state mismatch, expired code, refused
//! exchange, device code expired or denied) is a clear error with its exit code, and stores
//! nothing. An update's availability change reaches Provider Retry (a retry waiting an hour
//! moves to now). No secret is ever printed. Nothing waits for a timer: the fake issuer
//! answers a polling interval of 0, and the only polling is bounded and quick (for a turn
//! to reach the retry plugin, for a moved retry to be sent).

#![cfg(unix)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support;
use support::{Served, text};

const CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
const REDIRECT_URI: &str = "https://console.anthropic.com/oauth/code/callback";
const CODEX_CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
const ACCESS: &str = "sk-ant-oat01-fake-access-token-AAAA";
const REFRESH: &str = "sk-ant-ort01-fake-refresh-token-RRRR";
const CODEX_ACCESS_SECRET: &str = "codex-access-secret-XXXX";
const CODEX_REFRESH: &str = "codex-refresh-secret-YYYY";

/// One request a fake saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: String,
}

type Handler = dyn Fn(&Seen) -> (u16, String) + Send + Sync;

/// A fake HTTP server on 127.0.0.1: answers each request with `handler`'s status and JSON
/// body, and records what it saw.
struct Fake {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    fn start(handler: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> Fake {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let url = support::serve_each(move |stream| serve(stream, &record, &handler));
        Fake { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn seen_at(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

fn serve(stream: TcpStream, record: &Mutex<Vec<Seen>>, handler: &Handler) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let Some(support::RawRequest {
        method,
        path,
        headers,
        body,
    }) = support::read_request(&mut reader)
    else {
        return;
    };
    let seen = Seen {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    record.lock().unwrap().push(seen.clone());
    let (status, answer) = handler(&seen);
    // A 429 says when to come back: an hour from now.
    let retry_after = if status == 429 {
        "retry-after: 3600\r\n"
    } else {
        ""
    };
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{retry_after}content-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// `a=b&c=d` (percent-decoded, `+` a space) as a map.
fn query_map(query: &str) -> HashMap<String, String> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn challenge_of(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// One HTTP/1.1 GET over a plain socket (the "browser"); the body.
fn browser_get(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// Claude's OAuth endpoints: `GET /oauth/authorize` checks the parameters, remembers the
/// challenge and answers what the callback page would show (`CODE#STATE`, with the code
/// `code`); `POST /v1/oauth/token` answers by the code: `CODE-OK` tokens (when the verifier
/// matches the remembered challenge), `CODE-EXPIRED` 400 `invalid_grant`, `CODE-REFUSED`
/// 403 `invalid_client`.
fn claude_oauth(code: &'static str) -> Fake {
    let challenge = Arc::new(Mutex::new(String::new()));
    Fake::start(move |seen| {
        if seen.method == "GET" && seen.path.starts_with("/oauth/authorize?") {
            let q = query_map(seen.path.split_once('?').unwrap().1);
            let ok = q.get("client_id").map(String::as_str) == Some(CLIENT_ID)
                && q.get("response_type").map(String::as_str) == Some("code")
                && q.get("redirect_uri").map(String::as_str) == Some(REDIRECT_URI)
                && q.get("code_challenge_method").map(String::as_str) == Some("S256")
                && q.get("code").map(String::as_str) == Some("true")
                && q.get("scope").map(String::as_str)
                    == Some("org:create_api_key user:profile user:inference");
            if !ok {
                return (400, json!({"error": "invalid_request"}).to_string());
            }
            *challenge.lock().unwrap() = q["code_challenge"].clone();
            return (200, format!("{code}#{}", q["state"]));
        }
        if seen.method == "POST" && seen.path == "/v1/oauth/token" {
            let body: Value = serde_json::from_str(&seen.body).unwrap_or(Value::Null);
            let verifier = body["code_verifier"].as_str().unwrap_or("");
            if challenge_of(verifier) != *challenge.lock().unwrap() {
                return (400, json!({"error": "invalid_grant"}).to_string());
            }
            return match body["code"].as_str() {
                Some("CODE-OK") => (
                    200,
                    json!({"access_token": ACCESS, "refresh_token": REFRESH, "expires_in": 28800,
                           "token_type": "Bearer", "scope": "user:inference"})
                    .to_string(),
                ),
                Some("CODE-EXPIRED") => (
                    400,
                    json!({"error": "invalid_grant", "error_description": "Invalid 'code' in request: CODE-EXPIRED"}).to_string(),
                ),
                _ => (
                    403,
                    json!({"error": "invalid_client", "error_description": "no"}).to_string(),
                ),
            };
        }
        (404, "{}".into())
    })
}

/// Run `pooler account login --provider claude` against `oauth`: read the authorize URL it
/// prints, hand it to `paste` (which plays the person: visit it, return what to paste),
/// type that in, and collect the output.
fn claude_login(
    served: &Served,
    oauth: &Fake,
    extra: &[&str],
    paste: impl FnOnce(&str) -> String,
) -> (Output, String) {
    let authorize = format!("{}/oauth/authorize", oauth.url);
    let token = format!("{}/v1/oauth/token", oauth.url);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["account", "login", "--provider", "claude"])
        .args(extra)
        .env("POOLER_DATA_DIR", &served.data)
        .env("POOLER_CLAUDE_AUTHORIZE_URL", &authorize)
        .env("POOLER_CLAUDE_TOKEN_URL", &token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut told = String::new();
    let url = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no authorize URL printed: {told}"
        );
        told.push_str(&line);
        if let Some(url) = line.trim().strip_prefix(&format!("{authorize}?")) {
            break format!("{authorize}?{url}");
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", paste(&url)).unwrap();
    drop(stdin);
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    told.push_str(&rest);
    let out = child.wait_with_output().unwrap();
    for stream in [text(&out.stdout), told.clone()] {
        for secret in [ACCESS, REFRESH, "CODE-OK", "CODE-EXPIRED", "CODE-REFUSED"] {
            assert!(!stream.contains(secret), "a secret was printed: {stream}");
        }
    }
    (out, told)
}

fn accounts(served: &Served) -> Vec<Value> {
    served.json(&["account", "list"])["accounts"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn claude_login_signs_in_with_pkce_and_stores_the_account() {
    let served = Served::start();
    let oauth = claude_oauth("CODE-OK");
    let before = support_now();
    let (out, told) = claude_login(
        &served,
        &oauth,
        &["--label", "max", "--priority", "-1", "--json"],
        browser_get,
    );
    assert_eq!(out.status.code(), Some(0), "{told}");
    assert!(told.contains("CODE#STATE"), "{told}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["account"]["kind"], "oauth", "{answer}");

    // The token endpoint saw one authorization-code grant, with the verifier whose S256
    // challenge the authorize URL carried, Claude Code's client id and redirect URI.
    let authorize = &oauth.seen_at_prefix("/oauth/authorize?")[0];
    let q = query_map(authorize.path.split_once('?').unwrap().1);
    let grants = oauth.seen_at("/v1/oauth/token");
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!(
        grants[0].headers["content-type"], "application/json",
        "{grants:?}"
    );
    let grant: Value = serde_json::from_str(&grants[0].body).unwrap();
    assert_eq!(grant["grant_type"], "authorization_code");
    assert_eq!(grant["code"], "CODE-OK");
    assert_eq!(grant["client_id"], CLIENT_ID);
    assert_eq!(grant["redirect_uri"], REDIRECT_URI);
    assert_eq!(grant["state"].as_str(), Some(q["state"].as_str()));
    let verifier = grant["code_verifier"].as_str().unwrap();
    assert!(verifier.len() >= 43, "{verifier}");
    assert_eq!(challenge_of(verifier), q["code_challenge"]);
    assert_ne!(verifier, q["state"], "the state is not the verifier");
    assert!(!authorize.path.contains(verifier));

    // The account is there: OAuth, labelled, its expiry from `expires_in`.
    let list = accounts(&served);
    assert_eq!(list.len(), 1, "{list:?}");
    let a = &list[0];
    assert_eq!(a["provider"], "claude");
    assert_eq!(a["kind"], "oauth");
    assert_eq!(a["label"], "max");
    assert_eq!(a["priority"], -1);
    assert_eq!(a["secret_hint"], "oauth");
    let expires = a["token_expires_at"].as_u64().unwrap();
    assert!(
        expires >= before + 28_800_000 && expires <= support_now() + 28_800_000,
        "{a}"
    );
    let table = served.ok(&["account", "list"]);
    assert!(table.contains("max"), "{table}");
    assert!(!table.contains(ACCESS) && !table.contains(REFRESH));
}

fn support_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

impl Fake {
    fn seen_at_prefix(&self, prefix: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.starts_with(prefix))
            .collect()
    }
}

#[test]
fn claude_login_failures_say_what_went_wrong_and_store_nothing() {
    let served = Served::start();

    // A code from another sign-in (its state differs): refused before any exchange.
    let oauth = claude_oauth("CODE-OK");
    let (out, told) = claude_login(&served, &oauth, &[], |url| {
        let shown = browser_get(url);
        format!(
            "{}#another-sign-ins-state",
            shown.split_once('#').unwrap().0
        )
    });
    assert_eq!(out.status.code(), Some(1), "{told}");
    assert!(told.contains("state does not match"), "{told}");
    assert!(!told.contains("another-sign-ins-state"), "{told}");
    assert_eq!(oauth.seen_at("/v1/oauth/token").len(), 0);

    // An expired (or already used) code: the token endpoint's invalid_grant, in words.
    let oauth = claude_oauth("CODE-EXPIRED");
    let (out, told) = claude_login(&served, &oauth, &[], browser_get);
    assert_eq!(out.status.code(), Some(1), "{told}");
    assert!(
        told.contains("refused the code (HTTP 400, invalid_grant)") && told.contains("expired"),
        "{told}"
    );
    assert!(
        !told.contains("Invalid 'code'"),
        "the description is not shown: {told}"
    );
    assert_eq!(oauth.seen_at("/v1/oauth/token").len(), 1);

    // A refused exchange.
    let oauth = claude_oauth("CODE-REFUSED");
    let (out, told) = claude_login(&served, &oauth, &["--json"], browser_get);
    assert_eq!(out.status.code(), Some(1), "{told}");
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refused the sign-in (HTTP 403, invalid_client)"),
        "{error}"
    );

    // Something that is not a code: a usage error, exit 2.
    let oauth = claude_oauth("CODE-OK");
    let (out, told) = claude_login(&served, &oauth, &[], |_| "not a code".into());
    assert_eq!(out.status.code(), Some(2), "{told}");
    assert!(told.contains("CODE#STATE"), "{told}");
    assert_eq!(oauth.seen_at("/v1/oauth/token").len(), 0);

    assert_eq!(accounts(&served), Vec::<Value>::new());
}

/// An id token whose claims carry the ChatGPT account id.
fn id_token(account: &str) -> String {
    let claims = URL_SAFE_NO_PAD.encode(
        json!({"email": "a@example.com", "https://api.openai.com/auth": {"chatgpt_account_id": account}})
            .to_string(),
    );
    format!("eyJhbGciOiJub25lIn0.{claims}.sig")
}

#[derive(Clone, Copy, PartialEq)]
enum Device {
    /// Pending twice, then the code.
    Ok,
    /// Always pending.
    Pending,
    /// Denied at the first poll.
    Denied,
    /// The code is issued, the exchange refused.
    ExchangeRefused,
}

/// Codex's issuer: the user code (interval 0), the poll, the token exchange.
fn codex_issuer(mode: Device) -> (Fake, Arc<AtomicUsize>) {
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = polls.clone();
    let fake = Fake::start(move |seen| match seen.path.as_str() {
        "/api/accounts/deviceauth/usercode" => {
            let body: Value = serde_json::from_str(&seen.body).unwrap_or(Value::Null);
            if body["client_id"] != CODEX_CLIENT_ID {
                return (400, "{}".into());
            }
            (
                200,
                json!({"device_auth_id": "dev-1", "user_code": "WXYZ-1234", "interval": "0"})
                    .to_string(),
            )
        }
        "/api/accounts/deviceauth/token" => {
            let body: Value = serde_json::from_str(&seen.body).unwrap_or(Value::Null);
            assert_eq!(body["device_auth_id"], "dev-1");
            assert_eq!(body["user_code"], "WXYZ-1234");
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            match mode {
                Device::Denied => (400, json!({"error": "access_denied"}).to_string()),
                Device::Pending => (403, json!({"error": "authorization_pending"}).to_string()),
                _ if n <= 2 => (404, "{}".into()),
                _ => (
                    200,
                    json!({"authorization_code": "AUTH-CODE-1", "code_challenge": challenge_of("VERIFIER-1"),
                           "code_verifier": "VERIFIER-1"})
                    .to_string(),
                ),
            }
        }
        "/oauth/token" => {
            if mode == Device::ExchangeRefused {
                return (400, json!({"error": "invalid_grant"}).to_string());
            }
            (
                200,
                json!({"id_token": id_token("acct-42"), "access_token": CODEX_ACCESS_SECRET,
                       "refresh_token": CODEX_REFRESH, "expires_in": 3600})
                .to_string(),
            )
        }
        _ => (404, "{}".into()),
    });
    (fake, polls)
}

fn codex_login(served: &Served, issuer: &Fake, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let mut args = vec!["account", "login", "--provider", "codex"];
    args.extend_from_slice(extra);
    let mut all = vec![("POOLER_CODEX_ISSUER", issuer.url.as_str())];
    all.extend_from_slice(env);
    let out = served.pooler_with(&args, &all, None);
    for stream in [text(&out.stdout), text(&out.stderr)] {
        for secret in [
            CODEX_ACCESS_SECRET,
            CODEX_REFRESH,
            "AUTH-CODE-1",
            "VERIFIER-1",
        ] {
            assert!(!stream.contains(secret), "a secret was printed: {stream}");
        }
    }
    out
}

#[test]
fn codex_device_login_polls_exchanges_and_stores_the_account() {
    let served = Served::start();
    let (issuer, polls) = codex_issuer(Device::Ok);
    let out = codex_login(&served, &issuer, &[], &["--label", "plus"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let told = text(&out.stderr);
    assert!(
        told.contains(&format!("{}/codex/device", issuer.url)) && told.contains("WXYZ-1234"),
        "{told}"
    );
    assert!(text(&out.stdout).starts_with("signed in and added codex account "));
    assert_eq!(
        polls.load(Ordering::SeqCst),
        3,
        "pending twice, then the code"
    );

    // The exchange: a form with the code, the server-made verifier, the device callback.
    let exchanges = issuer.seen_at("/oauth/token");
    assert_eq!(exchanges.len(), 1);
    assert_eq!(
        exchanges[0].headers["content-type"],
        "application/x-www-form-urlencoded"
    );
    let form = query_map(&exchanges[0].body);
    assert_eq!(form["grant_type"], "authorization_code");
    assert_eq!(form["code"], "AUTH-CODE-1");
    assert_eq!(form["code_verifier"], "VERIFIER-1");
    assert_eq!(form["client_id"], CODEX_CLIENT_ID);
    assert_eq!(
        form["redirect_uri"],
        format!("{}/deviceauth/callback", issuer.url)
    );

    let list = accounts(&served);
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["provider"], "codex");
    assert_eq!(list[0]["kind"], "oauth");
    assert_eq!(list[0]["label"], "plus");
    assert!(list[0]["token_expires_at"].as_u64().is_some());

    // Signing in again with --replace gives the same account the new tokens.
    let id = list[0]["id"].as_str().unwrap().to_owned();
    let (issuer, _) = codex_issuer(Device::Ok);
    let out = codex_login(&served, &issuer, &[], &["--replace", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("signed in again: codex account "));
    let list = accounts(&served);
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0]["id"].as_str(), list[0]["label"].as_str()),
        (Some(id.as_str()), Some("plus"))
    );
}

#[test]
fn codex_device_login_failures_say_what_went_wrong_and_store_nothing() {
    let served = Served::start();

    let (issuer, _) = codex_issuer(Device::Denied);
    let out = codex_login(&served, &issuer, &[], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the sign-in was denied"),
        "{}",
        text(&out.stderr)
    );

    // Never entered: the code expires (the wait is configured to end at once).
    let (issuer, polls) = codex_issuer(Device::Pending);
    let out = codex_login(
        &served,
        &issuer,
        &[("POOLER_CODEX_DEVICE_TIMEOUT_SECS", "0")],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the device code expired"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(polls.load(Ordering::SeqCst), 1);
    assert!(issuer.seen_at("/oauth/token").is_empty());

    let (issuer, _) = codex_issuer(Device::ExchangeRefused);
    let out = codex_login(&served, &issuer, &[], &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refused the code (HTTP 400, invalid_grant)"),
        "{error}"
    );

    assert_eq!(accounts(&served), Vec::<Value>::new());
}

const KEY_OLD: &str = "sk-ant-api03-old-secret-OLD1";
const KEY_NEW: &str = "sk-ant-api03-new-secret-NEW2";
const KEY_SPARE: &str = "sk-ant-api03-spare-secret-SPR3";

/// A fake Anthropic API: 200 for every key, except the old key once `refuse_old` is set
/// (401, as the real API refuses a revoked key). Requests it would refuse for their shape
/// are refused as the real API would.
fn anthropic(refuse_old: Arc<AtomicBool>) -> Fake {
    Fake::start(move |seen| {
        if let Some(refusal) = support::claude_refusal(
            &seen.method,
            &seen.path,
            &seen.headers,
            seen.body.as_bytes(),
        ) {
            let refusal = String::from_utf8_lossy(&refusal).into_owned();
            let status = refusal.split_whitespace().nth(1).unwrap().parse().unwrap();
            let body = refusal.split_once("\r\n\r\n").unwrap().1.to_owned();
            return (status, body);
        }
        let key = seen.headers.get("x-api-key").map(String::as_str);
        if key == Some(KEY_OLD) && refuse_old.load(Ordering::SeqCst) {
            return (
                401,
                json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}).to_string(),
            );
        }
        (
            200,
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#.into(),
        )
    })
}

/// An agent's request through a route token, for a session; the status.
fn agent_request(served: &Served, token: &str, session: &str) -> u16 {
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello"}],
        "metadata": {"user_id": format!("user_0123_account__session_{session}")},
    })
    .to_string();
    let mut stream = TcpStream::connect(served.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nanthropic-version: 2023-06-01\r\nContent-Length: {}\r\n\r\n{body}",
        served.addr(),
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn open_route(served: &Served, thread: &str, provider: &str) -> String {
    let route = served.json(&["route", "open", "--thread", thread, "--provider", provider]);
    route["route"]["token"].as_str().unwrap().to_owned()
}

fn add_key(served: &Served, key: &str, label: &str, priority: &str) -> String {
    support::add_api_key_with(served, key, label, &["--priority", priority])
}

#[test]
fn account_update_replaces_a_key_in_place_and_clears_its_error() {
    let refuse_old = Arc::new(AtomicBool::new(false));
    let upstream = anthropic(refuse_old.clone());
    let served = Served::start()
        .never_prints(KEY_OLD)
        .never_prints(KEY_NEW)
        .never_prints(KEY_SPARE);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    let work = add_key(&served, KEY_OLD, "work", "3");
    let spare = add_key(&served, KEY_SPARE, "spare", "3");
    served.ok(&["account", "disable", &spare]);
    let token = open_route(&served, "thread-1", "claude");

    // A conversation pinned on `work`; then its key is revoked and it falls into error.
    assert_eq!(agent_request(&served, &token, "s-1"), 200);
    refuse_old.store(true, Ordering::SeqCst);
    assert_ne!(agent_request(&served, &token, "s-2"), 200);
    let shown = served.json(&["account", "show", &work]);
    assert_eq!(shown["account"]["status"], "error", "{shown}");

    // The new key, from standard input.
    let out = served.pooler_with(
        &["account", "update", &work, "--api-key", "-"],
        &[],
        Some(KEY_NEW),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("updated claude account {work} \"work\" (…NEW2), ready")
    );

    // Same id, label, priority and place; error cleared; the pin is still there.
    let list = accounts(&served);
    let ids: Vec<&str> = list.iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [work.as_str(), spare.as_str()]);
    let a = &list[0];
    assert_eq!(
        (a["label"].as_str(), a["priority"].as_i64()),
        (Some("work"), Some(3))
    );
    assert_eq!(a["status"], "ready", "{a}");
    assert_eq!(a["error"], Value::Null, "{a}");
    assert_eq!(a["secret_hint"], "…NEW2");
    let explained = served.json(&["session", "explain", "--provider", "claude", "s-1"]);
    assert_eq!(
        explained["session"]["account"],
        work.as_str(),
        "{explained}"
    );

    // The conversation goes on, on the same account, with the new key.
    let before = upstream.seen().len();
    assert_eq!(agent_request(&served, &token, "s-1"), 200);
    let after = upstream.seen();
    assert_eq!(after.len(), before + 1);
    assert_eq!(after.last().unwrap().headers["x-api-key"], KEY_NEW);

    // Refused: an API key for Codex, an unknown id (exit 1); an empty key (exit 2).
    let codex = served.pooler_with(
        &["account", "add", "--provider", "codex", "--oauth-file", "/dev/stdin", "--json"],
        &[],
        Some(r#"{"access_token": "at-codex-1", "refresh_token": "rt-codex-1", "chatgpt_account_id": "acct-1"}"#),
    );
    assert_eq!(codex.status.code(), Some(0), "{}", text(&codex.stderr));
    let codex: Value = serde_json::from_slice(&codex.stdout).unwrap();
    let codex_id = codex["account"]["id"].as_str().unwrap();
    let out = served.pooler_with(
        &["account", "update", codex_id, "--api-key", "-"],
        &[],
        Some(KEY_SPARE),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("API keys are only for Claude"),
        "{}",
        text(&out.stderr)
    );
    let out = served.pooler_with(
        &["account", "update", "no-such-id", "--api-key", "-"],
        &[],
        Some(KEY_SPARE),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no-such-id"),
        "{}",
        text(&out.stderr)
    );
    let out = served.pooler_with(
        &["account", "update", &work, "--api-key", "-"],
        &[],
        Some("  \n"),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = served.fails(&["account", "update", &work], 2);
    assert!(
        err.contains("--api-key") && err.contains("--oauth-file"),
        "{err}"
    );
    assert_eq!(accounts(&served)[0]["secret_hint"], "…NEW2");
}

/// The per-account options, end to end: set on `account add` and changed by `account
/// update` without a credential, shown by `account list`, `account show` and `status`,
/// refused with exit 2 when out of range; each provider's routing strategy is a
/// `pooler config` setting, shown by `status`.
#[test]
fn account_options_are_set_changed_and_shown() {
    let served = Served::start()
        .never_prints(KEY_OLD)
        .never_prints(KEY_SPARE);
    let spare = served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--api-key",
            "-",
            "--label",
            "spare",
            "--last-resort",
            "--max-in-flight",
            "2",
            "--json",
        ],
        &[],
        Some(KEY_SPARE),
    );
    assert_eq!(spare.status.code(), Some(0), "{}", text(&spare.stderr));
    let spare: Value = serde_json::from_slice(&spare.stdout).unwrap();
    let a = &spare["account"];
    assert_eq!(
        (
            &a["last_resort"],
            &a["max_in_flight"],
            &a["extra_usage"],
            &a["preserve"]
        ),
        (&json!(true), &json!(2), &json!("deny"), &json!(1.0)),
        "{a}"
    );
    let id = a["id"].as_str().unwrap().to_owned();
    let work = add_key(&served, KEY_OLD, "work", "0");

    let out = served.ok(&[
        "account",
        "update",
        &work,
        "--preserve",
        "0.8",
        "--extra-usage",
        "allow",
    ]);
    assert!(out.contains("[extra usage allowed, preserve 80%]"), "{out}");
    let out = served.ok(&[
        "account",
        "update",
        &id,
        "--last-resort=false",
        "--max-in-flight",
        "0",
    ]);
    assert!(!out.contains('['), "back to the defaults: {out}");
    served.ok(&["account", "update", &id, "--last-resort"]);
    let list = served.ok(&["account", "list"]);
    assert!(list.contains("last-resort"), "{list}");
    assert!(list.contains("extra-usage,preserve 80%"), "{list}");
    let shown = served.ok(&["account", "show", &work]);
    assert!(shown.contains("extra usage   allow"), "{shown}");
    assert!(
        shown.contains("no new conversation from 80% weekly"),
        "{shown}"
    );
    let status = served.ok(&["status"]);
    assert!(status.contains("[last-resort]"), "{status}");

    let err = served.fails(&["account", "update", &work, "--preserve", "1.5"], 2);
    assert!(err.contains("a fraction > 0 and ≤ 1"), "{err}");
    let err = served.fails(&["account", "update", &work, "--extra-usage", "maybe"], 2);
    assert!(err.contains("allow"), "{err}");
    let err = served.fails(&["account", "update", &work, "--max-in-flight", "10001"], 2);
    assert!(err.contains("10001"), "{err}");

    served.ok(&["config", "set", "pool.claude-strategy", "soonest-reset"]);
    let got = served.ok(&["config", "get", "pool.claude-strategy"]);
    assert!(got.contains("soonest-reset"), "{got}");
    let err = served.fails(&["config", "set", "pool.codex-strategy", "round-robin"], 1);
    assert!(err.contains("fill-first, spread, soonest-reset"), "{err}");
    let status = served.ok(&["status"]);
    assert!(
        status.contains("new conversations: soonest-reset"),
        "{status}"
    );
}

/// The availability change an update signals reaches Provider Retry: a retry waiting an
/// hour for a rate-limited account moves to now once the account in error gets a working
/// key, and the turn is then served with that key.
#[test]
fn account_update_signals_availability_so_a_waiting_retry_moves() {
    let limit_work = Arc::new(AtomicBool::new(false));
    let flag = limit_work.clone();
    let upstream = Fake::start(move |seen| {
        if let Some(refusal) = support::claude_refusal(
            &seen.method,
            &seen.path,
            &seen.headers,
            seen.body.as_bytes(),
        ) {
            let refusal = String::from_utf8_lossy(&refusal).into_owned();
            let status = refusal.split_whitespace().nth(1).unwrap().parse().unwrap();
            return (status, refusal.split_once("\r\n\r\n").unwrap().1.to_owned());
        }
        match seen.headers.get("x-api-key").map(String::as_str) {
            Some(KEY_OLD) => (
                401,
                json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}).to_string(),
            ),
            Some(KEY_SPARE) if flag.load(Ordering::SeqCst) => (
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}).to_string(),
            ),
            _ => (
                200,
                r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#.into(),
            ),
        }
    });
    let served = Served::start()
        .never_prints(KEY_OLD)
        .never_prints(KEY_NEW)
        .never_prints(KEY_SPARE);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    // `revoked` is tried first and its key is refused: it falls into error.
    let revoked = add_key(&served, KEY_OLD, "revoked", "0");
    add_key(&served, KEY_SPARE, "limited", "1");
    let token = open_route(&served, "probe", "claude");
    assert_eq!(agent_request(&served, &token, "p-1"), 200);
    assert_eq!(
        served.json(&["account", "show", &revoked])["account"]["status"],
        "error"
    );

    // The other account is rate limited for an hour: the thread's turn fails and Provider
    // Retry schedules it for then.
    limit_work.store(true, Ordering::SeqCst);
    let thread = served.ok(&["thread", "new", "--provider", "claude", "hello"]);
    let thread = thread.trim().to_owned();
    let started = std::time::Instant::now();
    let send_at = loop {
        let status = served.json(&["retry", "status"]);
        if let Some(c) = status["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["thread"] == thread.as_str() && c["send_at"].is_u64())
        {
            break c["send_at"].as_u64().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no retry: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        send_at > support_now() + 3_000_000,
        "about an hour ahead: {send_at}"
    );

    // A working key for the account in error: the pool signals, Provider Retry moves the
    // retry to now, and the turn is served with the new key.
    let out = served.pooler_with(
        &["account", "update", &revoked, "--api-key", "-"],
        &[],
        Some(KEY_NEW),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let started = std::time::Instant::now();
    loop {
        let explained = served.json(&["retry", "explain", &thread]);
        let moved = explained["chains"][0]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| {
                e["trigger"]["kind"] == "signal"
                    && e["trigger"]["causes"]
                        .as_str()
                        .is_some_and(|c| c.contains("account error cleared"))
            });
        let served_new = upstream
            .seen()
            .iter()
            .any(|s| s.headers.get("x-api-key").map(String::as_str) == Some(KEY_NEW));
        if moved && served_new {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the retry did not move after the update: {explained}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn route_list_and_session_list_show_what_is_open_and_pinned_without_tokens() {
    let upstream = anthropic(Arc::new(AtomicBool::new(false)));
    let served = Served::start();
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    let id = add_key(&served, KEY_OLD, "work", "0");
    let t1 = open_route(&served, "thread-1", "claude");
    let t2 = open_route(&served, "thread-2", "claude");
    let t3 = open_route(&served, "thread-1", "codex");
    let served = served.never_prints(&t1).never_prints(&t2).never_prints(&t3);

    let routes = served.json(&["route", "list"]);
    let listed: Vec<(String, String)> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r.get("token").is_none(), "{r}");
            assert!(r["opened_at"].as_u64().is_some(), "{r}");
            (
                r["thread"].as_str().unwrap().into(),
                r["provider"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("thread-1".to_owned(), "claude".to_owned()),
            ("thread-1".into(), "codex".into()),
            ("thread-2".into(), "claude".into()),
        ]
    );
    let codex = served.json(&["route", "list", "--provider", "codex"]);
    assert_eq!(codex["routes"].as_array().unwrap().len(), 1, "{codex}");
    let table = served.ok(&["route", "list"]);
    assert!(
        table.contains("THREAD") && table.contains("thread-2"),
        "{table}"
    );
    served.ok(&[
        "route",
        "close",
        "--thread",
        "thread-2",
        "--provider",
        "claude",
    ]);
    assert_eq!(
        served.json(&["route", "list"])["routes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Two conversations on thread-1, one on thread-2 (its route opened again), each
    // pinned on the account.
    let t2 = open_route(&served, "thread-2", "claude");
    let served = served.never_prints(&t2);
    assert_eq!(agent_request(&served, &t1, "a-1"), 200);
    assert_eq!(agent_request(&served, &t1, "a-2"), 200);
    assert_eq!(agent_request(&served, &t2, "b-1"), 200);
    let keys = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["session", "list"];
        all.extend_from_slice(args);
        served.json(&all)["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                assert_eq!(s["account"], id.as_str(), "{s}");
                s["key"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let mut every = keys(&[]);
    every.sort();
    assert_eq!(every, ["session:a-1", "session:a-2", "session:b-1"]);
    let mut one = keys(&["--thread", "thread-1"]);
    one.sort();
    assert_eq!(one, ["session:a-1", "session:a-2"]);
    assert_eq!(
        keys(&["--thread", "thread-2", "--provider", "claude"]),
        ["session:b-1"]
    );
    assert_eq!(keys(&["--provider", "codex"]), Vec::<String>::new());
    assert_eq!(keys(&["--thread", "thread-9"]), Vec::<String>::new());
    let table = served.ok(&["session", "list", "--thread", "thread-2"]);
    assert!(
        table.contains("session:b-1") && table.contains("thread-2"),
        "{table}"
    );
    assert!(!table.contains("a-1"), "{table}");
    assert_eq!(
        served
            .ok(&["session", "list", "--provider", "codex"])
            .trim(),
        "no pinned sessions"
    );
}

/// Characters no output may carry raw: terminal escapes (ESC, BEL, the one-byte C1 CSI),
/// bidi controls, zero-width characters.
const RAW: [char; 8] = [
    '\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{2066}', '\u{2069}', '\u{200b}', '\u{feff}',
];

fn assert_no_raw(what: &str, output: &str) {
    if let Some(c) = output.chars().find(|c| RAW.contains(c)) {
        panic!("{what} printed {c:?} raw: {output:?}");
    }
}

/// Text from outside is printed written out, never raw: an upstream refusal carrying an OSC
/// title, a screen clear, a C1 CSI and a bidi override (`account list`, `account show`,
/// `status`); a label with bidi isolates; a client's session id with a bidi override and
/// zero-width characters (`session list`). `--json` stays JSON that reads back as the same
/// strings, those characters as `\u` escapes.
#[test]
fn outside_text_is_printed_escaped_and_json_reads_back_the_same() {
    const HOSTILE: &str = "bad key\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\u{202e}gnp.exe";
    const SHOWN: &str = r"bad key\x1b]0;pwned\x07\x1b[2J\x9b31m\u{202e}gnp.exe";
    const LABEL: &str = "ops\u{2066}x\u{2069}";
    const SESSION: &str = "s\u{202e}\u{200b}evil\u{feff}";
    let upstream = Fake::start(move |seen| {
        match seen.headers.get("x-api-key").map(String::as_str) {
            Some(KEY_OLD) => (
                401,
                json!({"type": "error", "error": {"type": "authentication_error", "message": HOSTILE}}).to_string(),
            ),
            _ => (
                200,
                r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#.into(),
            ),
        }
    });
    let served = Served::start()
        .never_prints(KEY_OLD)
        .never_prints(KEY_SPARE);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    let refused = add_key(&served, KEY_OLD, LABEL, "0");
    add_key(&served, KEY_SPARE, "spare", "1");
    let token = open_route(&served, "thread-1", "claude");
    let served = served.never_prints(&token);
    // Refused on the first account, served by the second, which pins the session.
    assert_eq!(agent_request(&served, &token, SESSION), 200);

    for args in [
        vec!["account", "list"],
        vec!["account", "show", &refused],
        vec!["status"],
    ] {
        let out = served.ok(&args);
        assert_no_raw(&args.join(" "), &out);
        assert!(out.contains(SHOWN), "{args:?}: {out}");
        assert!(out.contains(r"ops\u{2066}x\u{2069}"), "{args:?}: {out}");
    }
    let sessions = served.ok(&["session", "list"]);
    assert_no_raw("session list", &sessions);
    assert!(
        sessions.contains(r"session:s\u{202e}\u{200b}evil\u{feff}"),
        "{sessions}"
    );

    // JSON: no raw character either, and the same strings once read.
    for args in [
        vec!["account", "list", "--json"],
        vec!["status", "--json"],
        vec!["session", "list", "--json"],
    ] {
        let out = served.ok(&args);
        assert_no_raw(&args.join(" "), &out);
        let value: Value = serde_json::from_str(&out).unwrap();
        match args[0] {
            "account" => {
                let a = &value["accounts"][0];
                assert_eq!(a["label"], LABEL);
                assert!(a["error"].as_str().unwrap().ends_with(HOSTILE), "{a}");
            }
            "session" => {
                assert_eq!(value["sessions"][0]["key"], format!("session:{SESSION}"));
            }
            _ => assert!(out.contains(r"\u202e"), "{out}"),
        }
    }
}

#[test]
fn the_new_commands_explain_themselves() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        text(&out.stdout)
    };
    let login = help(&["account", "login"]);
    for word in [
        "--provider",
        "--replace",
        "--authorize-url",
        "--token-url",
        "--issuer",
        "CODE#STATE",
    ] {
        assert!(login.contains(word), "{word}: {login}");
    }
    let update = help(&["account", "update"]);
    assert!(
        update.contains("--api-key") && update.contains("pinned"),
        "{update}"
    );
    for command in ["add", "update", "import", "login"] {
        let text = help(&["account", command]);
        for flag in [
            "--last-resort",
            "--extra-usage",
            "--max-in-flight",
            "--preserve",
        ] {
            assert!(text.contains(flag), "account {command}: {flag}: {text}");
        }
    }
    assert!(help(&["route", "list"]).contains("never a token"));
    let sessions = help(&["session", "list"]);
    assert!(
        sessions.contains("--thread") && sessions.contains("--provider"),
        "{sessions}"
    );
}
