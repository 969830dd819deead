//! Session extraction on agent-sized bodies (on demand, not in CI):
//! `cargo bench -p account-pool --bench session`. A Claude Code request carries the whole
//! conversation and the tool definitions, so its body runs from kilobytes to megabytes;
//! the session fields are a few hundred bytes of it. Prints, per body size, the time to
//! read the session the way the pool does ([`session::extract`], which keeps only the
//! fields it reads) against a full parse of the body into a `serde_json::Value` (what it
//! did once), measured in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use account_pool::body::Collector;
use account_pool::http::Headers;
use account_pool::model::Provider;
use account_pool::session;

/// A Claude Messages request of about `bytes` bytes: metadata with the session, tools,
/// and as many conversation turns as it takes.
fn body(bytes: usize) -> Vec<u8> {
    let turn = r#"{"role":"user","content":[{"type":"text","text":"Please look at src/main.rs and explain why the \"retry\" loop never ends; here is the output:\n\terror[E0502]: cannot borrow `x` as mutable"}]},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"Read","input":{"file_path":"/repo/src/main.rs","limit":200}}]},"#;
    let mut messages = String::new();
    while messages.len() + 1_000 < bytes {
        messages.push_str(turn);
    }
    messages.push_str(r#"{"role":"user","content":"go on"}"#);
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,"system":[{{"type":"text","text":"You are Claude Code."}}],"tools":[{{"name":"Read","description":"Reads a file","input_schema":{{"type":"object","properties":{{"file_path":{{"type":"string"}}}}}}}}],"messages":[{messages}],"metadata":{{"user_id":"{{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"4f1c2d9e-0000-4000-8000-000000000001\"}}"}}}}"#
    )
    .into_bytes()
}

/// Median time of one run of `f`, after at least 50 ms of warm-up runs.
fn time(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < Duration::from_millis(50) || runs < 5 {
        f();
        runs += 1;
    }
    let mut samples: Vec<Duration> = (0..runs.clamp(5, 200))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let mut headers = Headers::new();
    headers.push(
        "x-claude-code-session-id",
        "4f1c2d9e-0000-4000-8000-000000000001",
    );
    println!(
        "{:>10} | {:>16} | {:>16} | {:>6}",
        "body", "full parse µs", "session read µs", "ratio"
    );
    for bytes in [2_000, 50_000, 500_000, 2_000_000] {
        let bytes = body(bytes);
        // Held as the pool holds a body: in chunks, as it arrived.
        let mut collector = Collector::new(u64::MAX, Some(bytes.len() as u64));
        for frame in bytes.chunks(16 << 10) {
            collector.push(frame).expect("held");
        }
        let held = collector.finish();
        let expected = session::extract(Provider::Claude, &headers, &held);
        assert!(expected.key.is_some(), "the body carries a session");
        let full = time(|| {
            let json: Option<serde_json::Value> = serde_json::from_slice(black_box(&bytes)).ok();
            black_box(json);
        });
        let read = time(|| {
            black_box(session::extract(
                Provider::Claude,
                &headers,
                black_box(&held),
            ));
        });
        let body = bytes;
        println!(
            "{:>8} B | {:>16.1} | {:>16.1} | {:>5.2}×",
            body.len(),
            full.as_secs_f64() * 1e6,
            read.as_secs_f64() * 1e6,
            read.as_secs_f64() / full.as_secs_f64()
        );
    }
}
