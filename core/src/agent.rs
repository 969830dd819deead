//! Agent CLIs as turn runners: one `claude -p` or `codex exec` process per turn, with the
//! thread's route, resuming the thread's agent session after the first turn.
//!
//! What the real CLIs do is recorded in `docs/agents.md` (Claude Code 2.1.328, Codex CLI
//! 0.169.0, observed against loopback fakes); the parts this module relies on:
//!
//! - Claude Code: `claude -p --output-format json [--session-id ID | --resume ID] TEXT`
//!   prints one `{"type":"result",…}` object: `is_error`, `result` (the final text),
//!   `session_id`, `api_error_status`, `subtype`. `--session-id` names the session of a
//!   first turn, so the thread knows it before the turn ends. With
//!   `CLAUDE_CODE_MAX_RETRIES=0` and `CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK=1` a failure
//!   is one request (the pool retries and detours; Provider Retry schedules).
//! - Codex: `codex exec --json --skip-git-repo-check -c … [resume ID] TEXT` prints JSON
//!   lines: `thread.started{thread_id}`, `item.completed{item:{type:"agent_message",text}}`,
//!   `turn.completed` or `turn.failed{error:{message}}`. The provider flags must be given on
//!   every resume; `request_max_retries=0` and `stream_max_retries=0` make a failure one
//!   request.
//! - Both keep a turn's input in their session once they sent it, even when the provider
//!   refused it: a retry resumes the session with a continuation, never the input again.
//!
//! The CLI's text is not a contract. A turn's failure description (status, origin,
//! retry-after) comes from what the host's listener saw of the route's last request
//! ([`Observation`]), classified exactly as the HTTP driver classifies its own requests;
//! the CLI's report says only whether the turn succeeded, its final text and session id,
//! and why it failed when the pool saw nothing wrong (the agent crashed, ran too long, or
//! stopped for a reason of its own).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use hyper::HeaderMap;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::classify;
use crate::driver::StreamEnd;
use crate::model::*;

/// The environment variable that carries the Codex route token (`env_key` of the provider).
pub const CODEX_TOKEN_VAR: &str = "POOLER_CODEX_TOKEN";

/// An agent CLI (the agents that run a process per turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cli {
    ClaudeCode,
    Codex,
}

impl Cli {
    /// The CLI of `agent`; `None` for the HTTP driver.
    pub fn of(agent: Agent) -> Option<Cli> {
        match agent {
            Agent::Http => None,
            Agent::ClaudeCode => Some(Cli::ClaudeCode),
            Agent::Codex => Some(Cli::Codex),
        }
    }

    /// The agent's name (`claude-code`, `codex`).
    pub fn agent(self) -> Agent {
        match self {
            Cli::ClaudeCode => Agent::ClaudeCode,
            Cli::Codex => Agent::Codex,
        }
    }
}

/// Bounds of one agent turn.
#[derive(Debug, Clone)]
pub struct AgentLimits {
    /// Real time a turn may run before its process group is killed.
    pub time_limit: Duration,
    /// The longest output line read (a longer one is skipped whole), and the most of stderr
    /// kept (its end).
    pub max_line_bytes: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            time_limit: Duration::from_secs(30 * 60),
            max_line_bytes: 4 << 20,
        }
    }
}

/// A process to start for one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Set in the child's environment (over the inherited one).
    pub env: Vec<(String, String)>,
    /// Removed from the child's environment (credentials that would override the route).
    pub env_remove: Vec<String>,
    pub cwd: PathBuf,
    /// Where the running process group is noted ([`GROUP_NOTES`]), so that a host killed
    /// outright, whose drop code never ran, kills the group at its next start
    /// ([`kill_left_behind`]). `None`: not noted.
    pub group_notes: Option<PathBuf>,
}

/// The directory, under the data directory, where each running agent's process group is
/// noted: one file per group, named by its id, holding the group leader's start time.
pub const GROUP_NOTES: &str = "agents";

