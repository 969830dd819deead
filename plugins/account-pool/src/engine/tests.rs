//! The engine against a scripted upstream and a manual clock: every AP scenario of the
//! spec at the unit level, plus the proxy's edges (paths, shapes, limits, streaming).

use super::*;
use crate::admin::{Admin, NewAccount};
use crate::model::{
    Availability, BlockCause, ChangeCause, Credential, OAuthTokens, UnavailableReason,
};
use crate::store::TOUCH_GRANULARITY_MS;
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
    }
}

/// A scripted upstream answer.
#[derive(Clone, Debug)]
enum Reply {
    Status(u16, Vec<(&'static str, String)>, String),
    Sse(Vec<&'static str>, bool),
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

impl BodyStream for FakeBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
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
}

impl Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

async fn collect(r: Response<FakeBody>) -> Resp {
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
            out
        }
    };
    Resp {
        status: r.status,
        headers: r.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
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

    fn on(db: NativeDb) -> Self {
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
            body_truncated: false,
        }
    }

    /// Serve one request (whose client is there when it starts).
    fn send(&self, req: IncomingRequest) -> Resp {
        self.env.gone.set(false);
        block_on(async {
            collect(Engine::new(&self.db, &self.up, &self.env).handle(req).await).await
        })
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

fn quota_reject(window: &str, reset_ms: u64) -> Reply {
    let prefix = "anthropic-ratelimit-unified-";
    Reply::Status(
        429,
        vec![
            (
                Box::leak(format!("{prefix}{window}-status").into_boxed_str()),
                "rejected".into(),
            ),
            (
                Box::leak(format!("{prefix}{window}-reset").into_boxed_str()),
                (reset_ms / 1000).to_string(),
            ),
        ],
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"limit"}}"#.into(),
    )
}

/// AP-1: a session stays on its account while that account is eligible.
#[test]
fn ap1_session_sticks_to_its_account() {
    let p = Pool::abc();
    for _ in 0..3 {
        assert_eq!(p.claude(Some("S")).status, 200);
    }
    assert_eq!(p.up.seen(), ["a", "a", "a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// AP-2 (#6990): for each transient failure, the pinned account is retried with backoff,
/// another serves as a detour, and the next request goes home to the pinned account.
#[test]
fn ap2_pinned_session_returns_home_after_each_transient_failure() {
    let failures = [
        status(408),
        status(500),
        status(502),
        status(503),
        status(504),
        status(529),
        Reply::Drop,
    ];
    for failure in failures {
        let p = Pool::abc();
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a"]);
        p.up.set("a", failure.clone());
        assert_eq!(p.claude(Some("S")).status, 200, "{failure:?}");
        assert_eq!(
            p.up.seen(),
            ["a", "a", "a", "b"],
            "{failure:?}: retried twice, then a detour"
        );
        assert_eq!(
            *p.env.sleeps.borrow(),
            [250, 1_000],
            "{failure:?}: backoff 250 ms then 1 s"
        );
        p.up.clear("a");
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a"], "{failure:?}: home first and only");
        assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
        assert_eq!(
            p.cursor().as_deref(),
            Some("a"),
            "{failure:?}: the cursor did not move"
        );
    }
}

/// AP-3: a longer outage detours every request (each trying the pin first) and returns
/// on the first request after recovery.
#[test]
fn ap3_outage_longer_than_retries_detours_each_request() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.set("a", status(503));
    for _ in 0..3 {
        assert_eq!(p.claude(Some("S")).status, 200);
        assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
    }
    p.up.clear("a");
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
    let recent = p
        .admin()
        .explain_session(Provider::Claude, "S")
        .unwrap()
        .recent;
    assert!(recent.iter().any(|r| r.outcome == "detour"));
    assert!(
        recent
            .iter()
            .any(|r| r.outcome == "transient" && r.status == Some(503))
    );
}

/// AP-4: an API key refused with 401 is a lasting reason: the session re-pins and stays
/// on the new account after the old one is re-enabled.
#[test]
fn ap4_auth_refusal_re_pins_for_good() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.set("a", status(401));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Error);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("b"));
    p.up.clear("a");
    p.admin().enable(&p.id("a")).unwrap();
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["b"]);
    let why = p
        .admin()
        .explain_session(Provider::Claude, "S")
        .unwrap()
        .why;
    assert!(why.contains("re-pinned") && why.contains("auth"), "{why}");
}

/// AP-5: a shared quota refusal moves the session and the cursor; after the reset the
/// cursor stays on the new account and so does the session.
#[test]
fn ap5_shared_quota_exhaustion_moves_session_and_cursor() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.push("a", quota_reject("5h", T0 + 60_000));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Exhausted);
    p.claude(Some("N1"));
    assert_eq!(p.up.seen(), ["b"], "new sessions go to the cursor, now b");
    p.env.advance(61_000);
    p.claude(Some("N2"));
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["b", "b"]);
    assert_eq!(p.cursor().as_deref(), Some("b"));
}

/// AP-6: a family limit detours only that family's requests; the pin stays.
#[test]
fn ap6_family_limit_is_a_detour() {
    let p = Pool::abc();
    p.send(p.claude_req(Some("S"), "claude-opus-4-1"));
    p.up.seen();
    p.up.push("a", quota_reject("7d_opus", T0 + 3_600_000));
    assert_eq!(
        p.send(p.claude_req(Some("S"), "claude-opus-4-1")).status,
        200
    );
    assert_eq!(p.up.seen(), ["a", "b"]);
    p.send(p.claude_req(Some("S"), "claude-opus-4-1"));
    assert_eq!(p.up.seen(), ["b"], "the opus window is known to be refused");
    p.send(p.claude_req(Some("S"), "claude-sonnet-4-5"));
    assert_eq!(p.up.seen(), ["a"], "other families stay home");
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(
        p.status_of("a"),
        crate::model::AccountStatus::Ready,
        "a family limit does not change status"
    );
}

/// AP-7: a short 429 is waited out once and the same account retried.
#[test]
fn ap7_short_429_waits_once_and_retries() {
    let p = Pool::abc();
    p.up.push("a", with_headers(429, &[("retry-after", "5".into())]));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a"]);
    assert_eq!(*p.env.sleeps.borrow(), [5_000]);
}

