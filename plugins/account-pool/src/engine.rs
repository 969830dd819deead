//! The proxy engine: one client request in, one response out. It authenticates the route
//! token, reads the session, chooses accounts, forwards with each account's credential,
//! classifies every upstream answer (spec §4), retries and detours, refreshes OAuth
//! tokens, records quota and attempts, and commits pins and the cursor by the #6990 rule.
//!
//! It reaches the outside only through [`Upstream`], [`Clock`], [`Random`], [`Log`] and
//! [`Cancel`], and keeps all state in the database, so it runs the same natively (tests,
//! fakes) and in the component (wasi:http, the WIT sqlite and incoming-client imports).
//!
//! When the client goes away ([`Cancel`]) the request's work stops: every backoff, inline
//! wait, refresh poll, upstream call and relayed chunk races against it; the attempt under
//! way is dropped and recorded `cancelled`, and nothing is committed (spec §4).

use crate::http::{self, Endpoint, Headers, PoolError, RouteMatch};
use crate::model::{ChangeCause, Credential, Family, HoldKind, OAuthTokens, Provider};
use crate::oauth::{self, Need, RefreshResult, RefusedEffect};
use crate::policy::{
    self, AccountState, AttemptOutcome, Candidate, Classified, PinAction, PinSeen, Role, Selection,
};
use crate::quota::{self, Observation};
use crate::session::{self, SessionInfo};
use crate::settings::Settings;
use crate::store::{Store, TOUCH_GRANULARITY_MS};
use crate::stream::{self, BodyStream, Relay};
use crate::token;
use pooler_plugin_kit::{Db, DbError};

/// How much of a failed upstream body is kept as its detail.
const DETAIL_LIMIT: usize = 1024;
/// How often a request waiting for another request's token refresh looks again.
const REFRESH_POLL_MS: u64 = 100;
/// An exhausted OAuth account's usage is re-fetched by requests at most this often.
pub const EXHAUSTED_RECHECK_MS: u64 = 30_000;

/// A request to an upstream.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamRequest {
    pub method: String,
    pub url: String,
    pub headers: Headers,
    /// Shared with the incoming request: every attempt sends the same bytes, uncopied.
    pub body: bytes::Bytes,
    pub deadlines: Deadlines,
}

/// Time limits of one upstream call; `None` leaves the host's default (wasi:http request
/// options). A call past a limit fails as a transport error (no head) or a broken body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// From sending the request to the response head.
    pub first_byte_ms: Option<u64>,
    /// Between two pieces of the response body.
    pub between_bytes_ms: Option<u64>,
}

impl Deadlines {
    /// A model call: a model may think for minutes before its head or between events, so
    /// the host's long defaults apply.
    pub const MODEL: Deadlines = Deadlines {
        first_byte_ms: None,
        between_bytes_ms: None,
    };
    /// A token or usage endpoint, which answers a small JSON document at once. Bounded so
    /// a stalled one cannot hold a request's refresh or a maintenance tick for minutes.
    pub const SERVICE: Deadlines = Deadlines {
        first_byte_ms: Some(30_000),
        between_bytes_ms: Some(30_000),
    };
}

/// An upstream's answer head and streaming body.
pub struct UpstreamResponse<B> {
    pub status: u16,
    pub headers: Headers,
    pub body: B,
}

/// Why no response head arrived (refused, reset, timed out, TLS failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError(pub String);

/// Sends requests upstream (wasi:http in the component, a script in tests).
#[allow(async_fn_in_trait)]
pub trait Upstream {
    type Body: BodyStream;
    async fn send(
        &self,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse<Self::Body>, TransportError>;
}

/// The host clock: epoch milliseconds, and sleeping (manual in tests).
#[allow(async_fn_in_trait)]
pub trait Clock {
    fn now(&self) -> u64;
    async fn sleep(&self, ms: u64);
}

/// Cryptographically secure random bytes.
pub trait Random {
    fn fill(&self, buf: &mut [u8]);
}

/// Log severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Structured logging. Callers never pass a secret.
pub trait Log {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]);
}

/// Whether the client of the request being served has gone (its connection closed before
/// the response ended): the host's `incoming-client` import in the component, a flag in
/// tests. Outside a request (admin calls, maintenance) the client never goes.
#[allow(async_fn_in_trait)]
pub trait Cancel {
    /// Whether the client has gone; once true, true for the rest of the request.
    fn gone(&self) -> bool;
    /// Resolves once the client has gone; never while it is there.
    async fn gone_wait(&self);
}

/// The log line of a request the pool stopped because its client went away.
pub const CANCELLED_MESSAGE: &str = "Account Pooler request cancelled: the client went away";

/// What racing a piece of a request's work against its client's leaving came to.
enum Raced<T> {
    Done(T),
    Gone,
}

/// Run `work` unless the client goes first; then `work` is dropped where it stands (a
/// wasi:http request in flight is aborted when its future-incoming-response is dropped).
async fn unless_gone<T>(cancel: &impl Cancel, work: impl Future<Output = T>) -> Raced<T> {
    if cancel.gone() {
        return Raced::Gone;
    }
    let mut work = std::pin::pin!(work);
    let mut gone = std::pin::pin!(cancel.gone_wait());
    std::future::poll_fn(|cx| {
        if gone.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Raced::Gone);
        }
        work.as_mut().poll(cx).map(Raced::Done)
    })
    .await
}

/// The next chunk of `relay` for the client, unless the client goes first: then the relay
/// stops (None; dropping it drops the upstream body, closing that connection) and says so
/// in one log line. Once the response head is out nothing else is left to undo: the
/// attempt that served it was recorded and committed before.
pub async fn relay_next<B: BodyStream>(
    relay: &mut Relay<B>,
    env: &(impl Cancel + Log),
) -> Option<Result<Vec<u8>, String>> {
    match unless_gone(env, relay.next()).await {
        Raced::Done(chunk) => chunk,
        Raced::Gone => {
            if !relay.stop() {
                env.log(
                    Level::Info,
                    CANCELLED_MESSAGE,
                    &[
                        ("while", "relaying the response".to_owned()),
                        ("account", relay.account().unwrap_or("?").to_owned()),
                    ],
                );
            }
            None
        }
    }
}

/// The client's request, with its body read (bounded by the glue).
#[derive(Debug, Clone, PartialEq)]
pub struct IncomingRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: Headers,
    pub body: bytes::Bytes,
    /// The body was longer than the glue was willing to read.
    pub body_truncated: bool,
}

/// A response body: made by the pool, or relayed from upstream.
pub enum Body<B> {
    Full(Vec<u8>),
    Stream(Relay<B>),
}

/// The response to the client.
pub struct Response<B> {
    pub status: u16,
    pub headers: Headers,
    pub body: Body<B>,
}

impl<B> Response<B> {
    fn pool(provider: Provider, e: &PoolError) -> Self {
        Response {
            status: e.status,
            headers: e.headers(),
            body: Body::Full(e.body(provider)),
        }
    }
}

