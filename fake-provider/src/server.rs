//! A scripted fake upstream: a real HTTP/1.1 server on 127.0.0.1 that answers each request
//! with the next scripted [`Reply`] (or the default one), and records every request. Replies
//! can carry any status and headers, stream their body in chunks (SSE events included) with
//! pauses the test releases through a [`Gate`], and drop the connection before answering or
//! in the middle of the body.
//!
//! ```no_run
//! # async fn demo() {
//! use pooler_fake_provider::server::{FakeUpstream, Gate, Reply};
//! let upstream = FakeUpstream::start().await;
//! let gate = Gate::new();
//! upstream.push(Reply::status(429).header("retry-after", "30").body("slow down"));
//! upstream.push(Reply::sse().event("message_start", "{}").pause(&gate).event("message_stop", "{}"));
//! upstream.push(Reply::drop_connection());
//! // ... drive requests; later: gate.open();
//! # }
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::contract::Contract;

/// A pause point the test opens when it wants the stream to go on.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn new() -> Self {
        Gate(Arc::new(watch::Sender::new(false)))
    }
    /// Let every stream waiting on this gate continue.
    pub fn open(&self) {
        self.0.send_replace(true);
    }
    async fn passed(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

/// One step of a response body.
#[derive(Clone)]
pub enum Step {
    Chunk(Bytes),
    /// Wait until the gate opens.
    Pause(Gate),
    /// Break the connection here (the client sees a truncated body).
    Disconnect,
    /// Wait this long on tokio's clock: real time in the tests, virtual time under a paused
    /// runtime (the week simulator's streams take their time without anyone waiting).
    Delay(std::time::Duration),
}

/// A scripted response.
#[derive(Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    steps: Vec<Step>,
    /// Close the connection without any response.
    drop_before_head: bool,
    /// Send nothing (not even the head) until this gate opens.
    head_gate: Option<Gate>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            steps: Vec::new(),
            drop_before_head: false,
            head_gate: None,
        }
    }

    /// A 200 `text/event-stream` response; add events with [`Reply::event`].
    pub fn sse() -> Self {
        Reply::status(200).header("content-type", "text/event-stream")
    }

    /// Close the connection without answering.
    pub fn drop_connection() -> Self {
        Reply {
            drop_before_head: true,
            ..Reply::status(0)
        }
    }

    /// Answer nothing, not even the status line, until `gate` opens (the request stays in
    /// flight, waiting for its response head).
    pub fn hold_head(mut self, gate: &Gate) -> Self {
        self.head_gate = Some(gate.clone());
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Append a body chunk.
    pub fn body(mut self, chunk: impl Into<Bytes>) -> Self {
        self.steps.push(Step::Chunk(chunk.into()));
        self
    }

    /// Append one SSE event (`event:` and `data:` lines and a blank line), as its own chunk.
    pub fn event(self, event: &str, data: &str) -> Self {
        self.body(format!("event: {event}\ndata: {data}\n\n"))
    }

    /// Stop streaming until `gate` opens.
    pub fn pause(mut self, gate: &Gate) -> Self {
        self.steps.push(Step::Pause(gate.clone()));
        self
    }

    /// Wait `by` on tokio's clock before the next step of the body.
    pub fn delay(mut self, by: std::time::Duration) -> Self {
        self.steps.push(Step::Delay(by));
        self
    }

    /// Break the connection at this point of the body.
    pub fn disconnect(mut self) -> Self {
        self.steps.push(Step::Disconnect);
        self
    }

    /// The status this reply answers with (0 for a dropped connection).
    pub fn status_code(&self) -> u16 {
        self.status
    }

    /// The headers this reply sends.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The whole body this reply sends (its chunks, without pauses or breaks).
    pub fn body_bytes(&self) -> Vec<u8> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::Chunk(bytes) => Some(bytes.as_ref()),
                _ => None,
            })
            .flatten()
            .copied()
            .collect()
    }

    /// The reply as HTTP/1.1 bytes with `connection: close`, for fakes that write to a
    /// socket themselves.
    pub fn to_http1(&self) -> Vec<u8> {
        let body = self.body_bytes();
        let mut head = format!("HTTP/1.1 {} \r\n", self.status);
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ));
        let mut out = head.into_bytes();
        out.extend_from_slice(&body);
        out
    }
}

/// A request the upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Decides the answer to a request before the script does (a fault injector, say): `Some`
/// answers with that reply, `None` leaves the request to the script.
pub type Responder = Arc<dyn Fn(&Received) -> Option<Reply> + Send + Sync>;

