//! The engine against a scripted upstream and a manual clock. This file is the harness
//! (the fake clock, random source, log, client and upstream, and a pool of accounts over
//! them); the tests are grouped by concern:
//!
//! | file | tests |
//! |---|---|
//! | [`scenarios`] | every AP scenario of the spec at the unit level |
//! | [`edges`] | the proxy's edges: forwarding, shapes, statuses, limits, settings, maintenance |
//! | [`storage`] | what a request reads and writes, and what the head screen answers |
//! | [`cancel`] | a client that goes away mid-request |
//! | [`admin`] | replacing a credential in place; listing routes and pinned sessions |
//! | [`faults`] | absurd upstream values, a stalled or lost token refresh, storage failing after a served answer |
//! | [`odd`] | odd upstream answers: 1xx, compressed bodies; what every upstream call asks for |
//! | [`redaction`] | an upstream that echoes the account's credential: kept and relayed without it |
//! | [`first_event`] | a served stream's head held for its first event: an opening failure retried or moved, the bounds |
//! | [`strategy`] | routing strategies, paced movers, last-resort accounts, in-flight limits, extra usage |

mod admin;
mod cancel;
mod edges;
mod faults;
mod first_event;
mod history;
mod observe;
mod odd;
mod redaction;
mod scenarios;
mod storage;
mod strategy;
mod tokens;

use super::*;
use crate::admin::{Admin, NewAccount};
use crate::model::{
    Availability, BlockCause, ChangeCause, Credential, OAuthTokens, UnavailableReason,
};
use crate::store::{FLIGHT_LEASE_MS, TOUCH_GRANULARITY_MS};
use futures::executor::block_on;
use pooler_plugin_kit::{DbError, NativeDb, Rows, Value};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

const T0: u64 = 1_700_000_000_000;

/// Yields to the executor `n` times.
struct Yield(u32);

