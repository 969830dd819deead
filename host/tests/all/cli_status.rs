//! `pooler status` and `pooler page` as a user meets them: a real `pooler serve` process with
//! the embedded plugins, two Claude accounts in front of a fake Anthropic upstream on
//! 127.0.0.1 that refuses what the real API refuses and answers every other request 429 with
//! `Retry-After: 3600`: "Key A" is held by that answer, "Key B" is disabled. A thread's first
//! turn fails on it and Provider Retry schedules a retry about an hour ahead.
//!
//! No test waits for a timer: the retry is an hour away. The only polling is for the failed
//! turn to reach the plugin (a bounded number of quick retries).

#![cfg(unix)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;
use support::{Served, text};

const KEY_A: &str = "sk-ant-api03-status-secret-AAAA";
const KEY_B: &str = "sk-ant-api03-status-secret-BBBB";

/// The server of the scenario in the module docs, with the thread's retry scheduled:
/// (server, thread, the retry's candidate as `pooler retry status --json` lists it).
fn scenario() -> (Served, String, Value) {
    let (upstream, _) = support::rate_limited_claude();
    let served = Served::start().never_prints(KEY_A).never_prints(KEY_B);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream]);
    let mut ids = Vec::new();
    for (key, label) in [(KEY_A, "Key A"), (KEY_B, "Key B")] {
        let added = served.pooler_with(
            &[
                "account",
                "add",
                "--provider",
                "claude",
                "--label",
                label,
                "--api-key",
                "-",
                "--json",
            ],
            &[],
            Some(&format!("{key}\n")),
        );
        assert_eq!(added.status.code(), Some(0), "{}", text(&added.stderr));
        let added: Value = serde_json::from_slice(&added.stdout).unwrap();
        ids.push(added["account"]["id"].as_str().unwrap().to_owned());
    }
    served.ok(&["account", "disable", &ids[1]]);
    let thread = served
        .ok(&[
            "thread",
            "new",
            "--provider",
            "claude",
            "Summarise README.md",
        ])
        .trim()
        .to_owned();
    let started = Instant::now();
    let candidate = loop {
        let status = served.json(&["retry", "status"]);
        if let Some(c) = status["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["thread"] == thread.as_str() && c["state"] == "scheduled")
        {
            break c.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the failed turn never became a scheduled retry: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (served, thread, candidate)
}

#[test]
fn status_shows_both_accounts_the_hold_and_the_threads_open_retry() {
    let (served, thread, candidate) = scenario();
    let screen = served.ok(&["status"]);
    // Piped: no colour.
    assert!(!screen.contains('\x1b'), "{screen:?}");
    let lines: Vec<&str> = screen.lines().collect();
    let find = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?}:\n{screen}"))
    };
    assert!(lines[0].starts_with("Pooler at "), "{screen}");
    assert!(lines[0].contains("times are local"), "{screen}");

    // The provider cannot serve, and says until when.
    let provider = lines[find("Providers") + 1];
    assert!(
        provider.contains("claude") && provider.contains("blocked (held): serves again "),
        "{screen}"
    );
    assert!(
        provider.contains("(in 59 m)") || provider.contains("(in 1 h)"),
        "{screen}"
    );
    assert!(
        provider.contains("0 of 2 accounts serving, 1 enabled"),
        "{screen}"
    );

    // Both accounts, the held one with its reason and when it serves again.
    let a = find("Key A");
    assert!(
        lines[a].contains(" held ") || lines[a].contains(" held"),
        "{screen}"
    );
    assert!(lines[a].contains("serves again "), "{screen}");
    assert_eq!(
        lines[a + 1].trim(),
        "why: held after a rate limit (Retry-After)",
        "{screen}"
    );
    let b = find("Key B");
    assert!(lines[b].ends_with("disabled"), "{screen}");
    assert_eq!(lines[b + 1].trim(), "why: disabled by a person", "{screen}");

    // The thread, failed, with its retry: attempt, time, reason.
    let t = find(&format!("  {thread}  http claude  error"));
    assert!(lines[t].contains("pool: blocked (held) until "), "{screen}");
    let retry = lines[t + 1].trim();
    let reason = candidate["reason"].as_str().unwrap();
    assert!(
        retry.starts_with("retry: attempt 2 at ") && retry.ends_with(&format!(" — {reason}")),
        "{screen}"
    );
    assert!(
        retry.contains("(in 59 m)") || retry.contains("(in 1 h)"),
        "{screen}"
    );

    // The same snapshot as JSON.
    let json = served.json(&["status"]);
    let accounts = json["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2, "{json}");
    let statuses: Vec<&str> = accounts
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["held", "disabled"], "{json}");
    let threads = json["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{json}");
    assert_eq!(threads[0]["id"], thread.as_str());
    assert_eq!(threads[0]["retry"], candidate, "{json}");
    assert_eq!(threads[0]["row"]["send_at"], candidate["send_at"], "{json}");
    assert_eq!(threads[0]["availability"]["kind"], "blocked", "{json}");
    assert_eq!(json["providers"][0]["serving"]["kind"], "blocked", "{json}");
    assert_eq!(json["problems"], serde_json::json!([]), "{json}");
}

