//! Agent threads with the real CLIs: Claude Code 2.1.328 and Codex CLI 0.169.0 run each
//! turn through the real host (its listener, the real Account Pooler, the real Provider
//! Retry and the core) in front of the strict fake provider on 127.0.0.1, on the manual
//! clock (the host's; the CLIs themselves need none). Each CLI gets a home of its own in the
//! test's directory. A real CLI turn against the loopback fake takes about a second.

use std::time::Duration;

use pooler_core::agent::Cli;
use pooler_core::{Agent, AgentSpec, FailureCategory, FailureOrigin, Provider, ThreadStatus};
use pooler_core::{TurnOutcomeKind, TurnTrigger};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, NewAccount,
};
use pooler_host::runtime::bindings::types as wit;
use pooler_tests::agents::{isolated_binary, occurrences};
use pooler_tests::core::{CoreHost, CoreSetup};
use pooler_tests::pool::oauth;
use pooler_tests::provider::{claude, codex};
use pooler_tests::upstream::Received;

const SECOND: u64 = 1_000;
const HOUR: u64 = 3_600 * SECOND;
/// Provider Retry's default reset buffer and the most of its jitter.
const BUFFER_AND_JITTER: Duration = Duration::from_secs(15 + 30);

/// The betas Claude Code 2.1.328 sends (a few of them).
const CLAUDE_CODE_BETA: &str = "claude-code-20250219";

/// A host whose agents are the real CLIs (each with a home in a directory of its own),
/// with the real Provider Retry and no account yet.
async fn agent_host(dir: &tempfile::TempDir) -> CoreHost {
    let claude = isolated_binary(Cli::ClaudeCode, &dir.path().join("claude"));
    let codex = isolated_binary(Cli::Codex, &dir.path().join("codex"));
    CoreSetup::new()
        .real_retry()
        .without_account()
        .agents(&format!("claude-code = {:?}", claude.display().to_string()))
        .agents(&format!("codex = {:?}", codex.display().to_string()))
        .start()
        .await
}

fn agent_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// A subscription (OAuth) account; `letter` marks its tokens (`pool::oauth`).
async fn oauth_account(h: &CoreHost, provider: wit::Provider, letter: &str) -> AccountInfo {
    h.add_account(NewAccount {
        provider,
        credential: oauth(provider, letter, None),
        label: None,
        priority: None,
        options: None,
    })
    .await
}

async fn agent_thread(h: &CoreHost, agent: Agent, provider: Provider, text: &str) -> String {
    let spec = AgentSpec {
        agent,
        cwd: None,
        args: Vec::new(),
    };
    let thread = h
        .link
        .new_agent_thread(provider, None, &spec)
        .await
        .expect("an agent thread");
    h.send(&thread, text);
    thread
}

/// The account letter a received request was sent with (`…tok-a` → `a`).
fn letter(received: &Received) -> String {
    let auth = received.header("authorization").unwrap_or_default();
    auth.rsplit("tok-").next().unwrap_or_default().to_owned()
}

/// The model requests the upstream received (not the pool's usage look-ups of an exhausted
/// subscription account).
fn model_calls(h: &CoreHost) -> Vec<Received> {
    h.upstream
        .received()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/messages") || r.path.ends_with("/responses"))
        .collect()
}

fn text_of(received: &Received) -> String {
    String::from_utf8_lossy(&received.body).into_owned()
}

/// A Claude Code turn on a Claude subscription account completes: the upstream saw
/// Claude Code's own betas and the OAuth beta, and the thread shows the reply and the
/// agent's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_on_an_oauth_account_completes() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    oauth_account(&h, wit::Provider::Claude, "a").await;
    h.upstream.push(claude::message("pong"));
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "say pong").await;
    h.settle().await;

    assert_eq!(
        h.upstream.refused(),
        [],
        "the strict provider refused nothing"
    );
    let received = h.upstream.received();
    assert_eq!(received.len(), 1, "one request per turn");
    let betas = received[0].header("anthropic-beta").unwrap_or_default();
    assert!(betas.contains(CLAUDE_CODE_BETA), "{betas}");
    assert_eq!(occurrences(betas, "oauth-2025-04-20"), 1, "{betas}");
    assert_eq!(letter(&received[0]), "a");

    let show = h.show(&thread);
    assert_eq!(show.thread.agent, Agent::ClaudeCode);
    assert_eq!(show.thread.info.status, ThreadStatus::Idle);
    assert_eq!(show.turns.len(), 1);
    assert_eq!(show.turns[0].outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(show.turns[0].reply.as_deref(), Some("pong"));
    // The first turn is started with the thread's session id, which the provider sees.
    assert_eq!(
        show.thread.agent_session.as_deref(),
        Some(show.thread.session_id.as_str())
    );
    assert_eq!(
        received[0].header("x-claude-code-session-id"),
        Some(show.thread.session_id.as_str())
    );
}