/// AP-8: a long 429 on the pinned account: another serves as a detour; after the hold the
/// session is home.
#[test]
fn ap8_long_429_detours_then_returns_after_the_hold() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    p.up.push("a", with_headers(429, &[("retry-after", "60".into())]));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["b"], "held: no call to a");
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Held);
    p.env.advance(60_000);
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// AP-9: every account failing transiently: the client gets the last failure (503), and
/// pin and cursor stay.
#[test]
fn ap9_all_accounts_failing_commits_nothing() {
    let p = Pool::abc();
    p.claude(Some("S"));
    p.up.seen();
    for l in ["a", "b", "c"] {
        p.up.set(l, status(503));
    }
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["message"], "upstream 503");
    assert_eq!(
        r.headers.get("x-pooler-origin"),
        None,
        "an upstream failure, re-shaped"
    );
    assert_eq!(p.up.seen(), ["a", "a", "a", "b", "b", "b", "c", "c", "c"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    for l in ["a", "b", "c"] {
        p.up.clear(l);
    }
    p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a"]);
}

/// AP-10: everything exhausted: the pool's 429 with Retry-After to the earliest reset,
/// no upstream call on a repeat, availability blocked at the same time; after A's reset,
/// A serves.
#[test]
fn ap10_everything_exhausted_gives_the_pools_429() {
    let p = Pool::new();
    p.add_key("a");
    p.add_key("b");
    p.up.push("a", quota_reject("5h", T0 + 60_000));
    p.up.push("b", quota_reject("7d", T0 + 120_000));
    let r = p.claude(Some("S"));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(r.status, 429);
    assert_eq!(r.headers.get("retry-after"), Some("60"));
    assert_eq!(r.headers.get("x-pooler-origin"), Some("pool"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let again = p.claude(Some("S"));
    assert_eq!(
        (again.status, again.headers.get("retry-after")),
        (429, Some("60"))
    );
    assert!(p.up.seen().is_empty(), "no upstream call on a repeat");
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Blocked {
            retry_at: T0 + 60_000,
            cause: BlockCause::QuotaExhausted
        }
    );
    p.env.advance(60_000);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
}

/// AP-11 (#6169): accounts at 99 % still serve; a new session prefers one under the
/// threshold.
#[test]
fn ap11_threshold_is_a_preference() {
    let p = Pool::new();
    p.add_key("a");
    p.add_key("b");
    let near = |u: &str| {
        with_headers(
            200,
            &[
                ("anthropic-ratelimit-unified-5h-utilization", u.into()),
                ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
            ],
        )
    };
    p.up.set("a", near("0.99"));
    p.up.set("b", near("0.99"));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.claude(Some("T")).status, 200);
    assert_eq!(p.claude(None).status, 200);
    // S lands on the cursor a, which turns reserve; T prefers b, which turns reserve too;
    // with nothing preferred left, a new request takes the reserve cursor a.
    assert_eq!(p.up.seen(), ["a", "b", "a"]);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::NearLimit);
    assert_eq!(
        p.claude(Some("S")).status,
        200,
        "a pinned session stays on its reserve account"
    );
    assert_eq!(p.up.seen(), ["a"]);
    p.up.set("b", near("0.5"));
    p.claude(Some("T"));
    p.claude(Some("U"));
    p.claude(Some("V"));
    assert_eq!(
        p.up.seen(),
        ["b", "b", "b"],
        "T's answer showed b under the threshold: new sessions prefer it"
    );
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Ready
    );
}

/// AP-12 (#6167): a refused proactive refresh keeps a valid token serving with the flag;
/// after expiry with refresh still refused, the account is in error.
#[test]
fn ap12_refused_proactive_refresh_keeps_a_valid_token() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 10 * 60_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(400, vec![], r#"{"error":"invalid_grant"}"#.into()),
    );
    p.env.advance(6 * 60_000);
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["at-1"]);
    assert_eq!(p.up.count("token-endpoint"), 1);
    let info = p.admin().list(None).unwrap().remove(0);
    assert!(info.needs_sign_in && info.error.is_none());
    assert_eq!(info.status, crate::model::AccountStatus::Ready);
    assert_eq!(
        p.admin()
            .availability("t1", Provider::Claude, None)
            .unwrap(),
        Availability::Ready
    );
    p.env.advance(5 * 60_000);
    let r = p.claude(Some("S"));
    assert_ne!(r.status, 200);
    assert_eq!(p.status_of("o"), crate::model::AccountStatus::Error);
    assert!(p.up.seen().is_empty(), "an expired token is never sent");
}

fn file_db(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("pool-{name}-{}.sqlite3", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// AP-13: a 401 on an OAuth token: one refresh, a retry with the new token, 200; two
/// concurrent requests (two instances on one database) share one refresh.
#[test]
fn ap13_oauth_401_refreshes_once_for_concurrent_requests() {
    let path = file_db("ap13");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    p.add_oauth(Provider::Claude, "o", "old", Some(T0 + 3_600_000));
    p.up.set("old", status(401));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"new","expires_in":3600}"#.into(),
        ),
    );
    p.up.delays.borrow_mut().insert("token-endpoint".into(), 3);
    let second = NativeDb::open(&path).unwrap();
    let (r1, r2) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S1"), "claude-sonnet"))
                        .await,
                )
                .await
            },
            async {
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S2"), "claude-sonnet"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((r1.status, r2.status), (200, 200));
    assert_eq!(p.up.count("token-endpoint"), 1, "one refresh in flight");
    let seen = p.up.seen();
    assert_eq!(seen.iter().filter(|c| *c == "new").count(), 2);
    assert!(seen.iter().all(|c| c == "old" || c == "new"));
    let _ = std::fs::remove_file(&path);
}

/// AP-14: an SSE response is relayed chunk by chunk; a break after the first chunk gives
/// an SSE error event and no second attempt.
#[test]
fn ap14_sse_streams_through_and_a_break_becomes_an_error_event() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Sse(
            vec![
                "event: message_start\ndata: {}\n\n",
                "event: ping\ndata: {}\n\n",
            ],
            true,
        ),
    );
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet"))
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers.get("content-type"), Some("text/event-stream"));
        let Body::Stream(mut relay) = r.body else {
            panic!("a stream")
        };
        let first = relay.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"event: message_start"));
        assert_eq!(
            p.up.pulled.get(),
            1,
            "the first chunk reached the client before the rest was read"
        );
        let second = relay.next().await.unwrap().unwrap();
        assert!(second.starts_with(b"event: ping"));
        let error = String::from_utf8(relay.next().await.unwrap().unwrap()).unwrap();
        assert!(
            error.starts_with("event: error\n") && error.contains("api_error"),
            "{error}"
        );
        assert!(relay.next().await.is_none());
    });
    assert_eq!(p.up.seen(), ["a"], "no second attempt");
}

