//! The turn driver against a fake upstream: a real hyper HTTP/1 server on 127.0.0.1 that
//! answers each request with the next scripted response (success streams, error statuses,
//! a dropped connection, a stream broken or stalled mid-way) and records what it received.
//! Timeouts run on the manual clock; nothing sleeps.

use crate::common;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use common::*;
use pooler_core::clock::{ManualClock, SharedClock};
use pooler_core::driver::{DriverConfig, TurnDriver, run_and_record};
use pooler_core::*;

// ---------------------------------------------------------------- fake upstream

/// How a scripted stream ends.
#[derive(Clone, Copy)]
enum End {
    /// The body completes normally.
    Finish,
    /// The body neither continues nor ends (until [`Upstream::cut`] breaks it).
    Stall,
}

enum Script {
    /// A complete response.
    Respond {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// A 200 `text/event-stream` response sending `events`, then ending as `end` says.
    Stream {
        headers: Vec<(&'static str, String)>,
        events: Vec<String>,
        end: End,
    },
    /// The connection is closed with no response at all.
    Drop,
}

#[derive(Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Value,
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

/// A response body fed through a channel, so a script can cut it or hold it open.
struct ChannelBody(mpsc::UnboundedReceiver<Chunk>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        self.0.poll_recv(cx)
    }
}

#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    scripts: Arc<Mutex<VecDeque<Script>>>,
    received: Arc<Mutex<Vec<Received>>>,
    /// Senders of stalled bodies, kept alive so the bodies stay open.
    held: Arc<Mutex<Vec<mpsc::UnboundedSender<Chunk>>>>,
}

impl Upstream {
    async fn start(scripts: Vec<Script>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Upstream {
            addr: listener.local_addr().unwrap(),
            scripts: Arc::new(Mutex::new(scripts.into())),
            received: Arc::default(),
            held: Arc::default(),
        };
        let server = upstream.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| server.clone().handle(req));
                    // Scripted breakage makes some connections end in errors; that is the point.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        upstream
    }

    fn route(&self) -> Route {
        Route {
            base_url: format!("http://{}", self.addr),
            token: "route-token-abc123".into(),
        }
    }

    /// Cuts every stalled stream: the server aborts those connections mid-body.
    fn cut(&self) {
        for tx in self.held.lock().unwrap().drain(..) {
            let _ = tx.send(Err(std::io::Error::other("scripted: cut the stream")));
        }
    }

    fn received(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.received.lock().unwrap()
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<ChannelBody>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        self.received.lock().unwrap().push(Received {
            path: parts.uri.path().to_string(),
            headers: parts.headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        let script = self
            .scripts
            .lock()
            .unwrap()
            .pop_front()
            .expect("a script for every request");
        let (tx, rx) = mpsc::unbounded_channel();
        let mut response = Response::builder();
        match script {
            Script::Drop => return Err(std::io::Error::other("scripted: drop the connection")),
            Script::Respond {
                status,
                headers,
                body,
            } => {
                response = response.status(status);
                for (k, v) in headers {
                    response = response.header(k, v);
                }
                tx.send(Ok(Frame::data(Bytes::from(body)))).unwrap();
            }
            Script::Stream {
                headers,
                events,
                end,
            } => {
                response = response
                    .status(200)
                    .header("content-type", "text/event-stream");
                for (k, v) in headers {
                    response = response.header(k, v);
                }
                for e in events {
                    tx.send(Ok(Frame::data(Bytes::from(e)))).unwrap();
                }
                match end {
                    End::Finish => {}
                    End::Stall => self.held.lock().unwrap().push(tx),
                }
            }
        }
        Ok(response.body(ChannelBody(rx)).unwrap())
    }
}

fn sse(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn claude_success(text_parts: &[&str]) -> Vec<String> {
    let mut events = vec![sse(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1"}}),
    )];
    events.push(sse(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0}),
    ));
    for part in text_parts {
        events.push(sse(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}}),
        ));
    }
    events.push(sse(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
    ));
    events.push(sse("message_stop", json!({"type": "message_stop"})));
    events
}

