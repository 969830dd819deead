//! Admission: what a request comes to before it chooses an account. The head is
//! screened before the body is read ([`Engine::screen`]), in one read transaction that
//! also reads the state the decision starts from for the session the head names (the real
//! clients name it in the head and the body); the decision uses that read when the body
//! names the same session and came soon enough, and reads again otherwise.

use super::{Cancel, Clock, Ctx, Engine, IncomingRequest, Log, Random, Response, Upstream};
use crate::body::{Refused, RequestBody};
use crate::http::{self, Endpoint, Headers, PoolError, RouteMatch};
use crate::model::Provider;
use crate::policy::AccountState;
use crate::session::{self, SessionInfo};
use crate::settings::Settings;
use crate::store::{Secret, Store};
use crate::token;
use pooler_plugin_kit::{Db, DbError};

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

/// A request's route and the settings it is served with, read before its body, and what
/// it chooses its account from, read with them for the session its head names.
pub struct Admitted {
    endpoint: Endpoint,
    thread: String,
    settings: Settings,
    /// Taken by the request's decision ([`Engine::handle`]).
    ahead: std::cell::Cell<Option<Box<Ahead>>>,
}

/// How long what a screen read stays the state a request decides on: a body that took
/// longer to arrive has its request decided on a fresh read, so a slow upload never places
/// a conversation on a picture of the pool from seconds before.
pub const HEAD_READ_FRESH_MS: u64 = 1_000;

/// What the screen read for the session the request's head names, and when.
struct Ahead {
    read_at: u64,
    /// The session as the head alone names it; the snapshot serves the request when its
    /// body names the same one (key and parent).
    info: SessionInfo,
    snapshot: Snapshot,
}

impl Admitted {
    /// The most body bytes the request may have (`max-request-body`).
    pub fn max_body(&self) -> u64 {
        self.settings.max_request_body
    }

