//! Secrets never appear in the log or in any command's output. A real `pooler serve` process
//! logs as JSON to a file (the host, core and plugins at trace, libraries at debug); the test configures API keys, OAuth access and
//! refresh tokens (and gets new ones from a refresh), route tokens and the admin token,
//! drives every path of a proxied request — success, an OAuth refresh, an upstream failure,
//! an upstream 401 that echoes the key it refused (as `invalid x-api-key sk-ant-…`), an
//! upstream 400 passed through that echoes it too, the pool's own 401 for a wrong route
//! token — and runs every read command (text and `--json`) and reads the admin API's
//! overview and accounts (what the status page shows), and has the alerts of the account
//! whose key was refused sent to a webhook (whose URL's path is a secret too) and a
//! command, then searches the whole log, every
//! output and the bodies the client got for each secret and for every 12-character
//! piece of its secret part (so a secret cut short or embedded in a longer string is found
//! too). It also checks the per-request JSON line has its fields as members.

#![cfg(unix)]

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;
use support::{Served, text};

// The secret part of each is after its provider prefix (what every Claude key shares).
const KEY_OK: &str = "sk-ant-api03-Qz7xK2pL9mW4vN8rOKOK";
const KEY_FAIL: &str = "sk-ant-api03-Hj3sD8fG1kL5zX0cFAIL";
const KEY_BAD: &str = "sk-ant-api03-Tb6yN2mQ9wE4rU7iBADD";
const KEY_ECHO: &str = "sk-ant-api03-Wq2eR5tY8uI1oP4aECHO";
const ACCESS_OLD: &str = "sk-ant-oat01-Lp4oI8uY2tR6eW1qOLDA";
const REFRESH_OLD: &str = "sk-ant-ort01-Mn5bV9cX3zA7sD2fOLDR";
const ACCESS_NEW: &str = "sk-ant-oat01-Gh8jK2lP6oI4uY9tNEWA";
const REFRESH_NEW: &str = "sk-ant-ort01-Zx1cV5bN9mQ3wE7rNEWR";
const LOG_FILTER: &str = "debug,pooler=trace,cranelift_codegen=info,cranelift_frontend=info,\
                          wasmtime_cranelift=info,regalloc2=info,wasmtime=info";
const PREFIXES: [&str; 3] = ["sk-ant-api03-", "sk-ant-oat01-", "sk-ant-ort01-"];
/// The webhook's path: its credential, as a Slack or ntfy URL's is.
const HOOK_PATH: &str = "/hook/Wb7nK3xQ9pL2mZ5vHOOK";

/// Every 12-character piece of `secret`'s secret part (after a known prefix), and the secret
/// itself.
fn pieces(secret: &str) -> Vec<String> {
    let part = PREFIXES
        .iter()
        .find_map(|p| secret.strip_prefix(p))
        .unwrap_or(secret);
    let chars: Vec<char> = part.chars().collect();
    let mut out: Vec<String> = chars
        .windows(12.min(chars.len()))
        .map(|w| w.iter().collect())
        .collect();
    out.push(secret.to_owned());
    out
}

/// The first piece of any of `secrets` found in `haystack`.
fn leaked<'a>(haystack: &str, secrets: &'a [String]) -> Option<(&'a str, String)> {
    secrets.iter().find_map(|s| {
        pieces(s)
            .into_iter()
            .find(|p| haystack.contains(p.as_str()))
            .map(|p| (s.as_str(), p))
    })
}

/// The fake Anthropic API and token endpoint on 127.0.0.1, answering by credential: the
/// strict provider's refusals first, then `KEY_OK` and `ACCESS_NEW` 200, `KEY_FAIL` 500,
/// `KEY_ECHO` 400, `KEY_BAD` and `ACCESS_OLD` 401 (each error echoing the credential it
/// was sent); `POST /v1/oauth/token` with `REFRESH_OLD` gives `ACCESS_NEW` / `REFRESH_NEW`.
fn start_upstream() -> String {
    support::serve_each(serve_one)
}