/// AP-15: missing, wrong or closed tokens get 401 without an upstream call; tokens of two
/// threads are independent.
#[test]
fn ap15_route_tokens_guard_the_pool() {
    let p = Pool::abc();
    let mut missing = p.claude_req(Some("S"), "m");
    missing.headers = Headers::from([("content-type", "application/json")]);
    let mut wrong = p.claude_req(Some("S"), "m");
    wrong.headers.set("authorization", "Bearer not-a-token");
    let mut codex_token_on_claude = p.claude_req(Some("S"), "m");
    codex_token_on_claude
        .headers
        .set("authorization", format!("Bearer {}", p.codex_token));
    for req in [missing, wrong, codex_token_on_claude] {
        let r = p.send(req);
        assert_eq!(r.status, 401);
        assert_eq!(r.json()["error"]["type"], "authentication_error");
        assert_eq!(r.headers.get("x-pooler-origin"), Some("pool"));
    }
    let t2 = p
        .admin()
        .open_route("t2", Provider::Claude, "http://127.0.0.1:8787")
        .unwrap()
        .token;
    p.admin().close_route("t1", Provider::Claude).unwrap();
    assert_eq!(
        p.claude(Some("S")).status,
        401,
        "a closed route's token stops at once"
    );
    let mut via_t2 = p.claude_req(Some("S"), "m");
    via_t2.headers.set("x-api-key", t2);
    via_t2.headers = Headers::from([("x-api-key", via_t2.headers.get("x-api-key").unwrap())]);
    assert_eq!(p.send(via_t2).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(
        p.admin().close_route("t1", Provider::Claude),
        Err(crate::admin::RoutingError::NoSuchRoute)
    );
}

/// AP-16: a child session starts on its parent's account; its own later failover does not
/// move the parent (nor extend the parent's pin).
#[test]
fn ap16_child_inherits_parent_account() {
    let p = Pool::abc();
    p.admin().disable(&p.id("a")).unwrap();
    p.claude(Some("P"));
    p.admin().enable(&p.id("a")).unwrap();
    p.store()
        .cas_cursor(Provider::Claude, Some(&p.id("b")), &p.id("a"))
        .unwrap();
    p.up.seen();
    let parent_used = p
        .admin()
        .explain_session(Provider::Claude, "P")
        .unwrap()
        .last_used_at;
    let child = |p: &Pool| {
        let mut req = p.claude_req(None, "claude-sonnet");
        let mut body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
        body["metadata"] =
            json!({"user_id": json!({"session_id": "C", "parent_session_id": "P"}).to_string()});
        req.body = body.to_string().into_bytes().into();
        p.send(req)
    };
    p.env.advance(1_000);
    assert_eq!(child(&p).status, 200);
    assert_eq!(p.up.seen(), ["b"], "inherited, not the cursor a");
    assert_eq!(p.pinned(Provider::Claude, "C").as_deref(), Some("b"));
    p.up.set("b", status(503));
    child(&p);
    assert_eq!(p.up.seen(), ["b", "b", "b", "c"]);
    assert_eq!(p.pinned(Provider::Claude, "P").as_deref(), Some("b"));
    assert_eq!(
        p.admin()
            .explain_session(Provider::Claude, "P")
            .unwrap()
            .last_used_at,
        parent_used
    );
    let why = p
        .admin()
        .explain_session(Provider::Claude, "C")
        .unwrap()
        .why;
    assert!(why.contains("inherited"), "{why}");
}

/// AP-17: Codex session keys from headers and body, the `cache:` namespace, and the
/// Codex forwarding (base URL without `/v1`, bearer token, account id).
#[test]
fn ap17_codex_session_keys_and_forwarding() {
    let p = Pool::new();
    p.add_oauth(Provider::Codex, "x", "cx-1", None);
    p.add_oauth(Provider::Codex, "y", "cx-2", None);
    let codex = |headers: &[(&str, &str)], body: serde_json::Value| {
        let mut h = Headers::from([(
            "authorization",
            format!("Bearer {}", p.codex_token).as_str(),
        )]);
        for (n, v) in headers {
            h.push(n, *v);
        }
        p.send(IncomingRequest {
            method: "POST".into(),
            path: "/v1/responses".into(),
            query: None,
            headers: h,
            body: body.to_string().into_bytes().into(),
            body_truncated: false,
        })
    };
    assert_eq!(
        codex(
            &[("session-id", "s1"), ("thread-id", "th1")],
            json!({"prompt_cache_key": "k", "stream": true})
        )
        .status,
        200
    );
    let req = p.up.last();
    assert_eq!(req.url, "https://chatgpt.com/backend-api/codex/responses");
    assert_eq!(req.headers.get("authorization"), Some("Bearer cx-1"));
    assert_eq!(req.headers.get("chatgpt-account-id"), Some("acct-x"));
    assert_eq!(req.headers.get("session-id"), Some("s1"));
    assert!(req.headers.get("x-api-key").is_none());
    assert_eq!(p.pinned(Provider::Codex, "th1").as_deref(), Some("x"));
    assert_eq!(
        p.pinned(Provider::Codex, "s1"),
        None,
        "thread-id wins over session-id"
    );
    codex(&[], json!({"prompt_cache_key": "k2"}));
    assert_eq!(p.pinned(Provider::Codex, "cache:k2").as_deref(), Some("x"));
    assert_eq!(
        p.pinned(Provider::Codex, "k2"),
        None,
        "a cache key is its own namespace"
    );
    let models = p.send(IncomingRequest {
        method: "GET".into(),
        path: "/v1/models".into(),
        query: Some("client_version=0.169.0".into()),
        headers: Headers::from([(
            "authorization",
            format!("Bearer {}", p.codex_token).as_str(),
        )]),
        body: bytes::Bytes::new(),
        body_truncated: false,
    });
    assert_eq!(models.status, 200);
    assert_eq!(
        p.up.last().url,
        "https://chatgpt.com/backend-api/codex/models?client_version=0.169.0"
    );
}

/// AP-18: concurrent first requests of a new session land on one account, even when the
/// cursor moves between them.
#[test]
fn ap18_concurrent_first_requests_share_one_account() {
    let path = file_db("ap18");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    p.add_key("a");
    p.add_key("b");
    p.up.delays.borrow_mut().insert("a".into(), 5);
    let second = NativeDb::open(&path).unwrap();
    let (r1, r2) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
            async {
                // Meanwhile another request moved the cursor to b.
                Store::new(&second)
                    .cas_cursor(Provider::Claude, None, &p.id("b"))
                    .unwrap();
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((r1.status, r2.status), (200, 200));
    assert_eq!(p.up.seen(), ["a", "a"]);
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    let _ = std::fs::remove_file(&path);
}

/// AP-19: an older request completing after a newer one re-pinned the session does not
/// overwrite the newer pin.
#[test]
fn ap19_stale_completion_keeps_the_newer_pin() {
    let path = file_db("ap19");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    for l in ["a", "b"] {
        p.add_key(l);
    }
    p.claude(Some("S"));
    p.up.seen();
    p.up.delays.borrow_mut().insert("a".into(), 5);
    let second = NativeDb::open(&path).unwrap();
    let (old, new) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
            async {
                Admin::new(&second, &p.up, &p.env)
                    .unwrap()
                    .disable(&p.id("a"))
                    .unwrap();
                collect(
                    Engine::new(&second, &p.up, &p.env)
                        .handle(p.claude_req(Some("S"), "m"))
                        .await,
                )
                .await
            },
        )
    });
    assert_eq!((old.status, new.status), (200, 200));
    assert_eq!(p.up.seen(), ["a", "b"]);
    assert_eq!(
        p.pinned(Provider::Claude, "S").as_deref(),
        Some("b"),
        "the newer pin stands"
    );
    let _ = std::fs::remove_file(&path);
}