/// The command line of `plan`'s turn for an agent CLI at `program`, sending through
/// `route` (base URL of the host's listener, the thread's route token), in `cwd`.
/// `new_session` is the session id a first Claude Code turn is started with.
///
/// Secrets: the route token goes into the environment only, never into the arguments (a
/// process's arguments are visible to every user of the machine).
pub fn invocation(
    cli: Cli,
    plan: &TurnPlan,
    route: &Route,
    program: &Path,
    cwd: &Path,
    new_session: Option<&str>,
) -> Invocation {
    let base = route.base_url.trim_end_matches('/');
    let mut args: Vec<String> = Vec::new();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut env_remove: Vec<String> = Vec::new();
    match cli {
        Cli::ClaudeCode => {
            args.extend(["-p", "--output-format", "json"].map(String::from));
            match (&plan.agent_session, new_session) {
                (Some(session), _) => args.extend(["--resume".into(), session.clone()]),
                (None, Some(session)) => args.extend(["--session-id".into(), session.into()]),
                (None, None) => {}
            }
            if let Some(model) = &plan.model {
                args.extend(["--model".into(), model.clone()]);
            }
            env.extend([
                ("ANTHROPIC_BASE_URL".into(), base.to_owned()),
                ("ANTHROPIC_AUTH_TOKEN".into(), route.token.clone()),
                (
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                    "1".into(),
                ),
                ("CLAUDE_CODE_MAX_RETRIES".into(), "0".into()),
                (
                    "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK".into(),
                    "1".into(),
                ),
            ]);
            // An API key in the server's environment would win over the route.
            env_remove.extend(["ANTHROPIC_API_KEY".into(), "CLAUDE_CODE_OAUTH_TOKEN".into()]);
        }
        Cli::Codex => {
            args.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
            for flag in [
                "model_provider=\"pooler\"".to_owned(),
                "model_providers.pooler.name=\"Pooler\"".to_owned(),
                format!("model_providers.pooler.base_url=\"{base}/v1\""),
                "model_providers.pooler.wire_api=\"responses\"".to_owned(),
                format!("model_providers.pooler.env_key=\"{CODEX_TOKEN_VAR}\""),
                "model_providers.pooler.request_max_retries=0".to_owned(),
                "model_providers.pooler.stream_max_retries=0".to_owned(),
            ] {
                args.extend(["-c".into(), flag]);
            }
            if let Some(model) = &plan.model {
                args.extend(["-m".into(), model.clone()]);
            }
            env.push((CODEX_TOKEN_VAR.into(), route.token.clone()));
        }
    }
    args.extend(plan.agent.args.iter().cloned());
    if cli == Cli::Codex
        && let Some(session) = &plan.agent_session
    {
        args.extend(["resume".into(), session.clone()]);
    }
    // `--` ends the options: a message that starts with `-` is still the message.
    args.extend(["--".into(), plan.input.clone()]);
    Invocation {
        program: program.to_owned(),
        args,
        env,
        env_remove,
        cwd: cwd.to_owned(),
        group_notes: None,
    }
}

/// What an agent CLI reported about its turn (parsed from its standard output).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CliReport {
    /// The agent's session id (Claude Code `session_id`, Codex `thread_id`).
    pub session: Option<String>,
    /// The turn ended well (Claude Code `is_error: false`; Codex `turn.completed`).
    pub ok: bool,
    /// The final text (Claude Code `result`; Codex's last `agent_message`).
    pub text: Option<String>,
    /// The CLI's own error text, when it reported one.
    pub error: Option<String>,
    /// The HTTP status the CLI said its request failed with (Claude Code
    /// `api_error_status`): a hint only, the listener's record decides.
    pub api_status: Option<u16>,
    /// Claude Code's `subtype` of a failed result (`error_max_turns`, …).
    pub subtype: Option<String>,
    /// A final result was printed at all.
    pub finished: bool,
}

/// Reads an agent CLI's standard output one line at a time, keeping only what
/// [`CliReport`] needs (so a long turn's output costs no memory).
#[derive(Debug, Clone)]
pub struct OutputParser {
    cli: Cli,
    report: CliReport,
}

impl OutputParser {
    pub fn new(cli: Cli) -> Self {
        OutputParser {
            cli,
            report: CliReport::default(),
        }
    }

    /// One line of standard output (without its newline). Lines that are not JSON objects
    /// (a banner, a warning) are ignored.
    pub fn line(&mut self, line: &str) {
        let Ok(Value::Object(event)) = serde_json::from_str::<Value>(line.trim()) else {
            return;
        };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let r = &mut self.report;
        match (self.cli, kind) {
            (Cli::ClaudeCode, "result") => {
                let failed = event
                    .get("is_error")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                r.finished = true;
                r.ok = !failed;
                r.session = text(event.get("session_id")).or(r.session.take());
                r.text = text(event.get("result"));
                r.api_status = event
                    .get("api_error_status")
                    .and_then(Value::as_u64)
                    .and_then(|s| u16::try_from(s).ok());
                r.subtype = text(event.get("subtype")).filter(|s| s != "success");
                r.error = failed.then(|| r.text.clone()).flatten();
            }
            (Cli::Codex, "thread.started") => r.session = text(event.get("thread_id")),
            (Cli::Codex, "item.completed") => {
                let item = event.get("item");
                if item.and_then(|i| i.get("type")).and_then(Value::as_str) == Some("agent_message")
                {
                    r.text = text(item.and_then(|i| i.get("text")));
                }
            }
            (Cli::Codex, "error") => r.error = text(event.get("message")),
            (Cli::Codex, "turn.completed") => {
                r.finished = true;
                r.ok = true;
            }
            (Cli::Codex, "turn.failed") => {
                r.finished = true;
                r.ok = false;
                r.error =
                    text(event.get("error").and_then(|e| e.get("message"))).or(r.error.take());
            }
            _ => {}
        }
    }

    pub fn report(self) -> CliReport {
        self.report
    }
}

/// Parses a whole recorded output (tests, fixtures).
pub fn parse_output(cli: Cli, stdout: &str) -> CliReport {
    let mut parser = OutputParser::new(cli);
    stdout.lines().for_each(|l| parser.line(l));
    parser.report()
}

