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
//!
//! | part | owns |
//! |---|---|
//! | [`ports`] | the traits the engine reaches the outside through, upstream request and response |
//! | [`admission`] | screening a request's head, and the one read a routed request starts from |
//! | [`routing`] | the attempt loop over accounts, holds, pins and the cursor, the final failure |
//! | [`attempt`] | one account: send, hold a served stream's head for its first event, classify, same-account retries |
//! | [`credentials`] | the credential to send, OAuth refreshes under a lease |
//! | [`usage`] | quota observations and their signals, usage endpoint fetches |
//! | this file | the engine, the client's request and response, cancellation |

mod admission;
mod attempt;
mod credentials;
mod ports;
mod report;
mod routing;
mod usage;

pub use admission::{Admitted, BODY_OUT_OF_MEMORY, HEAD_READ_FRESH_MS, Screen, not_allowed};
pub use credentials::Refreshed;
pub use ports::{
    Cancel, Clock, Deadlines, Level, Log, Random, TransportError, Upstream, UpstreamRequest,
    UpstreamResponse, new_id,
};
pub use report::{REQUEST_MESSAGE, session_hash};
pub use usage::{EXHAUSTED_RECHECK_MS, UsageFailure, codex_usage_url};

use crate::body::{Refused, RequestBody};
use crate::http::{self, Headers, PoolError, RouteMatch};
use crate::model::{Family, Provider};
use crate::settings::Settings;
use crate::store::Store;
use crate::stream::{BodyStream, Relay};
use pooler_plugin_kit::Db;

/// The log line of a request the pool stopped because its client went away.
pub const CANCELLED_MESSAGE: &str = "Account Pooler request cancelled: the client went away";

/// The warning of bookkeeping about an upstream answer that could not be written (its
/// fields: `account`, `lost`, `error`, `tries`); the answer went to the client all the same.
pub const BOOKKEEPING_LOST_MESSAGE: &str =
    "Account Pooler could not record an upstream answer; the client got it all the same";

/// How many times bookkeeping about an upstream answer is tried before it is given up
/// (each try may wait out the database's busy timeout).
const BOOKKEEPING_TRIES: u32 = 2;

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

/// The warning of token usage that could not be written (its fields: `account`, `error`);
/// the answer reached the client all the same.
pub const TOKENS_LOST_MESSAGE: &str = "Account Pooler could not record an answer's token usage";

/// Record what a relayed answer reported of its tokens, once its relay ended or was
/// dropped (the client went away: what came before counts, as the provider bills it):
/// the `tokens` table, and the counter `pooler_pool_tokens_total{provider,account,kind}`.
/// One write; a failure is a warning, never the client's concern.
pub fn record_tokens<B: BodyStream>(
    db: &impl Db,
    env: &(impl Clock + Log + pooler_plugin_kit::Metrics),
    relay: &mut Relay<B>,
) {
    let Some(reported) = relay.tally() else {
        return;
    };
    let counts = reported.tally.counts;
    for (kind, n) in counts.kinds() {
        env.counter_add(
            "pooler_pool_tokens_total",
            &[
                ("provider", reported.provider.as_str()),
                ("account", &reported.account),
                ("kind", kind),
            ],
            n,
        );
    }
    let written = Store::new(db).record_tokens(
        env.now(),
        reported.provider,
        &reported.account,
        reported.thread.as_deref(),
        reported.tally.model.as_deref(),
        &counts,
    );
    if let Err(e) = written {
        env.log(
            Level::Warn,
            TOKENS_LOST_MESSAGE,
            &[
                ("account", reported.account.clone()),
                ("error", e.to_string()),
            ],
        );
    }
}

/// The client's request, with its body read (bounded by the glue).
#[derive(Debug, Clone, PartialEq)]
pub struct IncomingRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: Headers,
    pub body: RequestBody,
    /// Why the glue did not take the body whole, when it did not (the request gets 413;
    /// `body` is then empty).
    pub body_refused: Option<Refused>,
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
    /// The in-flight lease of the account whose answer this is (an account with an
    /// in-flight limit): the caller ends it ([`end_flight`]) once the body has been relayed
    /// or dropped. Left unended, it expires by itself ([`crate::store::FLIGHT_LEASE_MS`]).
    pub lease: Option<String>,
}

impl<B> Response<B> {
    fn pool(provider: Provider, e: &PoolError) -> Self {
        Response {
            status: e.status,
            headers: e.headers(),
            body: Body::Full(e.body(provider)),
            lease: None,
        }
    }
}

/// End the in-flight lease a [`Response`] carried, once its body is relayed or dropped.
pub fn end_flight(db: &impl Db, lease: &str) -> Result<(), pooler_plugin_kit::DbError> {
    Store::new(db).end_flight_lease(lease)
}

/// The engine, borrowing its capabilities for one call.
pub struct Engine<
    'a,
    D: Db,
    U: Upstream,
    E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics,