/// AP-20: pins, cursor, holds and quota observations survive a restart (a new connection
/// to the same database, no guest memory).
#[test]
fn ap20_state_survives_a_restart() {
    let path = file_db("ap20");
    let (ids, now) = {
        let p = Pool::on(NativeDb::open(&path).unwrap());
        p.add_key("a");
        p.add_key("b");
        p.claude(Some("original"));
        p.up.push("a", quota_reject("5h", T0 + 60_000));
        p.claude(Some("fallback"));
        assert_eq!(p.up.seen(), ["a", "a", "b"]);
        p.env.advance(61_000);
        p.up.push("b", with_headers(429, &[("retry-after", "600".into())]));
        p.claude(Some("held"));
        (p.ids.borrow().clone(), p.env.now())
    };
    let p = Pool::on(NativeDb::open(&path).unwrap());
    *p.ids.borrow_mut() = ids;
    p.env.now.set(now);
    assert_eq!(
        p.status_of("b"),
        crate::model::AccountStatus::Held,
        "the hold survived"
    );
    assert!(
        p.admin().list(None).unwrap()[0]
            .windows
            .iter()
            .any(|w| w.name == "5h"),
        "observations survived"
    );
    p.env.advance(600_000);
    p.claude(Some("fresh"));
    p.claude(Some("original"));
    p.claude(Some("fallback"));
    assert_eq!(p.up.seen(), ["b", "a", "b"]);
    let _ = std::fs::remove_file(&path);
}

/// AP-21: the availability answers, and `blocked` equal to the 429's Retry-After.
#[test]
fn ap21_availability_answers() {
    let p = Pool::new();
    let admin = p.admin();
    assert_eq!(
        admin
            .availability("nobody", Provider::Claude, None)
            .unwrap(),
        Availability::NotRouted
    );
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Unavailable(UnavailableReason::NoEnabledAccount)
    );
    p.add_key("a");
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Ready
    );
    p.up.set("a", status(401));
    p.claude(None);
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::Unavailable(UnavailableReason::Authentication)
    );
    admin.enable(&p.id("a")).unwrap();
    p.up.set("a", with_headers(429, &[("retry-after", "42".into())]));
    let r = p.claude(None);
    assert_eq!(r.status, 429);
    let blocked = admin.availability("t1", Provider::Claude, None).unwrap();
    assert_eq!(
        blocked,
        Availability::Blocked {
            retry_at: p.env.now() + 42_000,
            cause: BlockCause::Held
        }
    );
    p.up.seen();
    let pool429 = p.claude(None);
    let Availability::Blocked { retry_at, .. } = blocked else {
        unreachable!()
    };
    assert_eq!(
        pool429.headers.get("retry-after"),
        Some(
            crate::policy::retry_after_secs(retry_at, p.env.now())
                .to_string()
                .as_str()
        )
    );
    assert_eq!(pool429.headers.get("x-pooler-origin"), Some("pool"));
    admin.set_setting("claude-routing", "off").unwrap();
    assert_eq!(
        admin.availability("t1", Provider::Claude, None).unwrap(),
        Availability::NotRouted
    );
    admin.set_setting("claude-routing", "on").unwrap();

    let q = Pool::new();
    q.add_oauth(Provider::Codex, "x", "cx", None);
    q.up.set(
        "cx",
        with_headers(429, &[("x-codex-primary-over-limit", "true".into())]),
    );
    let mut h = Headers::from([(
        "authorization",
        format!("Bearer {}", q.codex_token).as_str(),
    )]);
    h.push("session-id", "s");
    let r = q.send(IncomingRequest {
        method: "POST".into(),
        path: "/v1/responses".into(),
        query: None,
        headers: h,
        body: bytes::Bytes::from_static(b"{}"),
        body_truncated: false,
    });
    assert_eq!((r.status, r.headers.get("retry-after")), (429, Some("60")));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        q.admin().availability("t1", Provider::Codex, None).unwrap(),
        Availability::Unavailable(UnavailableReason::ResetUnknown)
    );
}

