//! The agents: in-process models of Claude Code and Codex CLI that the core launches in
//! place of their processes ([`pooler_core::agent::Launcher`]). They take the invocation the
//! core builds for the real CLI — its arguments, the route in its environment — and behave
//! as the CLI does in the respects that matter to the pool (`docs/agents.md`,
//! `shared/reference/real-clients.md`):
//!
//! - a turn is a sequence of streaming requests through the route (tool loops), with tool
//!   time between them on the virtual clock, sometimes subagents sending in parallel on the
//!   same session id;
//! - Claude Code sends `POST /v1/messages?beta=true` with `authorization: Bearer`,
//!   `x-claude-code-session-id` and the session in `metadata.user_id`; Codex sends
//!   `POST /v1/responses` with `session-id`/`thread-id` and `prompt_cache_key`;
//! - with retries off (as the core runs them) the first failed request ends the turn, and
//!   the CLI prints its result line (`is_error`, `api_error_status`; Codex `turn.failed`);
//! - the session keeps the conversation: a resumed turn continues the task where it
//!   stopped (the failed request is sent again, finished ones are not).
//!
//! What each request costs and how long it streams is the provider model's business; the
//! agent says it in the message text ([`crate::model::Tag`]).

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pooler_core::Provider;
use pooler_core::agent::{Cli, Invocation, Launcher, Run, parse_output};
use pooler_core::clock::SharedClock;
use pooler_core::driver::{StreamEnd, StreamWatch};
use serde_json::json;

use crate::ledger::Ledger;
use crate::model::{Model, Tag};
use crate::pins::Pins;
use crate::workload::{Req, Step, ThreadPlan};

/// The person's message of task `task` of thread `thread`.
pub fn task_message(thread: u32, task: usize) -> String {
    format!("sim-task t={thread} k={task}")
}

fn parse_task_message(text: &str) -> Option<(u32, usize)> {
    let rest = text.trim().strip_prefix("sim-task ")?;
    let mut thread = None;
    let mut task = None;
    for part in rest.split_whitespace() {
        match part.split_once('=')? {
            ("t", v) => thread = v.parse().ok(),
            ("k", v) => task = v.parse().ok(),
            _ => {}
        }
    }
    Some((thread?, task?))
}

/// Where a session's conversation stands.
#[derive(Debug, Clone, Default)]
struct Session {
    thread: u32,
    task: Option<usize>,
    /// The step of the task it is at, and how far each chain of a fan-out step got.
    step: usize,
    chains: Vec<usize>,
}

/// Tells the person a task finished.
pub type TaskDone = Arc<dyn Fn(u32, usize) + Send + Sync>;

/// The agents of one run.
pub struct Agents {
    plans: Arc<Vec<ThreadPlan>>,
    ledger: Arc<Ledger>,
    clock: SharedClock,
    client: Client<HttpConnector, Full<Bytes>>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Codex sessions the agent named (the CLI makes its own ids).
    codex_sessions: Mutex<u64>,
    done: TaskDone,
    requests: std::sync::atomic::AtomicU64,
    model: Arc<Model>,
    /// The host and the pin watch, once the host exists (it is built after the core, which
    /// takes this launcher).
    watch: std::sync::OnceLock<(pooler_host::runtime::Host, Arc<Pins>)>,
}

/// How one request went.
enum Sent {
    Ok,
    /// An HTTP status other than 2xx, or a stream that failed (`None`: no status).
    Failed(Option<u16>, String),
}

