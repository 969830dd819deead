//! `pooler retry status|explain|cancel` as a user meets them: a real `pooler serve` process
//! with the embedded plugins, a pool account pointed at a fake Anthropic upstream on
//! 127.0.0.1 that refuses what the real API refuses and answers every other request 429
//! with `Retry-After: 3600`, and a thread whose
//! first turn fails on it. Provider Retry schedules a retry about an hour ahead (the account
//! is held); the commands list it, explain it in words and cancel it. A thread with nothing
//! pending is an error (exit 1) that says so.
//!
//! No test waits for a timer: the retry is an hour away. The only polling is for the failed
//! turn to reach the plugin (a bounded number of quick retries).

#![cfg(unix)]

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;
use support::{Served, text};

const KEY: &str = "sk-ant-api03-retry-secret-ZZZZ";
/// Poll `pooler retry status --json` until it lists `thread` (the failed turn reached the
/// plugin), with a bounded number of quick retries.
fn wait_for_candidate(served: &Served, thread: &str) -> Value {
    let started = Instant::now();
    loop {
        let status = served.json(&["retry", "status"]);
        if let Some(c) = status["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["thread"] == thread)
        {
            return c.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the failed turn never became a retry candidate: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `HH:MM:SS` (UTC) of an epoch-millisecond timestamp.
fn clock(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

#[test]
fn a_rate_limited_turn_is_listed_explained_in_words_and_cancelled() {
    let (upstream, requests) = support::rate_limited_claude();
    let served = Served::start().never_prints(KEY);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream]);
    let added = served.pooler_with(
        &["account", "add", "--provider", "claude", "--api-key", "-"],
        &[],
        Some(&format!("{KEY}\n")),
    );
    assert_eq!(added.status.code(), Some(0), "{}", text(&added.stderr));

    // Nothing is pending anywhere yet.
    assert_eq!(
        served.ok(&["retry", "status"]).trim(),
        "no thread has a retry pending"
    );

    let thread = served.ok(&[
        "thread",
        "new",
        "--provider",
        "claude",
        "Summarise README.md",
    ]);
    let thread = thread.trim();
    assert!(!thread.is_empty());

    // The turn fails with the upstream's 429: a retry is scheduled about an hour ahead.
    let candidate = wait_for_candidate(&served, thread);
    assert!(requests.load(Ordering::SeqCst) >= 1);
    assert_eq!(candidate["state"], "scheduled", "{candidate}");
    assert_eq!(candidate["next_attempt"], 2, "{candidate}");
    let send_at = candidate["send_at"].as_u64().unwrap();
    let started = candidate["chain_started_at"].as_u64().unwrap();
    assert!(
        send_at >= started + 3_500_000 && send_at <= started + 3_900_000,
        "expected about an hour after the failure: {candidate}"
    );
    assert!(candidate["row"].as_u64().is_some(), "{candidate}");
    let reason = candidate["reason"].as_str().unwrap();

    // One thread's status, as JSON and as a table.
    let one = served.json(&["retry", "status", thread]);
    assert_eq!(one["candidates"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["candidates"][0], candidate);
    let table = served.ok(&["retry", "status", thread]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    for column in ["THREAD", "STATE", "NEXT SEND", "REASON"] {
        assert!(lines[0].contains(column), "{table}");
    }
    assert!(lines[1].starts_with(thread), "{table}");
    assert!(
        lines[1].contains("scheduled") && lines[1].contains("(in "),
        "{table}"
    );
    assert!(lines[1].contains(reason), "{table}");

    // The decision in words, and the same data as JSON.
    let explained = served.json(&["retry", "explain", thread]);
    assert_eq!(explained["thread"], thread);
    let chains = explained["chains"].as_array().unwrap();
    assert_eq!(chains.len(), 1, "{explained}");
    let first = &chains[0]["entries"][0];
    assert_eq!(first["trigger"]["kind"], "failure", "{explained}");
    assert_eq!(first["action"]["kind"], "scheduled", "{explained}");
    assert_eq!(first["action"]["at"].as_u64(), Some(send_at), "{explained}");
    let words = served.ok(&["retry", "explain", thread]);
    let lines: Vec<&str> = words.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{thread} — retries of request ")),
        "{words}"
    );
    assert!(lines[0].ends_with(" UTC)"), "{words}");
    let expected = format!(
        "  {}  scheduled for {} after the turn failed",
        clock(first["at"].as_u64().unwrap()),
        clock(send_at)
    );
    assert!(
        lines[1].starts_with(&expected),
        "{words}\nexpected: {expected}"
    );
    assert!(lines[1].contains("pool blocked until "), "{words}");

    // Cancel it: it is gone from the status, and the history says a person cancelled it.
    let cancelled = served.ok(&["retry", "cancel", thread]);
    assert!(
        cancelled.starts_with(&format!(
            "cancelled the retry of thread {thread} (attempt 2"
        )),
        "{cancelled}"
    );
    let status = served.json(&["retry", "status"]);
    assert_eq!(status["candidates"], serde_json::json!([]), "{status}");
    let words = served.ok(&["retry", "explain", thread]);
    assert!(
        words
            .lines()
            .last()
            .unwrap()
            .ends_with("by a person: cancelled by a person"),
        "{words}"
    );
    let shown = served.json(&["thread", "show", thread]);
    assert_eq!(shown["rows"], serde_json::json!([]), "{shown}");

    // Nothing pending: said so, exit 1 — for the cancelled thread and for one never seen.
    let expected = format!("error: thread {thread} has nothing pending");
    assert_eq!(
        served.fails(&["retry", "status", thread], 1).trim(),
        expected
    );
    // With --json the failure is a JSON object on stdout, same exit code.
    let error = served.fails_json(&["retry", "status", thread, "--json"], 1);
    assert_eq!(
        format!("error: {}", error["message"].as_str().unwrap()),
        expected
    );
    assert_eq!(
        served.fails(&["retry", "cancel", thread], 1).trim(),
        expected
    );
    for args in [
        &["retry", "status", "th_never"][..],
        &["retry", "explain", "th_never"],
        &["retry", "cancel", "th_never"],
    ] {
        let stderr = served.fails(args, 1);
        assert!(
            stderr.starts_with("error: thread th_never has nothing pending"),
            "{args:?}: {stderr}"
        );
    }
    let error = served.fails_json(&["retry", "explain", "th_never", "--json"], 1);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("thread th_never has nothing pending"),
        "{error}"
    );
    // No retry was sent upstream meanwhile.
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[test]
fn the_retry_help_shows_every_command_with_examples() {
    let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["retry", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in [
        "status",
        "explain",
        "cancel",
        "send-now",
        "opt-out",
        "Examples:",
        "pooler retry explain",
        "--json",
    ] {
        assert!(help.contains(word), "missing {word}:\n{help}");
    }
}