/// AP-22: enabling, adding, clearing an error, changing the threshold and a reset passing
/// each produce one coalesced availability-changed for that provider.
#[test]
fn ap22_signals_are_coalesced_per_provider() {
    let p = Pool::new();
    let admin = p.admin();
    admin.take_changes().unwrap();
    let one = |want: ChangeCause| {
        let changes = admin.take_changes().unwrap();
        assert_eq!(changes.len(), 1, "{want:?}: {changes:?}");
        assert_eq!(changes[0].provider, Provider::Claude);
        assert!(changes[0].causes.contains(&want), "{want:?}: {changes:?}");
        changes
    };
    p.add_key("a");
    one(ChangeCause::AccountAdded);
    admin.disable(&p.id("a")).unwrap();
    admin.enable(&p.id("a")).unwrap();
    admin.enable(&p.id("a")).unwrap();
    let c = one(ChangeCause::AccountEnabled);
    assert_eq!(
        c[0].causes,
        [ChangeCause::AccountDisabled, ChangeCause::AccountEnabled],
        "coalesced, first seen first"
    );
    assert_eq!(c[0].earliest, Availability::Ready);

    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 3_600_000));
    admin.take_changes().unwrap();
    p.store()
        .set_error(&o, "OAuth refresh failed with HTTP 400.")
        .unwrap();
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    block_on(admin.refresh(&o)).unwrap();
    one(ChangeCause::ErrorCleared);

    admin.set_setting("switch-threshold", "0.9").unwrap();
    let c = admin.take_changes().unwrap();
    assert_eq!(c.len(), 2, "the threshold concerns both providers");
    assert!(c.iter().all(|c| c.causes == [ChangeCause::ConfigChanged]));

    block_on(admin.tick(p.env.now())).unwrap();
    admin.take_changes().unwrap();
    p.up.push("a", quota_reject("5h", p.env.now() + 30_000));
    p.up.push("at-2", quota_reject("5h", p.env.now() + 30_000));
    p.claude(None);
    admin.take_changes().unwrap();
    p.env.advance(31_000);
    block_on(admin.tick(p.env.now())).unwrap();
    let c = one(ChangeCause::ResetPassed);
    assert_eq!(c[0].earliest, Availability::Ready);
}

/// AP-23: reorder refuses incomplete or duplicate lists; invalid settings are refused by
/// name; list never shows a secret.
#[test]
fn ap23_admin_refusals_and_secrets() {
    let p = Pool::new();
    let admin = p.admin();
    let a = admin
        .add(NewAccount {
            provider: Provider::Claude,
            credential: Credential::ApiKey("sk-ant-secret-wxyz".into()),
            label: None,
            priority: None,
        })
        .unwrap();
    let b = p.add_key("b");
    for bad in [
        vec![a.id.clone()],
        vec![a.id.clone(), a.id.clone(), b.clone()],
        vec![a.id.clone(), b.clone(), "ghost".into()],
    ] {
        assert!(
            matches!(
                admin.reorder(Provider::Claude, &bad),
                Err(crate::admin::AccountsError::InvalidOrder(_))
            ),
            "{bad:?}"
        );
    }
    let order: Vec<String> = admin
        .list(Some(Provider::Claude))
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(order, [a.id.clone(), b.clone()], "nothing changed");
    let reordered = admin
        .reorder(Provider::Claude, &[b.clone(), a.id.clone()])
        .unwrap();
    assert_eq!(
        reordered
            .iter()
            .map(|i| (i.id.clone(), i.priority))
            .collect::<Vec<_>>(),
        [(b.clone(), 0), (a.id.clone(), 1)]
    );
    match admin.set_setting("switch-threshold", "1.5") {
        Err(crate::admin::SettingsError::Refused(crate::settings::SettingError::Invalid {
            key,
            accepted,
            ..
        })) => {
            assert_eq!(key, "switch-threshold");
            assert!(accepted.contains("≤ 1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(admin.get_setting("switch-threshold").unwrap().value, "0.98");
    let listed = format!("{:?}", admin.list(None).unwrap());
    assert!(!listed.contains("sk-ant-secret"), "{listed}");
    assert_eq!(
        admin
            .list(None)
            .unwrap()
            .iter()
            .find(|i| i.id == a.id)
            .unwrap()
            .secret_hint,
        "…wxyz"
    );
    assert_eq!(a.label, "Claude API key");
    assert!(matches!(
        admin.add(NewAccount {
            provider: Provider::Codex,
            credential: Credential::ApiKey("k".into()),
            label: None,
            priority: None
        }),
        Err(crate::admin::AccountsError::ApiKeyNotSupported(
            Provider::Codex
        ))
    ));
}

/// AP-24: bad input gets a clear answer or a session-less forward, and the pool keeps
/// serving.
#[test]
fn ap24_bad_input_is_answered_clearly() {
    let p = Pool::abc();
    let mut not_json = p.claude_req(None, "m");
    not_json.body = bytes::Bytes::from_static(b"{not json");
    assert_eq!(p.send(not_json).status, 200, "forwarded session-less");
    assert_eq!(p.up.last().body, &b"{not json"[..]);

    let mut big = p.claude_req(None, "m");
    p.admin().set_setting("max-request-body", "1024").unwrap();
    big.body = vec![b' '; 2048].into();
    let r = p.send(big);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (413, Some("pool"))
    );
    let mut truncated = p.claude_req(None, "m");
    truncated.body_truncated = true;
    assert_eq!(p.send(truncated).status, 413);

    let bad_session = "x\u{1}y";
    assert_eq!(p.claude(Some(bad_session)).status, 200);
    assert_eq!(
        p.store().pin_count().unwrap(),
        0,
        "an invalid session id gives no pin"
    );

    let mut unknown = p.claude_req(None, "m");
    unknown.path = "/v1/complete".into();
    let r = p.send(unknown.clone());
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
    unknown.headers = Headers::new();
    assert_eq!(p.send(unknown).status, 401);
    let mut wrong_method = p.claude_req(None, "m");
    wrong_method.method = "GET".into();
    assert_eq!(p.send(wrong_method).status, 405);
    p.up.seen();
    assert_eq!(p.claude(Some("S")).status, 200, "still serving");
    assert_eq!(p.up.seen(), ["a"]);
}

#[test]
fn claude_forwarding_keeps_path_query_and_allowed_headers_only() {
    let p = Pool::abc();
    let mut req = p.claude_req(Some("S"), "m");
    req.headers.push("x-stainless-os", "Linux");
    req.headers.push("cookie", "c=1");
    p.send(req);
    let sent = p.up.last();
    assert_eq!(sent.url, "https://api.anthropic.com/v1/messages?beta=true");
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.headers.get("x-api-key"), Some("a"));
    assert_eq!(sent.headers.get("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.headers.get("x-stainless-os"), Some("Linux"));
    assert!(
        sent.headers.get("authorization").is_none(),
        "the route token never goes upstream"
    );
    assert!(sent.headers.get("cookie").is_none());
    let mut count = p.claude_req(Some("S"), "m");
    count.path = "/v1/messages/count_tokens".into();
    count.query = None;
    assert_eq!(p.send(count).status, 200);
    assert_eq!(
        p.up.last().url,
        "https://api.anthropic.com/v1/messages/count_tokens"
    );
}

/// Claude Code sends its own `anthropic-beta` list; an OAuth account's request carries it
/// plus the OAuth beta (once, the client's order kept), an API-key account's request carries
/// it unchanged, and a request with no betas gets the OAuth beta alone on OAuth.
#[test]
fn an_oauth_request_adds_the_oauth_beta_to_the_clients_betas() {
    let claude_code = "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24";
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "at-o", None);
    let beta_of = |betas: Option<&str>| {
        let mut req = p.claude_req(Some("S"), "m");
        if let Some(b) = betas {
            req.headers.push("anthropic-beta", b);
        }
        assert_eq!(p.send(req).status, 200);
        let sent = p.up.last();
        assert_eq!(sent.headers.get("authorization"), Some("Bearer at-o"));
        let all: Vec<&str> = sent
            .headers
            .iter()
            .filter(|(n, _)| *n == "anthropic-beta")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(all.len(), 1, "one anthropic-beta header: {all:?}");
        all[0].to_string()
    };
    assert_eq!(
        beta_of(Some(claude_code)),
        format!("{claude_code},oauth-2025-04-20")
    );
    assert_eq!(beta_of(None), "oauth-2025-04-20");
    assert_eq!(
        beta_of(Some("oauth-2025-04-20,claude-code-20250219")),
        "oauth-2025-04-20,claude-code-20250219"
    );

    let k = Pool::abc();
    let mut req = k.claude_req(Some("S"), "m");
    req.headers.push("anthropic-beta", claude_code);
    assert_eq!(k.send(req).status, 200);
    let sent = k.up.last();
    assert_eq!(sent.headers.get("x-api-key"), Some("a"));
    assert_eq!(sent.headers.get("anthropic-beta"), Some(claude_code));
    assert!(k.send(k.claude_req(Some("S"), "m")).status == 200);
    assert_eq!(k.up.last().headers.get("anthropic-beta"), None);
}

#[test]
fn passed_through_statuses_are_returned_as_is() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Status(
            400,
            vec![
                ("content-type", "application/json".into()),
                ("content-length", "9".into()),
            ],
            r#"{"bad":1}"#.into(),
        ),
    );
    let r = p.claude(Some("S"));
    assert_eq!((r.status, r.body.as_str()), (400, r#"{"bad":1}"#));
    assert_eq!(
        r.headers.get("content-length"),
        None,
        "framing headers are the host's"
    );
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.store().pin_count().unwrap(), 0, "only a success pins");
}

#[test]
fn unreachable_upstream_gives_the_pools_502_and_logs_no_secret() {
    let p = Pool::new();
    p.add_key("sk-secret-key");
    p.up.set("sk-secret-key", Reply::Drop);
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (502, Some("pool"))
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not reach Anthropic")
    );
    let logs = p.env.logs.borrow().join("\n");
    assert!(
        logs.contains("ECONNRESET") && !logs.contains("sk-secret"),
        "{logs}"
    );
}

#[test]
fn no_enabled_account_is_the_pools_503_and_routing_off_refuses() {
    let p = Pool::new();
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (503, Some("pool"))
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no enabled account")
    );
    p.add_key("a");
    p.admin().set_setting("claude-routing", "off").unwrap();
    assert_eq!(p.claude(None).status, 503);
    assert!(p.up.seen().is_empty());
}