fn codex_success(text_parts: &[&str]) -> Vec<String> {
    let mut events = vec![sse(
        "response.created",
        json!({"type": "response.created", "response": {"id": "resp_1"}}),
    )];
    for part in text_parts {
        events.push(sse(
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "delta": part}),
        ));
    }
    events.push(sse(
        "response.completed",
        json!({"type": "response.completed", "response": {"id": "resp_1"}}),
    ));
    events
}

// ---------------------------------------------------------------- helpers

const IDLE: Duration = Duration::from_secs(300);

fn driver(clock: &Arc<ManualClock>) -> TurnDriver {
    TurnDriver::new(
        clock.clone() as SharedClock,
        DriverConfig {
            idle_timeout: IDLE,
            ..DriverConfig::default()
        },
    )
}

fn plan(provider: Provider) -> TurnPlan {
    TurnPlan {
        request: "rq_test".into(),
        thread: "th_test".into(),
        provider,
        model: Some("model-x".into()),
        session_id: "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab".into(),
        input: "hello".into(),
        attempt: 1,
        original_request: "rq_test".into(),
        trigger: TurnTrigger::User,
        route: None,
        history: vec![],
        agent: AgentSpec::default(),
        agent_session: None,
    }
}

async fn run(upstream: &Upstream, provider: Provider) -> TurnOutcome {
    let clock = ManualClock::new(T0);
    driver(&clock)
        .run(&plan(provider), &upstream.route(), || {})
        .await
}

fn spawnable<F: std::future::Future + Send>(future: F) -> F {
    future
}

fn failure(outcome: &TurnOutcome) -> &Failure {
    match &outcome.result {
        TurnResult::Failed { failure, .. } => failure,
        other => panic!("expected a failure, got {other:?}"),
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn a_claude_turn_streams_its_reply_with_the_thread_session() {
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![
            ("anthropic-ratelimit-unified-status", "allowed".into()),
            ("anthropic-ratelimit-unified-5h-utilization", "0.25".into()),
            ("anthropic-ratelimit-unified-5h-reset", "1790003600".into()),
        ],
        events: claude_success(&["Hello", ", ", "world"]),
        end: End::Finish,
    }])
    .await;
    let mut accepted = false;
    let clock = ManualClock::new(T0);
    let outcome = driver(&clock)
        .run(&plan(Provider::Claude), &upstream.route(), || {
            accepted = true
        })
        .await;
    assert_eq!(
        outcome.result,
        TurnResult::Succeeded {
            reply: "Hello, world".into()
        }
    );
    assert!(outcome.input_accepted && accepted);
    let snapshot = outcome.rate_limits.expect("headers carried a snapshot");
    assert_eq!(snapshot.status, LimitStatus::Allowed);
    assert_eq!(snapshot.windows[0].resets_at, Some(1_790_003_600_000));

    let received = upstream.received();
    let req = &received[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.headers["authorization"], "Bearer route-token-abc123");
    assert_eq!(req.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        req.headers["x-claude-code-session-id"],
        "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab"
    );
    assert_eq!(req.body["model"], "model-x");
    assert_eq!(req.body["stream"], true);
    assert!(req.body["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        req.body["messages"],
        json!([{"role": "user", "content": "hello"}])
    );
    let user_id: Value =
        serde_json::from_str(req.body["metadata"]["user_id"].as_str().unwrap()).unwrap();
    assert_eq!(
        user_id,
        json!({"session_id": "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab"})
    );
}