struct State {
    /// The service whose rules a strict fake enforces before it answers from the script.
    contract: Option<Contract>,
    /// The refusals the rules gave: (path, status), in order.
    refused: Mutex<Vec<(String, u16)>>,
    script: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Responder>>,
    default: Reply,
    received: Mutex<Vec<Received>>,
    /// Whether requests are kept (benchmarks turn it off).
    recording: std::sync::atomic::AtomicBool,
    hits: watch::Sender<usize>,
}

/// The fake upstream server; it stops when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A streamed body fed by the script runner.
struct Streamed(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl Body for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx)
    }
}

impl FakeUpstream {
    /// Start on an ephemeral loopback port; unscripted requests get `200 ok`.
    pub async fn start() -> FakeUpstream {
        Self::start_with_default(
            Reply::status(200)
                .header("content-type", "text/plain")
                .body("ok"),
        )
        .await
    }

    /// Start with `default` as the answer to unscripted requests.
    pub async fn start_with_default(default: Reply) -> FakeUpstream {
        Self::launch(None, default).await
    }

    /// A strict fake of `contract`'s service: a request the real service would refuse gets
    /// that refusal ([`crate::contract`]) and leaves the script alone; the others are
    /// answered from the script, then with `200 ok`.
    pub async fn strict(contract: Contract) -> FakeUpstream {
        Self::launch(
            Some(contract),
            Reply::status(200)
                .header("content-type", "text/plain")
                .body("ok"),
        )
        .await
    }

    /// [`FakeUpstream::strict`] with `default` as the answer to unscripted requests.
    pub async fn strict_with_default(contract: Contract, default: Reply) -> FakeUpstream {
        Self::launch(Some(contract), default).await
    }

    async fn launch(contract: Option<Contract>, default: Reply) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake upstream");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            contract,
            refused: Mutex::new(Vec::new()),
            script: Mutex::new(VecDeque::new()),
            responder: Mutex::new(None),
            default,
            received: Mutex::new(Vec::new()),
            recording: std::sync::atomic::AtomicBool::new(true),
            hits: watch::Sender::new(0),
        });
        let served = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { answer(&state, req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeUpstream { addr, state, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queue the answer to the next unanswered request.
    pub fn push(&self, reply: Reply) {
        self.state.script.lock().unwrap().push_back(reply);
    }

    /// Answer every request the service's rules accept with `responder` first (`None`: the
    /// script alone, as at the start).
    pub fn set_responder(&self, responder: Option<Responder>) {
        *self.state.responder.lock().unwrap() = responder;
    }

    /// Keep (the default) or stop keeping the requests received.
    pub fn set_recording(&self, on: bool) {
        self.state
            .recording
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The refusals a strict fake gave by its rules, as (path, status), in order.
    pub fn refused(&self) -> Vec<(String, u16)> {
        self.state.refused.lock().unwrap().clone()
    }

    /// Wait until at least `n` requests have arrived.
    pub async fn wait_for_hits(&self, n: usize) {
        let mut rx = self.state.hits.subscribe();
        let _ = rx.wait_for(|hits| *hits >= n).await;
    }
}

async fn answer(
    state: &State,
    req: Request<Incoming>,
) -> Result<Response<Streamed>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let received = Received {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
    };
    let refusal = state
        .contract
        .and_then(|contract| crate::contract::refusal(contract, &received));
    if let Some(refusal) = &refusal {
        state
            .refused
            .lock()
            .unwrap()
            .push((received.path.clone(), refusal.status_code()));
    }
    let responder = state.responder.lock().unwrap().clone();
    let decided = refusal.or_else(|| responder.and_then(|respond| respond(&received)));
    if state.recording.load(std::sync::atomic::Ordering::Relaxed) {
        state.received.lock().unwrap().push(received);
    }
    let reply = decided.unwrap_or_else(|| {
        state
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| state.default.clone())
    });
    // Counted once its reply is taken: a test that waits for this hit and then scripts the
    // next reply must not race this request for the one it was given.
    state.hits.send_modify(|n| *n += 1);
    if let Some(gate) = &reply.head_gate {
        gate.passed().await;
    }
    if reply.drop_before_head {
        // An error from the service makes hyper close the connection without a response.
        return Err(std::io::Error::other("scripted: drop the connection"));
    }
    let (tx, rx) = mpsc::channel(16);
    let mut response = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        response = response.header(name, value);
    }
    let response = response.body(Streamed(rx)).map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        for step in reply.steps {
            match step {
                Step::Chunk(bytes) => {
                    if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                        return;
                    }
                }
                Step::Pause(gate) => gate.passed().await,
                Step::Delay(by) => tokio::time::sleep(by).await,
                Step::Disconnect => {
                    let _ = tx
                        .send(Err(std::io::Error::other("scripted: disconnect")))
                        .await;
                    return;
                }
            }
        }
    });
    Ok(response)
}
