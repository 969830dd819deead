//! The pool's command line as a user meets it: a real `pooler serve` process with the
//! embedded plugins, driven by the `pooler account|config|route|session` commands, with a
//! fake Anthropic upstream on 127.0.0.1. Also: refused input (exit codes, messages, nothing
//! changed), the admin API refusing a wrong token, and each command group's help.

#![cfg(unix)]

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::support;
use support::{Served, text};

const KEY_A: &str = "sk-ant-api03-first-secret-AAAA";
const KEY_B: &str = "sk-ant-api03-second-secret-BBBB";

/// One request as the fake upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
}

/// A fake Anthropic API on 127.0.0.1: refuses what the real API refuses (the strict rules of
/// `pooler_tests::provider`), answers every other request 200 with a small message, and
/// records what it saw.
struct Upstream {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    fn start() -> Upstream {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let url = support::serve_each(move |stream| serve_one(stream, &record));
        Upstream { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_one(stream: TcpStream, record: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let support::RawRequest {
        method,
        path,
        headers,
        body,
    } = support::read_request(&mut reader).expect("a whole request");
    let refusal = support::claude_refusal(&method, &path, &headers, &body);
    record.lock().unwrap().push(Seen { path, headers });
    let mut stream = stream;
    if let Some(refusal) = refusal {
        stream.write_all(&refusal).unwrap();
        return;
    }
    let answer = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    )
    .unwrap();
}

/// `KEY=VALUE` lines (comments skipped) as a map.
fn env_lines(output: &str) -> HashMap<String, String> {
    output
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=VALUE: {l}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn ids(accounts: &Value) -> Vec<String> {
    accounts["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect()
}

fn messages_request(session: &str) -> String {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello"}],
        "metadata": {"user_id": format!("user_0123_account__session_{session}")},
    })
    .to_string()
}

#[test]
fn a_user_adds_two_accounts_opens_a_route_and_the_pool_serves_with_the_first() {
    let upstream = Upstream::start();
    let served = Served::start();

    // The pool's settings are there under their role prefix; point Claude at the fake.
    let settings = served.json(&["config", "get"]);
    let keys: Vec<&str> = settings["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"pool.claude-upstream-url"), "{keys:?}");
    assert!(keys.iter().any(|k| k.starts_with("retry.")), "{keys:?}");
    let set = served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    assert_eq!(
        set.trim(),
        format!("pool.claude-upstream-url = {}", upstream.url)
    );

    // Two API keys: one from standard input, one from the environment.
    let first = served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--api-key",
            "-",
            "--label",
            "first",
        ],
        &[],
        Some(&format!("{KEY_A}\n")),
    );
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(
        text(&first.stdout).contains("…AAAA"),
        "{}",
        text(&first.stdout)
    );
    let second = served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--label",
            "second",
        ],
        &[("POOLER_API_KEY", KEY_B)],
        None,
    );
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));

    // A route: the printed environment points at this server and carries a token.
    let opened = served.ok(&[
        "route",
        "open",
        "--thread",
        "thread-1",
        "--provider",
        "claude",
    ]);
    let env = env_lines(&opened);
    assert_eq!(env["ANTHROPIC_BASE_URL"], served.url);
    let token = env["ANTHROPIC_AUTH_TOKEN"].clone();
    assert_eq!(token.len(), 43, "{opened}");

    // The agent's request, with that token, is served upstream with the first account's key.
    let auth = format!("Bearer {token}");
    let (status, body) = support::http(
        served.addr(),
        "POST",
        "/v1/messages",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("anthropic-version", "2023-06-01"),
        ],
        &messages_request("s-1"),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("msg_1"), "{body}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(
        seen[0].headers.get("x-api-key").map(String::as_str),
        Some(KEY_A)
    );

    // The list, as JSON and as text, shows both accounts and no secret.
    let listed = served.pooler(&["account", "list", "--json"]);
    assert_eq!(listed.status.code(), Some(0));
    let json: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let accounts = json["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2);
    assert_eq!(accounts[0]["label"], "first");
    assert_eq!(accounts[0]["secret_hint"], "…AAAA");
    assert_eq!(accounts[1]["label"], "second");
    let table = served.ok(&["account", "list"]);
    assert!(
        table.contains("first") && table.contains("second"),
        "{table}"
    );
    for out in [text(&listed.stdout), table, text(&listed.stderr)] {
        for secret in [KEY_A, KEY_B, token.as_str()] {
            assert!(!out.contains(secret), "a secret was printed: {out}");
        }
    }

    // The session is pinned to the first account, through thread-1.
    let first_id = accounts[0]["id"].as_str().unwrap();
    let explained = served.json(&["session", "explain", "--provider", "claude", "s-1"]);
    assert_eq!(explained["session"]["account"], first_id, "{explained}");
    assert_eq!(explained["session"]["thread"], "thread-1", "{explained}");
    let words = served.ok(&["session", "explain", "--provider", "claude", "s-1"]);
    assert!(
        words.contains(first_id) && words.contains("served"),
        "{words}"
    );

    // Closing the route stops its token at once.
    served.ok(&[
        "route",
        "close",
        "--thread",
        "thread-1",
        "--provider",
        "claude",
    ]);
    let (status, _) = support::http(
        served.addr(),
        "POST",
        "/v1/messages",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &messages_request("s-1"),
    );
    assert_eq!(status, 401);
    assert_eq!(upstream.seen().len(), 1);

    // A clean stop removes server.json; the commands then say how to start a server.
    let data = served.data.clone();
    assert!(data.join("server.json").exists());
    assert_eq!(served.stop(), Some(0));
    assert!(!data.join("server.json").exists());
}