fn serve_one(stream: TcpStream) {
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
    let mut stream = stream;
    let answer = |stream: &mut TcpStream, status: u16, body: &str| {
        let _ = write!(
            stream,
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if path.starts_with("/v1/oauth/token") {
        let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if sent["refresh_token"] == REFRESH_OLD {
            let reply = serde_json::json!({
                "access_token": ACCESS_NEW,
                "refresh_token": REFRESH_NEW,
                "expires_in": 28_800,
                "token_type": "Bearer",
            });
            answer(&mut stream, 200, &reply.to_string());
        } else {
            answer(&mut stream, 400, r#"{"error":"invalid_grant"}"#);
        }
        return;
    }
    if let Some(refusal) = support::claude_refusal(&method, &path, &headers, &body) {
        let _ = stream.write_all(&refusal);
        return;
    }
    let credential = headers
        .get("x-api-key")
        .cloned()
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|a| a.strip_prefix("Bearer ").map(str::to_owned))
        })
        .unwrap_or_default();
    let ok = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;
    let auth_error = serde_json::json!({"type": "error", "error": {
        "type": "authentication_error",
        "message": format!("invalid x-api-key {credential}"),
    }})
    .to_string();
    match credential.as_str() {
        KEY_OK | ACCESS_NEW => answer(&mut stream, 200, ok),
        KEY_FAIL => answer(
            &mut stream,
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        ),
        KEY_ECHO => answer(
            &mut stream,
            400,
            &format!(
                r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"x-api-key {credential} cannot use this model"}}}}"#
            ),
        ),
        _ => answer(&mut stream, 401, &auth_error),
    }
}

fn messages(session: &str) -> String {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello"}],
        "metadata": {"user_id": format!("user_0123_account__session_{session}")},
    })
    .to_string()
}

/// Every output a command gave, for the search.
#[derive(Default)]
struct Outputs(Vec<(String, String)>);

impl Outputs {
    fn keep(&mut self, what: &str, out: &Output) -> String {
        let stdout = text(&out.stdout);
        self.0.push((format!("{what} (stdout)"), stdout.clone()));
        self.0.push((format!("{what} (stderr)"), text(&out.stderr)));
        stdout
    }
}