/// A Claude Code turn on an API-key account: the key goes upstream as `x-api-key`, and
/// Claude Code's betas go unchanged, with no OAuth beta.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_on_an_api_key_account_carries_no_oauth_beta() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    h.add_claude_key("sk-ant-api03-key-a").await;
    h.upstream.push(claude::message("pong"));
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "say pong").await;
    h.settle().await;
    assert_eq!(h.upstream.refused(), []);
    let received = h.upstream.received();
    assert_eq!(received[0].header("x-api-key"), Some("sk-ant-api03-key-a"));
    assert_eq!(received[0].header("authorization"), None);
    let betas = received[0].header("anthropic-beta").unwrap_or_default();
    assert!(betas.contains(CLAUDE_CODE_BETA), "{betas}");
    assert!(!betas.contains("oauth-2025-04-20"), "{betas}");
    assert_eq!(h.turns(&thread)[0].outcome, Some(TurnOutcomeKind::Ok));
}

/// Seed #6172 with a real Claude Code thread: A answers 429 with unified headers (reset in
/// 2 h) and B is disabled → the turn fails with a rate limit → a retry row about 2 h out →
/// `account enable B` → once the buffer and jitter have passed, the thread's Claude Code
/// session is resumed (the same session id upstream) as attempt 2, served by B, with the
/// person's message in the conversation once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_6172_a_claude_code_thread_resumes_on_the_enabled_account() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    oauth_account(&h, wit::Provider::Claude, "a").await;
    let b = oauth_account(&h, wit::Provider::Claude, "b").await;
    h.disable_account(&b.id).await;
    h.settle().await;
    let t0 = h.now();
    let reset = t0 + 2 * HOUR;
    h.upstream.push(claude::rate_limited(reset, t0));
    const MESSAGE: &str = "Fix the flaky parser test (#6172)";
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, MESSAGE).await;
    h.settle().await;

    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 1);
    let failure = turns[0].failure.clone().expect("a failure description");
    assert_eq!(failure.category, FailureCategory::RateLimit, "{failure:?}");
    assert_eq!(failure.http_status, Some(429), "{failure:?}");
    assert_ne!(failure.origin, FailureOrigin::Transport, "{failure:?}");
    let rows = h.rows(&thread);
    assert_eq!(rows.len(), 1, "one retry row");
    assert!(
        rows[0].send_at >= reset,
        "about 2 h out: {}",
        rows[0].send_at - t0
    );
    assert_eq!(rows[0].attempt, 2);

    h.enable_account(&b.id).await;
    h.settle().await;
    let row = &h.rows(&thread)[0];
    assert!(
        row.send_at <= h.now() + BUFFER_AND_JITTER.as_millis() as u64,
        "moved within the buffer and jitter: {} ms",
        row.send_at - h.now()
    );
    h.upstream.push(claude::message("fixed"));
    h.advance(BUFFER_AND_JITTER).await;

    let received = model_calls(&h);
    assert_eq!(received.len(), 2, "the failed request and the retry");
    assert_eq!(h.upstream.refused(), []);
    assert_eq!(letter(&received[0]), "a");
    assert_eq!(letter(&received[1]), "b", "the retry was served by B");
    let session = received[0].header("x-claude-code-session-id");
    assert!(session.is_some());
    assert_eq!(
        received[1].header("x-claude-code-session-id"),
        session,
        "the same Claude Code session was resumed"
    );
    assert_eq!(
        occurrences(&text_of(&received[1]), MESSAGE),
        1,
        "the person's message is in the conversation once"
    );
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].attempt, 2);
    assert_eq!(turns[1].trigger, TurnTrigger::Retry);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(turns[1].reply.as_deref(), Some("fixed"));
    assert!(h.rows(&thread).is_empty());
}