impl Agents {
    pub fn new(
        plans: Arc<Vec<ThreadPlan>>,
        ledger: Arc<Ledger>,
        model: Arc<Model>,
        clock: SharedClock,
        done: TaskDone,
    ) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Agents {
            plans,
            ledger,
            clock,
            client: Client::builder(TokioExecutor::new()).build(http),
            sessions: Mutex::new(HashMap::new()),
            codex_sessions: Mutex::new(0),
            done,
            requests: std::sync::atomic::AtomicU64::new(0),
            model,
            watch: std::sync::OnceLock::new(),
        }
    }

    /// Where served requests are compared with their conversation's pin.
    pub fn watch_pins(&self, host: pooler_host::runtime::Host, pins: Arc<Pins>) {
        let _ = self.watch.set((host, pins));
    }

    /// Requests the agents sent through the pool.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn turn(&self, invocation: &Invocation, cli: Cli) -> std::io::Result<Run> {
        let args = &invocation.args;
        let arg_after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        let message = arg_after("--").unwrap_or_default();
        let env = |name: &str| {
            invocation
                .env
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let (session, base, token) = match cli {
            Cli::ClaudeCode => (
                arg_after("--resume").or_else(|| arg_after("--session-id")),
                env("ANTHROPIC_BASE_URL").map(|b| format!("{b}/v1/messages?beta=true")),
                env("ANTHROPIC_AUTH_TOKEN"),
            ),
            Cli::Codex => {
                let resumed = arg_after("resume");
                let base = args
                    .iter()
                    .find_map(|a| a.strip_prefix("model_providers.pooler.base_url="))
                    .map(|b| format!("{}/responses", b.trim_matches('"')));
                (resumed, base, env(pooler_core::agent::CODEX_TOKEN_VAR))
            }
        };
        let (Some(base), Some(token)) = (base, token) else {
            return Ok(finished(
                cli,
                None,
                Err((None, "no route in the environment".into())),
            ));
        };
        let session = match session {
            Some(s) => s,
            None => {
                let mut n = self
                    .codex_sessions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                *n += 1;
                format!("019a0000-0000-7000-8000-{:012x}", *n)
            }
        };
        // The conversation: a person's message starts (or names) a task; a continuation
        // goes on with the task in hand.
        let (thread, task) = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let state = sessions.entry(session.clone()).or_default();
            if let Some((thread, task)) = parse_task_message(&message) {
                state.thread = thread;
                if state.task != Some(task) {
                    state.task = Some(task);
                    state.step = 0;
                    state.chains.clear();
                }
            }
            (state.thread, state.task)
        };
        let Some(task) = task else {
            return Ok(finished(
                cli,
                Some(&session),
                Err((None, "no task in this session".into())),
            ));
        };
        let plan = self.plans[thread as usize].clone();
        let model = plan.model.clone();
        self.ledger
            .turn_started(thread as usize, self.clock.now_ms());
        // The turn ends in the ledger however it ends: the core drops a turn that runs past
        // its time limit (or is cancelled) without waiting for it to return.
        let mut running = Running {
            ledger: &self.ledger,
            clock: &self.clock,
            thread: thread as usize,
            returned: false,
        };
        let result = self
            .work(
                cli,
                &base,
                &token,
                &session,
                &model,
                thread,
                &plan.tasks[task].steps,
            )
            .await;
        let now = self.clock.now_ms();
        if let Err((status, why)) = &result {
            tracing::debug!(thread, task, now, ?status, why, "agent turn failed");
        }
        if result.is_ok() {
            self.ledger.task_done(thread as usize, now);
        }
        running.returned = true;
        drop(running);
        if result.is_ok() {
            (self.done)(thread, task);
        }
        Ok(finished(cli, Some(&session), result))
    }

    /// Runs the task's remaining steps; the first failed request ends the turn.
    #[allow(clippy::too_many_arguments)]
    async fn work(
        &self,
        cli: Cli,
        url: &str,
        token: &str,
        session: &str,
        model: &str,
        thread: u32,
        steps: &[Step],
    ) -> Result<(), (Option<u16>, String)> {
        loop {
            let (step, chains_done) = {
                let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
                let s = &sessions[session];
                (s.step, s.chains.clone())
            };
            let Some(current) = steps.get(step) else {
                return Ok(());
            };
            match current {
                Step::One(req) => {
                    if let Sent::Failed(status, why) = self
                        .send(cli, url, token, session, model, thread, req)
                        .await
                    {
                        return Err((status, why));
                    }
                    self.sleep(req.tool_ms).await;
                }
                Step::FanOut(chains) => {
                    let runs = chains.iter().enumerate().map(|(c, chain)| {
                        let from = chains_done.get(c).copied().unwrap_or(0);
                        async move {
                            for (i, req) in chain.iter().enumerate().skip(from) {
                                if let Sent::Failed(status, why) = self
                                    .send(cli, url, token, session, model, thread, req)
                                    .await
                                {
                                    return (i, Some((status, why)));
                                }
                                self.sleep(req.tool_ms).await;
                            }
                            (chain.len(), None)
                        }
                    });
                    let ends = futures_join(runs.collect()).await;
                    let failure = ends.iter().find_map(|(_, f)| f.clone());
                    let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
                    let s = sessions.get_mut(session).expect("the session exists");
                    if let Some(failure) = failure {
                        s.chains = ends.iter().map(|(done, _)| *done).collect();
                        return Err(failure);
                    }
                    s.chains.clear();
                }
            }
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.get_mut(session).expect("the session exists").step = step + 1;
        }
    }

    async fn sleep(&self, ms: u64) {
        let until = self.clock.now_ms() + ms;
        self.clock.sleep_until(until).await;
    }

    /// One request through the route, read to its end.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        cli: Cli,
        url: &str,
        token: &str,
        session: &str,
        model: &str,
        thread: u32,
        req: &Req,
    ) -> Sent {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = Tag {
            thread,
            request: req.n,
            context: req.context,
            output: req.output,
            cache_key: req.cache_key.clone(),
        }
        .text();
        let builder = hyper::Request::post(url)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        let (builder, body, provider) = match cli {
            Cli::ClaudeCode => (
                builder
                    .header("anthropic-version", "2023-06-01")
                    .header(
                        "anthropic-beta",
                        "claude-code-20250219,interleaved-thinking-2025-05-14",
                    )
                    .header("x-app", "cli")
                    .header("x-claude-code-session-id", session),
                json!({"model": model, "max_tokens": 32000, "stream": true,
                       "messages": [{"role": "user", "content": tag}],
                       "metadata": {"user_id": json!({"session_id": session}).to_string()}}),
                Provider::Claude,
            ),
            Cli::Codex => (
                builder
                    .header("session-id", session)
                    .header("thread-id", session)
                    .header("originator", "codex_exec"),
                json!({"model": model, "stream": true, "store": false, "prompt_cache_key": session,
                       "input": [{"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": tag}]}]}),
                Provider::Codex,
            ),
        };
        let request = match builder.body(Full::new(Bytes::from(body.to_string()))) {
            Ok(r) => r,
            Err(e) => return Sent::Failed(None, e.to_string()),
        };
        let response = match self.client.request(request).await {
            Ok(r) => r,
            Err(e) => return Sent::Failed(None, format!("Connection error: {e}")),
        };
        let status = response.status().as_u16();
        let (parts, mut body) = response.into_parts();
        if !(200..300).contains(&status) {
            let text = body
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            return Sent::Failed(Some(status), text);
        }
        let mut watch = StreamWatch::new(provider, parts.headers);
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        watch.push(&data, self.clock.now_ms());
                        if *watch.end() != StreamEnd::Open {
                            break;
                        }
                    }
                }
                Some(Err(e)) => return Sent::Failed(None, format!("stream broke: {e}")),
                None => break,
            }
        }
        match watch.end() {
            StreamEnd::Completed => {
                if let (Some((host, pins)), Some(account)) =
                    (self.watch.get(), self.model.served_by(thread, req.n))
                {
                    let wit = match provider {
                        Provider::Claude => pooler_host::runtime::bindings::types::Provider::Claude,
                        Provider::Codex => pooler_host::runtime::bindings::types::Provider::Codex,
                    };
                    pins.served(host, wit, session, account, self.clock.now_ms())
                        .await;
                }
                Sent::Ok
            }
            StreamEnd::Failed(f) => {
                Sent::Failed(f.http_status, f.message.clone().unwrap_or_default())
            }
            StreamEnd::Open => Sent::Failed(None, "the stream ended before its final event".into()),
        }
    }
}