/// A random id: 16 random bytes in UUID v4 form.
pub fn new_id(random: &impl Random) -> String {
    let mut b = [0u8; 16];
    random.fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// What an OAuth refresh came to, for the caller.
#[derive(Debug)]
pub enum Refreshed {
    /// A usable token (new, or refreshed by another request meanwhile).
    Tokens(OAuthTokens),
    /// The endpoint refused the refresh token.
    Refused(u16),
    /// Not now (endpoint failure, or another refresh still running).
    Transient(String),
}

/// Why an account's usage was not merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFailure {
    /// The usage endpoint refused the access token (HTTP 401).
    Unauthorized(u16),
    /// The token refresh that followed a 401 was refused with this status.
    SignInRefused(u16),
    /// Anything else (unreachable, another status, unreadable answer, no usage endpoint).
    Other(String),
}

impl std::fmt::Display for UsageFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsageFailure::Unauthorized(status) => {
                write!(f, "usage endpoint refused the access token (HTTP {status})")
            }
            UsageFailure::SignInRefused(status) => write!(
                f,
                "usage endpoint refused the access token and the token refresh failed with HTTP {status}"
            ),
            UsageFailure::Other(why) => f.write_str(why),
        }
    }
}

/// The engine, borrowing its capabilities for one call.
pub struct Engine<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> {
    store: Store<'a, D>,
    upstream: &'a U,
    env: &'a E,
    /// The route and settings [`Engine::screen`] read for this request (read here
    /// otherwise).
    admitted: Option<Admitted>,
    /// When the current attempt last tried its account: the account's "last used" time,
    /// written with the attempt's outcome.
    last_try: std::cell::Cell<u64>,
    /// Upstream calls this request has made (for the log line of a cancelled request).
    sends: std::cell::Cell<u32>,
}

/// What one attempt on one account came to.
enum Attempt<B> {
    /// A response for the client: 2xx served, or passed through as is.
    Respond {
        response: UpstreamResponse<B>,
        served: bool,
    },
    /// The account could not serve; the failure (if any) is what the client sees if
    /// nothing else serves.
    Failed {
        outcome: AttemptOutcome,
        failure: Option<PoolError>,
    },
    /// The client went away: the attempt stopped where it stood. `status` is the last
    /// answer the account gave it (None when it had none, or its call was in flight).
    Cancelled { status: Option<u16> },
}

/// What to do after a transient failure ([`Engine::transient_retry`]).
enum Backoff {
    /// The wait is over: try the same account again.
    Retry,
    /// No retry is left (or it would wait past the inline wait limit).
    GiveUp,
    /// The client went away during the wait.
    Gone,
}

/// The outcome recorded for an attempt the client's leaving stopped.
const CANCELLED: &str = "cancelled";

/// What a request's head comes to, before its body is read ([`Engine::screen`]).
pub enum Screen<B> {
    /// The pool answers it whatever its body holds (a method, path or route token it does
    /// not serve, or routing off): its body need not be kept.
    Refused(Response<B>),
    /// It may be routed: read its body, up to [`Admitted::max_body`] bytes, and serve it
    /// with [`Engine::with_admitted`].
    Admitted(Admitted),
    /// Storage cannot tell yet (not migrated, or failing): read the body and let
    /// [`Engine::handle`] decide (it migrates, or answers 503).
    Unknown,
}

/// A request's route and the settings it is served with, read before its body.
#[derive(Debug, Clone)]
pub struct Admitted {
    route: (String, Provider),
    settings: Settings,
}

impl Admitted {
    /// The most body bytes the request may have (`max-request-body`).
    pub fn max_body(&self) -> u64 {
        self.settings.max_request_body
    }
}

/// What a request comes to before it chooses an account, read in one read transaction.
enum Decision<B> {
    /// The pool answers it itself (bad method or path, bad token, routing off, too large).
    Refused(Response<B>),
    /// It is routed.
    Routed(Box<Routed>),
}

/// A request the pool routes: for the route's thread, with what it chooses from.
struct Routed {
    thread: String,
    settings: Settings,
    info: SessionInfo,
    snapshot: Snapshot,
}

/// Whether the pool serves this request, checked in the order the client should hear
/// about it: the endpoint and thread it is routed for, or the pool's own answer.
fn refusal<B>(
    req: &IncomingRequest,
    route: Option<(String, Provider)>,
    settings: &Settings,
) -> Result<(Endpoint, String), Response<B>> {
    let (endpoint, thread) = head_refusal(&req.method, &req.path, route, settings)?;
    if req.body_truncated || req.body.len() as u64 > settings.max_request_body {
        return Err(Response::pool(
            endpoint.provider(),
            &PoolError::pool(
                413,
                format!(
                    "The request body exceeds {} bytes.",
                    settings.max_request_body
                ),
            ),
        ));
    }
    Ok((endpoint, thread))
}

/// [`refusal`] from the request's head alone: everything but the body's size.
fn head_refusal<B>(
    method: &str,
    path: &str,
    route: Option<(String, Provider)>,
    settings: &Settings,
) -> Result<(Endpoint, String), Response<B>> {
    let endpoint = match http::match_route(method, path) {
        RouteMatch::Endpoint(e) => e,
        RouteMatch::MethodNotAllowed(p) => {
            return Err(Response::pool(
                p,
                &PoolError::pool(405, format!("{method} is not allowed on {path}.")),
            ));
        }
        RouteMatch::NotFound(guess) => {
            let p = route
                .as_ref()
                .map(|r| r.1)
                .or(guess)
                .unwrap_or(Provider::Claude);
            let status = if route.is_some() { 404 } else { 401 };
            let msg = if route.is_some() {
                format!("Account Pooler does not serve {path}.")
            } else {
                "Invalid Account Pooler bearer token.".to_owned()
            };
            return Err(Response::pool(p, &PoolError::pool(status, msg)));
        }
    };
    let provider = endpoint.provider();
    let Some((thread, _)) = route.filter(|r| r.1 == provider) else {
        return Err(Response::pool(
            provider,
            &PoolError::pool(401, "Invalid Account Pooler bearer token."),
        ));
    };
    if !settings.routing(provider) {
        return Err(Response::pool(
            provider,
            &PoolError::pool(
                503,
                format!("Account Pooler routing is off for {provider}."),
            ),
        ));
    }
    Ok((endpoint, thread))
}

/// The state a routed request chooses its first account from.
struct Snapshot {
    provider: Provider,
    /// The provider's accounts, in selection order.
    accounts: Vec<AccountState>,
    /// The session's fresh pin.
    pin: Option<crate::store::Pin>,
    /// The account of the parent session's fresh pin, when the session has no pin.
    inherited: Option<String>,
    /// The provider's round-robin cursor.
    cursor: Option<String>,
}

