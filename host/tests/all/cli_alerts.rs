//! `pooler alerts [test]` and `pooler config get` against a real `pooler serve` with
//! `[alerts]`: the test alert goes through the webhook (a loopback receiver) and the command
//! (a fake program) at once; a failing receiver makes the command exit 1 naming it; the
//! webhook's path (its secret) is never printed, nor logged.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;

use crate::support;
use support::Served;

const HOOK_PATH: &str = "/hook/T0CLISECRET99";

/// Each request a receiver got: its path and body.
#[test]
fn alerts_test_sends_through_the_webhook_and_the_command_and_says_what_failed() {
    let (url, seen) = support::receiver(200);
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    let program = dir.path().join("notify");
    std::fs::write(
        &program,
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\n", args.display()),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let served = Served::start_with(&format!(
        "[alerts]\nwebhook = \"{url}{HOOK_PATH}\"\ncommand = [\"{}\", \"{{kind}}\", \"{{title}}\"]\n",
        program.display()
    ));

    let out = served.ok(&["alerts", "test"]);
    assert!(out.contains("webhook: sent (HTTP 200)"), "{out}");
    assert!(out.contains("command: sent"), "{out}");
    assert!(!out.contains("T0CLISECRET99"), "{out}");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path, HOOK_PATH);
    let doc: serde_json::Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(doc["alerts"][0]["kind"], "test");
    assert_eq!(
        std::fs::read_to_string(&args).unwrap(),
        "test\npooler test alert\n"
    );

    // `pooler alerts` shows where alerts go and what is open; `pooler config get` shows the
    // [alerts] table, the webhook as its origin only.
    let out = served.ok(&["alerts"]);
    assert!(out.contains("no alert open"), "{out}");
    let config = served.ok(&["config", "get"]);
    assert!(config.contains("alerts.webhook"), "{config}");
    assert!(config.contains(&format!("{url}/…")), "{config}");
    assert!(!config.contains("T0CLISECRET99"), "{config}");
    let json = served.json(&["config", "get"]);
    let webhook = json["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "alerts.webhook")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(webhook.ends_with("/…"), "{webhook}");
    assert!(!served.log().contains("T0CLISECRET99"));
}

#[test]
fn alerts_test_exits_1_when_the_receiver_fails() {
    let (url, seen) = support::receiver(500);
    let served = Served::start_with(&format!("[alerts]\nwebhook = \"{url}{HOOK_PATH}\"\n"));
    let out = served.fails(&["alerts", "test"], 1);
    assert!(
        out.contains("not delivered: webhook: FAILED (HTTP 500)"),
        "{out}"
    );
    let error = served.fails_json(&["alerts", "test", "--json"], 1);
    assert!(
        error["message"].as_str().unwrap().contains("HTTP 500"),
        "{error}"
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "one attempt per test");
}