/// How an agent process ended.
#[derive(Debug, Clone)]
pub struct Run {
    /// What it printed.
    pub report: CliReport,
    /// Its exit status; `None` when it was killed for running past the time limit (or the
    /// turn was abandoned).
    pub status: Option<ExitStatus>,
    /// It ran past the time limit and its process group was killed.
    pub timed_out: bool,
    /// The end of its standard error (at most `max_line_bytes`).
    pub stderr_tail: String,
}

/// Kills a process group when dropped: the agent and anything it started (the Codex npm
/// wrapper's native child, a tool's subprocess) end with the turn, however the turn ends
/// (time limit, the thread archived, the host stopping). Its note (if any) goes with it.
struct GroupGuard(Option<i32>, Option<PathBuf>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // An exited group gives ESRCH: nothing left to kill.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some(note) = self.1.take() {
            let _ = std::fs::remove_file(note);
        }
    }
}

/// The start time of process `pid` (clock ticks since boot, field 22 of `/proc/PID/stat`),
/// which tells a process from a later one that reused its id. `None` off Linux, or when
/// the process is gone.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Notes the running group `pgid` in `dir` (0700; the note 0600): its leader's start time.
fn note_group(dir: &Path, pgid: i32) -> std::io::Result<PathBuf> {
    use std::io::Write;
    crate::private_file::create_private_dir(dir)?;
    let path = dir.join(pgid.to_string());
    let started = start_time(pgid).map(|t| t.to_string()).unwrap_or_default();
    let mut file =
        crate::private_file::create_private_file(&path, crate::private_file::Existing::Truncate)?;
    file.write_all(started.as_bytes())?;
    Ok(path)
}

/// Kills the agent process groups a previous run of the host noted in `dir` and left
/// running (it was killed outright, so no [`GroupGuard`] ran): each group whose leader is
/// still the process noted (same id, same start time) gets SIGKILL; every note is removed.
/// Returns the groups killed. A process that merely reused a noted id is left alone.
pub fn kill_left_behind(dir: &Path) -> std::io::Result<Vec<i32>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut killed = Vec::new();
    for entry in entries {
        let path = entry?.path();
        // A note that is not this user's own names no group of ours.
        let noted = crate::private_file::read_private_file(&path).unwrap_or_default();
        let pgid = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|p| *p > 1);
        if let Some(pgid) = pgid
            && let Some(now) = start_time(pgid)
            && noted.trim().parse::<u64>().ok() == Some(now)
            && killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
        {
            killed.push(pgid);
        }
        std::fs::remove_file(&path)?;
    }
    Ok(killed)
}

/// Reads `reader` line by line into `on_line`. A line longer than `max` bytes is read
/// through but not kept (no JSON report is that long); blank lines are skipped.
async fn read_lines(
    reader: impl AsyncRead + Unpin,
    max: usize,
    mut on_line: impl FnMut(&str),
) -> std::io::Result<()> {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut kept_all = true;
        loop {
            let buf = reader.fill_buf().await?;
            if buf.is_empty() {
                break;
            }
            let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
                Some(at) => (&buf[..at], at + 1),
                None => (buf, buf.len()),
            };
            let room = max.saturating_sub(line.len());
            kept_all &= chunk.len() <= room;
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let newline = done > chunk.len();
            reader.consume(done);
            if newline {
                break;
            }
        }
        if line.is_empty() && reader.fill_buf().await?.is_empty() {
            return Ok(());
        }
        if kept_all && !line.is_empty() {
            on_line(&String::from_utf8_lossy(&line));
        }
    }
}

/// Runs one agent turn: starts `inv` in its own process group with no standard input,
/// reads its output as it comes, and waits for it to end within `limits.time_limit`
/// (real time: it bounds a real process). Dropping the future kills the process group.
pub async fn run(inv: &Invocation, cli: Cli, limits: &AgentLimits) -> std::io::Result<Run> {
    let mut command = tokio::process::Command::new(&inv.program);
    command
        .args(&inv.args)
        .current_dir(&inv.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for name in &inv.env_remove {
        command.env_remove(name);
    }
    for (name, value) in &inv.env {
        command.env(name, value);
    }
    let mut child = command.spawn()?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let mut group = GroupGuard(pgid, None);
    // Noted before the turn goes on: a host killed from here on leaves the note behind
    // (and a note that cannot be written ends the turn, its group killed).
    if let (Some(pgid), Some(dir)) = (pgid, &inv.group_notes) {
        group.1 = Some(note_group(dir, pgid)?);
    }

    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let max = limits.max_line_bytes;
    let mut parser = OutputParser::new(cli);
    let mut stderr_tail = String::new();
    let work = async {
        let out = read_lines(stdout, max, |line| parser.line(line));
        let err = read_lines(stderr, max, |line| {
            stderr_tail.push_str(line);
            stderr_tail.push('\n');
            if stderr_tail.len() > max {
                let cut = stderr_tail.len() - max;
                let cut = (cut..stderr_tail.len())
                    .find(|i| stderr_tail.is_char_boundary(*i))
                    .unwrap_or(stderr_tail.len());
                stderr_tail.drain(..cut);
            }
        });
        let (out, err) = tokio::join!(out, err);
        out.and(err)?;
        child.wait().await
    };
    let (status, timed_out) = match tokio::time::timeout(limits.time_limit, work).await {
        Ok(status) => (Some(status?), false),
        Err(_) => (None, true),
    };
    Ok(Run {
        report: parser.report(),
        status,
        timed_out,
        stderr_tail,
    })
}

/// What runs an agent turn's [`Invocation`]. The host starts an operating-system process
/// ([`run`]) unless its embedder gives it a launcher of its own: the week simulator plays
/// Claude Code and Codex in-process, so a turn there costs no process and sleeps on the
/// virtual clock. A launcher reports what the process would have: the CLI's output (parse it
/// with [`parse_output`]), its exit status, and the end of its standard error; the host
/// still bounds it by the turn's time limit.
pub trait Launcher: Send + Sync + 'static {
    fn launch<'a>(
        &'a self,
        invocation: &'a Invocation,
        cli: Cli,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Run>> + Send + 'a>>;
}

