//! The turn driver: one turn is one real streaming provider request, sent with the thread's
//! route (normally the pool's base URL and per-thread token).
//!
//! - Claude: `POST {base}/v1/messages`, `Authorization: Bearer <token>`, `anthropic-version`,
//!   `X-Claude-Code-Session-Id`, body `{model, max_tokens, stream: true, messages,
//!   metadata: {user_id: "{\"session_id\":\"…\"}"}}`; the reply is the `text_delta`s of
//!   `content_block_delta` events, the end is `message_stop`.
//! - Codex: `POST {base}/v1/responses`, headers `session-id` and `thread-id`, body `{model,
//!   input, stream: true, store: false, prompt_cache_key}`; the reply is the
//!   `response.output_text.delta`s, the end is `response.completed`.
//!
//! The stream is read to its end. The input counts as accepted once the provider's first
//! regular event arrives. Rate-limit headers become a snapshot; any failure is classified
//! by [`crate::classify`]. Silence longer than the idle timeout (measured on the host clock,
//! so tests advance it instead of sleeping) ends the turn as a failure. The driver speaks
//! plain HTTP: routes point at the local pool.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::classify;
use crate::clock::SharedClock;
use crate::error::CoreError;
use crate::model::*;
use crate::ratelimit;
use crate::sse::{SseEvent, SseParser};
use crate::store::Core;

/// The most of an error body the driver reads (the message is truncated further).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Settings of the turn driver.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The longest silence (no response headers, or no stream bytes) before the turn fails.
    pub idle_timeout: Duration,
    /// `max_tokens` of Claude requests.
    pub max_tokens: u32,
    /// The `anthropic-version` header.
    pub anthropic_version: String,
    /// The model when a Claude thread names none.
    pub default_claude_model: String,
    /// The model when a Codex thread names none.
    pub default_codex_model: String,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            idle_timeout: Duration::from_secs(300),
            max_tokens: 8192,
            anthropic_version: "2023-06-01".into(),
            default_claude_model: "claude-sonnet-4-5".into(),
            default_codex_model: "gpt-5-codex".into(),
        }
    }
}

/// Sends turns and reads their streams. Cheap to share: one keep-alive HTTP client.
#[derive(Clone)]
pub struct TurnDriver {
    client: Client<HttpConnector, Full<Bytes>>,
    clock: SharedClock,
    config: DriverConfig,
}

impl std::fmt::Debug for TurnDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnDriver")
            .field("config", &self.config)
            .finish()
    }
}

/// Runs `plan` with `driver` and records the outcome in `core`: marks the input accepted
/// when the stream begins, then [`Core::record_outcome`]. Returns the outbox event id.
pub async fn run_and_record(
    core: &Core,
    driver: &TurnDriver,
    plan: &TurnPlan,
    route: &Route,
) -> Result<EventId, CoreError> {
    let mut accept_error = None;
    let outcome = driver
        .run(plan, route, || {
            accept_error = core.mark_input_accepted(&plan.request).err();
        })
        .await;
    if let Some(e) = accept_error {
        // The outcome below carries input_accepted anyway; only crash reporting is weaker.
        tracing::warn!(request = %plan.request, error = %e, "could not note input acceptance");
    }
    core.record_outcome(&plan.request, &outcome)
}

enum Progress {
    Continue,
    Completed,
    Failed(Failure),
}

/// How a provider's stream ended, as far as a [`StreamWatch`] saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEnd {
    /// No final event yet (still streaming, or it stopped without one).
    Open,
    /// The provider's final event (`message_stop`, `response.completed`).
    Completed,
    /// The stream carried a failure (an `error` event, `response.failed`, a refusal…).
    Failed(Failure),
}