fn ok(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Wait (a safety net, not a timer the test depends on) until the log has a line `pred`
/// accepts.
fn wait_for_line(server: &Served, pred: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        if let Some(line) = server
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| pred(v))
        {
            return line;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no such log line in {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn add_key(server: &Served, outputs: &mut Outputs, key: &str, label: &str) -> String {
    let out = server.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--api-key",
            "-",
            "--label",
            label,
            "--json",
        ],
        &[],
        Some(&format!("{key}\n")),
    );
    ok(&out, "account add");
    let stdout = outputs.keep("account add", &out);
    let added: Value = serde_json::from_str(&stdout).unwrap();
    added["account"]["id"]
        .as_str()
        .or_else(|| added["id"].as_str())
        .unwrap_or_else(|| panic!("an id in {stdout}"))
        .to_owned()
}

fn disable(server: &Served, outputs: &mut Outputs, id: &str) {
    let out = server.pooler_with(&["account", "disable", id], &[], None);
    ok(&out, "account disable");
    outputs.keep("account disable", &out);
}

#[test]
fn no_secret_is_ever_logged_or_printed_on_any_path() {
    let upstream = start_upstream();
    let (hook, hook_requests) = support::receiver(200);
    let dir = tempfile::tempdir().unwrap();
    let alerts = {
        let dir = dir.path();
        // The alert command records its arguments and environment.
        let program = dir.join("notify");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\n{{ printf '%s\\n' \"$@\"; env | grep '^POOLER_ALERT_'; }} >> '{}'\n",
                dir.join("notified").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &program,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        format!(
            "[alerts]\nwebhook = \"{hook}{HOOK_PATH}\"\ncoalesce-s = 0\ncommand = [\"{}\", \"{{title}}\", \"{{body}}\", \"{{json}}\"]\n",
            program.display()
        )
    };
    // Everything of the host, the core and the plugins at trace; the libraries at debug
    // (hyper, wasmtime-wasi-http), but not the compiler's own trace (gigabytes).
    let server = Served::start_in_with_args(
        dir,
        &format!("[plugins.account-pool]\ncomponent = \"embedded\"\n{alerts}"),
        &["--log-format", "json", "--log-level", LOG_FILTER],
    );
    let mut outputs = Outputs::default();
    let admin_token = std::fs::read_to_string(server.data.join("admin-token")).unwrap();

    for (key, value) in [
        ("pool.claude-upstream-url", upstream.clone()),
        (
            "pool.claude-token-url",
            format!("{upstream}/v1/oauth/token"),
        ),
    ] {
        let out = server.pooler_with(&["config", "set", key, &value], &[], None);
        ok(&out, "config set");
        outputs.keep("config set", &out);
    }

    // A route; its token is a secret everywhere but in `route open`'s own output.
    let opened = server.pooler_with(
        &[
            "route",
            "open",
            "--thread",
            "thread-s",
            "--provider",
            "claude",
        ],
        &[],
        None,
    );
    ok(&opened, "route open");
    let route_token = text(&opened.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("ANTHROPIC_AUTH_TOKEN="))
        .expect("a token line")
        .to_owned();
    let auth = format!("Bearer {route_token}");
    let send = |session: &str| {
        support::http(
            server.addr(),
            "POST",
            "/v1/messages",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
                ("anthropic-version", "2023-06-01"),
            ],
            &messages(session),
        )
    };

    // Success with an API key.
    let ok_id = add_key(&server, &mut outputs, KEY_OK, "ok");
    let (status, body) = send("s-success");
    assert_eq!(status, 200, "{body}");
    disable(&server, &mut outputs, &ok_id);

    // An OAuth account whose access token has expired: refreshed, then it serves.
    let oauth_file = server.dir().join("login.json");
    std::fs::write(
        &oauth_file,
        serde_json::json!({
            "access_token": ACCESS_OLD,
            "refresh_token": REFRESH_OLD,
            "expires_at": 1_000,
        })
        .to_string(),
    )
    .unwrap();
    let out = server.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--oauth-file",
            oauth_file.to_str().unwrap(),
            "--json",
        ],
        &[],
        None,
    );
    ok(&out, "account add --oauth-file");
    let added: Value = serde_json::from_str(&outputs.keep("account add oauth", &out)).unwrap();
    let oauth_id = added["account"]["id"]
        .as_str()
        .or_else(|| added["id"].as_str())
        .expect("an id")
        .to_owned();
    let (status, body) = send("s-refresh");
    assert_eq!(status, 200, "the refreshed token serves: {body}");
    let out = server.pooler_with(&["account", "refresh", &oauth_id], &[], None);
    outputs.keep("account refresh", &out);
    disable(&server, &mut outputs, &oauth_id);

    // An upstream failure (500 on every try).
    let fail_id = add_key(&server, &mut outputs, KEY_FAIL, "fail");
    let (status, _) = send("s-failure");
    assert!(status >= 500, "{status}");
    disable(&server, &mut outputs, &fail_id);

    // An upstream 401 that echoes the key it refused: the client's answer and the
    // account's error carry the upstream's message without it.
    let bad_id = add_key(&server, &mut outputs, KEY_BAD, "bad");
    let (status, refused) = send("s-refused");
    assert_eq!(status, 401, "{refused}");
    assert!(
        refused.contains("invalid x-api-key [redacted]"),
        "{refused}"
    );
    outputs.0.push(("the client's 401".into(), refused));
    // Its key refused, the account is in error, and nothing else serves: the alerts (a
    // look forced by `pooler alerts`) go to the webhook and the command.
    for args in [
        vec!["alerts"],
        vec!["alerts", "--json"],
        vec!["alerts", "test"],
    ] {
        let out = server.pooler_with(&args, &[], None);
        ok(&out, "pooler alerts");
        outputs.keep(&args.join(" "), &out);
    }
    let started = Instant::now();
    let hook_bodies = || -> Vec<String> {
        hook_requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| text(&r.body))
            .collect()
    };
    while !hook_bodies().iter().any(|b| b.contains("account-error")) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no account-error alert at the webhook: {:?}",
            hook_bodies()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let alerted = hook_bodies().join("\n");
    assert!(
        alerted.contains("invalid x-api-key [redacted]"),
        "{alerted}"
    );
    outputs.0.push(("the webhook's bodies".into(), alerted));

    // An upstream 400 passed through as is, but for the key it echoes.
    let echo_id = add_key(&server, &mut outputs, KEY_ECHO, "echo");
    let (status, passed) = send("s-echo");
    assert_eq!(status, 400, "{passed}");
    assert!(
        passed.contains("x-api-key [redacted] cannot use"),
        "{passed}"
    );
    outputs
        .0
        .push(("the client's passed-through 400".into(), passed));
    disable(&server, &mut outputs, &echo_id);

    // The pool's own 401: a wrong route token that looks like a real one.
    let wrong = format!("{}x", &route_token[..42]);
    let (status, _) = support::http(
        server.addr(),
        "POST",
        "/v1/messages",
        &[
            ("Authorization", &format!("Bearer {wrong}")),
            ("Content-Type", "application/json"),
        ],
        &messages("s-wrong"),
    );
    assert_eq!(status, 401);
    // The metrics, with and without the admin token.
    let (status, metrics) = support::http(
        server.addr(),
        "GET",
        "/metrics",
        &[("Authorization", &format!("Bearer {admin_token}"))],
        "",
    );
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("pooler_pool_requests_total"), "{metrics}");
    let (status, refused) = support::http(server.addr(), "GET", "/metrics", &[], "");
    assert_eq!(status, 401);
    outputs.0.push(("GET /metrics".into(), metrics));
    outputs
        .0
        .push(("GET /metrics unauthorized".into(), refused));

    // Every read command.
    for args in [
        vec!["account", "list"],
        vec!["account", "list", "--json"],
        vec!["account", "show", &ok_id],
        vec!["account", "show", &oauth_id, "--json"],
        vec!["session", "explain", "--provider", "claude", "s-refresh"],
        vec![
            "session",
            "explain",
            "--provider",
            "claude",
            "s-refused",
            "--json",
        ],
        vec!["account", "show", &bad_id],
        vec!["account", "show", &bad_id, "--json"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["config", "get"],
        vec!["config", "get", "--json"],
        vec!["config", "get", "pool.claude-token-url"],
        vec!["thread", "list"],
        vec!["retry", "status"],
    ] {
        let out = server.pooler_with(&args, &[], None);
        outputs.keep(&args.join(" "), &out);
    }
    let shown: Value = serde_json::from_str(
        &outputs
            .0
            .iter()
            .find(|(what, _)| what == &format!("account show {bad_id} --json (stdout)"))
            .expect("account show --json ran")
            .1,
    )
    .unwrap();
    let error = shown["account"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("invalid x-api-key [redacted]"), "{shown}");
    // What the status page reads: the admin API's overview and accounts.
    for path in ["/_pooler/overview", "/_pooler/accounts"] {
        let (status, body) = support::http(
            server.addr(),
            "GET",
            path,
            &[("Authorization", &format!("Bearer {}", admin_token.trim()))],
            "",
        );
        assert_eq!(status, 200, "{path}: {body}");
        assert!(body.contains("[redacted]"), "{path}: {body}");
        outputs.0.push((format!("GET {path}"), body));
    }
    // A command's own failure: a wrong token in the environment of a client (none is
    // read from there, but a mistaken user may try).
    let out = server.pooler_with(&["account", "show", "no-such-account", "--json"], &[], None);
    outputs.keep("account show (missing)", &out);

    // Each refresh and each request left its lines: the per-request line with its fields as
    // JSON members, for every path.
    let served = wait_for_line(&server, |v| {
        v["message"] == "Account Pooler request" && v["outcome"] == "served"
    });
    for field in [
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
    ] {
        assert!(served[field].is_string(), "{field} in {served}");
    }
    assert_eq!(served["plugin"], "account-pool");
    assert_eq!(served["thread"], "thread-s");
    assert!(served.get("fields").is_none(), "{served}");
    wait_for_line(&server, |v| {
        v["message"] == "Account Pooler request" && v["outcome"] == "refused"
    });
    wait_for_line(&server, |v| {
        v["message"] == "Account Pooler request" && v["outcome"] == "failed"
    });

    // Stop the server: the log is complete.
    let server = server.terminate();
    let log = server.log();
    assert!(log.lines().count() > 50, "a trace-level log: {log}");
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "every line is one JSON object"
    );

    let notified =
        std::fs::read_to_string(server.dir().join("notified")).expect("the alert command ran");
    assert!(notified.contains("POOLER_ALERT_KIND="), "{notified}");
    outputs.0.push((
        "the alert command's arguments and environment".into(),
        notified,
    ));

    let secrets: Vec<String> = [
        HOOK_PATH,
        KEY_OK,
        KEY_FAIL,
        KEY_BAD,
        KEY_ECHO,
        ACCESS_OLD,
        REFRESH_OLD,
        ACCESS_NEW,
        REFRESH_NEW,
        route_token.as_str(),
        admin_token.trim(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some((secret, piece)) = leaked(&log, &secrets) {
        let line = log.lines().find(|l| l.contains(&piece)).unwrap_or_default();
        panic!("the log has a piece `{piece}` of secret `{secret}`: {line}");
    }
    let serve_stdout = server.stdout();
    outputs
        .0
        .push(("pooler serve (stdout)".into(), serve_stdout));
    for (what, output) in &outputs.0 {
        if let Some((secret, piece)) = leaked(output, &secrets) {
            panic!("{what} printed a piece `{piece}` of secret `{secret}`: {output}");
        }
    }
    // `route open` prints its own route token (that is what it is for), and no other secret.
    let route_out = text(&opened.stdout);
    assert!(route_out.contains(&route_token));
    let others: Vec<String> = secrets
        .iter()
        .filter(|s| **s != route_token)
        .cloned()
        .collect();
    assert!(leaked(&route_out, &others).is_none(), "{route_out}");
    assert!(leaked(&text(&opened.stderr), &secrets).is_none());
}

/// The search can fail: a secret in a line, whole or in part, is found.
#[test]
fn the_search_finds_a_secret_whole_cut_or_embedded() {
    let secrets = vec![
        KEY_OK.to_owned(),
        "0123456789abcdef0123456789abcdef".to_owned(),
    ];
    assert!(leaked(&format!("key={KEY_OK}"), &secrets).is_some());
    assert!(
        leaked(&format!("key={}", &KEY_OK[..26]), &secrets).is_some(),
        "cut short"
    );
    assert!(
        leaked("x0123456789abcdef0123y", &secrets).is_some(),
        "embedded"
    );
    assert!(leaked("hint …OKOK, prefix sk-ant-api03-", &secrets).is_none());
}