/// One answer the host's listener gave on a route (see [`Observation`]).
#[derive(Debug, Clone)]
pub struct Observed {
    pub status: u16,
    pub headers: HeaderMap,
    /// The start of a non-2xx answer's body (at most 64 KiB).
    pub error_body: Vec<u8>,
    /// How a 2xx stream ended (a 2xx answer that is not a stream is `Completed`).
    pub stream: StreamEnd,
    /// The body reached its end (a stream cut short, or left by its reader, has not).
    pub finished: bool,
}

/// What the host's listener saw of one route's requests during a turn.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Requests answered (a head was sent).
    pub requests: u32,
    /// A stream of the turn began answering (the provider accepted the input).
    pub accepted: bool,
    /// The latest rate-limit snapshot the answers carried.
    pub rate_limits: Option<RateLimitSnapshot>,
    /// The latest answer.
    pub last: Option<Observed>,
}

/// The failure an observed answer stands for, classified as the HTTP driver classifies
/// its own requests; `None` for a completed answer.
pub fn observed_failure(provider: Provider, seen: &Observed, now: Timestamp) -> Option<Failure> {
    if !(200..300).contains(&seen.status) {
        return Some(match provider {
            Provider::Claude => {
                classify::claude_http_failure(seen.status, &seen.headers, &seen.error_body, now)
            }
            Provider::Codex => {
                classify::codex_http_failure(seen.status, &seen.headers, &seen.error_body, now)
            }
        });
    }
    match &seen.stream {
        StreamEnd::Completed => None,
        StreamEnd::Failed(failure) => Some(failure.clone()),
        StreamEnd::Open if seen.finished => Some(classify::stream_disconnected(
            &seen.headers,
            "the stream ended before its final event",
        )),
        StreamEnd::Open => Some(classify::stream_disconnected(
            &seen.headers,
            "the stream was cut before its final event",
        )),
    }
}

/// How an agent process ended, in words.
fn exit_words(run: &Run) -> String {
    use std::os::unix::process::ExitStatusExt;
    match run.status {
        Some(s) if s.code().is_some() => format!("exited with status {}", s.code().unwrap_or(0)),
        Some(s) => format!("was killed by signal {}", s.signal().unwrap_or(0)),
        None => "did not end".into(),
    }
}

fn own_failure(category: FailureCategory, message: String) -> Failure {
    Failure {
        category,
        provider_code: None,
        http_status: None,
        origin: FailureOrigin::Transport,
        retry_after: None,
        message: Some(message.chars().take(1024).collect()),
    }
}