    /// The provider of the endpoint the request was matched to.
    pub fn provider(&self) -> Provider {
        self.endpoint.provider()
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

/// The session a routed request is for: what its head and body name (the body is parsed
/// only now, for a request the pool routes); an endpoint that is no conversation keeps
/// only the model family.
fn session_info(endpoint: Endpoint, headers: &Headers, body: &RequestBody) -> SessionInfo {
    let found = session::extract(endpoint.provider(), headers, body);
    if endpoint.is_conversation() {
        found
    } else {
        SessionInfo {
            family: found.family,
            ..SessionInfo::default()
        }
    }
}

/// The 413 message of a body within `max-request-body` that the instance's memory could
/// not hold.
pub const BODY_OUT_OF_MEMORY: &str = "The request body does not fit in the memory Account Pooler is given (it holds a body whole, to send it again on a retry). Send a smaller one, or raise the pool's memory limit in its host (`memory-mib` in the reference host) and keep `max-request-body` within it.";

/// Whether the pool serves this request, checked in the order the client should hear
/// about it: the endpoint and thread it is routed for, or the pool's own answer.
fn refusal<B>(
    req: &IncomingRequest,
    route: Option<(String, Provider)>,
    settings: &Settings,
) -> Result<(Endpoint, String), Response<B>> {
    let (endpoint, thread) = head_refusal(&req.method, &req.path, route, settings)?;
    body_refusal(req, endpoint.provider(), settings)?;
    Ok((endpoint, thread))
}

/// The 413 of a request whose body the glue did not take whole, or that exceeds
/// `max-request-body`.
fn body_refusal<B>(
    req: &IncomingRequest,
    provider: Provider,
    settings: &Settings,
) -> Result<(), Response<B>> {
    let over = || {
        format!(
            "The request body exceeds {} bytes.",
            settings.max_request_body
        )
    };
    let too_large = match req.body_refused {
        Some(Refused::OutOfMemory { .. }) => Some(BODY_OUT_OF_MEMORY.to_owned()),
        Some(Refused::OverLimit) => Some(over()),
        None => (req.body.len() as u64 > settings.max_request_body).then(over),
    };
    match too_large {
        Some(message) => Err(Response::pool(provider, &PoolError::pool(413, message))),
        None => Ok(()),
    }
}

/// The message of a 405: the method, and the path when the request named one (a
/// `CONNECT`'s target is no path).
pub fn not_allowed(method: &str, path: &str) -> String {
    if path.is_empty() {
        format!("{method} is not served by Account Pooler.")
    } else {
        format!("{method} is not allowed on {path}.")
    }
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
                &PoolError::pool(405, not_allowed(method, path)),
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
pub(super) struct Snapshot {
    pub(super) provider: Provider,
    /// The provider's accounts, in selection order.
    pub(super) accounts: Vec<AccountState>,
    /// The session's fresh pin.
    pub(super) pin: Option<crate::store::Pin>,
    /// The account of the parent session's fresh pin, when the session has no pin.
    pub(super) inherited: Option<String>,
    /// The provider's round-robin cursor.
    pub(super) cursor: Option<String>,
    /// The secret of the account the request will most likely try first: the pin's, the
    /// parent's, or the cursor's when the strategy follows it.
    pub(super) secret: Option<Secret>,
    /// When it was read.
    pub(super) read_at: u64,
}

impl Snapshot {
    /// Read the state a request for session `info` chooses from.
    fn read<D: Db>(
        st: &Store<'_, D>,
        provider: Provider,
        info: &SessionInfo,
        s: &Settings,
        now: u64,
    ) -> Result<Snapshot, DbError> {
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
        let cursor = st.cursor(provider)?;
        let likely = pin
            .as_ref()
            .map(|p| &p.account)
            .or(inherited.as_ref())
            .or(cursor.as_ref().filter(|_| !s.strategy(provider).ranks()));
        let secret = likely.map(|id| st.secret(id)).transpose()?;
        Ok(Snapshot {
            provider,
            accounts: st.accounts(Some(provider))?,
            pin,
            inherited,
            cursor,
            secret,
            read_at: now,
        })
    }
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    /// Look at a request's head before its body is read: its settings and route token,
    /// in one read transaction. A request the pool would refuse whatever its body holds is
    /// answered now, so a caller need not keep a body (up to `max-request-body` of it) only
    /// to refuse it.
    pub fn screen(&self, method: &str, path: &str, headers: &Headers) -> Screen<U::Body> {
        let hash = token::from_headers(headers).map(|t| token::hash(&t));
        let now = self.env.now();
        // One read transaction: the route and settings, and for a head the pool would
        // route, the state its decision starts from, for the session the head names.
        let read = self.store.read(|st| {
            if !st.schema_current()? {
                return Ok(None);
            }
            let route = match &hash {
                Some(h) => st.route_by_hash(h)?,
                None => None,
            };
            let settings = st.settings()?;
            let screened = match head_refusal(method, path, route, &settings) {
                Err(refused) => Err(refused),
                // Only a head that names a session: the real clients name it in both, and
                // a request that names it in its body alone would read twice.
                Ok((endpoint, thread)) => {
                    let info = session_info(endpoint, headers, &RequestBody::default());
                    let ahead = match info.key {
                        Some(_) => Some(Box::new(Ahead {
                            read_at: now,
                            snapshot: Snapshot::read(
                                st,
                                endpoint.provider(),
                                &info,
                                &settings,
                                now,
                            )?,
                            info,
                        })),
                        None => None,
                    };
                    Ok((endpoint, thread, ahead))
                }
            };
            Ok(Some((settings, screened)))
        });
        let Ok(Some((settings, screened))) = read else {
            return Screen::Unknown;
        };
        match screened {
            Err(refused) => Screen::Refused(refused),
            Ok((endpoint, thread, ahead)) => Screen::Admitted(Admitted {
                endpoint,
                thread,
                settings,
                ahead: std::cell::Cell::new(ahead),
            }),
        }
    }

    /// The decision of a screened request: its body's size is the one check left, and
    /// what the screen read is its snapshot when its body names the session its head
    /// named and arrived within [`HEAD_READ_FRESH_MS`]; otherwise it is read again.
    fn decide_screened(
        &self,
        a: &Admitted,
        req: &IncomingRequest,
        now: u64,
    ) -> Result<Decision<U::Body>, DbError> {
        let provider = a.endpoint.provider();
        if let Err(refused) = body_refusal(req, provider, &a.settings) {
            return Ok(Decision::Refused(refused));
        }
        let info = session_info(a.endpoint, &req.headers, &req.body);
        let snapshot = match a.ahead.take() {
            Some(h)
                if h.info.key == info.key
                    && h.info.parent == info.parent
                    && now.saturating_sub(h.read_at) <= HEAD_READ_FRESH_MS =>
            {
                h.snapshot
            }
            _ => self
                .store
                .read(|st| Snapshot::read(st, provider, &info, &a.settings, now))?,
        };
        Ok(Decision::Routed(Box::new(Routed {
            thread: a.thread.clone(),
            settings: a.settings.clone(),
            info,
            snapshot,
        })))
    }

    pub(super) async fn handle_inner(
        &self,
        req: &IncomingRequest,
        report: &std::cell::RefCell<super::report::Report>,
    ) -> Result<Response<U::Body>, DbError> {
        let start = self.env.now();
        // An unscreened request: everything it decides on in one read transaction, one
        // snapshot, one read lock (instead of one per statement).
        let read = |st: &Store<'a, D>| -> Result<Option<Decision<U::Body>>, DbError> {
            if !st.schema_current()? {
                return Ok(None);
            }
            let route = match token::from_headers(&req.headers) {
                Some(t) => st.route_by_hash(&token::hash(&t))?,
                None => None,
            };
            let settings = st.settings()?;
            Ok(Some(match refusal(req, route, &settings) {
                Err(refused) => Decision::Refused(refused),
                Ok((endpoint, thread)) => {
                    let info = session_info(endpoint, &req.headers, &req.body);
                    let snapshot =
                        Snapshot::read(st, endpoint.provider(), &info, &settings, start)?;
                    Decision::Routed(Box::new(Routed {
                        thread,
                        settings,
                        info,
                        snapshot,
                    }))
                }
            }))
        };
        let decision = match self.admitted.as_ref() {
            // Screened: the schema was current then, and a schema never goes back.
            Some(a) => self.decide_screened(a, req, start)?,
            None => match self.store.read(read)? {
                Some(d) => d,
                None => {
                    self.store.migrate()?;
                    self.store
                        .read(read)?
                        .ok_or_else(|| DbError::Decode("the schema did not migrate".into()))?
                }
            },
        };
        let Routed {
            thread,
            settings,
            info,
            snapshot,
        } = match decision {
            Decision::Refused(response) => {
                report.borrow_mut().outcome = Some("refused");
                return Ok(response);
            }
            Decision::Routed(routed) => *routed,
        };
        {
            let mut report = report.borrow_mut();
            report.provider = Some(snapshot.provider);
            report.thread = Some(thread.clone());
            report.session = info.key.as_deref().map(super::report::session_hash);
        }
        let mut snapshot = snapshot;
        let ctx = Ctx {
            provider: snapshot.provider,
            req,
            family: info.family,
            key: info.key.as_deref(),
            settings: &settings,
            secret: std::cell::Cell::new(snapshot.secret.take().map(|s| (snapshot.read_at, s))),
            last_try: std::cell::Cell::new(0),
            sends: std::cell::Cell::new(0),
            report,
        };
        self.route(&ctx, &thread, snapshot).await
    }
}