/// A turn running, as the ledger sees it: ended when dropped.
struct Running<'a> {
    ledger: &'a Ledger,
    clock: &'a SharedClock,
    thread: usize,
    /// The turn returned (else the core dropped it: its time limit, a cancel).
    returned: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.returned {
            self.ledger.act_turn_cut(self.thread);
        }
        self.ledger.turn_ended(self.thread, self.clock.now_ms());
    }
}

/// Waits for every future (the subagents of a fan-out), in order of their results.
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    futures::future::join_all(futures).await
}

/// What the CLI prints and how it exits, parsed as the core parses the real one's.
fn finished(cli: Cli, session: Option<&str>, result: Result<(), (Option<u16>, String)>) -> Run {
    let stdout = match cli {
        Cli::ClaudeCode => {
            let mut line = match &result {
                Ok(()) => json!({"type": "result", "subtype": "success", "is_error": false,
                                 "result": "done", "stop_reason": "end_turn"}),
                Err((status, why)) => {
                    let text = match status {
                        Some(s) => format!("API Error: Request rejected ({s}) · {why}"),
                        None => format!("API Error: {why}"),
                    };
                    json!({"type": "result", "subtype": "success", "is_error": true,
                           "terminal_reason": "api_error", "result": text})
                }
            };
            if let Some(s) = session {
                line["session_id"] = json!(s);
            }
            if let Err((Some(status), _)) = &result {
                line["api_error_status"] = json!(status);
            }
            line.to_string()
        }
        Cli::Codex => {
            let mut lines = Vec::new();
            if let Some(s) = session {
                lines.push(json!({"type": "thread.started", "thread_id": s}).to_string());
            }
            lines.push(json!({"type": "turn.started"}).to_string());
            match &result {
                Ok(()) => {
                    lines.push(json!({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "done"}}).to_string());
                    lines.push(json!({"type": "turn.completed"}).to_string());
                }
                Err((_, why)) => {
                    lines.push(json!({"type": "error", "message": why}).to_string());
                    lines.push(
                        json!({"type": "turn.failed", "error": {"message": why}}).to_string(),
                    );
                }
            }
            lines.join("\n")
        }
    };
    Run {
        report: parse_output(cli, &stdout),
        status: Some(std::process::ExitStatus::from_raw(if result.is_ok() {
            0
        } else {
            256
        })),
        timed_out: false,
        stderr_tail: String::new(),
    }
}

impl Launcher for Agents {
    fn launch<'a>(
        &'a self,
        invocation: &'a Invocation,
        cli: Cli,
    ) -> Pin<Box<dyn std::future::Future<Output = std::io::Result<Run>> + Send + 'a>> {
        Box::pin(self.turn(invocation, cli))
    }
}

/// The launcher handle the core takes.
pub fn launcher(agents: &Arc<Agents>) -> Arc<dyn Launcher> {
    agents.clone()
}