/// Reads a provider's server-sent-events stream as it passes: the reply text, whether the
/// provider began answering (the input was accepted), and how the stream ended. The turn
/// driver reads its own streams with it; the host's listener watches an agent CLI's
/// streams through the pool with it, so both classify a stream the same way.
pub struct StreamWatch {
    provider: Provider,
    headers: HeaderMap,
    parser: SseParser,
    reply: String,
    accepted: bool,
    refused: bool,
    end: StreamEnd,
}

impl StreamWatch {
    /// A watch of a `provider` stream whose response head carried `headers`.
    pub fn new(provider: Provider, headers: HeaderMap) -> Self {
        StreamWatch {
            provider,
            headers,
            parser: SseParser::new(),
            reply: String::new(),
            accepted: false,
            refused: false,
            end: StreamEnd::Open,
        }
    }

    /// Feeds the next bytes of the stream, read at `now`. Bytes after the end are ignored.
    pub fn push(&mut self, bytes: &[u8], now: Timestamp) {
        if self.end != StreamEnd::Open {
            return;
        }
        for event in self.parser.push(bytes) {
            match self.event(&event, now) {
                Progress::Continue => {}
                Progress::Completed => self.end = StreamEnd::Completed,
                Progress::Failed(failure) => self.end = StreamEnd::Failed(failure),
            }
            if self.end != StreamEnd::Open {
                return;
            }
        }
    }

    /// The provider began answering: its first regular event arrived.
    pub fn accepted(&self) -> bool {
        self.accepted
    }

    /// How the stream ended so far.
    pub fn end(&self) -> &StreamEnd {
        &self.end
    }

    /// The reply text so far.
    pub fn reply(&self) -> &str {
        &self.reply
    }

    /// The response head's headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    fn event(&mut self, sse: &SseEvent, now: Timestamp) -> Progress {
        let data: Value = serde_json::from_str(&sse.data).unwrap_or(Value::Null);
        let kind = sse
            .event
            .clone()
            .or_else(|| data.get("type").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        let failure_event = matches!(
            kind.as_str(),
            "error" | "response.failed" | "response.incomplete"
        );
        if !failure_event && !kind.is_empty() {
            self.accepted = true;
        }
        match self.provider {
            Provider::Claude => self.claude_event(&kind, &data, now),
            Provider::Codex => self.codex_event(&kind, &data, now),
        }
    }

    fn claude_event(&mut self, kind: &str, data: &Value, now: Timestamp) -> Progress {
        match kind {
            "content_block_delta" => {
                let delta = &data["delta"];
                if delta["type"] == "text_delta"
                    && let Some(text) = delta["text"].as_str()
                {
                    self.reply.push_str(text);
                }
                Progress::Continue
            }
            "message_delta" => {
                if data["delta"]["stop_reason"] == "refusal" {
                    self.refused = true;
                }
                Progress::Continue
            }
            "message_stop" if self.refused => Progress::Failed(Failure {
                category: FailureCategory::Policy,
                provider_code: Some("refusal".into()),
                http_status: None,
                origin: classify::origin_of(&self.headers),
                retry_after: None,
                message: Some("the model refused to answer".into()),
            }),
            "message_stop" => Progress::Completed,
            "error" => Progress::Failed(classify::claude_stream_error(&self.headers, data, now)),
            _ => Progress::Continue,
        }
    }

    fn codex_event(&mut self, kind: &str, data: &Value, now: Timestamp) -> Progress {
        match kind {
            "response.output_text.delta" => {
                if let Some(text) = data["delta"].as_str() {
                    self.reply.push_str(text);
                }
                Progress::Continue
            }
            "response.completed" => Progress::Completed,
            "response.failed" | "error" => {
                Progress::Failed(classify::codex_stream_error(&self.headers, data, now))
            }
            "response.incomplete" => {
                let reason = data["response"]["incomplete_details"]["reason"].as_str();
                let category = match reason {
                    Some("max_output_tokens") => FailureCategory::MaxOutputTokens,
                    Some("content_filter") => FailureCategory::Policy,
                    _ => FailureCategory::Unknown,
                };
                Progress::Failed(Failure {
                    category,
                    provider_code: reason.map(str::to_string),
                    http_status: None,
                    origin: classify::origin_of(&self.headers),
                    retry_after: None,
                    message: Some("the response ended incomplete".into()),
                })
            }
            _ => Progress::Continue,
        }
    }
}