impl Snapshot {
    /// Read the request's session (its body is parsed only now, for a request the pool
    /// routes) and the state it chooses from.
    fn read<D: Db>(
        st: &Store<'_, D>,
        endpoint: Endpoint,
        req: &IncomingRequest,
        s: &Settings,
        now: u64,
    ) -> Result<(SessionInfo, Snapshot), DbError> {
        let provider = endpoint.provider();
        let found = session::extract(provider, &req.headers, &req.body);
        let info = if endpoint.is_conversation() {
            found
        } else {
            SessionInfo {
                family: found.family,
                ..SessionInfo::default()
            }
        };
        let pin = match info.key.as_deref() {
            Some(k) => st.pin(provider, k, now, s.pin_lifetime_ms)?,
            None => None,
        };
        let inherited = match (info.key.as_deref(), info.parent.as_deref(), &pin) {
            (Some(_), Some(parent), None) => st
                .pin(provider, parent, now, s.pin_lifetime_ms)?
                .map(|p| p.account),
            _ => None,
        };
        let snapshot = Snapshot {
            provider,
            accounts: st.accounts(Some(provider))?,
            pin,
            inherited,
            cursor: st.cursor(provider)?,
        };
        Ok((info, snapshot))
    }
}

/// The per-request facts every attempt needs.
struct Ctx<'r> {
    provider: Provider,
    req: &'r IncomingRequest,
    family: Option<Family>,
    key: Option<&'r str>,
    settings: &'r Settings,
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> Engine<'a, D, U, E> {
    pub fn new(db: &'a D, upstream: &'a U, env: &'a E) -> Self {
        Engine {
            store: Store::new(db),
            upstream,
            env,
            admitted: None,
            last_try: std::cell::Cell::new(0),
            sends: std::cell::Cell::new(0),
        }
    }

    /// Look at a request's head before its body is read: its settings and route token,
    /// in one read transaction. A request the pool would refuse whatever its body holds is
    /// answered now, so a caller need not keep a body (up to `max-request-body` of it) only
    /// to refuse it.
    pub fn screen(&self, method: &str, path: &str, headers: &Headers) -> Screen<U::Body> {
        let hash = token::from_headers(headers).map(|t| token::hash(&t));
        let read = self.store.read(|st| {
            if !st.schema_current()? {
                return Ok(None);
            }
            let route = match &hash {
                Some(h) => st.route_by_hash(h)?,
                None => None,
            };
            Ok(Some((route, st.settings()?)))
        });
        let Ok(Some((route, settings))) = read else {
            return Screen::Unknown;
        };
        match head_refusal(method, path, route.clone(), &settings) {
            Err(refused) => Screen::Refused(refused),
            Ok(_) => match route {
                Some(route) => Screen::Admitted(Admitted { route, settings }),
                None => Screen::Unknown,
            },
        }
    }

    /// Serve the request `admitted` was screened from with what the screen read, instead
    /// of reading it again.
    pub fn with_admitted(mut self, admitted: Admitted) -> Self {
        self.admitted = Some(admitted);
        self
    }

    /// Serve one client request. Storage failures become the pool's own 503.
    pub async fn handle(&self, req: IncomingRequest) -> Response<U::Body> {
        let shape = match http::match_route(&req.method, &req.path) {
            RouteMatch::Endpoint(e) => e.provider(),
            RouteMatch::MethodNotAllowed(p) => p,
            RouteMatch::NotFound(p) => p.unwrap_or(Provider::Claude),
        };
        match self.handle_inner(&req).await {
            Ok(r) => r,
            Err(e) => {
                self.env.log(
                    Level::Warn,
                    "Account Pooler storage failed",
                    &[("error", e.to_string())],
                );
                Response::pool(
                    shape,
                    &PoolError::pool(503, "Account Pooler storage is unavailable; try again."),
                )
            }
        }
    }

    async fn handle_inner(&self, req: &IncomingRequest) -> Result<Response<U::Body>, DbError> {
        let start = self.env.now();
        // Everything the request decides on that the screen did not read, in one read
        // transaction: one snapshot, one read lock (instead of one per statement).
        let read = |st: &Store<'a, D>| -> Result<Option<Decision<U::Body>>, DbError> {
            let (route, settings) = match &self.admitted {
                // Screened: the schema was current then, and a schema never goes back.
                Some(a) => (Some(a.route.clone()), a.settings.clone()),
                None => {
                    if !st.schema_current()? {
                        return Ok(None);
                    }
                    let route = match token::from_headers(&req.headers) {
                        Some(t) => st.route_by_hash(&token::hash(&t))?,
                        None => None,
                    };
                    (route, st.settings()?)
                }
            };
            Ok(Some(match refusal(req, route, &settings) {
                Err(refused) => Decision::Refused(refused),
                Ok((endpoint, thread)) => {
                    let (info, snapshot) = Snapshot::read(st, endpoint, req, &settings, start)?;
                    Decision::Routed(Box::new(Routed {
                        thread,
                        settings,
                        info,
                        snapshot,
                    }))
                }
            }))
        };
        let decision = match self.store.read(read)? {
            Some(d) => d,
            None => {
                self.store.migrate()?;
                self.store
                    .read(read)?
                    .ok_or_else(|| DbError::Decode("the schema did not migrate".into()))?
            }
        };
        let Routed {
            thread,
            settings,
            info,
            snapshot,
        } = match decision {
            Decision::Refused(response) => return Ok(response),
            Decision::Routed(routed) => *routed,
        };
        let ctx = Ctx {
            provider: snapshot.provider,
            req,
            family: info.family,
            key: info.key.as_deref(),
            settings: &settings,
        };
        self.route(&ctx, &thread, snapshot).await
    }

    /// The attempt loop, from what the request read before choosing.
    async fn route(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        snapshot: Snapshot,
    ) -> Result<Response<U::Body>, DbError> {
        let s = ctx.settings;
        let (provider, threshold) = (ctx.provider, s.switch_threshold);
        // The accounts this request may use: those that exist now. The first pass of the
        // loop uses the snapshot's read; later passes read again (an attempt changes state).
        let Snapshot {
            accounts,
            pin,
            inherited,
            cursor,
            ..
        } = snapshot;
        let snapshot: Vec<String> = accounts.iter().map(|a| a.id.clone()).collect();
        let mut fresh = Some(accounts);
        let mut pin: Option<PinSeen> = pin.map(|p| PinSeen {
            confirmed_use: (!p.provisional).then_some(p.last_used_at),
            account: p.account,
            generation: p.generation,
            claimed: false,
        });
        let mut attempted: Vec<String> = Vec::new();
        let mut outcomes: Vec<(String, AttemptOutcome)> = Vec::new();
        let mut waited: Vec<String> = Vec::new();
        let mut previous: Option<String> = None;
        let mut failure: Option<PoolError> = None;
        let mut rechecked = false;

        loop {
            if self.env.gone() {
                // Between attempts (the last one was recorded with its own outcome).
                return self.cancelled(ctx, pin.as_ref(), previous.as_deref());
            }
            let now = self.env.now();
            let states: Vec<AccountState> = match fresh.take() {
                Some(states) => states,
                None => self
                    .store
                    .accounts(Some(provider))?
                    .into_iter()
                    .filter(|a| snapshot.contains(&a.id))
                    .collect(),
            };
            let candidates: Vec<Candidate> = states
                .iter()
                .map(|a| Candidate {
                    id: a.id.clone(),
                    tier: policy::tier(a, ctx.family, threshold, now),
                    held: a.held(now),
                })
                .collect();
            let Some((id, role)) = policy::choose(Selection {
                candidates: &candidates,
                attempted: &attempted,
                pinned: pin.as_ref().map(|p| p.account.as_str()),
                inherited: inherited.as_deref(),
                cursor: cursor.as_deref(),
                previous: previous.as_deref(),
            }) else {
                if !rechecked && failure.is_none() {
                    rechecked = true;
                    if self
                        .recheck_exhausted(provider, &states, ctx.family, s)
                        .await?
                    {
                        continue;
                    }
                }
                break;
            };
            if let (Some(key), None) = (ctx.key, &pin) {
                let why = if role == Role::Inherited {
                    "inherited from its parent session"
                } else {
                    "pinned on first success"
                };
                let seen = self.store.claim_pin(
                    provider,
                    key,
                    &id,
                    Some(thread),
                    now,
                    s.pin_lifetime_ms,
                    s.pin_cap,
                    why,
                )?;
                let other = seen.account != id;
                pin = Some(seen);
                if other {
                    // A concurrent request of the same new session claimed it first: follow it.
                    continue;
                }
            }
            let Some(state) = states.iter().find(|a| a.id == id) else {
                break;
            };
            if let Some(until) = state.unusable_until(now) {
                // Only the pin is chosen while held: wait out a short hold once, else detour.
                let remaining = until - now;
                if remaining <= s.inline_wait_ms && !waited.contains(&id) {
                    if let Raced::Gone = unless_gone(self.env, self.env.sleep(remaining)).await {
                        self.note_attempt(ctx, self.env.now(), &id, None, CANCELLED)?;
                        return self.cancelled(ctx, pin.as_ref(), Some(&id));
                    }
                    waited.push(id);
                    continue;
                }
                attempted.push(id.clone());
                outcomes.push((id.clone(), AttemptOutcome::Hold));
                failure = Some(hold_failure(state, until, now));
                self.note_attempt(ctx, now, &id, None, AttemptOutcome::Hold.as_str())?;
                previous = Some(id);
                continue;
            }
            attempted.push(id.clone());
            previous = Some(id.clone());
            match self.attempt(ctx, state, &mut waited).await? {
                Attempt::Respond { response, served } => {
                    let now = self.env.now();
                    // What this outcome changes is one commit (one WAL write, one lock).
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        let mut outcome = if served { "served" } else { "passed-through" };
                        if served {
                            let detour = self.commit(
                                ctx,
                                thread,
                                &id,
                                pin.as_ref(),
                                cursor.as_deref(),
                                &outcomes,
                                now,
                            )?;
                            if detour {
                                outcome = "detour";
                            }
                        } else if let Some(p) = pin.as_ref().filter(|p| p.claimed) {
                            store.release_claim(
                                provider,
                                ctx.key.unwrap_or_default(),
                                p.generation,
                            )?;
                        }
                        self.note_attempt(ctx, now, &id, Some(response.status), outcome)
                    })?;
                    return Ok(self.relay(ctx, &id, response));
                }
                Attempt::Cancelled { status } => {
                    // Recorded, and nothing else: no pin, cursor or failure of this request
                    // is committed.
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        self.note_attempt(ctx, self.env.now(), &id, status, CANCELLED)
                    })?;
                    return self.cancelled(ctx, pin.as_ref(), Some(&id));
                }
                Attempt::Failed {
                    outcome,
                    failure: f,
                } => {
                    self.store.tx(|store| {
                        store.touch_account(&id, state.last_used_at, self.last_try.get())?;
                        self.note_attempt(
                            ctx,
                            self.env.now(),
                            &id,
                            f.as_ref().map(|f| f.status),
                            outcome.as_str(),
                        )
                    })?;
                    outcomes.push((id, outcome));
                    if f.is_some() {
                        failure = f;
                    }
                }
            }
        }

        // Nothing served: commit nothing.
        if let (Some(key), Some(p)) = (ctx.key, pin.as_ref().filter(|p| p.claimed)) {
            self.store.release_claim(provider, key, p.generation)?;
        }
        let now = self.env.now();
        let error = match failure {
            Some(f) => f,
            None => {
                let states = self.store.accounts(Some(provider))?;
                let verdict = policy::verdict(&states, ctx.family, threshold, now);
                let mut error = policy::no_eligible_response(verdict, now);
                if token_held_only(&states, now) {
                    // Every usable account is held because the upstream refused its fresh
                    // token: an upstream failure, answered 503 (at the same retry time).
                    error.status = 503;
                    error.message = format!(
                        "{} refused the pool's sign-ins; Account Pooler is holding them.",
                        provider.upstream_name()
                    );
                }
                error
            }
        };
        Ok(Response::pool(provider, &error))
    }

    /// Stop a request whose client went away: release the pin it claimed (a cancelled
    /// request pins nothing), say so in one log line, and answer something nobody reads.
    fn cancelled(
        &self,
        ctx: &Ctx<'_>,
        pin: Option<&PinSeen>,
        account: Option<&str>,
    ) -> Result<Response<U::Body>, DbError> {
        if let (Some(key), Some(p)) = (ctx.key, pin.filter(|p| p.claimed)) {
            self.store.release_claim(ctx.provider, key, p.generation)?;
        }
        self.env.log(
            Level::Info,
            CANCELLED_MESSAGE,
            &[
                ("provider", ctx.provider.to_string()),
                ("account", account.unwrap_or("none").to_owned()),
                ("attempts", self.sends.get().to_string()),
            ],
        );
        Ok(Response::pool(
            ctx.provider,
            &PoolError::pool(
                499,
                "The client closed the request; Account Pooler stopped it.",
            ),
        ))
    }

    /// Apply the commit rule after a success on `served`. Returns whether it was a detour
    /// (the session stays pinned elsewhere).
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        ctx: &Ctx<'_>,
        thread: &str,
        served: &str,
        pin: Option<&PinSeen>,
        cursor: Option<&str>,
        outcomes: &[(String, AttemptOutcome)],
        now: u64,
    ) -> Result<bool, DbError> {
        let s = ctx.settings;
        let threshold = s.switch_threshold;
        let outcome_of = |id: &str| {
            outcomes
                .iter()
                .rev()
                .find(|(a, _)| a == id)
                .map(|(_, o)| *o)
        };
        let gone = |id: &str| -> Result<bool, DbError> {
            Ok(policy::gone_for_good(
                self.store.account(id)?.as_ref(),
                outcome_of(id),
                threshold,
                now,
            ))
        };
        let mut detour = false;
        if let Some(key) = ctx.key {
            let pinned_gone = match pin {
                Some(p) if p.account != served && !p.claimed => gone(&p.account)?,
                _ => false,
            };
            match policy::pin_action(true, pin, served, pinned_gone) {
                PinAction::Touch => {
                    if let Some(p) = pin.filter(|p| p.touch_due(now, TOUCH_GRANULARITY_MS)) {
                        self.store.touch_pin(ctx.provider, key, p.generation, now)?;
                    }
                }
                PinAction::Bind => {
                    let why = match pin {
                        Some(p) if !p.claimed => {
                            let reason = outcome_of(&p.account)
                                .filter(|o| o.is_lasting())
                                .map_or("no longer usable", AttemptOutcome::as_str);
                            format!("re-pinned: previous account {} ({reason})", p.account)
                        }
                        _ => "pinned on first success".to_owned(),
                    };
                    self.store.bind_pin(
                        ctx.provider,
                        key,
                        served,
                        Some(thread),
                        pin.map(|p| p.generation),
                        now,
                        s.pin_lifetime_ms,
                        &why,
                        s.pin_cap,
                    )?;
                }
                PinAction::Keep => detour = pin.is_some(),
            }
        }
        let cursor_gone = match cursor {
            Some(c) if c != served => gone(c)?,
            _ => false,
        };
        if policy::cursor_moves(cursor, served, cursor_gone) {
            self.store.cas_cursor(ctx.provider, cursor, served)?;
        }
        Ok(detour)
    }

    fn note_attempt(
        &self,
        ctx: &Ctx<'_>,
        at: u64,
        account: &str,
        status: Option<u16>,
        outcome: &str,
    ) -> Result<(), DbError> {
        match ctx.key {
            Some(key) => self
                .store
                .record_attempt(ctx.provider, key, at, account, status, outcome),
            None => Ok(()),
        }
    }

    fn relay(
        &self,
        ctx: &Ctx<'_>,
        account: &str,
        response: UpstreamResponse<U::Body>,
    ) -> Response<U::Body> {
        let mut headers = Headers::new();
        for (n, v) in response.headers.iter() {
            if http::forward_response_header(n) {
                headers.push(n, v);
            }
        }
        let relay = Relay::new(
            response.body,
            ctx.provider,
            response.headers.get("content-type"),
        )
        .for_account(account);
        Response {
            status: response.status,
            headers,
            body: Body::Stream(relay),
        }
    }

    /// One account: send, classify, and retry the same account where the outcome table
    /// says so (transient failures with backoff, one short-429 wait, one token refresh).
    /// Every wait and upstream call races against the client's leaving, except a token
    /// refresh, whose answer must be stored.
    async fn attempt(
        &self,
        ctx: &Ctx<'_>,
        state: &AccountState,
        waited: &mut Vec<String>,
    ) -> Result<Attempt<U::Body>, DbError> {
        let s = ctx.settings;
        let id = state.id.as_str();
        let upstream_name = ctx.provider.upstream_name();
        let mut retries = 0u32;
        let mut slept = 0u64;
        let mut refreshed = false;
        // The last answer the account gave this attempt (what a cancelled one records).
        let mut status: Option<u16> = None;
        loop {
            if self.env.gone() {
                return Ok(Attempt::Cancelled { status });
            }
            let now = self.env.now();
            self.last_try.set(now);
            // A token refresh started here runs to its end even if the client leaves
            // meanwhile: the endpoint may already have spent the old refresh token, and
            // only storing its answer keeps the account signed in.
            let credential = match self.usable_credential(ctx.provider, state, s).await? {
                Ok(c) => c,
                // Whatever kept the credential from us, the client's leaving comes first.
                Err(_) if self.env.gone() => return Ok(Attempt::Cancelled { status }),
                Err(failed) => return Ok(failed),
            };
            if self.env.gone() {
                return Ok(Attempt::Cancelled { status });
            }
            let request = self.upstream_request(ctx, &credential);
            self.sends.set(self.sends.get() + 1);
            status = None;
            // Dropped unanswered when the client goes: wasi:http then aborts the request.
            let sent = match unless_gone(self.env, self.upstream.send(request)).await {
                Raced::Done(sent) => sent,
                Raced::Gone => return Ok(Attempt::Cancelled { status: None }),
            };
            let now = self.env.now();
            let mut response = match sent {
                Ok(r) => r,
                Err(TransportError(code)) => {
                    self.env.log(
                        Level::Warn,
                        "Account Pooler upstream transport failed",
                        &[
                            ("provider", ctx.provider.to_string()),
                            ("account", id.to_owned()),
                            ("error", code),
                        ],
                    );
                    let failure = PoolError::pool(
                        502,
                        format!("Account Pooler could not reach {upstream_name}."),
                    );
                    match self.transient_retry(s, &mut retries, &mut slept).await {
                        Backoff::Retry => continue,
                        Backoff::Gone => return Ok(Attempt::Cancelled { status }),
                        Backoff::GiveUp => {}
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(failure),
                    });
                }
            };
            status = Some(response.status);
            let obs = match ctx.provider {
                Provider::Claude => quota::parse_claude_headers(&response.headers, now),
                Provider::Codex => quota::parse_codex_headers(&response.headers, now),
            };
            self.observe(ctx.provider, id, &obs, s.switch_threshold, now)?;
            match policy::classify(response.status, &obs, ctx.family, now) {
                Classified::Served => {
                    return Ok(Attempt::Respond {
                        response,
                        served: true,
                    });
                }
                Classified::PassThrough => {
                    return Ok(Attempt::Respond {
                        response,
                        served: false,
                    });
                }
                Classified::Quota => {
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Quota,
                        failure: None,
                    });
                }
                Classified::Family => {
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Family,
                        failure: None,
                    });
                }
                Classified::Transient => {
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    match self.transient_retry(s, &mut retries, &mut slept).await {
                        Backoff::Retry => continue,
                        Backoff::Gone => return Ok(Attempt::Cancelled { status }),
                        Backoff::GiveUp => {}
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(failure),
                    });
                }
                Classified::RateLimited => {
                    let wait = quota::parse_retry_after(response.headers.get("retry-after"), now);
                    // The hold is the upstream's word about the account, not this request's
                    // doing: it stays even if the client leaves during the wait.
                    self.store.set_hold(id, now + wait, HoldKind::RateLimit)?;
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    if wait <= s.inline_wait_ms && !waited.iter().any(|w| w == id) {
                        waited.push(id.to_owned());
                        if let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await {
                            return Ok(Attempt::Cancelled { status });
                        }
                        continue;
                    }
                    return Ok(Attempt::Failed {
                        outcome: AttemptOutcome::Hold,
                        failure: Some(failure),
                    });
                }
                Classified::AuthRefused => {
                    let Raced::Done(failure) =
                        unless_gone(self.env, upstream_failure(&mut response, now)).await
                    else {
                        return Ok(Attempt::Cancelled { status });
                    };
                    match &credential {
                        Credential::ApiKey(_) => {
                            let text =
                                format!("{upstream_name} refused the API key: {}", failure.message);
                            if self.store.set_error(id, &text)? {
                                self.store
                                    .push_signal(ctx.provider, ChangeCause::ErrorSet, now)?;
                            }
                            return Ok(Attempt::Failed {
                                outcome: AttemptOutcome::Auth,
                                failure: Some(failure),
                            });
                        }
                        Credential::OAuth(tokens) if !refreshed => {
                            match self.refresh(ctx.provider, id, tokens, s).await? {
                                Refreshed::Tokens(_) => {
                                    refreshed = true;
                                    continue;
                                }
                                Refreshed::Refused(status) => {
                                    // The upstream refused the token and the refresh is refused too.
                                    if self.store.access_token(id)?.as_deref()
                                        == Some(tokens.access_token.as_str())
                                    {
                                        self.mark_error(
                                            ctx.provider,
                                            id,
                                            &format!("OAuth refresh failed with HTTP {status}."),
                                            now,
                                        )?;
                                    }
                                    return Ok(Attempt::Failed {
                                        outcome: AttemptOutcome::Auth,
                                        failure: Some(failure),
                                    });
                                }
                                // It stopped waiting for another request's refresh.
                                Refreshed::Transient(_) if self.env.gone() => {
                                    return Ok(Attempt::Cancelled { status });
                                }
                                Refreshed::Transient(_) => {
                                    let f = PoolError::pool(
                                        503,
                                        format!(
                                            "Account Pooler could not refresh the {upstream_name} sign-in; try again shortly."
                                        ),
                                    );
                                    return Ok(Attempt::Failed {
                                        outcome: AttemptOutcome::Transient,
                                        failure: Some(f),
                                    });
                                }
                            }
                        }
                        Credential::OAuth(tokens) => {
                            // Refused again with a fresh token: not an auth error; hold that token.
                            if self.store.access_token(id)?.as_deref()
                                == Some(tokens.access_token.as_str())
                            {
                                self.store
                                    .set_hold(id, now + s.token_hold_ms, HoldKind::Token)?;
                            }
                            let f = PoolError::pool(
                                503,
                                format!(
                                    "{upstream_name} refused a freshly refreshed token; treating it as an upstream failure: {}",
                                    failure.message
                                ),
                            );
                            return Ok(Attempt::Failed {
                                outcome: AttemptOutcome::Hold,
                                failure: Some(f),
                            });
                        }
                    }
                }
            }
        }
    }

    /// Wait before another same-account try after a transient failure, if the retry limit
    /// and the inline wait allow, unless the client goes away first.
    async fn transient_retry(&self, s: &Settings, retries: &mut u32, slept: &mut u64) -> Backoff {
        if *retries >= s.transient_retries {
            return Backoff::GiveUp;
        }
        let wait = s.backoff(*retries);
        if *slept + wait > s.inline_wait_ms {
            return Backoff::GiveUp;
        }
        *retries += 1;
        *slept += wait;
        if wait > 0
            && let Raced::Gone = unless_gone(self.env, self.env.sleep(wait)).await
        {
            return Backoff::Gone;
        }
        Backoff::Retry
    }

    /// Merge a quota observation and queue a signal when it moved the account's blocking
    /// time.
    pub fn observe(
        &self,
        provider: Provider,
        id: &str,
        obs: &Observation,
        threshold: f64,
        now: u64,
    ) -> Result<(), DbError> {
        if obs.is_empty() {
            return Ok(());
        }
        let Some(mut state) = self.store.account(id)? else {
            return Ok(());
        };
        let before = policy::blocked_until(&state, None, threshold, now);
        state.quota.merge(obs);
        self.store.save_quota(id, &state.quota)?;
        let after = policy::blocked_until(&state, None, threshold, now);
        let cause = match (before, after) {
            (Some(_), None) => Some(ChangeCause::EarlierResetObserved),
            (None, Some(_)) => Some(ChangeCause::LaterResetObserved),
            (Some(Some(b)), Some(Some(a))) if a < b => Some(ChangeCause::EarlierResetObserved),
            (Some(Some(b)), Some(Some(a))) if a > b => Some(ChangeCause::LaterResetObserved),
            _ => None,
        };
        if let Some(c) = cause {
            self.store.push_signal(provider, c, now)?;
        }
        Ok(())
    }

    /// When nothing is eligible, re-fetch the usage of exhausted OAuth accounts not
    /// fetched in the last 30 s (their windows may have been lifted early). Returns whether
    /// any was fetched.
    async fn recheck_exhausted(
        &self,
        provider: Provider,
        states: &[AccountState],
        family: Option<Family>,
        s: &Settings,
    ) -> Result<bool, DbError> {
        let mut fetched = false;
        for a in states {
            let now = self.env.now();
            let exhausted = matches!(
                policy::tier(a, family, s.switch_threshold, now),
                policy::Tier::Refused(
                    policy::Refusal::SharedExhausted
                        | policy::Refusal::FamilyExhausted
                        | policy::Refusal::Restricted
                )
            );
            if a.kind != crate::model::CredentialKind::OAuth || !exhausted {
                continue;
            }
            let last = self.store.refresh_state(&a.id)?.last_usage_at;
            if last.is_some_and(|t| now < t + EXHAUSTED_RECHECK_MS) {
                continue;
            }
            if self
                .refresh_usage_signed_in(provider, &a.id, s)
                .await?
                .is_ok()
            {
                fetched = true;
            }
        }
        Ok(fetched)
    }

    /// [`Engine::refresh_usage`], and when the usage endpoint refuses the access token
    /// (401), one token refresh and one more fetch with the new token. A refused refresh
    /// is the caller's to judge ([`UsageFailure::SignInRefused`]).
    pub async fn refresh_usage_signed_in(
        &self,
        provider: Provider,
        id: &str,
        s: &Settings,
    ) -> Result<Result<(), UsageFailure>, DbError> {
        match self.refresh_usage(provider, id, s).await? {
            Err(UsageFailure::Unauthorized(status)) => {
                let Some(Credential::OAuth(tokens)) = self.store.credential(id)? else {
                    return Ok(Err(UsageFailure::Unauthorized(status)));
                };
                self.env.log(
                    Level::Info,
                    "Account Pooler usage endpoint refused the access token; refreshing it",
                    &[("account", id.to_owned()), ("status", status.to_string())],
                );
                match self.refresh(provider, id, &tokens, s).await? {
                    Refreshed::Tokens(_) => self.refresh_usage(provider, id, s).await,
                    Refreshed::Refused(status) => Ok(Err(UsageFailure::SignInRefused(status))),
                    Refreshed::Transient(detail) => Ok(Err(UsageFailure::Other(format!(
                        "the token refresh after the usage endpoint's HTTP {status} did not complete: {detail}"
                    )))),
                }
            }
            other => Ok(other),
        }
    }

    /// Fetch an OAuth account's usage from its provider's usage endpoint and merge it.
    /// `Err` (inside `Ok`) says why nothing was merged; API-key accounts have no usage
    /// endpoint.
    pub async fn refresh_usage(
        &self,
        provider: Provider,
        id: &str,
        s: &Settings,
    ) -> Result<Result<(), UsageFailure>, DbError> {
        let Some(Credential::OAuth(tokens)) = self.store.credential(id)? else {
            return Ok(Err(UsageFailure::Other(
                "API-key accounts have no usage endpoint".into(),
            )));
        };
        let now = self.env.now();
        self.store.set_last_usage(id, now)?;
        let mut headers = Headers::new();
        headers.push("authorization", format!("Bearer {}", tokens.access_token));
        headers.push("accept", "application/json");
        let url = match provider {
            Provider::Claude => {
                headers.push("anthropic-beta", http::OAUTH_BETA);
                format!(
                    "{}/api/oauth/usage",
                    s.claude_upstream_url.trim_end_matches('/')
                )
            }
            Provider::Codex => {
                if let Some(acct) = &tokens.chatgpt_account_id {
                    headers.push("chatgpt-account-id", acct.as_str());
                }
                headers.push("originator", "pooler");
                codex_usage_url(&s.codex_upstream_url)
            }
        };
        let request = UpstreamRequest {
            method: "GET".into(),
            url,
            headers,
            body: bytes::Bytes::new(),
            deadlines: Deadlines::SERVICE,
        };
        let mut response = match self.upstream.send(request).await {
            Ok(r) => r,
            Err(TransportError(e)) => {
                return Ok(Err(UsageFailure::Other(format!(
                    "usage endpoint unreachable: {e}"
                ))));
            }
        };
        if response.status == 401 {
            return Ok(Err(UsageFailure::Unauthorized(response.status)));
        }
        if !(200..300).contains(&response.status) {
            return Ok(Err(UsageFailure::Other(format!(
                "usage endpoint answered HTTP {}",
                response.status
            ))));
        }
        let body = stream::read_to_end(&mut response.body, 256 * 1024)
            .await
            .unwrap_or_default();
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return Ok(Err(UsageFailure::Other(
                "usage endpoint answered with unreadable JSON".into(),
            )));
        };
        let now = self.env.now();
        let obs = match provider {
            Provider::Claude => quota::parse_claude_usage(&json, now),
            Provider::Codex => quota::parse_codex_usage(&json, now),
        };
        self.observe(provider, id, &obs, s.switch_threshold, now)?;
        Ok(Ok(()))
    }

    fn mark_error(
        &self,
        provider: Provider,
        id: &str,
        text: &str,
        now: u64,
    ) -> Result<(), DbError> {
        if self.store.set_error(id, text)? {
            self.store
                .push_signal(provider, ChangeCause::ErrorSet, now)?;
        }
        Ok(())
    }

    /// The credential to send now, refreshing an OAuth token that expires soon (§8). A
    /// refused proactive refresh keeps a valid token serving with the sign-in flag (#6167).
    async fn usable_credential(
        &self,
        provider: Provider,
        state: &AccountState,
        s: &Settings,
    ) -> Result<Result<Credential, Attempt<U::Body>>, DbError> {
        let id = state.id.as_str();
        let upstream_name = provider.upstream_name();
        let Some(credential) = self.store.credential(id)? else {
            let now = self.env.now();
            self.mark_error(provider, id, "The account's secret is missing.", now)?;
            return Ok(Err(Attempt::Failed {
                outcome: AttemptOutcome::Auth,
                failure: None,
            }));
        };
        let Credential::OAuth(tokens) = &credential else {
            return Ok(Ok(credential));
        };
        let now = self.env.now();
        let rs = self.store.refresh_state(id)?;
        let backing_off = rs.retry_at.is_some_and(|t| t > now);
        match oauth::need(tokens.expires_at, now) {
            Need::None => Ok(Ok(credential)),
            Need::Proactive if backing_off => Ok(Ok(credential)),
            Need::Proactive => match self.refresh(provider, id, tokens, s).await? {
                Refreshed::Tokens(t) => Ok(Ok(Credential::OAuth(t))),
                Refreshed::Refused(_) | Refreshed::Transient(_) => Ok(Ok(credential)),
            },
            Need::Expired if backing_off && rs.failure.as_deref() == Some("transient") => {
                let f = PoolError::pool(
                    503,
                    format!(
                        "The {upstream_name} sign-in of this account is being refreshed; try again shortly."
                    ),
                );
                Ok(Err(Attempt::Failed {
                    outcome: AttemptOutcome::Transient,
                    failure: Some(f),
                }))
            }
            Need::Expired => match self.refresh(provider, id, tokens, s).await? {
                Refreshed::Tokens(t) => Ok(Ok(Credential::OAuth(t))),
                Refreshed::Refused(status) => {
                    let now = self.env.now();
                    self.mark_error(
                        provider,
                        id,
                        &format!("OAuth refresh failed with HTTP {status}."),
                        now,
                    )?;
                    let f = PoolError::pool(
                        401,
                        format!(
                            "The {upstream_name} sign-in of this account expired and could not be refreshed."
                        ),
                    );
                    Ok(Err(Attempt::Failed {
                        outcome: AttemptOutcome::Auth,
                        failure: Some(f),
                    }))
                }
                Refreshed::Transient(_) => {
                    let f = PoolError::pool(
                        503,
                        format!(
                            "Account Pooler could not refresh the {upstream_name} sign-in; try again shortly."
                        ),
                    );
                    Ok(Err(Attempt::Failed {
                        outcome: AttemptOutcome::Transient,
                        failure: Some(f),
                    }))
                }
            },
        }
    }

    /// Refresh an account's OAuth token, one refresh in flight per account across every
    /// instance (a lease row). A caller that finds another refresh running waits for it
    /// and uses its token. `old` is the token the caller holds: if the stored one already
    /// differs, it is used without another refresh.
    pub async fn refresh(
        &self,
        provider: Provider,
        id: &str,
        old: &OAuthTokens,
        s: &Settings,
    ) -> Result<Refreshed, DbError> {
        let owner = new_id(self.env);
        let started = self.env.now();
        loop {
            let now = self.env.now();
            if self
                .store
                .try_lease(id, &owner, now, now + oauth::LEASE_MS)?
            {
                break;
            }
            if now >= started + oauth::LEASE_MS {
                return Ok(Refreshed::Transient(
                    "another token refresh is still running".into(),
                ));
            }
            // Waiting for another request's refresh is this request's own work: it stops
            // when its client goes (the caller sees the client gone and records that).
            if let Raced::Gone = unless_gone(self.env, self.env.sleep(REFRESH_POLL_MS)).await {
                return Ok(Refreshed::Transient("the client went away".into()));
            }
            if let Some(Credential::OAuth(t)) = self.store.credential(id)?
                && t.access_token != old.access_token
            {
                return Ok(Refreshed::Tokens(t));
            }
        }
        let result = self.refresh_with_lease(provider, id, old, s).await;
        self.store.release_lease(id, &owner)?;
        result
    }

    async fn refresh_with_lease(
        &self,
        provider: Provider,
        id: &str,
        old: &OAuthTokens,
        s: &Settings,
    ) -> Result<Refreshed, DbError> {
        let current = match self.store.credential(id)? {
            Some(Credential::OAuth(t)) => t,
            _ => {
                return Ok(Refreshed::Transient(
                    "the account has no OAuth credential".into(),
                ));
            }
        };
        if current.access_token != old.access_token {
            return Ok(Refreshed::Tokens(current));
        }
        let mut headers = Headers::new();
        headers.push("content-type", "application/json");
        headers.push("accept", "application/json");
        let request = UpstreamRequest {
            method: "POST".into(),
            url: s.token_url(provider).to_owned(),
            headers,
            body: oauth::refresh_request_body(provider, &current.refresh_token).into(),
            deadlines: Deadlines::SERVICE,
        };
        let sent = self.upstream.send(request).await;
        let now = self.env.now();
        let result = match sent {
            Err(TransportError(e)) => RefreshResult::Transient {
                retry_after_ms: None,
                detail: e,
            },
            Ok(mut r) => {
                let ra = quota::retry_after_ms(r.headers.get("retry-after"), now);
                let body = stream::read_to_end(&mut r.body, 64 * 1024)
                    .await
                    .unwrap_or_default();
                oauth::parse_refresh_response(r.status, &body, ra, &current, now)
            }
        };
        let rs = self.store.refresh_state(id)?;
        Ok(match result {
            RefreshResult::Refreshed(tokens) => {
                self.store
                    .put_credential(id, &Credential::OAuth(tokens.clone()))?;
                self.store.clear_refresh_failure(id)?;
                if self.store.clear_error(id)? {
                    self.store
                        .push_signal(provider, ChangeCause::ErrorCleared, now)?;
                }
                Refreshed::Tokens(tokens)
            }
            RefreshResult::Refused(status) => {
                let backoff = oauth::next_backoff(rs.backoff_ms, None);
                self.store
                    .set_refresh_failure(id, "refused", backoff, now + backoff)?;
                let valid = current.expires_at.is_none_or(|t| t > now);
                if oauth::on_refused(valid) == RefusedEffect::KeepServing {
                    self.store.set_needs_sign_in(id, true)?;
                }
                self.env.log(
                    Level::Warn,
                    "Account Pooler OAuth refresh refused",
                    &[("account", id.to_owned()), ("status", status.to_string())],
                );
                Refreshed::Refused(status)
            }
            RefreshResult::Transient {
                retry_after_ms,
                detail,
            } => {
                let backoff = oauth::next_backoff(rs.backoff_ms, retry_after_ms);
                self.store
                    .set_refresh_failure(id, "transient", backoff, now + backoff)?;
                Refreshed::Transient(detail)
            }
        })
    }

    fn upstream_request(&self, ctx: &Ctx<'_>, credential: &Credential) -> UpstreamRequest {
        let mut headers = Headers::new();
        for (n, v) in ctx.req.headers.iter() {
            if http::forward_request_header(ctx.provider, n) {
                headers.push(n, v);
            }
        }
        match credential {
            Credential::ApiKey(k) => headers.set("x-api-key", k.as_str()),
            Credential::OAuth(t) => {
                headers.set("authorization", format!("Bearer {}", t.access_token));
                if ctx.provider == Provider::Claude {
                    // Subscription tokens are accepted on the Messages API only with this beta.
                    let betas = http::with_oauth_beta(
                        ctx.req
                            .headers
                            .iter()
                            .filter(|(n, _)| n.eq_ignore_ascii_case("anthropic-beta"))
                            .map(|(_, v)| v),
                    );
                    headers.set("anthropic-beta", betas);
                }
                if let Some(acct) = &t.chatgpt_account_id {
                    headers.set("chatgpt-account-id", acct.as_str());
                }
            }
        }
        UpstreamRequest {
            method: ctx.req.method.to_ascii_uppercase(),
            url: http::upstream_url(
                ctx.provider,
                ctx.settings.upstream_url(ctx.provider),
                &ctx.req.path,
                ctx.req.query.as_deref(),
            ),
            headers,
            body: ctx.req.body.clone(),
            deadlines: Deadlines::MODEL,
        }
    }
}