/// The outcome of an agent turn from how its process ended and what the listener saw.
///
/// - The CLI reported success: succeeded, with its final text.
/// - Otherwise, when the route's last answer failed (non-2xx, a failure in its stream, a
///   stream cut short): that failure, as the HTTP driver would have described it.
/// - Otherwise the agent's own failure, origin `transport`: past the time limit
///   (`stream-disconnected` when a stream was open, else `connection-failed`: both worth a
///   retry); its own reason (`max-turns` for Claude Code's `error_max_turns`); a crash or
///   an unexplained error (`unknown`: not retried automatically).
///
/// The input is in the agent's session when the agent reached the pool or reported a
/// session (both CLIs write the input to their session before they send it).
pub fn outcome(
    plan: &TurnPlan,
    run: &Run,
    seen: &Observation,
    new_session: Option<&str>,
    now: Timestamp,
) -> TurnOutcome {
    let agent = plan.agent.agent;
    let report = &run.report;
    let reached = seen.requests > 0 || report.session.is_some();
    let session = report
        .session
        .clone()
        .or_else(|| plan.agent_session.clone())
        .or_else(|| reached.then(|| new_session.map(str::to_owned)).flatten());
    let result = if report.ok && !run.timed_out {
        TurnResult::Succeeded {
            reply: report.text.clone().unwrap_or_default(),
        }
    } else {
        let seen_failure = seen
            .last
            .as_ref()
            .and_then(|last| observed_failure(plan.provider, last, now));
        let failure = match seen_failure {
            Some(failure) => failure,
            None if run.timed_out => {
                let open = seen
                    .last
                    .as_ref()
                    .is_some_and(|l| l.stream == StreamEnd::Open);
                own_failure(
                    if open {
                        FailureCategory::StreamDisconnected
                    } else {
                        FailureCategory::ConnectionFailed
                    },
                    format!("the {agent} agent ran past its time limit and was stopped"),
                )
            }
            None if report.subtype.as_deref() == Some("error_max_turns") => own_failure(
                FailureCategory::MaxTurns,
                format!("the {agent} agent stopped at its turn limit"),
            ),
            None => {
                let why = report
                    .error
                    .clone()
                    .or_else(|| {
                        let tail = run.stderr_tail.trim();
                        (!tail.is_empty()).then(|| tail.lines().last().unwrap_or(tail).to_owned())
                    })
                    .unwrap_or_else(|| "no report".into());
                own_failure(
                    FailureCategory::Unknown,
                    format!("the {agent} agent {}: {why}", exit_words(run)),
                )
            }
        };
        TurnResult::Failed {
            failure,
            partial_reply: String::new(),
        }
    };
    TurnOutcome {
        result,
        input_accepted: seen.accepted,
        rate_limits: seen.rate_limits.clone(),
        agent_session: session,
        input_in_session: reached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::CONTINUE_INPUT;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/agents")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn claude_code_results_are_read_from_recorded_output() {
        let ok = parse_output(Cli::ClaudeCode, &fixture("claude-success.json"));
        assert!(ok.ok && ok.finished);
        assert_eq!(ok.text.as_deref(), Some("pong"));
        assert_eq!(
            ok.session.as_deref(),
            Some("aee15230-6aa0-45fb-83c2-e2fd79449ff7")
        );
        assert_eq!(ok.error, None);

        let limited = parse_output(Cli::ClaudeCode, &fixture("claude-429.json"));
        assert!(!limited.ok && limited.finished);
        assert_eq!(limited.api_status, Some(429));
        assert!(
            limited
                .error
                .as_deref()
                .is_some_and(|e| e.contains("(429)"))
        );
        assert_eq!(
            limited.session.as_deref(),
            Some("45e67187-5cfa-4a75-a63e-502b40b74c31")
        );
        assert_eq!(limited.subtype, None, "`subtype: success` even on an error");

        for (name, status) in [("claude-5xx.json", 500), ("claude-529.json", 529)] {
            let gave_up = parse_output(Cli::ClaudeCode, &fixture(name));
            assert!(!gave_up.ok, "{name}");
            assert_eq!(gave_up.api_status, Some(status), "{name}");
        }
        // A crash prints nothing (kill -9: exit 137, empty output).
        let crashed = parse_output(Cli::ClaudeCode, "");
        assert!(!crashed.ok && !crashed.finished);
        assert_eq!(crashed, CliReport::default());
    }

    #[test]
    fn codex_results_are_read_from_recorded_output() {
        let ok = parse_output(Cli::Codex, &fixture("codex-success.jsonl"));
        assert!(ok.ok && ok.finished);
        assert_eq!(ok.text.as_deref(), Some("pong"));
        assert_eq!(
            ok.session.as_deref(),
            Some("01a2331a-e075-7971-aa18-84c5d94e233a")
        );

        let limited = parse_output(Cli::Codex, &fixture("codex-429.jsonl"));
        assert!(!limited.ok && limited.finished);
        assert!(
            limited
                .error
                .as_deref()
                .is_some_and(|e| e.contains("usage limit"))
        );
        assert_eq!(
            limited.session.as_deref(),
            Some("01a2331a-ffba-7311-badf-db67a8e404d5")
        );

        let gave_up = parse_output(Cli::Codex, &fixture("codex-5xx-noretry.jsonl"));
        assert!(!gave_up.ok);
        assert!(gave_up.error.as_deref().is_some_and(|e| e.contains("502")));

        // Killed mid-turn: the session started, nothing finished.
        let killed = parse_output(
            Cli::Codex,
            "{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}\n{\"type\":\"turn.started\"}\n",
        );
        assert!(!killed.finished && !killed.ok);
        assert_eq!(killed.session.as_deref(), Some("t-1"));
    }

    fn plan(agent: Agent, session: Option<&str>, input: &str) -> TurnPlan {
        TurnPlan {
            request: "rq_1".into(),
            thread: "th_1".into(),
            provider: agent.provider().unwrap_or(Provider::Claude),
            model: Some("m-1".into()),
            session_id: "s".into(),
            input: input.into(),
            attempt: 1,
            original_request: "rq_1".into(),
            trigger: TurnTrigger::User,
            route: None,
            history: Vec::new(),
            agent: AgentSpec {
                agent,
                cwd: None,
                args: vec!["--verbose".into()],
            },
            agent_session: session.map(str::to_owned),
        }
    }

    fn route() -> Route {
        Route {
            base_url: "http://127.0.0.1:8787/".into(),
            token: "route-token-secret".into(),
        }
    }

    #[test]
    fn claude_code_is_started_then_resumed_with_the_route_in_its_environment() {
        let first = invocation(
            Cli::ClaudeCode,
            &plan(Agent::ClaudeCode, None, "-starts with a dash"),
            &route(),
            Path::new("/bin/claude"),
            Path::new("/w"),
            Some("uuid-1"),
        );
        assert_eq!(
            first.args,
            [
                "-p",
                "--output-format",
                "json",
                "--session-id",
                "uuid-1",
                "--model",
                "m-1",
                "--verbose",
                "--",
                "-starts with a dash"
            ]
        );
        assert!(
            first
                .env
                .contains(&("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:8787".into()))
        );
        assert!(
            first
                .env
                .contains(&("ANTHROPIC_AUTH_TOKEN".into(), "route-token-secret".into()))
        );
        assert!(
            first
                .env
                .contains(&("CLAUDE_CODE_MAX_RETRIES".into(), "0".into()))
        );
        assert!(first.env_remove.contains(&"ANTHROPIC_API_KEY".to_owned()));
        assert!(!first.args.iter().any(|a| a.contains("route-token-secret")));
        let later = invocation(
            Cli::ClaudeCode,
            &plan(Agent::ClaudeCode, Some("uuid-1"), CONTINUE_INPUT),
            &route(),
            Path::new("/bin/claude"),
            Path::new("/w"),
            None,
        );
        assert_eq!(
            later.args[3..5],
            ["--resume".to_owned(), "uuid-1".to_owned()]
        );
        assert_eq!(later.args.last().map(String::as_str), Some(CONTINUE_INPUT));
    }

    #[test]
    fn codex_gets_the_provider_flags_on_every_turn_and_resume_before_the_text() {
        let first = invocation(
            Cli::Codex,
            &plan(Agent::Codex, None, "hello"),
            &route(),
            Path::new("codex"),
            Path::new("/w"),
            None,
        );
        assert_eq!(first.args[..3], ["exec", "--json", "--skip-git-repo-check"]);
        assert!(
            first.args.contains(
                &"model_providers.pooler.base_url=\"http://127.0.0.1:8787/v1\"".to_owned()
            )
        );
        assert!(
            first
                .args
                .contains(&"model_providers.pooler.request_max_retries=0".to_owned())
        );
        assert!(
            first
                .env
                .contains(&(CODEX_TOKEN_VAR.into(), "route-token-secret".into()))
        );
        assert!(!first.args.contains(&"resume".to_owned()));
        let later = invocation(
            Cli::Codex,
            &plan(Agent::Codex, Some("t-1"), CONTINUE_INPUT),
            &route(),
            Path::new("codex"),
            Path::new("/w"),
            None,
        );
        let n = later.args.len();
        assert_eq!(
            later.args[n - 5..],
            ["--verbose", "resume", "t-1", "--", CONTINUE_INPUT].map(String::from)
        );
        assert_eq!(first.args[..n - 5], later.args[..n - 5], "the same flags");
    }

    fn run_with(report: CliReport) -> Run {
        use std::os::unix::process::ExitStatusExt;
        Run {
            status: Some(ExitStatus::from_raw(if report.ok { 0 } else { 1 << 8 })),
            report,
            timed_out: false,
            stderr_tail: String::new(),
        }
    }

    fn pool_429() -> Observed {
        let mut headers = HeaderMap::new();
        headers.insert("x-pooler-origin", "pool".parse().unwrap());
        headers.insert("retry-after", "3600".parse().unwrap());
        Observed {
            status: 429,
            headers,
            error_body: br#"{"type":"error","error":{"type":"rate_limit_error","message":"busy"}}"#
                .to_vec(),
            stream: StreamEnd::Open,
            finished: true,
        }
    }

    #[test]
    fn a_failed_turn_is_described_by_the_listeners_record_not_the_cli_text() {
        const NOW: Timestamp = 1_700_000_000_000;
        let report = parse_output(Cli::ClaudeCode, &fixture("claude-429.json"));
        let seen = Observation {
            requests: 1,
            accepted: false,
            rate_limits: None,
            last: Some(pool_429()),
        };
        let out = outcome(
            &plan(Agent::ClaudeCode, None, "x"),
            &run_with(report),
            &seen,
            Some("uuid-1"),
            NOW,
        );
        let TurnResult::Failed { failure, .. } = &out.result else {
            panic!("{out:?}")
        };
        assert_eq!(failure.category, FailureCategory::RateLimit);
        assert_eq!(failure.http_status, Some(429));
        assert_eq!(failure.origin, FailureOrigin::Pool);
        assert_eq!(failure.retry_after, Some(NOW + 3_600_000));
        assert!(out.input_in_session);
        assert_eq!(
            out.agent_session.as_deref(),
            Some("45e67187-5cfa-4a75-a63e-502b40b74c31")
        );

        // A crash the pool never saw: the agent's own failure, not retried automatically.
        let crashed = Run {
            status: Some(std::os::unix::process::ExitStatusExt::from_raw(9)),
            report: CliReport::default(),
            timed_out: false,
            stderr_tail: "boom\n".into(),
        };
        let out = outcome(
            &plan(Agent::ClaudeCode, None, "x"),
            &crashed,
            &Observation::default(),
            Some("uuid-2"),
            NOW,
        );
        let TurnResult::Failed { failure, .. } = &out.result else {
            panic!("{out:?}")
        };
        assert_eq!(failure.category, FailureCategory::Unknown);
        assert_eq!(failure.origin, FailureOrigin::Transport);
        assert!(
            failure
                .message
                .as_deref()
                .is_some_and(|m| m.contains("signal 9")),
            "{failure:?}"
        );
        assert!(!out.input_in_session, "it never reached the pool");
        assert_eq!(out.agent_session, None, "the new session was never used");

        // Past the time limit with a stream open: a cut stream, worth a retry.
        let open = Observed {
            status: 200,
            headers: HeaderMap::new(),
            error_body: Vec::new(),
            stream: StreamEnd::Open,
            finished: false,
        };
        let seen = Observation {
            requests: 1,
            accepted: true,
            rate_limits: None,
            last: Some(open),
        };
        let timed = Run {
            status: None,
            report: CliReport::default(),
            timed_out: true,
            stderr_tail: String::new(),
        };
        let out = outcome(
            &plan(Agent::Codex, Some("t-1"), "x"),
            &timed,
            &seen,
            None,
            NOW,
        );
        let TurnResult::Failed { failure, .. } = &out.result else {
            panic!("{out:?}")
        };
        assert_eq!(failure.category, FailureCategory::StreamDisconnected);
        assert!(out.input_accepted && out.input_in_session);
        assert_eq!(out.agent_session.as_deref(), Some("t-1"));

        // Success: the CLI's final text.
        let ok = parse_output(Cli::Codex, &fixture("codex-success.jsonl"));
        let out = outcome(
            &plan(Agent::Codex, None, "x"),
            &run_with(ok),
            &Observation::default(),
            None,
            NOW,
        );
        assert_eq!(
            out.result,
            TurnResult::Succeeded {
                reply: "pong".into()
            }
        );
    }

    #[tokio::test]
    async fn output_lines_are_read_whole_and_an_overlong_one_is_skipped() {
        let input = format!("one\n\n{}\ntwo\nlast", "x".repeat(100));
        let mut lines = Vec::new();
        read_lines(input.as_bytes(), 10, |l| lines.push(l.to_owned()))
            .await
            .unwrap();
        assert_eq!(lines, ["one", "two", "last"]);
    }

    #[tokio::test]
    async fn a_process_is_run_without_stdin_and_killed_past_its_time_limit() {
        let dir = std::env::temp_dir();
        let echo = Invocation {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "read x || echo '{\"type\":\"result\",\"is_error\":false,\"result\":\"no stdin\",\"session_id\":\"s\"}'; echo oops >&2".into(),
            ],
            env: Vec::new(),
            env_remove: Vec::new(),
            cwd: dir.clone(),
            group_notes: None,
        };
        let run = run(&echo, Cli::ClaudeCode, &AgentLimits::default())
            .await
            .unwrap();
        assert!(run.report.ok, "{run:?}");
        assert_eq!(run.report.text.as_deref(), Some("no stdin"));
        assert_eq!(run.stderr_tail, "oops\n");
        assert!(run.status.is_some_and(|s| s.success()));

        // A process the agent started is killed with it when the time limit passes.
        let pid_file = dir.join(crate::ids::new_id("pooler-agent-group"));
        let slow = Invocation {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("sleep 60 & echo $! > {}; sleep 60", pid_file.display()),
            ],
            env: Vec::new(),
            env_remove: Vec::new(),
            cwd: dir,
            group_notes: None,
        };
        let limits = AgentLimits {
            time_limit: Duration::from_millis(300),
            ..AgentLimits::default()
        };
        let run = super::run(&slow, Cli::ClaudeCode, &limits).await.unwrap();
        assert!(run.timed_out && run.status.is_none());
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::remove_file(&pid_file);
        // The kernel reaps the orphan soon after the kill; wait for that, not for a timer.
        let gone = async {
            // No signal: only whether the process exists.
            while nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the agent's background process was killed with its group");
    }

    /// The parsers of Claude Code's and Codex's output, on arbitrary and
    /// on near-valid lines.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        const FIXTURES: &[(Cli, &str)] = &[
            (Cli::ClaudeCode, "claude-success.json"),
            (Cli::ClaudeCode, "claude-429.json"),
            (Cli::ClaudeCode, "claude-5xx.json"),
            (Cli::ClaudeCode, "claude-529.json"),
            (Cli::Codex, "codex-success.jsonl"),
            (Cli::Codex, "codex-429.jsonl"),
            (Cli::Codex, "codex-5xx-noretry.jsonl"),
        ];

        fn cli() -> impl Strategy<Value = Cli> {
            prop_oneof![Just(Cli::ClaudeCode), Just(Cli::Codex)]
        }

        /// JSON values built from the words the parsers look for, nested a little.
        fn json() -> impl Strategy<Value = Value> {
            let word = prop_oneof![
                Just("type"),
                Just("result"),
                Just("is_error"),
                Just("session_id"),
                Just("api_error_status"),
                Just("subtype"),
                Just("thread.started"),
                Just("thread_id"),
                Just("item.completed"),
                Just("item"),
                Just("agent_message"),
                Just("text"),
                Just("error"),
                Just("message"),
                Just("turn.completed"),
                Just("turn.failed"),
                Just("success"),
            ];
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_map(
                    |f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
                ),
                word.clone().prop_map(Value::from),
                any::<String>().prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 32, 6, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::vec((word.clone(), inner), 0..6).prop_map(|kv| {
                        Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                    }),
                ]
            })
        }

        /// A line that is not a JSON object (a banner, a warning, a progress bar).
        fn noise() -> impl Strategy<Value = String> {
            any::<String>().prop_map(|s| {
                let s = s.replace(['\n', '\r'], " ");
                if s.trim_start().starts_with('{') {
                    format!("warning: {s}")
                } else {
                    s
                }
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                failure_persistence: Some(Box::new(
                    proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
                )),
                ..ProptestConfig::default()
            })]

            /// Any lines, JSON or not: no panic, and a report that says it is fine only
            /// when it also says the turn finished.
            #[test]
            fn any_output_gives_a_consistent_report(
                cli in cli(),
                lines in prop::collection::vec(
                    prop_oneof![json().prop_map(|v| v.to_string()), any::<String>()],
                    0..8,
                ),
            ) {
                let mut parser = OutputParser::new(cli);
                for line in &lines {
                    parser.line(line);
                }
                let report = parser.report();
                prop_assert!(!report.ok || report.finished, "{report:?}");
                prop_assert!(report.subtype.as_deref() != Some("success"));
                if lines.iter().all(|l| !l.contains(['\n', '\r'])) {
                    prop_assert_eq!(&report, &parse_output(cli, &lines.join("\n")));
                }
            }

            /// A recorded output with noise lines anywhere reads as the recording does.
            #[test]
            fn noise_between_recorded_lines_changes_nothing(
                which in 0..FIXTURES.len(),
                noise in prop::collection::vec((any::<usize>(), noise()), 0..6),
            ) {
                let (cli, name) = FIXTURES[which];
                let recorded = fixture(name);
                let mut lines: Vec<String> = recorded.lines().map(str::to_owned).collect();
                for (at, line) in noise {
                    let at = at % (lines.len() + 1);
                    lines.insert(at, line);
                }
                prop_assert_eq!(parse_output(cli, &lines.join("\n")), parse_output(cli, &recorded));
            }
        }

        #[test]
        fn every_recorded_output_still_parses() {
            for (cli, name) in FIXTURES {
                let report = parse_output(*cli, &fixture(name));
                assert!(report.finished, "{name}");
                assert!(report.session.is_some(), "{name}");
                assert_eq!(report.ok, name.contains("success"), "{name}");
            }
        }
    }

    /// What a host killed outright leaves: agent groups noted and still running. The next
    /// start kills a noted group whose leader is the process noted, and leaves alone a
    /// process whose start time differs (an id reused since); every note is removed.
    #[test]
    fn groups_a_killed_host_left_running_are_killed_and_reused_ids_are_not() {
        use std::os::unix::process::CommandExt;
        let notes = std::env::temp_dir()
            .join(crate::ids::new_id("pooler-agent-notes"))
            .join(GROUP_NOTES);
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("60")
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let (mut left, mut other) = (spawn(), spawn());
        let left_id = left.id() as i32;
        note_group(&notes, left_id).unwrap();
        // A note whose process has another start time: the id was reused.
        std::fs::write(notes.join(other.id().to_string()), "1").unwrap();
        assert_eq!(kill_left_behind(&notes).unwrap(), [left_id]);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(left.wait().unwrap().signal(), Some(Signal::SIGKILL as i32));
        assert!(other.try_wait().unwrap().is_none(), "not the noted process");
        assert_eq!(
            std::fs::read_dir(&notes).unwrap().count(),
            0,
            "notes removed"
        );
        other.kill().unwrap();
        other.wait().unwrap();
        std::fs::remove_dir_all(notes.parent().unwrap()).unwrap();
        // Nothing noted: nothing to do.
        assert!(kill_left_behind(&notes).unwrap().is_empty());
    }

    /// A note anyone could have written (here one others can write) names no group of ours:
    /// the group it names is left running, and the note removed.
    #[test]
    fn a_note_others_could_have_written_kills_nothing() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let notes = std::env::temp_dir()
            .join(crate::ids::new_id("pooler-agent-notes"))
            .join(GROUP_NOTES);
        let mut running = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let note = note_group(&notes, running.id() as i32).unwrap();
        std::fs::set_permissions(&note, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(kill_left_behind(&notes).unwrap(), Vec::<i32>::new());
        assert!(running.try_wait().unwrap().is_none(), "left running");
        assert!(!note.exists(), "the note is removed");
        running.kill().unwrap();
        running.wait().unwrap();
        std::fs::remove_dir_all(notes.parent().unwrap()).unwrap();
    }
}