#[tokio::test]
async fn a_codex_turn_streams_its_reply_with_the_session_headers_and_cache_key() {
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![
            ("x-codex-primary-used-percent", "40".into()),
            ("x-codex-primary-window-minutes", "300".into()),
        ],
        events: codex_success(&["Done", "."]),
        end: End::Finish,
    }])
    .await;
    let outcome = run(&upstream, Provider::Codex).await;
    assert_eq!(
        outcome.result,
        TurnResult::Succeeded {
            reply: "Done.".into()
        }
    );
    assert_eq!(
        outcome.rate_limits.unwrap().windows[0].utilization,
        Some(0.4)
    );
    let received = upstream.received();
    let req = &received[0];
    assert_eq!(req.path, "/v1/responses");
    assert_eq!(
        req.headers["session-id"],
        "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab"
    );
    assert_eq!(
        req.headers["thread-id"],
        "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab"
    );
    assert_eq!(
        req.body["prompt_cache_key"],
        "0b7c3f1e-5d2a-4c8e-9f10-1234567890ab"
    );
    assert_eq!(req.body["store"], false);
    assert_eq!(req.body["stream"], true);
    assert_eq!(
        req.body["input"],
        json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}])
    );
}

#[tokio::test]
async fn a_429_with_retry_after_is_a_rate_limit_with_its_deadline() {
    let upstream = Upstream::start(vec![Script::Respond {
        status: 429,
        headers: vec![("retry-after", "120".into())],
        body:
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
                .to_string(),
    }])
    .await;
    let outcome = run(&upstream, Provider::Claude).await;
    let f = failure(&outcome);
    assert_eq!(f.category, FailureCategory::RateLimit);
    assert_eq!(f.http_status, Some(429));
    assert_eq!(f.origin, FailureOrigin::Provider);
    assert_eq!(f.retry_after, Some(T0 + 120_000));
    assert_eq!(f.provider_code.as_deref(), Some("rate_limit_error"));
    assert!(!outcome.input_accepted);
}

#[tokio::test]
async fn the_pools_own_answer_is_marked_with_origin_pool() {
    let upstream = Upstream::start(vec![Script::Respond {
        status: 429,
        headers: vec![("x-pooler-origin", "pool".into()), ("retry-after", "60".into())],
        body: json!({"type": "error", "error": {"type": "rate_limit_error", "message": "every account is blocked"}})
            .to_string(),
    }])
    .await;
    let outcome = run(&upstream, Provider::Claude).await;
    let f = failure(&outcome);
    assert_eq!(
        (f.origin, f.category, f.retry_after),
        (
            FailureOrigin::Pool,
            FailureCategory::RateLimit,
            Some(T0 + 60_000)
        )
    );
}

#[tokio::test]
async fn a_502_from_a_gateway_is_internal_with_its_status() {
    let upstream = Upstream::start(vec![Script::Respond {
        status: 502,
        headers: vec![("content-type", "text/html".into())],
        body: "<html>502 Bad Gateway</html>".into(),
    }])
    .await;
    let outcome = run(&upstream, Provider::Codex).await;
    let f = failure(&outcome);
    assert_eq!(
        (f.category, f.http_status, f.origin),
        (
            FailureCategory::Internal,
            Some(502),
            FailureOrigin::Provider
        )
    );
    assert_eq!(f.message.as_deref(), Some("<html>502 Bad Gateway</html>"));
}

#[tokio::test]
async fn a_connection_dropped_before_any_response_is_connection_failed() {
    let upstream = Upstream::start(vec![Script::Drop]).await;
    let outcome = run(&upstream, Provider::Claude).await;
    let f = failure(&outcome);
    assert_eq!(
        (f.category, f.origin, f.http_status),
        (
            FailureCategory::ConnectionFailed,
            FailureOrigin::Transport,
            None
        )
    );
    assert!(!outcome.input_accepted);
}

#[tokio::test]
async fn a_refused_connection_is_connection_failed() {
    // Take a free port, then close it, so nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let clock = ManualClock::new(T0);
    let route = Route {
        base_url: format!("http://{addr}"),
        token: "t".into(),
    };
    let outcome = driver(&clock)
        .run(&plan(Provider::Codex), &route, || {})
        .await;
    let f = failure(&outcome);
    assert_eq!(
        (f.category, f.origin),
        (FailureCategory::ConnectionFailed, FailureOrigin::Transport)
    );
    assert!(
        f.message
            .as_deref()
            .unwrap()
            .to_lowercase()
            .contains("connect"),
        "{f:?}"
    );
}