#[test]
fn refused_input_says_what_is_wrong_and_changes_nothing() {
    let served = Served::start();

    // Usage: no credential is exit 2, before anything reaches the server.
    let err = served.fails(&["account", "add", "--provider", "claude"], 2);
    assert!(
        err.contains("--api-key") && err.contains("--oauth-file"),
        "{err}"
    );
    let err = served.fails(
        &["account", "add", "--provider", "gemini", "--api-key", "x"],
        2,
    );
    assert!(err.contains("gemini"), "{err}");
    let err = served.fails(
        &["account", "add", "--provider", "claude", "--api-key", "-"],
        2,
    );
    assert!(err.contains("empty"), "{err}");

    served.pooler_with(
        &["account", "add", "--provider", "claude", "--api-key", "-"],
        &[],
        Some(KEY_A),
    );
    served.pooler_with(
        &["account", "add", "--provider", "claude", "--api-key", "-"],
        &[],
        Some(KEY_B),
    );
    let before = served.json(&["account", "list"]);
    let order = ids(&before);
    assert_eq!(order.len(), 2);

    // A reorder that leaves one out is refused, naming it; the order stays.
    let err = served.fails(
        &["account", "reorder", "--provider", "claude", &order[1]],
        1,
    );
    assert!(err.contains(&order[0]), "{err}");
    assert_eq!(ids(&served.json(&["account", "list"])), order);

    // Settings: an unknown key is named; an invalid value names the key and the range.
    let err = served.fails(&["config", "set", "pool.no-such-setting", "1"], 1);
    assert!(err.contains("pool.no-such-setting"), "{err}");
    let err = served.fails(&["config", "get", "switch-threshold"], 1);
    assert!(
        err.contains("`switch-threshold`") && err.contains("pool."),
        "{err}"
    );
    let err = served.fails(&["config", "set", "pool.switch-threshold", "1.5"], 1);
    assert!(
        err.contains("pool.switch-threshold") && err.contains("1.5"),
        "{err}"
    );
    let kept = served.json(&["config", "get", "pool.switch-threshold"]);
    assert_eq!(kept["setting"]["value"], "0.98");

    // Ids and providers the pool does not know.
    let err = served.fails(&["account", "disable", "no-such-id"], 1);
    assert!(err.contains("no-such-id"), "{err}");
    let err = served.fails(
        &["account", "add", "--provider", "codex", "--api-key", "sk-x"],
        1,
    );
    assert!(err.contains("only for Claude"), "{err}");
    let err = served.fails(
        &[
            "route",
            "close",
            "--thread",
            "never-opened",
            "--provider",
            "claude",
        ],
        1,
    );
    assert!(err.contains("never-opened"), "{err}");
    assert_eq!(served.json(&["account", "list"]), before);

    // A login file the pool cannot understand is refused; the provider's own file (found
    // through CLAUDE_CONFIG_DIR, as Claude Code does) is imported, its tokens never shown.
    let logins = tempfile::tempdir().unwrap();
    let bad = logins.path().join("bad.json");
    std::fs::write(&bad, "not json").unwrap();
    let err = served.fails(
        &[
            "account",
            "import",
            "--provider",
            "claude",
            "--from",
            bad.to_str().unwrap(),
        ],
        1,
    );
    assert!(err.contains("login file"), "{err}");
    assert_eq!(served.json(&["account", "list"]), before);
    std::fs::write(
        logins.path().join(".credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"at-secret-CCCC","refreshToken":"rt-secret-DDDD","expiresAt":4102444800000}}"#,
    )
    .unwrap();
    let imported = served.pooler_with(
        &[
            "account",
            "import",
            "--provider",
            "claude",
            "--label",
            "laptop",
        ],
        &[("CLAUDE_CONFIG_DIR", logins.path().to_str().unwrap())],
        None,
    );
    assert_eq!(
        imported.status.code(),
        Some(0),
        "{}",
        text(&imported.stderr)
    );
    let said = text(&imported.stdout);
    assert!(
        said.contains("laptop") && said.contains(".credentials.json"),
        "{said}"
    );
    let listed = served.ok(&["account", "list", "--json"]);
    assert!(
        !listed.contains("secret-CCCC") && !listed.contains("secret-DDDD"),
        "{listed}"
    );
    assert_eq!(ids(&serde_json::from_str(&listed).unwrap()).len(), 3);

    // The admin API itself refuses a missing or wrong token.
    for auth in [None, Some("Bearer wrong"), Some("Bearer ")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let (status, body) = support::http(served.addr(), "GET", "/_pooler/accounts", &headers, "");
        assert_eq!(status, 401, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let auth = format!("Bearer {}", served.admin_token());
    let (status, _) = support::http(
        served.addr(),
        "GET",
        "/_pooler/accounts",
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(status, 200);
}

/// `pooler account show ID` prints one account as `account list` knows it (the same JSON
/// under `--json`); an unknown id is refused by name, exit 1.
#[test]
fn account_show_prints_one_account() {
    let served = Served::start().never_prints(KEY_A);
    served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--label",
            "laptop",
            "--api-key",
            "-",
        ],
        &[],
        Some(KEY_A),
    );
    let listed = served.json(&["account", "list"]);
    let id = ids(&listed)[0].clone();
    let shown = served.json(&["account", "show", &id]);
    assert_eq!(shown["account"], listed["accounts"][0], "{shown}");
    let said = served.ok(&["account", "show", &id]);
    assert!(
        said.starts_with(&format!("claude account {id} \"laptop\"")),
        "{said}"
    );
    let err = served.fails(&["account", "show", "acc_nope"], 1);
    assert!(err.contains("`acc_nope`"), "{err}");
    let error = served.fails_json(&["account", "show", "acc_nope", "--json"], 1);
    assert_eq!(
        (error["kind"].as_str(), error["status"].as_u64()),
        (Some("no-such-account"), Some(404)),
        "{error}"
    );
}

/// With `--json`, a failure is `{"error": {"kind", "message"}}` on stdout (no text on
/// stderr) and keeps its exit code: a refusal by the server carries the admin API's code and
/// status, local input that cannot be used is `usage` (exit 2), no server is `no-server`.
#[test]
fn json_failures_are_json_objects_with_the_same_exit_codes() {
    let served = Served::start();
    let refused = served.fails_json(&["account", "enable", "acc_nope", "--json"], 1);
    let plain = served.fails(&["account", "enable", "acc_nope"], 1);
    assert_eq!(
        format!("error: {}", refused["message"].as_str().unwrap()),
        plain.trim()
    );
    assert!(
        refused["status"].as_u64().is_some_and(|s| s >= 400)
            && !["usage", "no-server", "failed"].contains(&refused["kind"].as_str().unwrap()),
        "{refused}"
    );
    let usage = served.fails_json(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--api-key",
            "-",
            "--json",
        ],
        2,
    );
    assert_eq!(usage["kind"], "usage", "{usage}");
    assert!(
        usage["message"].as_str().unwrap().contains("empty"),
        "{usage}"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["account", "list", "--json", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !text(&out.stderr).contains("error:"),
        "{}",
        text(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["error"]["kind"], "no-server", "{value}");
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pooler serve"),
        "{value}"
    );
}

#[test]
fn commands_without_a_server_say_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["account", "list"],
        vec!["config", "get"],
        vec!["route", "open", "--thread", "t", "--provider", "claude"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
            .args(&args)
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("no pooler is serving {}", dir.path().display()))
                && err.contains("pooler serve"),
            "{err}"
        );
    }
    // A stale server.json (nothing listens there) says the same.
    std::fs::write(
        dir.path().join("server.json"),
        r#"{"url":"http://127.0.0.1:9","pid":1}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("admin-token"), "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["account", "list", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no pooler is serving"),
        "{}",
        text(&out.stderr)
    );
}