/// Seed #6172 with a real Codex thread: A answers Codex's usage-limit 429 (window resets in
/// 2 h) and B is disabled → a retry row about 2 h out → enabling B resumes the same Codex
/// session (`codex exec resume`) as attempt 2, served by B, the message in it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_6172_a_codex_thread_resumes_on_the_enabled_account() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    h.set_pool(
        "codex-upstream-url",
        &format!("{}/backend-api/codex", h.upstream.url()),
    )
    .await;
    oauth_account(&h, wit::Provider::Codex, "a").await;
    let b = oauth_account(&h, wit::Provider::Codex, "b").await;
    h.disable_account(&b.id).await;
    h.settle().await;
    let t0 = h.now();
    h.upstream.push(codex::usage_limit(2 * 3_600));
    const MESSAGE: &str = "Port the retry queue to the new schema (#6172)";
    let thread = agent_thread(&h, Agent::Codex, Provider::Codex, MESSAGE).await;
    h.settle().await;

    let turns = h.turns(&thread);
    let failure = turns[0].failure.clone().expect("a failure description");
    assert_eq!(failure.category, FailureCategory::RateLimit, "{failure:?}");
    assert_eq!(failure.http_status, Some(429), "{failure:?}");
    let rows = h.rows(&thread);
    assert_eq!(rows.len(), 1, "one retry row: {turns:?}");
    assert!(
        rows[0].send_at >= t0 + 2 * HOUR,
        "about 2 h out: {}",
        rows[0].send_at - t0
    );

    h.enable_account(&b.id).await;
    h.settle().await;
    h.upstream.push(codex::response("ported"));
    h.advance(BUFFER_AND_JITTER).await;

    let received = model_calls(&h);
    assert_eq!(received.len(), 2, "the failed request and the retry");
    assert_eq!(h.upstream.refused(), []);
    assert_eq!(letter(&received[0]), "a");
    assert_eq!(letter(&received[1]), "b");
    assert_eq!(received[1].header("chatgpt-account-id"), Some("acct-b"));
    let session = received[0].header("session-id");
    assert!(session.is_some());
    assert_eq!(
        received[1].header("session-id"),
        session,
        "the same Codex session"
    );
    assert_eq!(occurrences(&text_of(&received[1]), MESSAGE), 1);
    let show = h.show(&thread);
    assert_eq!(show.thread.agent_session.as_deref(), session);
    assert_eq!(show.turns[1].attempt, 2);
    assert_eq!(show.turns[1].outcome, Some(TurnOutcomeKind::Ok));
    assert_eq!(show.turns[1].reply.as_deref(), Some("ported"));
}

/// A Claude Code thread whose newer turn succeeded while its retry row waited: the row is
/// dropped when it comes due, and no continuation is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_row_of_a_thread_that_moved_on_is_dropped_without_a_continuation() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    oauth_account(&h, wit::Provider::Claude, "a").await;
    h.upstream.push(claude::overloaded());
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "first task").await;
    h.settle().await;
    let rows = h.rows(&thread);
    assert_eq!(
        rows.len(),
        1,
        "a backoff retry of the 529: {:?}",
        h.turns(&thread)
    );

    h.upstream.push(claude::message("done"));
    h.send(&thread, "second task");
    h.settle().await;
    assert_eq!(h.turns(&thread)[1].outcome, Some(TurnOutcomeKind::Ok));

    h.advance(Duration::from_secs(60)).await;
    assert!(h.rows(&thread).is_empty(), "the row was dropped");
    assert_eq!(model_calls(&h).len(), 2, "no continuation was sent");
    assert_eq!(h.turns(&thread).len(), 2);
    assert_eq!(h.show(&thread).thread.info.status, ThreadStatus::Idle);
}

/// A missing agent binary is a clear error when the thread is created, not a failed turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_agent_binary_is_refused_when_the_thread_is_created() {
    let h = CoreSetup::new()
        .agents("claude-code = \"/nonexistent/claude\"")
        .start()
        .await;
    let spec = AgentSpec {
        agent: Agent::ClaudeCode,
        cwd: None,
        args: Vec::new(),
    };
    let err = h
        .link
        .new_agent_thread(Provider::Claude, None, &spec)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/claude") && text.contains("claude-code"),
        "{text}"
    );
    assert!(
        h.core().list_threads().unwrap().is_empty(),
        "no thread was made"
    );
}