#[tokio::test]
async fn a_stream_broken_midway_is_stream_disconnected_with_the_partial_reply() {
    let mut events = claude_success(&["Half", " an answer"]);
    events.truncate(4); // message_start, content_block_start, two deltas
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![],
        events,
        end: End::Stall,
    }])
    .await;
    // Cut the connection once the driver has seen the stream begin, so the break is
    // mid-stream by construction.
    let clock = ManualClock::new(T0);
    let outcome = driver(&clock)
        .run(&plan(Provider::Claude), &upstream.route(), || {
            upstream.cut()
        })
        .await;
    assert!(outcome.input_accepted);
    match &outcome.result {
        TurnResult::Failed {
            failure,
            partial_reply,
        } => {
            assert_eq!(failure.category, FailureCategory::StreamDisconnected);
            assert_eq!(failure.origin, FailureOrigin::Provider);
            assert_eq!(partial_reply, "Half an answer");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stream_that_ends_without_its_final_event_is_stream_disconnected() {
    let mut events = codex_success(&["x"]);
    events.pop();
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![("x-pooler-origin", "pool".into())],
        events,
        end: End::Finish,
    }])
    .await;
    let outcome = run(&upstream, Provider::Codex).await;
    let f = failure(&outcome);
    assert_eq!(
        (f.category, f.origin),
        (FailureCategory::StreamDisconnected, FailureOrigin::Pool)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_fails_when_the_idle_timeout_passes_on_the_host_clock() {
    let events = claude_success(&["Started"])[..3].to_vec();
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![],
        events,
        end: End::Stall,
    }])
    .await;
    let clock = ManualClock::new(T0);
    let driver = driver(&clock);
    let route = upstream.route();
    let (began_tx, began) = tokio::sync::oneshot::channel();
    let mut task = tokio::spawn(async move {
        driver
            .run(&plan(Provider::Claude), &route, move || {
                let _ = began_tx.send(());
            })
            .await
    });
    // Once the stream has begun, move the host clock until the driver, waiting on the
    // stalled stream, gives up. Nothing waits for real time: each round only lets the other
    // tasks run.
    began.await.unwrap();
    let outcome = loop {
        clock.advance(IDLE + Duration::from_secs(1));
        tokio::select! {
            out = &mut task => break out.unwrap(),
            _ = tokio::task::yield_now() => {}
        }
    };
    assert!(outcome.input_accepted);
    let f = failure(&outcome);
    assert_eq!(f.category, FailureCategory::StreamDisconnected);
    assert!(f.message.as_deref().unwrap().contains("idle timeout"));
}

#[tokio::test]
async fn a_claude_error_event_mid_stream_is_classified_by_its_code() {
    let mut events = claude_success(&["partial"]);
    events.truncate(3);
    events.push(sse(
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![],
        events,
        end: End::Stall, // the driver stops at the error event; it does not wait for the end
    }])
    .await;
    let outcome = run(&upstream, Provider::Claude).await;
    let f = failure(&outcome);
    assert_eq!(
        (f.category, f.provider_code.as_deref()),
        (FailureCategory::Overloaded, Some("overloaded_error"))
    );
    assert!(outcome.input_accepted);
}

#[tokio::test]
async fn a_codex_response_failed_event_is_classified_by_its_code() {
    let mut events = codex_success(&[]);
    events.pop();
    events.push(sse(
        "response.failed",
        json!({"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded", "message": "limit"}}}),
    ));
    let upstream = Upstream::start(vec![Script::Stream {
        headers: vec![],
        events,
        end: End::Finish,
    }])
    .await;
    let outcome = run(&upstream, Provider::Codex).await;
    assert_eq!(failure(&outcome).category, FailureCategory::RateLimit);
}