impl TurnDriver {
    pub fn new(clock: SharedClock, config: DriverConfig) -> Self {
        TurnDriver {
            client: Client::builder(TokioExecutor::new()).build_http(),
            clock,
            config,
        }
    }

    /// Builds the provider request for `plan` sent through `route`.
    pub fn build_request(
        &self,
        plan: &TurnPlan,
        route: &Route,
    ) -> Result<Request<Full<Bytes>>, String> {
        let base = route.base_url.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(format!(
                "route base URL {base:?} is not plain http (the driver talks to the local pool)"
            ));
        }
        let bearer = format!("Bearer {}", route.token);
        let builder = Request::post(match plan.provider {
            Provider::Claude => format!("{base}/v1/messages"),
            Provider::Codex => format!("{base}/v1/responses"),
        })
        .header("authorization", bearer)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
        let (builder, body) = match plan.provider {
            Provider::Claude => {
                let mut messages = Vec::new();
                for ex in &plan.history {
                    messages.push(json!({"role": "user", "content": ex.user}));
                    if !ex.assistant.is_empty() {
                        messages.push(json!({"role": "assistant", "content": ex.assistant}));
                    }
                }
                messages.push(json!({"role": "user", "content": plan.input}));
                let body = json!({
                    "model": plan.model.as_deref().unwrap_or(&self.config.default_claude_model),
                    "max_tokens": self.config.max_tokens,
                    "stream": true,
                    "messages": messages,
                    "metadata": {
                        "user_id": json!({"session_id": plan.session_id}).to_string(),
                    },
                });
                (
                    builder
                        .header("anthropic-version", &self.config.anthropic_version)
                        .header("x-claude-code-session-id", &plan.session_id),
                    body,
                )
            }
            Provider::Codex => {
                let message = |role: &str, kind: &str, text: &str| json!({"type": "message", "role": role, "content": [{"type": kind, "text": text}]});
                let mut input = Vec::new();
                for ex in &plan.history {
                    input.push(message("user", "input_text", &ex.user));
                    if !ex.assistant.is_empty() {
                        input.push(message("assistant", "output_text", &ex.assistant));
                    }
                }
                input.push(message("user", "input_text", &plan.input));
                let body = json!({
                    "model": plan.model.as_deref().unwrap_or(&self.config.default_codex_model),
                    "input": input,
                    "stream": true,
                    "store": false,
                    "prompt_cache_key": plan.session_id,
                });
                (
                    builder
                        .header("session-id", &plan.session_id)
                        .header("thread-id", &plan.session_id),
                    body,
                )
            }
        };
        builder
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("invalid request: {e}"))
    }

    /// Sends the turn and reads it to its end. `on_accepted` runs once, when the provider's
    /// stream begins. Never fails: every failure is a classified [`TurnResult::Failed`].
    pub async fn run(
        &self,
        plan: &TurnPlan,
        route: &Route,
        on_accepted: impl FnOnce() + Send,
    ) -> TurnOutcome {
        let outcome = self.run_inner(plan, route, on_accepted).await;
        // A provider may echo a credential in its message; never store one. (Tokens shorter
        // than 8 characters are not real route tokens, and replacing them would garble text.)
        match outcome.result {
            TurnResult::Failed {
                mut failure,
                partial_reply,
            } => {
                if let Some(m) = failure.message.as_mut()
                    && route.token.len() >= 8
                {
                    *m = m.replace(&route.token, "[redacted]");
                }
                TurnOutcome {
                    result: TurnResult::Failed {
                        failure,
                        partial_reply,
                    },
                    ..outcome
                }
            }
            _ => outcome,
        }
    }

    async fn run_inner(
        &self,
        plan: &TurnPlan,
        route: &Route,
        on_accepted: impl FnOnce() + Send,
    ) -> TurnOutcome {
        let failed = TurnOutcome::failed;
        let request = match self.build_request(plan, route) {
            Ok(r) => r,
            Err(message) => return failed(classify::connection_failed(&message)),
        };
        let response = match self.within_idle(self.client.request(request)).await {
            None => {
                return failed(classify::connection_failed(
                    "no response before the idle timeout",
                ));
            }
            Some(Err(e)) => return failed(classify::connection_failed(&error_chain(&e))),
            Some(Ok(r)) => r,
        };
        let now = self.clock.now_ms();
        let rate_limits = ratelimit::snapshot_from_headers(plan.provider, response.headers(), now);
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = self.read_error_body(response).await;
            let failure = match plan.provider {
                Provider::Claude => classify::claude_http_failure(status, &headers, &body, now),
                Provider::Codex => classify::codex_http_failure(status, &headers, &body, now),
            };
            return TurnOutcome {
                rate_limits,
                ..failed(failure)
            };
        }
        self.read_stream(plan.provider, response, rate_limits, on_accepted)
            .await
    }

    async fn read_stream(
        &self,
        provider: Provider,
        response: Response<Incoming>,
        rate_limits: Option<RateLimitSnapshot>,
        on_accepted: impl FnOnce() + Send,
    ) -> TurnOutcome {
        let (parts, mut body) = response.into_parts();
        let mut watch = StreamWatch::new(provider, parts.headers);
        let mut on_accepted = Some(on_accepted);
        let failed = loop {
            let frame = match self.within_idle(body.frame()).await {
                None => break Some("the stream stalled past the idle timeout".to_string()),
                Some(None) => break Some("the stream ended before its final event".to_string()),
                Some(Some(Err(e))) => break Some(error_chain(&e)),
                Some(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers carry nothing the turn needs
            };
            watch.push(&data, self.clock.now_ms());
            if watch.accepted()
                && let Some(callback) = on_accepted.take()
            {
                callback();
            }
            if *watch.end() != StreamEnd::Open {
                break None;
            }
        };
        let reply = watch.reply().to_string();
        let result = match (failed, watch.end()) {
            (Some(why), _) => TurnResult::Failed {
                failure: classify::stream_disconnected(watch.headers(), &why),
                partial_reply: reply,
            },
            (None, StreamEnd::Failed(failure)) => TurnResult::Failed {
                failure: failure.clone(),
                partial_reply: reply,
            },
            (None, _) => TurnResult::Succeeded { reply },
        };
        TurnOutcome {
            result,
            input_accepted: watch.accepted(),
            rate_limits,
            agent_session: None,
            input_in_session: false,
        }
    }

    async fn read_error_body(&self, response: Response<Incoming>) -> Vec<u8> {
        let mut body = response.into_body();
        let mut out = Vec::new();
        while out.len() < MAX_ERROR_BODY {
            match self.within_idle(body.frame()).await {
                Some(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let room = MAX_ERROR_BODY - out.len();
                        out.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                // A truncated error body still classifies by its status.
                _ => break,
            }
        }
        out
    }

    /// `fut`, or `None` if the idle timeout passes first on the host clock.
    async fn within_idle<F: Future>(&self, fut: F) -> Option<F::Output> {
        let deadline = self
            .clock
            .now_ms()
            .saturating_add(self.config.idle_timeout.as_millis() as u64);
        tokio::select! {
            out = fut => Some(out),
            _ = self.clock.sleep_until(deadline) => None,
        }
    }
}

/// An error and its sources, e.g. "client error (Connect): tcp connect error: Connection
/// refused". hyper's errors never include request headers, so no token can leak here.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