> {
    store: Store<'a, D>,
    upstream: &'a U,
    env: &'a E,
    /// The route and settings [`Engine::screen`] read for this request (read here
    /// otherwise).
    admitted: Option<Admitted>,
}

/// One routed request as it passes from phase to phase: the facts every attempt needs,
/// and what the request has come to so far. It lives for the one request; the engine
/// holds only the capabilities.
struct Ctx<'r> {
    provider: Provider,
    req: &'r IncomingRequest,
    family: Option<Family>,
    key: Option<&'r str>,
    settings: &'r Settings,
    /// The secret the request's read took along for the account it will most likely try
    /// first, and when it was read; taken by the request's first try.
    secret: std::cell::Cell<Option<(u64, crate::store::Secret)>>,
    /// When the current attempt last tried its account: the account's "last used" time,
    /// written with the attempt's outcome.
    last_try: std::cell::Cell<u64>,
    /// Upstream calls this request has made (for the log line of a cancelled request).
    sends: std::cell::Cell<u32>,
    /// The request's one log line and its metrics, written when its answer is ready.
    report: &'r std::cell::RefCell<report::Report>,
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    pub fn new(db: &'a D, upstream: &'a U, env: &'a E) -> Self {
        Engine {
            store: Store::new(db),
            upstream,
            env,
            admitted: None,
        }
    }

    /// Serve the request `admitted` was screened from with what the screen read, instead
    /// of reading it again.
    pub fn with_admitted(mut self, admitted: Admitted) -> Self {
        self.admitted = Some(admitted);
        self
    }

    /// Serve one client request. Storage failures become the pool's own 503, except those
    /// of bookkeeping about an upstream answer in hand, which is tried again and then
    /// given up with a warning ([`BOOKKEEPING_LOST_MESSAGE`]) so the answer reaches the
    /// client. When the
    /// answer's head is ready the request's one log line and its metrics are written
    /// ([`report`]).
    pub async fn handle(&self, req: IncomingRequest) -> Response<U::Body> {
        let start = self.env.now();
        // A screened request's route was matched by its screen.
        let shape = match &self.admitted {
            Some(a) => a.provider(),
            None => match http::match_route(&req.method, &req.path) {
                RouteMatch::Endpoint(e) => e.provider(),
                RouteMatch::MethodNotAllowed(p) => p,
                RouteMatch::NotFound(p) => p.unwrap_or(Provider::Claude),
            },
        };
        let report = std::cell::RefCell::new(report::Report {
            provider: Some(shape),
            ..Default::default()
        });
        let response = match self.handle_inner(&req, &report).await {
            Ok(r) => r,
            Err(e) => {
                self.env.log(
                    Level::Warn,
                    "Account Pooler storage failed",
                    &[("error", e.to_string())],
                );
                report.borrow_mut().outcome = Some("error");
                Response::pool(
                    shape,
                    &PoolError::pool(503, "Account Pooler storage is unavailable; try again."),
                )
            }
        };
        self.finish(
            report.into_inner(),
            &response,
            self.env.now().saturating_sub(start),
        );
        response
    }

    /// Write bookkeeping about an upstream answer already in hand (`write`, one
    /// transaction), tried [`BOOKKEEPING_TRIES`] times. If every try fails (disk full, a
    /// busy wait that ran out) the request goes on without it: the answer reaches the
    /// client, which would otherwise pay for the request again, and one warning names
    /// what was `lost`. None then.
    fn bookkeeping<T>(
        &self,
        account: &str,
        lost: &str,
        mut write: impl FnMut() -> Result<T, pooler_plugin_kit::DbError>,
    ) -> Option<T> {
        let mut tries = 0;
        loop {
            tries += 1;
            match write() {
                Ok(v) => return Some(v),
                Err(_) if tries < BOOKKEEPING_TRIES => {}
                Err(e) => {
                    self.env.log(
                        Level::Warn,
                        BOOKKEEPING_LOST_MESSAGE,
                        &[
                            ("account", account.to_owned()),
                            ("lost", lost.to_owned()),
                            ("error", e.to_string()),
                            ("tries", tries.to_string()),
                        ],
                    );
                    return None;
                }
            }
        }
    }

    /// Write the request's line and metrics for `response`, `total_ms` after it started.
    fn finish(&self, report: report::Report, response: &Response<U::Body>, total_ms: u64) {
        report.emit(
            self.env,
            self.env,
            response.status,
            report::is_own(&response.headers),
            total_ms,
        );
    }

    /// A request [`Engine::screen`] refused: its line and metrics (outcome `refused`).
    pub fn refused(&self, method: &str, path: &str, response: &Response<U::Body>) {
        let provider = match http::match_route(method, path) {
            RouteMatch::Endpoint(e) => Some(e.provider()),
            RouteMatch::MethodNotAllowed(p) => Some(p),
            RouteMatch::NotFound(p) => p,
        };
        let report = report::Report {
            provider,
            outcome: Some("refused"),
            ..Default::default()
        };
        self.finish(report, response, 0);
    }
}

#[cfg(test)]
mod tests;