/// A Claude Code turn whose stream fails mid-answer with `overloaded_error`: the listener
/// saw the stream begin and then the error event, so the turn fails as `overloaded` with
/// its input accepted (as the built-in driver would describe it), and gets a backoff retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_mid_answer_is_described_from_the_stream() {
    let dir = agent_dir();
    let h = agent_host(&dir).await;
    oauth_account(&h, wit::Provider::Claude, "a").await;
    h.upstream
        .push(claude::stream_error("Let me look", "overloaded_error"));
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "look at it").await;
    h.settle().await;
    assert_eq!(
        model_calls(&h).len(),
        1,
        "Claude Code's own fallback is off"
    );
    let turn = &h.turns(&thread)[0];
    let failure = turn.failure.clone().expect("a failure description");
    assert_eq!(failure.category, FailureCategory::Overloaded, "{failure:?}");
    assert_eq!(failure.origin, FailureOrigin::Provider, "{failure:?}");
    assert!(turn.input_accepted, "the stream had begun");
    assert_eq!(h.rows(&thread).len(), 1, "a backoff retry");
}

/// A stand-in agent that starts a child and waits for it: (its path, the file where the
/// child's pid appears).
fn waiting_agent(dir: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let pid_file = dir.path().join("agent.pid");
    let fake = dir.path().join("claude");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nsleep 120 &\necho $! > '{}'\nwait\n",
            pid_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    (fake, pid_file)
}

/// Whether process `pid` exists.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Waits for the stand-in agent's child to start; its pid.
async fn child_pid(h: &CoreHost, pid_file: &std::path::Path) -> i32 {
    h.wait_for("the agent to start", |_| {
        std::fs::read_to_string(pid_file).is_ok_and(|p| p.ends_with('\n'))
    })
    .await;
    std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A person's cancel of a running agent turn kills the agent's process group; the turn is
/// recorded as failed with a failure Provider Retry does not retry, and the thread takes
/// the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_agent_turn_ends_it_without_a_retry() {
    let dir = agent_dir();
    let (fake, pid_file) = waiting_agent(&dir);
    let h = CoreSetup::new()
        .real_retry()
        .agents(&format!("claude-code = {:?}", fake.display().to_string()))
        .start()
        .await;
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "wait").await;
    let pid = child_pid(&h, &pid_file).await;
    assert!(h.link.cancel_turn(&thread).expect("a thread"));
    h.settle().await;
    let turn = &h.turns(&thread)[0];
    assert_eq!(turn.outcome, Some(TurnOutcomeKind::Failed));
    let failure = turn.failure.clone().unwrap();
    assert_eq!(failure.category, FailureCategory::Unknown, "{failure:?}");
    assert!(failure.message.is_some_and(|m| m.contains("cancelled")));
    assert!(h.rows(&thread).is_empty(), "no retry of a person's cancel");
    assert!(!h.link.cancel_turn(&thread).unwrap(), "nothing runs now");
    h.wait_for("the agent's child to be gone", |_| !alive(pid))
        .await;
}

/// Archiving a thread while its agent runs ends the agent's whole process group, and the
/// turn is recorded as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiving_a_thread_ends_its_running_agent() {
    let dir = agent_dir();
    let (fake, pid_file) = waiting_agent(&dir);
    let h = CoreSetup::new()
        .agents(&format!("claude-code = {:?}", fake.display().to_string()))
        .start()
        .await;
    let thread = agent_thread(&h, Agent::ClaudeCode, Provider::Claude, "wait").await;
    let pid = child_pid(&h, &pid_file).await;
    h.link.archive(&thread).await.expect("archived");
    h.settle().await;
    let turn = &h.turns(&thread)[0];
    assert_eq!(turn.outcome, Some(TurnOutcomeKind::Failed));
    assert!(
        turn.failure
            .as_ref()
            .and_then(|f| f.message.as_deref())
            .is_some_and(|m| m.contains("archived")),
        "{turn:?}"
    );
    h.wait_for("the agent's child to be gone", |_| !alive(pid))
        .await;
}