impl Future for Yield {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// One log line: its message and fields.
type LogLine = (String, Vec<(String, String)>);

/// The manual clock, a counter-based random source, a log sink, and the client's leaving
/// (a flag the test raises, or has a sleep or an upstream call raise).
struct Env {
    now: Cell<u64>,
    sleeps: RefCell<Vec<u64>>,
    counter: Cell<u64>,
    logs: RefCell<Vec<String>>,
    /// The client of the request being served has gone ([`Pool::send`] lowers it).
    gone: std::rc::Rc<Cell<bool>>,
    /// The client leaves when the sleep with this number (1 = the first) begins.
    leave_at_sleep: Cell<Option<usize>>,
    /// Every log line with its fields, as given.
    lines: RefCell<Vec<LogLine>>,
    /// What was reported through the metrics port.
    metrics: pooler_plugin_kit::metrics::Recorded,
}

impl Env {
    fn new() -> Self {
        Env {
            now: Cell::new(T0),
            sleeps: RefCell::new(Vec::new()),
            counter: Cell::new(0),
            logs: RefCell::new(Vec::new()),
            gone: std::rc::Rc::new(Cell::new(false)),
            leave_at_sleep: Cell::new(None),
            lines: RefCell::default(),
            metrics: Default::default(),
        }
    }
    fn advance(&self, ms: u64) {
        self.now.set(self.now.get() + ms);
    }
    /// The client leaves during the `n`-th sleep from now (1 = the next one).
    fn leave_during_sleep(&self, n: usize) {
        self.leave_at_sleep
            .set(Some(self.sleeps.borrow().len() + n));
    }
}

impl Clock for Env {
    fn now(&self) -> u64 {
        self.now.get()
    }
    async fn sleep(&self, ms: u64) {
        self.advance(ms);
        self.sleeps.borrow_mut().push(ms);
        if self.leave_at_sleep.get() == Some(self.sleeps.borrow().len()) {
            self.gone.set(true);
        }
        Yield(1).await;
    }
}

impl Cancel for Env {
    fn gone(&self) -> bool {
        self.gone.get()
    }
    async fn gone_wait(&self) {
        std::future::poll_fn(|cx| {
            if self.gone.get() {
                Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await
    }
}

impl Random for Env {
    fn fill(&self, buf: &mut [u8]) {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (n.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8;
        }
    }
}

impl Log for Env {
    fn log(&self, _level: Level, message: &str, fields: &[(&str, String)]) {
        self.logs.borrow_mut().push(format!("{message} {fields:?}"));
        self.lines.borrow_mut().push((
            message.to_owned(),
            fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        ));
    }
}

impl pooler_plugin_kit::Metrics for Env {
    fn counter_add(&self, name: &str, labels: &[(&str, &str)], delta: u64) {
        self.metrics.counter_add(name, labels, delta);
    }
    fn observe(&self, name: &str, labels: &[(&str, &str)], seconds: f64) {
        self.metrics.observe(name, labels, seconds);
    }
}

impl Env {
    /// The fields of every per-request line ([`REQUEST_MESSAGE`]), in order.
    fn request_lines(&self) -> Vec<std::collections::BTreeMap<String, String>> {
        self.lines
            .borrow()
            .iter()
            .filter(|(m, _)| m == REQUEST_MESSAGE)
            .map(|(_, f)| f.iter().cloned().collect())
            .collect()
    }
}

/// A scripted upstream answer.
#[derive(Clone, Debug)]
enum Reply {
    Status(u16, Vec<(&'static str, String)>, String),
    Sse(Vec<&'static str>, bool),
    /// A 200 with these headers, its body in these chunks, broken after them when true.
    Chunks(Vec<(&'static str, String)>, Vec<&'static str>, bool),
    /// A status, headers, and a body in these chunks.
    Chunked(u16, Vec<(&'static str, String)>, Vec<String>),
    Drop,
}

fn ok() -> Reply {
    Reply::Status(
        200,
        vec![("content-type", "application/json".into())],
        r#"{"ok":true}"#.into(),
    )
}

fn status(code: u16) -> Reply {
    Reply::Status(
        code,
        vec![("content-type", "application/json".into())],
        format!(r#"{{"type":"error","error":{{"type":"x","message":"upstream {code}"}}}}"#),
    )
}

fn with_headers(code: u16, headers: &[(&'static str, String)]) -> Reply {
    Reply::Status(code, headers.to_vec(), "{}".into())
}

struct FakeBody {
    chunks: VecDeque<Result<Vec<u8>, String>>,
    pulled: std::rc::Rc<Cell<usize>>,
}

/// A chunk of a scripted body that is no chunk: the body keeps its reader waiting there
/// (for longer than a sleep takes), then goes on.
const STALL: &str = "\0stall";

impl BodyStream for FakeBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        // Taken only once waited out: a read dropped meanwhile leaves it, as a real body
        // leaves bytes that have not come yet.
        if matches!(self.chunks.front(), Some(Ok(c)) if c == STALL.as_bytes()) {
            Yield(5).await;
            self.chunks.pop_front();
        }
        let c = self.chunks.pop_front();
        if c.is_some() {
            self.pulled.set(self.pulled.get() + 1);
        }
        c
    }
}

/// The upstream: answers per credential (queued one-shot replies, then a default), and
/// records what it saw. The token endpoint's credential is `token-endpoint`; usage
/// endpoints are `usage`.
#[derive(Default)]
struct Fake {
    queued: RefCell<HashMap<String, VecDeque<Reply>>>,
    defaults: RefCell<HashMap<String, Reply>>,
    delays: RefCell<HashMap<String, u32>>,
    calls: RefCell<Vec<(String, UpstreamRequest)>>,
    pulled: std::rc::Rc<Cell<usize>>,
    /// The client's flag (the pool's [`Env::gone`]), and the call (1 = the first) during
    /// which the client leaves.
    gone: std::rc::Rc<Cell<bool>>,
    leave_at_call: Cell<Option<usize>>,
    /// Calls dropped before they answered.
    abandoned: std::rc::Rc<Cell<usize>>,
}

/// Counts a call as abandoned if it is dropped before it answers.
struct InFlight {
    abandoned: std::rc::Rc<Cell<usize>>,
    answered: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.answered {
            self.abandoned.set(self.abandoned.get() + 1);
        }
    }
}

impl Fake {
    fn set(&self, cred: &str, r: Reply) {
        self.defaults.borrow_mut().insert(cred.into(), r);
    }
    fn clear(&self, cred: &str) {
        self.defaults.borrow_mut().remove(cred);
    }
    /// The client leaves while the `n`-th call from now (1 = the next one) is in flight.
    fn leave_during_call(&self, n: usize) {
        self.leave_at_call.set(Some(self.calls.borrow().len() + n));
    }
    fn push(&self, cred: &str, r: Reply) {
        self.queued
            .borrow_mut()
            .entry(cred.into())
            .or_default()
            .push_back(r);
    }
    /// Credentials of the proxied calls since the last look (token and usage calls apart).
    fn seen(&self) -> Vec<String> {
        let proxied = |c: &str| c != "token-endpoint" && c != "usage";
        let mut calls = self.calls.borrow_mut();
        let seen = calls
            .iter()
            .map(|(c, _)| c.clone())
            .filter(|c| proxied(c))
            .collect();
        calls.retain(|(c, _)| !proxied(c));
        seen
    }
    fn count(&self, cred: &str) -> usize {
        self.calls
            .borrow()
            .iter()
            .filter(|(c, _)| c == cred)
            .count()
    }
    fn calls_to(&self, cred: &str) -> Vec<UpstreamRequest> {
        self.calls
            .borrow()
            .iter()
            .filter(|(c, _)| c == cred)
            .map(|(_, r)| r.clone())
            .collect()
    }
    fn last(&self) -> UpstreamRequest {
        self.calls
            .borrow()
            .last()
            .map(|(_, r)| r.clone())
            .expect("a call")
    }
}

fn credential_of(req: &UpstreamRequest) -> String {
    if req.url.contains("/oauth/token") {
        return "token-endpoint".into();
    }
    if req.url.contains("/usage") {
        return "usage".into();
    }
    req.headers
        .get("x-api-key")
        .map(str::to_owned)
        .or_else(|| {
            req.headers
                .get("authorization")
                .map(|a| a.trim_start_matches("Bearer ").to_owned())
        })
        .unwrap_or_default()
}

impl Upstream for Fake {
    type Body = FakeBody;
    async fn send(
        &self,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse<FakeBody>, TransportError> {
        let cred = credential_of(&req);
        self.calls.borrow_mut().push((cred.clone(), req));
        let mut in_flight = InFlight {
            abandoned: self.abandoned.clone(),
            answered: false,
        };
        if self.leave_at_call.get() == Some(self.calls.borrow().len()) {
            self.gone.set(true);
        }
        let delay = self.delays.borrow().get(&cred).copied().unwrap_or(0);
        Yield(delay).await;
        in_flight.answered = true;
        let queued = self
            .queued
            .borrow_mut()
            .get_mut(&cred)
            .and_then(VecDeque::pop_front);
        let reply = queued
            .or_else(|| self.defaults.borrow().get(&cred).cloned())
            .unwrap_or_else(ok);
        let body = |chunks: VecDeque<Result<Vec<u8>, String>>| FakeBody {
            chunks,
            pulled: self.pulled.clone(),
        };
        match reply {
            Reply::Drop => Err(TransportError("ECONNRESET".into())),
            Reply::Status(code, headers, text) => {
                let mut h = Headers::new();
                for (n, v) in headers {
                    h.push(n, v);
                }
                Ok(UpstreamResponse {
                    status: code,
                    headers: h,
                    body: body(VecDeque::from([Ok(text.into_bytes())])),
                })
            }
            Reply::Chunks(headers, chunks, broken) => {
                let mut h = Headers::new();
                for (n, v) in headers {
                    h.push(n, v);
                }
                let mut q: VecDeque<_> = chunks
                    .into_iter()
                    .map(|c| Ok(c.as_bytes().to_vec()))
                    .collect();
                if broken {
                    q.push_back(Err("connection reset by peer".into()));
                }
                Ok(UpstreamResponse {
                    status: 200,
                    headers: h,
                    body: body(q),
                })
            }
            Reply::Chunked(code, headers, chunks) => {
                let mut h = Headers::new();
                for (n, v) in headers {
                    h.push(n, v);
                }
                Ok(UpstreamResponse {
                    status: code,
                    headers: h,
                    body: body(chunks.into_iter().map(|c| Ok(c.into_bytes())).collect()),
                })
            }
            Reply::Sse(chunks, broken) => {
                let mut q: VecDeque<_> = chunks
                    .into_iter()
                    .map(|c| Ok(c.as_bytes().to_vec()))
                    .collect();
                if broken {
                    q.push_back(Err("connection reset by peer".into()));
                }
                Ok(UpstreamResponse {
                    status: 200,
                    headers: Headers::from([("content-type", "text/event-stream")]),
                    body: body(q),
                })
            }
        }
    }
}

/// A collected response.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Headers,
    body: String,
    /// The in-flight lease it carried (ended once collected, as the glue ends it).
    lease: Option<String>,
}

impl Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

async fn collect(r: Response<FakeBody>) -> Resp {
    collect_then(r, |_| {}).await
}

/// Collect a response, handing its relay, once ended, to `ended` (as the glue records the
/// answer's tokens then).
async fn collect_then(
    r: Response<FakeBody>,
    ended: impl FnOnce(&mut crate::stream::Relay<FakeBody>),
) -> Resp {
    let body = match r.body {
        Body::Full(b) => b,
        Body::Stream(mut relay) => {
            let mut out = Vec::new();
            while let Some(c) = relay.next().await {
                match c {
                    Ok(c) => out.extend(c),
                    Err(e) => out.extend(format!("<error {e}>").bytes()),
                }
            }
            ended(&mut relay);
            out
        }
    };
    Resp {
        status: r.status,
        headers: r.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        lease: r.lease,
    }
}

/// The pool under test: one database, the fake upstream, the manual clock, a route for
/// thread `t1` per provider, and accounts named by label.
struct Pool {
    db: NativeDb,
    up: Fake,
    env: Env,
    claude_token: String,
    codex_token: String,
    ids: RefCell<HashMap<String, String>>,
}

impl Pool {
    fn new() -> Self {
        Self::on(NativeDb::memory())
    }

    /// A pool on `db` that follows the cursor (fill-first): the scenarios of the spec's
    /// routing order are written against it; the strategy tests choose their own.
    fn on(db: NativeDb) -> Self {
        let p = Self::unconfigured(db);
        for key in ["claude-strategy", "codex-strategy"] {
            p.admin().set_setting(key, "fill-first").unwrap();
        }
        p
    }

    /// A pool on `db` with every setting at its default.
    fn unconfigured(db: NativeDb) -> Self {
        let env = Env::new();
        let up = Fake {
            gone: env.gone.clone(),
            ..Fake::default()
        };
        let (claude_token, codex_token) = {
            let admin = Admin::new(&db, &up, &env).unwrap();
            let c = admin
                .open_route("t1", Provider::Claude, "http://127.0.0.1:8787")
                .unwrap()
                .token;
            let x = admin
                .open_route("t1", Provider::Codex, "http://127.0.0.1:8787")
                .unwrap()
                .token;
            (c, x)
        };
        Pool {
            db,
            up,
            env,
            claude_token,
            codex_token,
            ids: RefCell::new(HashMap::new()),
        }
    }

    /// Pools with accounts `a`, `b`, `c` (API keys `a`, `b`, `c`).
    fn abc() -> Self {
        let p = Pool::new();
        for l in ["a", "b", "c"] {
            p.add_key(l);
        }
        p
    }

    fn admin(&self) -> Admin<'_, NativeDb, Fake, Env> {
        Admin::new(&self.db, &self.up, &self.env).unwrap()
    }

    fn store(&self) -> Store<'_, NativeDb> {
        Store::new(&self.db)
    }

    fn add_key(&self, label: &str) -> String {
        let info = self
            .admin()
            .add(NewAccount {
                provider: Provider::Claude,
                credential: Credential::ApiKey(label.into()),
                label: Some(label.into()),
                priority: None,
                options: None,
            })
            .unwrap();
        self.ids.borrow_mut().insert(label.into(), info.id.clone());
        info.id
    }

    fn add_oauth(
        &self,
        provider: Provider,
        label: &str,
        access: &str,
        expires_at: Option<u64>,
    ) -> String {
        let info = self
            .admin()
            .add(NewAccount {
                provider,
                credential: Credential::OAuth(OAuthTokens {
                    access_token: access.into(),
                    refresh_token: format!("rt-{label}"),
                    expires_at,
                    chatgpt_account_id: (provider == Provider::Codex)
                        .then(|| format!("acct-{label}")),
                }),
                label: Some(label.into()),
                priority: None,
                options: None,
            })
            .unwrap();
        self.ids.borrow_mut().insert(label.into(), info.id.clone());
        info.id
    }

    fn id(&self, label: &str) -> String {
        self.ids.borrow()[label].clone()
    }

    fn label_of(&self, id: &str) -> String {
        self.ids
            .borrow()
            .iter()
            .find(|(_, v)| *v == id)
            .map(|(k, _)| k.clone())
            .unwrap_or_default()
    }

    fn claude_req(&self, session: Option<&str>, model: &str) -> IncomingRequest {
        let mut body = json!({"model": model, "max_tokens": 16, "messages": []});
        if let Some(s) = session {
            body["metadata"] =
                json!({"user_id": json!({"device_id": "d", "session_id": s}).to_string()});
        }
        IncomingRequest {
            method: "POST".into(),
            path: "/v1/messages".into(),
            query: Some("beta=true".into()),
            headers: Headers::from([
                (
                    "authorization",
                    format!("Bearer {}", self.claude_token).as_str(),
                ),
                ("content-type", "application/json"),
                ("anthropic-version", "2023-06-01"),
            ]),
            body: body.to_string().into_bytes().into(),
            body_refused: None,
        }
    }

    /// Serve one request (whose client is there when it starts).
    fn send(&self, req: IncomingRequest) -> Resp {
        self.env.gone.set(false);
        let resp = block_on(async {
            collect_then(
                Engine::new(&self.db, &self.up, &self.env).handle(req).await,
                |relay| crate::engine::record_tokens(&self.db, &self.env, relay),
            )
            .await
        });
        if let Some(lease) = &resp.lease {
            end_flight(&self.db, lease).unwrap();
        }
        resp
    }

    fn claude(&self, session: Option<&str>) -> Resp {
        self.send(self.claude_req(session, "claude-sonnet-4-5"))
    }

    fn pinned(&self, provider: Provider, session: &str) -> Option<String> {
        self.admin()
            .explain_session(provider, session)
            .unwrap()
            .account
            .map(|id| self.label_of(&id))
    }

    fn cursor(&self) -> Option<String> {
        self.store()
            .cursor(Provider::Claude)
            .unwrap()
            .map(|id| self.label_of(&id))
    }

    fn status_of(&self, label: &str) -> crate::model::AccountStatus {
        self.admin()
            .list(None)
            .unwrap()
            .into_iter()
            .find(|a| a.id == self.id(label))
            .unwrap()
            .status
    }
}