fn help(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pooler"));
    command.args(args).arg("--help");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    text(&out.stdout)
}

#[test]
fn every_command_group_explains_itself_with_examples() {
    let top = help(&[], &[]);
    for group in ["serve", "account", "config", "route", "session"] {
        assert!(top.contains(group), "{top}");
    }
    for (group, commands) in [
        (
            "account",
            &[
                "add", "import", "list", "enable", "disable", "remove", "refresh", "priority",
                "reorder",
            ][..],
        ),
        ("config", &["get", "set"][..]),
        ("route", &["open", "close"][..]),
        ("session", &["explain"][..]),
    ] {
        let text = help(&[group], &[]);
        assert!(text.contains("Examples:"), "{group}: {text}");
        assert!(
            text.contains("--data-dir") && text.contains("--json"),
            "{group}: {text}"
        );
        for command in commands {
            assert!(text.contains(command), "{group} lacks {command}: {text}");
            help(&[group, command], &[]);
        }
    }
    // The key's help says how to keep it out of shell history, and never shows its value.
    let add = help(&["account", "add"], &[("POOLER_API_KEY", KEY_A)]);
    assert!(
        add.contains("POOLER_API_KEY") && add.contains("standard input"),
        "{add}"
    );
    assert!(!add.contains(KEY_A), "{add}");
    let import = help(&["account", "import"], &[]);
    assert!(
        import.contains(".claude/.credentials.json") && import.contains(".codex/auth.json"),
        "{import}"
    );
}

/// The data directory `pooler serve` creates is its owner's alone (0700) whatever the umask:
/// it holds the admin token and every database.
#[cfg(unix)]
#[test]
fn the_data_directory_serve_creates_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let served = Served::start();
    let mode = std::fs::metadata(&served.data)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "{:o}", mode);
}