#[test]
fn refused_fresh_token_is_held_and_answered_with_503_not_error() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "old", None);
    p.up.set("old", status(403));
    p.up.set("new", status(403));
    p.up.set(
        "token-endpoint",
        Reply::Status(200, vec![], r#"{"access_token":"new"}"#.into()),
    );
    let r = p.claude(None);
    assert_eq!(
        (r.status, r.headers.get("x-pooler-origin")),
        (503, Some("pool"))
    );
    assert_eq!(p.up.seen(), ["old", "new"]);
    assert_eq!(p.status_of("o"), crate::model::AccountStatus::Held);
    p.env.advance(30_000);
    assert_eq!(p.claude(None).status, 503);
    assert!(p.up.seen().is_empty(), "held: no upstream call");
    p.up.clear("new");
    p.env.advance(31_000);
    assert_eq!(p.claude(None).status, 200);
    assert_eq!(p.up.seen(), ["new"]);
    assert_eq!(p.up.count("token-endpoint"), 1, "no second refresh");
}

#[test]
fn token_refresh_refused_after_401_marks_the_account_in_error() {
    let p = Pool::new();
    p.add_oauth(Provider::Claude, "o", "old", None);
    p.add_key("b");
    p.up.set("old", status(401));
    p.up.set("token-endpoint", Reply::Status(400, vec![], "{}".into()));
    assert_eq!(p.claude(None).status, 200);
    assert_eq!(p.up.seen(), ["old", "b"]);
    let o = p
        .admin()
        .list(None)
        .unwrap()
        .into_iter()
        .find(|a| a.label == "o")
        .unwrap();
    assert_eq!(o.status, crate::model::AccountStatus::Error);
    assert_eq!(
        o.error.as_deref(),
        Some("OAuth refresh failed with HTTP 400.")
    );
}

#[test]
fn pin_lifetime_setting_expires_pins() {
    let p = Pool::abc();
    p.admin().set_setting("pin-lifetime", "1m").unwrap();
    p.claude(Some("S"));
    p.store()
        .cas_cursor(Provider::Claude, Some(&p.id("a")), &p.id("b"))
        .unwrap();
    p.env.advance(59_000);
    p.claude(Some("S"));
    p.env.advance(60_000);
    p.claude(Some("S"));
    assert_eq!(
        p.up.seen(),
        ["a", "a", "b"],
        "touched at 59 s, expired a minute later"
    );
}

#[test]
fn transient_retries_respect_settings_and_the_inline_wait() {
    let p = Pool::abc();
    p.admin().set_setting("transient-retries", "3").unwrap();
    p.admin().set_setting("transient-backoff", "4s").unwrap();
    p.admin().set_setting("inline-wait", "10s").unwrap();
    p.up.set("a", status(529));
    p.claude(Some("S"));
    assert_eq!(
        p.up.seen(),
        ["a", "a", "a", "b"],
        "the third retry would pass the inline wait"
    );
    assert_eq!(*p.env.sleeps.borrow(), [4_000, 4_000]);
}

