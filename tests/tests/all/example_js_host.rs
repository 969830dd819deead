//! The JavaScript host example (`examples/js-host/host.mjs`, on jco) runs the real components
//! the `pooler` binary embeds: it adds a Claude API-key account, points the pool at a strict
//! fake Messages API on 127.0.0.1, serves one request through the pool's `wasi:http` handler
//! and feeds the 429 to Provider Retry, which schedules the retry at the pool's reset.
//!
//! Needs Node and `npm ci --prefix examples/js-host` (done by `.ci/run`); without them the
//! test fails, saying so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pooler_host::runtime::embedded;
use pooler_host::runtime::roles::Role;
use pooler_tests::provider::{Contract, claude};
use pooler_tests::upstream::FakeUpstream;
use serde_json::{Value, json};

/// The host clock of the run: a fixed instant (manual clock), 2027-01-15T08:00:00Z.
const NOW: u64 = 1_800_000_000_000;
const HOUR: u64 = 3_600_000;
/// Provider Retry's default `reset-buffer` and `reset-jitter`.
const BUFFER: u64 = 15_000;
const JITTER: u64 = 30_000;
const API_KEY: &str = "sk-ant-api03-js-host-example-key";

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/js-host")
}

/// Write the embedded component of `role` to `dir`, for the JS host to load.
fn component_file(dir: &Path, role: Role) -> PathBuf {
    let path = dir.join(format!("{}.wasm", role.name()));
    let bytes = embedded::component(role).expect("the binary embeds a component per role");
    std::fs::write(&path, bytes).expect("write the component");
    path
}

/// Fail (not skip) when the example's npm packages are not installed.
fn require_packages() {
    let jco = example_dir().join("node_modules/@bytecodealliance/jco/package.json");
    assert!(
        jco.is_file(),
        "the JS host's packages are not installed ({} is missing): run `npm ci --prefix examples/js-host`",
        jco.display()
    );
}

/// Run `host.mjs` with `args` and the API key in its environment; its stdout, parsed.
async fn run_host(args: &[&str]) -> Value {
    require_packages();
    let dir = example_dir();
    let run = tokio::process::Command::new("node")
        .arg(dir.join("host.mjs"))
        .args(args)
        .env("POOLER_EXAMPLE_API_KEY", API_KEY)
        .kill_on_drop(true)
        .output();
    // A guard against a hung host, not a wait for a timer.
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the JS host finished within 5 minutes")
        .unwrap_or_else(|e| panic!("could not run `node` (is Node installed?): {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the JS host failed ({}):\n{stderr}",
        output.status
    );
    assert!(
        !stderr.contains(API_KEY),
        "the JS host or a plugin logged the API key"
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the JS host printed no JSON ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {value:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_host_serves_a_429_through_the_pool_and_provider_retry_schedules_the_reset() {
    let work = tempfile::tempdir().unwrap();
    let pool = component_file(work.path(), Role::AccountPool);
    let retry = component_file(work.path(), Role::ProviderRetry);
    let build = work.path().join("build");
    let upstream = FakeUpstream::strict(Contract::Api).await;
    let reset = NOW + 2 * HOUR;
    upstream.push(claude::rate_limited(reset, NOW));

    let out = run_host(&[
        "--pool",
        pool.to_str().unwrap(),
        "--retry",
        retry.to_str().unwrap(),
        "--upstream",
        &upstream.url(),
        "--now",
        &NOW.to_string(),
        "--build-dir",
        build.to_str().unwrap(),
    ])
    .await;

    // The fake saw exactly one request, the one the agent sent, with the account's key.
    assert_eq!(upstream.refused(), [], "the strict fake refused a request");
    let received = upstream.received();
    assert_eq!(received.len(), 1, "one upstream request: {received:?}");
    let forwarded = &received[0];
    assert_eq!(forwarded.method, "POST");
    assert_eq!(forwarded.path, "/v1/messages");
    assert_eq!(forwarded.header("x-api-key"), Some(API_KEY));
    assert_eq!(forwarded.header("authorization"), None);
    assert_eq!(forwarded.header("anthropic-version"), Some("2023-06-01"));
    let body: Value = serde_json::from_slice(&forwarded.body).expect("a JSON body");
    assert_eq!(
        body,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
               "messages": [{"role": "user", "content": "ping"}]})
    );

    // The agent got a 429 with a Retry-After at the window's reset.
    assert_eq!(out["jco"], "1.35.0", "{out:#}");
    assert_eq!(u64_at(&out, "/pool/status"), 429, "{out:#}");
    let retry_after: u64 = out
        .pointer("/pool/headers/retry-after")
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a numeric Retry-After: {out:#}"));
    assert_eq!(retry_after, 2 * HOUR / 1000, "{out:#}");
    assert_eq!(out["turnFailed"]["failure"]["category"], "rate-limit");
    assert_eq!(u64_at(&out, "/turnFailed/failure/retryAfter"), reset);

    // The pool says it is blocked until the reset, and Provider Retry scheduled the retry
    // there, within its buffer and jitter.
    assert_eq!(out["availability"]["tag"], "blocked", "{out:#}");
    assert_eq!(u64_at(&out, "/availability/val/retryAt"), reset, "{out:#}");
    let rows = out["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "one retry row: {out:#}");
    assert_eq!(rows[0]["thread"], "js-host-thread");
    assert_eq!(rows[0]["failedRequest"], "js-host-request-1");
    assert_eq!(u64_at(&rows[0], "/attempt"), 2);
    // Scheduled on the pool's answer (asked through the host), not on the Retry-After alone.
    assert_eq!(rows[0]["reason"], "rate-limited: pool reset", "{out:#}");
    let send_at = u64_at(&rows[0], "/sendAt");
    assert!(
        (reset + BUFFER..=reset + BUFFER + JITTER).contains(&send_at),
        "the retry is due {} ms after the reset: {out:#}",
        send_at as i64 - reset as i64
    );

    // The pool's availability signals reached Provider Retry through the host.
    let signals = out["signals"].as_array().expect("signals");
    assert!(
        signals.iter().any(|s| s["causes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "account-added"))),
        "the account-added signal was delivered: {out:#}"
    );
    assert_eq!(out["undelivered"], json!([]), "{out:#}");
    // The plugins' metrics reached the JS host's `metrics` import: one request through the
    // pool, and Provider Retry's decision on the failed turn.
    assert_eq!(
        out["metrics"]["account-pool"]["pooler_pool_requests_total"],
        json!(1),
        "{out:#}"
    );
    assert!(
        out["metrics"]["provider-retry"]["pooler_retry_decisions_total"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{out:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_host_refuses_a_missing_flag_with_usage_and_exit_code_2() {
    require_packages();
    let output = tokio::process::Command::new("node")
        .arg(example_dir().join("host.mjs"))
        .args(["--pool", "p.wasm"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("could not run `node` (is Node installed?): {e}"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--retry is required"), "{stderr}");
    assert!(stderr.contains("Usage:"), "{stderr}");
}