#[tokio::test]
async fn a_route_token_echoed_by_the_provider_is_redacted_from_the_message() {
    let upstream = Upstream::start(vec![Script::Respond {
        status: 401,
        headers: vec![],
        body: json!({"error": {"message": "Incorrect API key provided: route-token-abc123", "code": "invalid_api_key"}})
            .to_string(),
    }])
    .await;
    let outcome = run(&upstream, Provider::Codex).await;
    let f = failure(&outcome);
    assert_eq!(f.category, FailureCategory::Unauthorized);
    assert_eq!(
        f.message.as_deref(),
        Some("Incorrect API key provided: [redacted]")
    );
}

/// End to end through the core: the outcome is recorded, the thread moves, the event waits
/// in the outbox, and the next turn replays the accepted exchange.
#[tokio::test]
async fn run_and_record_stores_the_outcome_and_the_event() {
    let upstream = Upstream::start(vec![
        Script::Stream {
            headers: vec![],
            events: claude_success(&["first reply"]),
            end: End::Finish,
        },
        Script::Respond {
            status: 503,
            headers: vec![
                ("retry-after", "30".into()),
                ("anthropic-ratelimit-unified-status", "rejected".into()),
            ],
            body:
                json!({"type": "error", "error": {"type": "api_error", "message": "unavailable"}})
                    .to_string(),
        },
    ])
    .await;
    let f = Fixture::new();
    f.core.register_subscriber("provider-retry").unwrap();
    let driver = TurnDriver::new(f.clock.clone() as SharedClock, DriverConfig::default());
    let thread = f
        .core
        .new_thread(Provider::Claude, Some("model-x"), Some(upstream.route()))
        .unwrap();

    f.core.send(&thread, "first").unwrap();
    let first = f.core.start_turns().unwrap().remove(0);
    let route = first.route.clone().unwrap();
    // The host spawns this on its runtime: the future must be Send.
    spawnable(run_and_record(&f.core, &driver, &first, &route))
        .await
        .unwrap();
    assert_eq!(
        f.core.get_thread(&thread).unwrap().status,
        ThreadStatus::Idle
    );

    f.core.send(&thread, "second").unwrap();
    let second = f.core.start_turns().unwrap().remove(0);
    assert_eq!(
        second.history,
        vec![Exchange {
            user: "first".into(),
            assistant: "first reply".into()
        }]
    );
    run_and_record(&f.core, &driver, &second, &route)
        .await
        .unwrap();

    let show = f.core.show(&thread).unwrap();
    assert_eq!(show.thread.info.status, ThreadStatus::Error);
    assert_eq!(show.turns[0].reply.as_deref(), Some("first reply"));
    assert_eq!(show.turns[1].outcome, Some(TurnOutcomeKind::Failed));
    let received = upstream.received();
    assert_eq!(received[1].body["messages"].as_array().unwrap().len(), 3);

    let events = f.core.pending_events("provider-retry", 10).unwrap();
    assert_eq!(events.len(), 2);
    let PluginEvent::TurnFailed(failed) = &events[1].event else {
        panic!("expected turn-failed");
    };
    assert_eq!(failed.failed_request, second.request);
    assert!(failed.routed_by_pool);
    let failure = failed.failure.as_ref().unwrap();
    assert_eq!(
        (failure.category, failure.http_status),
        (FailureCategory::Internal, Some(503))
    );
    assert_eq!(failure.retry_after, Some(T0 + 30_000));
    assert_eq!(
        failed.rate_limits.as_ref().unwrap().status,
        LimitStatus::Blocked
    );
}

#[tokio::test]
async fn scripted_responses_are_served_in_order_across_requests() {
    // Guards the fake itself, and the driver's reuse of its client between turns.
    let upstream = Upstream::start(vec![
        Script::Respond {
            status: 500,
            headers: vec![],
            body: String::new(),
        },
        Script::Respond {
            status: 529,
            headers: vec![],
            body: String::new(),
        },
    ])
    .await;
    let a = run(&upstream, Provider::Claude).await;
    let b = run(&upstream, Provider::Claude).await;
    assert_eq!(failure(&a).category, FailureCategory::Internal);
    assert_eq!(failure(&b).category, FailureCategory::Overloaded);
}
