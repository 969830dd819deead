//! Crash-safety: a real `pooler serve` is killed with SIGKILL at a chosen point, then started
//! again on the same data directory. After the restart nothing is lost or done twice: the
//! interrupted turn is recorded failed once and retried once (one retry row, attempt 2),
//! no upstream request or agent run is repeated beyond that retry, pins and quota
//! observations are what they were, every outbox event reaches Provider Retry, and every
//! database (the core's and each plugin's) passes `PRAGMA integrity_check`.
//!
//! Each point is reached deterministically: the fake upstream (or the fake agent) blocks
//! there and tells the test (a channel, or a file the fake agent writes), and only then is
//! the process killed. The server runs on the real clock, so the test polls its databases,
//! with a limit, for what the restarted server does.
//!
//! (The kill between a retry row's claim and its dispatch is `core_kill.rs`.)

#![cfg(unix)]

use crate::support;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rusqlite::OptionalExtension;
use support::{
    Served, Stopped, add_api_key, core_db, databases_intact, eventually, plugin_db, read_only,
};

/// How long the restarted server may take to do what it must.
const LIMIT: Duration = Duration::from_secs(30);

const API_KEY: &str = "sk-ant-api03-crash-secret-CRSH";

/// A thread's turn requests: (attempt, outcome, input accepted, finished).
fn turns(data: &Path, thread: &str) -> Vec<(u32, Option<String>, bool, bool)> {
    let conn = core_db(data);
    let mut stmt = conn
        .prepare(
            "SELECT attempt, outcome, input_accepted, finished_at IS NOT NULL
             FROM turn_requests WHERE thread_id = ?1 ORDER BY rowid",
        )
        .unwrap();
    stmt.query_map([thread], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// How many retry rows the thread has in the core's queue now.
/// Wait until the thread has its second turn, finished, and return its turns.
fn retried_turns(data: &Path, thread: &str) -> Vec<(u32, Option<String>, bool, bool)> {
    eventually("the retry to finish", LIMIT, || {
        let t = turns(data, thread);
        (t.len() == 2 && t[1].3).then_some(t)
    })
}

fn queued_rows(data: &Path, thread: &str) -> usize {
    core_db(data)
        .query_row(
            "SELECT COUNT(*) FROM queued_rows WHERE thread_id = ?1",
            [thread],
            |r| r.get(0),
        )
        .unwrap()
}

/// The core's history actions of a thread, in order (`scheduled`, `dispatched`, …).
fn core_history(data: &Path, thread: &str) -> Vec<String> {
    let conn = core_db(data);
    let mut stmt = conn
        .prepare("SELECT action FROM history WHERE thread_id = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([thread], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Outbox events Provider Retry has not acknowledged.
fn undelivered_events(data: &Path) -> usize {
    core_db(data)
        .query_row(
            "SELECT COUNT(*) FROM outbox o
             WHERE o.id >= (SELECT first_event FROM outbox_subscribers WHERE name = 'provider-retry')
               AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
                               WHERE d.event_id = o.id AND d.subscriber = 'provider-retry'
                                 AND d.done_at IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Provider Retry's chains of a thread: (failed attempt, state).
fn chains(data: &Path, thread: &str) -> Vec<(u32, String)> {
    let conn = read_only(&plugin_db(data, "provider-retry"));
    let mut stmt = conn
        .prepare("SELECT failed_attempt, state FROM chains WHERE thread = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([thread], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The pool's pins of a thread: (account, generation).
fn pins(data: &Path, thread: &str) -> Vec<(String, i64)> {
    let conn = read_only(&plugin_db(data, "account-pool"));
    let mut stmt = conn
        .prepare("SELECT account_id, generation FROM pins WHERE thread = ?1 ORDER BY key")
        .unwrap();
    stmt.query_map([thread], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The pool's quota windows of an account: (name, utilization, resets at).
fn windows(data: &Path, account: &str) -> Vec<(String, Option<f64>, Option<i64>)> {
    let conn = read_only(&plugin_db(data, "account-pool"));
    let mut stmt = conn
        .prepare(
            "SELECT name, utilization, resets_at FROM windows WHERE account_id = ?1 ORDER BY name",
        )
        .unwrap();
    stmt.query_map([account], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A fake Messages API on loopback (strict: what the real API refuses it refuses). Its
/// first model request is answered with a stream that starts (the head with the unified
/// rate-limit headers, `message_start`, one text delta) and then stops: the fake tells the
/// test through the channel and holds the connection until the other side closes it. Every
/// later model request gets a whole answer. The bodies of the model requests, in order.
struct StallingClaude {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    mid_stream: mpsc::Receiver<()>,
    reset_s: u64,
}

impl StallingClaude {
    fn start() -> StallingClaude {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (tell, mid_stream) = mpsc::channel();
        let seen = bodies.clone();
        let reset_s = now_ms() / 1000 + 3 * 3600;
        let url = support::serve_each(move |stream| answer(stream, &seen, &tell, reset_s));
        StallingClaude {
            url,
            bodies,
            mid_stream,
            reset_s,
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }
}

fn answer(mut stream: TcpStream, seen: &Mutex<Vec<String>>, tell: &mpsc::Sender<()>, reset_s: u64) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let Some(r) = support::read_request(&mut reader) else {
        return;
    };
    if let Some(refusal) = support::claude_refusal(&r.method, &r.path, &r.headers, &r.body) {
        let _ = stream.write_all(&refusal);
        return;
    }
    let nth = {
        let mut seen = seen.lock().unwrap();
        seen.push(support::text(&r.body));
        seen.len()
    };
    let rate_limits =
        pooler_tests::provider::claude::unified_headers("allowed", 0.25, reset_s * 1000);
    if nth > 1 {
        let mut reply = pooler_tests::provider::claude::message("the whole answer");
        for (name, value) in &rate_limits {
            reply = reply.header(name, value);
        }
        let _ = stream.write_all(&reply.to_http1());
        return;
    }
    let mut head = String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n");
    for (name, value) in &rate_limits {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("connection: close\r\n\r\n");
    let start = serde_json::json!({"type": "message_start", "message": {
        "id": "msg_crash", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let events = format!(
        "event: message_start\ndata: {start}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"half an \"}}}}\n\n"
    );
    if stream.write_all(head.as_bytes()).is_err() || stream.write_all(events.as_bytes()).is_err() {
        return;
    }
    let _ = stream.flush();
    let _ = tell.send(());
    // Mid-stream: hold the connection until the pool's side of it closes.
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
}

/// 12a. Killed while the pool proxies a stream (the upstream has sent the head and the
/// first events, and stalls). After the restart the turn is recorded failed once (input
/// accepted: the provider had begun answering), Provider Retry gets that event and
/// schedules one retry, which runs once as attempt 2 with "Please continue."; the upstream
/// sees exactly two model requests. The pin and the quota window the first response head
/// carried were committed before the kill and are still there.
#[test]
fn a_kill_mid_stream_fails_the_turn_once_and_retries_it_once() {
    let upstream = StallingClaude::start();
    let served = Served::start_with("[maintenance]\ninterval-s = 0\n").never_prints(API_KEY);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    served.ok(&["config", "set", "retry.backoff-base", "1ms"]);
    let account = add_api_key(&served, API_KEY, "work");
    let thread = served
        .ok(&["thread", "new", "--provider", "claude", "hello"])
        .trim()
        .to_owned();

    // The point: the upstream is mid-stream, and the core has seen the stream begin.
    upstream
        .mid_stream
        .recv_timeout(LIMIT)
        .expect("the upstream to be asked and start streaming");
    let data = served.data.clone();
    eventually("the core to see the stream begin", LIMIT, || {
        (turns(&data, &thread) == [(1, None, true, false)]).then_some(())
    });
    let pinned = pins(&data, &thread);
    assert_eq!(
        pinned.len(),
        1,
        "the request pinned its session: {pinned:?}"
    );
    assert_eq!(pinned[0].0, account);
    let observed = windows(&data, &account);
    assert!(
        observed
            .iter()
            .any(|(_, u, reset)| *u == Some(0.25) && *reset == Some(upstream.reset_s as i64 * 1000)),
        "the response head's quota window: {observed:?}"
    );
    let stopped: Stopped = served.kill();

    // What the kill left: consistent databases, the turn still marked running.
    databases_intact(&data);
    assert_eq!(turns(&data, &thread), [(1, None, true, false)]);
    assert_eq!(pins(&data, &thread), pinned);
    assert_eq!(windows(&data, &account), observed);

    // Run 2: recovery fails the turn; its event reaches Provider Retry, which retries once.
    let served = stopped.restart();
    let done = retried_turns(&data, &thread);
    assert_eq!(
        done,
        [
            (1, Some("failed".into()), true, true),
            (2, Some("ok".into()), true, true)
        ]
    );
    eventually("every event delivered", LIMIT, || {
        (undelivered_events(&data) == 0).then_some(())
    });
    let stopped = served.kill();

    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), 2, "one request per attempt: {bodies:?}");
    assert!(
        bodies[1].contains("Please continue."),
        "the retry continues the accepted input: {}",
        bodies[1]
    );
    assert_eq!(queued_rows(&data, &thread), 0);
    assert_eq!(core_history(&data, &thread), ["scheduled", "dispatched"]);
    let chains = chains(&data, &thread);
    assert_eq!(chains.len(), 1, "one chain, never two: {chains:?}");
    assert_eq!(chains[0].0, 1, "it retried the failed attempt 1");
    assert_eq!(
        pins(&data, &thread),
        pinned,
        "the pin held across the crash"
    );
    let after = windows(&data, &account);
    assert!(
        after
            .iter()
            .any(|(_, u, reset)| *u == Some(0.25) && *reset == Some(upstream.reset_s as i64 * 1000)),
        "{after:?}"
    );
    databases_intact(&data);
    drop(stopped);
}

/// A process that is still running (not gone, not a zombie), read from `/proc`.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Kills a fake agent the test started, if it is still there when the test ends.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        if running(self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// A stand-in for the Codex CLI (the real CLI is driven in `tests/tests/all/agents.rs`): every
/// run appends `run <args>` to `runs`. The first run prints the session it started, writes
/// its pid to `pid` (the test's signal: the turn is mid-run) and blocks; later runs print a
/// whole turn and end.
fn blocking_agent(dir: &Path) -> PathBuf {
    let agent = dir.join("codex");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n\
             d='{dir}'\n\
             echo \"run $*\" >> \"$d/runs\"\n\
             echo '{{\"type\":\"thread.started\",\"thread_id\":\"t-crash-1\"}}'\n\
             if [ ! -e \"$d/pid\" ]; then\n\
               echo $$ > \"$d/pid.tmp\" && mv \"$d/pid.tmp\" \"$d/pid\"\n\
               exec sleep 3600\n\
             fi\n\
             echo '{{\"type\":\"item.completed\",\"item\":{{\"type\":\"agent_message\",\"text\":\"done\"}}}}'\n\
             echo '{{\"type\":\"turn.completed\"}}'\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent
}

/// 12f. Killed while an agent CLI runs a turn. The agent's process does not outlive the
/// host's restart (its process group is killed at start, as a clean stop would have
/// killed it), the turn is recorded failed once and retried once, and the agent runs
/// exactly twice: once per attempt.
#[test]
fn f_a_kill_during_an_agent_turn_leaves_no_orphan_and_runs_the_turn_once_more() {
    let agent_dir = tempfile::tempdir().unwrap();
    let agent = blocking_agent(agent_dir.path());
    let served = Served::start_with(&format!(
        "[maintenance]\ninterval-s = 0\n\n[agents]\ncodex = {:?}\n",
        agent.display().to_string()
    ));
    served.ok(&["config", "set", "retry.backoff-base", "1ms"]);
    let thread = served
        .ok(&["thread", "new", "--agent", "codex", "do the work"])
        .trim()
        .to_owned();

    // The point: the agent is mid-run.
    let pid_file = agent_dir.path().join("pid");
    let pid: u32 = eventually("the agent to start", LIMIT, || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    let _reap = Reap(pid);
    let data = served.data.clone();
    assert_eq!(turns(&data, &thread), [(1, None, false, false)]);
    let stopped = served.kill();
    databases_intact(&data);
    assert_eq!(turns(&data, &thread), [(1, None, false, false)]);

    // Run 2: the first run's agent is stopped; the turn is failed and retried once.
    let served = stopped.restart();
    eventually("the first run's agent to be stopped", LIMIT, || {
        (!running(pid)).then_some(())
    });
    let done = retried_turns(&data, &thread);
    assert_eq!(
        done,
        [
            (1, Some("failed".into()), false, true),
            (2, Some("ok".into()), true, true)
        ]
    );
    eventually("every event delivered", LIMIT, || {
        (undelivered_events(&data) == 0).then_some(())
    });
    let stopped = served.kill();
    let runs = std::fs::read_to_string(agent_dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 2, "one agent run per attempt: {runs}");
    assert_eq!(queued_rows(&data, &thread), 0);
    assert_eq!(core_history(&data, &thread), ["scheduled", "dispatched"]);
    assert_eq!(chains(&data, &thread).len(), 1);
    databases_intact(&data);
    drop(stopped);
}

/// A key of the fixture retry plugin's table.
fn fixture_key(data: &Path, key: &str) -> Option<String> {
    let path = data.join("plugins/provider-retry/fixture.sqlite3");
    read_only(&path)
        .query_row("SELECT value FROM kv WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .unwrap()
}

/// The outbox, when killed with an event not yet delivered: the thread's first turn failed
/// (no account: the pool refuses it) and its `turn-failed` event is pending, because the
/// (fixture) Provider Retry traps on every delivery. With the trap lifted while the host
/// is down, the restarted host delivers the event, once; nothing is left pending.
#[test]
fn an_event_pending_delivery_at_the_kill_is_delivered_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let plugin = data.join("plugins").join("provider-retry");
    std::fs::create_dir_all(&plugin).unwrap();
    pooler_host::runtime::imports::sqlite::open(&plugin, "fixture")
        .unwrap()
        .execute_batch(
            "CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO kv VALUES ('event-trap', 'always'), ('schedule', 'off');",
        )
        .unwrap();
    let served = Served::start_in(
        dir,
        &format!(
            "[plugins.account-pool]\ncomponent = \"embedded\"\n\n\
             [plugins.provider-retry]\ncomponent = {:?}\n\n[maintenance]\ninterval-s = 0\n",
            pooler_tests::fixtures::RETRY
        ),
    );
    let thread = served
        .ok(&["thread", "new", "--provider", "claude", "hello"])
        .trim()
        .to_owned();

    // The point: the event exists, its delivery failed, it is still pending.
    let failed_deliveries = || -> Option<u32> {
        core_db(&data)
            .query_row(
                "SELECT d.failed_attempts FROM outbox o
                 JOIN outbox_deliveries d ON d.event_id = o.id AND d.subscriber = 'provider-retry'
                 WHERE o.thread_id = ?1 AND o.kind = 'turn-failed' AND d.done_at IS NULL",
                [&thread],
                |r| r.get(0),
            )
            .optional()
            .unwrap()
    };
    eventually("a delivery to fail", LIMIT, || {
        failed_deliveries().filter(|n| *n >= 1)
    });
    let stopped = served.kill();
    databases_intact(&data);
    assert_eq!(undelivered_events(&data), 1);
    assert_eq!(fixture_key(&data, "events"), None, "never delivered");
    rusqlite::Connection::open(plugin.join("fixture.sqlite3"))
        .unwrap()
        .execute("DELETE FROM kv WHERE key = 'event-trap'", [])
        .unwrap();

    let served = stopped.restart();
    eventually("the event to be delivered", LIMIT, || {
        (undelivered_events(&data) == 0).then_some(())
    });
    let stopped = served.kill();
    let events = fixture_key(&data, "events").unwrap_or_default();
    let lines: Vec<&str> = events.lines().collect();
    assert_eq!(lines.len(), 1, "delivered once: {events}");
    assert!(
        lines[0].starts_with(&format!("failed {thread} ")),
        "{events}"
    );
    assert_eq!(turns(&data, &thread).len(), 1, "no turn ran again");
    databases_intact(&data);
    drop(stopped);
}

const OLD_ACCESS: &str = "sk-ant-oat01-tok-old";
const OLD_REFRESH: &str = "sk-ant-ort01-refresh-old";
const NEW_ACCESS: &str = "sk-ant-oat01-tok-new";
const NEW_REFRESH: &str = "sk-ant-ort01-refresh-new";

/// A fake Anthropic for a subscription account, on loopback and strict: its token endpoint
/// (`/v1/oauth/token`) stalls on the first refresh grant (it tells the test through the
/// channel and holds the connection until the other side closes it) and answers later
/// ones with new tokens; the Messages API answers whole. What it saw: the refresh tokens
/// of the grants, the bearer tokens of the model requests, and when the second grant came.
struct StallingTokens {
    url: String,
    grants: Arc<Mutex<Vec<(String, std::time::Instant)>>>,
    bearers: Arc<Mutex<Vec<String>>>,
    stalled: mpsc::Receiver<()>,
}

impl StallingTokens {
    fn start() -> StallingTokens {
        let grants = Arc::new(Mutex::new(Vec::new()));
        let bearers = Arc::new(Mutex::new(Vec::new()));
        let (tell, stalled) = mpsc::channel();
        let (g, b) = (grants.clone(), bearers.clone());
        let url = support::serve_each(move |stream| token_or_message(stream, &g, &b, &tell));
        StallingTokens {
            url,
            grants,
            bearers,
            stalled,
        }
    }
}

fn token_or_message(
    mut stream: TcpStream,
    grants: &Mutex<Vec<(String, std::time::Instant)>>,
    bearers: &Mutex<Vec<String>>,
    tell: &mpsc::Sender<()>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let Some(r) = support::read_request(&mut reader) else {
        return;
    };
    if r.path == "/v1/oauth/token" {
        let received = pooler_tests::upstream::Received {
            method: r.method.clone(),
            path: r.path.clone(),
            headers: r
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            body: r.body.clone().into(),
        };
        let contract = pooler_tests::provider::Contract::TokenEndpoint;
        if let Some(refusal) = pooler_tests::provider::refusal(contract, &received) {
            let _ = stream.write_all(&refusal.to_http1());
            return;
        }
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let nth = {
            let mut grants = grants.lock().unwrap();
            let token = body["refresh_token"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            grants.push((token, std::time::Instant::now()));
            grants.len()
        };
        if nth == 1 {
            let _ = tell.send(());
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            return;
        }
        let tokens = serde_json::json!({
            "access_token": NEW_ACCESS, "refresh_token": NEW_REFRESH, "expires_in": 3600,
        })
        .to_string();
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{tokens}",
            tokens.len()
        );
        return;
    }
    if let Some(refusal) = support::claude_refusal(&r.method, &r.path, &r.headers, &r.body) {
        let _ = stream.write_all(&refusal);
        return;
    }
    let bearer = r.headers.get("authorization").cloned().unwrap_or_default();
    bearers.lock().unwrap().push(bearer);
    let _ = stream.write_all(&pooler_tests::provider::claude::message("fresh").to_http1());
}

/// The stored OAuth tokens of an account: (access, refresh).
fn stored_tokens(data: &Path, account: &str) -> (String, String) {
    read_only(&plugin_db(data, "account-pool"))
        .query_row(
            "SELECT access_token, refresh_token FROM secrets WHERE account_id = ?1",
            [account],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// 12e. Killed during an OAuth refresh (the token endpoint has the grant and stalls). The
/// kill leaves the old tokens stored whole (the refresh token is still the valid one: the
/// endpoint never answered). After the restart the interrupted turn is retried once; its
/// request refreshes with the old refresh token once more, gets new tokens, stores them
/// and is served with the new access token. One refresh per run, one model request.
#[test]
fn e_a_kill_during_an_oauth_refresh_keeps_the_old_tokens_and_refreshes_once_after() {
    let upstream = StallingTokens::start();
    let served = Served::start_with("[maintenance]\ninterval-s = 0\n")
        .never_prints(OLD_ACCESS)
        .never_prints(OLD_REFRESH)
        .never_prints(NEW_ACCESS)
        .never_prints(NEW_REFRESH);
    served.ok(&["config", "set", "pool.claude-upstream-url", &upstream.url]);
    let token_url = format!("{}/v1/oauth/token", upstream.url);
    served.ok(&["config", "set", "pool.claude-token-url", &token_url]);
    served.ok(&["config", "set", "retry.backoff-base", "1ms"]);
    // Expired a minute ago: the first request must refresh before it can be sent.
    let oauth = serde_json::json!({
        "access_token": OLD_ACCESS, "refresh_token": OLD_REFRESH,
        "expires_at": now_ms() - 60_000,
    })
    .to_string();
    let out = served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--oauth-file",
            "/dev/stdin",
            "--json",
        ],
        &[],
        Some(&oauth),
    );
    assert_eq!(out.status.code(), Some(0), "{}", support::text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let account = v["account"]["id"].as_str().unwrap().to_owned();
    let thread = served
        .ok(&["thread", "new", "--provider", "claude", "hello"])
        .trim()
        .to_owned();

    // The point: the token endpoint holds the grant.
    upstream
        .stalled
        .recv_timeout(LIMIT)
        .expect("the pool to ask the token endpoint");
    let data = served.data.clone();
    let stopped = served.kill();
    databases_intact(&data);
    assert_eq!(
        stored_tokens(&data, &account),
        (OLD_ACCESS.to_owned(), OLD_REFRESH.to_owned())
    );
    assert_eq!(turns(&data, &thread), [(1, None, false, false)]);

    let restarted = std::time::Instant::now();
    let served = stopped.restart();
    let done = retried_turns(&data, &thread);
    assert_eq!(
        done,
        [
            (1, Some("failed".into()), false, true),
            (2, Some("ok".into()), true, true)
        ]
    );
    let stopped = served.kill();
    let grants = upstream.grants.lock().unwrap().clone();
    let refreshed: Vec<&str> = grants.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(refreshed, [OLD_REFRESH, OLD_REFRESH], "one grant per run");
    // The killed server's lease (two minutes) was dropped by the new server's
    // `maintenance.on-start`: the refresh goes out at once, not when the lease ends.
    let after_restart = grants[1].1.saturating_duration_since(restarted);
    eprintln!(
        "12e: the second refresh came {} ms after the restart",
        after_restart.as_millis()
    );
    assert!(
        after_restart < Duration::from_secs(10),
        "the dead server's refresh lease held the refresh for {after_restart:?}"
    );
    assert_eq!(
        *upstream.bearers.lock().unwrap(),
        [format!("Bearer {NEW_ACCESS}")],
        "one model request, with the new token"
    );
    assert_eq!(
        stored_tokens(&data, &account),
        (NEW_ACCESS.to_owned(), NEW_REFRESH.to_owned())
    );
    assert_eq!(chains(&data, &thread).len(), 1);
    databases_intact(&data);
    drop(stopped);
}

const LIMITED_KEY: &str = "sk-ant-api03-limited-secret-LIM1";
const SPARE_KEY: &str = "sk-ant-api03-spare-secret-SPR2";

/// A fake Messages API (strict) that answers `LIMITED_KEY` 429 with `Retry-After: 3600`
/// and any other key with a whole streamed answer; the keys of the model requests it
/// answered, in order.
fn keyed_claude() -> (String, Arc<Mutex<Vec<String>>>) {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let url = support::strict_claude(move |r, stream| {
        let key = r.headers.get("x-api-key").cloned().unwrap_or_default();
        seen.lock().unwrap().push(key.clone());
        if key == LIMITED_KEY {
            support::write_rate_limited(stream);
        } else {
            let reply = pooler_tests::provider::claude::message("served");
            let _ = stream.write_all(&reply.to_http1());
        }
    });
    (url, keys)
}

/// The pool's accounts: (id, label), in their order.
fn pool_accounts(data: &Path) -> Vec<(String, String)> {
    let conn = read_only(&plugin_db(data, "account-pool"));
    let mut stmt = conn
        .prepare("SELECT id, label FROM accounts ORDER BY seq")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The send time of the thread's one queued row.
fn send_at(data: &Path, thread: &str) -> Option<u64> {
    core_db(data)
        .query_row(
            "SELECT send_at FROM queued_rows WHERE thread_id = ?1",
            [thread],
            |r| r.get(0),
        )
        .optional()
        .unwrap()
}

/// 12d. Killed the moment an account add is acknowledged, while the availability change
/// it signals may still be on its way to Provider Retry (held in the host's memory). A
/// retry waits an hour for the only, rate-limited, account. The added account survives
/// the kill, and after the restart the waiting retry is moved up (Provider Retry's
/// `on-start` re-evaluation finds what a lost signal would have told it) and runs once, on
/// the new account. (A reset buffer of 2 s keeps a row moved before the kill from coming
/// due before it.)
#[test]
fn d_a_kill_as_an_account_is_added_keeps_it_and_the_waiting_retry_moves_up() {
    let (url, keys) = keyed_claude();
    let served = Served::start_with("[maintenance]\ninterval-s = 0\n")
        .never_prints(LIMITED_KEY)
        .never_prints(SPARE_KEY);
    served.ok(&["config", "set", "pool.claude-upstream-url", &url]);
    served.ok(&["config", "set", "retry.reset-buffer", "2s"]);
    served.ok(&["config", "set", "retry.reset-jitter", "0s"]);
    let limited = add_api_key(&served, LIMITED_KEY, "limited");
    let thread = served
        .ok(&["thread", "new", "--provider", "claude", "hello"])
        .trim()
        .to_owned();
    let data = served.data.clone();
    let waiting = eventually("the retry to be scheduled", LIMIT, || {
        send_at(&data, &thread).filter(|t| *t > now_ms() + 3_000_000)
    });

    // The point: the add is acknowledged; kill at once.
    let spare = add_api_key(&served, SPARE_KEY, "spare");
    let stopped = served.kill();
    let killed_at = now_ms();
    databases_intact(&data);
    assert_eq!(
        pool_accounts(&data),
        [
            (limited.clone(), "limited".into()),
            (spare.clone(), "spare".into())
        ],
        "the acknowledged add survived the kill"
    );
    let at_kill = send_at(&data, &thread).expect("the row is still queued");
    assert!(
        at_kill == waiting || at_kill > killed_at,
        "still waiting, or moved but not yet due: {at_kill}"
    );
    assert_eq!(
        turns(&data, &thread).len(),
        1,
        "not retried before the kill"
    );

    let served = stopped.restart();
    let done = retried_turns(&data, &thread);
    assert_eq!(
        done,
        [
            (1, Some("failed".into()), false, true),
            (2, Some("ok".into()), true, true)
        ]
    );
    let served_keys = keys.lock().unwrap().clone();
    assert_eq!(
        served_keys,
        [LIMITED_KEY, SPARE_KEY],
        "one request per attempt, the retry on the new account"
    );
    assert_eq!(pool_accounts(&served.data).len(), 2, "no account twice");
    let stopped = served.kill();
    assert_eq!(queued_rows(&data, &thread), 0);
    assert_eq!(chains(&data, &thread).len(), 1);
    databases_intact(&data);
    drop(stopped);
}