#[test]
fn status_refuses_a_zero_watch_interval_and_needs_a_server() {
    let served = Served::start();
    let said = served.fails(&["status", "--watch", "0"], 2);
    assert!(said.contains("--watch"), "{said}");
    let said = served.fails(&["status", "--watch", "soon"], 2);
    assert!(said.contains("soon"), "{said}");
    let empty = served.ok(&["status"]);
    assert!(
        empty.contains("no accounts (add one with `pooler account add`)"),
        "{empty}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["status", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("pooler serve"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn status_watch_redraws_in_place_until_interrupted() {
    let served = Served::start();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["status", "--watch", "1"])
        .env("POOLER_DATA_DIR", &served.data)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first screen is drawn at once: home, clear, then the screen.
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !text(&seen).contains("Threads\n  none\n") {
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "ended early: {:?}",
            text(&seen)
        );
        seen.push(byte[0]);
    }
    assert!(
        text(&seen).starts_with("\x1b[H\x1b[2JPooler at "),
        "{:?}",
        text(&seen)
    );
    // Ctrl-C ends it, successfully.
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// One HTTP/1.1 GET on loopback; the status line and the headers (lower-case names).
fn get(addr: &str, path: &str, cookie: Option<&str>) -> (u16, Vec<(String, String)>, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let cookie = cookie.map_or(String::new(), |c| format!("cookie: {c}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\n{cookie}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

#[test]
fn page_prints_a_one_time_link_that_signs_a_browser_in() {
    let served = Served::start();
    let token = served.admin_token();
    let url = served.ok(&["page"]).trim().to_owned();
    assert!(
        !url.contains(token.trim()),
        "the admin token is in the link"
    );
    let prefix = format!("{}/_pooler/page/login?code=", served.url);
    let code = url.strip_prefix(&prefix).unwrap_or_else(|| panic!("{url}"));
    assert_eq!(code.len(), 32, "{url}");
    let path = url.strip_prefix(&served.url).unwrap();

    let (status, headers, _) = get(served.addr(), path, None);
    assert_eq!(status, 303);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header("location"), "/_pooler/page");
    let cookie = header("set-cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();

    // The cookie opens the page, with its policy; the link is spent.
    let (status, headers, body) = get(served.addr(), "/_pooler/page", Some(&pair));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<title>Pooler status</title>"), "{body}");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "content-security-policy" && v.starts_with("default-src 'self'")),
        "{headers:?}"
    );
    let (status, _, _) = get(served.addr(), path, None);
    assert_eq!(status, 401, "a spent link signs nobody in");
    let (status, _, _) = get(served.addr(), "/_pooler/page", None);
    assert_eq!(status, 401);

    // --json: the link and when it expires.
    let json = served.json(&["page"]);
    assert!(json["url"].as_str().unwrap().starts_with(&prefix), "{json}");
    assert!(json["expires_at"].as_u64().is_some(), "{json}");
}