#[test]
fn maintenance_refreshes_usage_and_expiring_tokens() {
    let p = Pool::new();
    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 2 * 60_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    p.up.set(
        "usage",
        Reply::Status(
            200,
            vec![],
            json!({"five_hour": {"utilization": 40.0, "resets_at": "2023-11-15T00:00:00Z"}})
                .to_string(),
        ),
    );
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 1);
    assert_eq!(p.up.count("usage"), 1);
    // Both are bounded; a model call is left the host's long defaults.
    for call in ["token-endpoint", "usage"] {
        assert_eq!(
            p.up.calls_to(call)[0].deadlines,
            Deadlines::SERVICE,
            "{call}"
        );
    }
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.last().deadlines, Deadlines::MODEL);
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.token_expires_at, Some(T0 + 3_600_000));
    assert_eq!(info.windows[0].utilization, Some(0.4));
    block_on(p.admin().tick(p.env.now() + 1_000)).unwrap();
    assert_eq!(
        p.up.count("usage"),
        1,
        "not due again before the usage refresh interval"
    );
    assert!(
        matches!(p.store().credential(&o).unwrap(), Some(Credential::OAuth(t)) if t.access_token == "at-2")
    );
}

/// The usage endpoint refusing the access token (401) leads to one token refresh and one
/// more usage fetch with the new token; a refused refresh of a valid token flags the
/// sign-in and keeps the account serving.
#[test]
fn a_usage_401_refreshes_the_token_once_and_fetches_again() {
    let p = Pool::new();
    let o = p.add_oauth(Provider::Claude, "o", "at-1", Some(T0 + 3_600_000));
    p.up.set(
        "token-endpoint",
        Reply::Status(
            200,
            vec![],
            r#"{"access_token":"at-2","expires_in":3600}"#.into(),
        ),
    );
    p.up.push("usage", status(401));
    p.up.set(
        "usage",
        Reply::Status(
            200,
            vec![],
            json!({"five_hour": {"utilization": 40.0, "resets_at": "2023-11-15T00:00:00Z"}})
                .to_string(),
        ),
    );
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 1, "one refresh");
    let usage = p.up.calls_to("usage");
    assert_eq!(
        usage.len(),
        2,
        "the refused fetch and one with the new token"
    );
    assert_eq!(usage[0].headers.get("authorization"), Some("Bearer at-1"));
    assert_eq!(usage[1].headers.get("authorization"), Some("Bearer at-2"));
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.windows[0].utilization, Some(0.4));
    assert!(info.error.is_none());

    // A 401 again and the refresh refused while the token is still valid: the sign-in is
    // flagged, the account keeps serving (#6167), and nothing is fetched a third time.
    p.env.advance(20 * 60_000);
    p.up.push("usage", status(401));
    p.up.push("token-endpoint", status(400));
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(p.up.count("token-endpoint"), 2);
    assert_eq!(p.up.count("usage"), 3);
    let info = p.admin().list(None).unwrap().remove(0);
    assert_eq!(info.id, o);
    assert!(info.needs_sign_in);
    assert!(info.error.is_none(), "{:?}", info.error);
}

/// A database that records the statements run on it.
struct Recording<'a> {
    db: &'a NativeDb,
    statements: RefCell<Vec<String>>,
}

impl Db for Recording<'_> {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.execute(sql, params)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.execute_batch(sql)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.query(sql, params)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.db.last_insert_rowid()
    }
}

/// A pinned session's request within a second of its last commits only its attempt: the
/// account's and the pin's last use are not written again (the statements would change
/// nothing), and a second later they are.
#[test]
fn a_pinned_request_within_the_granularity_writes_only_its_attempt() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    let writes = |p: &Pool| {
        let rec = Recording {
            db: &p.db,
            statements: RefCell::new(Vec::new()),
        };
        let req = p.claude_req(Some("S"), "claude-sonnet-4-5");
        let status = block_on(async {
            collect(Engine::new(&rec, &p.up, &p.env).handle(req).await)
                .await
                .status
        });
        assert_eq!(status, 200);
        rec.statements
            .into_inner()
            .into_iter()
            .filter(|s| {
                let s = s.trim_start().to_ascii_uppercase();
                s.starts_with("UPDATE") || s.starts_with("INSERT") || s.starts_with("DELETE")
            })
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
    };
    p.env.advance(TOUCH_GRANULARITY_MS - 1);
    assert_eq!(writes(&p), ["INSERT INTO attempts"]);
    p.env.advance(1);
    assert_eq!(
        writes(&p),
        [
            "UPDATE accounts SET",
            "UPDATE pins SET",
            "INSERT INTO attempts"
        ]
    );
    let pin = p
        .store()
        .pin(Provider::Claude, "session:S", p.env.now(), u64::MAX);
    assert_eq!(pin.unwrap().unwrap().last_used_at, p.env.now());
    assert_eq!(p.up.seen(), ["a", "a", "a"]);
}

/// The head is screened before the body is read: a wrong token, a path the pool does not
/// serve and routing off are refused from it; a routable request is admitted with the
/// body limit; and a database not yet migrated cannot tell.
#[test]
fn a_request_head_is_refused_or_admitted_before_its_body_is_read() {
    let p = Pool::abc();
    let screen = |req: &IncomingRequest| {
        Engine::new(&p.db, &p.up, &p.env).screen(&req.method, &req.path, &req.headers)
    };
    let status = |s: Screen<FakeBody>| match s {
        Screen::Refused(r) => Some(r.status),
        _ => None,
    };
    let good = p.claude_req(Some("S"), "m");
    let mut wrong = good.clone();
    wrong.headers = Headers::from([("authorization", "Bearer not-a-route")]);
    assert_eq!(status(screen(&wrong)), Some(401));
    let mut codex_token = good.clone();
    codex_token.headers = Headers::from([(
        "authorization",
        format!("Bearer {}", p.codex_token).as_str(),
    )]);
    assert_eq!(
        status(screen(&codex_token)),
        Some(401),
        "a Codex route's token on a Claude path"
    );
    let mut elsewhere = good.clone();
    elsewhere.path = "/v1/elsewhere".into();
    assert_eq!(status(screen(&elsewhere)), Some(404));
    let mut get = good.clone();
    get.method = "GET".into();
    assert_eq!(status(screen(&get)), Some(405));

    p.admin().set_setting("max-request-body", "4096").unwrap();
    match screen(&good) {
        Screen::Admitted(a) => assert_eq!(a.max_body(), 4096),
        _ => panic!("a routable head is admitted"),
    }
    p.admin().set_setting("claude-routing", "off").unwrap();
    assert_eq!(status(screen(&good)), Some(503));
    assert_eq!(p.up.seen(), Vec::<String>::new(), "nothing went upstream");

    let fresh = Pool::on(NativeDb::memory());
    fresh.db.execute_batch("DROP TABLE meta").unwrap();
    let unknown = Engine::new(&fresh.db, &fresh.up, &fresh.env).screen(
        &good.method,
        &good.path,
        &good.headers,
    );
    assert!(matches!(unknown, Screen::Unknown));
}