/// Codex's usage endpoint: the `…/backend-api/wham/usage` beside the Codex API base
/// (`…/backend-api/codex`); for another base, `<base>/wham/usage`.
pub fn codex_usage_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    let root = base.strip_suffix("/codex").unwrap_or(base);
    format!("{root}/wham/usage")
}

/// Whether the enabled, error-free accounts are all held, and all by token holds.
fn token_held_only(states: &[AccountState], now: u64) -> bool {
    let mut live = states
        .iter()
        .filter(|a| a.enabled && a.error.is_none())
        .peekable();
    live.peek().is_some() && live.all(|a| a.held(now) && a.hold_kind == Some(HoldKind::Token))
}

/// The failure a held account stands for: 429 with the hold's Retry-After, or 503 for a
/// token hold.
fn hold_failure(state: &AccountState, until: u64, now: u64) -> PoolError {
    match state.hold_kind {
        Some(HoldKind::Token) => PoolError::pool(
            503,
            "The account's sign-in was refused upstream; Account Pooler is holding it.",
        ),
        _ => PoolError::pool(
            429,
            "The current Account Pooler account is temporarily rate limited.",
        )
        .with_retry_after(policy::retry_after_secs(until, now)),
    }
}

/// A failed upstream answer as the client would see it if nothing else serves: its
/// status, its detail (≤ 1 KiB) and its Retry-After.
async fn upstream_failure<B: BodyStream>(
    response: &mut UpstreamResponse<B>,
    now: u64,
) -> PoolError {
    let body = stream::read_prefix(&mut response.body, DETAIL_LIMIT).await;
    let message = http::upstream_detail(&body)
        .unwrap_or_else(|| format!("upstream returned HTTP {}.", response.status));
    PoolError {
        status: response.status,
        message,
        retry_after_secs: quota::retry_after_ms(response.headers.get("retry-after"), now)
            .map(|ms| ms.div_ceil(1000).max(1)),
        pool_origin: false,
    }
}

#[cfg(test)]
mod tests;