/// A screened request is served with what the screen read: its route and settings are not
/// read again, and it is routed as an unscreened one is (the 413 still applies).
#[test]
fn a_screened_request_reads_neither_its_route_nor_its_settings_again() {
    let p = Pool::abc();
    let serve = |req: IncomingRequest| {
        let rec = Recording {
            db: &p.db,
            statements: RefCell::new(Vec::new()),
        };
        let engine = Engine::new(&rec, &p.up, &p.env);
        let engine = match engine.screen(&req.method, &req.path, &req.headers) {
            Screen::Admitted(a) => engine.with_admitted(a),
            _ => panic!("admitted"),
        };
        rec.statements.borrow_mut().clear();
        let status = block_on(async { collect(engine.handle(req).await).await.status });
        let read: Vec<String> = rec
            .statements
            .into_inner()
            .into_iter()
            .filter(|s| {
                let s = s.to_ascii_lowercase();
                s.contains("from routes") || s.contains("from settings") || s.contains("from meta")
            })
            .collect();
        (status, read)
    };
    // Pinned first, so that serving it reads no pin generation from `meta` either.
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(
        serve(p.claude_req(Some("S"), "m")),
        (200, Vec::<String>::new())
    );
    assert_eq!(p.up.seen(), ["a", "a"]);
    p.admin().set_setting("max-request-body", "1024").unwrap();
    let mut big = p.claude_req(Some("S"), "m");
    big.body = vec![b' '; 1025].into();
    assert_eq!(serve(big).0, 413);
    assert_eq!(p.up.seen(), Vec::<String>::new(), "the 413 went nowhere");
}

/// The latest attempt recorded for `session`: (account label, status, outcome).
fn latest_attempt(p: &Pool, session: &str) -> (String, Option<u16>, String) {
    let recent = p
        .admin()
        .explain_session(Provider::Claude, session)
        .unwrap()
        .recent;
    let last = recent.last().expect("an attempt was recorded");
    (p.label_of(&last.account), last.status, last.outcome.clone())
}

/// The cancellation log lines so far.
fn cancel_lines(p: &Pool) -> Vec<String> {
    p.env
        .logs
        .borrow()
        .iter()
        .filter(|l| l.starts_with(CANCELLED_MESSAGE))
        .cloned()
        .collect()
}

/// The client goes away during the backoff after a 503 (spec §4: "the client cancelling
/// stops every further attempt and wait"): no further upstream attempt, no detour, the
/// attempt is recorded `cancelled`, and pin, cursor and the account's standing are as they
/// were; one log line says so. A new session whose client leaves so is not pinned at all.
#[test]
fn a_client_gone_during_the_backoff_after_a_503_stops_the_request() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    p.up.set("a", status(503));
    p.env.leave_during_sleep(1);
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 499, "{}", r.body);
    assert_eq!(p.up.seen(), ["a"], "no retry of a, no detour to b");
    assert_eq!(
        *p.env.sleeps.borrow(),
        [250],
        "the first backoff only began"
    );
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(503), "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Ready);
    let lines = cancel_lines(&p);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(&p.id("a")) && lines[0].contains("(\"attempts\", \"1\")"),
        "{lines:?}"
    );
    assert!(!lines[0].contains(&p.claude_token), "no secret in the log");

    // A new session: its provisional pin is released, the cursor stays.
    p.env.leave_during_sleep(1);
    assert_eq!(p.claude(Some("N")).status, 499);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(
        p.pinned(Provider::Claude, "N"),
        None,
        "a cancelled request pins nothing"
    );
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(
        latest_attempt(&p, "N"),
        ("a".into(), Some(503), "cancelled".into())
    );

    // With its client there, the same request retries and detours as before.
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "a", "a", "b"]);
}

/// The client goes away while an attempt's upstream call is in flight: the call is dropped
/// unanswered (in the component, wasi:http aborts it), nothing else is tried, and the
/// attempt is recorded `cancelled` with no status.
#[test]
fn a_client_gone_while_an_attempt_is_in_flight_drops_it() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    p.up.seen();
    p.up.delays.borrow_mut().insert("a".into(), 5);
    p.up.leave_during_call(1);
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 499, "{}", r.body);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(p.up.abandoned.get(), 1, "the call in flight was dropped");
    assert!(p.env.sleeps.borrow().is_empty());
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), None, "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    assert_eq!(p.cursor().as_deref(), Some("a"));
    assert_eq!(cancel_lines(&p).len(), 1);
}

/// The client goes away during the inline wait for a short 429: the account is not tried
/// again. The hold the upstream asked for stays (it is the upstream's word, not the
/// request's), the pin does not move.
#[test]
fn a_client_gone_during_a_short_429_wait_stops_the_request() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    p.up.seen();
    p.up.push("a", with_headers(429, &[("retry-after", "5".into())]));
    p.env.leave_during_sleep(1);
    assert_eq!(p.claude(Some("S")).status, 499);
    assert_eq!(p.up.seen(), ["a"]);
    assert_eq!(*p.env.sleeps.borrow(), [5_000]);
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(429), "cancelled".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}

/// The client goes away in the middle of a relayed stream: relaying stops at once (the
/// upstream's next chunk is not even read), with one log line; the attempt that served the
/// head keeps its record.
#[test]
fn a_client_gone_mid_stream_stops_relaying() {
    let p = Pool::abc();
    p.up.set(
        "a",
        Reply::Sse(
            vec![
                "event: message_start\ndata: {}\n\n",
                "event: ping\ndata: {}\n\n",
                "event: message_stop\ndata: {}\n\n",
            ],
            false,
        ),
    );
    block_on(async {
        let r = Engine::new(&p.db, &p.up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet"))
            .await;
        assert_eq!(r.status, 200);
        let Body::Stream(mut relay) = r.body else {
            panic!("a stream")
        };
        let first = relay_next(&mut relay, &p.env).await.unwrap().unwrap();
        assert!(first.starts_with(b"event: message_start"));
        p.env.gone.set(true);
        assert!(relay_next(&mut relay, &p.env).await.is_none());
        assert!(relay_next(&mut relay, &p.env).await.is_none());
    });
    assert_eq!(p.up.pulled.get(), 1, "nothing more was read from upstream");
    let lines = cancel_lines(&p);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&p.id("a")), "{lines:?}");
    assert_eq!(
        latest_attempt(&p, "S"),
        ("a".into(), Some(200), "served".into())
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
}
